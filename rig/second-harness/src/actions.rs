//! Actions: each tool call a record of its own (scope [`crate::ACTION_SCOPE`], keyed by its
//! action id), its intent written before its effect is requested, an unknown outcome reconciled
//! with the service before anything is sent again, and what stays ambiguous held for a person.

use crate::store::{WriteError, OWNER_SCOPE};
use crate::{Worker, ACTION_SCOPE};
use rig::{Bus, InvokeError, Tool};
use serde_json::{json, Value};
use std::rc::Rc;

/// An action's statuses in this harness's layout.
pub(crate) const REQUESTED: &str = "requested";
pub(crate) const DONE: &str = "done";
pub(crate) const NOT_DONE: &str = "not-done";
pub(crate) const HELD: &str = "held";
/// How often an effect is sent in one delivery, reconciled in between.
const SENDS_MAX: u32 = 2;

/// Where an action stands once this worker is through with it.
pub(crate) enum Settled {
    Done,
    NotDone,
    /// Held for a person, with why.
    Held(String),
    /// A newer owner exists: stop.
    Superseded,
    /// Its outcome is known but could not be recorded: the delivery ends without an end, to be
    /// delivered again.
    Unrecorded(String),
}

/// What the service says about an action of unknown outcome.
enum Found {
    Happened(Value),
    NotHappened,
    Unknown(String),
}

impl Worker {
    /// Brings one planned call of the turn to a settled outcome, or a hold.
    pub(crate) async fn settle(self: &Rc<Self>, bus: &Bus, record: &Value, call: &Value) -> Settled {
        let id = call["action_id"].as_str().unwrap_or_default().to_string();
        let stored = match self.get(bus, ACTION_SCOPE, &id).await {
            Ok(stored) => stored,
            Err(why) => return Settled::Unrecorded(why),
        };
        let Some(tool) = self.env.config.tools.iter().find(|t| call["tool"] == t.name.as_str()).cloned() else {
            let error = json!({ "error": format!("no tool named {}", call["tool"]) });
            return self
                .record_outcome(bus, record, call, intent_of(&stored, record, call, self), NOT_DONE, error)
                .await;
        };
        match stored["status"].as_str() {
            // Settled before, perhaps by a worker that died before its result reached the
            // transcript: the result goes there (again: the append is keyed) before the turn
            // goes on, so no call of the turn is left without one.
            Some(status @ (DONE | NOT_DONE)) => {
                return self.transcribe(bus, record, call, status, &stored["outcome"]).await
            }
            Some(HELD) => return Settled::Held(stored["held_reason"].as_str().unwrap_or("held").into()),
            _ => {}
        }
        let action = intent_of(&stored, record, call, self);
        if !stored.is_null() {
            // Requested before, by this worker or another, with no outcome recorded.
            match self.reconcile(bus, &tool, &action).await {
                Found::Happened(effect) => return self.record_outcome(bus, record, call, action, DONE, effect).await,
                Found::Unknown(why) => return self.hold(bus, record, action, why).await,
                Found::NotHappened => {}
            }
        }
        self.request(bus, record, call, &tool, action).await
    }

    /// Records the intent, then sends the effect; an unknown answer is reconciled before the
    /// one further try.
    async fn request(
        self: &Rc<Self>,
        bus: &Bus,
        record: &Value,
        call: &Value,
        tool: &Tool,
        mut action: Value,
    ) -> Settled {
        let session = record["session_id"].as_str().unwrap_or_default().to_string();
        let id = call["action_id"].as_str().unwrap_or_default().to_string();
        for _ in 0..SENDS_MAX {
            action["requested_at_ms"] = json!(self.env.clock.now_ms());
            if action["first_requested_at_ms"].is_null() {
                action["first_requested_at_ms"] = action["requested_at_ms"].clone();
            }
            if let Err(error) = self.put(bus, (ACTION_SCOPE, &id), &action, &session, (false, 3)).await {
                return unwritten(error);
            }
            self.env.checkpoint("before_submission", &id).await;
            let Ok(token) = self.fence(&session) else { return Settled::Superseded };
            let mut effect = json!({
                "action_id": id, "idempotency_key": action["idempotency_key"],
                "client_reference": action["client_reference"], "args": call["args"],
            });
            if let Some(title) = call["args"].get("title") {
                effect["title"] = title.clone();
            }
            if let Some(token) = token {
                effect["fencing"] = json!({ "domain": format!("{OWNER_SCOPE}/{session}"), "token": token });
            }
            match bus.invoke(&tool.function, effect, self.env.config.tool_timeout_ms).await {
                Ok(answer) => {
                    self.env.checkpoint("after_acceptance", &id).await;
                    return self.record_outcome(bus, record, call, action, DONE, answer).await;
                }
                Err(InvokeError::Rejected(body)) if body.code == "stale_token" => return Settled::Superseded,
                Err(error) if !error.outcome_unknown() => {
                    // A refusal answers one copy of a request the network may have delivered
                    // more than once: the service is asked before the action is taken as not
                    // done, and trusted only when it cannot be asked.
                    return match self.reconcile(bus, tool, &action).await {
                        Found::Happened(effect) => self.record_outcome(bus, record, call, action, DONE, effect).await,
                        Found::NotHappened | Found::Unknown(_) => {
                            let refusal = json!({ "error": error.to_json() });
                            self.record_outcome(bus, record, call, action, NOT_DONE, refusal).await
                        }
                    };
                }
                Err(error) => match self.reconcile(bus, tool, &action).await {
                    Found::Happened(effect) => {
                        return self.record_outcome(bus, record, call, action, DONE, effect).await
                    }
                    Found::Unknown(why) => {
                        return self
                            .hold(bus, record, action, format!("{} got no answer ({error}); {why}", tool.name))
                            .await
                    }
                    Found::NotHappened => {}
                },
            }
        }
        let why = format!("{} was sent {SENDS_MAX} times without an answer", tool.name);
        self.hold(bus, record, action, why).await
    }

    /// Asks the service whether the action's effect happened: by idempotency key, then by
    /// client reference. A negative answer about a key counts only within the key's window.
    async fn reconcile(&self, bus: &Bus, tool: &Tool, action: &Value) -> Found {
        let mut last = format!("{} can be asked neither by key nor by reference", tool.service);
        for attempt in 0..self.env.config.terminalize_attempts.max(1) {
            let mut reached = true;
            if tool.idempotency {
                let asked = json!({ "idempotency_key": action["idempotency_key"] });
                match self.ask(bus, &format!("{}::status", tool.service), asked).await {
                    Ok(answer) if answer["known"] == true => return Found::Happened(answer),
                    Ok(_) if self.within_window(tool, action) => return Found::NotHappened,
                    Ok(_) => last = format!("{}'s key memory may have forgotten the key", tool.service),
                    Err(error) => (reached, last) = (false, format!("{}::status: {error}", tool.service)),
                }
            }
            if tool.lookup {
                let asked = json!({ "client_reference": action["client_reference"] });
                match self.ask(bus, &format!("{}::lookup", tool.service), asked).await {
                    Ok(answer) if answer["found"] == true => return Found::Happened(answer),
                    Ok(_) => return Found::NotHappened,
                    Err(error) => (reached, last) = (false, format!("{}::lookup: {error}", tool.service)),
                }
            }
            if reached {
                break;
            }
            self.back_off(attempt).await;
        }
        Found::Unknown(format!("its outcome is unknown: {last}"))
    }

    /// A question to an effect service, with the deadline of its effect requests.
    async fn ask(&self, bus: &Bus, function: &str, data: Value) -> Result<Value, InvokeError> {
        bus.invoke(function, data, self.env.config.tool_timeout_ms).await
    }

    fn within_window(&self, tool: &Tool, action: &Value) -> bool {
        let first = action["first_requested_at_ms"].as_u64().or(action["requested_at_ms"].as_u64()).unwrap_or(0);
        self.env.clock.now_ms().saturating_sub(first) < tool.idempotency_window_ms
    }

    /// Records a settled outcome, then its result in the transcript.
    async fn record_outcome(
        &self,
        bus: &Bus,
        record: &Value,
        call: &Value,
        mut action: Value,
        status: &str,
        answer: Value,
    ) -> Settled {
        let session = record["session_id"].as_str().unwrap_or_default().to_string();
        let id = call["action_id"].as_str().unwrap_or_default().to_string();
        action["status"] = json!(status);
        action["outcome"] = answer.clone();
        if let Err(error) = self.put(bus, (ACTION_SCOPE, &id), &action, &session, (false, 3)).await {
            return unwritten(error);
        }
        let settled = self.transcribe(bus, record, call, status, &answer).await;
        self.env.checkpoint("after_completion", &id).await;
        settled
    }

    /// Puts a settled call's result into the transcript, under a key of its action's own so
    /// that whoever finds the action settled can put it there again harmlessly. A result that
    /// cannot be appended leaves the call open: the delivery ends unfinished, to be delivered
    /// again, rather than going on without it.
    async fn transcribe(&self, bus: &Bus, record: &Value, call: &Value, status: &str, answer: &Value) -> Settled {
        let id = call["action_id"].as_str().unwrap_or_default();
        let content = match answer.get("content") {
            Some(content) => content.clone(),
            None => json!([{ "type": "text", "text": answer.to_string() }]),
        };
        let call_id = if call["call_id"].is_string() { &call["call_id"] } else { &call["action_id"] };
        let entry = json!({
            "role": "function_result", "function_call_id": call_id, "function_id": call["tool"], "content": content,
            "is_error": status != DONE || answer["is_error"] == true, "entry_key": format!("{id}:result"),
        });
        if !self.append(bus, record, entry).await {
            return Settled::Unrecorded(format!("the result of action {id} could not be put into the transcript"));
        }
        if status == DONE {
            Settled::Done
        } else {
            Settled::NotDone
        }
    }

    async fn hold(&self, bus: &Bus, record: &Value, mut action: Value, why: String) -> Settled {
        let session = record["session_id"].as_str().unwrap_or_default().to_string();
        action["status"] = json!(HELD);
        action["held_reason"] = json!(why);
        let id = action["action_id"].as_str().unwrap_or_default().to_string();
        match self.put(bus, (ACTION_SCOPE, &id), &action, &session, (false, 3)).await {
            Ok(()) => Settled::Held(why),
            Err(error) => unwritten(error),
        }
    }
}

/// The action's record: the stored one, or a new intent for the planned call.
fn intent_of(stored: &Value, record: &Value, call: &Value, worker: &Worker) -> Value {
    if !stored.is_null() {
        let mut action = stored.clone();
        if action["first_requested_at_ms"].is_null() {
            action["first_requested_at_ms"] = stored["requested_at_ms"].clone();
        }
        return action;
    }
    json!({
        "action_id": call["action_id"], "session_id": record["session_id"], "turn_id": record["turn_id"],
        "tool": call["tool"], "owner": worker.env.host, "status": REQUESTED,
        "idempotency_key": format!("key-{}", worker.env.new_id()), "client_reference": call["action_id"],
    })
}

fn unwritten(error: WriteError) -> Settled {
    match error {
        WriteError::Fenced => Settled::Superseded,
        other => Settled::Unrecorded(other.describe()),
    }
}
