//! Input: `send`, queued input (scope `harness_queue`, key `{session}:{id}`), and admitting it
//! as a new turn once the session's turn has ended.

use crate::store::{WriteError, FINAL};
use crate::turn::{ANSWER_FIELD, TURN_SCOPE};
use crate::{text, Worker, SENT_SCOPE};
use rig::{Action, Bus, ErrorBody};
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::rc::Rc;

pub(crate) const INPUT_SCOPE: &str = "harness_queue";
/// How often `send` decides afresh between starting a turn and queueing the message, when a
/// turn keeps starting under it.
const SEND_DECISIONS: u32 = 3;

impl Worker {
    /// `{host}::send`: the message starts a turn, or waits behind the one under way.
    ///
    /// The message's input id is its idempotency key, or without one the invocation's id: the
    /// copies of one invocation the network delivered twice are then one input, found in the
    /// record of the turn the first copy started (`input_keys`) or written over itself in the
    /// queue, never a second message.
    pub(crate) async fn send(
        self: &Rc<Self>,
        bus: &Bus,
        invocation_id: &str,
        data: &Value,
    ) -> Result<Value, ErrorBody> {
        let session = text(data, "session_id")?;
        let message = data.get("message").cloned().ok_or_else(|| ErrorBody::new("bad_request", "`message` missing"))?;
        self.not_exported(&session)?;
        let unavailable = |e: String| ErrorBody::new("unavailable", e);
        let key = data["idempotency_key"].as_str().map(|k| format!("{session}:{k}"));
        let lock = self.send_lock(&session);
        let _sending = lock.lock().await;
        let deduplicated = |turn_id: &Value, queued: &Value| {
            json!({
                "session_id": session, "turn_id": turn_id, "accepted": true, "queued": queued,
                "deduplicated": true, "merged": false,
            })
        };
        if let Some(key) = &key {
            let sent = self.get(bus, SENT_SCOPE, key).await.map_err(unavailable)?;
            if !sent.is_null() {
                return Ok(deduplicated(&sent["turn_id"], &sent["queued"]));
            }
        }
        let id = key.clone().unwrap_or_else(|| format!("{session}:send-{invocation_id}"));
        let mut started = None;
        for _ in 0..SEND_DECISIONS {
            let record = self.get(bus, TURN_SCOPE, &session).await.map_err(unavailable)?;
            // A turn started on this very message, by a send whose own note of the key never
            // landed, or by another copy of this invocation: the message is in, once.
            if record["input_keys"].as_array().is_some_and(|keys| keys.contains(&json!(id))) {
                return Ok(deduplicated(&record["turn_id"], &json!(false)));
            }
            if record["status"].as_str().is_some_and(|s| !FINAL.contains(&s)) {
                let entry = json!({ "session_id": session, "message": message });
                self.store(bus, INPUT_SCOPE, &id, &entry).await.map_err(unavailable)?;
                started = Some((record["turn_id"].clone(), true));
                break;
            }
            // A turn started meanwhile (queued input admitted as the last one ended): the
            // message waits behind it instead, decided on the record read again.
            let input = [(id.clone(), message.clone())];
            if let Some(turn_id) = self.start_turn(bus, &session, &input, &record).await.map_err(unavailable)? {
                started = Some((json!(turn_id), false));
                break;
            }
        }
        let Some((turn_id, queued)) = started else {
            return Err(unavailable(format!(
                "the turn of session {session} kept moving while the message was taken in"
            )));
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
    /// When that cannot be found out or done now (the store refuses the listing or the read, or
    /// the new turn cannot be started), it is tried again in the background, further apart: the
    /// delivery that ended the turn has been answered, and nobody else would admit the input.
    pub(crate) async fn admit(self: &Rc<Self>, bus: &Bus, session: &str) {
        if !self.try_admit(bus, session).await {
            tokio::task::spawn_local(Rc::clone(self).admit_later(bus.clone(), session.to_string()));
        }
    }

    /// [`Worker::admit`]'s later rounds. A new turn this worker recorded meanwhile, in a round
    /// whose answer it never heard, is put on the turn queue (a second delivery of a turn that
    /// did reach it finds it under way or over, and runs nothing again).
    async fn admit_later(self: Rc<Self>, bus: Bus, session: String) {
        let mut settling = self.settling(3);
        while self.next_try(&bus, &mut settling).await {
            // One admission of the session at a time: a delivery ending a turn admits too.
            let lock = self.session_lock(&session);
            let _working = lock.lock().await;
            let Ok(record) = self.get(&bus, TURN_SCOPE, &session).await else { continue };
            let mine = record["created_by"]["host"] == self.env.host.as_str();
            if record["status"] == "running" && record["step"] == 0 && record["plan"].is_null() && mine {
                self.enqueue_new_turn(&bus, record).await;
                return;
            }
            if self.try_admit(&bus, &session).await {
                return;
            }
        }
    }

    /// One try of [`Worker::admit`]: whether nothing is left owed (input admitted, none
    /// waiting, or the turn not ended).
    async fn try_admit(self: &Rc<Self>, bus: &Bus, session: &str) -> bool {
        let mut listed = None;
        for attempt in 0..3 {
            if let Ok(Value::Array(entries)) = self.call(bus, "state::list", json!({ "scope": INPUT_SCOPE })).await {
                listed = Some(entries);
                break;
            }
            self.back_off(attempt).await;
        }
        let Some(listed) = listed else { return false };
        let waiting: Vec<(String, Value)> = listed
            .into_iter()
            .filter(|e| e["value"]["session_id"] == session)
            .map(|e| (e["key"].as_str().unwrap_or_default().to_string(), e["value"]["message"].clone()))
            .collect();
        if waiting.is_empty() {
            return true;
        }
        let Ok(record) = self.get(bus, TURN_SCOPE, session).await else { return false };
        if record["status"].as_str().is_some_and(|s| !FINAL.contains(&s)) {
            return true;
        }
        // Input the ended turn was admitted from, whose removal did not land, is spent: removed
        // now, never admitted again.
        let spent: Vec<&str> =
            record["input_keys"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
        let (spent, waiting): (Vec<_>, Vec<_>) =
            waiting.into_iter().partition(|(key, _)| spent.contains(&key.as_str()));
        for (key, _) in &spent {
            self.remove_input(bus, key).await;
        }
        // A turn started meanwhile (another admission of the same input, or a send) makes this
        // round's decision stale: the next round reads again.
        waiting.is_empty() || matches!(self.start_turn(bus, session, &waiting, &record).await, Ok(Some(_)))
    }

    /// Removes an admitted input's entry, trying a few times.
    async fn remove_input(&self, bus: &Bus, key: &str) {
        for attempt in 0..3 {
            if self.call(bus, "state::delete", json!({ "scope": INPUT_SCOPE, "key": key })).await.is_ok() {
                return;
            }
            self.back_off(attempt).await;
        }
    }

    /// A new turn made of `input` (`(key, message)`): its record at step 0 naming the input, the
    /// messages into the transcript, the input's entries removed, the turn on the turn queue. A
    /// turn that cannot be enqueued is held, with why. Answers the new turn's id.
    ///
    /// The messages go into the transcript first (keyed by their input, so a repeat adds
    /// nothing), after the ended turn's answer: once the record exists, whoever takes the turn up finds them there, even if
    /// this worker dies before enqueueing it. The record names the worker that wrote it
    /// (`created_by`: its host and that host's start), so that host, if it dies before the
    /// turn reaches the queue, enqueues it when it starts again ([`Worker::recover_on_start`]).
    ///
    /// The caller decided on the session's record as it read it (`ended`, the turn that ended,
    /// or null): a write of the new record whose answer was lost is never made again over a turn
    /// another admission or a `send` started meanwhile ([`Worker::put_over`]), and `Ok(None)`
    /// says so: nothing was started. (A worker's own admissions of a session take its session
    /// lock, one at a time.)
    async fn start_turn(
        self: &Rc<Self>,
        bus: &Bus,
        session: &str,
        input: &[(String, Value)],
        ended: &Value,
    ) -> Result<Option<String>, String> {
        let turn_id = format!("turn-{}", self.env.new_id());
        let keys: Vec<&String> = input.iter().map(|(key, _)| key).collect();
        let record = json!({
            "session_id": session, "turn_id": turn_id, "status": "running", "step": 0, "input_keys": keys,
            "created_by": { "host": self.env.host, "incarnation": self.incarnation },
        });
        // The ended turn's answer goes first (kept once, by its key): the worker that ended it
        // may have died retrying its append, and once this record is written over the ended
        // one, nothing else says the answer is owed.
        let answer = &ended[ANSWER_FIELD];
        if answer.is_object() && !self.append(bus, &record, answer.clone()).await {
            return Err(format!("the answer of turn {} could not be put into the transcript", ended["turn_id"]));
        }
        for (key, message) in input {
            let mut entry = message.clone();
            if let Some(fields) = entry.as_object_mut() {
                fields.insert("entry_key".into(), json!(format!("input:{key}")));
                fields.entry("role").or_insert(json!("user"));
            }
            if !self.append(bus, &record, entry).await {
                return Err(format!("input {key} could not be put into the transcript"));
            }
        }
        if !self.put_over(bus, (TURN_SCOPE, session), &record, session, ended).await.map_err(|e| e.describe())? {
            return Ok(None);
        }
        for (key, _) in input {
            self.remove_input(bus, key).await;
        }
        self.enqueue_new_turn(bus, record).await;
        Ok(Some(turn_id))
    }

    /// At a worker's start, what an earlier start of this host may have died doing, that no
    /// delivery would finish:
    /// - a new turn it recorded and may not have put on the turn queue (running at step 0, no
    ///   round planned yet) is put there now, or held with why; one that did reach the queue is
    ///   then delivered twice, and the later delivery finds the turn under way or over and runs
    ///   nothing of it again;
    /// - input still queued behind a session's ended turn (the worker admitting it died, or was
    ///   cut off, between the transcript and the new turn's record) is admitted.
    ///
    /// The listings ride out a store that is down as the worker starts.
    pub(crate) async fn recover_on_start(self: Rc<Self>) {
        let bus = self.env.bus.clone();
        self.connected(&bus).await;
        let Some(turns) = self.list_settling(&bus, TURN_SCOPE).await else { return };
        let by_a_predecessor = |created_by: &Value| {
            created_by["host"] == self.env.host.as_str() && created_by["incarnation"] != self.incarnation.as_str()
        };
        let records: Vec<Value> = turns.into_iter().map(|entry| entry["value"].clone()).collect();
        let unqueued = records.iter().filter(|record| {
            record["status"] == "running"
                && record["step"] == 0
                && record["plan"].is_null()
                && by_a_predecessor(&record["created_by"])
        });
        for record in unqueued {
            self.enqueue_new_turn(&bus, record.clone()).await;
        }
        // Input behind a running or held turn is admitted when that turn ends.
        let ended: BTreeSet<&str> = records
            .iter()
            .filter(|record| record["status"].as_str().is_some_and(|s| FINAL.contains(&s)))
            .filter_map(|record| record["session_id"].as_str())
            .collect();
        if ended.is_empty() {
            return;
        }
        let Some(queued) = self.list_settling(&bus, INPUT_SCOPE).await else { return };
        let waiting: BTreeSet<&str> = queued
            .iter()
            .filter_map(|entry| entry["value"]["session_id"].as_str())
            .filter(|session| ended.contains(session))
            .collect();
        for session in waiting {
            let lock = self.session_lock(session);
            let _working = lock.lock().await;
            // Owned by another worker, which admits it itself.
            if self.own(&bus, session, false).await.is_err() {
                continue;
            }
            self.admit(&bus, session).await;
            self.release(&bus, session).await;
        }
    }

    /// Every entry at `scope`, asked for again on the settling schedule while the store does
    /// not answer.
    async fn list_settling(&self, bus: &Bus, scope: &str) -> Option<Vec<Value>> {
        let mut settling = self.settling(0);
        loop {
            if let Ok(Value::Array(entries)) = self.call(bus, "state::list", json!({ "scope": scope })).await {
                return Some(entries);
            }
            if !self.next_try(bus, &mut settling).await {
                return None;
            }
        }
    }

    /// Puts a new turn on the turn queue. A turn that cannot be enqueued is held, with why; when
    /// even the hold cannot be written, both are tried again in the background, further apart,
    /// so the turn is not left running with nobody to deliver it.
    pub(crate) async fn enqueue_new_turn(self: &Rc<Self>, bus: &Bus, record: Value) {
        let (Ok(session), Ok(turn_id)) = (text(&record, "session_id"), text(&record, "turn_id")) else { return };
        let Err(why) = self.enqueue(bus, &session, &turn_id).await else { return };
        if self.hold_unqueued(bus, &record, &why).await.is_err() {
            tokio::task::spawn_local(Rc::clone(self).enqueue_later(bus.clone(), record));
        }
    }

    async fn hold_unqueued(&self, bus: &Bus, record: &Value, why: &str) -> Result<(), String> {
        let mut held = record.clone();
        held["status"] = json!("held");
        held["held_reason"] = json!(format!("the new turn could not be put on the turn queue: {why}"));
        self.store(bus, TURN_SCOPE, record["session_id"].as_str().unwrap_or_default(), &held).await
    }

    async fn enqueue_later(self: Rc<Self>, bus: Bus, record: Value) {
        // Each round once this worker is connected to the engine: a round tried while it is cut
        // off fails at once.
        let mut settling = self.settling(3);
        while self.next_try(&bus, &mut settling).await {
            let Ok(stored) = self.get(&bus, TURN_SCOPE, record["session_id"].as_str().unwrap_or_default()).await else {
                continue;
            };
            // Delivered, held or followed meanwhile: nothing left to do.
            if stored["turn_id"] != record["turn_id"] || stored["status"] != "running" {
                return;
            }
            let (session, turn_id) = (text(&stored, "session_id"), text(&stored, "turn_id"));
            let (Ok(session), Ok(turn_id)) = (session, turn_id) else { return };
            let Err(why) = self.enqueue(&bus, &session, &turn_id).await else { return };
            if self.hold_unqueued(&bus, &stored, &why).await.is_ok() {
                return;
            }
        }
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
