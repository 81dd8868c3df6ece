//! The harness's public functions beyond `turn`: `{host}::status` (where a session stands),
//! `{host}::send` (a user message, starting a turn or queued behind the running one), and the
//! `turn-completed` lifecycle trigger, told to the functions bound to it once a turn's terminal
//! state is durable.

use super::{error_body, is_terminal, Policy, TurnRequest, Worker, QUEUE_SCOPE, TURN_SCOPE};
use crate::bus::{Bus, ErrorBody};
use crate::harness::BindingPoint;
use serde_json::{json, Value};
use std::rc::Rc;

/// Where `send` remembers what it answered for an idempotency key.
const SEND_SCOPE: &str = "harness_send";
/// How many sends' answers a worker keeps by invocation id: copies of one invocation arrive
/// together (the network delivers at least once), not after hundreds of later sends.
pub(super) const ANSWERED_SENDS_MAX: usize = 256;

/// The flags of a `send` reply.
fn sent(session_id: &str, turn_id: &Value, queued: bool) -> Value {
    json!({
        "session_id": session_id, "turn_id": turn_id, "accepted": true,
        "queued": queued, "merged": false, "deduplicated": false,
    })
}

impl Worker {
    async fn list(&self, bus: &Bus, scope: &str) -> Result<Vec<Value>, ErrorBody> {
        let listed = bus.invoke("state::list", json!({ "scope": scope }), self.env.config.session_timeout_ms).await;
        match listed {
            Ok(Value::Array(entries)) => Ok(entries),
            Ok(_) => Ok(Vec::new()),
            Err(error) => Err(error_body("state::list", &error)),
        }
    }

    /// `{host}::status {session_id}`: the session's turn, the calls it has not settled, the
    /// messages queued behind it and the child sessions it started.
    pub(super) async fn status(&self, bus: &Bus, data: &Value) -> Result<Value, ErrorBody> {
        let session_id =
            data["session_id"].as_str().ok_or_else(|| ErrorBody::new("bad_request", "missing `session_id`"))?;
        if self.policy == Policy::StatusFromMemory {
            // The known-bad answer: what this worker last told a client, however the turn moved
            // on since.
            if let Some(remembered) = self.status_memory.borrow().get(session_id) {
                return Ok(remembered.clone());
            }
        }
        // The listings first and the turn record last: they take a while (longer when the store
        // is slow), and a reply built from a turn record read before them could say `running` of
        // a turn that ended meanwhile.
        let of_session = |entry: &&Value| entry["value"]["session_id"] == json!(session_id);
        let queued: Vec<Value> = self
            .list(bus, QUEUE_SCOPE)
            .await?
            .iter()
            .filter(of_session)
            .map(|e| e["value"]["message"].clone())
            .collect();
        let children: Vec<Value> = self
            .list(bus, TURN_SCOPE)
            .await?
            .iter()
            .filter(|e| e["value"]["parent"]["session_id"] == json!(session_id))
            .map(|e| e["key"].clone())
            .collect();
        let record = self.get_turn(bus, session_id).await.map_err(|e| error_body("get_turn", &e))?;
        let record = record.unwrap_or_else(|| json!({ "status": "none" }));
        let pending: Vec<Value> = record["calls"]
            .as_object()
            .map(|calls| {
                calls
                    .iter()
                    .filter(|(_, entry)| !matches!(entry["status"].as_str(), Some("complete" | "failed")))
                    .map(|(id, entry)| {
                        let mut pending = json!({ "id": id, "tool": entry["tool"], "status": entry["status"], "reason": entry["held_reason"] });
                        if let Some(at) = self.expires_at(entry, id) {
                            pending["expires_at_ms"] = json!(at);
                        }
                        pending
                    })
                    .collect()
            })
            .unwrap_or_default();
        let answer = json!({
            "session_id": session_id, "turn_id": record["turn_id"], "status": record["status"], "step": record["step"],
            "pending_calls": pending, "queued": queued, "children": children,
        });
        if self.policy == Policy::StatusFromMemory {
            self.status_memory.borrow_mut().insert(session_id.to_string(), answer.clone());
        }
        Ok(answer)
    }

    /// One invocation of `send`, however many copies of it the network delivers: the copies are
    /// taken one after the other, and a later copy gets the first one's answer without doing
    /// anything. The idempotency key cannot catch this on its own: a send may carry none, and
    /// its copies are still one message.
    pub(super) async fn send_once(
        self: &Rc<Self>,
        bus: &Bus,
        invocation_id: &str,
        data: &Value,
    ) -> Result<Value, ErrorBody> {
        let lock = self.send_lock(&format!("invocation/{invocation_id}"));
        let _copies = lock.lock().await;
        let answered = self.answered_sends.borrow().iter().find(|(id, _)| id == invocation_id).map(|(_, a)| a.clone());
        if let Some(answer) = answered {
            self.note("send_copy_answered", json!({ "invocation_id": invocation_id }));
            return answer;
        }
        let answer = self.send(bus, data).await;
        let mut answered = self.answered_sends.borrow_mut();
        if answered.len() >= ANSWERED_SENDS_MAX {
            answered.pop_front();
        }
        answered.push_back((invocation_id.to_string(), answer.clone()));
        drop(answered);
        self.send_locks.borrow_mut().remove(&format!("invocation/{invocation_id}"));
        answer
    }

    /// `{host}::send {session_id, message, idempotency_key?}`: starts a turn on the message, or
    /// queues it when a turn of the session is under way (it is admitted when that turn ends).
    /// The reply's flags say which (`queued`), and whether the key had been sent before
    /// (`deduplicated`: nothing new happened). This harness never merges a message into a
    /// running turn (`merged` is always false).
    pub(super) async fn send(self: &Rc<Self>, bus: &Bus, data: &Value) -> Result<Value, ErrorBody> {
        let session_id =
            data["session_id"].as_str().ok_or_else(|| ErrorBody::new("bad_request", "missing `session_id`"))?;
        if data["message"].is_null() {
            return Err(ErrorBody::new("bad_request", "missing `message`"));
        }
        let timeout = self.env.config.session_timeout_ms;
        let remembered = data["idempotency_key"].as_str().map(|key| format!("{session_id}/{key}"));
        // Copies of one send (the network delivers at least once) one after the other: the
        // second finds what the first recorded, instead of both finding nothing.
        let key_lock = remembered.as_ref().map(|key| self.send_lock(key));
        let _sending = match &key_lock {
            Some(lock) => Some(lock.lock().await),
            None => None,
        };
        if let Some(key) = &remembered {
            let earlier = bus.invoke("state::get", json!({ "scope": SEND_SCOPE, "key": key }), timeout).await;
            let mut earlier = earlier.map_err(|e| error_body("state::get", &e))?;
            if earlier.is_object() {
                // The known-bad check: a key counts as sent only while its message waits in the queue.
                if self.policy != Policy::DedupeQueuedOnly || earlier["queued"] == json!(true) {
                    earlier["deduplicated"] = json!(true);
                    return Ok(earlier);
                }
            } else if !earlier.is_null() {
                return Err(ErrorBody::new(
                    "malformed_record",
                    format!("the reply remembered for {key} is `{earlier}`"),
                ));
            }
        }
        // Queueing behind a running turn takes no lock: the running turn holds it to its end.
        let reply = match self.queue_behind(bus, session_id, data, false).await? {
            Some(reply) => reply,
            None => {
                let lock = self.session_lock(session_id);
                let _guard = lock.lock().await;
                if let Err(not_owner) = self.ensure_ownership(bus, session_id).await {
                    return Err(ErrorBody::new("not_owner", not_owner.reason()));
                }
                // A turn may have started while this worker waited for the session.
                let reply = match self.queue_behind(bus, session_id, data, true).await {
                    Ok(Some(reply)) => Ok(reply),
                    Ok(None) => self.start_turn(bus, session_id, data).await,
                    Err(error) => Err(error),
                };
                self.hand_back(bus, session_id).await;
                reply?
            }
        };
        let remember = !crate::planted!("ref-send-remembered-only-when-queued") || reply["queued"] == json!(true);
        if let Some(key) = remembered.filter(|_| remember) {
            let write = json!({ "scope": SEND_SCOPE, "key": key, "value": reply });
            bus.invoke("state::set", write, timeout).await.map_err(|e| error_body("state::set", &e))?;
        }
        Ok(reply)
    }

    /// Queues the message behind the session's turn if one is under way (`None` if not). When
    /// that turn ended while the message was being queued, its finalisation may have drained the
    /// queue of input before the message was in it: the message is admitted here.
    async fn queue_behind(
        self: &Rc<Self>,
        bus: &Bus,
        session_id: &str,
        data: &Value,
        locked: bool,
    ) -> Result<Option<Value>, ErrorBody> {
        let current = self.get_turn(bus, session_id).await.map_err(|e| error_body("get_turn", &e))?;
        if let Some(to) = self.handed_to(session_id, current.as_ref()) {
            return Err(ErrorBody::new("not_owner", format!("the session was handed over to {to}")));
        }
        let Some(record) = current.filter(|record| !is_terminal(record)) else { return Ok(None) };
        let entry = json!({ "session_id": session_id, "message": data["message"] });
        let key = format!("{session_id}:{}", self.env.new_id());
        let write = json!({ "scope": QUEUE_SCOPE, "key": key, "value": entry });
        let timeout = self.env.config.session_timeout_ms;
        bus.invoke("state::set", write, timeout).await.map_err(|e| error_body("state::set", &e))?;
        if let Ok(Some(now)) = self.get_turn(bus, session_id).await {
            if now["turn_id"] == record["turn_id"] && is_terminal(&now) {
                let turn_id = now["turn_id"].as_str().unwrap_or_default().to_string();
                let request = TurnRequest { session_id: session_id.to_string(), turn_id, step: 0 };
                let lock = self.session_lock(session_id);
                let _guard = if locked { None } else { Some(lock.lock().await) };
                // Read again under the lock: the finalisation that held it may have admitted a
                // successor since, and a stale record would admit the input a second time.
                let now = if locked { Some(now) } else { self.get_turn(bus, session_id).await.ok().flatten() };
                self.finish_admission(bus, &request, now.as_ref()).await;
            }
        }
        Ok(Some(sent(session_id, &record["turn_id"], true)))
    }

    /// A new turn on the sent message: the message enters the transcript, the turn record is written,
    /// and the turn goes to the turn queue.
    async fn start_turn(&self, bus: &Bus, session_id: &str, data: &Value) -> Result<Value, ErrorBody> {
        let message = &data["message"];
        let turn_id = format!("t-{}", self.env.new_id());
        let previous = self.get_turn(bus, session_id).await.ok().flatten();
        let turn_count = previous.as_ref().map_or(0, |r| r["turn_count"].as_u64().unwrap_or(0));
        // A send that failed after its message entered the transcript is sent again under the
        // same idempotency key: keyed by it, the message is not entered a second time.
        let key = Some(match data["idempotency_key"].as_str() {
            Some(idempotency_key) => format!("send:{idempotency_key}"),
            None => format!("{turn_id}:message"),
        });
        if !self.append_entry(bus, &json!(session_id), key, message.clone()).await {
            return Err(ErrorBody::new("unavailable", "the message could not be written to the session"));
        }
        // Like a turn admitted from queued input, it names the turn it follows (itself when it
        // follows none), so a worker's recovery sweep enqueues it if this worker dies first.
        let predecessor = previous.as_ref().map_or_else(|| json!(turn_id), |r| r["turn_id"].clone());
        let mut turn = json!({
            "session_id": session_id, "turn_id": turn_id, "status": "running", "step": 0, "turn_count": turn_count,
            "depth": 0, "abort": false, "calls": {}, "predecessor": predecessor,
            "created_at": self.now(), "updated_at": self.now(),
        });
        super::switch::carry_hand_over(previous.as_ref(), &mut turn);
        // A new turn runs on the version production points at now, whatever happens to the
        // pointer later.
        self.pin_new_turn(bus, &mut turn).await.map_err(|f| error_body(&f.during, &f.error))?;
        self.create_turn_record(bus, &turn).await.map_err(|e| error_body("put_turn", &e))?;
        let admitted = self.admit(bus, turn).await;
        if admitted["admitted"] != json!(true) {
            return Err(ErrorBody::new("unavailable", format!("the turn could not be queued: {}", admitted["error"])));
        }
        Ok(sent(session_id, &json!(turn_id), false))
    }

    /// Tells every function bound to `turn-completed` that a turn ended (its terminal state is
    /// durable): at least once, with the same payload every time.
    pub(super) async fn announce(&self, bus: &Bus, terminal: &Value) {
        let payload = json!({ "session_id": terminal["session_id"], "turn_id": terminal["turn_id"], "status": terminal["status"] });
        let bound = self.env.config.bindings.iter().filter(|b| b.trigger == BindingPoint::TurnCompleted);
        for binding in bound {
            let _ = bus.invoke(&binding.function, payload.clone(), self.env.config.session_timeout_ms).await;
        }
    }
}
