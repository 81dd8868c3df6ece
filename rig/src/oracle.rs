//! Oracles: what every run checks, whatever the scenario expects.
//!
//! They judge from what the services saw (the store's commits, its final contents, the effect
//! ledger), never from the harness's own account of what it did.

use crate::trace::{Event, EventKind};
use doubles::StateStore;
use serde::Serialize;
use serde_json::Value;
use std::collections::BTreeMap;

/// An always-on check.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Oracle {
    /// No logical action produced more external effects than allowed.
    Effects,
    /// Once faults are healed, every turn ends terminal, or held with a recorded reason.
    Liveness,
    /// A terminal turn never goes back to a non-terminal status.
    Monotonic,
}

impl Oracle {
    pub const ALL: [Oracle; 3] = [Oracle::Effects, Oracle::Liveness, Oracle::Monotonic];

    pub fn name(self) -> &'static str {
        match self {
            Oracle::Effects => "effects",
            Oracle::Liveness => "liveness",
            Oracle::Monotonic => "monotonic",
        }
    }

    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|o| o.name() == name)
    }
}

/// An oracle that fired, with what it saw.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Violation {
    pub oracle: Oracle,
    pub detail: String,
}

/// The turn records' scope in the store.
pub const TURN_SCOPE: &str = "harness_turn";
const TERMINAL: [&str; 3] = ["completed", "failed", "cancelled"];

fn status(record: &Value) -> &str {
    record["status"].as_str().unwrap_or("")
}

fn is_terminal(record: &Value) -> bool {
    TERMINAL.contains(&status(record))
}

/// What the oracles need to know about a finished run.
pub struct Evidence<'a> {
    pub events: &'a [Event],
    pub store: &'a StateStore,
    /// When the final heal happened and how long turns had afterwards to settle.
    pub healed_at_ms: u64,
    pub ended_at_ms: u64,
    /// Whether the run ended because nothing could happen any more (rather than at its bound).
    pub quiescent: bool,
    pub effects_per_action_max: u64,
}

/// Runs every oracle.
pub fn check(evidence: &Evidence<'_>) -> Vec<Violation> {
    let mut violations = Vec::new();
    effects(evidence, &mut violations);
    liveness(evidence, &mut violations);
    monotonic(evidence, &mut violations);
    violations
}

fn effects(evidence: &Evidence<'_>, violations: &mut Vec<Violation>) {
    let mut per_action: BTreeMap<(&str, &str), u64> = BTreeMap::new();
    for event in evidence.events {
        if let EventKind::Effect { effect, action, accepted: true, .. } = &event.kind {
            *per_action.entry((effect.as_str(), action.as_str())).or_default() += 1;
        }
    }
    for ((kind, action), count) in per_action {
        if count > evidence.effects_per_action_max {
            violations.push(Violation {
                oracle: Oracle::Effects,
                detail: format!(
                    "action `{action}` produced {count} `{kind}` effects (at most {} allowed)",
                    evidence.effects_per_action_max
                ),
            });
        }
    }
}

fn liveness(evidence: &Evidence<'_>, violations: &mut Vec<Violation>) {
    let settled_ms = evidence.ended_at_ms.saturating_sub(evidence.healed_at_ms);
    let why = if evidence.quiescent {
        format!("and the world went quiet {settled_ms} ms after the faults were healed, with nothing left to run")
    } else {
        format!("{settled_ms} ms after the faults were healed")
    };
    for (scope, key, record) in evidence.store.records() {
        if scope != TURN_SCOPE || is_terminal(record) {
            continue;
        }
        let held_with_reason =
            status(record) == "held" && record["held_reason"].as_str().is_some_and(|r| !r.is_empty());
        if !held_with_reason {
            violations.push(Violation {
                oracle: Oracle::Liveness,
                detail: format!(
                    "turn {}/{} is still `{}` at step {} {why}",
                    key,
                    record["turn_id"].as_str().unwrap_or("?"),
                    status(record),
                    record["step"]
                ),
            });
        }
    }
}

fn monotonic(evidence: &Evidence<'_>, violations: &mut Vec<Violation>) {
    let mut terminal_turns: BTreeMap<String, (u64, String)> = BTreeMap::new();
    for event in evidence.events {
        let EventKind::Commit { scope, value, .. } = &event.kind else {
            continue;
        };
        if scope != TURN_SCOPE || value.is_null() {
            continue;
        }
        let turn = value["turn_id"].as_str().unwrap_or("?").to_string();
        if is_terminal(value) {
            terminal_turns.entry(turn).or_insert((event.at_ms, status(value).to_string()));
        } else if let Some((at_ms, was)) = terminal_turns.get(&turn) {
            violations.push(Violation {
                oracle: Oracle::Monotonic,
                detail: format!(
                    "turn {turn} went from `{was}` (at {at_ms} ms) back to `{}` at {} ms",
                    status(value),
                    event.at_ms
                ),
            });
        }
    }
}
