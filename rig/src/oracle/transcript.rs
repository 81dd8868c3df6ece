//! The oracles of the transcript and of what the model is sent, judged from the calls the session
//! service and the model received and from what the model answered: whether a worker asks the
//! model with the results it has itself put into the transcript (`model-context`), and whether a
//! streamed reply enters the transcript whole (`whole-replies`).

use super::{violation, Evidence, Oracle, Violation};
use crate::topology::DRIVER;
use crate::trace::{Event, EventKind};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};

/// More deltas than this in one streamed reply and the oracle does not try to tell which of them
/// an entry is made of (the search is exponential in the worst case; scripts stream a few).
const DELTAS_MAX: usize = 32;

/// Whether the call of `events[index]` reached its double: no cut refused it, timed it out or
/// crashed its caller before it was handed over (the cut, if any, is the very next event).
fn landed(events: &[Event], index: usize) -> bool {
    !events.get(index + 1).is_some_and(|next| {
        matches!(&next.kind, EventKind::Cut { action, .. }
            if matches!(action.as_str(), "timeout" | "reject" | "crash-caller-before"))
    })
}

/// The call ids a list of transcript entries holds function results for.
fn results_in(entries: &Value) -> BTreeSet<&str> {
    let entries = entries.as_array().map(Vec::as_slice).unwrap_or_default();
    entries
        .iter()
        .filter(|entry| entry["role"] == "function_result")
        .filter_map(|entry| entry["function_call_id"].as_str())
        .collect()
}

/// A session append from a worker that reached the session service: the worker, the session and
/// the entry.
fn worker_append(events: &[Event], index: usize) -> Option<(&str, &str, &Value)> {
    let EventKind::Call { function, payload, caller: Some(worker), .. } = &events[index].kind else { return None };
    if function != "session::append" || worker == DRIVER || !landed(events, index) {
        return None;
    }
    Some((worker, payload["session_id"].as_str()?, &payload["entry"]))
}

/// `model-context`: a worker that put a call's result into a session's transcript never asks the
/// model for that session afterwards with messages that lack it. Every generation is sent the
/// transcript as `session::messages` gives it, read for that generation; a worker whose append
/// landed before its request reads the result back. Only the worker's own appends are held
/// against it: another worker's may still be on its way when the transcript is read.
pub(super) fn model_context(evidence: &Evidence<'_>, violations: &mut Vec<Violation>) {
    let mut held: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    // The results each worker put into each session's transcript, with when it first did.
    let mut put: BTreeMap<(&str, &str), BTreeMap<&str, u64>> = BTreeMap::new();
    for (index, event) in evidence.events.iter().enumerate() {
        if let Some((worker, session, entry)) = worker_append(evidence.events, index) {
            let Some(call_id) = entry["function_call_id"].as_str().filter(|_| entry["role"] == "function_result")
            else {
                continue;
            };
            // The service refuses an append it cannot take: the result is then not there.
            let transcript = held.entry(session).or_insert_with(|| {
                evidence.sessions.entries(session).iter().filter_map(|e| e["function_call_id"].as_str()).collect()
            });
            if transcript.contains(call_id) {
                put.entry((worker, session)).or_default().entry(call_id).or_insert(event.at_ms);
            }
            continue;
        }
        let EventKind::Call { function, payload, caller: Some(worker), .. } = &event.kind else { continue };
        if function != "model::generate" {
            continue;
        }
        let Some(session) = payload["session_id"].as_str() else { continue };
        let Some(results) = put.get(&(worker.as_str(), session)) else { continue };
        let sent = results_in(&payload["messages"]);
        let missing: Vec<(&&str, &u64)> = results.iter().filter(|(id, _)| !sent.contains(**id)).collect();
        let Some((first, first_at)) = missing.first() else { continue };
        violations.push(violation(
            Oracle::ModelContext,
            format!(
                "`{worker}` asked the model for turn {session}/{} at {} ms without the result of call `{first}`{}, which it had put into the session's transcript at {first_at} ms",
                payload["turn_id"].as_str().unwrap_or("?"),
                event.at_ms,
                match missing.len() {
                    1 => String::new(),
                    n => format!(" (and {} more)", n - 1),
                }
            ),
        ));
    }
}

/// The text deltas of a streamed reply, in sequence order.
fn deltas(reply: &Value) -> Vec<&str> {
    let frames = reply["frames"].as_array().map(Vec::as_slice).unwrap_or_default();
    frames
        .iter()
        .filter(|frame| frame["type"] == "text_delta")
        .filter_map(|frame| frame["delta"].as_str())
        .filter(|delta| !delta.is_empty())
        .collect()
}

/// The deltas (by index) that `text` is made of, each used once, in the order they make it:
/// the first way found, trying earlier deltas first.
fn pieces(text: &str, deltas: &[&str], used: &mut Vec<usize>) -> bool {
    if text.is_empty() {
        return !used.is_empty();
    }
    for (index, delta) in deltas.iter().enumerate() {
        if used.contains(&index) || !text.starts_with(delta) {
            continue;
        }
        used.push(index);
        if pieces(&text[delta.len()..], deltas, used) {
            return true;
        }
        used.pop();
    }
    false
}

/// `whole-replies`: a streamed reply a worker transcribes enters the transcript whole. An
/// assistant text entry made of some of a reply's text deltas, and not of all of them in
/// sequence order, is a fault: a part of the reply as an entry of its own, or the reply with its
/// pieces out of order. (Any other text is the harness's own, such as how it shows a failure.)
pub(super) fn whole_replies(evidence: &Evidence<'_>, violations: &mut Vec<Violation>) {
    let mut streamed: BTreeMap<&str, Vec<Vec<&str>>> = BTreeMap::new();
    for generation in evidence.generations {
        let deltas = deltas(&generation.reply);
        if (2..=DELTAS_MAX).contains(&deltas.len()) {
            streamed.entry(generation.session_id.as_str()).or_default().push(deltas);
        }
    }
    // No reply was streamed in pieces: no entry can be a part of one.
    if streamed.is_empty() {
        return;
    }
    for (index, event) in evidence.events.iter().enumerate() {
        let Some((worker, session, entry)) = worker_append(evidence.events, index) else { continue };
        let Some(text) = entry["text"].as_str().filter(|_| entry["role"] == "assistant") else { continue };
        for deltas in streamed.get(session).map(Vec::as_slice).unwrap_or_default() {
            let whole: String = deltas.concat();
            let mut used = Vec::new();
            if text == whole || !pieces(text, deltas, &mut used) {
                continue;
            }
            let in_order = used.windows(2).all(|pair| pair[1] == pair[0] + 1);
            let (first, last, of) = (used[0] + 1, used[used.len() - 1] + 1, deltas.len());
            let what = match (in_order, first == last) {
                (true, true) => format!("only delta {first} (of {of}) of"),
                (true, false) => format!("only deltas {first} to {last} (of {of}) of"),
                (false, _) => "the pieces, out of sequence order, of".to_string(),
            };
            violations.push(violation(
                Oracle::WholeReplies,
                format!(
                    "`{worker}` put the assistant entry {text:?} into session {session}'s transcript at {} ms: {what} the model's streamed reply {whole:?}",
                    event.at_ms
                ),
            ));
            break;
        }
    }
}
