//! A turn: its deliveries, its model rounds, and its one recorded end.

use crate::actions::Settled;
use crate::status::{NOT_DONE, PLANNED};
use crate::store::{ended, Unwritten, TRIES};
use crate::{text, Worker, ACTIONS_FIELD, ANSWER_FIELD};
use rig::{Bus, ErrorBody};
use serde_json::{json, Value};
use std::rc::Rc;

/// The most model rounds one delivery runs before the turn fails.
const ROUNDS_MAX: u32 = 16;

/// How a delivery's work ended.
enum Ended {
    /// The turn ended (`completed`, `failed`, `held`) and the record says so.
    Recorded(String),
    /// A write was refused for a stale token: this worker stops.
    Fenced,
    /// The turn ended elsewhere: this worker stops.
    Superseded,
    /// What it had to record could not be: the delivery is answered with an error, so whoever
    /// delivers it again runs the turn on from its record.
    Unrecorded(String),
}

impl From<Unwritten> for Ended {
    fn from(unwritten: Unwritten) -> Self {
        match unwritten {
            Unwritten::Failed(why) => Ended::Unrecorded(why),
            Unwritten::Fenced => Ended::Fenced,
            Unwritten::Ended => Ended::Superseded,
        }
    }
}

/// Whether a delivery for `turn_id` at `step` is the session's current work: the record is that
/// turn, running, at or past that step.
fn current(record: &Value, turn_id: &str, step: u64) -> bool {
    let at = record["step"].as_u64().unwrap_or(0);
    let reached = if rig::planted!("small-current-only-at-the-delivered-step") { at == step } else { at >= step };
    // (The planted bug: the session's running turn is taken as the delivered one, "a session runs one turn".)
    let same_turn = rig::planted!("small-delivery-current-for-any-turn") || record["turn_id"] == turn_id;
    same_turn && record["status"] == "running" && reached
}

fn skipped(session: &str, turn_id: &str, reason: &str) -> Value {
    json!({ "session_id": session, "turn_id": turn_id, "skipped": true, "reason": reason })
}

impl Worker {
    /// `{host}::turn`: runs the turn when the delivery is current, and answers the contract's
    /// turn reply.
    pub(crate) async fn deliver(self: &Rc<Self>, bus: &Bus, data: &Value) -> Result<Value, ErrorBody> {
        let session = text(data, "session_id")?;
        let turn_id = text(data, "turn_id")?;
        let step = data["step"].as_u64().unwrap_or(0);
        let lock = self.session_lock(&session);
        let _working = lock.lock().await;
        let unavailable = |why: String| ErrorBody::new("unavailable", why);
        let record = self.read_turn(bus, &session).await.map_err(unavailable)?;
        if !current(&record, &turn_id, step) {
            self.finish_what_was_left(bus, &session, &record).await;
            return Ok(skipped(&session, &turn_id, "not the session's current turn at that step"));
        }
        self.own(bus, &session).await.map_err(unavailable)?;
        // Read again as its owner: the record may have moved before the lease was granted.
        let record = match self.read_turn(bus, &session).await {
            Ok(record) => record,
            Err(why) => {
                self.release(bus, &session).await;
                return Err(unavailable(why));
            }
        };
        if !current(&record, &turn_id, step) {
            self.finish_what_was_left(bus, &session, &record).await;
            self.release(bus, &session).await;
            return Ok(skipped(&session, &turn_id, "not the session's current turn at that step"));
        }
        match self.run(bus, record).await {
            Ended::Recorded(status) => {
                if status != "held" {
                    self.admit(bus, &session).await;
                }
                // (The planted bug: a held turn keeps its owner, "to pick it up when it is released".)
                if !(status == "held" && rig::planted!("small-lease-kept-on-a-held-turn")) {
                    self.release(bus, &session).await;
                }
                Ok(json!({ "session_id": session, "turn_id": turn_id, "status": status }))
            }
            Ended::Superseded => {
                self.release(bus, &session).await;
                Ok(skipped(&session, &turn_id, "the turn ended elsewhere"))
            }
            // Refused for a stale token: another worker's newer grant, which is its turn to
            // run now; or this worker's own, granted twice to one request the network repeated,
            // whose token it never heard of. Then nobody runs the turn unless it is delivered
            // again: an error asks for that, and the next delivery takes a lease it knows.
            Ended::Fenced => match self.lease_holder(bus, &session).await {
                Some(owner) if owner != self.env.host => {
                    Ok(skipped(&session, &turn_id, &format!("superseded: {owner} owns the session now")))
                }
                _ => Err(ErrorBody::new("fenced_out", format!("a newer lease of session {session} was granted"))),
            },
            Ended::Unrecorded(why) => {
                self.release(bus, &session).await;
                if !bus.is_connected() {
                    // Cut off from the engine, this worker's answer reaches nobody, and the
                    // queue may give the delivery up meanwhile: once back, it puts the turn
                    // on the queue again itself (a delivery too many is not current, and runs
                    // nothing).
                    let delivery = json!({ "session_id": session, "turn_id": turn_id, "step": step });
                    tokio::task::spawn_local(Rc::clone(self).deliver_again_later(bus.clone(), delivery));
                }
                Err(unavailable(why))
            }
        }
    }

    /// Model rounds, each a generation and the actions it asked for, until the turn ends.
    async fn run(self: &Rc<Self>, bus: &Bus, mut record: Value) -> Ended {
        for _ in 0..ROUNDS_MAX {
            if !self.round_planned(&record) {
                match self.generate(bus, &record).await {
                    Ok(Generated::Answer(answer)) => return self.complete(bus, record, answer).await,
                    Ok(Generated::Calls(calls)) => {
                        if let Err(unwritten) = self.plan(bus, &mut record, &calls).await {
                            return unwritten.into();
                        }
                    }
                    Err(why) => return self.end(bus, record, "failed", why).await,
                }
            }
            // The round's calls go into the transcript before any of their results, whoever
            // runs the round: the delivery that planned it, or one that finds it planned after
            // an append the session refused or a worker that died (keyed: kept once). The
            // model is never asked from a transcript that lacks them.
            if !self.transcribe_calls(bus, &record).await {
                return Ended::Unrecorded("the round's function calls could not be put into the transcript".into());
            }
            let mut held = Vec::new();
            for id in self.round_actions(&record) {
                match self.settle(bus, &mut record, &id).await {
                    Ok(Settled::Held(why)) => held.push(format!("{id}: {why}")),
                    Ok(Settled::Done | Settled::NotDone) => {}
                    // The next generation would be asked from a transcript without it: the turn
                    // fails here, as it does when a write of its next step is refused, and the
                    // result goes into the transcript in the background once the service is back.
                    Ok(Settled::Untranscribed(entry)) => {
                        let session = record["session_id"].as_str().unwrap_or_default().to_string();
                        tokio::task::spawn_local(Rc::clone(self).append_owed(bus.clone(), session, entry));
                        let why = format!("the result of action {id} could not be put into the transcript");
                        return self.end(bus, record, "failed", why).await;
                    }
                    Err(unwritten) => return unwritten.into(),
                }
            }
            if !held.is_empty() {
                return self.end(bus, record, "held", held.join("; ")).await;
            }
            record["step"] = json!(record["step"].as_u64().unwrap_or(0) + 1);
            if let Err(unwritten) = self.write_turn(bus, &record, TRIES).await {
                return unwritten.into();
            }
        }
        self.end(bus, record, "failed", format!("more than {ROUNDS_MAX} model rounds")).await
    }

    /// Whether the record holds a round planned at its current step.
    fn round_planned(&self, record: &Value) -> bool {
        !self.round_actions(record).is_empty()
    }

    /// The ids of the actions planned at the record's current step, in order.
    pub(crate) fn round_actions(&self, record: &Value) -> Vec<String> {
        let step = record["step"].as_u64().unwrap_or(0);
        let mut planned: Vec<(u64, String)> = record[ACTIONS_FIELD]
            .as_object()
            .into_iter()
            .flatten()
            .filter(|(_, action)| action["step"].as_u64() == Some(step))
            .map(|(id, action)| (action["index"].as_u64().unwrap_or(0), id.clone()))
            .collect();
        planned.sort();
        planned.into_iter().map(|(_, id)| id).collect()
    }

    /// Records a round: every call it asks for, planned, in one write.
    async fn plan(&self, bus: &Bus, record: &mut Value, calls: &[Value]) -> Result<(), Unwritten> {
        let turn_id = record["turn_id"].as_str().unwrap_or_default().to_string();
        let step = record["step"].as_u64().unwrap_or(0);
        let session = record["session_id"].as_str().unwrap_or_default().to_string();
        if !record[ACTIONS_FIELD].is_object() {
            record[ACTIONS_FIELD] = json!({});
        }
        for (index, call) in calls.iter().enumerate() {
            let id = format!("{turn_id}/{step}.{index}");
            let call_id = call["id"].as_str().map_or_else(|| id.clone(), str::to_string);
            record[ACTIONS_FIELD][&id] = json!({
                "step": step, "index": index, "tool": call["tool"], "args": call["args"], "call_id": call_id,
                "status": PLANNED, "owner": self.env.host,
                "idempotency_key": format!("{session}/{id}"), "client_reference": id,
            });
        }
        self.write_turn(bus, record, TRIES).await
    }

    /// Puts the planned round's calls into the transcript, as one entry keyed by the turn and
    /// step; whether the session took it.
    async fn transcribe_calls(&self, bus: &Bus, record: &Value) -> bool {
        let turn_id = record["turn_id"].as_str().unwrap_or_default();
        let step = record["step"].as_u64().unwrap_or(0);
        let session = record["session_id"].as_str().unwrap_or_default();
        let content: Vec<Value> = self
            .round_actions(record)
            .iter()
            .map(|id| &record[ACTIONS_FIELD][id])
            .map(|call| {
                json!({ "type": "function_call", "id": call["call_id"], "function_id": call["tool"], "arguments": call["args"] })
            })
            .collect();
        let entry = json!({ "role": "assistant", "content": content, "entry_key": format!("{turn_id}/{step}:calls") });
        self.append(bus, session, entry).await
    }

    /// A completed turn: its answer tried once in the transcript, then its end recorded with
    /// the answer in it (`answer`), then the answer presented if the try did not get through.
    /// The try comes first so that the delivery made again after an end that could not be
    /// recorded finds the answer there and does not ask the model again (an end refused still
    /// puts it there, tried as often as any append); the record holds it for a session that
    /// was down, so that a worker that dies before the answer reaches the transcript leaves it
    /// owed in the store, where whoever finds the turn ended (a stale delivery, the turn
    /// admitted next) presents it.
    async fn complete(self: &Rc<Self>, bus: &Bus, mut record: Value, answer: Value) -> Ended {
        let session = record["session_id"].as_str().unwrap_or_default().to_string();
        let entry = json!({ "role": "assistant", "text": answer, "entry_key": answer_key(&record) });
        let request = json!({ "session_id": session, "entry": entry });
        let appended = self.call(bus, "session::append", request).await.is_ok();
        record[ANSWER_FIELD] = entry.clone();
        let mut ended = self.end(bus, record, "completed", String::new()).await;
        // (The planted bug: "the user has the answer, so the turn is complete".)
        if appended && matches!(ended, Ended::Unrecorded(_)) && rig::planted!("small-answered-turn-taken-as-ended") {
            ended = Ended::Recorded("completed".into());
        }
        match ended {
            _ if appended => {}
            Ended::Recorded(_) => self.present(bus, &session, &entry).await,
            Ended::Unrecorded(_) => {
                self.append(bus, &session, entry).await;
            }
            Ended::Fenced | Ended::Superseded => {}
        }
        ended
    }

    /// Shows an ended turn's answer on the session (kept once, by its key): tried now and, while
    /// the session service will not take it, in the background, so a session down for a while
    /// delays the answer and never loses it.
    pub(crate) async fn present(self: &Rc<Self>, bus: &Bus, session: &str, entry: &Value) {
        if entry.is_object() && !self.append(bus, session, entry.clone()).await {
            tokio::task::spawn_local(Rc::clone(self).append_owed(bus.clone(), session.to_string(), entry.clone()));
        }
    }

    /// Records how the turn ended (`why`: a failure's or a hold's reason). Before a failure, each
    /// action of the turn that was never requested is closed as not done; one whose request may
    /// have left cannot be closed, so the turn is held for a person instead.
    async fn end(self: &Rc<Self>, bus: &Bus, mut record: Value, status: &str, why: String) -> Ended {
        let mut status = status.to_string();
        let session = record["session_id"].as_str().unwrap_or_default().to_string();
        let mut results = Vec::new();
        let mut why = why;
        if status == "failed" {
            let ids: Vec<String> =
                record[ACTIONS_FIELD].as_object().into_iter().flatten().map(|(id, _)| id.clone()).collect();
            for id in ids {
                let action = &mut record[ACTIONS_FIELD][&id];
                match action["status"].as_str() {
                    Some(PLANNED) => {
                        action["status"] = json!(NOT_DONE);
                        action["error"] = json!(format!("never requested: the turn failed ({why})"));
                        results.push((id.clone(), action.clone()));
                    }
                    Some(crate::status::REQUESTED) if rig::planted!("small-requested-closed-as-not-done") => {
                        action["status"] = json!(NOT_DONE);
                        action["error"] = json!(format!("not completed: the turn failed ({why})"));
                        results.push((id.clone(), action.clone()));
                    }
                    Some(crate::status::REQUESTED | crate::status::HELD) => {
                        status = "held".into();
                        why = format!("the turn failed ({why}) with action {id} of unknown outcome");
                    }
                    _ => {}
                }
            }
        }
        record["status"] = json!(status);
        match status.as_str() {
            // (The planted bug: the reason under a misspelt field, so the record says held with no reason.)
            "held" => {
                record[if rig::planted!("small-hold-reason-misnamed") { "hold_reason" } else { "held_reason" }] =
                    json!(why)
            }
            "failed" => record["error"] = json!(why),
            _ => {}
        }
        let tries = self.env.config.terminalize_attempts.max(1);
        if let Err(unwritten) = self.write_turn(bus, &record, tries).await {
            if !(rig::planted!("small-end-answered-before-it-is-durable") && matches!(unwritten, Unwritten::Failed(_)))
            {
                return unwritten.into();
            }
        }
        for (id, action) in results {
            let result = json!({ "error": action["error"] });
            if let Err(entry) = self.transcribe_result(bus, &session, &id, &action, &result, true).await {
                tokio::task::spawn_local(Rc::clone(self).append_owed(bus.clone(), session.clone(), entry));
            }
        }
        Ended::Recorded(status)
    }

    /// One generation for the turn, from the transcript as it stands; a completed turn whose
    /// end was not recorded finds its answer there, and is not asked again.
    async fn generate(&self, bus: &Bus, record: &Value) -> Result<Generated, String> {
        let session = record["session_id"].clone();
        let messages = self.call(bus, "session::messages", json!({ "session_id": session })).await;
        let messages = messages.map_err(|e| format!("session::messages: {e}"))?;
        let key = answer_key(record);
        let entries = messages["entries"].as_array().map(Vec::as_slice).unwrap_or_default();
        // (The planted bug: the transcript's answer found by its role, "the last answer is ours".)
        let ours = |entry: &&Value| match rig::planted!("small-any-answer-taken-as-this-turns") {
            true => entry["role"] == "assistant" && entry["text"].is_string(),
            false => entry["entry_key"] == key.as_str(),
        };
        if let Some(answer) = entries.iter().find(ours) {
            return Ok(Generated::Answer(answer["text"].clone()));
        }
        let tools: Vec<Value> = self
            .env
            .config
            .tools
            .iter()
            .map(|tool| json!({ "name": tool.name, "description": tool.description, "parameters": tool.parameters }))
            .collect();
        let request = json!({
            "session_id": session, "turn_id": record["turn_id"], "step": record["step"], "messages": messages["entries"],
            "tools": tools, "system_prompt": self.env.config.system_prompt,
        });
        let reply = bus.invoke("model::generate", request, self.env.config.model_timeout_ms).await;
        let reply = reply.map_err(|e| format!("model::generate: {e}"))?;
        match reply["tool_calls"].as_array().filter(|calls| !calls.is_empty()) {
            Some(calls) => Ok(Generated::Calls(calls.clone())),
            None => Ok(Generated::Answer(reply["text"].clone())),
        }
    }

    /// What a delivery that is not current may still find to do, left by a worker that died:
    /// a recorded end's answer to present, input waiting after it, or a new turn recorded but
    /// not yet through admission.
    async fn finish_what_was_left(self: &Rc<Self>, bus: &Bus, session: &str, record: &Value) {
        if ended(record) {
            self.present(bus, session, &record[ANSWER_FIELD]).await;
            self.admit(bus, session).await;
        } else if record["status"] == "running" && record["step"] == 0 {
            self.finish_admission_or_later(bus, record.clone()).await;
        }
    }
}

/// What a generation asked for.
enum Generated {
    Answer(Value),
    Calls(Vec<Value>),
}

/// The transcript key of a turn's answer.
fn answer_key(record: &Value) -> String {
    format!("{}:answer", record["turn_id"].as_str().unwrap_or_default())
}
