//! A rule of `recovery-cost` judged from the store's leases: work repeated because a worker's own
//! lease lapsed mid-turn with no fault to cause it. Fencing keeps such a lapse from doing harm
//! (the old holder's writes are refused once another worker takes the session), so its only
//! trace is work done again: a round asked of the model again, an action sent again. The
//! per-fault allowance would charge that work to whatever faults the run happened to have; this
//! rule charges it to the lapse, which no fault caused.

use super::{violation, Evidence, Oracle, Violation};
use crate::topology::DRIVER;
use crate::trace::{Event, EventKind};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};

/// The cuts that can keep a healthy worker from renewing its lease: they stop, pause or cut off
/// the worker, the engine or the store. (Any cut of a lease call counts too.)
const LAPSING_CUTS: [&str; 6] =
    ["crash-caller-before", "crash-caller-after", "crash-service", "crash-engine", "pause-caller", "isolate-caller"];

/// Whether an event is a fault that could make a lease lapse: a cut of those kinds or of a lease
/// call, any process cut, any proxy rule, and anything the script did to hosts and links.
fn could_lapse_a_lease(event: &Event) -> bool {
    match &event.kind {
        EventKind::Cut { action, function, .. } => {
            // (The planted bug: any cut taken as one that could keep a worker from renewing.)
            crate::planted!("recovery-cost-any-cut-explains-a-lapse")
                || LAPSING_CUTS.contains(&action.as_str())
                || function.contains("lease")
        }
        EventKind::Interrupt { .. } | EventKind::ProxyRule { .. } => true,
        EventKind::Control { action, .. } => action != "heal",
        _ => false,
    }
}

/// A lease held on a session, as the store granted and renewed it.
struct Held<'a> {
    owner: &'a str,
    token: u64,
    granted_ms: u64,
    expires_at_ms: u64,
    released: bool,
}

/// `recovery-cost`: a worker's lease that ran out while the session's turn was running (not
/// ended, held or parked), that it had not handed back, with no fault since its grant that could
/// have kept it from renewing (see [`could_lapse_a_lease`]), and that another grant then took
/// over (the holder itself again, or another worker): the work repeated after that grant (a
/// generation for a round already asked, an effect request for an action already sent), up to
/// the next fault, is charged to no fault at all.
pub(super) fn lapsed_without_a_fault(evidence: &Evidence<'_>, violations: &mut Vec<Violation>) {
    let layout = evidence.layout;
    let prefix = format!("{}/", layout.owner_scope);
    let mut held: BTreeMap<&str, Held<'_>> = BTreeMap::new();
    // Each session's turn record over time: when it was committed, and whether it was running.
    let mut running: BTreeMap<&str, Vec<(u64, bool, &str)>> = BTreeMap::new();
    let is_running = |record: &Value| {
        !layout.is_terminal(record) && !layout.is_held_with_reason(record) && !layout.is_parked(record)
    };
    for (scope, key, value) in evidence.seeded {
        if *scope == layout.turn_scope {
            running.entry(key).or_default().push((0, is_running(value), layout.turn_id(value)));
        }
    }
    let mut last_fault_ms: Option<u64> = None;
    for (position, event) in evidence.events.iter().enumerate() {
        if could_lapse_a_lease(event) {
            last_fault_ms = Some(event.at_ms);
        }
        match &event.kind {
            EventKind::Commit { scope, key, value, .. } if *scope == layout.turn_scope && !value.is_null() => {
                running.entry(key).or_default().push((event.at_ms, is_running(value), layout.turn_id(value)));
            }
            EventKind::Call { function, payload, caller, .. } if function == "state::release-lease" => {
                let domain =
                    format!("{}/{}", payload["scope"].as_str().unwrap_or(""), payload["key"].as_str().unwrap_or(""));
                if let Some(lease) = held.get_mut(domain.as_str()) {
                    let by_holder = caller.as_deref() == Some(lease.owner) && payload["token"] == lease.token;
                    lease.released |= by_holder && event.at_ms <= lease.expires_at_ms;
                }
            }
            EventKind::Lease { domain, owner, token, expires_at_ms } => {
                let Some(session) = domain.strip_prefix(&prefix) else { continue };
                match held.get_mut(domain.as_str()) {
                    Some(lease) if lease.token == *token => lease.expires_at_ms = *expires_at_ms,
                    before => {
                        if let Some(lapsed) = before.filter(|l| !l.released && l.expires_at_ms < event.at_ms) {
                            let no_fault = last_fault_ms.is_none_or(|at| at < lapsed.granted_ms);
                            let turn = running
                                .get(session)
                                .and_then(|history| history.iter().rev().find(|(at, _, _)| *at <= lapsed.expires_at_ms))
                                .filter(|(_, running, _)| *running)
                                .map(|(_, _, turn)| *turn);
                            if let (true, Some(turn)) = (no_fault, turn) {
                                let lapse = Lapse { session, turn, lapsed, taken_by: owner, taken_at: position };
                                lapse.judge(evidence, violations);
                            }
                        }
                        let granted_ms = event.at_ms;
                        held.insert(
                            domain,
                            Held { owner, token: *token, granted_ms, expires_at_ms: *expires_at_ms, released: false },
                        );
                    }
                }
            }
            _ => {}
        }
    }
}

/// A lease that lapsed mid-turn with no fault, and the grant that took the session over.
struct Lapse<'a, 'b> {
    session: &'a str,
    turn: &'a str,
    lapsed: &'b Held<'a>,
    taken_by: &'a str,
    /// The trace position of the grant that took the session over.
    taken_at: usize,
}

impl Lapse<'_, '_> {
    /// Counts the work repeated after the takeover (up to the next fault) and reports it.
    fn judge(&self, evidence: &Evidence<'_>, violations: &mut Vec<Violation>) {
        let effects = &evidence.effect_functions.effects;
        let (mut rounds, mut actions, mut requests) = (BTreeSet::new(), BTreeSet::new(), BTreeSet::new());
        let (mut model_calls, mut effect_requests) = (0u64, 0u64);
        for (position, event) in evidence.events.iter().enumerate() {
            if position > self.taken_at && could_lapse_a_lease(event) {
                break;
            }
            let EventKind::Call { function, payload, caller, invocation_id, .. } = &event.kind else { continue };
            if caller.as_deref() == Some(DRIVER) || invocation_id.as_deref().is_some_and(|id| !requests.insert(id)) {
                continue;
            }
            let repeated = if function == "model::generate" {
                !rounds.insert((payload["turn_id"].to_string(), payload["step"].to_string()))
            } else if effects.contains(function.as_str()) {
                payload["action_id"].as_str().is_some_and(|action| !actions.insert(action.to_string()))
            } else {
                false
            };
            if repeated && position > self.taken_at {
                if function == "model::generate" {
                    model_calls += 1;
                } else {
                    effect_requests += 1;
                }
            }
        }
        let repeated: Vec<String> = [(model_calls, "model_calls"), (effect_requests, "effect_requests")]
            .into_iter()
            .filter(|(n, _)| *n > 0)
            .map(|(n, dimension)| format!("{n} {dimension}"))
            .collect();
        if repeated.is_empty() {
            return;
        }
        let lapsed = self.lapsed;
        violations.push(violation(
            Oracle::RecoveryCost,
            format!(
                "excessive recovery: {} repeated work already done after the lease `{}` held on session {} (token {}) lapsed at {} ms while turn {} was running, with no fault to cause it, and `{}` took the session over: work charged to no fault",
                repeated.join(" and "),
                lapsed.owner,
                self.session,
                lapsed.token,
                lapsed.expires_at_ms,
                self.turn,
                self.taken_by
            ),
        ));
    }
}
