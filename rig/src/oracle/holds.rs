//! Rules of `liveness` for turns that look at rest but wait on nothing that will ever come: a
//! turn held for a hook's hold of a call that no action records (nothing a person can release),
//! and a turn paused again by an older pause after its resume was applied (both commands done,
//! the turn parked for ever).

use super::{violation, Evidence, Oracle, Violation, CONTROL_SCOPE};
use crate::layout::ActionClass;
use crate::trace::EventKind;
use serde_json::Value;
use std::collections::BTreeMap;

/// A turn still held at the end for a call a `pre-trigger` hook held (its configured answer is
/// `hold`), which never ran again since it was first held after that answer, and none of whose actions is
/// recorded held: a release names a held call, and there is none to name. A turn first held
/// after that answer by a write made once its queue had given up on it, and held at the end with
/// a reason naming that dead letter, is held for the dead letter, not for the call, and is not
/// judged here.
pub(super) fn held_for_nothing(evidence: &Evidence<'_>, violations: &mut Vec<Violation>) {
    let layout = evidence.layout;
    let holds = |reply: &Value| reply["decision"] == "hold";
    // No hook of the world answers `hold`: no call was held, and no turn waits on one.
    if !evidence.hook_replies.values().any(holds) {
        return;
    }
    let holds_calls = |function: &str| evidence.hook_replies.get(function).is_some_and(holds);
    // The last hold of a call each session's hooks answered, by trace position.
    let mut last_hold: BTreeMap<&str, (usize, &str, u64)> = BTreeMap::new();
    for (position, event) in evidence.events.iter().enumerate() {
        let EventKind::Call { function, payload, .. } = &event.kind else { continue };
        if holds_calls(function) && payload["point"] == "pre_trigger" {
            if let Some(session) = payload["session_id"].as_str() {
                last_hold.insert(session, (position, function.as_str(), event.at_ms));
            }
        }
    }
    for (session, (position, hook, at_ms)) in last_hold {
        let Some(record) = evidence.store.get(&layout.turn_scope, session) else { continue };
        if layout.status(record) != layout.held_status {
            continue;
        }
        // From the first hold of the turn recorded after the hook's answer on, the turn never ran.
        let commits: Vec<(usize, &Value)> = evidence
            .events
            .iter()
            .enumerate()
            .skip(position)
            .filter_map(|(at, event)| match &event.kind {
                EventKind::Commit { scope, key, value, .. }
                    if *scope == layout.turn_scope && key == session && !value.is_null() =>
                {
                    Some((at, &**value))
                }
                _ => None,
            })
            .collect();
        let ran = |value: &Value| {
            !layout.is_terminal(value) && layout.status(value) != layout.held_status && !layout.is_parked(value)
        };
        let first_held = commits.iter().position(|(_, value)| layout.status(value) == layout.held_status);
        // (The planted bug: the turn's writes before its hold was recorded count as running again.)
        let ran_again = match crate::planted!("liveness-hold-ran-before-its-record-counts") {
            true => commits.iter().any(|(_, value)| ran(value)),
            false => first_held.is_some_and(|first| commits[first..].iter().any(|(_, value)| ran(value))),
        };
        // A hold first written after the turn's queue gave up on it is the dead letter's: the
        // contract lets a harness hold (or fail) a turn whose delivery was given up on, for a
        // person to deal with as a dead letter, whatever the turn was doing when its deliveries
        // ran out. It promises no held call, so no release is owed. It says so: a dead-letter hold
        // names the dead letter in its reason (the contract), so a turn held at the end for
        // another reason (the hook's) is held for the call, whenever that hold was written.
        let turn_id = layout.turn_id(record);
        let reason = record[&layout.held_reason_field].as_str().unwrap_or_default();
        let for_a_dead_letter =
            first_held.is_some_and(|first| given_up_before(evidence, session, turn_id, commits[first].0, reason));
        let actions = layout.turn_actions(evidence.store, session, record);
        if ran_again
            || for_a_dead_letter
            || actions.iter().any(|(_, action)| layout.classify(action) == ActionClass::Held)
        {
            continue;
        }
        violations.push(violation(
            Oracle::Liveness,
            format!(
                "turn {session}/{} is `{}` since hook `{hook}` held a call of it at {at_ms} ms, but none of its actions is recorded held: nothing can release it",
                layout.turn_id(record),
                layout.status(record)
            ),
        ));
    }
}

/// Whether a queue gave up on a message carrying this turn (its `session_id`, and its `turn_id`
/// or none) before trace position `before`, which the hold's `reason` names.
fn given_up_before(evidence: &Evidence<'_>, session: &str, turn_id: &str, before: usize, reason: &str) -> bool {
    let carried = |data: &Value| {
        data["session_id"].as_str() == Some(session) && data["turn_id"].as_str().is_none_or(|id| id == turn_id)
    };
    let mut given_up =
        evidence.given_up.iter().filter(|(_, message_id, data)| carried(data) && names(reason, message_id));
    given_up.any(|(queue, message_id, _)| {
        evidence.events[..before].iter().any(|event| match &event.kind {
            EventKind::Note { what, detail } if what == "queue_dead_letter" => {
                detail["queue"] == *queue && detail["message_id"] == *message_id
            }
            _ => false,
        })
    })
}

/// Whether `text` names `id` as a word of its own (message `m1` is not named by `m10`).
fn names(text: &str, id: &str) -> bool {
    !id.is_empty()
        && text.match_indices(id).any(|(at, _)| {
            let before = text[..at].chars().next_back();
            let after = text[at + id.len()..].chars().next();
            !before.is_some_and(char::is_alphanumeric) && !after.is_some_and(char::is_alphanumeric)
        })
}

/// A turn parked at the end whose last command of the two that park and unpark it, by when each
/// was recorded, is a resume that was applied: an older pause, applied after the resume, parked
/// it again, and nothing will ever resume it. (A pause recorded later, if it was taken, explains
/// the park.)
pub(super) fn paused_after_resume(evidence: &Evidence<'_>, violations: &mut Vec<Violation>) {
    let layout = evidence.layout;
    // When each command was first recorded, in order, per session.
    let mut recorded: BTreeMap<&str, BTreeMap<&str, usize>> = BTreeMap::new();
    let mut order = 0usize;
    let seeded =
        evidence.seeded.iter().filter(|(scope, _, _)| scope == CONTROL_SCOPE).map(|(_, key, value)| (key, value));
    let committed = evidence.events.iter().filter_map(|event| match &event.kind {
        EventKind::Commit { scope, key, value, .. } if scope == CONTROL_SCOPE => Some((key, &**value)),
        _ => None,
    });
    for (session, control) in seeded.chain(committed) {
        let known = recorded.entry(session.as_str()).or_default();
        for (key, _) in control["commands"].as_object().into_iter().flatten() {
            order += 1;
            known.entry(key.as_str()).or_insert(order);
        }
    }
    for (scope, session, control) in evidence.store.records() {
        if scope != CONTROL_SCOPE {
            continue;
        }
        let Some(turn) = evidence.store.get(&layout.turn_scope, session).filter(|turn| layout.is_parked(turn)) else {
            continue;
        };
        let turn_id = layout.turn_id(turn);
        let of_turn = |command: &Value| command["turn_id"].as_str() == Some(turn_id);
        let parking = control["commands"].as_object().into_iter().flatten().filter(|(_, command)| {
            of_turn(command)
                && match command["command"].as_str() {
                    Some("resume") => command["state"] == "applied",
                    Some("pause") => matches!(command["state"].as_str(), Some("accepted" | "applied")),
                    _ => false,
                }
        });
        let when = |key: &str| recorded.get(session).and_then(|known| known.get(key)).copied().unwrap_or(0);
        let last = parking.max_by_key(|(key, _)| when(key));
        let Some((resume, _)) = last.filter(|(_, command)| command["command"] == "resume") else { continue };
        let pauses: Vec<&str> = control["commands"]
            .as_object()
            .into_iter()
            .flatten()
            .filter(|(_, command)| of_turn(command) && command["command"] == "pause" && command["state"] == "applied")
            .map(|(key, _)| key.as_str())
            .collect();
        violations.push(violation(
            Oracle::Liveness,
            format!(
                "turn {session}/{turn_id} is `{}`, though its last command, resume {resume}, was applied after the pause {} had been recorded: an older pause parked it again, and nothing will resume it",
                layout.status(turn),
                if pauses.is_empty() { "?".to_string() } else { pauses.join(", ") }
            ),
        ));
    }
}
