//! Input: `send`, queued input (scope `harness_queue`, key `{session}:{id}`), and admitting it
//! as a new turn once the session's turn has ended.

use crate::store::{WriteError, FINAL};
use crate::turn::TURN_SCOPE;
use crate::{text, Worker, SENT_SCOPE};
use rig::{Action, Bus, ErrorBody};
use serde_json::{json, Value};
use std::rc::Rc;

pub(crate) const INPUT_SCOPE: &str = "harness_queue";

impl Worker {
    /// `{host}::send`: the message starts a turn, or waits behind the one under way.
    pub(crate) async fn send(self: &Rc<Self>, bus: &Bus, data: &Value) -> Result<Value, ErrorBody> {
        let session = text(data, "session_id")?;
        let message = data.get("message").cloned().ok_or_else(|| ErrorBody::new("bad_request", "`message` missing"))?;
        self.not_exported(&session)?;
        let unavailable = |e: String| ErrorBody::new("unavailable", e);
        let key = data["idempotency_key"].as_str().map(|k| format!("{session}:{k}"));
        if let Some(key) = &key {
            let sent = self.get(bus, SENT_SCOPE, key).await.map_err(unavailable)?;
            if !sent.is_null() {
                return Ok(json!({
                    "session_id": session, "turn_id": sent["turn_id"], "accepted": true, "queued": sent["queued"],
                    "deduplicated": true, "merged": false,
                }));
            }
        }
        let record = self.get(bus, TURN_SCOPE, &session).await.map_err(unavailable)?;
        let under_way = record["status"].as_str().is_some_and(|s| !FINAL.contains(&s));
        let id = key.clone().unwrap_or_else(|| format!("{session}:{}", self.env.new_id()));
        let (turn_id, queued) = if under_way {
            let entry = json!({ "session_id": session, "message": message });
            self.store(bus, INPUT_SCOPE, &id, &entry).await.map_err(unavailable)?;
            (record["turn_id"].clone(), true)
        } else {
            (json!(self.start_turn(bus, &session, &[(id.clone(), message)]).await.map_err(unavailable)?), false)
        };
        if let Some(key) = &key {
            let sent = json!({ "session_id": session, "turn_id": turn_id, "queued": queued });
            let _ = self.store(bus, SENT_SCOPE, key, &sent).await;
        }
        Ok(json!({
            "session_id": session, "turn_id": turn_id, "accepted": true, "queued": queued, "deduplicated": false,
            "merged": false,
        }))
    }

    /// Admits the session's queued input as a new turn, if its turn has ended and input waits.
    pub(crate) async fn admit(self: &Rc<Self>, bus: &Bus, session: &str) {
        let Ok(Value::Array(listed)) = self.call(bus, "state::list", json!({ "scope": INPUT_SCOPE })).await else {
            return;
        };
        let waiting: Vec<(String, Value)> = listed
            .into_iter()
            .filter(|e| e["value"]["session_id"] == session)
            .map(|e| (e["key"].as_str().unwrap_or_default().to_string(), e["value"]["message"].clone()))
            .collect();
        if waiting.is_empty() {
            return;
        }
        let Ok(record) = self.get(bus, TURN_SCOPE, session).await else { return };
        if record["status"].as_str().is_some_and(|s| !FINAL.contains(&s)) {
            return;
        }
        let _ = self.start_turn(bus, session, &waiting).await;
    }

    /// A new turn made of `input` (`(key, message)`): its record at step 0 naming the input, the
    /// messages into the transcript, the input's entries removed, the turn on the turn queue. A
    /// turn that cannot be enqueued is held, with why. Answers the new turn's id.
    async fn start_turn(
        self: &Rc<Self>,
        bus: &Bus,
        session: &str,
        input: &[(String, Value)],
    ) -> Result<String, String> {
        let turn_id = format!("turn-{}", self.env.new_id());
        let keys: Vec<&String> = input.iter().map(|(key, _)| key).collect();
        let mut record = json!({
            "session_id": session, "turn_id": turn_id, "status": "running", "step": 0, "input_keys": keys,
        });
        self.store(bus, TURN_SCOPE, session, &record).await?;
        for (key, message) in input {
            let mut entry = message.clone();
            if let Some(fields) = entry.as_object_mut() {
                fields.insert("entry_key".into(), json!(format!("input:{key}")));
                fields.entry("role").or_insert(json!("user"));
            }
            self.append(bus, &record, entry).await;
            let _ = self.call(bus, "state::delete", json!({ "scope": INPUT_SCOPE, "key": key })).await;
        }
        if let Err(why) = self.enqueue(bus, session, &turn_id).await {
            record["status"] = json!("held");
            record["held_reason"] = json!(format!("the new turn could not be put on the turn queue: {why}"));
            self.store(bus, TURN_SCOPE, session, &record).await?;
        }
        Ok(turn_id)
    }

    async fn enqueue(&self, bus: &Bus, session: &str, turn_id: &str) -> Result<(), String> {
        let queue = Action::Enqueue { queue: self.env.config.turn_queue.clone() };
        let request = json!({ "session_id": session, "turn_id": turn_id, "step": 0 });
        let mut last = String::new();
        for attempt in 0..self.env.config.enqueue_attempts.max(1) {
            let sent = bus
                .invoke_with(
                    &self.env.function("turn"),
                    request.clone(),
                    Some(queue.clone()),
                    self.env.config.session_timeout_ms,
                )
                .await;
            match sent {
                Ok(_) => return Ok(()),
                Err(error) => last = error.to_string(),
            }
            self.back_off(attempt).await;
        }
        Err(last)
    }

    /// A write of a session's record outside a turn's own: fenced when this worker owns the
    /// session, unfenced when nobody does.
    async fn store(&self, bus: &Bus, scope: &str, key: &str, value: &Value) -> Result<(), String> {
        let session = value["session_id"].as_str().unwrap_or_default().to_string();
        let owned = self.leases.borrow().contains_key(&session);
        let result = if owned || self.env.config.lease_ttl_ms == 0 {
            self.put(bus, (scope, key), value, &session, (false, 3)).await
        } else {
            self.put_unfenced(bus, scope, key, value).await
        };
        result.map_err(|e| e.describe())
    }

    async fn put_unfenced(&self, bus: &Bus, scope: &str, key: &str, value: &Value) -> Result<(), WriteError> {
        let request = json!({ "scope": scope, "key": key, "value": value });
        self.call(bus, "state::set", request).await.map(|_| ()).map_err(|e| WriteError::Failed(e.to_string()))
    }
}
