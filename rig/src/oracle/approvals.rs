//! The oracle of approvals that expire, judged from what the hooks and the tool services
//! received and from the engine's frames: the holding hook's answer (an expiry the world
//! configured), when it reached the worker, any release sent meanwhile, and the requests the
//! tool's service got after. In a world with no hook that holds with an expiry it has nothing
//! to judge.

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
    if evidence.hold_expiries.is_empty() {
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
                let (Some((expires_in_ms, mutations)), Some(invocation_id)) =
                    (evidence.hold_expiries.get(function), invocation_id.as_deref())
                else {
                    continue;
                };
                let arguments = call["arguments"].clone();
                let mut mutated = arguments.clone();
                if let (Some(into), Some(changes)) = (mutated.as_object_mut(), mutations.as_object()) {
                    into.extend(changes.iter().map(|(k, v)| (k.clone(), v.clone())));
                }
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
                    if !its_request || event.at_ms <= expired_at || hold.superseded || hold.released || hold.reported {
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

/// The `pre-trigger` hook functions of a world that hold with an expiry: by function id, the
/// expiry and the changes to the arguments the hold makes (`mutations.arguments`, or null).
pub fn hold_expiries(services: &BTreeMap<String, doubles::ServiceConfig>) -> BTreeMap<String, (u64, Value)> {
    let mut expiries = BTreeMap::new();
    for (name, config) in services {
        for (function, reply) in &config.functions {
            if let ("hold", Some(expires_in_ms)) =
                (reply["decision"].as_str().unwrap_or(""), reply["expires_in_ms"].as_u64())
            {
                expiries
                    .insert(format!("{name}::{function}"), (expires_in_ms, reply["mutations"]["arguments"].clone()));
            }
        }
    }
    expiries
}
