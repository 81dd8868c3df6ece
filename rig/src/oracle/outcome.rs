//! The `outcome` oracle: faults may delay an outcome, never change it. A run with faults is
//! judged against the same workload run without them (its uncut run, see `run::uncut`): per
//! session, the same turns ending the same way, the same effects accepted, the same final
//! answers. Both outcomes are read the same way, from what the services saw (the store's commits,
//! the ledger, the transcripts) through the harness's record layout, so the oracle is as
//! harness-neutral as the others.
//!
//! The differences the contract permits (a turn held or failed with a reason, whose reply the
//! other oracles hold to the store; an action held as unresolved, or refused by its service; a
//! control command whose delivery was cut and never took effect, or that met the turn at another
//! point) excuse what follows from them; a workload whose outcome depends on the faults by design
//! says so (`outcome_depends_on_faults`), and is not judged.

use super::{violation, Evidence, Oracle, Violation, CONTROL_SCOPE};
use crate::layout::{ActionClass, RecordLayout};
use crate::services::EffectFunctions;
use crate::trace::{Event, EventKind};
use doubles::{SessionService, StateStore};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};

/// An effect as both runs can name it: its kind and the arguments it was requested with (action
/// ids, keys and tokens are each run's own).
type EffectName = (String, String);

/// What a run came to, per session.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Outcome {
    pub sessions: BTreeMap<String, SessionOutcome>,
    /// How many generations the model was asked for again: requests that reached it with the
    /// messages of one it had had before (a reply lost, a request the network repeated).
    pub repeated_generations: u64,
}

/// What one session came to.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SessionOutcome {
    /// Its turns, in the order the store first held them (the seeded ones first), and how each
    /// ended: the status of its last record.
    pub turns: Vec<TurnEnd>,
    /// The effects its actions had accepted: by effect, the number of actions (an action counts
    /// once, however many of its requests a service accepted: that is `effects`' business).
    pub effects: BTreeMap<EffectName, u64>,
    /// Effects of actions a service refused (a definite answer: it did not happen), by effect.
    pub refused: BTreeMap<EffectName, u64>,
    /// Whether an action of its current turn is held or unsettled at the end.
    pub unresolved: bool,
    /// The assistant's text entries of its transcript, in order: the turns' answers.
    pub answers: Vec<String>,
    /// Its control commands, by idempotency key: what each is and how it stands at the end; and
    /// the replies to the script's commands naming it (`reply NAME`: a release, a cancel, a
    /// pause...), by whether they say the command took effect.
    pub commands: BTreeMap<String, String>,
}

/// How one turn ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TurnEnd {
    pub turn_id: String,
    pub status: String,
}

/// What reading a run's outcome needs of its workload (the runner digests it from the scenario).
#[derive(Debug, Clone, Default)]
pub struct Workload<'a> {
    /// The records the world was seeded with: `(scope, key, value)`.
    pub seeded: &'a [(String, String, Value)],
    /// The indices of the run's cuts that answer a call with a definite refusal (a `reject`, an
    /// outage that rejects): a request such a cut answered did not happen.
    pub refusing: BTreeSet<usize>,
    /// The script's control-command invocations (a release or denial of a held call, the
    /// commands of the control record), by step name: the session each names.
    pub commanded: BTreeMap<String, String>,
}

impl Outcome {
    /// The outcome of a finished run, from its trace, its final store and transcripts, and what
    /// its workload was seeded and scripted with.
    pub fn of(
        events: &[Event],
        store: &StateStore,
        sessions: &SessionService,
        workload: &Workload<'_>,
        layout: &RecordLayout,
        effects: &EffectFunctions,
    ) -> Outcome {
        let mut outcome = Outcome::default();
        let (commanded, refusing) = (&workload.commanded, &workload.refusing);
        let mut ends: BTreeMap<(String, String), usize> = BTreeMap::new();
        let mut turn_session: BTreeMap<String, String> = BTreeMap::new();
        let mut record_turn = |outcome: &mut Outcome, session: &str, value: &Value| {
            let turn_id = layout.turn_id(value).to_string();
            turn_session.insert(turn_id.clone(), session.to_string());
            let turns = &mut outcome.sessions.entry(session.to_string()).or_default().turns;
            let status = layout.status(value).to_string();
            match ends.get(&(session.to_string(), turn_id.clone())) {
                Some(&index) => turns[index].status = status,
                None => {
                    ends.insert((session.to_string(), turn_id.clone()), turns.len());
                    turns.push(TurnEnd { turn_id, status });
                }
            }
        };
        for (scope, key, value) in workload.seeded {
            if *scope == layout.turn_scope {
                record_turn(&mut outcome, key, value);
            }
        }
        // Requests to effect services, by invocation: what each asked for.
        let mut requests: BTreeMap<&str, &Value> = BTreeMap::new();
        let mut function_of: BTreeMap<&str, &str> = BTreeMap::new();
        let mut action_turn: BTreeMap<String, String> = BTreeMap::new();
        let mut refused_requests: BTreeSet<&str> = BTreeSet::new();
        let mut accepted: BTreeMap<String, (String, String)> = BTreeMap::new();
        let mut refused: BTreeMap<String, (String, String)> = BTreeMap::new();
        // The last effect request, while its cut (if any) is the next event.
        let mut last_call: Option<&str> = None;
        // The messages of each generation so far, compared as the texts they write: a run asks
        // a few times, so a look along them is cheaper than writing every one out.
        let mut generated: Vec<&Value> = Vec::new();
        for event in events {
            match &event.kind {
                EventKind::Commit { scope, key, value, .. } if !value.is_null() => {
                    if *scope == layout.turn_scope {
                        record_turn(&mut outcome, key, value);
                    }
                    for version in layout.committed_actions(scope, key, value) {
                        action_turn.insert(version.action_id.to_string(), version.turn_id.to_string());
                    }
                }
                EventKind::Call { function, payload, .. }
                    if function == GENERATE && !first_asked(&mut generated, &payload["messages"]) =>
                {
                    outcome.repeated_generations += 1;
                }
                EventKind::Call { function, payload, invocation_id: Some(id), .. }
                    if effects.effects.contains(function.as_str()) =>
                {
                    requests.insert(id, payload);
                    function_of.insert(id, function);
                    last_call = Some(id);
                    continue;
                }
                // A call its cut refused: the service answered no (it did not happen).
                EventKind::Cut { cut, .. } if refusing.contains(cut) => {
                    if let Some(id) = last_call {
                        refused_requests.insert(id);
                    }
                }
                EventKind::Rpc { name, outcome: reply, .. } => {
                    if let Some(session) = commanded.get(name.as_str()) {
                        let commands = &mut outcome.sessions.entry(session.clone()).or_default().commands;
                        commands.insert(format!("reply {name}"), took_effect(reply));
                    }
                }
                EventKind::Effect(ledgered) => {
                    let crate::trace::EffectEvent {
                        effect, action, accepted: was_accepted, invocation_id, reason, ..
                    } = &**ledgered;
                    let payload = invocation_id.as_deref().and_then(|id| requests.get(id));
                    let named = (effect.clone(), payload.map_or_else(String::new, |p| arguments(p)));
                    if *was_accepted {
                        accepted.insert(action.clone(), named);
                    } else if reason != "duplicate key" {
                        refused.entry(action.clone()).or_insert(named);
                    }
                }
                _ => {}
            }
            last_call = None;
        }
        for id in refused_requests {
            let Some(payload) = requests.get(id) else { continue };
            let (Some(action), Some(function)) = (payload["action_id"].as_str(), function_of.get(id)) else { continue };
            // The ledger names an effect by its service and effect (`ticket.create`).
            let kind = function.replace("::", ".");
            refused.entry(action.to_string()).or_insert((kind, arguments(payload)));
        }
        let session_of = |action: &str, fallback: &str| {
            action_turn
                .get(action)
                .and_then(|turn| turn_session.get(turn))
                .cloned()
                .unwrap_or_else(|| fallback.to_string())
        };
        for (action, named) in accepted {
            let session = session_of(&action, "");
            *outcome.sessions.entry(session).or_default().effects.entry(named).or_default() += 1;
        }
        for (action, named) in refused {
            let session = session_of(&action, "");
            *outcome.sessions.entry(session).or_default().refused.entry(named).or_default() += 1;
        }
        for (scope, session, record) in store.records() {
            if scope == layout.turn_scope {
                let actions = layout.turn_actions(store, session, record);
                let unresolved = actions.iter().any(|(_, action)| layout.classify(action) != ActionClass::Complete);
                outcome.sessions.entry(session.to_string()).or_default().unresolved = unresolved;
            } else if scope == CONTROL_SCOPE {
                let commands = record["commands"].as_object().into_iter().flatten();
                let states = commands.map(|(key, command)| {
                    let what = format!(
                        "{} {}",
                        command["command"].as_str().unwrap_or("?"),
                        command["state"].as_str().unwrap_or("?")
                    );
                    (key.clone(), what)
                });
                outcome.sessions.entry(session.to_string()).or_default().commands.extend(states);
            }
        }
        for (session, transcript) in sessions.transcripts() {
            let answers = transcript
                .iter()
                .filter(|entry| entry["role"] == "assistant")
                .filter_map(|entry| entry["text"].as_str().map(str::to_string));
            outcome.sessions.entry(session.to_string()).or_default().answers = answers.collect();
        }
        outcome
    }
}

/// The model's function: a generation.
const GENERATE: &str = "model::generate";

/// Whether `messages` were not asked for before; kept if not.
fn first_asked<'a>(asked: &mut Vec<&'a Value>, messages: &'a Value) -> bool {
    let first = !asked.iter().any(|seen| same_text(seen, messages));
    if first {
        asked.push(messages);
    }
    first
}

/// Whether `a` and `b` write the same JSON text. Their `==` but for numbers, which are compared
/// as written (`-0.0` is not `0.0`, `1.0` is not `1`).
fn same_text(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(a), Value::Number(b)) => a.to_string() == b.to_string(),
        (Value::Array(a), Value::Array(b)) => a.len() == b.len() && a.iter().zip(b).all(|(a, b)| same_text(a, b)),
        (Value::Object(a), Value::Object(b)) => {
            a.len() == b.len() && a.iter().zip(b).all(|((ka, a), (kb, b))| ka == kb && same_text(a, b))
        }
        _ => a == b,
    }
}

/// What a reply to a command says of it: whether it took effect, as far as the contract's
/// replies tell (`resolved` for a release, `state` for a control command), or that no answer
/// came (its delivery, or the answer's, was cut).
fn took_effect(reply: &Value) -> String {
    if reply["outcome"] != "ok" {
        return "no answer".to_string();
    }
    let result = &reply["result"];
    match (&result["resolved"], &result["state"]) {
        (Value::Bool(resolved), _) => format!("resolved {resolved}"),
        (_, Value::String(state)) => format!("state {state}"),
        _ => "answered".to_string(),
    }
}

/// The arguments an effect request carried, as text: its `args`, or else the request without the
/// fields that are each run's own (the action's id, key and reference, the fencing token).
fn arguments(payload: &Value) -> String {
    if !payload["args"].is_null() {
        return payload["args"].to_string();
    }
    let mut rest = payload.clone();
    if let Some(fields) = rest.as_object_mut() {
        for own in ["action_id", "idempotency_key", "client_reference", "fencing"] {
            fields.remove(own);
        }
    }
    rest.to_string()
}

/// Whether a turn's end is one the contract lets a fault bring about (held for a person, with a
/// reason the other oracles require; failed, with a reply they hold to the store), or no end at
/// all (a turn left running or parked is `liveness`'s business, not a changed outcome).
fn permitted_end(layout: &RecordLayout, status: &str) -> bool {
    status == layout.held_status || status == FAILED || !layout.terminal_statuses.iter().any(|s| s == status)
}

/// Whether a turn in this status has come to an end: terminal, or held for a person.
fn came_to_an_end(layout: &RecordLayout, status: &str) -> bool {
    status == layout.held_status || layout.terminal_statuses.iter().any(|s| s == status)
}

/// Whether a turn in this status did what it was for: terminal, and not failed.
fn finished(layout: &RecordLayout, status: &str) -> bool {
    status != FAILED && layout.terminal_statuses.iter().any(|s| s == status)
}

/// The terminal status of a turn that ended without doing what it was for (the contract's).
const FAILED: &str = "failed";

/// `outcome`: the run against its uncut run, session by session (see the module's comment).
pub(super) fn same_outcome(evidence: &Evidence<'_>, violations: &mut Vec<Violation>) {
    let Some(judged) = &evidence.outcome else { return };
    for difference in outcome_differences(judged, evidence.layout, &evidence.effect_functions) {
        violations.push(violation(Oracle::Outcome, difference));
    }
}

/// The differences between a run's outcome and an uncut run's that the contract does not permit,
/// one line each (what `outcome` reports).
pub fn outcome_differences(
    judged: &OutcomeJudged<'_>,
    layout: &RecordLayout,
    effects: &EffectFunctions,
) -> Vec<String> {
    differences(judged.run, judged.uncut, layout, effects, judged)
}

/// What judging a run's outcome needs beyond the run itself.
pub struct OutcomeJudged<'a> {
    /// What the run came to ([`Outcome::of`] its trace, store and transcripts).
    pub run: &'a Outcome,
    /// What the same workload came to without the faults.
    pub uncut: &'a Outcome,
    /// Whether the run's script ran every step (a step that could not complete ends it: what the
    /// steps after it would have done never happened, and is not missed).
    pub script_complete: bool,
    /// Whether the model answers a generation asked again as it did before: the answers are then
    /// the same text.
    pub deterministic_model: bool,
    /// Sessions whose turn record the script wrote itself (a `put` step: a person closing or
    /// changing a turn). Where that write lands in the harness's work is the faults' doing (a
    /// turn closed before the harness answered it, or after), so what the harness would have
    /// done in the session after it (fewer effects, answers) is not owed.
    pub written_by_script: BTreeSet<String>,
}

/// The differences between a run's outcome and its uncut run's that the contract does not
/// permit, one line each.
fn differences(
    run: &Outcome,
    uncut: &Outcome,
    layout: &RecordLayout,
    effects: &EffectFunctions,
    judged: &OutcomeJudged<'_>,
) -> Vec<String> {
    let mut found = Vec::new();
    let empty = SessionOutcome::default();
    // A model that is not deterministic answers a generation asked again (its reply lost with a
    // worker that died before anything of it was durable, or its request repeated by the
    // network) with the script's next reply: from there on the run's story is the script's,
    // shifted, and no harness can give the answers, or request the effects, the uncut run's
    // script made. Its turns, its effects' arguments and the sessions a harness names after them (a
    // delegated child's) are the script's then, not the harness's: there is no outcome to hold
    // the run to (`effects` still judges each action's requests).
    if !judged.deterministic_model && run.repeated_generations > uncut.repeated_generations {
        return found;
    }
    let sessions: BTreeSet<&String> = run.sessions.keys().chain(uncut.sessions.keys()).collect();
    // An uncut run that did not bring a turn to the end the run did, because it held, failed or
    // never ended it, did not come to the workload's outcome: its story was written around the
    // faults (a model script for the retry they cause, a step that waits for them), and there
    // is nothing to hold the run to.
    for session in &sessions {
        let (now, before) =
            (run.sessions.get(*session).unwrap_or(&empty), uncut.sessions.get(*session).unwrap_or(&empty));
        let unfinished = now
            .turns
            .iter()
            .zip(&before.turns)
            .any(|(end, uncut_end)| end.status != uncut_end.status && !finished(layout, &uncut_end.status));
        if unfinished {
            return found;
        }
    }
    for session in sessions {
        let (now, before) =
            (run.sessions.get(session).unwrap_or(&empty), uncut.sessions.get(session).unwrap_or(&empty));
        // A command that took effect in one run and not the other changed the session's story:
        // its delivery was cut, or it met the turn at another point.
        if now.commands != before.commands {
            continue;
        }
        let name = if session.is_empty() { "no session".to_string() } else { format!("session {session}") };
        // The turns, one by one: a permitted end stops the comparison (what it cut short is
        // excused), any other difference is reported once.
        // A turn held or failed did only part of its work, as far as the faults let it get (the
        // uncut run's turn may have failed too, at a later point): fewer effects are excused.
        let stopped = now.turns.iter().any(|end| permitted_end(layout, &end.status));
        let mut cut_short = now.unresolved || stopped || judged.written_by_script.contains(session.as_str());
        for index in 0..now.turns.len().max(before.turns.len()) {
            let (ended, uncut_ended) = (now.turns.get(index), before.turns.get(index));
            match (ended, uncut_ended) {
                (Some(end), Some(uncut_end)) if end.status == uncut_end.status => continue,
                // The uncut run never brought this turn to an end (it ran into its bound, which
                // `liveness` judges there): there is no outcome to hold the run to.
                (_, Some(uncut_end)) if !came_to_an_end(layout, &uncut_end.status) => cut_short = true,
                (Some(end), _) if permitted_end(layout, &end.status) => cut_short = true,
                // Another end is the difference; the answer and the effects it did not come to
                // are that difference, not more (effects beyond the uncut run's still are).
                (Some(end), Some(uncut_end)) => {
                    found.push(format!(
                        "{name}: turn #{} ({}) ended `{}`, where the uncut run's ({}) ended `{}`",
                        index + 1,
                        end.turn_id,
                        end.status,
                        uncut_end.turn_id,
                        uncut_end.status
                    ));
                    cut_short = true;
                }
                (None, Some(uncut_end)) if judged.script_complete => found.push(format!(
                    "{name}: the uncut run's turn #{} ({}, ended `{}`) never happened",
                    index + 1,
                    uncut_end.turn_id,
                    uncut_end.status
                )),
                (None, _) => cut_short = true,
                (Some(end), None) => found.push(format!(
                    "{name}: turn #{} ({}, ended `{}`) is one the uncut run never had",
                    index + 1,
                    end.turn_id,
                    end.status
                )),
            }
            break;
        }
        // Effects: never more (but repeats of calls safe to replay); fewer only where a turn
        // ended as permitted, an action stayed unresolved, or the service refused one.
        for (effect, &count) in &now.effects {
            let had = before.effects.get(effect).copied().unwrap_or(0);
            if count > had && !effects.replay_safe.contains(&effect.0) {
                found.push(format!(
                    "{name}: {count} action(s) had `{}` {} accepted, where the uncut run had {had}",
                    effect.0, effect.1
                ));
            }
        }
        if !cut_short && judged.script_complete {
            for (effect, &had) in &before.effects {
                let count = now.effects.get(effect).copied().unwrap_or(0);
                let refused = now.refused.get(effect).copied().unwrap_or(0);
                if count + refused < had {
                    found.push(format!(
                        "{name}: {count} action(s) had `{}` {} accepted, where the uncut run had {had}",
                        effect.0, effect.1
                    ));
                }
            }
        }
        // One final answer per answer the uncut run gave, the same text where the model answers
        // a repeated generation alike.
        let same_turns = now.turns.len() == before.turns.len() && !cut_short;
        if same_turns && judged.script_complete && now.answers.len() != before.answers.len() {
            found.push(format!(
                "{name}: the transcript holds {} assistant answer(s), where the uncut run's holds {}",
                now.answers.len(),
                before.answers.len()
            ));
        } else if same_turns && judged.script_complete && judged.deterministic_model && now.answers != before.answers {
            found.push(format!(
                "{name}: the transcript's answers are {:?}, where the uncut run's are {:?}",
                now.answers, before.answers
            ));
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generations_are_the_same_when_their_messages_write_the_same_text() {
        use serde_json::json;
        assert!(same_text(&json!([{"b": 1, "a": "x"}]), &json!([{"a": "x", "b": 1}])));
        assert!(!same_text(&json!([{"a": 1}]), &json!([{"a": 1.0}])), "1 and 1.0 are written apart");
        assert!(!same_text(&json!(-0.0), &json!(0.0)), "as are -0.0 and 0.0, which `==` takes for one");
        // Inside a list or a map too, where `==` alone would take them for one.
        assert!(!same_text(&json!([-0.0]), &json!([0.0])));
        assert!(!same_text(&json!({"t": -0.0}), &json!({"t": 0.0})));
        assert!(!same_text(&json!(["a", "b"]), &json!(["a"])));
        assert!(!same_text(&json!({"a": 1}), &json!({"b": 1})));
        for (a, b) in [
            (json!([{"a": 1}]), json!([{"a": 1.0}])),
            (json!(-0.0), json!(0.0)),
            (json!({"x": [1]}), json!({"x": [1]})),
        ] {
            let (text_a, text_b) = (a.to_string(), b.to_string());
            assert_eq!(same_text(&a, &b), text_a == text_b);
        }
    }

    fn turns(ends: &[&str]) -> Vec<TurnEnd> {
        let end = |(i, status): (usize, &&str)| TurnEnd { turn_id: format!("t{}", i + 1), status: status.to_string() };
        ends.iter().enumerate().map(end).collect()
    }

    fn session(ends: &[&str], tickets: u64, answers: &[&str]) -> Outcome {
        let mut effects = BTreeMap::new();
        if tickets > 0 {
            effects.insert(("ticket.create".to_string(), "{\"title\":\"refund\"}".to_string()), tickets);
        }
        let one = SessionOutcome {
            turns: turns(ends),
            effects,
            answers: answers.iter().map(|a| a.to_string()).collect(),
            ..SessionOutcome::default()
        };
        Outcome { sessions: BTreeMap::from([("s1".to_string(), one)]), repeated_generations: 0 }
    }

    fn judge(run: &Outcome, uncut: &Outcome, script_complete: bool, deterministic_model: bool) -> Vec<String> {
        let judged =
            OutcomeJudged { run, uncut, script_complete, deterministic_model, written_by_script: BTreeSet::new() };
        differences(run, uncut, &RecordLayout::default(), &EffectFunctions::default(), &judged)
    }

    #[test]
    fn the_same_outcome_later_is_no_difference() {
        let uncut = session(&["completed"], 1, &["done"]);
        assert!(judge(&uncut.clone(), &uncut, true, true).is_empty());
    }

    #[test]
    fn another_end_fewer_or_more_effects_and_answers_are_differences() {
        let uncut = session(&["completed"], 1, &["done"]);
        let cancelled = judge(&session(&["cancelled"], 1, &["done"]), &uncut, true, false);
        assert!(
            cancelled[0].contains("ended `cancelled`, where the uncut run's (t1) ended `completed`"),
            "{cancelled:?}"
        );
        // What a turn that ended otherwise did not come to is the same difference, reported once.
        let cancelled_early = judge(&session(&["cancelled"], 0, &[]), &uncut, true, true);
        assert_eq!(cancelled_early.len(), 1, "{cancelled_early:?}");
        // More effects than the uncut run's are a difference of their own.
        assert_eq!(judge(&session(&["cancelled"], 2, &[]), &uncut, true, true).len(), 2);
        let fewer = judge(&session(&["completed"], 0, &["done"]), &uncut, true, false);
        assert!(fewer[0].contains("0 action(s) had `ticket.create`"), "{fewer:?}");
        let more = judge(&session(&["completed"], 2, &["done"]), &uncut, true, false);
        assert!(more[0].contains("2 action(s) had `ticket.create`"), "{more:?}");
        let twice = judge(&session(&["completed"], 1, &["done", "done"]), &uncut, true, false);
        assert!(twice[0].contains("holds 2 assistant answer(s), where the uncut run's holds 1"), "{twice:?}");
        let other = judge(&session(&["completed"], 1, &["other"]), &uncut, true, true);
        assert!(other[0].contains("answers are"), "{other:?}");
        assert!(
            judge(&session(&["completed"], 1, &["other"]), &uncut, true, false).is_empty(),
            "a model not deterministic"
        );
        let extra = judge(&session(&["completed", "completed"], 1, &["done"]), &uncut, true, false);
        assert!(extra[0].contains("is one the uncut run never had"), "{extra:?}");
        let missing = judge(&session(&[], 1, &["done"]), &uncut, true, false);
        assert!(missing[0].contains("never happened"), "{missing:?}");
    }

    #[test]
    fn a_permitted_end_excuses_what_follows_it() {
        let uncut = session(&["completed", "completed"], 1, &["done", "again"]);
        for end in ["held", "failed", "running"] {
            let run = session(&[end], 0, &[]);
            assert!(judge(&run, &uncut, true, true).is_empty(), "{end}: {:?}", judge(&run, &uncut, true, true));
        }
        // More effects than the uncut run are never excused.
        assert!(!judge(&session(&["failed"], 2, &[]), &uncut, true, true).is_empty());
        // A script that ended early never began what the uncut run's later steps did.
        assert!(judge(&session(&["completed"], 1, &["done"]), &uncut, false, true).is_empty());
        // A refusal is the service's definite no.
        let mut refused = session(&["completed", "completed"], 0, &["done", "again"]);
        let only = refused.sessions.get_mut("s1").expect("s1");
        only.refused.insert(("ticket.create".to_string(), "{\"title\":\"refund\"}".to_string()), 1);
        assert!(judge(&refused, &uncut, true, true).is_empty());
    }

    #[test]
    fn an_uncut_run_that_never_ended_a_turn_holds_the_run_to_nothing_after_it() {
        let uncut = session(&["running"], 0, &[]);
        assert!(judge(&session(&["completed"], 1, &["done"]), &uncut, true, true).is_empty());
    }

    #[test]
    fn a_later_turn_the_uncut_run_never_ended_is_owed_by_no_run() {
        // The turns before it ended alike; the uncut run's next turn ran into its bound, so a run
        // that never began it missed nothing.
        let uncut = session(&["completed", "running"], 1, &["done"]);
        let run = session(&["completed"], 1, &["done"]);
        assert!(judge(&run, &uncut, true, true).is_empty(), "{:?}", judge(&run, &uncut, true, true));
        // One that did end is owed.
        let ended = session(&["completed", "completed"], 1, &["done"]);
        let missing = judge(&run, &ended, true, true);
        assert!(missing[0].contains("turn #2 (t2, ended `completed`) never happened"), "{missing:?}");
    }

    #[test]
    fn the_oracle_reports_each_difference_and_judges_nothing_without_an_uncut_run() {
        let (uncut, run) = (session(&["completed"], 1, &["done"]), session(&["completed"], 2, &["done", "done"]));
        let judged = |outcome| {
            let (store, sessions, layout) = (StateStore::new(), SessionService::new(), RecordLayout::default());
            let evidence = Evidence { outcome, ..crate::oracle::tests::evidence(&[], &store, &sessions, &layout, 10) };
            let mut violations = Vec::new();
            same_outcome(&evidence, &mut violations);
            violations.into_iter().map(|v| (v.oracle, v.detail)).collect::<Vec<_>>()
        };
        assert!(judged(None).is_empty());
        let against = OutcomeJudged {
            run: &run,
            uncut: &uncut,
            script_complete: true,
            deterministic_model: true,
            written_by_script: BTreeSet::new(),
        };
        let found = judged(Some(against));
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(found.iter().all(|(oracle, _)| *oracle == Oracle::Outcome), "{found:?}");
        assert!(found[0].1.contains("2 action(s) had `ticket.create`"), "{found:?}");
        assert!(found[1].1.contains("holds 2 assistant answer(s)"), "{found:?}");
        let public = OutcomeJudged {
            run: &run,
            uncut: &uncut,
            script_complete: true,
            deterministic_model: true,
            written_by_script: BTreeSet::new(),
        };
        let listed = outcome_differences(&public, &RecordLayout::default(), &EffectFunctions::default());
        assert_eq!(listed, found.into_iter().map(|(_, detail)| detail).collect::<Vec<_>>());
    }

    #[test]
    fn a_turn_the_script_wrote_itself_owes_no_answer_but_never_more_effects() {
        let uncut = session(&["completed"], 1, &["done"]);
        let run = session(&["completed"], 0, &[]);
        let mut judged = OutcomeJudged {
            run: &run,
            uncut: &uncut,
            script_complete: true,
            deterministic_model: true,
            written_by_script: BTreeSet::new(),
        };
        let (layout, effects) = (RecordLayout::default(), EffectFunctions::default());
        assert_eq!(differences(&run, &uncut, &layout, &effects, &judged).len(), 2, "unwritten: judged");
        judged.written_by_script.insert("s1".to_string());
        assert!(differences(&run, &uncut, &layout, &effects, &judged).is_empty());
        let more = session(&["completed"], 2, &["done"]);
        assert!(!differences(&more, &uncut, &layout, &effects, &judged).is_empty());
    }

    #[test]
    fn a_session_whose_commands_ended_otherwise_is_not_judged() {
        let mut uncut = session(&["cancelled"], 0, &[]);
        let commands = &mut uncut.sessions.get_mut("s1").expect("s1").commands;
        commands.insert("c1".to_string(), "cancel applied".to_string());
        let run = session(&["completed"], 1, &["done"]);
        assert!(judge(&run, &uncut, true, true).is_empty());
    }

    #[test]
    fn a_failed_turn_excuses_fewer_effects_even_where_the_uncut_turn_failed_too() {
        let uncut = session(&["failed"], 1, &[]);
        assert!(judge(&session(&["failed"], 0, &[]), &uncut, true, true).is_empty());
        assert!(!judge(&session(&["completed"], 0, &["done"]), &session(&["completed"], 1, &["done"]), true, true)
            .is_empty());
    }

    #[test]
    fn a_generation_asked_again_of_a_scripted_model_leaves_the_story_to_the_script() {
        let uncut = session(&["completed"], 3, &["done"]);
        let mut run = session(&["completed"], 2, &["done"]);
        run.repeated_generations = 1;
        assert!(judge(&run, &uncut, true, false).is_empty());
        // A model that answers a repeated generation alike keeps the story the harness's.
        assert!(!judge(&run, &uncut, true, true).is_empty());
        // So does a run that asked no more again than its uncut run.
        let mut asked_alike = uncut.clone();
        asked_alike.repeated_generations = 1;
        assert!(!judge(&run, &asked_alike, true, false).is_empty());
    }

    #[test]
    fn a_command_reply_that_says_otherwise_excuses_its_session() {
        let mut uncut = session(&["completed"], 1, &["done"]);
        let mut run = session(&["completed"], 0, &["done"]);
        let reply = |outcome: &mut Outcome, what: &str| {
            let commands = &mut outcome.sessions.get_mut("s1").expect("s1").commands;
            commands.insert("reply release".to_string(), what.to_string());
        };
        reply(&mut uncut, "resolved true");
        reply(&mut run, "resolved true");
        assert!(!judge(&run, &uncut, true, true).is_empty(), "the same reply: judged");
        reply(&mut run, "resolved false");
        assert!(judge(&run, &uncut, true, true).is_empty());
        reply(&mut run, "no answer");
        assert!(judge(&run, &uncut, true, true).is_empty());
    }

    #[test]
    fn replies_say_whether_a_command_took_effect() {
        assert_eq!(took_effect(&serde_json::json!({ "outcome": "error", "error": {} })), "no answer");
        let released = serde_json::json!({ "outcome": "ok", "result": { "resolved": false, "reason": "expired" } });
        assert_eq!(took_effect(&released), "resolved false");
        let cancel = serde_json::json!({ "outcome": "ok", "result": { "state": "applied" } });
        assert_eq!(took_effect(&cancel), "state applied");
    }

    fn at(kind: EventKind) -> Event {
        Event { at_ms: 1, host: "worker".into(), kind }
    }

    fn commit(scope: &str, key: &str, value: Value) -> Event {
        at(EventKind::Commit { scope: scope.into(), key: key.into(), value: value.into(), version: 1 })
    }

    fn call(function: &str, invocation: &str, payload: Value) -> Event {
        at(EventKind::Call {
            service: "tickets".into(),
            function: function.into(),
            payload: payload.into(),
            caller: Some("worker".into()),
            invocation_id: Some(invocation.into()),
        })
    }

    fn ledger(action: &str, invocation: &str, accepted: bool, reason: &str) -> Event {
        at(EventKind::Effect(Box::new(crate::trace::EffectEvent {
            effect: "ticket.create".into(),
            action: action.into(),
            idempotency_key: None,
            token: None,
            domain: None,
            accepted,
            reason: reason.into(),
            by: Some("worker".into()),
            invocation_id: Some(invocation.into()),
        })))
    }

    fn cut(index: usize) -> Event {
        at(EventKind::Cut { cut: index, action: "reject".into(), function: "ticket::create".into() })
    }

    /// Reading a run's outcome: every kind of evidence `Outcome::of` reads, each once the way a
    /// run leaves it and once the way it must not be read (a delete, a record of another scope, a
    /// cut that does not refuse, a duplicate-key refusal, a message asked once).
    #[test]
    fn a_run_s_outcome_is_read_from_its_trace_store_and_transcripts() {
        use serde_json::json;
        let ticket = |action: &str, title: &str| json!({"action_id": action, "idempotency_key": format!("k-{action}"), "client_reference": action, "title": title});
        let calls = json!({"a1": {"status": "complete"}, "a2": {"status": "pending"}, "a3": {"status": "complete"}, "a4": {"status": "complete"}});
        let events = vec![
            commit("harness_turn", "s1", json!({"turn_id": "t1", "status": "running", "calls": calls})),
            // A delete and a record of another scope are no turns.
            commit("harness_turn", "s9", Value::Null),
            commit("harness_queue", "s1:q1", json!({"session_id": "s1", "turn_id": "q", "status": "queued"})),
            call(GENERATE, "g1", json!({"messages": ["hi"]})),
            call(GENERATE, "g2", json!({"messages": ["hi"]})),
            call(GENERATE, "g3", json!({"messages": ["hi", "done"]})),
            // Accepted; sent again and refused as a duplicate (that is no refusal).
            call("ticket::create", "i1", ticket("a1", "refund")),
            ledger("a1", "i1", true, "created"),
            call("ticket::create", "i5", ticket("a1", "refund")),
            ledger("a1", "i5", false, "duplicate key"),
            // Refused by a cut that answers no; then one cut that does not.
            call("ticket::create", "i2", ticket("a2", "second")),
            cut(0),
            call("ticket::create", "i3", ticket("a3", "third")),
            cut(1),
            ledger("a3", "i3", true, "created"),
            // Refused by the service.
            call("ticket::create", "i4", json!({"action_id": "a4", "args": {"title": "fourth"}})),
            ledger("a4", "i4", false, "invalid"),
            // A question the cut refused is no effect refused.
            call("ticket::status", "i6", json!({"action_id": "a1", "idempotency_key": "k-a1"})),
            cut(0),
            at(EventKind::Rpc {
                name: "release".into(),
                function: "harness::release".into(),
                outcome: json!({"outcome": "ok", "result": {"resolved": true}}),
            }),
            at(EventKind::Rpc {
                name: "other".into(),
                function: "harness::status".into(),
                outcome: json!({"outcome": "ok", "result": {}}),
            }),
            commit("harness_turn", "s1", json!({"turn_id": "t1", "status": "completed", "calls": calls})),
        ];
        let mut store = StateStore::new();
        store.seed("harness_turn", "s1", json!({"turn_id": "t1", "status": "completed", "calls": calls}));
        store.seed(
            "harness_turn",
            "s2",
            json!({"turn_id": "t2", "status": "completed", "calls": {"b1": {"status": "complete"}}}),
        );
        store.seed(CONTROL_SCOPE, "s1", json!({"commands": {"c1": {"command": "cancel", "state": "applied"}}}));
        let mut sessions = SessionService::new();
        for entry in [
            json!({"role": "user", "text": "hi"}),
            json!({"role": "assistant", "text": "done"}),
            json!({"role": "assistant"}),
        ] {
            sessions.seed_message("s1", entry);
        }
        let seeded = vec![
            ("harness_turn".to_string(), "s0".to_string(), json!({"turn_id": "t0", "status": "failed"})),
            ("harness_queue".to_string(), "s0:q1".to_string(), json!({"session_id": "s0", "message": "hi"})),
        ];
        let workload = Workload {
            seeded: &seeded,
            refusing: BTreeSet::from([0]),
            commanded: BTreeMap::from([("release".to_string(), "s1".to_string())]),
        };
        let effects =
            crate::services::Services { tickets: Some(Default::default()), ..Default::default() }.effect_functions();
        let outcome = Outcome::of(&events, &store, &sessions, &workload, &RecordLayout::default(), &effects);
        let named = |title: &str| ("ticket.create".to_string(), format!("{{\"title\":\"{title}\"}}"));
        let s0 = SessionOutcome {
            turns: vec![TurnEnd { turn_id: "t0".into(), status: "failed".into() }],
            ..SessionOutcome::default()
        };
        let s1 = SessionOutcome {
            turns: vec![TurnEnd { turn_id: "t1".into(), status: "completed".into() }],
            effects: BTreeMap::from([(named("refund"), 1), (named("third"), 1)]),
            refused: BTreeMap::from([(named("second"), 1), (named("fourth"), 1)]),
            unresolved: true,
            answers: vec!["done".to_string()],
            commands: BTreeMap::from([
                ("c1".to_string(), "cancel applied".to_string()),
                ("reply release".to_string(), "resolved true".to_string()),
            ]),
        };
        let s2 = SessionOutcome { turns: Vec::new(), unresolved: false, ..SessionOutcome::default() };
        let expected = Outcome {
            sessions: BTreeMap::from([("s0".to_string(), s0), ("s1".to_string(), s1), ("s2".to_string(), s2)]),
            repeated_generations: 1,
        };
        assert_eq!(outcome, expected);
    }

    #[test]
    fn a_replay_safe_effect_may_be_repeated() {
        let uncut = session(&["completed"], 1, &["done"]);
        let effects =
            EffectFunctions { replay_safe: BTreeSet::from(["ticket.create".to_string()]), ..Default::default() };
        let run = session(&["completed"], 2, &["done"]);
        let judged = OutcomeJudged {
            run: &run,
            uncut: &uncut,
            script_complete: true,
            deterministic_model: true,
            written_by_script: BTreeSet::new(),
        };
        assert!(differences(&run, &uncut, &RecordLayout::default(), &effects, &judged).is_empty());
    }
}
