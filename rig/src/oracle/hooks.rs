//! The oracles of `pre-trigger` hooks, judged from what the hooks and the tool services received,
//! the answers the world configured for its hooks, and the engine's frames: whether a held call
//! whose approval expired ran anyway (`approval-expiry`), and whether a call ran with the
//! arguments its hook chain left it (`hook-arguments`). In a world whose hooks answer nothing the
//! world configured they have nothing to judge.

use super::{violation, Evidence, Oracle, Violation};
use crate::trace::EventKind;
use serde_json::Value;
use std::collections::BTreeMap;

/// How much later than the engine passed on the hook's answer a release may come and still
/// count as before the expiry: the answer takes a hop to reach the worker, whose clock the
/// expiry runs on (a few milliseconds in a simulated world; a live one's network is slower).
const RELEASE_GRACE_MS: u64 = 100;

/// A call a hook held with an expiry, as the trace shows it.
struct Hold<'a> {
    hook: &'a str,
    /// The hook's invocation, whose answer starts the expiry's clock when it reaches the worker.
    invocation_id: &'a str,
    call_id: &'a Value,
    function_id: &'a Value,
    /// The call's arguments as the holder saw them, and with the holder's own changes merged.
    arguments: Value,
    mutated: Value,
    expires_in_ms: u64,
    expires_at_ms: Option<u64>,
    /// A later hook consulted for the same call (the chain went on, or the call was asked about
    /// again): this hold no longer decides it.
    superseded: bool,
    /// A release reached the engine before the expiry: the call may run.
    released: bool,
    reported: bool,
}

/// `approval-expiry`: a call a `pre-trigger` hook held with an approval that expires is never
/// requested of its service after the expiry, unless a release was sent before it. The expiry
/// runs from when the engine passed the hook's answer on (a release up to [`RELEASE_GRACE_MS`]
/// after the expiry still counts); any `resolve` sent in the meantime counts
/// as a release (the oracle cannot see which call a release names, so it never blames a call
/// that might have been released). A request is the held call's when it is to the call's
/// function with its arguments, as the holder saw them or with the holder's changes merged.
pub(super) fn approval_expiry(evidence: &Evidence<'_>, violations: &mut Vec<Violation>) {
    let expiries = hold_expiries(&evidence.hook_replies);
    if expiries.is_empty() {
        return;
    }
    let mut holds: Vec<Hold<'_>> = Vec::new();
    for event in evidence.events {
        match &event.kind {
            EventKind::Call { function, payload, invocation_id, .. } if payload["point"] == "pre_trigger" => {
                let call = &payload["call"];
                for hold in holds.iter_mut().filter(|h| !h.superseded) {
                    let same_call = *hold.call_id == call["id"]
                        || (*hold.function_id == call["function_id"] && hold.arguments == call["arguments"]);
                    hold.superseded |= same_call;
                }
                let (Some((expires_in_ms, reply)), Some(invocation_id)) =
                    (expiries.get(function.as_str()), invocation_id.as_deref())
                else {
                    continue;
                };
                let arguments = call["arguments"].clone();
                let mutated = merged(&arguments, reply);
                holds.push(Hold {
                    hook: function,
                    invocation_id,
                    call_id: &call["id"],
                    function_id: &call["function_id"],
                    arguments,
                    mutated,
                    expires_in_ms: *expires_in_ms,
                    expires_at_ms: None,
                    superseded: false,
                    released: false,
                    reported: false,
                });
            }
            EventKind::Frame { direction: "out", frame: "invocationresult", invocation_id: Some(id), .. } => {
                for hold in holds.iter_mut().filter(|h| h.invocation_id == id && h.expires_at_ms.is_none()) {
                    hold.expires_at_ms = Some(event.at_ms.saturating_add(hold.expires_in_ms));
                }
            }
            EventKind::Frame { direction: "in", frame: "invokefunction", function_id: Some(f), .. }
                if f.ends_with("::resolve") =>
            {
                let in_time = |at: u64| event.at_ms <= at.saturating_add(RELEASE_GRACE_MS);
                for hold in holds.iter_mut().filter(|h| h.expires_at_ms.is_none_or(in_time)) {
                    hold.released = true;
                }
            }
            EventKind::Call { function, payload, .. } => {
                for hold in holds.iter_mut() {
                    let Some(expired_at) = hold.expires_at_ms else { continue };
                    let its_request = *hold.function_id == function.as_str()
                        && (payload["args"] == hold.arguments || payload["args"] == hold.mutated);
                    let grace =
                        if crate::planted!("approval-expiry-grace-on-the-request") { RELEASE_GRACE_MS } else { 0 };
                    let in_time = event.at_ms <= expired_at.saturating_add(grace);
                    if !its_request || in_time || hold.superseded || hold.released || hold.reported {
                        continue;
                    }
                    hold.reported = true;
                    violations.push(violation(
                        Oracle::ApprovalExpiry,
                        format!(
                            "`{function}` was requested at {} ms for call {} that `{}` held with an approval expiring at {expired_at} ms, and no release was sent before then",
                            event.at_ms, hold.call_id, hold.hook
                        ),
                    ));
                }
            }
            _ => {}
        }
    }
}

/// The hook functions that hold with an expiry: by function id, the expiry and the hook's whole
/// answer (the changes it makes to the arguments are in it).
fn hold_expiries(replies: &BTreeMap<String, Value>) -> BTreeMap<&str, (u64, &Value)> {
    let mut expiries = BTreeMap::new();
    for (function, reply) in replies {
        if let ("hold", Some(expires_in_ms)) =
            (reply["decision"].as_str().unwrap_or(""), reply["expires_in_ms"].as_u64())
        {
            expiries.insert(function.as_str(), (expires_in_ms, reply));
        }
    }
    expiries
}

/// The arguments a hook passes on: those it saw, with the changes its answer makes merged field
/// by field (none for an answer that is not an object of changes).
fn merged(arguments: &Value, reply: &Value) -> Value {
    let mut out = arguments.clone();
    if let (Some(into), Some(changes)) = (out.as_object_mut(), reply["mutations"]["arguments"].as_object()) {
        into.extend(changes.iter().map(|(k, v)| (k.clone(), v.clone())));
    }
    out
}

/// One call's hook chain as the trace shows it: the arguments each hook saw, and what the last
/// one asked passed on (`None` once a hook whose answer the world does not configure was asked,
/// or the chain denied the call).
struct Chain<'a> {
    function_id: &'a Value,
    seen: Vec<&'a Value>,
    passed_on: Option<Value>,
}

/// `hook-arguments`: a call the `pre-trigger` hooks changed runs with the arguments the chain
/// left it. A request of the call's function carrying the arguments one of its hooks saw (the
/// model's, or a later hook's input), when that is not what the chain passed on, ran the call
/// with changes lost: a holding hook's own, or every hook's when a released call runs as the
/// model asked. Arguments that some chain of the function passed on are never blamed.
pub(super) fn hook_arguments(evidence: &Evidence<'_>, violations: &mut Vec<Violation>) {
    let mut chains: BTreeMap<String, Chain<'_>> = BTreeMap::new();
    let mut reported: Vec<&Value> = Vec::new();
    for event in evidence.events {
        let EventKind::Call { function, payload, .. } = &event.kind else { continue };
        if payload["point"] == "pre_trigger" {
            let call = &payload["call"];
            // A call id names a call within its session: another session may use it too.
            let chain = chains.entry(format!("{}/{}", payload["session_id"], call["id"])).or_insert(Chain {
                function_id: &call["function_id"],
                seen: Vec::new(),
                passed_on: None,
            });
            chain.seen.push(&call["arguments"]);
            chain.passed_on = evidence
                .hook_replies
                .get(function.as_str())
                .filter(|reply| reply["decision"] != "deny")
                .map(|reply| merged(&call["arguments"], reply));
            continue;
        }
        // No hook was consulted yet: no chain can have changed this call's arguments.
        if chains.is_empty() {
            continue;
        }
        let args = &payload["args"];
        let of_function = |chain: &&Chain<'_>| *chain.function_id == function.as_str();
        if args.is_null() || chains.values().filter(of_function).any(|c| c.passed_on.as_ref() == Some(args)) {
            continue;
        }
        // (The planted bug: the arguments the last hook saw count as passed on, as if it changed nothing.)
        let last_seen =
            |c: &Chain<'_>| crate::planted!("hook-arguments-last-hook-input-passes") && c.seen.last() == Some(&args);
        let Some(chain) = chains
            .values()
            .filter(of_function)
            .find(|c| c.passed_on.is_some() && c.seen.contains(&args) && !last_seen(c))
        else {
            continue;
        };
        if reported.contains(&args) {
            continue;
        }
        reported.push(args);
        violations.push(violation(
            Oracle::HookArguments,
            format!(
                "`{function}` was requested at {} ms with {args}, as a hook saw the call before the chain changed it to {}",
                event.at_ms,
                chain.passed_on.as_ref().unwrap_or(&Value::Null)
            ),
        ));
    }
}
