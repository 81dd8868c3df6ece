//! Tool actions: the model's tool calls as durable, reconcilable actions.
//!
//! Before an effect is requested, its intent is recorded durably with an action id, an
//! idempotency key and a client reference; its outcome is recorded after. An action is never
//! started, confirmed (done, or definitely not done), or of unknown outcome: a timeout, a lost
//! connection or a provider stopped mid-call (`invocation_stopped`) leave it unknown. An unknown
//! action is reconciled with the receiving service (its idempotency key, then lookup by
//! reference) before anything is sent again; while the service cannot be reached it is asked
//! again with backoff, and what stays unknown is held for a person, with its owner and the true
//! reason.

use super::budget::Spend;
use super::transcript::action_id;
use super::{Policy, StepFailure, Stop, Worker};
use crate::bus::{Bus, ErrorBody, InvokeError};
use crate::harness::Tool;
use serde_json::{json, Value};
use std::rc::Rc;

/// The most model rounds one turn may take; a turn that needs more fails with a reason.
const ROUNDS_MAX: u32 = 8;
/// The most times one action is sent; each further send follows a reconciliation that found it
/// did not happen.
const SENDS_MAX: u32 = 3;

/// What reconciliation with the receiving service found out.
enum Reconciled {
    Complete(Value),
    NotExecuted,
    /// The service answered, and its answers cannot tell.
    Ambiguous(String),
    /// The service could not be asked.
    Unreachable(String),
}

fn status(entry: &Value) -> &str {
    entry["status"].as_str().unwrap_or("")
}

fn is_settled(entry: &Value) -> bool {
    matches!(status(entry), "complete" | "failed")
}

/// Whether an action's outcome is unknown: its intent was recorded (and it may have been sent)
/// and nothing since has established what happened.
fn is_unsettled(entry: &Value) -> bool {
    matches!(status(entry), "started" | "unknown") && entry["reconciled"] != json!(true)
}

/// Whether a call is held by a hook: stopped before it was ever sent, so known not to have run.
fn is_held_by_a_hook(entry: &Value) -> bool {
    status(entry) == "held" && !entry["hold"].is_null()
}

/// Whether an action is held for a person because its outcome is unknown.
fn is_held_for_a_person(entry: &Value) -> bool {
    status(entry) == "held" && !is_held_by_a_hook(entry)
}

/// Whether a call of `tool` is an external effect: every tool is, but the queries its own service
/// answers about actions (`{service}::status`, `{service}::lookup`), which only read.
pub(super) fn is_effect(tool: &Tool) -> bool {
    !["status", "lookup"].iter().any(|query| tool.function == format!("{}::{query}", tool.service))
}

/// Actions of a record, in action-id order, by how far along they are: confirmed outcomes
/// (`complete`), not yet done and safe to continue (`resumable`), held for a person (`held`),
/// and possibly executed (`unsettled`).
pub(super) fn classify(record: &Value, owner: &str) -> Value {
    let mut report = json!({ "complete": [], "resumable": [], "held": [], "unsettled": [] });
    if let Some(calls) = record["calls"].as_object() {
        for (action_id, entry) in calls {
            let class = match status(entry) {
                "complete" | "failed" => "complete",
                "held" => "held",
                _ if is_unsettled(entry) => "unsettled",
                _ => "resumable",
            };
            let line = json!({ "action_id": action_id, "tool": entry["tool"], "status": entry["status"], "owner": owner,
                               "reason": entry.get("held_reason").cloned().unwrap_or(Value::Null) });
            report[class].as_array_mut().expect("report lists").push(line);
        }
    }
    report
}

impl Worker {
    /// Runs the turn from its durable record: a recorded model reply is reused, completed
    /// actions never run again, and the record is written after every round.
    pub(super) async fn drive(self: &Rc<Self>, bus: &Bus, mut record: Value) -> Result<(Value, Value), Stop> {
        // The model is never asked from a transcript that lacks what the turn put into it (the
        // entries left to the background land later): a session refusing appends past their
        // tries fails the step.
        if !self.transcribe_input(bus, &record).await {
            return Err(untranscribed("the turn's input"));
        }
        self.ensure_pin(bus, &mut record).await?;
        for _ in 0..ROUNDS_MAX {
            let session_id = record["session_id"].as_str().unwrap_or_default().to_string();
            let reply = match record.get("reply").filter(|r| !r.is_null()) {
                Some(reply) => reply.clone(),
                None => {
                    // A safe point: before a model call.
                    self.check_control(&session_id)?;
                    self.spend(bus, &mut record, Spend::ModelRound).await?;
                    self.ask_model(bus, &mut record).await.map_err(Stop::Failed)?
                }
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
            if !self.transcribe_calls(bus, &record).await {
                return Err(untranscribed("the round's function calls"));
            }
            for (index, call) in calls.iter().enumerate() {
                let action_id = action_id(&record, index);
                self.run_action(bus, &mut record, &action_id, call).await?;
            }
            if !self.transcribe_results(bus, &record, false).await {
                return Err(untranscribed("the round's function results"));
            }
            record["step"] = json!(record["step"].as_u64().unwrap_or(0) + 1);
            record["reply"] = Value::Null;
            self.write(bus, &record).await?;
        }
        let error =
            InvokeError::Rejected(ErrorBody::new("rounds_exhausted", format!("more than {ROUNDS_MAX} model rounds")));
        Err(Stop::Failed(StepFailure { during: "turn".into(), error }))
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
        if call["tool"] == json!("agent.delegate") {
            self.check_control(&session_id)?;
            return self.delegate(bus, record, action_id, call).await;
        }
        let Some(tool) = call["tool"].as_str().and_then(|name| self.tool(name)) else {
            record["calls"][action_id] = json!({ "tool": call["tool"], "status": "failed", "error": "unknown tool" });
            return self.write(bus, record).await;
        };
        match status(&record["calls"][action_id]) {
            "complete" | "failed" => return Ok(()),
            "held" => return Err(Stop::Held { reason: format!("action {action_id} is held") }),
            "" | "released" => {
                // A safe point: before a tool is dispatched.
                self.check_control(&session_id)?;
                // Hooks see the call first; a held or denied call goes no further (and spends
                // nothing: a held call's budget is spent when it is released and runs).
                let Some(args) = self.pass_hooks(bus, record, action_id, &tool, call).await? else { return Ok(()) };
                self.spend(bus, record, Spend::ToolCall).await?;
                if !tool.replay_safe {
                    // An effect the budget cannot afford is never begun: no intent is left behind
                    // for a person to wonder about. One it can afford is counted with its intent,
                    // before it is sent: from the send on it may have happened, whatever answer
                    // (or none) comes back.
                    self.spend(bus, record, Spend::EffectDispatch).await?;
                }
                let mut intent = json!({
                    "tool": call["tool"], "idempotency_key": self.new_key(),
                    "client_reference": action_id, "status": "started", "owner": self.env.host,
                    "token": self.lease_token(&session_id), "intent_at_ms": self.now(),
                    "replay": if tool.replay_safe { "safe" } else { "unsafe" },
                });
                // Moved in: `json!` would copy the arguments node by node.
                intent["args"] = args;
                record["calls"][action_id] = intent;
                self.write(bus, record).await?;
            }
            // Outcome unknown (an earlier runner recorded the intent, or a send had no result):
            // ask the service before sending anything again.
            _ if self.policy == Policy::AssumeSent && is_unsettled(&record["calls"][action_id]) => {
                // The known-bad recovery: what was begun is taken as sent, and as done.
                record["calls"][action_id]["status"] = json!("complete");
                record["calls"][action_id]["completed_at_ms"] = json!(self.now());
                return self.write(bus, record).await;
            }
            _ if crate::planted!("ref-recorded-intent-taken-as-done")
                && status(&record["calls"][action_id]) == "started" =>
            {
                // (The planted bug: an intent an earlier runner recorded is taken as sent and done.)
                record["calls"][action_id]["status"] = json!("complete");
                record["calls"][action_id]["result"] = json!({ "assumed": true });
                return self.write(bus, record).await;
            }
            _ => {
                let must_ask = self.reconciles() && !tool.replay_safe && is_unsettled(&record["calls"][action_id]);
                if must_ask && self.settle_by_reconciling(bus, record, action_id).await? {
                    return Ok(());
                }
            }
        }
        // The action the request is sent as: the call's own, but for `retry-as-new-action`'s
        // retries.
        let mut attempt = action_id.to_string();
        for send in 1..=SENDS_MAX {
            if record["calls"][action_id]["reconciled"] == json!(true) {
                // "Known not to have happened" holds only until it is sent again: from here on,
                // a worker that finds this record after a crash must ask the service first.
                record["calls"][action_id]["reconciled"] = json!(false);
                self.write(bus, record).await?;
            }
            self.env.checkpoint("before_submission", action_id).await;
            // The last moment before the send: a command accepted meanwhile (by any worker) or
            // a wall-time limit passed while this worker was held up still stops it.
            self.check_control_durably(bus, record).await?;
            self.check_wall_time(record)?;
            // And the safety overlay, read here last: a tool it took away is never called.
            if let Some(why) = self.taken_away(bus, record, &tool).await? {
                return self.settle_unavailable(bus, record, action_id, why).await;
            }
            let entry = &record["calls"][&attempt];
            let request = json!({
                "action_id": attempt, "idempotency_key": entry["idempotency_key"], "client_reference": entry["client_reference"],
                "args": entry["args"], "fencing": self.effect_fence(&session_id),
            });
            let error = match bus.invoke(&tool.function, request, self.env.config.tool_timeout_ms).await {
                Ok(result) => {
                    self.env.checkpoint("after_acceptance", action_id).await;
                    // (An attempt of `retry-as-new-action` that answers settles the call too.)
                    for id in [action_id, attempt.as_str()] {
                        record["calls"][id]["status"] = json!("complete");
                        record["calls"][id]["result"] = result.clone();
                        record["calls"][id]["completed_at_ms"] = json!(self.now());
                    }
                    self.write(bus, record).await?;
                    self.env.checkpoint("after_completion", action_id).await;
                    // A safe point: after a tool's outcome is recorded.
                    return self.check_control(&session_id);
                }
                Err(InvokeError::Rejected(body)) if body.code == "stale_token" => {
                    return Err(self.stop_for(&session_id, &tool.function, InvokeError::Rejected(body)));
                }
                Err(error) => error,
            };
            if error.outcome_unknown() && self.policy == Policy::RetryAsNewAction && send < SENDS_MAX {
                // The known-bad retry: a request whose answer was lost is sent again at once as
                // a new action (a new id, so a new key and reference), as a retry that mints
                // every attempt afresh; the call is taken for done by whichever attempt answers,
                // and an attempt left unknown between them is the close's to settle.
                record["calls"][&attempt]["status"] = json!("unknown");
                let next = format!("{action_id}/{}", send + 1);
                let mut retry = record["calls"][&attempt].clone();
                retry["status"] = json!("started");
                retry["idempotency_key"] = json!(self.new_key());
                retry["client_reference"] = json!(next);
                record["calls"][&next] = retry;
                self.write(bus, record).await?;
                attempt = next;
                continue;
            }
            if !error.outcome_unknown() || self.policy == Policy::AssumeFailed {
                // A definite refusal (or, under `assume-failed`, any error): it did not happen.
                // A refusal answers one copy of the request, and the network delivers at least
                // once: an effect is asked about before it is recorded failed.
                let asks = !tool.replay_safe
                    && self.reconciles()
                    && self.policy != Policy::AssumeFailed
                    && !crate::planted!("ref-refusal-taken-as-not-done");
                if asks {
                    if let Reconciled::Complete(result) = self.reconcile(bus, &record["calls"][action_id]).await {
                        self.note(
                            "refused_but_executed",
                            json!({ "action_id": action_id, "error": error.to_string() }),
                        );
                        let entry = &mut record["calls"][action_id];
                        entry["status"] = json!("complete");
                        entry["result"] = result;
                        entry["reconciled"] = json!(true);
                        entry["completed_at_ms"] = json!(self.now());
                        self.write(bus, record).await?;
                        return self.check_control(&session_id);
                    }
                }
                record["calls"][action_id]["status"] = json!("failed");
                record["calls"][action_id]["error"] = json!(error.to_string());
                return self.write(bus, record).await;
            }
            self.note(
                "action_outcome_unknown",
                json!({ "action_id": action_id, "error": error.to_string(), "send": send }),
            );
            record["calls"][action_id]["status"] = json!("unknown");
            record["calls"][action_id]["reconciled"] = json!(false);
            let _ = self.write(bus, record).await;
            if !tool.replay_safe && self.settle_by_reconciling(bus, record, action_id).await? {
                return Ok(());
            }
        }
        // Every send was found not to have happened: a definite failure, with its reason.
        record["calls"][action_id]["status"] = json!("failed");
        record["calls"][action_id]["error"] = json!(format!("not executed after {SENDS_MAX} sends"));
        self.write(bus, record).await
    }

    /// Whether this policy reconciles an outcome-unknown action before sending it again.
    fn reconciles(&self) -> bool {
        !matches!(self.policy, Policy::ReplayUnfinished | Policy::FreshKey)
    }

    /// The tool of this name, as the world's services document it.
    pub(super) fn tool(&self, name: &str) -> Option<Tool> {
        self.env.config.tools.iter().find(|tool| tool.name == name).cloned()
    }

    fn new_key(&self) -> String {
        format!("key-{}", self.env.new_id())
    }

    /// Reconciles one action and records what was found. True when the action is settled
    /// (complete), false when it is known not to have happened (safe to send); a hold stops the
    /// turn.
    async fn settle_by_reconciling(&self, bus: &Bus, record: &mut Value, action_id: &str) -> Result<bool, Stop> {
        let found = self.reconcile_until_answered(bus, &record["calls"][action_id]).await;
        let settled = self.record_reconciliation(&mut record["calls"][action_id], action_id, found);
        self.write(bus, record).await?;
        match settled {
            Ok(complete) => Ok(complete),
            Err(reason) => Err(Stop::Held { reason }),
        }
    }

    /// Settles, in memory, every action of `record` whose outcome is unknown, so that the write
    /// closing the turn records them settled; the reason to hold the turn if one stays unknown.
    pub(super) async fn settle_open_actions(&self, bus: &Bus, record: &mut Value) -> Result<(), String> {
        // A call a hook still holds was never sent: the turn is closing, so it never will be.
        if let Some(calls) = record["calls"].as_object_mut() {
            for (_, entry) in calls.iter_mut().filter(|(_, e)| is_held_by_a_hook(e)) {
                entry["status"] = json!("failed");
                entry["error"] = json!("not run: the turn ended while a hook held it");
            }
        }
        let open: Vec<String> = record["calls"]
            .as_object()
            .map(|calls| {
                calls.iter().filter(|(_, e)| !is_settled(e) && status(e) != "held").map(|(id, _)| id.clone()).collect()
            })
            .unwrap_or_default();
        // An action already held for a person is still of unknown outcome: it holds the turn too
        // (a turn that failed after the hold was written would otherwise close over it).
        let mut held: Vec<String> = record["calls"]
            .as_object()
            .map(|calls| {
                calls
                    .iter()
                    .filter(|(_, e)| is_held_for_a_person(e))
                    .map(|(id, e)| format!("action {id}: {}", e["held_reason"].as_str().unwrap_or("held for a person")))
                    .collect()
            })
            .unwrap_or_default();
        for action_id in open {
            let found = if is_unsettled(&record["calls"][&action_id]) {
                self.reconcile_until_answered(bus, &record["calls"][&action_id]).await
            } else {
                // Reconciled already and not sent since: known not to have happened.
                Reconciled::NotExecuted
            };
            match self.record_reconciliation(&mut record["calls"][&action_id], &action_id, found) {
                Ok(true) => {}
                // Known not to have happened: the turn is closing, so it never will.
                Ok(false) => {
                    record["calls"][&action_id]["status"] = json!("failed");
                    record["calls"][&action_id]["error"] =
                        json!("not executed; the turn ended before it was sent again");
                }
                Err(reason) => held.push(reason),
            }
        }
        if held.is_empty() {
            Ok(())
        } else {
            Err(held.join("; "))
        }
    }

    /// Writes what reconciliation found into the action's entry: `Ok(true)` complete, `Ok(false)`
    /// not executed, `Err(reason)` held.
    fn record_reconciliation(&self, entry: &mut Value, action_id: &str, found: Reconciled) -> Result<bool, String> {
        entry["reconciled"] = json!(true);
        let settled = match found {
            Reconciled::Complete(result) => {
                entry["status"] = json!("complete");
                entry["result"] = result;
                Ok(true)
            }
            Reconciled::NotExecuted => {
                entry["status"] = json!("started");
                Ok(false)
            }
            Reconciled::Ambiguous(reason) | Reconciled::Unreachable(reason) => {
                entry["status"] = json!("held");
                entry["held_reason"] = json!(reason);
                entry["owner"] = json!(self.env.host);
                self.note("action_held", json!({ "action_id": action_id, "reason": reason }));
                return Err(format!("action {action_id}: {reason}"));
            }
        };
        self.note("action_reconciled", json!({ "action_id": action_id, "complete": settled == Ok(true) }));
        settled
    }

    /// Reconciles an action, asking again with backoff while the service cannot be reached.
    async fn reconcile_until_answered(&self, bus: &Bus, entry: &Value) -> Reconciled {
        let attempts = self.env.config.terminalize_attempts.max(1);
        let mut last_error = String::new();
        for attempt in 1..=attempts {
            match self.reconcile(bus, entry).await {
                Reconciled::Unreachable(error) => last_error = error,
                answered => return answered,
            }
            if attempt < attempts {
                self.env.clock.sleep(self.deferred_backoff(attempt)).await;
            }
        }
        Reconciled::Unreachable(format!(
            "the outcome is unknown and the service could not be asked after {attempts} attempts: {last_error}"
        ))
    }

    /// Asks the receiving service whether an action happened: first by its idempotency key,
    /// then by its client reference. A negative key check is conclusive only within the
    /// service's memory window.
    async fn reconcile(&self, bus: &Bus, entry: &Value) -> Reconciled {
        let Some(tool) = entry["tool"].as_str().and_then(|name| self.tool(name)) else {
            return Reconciled::Ambiguous("no service of this world documents the tool".into());
        };
        let timeout = self.env.config.tool_timeout_ms;
        let mut key_unknown = false;
        let mut unreachable = None;
        // What the service says it found, as the action's result.
        let found = |mut answer: Value, by: &str| {
            if let Some(fields) = answer.as_object_mut() {
                fields.remove("known");
                fields.remove("found");
                fields.insert("reconciled_by".into(), json!(by));
            }
            Reconciled::Complete(answer)
        };
        if tool.idempotency {
            let status = format!("{}::status", tool.service);
            match bus.invoke(&status, json!({ "idempotency_key": entry["idempotency_key"] }), timeout).await {
                Ok(answer) if answer["known"] == json!(true) => return found(answer, "idempotency key"),
                Ok(_) => key_unknown = true,
                // (The planted bug: a question that got no answer taken as "key unknown".)
                Err(_) if crate::planted!("ref-status-error-taken-as-unknown-key") => key_unknown = true,
                Err(error) => unreachable = Some(error.to_string()),
            }
        }
        if tool.lookup {
            let lookup = json!({ "client_reference": entry["client_reference"] });
            match bus.invoke(&format!("{}::lookup", tool.service), lookup, timeout).await {
                Ok(answer) if answer["found"] == json!(true) => return found(answer, "client reference"),
                Ok(_) => return Reconciled::NotExecuted,
                Err(error) => unreachable = Some(error.to_string()),
            }
        }
        let age_ms = self.now().saturating_sub(entry["intent_at_ms"].as_u64().unwrap_or(0));
        if key_unknown
            && (age_ms < tool.idempotency_window_ms || crate::planted!("ref-key-check-trusted-past-its-window"))
        {
            return Reconciled::NotExecuted;
        }
        if let Some(error) = unreachable {
            return Reconciled::Unreachable(error);
        }
        Reconciled::Ambiguous(if tool.idempotency {
            format!(
                "the service no longer remembers the key ({age_ms} ms since the intent, window {} ms) and offers no lookup",
                tool.idempotency_window_ms
            )
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
}

/// The failure of a step whose transcript entries the session refused past their tries.
fn untranscribed(what: &str) -> Stop {
    let error =
        ErrorBody::new("transcript_unwritten", format!("{what} could not be written to the session's transcript"));
    Stop::Failed(StepFailure { during: "session::append".into(), error: InvokeError::Rejected(error) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    /// The class each action of a record lands in, by id.
    fn classes(calls: Value) -> BTreeMap<String, String> {
        let report = classify(&json!({ "calls": calls }), "w1");
        let mut classes = BTreeMap::new();
        for class in ["complete", "resumable", "held", "unsettled"] {
            for line in report[class].as_array().unwrap() {
                classes.insert(line["action_id"].as_str().unwrap().to_string(), class.to_string());
            }
        }
        classes
    }

    #[test]
    fn an_action_is_unsettled_only_while_nothing_established_its_outcome() {
        let classes = classes(json!({
            "a-started": { "status": "started" },
            "a-unknown": { "status": "unknown" },
            // Reconciliation found it had not happened, and it was not sent since: safe to send.
            "b-started-reconciled": { "status": "started", "reconciled": true },
            "b-unknown-reconciled": { "status": "unknown", "reconciled": true },
            "b-started-sent-again": { "status": "started", "reconciled": false },
            "c-complete": { "status": "complete" },
            "c-failed": { "status": "failed" },
            "d-held": { "status": "held", "hold": { "hook": "approvals::approve" } },
            "e-released": { "status": "released" },
        }));
        let expected = [
            ("a-started", "unsettled"),
            ("a-unknown", "unsettled"),
            ("b-started-reconciled", "resumable"),
            ("b-unknown-reconciled", "resumable"),
            ("b-started-sent-again", "unsettled"),
            ("c-complete", "complete"),
            ("c-failed", "complete"),
            ("d-held", "held"),
            ("e-released", "resumable"),
        ];
        let expected: BTreeMap<String, String> = expected.iter().map(|(a, c)| (a.to_string(), c.to_string())).collect();
        assert_eq!(classes, expected);
    }
}
