//! Oracles: what every run checks, whatever the scenario expects.
//!
//! They judge from what the services saw (the store's commits, its final contents, the effect
//! ledger), never from the harness's own account of what it did.

use crate::trace::{Event, EventKind};
use doubles::{StateStore, TicketService};
use serde::Serialize;
use serde_json::Value;
use std::collections::BTreeMap;

/// An always-on check.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Oracle {
    /// No logical action produced more external effects than allowed.
    Effects,
    /// No write or effect carrying a fencing token older than the latest granted for its
    /// ownership domain was accepted.
    Fencing,
    /// No action was sent to a service again without a reconciliation request (a key check or
    /// a lookup by reference) for it reaching that service first.
    BlindReplay,
    /// Once faults are healed, every turn ends terminal, or held with a recorded reason.
    Liveness,
    /// A terminal turn never goes back to a non-terminal status.
    Monotonic,
}

impl Oracle {
    pub const ALL: [Oracle; 5] =
        [Oracle::Effects, Oracle::Fencing, Oracle::BlindReplay, Oracle::Liveness, Oracle::Monotonic];

    pub fn name(self) -> &'static str {
        match self {
            Oracle::Effects => "effects",
            Oracle::Fencing => "fencing",
            Oracle::BlindReplay => "blind-replay",
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
    fencing(evidence, &mut violations);
    blind_replay(evidence, &mut violations);
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

fn fencing(evidence: &Evidence<'_>, violations: &mut Vec<Violation>) {
    let mut latest: BTreeMap<&str, u64> = BTreeMap::new();
    let stale = |domain: &str, token: u64, latest: &BTreeMap<&str, u64>| latest.get(domain).is_some_and(|&l| token < l);
    for event in evidence.events {
        match &event.kind {
            EventKind::Lease { domain, token, .. } => {
                let newest = latest.entry(domain.as_str()).or_insert(*token);
                *newest = (*newest).max(*token);
            }
            EventKind::Fenced { scope, key, domain, token, accepted: true } if stale(domain, *token, &latest) => {
                violations.push(Violation {
                    oracle: Oracle::Fencing,
                    detail: format!("write to {scope}/{key} with token {token} accepted at {} ms after token {} was granted for {domain}", event.at_ms, latest[domain.as_str()]),
                });
            }
            EventKind::Effect { effect, action, token: Some(token), domain: Some(domain), accepted: true, .. }
                if stale(domain, *token, &latest) =>
            {
                violations.push(Violation {
                    oracle: Oracle::Fencing,
                    detail: format!("`{effect}` for action `{action}` with token {token} accepted at {} ms after token {} was granted for {domain}", event.at_ms, latest[domain.as_str()]),
                });
            }
            _ => {}
        }
    }
}

/// What the services have seen of one action.
#[derive(Default)]
struct ActionSeen {
    keys: std::collections::BTreeSet<String>,
    references: std::collections::BTreeSet<String>,
    sent: bool,
    reconciled_since_sent: bool,
}

fn blind_replay(evidence: &Evidence<'_>, violations: &mut Vec<Violation>) {
    let mut actions: BTreeMap<String, ActionSeen> = BTreeMap::new();
    let text = |value: &Value, field: &str| value[field].as_str().map(str::to_string);
    for event in evidence.events {
        match &event.kind {
            EventKind::Call { function, payload, .. } if function == TicketService::EFFECT_FUNCTION => {
                if let Some(action) = text(payload, "action_id") {
                    let seen = actions.entry(action).or_default();
                    seen.keys.extend(text(payload, "idempotency_key"));
                    seen.references.extend(text(payload, "client_reference"));
                }
            }
            // A reconciliation names the action by a key or a reference it was sent with before.
            EventKind::Call { function, payload, .. }
                if TicketService::RECONCILE_FUNCTIONS.iter().any(|(f, _)| f == function) =>
            {
                let key = text(payload, "idempotency_key");
                let reference = text(payload, "client_reference");
                for seen in actions.values_mut().filter(|s| s.sent) {
                    let names_it = key.as_ref().is_some_and(|k| seen.keys.contains(k))
                        || reference.as_ref().is_some_and(|r| seen.references.contains(r));
                    if names_it {
                        seen.reconciled_since_sent = true;
                    }
                }
            }
            // A stale-token refusal is the fencing oracle's business, and changes nothing.
            EventKind::Effect { reason, .. } if reason == "stale token" => {}
            EventKind::Effect { effect, action, .. } => {
                let seen = actions.entry(action.clone()).or_default();
                if seen.sent && !seen.reconciled_since_sent {
                    violations.push(Violation {
                        oracle: Oracle::BlindReplay,
                        detail: format!("action `{action}` was sent to `{effect}` again at {} ms with no reconciliation reaching the service since it was last sent", event.at_ms),
                    });
                }
                seen.sent = true;
                seen.reconciled_since_sent = false;
            }
            _ => {}
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn event(at_ms: u64, kind: EventKind) -> Event {
        Event { at_ms, host: "test".into(), kind }
    }

    fn call(at_ms: u64, function: &str, payload: Value) -> Event {
        event(at_ms, EventKind::Call { service: "tickets".into(), function: function.into(), payload })
    }

    fn effect(at_ms: u64, token: Option<u64>, accepted: bool, reason: &str) -> Event {
        event(
            at_ms,
            EventKind::Effect {
                effect: "ticket.create".into(),
                action: "a1".into(),
                idempotency_key: Some("k1".into()),
                token,
                domain: token.map(|_| "harness_owner/s1".to_string()),
                accepted,
                reason: reason.into(),
            },
        )
    }

    fn create(at_ms: u64) -> Event {
        call(at_ms, "ticket::create", json!({"action_id": "a1", "idempotency_key": "k1", "client_reference": "a1"}))
    }

    fn lease(at_ms: u64, token: u64) -> Event {
        event(at_ms, EventKind::Lease { domain: "harness_owner/s1".into(), owner: "w".into(), token, expires_at_ms: 0 })
    }

    fn fired(events: &[Event]) -> Vec<Oracle> {
        let store = StateStore::new();
        let evidence = Evidence {
            events,
            store: &store,
            healed_at_ms: 0,
            ended_at_ms: 0,
            quiescent: true,
            effects_per_action_max: 1,
        };
        check(&evidence).into_iter().map(|v| v.oracle).collect()
    }

    #[test]
    fn effects_counts_accepted_effects_per_action() {
        assert!(fired(&[create(1), effect(1, None, true, "created")]).is_empty());
        let duplicate_refused = [
            create(1),
            effect(1, None, true, "created"),
            call(2, "ticket::status", json!({"idempotency_key": "k1"})),
            create(3),
            effect(3, None, false, "duplicate key"),
        ];
        assert!(fired(&duplicate_refused).is_empty());
        let twice = [
            create(1),
            effect(1, None, true, "created"),
            call(2, "ticket::lookup", json!({"client_reference": "a1"})),
            create(3),
            effect(3, None, true, "created"),
        ];
        assert_eq!(fired(&twice), vec![Oracle::Effects]);
    }

    #[test]
    fn fencing_catches_an_accepted_stale_token_only() {
        let refused = [lease(0, 1), lease(5, 2), create(6), effect(6, Some(1), false, "stale token")];
        assert!(fired(&refused).is_empty());
        let current = [lease(0, 1), lease(5, 2), create(6), effect(6, Some(2), true, "created")];
        assert!(fired(&current).is_empty());
        let accepted_stale = [lease(0, 1), lease(5, 2), create(6), effect(6, Some(1), true, "created")];
        assert_eq!(fired(&accepted_stale), vec![Oracle::Fencing]);
        let stale_write = [
            lease(0, 1),
            lease(5, 2),
            event(
                6,
                EventKind::Fenced {
                    scope: "t".into(),
                    key: "s1".into(),
                    domain: "harness_owner/s1".into(),
                    token: 1,
                    accepted: true,
                },
            ),
        ];
        assert_eq!(fired(&stale_write), vec![Oracle::Fencing]);
    }

    #[test]
    fn blind_replay_needs_a_reconciliation_naming_the_action_between_sends() {
        let reconciled = [
            create(1),
            effect(1, None, true, "created"),
            call(2, "ticket::status", json!({"idempotency_key": "k1"})),
            create(3),
            effect(3, None, false, "duplicate key"),
        ];
        assert!(fired(&reconciled).is_empty());
        let blind = [create(1), effect(1, None, true, "created"), create(3), effect(3, None, false, "duplicate key")];
        assert_eq!(fired(&blind), vec![Oracle::BlindReplay]);
        // A check for some other key does not reconcile this action.
        let wrong_key = [
            create(1),
            effect(1, None, true, "created"),
            call(2, "ticket::status", json!({"idempotency_key": "k2"})),
            create(3),
            effect(3, None, false, "duplicate key"),
        ];
        assert_eq!(fired(&wrong_key), vec![Oracle::BlindReplay]);
        // A stale worker's refused request is fencing's business.
        let fenced =
            [create(1), effect(1, Some(2), true, "created"), create(3), effect(3, Some(1), false, "stale token")];
        assert!(fired(&fenced).is_empty());
    }

    #[test]
    fn monotonic_catches_a_terminal_turn_going_back_to_running() {
        let commit = |at_ms, turn: &str, status: &str| {
            event(
                at_ms,
                EventKind::Commit {
                    scope: TURN_SCOPE.into(),
                    key: "s1".into(),
                    value: json!({"turn_id": turn, "status": status}),
                    version: at_ms,
                },
            )
        };
        assert!(fired(&[commit(1, "t1", "running"), commit(2, "t1", "failed"), commit(3, "t2", "running")]).is_empty());
        assert_eq!(fired(&[commit(1, "t1", "failed"), commit(2, "t1", "running")]), vec![Oracle::Monotonic]);
    }

    #[test]
    fn liveness_accepts_terminal_and_reasoned_holds_only() {
        let judge = |record: Value| {
            let mut store = StateStore::new();
            store.seed(TURN_SCOPE, "s1", record);
            let evidence = Evidence {
                events: &[],
                store: &store,
                healed_at_ms: 0,
                ended_at_ms: 10,
                quiescent: true,
                effects_per_action_max: 1,
            };
            check(&evidence).into_iter().map(|v| v.oracle).collect::<Vec<_>>()
        };
        assert!(judge(json!({"turn_id": "t1", "status": "completed"})).is_empty());
        assert!(judge(json!({"turn_id": "t1", "status": "held", "held_reason": "enqueue exhausted"})).is_empty());
        assert_eq!(judge(json!({"turn_id": "t1", "status": "held"})), vec![Oracle::Liveness]);
        assert_eq!(judge(json!({"turn_id": "t1", "status": "running"})), vec![Oracle::Liveness]);
    }
}
