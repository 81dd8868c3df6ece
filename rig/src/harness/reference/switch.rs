//! Harness switches: exporting a session to another harness and importing one from it.
//!
//! Export hands the session over (task record, unsettled actions with ids and keys, owner) and
//! gives up the lease; import takes ownership with a new token, reconciles every unsettled
//! action, holds what stays ambiguous, and continues the turn. A rollback is the same path back.

use super::actions::classify;
use super::ownership::OWNER_SCOPE;
use super::{error_body, is_terminal, Stop, TurnRequest, Worker};
use crate::bus::{Bus, ErrorBody};
use serde_json::{json, Value};
use std::rc::Rc;

/// The field of a turn record naming the harness a switch handed the session to (the host of
/// the worker that imported it); carried into every later turn of the session.
pub(super) const HARNESS_FIELD: &str = "harness";
/// The field of a running (or held, or paused) turn record naming the worker that exported its
/// session and has not seen it imported yet: that worker takes it back should no import come
/// ([`Worker::take_back`]), even if it has died and started again meanwhile.
const EXPORTED_BY: &str = "exported_by";

impl Worker {
    /// To whom the session was handed over, when that is not this worker: the harness its turn
    /// record names, or, after this worker exported it and before anyone imported it, whoever
    /// will import it. Such a worker starts and retries nothing for the session.
    pub(super) fn handed_to(&self, session_id: &str, record: Option<&Value>) -> Option<String> {
        let named = record.and_then(|r| r[HARNESS_FIELD].as_str()).filter(|host| *host != self.env.host);
        if let Some(host) = named {
            return Some(host.to_string());
        }
        let exported = record.is_some_and(|r| r[EXPORTED_BY] == json!(self.env.host));
        (exported || self.exported.borrow().contains(session_id)).then(|| "the harness that imports it".to_string())
    }

    /// The session as a bundle another harness can import: the task record, the actions not
    /// yet settled with their ids and keys, and the owner.
    pub(super) async fn export(self: &Rc<Self>, bus: &Bus, session_id: &str) -> Result<Value, ErrorBody> {
        let record = self.get_turn(bus, session_id).await.map_err(|e| ErrorBody::new("unavailable", e.to_string()))?;
        let record = record.ok_or_else(|| ErrorBody::new("not_found", format!("no task for session {session_id}")))?;
        if let Some(to) = self.handed_to(session_id, Some(&record)) {
            return Err(ErrorBody::new("not_owner", format!("the session was handed over to {to}")));
        }
        // From here on this worker starts nothing for the session: a hand-over stops new work.
        self.exported.borrow_mut().insert(session_id.to_string());
        let record = if is_terminal(&record) || !self.policy.recovers() {
            record
        } else {
            // Durably, for a turn still to be driven: should no import take it over, this worker
            // takes it back, whether or not it lives until then.
            let mut exported = record;
            exported[EXPORTED_BY] = json!(self.env.host);
            if let Err(error) = self.put_turn(bus, &exported).await {
                // A write whose answer was lost may have landed, and a mark in the record makes
                // this worker skip the turn for good: read it back. The mark found, the export
                // went through; a read that fails too leaves it unknown, so the hand-over is
                // watched as for an export (taken back unless an import comes).
                match self.get_turn(bus, session_id).await {
                    Ok(Some(stored)) if stored[EXPORTED_BY] == json!(self.env.host) => {}
                    Ok(_) => {
                        self.exported.borrow_mut().remove(session_id);
                        return Err(error_body("recording the export", &error));
                    }
                    Err(_) => {
                        self.watch_hand_over(bus, session_id);
                        let mut unknown = error_body("recording the export", &error);
                        unknown.message += "; it may have been recorded: the session is taken back unless imported";
                        return Err(unknown);
                    }
                }
            }
            exported
        };
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
        if !is_terminal(&record) {
            self.watch_hand_over(bus, session_id);
        }
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
        if result.is_err() {
            self.finish_import_later(bus, session_id);
        }
        result
    }

    /// An import that failed after its hand-over may have landed (the record names this harness
    /// now): its exporter takes back only a session no import took over, and the caller that
    /// asked for the switch may be gone, so nobody but this worker would drive the turn. The
    /// import is finished in the background ([`super::finalize::Retry`]) while the record names
    /// this harness and the turn is still running; one whose hand-over never landed is left to
    /// its exporter.
    fn finish_import_later(self: &Rc<Self>, bus: &Bus, session_id: &str) {
        let finishing = (session_id.to_string(), "import".to_string());
        if !self.policy.recovers() || !self.settling.borrow_mut().insert(finishing.clone()) {
            return;
        }
        let (worker, bus, session_id) = (Rc::clone(self), bus.clone(), session_id.to_string());
        tokio::task::spawn_local(async move {
            let host = json!(worker.env.host);
            let mut retry = worker.retry();
            let finished = loop {
                if !worker.next_try(&bus, &mut retry).await {
                    break false;
                }
                let record = match worker.get_turn(&bus, &session_id).await {
                    Ok(Some(record)) => record,
                    Ok(None) => break true,
                    Err(_) => continue,
                };
                let ours = record[HARNESS_FIELD] == host && record["status"] == json!("running");
                if !ours || worker.pending_terminal.borrow().contains_key(&session_id) {
                    // Not (or no longer) this worker's to drive, or its end is owed already.
                    break true;
                }
                let lock = worker.session_lock(&session_id);
                let _guard = lock.lock().await;
                if worker.ensure_ownership(&bus, &session_id).await.is_err() {
                    continue;
                }
                let again = worker.owned_import(&bus, &session_id, &json!({ "session_id": session_id })).await;
                worker.hand_back(&bus, &session_id).await;
                if again.is_ok() {
                    worker.note("import_finished", json!({ "session_id": session_id, "attempt": retry.attempt() }));
                    break true;
                }
            };
            worker.settling.borrow_mut().remove(&finishing);
            if !finished {
                worker.note("import_abandoned", json!({ "session_id": session_id, "attempts": retry.attempt() }));
            }
        });
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
        if let Some(flaw) = super::shape::turn_record_flaw(&record) {
            return Err(ErrorBody::new("bad_request", format!("the bundle's task is malformed: {flaw}")));
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
        if let Some(fields) = record.as_object_mut() {
            // Imported: no longer its exporter's to take back.
            fields.remove(EXPORTED_BY);
        }
        // The hand-over, durably: the session is this harness's now (recorded with the
        // reconciliation below, or on its own for an ended turn), and any other worker that
        // finds it so starts nothing for it.
        let ended = is_terminal(&record);
        if !ended {
            record[HARNESS_FIELD] = json!(self.env.host);
        }
        self.exported.borrow_mut().remove(session_id);
        match self.recover(bus, &mut record).await {
            Err(Stop::FencedOut) => return self.fenced_out(&request),
            Err(Stop::Failed(failure)) => return Err(error_body(&failure.during, &failure.error)),
            _ => {}
        }
        if ended {
            self.record_hand_over(bus, &mut record).await?;
        }
        let actions = classify(&record, &self.env.host);
        let held = actions["held"].as_array().map_or(0, Vec::len);
        if held > 0 {
            let reason = format!("{held} action(s) unresolved after reconciliation");
            return self.hold_turn(bus, &request, &reason).await;
        }
        if record["status"] != json!("running") {
            if ended {
                self.present_again(bus, &record).await;
            }
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

impl Worker {
    /// A switch left half done must not leave its turn to nobody: the import may never come (the
    /// client that asked for the switch went away, its import was dead-lettered, or failed once
    /// the client had stopped listening), and this worker has given the session up. Unless an
    /// import takes the turn over (the record names the harness that imported it) within
    /// `handover_ms`, this worker takes the session back and drives the turn on, trying until
    /// it has (an import under way holds the lease meanwhile, and its record then names it).
    fn watch_hand_over(self: &Rc<Self>, bus: &Bus, session_id: &str) {
        if !self.policy.recovers() || !self.handing_over.borrow_mut().insert(session_id.to_string()) {
            return;
        }
        let (worker, bus, session_id) = (Rc::clone(self), bus.clone(), session_id.to_string());
        tokio::task::spawn_local(async move {
            worker.env.clock.sleep(worker.env.config.handover_ms).await;
            let mut retry = worker.retry();
            let mut settled = worker.take_back(&bus, &session_id).await;
            while !settled && worker.next_try(&bus, &mut retry).await {
                settled = worker.take_back(&bus, &session_id).await;
            }
            worker.handing_over.borrow_mut().remove(&session_id);
            if !settled {
                worker
                    .note("take_back_abandoned", json!({ "session_id": session_id, "attempts": retry.attempt() + 1 }));
            }
        });
    }

    /// Takes an exported session back unless an import took it over: whether that is settled
    /// (taken back, imported, or imported here again). False: try again (the store or the lease
    /// did not let it, which an import under way may be holding).
    pub(super) async fn take_back(self: &Rc<Self>, bus: &Bus, session_id: &str) -> bool {
        let imported_elsewhere = |record: &Value| record[HARNESS_FIELD].as_str().is_some_and(|h| h != self.env.host);
        if !self.exported.borrow().contains(session_id) {
            // Imported here again (a rollback), or taken back already.
            return true;
        }
        // Read first, without the lease: a switch that went through is done with.
        match self.get_turn(bus, session_id).await {
            Ok(Some(record)) if !imported_elsewhere(&record) => {}
            Ok(_) => return true,
            Err(_) => return false,
        }
        let lock = self.session_lock(session_id);
        let _guard = lock.lock().await;
        if self.ensure_ownership(bus, session_id).await.is_err() {
            return false;
        }
        let record = match self.get_turn(bus, session_id).await {
            Ok(Some(record)) if !imported_elsewhere(&record) => record,
            Ok(_) => {
                self.hand_back(bus, session_id).await;
                return true;
            }
            Err(_) => {
                self.hand_back(bus, session_id).await;
                return false;
            }
        };
        let running = record["status"] == json!("running");
        let mut taken = record.clone();
        if let Some(fields) = taken.as_object_mut() {
            fields.remove(EXPORTED_BY);
        }
        if running {
            // No delivery may come for it again: this worker drives it on, and a worker of its
            // host that starts does, should this one die first.
            taken[super::DRIVEN_BY] = json!(self.env.host);
        }
        if taken != record && !is_terminal(&record) {
            taken["updated_at"] = json!(self.now());
            if self.put_turn(bus, &taken).await.is_err() {
                self.hand_back(bus, session_id).await;
                return false;
            }
        }
        self.exported.borrow_mut().remove(session_id);
        self.note(
            "session_taken_back",
            json!({ "session_id": session_id, "turn_id": record["turn_id"], "status": record["status"] }),
        );
        self.hand_back(bus, session_id).await;
        if running {
            let request = TurnRequest {
                session_id: session_id.to_string(),
                turn_id: record["turn_id"].as_str().unwrap_or_default().to_string(),
                step: record["step"].as_u64().unwrap_or(0),
            };
            let (worker, bus) = (Rc::clone(self), bus.clone());
            tokio::task::spawn_local(async move { worker.drive_on(&bus, request).await });
        }
        true
    }

    /// Sessions this worker's host exported and nobody imported (a worker that exported them
    /// died since): their hand-over is watched again, as by the worker that exported them.
    pub(super) fn watch_exported(self: &Rc<Self>, bus: &Bus, turns: &[Value]) {
        let host = json!(self.env.host);
        for record in turns.iter().map(|e| &e["value"]) {
            let (Some(session_id), false) = (record["session_id"].as_str(), is_terminal(record)) else { continue };
            let imported = record[HARNESS_FIELD].as_str().is_some_and(|h| h != self.env.host);
            if record[EXPORTED_BY] == host && !imported {
                self.exported.borrow_mut().insert(session_id.to_string());
                self.watch_hand_over(bus, session_id);
            }
        }
    }

    /// Names this harness in an ended turn's record. The store's guard refuses any change to an
    /// ended record, so this write goes without it, under this worker's fence: the one change
    /// an ended turn's record ever gets, and its status stays as it was.
    async fn record_hand_over(&self, bus: &Bus, record: &mut Value) -> Result<(), ErrorBody> {
        if record[HARNESS_FIELD] == json!(self.env.host) {
            return Ok(());
        }
        record[HARNESS_FIELD] = json!(self.env.host);
        let mut write = self.turn_write(record);
        if let Some(fields) = write.as_object_mut() {
            fields.remove("guard");
        }
        let timeout = self.env.config.session_timeout_ms;
        let written = match bus.invoke("state::set", write.clone(), timeout).await {
            Err(error) if error.outcome_unknown() => bus.invoke("state::set", write, timeout).await,
            other => other,
        };
        written.map(drop).map_err(|error| error_body("recording the hand-over", &error))
    }
}

/// Carries the session's hand-over from the turn before into a new turn record.
pub(super) fn carry_hand_over(before: Option<&Value>, turn: &mut Value) {
    if let Some(harness) = before.and_then(|r| r[HARNESS_FIELD].as_str()) {
        turn[HARNESS_FIELD] = json!(harness);
    }
}
