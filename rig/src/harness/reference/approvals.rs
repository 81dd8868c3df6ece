//! Approvals that expire: a hook that holds a call may give the hold an expiry
//! (`expires_in_ms` in its reply). The held call carries its expiry in the turn record
//! (`expires_at_ms`, on the harness's clock), so it outlives the worker that held it. Past it,
//! the call is denied, once: recorded `failed` with "approval expired", its error result goes
//! into the transcript and the turn is driven on (the model hears that the call did not run). A
//! release that comes after the expiry finds nothing to run.
//!
//! The worker that holds a call waits out its expiry in the background; a worker that starts
//! waits out the expiries of every held turn it finds, so a crash in between loses nothing. Two
//! workers waiting for the same expiry deny it once: the second finds the call no longer held.
//!
//! Known-bad, `in-memory-expiry`: the expiry is kept in the holding worker's memory only, so a
//! crash loses it: the turn stays held past its expiry, and a late release runs the call.

use super::{Policy, TurnRequest, Worker};
use crate::bus::Bus;
use serde_json::{json, Value};
use std::rc::Rc;

/// The field of a held call that carries when its approval expires.
pub(super) const EXPIRES_AT: &str = "expires_at_ms";

impl Worker {
    /// Records when the approval of the held call `entry` (action `id`) expires: in the record,
    /// or, under `in-memory-expiry`, in this worker's memory.
    pub(super) fn record_expiry(&self, entry: &mut Value, id: &str, expires_in_ms: Option<u64>) {
        let Some(expires_in_ms) = expires_in_ms else { return };
        let at = self.now().saturating_add(expires_in_ms);
        if self.policy == Policy::InMemoryExpiry {
            self.expiries.borrow_mut().insert(id.to_string(), at);
        } else {
            entry[EXPIRES_AT] = json!(at);
        }
    }

    /// When the approval of the held call `entry` (action `id`) expires, if it does.
    pub(super) fn expires_at(&self, entry: &Value, id: &str) -> Option<u64> {
        entry[EXPIRES_AT].as_u64().or_else(|| self.expiries.borrow().get(id).copied())
    }

    /// Whether the held call's approval has expired by now.
    pub(super) fn approval_expired(&self, entry: &Value, id: &str) -> bool {
        entry["status"] == json!("held") && self.expires_at(entry, id).is_some_and(|at| at <= self.now())
    }

    /// Waits out, in the background, the expiry of every held call of `record` that has one.
    pub(super) fn watch_approvals(self: &Rc<Self>, bus: &Bus, record: &Value) {
        let (Some(session_id), Some(turn_id)) = (record["session_id"].as_str(), record["turn_id"].as_str()) else {
            return;
        };
        let Some(calls) = record["calls"].as_object() else { return };
        for (id, entry) in calls.iter().filter(|(_, entry)| entry["status"] == json!("held")) {
            let Some(at) = self.expires_at(entry, id) else { continue };
            let (worker, bus) = (Rc::clone(self), bus.clone());
            let request = TurnRequest { session_id: session_id.to_string(), turn_id: turn_id.to_string(), step: 0 };
            let id = id.clone();
            tokio::task::spawn_local(async move {
                worker.env.clock.sleep(at.saturating_sub(worker.now())).await;
                worker.expire_when_due(&bus, request, &id).await;
            });
        }
    }

    /// Denies the held call `id` of the request's turn if its approval has expired and it is
    /// still held (by now it may have been released, denied or expired by another worker).
    async fn expire_when_due(self: &Rc<Self>, bus: &Bus, request: TurnRequest, id: &str) {
        let lock = self.session_lock(&request.session_id);
        let _guard = lock.lock().await;
        if self.ensure_ownership(bus, &request.session_id).await.is_err() {
            return;
        }
        if let Ok(Some(record)) = self.get_turn(bus, &request.session_id).await {
            let current = record["turn_id"] == json!(request.turn_id) && record["status"] == json!("held");
            if current && self.approval_expired(&record["calls"][id], id) {
                let current = TurnRequest { step: record["step"].as_u64().unwrap_or(0), ..request.clone() };
                let _ = self.expire(bus, &current, record, id).await;
            }
        }
        self.hand_back(bus, &request.session_id).await;
    }

    /// Denies the held call `id`, whose approval expired, and drives its turn on: the call is
    /// recorded `failed`, so its error result enters the transcript and nothing runs it later.
    pub(super) async fn expire(
        self: &Rc<Self>,
        bus: &Bus,
        request: &TurnRequest,
        mut record: Value,
        id: &str,
    ) -> Result<Value, crate::bus::ErrorBody> {
        let at = self.expires_at(&record["calls"][id], id).unwrap_or_default();
        let entry = &mut record["calls"][id];
        if self.policy == Policy::RunOnExpiry {
            // The known-bad: an approval nobody gave in time is taken as given, and the call runs.
            *entry = json!({ "tool": entry["tool"], "args": entry["args"], "status": "released" });
        } else {
            let error = format!("approval expired at {at} ms: the call was not run");
            *entry = json!({ "tool": entry["tool"], "args": entry["args"], "status": "failed", "error": error, "expired": true });
        }
        record["status"] = json!("running");
        record["held_reason"] = Value::Null;
        // As after a release, no queue delivers the turn from here on: this worker drives it on,
        // and a worker of this host that starts drives it on again should this one die first.
        record[super::DRIVEN_BY] = json!(self.env.host);
        if self.write(bus, &record).await.is_err() {
            // The store may have recorded it all the same: then nobody else would drive it on.
            self.finish_settlement_later(bus, request, id, super::hooks::Settlement::Expiry);
            return Err(crate::bus::ErrorBody::new("unavailable", "could not record the expiry"));
        }
        self.expiries.borrow_mut().remove(id);
        self.note("approval_expired", json!({ "action_id": id, "expired_at_ms": at }));
        self.finish(bus, request, record).await
    }
}
