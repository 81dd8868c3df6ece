//! The oracles of versioned configuration, judged from the requests the model and the tools
//! received and from the configuration service's own account of its overlay; in a world
//! without `[world.config]` they have nothing to judge.

use super::{violation, Derived, Evidence, Oracle, Violation};
use crate::topology::{CONFIG, DRIVER};
use crate::trace::EventKind;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};

/// `pinned-config`: every generation request of a turn carries one and the same configuration
/// version (`config_version`), one the world defines, with that version's system prompt and
/// model profile. A turn that changes version after a crash, a redelivery, a release or an
/// import ran on "latest", not on its pin.
pub(super) fn pinned_config(evidence: &Evidence<'_>, violations: &mut Vec<Violation>) {
    let Some(config) = evidence.config else { return };
    let mut pinned: BTreeMap<String, String> = BTreeMap::new();
    let mut reported: BTreeSet<String> = BTreeSet::new();
    let mut requests: BTreeSet<&str> = BTreeSet::new();
    for event in evidence.events {
        let EventKind::Call { function, payload, caller, invocation_id, .. } = &event.kind else { continue };
        if function != "model::generate" || caller.as_deref() == Some(DRIVER) {
            continue;
        }
        if invocation_id.as_deref().is_some_and(|id| !requests.insert(id)) {
            continue;
        }
        let turn = payload["turn_id"].as_str().unwrap_or_default().to_string();
        let problem = match payload["config_version"].as_str() {
            None if crate::planted!("pinned-config-unversioned-passes") => None,
            None => Some("carried no `config_version`".to_string()),
            Some(version) => match config.versions.get(version) {
                None => Some(format!("carried `config_version` {version}, which the world does not define")),
                Some(manifest) if payload["system_prompt"] != manifest.system_prompt.as_str() => {
                    Some(format!("carried version {version} with another version's system prompt"))
                }
                Some(manifest) if payload["model_profile"] != manifest.model_profile.as_str() => {
                    Some(format!("carried version {version} with another model profile"))
                }
                Some(_) => match pinned.get(&turn) {
                    Some(first) if first != version => Some(format!("ran on version {version}, after {first}")),
                    Some(_) => None,
                    None => {
                        pinned.insert(turn.clone(), version.to_string());
                        None
                    }
                },
            },
        };
        if let Some(problem) = problem.filter(|_| reported.insert(turn.clone())) {
            violations.push(violation(
                Oracle::PinnedConfig,
                format!("a generation request of turn {turn} at {} ms {problem}", event.at_ms),
            ));
        }
    }
}

/// What one worker last learnt of the overlay for one turn, and whether it has looked since
/// its last request for that turn.
#[derive(Default)]
struct Looked {
    excluded: BTreeSet<String>,
    since_last_request: bool,
}

/// `safety-overlay`: a worker consults the overlay for a turn (`config::overlay` with the
/// turn's id) before each generation and each tool call it makes for that turn, and never
/// offers or calls a tool the overlay it read last took away. Both follow from the requests
/// themselves, so a revocation that lands between the worker's look and its request (it
/// cannot have known) is no violation.
pub(super) fn safety_overlay<'a>(evidence: &Evidence<'a>, derived: &Derived<'a>, violations: &mut Vec<Violation>) {
    if evidence.config.is_none() {
        return;
    }
    let turns = derived.action_turns(evidence);
    let tool_of: BTreeMap<&str, &str> =
        evidence.tool_functions.iter().map(|(tool, function)| (function.as_str(), tool.as_str())).collect();
    let mut excluded: BTreeSet<String> = BTreeSet::new();
    let mut looked: BTreeMap<(String, String), Looked> = BTreeMap::new();
    let mut reported: BTreeSet<(Oracle, String)> = BTreeSet::new();
    let mut requests: BTreeSet<&str> = BTreeSet::new();
    for event in evidence.events {
        match &event.kind {
            EventKind::Note { what, detail } if event.host == CONFIG && what == "overlay_changed" => {
                excluded = names(&detail["excluded"]);
            }
            EventKind::Call { function, payload, caller: Some(worker), invocation_id, .. } if worker != DRIVER => {
                if invocation_id.as_deref().is_some_and(|id| !requests.insert(id)) {
                    continue;
                }
                let (turn, used) = if function == "config::overlay" {
                    let turn = payload["turn_id"].as_str().unwrap_or_default().to_string();
                    let turn = if crate::planted!("safety-overlay-any-look-counts") { String::new() } else { turn };
                    looked.insert(
                        (worker.to_string(), turn),
                        Looked { excluded: excluded.clone(), since_last_request: true },
                    );
                    continue;
                } else if function == "model::generate" {
                    let offered = payload["tools"].as_array().into_iter().flatten().filter_map(|t| t["name"].as_str());
                    (payload["turn_id"].as_str().unwrap_or_default().to_string(), offered.map(str::to_string).collect())
                } else if let Some(tool) = tool_of.get(function.as_str()) {
                    let action = payload["action_id"].as_str().unwrap_or_default();
                    let Some(turn) = turns.get(action) else { continue };
                    (turn.to_string(), BTreeSet::from([tool.to_string()]))
                } else {
                    continue;
                };
                let what = if function == "model::generate" { "generation request" } else { "call" };
                let seen = match crate::planted!("safety-overlay-any-look-counts") {
                    // (The planted bug: a look for any turn counts for this one.)
                    true => looked.entry((worker.to_string(), String::new())).or_default(),
                    false => looked.entry((worker.to_string(), turn.clone())).or_default(),
                };
                let problem = if !seen.since_last_request {
                    Some(format!("`{worker}` sent a {what} (`{function}`) for turn {turn} at {} ms without consulting the safety overlay since its last request for the turn", event.at_ms))
                } else {
                    let taken: Vec<&String> = used.intersection(&seen.excluded).collect();
                    (!taken.is_empty()).then(|| {
                        let taken: Vec<&str> = taken.iter().map(|t| t.as_str()).collect();
                        format!("`{worker}` sent a {what} (`{function}`) for turn {turn} at {} ms using {}, which the overlay it had just read took away", event.at_ms, taken.join(", "))
                    })
                };
                seen.since_last_request = false;
                if let Some(problem) = problem.filter(|_| reported.insert((Oracle::SafetyOverlay, turn))) {
                    violations.push(violation(Oracle::SafetyOverlay, problem));
                }
            }
            _ => {}
        }
    }
}

fn names(list: &Value) -> BTreeSet<String> {
    list.as_array().into_iter().flatten().filter_map(|v| v.as_str().map(str::to_string)).collect()
}
