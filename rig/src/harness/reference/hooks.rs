//! Hooks: functions bound to the harness's `pre-trigger` point, consulted before a tool call
//! runs, lowest priority first (equal priorities in the order they were bound).
//!
//! Each hook is sent the call (`{point: "pre_trigger", session_id, call: {id, function_id,
//! arguments}}`) as the hooks before it left it, and answers a decision: `continue`, `hold` or
//! `deny`, with `mutations: {arguments: {...}}` merged into the call's arguments, a holding
//! hook's own included. A held call is recorded durably with where the chain stopped and the
//! arguments at that point, and its turn is held until `{host}::resolve` releases it: `execute`
//! resumes the chain after the holder over those arguments, then runs the call, once; `deny`
//! closes it with an error. A call released once is no longer held, so a second release (or the
//! network repeating the first) runs nothing.

use super::transcript::{action_id, call_id};
use super::{error_body, Policy, StepFailure, Stop, TurnRequest, Worker};
use crate::bus::{Bus, ErrorBody};
use crate::harness::{BindingPoint, Tool};
use serde_json::{json, Value};
use std::rc::Rc;

/// What the hook chain decided about one call.
enum Decision {
    /// Run it, with these arguments.
    Run(Value),
    /// Hold it for a release: the hook that held it, its place in the chain, and the arguments
    /// at that point.
    Hold { function: String, index: usize, arguments: Value, expires_in_ms: Option<u64> },
    /// Do not run it.
    Deny { function: String, reason: String },
}

/// The arguments with a hook's changes merged in, field by field.
fn mutated(mut arguments: Value, reply: &Value) -> Value {
    if let (Some(fields), Some(changes)) = (arguments.as_object_mut(), reply["mutations"]["arguments"].as_object()) {
        fields.extend(changes.iter().map(|(k, v)| (k.clone(), v.clone())));
    }
    arguments
}

impl Worker {
    /// The hooks consulted for calls of `tool`, in the order they run.
    fn hook_chain(&self, tool: &Tool) -> Vec<String> {
        let mut hooks: Vec<_> = self
            .env
            .config
            .bindings
            .iter()
            .filter(|b| b.trigger == BindingPoint::PreTrigger)
            .filter(|b| b.functions.is_empty() || b.functions.contains(&tool.function))
            .collect();
        hooks.sort_by_key(|b| b.priority);
        hooks.into_iter().map(|b| b.function.clone()).collect()
    }

    /// Consults the chain for the call `id` (as the transcript names it) from position `from`,
    /// over `arguments`.
    async fn consult(
        &self,
        bus: &Bus,
        record: &Value,
        id: &str,
        tool: &Tool,
        mut arguments: Value,
        from: usize,
    ) -> Result<Decision, Stop> {
        for (index, function) in self.hook_chain(tool).into_iter().enumerate().skip(from) {
            let call = json!({ "id": id, "function_id": tool.function, "arguments": arguments });
            let payload = json!({ "point": "pre_trigger", "session_id": record["session_id"], "call": call });
            let reply = bus
                .invoke(&function, payload, self.env.config.session_timeout_ms)
                .await
                .map_err(|error| Stop::Failed(StepFailure { during: function.clone(), error }))?;
            match reply["decision"].as_str() {
                Some("hold") => {
                    // The bug of `hold-drops-mutations`: a holding hook's own changes are lost.
                    let keep = self.policy != Policy::HoldDropsMutations;
                    let arguments = if keep { mutated(arguments, &reply) } else { arguments };
                    let expires_in_ms = reply["expires_in_ms"].as_u64();
                    return Ok(Decision::Hold { function, index, arguments, expires_in_ms });
                }
                Some("deny") => {
                    let reason = reply["reason"].as_str().unwrap_or("no reason given").to_string();
                    return Ok(Decision::Deny { function, reason });
                }
                _ => arguments = mutated(arguments, &reply),
            }
        }
        Ok(Decision::Run(arguments))
    }

    /// Runs the hook chain for a call about to be recorded: the arguments to run it with, or
    /// `None` when the chain settled it (denied, recorded failed); a hold stops the turn.
    pub(super) async fn pass_hooks(
        &self,
        bus: &Bus,
        record: &mut Value,
        id: &str,
        tool: &Tool,
        call: &Value,
    ) -> Result<Option<Value>, Stop> {
        if record["calls"][id]["status"] == json!("released") {
            return Ok(Some(record["calls"][id]["args"].clone()));
        }
        let shown = call["id"].as_str().unwrap_or(id).to_string();
        let decision = self.consult(bus, record, &shown, tool, call["args"].clone(), 0).await?;
        record["calls"][id] = json!({ "tool": call["tool"], "args": call["args"] });
        self.apply_decision(bus, record, id, decision).await
    }

    /// Records what the chain decided about a call: `Some(arguments)` to run it with.
    async fn apply_decision(
        &self,
        bus: &Bus,
        record: &mut Value,
        id: &str,
        decision: Decision,
    ) -> Result<Option<Value>, Stop> {
        let entry = &mut record["calls"][id];
        match decision {
            Decision::Run(arguments) => Ok(Some(arguments)),
            Decision::Hold { function, index, arguments, expires_in_ms } => {
                let reason = format!("call {id} held by hook `{function}` until it is released");
                if self.policy == Policy::HoldTurnOnly {
                    // The known-bad hold: the turn waits, and the call it waits for is not recorded.
                    self.write(bus, record).await?;
                    return Err(Stop::Held { reason });
                }
                if crate::planted!("ref-turn-held-before-its-call-is-recorded") {
                    // (The planted bug: the turn's hold is what is written; the call's is not.)
                    return Err(Stop::Held { reason });
                }
                entry["status"] = json!("held");
                entry["held_reason"] = json!(reason);
                entry["owner"] = json!(self.env.host);
                entry["hold"] = json!({ "function": function, "index": index, "arguments": arguments });
                self.record_expiry(entry, id, expires_in_ms);
                self.note("call_held", json!({ "action_id": id, "by": function }));
                self.write(bus, record).await?;
                Err(Stop::Held { reason })
            }
            Decision::Deny { function, reason } => {
                entry["status"] = json!("failed");
                entry["error"] = json!(format!("denied by `{function}`: {reason}"));
                self.write(bus, record).await?;
                Ok(None)
            }
        }
    }

    /// `{host}::resolve {session_id, function_call_id, action}`: releases a call a hook held
    /// (`execute`, the default, or `deny`) and drives its turn on.
    pub(super) async fn resolve(self: &Rc<Self>, bus: &Bus, data: &Value) -> Result<Value, ErrorBody> {
        let (Some(session_id), Some(id)) = (data["session_id"].as_str(), data["function_call_id"].as_str()) else {
            return Err(ErrorBody::new("bad_request", "`resolve` needs `session_id` and `function_call_id`"));
        };
        let execute = match data["action"].as_str().unwrap_or("execute") {
            "execute" => true,
            "deny" => false,
            other => return Err(ErrorBody::new("bad_request", format!("unknown action `{other}`: execute or deny"))),
        };
        let lock = self.session_lock(session_id);
        let _guard = lock.lock().await;
        if let Err(not_owner) = self.ensure_ownership(bus, session_id).await {
            return not_owner.answer(session_id);
        }
        let result = self.owned_resolve(bus, session_id, id, execute).await;
        self.hand_back(bus, session_id).await;
        result
    }

    async fn owned_resolve(
        self: &Rc<Self>,
        bus: &Bus,
        session_id: &str,
        function_call_id: &str,
        execute: bool,
    ) -> Result<Value, ErrorBody> {
        let record = self.get_turn(bus, session_id).await.map_err(|e| error_body("get_turn", &e))?;
        if let Some(to) = self.handed_to(session_id, record.as_ref()) {
            return Err(ErrorBody::new("not_owner", format!("the session was handed over to {to}")));
        }
        let Some(mut record) = record else { return Ok(json!({ "resolved": false, "reason": "no turn record" })) };
        // The call of the current round the transcript knows by this id.
        let rounds = record["reply"]["tool_calls"].as_array().map_or(0, Vec::len);
        let index = (0..rounds).find(|&i| call_id(&record, i) == function_call_id);
        let Some(id) = index.map(|i| action_id(&record, i)) else {
            return Ok(
                json!({ "resolved": false, "reason": format!("no call {function_call_id} in the turn's current round") }),
            );
        };
        let id = id.as_str();
        let entry = record["calls"][id].clone();
        let request = TurnRequest {
            session_id: session_id.to_string(),
            turn_id: record["turn_id"].as_str().unwrap_or_default().to_string(),
            step: record["step"].as_u64().unwrap_or(0),
        };
        if entry["status"] == json!("released") && record["status"] == json!("running") {
            // Released by an earlier call whose write was never answered, and run by nobody since
            // (this worker holds the session): this release runs it, once.
            self.note("release_resumed", json!({ "action_id": id }));
            let mut result = self.finish(bus, &request, record).await?;
            result["resolved"] = json!(true);
            return Ok(result);
        }
        if entry["status"] != json!("held") || entry["hold"].is_null() {
            return Ok(json!({ "resolved": false, "reason": format!("call {id} is not held by a hook") }));
        }
        // A hold of the turn still owed (its write was refused) is what this release or expiry
        // ends: it must not land after the turn is driven on.
        if self.supersede_owed_hold(&mut record, &request.turn_id).is_err() {
            return Ok(json!({ "resolved": false, "reason": "the turn is ending" }));
        }
        if self.approval_expired(&entry, id) {
            // Too late: the approval expired, so the call is denied (once) and nothing runs.
            let mut result = self.expire(bus, &request, record, id).await?;
            result["resolved"] = json!(false);
            result["reason"] = json!(format!("the approval of call {id} expired"));
            return Ok(result);
        }
        let decision = match (execute, self.policy) {
            (false, _) => Decision::Deny { function: "resolve".into(), reason: "denied on release".into() },
            // The bug of `release-original-arguments`: the model's arguments, whatever the hooks did.
            (true, Policy::ReleaseOriginalArguments) => Decision::Run(entry["args"].clone()),
            (true, _) => {
                let tool = entry["tool"].as_str().and_then(|name| self.tool(name));
                let Some(tool) = tool else {
                    return Err(ErrorBody::new("not_found", "the held call's tool is unknown"));
                };
                let hold = &entry["hold"];
                let from = hold["index"].as_u64().unwrap_or(0) as usize + 1;
                match self.consult(bus, &record, function_call_id, &tool, hold["arguments"].clone(), from).await {
                    Ok(decision) => decision,
                    Err(_) => return Err(ErrorBody::new("unavailable", "a hook after the holder could not be asked")),
                }
            }
        };
        record["calls"][id] = json!({ "tool": entry["tool"], "args": entry["args"] });
        match self.apply_decision(bus, &mut record, id, decision).await {
            Ok(Some(arguments)) => {
                record["calls"][id]["args"] = arguments;
                record["calls"][id]["status"] = json!("released");
            }
            Ok(None) => {}
            Err(Stop::Held { reason }) => return Ok(json!({ "resolved": true, "held": true, "reason": reason })),
            Err(_) => return Err(ErrorBody::new("unavailable", "could not record the release")),
        }
        record["status"] = json!("running");
        record["held_reason"] = Value::Null;
        // No queue delivers the turn from here on: this worker drives it, and drives it on
        // again should it die first (`recover_on_start`).
        record[super::DRIVEN_BY] = json!(self.env.host);
        match self.write(bus, &record).await {
            Ok(()) => {}
            Err(Stop::FencedOut) => return self.fenced_out(&request),
            Err(_) => {
                // The store may have recorded it all the same: then nobody else would run the call.
                self.finish_settlement_later(bus, &request, id, Settlement::Release);
                return Err(ErrorBody::new("unavailable", "could not record the release"));
            }
        }
        self.note("call_released", json!({ "action_id": id, "execute": execute }));
        let mut result = self.finish(bus, &request, record).await?;
        result["resolved"] = json!(true);
        Ok(result)
    }
}

/// What a held call's settlement whose write got no answer was: the call's status once the
/// write landed, and the notes that say whether it did.
#[derive(Clone, Copy)]
pub(super) enum Settlement {
    /// Released (`resolve`, `execute`): the call runs.
    Release,
    /// Denied as its approval expired: the turn goes on to the model.
    Expiry,
}

impl Settlement {
    fn landed_status(self) -> &'static str {
        match self {
            Settlement::Release => "released",
            Settlement::Expiry => "failed",
        }
    }

    fn notes(self) -> (&'static str, &'static str) {
        match self {
            Settlement::Release => ("release_confirmed", "release_unconfirmed"),
            Settlement::Expiry => ("expiry_confirmed", "expiry_unconfirmed"),
        }
    }
}

impl Worker {
    /// A settlement of a held call (a release, an expiry) whose write got no good answer: once
    /// the store answers again, if it says the write landed (the turn running, the call settled
    /// so), the turn is driven on, as nothing else delivers it; if it says the call is still
    /// held, the settlement never happened (a release's caller was told so; an expiry is found
    /// again by the next release, or a worker that starts). Tried in the background until the
    /// store answers ([`super::finalize::Retry`]).
    pub(super) fn finish_settlement_later(
        self: &Rc<Self>,
        bus: &Bus,
        request: &TurnRequest,
        action_id: &str,
        settlement: Settlement,
    ) {
        let (worker, bus, request, action_id) = (Rc::clone(self), bus.clone(), request.clone(), action_id.to_string());
        let (confirmed, unconfirmed) = settlement.notes();
        tokio::task::spawn_local(async move {
            let mut retry = worker.retry();
            while worker.next_try(&bus, &mut retry).await {
                let record = match worker.get_turn(&bus, &request.session_id).await {
                    Ok(Some(record)) => record,
                    Ok(None) => return,
                    Err(_) => continue,
                };
                let landed = record["turn_id"] == json!(request.turn_id)
                    && record["status"] == json!("running")
                    && record["calls"][&action_id]["status"] == json!(settlement.landed_status());
                if landed {
                    worker.note(confirmed, json!({ "action_id": action_id, "attempt": retry.attempt() }));
                    worker.drive_on(&bus, request).await;
                }
                return;
            }
            worker.note(unconfirmed, json!({ "action_id": action_id }));
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hooks_changes_are_merged_field_by_field() {
        let reply = json!({ "decision": "continue", "mutations": { "arguments": { "value": "expected+scope" } } });
        let merged = mutated(json!({ "value": "expected", "other": 1 }), &reply);
        assert_eq!(merged, json!({ "value": "expected+scope", "other": 1 }));
        assert_eq!(mutated(json!({ "value": "x" }), &json!({ "decision": "hold" })), json!({ "value": "x" }));
        assert_eq!(action_id(&json!({ "turn_id": "t1", "step": 2 }), 0), "t1:2:0");
    }
}
