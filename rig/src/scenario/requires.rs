//! What a scenario run needs of its harness, derived from what the file's story uses: never
//! listed by hand, and never from what the file merely names.
//!
//! - every harness function the story uses: a step invoking it (or enqueueing a call of it), a
//!   step waiting for it, a proxy rule on its frames (unless `optional`), an expectation that
//!   it is called at least once: the capability serving it. A condition that counts zero calls
//!   of it uses nothing; the expectations of a policy section judge only a harness held to the
//!   reference harness's particulars, so they count only for one;
//! - a queue's `dead_letter_function` is wiring, not a use: the story uses `dead-letters` only
//!   when it expects a dead letter (a step waits for one, an expectation counts at least one)
//!   on a queue that hands its dead letters to a harness. For a harness without a handler, a
//!   message that runs out of deliveries where the story expects none is that harness losing a
//!   turn, and the run says so;
//! - a scripted model reply streamed in `frames`: `streaming`; one calling `agent.delegate`:
//!   `delegation` (and `budgets` when it passes a budget);
//! - a seeded turn record carrying a budget: `budgets`; one naming its parent: `delegation`;
//! - a seeded control record: the capability of each command in it that a harness must still
//!   act on (a `cancel` waiting to be applied); a command already settled for an earlier turn is
//!   history, and needs nothing;
//! - a `pre-trigger` binding: `hooks`; a `turn-completed` binding: `lifecycle`;
//! - an `[[interrupt]]`: `checkpoints`;
//! - a `[world.config]` (versioned configuration and its safety overlay): `versions`.

use super::Scenario;
use crate::capability::{Capabilities, Capability, Requirements, DELEGATE_TOOL};
use crate::harness::BindingPoint;
use crate::layout::RecordLayout;
use crate::topology::{HARNESS, REPLACEMENT};
use crate::trace::{Event, EventKind};
use std::borrow::Cow;
use toml::Value;

/// The note the queue makes when a message runs out of deliveries (and its handler's notes
/// begin with it: `queue_dead_letter_handled`, ...).
const DEAD_LETTER_NOTE: &str = "queue_dead_letter";

/// The states of a command that a harness no longer acts on.
const SETTLED_COMMAND_STATES: [&str; 3] = ["applied", "rejected", "expired"];

/// Which of the process cuts and proxy rules its text scripts a scenario still has: a sweep's
/// workload is the file without them, and needs nothing of them.
#[derive(Debug, Clone, Copy)]
pub(super) struct Scripted {
    pub interrupts: bool,
    pub proxy: bool,
}

/// The requirements of a run under `policy` of the scenario written as `source`; `particulars`:
/// whether the harness is held to the policy section's own expectations too.
pub(super) fn derive(source: &str, policy: &str, particulars: bool, scripted: Scripted) -> Requirements {
    let mut needs = Requirements::default();
    // A loaded scenario's text parses; anything else has nothing to derive from.
    let Ok(mut file) = toml::from_str::<toml::Table>(source) else { return needs };
    file.remove("about");
    file.remove("needs");
    if !scripted.interrupts {
        file.remove("interrupt");
    }
    if !scripted.proxy {
        file.remove("proxy");
    }
    let policies = file.remove("policy");
    let file = Value::Table(file);
    functions_used(&file, &mut String::new(), &mut needs);
    let section = policies.as_ref().and_then(|p| p.get(policy)).filter(|_| particulars);
    if let Some(section) = section {
        functions_used(section, &mut format!("policy.{policy}"), &mut needs);
    }
    dead_letters_expected(&file, section.map(|s| (policy, s)), &mut needs);
    model_replies(&file, &mut needs);
    seeded_turns(&file, &mut needs);
    seeded_commands(&file, &mut needs);
    bindings(&file, &mut needs);
    if file.get("world").and_then(|w| w.get("config")).is_some() {
        needs.need(Capability::Versions, || "[world.config] declares versioned configuration".to_string());
    }
    for (index, interrupt) in items(&file, &["interrupt"]).enumerate() {
        let point = interrupt.get("point").and_then(Value::as_str).unwrap_or("?");
        needs.need(Capability::Checkpoints, || format!("interrupt #{} at {point}", index + 1));
    }
    needs
}

/// Every string value naming a harness function, wherever it is, but where naming it is not
/// using it: a queue's dead-letter wiring, a count of zero calls, an expectation that allows
/// none, an optional proxy rule.
fn functions_used(value: &Value, path: &mut String, needs: &mut Requirements) {
    if names_without_using(path, value) {
        return;
    }
    let length = path.len();
    match value {
        Value::String(text) => {
            if let Some(capability) = harness_function(text) {
                needs.need(capability, || format!("{path} = \"{text}\""));
            }
        }
        Value::Array(items) => {
            for (index, item) in items.iter().enumerate() {
                path.push_str(&format!(" #{}", index + 1));
                functions_used(item, path, needs);
                path.truncate(length);
            }
        }
        Value::Table(table) => {
            for (key, item) in table {
                if !path.is_empty() {
                    let after_index = path.rsplit_once(' ').is_some_and(|(_, last)| last.starts_with('#'));
                    path.push(if after_index { ' ' } else { '.' });
                }
                path.push_str(key);
                // A count of calls names its function as a key: `calls = { "harness::x" = 1 }`.
                if let (Some(capability), Some(count)) = (harness_function(key), item.as_integer()) {
                    if (count > 0 || crate::planted!("requires-zero-calls-is-a-need")) && is_calls(path) {
                        needs.need(capability, || format!("{path} = {count}"));
                    }
                } else {
                    functions_used(item, path, needs);
                }
                path.truncate(length);
            }
        }
        _ => {}
    }
}

/// Whether `path` is a `calls` expectation's entry (`expect.calls."harness::x"`).
fn is_calls(path: &str) -> bool {
    path.rsplit_once('.').is_some_and(|(before, _)| before.ends_with("expect.calls") || before == "calls")
}

/// Whether the value at `path` names functions without the story using them.
fn names_without_using(path: &str, value: &Value) -> bool {
    let last = path.rsplit(['.', ' ']).next().unwrap_or_default();
    let in_queue = path.starts_with("world.queue.");
    let is_events_entry = path.contains("expect.events #") && last.starts_with('#');
    let is_proxy_rule = path.starts_with("proxy.rule #") && last.starts_with('#');
    (in_queue && last == "dead_letter_function" && !crate::planted!("requires-dead-letter-wiring-is-a-need"))
        || (is_events_entry && allows_none(value))
        || (is_proxy_rule && value.get("optional").and_then(Value::as_bool) == Some(true))
}

/// Whether an `[[expect.events]]` entry is met by no matching event at all.
fn allows_none(entry: &Value) -> bool {
    let number = |key: &str| entry.get(key).and_then(Value::as_integer);
    match (number("count"), number("count_min")) {
        (Some(count), _) => count == 0,
        (None, Some(min)) => min == 0,
        (None, None) => true,
    }
}

/// A story that expects a dead letter on a queue that hands its dead letters to a harness
/// needs a harness that takes them: a step waiting for one, or an expectation counting at
/// least one.
fn dead_letters_expected(file: &Value, section: Option<(&str, &Value)>, needs: &mut Requirements) {
    let queues = file.get("world").and_then(|w| w.get("queue")).and_then(Value::as_table);
    let handed_to_harness = queues.into_iter().flatten().any(|(_, queue)| {
        let handler = queue.get("dead_letter_function").and_then(Value::as_str).unwrap_or_default();
        harness_function(handler) == Some(Capability::DeadLetters)
    });
    if !handed_to_harness {
        return;
    }
    for (index, step) in items(file, &["step"]).enumerate() {
        if let Some(what) = step.get("wait_until").and_then(|w| w.get("match")).and_then(|m| m.get("what")) {
            if names_dead_letter(what) {
                needs.need(Capability::DeadLetters, || format!("step #{} waits for a dead letter", index + 1));
            }
        }
    }
    let shared = file.get("expect").map(|expect| ("expect".to_string(), expect));
    let own = section.and_then(|(policy, s)| s.get("expect").map(|expect| (format!("policy.{policy}.expect"), expect)));
    for (at, expect) in shared.into_iter().chain(own) {
        let entries = expect.get("events").and_then(Value::as_array).into_iter().flatten();
        for (index, entry) in entries.enumerate() {
            let what = entry.get("match").and_then(|m| m.get("what"));
            if what.is_some_and(names_dead_letter) && !allows_none(entry) {
                needs.need(Capability::DeadLetters, || format!("{at}.events #{} expects a dead letter", index + 1));
            }
        }
    }
}

/// Whether a `what` condition (a string, or a table of tests) names one of the queue's
/// dead-letter notes.
fn names_dead_letter(what: &Value) -> bool {
    match what {
        Value::String(text) => text.starts_with(DEAD_LETTER_NOTE),
        Value::Array(items) => items.iter().any(names_dead_letter),
        Value::Table(tests) => tests.iter().any(|(test, value)| test != "ne" && names_dead_letter(value)),
        _ => false,
    }
}

/// The capability serving `text`, when it names a harness worker's function exactly.
fn harness_function(text: &str) -> Option<Capability> {
    let (host, function) = text.split_once("::")?;
    [HARNESS, REPLACEMENT].contains(&host).then(|| Capability::of_function(function)).flatten()
}

/// The items of the array of tables at `path` (`world.model`), if any.
fn items<'a>(file: &'a Value, path: &[&str]) -> impl Iterator<Item = &'a Value> {
    let found = path.iter().try_fold(file, |value, key| value.get(key));
    found.and_then(Value::as_array).into_iter().flatten()
}

fn model_replies(file: &Value, needs: &mut Requirements) {
    for (index, reply) in items(file, &["world", "model"]).enumerate() {
        let at = || format!("world.model #{}", index + 1);
        if reply.get("frames").is_some() {
            needs.need(Capability::Streaming, || format!("{} streams its reply in frames", at()));
        }
        let calls = reply.get("tool_calls").and_then(Value::as_array).into_iter().flatten();
        for call in calls.filter(|c| c.get("tool").and_then(Value::as_str) == Some(DELEGATE_TOOL)) {
            needs.need(Capability::Delegation, || format!("{} calls {DELEGATE_TOOL}", at()));
            if call.get("args").and_then(|a| a.get("budget")).is_some() {
                needs.need(Capability::Budgets, || format!("{} delegates with a budget", at()));
            }
        }
    }
}

/// Seeded turn records, in the layout scenario files write them in.
fn seeded_turns(file: &Value, needs: &mut Requirements) {
    let layout = RecordLayout::default();
    for (index, record) in items(file, &["world", "record"]).enumerate() {
        if record.get("scope").and_then(Value::as_str) != Some(layout.turn_scope.as_str()) {
            continue;
        }
        let Some(value) = record.get("value") else { continue };
        let at = || format!("world.record #{} ({}/{})", index + 1, layout.turn_scope, key(record));
        if value.get(&layout.budget_field).is_some() {
            needs.need(Capability::Budgets, || format!("{} carries a `{}`", at(), layout.budget_field));
        }
        if value.get(&layout.parent_field).is_some() {
            needs.need(Capability::Delegation, || format!("{} names its `{}`", at(), layout.parent_field));
        }
    }
}

/// Seeded control records: each command in one that a harness must still act on is the
/// business of the capability serving it; a command settled for an earlier turn, or for a turn
/// that has ended, is history.
fn seeded_commands(file: &Value, needs: &mut Requirements) {
    let layout = RecordLayout::default();
    for (index, record) in items(file, &["world", "record"]).enumerate() {
        if record.get("scope").and_then(Value::as_str) != Some(crate::layout::CONTROL_SCOPE) {
            continue;
        }
        let current = seeded_turn(file, &layout, key(record));
        let current_id = current.and_then(|turn| turn.get(&layout.turn_id_field)).and_then(Value::as_str);
        let status = current.and_then(|turn| turn.get(&layout.status_field)).and_then(Value::as_str);
        let ended = status.is_some_and(|status| layout.terminal_statuses.iter().any(|t| t == status));
        let commands = record.get("value").and_then(|v| v.get("commands")).and_then(Value::as_table);
        for (name, command) in commands.into_iter().flatten() {
            let text = |field: &str| command.get(field).and_then(Value::as_str);
            let settled = text("state").is_some_and(|state| SETTLED_COMMAND_STATES.contains(&state));
            let earlier = text("turn_id").is_some_and(|turn| current_id.is_some_and(|current| current != turn));
            if settled && (earlier || ended) && !crate::planted!("requires-settled-command-is-a-need") {
                continue;
            }
            let kind = text("command").unwrap_or_default();
            if let Some(capability) = Capability::of_function(kind) {
                let at = || {
                    format!(
                        "world.record #{} ({}/{}) holds {kind} `{name}`{}",
                        index + 1,
                        crate::layout::CONTROL_SCOPE,
                        key(record),
                        // A settled command is a need only while its turn has not ended; say which
                        // state that turn is in (paused, held, running), as the file seeds it.
                        if settled {
                            format!(" of the session's {} turn", status.unwrap_or("current"))
                        } else {
                            ", not yet settled".to_string()
                        }
                    )
                };
                needs.need(capability, at);
            }
        }
    }
}

/// The session's seeded turn record, if the file seeds one.
fn seeded_turn<'a>(file: &'a Value, layout: &RecordLayout, session: &str) -> Option<&'a Value> {
    items(file, &["world", "record"])
        .filter(|r| r.get("scope").and_then(Value::as_str) == Some(layout.turn_scope.as_str()) && key(r) == session)
        .find_map(|r| r.get("value"))
}

fn key(record: &Value) -> &str {
    record.get("key").and_then(Value::as_str).unwrap_or("?")
}

fn bindings(file: &Value, needs: &mut Requirements) {
    for (index, binding) in items(file, &["world", "binding"]).enumerate() {
        let trigger = binding.get("trigger").and_then(Value::as_str).unwrap_or("");
        let capability = match BindingPoint::ALL.into_iter().find(|point| point.name() == trigger) {
            Some(BindingPoint::PreTrigger) => Capability::Hooks,
            // (The planted bug: every binding taken for a hook.)
            Some(BindingPoint::TurnCompleted) if crate::planted!("requires-every-binding-is-a-hook") => {
                Capability::Hooks
            }
            Some(BindingPoint::TurnCompleted) => Capability::Lifecycle,
            None => continue,
        };
        needs.need(capability, || format!("world.binding #{} is a `{trigger}` binding", index + 1));
    }
}

/// The runtime side of needs: what only a run shows.
impl Scenario {
    /// This scenario as a harness declaring `declared` runs it. A queue's `dead_letter_function`
    /// is wiring, to the harness's handler when it has one: for a harness without
    /// `dead-letters` it is left unwired, so a message that runs out of deliveries is given up on
    /// at once (and `stranded` judges it) instead of being offered to a function no worker
    /// registers. The scenario is copied only when that changes it.
    pub(crate) fn wired_for(&self, declared: &Capabilities) -> Cow<'_, Scenario> {
        if declared.contains(Capability::DeadLetters) || self.queues_handing_to_harness().next().is_none() {
            return Cow::Borrowed(self);
        }
        let mut wired = self.clone();
        for (_, queue) in &mut wired.world.queues {
            if queue.dead_letter_function.as_deref().and_then(harness_function) == Some(Capability::DeadLetters) {
                queue.dead_letter_function = None;
            }
        }
        Cow::Owned(wired)
    }

    /// The queues that hand their dead letters to a harness's handler.
    fn queues_handing_to_harness(&self) -> impl Iterator<Item = &str> {
        self.world
            .queues
            .iter()
            .filter(|(_, q)| {
                q.dead_letter_function.as_deref().and_then(harness_function) == Some(Capability::DeadLetters)
            })
            .map(|(name, _)| name.as_str())
    }

    /// What a run of this scenario reached that its harness (`harness`, declaring `declared`)
    /// does not serve, and when, as the report says it: each message of a queue wired to a
    /// dead-letter handler that ran out of deliveries, for a harness without one. The file's
    /// story did not show the need (it expects no dead letter); the run did.
    pub(crate) fn reached_undeclared(&self, harness: &str, declared: &Capabilities, events: &[Event]) -> Vec<String> {
        if declared.contains(Capability::DeadLetters) {
            return Vec::new();
        }
        let wired: Vec<&str> = self.queues_handing_to_harness().collect();
        let gave_up = |event: &Event| match &event.kind {
            EventKind::Note { what, detail } if what == DEAD_LETTER_NOTE => {
                let queue = detail["queue"].as_str().unwrap_or_default();
                wired.contains(&queue).then(|| {
                    format!(
                        "at {} ms queue `{queue}` gave up on message {} after {} deliveries ({}); its \
                         `dead_letter_function` names a handler, and harness `{harness}` does not declare \
                         `dead-letters`, so nothing took it (the file's story expects no dead letter, so it \
                         runs for this harness, and is judged)",
                        event.at_ms,
                        detail["message_id"].as_str().unwrap_or("?"),
                        detail["attempt"],
                        detail["reason"].as_str().unwrap_or("no reason given"),
                    )
                })
            }
            _ => None,
        };
        events.iter().filter_map(gave_up).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn needs(source: &str, policy: &str) -> Vec<(&'static str, String)> {
        needs_judged(source, policy, true)
    }

    fn needs_judged(source: &str, policy: &str, particulars: bool) -> Vec<(&'static str, String)> {
        let all = Scripted { interrupts: true, proxy: true };
        derive(source, policy, particulars, all).iter().map(|(c, why)| (c.name(), why.to_string())).collect()
    }

    fn names(needs: Vec<(&'static str, String)>) -> Vec<&'static str> {
        needs.into_iter().map(|(c, _)| c).collect()
    }

    #[test]
    fn functions_the_story_uses_are_needed_and_other_policies_and_about_are_not() {
        let source = r#"
about = "mentions harness::status, which asks for nothing"
[[step]]
invoke = { function = "harness::turn", payload = {} }
[[step]]
invoke = { function = "replacement::import", payload = {} }
[[step]]
invoke = { function = "queue::enqueue", payload = { queue = "q", function_id = "harness::send", data = {} } }
[[step]]
wait_until = { match = { kind = "frame", function_id = "harness::status" }, within_ms = 10 }
[expect]
calls = { "harness::resolve" = 1 }
[policy.reference]
expect.events = [{ match = { kind = "call", function = "harness::cancel" }, count_min = 1 }]
[policy.swallow]
expect.events = [{ match = { kind = "call", function = "harness::stop" }, count = 2 }]
"#;
        assert_eq!(
            needs(source, "reference"),
            vec![
                ("turns", "step #1 invoke.function = \"harness::turn\"".to_string()),
                ("switch", "step #2 invoke.function = \"replacement::import\"".to_string()),
                ("send", "step #3 invoke.payload.function_id = \"harness::send\"".to_string()),
                ("status", "step #4 wait_until.match.function_id = \"harness::status\"".to_string()),
                ("cancel", "policy.reference.expect.events #1 match.function = \"harness::cancel\"".to_string()),
                ("hooks", "expect.calls.harness::resolve = 1".to_string()),
            ]
        );
        assert_eq!(names(needs(source, "swallow")), vec!["turns", "switch", "send", "status", "stop", "hooks"]);
        // A policy section's own expectations judge only a harness held to the reference
        // harness's particulars: for any other, they use nothing.
        assert_eq!(names(needs_judged(source, "reference", false)), vec!["turns", "switch", "send", "status", "hooks"]);
    }

    #[test]
    fn naming_a_function_without_using_it_needs_nothing() {
        let source = r#"
[world.queue.harness-turn]
dead_letter_function = "harness::dead-letter"
[proxy]
worker = "harness"
[[proxy.rule]]
action = "drop"
optional = true
match = { type = "invokefunction", function_id = "harness::stream" }
[[step]]
invoke = { function = "harness::turn", payload = {}, queue = "harness-turn" }
[expect]
calls = { "harness::cancel" = 0 }
events = [
  { match = { kind = "frame", function_id = "harness::stop" }, count = 0 },
  { match = { kind = "frame", function_id = "harness::pause" }, count_max = 3 },
  { match = { kind = "frame", function_id = "harness::resume" }, count_min = 0 },
  { match = { kind = "note", what = "queue_dead_letter" }, count = 0 },
]
[policy.reference]
"#;
        assert_eq!(names(needs(source, "reference")), vec!["turns"]);
    }

    #[test]
    fn a_story_expecting_a_dead_letter_handed_to_the_harness_needs_dead_letters() {
        let wired = "[world.queue.harness-turn]\ndead_letter_function = \"harness::dead-letter\"\n";
        let waits = "[[step]]\nwait_until = { match = { kind = \"note\", what = { one_of = [\"queue_dead_letter_handled\", \"queue_dead_letter_unhandled\"] } }, within_ms = 10 }\n";
        let counts = "[expect]\nevents = [{ match = { kind = \"note\", what = \"queue_dead_letter\" }, count = 1 }]\n";
        let policy = "[policy.reference]\n";
        assert_eq!(
            needs(&format!("{wired}{waits}{policy}"), "reference"),
            vec![("dead-letters", "step #1 waits for a dead letter".to_string())]
        );
        assert_eq!(
            needs(&format!("{wired}{counts}{policy}"), "reference"),
            vec![("dead-letters", "expect.events #1 expects a dead letter".to_string())]
        );
        // The same story on a queue with no handler, or one that is not the harness's, expects
        // the queue to give up: nothing of the harness.
        assert_eq!(needs(&format!("{waits}{counts}{policy}"), "reference"), vec![]);
        let elsewhere = "[world.queue.harness-turn]\ndead_letter_function = \"audit::record\"\n";
        assert_eq!(needs(&format!("{elsewhere}{waits}{counts}{policy}"), "reference"), vec![]);
        let not = "[[step]]\nwait_until = { match = { kind = \"note\", what = { ne = \"queue_dead_letter\" } }, within_ms = 10 }\n";
        assert_eq!(needs(&format!("{wired}{not}{policy}"), "reference"), vec![], "a wait for anything else");
    }

    #[test]
    fn world_features_are_needed_from_the_world_they_build() {
        let source = r#"
[[world.record]]
scope = "harness_turn"
key = "s1~t1"
value = { status = "running", budget = { limits = {} }, parent = { session_id = "s1", turn_id = "t1" } }
[[world.record]]
scope = "elsewhere"
key = "x"
value = { budget = 1 }
[[world.model]]
frames = [{ type = "start" }]
[[world.model]]
tool_calls = [{ tool = "agent.delegate", args = { task = "t" } }]
[[world.binding]]
trigger = "turn-completed"
function = "audit::record"
[[world.binding]]
trigger = "pre-trigger"
function = "policy::check"
[[interrupt]]
worker = "harness"
point = "before_submission"
action = "freeze"
[policy.reference]
"#;
        assert_eq!(
            needs(source, "reference"),
            vec![
                ("checkpoints", "interrupt #1 at before_submission".to_string()),
                ("hooks", "world.binding #2 is a `pre-trigger` binding".to_string()),
                ("lifecycle", "world.binding #1 is a `turn-completed` binding".to_string()),
                ("streaming", "world.model #1 streams its reply in frames".to_string()),
                ("delegation", "world.model #2 calls agent.delegate".to_string()),
                ("budgets", "world.record #1 (harness_turn/s1~t1) carries a `budget`".to_string()),
            ]
        );
    }

    #[test]
    fn each_command_a_seeded_control_record_holds_that_is_not_history_is_needed() {
        let source = r#"
[[world.record]]
scope = "harness_turn"
key = "s1"
value = { session_id = "s1", turn_id = "t2", status = "running", step = 1 }
[[world.record]]
scope = "harness_control"
key = "s1"
value = { commands = { p1 = { command = "pause", turn_id = "t2", state = "applied" }, c1 = { command = "cancel", turn_id = "t2", state = "accepted" }, x = { command = "teleport" }, s1 = { command = "stop", turn_id = "t1", state = "applied" }, r1 = { command = "resume", turn_id = "t1", state = "accepted" } } }
[[world.record]]
scope = "elsewhere"
key = "s1"
value = { commands = { s1 = { command = "stop" } } }
[policy.reference]
"#;
        assert_eq!(
            needs(source, "reference"),
            vec![
                ("cancel", "world.record #2 (harness_control/s1) holds cancel `c1`, not yet settled".to_string()),
                (
                    "pause-resume",
                    "world.record #2 (harness_control/s1) holds pause `p1` of the session's running turn".to_string()
                ),
            ],
            "the stop applied to an earlier turn is history; a resume of one still accepted is not (but pause \
             came first)"
        );
        let only_history = r#"
[[world.record]]
scope = "harness_turn"
key = "s1"
value = { session_id = "s1", turn_id = "t2", status = "running", step = 1 }
[[world.record]]
scope = "harness_control"
key = "s1"
value = { commands = { s1 = { command = "stop", turn_id = "t1", state = "applied" }, c0 = { command = "cancel", turn_id = "t0", state = "rejected" } } }
[policy.reference]
"#;
        assert_eq!(names(needs(only_history, "reference")), Vec::<&str>::new());
        // Settled for a turn that has ended since: history too.
        let ended = only_history.replace(
            "value = { commands = {",
            "value = { commands = { p2 = { command = \"pause\", turn_id = \"t2\", state = \"applied\" }, ",
        );
        assert_eq!(names(needs(&ended, "reference")), vec!["pause-resume"], "t2 is running");
        let ended = ended.replace("status = \"running\"", "status = \"completed\"");
        assert_eq!(names(needs(&ended, "reference")), Vec::<&str>::new());
    }

    #[test]
    fn a_plain_turn_needs_nothing_beyond_turns() {
        let source = "[[step]]\ninvoke = { function = \"harness::turn\", payload = {} }\n[policy.reference]\n";
        assert_eq!(
            needs(source, "reference"),
            vec![("turns", "step #1 invoke.function = \"harness::turn\"".to_string())]
        );
    }

    /// A harness without a dead-letter handler is run on the queue unwired, and the report says
    /// when a message of it ran out of deliveries; a harness with one is run as the file says.
    #[test]
    fn a_dead_letter_handler_is_wiring_to_a_harness_that_has_one() {
        let source = "[world.queue.harness-turn]\ndead_letter_function = \"harness::dead-letter\"\n\
                      [world.queue.audit]\ndead_letter_function = \"harness::turn\"\n\
                      [[step]]\nwait_ms = 1\n[policy.reference]\n";
        let scenario = Scenario::parse(std::path::Path::new("wired.toml"), source).unwrap();
        let turns = Capabilities::default();
        assert!(matches!(scenario.wired_for(&Capabilities::all()), Cow::Borrowed(_)));
        let wired = scenario.wired_for(&turns);
        let handlers: Vec<Option<&str>> =
            wired.world.queues.iter().map(|(_, q)| q.dead_letter_function.as_deref()).collect();
        assert_eq!(handlers, vec![Some("harness::turn"), None], "audit keeps a handler that is no dead-letter one");
        let note = |queue: &str| Event {
            at_ms: 1109,
            host: "queue".into(),
            kind: EventKind::Note {
                what: DEAD_LETTER_NOTE.into(),
                detail: serde_json::json!({ "queue": queue, "message_id": "m1", "attempt": 4, "reason": "error result: function_not_found" }),
            },
        };
        let events = [note("harness-turn"), note("audit")];
        let reached = scenario.reached_undeclared("small", &turns, &events);
        assert_eq!(reached.len(), 1, "{reached:?}");
        assert!(
            reached[0].starts_with("at 1109 ms queue `harness-turn` gave up on message m1 after 4 deliveries"),
            "{}",
            reached[0]
        );
        assert!(scenario.reached_undeclared("reference", &Capabilities::all(), &events).is_empty());
    }
}
