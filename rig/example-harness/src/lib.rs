//! A deliberately naive harness, written outside the rig as a team would write their own: it
//! uses only the rig's public API, and shows both how to put a harness in front of the rig's
//! scenario files and what the shipped catalogue catches when a harness cuts corners.
//!
//! Its mistakes, each one a harness really made somewhere:
//! - it sends an effect before recording anything about it, and records the action only after
//!   the service answered;
//! - a request without an answer is sent once more, under a new idempotency key;
//! - it swallows every error while finalising a turn, and reports the turn still running;
//! - it trusts every delivery: no check that the turn is still the current one;
//! - it takes no lease and carries no fencing token;
//! - on import it runs the turn again from the top;
//! - input queued during a turn is left where it is.
//!
//! It declares what it serves and nothing more: turns, a switch (`export`, `import`), and the
//! interruption points around its effects. The files that need more of the contract (control
//! commands, `send`, `status`, hooks, streaming, dead letters, delegation, budgets) are skipped
//! for it, with the reason, instead of failing on a function it never had.

use rig::{
    Answer, Bus, Capabilities, Capability, ErrorBody, HarnessEnv, HarnessFactory, Invocation, InvokeError, Provider,
};
use serde_json::{json, Value};
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;

/// The naive harness, as a factory the rig starts workers from.
#[derive(Debug, Default, Clone, Copy)]
pub struct NaiveHarness;

impl HarnessFactory for NaiveHarness {
    fn name(&self) -> &str {
        "naive"
    }

    fn capabilities(&self) -> Capabilities {
        [Capability::Turns, Capability::Switch, Capability::Checkpoints].into_iter().collect()
    }

    /// It never waits on time at all, and spawns nothing: its host may skip idle steps.
    fn waits_on_rig_clock_only(&self) -> bool {
        true
    }

    fn start(&self, _policy: &str, env: HarnessEnv) -> Rc<dyn Provider> {
        Rc::new(Worker { env })
    }
}

/// The factory to hand to `rig::run_with` or `rig::scenario_tests!`.
pub fn factory() -> std::sync::Arc<dyn HarnessFactory> {
    std::sync::Arc::new(NaiveHarness)
}

/// The most model rounds a turn takes.
const ROUNDS_MAX: u64 = 8;

struct Worker {
    env: HarnessEnv,
}

impl Worker {
    async fn call(&self, bus: &Bus, function: &str, data: Value) -> Result<Value, InvokeError> {
        bus.invoke(function, data, self.env.config.session_timeout_ms).await
    }

    async fn turn(&self, bus: &Bus, data: &Value) -> Result<Value, ErrorBody> {
        let session_id = data["session_id"].as_str().unwrap_or_default().to_string();
        let read = self.call(bus, "state::get", json!({ "scope": "harness_turn", "key": session_id })).await;
        let mut record = read.map_err(|e| ErrorBody::new("unavailable", e.to_string()))?;
        if record.is_null() {
            return Err(ErrorBody::new("not_found", format!("no turn for session {session_id}")));
        }
        let outcome = self.drive(bus, &mut record).await;
        let (status, presented) = match &outcome {
            Ok(reply) => {
                record["status"] = json!("completed");
                record["result"] = reply.clone();
                ("completed", json!({ "role": "assistant", "text": reply["text"] }))
            }
            Err(error) => {
                record["status"] = json!("failed");
                record["result_error"] = json!(error);
                ("failed", json!({ "role": "system", "kind": "error", "text": error }))
            }
        };
        let write = json!({ "scope": "harness_turn", "key": session_id, "value": record });
        if self.call(bus, "state::set", write).await.is_err() {
            // Whatever went wrong, the caller hears that the turn is still going.
            return Ok(
                json!({ "session_id": session_id, "turn_id": record["turn_id"], "status": "running", "skipped": true }),
            );
        }
        let _ = self.call(bus, "session::append", json!({ "session_id": session_id, "entry": presented })).await;
        Ok(json!({ "session_id": session_id, "turn_id": record["turn_id"], "status": status, "skipped": false }))
    }

    /// Model rounds until a reply without tool calls; `Err` with what went wrong.
    async fn drive(&self, bus: &Bus, record: &mut Value) -> Result<Value, String> {
        let session_id = record["session_id"].clone();
        for _ in 0..ROUNDS_MAX {
            let messages = self.call(bus, "session::messages", json!({ "session_id": session_id })).await;
            let messages = messages.map_err(|e| format!("session::messages: {e}"))?;
            let prompt = json!({ "session_id": session_id, "turn_id": record["turn_id"], "step": record["step"], "messages": messages["entries"] });
            let reply = bus.invoke("model::generate", prompt, self.env.config.model_timeout_ms).await;
            let reply = reply.map_err(|e| format!("model::generate: {e}"))?;
            let Some(calls) = reply["tool_calls"].as_array().filter(|c| !c.is_empty()) else { return Ok(reply) };
            for (index, call) in calls.iter().enumerate() {
                let action_id = format!("{}:{}:{index}", record["turn_id"].as_str().unwrap_or(""), record["step"]);
                let result = self.create_ticket(bus, &action_id, call).await;
                record["calls"][&action_id] = match result {
                    Ok(ticket) => json!({ "tool": call["tool"], "status": "complete", "result": ticket }),
                    Err(error) => json!({ "tool": call["tool"], "status": "failed", "error": error }),
                };
                self.env.checkpoint("after_completion", &action_id).await;
            }
            record["step"] = json!(record["step"].as_u64().unwrap_or(0) + 1);
            let write = json!({ "scope": "harness_turn", "key": session_id, "value": record });
            self.call(bus, "state::set", write).await.map_err(|e| format!("state::set: {e}"))?;
        }
        Err(format!("more than {ROUNDS_MAX} model rounds"))
    }

    /// Sends the effect; a request that got no answer is sent once more, under a new key.
    async fn create_ticket(&self, bus: &Bus, action_id: &str, call: &Value) -> Result<Value, String> {
        let mut last_error = String::new();
        for _ in 0..2 {
            self.env.checkpoint("before_submission", action_id).await;
            let request = json!({
                "action_id": action_id, "client_reference": action_id, "idempotency_key": self.env.new_id(),
                "title": call["args"]["title"],
            });
            match bus.invoke("ticket::create", request, self.env.config.tool_timeout_ms).await {
                Ok(ticket) => {
                    self.env.checkpoint("after_acceptance", action_id).await;
                    return Ok(ticket);
                }
                Err(error) => last_error = error.to_string(),
            }
        }
        Err(last_error)
    }
}

impl Provider for Worker {
    fn invoke(self: Rc<Self>, call: Invocation, bus: Bus) -> Pin<Box<dyn Future<Output = Answer>>> {
        Box::pin(async move {
            let name = call.function_id.rsplit("::").next().unwrap_or_default().to_string();
            Some(match name.as_str() {
                // A switch hands over the record; the importer runs the turn again from the top.
                "turn" | "import" => self.turn(&bus, &call.data).await,
                "export" => self
                    .call(&bus, "state::get", json!({ "scope": "harness_turn", "key": call.data["session_id"] }))
                    .await
                    .map(|task| json!({ "session_id": call.data["session_id"], "task": task }))
                    .map_err(|e| ErrorBody::new("unavailable", e.to_string())),
                _ => Err(ErrorBody::new("not_implemented", format!("the naive harness has no `{name}`"))),
            })
        })
    }
}

/// The manual's page on testing your own harness, whose example is compiled here as a doctest,
/// so the example stays true to the API.
#[doc = include_str!("../../docs/your-harness.md")]
mod readme {}
