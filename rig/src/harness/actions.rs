//! Tool actions: the model's tool calls as durable, reconcilable actions, and the session
//! export/import a harness switch goes through.
//!
//! Before an effect is requested, its intent is recorded durably with an action id, an
//! idempotency key and a client reference; its outcome is recorded after. Every action is in
//! one of three classes: never started (no intent), confirmed complete, or outcome unknown
//! (intent recorded, no outcome). An outcome-unknown action is reconciled with the receiving
//! service (its idempotency key, then lookup by reference) before anything is sent again; if
//! that cannot tell, the action is held for a person, with its owner.

use super::reference::{Policy, ReferenceHarness, StepFailure, Stop};
use crate::bus::{Bus, ErrorBody, InvokeError};
use crate::sim::streams::uuid;
use serde_json::{json, Value};
use std::rc::Rc;

/// The most model rounds one turn may take; a turn that needs more fails with a reason.
const ROUNDS_MAX: u32 = 8;

/// A tool the harness can dispatch: the service function it calls and whether it is safe to
/// run again after an interruption (`replay: 'safe'` in the durable-harness model).
struct Tool {
    function: &'static str,
    replay_safe: bool,
}

fn tool(name: &str) -> Option<Tool> {
    match name {
        "ticket.create" => Some(Tool { function: "ticket::create", replay_safe: false }),
        "ticket.lookup" => Some(Tool { function: "ticket::lookup", replay_safe: true }),
        _ => None,
    }
}

/// What reconciliation with the receiving service found out.
enum Reconciled {
    Complete(Value),
    NotExecuted,
    Ambiguous(String),
}

fn status(entry: &Value) -> &str {
    entry["status"].as_str().unwrap_or("")
}

fn is_settled(entry: &Value) -> bool {
    matches!(status(entry), "complete" | "failed")
}

/// Actions of a record, in action-id order, by how far along they are.
pub fn classify(record: &Value, owner: &str) -> Value {
    let mut report = json!({ "complete": [], "resumable": [], "held": [] });
    if let Some(calls) = record["calls"].as_object() {
        for (action_id, entry) in calls {
            let class = match status(entry) {
                "complete" | "failed" => "complete",
                "held" => "held",
                _ => "resumable",
            };
            let line = json!({ "action_id": action_id, "tool": entry["tool"], "status": entry["status"], "owner": owner,
                               "reason": entry.get("held_reason").cloned().unwrap_or(Value::Null) });
            report[class].as_array_mut().expect("report lists").push(line);
        }
    }
    report
}

impl ReferenceHarness {
    /// Runs the turn from its durable record: a recorded model reply is reused, completed
    /// actions never run again, and the record is written after every round.
    pub(super) async fn drive(self: &Rc<Self>, bus: &Bus, mut record: Value) -> Result<(Value, Value), Stop> {
        for _ in 0..ROUNDS_MAX {
            let reply = match record.get("reply").filter(|r| !r.is_null()) {
                Some(reply) => reply.clone(),
                None => self.ask_model(bus, &record).await.map_err(Stop::Failed)?,
            };
            let calls: Vec<Value> = reply["tool_calls"].as_array().cloned().unwrap_or_default();
            if calls.is_empty() {
                return Ok((record, reply));
            }
            if record["reply"].is_null() {
                // The model step is recorded before its tools run, so it is never asked again.
                record["reply"] = reply.clone();
                self.write(bus, &record).await?;
            }
            for (index, call) in calls.iter().enumerate() {
                let action_id = format!("{}:{}:{index}", record["turn_id"].as_str().unwrap_or(""), record["step"]);
                self.run_action(bus, &mut record, &action_id, call).await?;
            }
            record["step"] = json!(record["step"].as_u64().unwrap_or(0) + 1);
            record["reply"] = Value::Null;
            self.write(bus, &record).await?;
        }
        let error =
            InvokeError::Rejected(ErrorBody::new("rounds_exhausted", format!("more than {ROUNDS_MAX} model rounds")));
        Err(Stop::Failed(StepFailure { during: "turn", error }))
    }

    /// Writes the turn record under this worker's fence; a stale-token rejection means the
    /// session has a newer owner.
    pub(super) async fn write(&self, bus: &Bus, record: &Value) -> Result<(), Stop> {
        match self.put_turn(bus, record).await {
            Ok(()) => Ok(()),
            Err(error) => Err(self.stop_for(record["session_id"].as_str().unwrap_or(""), "state::set", error)),
        }
    }

    fn stop_for(&self, session_id: &str, during: &'static str, error: InvokeError) -> Stop {
        match &error {
            InvokeError::Rejected(body) if body.code == "stale_token" => {
                self.note(
                    "fenced_out",
                    json!({ "session_id": session_id, "during": during, "token": self.lease_token(session_id) }),
                );
                self.forget_lease(session_id);
                Stop::FencedOut
            }
            _ => Stop::Failed(StepFailure { during, error }),
        }
    }

    /// Runs one tool action to a recorded outcome.
    async fn run_action(
        self: &Rc<Self>,
        bus: &Bus,
        record: &mut Value,
        action_id: &str,
        call: &Value,
    ) -> Result<(), Stop> {
        let session_id = record["session_id"].as_str().unwrap_or("").to_string();
        let Some(tool) = call["tool"].as_str().and_then(tool) else {
            record["calls"][action_id] = json!({ "tool": call["tool"], "status": "failed", "error": "unknown tool" });
            return self.write(bus, record).await;
        };
        match status(&record["calls"][action_id]) {
            "complete" | "failed" => return Ok(()),
            "held" => return Err(Stop::Held { reason: format!("action {action_id} is held") }),
            "" => {
                let intent = json!({
                    "tool": call["tool"], "args": call["args"], "idempotency_key": self.new_key(),
                    "client_reference": action_id, "status": "started", "owner": self.env.host,
                    "token": self.lease_token(&session_id), "intent_at_ms": self.now(), "replay": if tool.replay_safe { "safe" } else { "unsafe" },
                });
                record["calls"][action_id] = intent;
                self.write(bus, record).await?;
            }
            // Outcome unknown (an earlier runner recorded the intent, or we timed out): ask the
            // service before sending anything again.
            _ => {
                let unreconciled = record["calls"][action_id]["reconciled"] != json!(true);
                let must_ask = self.reconciles() && !tool.replay_safe && unreconciled;
                if must_ask && self.settle_by_reconciling(bus, record, action_id).await? {
                    return Ok(());
                }
            }
        }
        self.checkpoint("before_submission", action_id).await;
        let entry = record["calls"][action_id].clone();
        let request = json!({
            "action_id": action_id, "idempotency_key": entry["idempotency_key"], "client_reference": entry["client_reference"],
            "title": entry["args"]["title"], "fencing": self.effect_fence(&session_id),
        });
        match bus.invoke(tool.function, request, self.env.config.tool_timeout_ms).await {
            Ok(result) => {
                self.checkpoint("after_acceptance", action_id).await;
                record["calls"][action_id]["status"] = json!("complete");
                record["calls"][action_id]["result"] = result;
                self.write(bus, record).await?;
                self.checkpoint("after_completion", action_id).await;
                Ok(())
            }
            Err(InvokeError::Rejected(body)) if body.code == "stale_token" => {
                Err(self.stop_for(&session_id, tool.function, InvokeError::Rejected(body)))
            }
            Err(InvokeError::Rejected(body)) => {
                record["calls"][action_id]["status"] = json!("failed");
                record["calls"][action_id]["error"] = json!(body);
                self.write(bus, record).await
            }
            Err(unknown) => {
                self.note("action_outcome_unknown", json!({ "action_id": action_id, "error": unknown.to_string() }));
                record["calls"][action_id]["status"] = json!("unknown");
                record["calls"][action_id]["reconciled"] = json!(false);
                let _ = self.write(bus, record).await;
                if self.settle_by_reconciling(bus, record, action_id).await? {
                    return Ok(());
                }
                Err(Stop::Failed(StepFailure { during: tool.function, error: unknown }))
            }
        }
    }

    /// Whether this policy reconciles an outcome-unknown action before sending it again.
    fn reconciles(&self) -> bool {
        !matches!(self.policy, Policy::ReplayUnfinished | Policy::FreshKey)
    }

    fn new_key(&self) -> String {
        format!("key-{}", uuid(&mut self.env.rng.borrow_mut()))
    }

    /// Reconciles one action and records what was found. True when the action is settled
    /// (complete), false when it is known not to have happened (safe to send); a hold stops the
    /// turn.
    async fn settle_by_reconciling(&self, bus: &Bus, record: &mut Value, action_id: &str) -> Result<bool, Stop> {
        let found = self.reconcile(bus, &record["calls"][action_id]).await;
        let entry = &mut record["calls"][action_id];
        entry["reconciled"] = json!(true);
        let settled = match found {
            Reconciled::Complete(result) => {
                entry["status"] = json!("complete");
                entry["result"] = result;
                true
            }
            Reconciled::NotExecuted => {
                entry["status"] = json!("started");
                false
            }
            Reconciled::Ambiguous(reason) => {
                entry["status"] = json!("held");
                entry["held_reason"] = json!(reason);
                entry["owner"] = json!(self.env.host);
                self.note("action_held", json!({ "action_id": action_id, "reason": reason }));
                self.write(bus, record).await?;
                return Err(Stop::Held { reason: format!("action {action_id}: {reason}") });
            }
        };
        self.note("action_reconciled", json!({ "action_id": action_id, "complete": settled }));
        self.write(bus, record).await?;
        Ok(settled)
    }

    /// Asks the receiving service whether an action happened: first by its idempotency key,
    /// then by its client reference. A negative key check is conclusive only within the
    /// service's memory window.
    async fn reconcile(&self, bus: &Bus, entry: &Value) -> Reconciled {
        let guarantees = &self.env.config.tickets;
        let timeout = self.env.config.tool_timeout_ms;
        let mut key_unknown = false;
        if guarantees.idempotency {
            if let Ok(found) =
                bus.invoke("ticket::status", json!({ "idempotency_key": entry["idempotency_key"] }), timeout).await
            {
                if found["known"] == json!(true) {
                    return Reconciled::Complete(
                        json!({ "ticket_id": found["ticket_id"], "reconciled_by": "idempotency key" }),
                    );
                }
                key_unknown = true;
            }
        }
        if guarantees.lookup {
            let lookup = json!({ "client_reference": entry["client_reference"] });
            if let Ok(found) = bus.invoke("ticket::lookup", lookup, timeout).await {
                if found["found"] == json!(true) {
                    return Reconciled::Complete(
                        json!({ "ticket_id": found["ticket_id"], "reconciled_by": "client reference" }),
                    );
                }
                return Reconciled::NotExecuted;
            }
        }
        let age_ms = self.now().saturating_sub(entry["intent_at_ms"].as_u64().unwrap_or(0));
        if key_unknown && age_ms < guarantees.idempotency_window_ms {
            return Reconciled::NotExecuted;
        }
        Reconciled::Ambiguous(if guarantees.idempotency {
            format!("the service no longer remembers the key ({age_ms} ms since the intent, window {} ms) and offers no lookup", guarantees.idempotency_window_ms)
        } else {
            "the service offers neither idempotency keys nor lookup by reference".to_string()
        })
    }

    /// Recovery after import: how this policy treats every action that is not settled.
    pub(super) async fn recover(&self, bus: &Bus, record: &mut Value) -> Result<(), Stop> {
        let pending: Vec<String> = record["calls"]
            .as_object()
            .map(|calls| calls.iter().filter(|(_, e)| !is_settled(e)).map(|(id, _)| id.clone()).collect())
            .unwrap_or_default();
        for action_id in pending {
            let replay_safe = record["calls"][&action_id]["replay"] == json!("safe");
            match self.policy {
                // Blind replay: the action is sent again as it is, on the next round.
                Policy::ReplayUnfinished => {}
                // A new key turns a retry into a new action.
                Policy::FreshKey => record["calls"][&action_id]["idempotency_key"] = json!(self.new_key()),
                _ if replay_safe => {}
                _ => {
                    record["calls"][&action_id]["reconciled"] = json!(false);
                    match self.settle_by_reconciling(bus, record, &action_id).await {
                        Ok(_) => {}
                        // Keep reconciling the others, so the report lists every held action.
                        Err(Stop::Held { .. }) => {}
                        Err(other) => return Err(other),
                    }
                }
            }
        }
        self.write(bus, record).await
    }

    /// A named interruption point: the rig may freeze this worker here (until it is crashed)
    /// or pause it for a while; a pause the rig set from outside is honoured here too.
    pub(super) async fn checkpoint(&self, point: &str, action_id: &str) {
        match self.env.process.interrupt(&self.env.host, point) {
            Some(super::Interrupt::Freeze) => {
                self.note("interrupted", json!({ "point": point, "action_id": action_id, "freeze": true }));
                std::future::pending::<()>().await;
            }
            Some(super::Interrupt::Pause { ms }) => {
                self.note("interrupted", json!({ "point": point, "action_id": action_id, "pause_ms": ms }));
                self.env.process.pause(&self.env.host, self.now().saturating_add(ms));
            }
            None => {}
        }
        self.wait_while_paused().await;
    }

    /// The session as a bundle another harness can import: the task record, the actions not
    /// yet settled with their ids and keys, and the owner.
    pub(super) async fn export(&self, bus: &Bus, session_id: &str) -> Result<Value, ErrorBody> {
        let record = self.get_turn(bus, session_id).await.map_err(|e| ErrorBody::new("unavailable", e.to_string()))?;
        let record = record.ok_or_else(|| ErrorBody::new("not_found", format!("no task for session {session_id}")))?;
        let lease = bus
            .invoke(
                "state::get-lease",
                json!({ "scope": super::ownership::OWNER_SCOPE, "key": session_id }),
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
}
