//! Finalising a turn: recording its terminal state, presenting it on the session, reseeding the
//! input queued meanwhile, and what happens when any of that fails.
//!
//! The terminal write is the commit point. Whatever path confirms it (the write's own answer, one
//! exact readback after an unknown outcome, or a deferred retry that finds it already recorded),
//! the rest of finalisation runs the same way: presentation, then reseeding. A turn is never
//! closed over an action whose outcome is unknown: such actions are reconciled first, and what
//! stays unknown holds the turn for a person.

use super::{
    error_body, failed_record, is_current, is_terminal, Policy, StepFailure, TurnRequest, Worker, QUEUE_SCOPE,
};
use crate::bus::{Action, Bus, ErrorBody, InvokeError};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::rc::Rc;

const DEFERRED_BACKOFF_MS_MAX: u64 = 5_000;
/// How long a starting worker waits for its engine connection before its recovery sweep:
/// this many checks, this far apart.
const RECOVERY_CONNECT_CHECKS: u32 = 100;
const RECOVERY_CONNECT_CHECK_MS: u64 = 10;
/// How often a background retry checks whether a worker cut off from the engine is connected
/// again, before it tries (a try while cut off fails at once and proves nothing).
const RECONNECT_CHECK_MS: u64 = 100;

/// The schedule of one piece of background settlement: tries a backoff apart (doubling from
/// `terminalize_backoff_ms`, at most [`DEFERRED_BACKOFF_MS_MAX`]), each once the worker is
/// connected to the engine, until it is settled or `settle_within_ms` has passed since it began.
/// Never a fixed number of tries: a second fault on the way, or an outage longer than the tries
/// add up to, must not leave a command `accepted` or a turn running with nobody on it.
pub(super) struct Retry {
    began_ms: u64,
    attempt: u32,
}

impl Retry {
    /// A schedule beginning now.
    pub(super) fn begin(env: &crate::harness::HarnessEnv) -> Self {
        Retry { began_ms: env.clock.now_ms(), attempt: 0 }
    }

    /// How many tries it has waited for.
    pub(super) fn attempt(&self) -> u32 {
        self.attempt
    }

    /// Waits for the next try: its backoff, then until the worker is connected to the engine (a
    /// try made while it is cut off fails at once). False once `settle_within_ms` has passed
    /// since the settlement began: the caller notes that it gave up, and after how many tries.
    /// (A free-standing schedule, so work that outlives the call that began it, such as a
    /// transcript entry, can ride it without its worker.)
    pub(super) async fn next(&mut self, env: &crate::harness::HarnessEnv, bus: &Bus) -> bool {
        let until_ms = self.began_ms.saturating_add(env.config.settle_within_ms);
        let now = || env.clock.now_ms();
        if now() >= until_ms {
            return false;
        }
        self.attempt += 1;
        env.clock.sleep(deferred_backoff(&env.config, self.attempt).min(until_ms - now())).await;
        while !bus.is_connected() && now() < until_ms {
            env.clock.sleep(RECONNECT_CHECK_MS).await;
        }
        bus.is_connected() && now() <= until_ms
    }
}

/// The terminal state a deferred terminalisation must record.
#[derive(Debug, Clone)]
pub(super) enum Intent {
    /// The exact record whose write could not be confirmed; it is written again unchanged.
    Record(Value),
    /// The turn failed, but its record could not even be read; build the failed record from
    /// whatever is read later, with the original cause.
    Failed { cause: String },
    /// The turn must be held for a person, but the hold could not be recorded (or the record not
    /// even read): hold whatever is read later, with this reason.
    Held { reason: String },
}

/// A terminalisation under way in the background, for the turn it is owed to.
#[derive(Debug, Clone)]
pub(super) struct PendingTerminal {
    pub(super) turn_id: String,
    intent: Intent,
    /// Whether the owed state is in the turn's record ([`TERMINAL_PENDING`]): until it is, a
    /// crash of this worker would lose it, so the delivery is not answered as done.
    pub(super) left_in_record: bool,
}

/// Where a terminal state owed to a turn stands once its worker tried to leave it in the record
/// ([`Worker::leave_terminal_pending`]).
enum Left {
    /// In the record, or the turn no longer running there: a worker that starts finishes it.
    Durably,
    /// Owed in this process's memory only: a crash of this worker would lose it.
    InMemory,
    /// The record holds the very terminal record owed (a write whose outcome was unknown landed).
    Landed,
}

/// The field of a turn record naming the queued input entries it was admitted from.
const INPUT_KEYS: &str = "input_keys";
/// The field of a turn record naming input entries earlier turns were admitted from and whose
/// removal has not succeeded yet: they are never admitted again.
const SPENT_KEYS: &str = "spent_keys";

/// The field of a turn admitted from queued input that holds its predecessor's answer (or error)
/// as the transcript shows it, written there before the turn's input.
pub(super) const PREDECESSOR_ENTRY: &str = "predecessor_entry";

/// The field of a terminal record written in the background, by a worker with no delivery of
/// the turn waiting on it (a terminal state owed since its delivery was answered): it names that
/// worker's host. No queue delivers the turn again, so no stale delivery finds it ended and shows
/// its answer; a worker of that host that starts shows it again instead (`recover_on_start`).
pub(super) const FINALIZED_BY: &str = "finalized_by";

/// The field of a running turn record where a terminal state owed to it is kept: the process
/// that owes it may die before it lands, and the queue, already answered, delivers nothing again.
pub(super) const TERMINAL_PENDING: &str = "terminal_pending";

impl Intent {
    fn to_json(&self) -> Value {
        match self {
            Intent::Record(record) => json!({ "record": record }),
            Intent::Failed { cause } => json!({ "failed": cause }),
            Intent::Held { reason } => json!({ "held": reason }),
        }
    }

    fn from_json(value: &Value) -> Option<Intent> {
        if let Some(record) = value.get("record") {
            return Some(Intent::Record(record.clone()));
        }
        if let Some(cause) = value["failed"].as_str() {
            return Some(Intent::Failed { cause: cause.to_string() });
        }
        value["held"].as_str().map(|reason| Intent::Held { reason: reason.to_string() })
    }

    fn status(&self) -> Value {
        match self {
            Intent::Record(record) => record["status"].clone(),
            Intent::Failed { .. } => json!("failed"),
            Intent::Held { .. } => json!("held"),
        }
    }
}

/// Whether this process owes the turn `turn_id` of `session_id` a terminal state.
fn in_memory_owed(pending: &BTreeMap<String, PendingTerminal>, session_id: &str, turn_id: &str) -> bool {
    pending.get(session_id).is_some_and(|p| p.turn_id == turn_id)
}

/// What finalising a terminal record shows on the session.
fn presentation(terminal: &Value) -> (Value, &'static str) {
    // Keyed by the turn, so a presentation repeated after a confirmed terminal write is kept once.
    // (The planted bug: keyed by the session, so a later turn's answer is taken as a repeat.)
    let by = if crate::planted!("ref-presentation-keyed-by-session") { "session_id" } else { "turn_id" };
    let entry_key = format!("{}:{}", terminal[by].as_str().unwrap_or(""), terminal["status"].as_str().unwrap_or(""));
    if terminal["status"] == json!("completed") {
        (json!({ "role": "assistant", "text": terminal["result"]["text"], "entry_key": entry_key }), "idle")
    } else {
        (
            json!({ "role": "system", "kind": "error", "text": terminal["result_error"], "entry_key": entry_key }),
            "error",
        )
    }
}

/// The entry a terminal record shows on the session (with its `entry_key`), for every end: the
/// same entry [`Worker::after_terminal`] presents when it finalises the turn itself, so a path
/// that shows it again (its first append lost) shows what the direct path shows. A turn a person
/// closed (cancelled, stopped) carries no text of its own, and shows a system entry with none.
/// A completed turn shows its answer: one whose record holds none (a record seeded so; a turn
/// this harness completes always has its reply) has nothing to show, and is not shown as an
/// assistant entry without text.
pub(super) fn owed_presentation(record: &Value) -> Option<Value> {
    let answered = record["status"] != json!("completed") || record["result"]["text"].is_string();
    (is_terminal(record) && answered).then(|| presentation(record).0)
}

/// The backoff before the `attempt`-th deferred retry (from 1).
fn deferred_backoff(config: &crate::harness::HarnessConfig, attempt: u32) -> u64 {
    config.terminalize_backoff_ms.saturating_mul(1 << (attempt - 1).min(16)).min(DEFERRED_BACKOFF_MS_MAX)
}

/// The longest a worker with `config` waits by itself between two of its calls: a deferred
/// retry's backoff at its cap, or the pause between two renewals of a lease. (What a live run
/// is told, so that it can judge a quiet world without waiting out its liveness bound.)
pub(crate) fn longest_own_wait_ms(config: &crate::harness::HarnessConfig) -> u64 {
    deferred_backoff(config, u32::MAX).max(config.lease_ttl_ms / 3)
}

impl Worker {
    /// The backoff before the `attempt`-th deferred retry (from 1).
    pub(super) fn deferred_backoff(&self, attempt: u32) -> u64 {
        deferred_backoff(&self.env.config, attempt)
    }

    pub(super) async fn complete(
        self: &Rc<Self>,
        bus: &Bus,
        request: &TurnRequest,
        mut record: Value,
        reply: Value,
    ) -> Result<Value, ErrorBody> {
        record["status"] = json!("completed");
        record["turn_count"] = json!(record["turn_count"].as_u64().unwrap_or(0) + 1);
        record["result"] = reply;
        record["updated_at"] = json!(self.now());
        self.close(bus, request, record).await
    }

    pub(super) async fn fail_turn(
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
                _ => return self.unfinalized(bus, request, Intent::Failed { cause: failure.summary() }, &error).await,
            },
        };
        let mut terminal = failed_record(record, &failure.summary(), self.now());
        if self.policy == Policy::TimeoutAsCancelled && matches!(failure.error, InvokeError::Timeout { .. }) {
            // The known-bad mapping: a step its timeout gave up on is taken for a cancelled
            // task (as a timeout that cancels the awaiting task is caught by the cancellation
            // handler), so the turn ends `cancelled` where it failed.
            terminal["status"] = json!("cancelled");
        }
        self.close(bus, request, terminal).await
    }

    /// Records a terminal turn and finishes finalising it, after settling every action the
    /// record still has open (in the same write); what cannot be settled holds the turn instead.
    async fn close(self: &Rc<Self>, bus: &Bus, request: &TurnRequest, mut terminal: Value) -> Result<Value, ErrorBody> {
        if self.policy.settles_before_closing() {
            if let Err(reason) = self.settle_open_actions(bus, &mut terminal).await {
                return self.hold_record(bus, request, terminal, &reason).await;
            }
        }
        self.transcribe_results(bus, &terminal, true).await;
        match self.finalize(bus, &terminal).await {
            Ok(result) => Ok(result),
            Err(error) => self.unfinalized(bus, request, Intent::Record(terminal), &error).await,
        }
    }

    /// Holds a turn whose actions cannot be settled: durably, with its reason and what is
    /// unresolved, so a person can decide.
    pub(super) async fn hold_turn(
        self: &Rc<Self>,
        bus: &Bus,
        request: &TurnRequest,
        reason: &str,
    ) -> Result<Value, ErrorBody> {
        let record = match self.get_turn(bus, &request.session_id).await {
            Ok(Some(record)) if is_current(&record, request) => record,
            Ok(_) => return Ok(self.skipped(request, "not current")),
            // Unreadable is not "not current": the hold is owed, and recorded later.
            Err(error) => {
                return self.unfinalized(bus, request, Intent::Held { reason: reason.to_string() }, &error).await
            }
        };
        self.watch_approvals(bus, &record);
        self.hold_record(bus, request, record, reason).await
    }

    /// Writes `record` as held for a person, with its reason; a hold that cannot be recorded now
    /// is owed, and recorded later like a terminal state.
    pub(super) async fn hold_record(
        self: &Rc<Self>,
        bus: &Bus,
        request: &TurnRequest,
        record: Value,
        reason: &str,
    ) -> Result<Value, ErrorBody> {
        match self.write_hold(bus, request, record, reason).await {
            Ok(reply) => Ok(reply),
            Err(error) => self.unfinalized(bus, request, Intent::Held { reason: reason.to_string() }, &error).await,
        }
    }

    pub(super) async fn write_hold(
        self: &Rc<Self>,
        bus: &Bus,
        request: &TurnRequest,
        record: Value,
        reason: &str,
    ) -> Result<Value, InvokeError> {
        self.write_hold_over(bus, request, record, reason, None).await
    }

    /// [`Self::write_hold`], over the record's stored `version` when one is given (a parked
    /// turn, which a rival may claim meanwhile): a write that finds another version refused.
    pub(super) async fn write_hold_over(
        self: &Rc<Self>,
        bus: &Bus,
        request: &TurnRequest,
        mut record: Value,
        reason: &str,
        version: Option<u64>,
    ) -> Result<Value, InvokeError> {
        // A cancellation accepted for this turn cannot be applied cleanly any more: it ends here,
        // with an effect that may have happened, for the person who resolves the hold.
        let command = self.accepted_command(bus, &request.session_id, &request.turn_id).await.ok().flatten();
        if let Some((kind, key)) = command.as_ref().filter(|(kind, _)| kind == "cancel" || kind == "stop") {
            record["cancellation"] = json!("unresolved-effect");
            if record["control"].is_null() {
                record["control"] = json!({ "command": kind, "idempotency_key": key });
            }
        }
        record["status"] = json!("held");
        record["held_reason"] = json!(reason);
        record["updated_at"] = json!(self.now());
        match version {
            None => self.put_turn(bus, &record).await?,
            Some(version) if self.put_turn_over(bus, &record, version).await? => {}
            Some(_) => {
                return Err(InvokeError::Rejected(ErrorBody::new("contended", "the turn changed before the hold")));
            }
        }
        if command.is_some() {
            self.settle_commands_or_retry(bus, &request.session_id, Some(&record)).await;
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

    /// What the caller hears when the terminal state could not be recorded.
    pub(super) async fn unfinalized(
        self: &Rc<Self>,
        bus: &Bus,
        request: &TurnRequest,
        intent: Intent,
        error: &InvokeError,
    ) -> Result<Value, ErrorBody> {
        if matches!(error, InvokeError::Rejected(body) if body.code == "stale_token") {
            self.forget_lease(&request.session_id);
            return self.fenced_out(request);
        }
        match self.policy {
            Policy::Swallow => Ok(self.skipped(request, "finalization failed")),
            Policy::Propagate => Err(error_body("finalize", error)),
            _ => {
                self.note(
                    "finalization_deferred",
                    json!({ "session_id": request.session_id, "turn_id": request.turn_id, "cause": error.to_string() }),
                );
                // Before the delivery is answered: the retry below lives in this process only.
                let left = self.leave_terminal_pending(bus, request, &intent).await;
                if let (Left::Landed, Intent::Record(terminal)) = (&left, &intent) {
                    // The terminal write whose outcome was unknown landed, as this read shows
                    // (the whole record, as the readback compares it): finalising goes on here,
                    // before the delivery is answered. Answered first, with the end owed, no
                    // queue delivers the turn again, and the record names no worker to show its
                    // answer once this one dies before its background retry: the answer would be
                    // left out of the transcript for good.
                    self.note("terminal_write_confirmed", json!({ "turn_id": terminal["turn_id"] }));
                    return Ok(self.after_terminal(bus, terminal).await);
                }
                let left_in_record = !matches!(left, Left::InMemory);
                let status = intent.status();
                let pending =
                    PendingTerminal { turn_id: request.turn_id.clone(), intent: intent.clone(), left_in_record };
                self.pending_terminal.borrow_mut().insert(request.session_id.clone(), pending);
                let (worker, retry_bus, retry) = (Rc::clone(self), bus.clone(), request.clone());
                tokio::task::spawn_local(async move { worker.terminalize_later(&retry_bus, &retry, intent).await });
                if !left_in_record {
                    return Err(self.terminal_owed_in_memory(request));
                }
                let mut reply = json!({
                    "session_id": request.session_id, "turn_id": request.turn_id, "status": status,
                    "skipped": false, "next_step": null, "finalized": false,
                    "reason": format!("terminal state not yet recorded: {error}"),
                });
                if self.policy == Policy::UnconfirmedReply {
                    // The known-bad reply: the state it owes, told as if it were recorded.
                    reply.as_object_mut().expect("a reply object").retain(|k, _| k != "finalized" && k != "reason");
                }
                Ok(reply)
            }
        }
    }

    /// Leaves the terminal state owed to a running turn in its record, so a worker that starts
    /// after this one died finishes it, and says where the owed state stands.
    async fn leave_terminal_pending(&self, bus: &Bus, request: &TurnRequest, intent: &Intent) -> Left {
        let mut record = match self.get_turn(bus, &request.session_id).await {
            Ok(Some(record)) if is_current(&record, request) => record,
            Ok(Some(record)) if matches!(intent, Intent::Record(terminal) if *terminal == record) => {
                return Left::Landed
            }
            Ok(_) => return Left::Durably,
            Err(_) => return Left::InMemory,
        };
        if record.get(TERMINAL_PENDING).is_some() || crate::planted!("ref-owed-terminal-kept-in-memory") {
            return Left::Durably;
        }
        record[TERMINAL_PENDING] = intent.to_json();
        match self.put_turn(bus, &record).await {
            Ok(()) => Left::Durably,
            Err(_) => Left::InMemory,
        }
    }

    /// Gives up a hold owed to the turn of `record` (`turn_id`), in memory or in the record,
    /// because a release or an expiry of its held call came before the hold was durable: the
    /// turn is driven on instead, and a hold written after that (by the background retry, or by
    /// a worker resuming it after this one died) would hold it for a call no longer held, which
    /// nothing can release. Err when the turn is owed a terminal state instead: it is ending, and
    /// nothing may drive it on.
    pub(super) fn supersede_owed_hold(&self, record: &mut Value, turn_id: &str) -> Result<(), ()> {
        let session_id = record["session_id"].as_str().unwrap_or_default().to_string();
        let in_memory =
            self.pending_terminal.borrow().get(&session_id).filter(|p| p.turn_id == turn_id).map(|p| p.intent.clone());
        let in_record = record.get(TERMINAL_PENDING).and_then(Intent::from_json);
        match in_memory.or(in_record) {
            None => Ok(()),
            Some(Intent::Held { reason }) => {
                if in_memory_owed(&self.pending_terminal.borrow(), &session_id, turn_id) {
                    self.pending_terminal.borrow_mut().remove(&session_id);
                }
                if let Some(fields) = record.as_object_mut() {
                    fields.remove(TERMINAL_PENDING);
                }
                self.note(
                    "owed_hold_superseded",
                    json!({ "session_id": session_id, "turn_id": turn_id, "reason": reason }),
                );
                Ok(())
            }
            Some(_) => Err(()),
        }
    }

    /// The answer to a delivery whose turn is owed a terminal state that only this process knows
    /// of: an error, so the queue delivers it again (after its backoff, not its deadline) and
    /// still holds it should this worker die.
    fn terminal_owed_in_memory(&self, request: &TurnRequest) -> ErrorBody {
        self.note(
            "terminal_pending_unrecorded",
            json!({ "session_id": request.session_id, "turn_id": request.turn_id }),
        );
        ErrorBody::new("unavailable", "the turn's terminal state is owed but not yet durable; deliver it again")
    }

    /// A redelivery of a turn whose owed terminal state is not in its record yet: one more try
    /// to leave it there, then the same answer as the first delivery's.
    pub(super) async fn owe_terminal_durably(&self, bus: &Bus, request: &TurnRequest) -> Result<Value, ErrorBody> {
        let Some(intent) = self.pending_terminal.borrow().get(&request.session_id).map(|p| p.intent.clone()) else {
            return Ok(self.skipped(request, "terminalization pending"));
        };
        if matches!(self.leave_terminal_pending(bus, request, &intent).await, Left::InMemory) {
            return Err(self.terminal_owed_in_memory(request));
        }
        if let Some(pending) = self.pending_terminal.borrow_mut().get_mut(&request.session_id) {
            pending.left_in_record = true;
        }
        Ok(self.skipped(request, "terminalization pending"))
    }

    /// Retries finalisation as terminalisation only: reads the record and, if this turn is still
    /// running, records the intended terminal state; if it finds it already recorded, finishes
    /// finalising it. Never re-runs the model or a tool.
    async fn terminalize_later(self: &Rc<Self>, bus: &Bus, request: &TurnRequest, intent: Intent) {
        let mut outcome = None;
        let mut retry = self.retry();
        while self.next_try(bus, &mut retry).await {
            let attempt = retry.attempt();
            let lock = self.session_lock(&request.session_id);
            let _guard = lock.lock().await;
            if !in_memory_owed(&self.pending_terminal.borrow(), &request.session_id, &request.turn_id) {
                // Superseded meanwhile: a release or an expiry drove the turn on instead of the
                // hold it was owed (`supersede_owed_hold`).
                outcome = Some((attempt, "superseded"));
                break;
            }
            // Its lease may have been lost meanwhile (a renewal refused after a newer grant, which
            // its holder may since have given back): the owed state is written under a lease of
            // this worker's, or not at all.
            if self.ensure_ownership(bus, &request.session_id).await.is_err() {
                continue;
            }
            let mut record = match self.get_turn(bus, &request.session_id).await {
                Ok(Some(record)) => record,
                Ok(None) => {
                    outcome = Some((attempt, "the turn record is gone"));
                    break;
                }
                Err(_) => continue,
            };
            // What is written from here on is the owed state itself.
            if let Some(fields) = record.as_object_mut() {
                fields.remove(TERMINAL_PENDING);
            }
            let held = record["status"] == json!("held");
            if record["turn_id"] == json!(request.turn_id) && (is_terminal(&record) || held) {
                self.note("terminalization_confirmed", json!({ "turn_id": request.turn_id, "attempt": attempt }));
                if record["status"] == intent.status() && !held {
                    // The terminal write landed though its acknowledgement did not: the rest of
                    // finalisation has not run yet.
                    self.after_terminal(bus, &record).await;
                }
                outcome = Some((attempt, "recorded"));
                break;
            }
            if !is_current(&record, request) {
                outcome = Some((attempt, "the turn is no longer current"));
                break;
            }
            if self.handed_to(&request.session_id, Some(&record)).is_some() {
                outcome = Some((attempt, "the session was handed over"));
                break;
            }
            let mut terminal = match &intent {
                Intent::Record(terminal) => terminal.clone(),
                Intent::Failed { cause } => failed_record(record, cause, self.now()),
                Intent::Held { reason } => {
                    if self.write_hold(bus, request, record, reason).await.is_ok() {
                        outcome = Some((attempt, "held"));
                        break;
                    }
                    continue;
                }
            };
            if self.policy.settles_before_closing() {
                if let Err(reason) = self.settle_open_actions(bus, &mut terminal).await {
                    let _ = self.hold_record(bus, request, terminal, &reason).await;
                    outcome = Some((attempt, "held"));
                    break;
                }
            }
            terminal[FINALIZED_BY] = json!(self.env.host);
            self.transcribe_results(bus, &terminal, true).await;
            if self.finalize(bus, &terminal).await.is_ok() {
                self.note("terminalized", json!({ "turn_id": request.turn_id, "attempt": attempt }));
                outcome = Some((attempt, "recorded"));
                break;
            }
        }
        {
            // The deferred work is over: the token it kept is no longer needed.
            let lock = self.session_lock(&request.session_id);
            let _guard = lock.lock().await;
            self.pending_terminal.borrow_mut().remove(&request.session_id);
            self.release_lease(bus, &request.session_id).await;
        }
        match outcome {
            Some((_, "recorded" | "held")) => {}
            Some((attempt, why)) => self.note(
                "terminalization_abandoned",
                json!({ "turn_id": request.turn_id, "attempts": attempt, "why": why }),
            ),
            None => {
                self.note("terminalization_gave_up", json!({ "turn_id": request.turn_id, "attempts": retry.attempt() }))
            }
        }
    }

    /// Records a terminal turn, presents it on the session, and reseeds queued input.
    pub(super) async fn finalize(self: &Rc<Self>, bus: &Bus, terminal: &Value) -> Result<Value, InvokeError> {
        self.put_terminal(bus, terminal).await?;
        Ok(self.after_terminal(bus, terminal).await)
    }

    /// Everything after the terminal state is durable: presentation (tried once now, since the
    /// durable record already says what happened, and the answer's entry in the background until
    /// the transcript has it) and reseeding queued input.
    pub(super) async fn after_terminal(self: &Rc<Self>, bus: &Bus, terminal: &Value) -> Value {
        let session_id = &terminal["session_id"];
        self.present(bus, terminal).await;
        // Commands waiting on this turn, accepted here or by another worker, learn how it ended.
        if self.policy != Policy::InMemoryCancel
            || self.controls.borrow().contains_key(session_id.as_str().unwrap_or_default())
        {
            self.settle_commands_or_retry(bus, session_id.as_str().unwrap_or_default(), Some(terminal)).await;
        }
        self.announce(bus, terminal).await;
        let reseed = self.reseed_queued_input(bus, terminal).await;
        let mut result = json!({
            "session_id": session_id, "turn_id": terminal["turn_id"], "status": terminal["status"],
            "skipped": false, "next_step": null,
        });
        if let (true, Some(reseed)) = (self.policy.recovers(), reseed) {
            self.reseed_later_if_unfinished(bus, terminal, &reseed);
            result["reseed"] = reseed;
        }
        result
    }

    /// Shows a turn found ended on the session again: a worker that died between the terminal
    /// write and the presentation left the answer out of the transcript for good, so whoever
    /// finds the turn ended next (a stale delivery of it, an import of it) presents it, kept
    /// once by its key. Every end, as the direct path presents it: a turn a person closed too.
    pub(super) async fn present_again(&self, bus: &Bus, record: &Value) {
        if owed_presentation(record).is_some() {
            self.present(bus, record).await;
        }
    }

    /// Shows a terminal turn on the session: its answer (or its error) in the transcript, keyed by
    /// the turn so that a presentation made again is kept once (tried once now, and in the
    /// background until the transcript has it), and the session's status.
    async fn present(&self, bus: &Bus, terminal: &Value) {
        let session_id = &terminal["session_id"];
        let timeout = self.env.config.session_timeout_ms;
        let (mut entry, session_status) = presentation(terminal);
        let key =
            entry.as_object_mut().and_then(|e| e.remove("entry_key")).and_then(|k| k.as_str().map(str::to_string));
        // The known-bad presentation: the answer goes in unkeyed, as a plain message, so the
        // session cannot tell a presentation made again from a new one.
        let key = key.filter(|_| self.policy != Policy::UnkeyedAnswer);
        self.append_entry_tried(bus, session_id, key, entry, 1).await;
        let _ = bus
            .invoke("session::set-status", json!({ "session_id": session_id, "status": session_status }), timeout)
            .await;
    }

    /// When a reseed left the input queued (no turn was made of it), admits it later; when it
    /// made a turn it could neither enqueue nor hold, admits that turn later.
    fn reseed_later_if_unfinished(self: &Rc<Self>, bus: &Bus, predecessor: &Value, reseed: &Value) {
        if reseed["admitted"] == json!(false) && reseed["turn_id"].is_null() {
            let (worker, retry_bus, predecessor) = (Rc::clone(self), bus.clone(), predecessor.clone());
            tokio::task::spawn_local(async move { worker.reseed_later(&retry_bus, &predecessor).await });
        }
        self.admit_later_if_stranded(bus, reseed);
    }

    /// A turn whose record is written but which could be neither enqueued nor held (the worker
    /// was cut off from the engine: every try failed at once) has nobody to run it and nobody to
    /// find it until a worker starts. It is admitted again in the background ([`Retry`]), for as
    /// long as it is still running and not on the turn queue.
    fn admit_later_if_stranded(self: &Rc<Self>, bus: &Bus, admission: &Value) {
        if admission["admitted"] != json!(false) || admission["held"] != json!(false) {
            return;
        }
        let (Some(turn_id), Some(session_id)) = (admission["turn_id"].as_str(), admission["session_id"].as_str())
        else {
            return;
        };
        let (worker, bus) = (Rc::clone(self), bus.clone());
        let (turn_id, session_id) = (turn_id.to_string(), session_id.to_string());
        tokio::task::spawn_local(async move {
            let mut retry = worker.retry();
            while worker.next_try(&bus, &mut retry).await {
                let lock = worker.session_lock(&session_id);
                let _guard = lock.lock().await;
                let record = match worker.get_turn(&bus, &session_id).await {
                    Ok(Some(record)) if record["turn_id"] == json!(turn_id) && record["status"] == json!("running") => {
                        record
                    }
                    Ok(_) => return,
                    Err(_) => continue,
                };
                if worker.is_enqueued(&bus, &record).await {
                    return;
                }
                let again = worker.admit(&bus, record).await;
                if again["admitted"] == json!(true) || again["held"] == json!(true) {
                    worker.note("admission_recovered", json!({ "turn_id": turn_id, "attempt": retry.attempt() }));
                    return;
                }
            }
            worker.note("admission_abandoned", json!({ "turn_id": turn_id, "attempts": retry.attempt() }));
        });
    }

    async fn put_terminal(&self, bus: &Bus, record: &Value) -> Result<(), InvokeError> {
        let written = self.put_turn(bus, record).await;
        match written {
            Err(error) if error.outcome_unknown() && self.policy.recovers() => {
                // An unknown outcome does not prove the write is absent: one exact whole-record
                // readback, and no further write.
                match self.get_turn(bus, record["session_id"].as_str().unwrap_or_default()).await {
                    Ok(Some(observed))
                        if observed == *record
                            || (crate::planted!("ref-terminal-readback-compares-the-status")
                                && observed["turn_id"] == record["turn_id"]
                                && observed["status"] == record["status"]) =>
                    {
                        self.note("terminal_write_confirmed", json!({ "turn_id": record["turn_id"] }));
                        Ok(())
                    }
                    _ => Err(error),
                }
            }
            other => other,
        }
    }

    /// Moves input queued for the session into a new turn and enqueues it. `None` when nothing
    /// was queued; otherwise what became of it (`turn_id` is absent when the input is still
    /// queued and no turn was created).
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
        let (leftover, queued) = self.set_aside_spent_input(predecessor, queued);
        let spent_keys = self.remove_spent_input(bus, leftover).await;
        if queued.is_empty() {
            return None;
        }
        // The new turn names what it was made from, so an admission cut short can be finished
        // by whoever finds it: which turn it follows, and which queued entries it consumed.
        let turn = json!({
            "session_id": session_id, "turn_id": format!("t-{}", self.env.new_id()), "status": "running", "step": 0,
            "turn_count": 0, "depth": 0, "abort": false, "calls": {},
            "input": queued.iter().map(|e| e["value"]["message"].clone()).collect::<Vec<_>>(),
            "input_keys": queued.iter().map(|e| e["key"].clone()).collect::<Vec<_>>(),
            "predecessor": predecessor["turn_id"],
            "created_at": self.now(), "updated_at": self.now(),
        });
        let mut turn = turn;
        super::switch::carry_hand_over(Some(predecessor), &mut turn);
        // The predecessor's answer goes into the transcript before this turn's input: its own
        // append may have been refused, and the worker retrying it in the background may die,
        // so the turn that follows carries it (kept once, by its key).
        if let Some(entry) = owed_presentation(predecessor) {
            turn[PREDECESSOR_ENTRY] = entry;
        }
        if !spent_keys.is_empty() {
            turn[SPENT_KEYS] = json!(spent_keys);
        }
        if self.policy == Policy::RemoveBeforeAdmit {
            // The known-bad order: the input leaves the queue before the turn made of it exists.
            for key in turn[INPUT_KEYS].as_array().cloned().unwrap_or_default() {
                let _ = bus.invoke("state::delete", json!({ "scope": QUEUE_SCOPE, "key": key }), timeout).await;
            }
        }
        if crate::planted!("ref-input-removed-before-its-turn-is-written") {
            // (The planted bug: the queue is emptied first, "so nothing is admitted twice".)
            for entry in &queued {
                let _ =
                    bus.invoke("state::delete", json!({ "scope": QUEUE_SCOPE, "key": entry["key"] }), timeout).await;
            }
        }
        if let Err(error) = self.put_turn(bus, &turn).await {
            let landed = error.outcome_unknown()
                && matches!(self.get_turn(bus, session_id.as_str().unwrap_or_default()).await, Ok(Some(stored)) if stored == turn);
            if !landed {
                self.note("reseed_write_failed", json!({ "session_id": session_id, "error": error.to_string() }));
                return Some(json!({ "admitted": false, "error": error.to_string() }));
            }
        }
        Some(self.admit(bus, turn).await)
    }

    /// Splits queued entries into those an earlier turn was already admitted from (their removal
    /// failed after the admission) and those still to admit.
    fn set_aside_spent_input(&self, predecessor: &Value, queued: Vec<Value>) -> (Vec<Value>, Vec<Value>) {
        if self.policy == Policy::ReadmitConsumedInput {
            return (Vec::new(), queued);
        }
        let spent = |entry: &Value| {
            let fields: &[&str] =
                if crate::planted!("ref-spent-keys-not-carried") { &[INPUT_KEYS] } else { &[INPUT_KEYS, SPENT_KEYS] };
            fields.iter().any(|field| predecessor[field].as_array().is_some_and(|keys| keys.contains(&entry["key"])))
        };
        queued.into_iter().partition(spent)
    }

    /// Removes input an earlier turn was admitted from; the keys still there, for the next turn
    /// to carry on.
    async fn remove_spent_input(&self, bus: &Bus, leftover: Vec<Value>) -> Vec<Value> {
        let timeout = self.env.config.session_timeout_ms;
        let mut still_there = Vec::new();
        for entry in leftover {
            let removed =
                bus.invoke("state::delete", json!({ "scope": QUEUE_SCOPE, "key": entry["key"] }), timeout).await;
            // (The planted bug: a removal that failed is forgotten, and the input stays queued.)
            if removed.is_err() && !crate::planted!("ref-spent-input-removal-error-ignored") {
                still_there.push(entry["key"].clone());
            }
        }
        still_there
    }

    /// Puts a turn on the turn queue, trying up to `enqueue_attempts` times with a backoff
    /// between tries (an engine that restarts refuses every call at once until the worker is
    /// connected again): the attempt that got through, or the last error.
    pub(super) async fn enqueue_turn(&self, bus: &Bus, request: Value) -> Result<u32, String> {
        let timeout = self.env.config.session_timeout_ms;
        let queue = Action::Enqueue { queue: self.env.config.turn_queue.clone() };
        let attempts = self.env.config.enqueue_attempts;
        let mut last_error = String::new();
        for attempt in 1..=attempts {
            match bus.invoke_with(&self.env.function("turn"), request.clone(), Some(queue.clone()), timeout).await {
                Ok(_receipt) => return Ok(attempt),
                Err(error) => last_error = error.to_string(),
            }
            if attempt < attempts {
                self.env.clock.sleep(self.deferred_backoff(attempt)).await;
            }
        }
        Err(last_error)
    }

    /// Admits a new turn whose record is written: the input it consumed leaves the queue of
    /// input, and the turn goes to the turn queue (an exhausted enqueue holds it, with why).
    pub(super) async fn admit(&self, bus: &Bus, mut turn: Value) -> Value {
        let timeout = self.env.config.session_timeout_ms;
        for key in turn[INPUT_KEYS].as_array().cloned().unwrap_or_default() {
            let _ = bus.invoke("state::delete", json!({ "scope": QUEUE_SCOPE, "key": key }), timeout).await;
        }
        let turn_id = turn["turn_id"].clone();
        let request = json!({ "session_id": turn["session_id"], "turn_id": turn_id, "step": 0, "depth": 0 });
        let attempts = self.env.config.enqueue_attempts;
        let last_error = match self.enqueue_turn(bus, request).await {
            Ok(attempt) => {
                self.note("reseed_enqueued", json!({ "turn_id": turn_id, "attempt": attempt }));
                return json!({ "turn_id": turn_id, "admitted": true, "attempts": attempt });
            }
            Err(error) => error,
        };
        self.note("reseed_enqueue_exhausted", json!({ "turn_id": turn_id, "attempts": attempts, "error": last_error }));
        if !self.policy.recovers() {
            // The predecessor's result is returned as if nothing happened; the new turn stays
            // running with nothing to run it.
            return Value::Null;
        }
        turn["status"] = json!("held");
        turn["held_reason"] = json!(format!("enqueue exhausted after {attempts} attempts: {last_error}"));
        turn["updated_at"] = json!(self.now());
        let held = self.put_turn(bus, &turn).await.is_ok();
        json!({
            "turn_id": turn_id, "session_id": turn["session_id"], "admitted": false, "attempts": attempts,
            "error": last_error, "held": held,
        })
    }

    /// Whether the turn queue holds a message for `turn` (waiting, in flight or dead). When the
    /// queue cannot be asked, it is taken as not there: enqueueing a turn twice is harmless, as
    /// the second delivery finds it no longer current.
    async fn is_enqueued(&self, bus: &Bus, turn: &Value) -> bool {
        let inspect = json!({ "queue": self.env.config.turn_queue });
        let Ok(view) = bus.invoke("queue::inspect", inspect, self.env.config.session_timeout_ms).await else {
            return false;
        };
        let carries = |entry: &Value| entry["data"]["turn_id"] == turn["turn_id"];
        let in_groups = view["groups"].as_object().is_some_and(|groups| {
            groups.values().any(|g| {
                ["in_flight", "waiting"].iter().any(|stage| g[stage].as_array().is_some_and(|e| e.iter().any(carries)))
            })
        });
        in_groups || view["dlq"].as_array().is_some_and(|dead| dead.iter().any(carries))
    }

    /// Finishes what the finalisation of the delivered turn may have left undone when its worker
    /// died: input still queued after the turn ended is admitted, and a successor whose record
    /// was written but which never reached the turn queue is enqueued.
    pub(super) async fn finish_admission(self: &Rc<Self>, bus: &Bus, request: &TurnRequest, record: Option<&Value>) {
        let Some(record) = record.filter(|r| self.handed_to(&request.session_id, Some(r)).is_none()) else { return };
        let delivered = json!(request.turn_id);
        if record["turn_id"] == delivered && is_terminal(record) {
            self.present_again(bus, record).await;
            if let Some(reseed) = self.reseed_queued_input(bus, record).await {
                self.note("admission_finished", json!({ "after": request.turn_id, "reseed": reseed }));
                if self.policy.recovers() {
                    self.reseed_later_if_unfinished(bus, record, &reseed);
                }
            }
        } else if record["predecessor"] == delivered
            && record["status"] == json!("running")
            && !self.is_enqueued(bus, record).await
        {
            let admitted = self.admit(bus, record.clone()).await;
            self.note("admission_finished", json!({ "after": request.turn_id, "reseed": admitted }));
            if self.policy.recovers() {
                self.admit_later_if_stranded(bus, &admitted);
            }
        }
    }

    /// Puts a delegated child turn on the turn queue if it is not there: the worker that recorded
    /// it may have died before enqueueing it, and its parent may have ended without it.
    async fn finish_delegation(&self, bus: &Bus, child: &Value) {
        if self.is_enqueued(bus, child).await {
            return;
        }
        let request = json!({
            "session_id": child["session_id"], "turn_id": child["turn_id"], "step": child["step"], "depth": 1,
        });
        let enqueued = self.enqueue_turn(bus, request).await;
        self.note(
            "delegation_finished",
            json!({ "session_id": child["session_id"], "turn_id": child["turn_id"], "enqueued": enqueued.is_ok() }),
        );
    }

    /// Admits input that finalisation could not drain, once the store answers again; stops as
    /// soon as another turn of the session is running (its own finalisation reseeds).
    async fn reseed_later(self: &Rc<Self>, bus: &Bus, predecessor: &Value) {
        let session_id = predecessor["session_id"].as_str().unwrap_or_default().to_string();
        let mut retry = self.retry();
        while self.next_try(bus, &mut retry).await {
            let lock = self.session_lock(&session_id);
            let _guard = lock.lock().await;
            match self.get_turn(bus, &session_id).await {
                // A successor of this turn: its admission may have been cut short.
                Ok(Some(record)) if record["predecessor"] == predecessor["turn_id"] => {
                    let request = TurnRequest {
                        session_id: session_id.clone(),
                        turn_id: predecessor["turn_id"].as_str().unwrap_or_default().to_string(),
                        step: 0,
                    };
                    return self.finish_admission(bus, &request, Some(&record)).await;
                }
                Ok(Some(record)) if record["turn_id"] != predecessor["turn_id"] || !is_terminal(&record) => return,
                Ok(_) => {}
                Err(_) => continue,
            }
            match self.reseed_queued_input(bus, predecessor).await {
                Some(reseed) if reseed["admitted"] == json!(false) && reseed["turn_id"].is_null() => continue,
                reseed => {
                    self.note("reseed_recovered", json!({ "session_id": session_id, "attempt": retry.attempt() }));
                    if let Some(reseed) = reseed {
                        self.admit_later_if_stranded(bus, &reseed);
                    }
                    return;
                }
            }
        }
        self.note("reseed_gave_up", json!({ "session_id": session_id }));
    }

    /// Commands an earlier worker accepted and died before settling: a turn that has since
    /// ended, been held or paused settles them now (only such turns can, so the control records
    /// are read only when there is one). A parked turn reaches no safe point: a cancel or stop
    /// waiting on it is applied, and a resume recorded and never claimed makes its claim, each
    /// settled in the background until it is; so is a cancel or stop whose own application
    /// ended the turn before its worker died (the rest of that ending has not run).
    async fn settle_orphaned_commands(self: &Rc<Self>, bus: &Bus, turns: &[Value]) {
        // A resumed turn names the resume whose claim it is, which may never have been recorded
        // applied (its worker died first).
        let settled_states = |t: &&Value| {
            is_terminal(&t["value"])
                || matches!(t["value"]["status"].as_str(), Some("held" | "paused"))
                || !t["value"]["resumed_by"].is_null()
        };
        if !turns.iter().any(|t| settled_states(&t)) {
            return;
        }
        let Some(controls) = self.list_for_recovery(bus, crate::layout::CONTROL_SCOPE).await else { return };
        for control in &controls {
            let Some(session_id) = control["key"].as_str() else { continue };
            let waiting: Vec<(&String, &Value)> = control["value"]["commands"]
                .as_object()
                .into_iter()
                .flatten()
                .filter(|(_, c)| c["state"] == json!("accepted"))
                .collect();
            if waiting.is_empty() {
                continue;
            }
            let turn = turns.iter().find(|t| t["key"] == json!(session_id)).map(|t| &t["value"]);
            let status = turn.and_then(|t| t["status"].as_str()).unwrap_or_default();
            let mut left = false;
            for (key, command) in waiting {
                let kind = command["command"].as_str().unwrap_or_default();
                // One accepted for a turn that has ended since is settled with the others
                // below, never applied to the turn the session holds now.
                let of_this_turn = turn.is_none_or(|t| !self.names_another_turn(&command["turn_id"], t));
                let applies = of_this_turn
                    && match kind {
                        "resume" => status == "paused" || turn.is_some_and(|t| t["resumed_by"] == json!(key)),
                        "cancel" | "stop" => {
                            matches!(status, "held" | "paused")
                                || turn.is_some_and(|t| is_terminal(t) && t["control"]["idempotency_key"] == json!(key))
                        }
                        _ => false,
                    };
                if applies {
                    self.settle_command_later(bus, session_id, kind, key, false);
                } else {
                    left = true;
                }
            }
            if left {
                self.settle_commands_or_retry(bus, session_id, turn).await;
            }
        }
    }

    /// Settles a session's waiting commands; when the store does not let it, again in the
    /// background ([`Retry`]): a command left `accepted` after its turn ended waits for ever, as
    /// nobody else settles it while this worker lives.
    pub(super) async fn settle_commands_or_retry(self: &Rc<Self>, bus: &Bus, session_id: &str, turn: Option<&Value>) {
        if self.settle_commands(bus, session_id, turn).await.is_ok() {
            return;
        }
        let (worker, bus, session_id, turn) = (Rc::clone(self), bus.clone(), session_id.to_string(), turn.cloned());
        tokio::task::spawn_local(async move {
            let mut retry = worker.retry();
            while worker.next_try(&bus, &mut retry).await {
                if worker.settle_commands(&bus, &session_id, turn.as_ref()).await.is_ok() {
                    return;
                }
            }
            let attempts = retry.attempt();
            worker.note("command_settling_abandoned", json!({ "session_id": session_id, "attempts": attempts }));
        });
    }

    /// Finishes the terminal states a worker that died owed to running turns
    /// ([`TERMINAL_PENDING`]): their deliveries were answered, so nobody else will.
    async fn resume_terminal_pending(self: &Rc<Self>, bus: &Bus, turns: &[Value]) {
        for record in turns.iter().map(|e| &e["value"]).filter(|r| r["status"] == json!("running")) {
            let (Some(session_id), Some(turn_id)) = (record["session_id"].as_str(), record["turn_id"].as_str()) else {
                continue;
            };
            let Some(intent) = record.get(TERMINAL_PENDING).and_then(Intent::from_json) else { continue };
            if self.handed_to(session_id, Some(record)).is_some() {
                continue;
            }
            {
                let lock = self.session_lock(session_id);
                let _guard = lock.lock().await;
                // Its lease is kept until the deferred work is over, as when it was deferred here.
                if self.ensure_ownership(bus, session_id).await.is_err() {
                    continue;
                }
            }
            self.note("terminalization_resumed", json!({ "session_id": session_id, "turn_id": turn_id }));
            let request = TurnRequest {
                session_id: session_id.to_string(),
                turn_id: turn_id.to_string(),
                step: record["step"].as_u64().unwrap_or_default(),
            };
            let pending =
                PendingTerminal { turn_id: request.turn_id.clone(), intent: intent.clone(), left_in_record: true };
            self.pending_terminal.borrow_mut().insert(request.session_id.clone(), pending);
            let (worker, retry_bus) = (Rc::clone(self), bus.clone());
            tokio::task::spawn_local(async move { worker.terminalize_later(&retry_bus, &request, intent).await });
        }
    }

    /// Lists a scope for the recovery sweep, again on the settlement schedule ([`Retry`]) while
    /// the store does not answer: a sweep that gave up after a few failed reads (an outage
    /// outlasts them) would leave what it recovers (owed terminal states, queued input) for ever.
    async fn list_for_recovery(&self, bus: &Bus, scope: &str) -> Option<Vec<Value>> {
        let timeout = self.env.config.session_timeout_ms;
        let mut retry = self.retry();
        loop {
            if let Ok(Value::Array(entries)) = bus.invoke("state::list", json!({ "scope": scope }), timeout).await {
                return Some(entries);
            }
            if !self.next_try(bus, &mut retry).await {
                break;
            }
        }
        self.note("recovery_abandoned", json!({ "scope": scope, "attempts": retry.attempt() + 1 }));
        None
    }

    /// Reads a session's turn record for the recovery sweep, again on the settlement schedule
    /// while the store does not answer, as [`Self::list_for_recovery`] lists.
    async fn get_turn_for_recovery(&self, bus: &Bus, session_id: &str) -> Option<Value> {
        let mut retry = self.retry();
        loop {
            if let Ok(record) = self.get_turn(bus, session_id).await {
                return record;
            }
            if !self.next_try(bus, &mut retry).await {
                break;
            }
        }
        self.note(
            "recovery_abandoned",
            json!({ "scope": super::TURN_SCOPE, "key": session_id, "attempts": retry.attempt() + 1 }),
        );
        None
    }

    /// What a worker does when it starts: finish what died with an earlier worker. Deferred work
    /// lives in memory, so a crash loses it; the durable traces it leaves (a terminal state owed
    /// to a running turn, input still queued after its session's turn ended, a successor that
    /// never reached the turn queue, a turn it released a held call of) are what this sweep
    /// looks for.
    pub(super) async fn recover_on_start(self: Rc<Self>) {
        let bus = self.env.bus.clone();
        for _ in 0..RECOVERY_CONNECT_CHECKS {
            if bus.is_connected() {
                break;
            }
            self.env.clock.sleep(RECOVERY_CONNECT_CHECK_MS).await;
        }
        let Some(queued) = self.list_for_recovery(&bus, QUEUE_SCOPE).await else { return };
        let Some(turns) = self.list_for_recovery(&bus, super::TURN_SCOPE).await else { return };
        self.settle_orphaned_commands(&bus, &turns).await;
        for held in turns.iter().map(|e| &e["value"]).filter(|r| r["status"] == json!("held")) {
            self.watch_approvals(&bus, held);
        }
        self.resume_terminal_pending(&bus, &turns).await;
        self.present_unbacked_ends(&bus, &turns);
        self.watch_exported(&bus, &turns);
        // Sessions with input still queued, and sessions whose running turn was admitted from
        // input (it names its predecessor) or delegated by another turn (it names its parent),
        // and may never have reached the turn queue.
        let admitted = turns.iter().filter(|e| {
            e["value"]["status"] == json!("running")
                && (!e["value"]["predecessor"].is_null() || !e["value"]["parent"].is_null())
        });
        let sessions: std::collections::BTreeSet<String> = queued
            .iter()
            .chain(admitted)
            .filter_map(|e| e["value"]["session_id"].as_str().map(str::to_string))
            .collect();
        for session_id in sessions {
            let lock = self.session_lock(&session_id);
            let _guard = lock.lock().await;
            if self.ensure_ownership(&bus, &session_id).await.is_err() {
                continue;
            }
            let record = self.get_turn_for_recovery(&bus, &session_id).await;
            if let Some(child) = record.as_ref().filter(|r| r["status"] == json!("running") && !r["parent"].is_null()) {
                self.finish_delegation(&bus, child).await;
            } else if let Some(record) = record {
                let request = TurnRequest {
                    session_id: session_id.clone(),
                    // An ended turn's own admission, or the admission of the successor it became.
                    turn_id: if is_terminal(&record) { &record["turn_id"] } else { &record["predecessor"] }
                        .as_str()
                        .unwrap_or_default()
                        .to_string(),
                    step: 0,
                };
                self.finish_admission(&bus, &request, Some(&record)).await;
            }
            self.hand_back(&bus, &session_id).await;
        }
        self.drive_on_orphaned(&bus, &turns).await;
    }

    /// Shows again, on their sessions, the ended turns this worker's host ended with no queue
    /// delivery behind it: one it drove on itself or imported ([`Self::drives`]), or whose terminal
    /// state it recorded in the background ([`FINALIZED_BY`]). A worker that died between such a
    /// terminal write and its answer's append left the answer out of the transcript, and nothing
    /// delivers the turn again to find it ended (as a stale delivery does). Kept once by its key,
    /// so a presentation that had landed is not repeated.
    fn present_unbacked_ends(self: &Rc<Self>, bus: &Bus, turns: &[Value]) {
        let host = json!(self.env.host);
        let unbacked = turns
            .iter()
            .map(|e| &e["value"])
            .filter(|r| is_terminal(r) && (self.drives(r) || r[FINALIZED_BY] == host))
            .filter(|r| self.handed_to(r["session_id"].as_str().unwrap_or_default(), Some(r)).is_none());
        for record in unbacked {
            let (worker, bus, record) = (Rc::clone(self), bus.clone(), record.clone());
            tokio::task::spawn_local(async move { worker.present_again(&bus, &record).await });
        }
    }

    /// Running turns this worker drove on itself (it released a held call of one, denied a call
    /// whose approval expired, or resumed it) or imported (a takeover, a switch): it died doing
    /// it (it is only starting now), and nothing else may deliver them (an import's delivery on
    /// its queue's last attempt is dead-lettered by the crash, and the dead letter's handler
    /// leaves a session imported elsewhere to the harness that imported it).
    async fn drive_on_orphaned(self: &Rc<Self>, bus: &Bus, turns: &[Value]) {
        let driven = turns
            .iter()
            .map(|e| &e["value"])
            .filter(|r| r["status"] == json!("running") && self.drives(r) && r["parent"].is_null());
        for record in driven {
            let (Some(session_id), Some(turn_id)) = (record["session_id"].as_str(), record["turn_id"].as_str()) else {
                continue;
            };
            let step = record["step"].as_u64().unwrap_or_default();
            self.note("turn_driven_on", json!({ "session_id": session_id, "turn_id": turn_id, "step": step }));
            let request = TurnRequest { session_id: session_id.to_string(), turn_id: turn_id.to_string(), step };
            let (worker, bus) = (Rc::clone(self), bus.clone());
            tokio::task::spawn_local(async move { worker.drive_on(&bus, request).await });
        }
    }

    /// A background settlement's schedule, beginning now.
    pub(super) fn retry(&self) -> Retry {
        Retry::begin(&self.env)
    }

    /// Waits for the next try of `retry`: its backoff, then until this worker is connected to the
    /// engine (a try made while it is cut off fails at once). False once `settle_within_ms` has
    /// passed since the settlement began: the caller notes that it gave up, and after how many
    /// tries ([`Retry::attempt`]).
    pub(super) async fn next_try(&self, bus: &Bus, retry: &mut Retry) -> bool {
        retry.next(&self.env, bus).await
    }

    /// Whether this worker's host drives a turn itself, with no queue delivery behind it: it
    /// drove it on (`DRIVEN_BY`), or imported its session (the record names it as its harness).
    fn drives(&self, record: &Value) -> bool {
        let host = json!(self.env.host);
        record[super::DRIVEN_BY] == host || record[super::switch::HARNESS_FIELD] == host
    }

    /// Runs a turn no queue delivers, which this worker drives (`DRIVEN_BY`, or imported): a try that could not
    /// run it (another worker holds the session's lease for now, or the store or the lease did
    /// not answer) leaves the turn as it was, so it is tried again in the background ([`Retry`])
    /// while the turn is still running and this worker's to drive.
    pub(super) async fn drive_on(self: &Rc<Self>, bus: &Bus, request: TurnRequest) {
        if self.drive_once(bus, &request).await {
            return;
        }
        let still_ours =
            |r: &Value| r["status"] == json!("running") && r["turn_id"] == json!(request.turn_id) && self.drives(r);
        let mut retry = self.retry();
        while self.next_try(bus, &mut retry).await {
            match self.get_turn(bus, &request.session_id).await {
                Ok(Some(record)) if still_ours(&record) => {}
                Ok(_) => return,
                Err(_) => continue,
            }
            if self.drive_once(bus, &request).await {
                return;
            }
        }
        self.note(
            "drive_on_abandoned",
            json!({ "session_id": request.session_id, "turn_id": request.turn_id, "attempts": retry.attempt() + 1 }),
        );
    }

    /// One try of [`Self::drive_on`]: whether this worker took the session and ran the turn's
    /// delivery to an answer. A refusal of the lease is no answer: the worker holding it now may
    /// be doing something else with the session (applying a command, handling a dead letter),
    /// and nobody but this worker will run the turn once it lets go.
    async fn drive_once(self: &Rc<Self>, bus: &Bus, request: &TurnRequest) -> bool {
        let lock = self.session_lock(&request.session_id);
        let _guard = if self.policy.locks_sessions() { Some(lock.lock().await) } else { None };
        if self.ensure_ownership(bus, &request.session_id).await.is_err() {
            return false;
        }
        let result = self.owned_turn(bus, request.clone()).await;
        self.hand_back(bus, &request.session_id).await;
        result.is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::harness::HarnessConfig;

    fn config(terminalize_backoff_ms: u64, lease_ttl_ms: u64) -> HarnessConfig {
        HarnessConfig { terminalize_backoff_ms, lease_ttl_ms, ..HarnessConfig::default() }
    }

    #[test]
    fn a_deferred_retry_waits_twice_as_long_each_time_up_to_its_cap() {
        let waits: Vec<u64> = (1..=4).map(|attempt| deferred_backoff(&config(100, 0), attempt)).collect();
        assert_eq!(waits, [100, 200, 400, 800]);
        assert_eq!(deferred_backoff(&config(100, 0), 40), DEFERRED_BACKOFF_MS_MAX);
    }

    /// What a live run is told: the capped backoff, or a third of the lease (the pause between
    /// renewals) when that is longer.
    #[test]
    fn a_worker_waits_by_itself_at_most_its_capped_backoff_or_a_renewal_pause() {
        assert_eq!(longest_own_wait_ms(&config(100, 0)), DEFERRED_BACKOFF_MS_MAX);
        assert_eq!(longest_own_wait_ms(&config(100, 3_000)), DEFERRED_BACKOFF_MS_MAX);
        assert_eq!(longest_own_wait_ms(&config(100, 30_000)), 10_000);
    }
}
