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
        Ok(json!({ "session_id": session, "bundle": { "turn": record, "actions": actions } }))
    }

    /// `{host}::import`: takes ownership and continues the session's turn from the store (the
    /// bundle is not needed: the store has everything), reconciling what was left unsettled.
    pub(crate) async fn import(self: &Rc<Self>, bus: &Bus, data: &Value) -> Result<Value, ErrorBody> {
        let session = text(data, "session_id")?;
        let lock = self.session_lock(&session);
        let _working = lock.lock().await;
        self.own(bus, &session, true).await?;
        let record = self.get(bus, TURN_SCOPE, &session).await.map_err(|e| ErrorBody::new("unavailable", e))?;
        let turn_id = record["turn_id"].as_str().unwrap_or_default().to_string();
        if !is_current(&record, &turn_id, 0) {
            self.release(bus, &session).await;
            return Ok(json!({ "session_id": session, "turn_id": record["turn_id"], "status": record["status"] }));
        }
        self.continue_turn(bus, record).await
    }
}
