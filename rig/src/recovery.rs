//! The cost of recovery: how much work a run did beyond its uncut workload.
//!
//! A recovery can be correct and still wasteful: a harness that answers one lost
//! acknowledgement by running the whole turn again passes every correctness oracle. So every
//! simulated run is measured against the same workload run uncut: the same file, harness,
//! policy and seed with its scripted faults taken out (every `[[cut]]` and `[[interrupt]]`, and
//! the proxy's rules, the proxy itself staying where it is). The script's own steps (crashes,
//! partitions, direct writes) are the workload, in both runs. Work is counted from what the
//! services saw, never from the harness's account, in three dimensions:
//!
//! - `model_calls`: generation requests reaching the model;
//! - `effect_requests`: requests reaching an external effect service (accepted or not);
//! - `store_writes`: record writes reaching the store (`set`, `delete`, `compare-and-set`; lease
//!   grants and renewals follow the clock, not the work, and are left out).
//!
//! A request the network delivered twice (one invocation id) is one request of the worker's;
//! the driver's own calls are the script's, not the harness's work.
//!
//! Two measures come of it. **Extra work** is the run's count less the uncut run's: what the
//! faults cost in all, reported with every run. It is no verdict by itself, because a fault can
//! change the story rather than its cost: a cancel that a cut kept from landing lets the turn
//! run to its end, more work than the cancelled uncut turn did, none of it wasted. **Repeated
//! work** is what the verdict bounds: a generation for a round (turn and step) already asked,
//! an effect request for an action already sent, a write taking a turn's record back to a step
//! the store already held it past; less what the uncut run repeated. The `recovery-cost`
//! oracle fires when a dimension's repeated work is over a per-fault allowance times the faults
//! that fired (each firing of a cut, an interrupt or a proxy rule): a correct harness pays a
//! small, fixed price per fault (one generation asked again, one effect sent again after
//! reconciliation found it had not happened), and a harness that redoes completed rounds pays
//! for every round it redoes. `[world] recovery_per_fault_max` sets the allowance.
//!
//! The verdict needs the uncut run only when the run itself repeated more work than the
//! allowance in some dimension: repeated work beyond the uncut run's is never more than the run's
//! own, so a run whose own repeats are within the bound passes `recovery-cost` whatever its
//! uncut run did. The runner simulates the uncut run only then ([`Recovery::needs_uncut`]), or
//! has it for free (a run with no scripted faults is its own uncut run, and one already made is
//! remembered); otherwise [`Recovery::uncut`] is `None` and the extra work is not known.
//!
//! The uncut run itself is made and remembered by the runner (`run::uncut`).

use crate::layout::RecordLayout;
use crate::services::EffectFunctions;
use crate::topology::DRIVER;
use crate::trace::{Event, EventKind};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

/// The store functions whose calls write a record.
const STORE_WRITES: [&str; 3] = ["state::set", "state::delete", "state::compare-and-set"];

/// Work a run did, counted from what the services saw.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Work {
    pub model_calls: u64,
    pub effect_requests: u64,
    pub store_writes: u64,
}

impl Work {
    /// The dimensions, by name, in report order.
    pub fn dimensions(&self) -> [(&'static str, u64); 3] {
        [
            ("model_calls", self.model_calls),
            ("effect_requests", self.effect_requests),
            ("store_writes", self.store_writes),
        ]
    }

    fn map(self, other: Work, f: impl Fn(u64, u64) -> u64) -> Work {
        Work {
            model_calls: f(self.model_calls, other.model_calls),
            effect_requests: f(self.effect_requests, other.effect_requests),
            store_writes: f(self.store_writes, other.store_writes),
        }
    }
}

/// The repeated work a correct harness may spend on each fault, unless `[world]
/// recovery_per_fault_max` says otherwise: a generation asked again (its reply was lost with a
/// crash), an effect sent again (reconciliation found it had not happened), and a few writes.
pub const PER_FAULT_MAX_DEFAULT: Work = Work { model_calls: 1, effect_requests: 1, store_writes: 2 };

/// What one run did: all its work, and the part of it that repeated work already done.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Measured {
    pub total: Work,
    pub repeated: Work,
}

/// A run's work against its uncut workload's, and what it may cost.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Recovery {
    pub run: Measured,
    /// The uncut run's work, when it was made: it is simulated only when the verdict needs it
    /// ([`Recovery::needs_uncut`]), unless it came for free (see the module's documentation).
    pub uncut: Option<Measured>,
    /// Firings of the scripted (or placed) cuts, interrupts and proxy rules.
    pub faults: u64,
    /// The turns the run recorded.
    pub turns: u64,
    pub per_fault_max: Work,
}

impl Recovery {
    /// All work beyond the uncut workload's, per dimension; `None` when the uncut run was not made.
    pub fn extra(&self) -> Option<Work> {
        self.uncut.map(|uncut| self.run.total.map(uncut.total, u64::saturating_sub))
    }

    /// Work repeated beyond what the uncut workload repeated: the cost the verdict bounds. When
    /// the uncut run was not made it is at most the run's own repeats ([`Recovery::needs_uncut`]
    /// says when that is within the bound), and `None`.
    pub fn repeated(&self) -> Option<Work> {
        self.uncut.map(|uncut| self.run.repeated.map(uncut.repeated, u64::saturating_sub))
    }

    /// Whether the verdict depends on the uncut run: the run repeated more work than the faults
    /// that fired allow in some dimension, so what the uncut run repeated decides whether that
    /// was the faults' doing. Otherwise no uncut run can make the run excessive.
    pub fn needs_uncut(&self) -> bool {
        let bound = self.bound();
        self.run.repeated.dimensions().into_iter().zip(bound.dimensions()).any(|((_, run), (_, allowed))| run > allowed)
    }

    /// The most repeated work the faults that fired allow.
    pub fn bound(&self) -> Work {
        self.per_fault_max.map(Work::default(), |allowed, _| allowed.saturating_mul(self.faults))
    }

    /// Each dimension whose repeated work is over its bound: `(dimension, repeated, bound)`.
    /// Without the uncut run, none: the runner makes it whenever it could matter
    /// ([`Recovery::needs_uncut`]).
    pub fn excessive(&self) -> Vec<(&'static str, u64, u64)> {
        let Some(repeated) = self.repeated() else { return Vec::new() };
        let bound = self.bound().dimensions();
        repeated
            .dimensions()
            .into_iter()
            .zip(bound)
            .filter(|((_, repeated), (_, allowed))| repeated > allowed)
            .map(|((name, repeated), (_, allowed))| (name, repeated, allowed))
            .collect()
    }

    /// One line for a person: the extra and the repeated work, when there is any. Without the
    /// uncut run, the run's own repeats, which are within the bound.
    pub fn summary(&self) -> Option<String> {
        let line = |work: Work| -> Vec<String> {
            work.dimensions().iter().filter(|(_, n)| *n > 0).map(|(name, n)| format!("{name} +{n}")).collect()
        };
        let (Some(extra), Some(repeated)) = (self.extra(), self.repeated()) else {
            let own = line(self.run.repeated);
            return (!own.is_empty()).then(|| {
                format!(
                    "repeated work within the bound for {} fault(s): {} (the uncut run was not needed)",
                    self.faults,
                    own.join(", ")
                )
            });
        };
        let (extra, repeated) = (line(extra), line(repeated));
        if extra.is_empty() && repeated.is_empty() {
            return None;
        }
        let mut text = format!("extra work over {} fault(s): ", self.faults);
        text.push_str(if extra.is_empty() { "none".to_string() } else { extra.join(", ") }.as_str());
        if !repeated.is_empty() {
            text.push_str(&format!("; repeated: {}", repeated.join(", ")));
        }
        Some(text)
    }
}

/// The work in a run's trace, and how much of it repeated work already done.
pub fn measure(events: &[Event], effects: &EffectFunctions, layout: &RecordLayout) -> Measured {
    let mut measured = Measured::default();
    let mut requests: BTreeSet<&str> = BTreeSet::new();
    let mut rounds: BTreeSet<(String, String)> = BTreeSet::new();
    let mut actions: BTreeSet<&str> = BTreeSet::new();
    // The furthest step the store has held each turn at.
    let mut furthest: BTreeMap<String, u64> = BTreeMap::new();
    for event in events {
        match &event.kind {
            EventKind::Commit { scope, value, .. } if *scope == layout.turn_scope && !value.is_null() => {
                if let Some(step) = value[&layout.step_field].as_u64() {
                    let at = furthest.entry(layout.turn_id(value).to_string()).or_default();
                    *at = (*at).max(step);
                }
            }
            EventKind::Call { function, payload, caller, invocation_id, .. } => {
                if caller.as_deref() == Some(DRIVER) || invocation_id.as_deref().is_some_and(|id| !requests.insert(id))
                {
                    continue;
                }
                let (total, repeated) = (&mut measured.total, &mut measured.repeated);
                if function == "model::generate" {
                    total.model_calls += 1;
                    let round = (payload["turn_id"].to_string(), payload["step"].to_string());
                    repeated.model_calls += u64::from(!rounds.insert(round));
                } else if effects.effects.contains(function.as_str()) {
                    total.effect_requests += 1;
                    let action = payload["action_id"].as_str().unwrap_or_default();
                    repeated.effect_requests += u64::from(!action.is_empty() && !actions.insert(action));
                } else if STORE_WRITES.contains(&function.as_str()) {
                    total.store_writes += 1;
                    let record = &payload["value"];
                    let back = payload["scope"] == layout.turn_scope.as_str()
                        && record[&layout.step_field]
                            .as_u64()
                            .zip(furthest.get(layout.turn_id(record)))
                            .is_some_and(|(step, furthest)| step < *furthest);
                    repeated.store_writes += u64::from(back);
                }
            }
            _ => {}
        }
    }
    measured
}

/// How many times a scripted or placed fault fired. A frame a `reorder` rule held is counted
/// once, when it is held.
pub fn faults(events: &[Event]) -> u64 {
    let fired = |event: &&Event| match &event.kind {
        EventKind::Cut { .. } | EventKind::Interrupt { .. } => true,
        // (The planted bug: the workload's own crashes and partitions, which its uncut run has
        // too, counted as faults that fired.)
        EventKind::Control { action, .. } if crate::planted!("recovery-cost-counts-scripted-steps") => {
            matches!(action.as_str(), "crash" | "partition" | "restart")
        }
        EventKind::ProxyRule { action, .. } => action != "reordered" && action != "reorder-expired",
        _ => false,
    };
    events.iter().filter(fired).count() as u64
}

/// The turns a run recorded (distinct turn ids in the turn scope).
pub fn turns(events: &[Event], layout: &RecordLayout) -> u64 {
    let mut turns = BTreeSet::new();
    for event in events {
        if let EventKind::Commit { scope, value, .. } = &event.kind {
            if *scope == layout.turn_scope && !value.is_null() {
                turns.insert(layout.turn_id(value).to_string());
            }
        }
    }
    turns.len() as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn recovery(run: Work, uncut: Work, faults: u64) -> Recovery {
        let measured = |repeated| Measured { total: Work { model_calls: 9, ..Work::default() }, repeated };
        Recovery {
            run: measured(run),
            uncut: Some(measured(uncut)),
            faults,
            turns: 1,
            per_fault_max: PER_FAULT_MAX_DEFAULT,
        }
    }

    #[test]
    fn repeated_work_is_bounded_per_fault_that_fired() {
        let uncut = Work { model_calls: 1, ..Work::default() };
        let asked_again = Work { model_calls: 2, effect_requests: 1, store_writes: 0 };
        assert!(recovery(asked_again, uncut, 1).excessive().is_empty(), "one generation asked again per fault");
        let redone = Work { model_calls: 4, ..asked_again };
        assert_eq!(recovery(redone, uncut, 1).excessive(), vec![("model_calls", 3, 1)]);
        assert!(recovery(redone, uncut, 3).excessive().is_empty(), "three faults allow three");
        assert_eq!(recovery(asked_again, uncut, 0).excessive().len(), 2, "no fault fired: nothing may be repeated");
        assert_eq!(recovery(Work::default(), uncut, 1).repeated(), Some(Work::default()), "repeating less is no cost");
    }

    #[test]
    fn the_uncut_run_is_needed_only_when_the_run_repeated_more_than_the_bound() {
        let uncut = Work { model_calls: 1, ..Work::default() };
        let within = Work { model_calls: 1, effect_requests: 1, store_writes: 2 };
        assert!(!recovery(within, uncut, 1).needs_uncut(), "at the bound in every dimension");
        let writes = Work { store_writes: 3, ..within };
        assert!(recovery(writes, uncut, 1).needs_uncut(), "one dimension over its bound");
        assert!(!recovery(writes, uncut, 2).needs_uncut(), "two faults allow four writes");
        assert!(recovery(Work { model_calls: 1, ..Work::default() }, uncut, 0).needs_uncut(), "no fault, a repeat");
        assert!(!recovery(Work::default(), uncut, 0).needs_uncut());
        // Whatever the uncut run repeated, a run within the bound is not excessive.
        for uncut in [Work::default(), within, writes] {
            assert!(recovery(within, uncut, 1).excessive().is_empty());
        }
        let mut unmeasured = recovery(within, uncut, 1);
        unmeasured.uncut = None;
        assert_eq!((unmeasured.extra(), unmeasured.repeated()), (None, None));
        assert!(unmeasured.excessive().is_empty());
        assert_eq!(
            unmeasured.summary().as_deref(),
            Some("repeated work within the bound for 1 fault(s): model_calls +1, effect_requests +1, store_writes +2 (the uncut run was not needed)")
        );
    }

    fn call(function: &str, id: &str, payload: serde_json::Value) -> Event {
        let kind = EventKind::Call {
            service: "s".into(),
            function: function.into(),
            payload: payload.into(),
            caller: Some("harness".into()),
            invocation_id: Some(id.into()),
        };
        Event { at_ms: 0, host: "s".into(), kind }
    }

    fn commit(turn: &str, step: u64) -> Event {
        let value = json!({ "turn_id": turn, "status": "running", "step": step });
        Event {
            at_ms: 0,
            host: "store".into(),
            kind: EventKind::Commit { scope: "harness_turn".into(), key: "s1".into(), value: value.into(), version: 1 },
        }
    }

    #[test]
    fn repeats_are_rounds_asked_again_actions_sent_again_and_records_taken_back() {
        let write = |id: &str, step: u64| {
            call(
                "state::set",
                id,
                json!({ "scope": "harness_turn", "key": "s1", "value": { "turn_id": "t1", "step": step } }),
            )
        };
        let effects = EffectFunctions { effects: ["ticket::create".to_string()].into(), ..Default::default() };
        let events = [
            call("model::generate", "a", json!({ "turn_id": "t1", "step": 0 })),
            call("model::generate", "a", json!({ "turn_id": "t1", "step": 0 })),
            call("model::generate", "b", json!({ "turn_id": "t1", "step": 0 })),
            call("ticket::create", "c", json!({ "action_id": "t1:0:0" })),
            call("ticket::create", "d", json!({ "action_id": "t1:0:0" })),
            write("e", 0),
            commit("t1", 1),
            write("f", 1),
            write("g", 0),
        ];
        let measured = measure(&events, &effects, &RecordLayout::default());
        assert_eq!(
            measured.total,
            Work { model_calls: 2, effect_requests: 2, store_writes: 3 },
            "the network's copy is one request"
        );
        assert_eq!(measured.repeated, Work { model_calls: 1, effect_requests: 1, store_writes: 1 });
    }
}
