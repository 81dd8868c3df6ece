//! Rules of the input oracles judged from what became of each message: queued input that left
//! the queue without becoming a turn (`stranded`: it vanished), and a message the client sent
//! once that more turns were started for than it and its like could account for
//! (`admitted-once`: answered twice, even when its first copy never went through the input
//! queue).

use super::{violation, Derived, Evidence, Oracle, Violation};
use crate::topology::DRIVER;
use crate::trace::EventKind;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};

/// Whether a transcript holds a message: an entry with every field the message has, as it was
/// given (a message that is plain text: an entry with that text).
fn transcript_holds(transcript: &[Value], message: &Value) -> bool {
    transcript.iter().any(|entry| match message {
        Value::Object(fields) => !fields.is_empty() && fields.iter().all(|(field, value)| entry[field] == *value),
        Value::String(text) => entry["text"] == *text,
        _ => false,
    })
}

/// Whether `value` holds `message` somewhere within a few levels (a turn record carrying the
/// message it was made of, in a field of the harness's own).
fn carries(value: &Value, message: &Value, depth: u32) -> bool {
    if value == message {
        return true;
    }
    depth > 0
        && match value {
            Value::Array(items) => items.iter().any(|item| carries(item, message, depth - 1)),
            Value::Object(fields) => fields.values().any(|field| carries(field, message, depth - 1)),
            _ => false,
        }
}

/// `stranded`: queued input whose entry was removed, though no turn was ever admitted from it:
/// no turn record names it, none of the session's turn records carries its message, and the
/// message never reached the session's transcript. The message vanished. (What is still queued
/// is the rule of input never admitted.)
pub(super) fn vanished<'a>(evidence: &Evidence<'a>, derived: &Derived<'a>, violations: &mut Vec<Violation>) {
    let layout = evidence.layout;
    let Some(input_scope) = &layout.input_scope else { return };
    let mut entries: BTreeMap<&str, &Value> = BTreeMap::new();
    let mut removed: BTreeMap<&str, u64> = BTreeMap::new();
    for (scope, key, value) in evidence.seeded {
        if scope == input_scope {
            entries.insert(key, value);
        }
    }
    for event in evidence.events {
        let EventKind::Commit { scope, key, value, .. } = &event.kind else { continue };
        if scope != input_scope {
            continue;
        }
        if value.is_null() {
            removed.insert(key, event.at_ms);
        } else {
            entries.entry(key).or_insert(value);
            removed.remove(key.as_str());
        }
    }
    let mut admitted: BTreeSet<&str> = derived.admissions(evidence).keys().copied().collect();
    if let Some(field) = &layout.input_keys_field {
        let seeded_turns = evidence.seeded.iter().filter(|(scope, _, _)| *scope == layout.turn_scope);
        for (_, _, record) in seeded_turns {
            admitted.extend(record[field].as_array().into_iter().flatten().filter_map(Value::as_str));
        }
    }
    let turn_records = || {
        let seeded = evidence.seeded.iter().filter(|(scope, _, _)| *scope == layout.turn_scope).map(|(_, k, v)| (k, v));
        let committed = evidence.events.iter().filter_map(|event| match &event.kind {
            EventKind::Commit { scope, key, value, .. } if *scope == layout.turn_scope => Some((key, &**value)),
            _ => None,
        });
        seeded.chain(committed)
    };
    for (key, at_ms) in removed {
        let Some(entry) = entries.get(key) else { continue };
        let session = entry["session_id"].as_str().unwrap_or_default();
        let message = &entry["message"];
        let carried = || {
            let meaningful = message.as_object().is_some_and(|m| !m.is_empty()) || message.is_string();
            meaningful
                && turn_records().any(|(turn_session, record)| turn_session == session && carries(record, message, 3))
        };
        // (The planted bug: any entry in the session's transcript taken as the message's.)
        let delivered = match crate::planted!("stranded-any-transcript-entry-counts") {
            true => !evidence.sessions.entries(session).is_empty(),
            false => transcript_holds(evidence.sessions.entries(session), message),
        };
        if admitted.contains(key) || delivered || carried() {
            continue;
        }
        violations.push(violation(
            Oracle::Stranded,
            format!(
                "input {input_scope}/{key} queued for session `{session}` was removed at {at_ms} ms, and no turn was ever admitted from it: the message vanished"
            ),
        ));
    }
}

/// `admitted-once`, judged by the messages themselves: every turn a worker starts for a session
/// answers a message of it (new turns start at step 0; a delegated child, which names its
/// parent, answers its parent), and a message is one message however often it was sent (again
/// under its idempotency key, or by the network under its invocation), whether it started a turn
/// directly or waited in the input queue. More new turns than the client's messages to the
/// session and the input put in its queue some other way means one of them was answered twice.
/// Only sessions the client sent to are judged.
pub(super) fn answered_twice(evidence: &Evidence<'_>, violations: &mut Vec<Violation>) {
    let layout = evidence.layout;
    let mut messages: BTreeMap<&str, BTreeSet<String>> = BTreeMap::new();
    for sent in &evidence.sends {
        messages.entry(sent.session_id.as_str()).or_default().insert(format!("sent {}", sent.identity));
    }
    if messages.is_empty() {
        return;
    }
    let queued_elsewhere = evidence
        .seeded
        .iter()
        .filter(|(scope, _, _)| Some(scope) == layout.input_scope.as_ref())
        .map(|(_, key, value)| (key.as_str(), value));
    let put_by_driver = evidence.events.iter().filter(|e| e.host == DRIVER).filter_map(|e| match &e.kind {
        EventKind::Commit { scope, key, value, .. } if Some(scope) == layout.input_scope.as_ref() => {
            Some((key.as_str(), &**value))
        }
        _ => None,
    });
    for (key, value) in queued_elsewhere.chain(put_by_driver) {
        if let Some(session) = value["session_id"].as_str() {
            messages.entry(session).or_default().insert(format!("queued {key}"));
        }
    }
    let seeded_turns: BTreeSet<(&str, &str)> = evidence
        .seeded
        .iter()
        .filter(|(scope, _, _)| *scope == layout.turn_scope)
        .map(|(_, key, value)| (key.as_str(), layout.turn_id(value)))
        .collect();
    let mut started: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    let mut seen: BTreeSet<(&str, &str)> = BTreeSet::new();
    for event in evidence.events {
        let EventKind::Commit { scope, key, value, .. } = &event.kind else { continue };
        if *scope != layout.turn_scope || value.is_null() {
            continue;
        }
        let turn = (key.as_str(), layout.turn_id(value));
        if !seen.insert(turn) || seeded_turns.contains(&turn) || event.host == DRIVER {
            continue;
        }
        let new = value[&layout.step_field].as_u64() == Some(0) && value[&layout.parent_field].is_null();
        if new {
            started.entry(turn.0).or_default().push(turn.1);
        }
    }
    for (session, sent) in messages {
        let Some(turns) = started.get(session).filter(|turns| turns.len() > sent.len()) else { continue };
        let sent: Vec<String> = sent.into_iter().collect();
        violations.push(violation(
            Oracle::AdmittedOnce,
            format!(
                "session {session} started {} turns ({}) for {} message(s) ({}): a message was answered twice",
                turns.len(),
                turns.join(", "),
                sent.len(),
                sent.join(", ")
            ),
        ));
    }
}
