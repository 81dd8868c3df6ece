//! The reference harness turn loop, with its failure-finalisation behaviour as a named policy.
//!
//! A turn reads its record, reads the session's messages, calls the model and finalises: it
//! writes the terminal record, presents the outcome on the session (best effort), and reseeds
//! input that was queued meanwhile as a new turn. What differs between policies is only what
//! happens when finalisation itself fails:
//!
//! - `swallow`, as the released 1.8.13 binary of incident 001: a read error while finalising
//!   becomes "no record", and a failed finalisation becomes `running, skipped, no next_step`.
//! - `propagate`, the seed's later main: errors surface to the caller, under a per-session lock.
//! - `reference`: propagate, plus a timed-out terminal write is confirmed by one exact
//!   whole-record readback, an unconfirmed finalisation is retried later as terminalisation
//!   only (never re-running model or tool steps), and an exhausted reseed enqueue is surfaced
//!   and the new turn held with its reason instead of left running.
//! - `unguarded`: reference finalisation without the stale-turn guard: it trusts every
//!   delivery and marks the delivered turn running at the delivered step before running it,
//!   so a redelivered old turn is resurrected over its successor.
//!
//! And three known-bad recovery policies for a harness switch (reference behaviour otherwise):
//! - `replay-unfinished`: on import, sends every unfinished action again as it is, blindly;
//! - `fresh-key`: on import, mints a new idempotency key for every unfinished action;
//! - `no-fencing`: holds leases but attaches no fencing token to writes or effects.

use super::ownership::HeldLease;
use super::{Harness, HarnessEnv};
use crate::bus::{Action, Answer, Bus, ErrorBody, Invocation, InvokeError, Provider};
use crate::sim::streams::uuid;
use serde::Deserialize;
use serde_json::{json, Value};
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;

const TURN_SCOPE: &str = "harness_turn";
const QUEUE_SCOPE: &str = "harness_queue";
const TERMINAL: [&str; 3] = ["completed", "failed", "cancelled"];
const TERMINALIZE_BACKOFF_MS_MAX: u64 = 5_000;

/// How the reference harness behaves when finalising a turn fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Policy {
    Swallow,
    Propagate,
    Reference,
    Unguarded,
    ReplayUnfinished,
    FreshKey,
    NoFencing,
}

impl Policy {
    pub const ALL: [Policy; 7] = [
        Policy::Swallow,
        Policy::Propagate,
        Policy::Reference,
        Policy::Unguarded,
        Policy::ReplayUnfinished,
        Policy::FreshKey,
        Policy::NoFencing,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Policy::Swallow => "swallow",
            Policy::Propagate => "propagate",
            Policy::Reference => "reference",
            Policy::Unguarded => "unguarded",
            Policy::ReplayUnfinished => "replay-unfinished",
            Policy::FreshKey => "fresh-key",
            Policy::NoFencing => "no-fencing",
        }
    }

    /// Whether failed finalisation is confirmed, retried and surfaced (the reference behaviour).
    fn recovers(self) -> bool {
        !matches!(self, Policy::Swallow | Policy::Propagate)
    }

    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|p| p.name() == name)
    }

    fn locks_sessions(self) -> bool {
        self != Policy::Swallow
    }
}

#[derive(Debug, Clone, Deserialize)]
struct TurnRequest {
    session_id: String,
    turn_id: String,
    step: u64,
}

/// The terminal state a deferred terminalisation must record.
#[derive(Debug, Clone)]
enum Intent {
    /// The exact record whose write could not be confirmed; it is written again unchanged.
    Record(Value),
    /// The turn failed, but its record could not even be read; build the failed record from
    /// whatever is read later, with the original cause.
    Failed { cause: String },
}

/// A step of the turn that failed, and how.
#[derive(Debug, Clone)]
pub(super) struct StepFailure {
    pub during: &'static str,
    pub error: InvokeError,
}

/// Why driving a turn stopped before it could be completed.
#[derive(Debug, Clone)]
pub(super) enum Stop {
    /// A step failed: the turn is finalised as failed.
    Failed(StepFailure),
    /// An action's outcome cannot be established: the turn is held for a person.
    Held { reason: String },
    /// A newer owner holds the session: this worker must not write anything more.
    FencedOut,
}

impl StepFailure {
    fn summary(&self) -> String {
        format!("{}: {}", self.during, self.error)
    }
}

/// The reference harness, started afresh on every (re)start of its host.
pub struct ReferenceHarness {
    pub(super) policy: Policy,
    pub(super) env: HarnessEnv,
    session_locks: RefCell<BTreeMap<String, Rc<tokio::sync::Mutex<()>>>>,
    pub(super) leases: RefCell<BTreeMap<String, HeldLease>>,
    /// The token last granted per session, kept after the lease is gone.
    pub(super) tokens: RefCell<BTreeMap<String, u64>>,
}

impl ReferenceHarness {
    pub fn new(policy: Policy, env: HarnessEnv) -> Rc<Self> {
        Rc::new(Self {
            policy,
            env,
            session_locks: RefCell::default(),
            leases: RefCell::default(),
            tokens: RefCell::default(),
        })
    }

    pub(super) fn note(&self, what: &str, detail: Value) {
        (self.env.note)(what, detail);
    }

    /// This worker's own function of the given name (`harness::turn` on host `harness`).
    fn function(&self, name: &str) -> String {
        format!("{}::{name}", self.env.host)
    }

    pub(super) fn now(&self) -> u64 {
        self.env.clock.now_ms()
    }

    fn session_lock(&self, session_id: &str) -> Rc<tokio::sync::Mutex<()>> {
        Rc::clone(self.session_locks.borrow_mut().entry(session_id.to_string()).or_default())
    }

    async fn turn(self: &Rc<Self>, bus: &Bus, request: TurnRequest) -> Result<Value, ErrorBody> {
        let lock = self.session_lock(&request.session_id);
        let _guard = if self.policy.locks_sessions() { Some(lock.lock().await) } else { None };
        if let Err(not_owner) = self.ensure_ownership(bus, &request.session_id).await {
            return Ok(not_owner);
        }
        let record = self.get_turn(bus, &request.session_id).await.map_err(|e| error_body("get_turn", &e))?;
        let record = match (self.policy, record) {
            (Policy::Unguarded, Some(record)) => Some(self.resume_as_delivered(bus, &request, record).await?),
            (_, record) => record,
        };
        let Some(record) = record.filter(|r| is_current(r, &request)) else {
            // The stale-turn guard: a delivery for a turn that is no longer current does nothing.
            self.note(
                "stale_turn_skipped",
                json!({ "session_id": request.session_id, "turn_id": request.turn_id, "step": request.step }),
            );
            return Ok(self.skipped(&request, "stale"));
        };
        self.finish(bus, &request, record).await
    }

    /// Drives a current turn to its end and finalises it by how it ended.
    async fn finish(self: &Rc<Self>, bus: &Bus, request: &TurnRequest, record: Value) -> Result<Value, ErrorBody> {
        let result = match self.drive(bus, record).await {
            Ok((record, reply)) => self.complete(bus, request, record, reply).await,
            Err(Stop::Failed(failure)) => self.fail_turn(bus, request, failure).await,
            Err(Stop::Held { reason }) => self.hold_turn(bus, request, &reason).await,
            Err(Stop::FencedOut) => Ok(self.fenced_out(request)),
        };
        // The turn is over: ownership covers a turn's work, so it is handed back, unless a
        // terminalisation is still pending (it will need the token).
        if result.as_ref().is_ok_and(|r| r["finalized"] != json!(false)) {
            self.release_lease(bus, &request.session_id).await;
        }
        result
    }

    fn fenced_out(&self, request: &TurnRequest) -> Value {
        json!({
            "session_id": request.session_id, "turn_id": request.turn_id, "status": "fenced",
            "skipped": true, "next_step": null, "reason": "a newer owner holds the session",
        })
    }

    /// Holds a turn whose actions cannot be settled: durably, with its reason and what is
    /// unresolved, so a person can decide.
    async fn hold_turn(self: &Rc<Self>, bus: &Bus, request: &TurnRequest, reason: &str) -> Result<Value, ErrorBody> {
        let mut record = match self.get_turn(bus, &request.session_id).await {
            Ok(Some(record)) if is_current(&record, request) || record["status"] == json!("running") => record,
            _ => return Ok(self.skipped(request, "not current")),
        };
        record["status"] = json!("held");
        record["held_reason"] = json!(reason);
        record["updated_at"] = json!(self.now());
        if let Err(Stop::FencedOut) = self.write(bus, &record).await {
            return Ok(self.fenced_out(request));
        }
        let actions = super::actions::classify(&record, &self.env.host);
        self.note(
            "turn_held",
            json!({ "session_id": request.session_id, "turn_id": request.turn_id, "reason": reason }),
        );
        Ok(json!({
            "session_id": request.session_id, "turn_id": request.turn_id, "status": "held", "skipped": false,
            "next_step": null, "reason": reason, "actions": actions,
        }))
    }

    /// Takes over a session exported by another harness: ownership first (a new token), then
    /// reconciliation of every unsettled action, then the turn goes on, unless something is held.
    async fn import(self: &Rc<Self>, bus: &Bus, data: &Value) -> Result<Value, ErrorBody> {
        let session_id =
            data["session_id"].as_str().ok_or_else(|| ErrorBody::new("bad_request", "missing `session_id`"))?;
        let lock = self.session_lock(session_id);
        let _guard = lock.lock().await;
        if let Err(not_owner) = self.ensure_ownership(bus, session_id).await {
            return Ok(json!({ "imported": false, "session_id": session_id, "reason": not_owner["reason"] }));
        }
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
            Err(Stop::FencedOut) => return Ok(self.fenced_out(&request)),
            Err(Stop::Failed(failure)) => return Err(error_body(failure.during, &failure.error)),
            _ => {}
        }
        let actions = super::actions::classify(&record, &self.env.host);
        if !actions["held"].as_array().is_none_or(|held| held.is_empty()) {
            let reason =
                format!("{} action(s) unresolved after reconciliation", actions["held"].as_array().map_or(0, Vec::len));
            let held = self.hold_turn(bus, &request, &reason).await;
            // Waiting for a person is not work: ownership is handed back, and the held actions
            // keep their recorded owner.
            self.release_lease(bus, session_id).await;
            return held;
        }
        if record["status"] != json!("running") {
            return Ok(
                json!({ "imported": true, "session_id": session_id, "status": record["status"], "actions": actions }),
            );
        }
        let mut result = self.finish(bus, &request, record).await?;
        result["imported"] = json!(true);
        Ok(result)
    }

    /// The unguarded policy's bug: whatever the durable record says, the delivery is taken as
    /// the truth and the record is rewritten to the delivered turn and step, running.
    async fn resume_as_delivered(
        &self,
        bus: &Bus,
        request: &TurnRequest,
        mut record: Value,
    ) -> Result<Value, ErrorBody> {
        if is_current(&record, request) {
            return Ok(record);
        }
        record["turn_id"] = json!(request.turn_id);
        record["step"] = json!(request.step);
        record["status"] = json!("running");
        self.put_turn(bus, &record).await.map_err(|e| error_body("put_turn", &e))?;
        Ok(record)
    }

    /// Reads the session's messages and asks the model for the current step.
    pub(super) async fn ask_model(&self, bus: &Bus, record: &Value) -> Result<Value, StepFailure> {
        let session_id = &record["session_id"];
        let timeout = self.env.config.session_timeout_ms;
        let messages = bus
            .invoke("session::messages", json!({ "session_id": session_id }), timeout)
            .await
            .map_err(|error| StepFailure { during: "session::messages", error })?;
        let prompt = json!({ "session_id": session_id, "turn_id": record["turn_id"], "step": record["step"], "messages": messages["entries"] });
        bus.invoke("model::generate", prompt, self.env.config.model_timeout_ms)
            .await
            .map_err(|error| StepFailure { during: "model::generate", error })
    }

    async fn complete(
        self: &Rc<Self>,
        bus: &Bus,
        request: &TurnRequest,
        mut record: Value,
        reply: Value,
    ) -> Result<Value, ErrorBody> {
        record["status"] = json!("completed");
        record["turn_count"] = json!(record["turn_count"].as_u64().unwrap_or(0) + 1);
        record["result"] = reply.clone();
        record["updated_at"] = json!(self.now());
        let entry = json!({ "role": "assistant", "text": reply.get("text").cloned().unwrap_or(Value::Null) });
        match self.finalize(bus, &record, entry, "idle").await {
            Ok(result) => Ok(result),
            Err(error) => self.unfinalized(bus, request, Intent::Record(record), &error),
        }
    }

    async fn fail_turn(
        self: &Rc<Self>,
        bus: &Bus,
        request: &TurnRequest,
        failure: StepFailure,
    ) -> Result<Value, ErrorBody> {
        self.note(
            "turn_step_failed",
            json!({ "session_id": request.session_id, "turn_id": request.turn_id, "error": failure.summary() }),
        );
        let record = match self.get_turn(bus, &request.session_id).await {
            Ok(Some(record)) if is_current(&record, request) => record,
            Ok(_) => return Ok(self.skipped(request, "not current")),
            Err(error) => match self.policy {
                // `.ok().flatten()`: the read error becomes "no record", and so a skip.
                Policy::Swallow => return Ok(self.skipped(request, "unreadable")),
                _ => return self.unfinalized(bus, request, Intent::Failed { cause: failure.summary() }, &error),
            },
        };
        let failed = failed_record(record, &failure.summary(), self.now());
        let entry = json!({ "role": "system", "kind": "error", "text": failure.summary() });
        match self.finalize(bus, &failed, entry, "error").await {
            Ok(result) => Ok(result),
            Err(error) => self.unfinalized(bus, request, Intent::Record(failed), &error),
        }
    }

    /// What the caller hears when the terminal state could not be recorded.
    fn unfinalized(
        self: &Rc<Self>,
        bus: &Bus,
        request: &TurnRequest,
        intent: Intent,
        error: &InvokeError,
    ) -> Result<Value, ErrorBody> {
        if matches!(error, InvokeError::Rejected(body) if body.code == "stale_token") {
            self.forget_lease(&request.session_id);
            return Ok(self.fenced_out(request));
        }
        match self.policy {
            Policy::Swallow => Ok(self.skipped(request, "finalization failed")),
            Policy::Propagate => Err(error_body("finalize", error)),
            _ => {
                self.note(
                    "finalization_deferred",
                    json!({ "session_id": request.session_id, "turn_id": request.turn_id, "cause": error.to_string() }),
                );
                let status = match &intent {
                    Intent::Record(record) => record["status"].clone(),
                    Intent::Failed { .. } => json!("failed"),
                };
                let (harness, retry_bus, retry) = (Rc::clone(self), bus.clone(), request.clone());
                tokio::task::spawn_local(async move { harness.terminalize_later(&retry_bus, &retry, intent).await });
                Ok(json!({
                    "session_id": request.session_id, "turn_id": request.turn_id, "status": status,
                    "skipped": false, "next_step": null, "finalized": false,
                    "reason": format!("terminal state not yet recorded: {error}"),
                }))
            }
        }
    }

    /// Retries finalisation as terminalisation only: reads the record, and if this turn is
    /// still running, records the intended terminal state. Never re-runs the model or a tool.
    async fn terminalize_later(self: &Rc<Self>, bus: &Bus, request: &TurnRequest, intent: Intent) {
        let config = &self.env.config;
        for attempt in 1..=config.terminalize_attempts {
            let backoff = config
                .terminalize_backoff_ms
                .saturating_mul(1 << (attempt - 1).min(16))
                .min(TERMINALIZE_BACKOFF_MS_MAX);
            self.env.clock.sleep(backoff).await;
            let lock = self.session_lock(&request.session_id);
            let _guard = lock.lock().await;
            let record = match self.get_turn(bus, &request.session_id).await {
                Ok(Some(record)) => record,
                Ok(None) => break,
                Err(_) => continue,
            };
            if record["turn_id"] == json!(request.turn_id) && is_terminal(&record) {
                self.note("terminalization_confirmed", json!({ "turn_id": request.turn_id, "attempt": attempt }));
                return;
            }
            if !is_current(&record, request) {
                break;
            }
            let (terminal, entry, session_status) = match &intent {
                Intent::Record(terminal) if terminal["status"] == json!("completed") => {
                    (terminal.clone(), json!({ "role": "assistant", "text": terminal["result"]["text"] }), "idle")
                }
                Intent::Record(terminal) => (
                    terminal.clone(),
                    json!({ "role": "system", "kind": "error", "text": terminal["result_error"] }),
                    "error",
                ),
                Intent::Failed { cause } => (
                    failed_record(record, cause, self.now()),
                    json!({ "role": "system", "kind": "error", "text": cause }),
                    "error",
                ),
            };
            if self.finalize(bus, &terminal, entry, session_status).await.is_ok() {
                self.note("terminalized", json!({ "turn_id": request.turn_id, "attempt": attempt }));
                return;
            }
        }
        self.note(
            "terminalization_gave_up",
            json!({ "turn_id": request.turn_id, "attempts": config.terminalize_attempts }),
        );
    }

    /// Records a terminal turn, presents it on the session, and reseeds queued input.
    async fn finalize(
        self: &Rc<Self>,
        bus: &Bus,
        terminal: &Value,
        entry: Value,
        session_status: &str,
    ) -> Result<Value, InvokeError> {
        self.put_terminal(bus, terminal).await?;
        let session_id = &terminal["session_id"];
        let timeout = self.env.config.session_timeout_ms;
        // Presentation is best effort: the durable record already says what happened.
        let _ = bus.invoke("session::append", json!({ "session_id": session_id, "entry": entry }), timeout).await;
        let _ = bus
            .invoke("session::set-status", json!({ "session_id": session_id, "status": session_status }), timeout)
            .await;
        let reseed = self.reseed_queued_input(bus, terminal).await;
        let mut result = json!({
            "session_id": session_id, "turn_id": terminal["turn_id"], "status": terminal["status"],
            "skipped": false, "next_step": null,
        });
        if let (true, Some(reseed)) = (self.policy.recovers(), reseed) {
            result["reseed"] = reseed;
        }
        Ok(result)
    }

    async fn put_terminal(&self, bus: &Bus, record: &Value) -> Result<(), InvokeError> {
        let written = self.put_turn(bus, record).await;
        match written {
            Err(error) if error.is_timeout() && self.policy.recovers() => {
                // A timeout does not prove the write is absent: one exact whole-record readback,
                // and no further write.
                match self.get_turn(bus, record["session_id"].as_str().unwrap_or_default()).await {
                    Ok(Some(observed)) if observed == *record => {
                        self.note("terminal_write_confirmed", json!({ "turn_id": record["turn_id"] }));
                        Ok(())
                    }
                    _ => Err(error),
                }
            }
            other => other,
        }
    }

    /// Moves input queued for the session into a new turn and enqueues it.
    async fn reseed_queued_input(&self, bus: &Bus, predecessor: &Value) -> Option<Value> {
        let timeout = self.env.config.session_timeout_ms;
        let session_id = predecessor["session_id"].clone();
        let listed = bus.invoke("state::list", json!({ "scope": QUEUE_SCOPE }), timeout).await;
        let queued: Vec<Value> = match listed {
            Ok(Value::Array(entries)) => {
                entries.into_iter().filter(|e| e["value"]["session_id"] == session_id).collect()
            }
            Ok(_) => Vec::new(),
            Err(error) => {
                self.note("reseed_drain_failed", json!({ "session_id": session_id, "error": error.to_string() }));
                return Some(json!({ "admitted": false, "error": error.to_string() }));
            }
        };
        if queued.is_empty() {
            return None;
        }
        let turn_id = format!("t-{}", uuid(&mut self.env.rng.borrow_mut()));
        let mut turn = json!({
            "session_id": session_id, "turn_id": turn_id, "status": "running", "step": 0, "turn_count": 0,
            "depth": 0, "abort": false, "calls": {},
            "input": queued.iter().map(|e| e["value"]["message"].clone()).collect::<Vec<_>>(),
            "created_at": self.now(), "updated_at": self.now(),
        });
        if let Err(error) = self.put_turn(bus, &turn).await {
            self.note("reseed_write_failed", json!({ "session_id": session_id, "error": error.to_string() }));
            return Some(json!({ "turn_id": turn_id, "admitted": false, "error": error.to_string() }));
        }
        for entry in &queued {
            let _ = bus.invoke("state::delete", json!({ "scope": QUEUE_SCOPE, "key": entry["key"] }), timeout).await;
        }
        let request = json!({ "session_id": session_id, "turn_id": turn_id, "step": 0, "depth": 0 });
        let queue = Action::Enqueue { queue: self.env.config.turn_queue.clone() };
        let attempts = self.env.config.enqueue_attempts;
        let mut last_error = String::new();
        for attempt in 1..=attempts {
            match bus.invoke_with(&self.function("turn"), request.clone(), Some(queue.clone()), timeout).await {
                Ok(_receipt) => {
                    self.note("reseed_enqueued", json!({ "turn_id": turn_id, "attempt": attempt }));
                    return Some(json!({ "turn_id": turn_id, "admitted": true, "attempts": attempt }));
                }
                Err(error) => last_error = error.to_string(),
            }
        }
        self.note("reseed_enqueue_exhausted", json!({ "turn_id": turn_id, "attempts": attempts, "error": last_error }));
        if !self.policy.recovers() {
            // The predecessor's result is returned as if nothing happened; the new turn stays
            // running with nothing to run it.
            return None;
        }
        turn["status"] = json!("held");
        turn["held_reason"] = json!(format!("enqueue exhausted after {attempts} attempts: {last_error}"));
        turn["updated_at"] = json!(self.now());
        let held = self.put_turn(bus, &turn).await.is_ok();
        Some(json!({ "turn_id": turn_id, "admitted": false, "attempts": attempts, "error": last_error, "held": held }))
    }

    pub(super) async fn get_turn(&self, bus: &Bus, session_id: &str) -> Result<Option<Value>, InvokeError> {
        let record = bus
            .invoke("state::get", json!({ "scope": TURN_SCOPE, "key": session_id }), self.env.config.session_timeout_ms)
            .await?;
        Ok(Some(record).filter(|r| !r.is_null()))
    }

    /// Writes a turn record, retrying once with the identical record after a timeout.
    pub(super) async fn put_turn(&self, bus: &Bus, record: &Value) -> Result<(), InvokeError> {
        let mut write = json!({ "scope": TURN_SCOPE, "key": record["session_id"], "value": record });
        if let Some(fence) = self.store_fence(record["session_id"].as_str().unwrap_or_default()) {
            write["fence"] = fence;
        }
        let timeout = self.env.config.session_timeout_ms;
        match bus.invoke("state::set", write.clone(), timeout).await {
            Err(error) if error.is_timeout() => bus.invoke("state::set", write, timeout).await.map(drop),
            other => other.map(drop),
        }
    }

    /// The seed's `skipped(session_id)`: running, no next step, whatever the reason. The
    /// reference policy says `skipped` and why instead, so a skip is never mistaken for a turn
    /// that is still running.
    fn skipped(&self, request: &TurnRequest, reason: &str) -> Value {
        let mut result = json!({
            "session_id": request.session_id, "turn_id": request.turn_id, "status": "running",
            "skipped": true, "next_step": null,
        });
        if self.policy.recovers() {
            result["status"] = json!("skipped");
            result["reason"] = json!(reason);
        }
        result
    }
}

impl Provider for ReferenceHarness {
    fn invoke(self: Rc<Self>, call: Invocation, bus: Bus) -> Pin<Box<dyn Future<Output = Answer>>> {
        Box::pin(async move {
            let name = call.function_id.strip_prefix(&format!("{}::", self.env.host)).unwrap_or_default().to_string();
            Some(match name.as_str() {
                "turn" => match serde_json::from_value::<TurnRequest>(call.data) {
                    Ok(request) => self.turn(&bus, request).await,
                    Err(error) => Err(ErrorBody::new("bad_request", error.to_string())),
                },
                "export" => match call.data["session_id"].as_str() {
                    Some(session_id) => self.export(&bus, session_id).await,
                    None => Err(ErrorBody::new("bad_request", "missing `session_id`")),
                },
                "import" => self.import(&bus, &call.data).await,
                _ => Err(ErrorBody::new("function_not_found", call.function_id)),
            })
        })
    }
}

impl Harness for ReferenceHarness {
    fn functions(&self) -> Vec<String> {
        ["turn", "export", "import"].iter().map(|name| self.function(name)).collect()
    }
}

fn is_terminal(record: &Value) -> bool {
    record["status"].as_str().is_some_and(|s| TERMINAL.contains(&s))
}

/// Exact turn identity: same turn, same step, still running.
fn is_current(record: &Value, request: &TurnRequest) -> bool {
    record["turn_id"] == json!(request.turn_id)
        && record["step"] == json!(request.step)
        && record["status"] == json!("running")
}

fn failed_record(mut record: Value, cause: &str, now: u64) -> Value {
    record["status"] = json!("failed");
    record["result_error"] = json!(cause);
    record["updated_at"] = json!(now);
    record
}

fn error_body(during: &str, error: &InvokeError) -> ErrorBody {
    match error {
        InvokeError::Rejected(body) => ErrorBody::new(&body.code, format!("{during}: {}", body.message)),
        InvokeError::Timeout { .. } => ErrorBody::new("timeout", format!("{during}: {error}")),
        InvokeError::Disconnected => ErrorBody::new("disconnected", format!("{during}: {error}")),
    }
}
