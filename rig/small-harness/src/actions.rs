//! Actions: a planned call marked requested before its request leaves, its outcome recorded
//! after; an outcome it does not know is asked of the service before anything is sent again,
//! and what the service cannot say is held for a person.

use crate::status::{DONE, HELD, NOT_DONE, REQUESTED};
use crate::store::{Unwritten, OWNER_SCOPE, TRIES};
use crate::{Worker, ACTIONS_FIELD};
use rig::{Bus, InvokeError, Tool};
use serde_json::{json, Value};

/// How many requests of one action one delivery sends, the service asked in between.
const REQUESTS_MAX: u32 = 2;

/// Where an action stands once this worker is through with it.
pub(crate) enum Settled {
    Done,
    NotDone,
    /// Held for a person, and why.
    Held(String),
    /// Settled and recorded, but its result could not be put into the transcript (this entry):
    /// the turn cannot go on to ask the model without it.
    Untranscribed(Value),
}

/// What the service says about an action whose outcome is unknown.
enum Asked {
    Happened(Value),
    NotHappened,
    Unknown(String),
}

impl Worker {
    /// Brings the action `id` of the turn to a settled outcome or a hold, recording each step
    /// of it in `record`.
    pub(crate) async fn settle(&self, bus: &Bus, record: &mut Value, id: &str) -> Result<Settled, Unwritten> {
        let action = record[ACTIONS_FIELD][id].clone();
        let session = record["session_id"].as_str().unwrap_or_default().to_string();
        match action["status"].as_str() {
            // Settled by a worker that may have died before transcribing its result: the
            // append is keyed, so making sure is harmless, and the next generation needs it.
            Some(DONE | NOT_DONE) if rig::planted!("small-settled-result-not-transcribed") => {
                return Ok(if action["status"] == DONE { Settled::Done } else { Settled::NotDone });
            }
            Some(status @ (DONE | NOT_DONE)) => {
                let result = match &action["result"] {
                    Value::Null => json!({ "error": action["error"] }),
                    result => result.clone(),
                };
                let is_error = status != DONE || result["is_error"] == true;
                if let Err(entry) = self.transcribe_result(bus, &session, id, &action, &result, is_error).await {
                    return Ok(Settled::Untranscribed(entry));
                }
                return Ok(if status == DONE { Settled::Done } else { Settled::NotDone });
            }
            // (The planted bug: a held action is tried again when its turn is delivered again.)
            Some(HELD) if !rig::planted!("small-held-action-requested-again") => {
                return Ok(Settled::Held(action["held_reason"].as_str().unwrap_or("held").into()))
            }
            _ => {}
        }
        let Some(tool) = self.env.config.tools.iter().find(|t| action["tool"] == t.name.as_str()).cloned() else {
            let error = json!({ "error": format!("no tool named {} is offered", action["tool"]) });
            return self.record_outcome(bus, record, id, NOT_DONE, error).await;
        };
        // (The planted bug: only another worker's request is asked about, "this one would know its own".)
        let mine = action["owner"] == self.env.host.as_str();
        if action["status"] == REQUESTED && !(mine && rig::planted!("small-own-request-sent-again-unasked")) {
            // Its request may have left, from this worker or one before it: ask first.
            match self.ask(bus, &tool, &action).await {
                Asked::Happened(answer) => return self.record_outcome(bus, record, id, DONE, answer).await,
                Asked::Unknown(why) => return self.hold(bus, record, id, why).await,
                Asked::NotHappened => {}
            }
        }
        self.request(bus, record, id, &tool).await
    }

    /// Marks the action requested, then sends it; an answer that does not come is asked about
    /// before the one further request.
    async fn request(&self, bus: &Bus, record: &mut Value, id: &str, tool: &Tool) -> Result<Settled, Unwritten> {
        let session = record["session_id"].as_str().unwrap_or_default().to_string();
        for request in 0..REQUESTS_MAX {
            let action = &mut record[ACTIONS_FIELD][id];
            if request > 0 && rig::planted!("small-retry-under-a-fresh-key") {
                // (The planted bug: each request its own key, "so the service never confuses them".)
                action["idempotency_key"] =
                    json!(format!("{}#{request}", action["idempotency_key"].as_str().unwrap_or("")));
            }
            // (The planted bug: the action is recorded done as it is requested, "the request is the commitment".)
            let marked = if rig::planted!("small-done-recorded-before-acceptance") { DONE } else { REQUESTED };
            action["status"] = json!(marked);
            if action["first_requested_at_ms"].is_null() {
                action["first_requested_at_ms"] = json!(self.env.clock.now_ms());
            }
            let action = action.clone();
            self.write_turn(bus, record, TRIES).await?;
            self.env.checkpoint("before_submission", id).await;
            let token = self.fence(&session)?;
            let mut effect = json!({
                "action_id": id, "idempotency_key": action["idempotency_key"],
                "client_reference": action["client_reference"], "args": action["args"],
            });
            if let Some(title) = action["args"].get("title") {
                effect["title"] = title.clone();
            }
            if let Some(token) = token {
                effect["fencing"] = json!({ "domain": format!("{OWNER_SCOPE}/{session}"), "token": token });
            }
            match bus.invoke(&tool.function, effect, self.env.config.tool_timeout_ms).await {
                Ok(answer) => {
                    self.env.checkpoint("after_acceptance", id).await;
                    return self.record_outcome(bus, record, id, DONE, answer).await;
                }
                Err(InvokeError::Rejected(body)) if body.code == "stale_token" => {
                    self.lose(&session);
                    return Err(Unwritten::Fenced);
                }
                Err(error) if !error.outcome_unknown() => {
                    // A refusal answers one copy of a request the network may deliver twice:
                    // the service is asked before the action is taken as not done.
                    let refusal = json!({ "error": error.to_json() });
                    // (The planted bug: a refusal taken at its word, "the service said no".)
                    if rig::planted!("small-refusal-taken-as-not-done") {
                        return self.record_outcome(bus, record, id, NOT_DONE, refusal).await;
                    }
                    return match self.ask(bus, tool, &action).await {
                        Asked::Happened(answer) => self.record_outcome(bus, record, id, DONE, answer).await,
                        Asked::NotHappened | Asked::Unknown(_) => {
                            self.record_outcome(bus, record, id, NOT_DONE, refusal).await
                        }
                    };
                }
                // (The planted bug: "the service is slow, never lossy": no answer taken as done.)
                Err(error) if rig::planted!("small-unanswered-request-taken-as-done") => {
                    let answer = json!({ "content": [{ "type": "text", "text": format!("sent ({error})") }] });
                    return self.record_outcome(bus, record, id, DONE, answer).await;
                }
                Err(error) => match self.ask(bus, tool, &action).await {
                    Asked::Happened(answer) => return self.record_outcome(bus, record, id, DONE, answer).await,
                    Asked::Unknown(why) => {
                        return self
                            .hold(bus, record, id, format!("{} got no answer ({error}); {why}", tool.name))
                            .await
                    }
                    Asked::NotHappened => {}
                },
            }
        }
        let why = format!("{} was requested {REQUESTS_MAX} times and never answered", tool.name);
        self.hold(bus, record, id, why).await
    }

    /// Asks the service whether the action happened: by its idempotency key (a negative answer
    /// trusted within the key's window), then by its client reference.
    async fn ask(&self, bus: &Bus, tool: &Tool, action: &Value) -> Asked {
        let mut last = format!("{} can be asked neither by key nor by reference", tool.service);
        for attempt in 0..self.env.config.terminalize_attempts.max(1) {
            let mut answered = true;
            if tool.idempotency {
                let question = json!({ "idempotency_key": action["idempotency_key"] });
                match bus.invoke(&format!("{}::status", tool.service), question, self.env.config.tool_timeout_ms).await
                {
                    Ok(answer) if answer["known"] == true => return Asked::Happened(answer),
                    Ok(_) if self.within_window(tool, action) => return Asked::NotHappened,
                    Ok(_) => last = format!("{} may have forgotten the key", tool.service),
                    // (The planted bug: a key check that got no answer read as "no such key".)
                    Err(_) if rig::planted!("small-unanswered-key-check-taken-as-not-there") => {
                        return Asked::NotHappened
                    }
                    Err(error) => (answered, last) = (false, format!("{}::status: {error}", tool.service)),
                }
            }
            if tool.lookup {
                let question = json!({ "client_reference": action["client_reference"] });
                match bus.invoke(&format!("{}::lookup", tool.service), question, self.env.config.tool_timeout_ms).await
                {
                    // (The planted bug: the lookup's answer read by the status answer's field.)
                    Ok(answer)
                        if answer[if rig::planted!("small-lookup-read-as-status") { "known" } else { "found" }]
                            == true =>
                    {
                        return Asked::Happened(answer)
                    }
                    Ok(_) => return Asked::NotHappened,
                    Err(error) => (answered, last) = (false, format!("{}::lookup: {error}", tool.service)),
                }
            }
            if answered {
                break;
            }
            self.back_off(attempt).await;
        }
        Asked::Unknown(format!("its outcome is unknown: {last}"))
    }

    fn within_window(&self, tool: &Tool, action: &Value) -> bool {
        let first = action["first_requested_at_ms"].as_u64().unwrap_or(0);
        rig::planted!("small-key-check-trusted-past-its-window")
            || self.env.clock.now_ms().saturating_sub(first) < tool.idempotency_window_ms
    }

    /// Records a settled outcome in the turn record, then its result in the transcript.
    async fn record_outcome(
        &self,
        bus: &Bus,
        record: &mut Value,
        id: &str,
        status: &str,
        answer: Value,
    ) -> Result<Settled, Unwritten> {
        let session = record["session_id"].as_str().unwrap_or_default().to_string();
        let action = &mut record[ACTIONS_FIELD][id];
        action["status"] = json!(status);
        action["result"] = answer.clone();
        let action = action.clone();
        self.write_turn(bus, record, TRIES).await?;
        let is_error = status != DONE || answer["is_error"] == true;
        let transcribed = self.transcribe_result(bus, &session, id, &action, &answer, is_error).await;
        self.env.checkpoint("after_completion", id).await;
        match transcribed {
            Ok(()) => Ok(if status == DONE { Settled::Done } else { Settled::NotDone }),
            Err(entry) => Ok(Settled::Untranscribed(entry)),
        }
    }

    /// The action's result as the transcript shows it: the service's `content` when it gives
    /// one, else the whole answer as one text block. The entry, when the session service would
    /// not take it.
    pub(crate) async fn transcribe_result(
        &self,
        bus: &Bus,
        session: &str,
        id: &str,
        action: &Value,
        answer: &Value,
        is_error: bool,
    ) -> Result<(), Value> {
        let content = match answer.get("content") {
            Some(content) => content.clone(),
            None => json!([{ "type": "text", "text": answer.to_string() }]),
        };
        let entry = json!({
            "role": "function_result", "function_call_id": action["call_id"], "function_id": action["tool"],
            "content": content, "is_error": is_error, "entry_key": format!("{id}:result"),
        });
        if self.append(bus, session, entry.clone()).await {
            Ok(())
        } else {
            Err(entry)
        }
    }

    /// Holds the action for a person, and says why.
    async fn hold(&self, bus: &Bus, record: &mut Value, id: &str, why: String) -> Result<Settled, Unwritten> {
        let action = &mut record[ACTIONS_FIELD][id];
        action["status"] = json!(HELD);
        action["held_reason"] = json!(why);
        self.write_turn(bus, record, TRIES).await?;
        Ok(Settled::Held(why))
    }
}
