//! A switch: `export` hands a session over, `import` takes it and continues its turn.

use crate::turn::{is_current, TURN_SCOPE};
use crate::{text, Worker, ACTION_SCOPE};
use rig::{Bus, ErrorBody};
use serde_json::{json, Value};
use std::rc::Rc;

impl Worker {
    /// `{host}::export`: a bundle of the session's turn and its planned actions, then the lease
    /// handed back; this worker does no more work on the session.
    pub(crate) async fn export(self: &Rc<Self>, bus: &Bus, data: &Value) -> Result<Value, ErrorBody> {
        let session = text(data, "session_id")?;
        let unavailable = |e: String| ErrorBody::new("unavailable", e);
        let record = self.get(bus, TURN_SCOPE, &session).await.map_err(unavailable)?;
        let mut actions = Vec::new();
        for call in record["plan"]["calls"].as_array().cloned().unwrap_or_default() {
            let id = call["action_id"].as_str().unwrap_or_default();
            actions.push(self.get(bus, ACTION_SCOPE, id).await.map_err(unavailable)?);
        }
        self.exported.borrow_mut().insert(session.clone());
        self.release(bus, &session).await;
        if record["status"] == "running" {
            tokio::task::spawn_local(Rc::clone(self).take_back_unless_imported(bus.clone(), record.clone()));
        }
        Ok(json!({ "session_id": session, "bundle": { "turn": record, "actions": actions } }))
    }

    /// The contract's switch left half done: an exported turn that no import has taken over
    /// within `handover_ms` (its record is still as it was exported) is taken back and continued
    /// here, tried with backoff (an import under way holds the lease) for `settle_within_ms`.
    async fn take_back_unless_imported(self: Rc<Self>, bus: Bus, exported: Value) {
        let session = exported["session_id"].as_str().unwrap_or_default().to_string();
        let config = &self.env.config;
        self.env.clock.sleep(config.handover_ms).await;
        let give_up_at = self.env.clock.now_ms().saturating_add(config.settle_within_ms);
        let mut attempt = 0;
        while self.exported.borrow().contains(&session) && self.env.clock.now_ms() < give_up_at {
            self.connected(&bus).await;
            if self.take_back(&bus, &session, &exported).await {
                return;
            }
            self.back_off(attempt).await;
            attempt += 1;
        }
    }

    /// One try of [`Self::take_back_unless_imported`]: whether it is settled (continued here, or
    /// found imported). An import that wrote the record took the turn over: the session stays
    /// handed over.
    async fn take_back(self: &Rc<Self>, bus: &Bus, session: &str, exported: &Value) -> bool {
        let lock = self.session_lock(session);
        let _working = lock.lock().await;
        match self.get(bus, TURN_SCOPE, session).await {
            Ok(record) if &record != exported => return true,
            Ok(_) => {}
            Err(_) => return false,
        }
        if self.own(bus, session, true).await.is_err() {
            self.exported.borrow_mut().insert(session.to_string());
            return false;
        }
        // Read again as owner: an import may have written it meanwhile.
        match self.get(bus, TURN_SCOPE, session).await {
            Ok(record) if &record == exported => {
                let _ = self.continue_turn(bus, record).await;
                true
            }
            other => {
                self.release(bus, session).await;
                self.exported.borrow_mut().insert(session.to_string());
                other.is_ok()
            }
        }
    }

    /// `{host}::import`: takes ownership and continues the session's turn from the store (the
    /// bundle is not needed: the store has everything), reconciling what was left unsettled.
    pub(crate) async fn import(self: &Rc<Self>, bus: &Bus, data: &Value) -> Result<Value, ErrorBody> {
        let session = text(data, "session_id")?;
        let lock = self.session_lock(&session);
        let _working = lock.lock().await;
        self.own(bus, &session, true).await?;
        let record = self.read_owned(bus, &session).await?;
        let turn_id = record["turn_id"].as_str().unwrap_or_default().to_string();
        if !is_current(&record, &turn_id, 0) {
            // Ended by a worker that may have died before its answer reached the transcript:
            // whoever takes the session over presents it (kept once, by its key).
            self.present(bus, &record).await;
            self.release(bus, &session).await;
            return Ok(json!({ "session_id": session, "turn_id": record["turn_id"], "status": record["status"] }));
        }
        self.continue_turn(bus, record).await
    }
}
