//! Expectations: what a scenario says a run must show afterwards, and checking them.

use crate::condition::Condition;
use crate::layout::RecordLayout;
use crate::trace::{Documents, Event, EventKind};
use doubles::{SessionService, StateStore};
use proxy::lookup;
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};

/// Something a run must show afterwards.
#[derive(Debug, Clone)]
pub enum Expectation {
    /// The outcome of a driver invocation, by the name the scenario gave it.
    Rpc { name: String, conditions: Vec<Condition> },
    /// A durable record at the end of the run.
    State { scope: String, key: String, conditions: Vec<Condition> },
    /// How the actions of a session's current turn stand at the end of the run, read through the
    /// harness's record layout: conditions on `{count, done, failed, held, unsettled}`.
    Actions { session: String, conditions: Vec<Condition> },
    /// A durable record that must not exist at the end of the run.
    Absent { scope: String, key: String },
    /// Trace events matching conditions: how many, and what they share.
    Events(EventsExpectation),
    /// Accepted external effects by kind, from the ledger: exact counts, absent kinds zero.
    Effects(BTreeMap<String, u64>),
    /// A session's transcript at the end of the run: exactly these entries, in order, each
    /// meeting its conditions.
    Transcript { session: String, entries: Vec<Vec<Condition>> },
    /// The model script was followed: no generation request it did not expect, none beyond it,
    /// and no scripted reply left unused.
    ModelScript,
}

/// Counts and sameness over the trace events that match `conditions`.
#[derive(Debug, Clone, Default)]
pub struct EventsExpectation {
    pub conditions: Vec<Condition>,
    pub count: Option<u64>,
    pub count_min: Option<u64>,
    pub count_max: Option<u64>,
    /// A dotted path whose value must be byte-identical across every matching event.
    pub same: Option<String>,
    /// Count only events before the outcome of this driver invocation arrived.
    pub before_rpc: Option<String>,
    /// When each matching event happened, measured from the latest event before it that meets
    /// the anchor's conditions.
    pub after: Option<After>,
}

/// The field an [`After`]'s condition is judged on: how many milliseconds after its anchor an
/// event happened.
pub const AFTER_BY: &str = "by_ms";

/// A time that matters, asserted: each matching event happened `by_ms` after the latest earlier
/// (or simultaneous) event that meets `conditions`.
#[derive(Debug, Clone)]
pub struct After {
    pub conditions: Vec<Condition>,
    pub by_ms: Condition,
}

/// Notes the rig's own components write (the queue, the proxy, the engine): what they saw, not a
/// harness's account of itself. A shared expectation may read these; a harness's own notes judge
/// only the reference harness.
pub fn is_rig_note(what: &str) -> bool {
    what.starts_with("queue_")
        || what.starts_with("proxy_")
        || what.starts_with("model_")
        || matches!(what, "unreadable_frame" | "outbox_full" | "late_call_arrived")
}

impl Expectation {
    /// Whether the expectation reads the reference harness's own notes: a harness's account of
    /// its decisions, which another harness does not give. Such expectations judge only the
    /// reference harness; everything else is judged from what the services, the queue and the
    /// driver saw.
    pub fn reads_harness_notes(&self) -> bool {
        let Expectation::Events(events) = self else { return false };
        let about_notes = events.conditions.iter().any(|c| c.path() == "kind" && c.matches(&json!({"kind": "note"})));
        // A note named for one of the rig's own components is what the rig saw, not the harness.
        let about_rig_notes = events
            .conditions
            .iter()
            .filter(|c| c.path() == "what")
            .any(|c| c.accepted_texts().is_some_and(|texts| texts.iter().all(|w| is_rig_note(w))));
        about_notes && !about_rig_notes
    }
}

/// What expectations are checked against.
pub struct Observed<'a> {
    pub rpc: &'a BTreeMap<String, Value>,
    pub store: &'a StateStore,
    pub events: &'a [Event],
    pub effects: &'a BTreeMap<String, u64>,
    /// The session service, whose transcripts `transcript` expectations read.
    pub sessions: &'a SessionService,
    /// What the doubles' scripts left unused (scripted model replies nobody asked for).
    pub unused: &'a [String],
    /// Where the harness keeps its state, for expectations read through it.
    pub layout: &'a RecordLayout,
}

/// Counts accepted external effects by kind, from the ledger's events.
pub fn effect_counts(events: &[Event]) -> BTreeMap<String, u64> {
    let mut counts = BTreeMap::new();
    for event in events {
        if let EventKind::Effect(ledgered) = &event.kind {
            if ledgered.accepted {
                *counts.entry(ledgered.effect.clone()).or_default() += 1;
            }
        }
    }
    counts
}

/// Where in the trace the driver got the outcome named `name`.
fn rpc_position(events: &[Event], name: &str) -> Option<usize> {
    events.iter().position(|e| matches!(&e.kind, EventKind::Rpc { name: n, .. } if n == name))
}

fn describe(conditions: &[Condition]) -> String {
    conditions.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
}

fn failed_conditions(conditions: &[Condition], document: &Value) -> Vec<String> {
    conditions.iter().filter(|c| !c.matches(document)).map(|c| c.explain(document)).collect()
}

/// Every expectation that does not hold, as one line each.
pub fn check(expectations: &[Expectation], observed: &Observed<'_>) -> Vec<String> {
    let mut failures = Vec::new();
    let event_documents = Documents::new(observed.events);
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
            Expectation::Actions { session, conditions } => {
                match observed.layout.action_summary(observed.store, session) {
                    None => failures.push(format!(
                        "actions of {session}: expected its turn's actions ({}), found no turn record",
                        describe(conditions)
                    )),
                    Some(summary) => {
                        let failed = failed_conditions(conditions, &summary);
                        if !failed.is_empty() {
                            failures.push(format!("actions of {session}: {} (found {summary})", failed.join("; ")));
                        }
                    }
                }
            }
            Expectation::Absent { scope, key } => {
                if let Some(record) = observed.store.get(scope, key) {
                    failures.push(format!("state {scope}/{key}: expected no record, found {record}"));
                }
            }
            Expectation::Events(events) => check_events(events, observed.events, &event_documents, &mut failures),
            Expectation::Transcript { session, entries } => {
                check_transcript(session, entries, observed.sessions.entries(session), &mut failures)
            }
            Expectation::ModelScript => check_model_script(observed, &mut failures),
            Expectation::Effects(expected) => {
                let kinds: BTreeSet<&String> = expected.keys().chain(observed.effects.keys()).collect();
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

/// What the shared expectations a known-bad policy breaks on purpose failed on, by kind: an
/// empty list for a kind none of whose expectations failed (the planted bug did not show).
pub fn broken(broken: &[(String, Vec<Expectation>)], observed: &Observed<'_>) -> Vec<(String, Vec<String>)> {
    broken.iter().map(|(kind, expectations)| (kind.clone(), check(expectations, observed))).collect()
}

/// A failure for each kind a known-bad policy was to break and did not.
pub fn check_broken(broken: &[(String, Vec<String>)]) -> Vec<String> {
    broken
        .iter()
        .filter(|(_, failed)| failed.is_empty())
        .map(|(kind, _)| {
            format!("`[expect]` {kind} was expected to fail under this policy (it breaks it on purpose), and it held")
        })
        .collect()
}

fn check_transcript(session: &str, expected: &[Vec<Condition>], entries: &[Value], failures: &mut Vec<String>) {
    let summary = || {
        let roles: Vec<String> = entries.iter().map(|e| e["role"].as_str().unwrap_or("?").to_string()).collect();
        format!("[{}]", roles.join(", "))
    };
    if entries.len() != expected.len() {
        failures.push(format!(
            "transcript {session}: expected {} entries, found {} {}",
            expected.len(),
            entries.len(),
            summary()
        ));
        return;
    }
    for (index, (conditions, entry)) in expected.iter().zip(entries).enumerate() {
        let failed = failed_conditions(conditions, entry);
        if !failed.is_empty() {
            failures.push(format!("transcript {session} entry #{}: {} (entry {entry})", index + 1, failed.join("; ")));
        }
    }
}

/// The model's own notes of requests its script did not provide for, and replies left unused;
/// and, before them, the deliveries of one queued turn a worker was running at once when such
/// a request came: the likely cause, said as such rather than as a script that ran short.
fn check_model_script(observed: &Observed<'_>, failures: &mut Vec<String>) {
    let overlaps = overlapping_deliveries(observed.events);
    let mut told = std::collections::BTreeSet::new();
    for event in observed.events {
        if let EventKind::Note { what, .. } = &event.kind {
            if what == "model_contract" {
                for (index, overlap) in overlaps.iter().enumerate() {
                    if overlap.covers(event.at_ms) && told.insert(index) {
                        failures.push(overlap.to_string());
                    }
                }
            }
        }
    }
    for event in observed.events {
        if let EventKind::Note { what, detail } = &event.kind {
            if what == "model_contract" {
                failures.push(format!(
                    "model script: generation {} at {} ms: {}",
                    detail["generation"],
                    event.at_ms,
                    {
                        let failed: Vec<String> = detail["failed"]
                            .as_array()
                            .map(|f| f.iter().map(|c| c.as_str().unwrap_or_default().to_string()).collect())
                            .unwrap_or_default();
                        if failed.is_empty() {
                            detail["problem"].as_str().unwrap_or_default().to_string()
                        } else {
                            format!("{}: {}", detail["problem"].as_str().unwrap_or_default(), failed.join("; "))
                        }
                    }
                ));
            }
        }
    }
    failures.extend(observed.unused.iter().map(|line| format!("model script: {line}")));
}

/// One delivery of a queued message to a worker, from the trace.
#[derive(Debug, Clone)]
struct Delivery {
    queue: String,
    message: String,
    attempt: u64,
    dispatched_ms: u64,
    invocation: Option<String>,
    worker: Option<String>,
    /// When the worker answered it, or its host crashed.
    ended_ms: Option<u64>,
}

/// Two deliveries of one queued message a worker was running at the same time: the later one
/// dispatched (its deadline having passed, or its answer lost) before the earlier one ended.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Overlap {
    worker: String,
    queue: String,
    message: String,
    /// `(attempt, dispatched at)` of each.
    first: (u64, u64),
    second: (u64, u64),
    /// From the second's dispatch, for as long as either of them ran.
    from_ms: u64,
    until_ms: Option<u64>,
}

impl Overlap {
    fn covers(&self, at_ms: u64) -> bool {
        at_ms >= self.from_ms && self.until_ms.is_none_or(|until| at_ms <= until)
    }
}

impl std::fmt::Display for Overlap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let until = match self.until_ms {
            Some(ms) => format!("until {ms} ms"),
            None => "to the end of the run".to_string(),
        };
        write!(
            f,
            "model script: two deliveries of one turn ran at once on `{}`: message {} of queue `{}`, attempt {} \
             (dispatched at {} ms, still running) and attempt {} (dispatched at {} ms), from {} ms {until}; the \
             generations the script did not provide for came meanwhile",
            self.worker,
            self.message,
            self.queue,
            self.first.0,
            self.first.1,
            self.second.0,
            self.second.1,
            self.from_ms
        )
    }
}

/// The deliveries of queued messages that a worker ran at the same time as an earlier delivery
/// of the same message, from the queue's dispatch notes and the engine's frames.
fn overlapping_deliveries(events: &[Event]) -> Vec<Overlap> {
    let mut deliveries: Vec<Delivery> = Vec::new();
    for event in events {
        match &event.kind {
            EventKind::Note { what, detail } if what == "queue_dispatch" => deliveries.push(Delivery {
                queue: detail["queue"].as_str().unwrap_or_default().to_string(),
                message: detail["message_id"].as_str().unwrap_or_default().to_string(),
                attempt: detail["attempt"].as_u64().unwrap_or(0),
                dispatched_ms: event.at_ms,
                invocation: None,
                worker: None,
                ended_ms: None,
            }),
            // The queue's invocation that follows its dispatch note is that delivery.
            EventKind::Frame { direction: "in", peer, frame: "invokefunction", invocation_id: Some(id), .. }
                if peer == "queue" =>
            {
                if let Some(delivery) = deliveries.iter_mut().rev().find(|d| d.invocation.is_none()) {
                    delivery.invocation = Some(id.to_string());
                }
            }
            EventKind::Frame { direction: "out", peer, frame: "invokefunction", invocation_id: Some(id), .. } => {
                if let Some(delivery) = deliveries.iter_mut().find(|d| d.invocation.as_deref() == Some(id.as_str())) {
                    delivery.worker.get_or_insert_with(|| peer.to_string());
                }
            }
            EventKind::Frame { direction: "in", peer, frame: "invocationresult", invocation_id: Some(id), .. } => {
                let answered = deliveries.iter_mut().find(|d| {
                    d.invocation.as_deref() == Some(id.as_str()) && d.worker.as_deref() == Some(peer.as_str())
                });
                if let Some(delivery) = answered {
                    delivery.ended_ms.get_or_insert(event.at_ms);
                }
            }
            EventKind::Control { action, target } if action == "crash" => {
                for delivery in deliveries.iter_mut().filter(|d| d.worker.as_ref() == Some(target)) {
                    delivery.ended_ms.get_or_insert(event.at_ms);
                }
            }
            _ => {}
        }
    }
    let mut overlaps = Vec::new();
    for (index, first) in deliveries.iter().enumerate() {
        for second in &deliveries[index + 1..] {
            let same = first.queue == second.queue && first.message == second.message && first.worker == second.worker;
            let Some(worker) = first.worker.as_ref().filter(|_| same && second.worker.is_some()) else { continue };
            if first.ended_ms.is_some_and(|ended| ended <= second.dispatched_ms) {
                continue;
            }
            // From the second's dispatch for as long as either runs: what the earlier one does
            // after the later one ended is the doubled work too.
            let until_ms = first.ended_ms.zip(second.ended_ms).map(|(a, b)| a.max(b));
            overlaps.push(Overlap {
                worker: worker.clone(),
                queue: first.queue.clone(),
                message: first.message.clone(),
                first: (first.attempt, first.dispatched_ms),
                second: (second.attempt, second.dispatched_ms),
                from_ms: second.dispatched_ms,
                until_ms,
            });
        }
    }
    overlaps
}

/// Each of `timed` (the events meeting `conditions`) against the latest other event of
/// `anchors` at or before it.
fn check_after(
    after: &After,
    conditions: &[Condition],
    timed: &[&Value],
    anchors: &[&Value],
    failures: &mut Vec<String>,
) {
    for &event in timed {
        let at = event["at_ms"].as_u64().unwrap_or_default();
        let what = format!("events [{}] at {at} ms", describe(conditions));
        let anchor = anchors
            .iter()
            .rev()
            .filter(|&&anchor| !std::ptr::eq(anchor, event))
            .find_map(|anchor| anchor["at_ms"].as_u64().filter(|&t| t <= at));
        match anchor {
            None => failures.push(format!("{what}: no [{}] before it to time it from", describe(&after.conditions))),
            Some(anchor) if !after.by_ms.matches(&json!({ AFTER_BY: at - anchor })) => failures.push(format!(
                "{what}: {} ms after [{}] at {anchor} ms, expected {}",
                at - anchor,
                describe(&after.conditions),
                after.by_ms
            )),
            Some(_) => {}
        }
    }
}

/// When no event met an expectation: whether the run had any event of its kind at all (a
/// `lease`, a call of its function, ...), said as what the harness did not do, since that is
/// what a person can act on ("no lease was granted in it", not only "found 0").
fn nothing_of_the_kind(conditions: &[Condition], documents: &Documents, until: usize) -> String {
    const IDENTITY: [&str; 4] = ["kind", "function", "function_id", "what"];
    let identity: Vec<Condition> =
        conditions.iter().filter(|c| IDENTITY.contains(&c.path().as_str())).cloned().collect();
    if identity.is_empty() || identity.len() == conditions.len() || !documents.matching(&identity, 0..until).is_empty()
    {
        return String::new();
    }
    let kind = conditions.iter().find(|c| c.path() == "kind").map(ToString::to_string).unwrap_or_default();
    let what = match kind.as_str() {
        "kind=lease" => ": no lease was granted in it, so the harness took none",
        "kind=call" => ": nothing made that call",
        "kind=effect" => ": no such effect was requested",
        "kind=frame" => ": no such frame crossed the engine",
        "kind=commit" => ": nothing like it was written",
        _ => "",
    };
    format!(" (the run has no event [{}] at all{what})", describe(&identity))
}

fn check_events(expected: &EventsExpectation, events: &[Event], documents: &Documents, failures: &mut Vec<String>) {
    let until = match &expected.before_rpc {
        Some(name) => match rpc_position(events, name) {
            Some(position) => position,
            None => {
                failures.push(format!(
                    "events [{}]: no outcome for `{name}` to count up to",
                    describe(&expected.conditions)
                ));
                return;
            }
        },
        None => events.len(),
    };
    let matching = documents.matching(&expected.conditions, 0..until);
    let found = matching.len() as u64;
    let wanted = match (expected.count, expected.count_min, expected.count_max) {
        (Some(n), _, _) if n != found => Some(n.to_string()),
        (None, Some(min), _) if found < min => Some(format!("at least {min}")),
        (None, _, Some(max)) if found > max => Some(format!("at most {max}")),
        _ => None,
    };
    if let Some(wanted) = wanted {
        let hint = if found == 0 { nothing_of_the_kind(&expected.conditions, documents, until) } else { String::new() };
        failures.push(format!("events [{}]: expected {wanted}, found {found}{hint}", describe(&expected.conditions)));
    }
    if let Some(after) = &expected.after {
        check_after(after, &expected.conditions, &matching, &documents.matching(&after.conditions, 0..until), failures);
    }
    if let Some(path) = &expected.same {
        let segments: Vec<String> = path.split('.').map(str::to_string).collect();
        let distinct: BTreeSet<String> = matching
            .iter()
            .map(|e| lookup(e, &segments).map_or_else(|| "<missing>".into(), Value::to_string))
            .collect();
        if distinct.len() > 1 {
            failures.push(format!(
                "events [{}]: `{path}` differs between them ({} distinct values)",
                describe(&expected.conditions),
                distinct.len()
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn note(at_ms: u64, what: &str) -> Value {
        json!({ "kind": "note", "at_ms": at_ms, "what": what })
    }

    fn failures_of(by_ms: toml::Value, timed: &[&Value], anchors: &[&Value]) -> Vec<String> {
        let after = After {
            conditions: vec![Condition::equals("what", "queue_dispatch").unwrap()],
            by_ms: Condition::from_toml(AFTER_BY, &by_ms).unwrap(),
        };
        let mut failures = Vec::new();
        check_after(&after, &[Condition::equals("what", "queue_redeliver").unwrap()], timed, anchors, &mut failures);
        failures
    }

    #[test]
    fn an_event_is_timed_from_the_latest_anchor_before_it() {
        let (first, second, redeliver) =
            (note(50, "queue_dispatch"), note(60, "queue_dispatch"), note(1_060, "queue_redeliver"));
        let exactly = |ms: i64| failures_of(toml::Value::Integer(ms), &[&redeliver], &[&first, &second]);
        assert!(exactly(1_000).is_empty(), "{:?}", exactly(1_000));
        // A tick early or late is a failure, and says by how much.
        let late = exactly(999);
        assert!(late.len() == 1 && late[0].contains("1000 ms after") && late[0].contains("at 60 ms"), "{late:?}");
        assert_eq!(exactly(1_001).len(), 1);
        let window: toml::Value = toml::from_str("ge = 1000\nle = 1100").unwrap();
        assert!(failures_of(window, &[&redeliver], &[&first, &second]).is_empty());
        // An anchor after the event does not time it, and neither does the event itself.
        let later = note(2_000, "queue_dispatch");
        let none = failures_of(toml::Value::Integer(0), &[&redeliver], &[&later, &redeliver]);
        assert!(none.len() == 1 && none[0].contains("no [what=queue_dispatch] before it"), "{none:?}");
    }

    fn at(at_ms: u64, kind: EventKind) -> Event {
        Event { at_ms, host: "h".into(), kind }
    }

    fn note_event(at_ms: u64, what: &str, detail: Value) -> Event {
        at(at_ms, EventKind::Note { what: what.into(), detail })
    }

    fn rpc_event(at_ms: u64, name: &str) -> Event {
        at(at_ms, EventKind::Rpc { name: name.into(), function: "harness::turn".into(), outcome: json!({}) })
    }

    fn effect_event(effect: &str, accepted: bool) -> Event {
        at(
            5,
            EventKind::Effect(Box::new(crate::trace::EffectEvent {
                effect: effect.into(),
                action: "a1".into(),
                idempotency_key: None,
                token: None,
                domain: None,
                accepted,
                reason: String::new(),
                by: None,
                invocation_id: None,
            })),
        )
    }

    fn is(path: &str, text: &str) -> Condition {
        Condition::equals(path, text).unwrap()
    }

    /// What a run left behind, to check expectations against.
    struct Fixture {
        rpc: BTreeMap<String, Value>,
        store: StateStore,
        events: Vec<Event>,
        effects: BTreeMap<String, u64>,
        sessions: SessionService,
        unused: Vec<String>,
        layout: RecordLayout,
    }

    impl Fixture {
        fn new(events: Vec<Event>) -> Self {
            let mut store = StateStore::new();
            store.seed(
                "harness_turn",
                "s1",
                json!({ "status": "completed", "calls": { "c1": { "status": "complete" }, "c2": { "status": "failed" } } }),
            );
            let mut sessions = SessionService::new();
            sessions.seed_message("s1", json!({ "role": "user", "content": "hi" }));
            sessions.seed_message("s1", json!({ "role": "assistant", "content": "done" }));
            Self {
                rpc: BTreeMap::from([("first".to_string(), json!({ "outcome": "ok", "status": "completed" }))]),
                store,
                effects: effect_counts(&events),
                events,
                sessions,
                unused: Vec::new(),
                layout: RecordLayout::default(),
            }
        }

        fn observed(&self) -> Observed<'_> {
            Observed {
                rpc: &self.rpc,
                store: &self.store,
                events: &self.events,
                effects: &self.effects,
                sessions: &self.sessions,
                unused: &self.unused,
                layout: &self.layout,
            }
        }

        fn check(&self, expectation: Expectation) -> Vec<String> {
            check(&[expectation], &self.observed())
        }
    }

    fn events(conditions: Vec<Condition>) -> EventsExpectation {
        EventsExpectation { conditions, ..EventsExpectation::default() }
    }

    #[test]
    fn rig_notes_are_told_from_a_harnesss_own() {
        for what in ["queue_redeliver", "proxy_held", "model_contract", "unreadable_frame", "outbox_full"] {
            assert!(is_rig_note(what), "{what}");
        }
        for what in ["finalize_retry", "approval_expired", "queue", "a_queue_note"] {
            assert!(!is_rig_note(what), "{what}");
        }
        let reads = |conditions: Vec<Condition>| Expectation::Events(events(conditions)).reads_harness_notes();
        assert!(reads(vec![is("kind", "note"), is("what", "finalize_retry")]));
        assert!(reads(vec![is("kind", "note")]), "every note, the harness's among them");
        assert!(!reads(vec![is("kind", "note"), is("what", "queue_redeliver")]));
        let mixed = Condition::from_toml(
            "what",
            &toml::from_str::<toml::Table>("v = { one_of = [\"queue_redeliver\", \"finalize_retry\"] }").unwrap()["v"],
        )
        .unwrap();
        assert!(reads(vec![is("kind", "note"), mixed]), "one harness note among the accepted is enough");
        assert!(!reads(vec![is("kind", "effect"), is("what", "finalize_retry")]), "not about notes");
        assert!(!reads(vec![is("what", "finalize_retry")]), "no kind named: not about notes");
        assert!(!Expectation::ModelScript.reads_harness_notes());
    }

    #[test]
    fn effects_are_counted_from_accepted_ledger_entries_by_kind() {
        let counts = effect_counts(&[
            effect_event("ticket", true),
            effect_event("ticket", true),
            effect_event("ticket", false),
            effect_event("email", true),
            note_event(1, "ticket", json!({})),
        ]);
        assert_eq!(counts, BTreeMap::from([("email".to_string(), 1), ("ticket".to_string(), 2)]));
        let fixture = Fixture::new(vec![effect_event("ticket", true)]);
        let effects = |pairs: &[(&str, u64)]| {
            fixture.check(Expectation::Effects(pairs.iter().map(|(k, n)| (k.to_string(), *n)).collect()))
        };
        assert!(effects(&[("ticket", 1)]).is_empty());
        assert!(effects(&[("ticket", 1), ("email", 0)]).is_empty(), "an absent kind is zero");
        assert_eq!(effects(&[("ticket", 2)]), ["effects `ticket`: expected 2, the ledger shows 1"]);
        assert_eq!(effects(&[]), ["effects `ticket`: expected 0, the ledger shows 1"], "a kind not named must be zero");
    }

    #[test]
    fn records_replies_and_actions_fail_only_when_a_condition_does() {
        let fixture = Fixture::new(Vec::new());
        let rpc = |conditions| fixture.check(Expectation::Rpc { name: "first".into(), conditions });
        assert!(rpc(vec![is("status", "completed")]).is_empty());
        assert_eq!(
            rpc(vec![is("outcome", "ok"), is("status", "failed")]),
            [
                r#"rpc `first`: status expected = failed, found `completed` (outcome {"outcome":"ok","status":"completed"})"#
            ]
        );
        let unknown = fixture.check(Expectation::Rpc { name: "never".into(), conditions: vec![is("outcome", "none")] });
        assert!(unknown.is_empty(), "an invocation that never answered has the outcome `none`");

        let state = |key: &str, conditions| {
            fixture.check(Expectation::State { scope: "harness_turn".into(), key: key.into(), conditions })
        };
        assert!(state("s1", vec![is("status", "completed")]).is_empty());
        assert_eq!(
            state("s1", vec![is("status", "failed")]),
            ["state harness_turn/s1: status expected = failed, found `completed`"]
        );
        assert_eq!(
            state("s2", vec![is("status", "failed")]),
            ["state harness_turn/s2: expected a record (status=failed), found none"]
        );

        let absent = |key: &str| fixture.check(Expectation::Absent { scope: "harness_turn".into(), key: key.into() });
        assert!(absent("s2").is_empty());
        assert_eq!(absent("s1").len(), 1);

        let actions =
            |session: &str, conditions| fixture.check(Expectation::Actions { session: session.into(), conditions });
        assert!(actions("s1", vec![is("count", "2"), is("done", "1"), is("failed", "1")]).is_empty());
        let failed = actions("s1", vec![is("done", "2")]);
        assert!(
            failed.len() == 1 && failed[0].starts_with("actions of s1: done expected = 2, found `1`"),
            "{failed:?}"
        );
        let none = actions("s2", vec![is("count", "0")]);
        assert!(none.len() == 1 && none[0].contains("found no turn record"), "{none:?}");
    }

    #[test]
    fn a_known_bad_policy_must_break_what_it_says_it_breaks() {
        let fixture = Fixture::new(Vec::new());
        let holds = || {
            vec![Expectation::State {
                scope: "harness_turn".into(),
                key: "s1".into(),
                conditions: vec![is("status", "completed")],
            }]
        };
        let fails = || vec![Expectation::Rpc { name: "first".into(), conditions: vec![is("status", "failed")] }];
        let judged = broken(&[("rpc".into(), fails()), ("state".into(), holds())], &fixture.observed());
        assert_eq!(judged.len(), 2);
        assert_eq!((judged[0].0.as_str(), judged[0].1.len()), ("rpc", 1));
        assert_eq!((judged[1].0.as_str(), judged[1].1.len()), ("state", 0));
        assert_eq!(
            check_broken(&judged),
            ["`[expect]` state was expected to fail under this policy (it breaks it on purpose), and it held"]
        );
        assert!(check_broken(&judged[..1]).is_empty(), "the rpc expectation did break");
    }

    #[test]
    fn a_transcript_must_hold_exactly_its_entries_in_order() {
        let fixture = Fixture::new(Vec::new());
        let transcript =
            |session: &str, entries| fixture.check(Expectation::Transcript { session: session.into(), entries });
        assert!(transcript("s1", vec![vec![is("role", "user")], vec![is("role", "assistant"), is("content", "done")]])
            .is_empty());
        assert_eq!(
            transcript("s1", vec![vec![is("role", "user")]]),
            ["transcript s1: expected 1 entries, found 2 [user, assistant]"]
        );
        let out_of_order = transcript("s1", vec![vec![is("role", "assistant")], vec![is("role", "assistant")]]);
        assert!(
            out_of_order.len() == 1 && out_of_order[0].starts_with("transcript s1 entry #1: role expected = assistant"),
            "{out_of_order:?}"
        );
        assert!(transcript("s2", Vec::new()).is_empty(), "a session nobody wrote has an empty transcript");
    }

    #[test]
    fn the_model_script_fails_on_what_the_model_noted_and_on_unused_replies() {
        let mut fixture = Fixture::new(vec![
            note_event(
                7,
                "model_contract",
                json!({ "generation": 2, "problem": "unexpected request", "failed": ["tools differ"] }),
            ),
            note_event(9, "model_contract", json!({ "generation": 3, "problem": "beyond the script" })),
            note_event(9, "finalize_retry", json!({ "generation": 4, "problem": "not the model's" })),
        ]);
        fixture.unused = vec!["reply 3 of s1 was never asked for".into()];
        assert_eq!(
            fixture.check(Expectation::ModelScript),
            [
                "model script: generation 2 at 7 ms: unexpected request: tools differ",
                "model script: generation 3 at 9 ms: beyond the script",
                "model script: reply 3 of s1 was never asked for",
            ]
        );
        assert!(Fixture::new(Vec::new()).check(Expectation::ModelScript).is_empty());
    }

    #[test]
    fn event_counts_hold_at_their_bounds_and_fail_past_them() {
        let fixture = Fixture::new(vec![
            note_event(1, "queue_dispatch", json!({ "m": 1 })),
            note_event(2, "queue_dispatch", json!({ "m": 1 })),
            note_event(3, "queue_ack", json!({ "m": 2 })),
        ]);
        let dispatches = || events(vec![is("kind", "note"), is("what", "queue_dispatch")]);
        let judge = |count: Option<u64>, count_min: Option<u64>, count_max: Option<u64>| {
            fixture.check(Expectation::Events(EventsExpectation { count, count_min, count_max, ..dispatches() })).len()
        };
        // Two dispatches: exactly two, at least one or two, at most two or three.
        assert_eq!([judge(Some(2), None, None), judge(Some(1), None, None), judge(Some(3), None, None)], [0, 1, 1]);
        assert_eq!([judge(None, Some(1), None), judge(None, Some(2), None), judge(None, Some(3), None)], [0, 0, 1]);
        assert_eq!([judge(None, None, Some(1)), judge(None, None, Some(2)), judge(None, None, Some(3))], [1, 0, 0]);
        assert_eq!(judge(None, Some(1), Some(3)), 0);
        assert_eq!(
            fixture.check(Expectation::Events(EventsExpectation { count: Some(0), ..dispatches() })),
            ["events [kind=note, what=queue_dispatch]: expected 0, found 2"]
        );
        // Sameness: one value across every match holds; two distinct values fail.
        let same = |path: &str, conditions| {
            fixture.check(Expectation::Events(EventsExpectation { same: Some(path.into()), ..events(conditions) }))
        };
        assert!(same("detail.m", dispatches().conditions).is_empty());
        assert_eq!(
            same("detail.m", vec![is("kind", "note")]),
            ["events [kind=note]: `detail.m` differs between them (2 distinct values)"]
        );
        assert_eq!(same("detail.absent", vec![is("kind", "note")]).len(), 0, "missing everywhere is the same");
    }

    #[test]
    fn before_rpc_counts_only_what_came_before_that_outcome() {
        let fixture = Fixture::new(vec![
            note_event(1, "queue_dispatch", json!({})),
            note_event(2, "queue_dispatch", json!({})),
            rpc_event(3, "first"),
            note_event(4, "queue_dispatch", json!({})),
        ]);
        let before = |name: &str, count: u64| {
            fixture.check(Expectation::Events(EventsExpectation {
                before_rpc: Some(name.into()),
                count: Some(count),
                ..events(vec![is("what", "queue_dispatch")])
            }))
        };
        assert!(before("first", 2).is_empty());
        assert_eq!(before("first", 3).len(), 1);
        assert_eq!(before("later", 2), ["events [what=queue_dispatch]: no outcome for `later` to count up to"]);
        let all = fixture.check(Expectation::Events(EventsExpectation {
            count: Some(3),
            ..events(vec![is("what", "queue_dispatch")])
        }));
        assert!(all.is_empty(), "{all:?}");
    }

    fn frame(at_ms: u64, direction: &'static str, peer: &str, frame: &'static str, id: &str) -> Event {
        at(
            at_ms,
            EventKind::Frame {
                direction,
                peer: peer.into(),
                frame,
                function_id: Some("harness::turn".into()),
                invocation_id: Some(id.into()),
            },
        )
    }

    /// One delivery of message m1: the queue's note, its invocation through the engine to the
    /// worker, and (when `answered_at` is given) the worker's answer.
    fn delivery(attempt: u64, at_ms: u64, answered_at: Option<u64>) -> Vec<Event> {
        let id = format!("i{attempt}");
        let detail = json!({ "queue": "harness-turn", "message_id": "m1", "attempt": attempt });
        let mut events = vec![
            note_event(at_ms, "queue_dispatch", detail),
            frame(at_ms + 1, "in", "queue", "invokefunction", &id),
            frame(at_ms + 1, "out", "harness", "invokefunction", &id),
        ];
        events.extend(answered_at.map(|ms| frame(ms, "in", "harness", "invocationresult", &id)));
        events
    }

    /// A delivery sent again while the worker still runs the first (its deadline passed) is
    /// two deliveries of one turn at once, and a generation the script did not provide for in
    /// that time says so; one sent again after the first was answered is not.
    #[test]
    fn two_deliveries_of_one_turn_at_once_are_told_as_such() {
        let mut events = delivery(1, 50, Some(11_091));
        events.extend(delivery(2, 10_350, Some(10_395)));
        events.push(note_event(11_080, "model_contract", json!({ "generation": 4, "problem": "no reply left" })));
        let overlaps = overlapping_deliveries(&events);
        assert_eq!(overlaps.len(), 1, "{overlaps:?}");
        assert_eq!((overlaps[0].from_ms, overlaps[0].until_ms), (10_350, Some(11_091)), "for as long as either ran");
        let failures = Fixture::new(events).check(Expectation::ModelScript);
        assert_eq!(failures.len(), 2, "{failures:#?}");
        assert!(
            failures[0].starts_with(
                "model script: two deliveries of one turn ran at once on `harness`: message m1 of queue \
                 `harness-turn`, attempt 1 (dispatched at 50 ms, still running) and attempt 2 (dispatched at 10350 ms)"
            ),
            "{}",
            failures[0]
        );
        assert!(failures[1].starts_with("model script: generation 4 at 11080 ms"), "{}", failures[1]);

        let mut one_after_another = delivery(1, 50, Some(10_000));
        one_after_another.extend(delivery(2, 10_350, Some(10_395)));
        assert!(overlapping_deliveries(&one_after_another).is_empty());
        // A first delivery whose worker crashed ran no more.
        let mut crashed = delivery(1, 50, None);
        crashed.push(at(60, EventKind::Control { action: "crash".into(), target: "harness".into() }));
        crashed.extend(delivery(2, 10_350, Some(10_395)));
        assert!(overlapping_deliveries(&crashed).is_empty());
    }

    /// An events expectation that found nothing says when the run had nothing of its kind at
    /// all: what the harness never did.
    #[test]
    fn nothing_found_says_when_nothing_of_the_kind_happened() {
        let fixture = Fixture::new(vec![note_event(1, "queue_ack", json!({}))]);
        let leases = events(vec![is("kind", "lease"), is("owner", "harness")]);
        assert_eq!(
            fixture.check(Expectation::Events(EventsExpectation { count_min: Some(2), ..leases })),
            ["events [kind=lease, owner=harness]: expected at least 2, found 0 (the run has no event [kind=lease] at \
              all: no lease was granted in it, so the harness took none)"]
        );
        let acks = events(vec![is("kind", "note"), is("what", "queue_ack"), is("detail.attempt", "2")]);
        assert_eq!(
            fixture.check(Expectation::Events(EventsExpectation { count: Some(1), ..acks })),
            ["events [kind=note, what=queue_ack, detail.attempt=2]: expected 1, found 0"],
            "there are acks, just not that one: nothing more to say"
        );
    }
}
