//! What a scenario run needs of its harness, derived from the file: never listed by hand.
//!
//! - every harness function the file names (`harness::export` in a step, a queue's
//!   `dead_letter_function`, a proxy rule's `function_id`, a condition on calls), outside
//!   `about` and outside the sections of other policies: the capability serving it;
//! - a scripted model reply streamed in `frames`: `streaming`; one calling `agent.delegate`:
//!   `delegation` (and `budgets` when it passes a budget);
//! - a seeded turn record carrying a budget: `budgets`; one naming its parent: `delegation`;
//! - a seeded control record: the capability of each command it holds (a `cancel` waiting to be
//!   applied needs a harness that applies it);
//! - a `pre-trigger` binding: `hooks`; a `turn-completed` binding: `lifecycle`;
//! - an `[[interrupt]]`: `checkpoints`;
//! - a `[world.config]` (versioned configuration and its safety overlay): `versions`.

use crate::capability::{Capability, Requirements, DELEGATE_TOOL};
use crate::harness::BindingPoint;
use crate::layout::RecordLayout;
use crate::topology::{HARNESS, REPLACEMENT};
use toml::Value;

/// The requirements of a run under `policy` of the scenario written as `source`.
pub(super) fn derive(source: &str, policy: &str) -> Requirements {
    let mut needs = Requirements::default();
    // A loaded scenario's text parses; anything else has nothing to derive from.
    let Ok(mut file) = toml::from_str::<toml::Table>(source) else { return needs };
    file.remove("about");
    let policies = file.remove("policy");
    let file = Value::Table(file);
    functions_named(&file, &mut String::new(), &mut needs);
    if let Some(section) = policies.as_ref().and_then(|p| p.get(policy)) {
        functions_named(section, &mut format!("policy.{policy}"), &mut needs);
    }
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

/// Every string value naming a harness function, wherever it is.
fn functions_named(value: &Value, path: &mut String, needs: &mut Requirements) {
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
                functions_named(item, path, needs);
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
                functions_named(item, path, needs);
                path.truncate(length);
            }
        }
        _ => {}
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

/// Seeded control records: each command in one is the business of the capability serving it.
fn seeded_commands(file: &Value, needs: &mut Requirements) {
    for (index, record) in items(file, &["world", "record"]).enumerate() {
        if record.get("scope").and_then(Value::as_str) != Some(crate::layout::CONTROL_SCOPE) {
            continue;
        }
        let commands = record.get("value").and_then(|v| v.get("commands")).and_then(Value::as_table);
        for (name, command) in commands.into_iter().flatten() {
            let kind = command.get("command").and_then(Value::as_str).unwrap_or_default();
            if let Some(capability) = Capability::of_function(kind) {
                let at = || {
                    format!(
                        "world.record #{} ({}/{}) holds {kind} `{name}`",
                        index + 1,
                        crate::layout::CONTROL_SCOPE,
                        key(record)
                    )
                };
                needs.need(capability, at);
            }
        }
    }
}

fn key(record: &Value) -> &str {
    record.get("key").and_then(Value::as_str).unwrap_or("?")
}

fn bindings(file: &Value, needs: &mut Requirements) {
    for (index, binding) in items(file, &["world", "binding"]).enumerate() {
        let trigger = binding.get("trigger").and_then(Value::as_str).unwrap_or("");
        let capability = match BindingPoint::ALL.into_iter().find(|point| point.name() == trigger) {
            Some(BindingPoint::PreTrigger) => Capability::Hooks,
            Some(BindingPoint::TurnCompleted) => Capability::Lifecycle,
            None => continue,
        };
        needs.need(capability, || format!("world.binding #{} is a `{trigger}` binding", index + 1));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn needs(source: &str, policy: &str) -> Vec<(&'static str, String)> {
        derive(source, policy).iter().map(|(c, why)| (c.name(), why.to_string())).collect()
    }

    #[test]
    fn functions_named_anywhere_but_about_and_other_policies_are_needed() {
        let source = r#"
about = "mentions harness::status, which asks for nothing"
[world.queue.harness-turn]
dead_letter_function = "harness::dead-letter"
[[step]]
invoke = { function = "harness::turn", payload = {} }
[[step]]
invoke = { function = "replacement::import", payload = {} }
[policy.reference]
expect.events = [{ match = { kind = "call", function = "harness::cancel" }, count = 0 }]
[policy.swallow]
expect.events = [{ match = { kind = "call", function = "harness::stop" }, count = 0 }]
"#;
        assert_eq!(
            needs(source, "reference"),
            vec![
                ("turns", "step #1 invoke.function = \"harness::turn\"".to_string()),
                ("switch", "step #2 invoke.function = \"replacement::import\"".to_string()),
                ("cancel", "policy.reference.expect.events #1 match.function = \"harness::cancel\"".to_string()),
                (
                    "dead-letters",
                    "world.queue.harness-turn.dead_letter_function = \"harness::dead-letter\"".to_string()
                ),
            ]
        );
        let swallow: Vec<&str> = needs(source, "swallow").into_iter().map(|(c, _)| c).collect();
        assert_eq!(swallow, vec!["turns", "switch", "stop", "dead-letters"]);
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
    fn each_command_a_seeded_control_record_holds_is_needed() {
        let source = r#"
[[world.record]]
scope = "harness_control"
key = "s1"
value = { commands = { p1 = { command = "pause", state = "applied" }, c1 = { command = "cancel", state = "accepted" }, x = { command = "teleport" } } }
[[world.record]]
scope = "elsewhere"
key = "s1"
value = { commands = { s1 = { command = "stop" } } }
[policy.reference]
"#;
        assert_eq!(
            needs(source, "reference"),
            vec![
                ("cancel", "world.record #1 (harness_control/s1) holds cancel `c1`".to_string()),
                ("pause-resume", "world.record #1 (harness_control/s1) holds pause `p1`".to_string()),
            ]
        );
    }

    #[test]
    fn a_plain_turn_needs_nothing_beyond_turns() {
        let source = "[[step]]\ninvoke = { function = \"harness::turn\", payload = {} }\n[policy.reference]\n";
        assert_eq!(
            needs(source, "reference"),
            vec![("turns", "step #1 invoke.function = \"harness::turn\"".to_string())]
        );
    }
}
