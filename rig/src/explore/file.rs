//! A finding as the scenario file a person would write, in the style of the shipped ones: the
//! workload's own text (its layout, key order, inline tables and comments) less the
//! expectations of its scripted story, the cuts that trigger the finding added as `[[cut]]`,
//! `[[interrupt]]` or `[[proxy.rule]]` tables with inline tables, what each policy must show,
//! and the sections in the order the shipped files have them.

use super::space::{Kind, Placement, Site};
use crate::scenario::Scenario;
use std::collections::BTreeSet;
use toml_edit::{value, Array, ArrayOfTables, DocumentMut, InlineTable, Item, Table};

/// A scenario file's top-level keys, in the order the shipped files have them; any other key
/// keeps its place after these.
const SECTIONS: [&str; 9] =
    ["about", "oracles_only", "outcome_depends_on_faults", "world", "proxy", "cut", "interrupt", "step", "policy"];

/// What the file says beyond the workload: why it exists, what it cuts, what each policy shows.
pub(super) struct Contents<'a> {
    pub about: &'a str,
    pub placements: &'a [Placement],
    pub policy: &'a str,
    pub oracle: &'a str,
    /// Every oracle the run trips (the one found among them): the known-bad policy declares them
    /// all, or the file would fail on the others.
    pub fired: &'a BTreeSet<String>,
    /// The workload's steps shrinking removed, by index.
    pub removed_steps: &'a BTreeSet<usize>,
}

/// The TOML of the finding's scenario file, from `about` to its policies (the header comment is
/// the caller's).
pub(super) fn scenario_toml(workload: &Scenario, contents: &Contents<'_>) -> String {
    let mut doc: DocumentMut = workload.source.parse().expect("a loaded scenario parses");
    // The story's expectations count what its own script did; an injected cut changes that.
    for key in ["about", "expect", "policy"] {
        doc.remove(key);
    }
    // The text still has the scripted cuts a workload may have run without: the finding must
    // script what was run, or it does not reproduce.
    let dropped = [
        ("cut", workload.cuts.is_empty()),
        ("interrupt", workload.interrupts.is_empty()),
        ("proxy", workload.proxy.is_none()),
    ];
    for (key, _) in dropped.iter().filter(|(_, empty)| *empty) {
        doc.remove(key);
    }
    remove_steps(&mut doc, contents.removed_steps);
    let count = contents.placements.len();
    // In the order the run added them: which cut counts which call depends on it.
    for n in super::space::application_order(contents.placements) {
        let placement = &contents.placements[n];
        let note = if count == 1 { String::from("The cut") } else { format!("Cut {} of {count}", n + 1) };
        add_cut(doc.as_table_mut(), placement, &format!("# {note}: {}", placement.id()));
    }
    // The cuts change the story the workload was written for (a step they keep from completing,
    // a scripted reply they leave unasked): the file is judged by the oracles alone, as the run
    // that found it was.
    doc.insert("oracles_only", value(true));
    doc.insert("policy", Item::Table(policies(contents)));
    doc.insert("about", value(contents.about));
    doc.set_trailing("");
    in_shipped_order(doc.as_table_mut());
    doc.to_string()
}

fn remove_steps(doc: &mut DocumentMut, removed: &BTreeSet<usize>) {
    let mut index = 0usize;
    let mut keep = || {
        index += 1;
        !removed.contains(&(index - 1))
    };
    match doc.get_mut("step") {
        Some(Item::ArrayOfTables(steps)) => steps.retain(|_| keep()),
        Some(Item::Value(toml_edit::Value::Array(steps))) => steps.retain(|_| keep()),
        _ => {}
    }
}

/// `[policy.reference]` (a correct harness trips no oracle) and, for a finding under a
/// known-bad policy, that policy with the oracle it trips.
fn policies(contents: &Contents<'_>) -> Table {
    let (policy, oracle) = (contents.policy, contents.oracle);
    let mut policies = Table::new();
    policies.set_implicit(true);
    policies.insert("reference", Item::Table(Table::new()));
    if policy != "reference" && oracle != "limit" {
        let mut bad = Table::new();
        let mut violations: BTreeSet<&str> =
            contents.fired.iter().map(String::as_str).filter(|o| *o != "limit").collect();
        violations.insert(oracle);
        bad.insert("violations", value(Array::from_iter(violations)));
        policies.insert(policy, Item::Table(bad));
    }
    policies
}

/// The root's keys in the shipped order, and every table numbered in that order (a table's
/// position is what the document is written by).
fn in_shipped_order(root: &mut Table) {
    let keys: Vec<String> = root.iter().map(|(key, _)| key.to_string()).collect();
    let rank = |key: &str| SECTIONS.iter().position(|s| *s == key).unwrap_or(SECTIONS.len());
    let mut ordered = keys.clone();
    ordered.sort_by_key(|key| rank(key));
    for key in ordered {
        if let Some((key, item)) = root.remove_entry(&key) {
            root.insert_formatted(&key, item);
        }
    }
    let mut next = 1;
    number_tables(root, &mut next);
}

fn number_tables(table: &mut Table, next: &mut isize) {
    for (_, item) in table.iter_mut() {
        let tables: Vec<&mut Table> = match item {
            Item::Table(table) => vec![table],
            Item::ArrayOfTables(tables) => tables.iter_mut().collect(),
            _ => continue,
        };
        for table in tables {
            table.set_position(*next);
            *next += 1;
            number_tables(table, next);
        }
    }
}

/// Appends `entry` to the array of tables `key` of `table`, made if need be (and made of an
/// inline array of tables, if the file wrote it so).
fn push(table: &mut Table, key: &str, entry: Table) {
    let item = table.entry(key).or_insert(Item::ArrayOfTables(ArrayOfTables::new()));
    if !item.is_array_of_tables() {
        if let Ok(tables) = item.clone().into_array_of_tables() {
            *item = Item::ArrayOfTables(tables);
        }
    }
    if let Some(tables) = item.as_array_of_tables_mut() {
        tables.push(entry);
    }
}

fn inline<'a>(pairs: impl IntoIterator<Item = (&'a str, &'a str)>) -> InlineTable {
    let mut table: InlineTable = pairs.into_iter().map(|(key, text)| (key, toml_edit::Value::from(text))).collect();
    table.fmt();
    table
}

fn number(n: u64) -> Item {
    value(i64::try_from(n).unwrap_or(i64::MAX))
}

/// A placement as the table that scripts it, under `comment`.
fn add_cut(root: &mut Table, placement: &Placement, comment: &str) {
    let mut cut = Table::new();
    cut.decor_mut().set_prefix(format!("\n{comment}\n"));
    let ms = number(placement.ms.unwrap_or(0));
    let skip = |cut: &mut Table, nth: u64| {
        if nth > 1 {
            cut.insert("skip", number(nth - 1));
        }
    };
    match &placement.site {
        Site::Call { function, about, nth } => {
            cut.insert("function", value(function.as_str()));
            if !about.is_empty() {
                cut.insert("match", value(inline(about.iter().map(|(k, v)| (k.as_str(), v.as_str())))));
            }
            cut.insert("action", value(placement.kind.name()));
            match placement.kind {
                Kind::Delay => drop(cut.insert("delay_ms", ms)),
                Kind::PauseCaller => drop(cut.insert("pause_ms", ms)),
                Kind::IsolateCaller => drop(cut.insert("isolate_ms", ms)),
                Kind::Outage | Kind::OutageTimeout => {
                    cut.insert("action", value("outage"));
                    cut.insert("for_ms", ms);
                    cut.insert("refuse", value(if placement.kind == Kind::Outage { "reject" } else { "timeout" }));
                    cut.insert("over", value("service"));
                }
                _ => {}
            }
            skip(&mut cut, *nth);
            push(root, "cut", cut);
        }
        Site::Point { worker, point, nth } => {
            cut.insert("worker", value(worker.as_str()));
            cut.insert("point", value(point.as_str()));
            cut.insert("action", value(placement.kind.name()));
            if placement.kind == Kind::Pause {
                cut.insert("pause_ms", ms);
            }
            skip(&mut cut, *nth);
            push(root, "interrupt", cut);
        }
        Site::Frame { worker, up, frame, function, nth } => {
            cut.insert("action", value(placement.kind.name()));
            cut.insert("count", value("once"));
            cut.insert("direction", value(if *up { "up" } else { "down" }));
            cut.insert("match", value(inline([("type", frame.as_str()), ("function_id", function.as_str())])));
            skip(&mut cut, *nth);
            let proxy = root.entry("proxy").or_insert(Item::Table(Table::new()));
            if let Some(proxy) = proxy.as_table_mut() {
                proxy.entry("worker").or_insert(value(worker.as_str()));
                push(proxy, "rule", cut);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{finding, workload};
    use super::*;
    use std::path::Path;

    fn load(path: &str) -> Scenario {
        Scenario::load(&Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(path)).unwrap()
    }

    /// The issue's complaint: `[[step]]` then `[step.invoke]` and `[step.invoke.payload]`, and
    /// `[world]` after the steps. A finding reads as the shipped files do.
    #[test]
    fn a_finding_reads_like_a_shipped_scenario_file() {
        let scenario = workload(&load("scenarios/workloads/multi-round.toml"), false);
        let cut = Placement {
            site: Site::Call {
                function: "state::set".into(),
                about: vec![("scope".into(), "harness_turn".into()), ("value.status".into(), "running".into())],
                nth: 2,
            },
            kind: Kind::CrashCallerAfter,
            ms: None,
        };
        let frame = Placement {
            site: Site::Frame {
                worker: "harness".into(),
                up: true,
                frame: "invocationresult".into(),
                function: "harness::turn".into(),
                nth: 1,
            },
            kind: Kind::Drop,
            ms: None,
        };
        let fired = BTreeSet::from(["ledger".to_string()]);
        let found = super::super::Found { oracle: "ledger", fired: &fired };
        let found = finding(&scenario, &[cut, frame], "unguarded", found, 7, &BTreeSet::from([1]), "test");
        let text = &found.scenario_file;
        assert!(text.starts_with("# Found by the test, under policy `unguarded` with seed 7,\n# on "), "{text}");
        let at = |what: &str| text.find(what).unwrap_or_else(|| panic!("no `{what}` in:\n{text}"));
        let order = [
            "\nabout = ",
            "\noracles_only = true\n",
            "\n[world]\n",
            "\n[proxy]\n",
            "\n[[proxy.rule]]\n",
            "\n[[cut]]\n",
            "\n[[step]]\n",
        ];
        let order = order.into_iter().chain(["\n[policy.reference]\n", "\n[policy.unguarded]\n"]);
        let places: Vec<usize> = order.map(at).collect();
        assert!(places.windows(2).all(|w| w[0] < w[1]), "sections out of the shipped order:\n{text}");
        for machine in ["[step.invoke", "[world.record.value", "[cut.match", "[proxy.rule.match"] {
            assert!(!text.contains(machine), "`{machine}` is no table a person writes:\n{text}");
        }
        assert!(text.contains("\ninvoke = { function = \"harness::turn\", payload = { session_id = \"s1\""), "{text}");
        assert!(text.contains("\nmatch = { scope = \"harness_turn\", \"value.status\" = \"running\" }\n"), "{text}");
        assert!(text.contains("\naction = \"crash-caller-after\"\nskip = 1\n"), "{text}");
        assert!(text.contains("\nviolations = [\"ledger\"]\n"), "{text}");
        assert_eq!(text.matches("\n[[step]]\n").count(), 1, "the removed step is gone:\n{text}");
        assert!(!text.contains("expect"), "the story's expectations are gone:\n{text}");
        let parsed = Scenario::parse(Path::new("finding.toml"), text).unwrap();
        assert_eq!((parsed.cuts.len(), parsed.steps.len()), (1, 1));
        assert_eq!(parsed.proxy.map(|p| p.rules.len()), Some(1));
    }

    fn crash_at_write() -> Placement {
        Placement {
            site: Site::Call { function: "state::set".into(), about: Vec::new(), nth: 1 },
            kind: Kind::CrashCallerAfter,
            ms: None,
        }
    }

    fn contents<'a>(
        placements: &'a [Placement],
        policy: &'a str,
        oracle: &'a str,
        fired: &'a BTreeSet<String>,
    ) -> Contents<'a> {
        static NONE: BTreeSet<usize> = BTreeSet::new();
        Contents { about: "found", placements, policy, oracle, fired, removed_steps: &NONE }
    }

    #[test]
    fn one_cut_is_the_cut_and_several_are_numbered() {
        let scenario = workload(&load("scenarios/workloads/multi-round.toml"), false);
        let fired = BTreeSet::from(["ledger".to_string()]);
        let one = [crash_at_write()];
        let text = scenario_toml(&scenario, &contents(&one, "unguarded", "ledger", &fired));
        assert!(text.contains("\n# The cut: crash-caller-after @ call state::set[]#1\n"), "{text}");
        let two = [crash_at_write(), crash_at_write()];
        let text = scenario_toml(&scenario, &contents(&two, "unguarded", "ledger", &fired));
        assert!(text.contains("\n# Cut 1 of 2: ") && text.contains("\n# Cut 2 of 2: "), "{text}");
    }

    #[test]
    fn the_reference_declares_nothing_and_a_limit_is_no_policys_violation() {
        let scenario = workload(&load("scenarios/workloads/multi-round.toml"), false);
        let placements = [crash_at_write()];
        let policies_of = |policy: &str, oracle: &str, fired: &[&str]| {
            let fired: BTreeSet<String> = fired.iter().map(|o| o.to_string()).collect();
            let text = scenario_toml(&scenario, &contents(&placements, policy, oracle, &fired));
            Scenario::parse(Path::new("finding.toml"), &text).unwrap().runs
        };
        let under_reference = policies_of("reference", "liveness", &["liveness"]);
        assert_eq!(under_reference.len(), 1);
        assert!(under_reference[0].expected_violations.is_empty(), "a correct harness trips nothing");
        let limit = policies_of("unguarded", "limit", &["limit"]);
        assert_eq!(limit.iter().map(|r| r.policy.as_str()).collect::<Vec<_>>(), ["reference"], "a limit is no oracle");
        let bad = policies_of("unguarded", "monotonic", &["limit", "ledger", "monotonic"]);
        let declared: BTreeSet<&str> = bad[1].expected_violations.iter().map(|o| o.name()).collect();
        assert_eq!((bad[1].policy.as_str(), declared), ("unguarded", BTreeSet::from(["ledger", "monotonic"])));
    }

    #[test]
    fn shrinking_removes_steps_written_inline_too() {
        let source = r#"about = "inline steps"
step = [
  { invoke = { function = "harness::status", payload = { session_id = "s1" }, name = "first" } },
  { invoke = { function = "harness::status", payload = { session_id = "s1" }, name = "second" } },
  { invoke = { function = "harness::status", payload = { session_id = "s1" }, name = "third" } },
]
[policy.reference]
"#;
        let scenario = Scenario::parse(Path::new("inline.toml"), source).unwrap_or_else(|e| panic!("{e}"));
        let removed = BTreeSet::from([0, 2]);
        let none = BTreeSet::new();
        let contents = Contents {
            about: "found",
            placements: &[],
            policy: "reference",
            oracle: "liveness",
            fired: &none,
            removed_steps: &removed,
        };
        let text = scenario_toml(&scenario, &contents);
        let parsed = Scenario::parse(Path::new("finding.toml"), &text).unwrap();
        assert_eq!(parsed.steps.len(), 1, "{text}");
        assert!(
            text.contains("name = \"second\"") && !text.contains("\"first\"") && !text.contains("\"third\""),
            "{text}"
        );
    }

    fn finding_text(source: &str, placements: &[Placement]) -> String {
        let scenario = Scenario::parse(Path::new("workload.toml"), source).unwrap_or_else(|e| panic!("{e}"));
        let none = BTreeSet::new();
        let text = scenario_toml(&scenario, &contents(placements, "reference", "liveness", &none));
        Scenario::parse(Path::new("finding.toml"), &text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        text
    }

    fn place(text: &str, what: &str) -> usize {
        text.find(what).unwrap_or_else(|| panic!("no `{what}` in:\n{text}"))
    }

    /// A workload that wrote its steps before its world: each table's place in the text comes
    /// from its position, which the finding sets in the shipped order.
    #[test]
    fn a_finding_orders_the_tables_of_a_workload_written_in_another_order() {
        let source = r#"about = "steps first"
[[step]]
invoke = { function = "harness::status", payload = { session_id = "s1" }, name = "status" }

[world]
session_timeout_ms = 300

[world.queue.harness-turn]
message_group_field = "session_id"

[policy.reference]
"#;
        let text = finding_text(source, &[crash_at_write()]);
        let places: Vec<usize> = ["\n[world]\n", "\n[world.queue.harness-turn]\n", "\n[[cut]]\n", "\n[[step]]\n"]
            .into_iter()
            .map(|what| place(&text, what))
            .collect();
        assert!(places.windows(2).all(|w| w[0] < w[1]), "tables out of the shipped order:\n{text}");
    }

    /// A workload that wrote its cuts as an inline array keeps them, and the finding's cut is
    /// added to them.
    #[test]
    fn a_cut_joins_the_cuts_a_workload_wrote_inline() {
        let source = r#"about = "inline cuts"
cut = [{ function = "session::messages", action = "delay", delay_ms = 5 }]

[[step]]
invoke = { function = "harness::status", payload = { session_id = "s1" }, name = "status" }

[policy.reference]
"#;
        let text = finding_text(source, &[crash_at_write()]);
        let parsed = Scenario::parse(Path::new("finding.toml"), &text).unwrap();
        assert_eq!(parsed.cuts.len(), 2, "{text}");
    }

    /// Each timed kind writes its duration under the key the scenario format reads, and a cut
    /// at the first matching call skips none.
    #[test]
    fn a_timed_cut_writes_its_duration_and_the_first_call_skips_none() {
        let source = "about = \"timed\"\n[[step]]\nwait_ms = 1\n\n[policy.reference]\n";
        for (kind, key) in
            [(Kind::Delay, "delay_ms"), (Kind::PauseCaller, "pause_ms"), (Kind::IsolateCaller, "isolate_ms")]
        {
            let placement = Placement { kind, ms: Some(750), ..crash_at_write() };
            let text = finding_text(source, &[placement]);
            assert!(text.contains(&format!("\n{key} = 750\n")), "{kind:?}:\n{text}");
            assert!(!text.contains("skip"), "{kind:?}:\n{text}");
        }
    }

    /// A pause at an interruption point says how long; a crash there has no duration.
    #[test]
    fn a_process_cut_writes_a_duration_for_a_pause_only() {
        let source = "about = \"points\"\n[[step]]\nwait_ms = 1\n\n[policy.reference]\n";
        let at = |kind: Kind| {
            let site = Site::Point { worker: "harness".into(), point: "after_completion".into(), nth: 1 };
            finding_text(source, &[Placement { site, kind, ms: Some(600) }])
        };
        let pause = at(Kind::Pause);
        assert!(pause.contains("\n[[interrupt]]\n") && pause.contains("\npause_ms = 600\n"), "{pause}");
        let crash = at(Kind::Crash);
        assert!(crash.contains("\naction = \"crash\"\n") && !crash.contains("pause_ms"), "{crash}");
    }

    /// Each kind of cut, written into a finding's file and read back, is the cut the placement
    /// adds to the run it was found in: the file replays what was run (an outage's length, how
    /// it refuses and over what included), at the same ordinal.
    #[test]
    fn each_placement_reads_back_from_its_file_as_the_cut_it_ran() {
        let source = r#"about = "any cut"
[[step]]
invoke = { function = "harness::status", payload = { session_id = "s1" }, name = "status" }

[policy.reference]
"#;
        let read_back = |placement: &Placement| {
            let text = finding_text(source, std::slice::from_ref(placement));
            let written = Scenario::parse(Path::new("finding.toml"), &text).unwrap();
            let mut ran = Scenario::parse(Path::new("workload.toml"), source).unwrap();
            placement.apply(&mut ran);
            (written, ran, text)
        };
        let call_kinds = [
            Kind::LostAck,
            Kind::Timeout,
            Kind::Reject,
            Kind::Delay,
            Kind::Late,
            Kind::CrashCallerBefore,
            Kind::CrashCallerAfter,
            Kind::CrashService,
            Kind::CrashEngine,
            Kind::IsolateCaller,
            Kind::PauseCaller,
            Kind::Outage,
            Kind::OutageTimeout,
        ];
        for kind in call_kinds {
            let site = Site::Call { function: "state::set".into(), about: vec![("scope".into(), "s".into())], nth: 3 };
            let (written, ran, text) = read_back(&Placement { site, kind, ms: Some(1_500) });
            let [written] = &written.cuts[..] else { panic!("{kind:?}: one cut:\n{text}") };
            let cut = &ran.cuts[0];
            assert_eq!(
                (&written.function, &written.fault, written.trigger.skip, written.trigger.count),
                (&cut.function, &cut.fault, cut.trigger.skip, cut.trigger.count),
                "{kind:?}:\n{text}"
            );
        }

        for kind in [Kind::Crash, Kind::Pause] {
            let site = Site::Point { worker: "harness".into(), point: "after_completion".into(), nth: 2 };
            let (written, ran, text) = read_back(&Placement { site, kind, ms: Some(1_500) });
            let [written] = &written.interrupts[..] else { panic!("{kind:?}: one interrupt:\n{text}") };
            let cut = &ran.interrupts[0];
            assert_eq!(
                (&written.worker, &written.point, written.interrupt, written.trigger.skip),
                (&cut.worker, &cut.point, cut.interrupt, cut.trigger.skip),
                "{kind:?}:\n{text}"
            );
        }
        for kind in [Kind::Drop, Kind::Duplicate, Kind::Reorder] {
            let site = Site::Frame {
                worker: "harness".into(),
                up: false,
                frame: "invokefunction".into(),
                function: "harness::turn".into(),
                nth: 2,
            };
            let (written, ran, text) = read_back(&Placement { site, kind, ms: None });
            let (written, ran) = (written.proxy.expect("a proxy"), ran.proxy.expect("a proxy"));
            let ([rule], [run]) = (&written.rules[..], &ran.rules[..]) else { panic!("{kind:?}: one rule:\n{text}") };
            assert_eq!(written.worker, ran.worker, "{kind:?}");
            assert_eq!(
                (rule.action, rule.skip, rule.direction, &rule.matches),
                (run.action, run.skip, run.direction, &run.matches),
                "{kind:?}:\n{text}"
            );
        }
    }
}
