use super::*;

fn parse(source: &str) -> Result<Scenario, ScenarioError> {
    Scenario::parse(Path::new("bad.toml"), source)
}

/// The error for `source`, which must not load.
fn error(source: &str) -> ScenarioError {
    parse(source).expect_err("the scenario must not load")
}

const TURN: &str =
    "[[step]]\ninvoke = { function = \"harness::turn\", payload = { session_id = \"s1\" }, name = \"turn\" }\n";

#[test]
fn unknown_keys_name_line_and_column() {
    let error = error("[world]\nsession_timeout_ms = 300\nbogus = 1\n[policy.reference]\n");
    assert_eq!((error.line, error.column), (3, 1), "{error}");
    assert!(error.message.contains("bogus"), "{error}");
}

#[test]
fn wrong_types_are_errors() {
    let error = error("[world]\nsession_timeout_ms = \"soon\"\n[policy.reference]\n");
    assert_eq!(error.line, 2, "{error}");
}

#[test]
fn unknown_functions_hosts_policies_and_oracles_are_errors_with_a_suggestion() {
    let cut = "[[cut]]\nfunction = \"state::sett\"\naction = \"timeout\"\n[policy.reference]\n";
    let e = error(cut);
    assert_eq!((e.line, e.column), (2, 12), "{e}");
    assert!(e.message.contains("did you mean `state::set`"), "{e}");
    let crash = "[[step]]\ncrash = \"stor\"\n[policy.reference]\n";
    let e = error(crash);
    assert_eq!(e.line, 2);
    assert!(e.message.contains("did you mean `store`"), "{e}");
    assert!(error("[policy.sloppy]\n").message.contains("unknown policy `sloppy`"));
    let e = error("[policy.swallow]\nviolations = [\"liveliness\"]\n");
    assert!(e.message.contains("unknown oracle `liveliness`") && e.message.contains("did you mean `liveness`"), "{e}");
    assert_eq!((e.line, e.column), (2, 15), "{e}");
}

#[test]
fn a_scenario_needs_a_policy() {
    assert!(error("[world]\n").message.contains("policy"));
}

#[test]
fn typos_in_expectations_are_errors() {
    let calls = format!("{TURN}[expect]\ncalls = {{ \"session::mesages\" = 1 }}\n[policy.reference]\n");
    let e = error(&calls);
    assert!(e.message.contains("did you mean `session::messages`"), "{e}");
    assert_eq!(e.line, 4, "{e}");
    let effects =
        format!("{TURN}[world.tickets]\n[expect]\neffects = {{ \"ticket.creat\" = 1 }}\n[policy.reference]\n");
    let e = error(&effects);
    assert!(e.message.contains("unknown effect kind `ticket.creat`"), "{e}");
    let no_service = format!("{TURN}[expect]\neffects = {{ \"ticket.create\" = 1 }}\n[policy.reference]\n");
    assert!(error(&no_service).message.contains("none in this world"), "no ticket service, no ticket effects");
    let rpc = format!("{TURN}[expect]\nrpc.trun = {{ outcome = \"ok\" }}\n[policy.reference]\n");
    let e = error(&rpc);
    assert!(e.message.contains("did you mean `turn`"), "{e}");
    let before = format!(
        "{TURN}[expect]\nevents = [{{ match = {{ kind = \"call\" }}, count = 1, before_rpc = \"tur\" }}]\n[policy.reference]\n"
    );
    assert!(error(&before).message.contains("did you mean `turn`"));
    let awaited = "[[step]]\nawait = { name = \"turn\" }\n[policy.reference]\n";
    assert!(error(awaited).message.contains("earlier `invoke`"));
}

#[test]
fn nonsense_world_settings_are_errors() {
    let model = "[[world.model]]\ntxt = \"hi\"\n[policy.reference]\n";
    let e = error(model);
    assert!(e.message.contains("txt"), "{e}");
    assert_eq!(e.line, 2, "{e}");
    assert!(error("[world]\nlatency_ms_min = 5\nlatency_ms_max = 2\n[policy.reference]\n")
        .message
        .contains("min <= max"));
    assert_eq!(error("[world]\ntick_ms = 0\n[policy.reference]\n").line, 2);
    let nth = "[[step]]\nwait_until = { match = { kind = \"call\" }, nth = 0, within_ms = 10 }\n[policy.reference]\n";
    assert!(error(nth).message.contains("counts from 1"));
    let dead_letter = "[world.queue.q]\ndead_letter_function = \"harness::dead-leter\"\n[policy.reference]\n";
    assert!(error(dead_letter).message.contains("did you mean `harness::dead-letter`"));
}

#[test]
fn a_partition_must_cut_a_link() {
    let between_workers = "[[step]]\npartition = [\"store\", \"session\"]\n[policy.reference]\n";
    let e = error(between_workers);
    assert_eq!(e.line, 2, "{e}");
    assert!(e.message.contains("no network link joins `store` and `session`"), "{e}");
    let behind_proxy =
        "[proxy]\nworker = \"harness\"\n[[step]]\nhold = [\"harness\", \"engine\"]\n[policy.reference]\n";
    assert!(error(behind_proxy).message.contains("[\"harness\", \"proxy\"]"), "the proxy's links are listed");
    assert!(parse("[[step]]\npartition = [\"harness\", \"engine\"]\n[policy.reference]\n").is_ok());
}

#[test]
fn an_event_is_timed_after_another() {
    let source = format!(
        "{TURN}[expect]\nevents = [{{ match = {{ kind = \"note\", what = \"queue_redeliver\" }}, after = {{ match = {{ kind = \"note\", what = \"queue_dispatch\" }}, by_ms = {{ ge = 1000, le = 1100 }} }} }}]\n[policy.reference]\n"
    );
    let scenario = parse(&source).unwrap();
    let Expectation::Events(events) = &scenario.runs[0].expectations[0] else { panic!("an events expectation") };
    let after = events.after.as_ref().expect("timed");
    assert_eq!(after.by_ms.to_string(), "by_ms >= 1000 and <= 1100");
    assert_eq!(after.conditions.len(), 2);
    let e = error(&source.replace("by_ms", "by"));
    assert!(e.message.contains("by_ms"), "{e}");
    let e = error(&source.replace("ge = 1000", "gte = 1000"));
    assert!(e.line == 4 && e.message.contains("unknown test `gte`"), "{e}");
}

#[test]
fn conditions_take_comparisons() {
    let source = format!(
        "{TURN}[expect]\nevents = [{{ match = {{ kind = \"note\", at_ms = {{ ge = 10, lt = 20 }} }}, count_max = 1 }}]\n[policy.reference]\n"
    );
    let scenario = parse(&source).unwrap();
    let Expectation::Events(events) = &scenario.runs[0].expectations[0] else { panic!("an events expectation") };
    assert_eq!(events.count_max, Some(1));
    assert!(events.conditions.iter().any(|c| c.to_string() == "at_ms >= 10 and < 20"));
    let e = error(&source.replace("ge = 10", "one_off = [10]"));
    assert!(e.message.contains("did you mean `one_of`"), "{e}");
}

#[test]
fn a_valid_scenario_compiles_shared_and_policy_expectations() {
    let source = r#"
        [[cut]]
        function = "state::set"
        match = { scope = "harness_turn", "value.status" = "failed" }
        action = "lost-ack"
        count = 2
        optional = true
        [[step]]
        invoke = { function = "harness::turn", payload = { session_id = "s1" }, name = "turn" }
        [expect]
        calls = { "session::messages" = 1 }
        [policy.swallow]
        violations = ["liveness"]
        expect.rpc.turn = { "result.skipped" = true }
    "#;
    let scenario = parse(source).unwrap();
    assert_eq!(scenario.cuts[0].trigger.count, Count::Times(2));
    assert!(scenario.cuts[0].trigger.optional);
    let swallow = &scenario.runs[0];
    assert_eq!((swallow.expectations.len(), swallow.particulars.len()), (1, 1), "shared, then its own");
    assert!(swallow.expected_violations.contains(&Oracle::Liveness));
}

#[test]
fn actions_expectations_read_a_sessions_actions_and_can_be_broken() {
    let source = format!(
        "{TURN}[expect]\nactions.s1 = {{ count = 1, done = 1, held = {{ lt = 1 }} }}\n[policy.reference]\n[policy.assume-failed]\nbreaks = [\"actions\"]\n"
    );
    let scenario = parse(&source).unwrap();
    let Expectation::Actions { session, conditions } = &scenario.run_of("reference").unwrap().expectations[0] else {
        panic!("an actions expectation")
    };
    assert_eq!((session.as_str(), conditions.len()), ("s1", 3));
    let bad = scenario.run_of("assume-failed").unwrap();
    assert_eq!((bad.broken[0].0.as_str(), bad.expectations.len()), ("actions", 0));
}

#[test]
fn proxy_rules_may_be_optional() {
    let source = r#"
        [proxy]
        worker = "harness"
        [[proxy.rule]]
        action = "drop"
        optional = true
        match = { type = "invocationresult" }
        [policy.reference]
    "#;
    let scenario = parse(source).unwrap();
    let proxy = scenario.proxy.unwrap();
    assert_eq!(proxy.optional, vec![true]);
    let bad = source.replace("action = \"drop\"", "action = \"dorp\"");
    assert!(parse(&bad).is_err());
}

const RECORDER: &str = "[world.service.recorder]\neffect = \"record\"\n[world.service.hooks]\nfunctions = { hold = { decision = \"hold\" } }\n";

#[test]
fn declared_services_are_hosts_with_their_functions_effects_and_tools() {
    let source = format!("{RECORDER}{TURN}[expect]\neffects = {{ \"recorder.record\" = 1 }}\ncalls = {{ \"hooks::hold\" = 1 }}\n[policy.reference]\n");
    let scenario = parse(&source).unwrap();
    let tools: Vec<&str> = scenario.world.harness.tools.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(tools, vec!["recorder.record"], "a plain function is no tool");
    assert!(error(&format!("{RECORDER}{TURN}[expect]\neffects = {{ \"recorder.recrd\" = 1 }}\n[policy.reference]\n"))
        .message
        .contains("did you mean `recorder.record`"));
    let e = error("[world.service.store]\neffect = \"x\"\n[policy.reference]\n");
    assert!(e.message.contains("host of every world"), "{e}");
    let e = error("[world.service.recorder]\neffect = \"record\"\nfunctions = { status = {} }\n[policy.reference]\n");
    assert!(e.message.contains("reconciliation function"), "{e}");
    let e = error("[world.service.recorder]\neffct = \"record\"\n[policy.reference]\n");
    assert!(e.message.contains("effct"), "{e}");
    assert!(error("[world.service.idle]\n[policy.reference]\n").message.contains("serves nothing"));
}

#[test]
fn bindings_name_a_trigger_and_functions_of_the_world() {
    let bind = |trigger: &str, function: &str, functions: &str| {
        format!("{RECORDER}[[world.binding]]\ntrigger = \"{trigger}\"\nfunction = \"{function}\"\nfunctions = {functions}\n[policy.reference]\n")
    };
    let scenario = parse(&bind("pre-trigger", "hooks::hold", "[\"recorder::record\"]")).unwrap();
    assert_eq!(scenario.world.harness.bindings[0].functions, vec!["recorder::record"]);
    let e = error(&bind("pre-triger", "hooks::hold", "[]"));
    assert!(e.message.contains("did you mean `pre-trigger`"), "{e}");
    assert_eq!(e.line, 6, "{e}");
    assert!(error(&bind("pre-trigger", "hooks::hld", "[]")).message.contains("did you mean `hooks::hold`"));
    assert!(error(&bind("pre-trigger", "hooks::hold", "[\"recorder::recor\"]"))
        .message
        .contains("unknown tool function"));
    assert!(error(&bind("turn-completed", "hooks::hold", "[\"recorder::record\"]")).message.contains("lifecycle"));
}

#[test]
fn a_known_bad_policy_breaks_kinds_the_shared_expectations_have() {
    let model = "[[world.model]]\ntext = \"hi\"\nexpect = { \"messages.0.role\" = \"user\" }\n";
    let source = |breaks: &str| {
        format!("{model}{TURN}[expect]\nrpc.turn = {{ outcome = \"ok\" }}\n[policy.reference]\n[policy.stale-context]\nbreaks = {breaks}\n")
    };
    let scenario = parse(&source("[\"model\", \"rpc\"]")).unwrap();
    let bad = scenario.run_of("stale-context").unwrap();
    let broken: Vec<&str> = bad.broken.iter().map(|(kind, _)| kind.as_str()).collect();
    assert_eq!((broken, bad.expectations.len()), (vec!["rpc", "model"], 0));
    assert_eq!(scenario.run_of("reference").unwrap().expectations.len(), 2, "the model script is expected too");
    let e = error(&source("[\"transcrpt\"]"));
    assert!(e.message.contains("did you mean `transcript`"), "{e}");
    assert!(error(&source("[\"events\"]")).message.contains("nothing for the policy to break"));
    let e = error(&format!("{TURN}[policy.reference]\nbreaks = [\"model\"]\n"));
    assert!(e.message.contains("scripts no model replies"), "{e}");
}

#[test]
fn a_known_bad_policy_that_says_it_trips_and_breaks_nothing_is_a_load_error() {
    let source = |section: &str| {
        format!("{TURN}[expect]\nrpc.turn = {{ outcome = \"ok\" }}\n[policy.reference]\n[policy.swallow]\n{section}")
    };
    // `violations = []` and no `breaks`: the run would pass, proving nothing.
    let e = error(&source("violations = []\n"));
    assert_eq!((e.path.as_str(), e.line, e.column), ("bad.toml", 7, 14), "at the empty list: {e}");
    assert!(
        e.message.contains("`[policy.swallow]` is a known-bad policy") && e.message.contains("proving nothing"),
        "{e}"
    );
    assert!(e.message.contains("expected the oracles it must trip"), "{e}");
    let e = error(&source("breaks = []\n"));
    assert_eq!((e.line, e.column), (7, 10), "{e}");
    assert!(e.message.contains("`breaks = []` with no `violations`"), "{e}");
    assert_eq!(error(&source("violations = []\nbreaks = []\n")).line, 7);
    // Either list naming something, or neither written (the policy run where it should do no
    // harm, as `harness-switch/after-completion.toml` runs two), loads.
    for fine in [
        "violations = [\"liveness\"]\nbreaks = []\n",
        "violations = []\nbreaks = [\"rpc\"]\n",
        "",
        "expect.calls = {}\n",
    ] {
        assert!(parse(&source(fine)).is_ok(), "{fine:?}");
    }
    // A correct policy trips nothing, in so many words or not.
    assert!(parse(&format!("{TURN}[policy.reference]\nviolations = []\n")).is_ok());
}

#[test]
fn a_scripted_reply_needs_something_to_say_and_checkable_expectations() {
    assert!(error("[[world.model]]\noptional = true\n[policy.reference]\n").message.contains("`frames`"));
    let e = error("[[world.model]]\ntext = \"hi\"\nexpect = { messages = { lenght = 1 } }\n[policy.reference]\n");
    assert!(e.message.contains("did you mean `len`"), "{e}");
    let transcript = format!("{TURN}[[expect.transcript.s1]]\nrole = {{ on_of = [\"user\"] }}\n[policy.reference]\n");
    assert!(error(&transcript).message.contains("did you mean `one_of`"));
}

#[test]
fn a_cut_that_may_fire_zero_times_is_a_load_error() {
    let cut =
        format!("{TURN}[[cut]]\nfunction = \"state::set\"\naction = \"timeout\"\ncount = 0\n[policy.reference]\n");
    let e = error(&cut);
    assert!(e.message.contains("`count = 0`") && e.message.contains("never fires"), "{e}");
    assert_eq!(e.line, 3, "at the cut: {e}");
    let interrupt = format!(
        "{TURN}[[interrupt]]\nworker = \"harness\"\npoint = \"after_completion\"\naction = \"freeze\"\ncount = 0\n[policy.reference]\n"
    );
    assert!(error(&interrupt).message.contains("`count = 0`"));
    assert!(parse(&cut.replace("count = 0", "count = 1")).is_ok());
}

#[test]
fn a_late_cut_holds_the_request_and_needs_no_length() {
    let late = format!("{TURN}[[cut]]\nfunction = \"state::set\"\naction = \"late\"\n[policy.reference]\n");
    assert_eq!(parse(&late).unwrap().cuts[0].fault, ServiceFault::Late);
    let timed = late.replace("action = \"late\"\n", "action = \"late\"\nlate_ms = 5\n");
    assert!(error(&timed).message.contains("late_ms"), "an unknown key is named");
}

#[test]
fn an_outage_says_how_long_and_compiles_its_refusal_and_reach() {
    let outage = |keys: &str| {
        format!("{TURN}[[cut]]\nfunction = \"state::set\"\naction = \"outage\"\n{keys}[policy.reference]\n")
    };
    let e = error(&outage(""));
    assert!(e.message.contains("needs `for_ms`"), "{e}");
    assert_eq!(e.line, 3, "at the cut: {e}");
    assert!(error(&outage("for_ms = 0\n")).message.contains("`for_ms = 0`"));
    assert!(error(&outage("for_ms = 5\nrefuse = \"drop\"\n")).message.contains("reject"), "the choices are named");
    assert!(error(&outage("for_ms = 5\nover = \"world\"\n")).message.contains("service"), "the choices are named");
    let fault = |keys: &str| parse(&outage(keys)).unwrap().cuts[0].fault.clone();
    assert_eq!(
        fault("for_ms = 5\n"),
        ServiceFault::Outage { ms: 5, refuse: Refusal::unavailable(), over: OutageOver::Function },
        "by default every call of the function is refused with an error"
    );
    assert_eq!(
        fault("for_ms = 5\nrefuse = \"timeout\"\nover = \"service\"\n"),
        ServiceFault::Outage { ms: 5, refuse: Refusal::Timeout, over: OutageOver::Service }
    );
    let named = fault("for_ms = 5\ncode = \"maintenance\"\nmessage = \"back soon\"\n");
    let ServiceFault::Outage { refuse: Refusal::Reject { code, message }, .. } = named else { panic!("{named:?}") };
    assert_eq!((code.as_str(), message.as_str()), ("maintenance", "back soon"));
}

/// A world with these `[world]` settings and one turn.
fn world(settings: &str) -> String {
    format!("[world]\n{settings}\n{TURN}[policy.reference]\n")
}

#[test]
fn a_world_too_slow_to_come_up_is_a_load_error() {
    // The values of issue 21, which failed at run time with "Ran for duration: 7201s" and
    // "the world did not come up within 5000 ms".
    for (settings, key) in [("tick_ms = 4000000000", "tick_ms"), ("latency_ms_max = 4000000000", "latency_ms_max")] {
        let e = error(&world(settings));
        assert!(e.message.contains("could not come up"), "{settings}: {e}");
        assert_eq!((e.line, e.column), (2, 1), "at `{key}`: {e}");
    }
    // At the edge, as measured on the smoke scenario: a 950 ms tick and a fixed 1,200 ms
    // latency came up; a 1,000 ms tick and a fixed 1,250 ms latency never did.
    assert!(parse(&world("tick_ms = 950")).is_ok());
    assert!(parse(&world("latency_ms_min = 1200\nlatency_ms_max = 1200")).is_ok());
    assert!(error(&world("tick_ms = 1000")).message.contains("could not come up"));
    assert!(error(&world("latency_ms_min = 1250\nlatency_ms_max = 1250")).message.contains("could not come up"));
    // Limits that end every run before the world is up.
    assert!(error(&world("steps_max = 0")).message.contains("ends before its world has come up"));
    assert!(error(&world("duration_ms_max = 0")).message.contains("ends before its world has come up"));
    assert!(parse(&world("duration_ms_max = 100")).is_ok());
}

#[test]
fn a_harness_restart_longer_than_the_rig_waits_for_it_is_a_load_error() {
    let e = error(&world("harness_restart_ms = 5000"));
    assert!(e.message.contains("would not be back within the 5000 ms"), "{e}");
    assert_eq!((e.line, e.column), (2, 1), "{e}");
    let parsed = parse(&world("harness_restart_ms = 700")).expect("a restart the rig waits for");
    assert_eq!(parsed.world.network.harness_restart_ms, 700);
}

#[test]
fn a_misspelt_key_or_word_gets_the_nearest_valid_one() {
    let source = world("").replace("[world]", "[wrold]");
    let e = error(&source);
    assert!(e.message.contains("unknown field `wrold`") && e.message.contains("did you mean `world`"), "{e}");
    let e = error(&format!("abuot = \"x\"\n{}", world("")));
    assert!(e.message.contains("did you mean `about`"), "{e}");
    let cut = format!("{TURN}[[cut]]\nfunction = \"state::set\"\naction = \"timout\"\n[policy.reference]\n");
    assert!(error(&cut).message.contains("did you mean `timeout`"), "an unknown variant too");
}

#[test]
fn a_wrong_type_names_the_key() {
    let e = error(&world("tick_ms = \"fast\""));
    assert!(e.message.starts_with("`tick_ms`: invalid type"), "{e}");
    let e = error(&format!("{TURN}[expect]\ncalls = 3\n[policy.reference]\n"));
    assert!(e.message.starts_with("`calls`: invalid type"), "{e}");
    let e = error(&format!("{TURN}[expect]\nstate.\"harness_turn/s1\" = 3\n[policy.reference]\n"));
    assert!(e.message.starts_with("`state.\"harness_turn/s1\"`") || e.message.starts_with("`harness_turn/s1`"), "{e}");
}

#[test]
fn an_empty_file_says_so_and_what_a_scenario_needs() {
    for source in ["", "\n\n", "# only a comment\n"] {
        let e = error(source);
        assert!(e.message.starts_with("the file is empty") && e.message.contains("[policy.NAME]"), "{e}");
        assert!(e.line >= 1 && e.column >= 1, "{e}");
    }
    let e = error("[world]\ntick_ms = 2\n");
    assert!(e.message.starts_with("expected at least one `[policy.NAME]`"), "{e}");
}

#[test]
fn a_binary_or_invalid_utf8_file_is_reported_where_it_stops_being_text() {
    let e = text(Path::new("bin.toml"), b"[world]\ntick_ms = \xff\xfe\n").expect_err("not UTF-8");
    assert_eq!((e.line, e.column), (2, 11), "{e}");
    assert!(e.message.contains("not UTF-8"), "{e}");
    let e = text(Path::new("bin.toml"), b"\x7fELF\x02\x01\x01\x00\x00").expect_err("binary");
    assert_eq!((e.line, e.column), (1, 8), "{e}");
    assert!(e.message.contains("binary file"), "{e}");
    assert_eq!(e.to_string(), format!("bin.toml:1:8: {}", e.message));
}

#[test]
fn a_file_judged_by_the_oracles_alone_has_no_expectations() {
    let judged =
        format!("oracles_only = true\n{TURN}[policy.reference]\n[policy.swallow]\nviolations = [\"liveness\"]\n");
    assert!(parse(&judged).expect("loads").oracles_only);
    for expectations in [
        "[expect]\ncalls = { \"model::generate\" = 1 }\n",
        "[policy.swallow]\nexpect.calls = { \"model::generate\" = 1 }\n",
    ] {
        let source = format!("oracles_only = true\n{TURN}{expectations}[policy.reference]\n");
        let e = error(&source);
        assert_eq!((e.line, e.column), (1, 1), "{e}");
        assert!(e.message.contains("oracles alone"), "{e}");
    }
}

#[test]
fn a_pinned_need_the_derivation_disagrees_with_is_an_error_naming_both_and_why() {
    let binding = "[world.service.observer]\nfunctions = { turn-completed = {} }\n[[world.binding]]\n\
                   trigger = \"turn-completed\"\nfunction = \"observer::turn-completed\"\n";
    // What the story uses, pinned as it is derived: it loads (`turns` is implied).
    let pinned = format!("needs = [\"lifecycle\"]\n{binding}{TURN}[policy.reference]\n");
    assert!(parse(&pinned).is_ok(), "{:?}", parse(&pinned).err());
    // A pin short of the derivation names what was derived beyond it, and from where.
    let e = error(&format!("needs = []\n{binding}{TURN}[policy.reference]\n"));
    assert_eq!((e.line, e.column), (1, 9), "{e}");
    assert!(e.message.contains("derived beyond the pin: lifecycle (from world.binding #1"), "{e}");
    // One beyond the derivation names what is pinned and not derived.
    let e = error(&format!("needs = [\"lifecycle\", \"hooks\"]\n{binding}{TURN}[policy.reference]\n"));
    assert!(e.message.contains("pinned and not derived: hooks"), "{e}");
    // An unknown capability is an error with the known ones.
    let e = error(&format!("needs = [\"lifecycel\"]\n{TURN}[policy.reference]\n"));
    assert!(e.message.contains("lifecycel") && e.message.contains("lifecycle"), "{e}");
}
