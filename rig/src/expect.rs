//! Checking a run against its scenario's expectations.

use crate::scenario::Expectation;
use crate::trace::{Event, EventKind};
use doubles::StateStore;
use proxy::{all_match, lookup, FieldMatch};
use serde_json::{json, Value};
use std::collections::BTreeMap;

/// What expectations are checked against.
pub struct Observed<'a> {
    pub rpc: &'a BTreeMap<String, Value>,
    pub store: &'a StateStore,
    pub events: &'a [Event],
    pub effects: &'a BTreeMap<String, u64>,
}

/// Counts accepted external effects by kind, from the ledger's events.
pub fn effect_counts(events: &[Event]) -> BTreeMap<String, u64> {
    let mut counts = BTreeMap::new();
    for event in events {
        if let EventKind::Effect { effect, accepted: true, .. } = &event.kind {
            *counts.entry(effect.clone()).or_default() += 1;
        }
    }
    counts
}

/// Where in the trace the driver got the outcome named `name`.
fn rpc_position(events: &[Event], name: &str) -> Option<usize> {
    events.iter().position(|e| matches!(&e.kind, EventKind::Rpc { name: n, .. } if n == name))
}

fn describe(conditions: &[FieldMatch]) -> String {
    conditions.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
}

fn failed_conditions(conditions: &[FieldMatch], document: &Value) -> Vec<String> {
    conditions
        .iter()
        .filter(|c| !c.matches(document))
        .map(|c| {
            let path: Vec<String> = c.path().split('.').map(str::to_string).collect();
            let found = lookup(document, &path)
                .map_or_else(|| "nothing".to_string(), |v| format!("`{}`", proxy::value_text(v)));
            format!("{} expected `{}`, found {found}", c.path(), c.expected())
        })
        .collect()
}

/// Every expectation that does not hold, as one line each.
pub fn check(expectations: &[Expectation], observed: &Observed<'_>) -> Vec<String> {
    let mut failures = Vec::new();
    let event_documents: Vec<Value> = observed.events.iter().map(Event::to_json).collect();
    for expectation in expectations {
        match expectation {
            Expectation::Rpc { name, conditions } => {
                let outcome = observed.rpc.get(name).cloned().unwrap_or_else(|| json!({ "outcome": "none" }));
                let failed = failed_conditions(conditions, &outcome);
                if !failed.is_empty() {
                    failures.push(format!("rpc `{name}`: {} (outcome {outcome})", failed.join("; ")));
                }
            }
            Expectation::State { scope, key, conditions } => match observed.store.get(scope, key) {
                None => failures
                    .push(format!("state {scope}/{key}: expected a record ({}), found none", describe(conditions))),
                Some(record) => {
                    let failed = failed_conditions(conditions, record);
                    if !failed.is_empty() {
                        failures.push(format!("state {scope}/{key}: {}", failed.join("; ")));
                    }
                }
            },
            Expectation::Absent { scope, key } => {
                if let Some(record) = observed.store.get(scope, key) {
                    failures.push(format!("state {scope}/{key}: expected no record, found {record}"));
                }
            }
            Expectation::Events { conditions, count, count_min, same, before_rpc } => {
                let until = match before_rpc {
                    Some(name) => match rpc_position(observed.events, name) {
                        Some(position) => position,
                        None => {
                            failures.push(format!(
                                "events [{}]: no outcome for `{name}` to count up to",
                                describe(conditions)
                            ));
                            continue;
                        }
                    },
                    None => event_documents.len(),
                };
                let matching: Vec<&Value> =
                    event_documents[..until].iter().filter(|e| all_match(conditions, e)).collect();
                let found = matching.len() as u64;
                if count.is_some_and(|n| n != found) || count_min.is_some_and(|n| found < n) {
                    let wanted =
                        count.map_or_else(|| format!("at least {}", count_min.unwrap_or(0)), |n| n.to_string());
                    failures.push(format!("events [{}]: expected {wanted}, found {found}", describe(conditions)));
                }
                if let Some(path) = same {
                    let segments: Vec<String> = path.split('.').map(str::to_string).collect();
                    let distinct: std::collections::BTreeSet<String> = matching
                        .iter()
                        .map(|e| lookup(e, &segments).map_or_else(|| "<missing>".into(), Value::to_string))
                        .collect();
                    if distinct.len() > 1 {
                        failures.push(format!(
                            "events [{}]: `{path}` differs between them ({} distinct values)",
                            describe(conditions),
                            distinct.len()
                        ));
                    }
                }
            }
            Expectation::Effects(expected) => {
                let kinds: std::collections::BTreeSet<&String> =
                    expected.keys().chain(observed.effects.keys()).collect();
                for kind in kinds {
                    let (want, got) =
                        (expected.get(kind).copied().unwrap_or(0), observed.effects.get(kind).copied().unwrap_or(0));
                    if want != got {
                        failures.push(format!("effects `{kind}`: expected {want}, the ledger shows {got}"));
                    }
                }
            }
        }
    }
    failures
}
