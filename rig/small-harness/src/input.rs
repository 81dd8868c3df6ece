//! Queued input (scope `harness_queue`, key `{session}:{id}`), admitted as a new turn once the
//! session's turn has ended: the new turn's record first (naming the input in `input_keys`, and
//! carrying the ended turn's answer), then that answer and its messages into the transcript, the entries removed, and the turn on the turn queue.
//! Each step is safe to do again, so whoever finds a new turn half admitted finishes it.

use crate::store::{ended, TRIES, TURN_SCOPE};
use crate::{Worker, ANSWER_FIELD, PREDECESSOR_ANSWER_FIELD};
use rig::{Action, Bus};
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::rc::Rc;

const INPUT_SCOPE: &str = "harness_queue";
/// How many more times a new turn that could be neither enqueued nor held is offered to the
/// turn queue in the background, further apart each time.
const LATER_ROUNDS: u32 = 6;

/// How far one attempt at admitting a session's input got.
enum Admitted {
    /// Nothing waits, or the session's turn has not ended: nothing to do.
    Nothing,
    /// The new turn is recorded, in the transcript and on the turn queue (or held).
    Done,
    /// Something could not be reached (a worker cut off from the engine, say): the new turn may
    /// be recorded without anybody else knowing it is there, or the input still waits.
    Unfinished,
}

impl Worker {
    /// Admits the session's waiting input as a new turn, if its turn has ended; what cannot be
    /// done now is done in the background once it can.
    pub(crate) async fn admit(self: &Rc<Self>, bus: &Bus, session: &str) {
        if let Admitted::Unfinished = self.admit_once(bus, session).await {
            tokio::task::spawn_local(Rc::clone(self).admit_later(bus.clone(), session.to_string()));
        }
    }

    async fn admit_once(self: &Rc<Self>, bus: &Bus, session: &str) -> Admitted {
        let Some(waiting) = self.waiting_input(bus, session).await else { return Admitted::Unfinished };
        if waiting.is_empty() {
            return Admitted::Nothing;
        }
        let Ok(record) = self.read_turn(bus, session).await else { return Admitted::Unfinished };
        if !ended(&record) && !rig::planted!("small-input-admitted-while-a-turn-runs") {
            // A new turn, recorded and not yet through admission, is finished; any other turn
            // under way admits the input itself when it ends.
            if record["status"] == "running" && record["step"] == 0 && !record["input_keys"].is_null() {
                return if self.finish_admission(bus, record).await { Admitted::Done } else { Admitted::Unfinished };
            }
            return Admitted::Nothing;
        }
        // Input the ended turn was itself admitted from is spent: its removal did not land.
        let spent: Vec<&str> = match rig::planted!("small-spent-input-admitted-again") {
            true => Vec::new(),
            false => record["input_keys"].as_array().into_iter().flatten().filter_map(Value::as_str).collect(),
        };
        let (spent, waiting): (Vec<_>, Vec<_>) =
            waiting.into_iter().partition(|(key, _)| spent.contains(&key.as_str()));
        for (key, _) in &spent {
            self.remove_input(bus, key).await;
        }
        if waiting.is_empty() {
            return Admitted::Nothing;
        }
        let keys: Vec<&String> = waiting.iter().map(|(key, _)| key).collect();
        if rig::planted!("small-input-removed-before-admission") {
            // (The planted bug: the entries are taken off the queue first, then the turn is made.)
            for key in &keys {
                self.remove_input(bus, key).await;
            }
        }
        let mut successor = json!({
            "session_id": session, "turn_id": format!("turn-{}", self.env.new_id()), "status": "running", "step": 0,
            "input_keys": keys, "after": record["turn_id"],
        });
        if record[ANSWER_FIELD].is_object() {
            successor[PREDECESSOR_ANSWER_FIELD] = record[ANSWER_FIELD].clone();
        }
        // (The planted bug: the record written without the keys, "the worker admitting it has them".)
        let mut written = successor.clone();
        if let Some(fields) =
            written.as_object_mut().filter(|_| rig::planted!("small-admitted-input-not-named-by-its-turn"))
        {
            fields.remove("input_keys");
        }
        if self.write_turn(bus, &written, TRIES).await.is_err() {
            // Its write may have landed all the same, with nobody to know it.
            return Admitted::Unfinished;
        }
        if self.finish_admission(bus, successor).await {
            Admitted::Done
        } else {
            Admitted::Unfinished
        }
    }

    /// At a worker's start: input still queued for a session whose worker died admitting it is
    /// admitted now, since no delivery would do it again: behind an ended turn, or named by a
    /// new turn this harness recorded (`after` its predecessor) that may never have reached the
    /// turn queue. Input behind a turn under way waits for that turn's end, so the queued input
    /// is listed only when some session's turn is in one of those two states. The listings
    /// ride out a store that is down as the worker starts, for `settle_within_ms`.
    pub(crate) async fn recover_on_start(self: Rc<Self>) {
        let bus = self.env.bus.clone();
        self.connected(&bus).await;
        let give_up_at = self.env.clock.now_ms().saturating_add(self.env.config.settle_within_ms);
        let Some(turns) = self.list_until(&bus, TURN_SCOPE, give_up_at).await else { return };
        let admitting =
            |record: &Value| record["status"] == "running" && record["step"] == 0 && !record["after"].is_null();
        let sessions: BTreeSet<String> = turns
            .iter()
            .map(|entry| &entry["value"])
            .filter(|record| ended(record) || admitting(record))
            .filter_map(|record| record["session_id"].as_str().map(str::to_string))
            .collect();
        if sessions.is_empty() {
            return;
        }
        let Some(queued) = self.list_until(&bus, INPUT_SCOPE, give_up_at).await else { return };
        let admitted = |session: &str| {
            turns.iter().map(|entry| &entry["value"]).any(|record| record["session_id"] == session && admitting(record))
        };
        for session in sessions {
            let waiting = queued.iter().any(|entry| entry["value"]["session_id"] == session.as_str());
            // A new turn whose input is all removed already may still be off the turn queue (its
            // worker died between the last removal and the enqueue): finished too.
            if !waiting && !admitted(&session) {
                continue;
            }
            let lock = self.session_lock(&session);
            let _working = lock.lock().await;
            // Owned by another worker, which admits it itself.
            if self.own(&bus, &session).await.is_err() {
                continue;
            }
            if waiting {
                self.admit(&bus, &session).await;
            } else if let Ok(record) = self.read_turn(&bus, &session).await {
                // (Not one this start of the worker admitted itself meanwhile.)
                let ours = record["turn_id"].as_str().is_some_and(|id| self.enqueued.borrow().contains(id));
                if admitting(&record) && !ours {
                    self.finish_admission_or_later(&bus, record).await;
                }
            }
            self.release(&bus, &session).await;
        }
    }

    /// Every entry at `scope`, asked for again, further apart, while the store does not answer,
    /// until `give_up_at`.
    async fn list_until(&self, bus: &Bus, scope: &str, give_up_at: u64) -> Option<Vec<Value>> {
        let mut attempt = 0;
        loop {
            if let Ok(Value::Array(entries)) = self.call(bus, "state::list", json!({ "scope": scope })).await {
                return Some(entries);
            }
            if self.env.clock.now_ms() >= give_up_at {
                return None;
            }
            self.back_off(attempt).await;
            attempt += 1;
            self.connected(bus).await;
        }
    }

    /// Admits again, further apart, each time once this worker is connected to the engine, until
    /// an attempt gets through: a worker cut off while admitting would otherwise leave the input
    /// waiting, or a new turn recorded that nobody delivers.
    async fn admit_later(self: Rc<Self>, bus: Bus, session: String) {
        for round in 0..LATER_ROUNDS {
            self.back_off(round + 3).await;
            self.connected(&bus).await;
            if !matches!(self.admit_once(&bus, &session).await, Admitted::Unfinished) {
                return;
            }
        }
    }

    /// Finishes a new turn's admission found half done (by a delivery that is not current), or
    /// in the background once it can.
    pub(crate) async fn finish_admission_or_later(self: &Rc<Self>, bus: &Bus, record: Value) {
        let session = record["session_id"].as_str().unwrap_or_default().to_string();
        if !self.finish_admission(bus, record).await {
            tokio::task::spawn_local(Rc::clone(self).admit_later(bus.clone(), session));
        }
    }

    /// The rest of a new turn's admission, from its record: its predecessor's answer, then its
    /// input's messages into the transcript (each kept once, by its key), their entries removed,
    /// the turn on the turn queue (or held, saying why). False when it could not get that far.
    async fn finish_admission(self: &Rc<Self>, bus: &Bus, record: Value) -> bool {
        let session = record["session_id"].as_str().unwrap_or_default().to_string();
        let answer = &record[PREDECESSOR_ANSWER_FIELD];
        if answer.is_object() && !self.append(bus, &session, answer.clone()).await {
            return false;
        }
        let keys: Vec<String> = record["input_keys"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .map(str::to_string)
            .collect();
        for key in &keys {
            let Ok(entry) = self.read(bus, INPUT_SCOPE, key).await else { return false };
            if entry.is_null() {
                continue;
            }
            let mut message = entry["message"].clone();
            if let Some(fields) = message.as_object_mut() {
                fields.insert("entry_key".into(), json!(format!("input:{key}")));
                fields.entry("role").or_insert(json!("user"));
            }
            // (The planted bug: the entry removed first, "it is in the turn record already".)
            if rig::planted!("small-input-removed-before-its-message-is-appended") {
                self.remove_input(bus, key).await;
            }
            if !self.append(bus, &session, message).await {
                return false;
            }
            self.remove_input(bus, key).await;
        }
        let Err(why) = self.enqueue(bus, &record).await else {
            self.enqueued.borrow_mut().insert(record["turn_id"].as_str().unwrap_or_default().to_string());
            return true;
        };
        // (The planted bug: "it is recorded, so it will run": a turn nobody delivers left running.)
        if rig::planted!("small-unqueued-turn-left-running") {
            return true;
        }
        if self.hold_unqueued(bus, &record, &why).await.is_err() {
            tokio::task::spawn_local(Rc::clone(self).enqueue_later(bus.clone(), record));
        }
        true
    }

    /// The session's waiting input, by key, oldest key first; `None` when it cannot be listed.
    async fn waiting_input(&self, bus: &Bus, session: &str) -> Option<Vec<(String, Value)>> {
        for attempt in 0..TRIES {
            if let Ok(Value::Array(entries)) = self.call(bus, "state::list", json!({ "scope": INPUT_SCOPE })).await {
                let mut waiting: Vec<(String, Value)> = entries
                    .into_iter()
                    .filter(|entry| entry["value"]["session_id"] == session)
                    .map(|entry| (entry["key"].as_str().unwrap_or_default().to_string(), entry["value"].clone()))
                    .collect();
                waiting.sort_by(|a, b| a.0.cmp(&b.0));
                return Some(waiting);
            }
            self.back_off(attempt).await;
        }
        None
    }

    async fn remove_input(&self, bus: &Bus, key: &str) {
        for attempt in 0..TRIES {
            if self.call(bus, "state::delete", json!({ "scope": INPUT_SCOPE, "key": key })).await.is_ok() {
                return;
            }
            self.back_off(attempt).await;
        }
    }

    /// Puts a new turn on the turn queue, as many times as the settings say.
    async fn enqueue(&self, bus: &Bus, record: &Value) -> Result<(), String> {
        let queue = Action::Enqueue { queue: self.env.config.turn_queue.clone() };
        let step = record["step"].as_u64().unwrap_or(0);
        let delivery = json!({ "session_id": record["session_id"], "turn_id": record["turn_id"], "step": step });
        let mut last = String::new();
        for attempt in 0..self.env.config.enqueue_attempts.max(1) {
            let sent = bus
                .invoke_with(
                    &self.env.function("turn"),
                    delivery.clone(),
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

    /// Puts a delivery of a running turn back on the turn queue once this worker is connected
    /// again, while the turn is still running.
    pub(crate) async fn deliver_again_later(self: Rc<Self>, bus: Bus, delivery: Value) {
        let session = delivery["session_id"].as_str().unwrap_or_default().to_string();
        for round in 0..LATER_ROUNDS {
            self.connected(&bus).await;
            let Ok(stored) = self.read_turn(&bus, &session).await else {
                self.back_off(round + 3).await;
                continue;
            };
            if stored["turn_id"] != delivery["turn_id"] || stored["status"] != "running" {
                return;
            }
            if self.enqueue(&bus, &delivery).await.is_ok() {
                return;
            }
            self.back_off(round + 3).await;
        }
    }

    /// A new turn nobody will deliver is held, with why, rather than left running.
    async fn hold_unqueued(&self, bus: &Bus, record: &Value, why: &str) -> Result<(), String> {
        let mut held = record.clone();
        held["status"] = json!("held");
        held["held_reason"] = json!(format!("the new turn could not be put on the turn queue: {why}"));
        self.write_turn(bus, &held, TRIES).await.map_err(|unwritten| unwritten.why())
    }

    /// Tries again, further apart, while the new turn is still running and undelivered: an
    /// outage longer than the first tries would otherwise leave it to nobody.
    async fn enqueue_later(self: Rc<Self>, bus: Bus, record: Value) {
        let session = record["session_id"].as_str().unwrap_or_default().to_string();
        for round in 0..LATER_ROUNDS {
            self.back_off(round + 3).await;
            // A round tried while this worker is cut off from the engine fails at once: wait for
            // the connection first, so that an outage longer than every backoff together does
            // not use the rounds up.
            self.connected(&bus).await;
            let Ok(stored) = self.read_turn(&bus, &session).await else { continue };
            if stored["turn_id"] != record["turn_id"] || stored["status"] != "running" {
                return;
            }
            let Err(why) = self.enqueue(&bus, &stored).await else { return };
            if self.hold_unqueued(&bus, &stored, &why).await.is_ok() {
                return;
            }
        }
    }
}
