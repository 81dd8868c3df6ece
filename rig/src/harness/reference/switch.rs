//! Harness switches: exporting a session to another harness and importing one from it.
//!
//! Export hands the session over (task record, unsettled actions with ids and keys, owner) and
//! gives up the lease; import takes ownership with a new token, reconciles every unsettled
//! action, holds what stays ambiguous, and continues the turn. A rollback is the same path back.

use super::actions::classify;
use super::ownership::OWNER_SCOPE;
use super::{error_body, Stop, TurnRequest, Worker};
use crate::bus::{Bus, ErrorBody};
use serde_json::{json, Value};
use std::rc::Rc;

impl Worker {
    /// The session as a bundle another harness can import: the task record, the actions not
    /// yet settled with their ids and keys, and the owner.
    pub(super) async fn export(&self, bus: &Bus, session_id: &str) -> Result<Value, ErrorBody> {
        let record = self.get_turn(bus, session_id).await.map_err(|e| ErrorBody::new("unavailable", e.to_string()))?;
        let record = record.ok_or_else(|| ErrorBody::new("not_found", format!("no task for session {session_id}")))?;
        let lease = bus
            .invoke(
                "state::get-lease",
                json!({ "scope": OWNER_SCOPE, "key": session_id }),
                self.env.config.session_timeout_ms,
            )
            .await
            .unwrap_or(Value::Null);
        let owner = lease["owner"].as_str().unwrap_or(&self.env.host).to_string();
        // Handing over: this worker gives up the lease so the replacement can take it now.
        self.release_lease(bus, session_id).await;
        let actions = classify(&record, &owner);
        self.note("session_exported", json!({ "session_id": session_id, "actions": actions }));
        Ok(
            json!({ "session_id": session_id, "task": record, "actions": actions, "owner": lease, "exported_by": self.env.host }),
        )
    }

    /// Takes over a session exported by another harness: ownership first (a new token), then
    /// reconciliation of every unsettled action, then the turn goes on, unless something is held.
    pub(super) async fn import(self: &Rc<Self>, bus: &Bus, data: &Value) -> Result<Value, ErrorBody> {
        let session_id =
            data["session_id"].as_str().ok_or_else(|| ErrorBody::new("bad_request", "missing `session_id`"))?;
        let lock = self.session_lock(session_id);
        let _guard = lock.lock().await;
        if let Err(not_owner) = self.ensure_ownership(bus, session_id).await {
            // An error, not a skip: whoever asked for the switch (a queue, an operator) must try
            // again once the session's owner has let go.
            let reason = not_owner.reason();
            return Err(ErrorBody::new("not_owner", format!("cannot import {session_id}: {reason}")));
        }
        let result = self.owned_import(bus, session_id, data).await;
        // Held actions keep their recorded owner; a finished or held turn needs no owner.
        self.hand_back(bus, session_id).await;
        result
    }

    /// An import once this worker owns the session.
    async fn owned_import(self: &Rc<Self>, bus: &Bus, session_id: &str, data: &Value) -> Result<Value, ErrorBody> {
        let mut record = match self.get_turn(bus, session_id).await {
            Ok(Some(record)) => record,
            Ok(None) => data["bundle"]["task"].clone(),
            Err(error) => return Err(error_body("get_turn", &error)),
        };
        if record.is_null() {
            return Err(ErrorBody::new("not_found", format!("no task for session {session_id}")));
        }
        let request = TurnRequest {
            session_id: session_id.to_string(),
            turn_id: record["turn_id"].as_str().unwrap_or_default().to_string(),
            step: record["step"].as_u64().unwrap_or(0),
        };
        self.note(
            "session_imported",
            json!({ "session_id": session_id, "turn_id": request.turn_id, "token": self.lease_token(session_id) }),
        );
        if record["status"] == json!("held") {
            // Held actions are reconciled again on every import; the turn resumes if they settle.
            record["status"] = json!("running");
        }
        match self.recover(bus, &mut record).await {
            Err(Stop::FencedOut) => return self.fenced_out(&request),
            Err(Stop::Failed(failure)) => return Err(error_body(&failure.during, &failure.error)),
            _ => {}
        }
        let actions = classify(&record, &self.env.host);
        let held = actions["held"].as_array().map_or(0, Vec::len);
        if held > 0 {
            let reason = format!("{held} action(s) unresolved after reconciliation");
            return self.hold_turn(bus, &request, &reason).await;
        }
        if record["status"] != json!("running") {
            return Ok(
                json!({ "imported": true, "session_id": session_id, "status": record["status"], "actions": actions }),
            );
        }
        // A switch takes the turn up again: its commands and its budget carry over.
        self.load_commands(bus, session_id, &request.turn_id).await;
        if let Err(stop) = self.resume_budget(bus, &mut record).await {
            return self.stopped(bus, &request, stop).await;
        }
        let mut result = self.finish(bus, &request, record).await?;
        result["imported"] = json!(true);
        Ok(result)
    }
}
