//! A turn: deliveries, model rounds, and the one recorded end.
//!
//! The turn record (scope `harness_turn`, key the session) is the contract's; this harness adds
//! `plan`, the round of tool calls under way: `{step, calls: [{action_id, tool, args, call_id}]}`,
//! written before the first of its effects is requested, so whoever continues the turn continues
//! the same actions instead of asking the model again; and, once the turn is completed, `answer`,
//! its answer as the transcript shows it, so whoever finds the turn ended can present it.

use crate::actions::Settled;
use crate::store::{WriteError, FINAL};
use crate::{text, Worker};
use rig::{Bus, ErrorBody};
use serde_json::{json, Value};
use std::rc::Rc;

pub(crate) const TURN_SCOPE: &str = "harness_turn";
/// The field of a completed turn's record that holds its answer as the transcript shows it
/// (with its `entry_key`): recorded with the end, before the answer is appended, so a worker that
/// dies before the append lands leaves the answer owed in the store, not lost.
pub(crate) const ANSWER_FIELD: &str = "answer";
/// The most model rounds one delivery runs before the turn fails.
const ROUNDS_MAX: u32 = 16;

/// How a delivery's work ended.
pub(crate) enum Ended {
    /// The turn reached an end (`completed`, `failed`, `held`) and the record says so (or will:
    /// `durable` false when the write is still owed).
    Recorded { status: String, durable: bool },
    /// A newer owner took the session, or the turn ended elsewhere: this worker stops.
    Superseded(Option<Value>),
    /// Something it must record could not be: the delivery ends unfinished, to be delivered
    /// again, and the turn stays running.
    Unfinished(String),
}

impl Worker {
    /// `{host}::turn`: runs the turn if the delivery is current.
    pub(crate) async fn deliver(self: &Rc<Self>, bus: &Bus, data: &Value) -> Result<Value, ErrorBody> {
        let session = text(data, "session_id")?;
        let turn_id = text(data, "turn_id")?;
        let step = data["step"].as_u64().unwrap_or(0);
        let lock = self.session_lock(&session);
        let _working = lock.lock().await;
        let record = self.get(bus, TURN_SCOPE, &session).await.map_err(|e| ErrorBody::new("unavailable", e))?;
        if !is_current(&record, &turn_id, step) {
            self.finish_after_a_crash(bus, &session, &record).await;
            return Ok(skipped(&session, &turn_id, "not the session's current turn at that step"));
        }
        self.own(bus, &session, false).await?;
        // Read again as owner: the record may have moved while the lease was taken.
        let record = self.read_owned(bus, &session).await?;
        if !is_current(&record, &turn_id, step) {
            self.release(bus, &session).await;
            return Ok(skipped(&session, &turn_id, "not the session's current turn at that step"));
        }
        self.continue_turn(bus, record).await
    }

    /// The session's turn record, read by the worker that has just taken its lease. A read the
    /// store refuses hands the lease back: the delivery ends with an error, and a lease kept
    /// (and renewed) by a worker that does nothing with it would keep every other worker, and
    /// the dead-letter handler, from the session for good.
    pub(crate) async fn read_owned(&self, bus: &Bus, session: &str) -> Result<Value, ErrorBody> {
        match self.get(bus, TURN_SCOPE, session).await {
            Ok(record) => Ok(record),
            Err(why) => {
                self.release(bus, session).await;
                Err(ErrorBody::new("unavailable", why))
            }
        }
    }

    /// Runs a current turn from its record to an end, and answers the contract's turn reply.
    pub(crate) async fn continue_turn(self: &Rc<Self>, bus: &Bus, record: Value) -> Result<Value, ErrorBody> {
        let session = record["session_id"].as_str().unwrap_or_default().to_string();
        let turn_id = record["turn_id"].clone();
        match self.run(bus, record).await {
            Ended::Recorded { status, durable } => {
                if durable {
                    let ended = json!({ "session_id": session, "turn_id": turn_id, "status": status });
                    self.tell_completed(bus, &ended).await;
                    self.admit(bus, &session).await;
                    self.release(bus, &session).await;
                    Ok(json!({ "session_id": session, "turn_id": turn_id, "status": status }))
                } else {
                    Ok(json!({ "session_id": session, "turn_id": turn_id, "status": status, "finalized": false }))
                }
            }
            Ended::Unfinished(why) => {
                self.release(bus, &session).await;
                Err(ErrorBody::new("unavailable", why))
            }
            // Refused for a stale token with no newer owner in sight: the newer grant may have been
            // this worker's own (a grant whose answer was lost, asked again). Forget the lease and
            // answer an error, so the queue delivers the turn again to whoever owns it now.
            Ended::Superseded(None) if self.not_exported(&session).is_ok() => {
                self.lose(&session);
                Err(ErrorBody::new("fenced_out", format!("a newer lease of session {session} was granted")))
            }
            Ended::Superseded(stored) => {
                let mut reply = skipped(&session, turn_id.as_str().unwrap_or_default(), "superseded");
                if let Some(status) = stored.as_ref().and_then(|r| r["status"].as_str()).filter(|s| FINAL.contains(s)) {
                    reply["status"] = json!(status);
                }
                Ok(reply)
            }
        }
    }

    /// Model rounds until the turn ends.
    async fn run(self: &Rc<Self>, bus: &Bus, mut record: Value) -> Ended {
        for _ in 0..ROUNDS_MAX {
            if record["plan"].is_null() {
                match self.generate(bus, &record).await {
                    Ok(Generated::Answer(answer)) => return self.complete(bus, record, &answer).await,
                    Ok(Generated::Calls(calls)) => {
                        if let Err(ended) = self.plan(bus, &mut record, &calls).await {
                            return ended;
                        }
                    }
                    Err(why) => return self.end(bus, record, "failed", Some(why)).await,
                }
            }
            // The round's calls go into the transcript before any of their results, whoever runs
            // the round (again: the append is keyed); the model is never asked from a transcript
            // that lacks them.
            if !self.transcribe_calls(bus, &record).await {
                return Ended::Unfinished("the round's function calls could not be put into the transcript".into());
            }
            let mut held = Vec::new();
            for call in record["plan"]["calls"].as_array().cloned().unwrap_or_default() {
                match self.settle(bus, &record, &call).await {
                    Settled::Held(reason) => held.push(reason),
                    Settled::Superseded => return Ended::Superseded(None),
                    Settled::Unrecorded(why) => return Ended::Unfinished(why),
                    Settled::Done | Settled::NotDone => {}
                }
            }
            if !held.is_empty() {
                return self.end(bus, record, "held", Some(held.join("; "))).await;
            }
            record["plan"] = Value::Null;
            record["step"] = json!(record["step"].as_u64().unwrap_or(0) + 1);
            if let Err(error) = self.put_turn(bus, &record, 3).await {
                return self.stopped(bus, record, error).await;
            }
        }
        self.end(bus, record, "failed", Some(format!("more than {ROUNDS_MAX} model rounds"))).await
    }

    /// Plans a round: ids for its calls, the round in the record (its calls go into the
    /// transcript as the round is run, [`Worker::transcribe_calls`]).
    async fn plan(self: &Rc<Self>, bus: &Bus, record: &mut Value, calls: &[Value]) -> Result<(), Ended> {
        let planned: Vec<Value> = calls
            .iter()
            .map(|call| {
                json!({ "action_id": format!("act-{}", self.env.new_id()), "tool": call["tool"], "args": call["args"], "call_id": call["id"] })
            })
            .collect();
        record["plan"] = json!({ "step": record["step"], "calls": planned });
        if let Err(error) = self.put_turn(bus, record, 3).await {
            return Err(self.stopped(bus, record.clone(), error).await);
        }
        Ok(())
    }

    /// The planned round's calls into the transcript, as one assistant entry keyed by the round:
    /// whether it is there now.
    async fn transcribe_calls(&self, bus: &Bus, record: &Value) -> bool {
        let content: Vec<Value> = record["plan"]["calls"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|call| {
                let id = if call["call_id"].is_string() { &call["call_id"] } else { &call["action_id"] };
                json!({ "type": "function_call", "id": id, "function_id": call["tool"], "arguments": call["args"] })
            })
            .collect();
        let step = &record["plan"]["step"];
        let key = format!("{}:{step}:calls", record["turn_id"].as_str().unwrap_or_default());
        self.append(bus, record, json!({ "role": "assistant", "content": content, "entry_key": key })).await
    }

    /// A completed turn: its end recorded with the answer in it, then the answer presented.
    /// The answer goes first wherever it can be kept: the record holds it, so a worker that dies
    /// before the answer reaches the transcript leaves it owed in the store, where whoever finds
    /// the turn ended (a stale delivery, an import, the turn admitted next) presents it; and when
    /// the end's first try is not taken, the answer is tried once in the transcript before the
    /// end is tried again, so a delivery made again after a worker that died meanwhile (or lost
    /// its lease) finds it there and ends with it, without asking the model again.
    async fn complete(self: &Rc<Self>, bus: &Bus, mut record: Value, answer: &Value) -> Ended {
        let key = format!("{}:answer", record["turn_id"].as_str().unwrap_or_default());
        record[ANSWER_FIELD] = json!({ "role": "assistant", "text": answer, "entry_key": key });
        record["status"] = json!("completed");
        record["plan"] = Value::Null;
        let tries = self.env.config.terminalize_attempts.max(1);
        match self.put_turn_attempts(bus, &record, 0..1).await {
            Ok(()) => {
                self.present(bus, &record).await;
                return Ended::Recorded { status: "completed".into(), durable: true };
            }
            Err(WriteError::Ended(stored)) => return Ended::Superseded(Some(stored)),
            Err(_) => {}
        }
        let request = json!({ "session_id": record["session_id"], "entry": record[ANSWER_FIELD] });
        let appended = self.call(bus, "session::append", request).await.is_ok();
        let presented = record.clone();
        if tries > 1 {
            self.back_off(0).await;
        }
        let ended = self.end_tried(bus, record, "completed", None, 1..tries).await;
        if let (false, Ended::Recorded { .. }) = (appended, &ended) {
            self.present(bus, &presented).await;
        }
        ended
    }

    /// Shows an ended turn's answer on the session (kept once, by its key), when its record
    /// holds one: tried now and, while the session service will not take it, in the background
    /// on the settling schedule, so a session down for a while delays the answer and never
    /// loses it.
    pub(crate) async fn present(self: &Rc<Self>, bus: &Bus, record: &Value) {
        let entry = &record[ANSWER_FIELD];
        if !entry.is_object() || self.append(bus, record, entry.clone()).await {
            return;
        }
        let request = json!({ "session_id": record["session_id"], "entry": entry });
        tokio::task::spawn_local(Rc::clone(self).append_later(bus.clone(), request));
    }

    /// [`Worker::present`]'s later tries.
    async fn append_later(self: Rc<Self>, bus: Bus, request: Value) {
        let mut settling = self.settling(3);
        while self.next_try(&bus, &mut settling).await {
            if self.call(&bus, "session::append", request.clone()).await.is_ok() {
                return;
            }
        }
    }

    /// Records how the turn ended (`why` the reason of a failure or a hold), retrying as the
    /// settings say; a write that never lands is still owed, and tried again in the background.
    pub(crate) async fn end(self: &Rc<Self>, bus: &Bus, record: Value, status: &str, why: Option<String>) -> Ended {
        let tries = self.env.config.terminalize_attempts.max(1);
        self.end_tried(bus, record, status, why, 0..tries).await
    }

    /// [`Worker::end`], making the `attempts` of its schedule before the background takes it
    /// over (one more when the range is empty).
    async fn end_tried(
        self: &Rc<Self>,
        bus: &Bus,
        mut record: Value,
        status: &str,
        why: Option<String>,
        attempts: std::ops::Range<u32>,
    ) -> Ended {
        record["status"] = json!(status);
        match (status, why) {
            ("held", Some(why)) => record["held_reason"] = json!(why),
            (_, Some(why)) => record["error"] = json!(why),
            _ => {}
        }
        if status != "held" {
            record["plan"] = Value::Null;
        }
        let attempts = if attempts.is_empty() { attempts.start..attempts.start + 1 } else { attempts };
        let tries = attempts.end;
        match self.put_turn_attempts(bus, &record, attempts).await {
            Ok(()) => Ended::Recorded { status: status.into(), durable: true },
            Err(WriteError::Failed(_)) => {
                let session = record["session_id"].as_str().unwrap_or_default().to_string();
                *self.owing.borrow_mut().entry(session).or_default() += 1;
                tokio::task::spawn_local(OwedEnd { record, tries }.write(Rc::clone(self), bus.clone()));
                Ended::Recorded { status: status.into(), durable: false }
            }
            Err(error) => self.stopped(bus, record, error).await,
        }
    }

    /// A write that could not land: a newer owner, or a turn that ended elsewhere, stops this
    /// worker; anything else fails the turn.
    async fn stopped(self: &Rc<Self>, bus: &Bus, record: Value, error: WriteError) -> Ended {
        match error {
            WriteError::Fenced => Ended::Superseded(None),
            WriteError::Ended(stored) => Ended::Superseded(Some(stored)),
            WriteError::Failed(why) => Box::pin(self.end(bus, record, "failed", Some(why))).await,
        }
    }

    pub(crate) async fn put_turn(&self, bus: &Bus, record: &Value, tries: u32) -> Result<(), WriteError> {
        self.put_turn_attempts(bus, record, 0..tries.max(1)).await
    }

    async fn put_turn_attempts(
        &self,
        bus: &Bus,
        record: &Value,
        attempts: std::ops::Range<u32>,
    ) -> Result<(), WriteError> {
        let session = record["session_id"].as_str().unwrap_or_default();
        self.put_attempts(bus, (TURN_SCOPE, session), record, session, (true, attempts)).await
    }

    /// Appends an entry to the session's transcript; its `entry_key` makes a repeat harmless.
    pub(crate) async fn append(&self, bus: &Bus, record: &Value, entry: Value) -> bool {
        let request = json!({ "session_id": record["session_id"], "entry": entry });
        for attempt in 0..3 {
            if self.call(bus, "session::append", request.clone()).await.is_ok() {
                return true;
            }
            self.back_off(attempt).await;
        }
        false
    }

    /// One generation for the turn, from the transcript as it stands.
    async fn generate(&self, bus: &Bus, record: &Value) -> Result<Generated, String> {
        let messages = self.call(bus, "session::messages", json!({ "session_id": record["session_id"] })).await;
        let messages = messages.map_err(|e| format!("session::messages: {e}"))?;
        // A delivery that died between transcribing the answer and recording the end finds the
        // answer there: the turn ends with it, without asking the model again.
        let answer_key = format!("{}:answer", record["turn_id"].as_str().unwrap_or_default());
        let entries = messages["entries"].as_array().map(Vec::as_slice).unwrap_or_default();
        if let Some(answer) = entries.iter().find(|e| e["entry_key"] == answer_key.as_str()) {
            return Ok(Generated::Answer(answer["text"].clone()));
        }
        let tools: Vec<Value> = self
            .env
            .config
            .tools
            .iter()
            .map(|t| json!({ "name": t.name, "description": t.description, "parameters": t.parameters }))
            .collect();
        let request = json!({
            "session_id": record["session_id"], "turn_id": record["turn_id"], "step": record["step"],
            "messages": messages["entries"], "tools": tools, "system_prompt": self.env.config.system_prompt,
        });
        let reply = bus.invoke("model::generate", request, self.env.config.model_timeout_ms).await;
        let reply = reply.map_err(|e| format!("model::generate: {e}"))?;
        match reply["tool_calls"].as_array().filter(|calls| !calls.is_empty()) {
            Some(calls) => Ok(Generated::Calls(calls.clone())),
            None => Ok(Generated::Answer(reply["text"].clone())),
        }
    }
}

/// What a generation asked for.
enum Generated {
    Answer(Value),
    Calls(Vec<Value>),
}

/// A turn's end that the store has not taken yet.
struct OwedEnd {
    record: Value,
    tries: u32,
}

impl OwedEnd {
    /// Tries again, further apart, for as long as the worker settles background work; once it
    /// lands, the session's queued input is admitted and its lease handed back, as after any
    /// recorded end.
    async fn write(self, worker: Rc<Worker>, bus: Bus) {
        let session = self.record["session_id"].as_str().unwrap_or_default().to_string();
        let landed = self.tried(&worker, &bus).await;
        {
            let mut owing = worker.owing.borrow_mut();
            if let Some(count) = owing.get_mut(&session) {
                *count -= 1;
                if *count == 0 {
                    owing.remove(&session);
                }
            }
        }
        if landed {
            worker.tell_completed(&bus, &self.record).await;
        }
        // One admission of the session at a time: a starting worker's recovery, a dead letter or
        // a delivery may be admitting its input too. Landed or not (ended elsewhere, its time
        // over), the lease it kept is handed back once no delivery here works on the session.
        let lock = worker.session_lock(&session);
        let _working = lock.lock().await;
        if landed {
            worker.admit(&bus, &session).await;
        }
        worker.release(&bus, &session).await;
    }

    /// The tries of [`OwedEnd::write`]: whether the end landed (false once a newer owner or an
    /// end recorded elsewhere stops it, or its time is over).
    async fn tried(&self, worker: &Rc<Worker>, bus: &Bus) -> bool {
        let mut settling = worker.settling(self.tries + 1);
        while worker.next_try(bus, &mut settling).await {
            match worker.put_turn(bus, &self.record, 1).await {
                Ok(()) => return true,
                Err(WriteError::Failed(_)) => continue,
                Err(_) => return false,
            }
        }
        false
    }
}

/// Whether a delivery for `turn_id` at `step` is the session's current work.
pub(crate) fn is_current(record: &Value, turn_id: &str, step: u64) -> bool {
    record["turn_id"] == turn_id && record["status"] == "running" && record["step"].as_u64().unwrap_or(0) >= step
}

fn skipped(session: &str, turn_id: &str, reason: &str) -> Value {
    json!({ "session_id": session, "turn_id": turn_id, "skipped": true, "reason": reason })
}

impl Worker {
    /// What a delivery (or a dead letter) that is not current may still owe, when the worker that
    /// ran the turn died, or was cut off from the engine, before finishing it: a recorded end's
    /// answer presented, the bound functions told of the end and the session's queued input
    /// admitted after it, or a new turn that was recorded but never reached the turn queue put
    /// there.
    pub(crate) async fn finish_after_a_crash(self: &Rc<Self>, bus: &Bus, session: &str, record: &Value) {
        if record["status"].as_str().is_some_and(|s| FINAL.contains(&s)) {
            self.present(bus, record).await;
            self.tell_completed(bus, record).await;
            self.admit(bus, session).await;
        } else if record["status"] == "running" && record["step"] == 0 {
            // Enqueued already, perhaps: a second delivery of it finds it ended, and runs nothing.
            self.enqueue_new_turn(bus, record.clone()).await;
        }
    }
}
