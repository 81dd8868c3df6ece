//! The control plane: stop, cancel, pause and resume as durable commands.
//!
//! A command names its session, carries an idempotency key (a command sent twice is answered
//! twice the same) and optionally the turn-record version the sender saw. It is answered with its
//! state: `accepted` (recorded durably, not yet in effect), `applied` (the turn changed at a safe
//! point), `rejected` (it cannot apply: the turn changed, ended, or another claim won) or
//! `expired` (the turn ended before it could apply). "Accepted" is never reported as "applied".
//!
//! Commands live in the session's control record (scope `harness_control`), so a worker that
//! starts a turn, or resumes one after a crash, learns of them; the worker that accepted one also
//! flags it in memory, so the turn it is running stops at its next safe point: before a model
//! call, before a tool is dispatched, after a tool's outcome is recorded. A call already under
//! way is never interrupted: it finishes, and its outcome is reconciled.
//!
//! Cancellation ends the turn `cancelled`, with how it ended: `cancelled-with-no-effect`,
//! `completed-before-cancellation` (an effect in flight when it was requested completed), or
//! `unresolved-effect` (one may have happened: the turn is held for a person). Resume is a claim:
//! a compare-and-set on the paused record that bumps its epoch and names its owner, then a new
//! lease (a newer fencing token); of two resumes at once, one wins.

use super::actions::is_effect;
use super::{error_body, is_terminal, Policy, Stop, TurnRequest, Worker, TURN_SCOPE};
use crate::bus::{Bus, ErrorBody};
use crate::layout::CONTROL_SCOPE;
use serde_json::{json, Value};
use std::rc::Rc;

/// How often a command retries its compare-and-set on the control record when another command
/// of the session changed it meanwhile.
const CONTROL_WRITE_ATTEMPTS: u32 = 4;

impl Worker {
    /// A command this worker accepted for `session_id` and has not applied yet.
    pub(super) fn pending_control(&self, session_id: &str) -> Option<(String, String)> {
        self.controls.borrow().get(session_id).cloned()
    }

    /// A safe point of a turn: a command accepted for its session stops it here.
    pub(super) fn check_control(&self, session_id: &str) -> Result<(), Stop> {
        match self.pending_control(session_id) {
            Some((kind, key)) => Err(Stop::Control { kind, key }),
            None => Ok(()),
        }
    }

    /// The session's turn record (null if none) with its version: what a claim on it expects.
    async fn turn_with_version(&self, bus: &Bus, session_id: &str) -> Result<(Value, u64), ErrorBody> {
        let read = json!({ "scope": TURN_SCOPE, "key": session_id, "versioned": true });
        let timeout = self.env.config.session_timeout_ms;
        let mut turn = bus.invoke("state::get", read, timeout).await.map_err(|e| error_body("get_turn", &e))?;
        // Taken out of the reply, which is dropped here: no copy.
        let version = turn["version"].as_u64().unwrap_or(0);
        Ok((turn.get_mut("value").map(Value::take).unwrap_or_default(), version))
    }

    async fn control_record(&self, bus: &Bus, session_id: &str) -> Result<(Value, u64), ErrorBody> {
        let read = json!({ "scope": CONTROL_SCOPE, "key": session_id, "versioned": true });
        let mut found = bus
            .invoke("state::get", read, self.env.config.session_timeout_ms)
            .await
            .map_err(|e| error_body("control", &e))?;
        let version = found["version"].as_u64().unwrap_or(0);
        let record = if found["value"].is_null() {
            json!({ "session_id": session_id, "commands": {} })
        } else {
            // Taken out of the reply, which is dropped here: no copy.
            found.get_mut("value").map(Value::take).unwrap_or_default()
        };
        if let Some(flaw) = super::shape::control_record_flaw(&record) {
            // Nothing is recorded over it: a person must look at it first.
            return Err(ErrorBody::new("malformed_record", format!("the control record of {session_id}: {flaw}")));
        }
        Ok((record, version))
    }

    /// Updates one command in the session's control record, with a compare-and-set so commands
    /// arriving together do not erase each other.
    async fn update_command(
        &self,
        bus: &Bus,
        session_id: &str,
        key: &str,
        change: &dyn Fn(&mut Value),
    ) -> Result<Value, ErrorBody> {
        for _ in 0..CONTROL_WRITE_ATTEMPTS {
            let (mut record, version) = self.control_record(bus, session_id).await?;
            change(&mut record["commands"][key]);
            let write =
                json!({ "scope": CONTROL_SCOPE, "key": session_id, "value": record, "expected_version": version });
            self.control_writes.set(self.control_writes.get() + 1);
            let swapped = bus
                .invoke("state::compare-and-set", write, self.env.config.session_timeout_ms)
                .await
                .map_err(|e| error_body("control", &e))?;
            if swapped["swapped"] == json!(true) {
                return Ok(record["commands"][key].clone());
            }
        }
        Err(ErrorBody::new("contended", format!("the control record of {session_id} kept changing")))
    }

    /// The answer to a command: its state as recorded, and what it is about.
    fn answer(session_id: &str, key: &str, command: &Value) -> Value {
        let mut answer = command.clone();
        answer["session_id"] = json!(session_id);
        answer["idempotency_key"] = json!(key);
        answer
    }

    /// Handles `{host}::stop|cancel|pause|resume`.
    pub(super) async fn command(self: &Rc<Self>, bus: &Bus, kind: &str, data: &Value) -> Result<Value, ErrorBody> {
        let text = |field: &str| data[field].as_str().map(str::to_string);
        let session_id = text("session_id").ok_or_else(|| ErrorBody::new("bad_request", "missing `session_id`"))?;
        let key = text("idempotency_key").ok_or_else(|| ErrorBody::new("bad_request", "missing `idempotency_key`"))?;
        let lock = self.control_lock(&session_id);
        let _guard = lock.lock().await;
        let (control, _) = self.control_record(bus, &session_id).await?;
        if !control["commands"][&key].is_null() {
            // The same command again: the same answer, whatever state it reached since.
            return Ok(Self::answer(&session_id, &key, &control["commands"][&key]));
        }
        let (record, version) = self.turn_with_version(bus, &session_id).await?;
        let refusal = if record.is_null() {
            Some("the session has no turn".to_string())
        } else if let Some(to) = self.handed_to(&session_id, Some(&record)) {
            Some(format!("the session was handed over to {to}"))
        } else if data["expected_version"].as_u64().is_some_and(|expected| expected != version) {
            Some(format!(
                "the turn changed: version {version}, not the {} the command expected",
                data["expected_version"]
            ))
        } else if is_terminal(&record) {
            Some(format!("the turn already ended: {}", record["status"].as_str().unwrap_or("?")))
        } else if kind == "resume" && record["status"] != json!("paused") {
            Some(format!("the turn is not paused but {}", record["status"].as_str().unwrap_or("?")))
        } else if kind == "pause" && record["status"] == json!("paused") {
            Some("the turn is already paused".to_string())
        } else {
            None
        };
        let entry = json!({
            "command": kind, "turn_id": record["turn_id"], "reason": data["reason"], "requested_at_ms": self.now(),
            "state": if refusal.is_some() { "rejected" } else { "accepted" }, "why": refusal,
        });
        let recorded = match self.update_command(bus, &session_id, &key, &|c| *c = entry.clone()).await {
            Ok(recorded) => recorded,
            Err(error) => {
                if refusal.is_none() {
                    self.settle_command_later(bus, &session_id, kind, &key, true);
                }
                return Err(error);
            }
        };
        if refusal.is_some() {
            return Ok(Self::answer(&session_id, &key, &recorded));
        }
        if kind == "resume" {
            return self.resume(bus, &session_id, &key, record, version).await;
        }
        self.controls.borrow_mut().insert(session_id.clone(), (kind.to_string(), key.clone()));
        // The released binary only flagged a stop and waited for a running turn to notice it.
        if !self.policy.recovers() {
            return Ok(Self::answer(&session_id, &key, &recorded));
        }
        // Nothing of this session runs here: the turn is at a safe point now, so apply at once.
        let session_lock = self.session_lock(&session_id);
        let Ok(_turn_guard) = session_lock.try_lock() else {
            // The turn is busy here: it applies the command at its next safe point. It may have
            // none left (it is holding or finishing), so the command is also applied once the
            // session is free, if it is still waiting then.
            if self.policy == Policy::InMemoryCancel {
                // The known-bad policy keeps its one try.
                let (worker, bus, kind) = (Rc::clone(self), bus.clone(), kind.to_string());
                let (session, command_key) = (session_id.clone(), key.clone());
                tokio::task::spawn_local(
                    async move { worker.apply_when_free(&bus, &session, &kind, &command_key).await },
                );
            } else {
                self.settle_command_later(bus, &session_id, kind, &key, false);
            }
            if self.policy == Policy::AppliedOnAccept {
                // The known-bad reply: what the command will do, told as done.
                let mut told = recorded.clone();
                told["state"] = json!("applied");
                return Ok(Self::answer(&session_id, &key, &told));
            }
            return Ok(Self::answer(&session_id, &key, &recorded));
        };
        if !self.apply_as_owner(bus, &session_id, kind, &key, &record["turn_id"]).await {
            // Another worker holds the session, or its lease could not be had: the command is
            // applied once it can be (a parked turn reaches no safe point to apply it itself).
            self.settle_command_later(bus, &session_id, kind, &key, false);
            return Ok(Self::answer(&session_id, &key, &recorded));
        }
        // Whatever applying it did (ended the turn, held it, failed half-way), the reply is the
        // command's own durable state: never more than the store says.
        match self.control_record(bus, &session_id).await {
            Ok((control, _)) if !control["commands"][&key].is_null() => {
                if control["commands"][&key]["state"] == json!("accepted") {
                    self.settle_command_later(bus, &session_id, kind, &key, false);
                }
                Ok(Self::answer(&session_id, &key, &control["commands"][&key]))
            }
            _ => {
                self.settle_command_later(bus, &session_id, kind, &key, false);
                Ok(Self::answer(&session_id, &key, &recorded))
            }
        }
    }

    /// A command whose application to a held or paused turn could not be recorded: it is still
    /// `accepted` in the store, so it is applied again once the store answers (and by a worker
    /// that starts, should this one die first).
    fn apply_again_later(self: &Rc<Self>, bus: &Bus, session_id: &str, kind: &str, key: &str) -> ErrorBody {
        self.note("command_application_deferred", json!({ "session_id": session_id, "command": key }));
        self.settle_command_later(bus, session_id, kind, key, false);
        ErrorBody::new("unavailable", format!("the {kind} {key} could not be recorded yet"))
    }

    /// A command recorded `accepted` that nothing is sure to apply (its turn is parked, so it
    /// reaches no safe point; the worker that went to apply it could not take the session; the
    /// store left its write or its application without an answer): applied in the background
    /// ([`super::finalize::Retry`]) until the store no longer holds it `accepted`. A resume makes
    /// its claim, or learns whether its claim landed. One such settlement per command at a time.
    /// `unconfirmed`: the command's own write got no answer, so it may not be recorded at all (its
    /// caller was told so): then there is nothing to settle.
    pub(super) fn settle_command_later(
        self: &Rc<Self>,
        bus: &Bus,
        session_id: &str,
        kind: &str,
        key: &str,
        unconfirmed: bool,
    ) {
        // The known-bad policies keep their bugs.
        if !self.policy.recovers() || self.policy == Policy::InMemoryCancel {
            return;
        }
        let settling = (session_id.to_string(), key.to_string());
        if !self.settling.borrow_mut().insert(settling.clone()) {
            return;
        }
        let (worker, bus, session_id, kind, key) =
            (Rc::clone(self), bus.clone(), session_id.to_string(), kind.to_string(), key.to_string());
        tokio::task::spawn_local(async move {
            let mut retry = worker.retry();
            let mut found = false;
            let settled = loop {
                if !worker.next_try(&bus, &mut retry).await {
                    break false;
                }
                let Ok((control, _)) = worker.control_record(&bus, &session_id).await else { continue };
                if control["commands"][&key]["state"] != json!("accepted") {
                    // A resume settled elsewhere (another worker found its claim and recorded it
                    // applied) may have left its turn to this worker to drive.
                    if kind == "resume" && !worker.drive_if_claimed_here(&bus, &session_id, &key).await {
                        continue;
                    }
                    break true;
                }
                if unconfirmed && !found {
                    found = true;
                    worker.note("command_found_recorded", json!({ "session_id": session_id, "command": key }));
                }
                if kind == "resume" {
                    worker.claim_recorded_resume(&bus, &session_id, &key, &control["commands"][&key]["turn_id"]).await;
                } else {
                    worker.apply_when_free(&bus, &session_id, &kind, &key).await;
                }
            };
            worker.settling.borrow_mut().remove(&settling);
            if !settled {
                let attempts = retry.attempt();
                worker.note(
                    "command_unsettled",
                    json!({ "session_id": session_id, "command": key, "attempts": attempts }),
                );
            }
        });
    }

    /// Drives on the turn a claim of resume `key` made this worker's, if it is still running:
    /// whether that is settled (false: the turn could not be read).
    async fn drive_if_claimed_here(self: &Rc<Self>, bus: &Bus, session_id: &str, key: &str) -> bool {
        let Ok(record) = self.get_turn(bus, session_id).await else { return false };
        let record = record.unwrap_or_default();
        let claimed_here = record["resumed_by"] == json!(key) && record[super::DRIVEN_BY] == json!(self.env.host);
        if claimed_here && record["status"] == json!("running") {
            self.drive_resumed(bus, &record);
        }
        true
    }

    /// A resume recorded `accepted` whose claim was never confirmed: the claim is made now, if
    /// the turn is still paused; a claim of this command found landed is driven on (by this
    /// worker when the claim names it) and recorded applied; otherwise the command is settled by
    /// what the turn became.
    pub(super) async fn claim_recorded_resume(
        self: &Rc<Self>,
        bus: &Bus,
        session_id: &str,
        key: &str,
        turn_id: &Value,
    ) {
        let lock = self.control_lock(session_id);
        let _guard = lock.lock().await;
        let Ok((record, version)) = self.turn_with_version(bus, session_id).await else { return };
        if record["status"] == json!("paused") && !self.names_another_turn(turn_id, &record) {
            let _ = self.resume(bus, session_id, key, record, version).await;
        } else if record["resumed_by"] == json!(key) {
            let _ = self.resume_landed(bus, session_id, key, &record).await;
        } else {
            let _ = self.settle_commands(bus, session_id, Some(&record)).await;
        }
    }

    /// Applies a command accepted while its turn was busy, once the session is free, unless the
    /// turn settled it meanwhile.
    async fn apply_when_free(self: &Rc<Self>, bus: &Bus, session_id: &str, kind: &str, key: &str) {
        let lock = self.session_lock(session_id);
        let _guard = lock.lock().await;
        let Ok((control, _)) = self.control_record(bus, session_id).await else { return };
        let command = &control["commands"][key];
        if command["state"] == json!("accepted") {
            self.apply_as_owner(bus, session_id, kind, key, &command["turn_id"]).await;
        }
    }

    /// With the session's lock held: applies a command as the session's owner, unless a deferred
    /// terminalisation of it is pending (which settles commands itself) or the session has
    /// another owner. Whether it was tried (it may have failed half-way: the command then
    /// still waits, `accepted`).
    ///
    /// No delivery of the turn is running it here, so a rival may claim it (a resume's
    /// compare-and-set, which takes no lease and raises the turn's epoch) at any moment: the
    /// turn's claim is read before this worker's lease is granted, and the command is applied
    /// only if no other claim came since (one that came before is older than the grant), and
    /// written over the version it read.
    async fn apply_as_owner(
        self: &Rc<Self>,
        bus: &Bus,
        session_id: &str,
        kind: &str,
        key: &str,
        turn_id: &Value,
    ) -> bool {
        if self.pending_terminal.borrow().contains_key(session_id) {
            return false;
        }
        let Ok((before, _)) = self.turn_with_version(bus, session_id).await else { return false };
        if self.ensure_ownership(bus, session_id).await.is_err() {
            return false;
        }
        let _ = self.apply_control_over(bus, session_id, kind, key, turn_id, Some(before["epoch"].clone())).await;
        self.hand_back(bus, session_id).await;
        true
    }

    /// A turn stopped at a safe point by a command: cancel and stop end it (settling what was
    /// in flight), pause parks it. Reads the turn's latest durable record.
    pub(super) async fn apply_control(
        self: &Rc<Self>,
        bus: &Bus,
        session_id: &str,
        kind: &str,
        key: &str,
    ) -> Result<Value, ErrorBody> {
        self.apply_control_over(bus, session_id, kind, key, &Value::Null, None).await
    }

    /// [`Self::apply_control`] by a worker that is not running the turn, which read the turn's
    /// claim (`epoch_before`) before it took the session ([`Self::apply_as_owner`]): every write
    /// is a compare-and-set on the version it reads, and what it cannot write is left to the
    /// command's own settlement, still `accepted` (there is no delivery to answer). `None`: by the
    /// worker that is running the turn (at one of its safe points), or holds it (a dead letter's
    /// handler).
    async fn apply_control_over(
        self: &Rc<Self>,
        bus: &Bus,
        session_id: &str,
        kind: &str,
        key: &str,
        turn_id: &Value,
        epoch_before: Option<Value>,
    ) -> Result<Value, ErrorBody> {
        let record = self.get_turn(bus, session_id).await.map_err(|e| error_body("get_turn", &e))?;
        if let Some(to) = self.handed_to(session_id, record.as_ref()) {
            return Err(ErrorBody::new("not_owner", format!("the session was handed over to {to}")));
        }
        let Some(mut record) = record else { return self.settle_commands(bus, session_id, None).await };
        if is_terminal(&record) {
            if record["control"]["idempotency_key"] == json!(key) {
                // This command's own application landed though its answer did not: the rest of
                // finalisation (the transcript closed, presentation, input queued behind the
                // turn) has not run yet.
                self.transcribe_results(bus, &record, true).await;
                self.after_terminal(bus, &record).await;
            }
            return self.settle_commands(bus, session_id, Some(&record)).await;
        }
        if self.names_another_turn(turn_id, &record) {
            // The turn the command was for ended and a later one is the session's now (its
            // worker died before settling it): it is settled as a command of an ended turn, and
            // never moves this one.
            return self.settle_commands(bus, session_id, Some(&record)).await;
        }
        let request = TurnRequest {
            session_id: session_id.to_string(),
            turn_id: record["turn_id"].as_str().unwrap_or_default().to_string(),
            step: record["step"].as_u64().unwrap_or(0),
        };
        if kind == "pause" && record["status"] != json!("running") {
            // Only a running turn can be parked: a pause waiting on a held or paused one is
            // settled by what the turn is.
            return self.settle_commands(bus, session_id, Some(&record)).await;
        }
        // A held or paused turn, like any turn no delivery runs here, has no delivery to answer:
        // what this application cannot record is retried as the command, still `accepted`, not
        // deferred as a running turn's owed terminal state. And nothing keeps a rival from
        // claiming it meanwhile (a resume's compare-and-set): it is written only over the version
        // read (for a worker not running it, the version it read before its lease was granted).
        let at_rest = record["status"] != json!("running");
        let claimed_since = epoch_before.as_ref().is_some_and(|before| *before != record["epoch"]);
        // (The known-bad application trusts the lease to keep every rival out and writes plainly,
        // fenced by its token alone: a claim, which takes no lease, lands between read and write.)
        let over_version = self.policy != Policy::CommandWithoutCas;
        let version = if over_version && (at_rest || epoch_before.is_some()) {
            let (again, version) = self.turn_with_version(bus, session_id).await?;
            if again != record || claimed_since {
                return Err(ErrorBody::new("contended", "the turn changed as the command was applied"));
            }
            Some(version)
        } else {
            None
        };
        let control = self.control_record(bus, session_id).await?.0;
        let requested_at = control["commands"][key]["requested_at_ms"].as_u64().unwrap_or(0);
        record["control"] = json!({ "command": kind, "idempotency_key": key, "requested_at_ms": requested_at });
        record["updated_at"] = json!(self.now());
        if kind == "pause" {
            record["status"] = json!("paused");
            record["paused_reason"] = json!(format!("paused by command {key}"));
            let written = match version {
                Some(version) => matches!(self.put_turn_over(bus, &record, version).await, Ok(true)),
                None => self.write(bus, &record).await.is_ok(),
            };
            if !written {
                return Err(ErrorBody::new("unavailable", "could not record the pause"));
            }
            self.note("turn_paused", json!({ "session_id": session_id, "turn_id": request.turn_id, "command": key }));
            return self.settle_commands(bus, session_id, Some(&record)).await;
        }
        // What was under way when the cancellation came is reconciled first: its outcome decides
        // how the turn ended.
        // (An action already held for a person is as unresolved as one that cannot be settled now.)
        if let Err(reason) = self.settle_open_actions(bus, &mut record).await {
            record["cancellation"] = json!("unresolved-effect");
            self.note(
                "turn_cancelled",
                json!({ "session_id": session_id, "turn_id": request.turn_id, "cancellation": "unresolved-effect" }),
            );
            let reason = format!("cancelled with an unresolved effect: {reason}");
            if version.is_some() {
                return match self.write_hold_over(bus, &request, record, &reason, version).await {
                    Ok(reply) => Ok(reply),
                    Err(_) => Err(self.apply_again_later(bus, session_id, kind, key)),
                };
            }
            return self.hold_record(bus, &request, record, &reason).await;
        }
        // How it ended follows from the evidence: what the turn's effects did, however their
        // outcome became known, not when the button was pressed.
        let effect_happened = match self.policy {
            Policy::CancelByClock => self.actions_completed_since(&record, requested_at),
            Policy::CancelCountsReads => self.call_completed(&record),
            _ => self.effect_completed(&record),
        };
        record["status"] = json!("cancelled");
        record["cancellation"] =
            json!(if effect_happened { "completed-before-cancellation" } else { "cancelled-with-no-effect" });
        if let Some(version) = version {
            // Over the version read, or not at all: the transcript is closed once the end is
            // recorded (a rival's claim would run those calls), and again by whoever finds this
            // end recorded with the command still waiting.
            match self.put_turn_over(bus, &record, version).await {
                Ok(true) => {}
                Ok(false) => return Err(ErrorBody::new("contended", "the turn changed as the command was applied")),
                Err(_) => return Err(self.apply_again_later(bus, session_id, kind, key)),
            }
            self.note(
                "turn_cancelled",
                json!({ "session_id": session_id, "turn_id": request.turn_id, "cancellation": record["cancellation"] }),
            );
            self.transcribe_results(bus, &record, true).await;
            self.after_terminal(bus, &record).await;
            return self.settle_commands(bus, session_id, Some(&record)).await;
        }
        self.note(
            "turn_cancelled",
            json!({ "session_id": session_id, "turn_id": request.turn_id, "cancellation": record["cancellation"] }),
        );
        // The transcript closes every call of the turn, as any turn's end does.
        self.transcribe_results(bus, &record, true).await;
        match self.finalize(bus, &record).await {
            Ok(_) => self.settle_commands(bus, session_id, Some(&record)).await,
            Err(error) => self.unfinalized(bus, &request, super::finalize::Intent::Record(record), &error).await,
        }
    }

    /// A cancel or stop accepted for a turn that its worker then lost (cut off from the store
    /// or the engine before it could apply it) waits for ever once the turn is held: a person
    /// would be asked about a turn somebody already asked to end. Applied now by the owner; the
    /// turn's other waiting commands are settled as a held turn settles them. An error when one
    /// is still waiting (the store refused its application).
    pub(super) async fn apply_waiting_cancellations(
        self: &Rc<Self>,
        bus: &Bus,
        session_id: &str,
    ) -> Result<(), ErrorBody> {
        let waiting = |control: &Value| -> Vec<(String, String, Value)> {
            control["commands"]
                .as_object()
                .into_iter()
                .flatten()
                .filter(|(_, c)| {
                    c["state"] == json!("accepted") && matches!(c["command"].as_str(), Some("cancel" | "stop"))
                })
                .map(|(key, c)| {
                    (key.clone(), c["command"].as_str().unwrap_or_default().to_string(), c["turn_id"].clone())
                })
                .collect()
        };
        let (control, _) = self.control_record(bus, session_id).await?;
        for (key, kind, turn_id) in &waiting(&control) {
            // Applied with the turn it was recorded for: one whose turn ended before this turn
            // began (its worker died before settling it) is settled as too late, never applied
            // to the turn this handler holds.
            let _ = self.apply_control_over(bus, session_id, kind, key, turn_id, None).await;
        }
        let _ = self.settle_commands(bus, session_id, None).await;
        let (control, _) = self.control_record(bus, session_id).await?;
        match waiting(&control).first() {
            Some((key, kind, _)) => {
                Err(ErrorBody::new("unavailable", format!("the {kind} {key} could not be applied yet")))
            }
            None => Ok(()),
        }
    }

    /// After a turn reached a state commands wait for (ended, or paused): every command of it
    /// still `accepted` is `applied` if that state is its doing, or `expired` if the turn ended
    /// otherwise. The answer is the last command's.
    pub(super) async fn settle_commands(
        &self,
        bus: &Bus,
        session_id: &str,
        turn: Option<&Value>,
    ) -> Result<Value, ErrorBody> {
        let (mut control, _) = self.control_record(bus, session_id).await?;
        // The turn is only read: a record handed in is not copied.
        let fetched;
        let turn = match turn {
            Some(turn) => turn,
            None => {
                fetched = self.get_turn(bus, session_id).await.ok().flatten().unwrap_or(Value::Null);
                &fetched
            }
        };
        let mut last = Value::Null;
        // Taken out of the record read for them, which is not used again: no copies.
        let pending: Vec<(String, Value)> = match control.get_mut("commands").map(Value::take) {
            Some(Value::Object(commands)) => {
                commands.into_iter().filter(|(_, v)| v["state"] == json!("accepted")).collect()
            }
            _ => Vec::new(),
        };
        for (key, command) in pending {
            let kind = command["command"].as_str().unwrap_or("");
            let done = match (kind, turn["status"].as_str()) {
                // Accepted for a turn that has ended since (the session holds a later one): as
                // for any ended turn, a stop has what it asked for and the rest came too late.
                ("stop", _) if self.names_another_turn(&command["turn_id"], turn) => {
                    Some(("applied", format!("the turn {} ended", command["turn_id"].as_str().unwrap_or("?"))))
                }
                (_, _) if self.names_another_turn(&command["turn_id"], turn) => Some((
                    "expired",
                    format!("the turn {} ended before the {kind} applied", command["turn_id"].as_str().unwrap_or("?")),
                )),
                ("pause", Some("paused")) => Some(("applied", "the turn is paused".to_string())),
                ("cancel" | "stop", Some("cancelled")) => {
                    Some(("applied", turn["cancellation"].as_str().unwrap_or("cancelled").to_string()))
                }
                ("cancel" | "stop", Some("held")) if turn["cancellation"] == json!("unresolved-effect") => {
                    Some(("applied", "unresolved-effect".to_string()))
                }
                // The turn ended by itself: a stop has what it asked for; a cancellation or a
                // pause came too late to change anything.
                ("stop", Some(status)) if is_terminal(turn) => Some(("applied", format!("the turn ended {status}"))),
                ("cancel", Some(status)) if is_terminal(turn) => {
                    Some(("expired", format!("the turn ended {status} before the cancellation applied")))
                }
                ("pause", _) if is_terminal(turn) => {
                    Some(("expired", "the turn ended before it could pause".to_string()))
                }
                ("pause", Some("held")) => Some(("expired", "the turn is held for a person".to_string())),
                // A resume whose claim landed but was never recorded applied (its worker died, or
                // the store did not answer): the turn names it.
                ("resume", Some(_)) if turn["resumed_by"] == json!(key) => {
                    Some(("applied", format!("epoch {}", turn["epoch"])))
                }
                // A resume whose claim never happened (its worker died first) can claim nothing
                // from a turn that is over.
                ("resume", Some(status)) if is_terminal(turn) || status == "held" => {
                    Some(("expired", format!("the turn is {status}: nothing to resume")))
                }
                _ => None,
            };
            let Some((state, outcome)) = done else { continue };
            let now = self.now();
            last = self
                .update_command(bus, session_id, &key, &|c| {
                    c["state"] = json!(state);
                    c["outcome"] = json!(outcome);
                    c["settled_at_ms"] = json!(now);
                })
                .await?;
            last = Self::answer(session_id, &key, &last);
            self.controls.borrow_mut().remove(session_id);
        }
        Ok(last)
    }

    /// Whether an effect of `record` happened: an action of an effect tool recorded complete,
    /// whether its service answered or reconciliation found it.
    fn effect_completed(&self, record: &Value) -> bool {
        record["calls"].as_object().is_some_and(|calls| {
            calls.values().any(|c| {
                let tool = c["tool"].as_str().and_then(|name| self.tool(name));
                c["status"] == json!("complete") && tool.is_some_and(|tool| is_effect(&tool))
            })
        })
    }

    /// The `cancel-counts-reads` bug: whether any call of `record` completed, a read or not.
    fn call_completed(&self, record: &Value) -> bool {
        record["calls"].as_object().is_some_and(|calls| calls.values().any(|c| c["status"] == json!("complete")))
    }

    /// The `cancel-by-clock` bug: whether an action of `record` completed after `since`, by its
    /// recorded completion time (which an action settled by reconciliation does not have).
    fn actions_completed_since(&self, record: &Value, since: u64) -> bool {
        record["calls"].as_object().is_some_and(|calls| {
            calls.values().any(|c| {
                c["status"] == json!("complete") && c["completed_at_ms"].as_u64().is_some_and(|at| at >= since)
            })
        })
    }

    /// A resume: a claim on the paused turn by compare-and-set that bumps its epoch, names this
    /// worker its owner and the command its claim (`resumed_by`); then the turn goes on, driven
    /// by this worker (`DRIVEN_BY`: no queue delivers it), under a lease of its own. A claim
    /// whose answer is lost is read back: the store says whether it landed.
    async fn resume(
        self: &Rc<Self>,
        bus: &Bus,
        session_id: &str,
        key: &str,
        mut record: Value,
        version: u64,
    ) -> Result<Value, ErrorBody> {
        let epoch = record["epoch"].as_u64().unwrap_or(0) + 1;
        record["status"] = json!("running");
        record["epoch"] = json!(epoch);
        record["owner"] = json!(self.env.host);
        record["resumed_by"] = json!(key);
        record[super::DRIVEN_BY] = json!(self.env.host);
        record["updated_at"] = json!(self.now());
        // A paused turn has no owner, so the claim carries no fence: what makes it one claim
        // among rivals is the version it expects.
        let timeout = self.env.config.session_timeout_ms;
        let claim = if self.policy == Policy::ResumeWithoutCas {
            // The known-bad claim: a plain write, whoever else is claiming at the same time.
            let write = json!({ "scope": TURN_SCOPE, "key": session_id, "value": record });
            bus.invoke("state::set", write, timeout).await.map(|_| json!({ "swapped": true }))
        } else {
            let claim = json!({ "scope": TURN_SCOPE, "key": session_id, "value": record, "expected_version": version });
            bus.invoke("state::compare-and-set", claim, timeout).await
        };
        if matches!(&claim, Ok(answer) if answer["swapped"] == json!(true)) {
            return self.resume_landed(bus, session_id, key, &record).await;
        }
        // Refused (another claim moved the version), or no answer: the store says what the turn
        // is now. The claim that won may be this very command's, made by another worker that
        // found it recorded (a starting worker's recovery): then the command is applied.
        let found = match self.get_turn(bus, session_id).await {
            Ok(found) => found.unwrap_or_default(),
            Err(_) => {
                self.settle_command_later(bus, session_id, "resume", key, false);
                return Err(ErrorBody::new("unavailable", "the claim's outcome is not known yet"));
            }
        };
        if found["resumed_by"] == json!(key) {
            return self.resume_landed(bus, session_id, key, &found).await;
        }
        let rejected = self.record_resume_rejected(bus, session_id, key, &found).await?;
        Ok(Self::answer(session_id, key, &rejected))
    }

    /// A claim of resume `key` that landed (`claimed`, the record as claimed): the turn goes on,
    /// driven by the worker the claim names (this one, unless another worker made the claim for
    /// the same command), and the command is recorded applied.
    async fn resume_landed(
        self: &Rc<Self>,
        bus: &Bus,
        session_id: &str,
        key: &str,
        claimed: &Value,
    ) -> Result<Value, ErrorBody> {
        let epoch = claimed["epoch"].as_u64().unwrap_or(0);
        if claimed["status"] == json!("running") && claimed[super::DRIVEN_BY] == json!(self.env.host) {
            self.note(
                "turn_resumed_by_command",
                json!({ "session_id": session_id, "turn_id": claimed["turn_id"], "epoch": epoch }),
            );
            self.drive_resumed(bus, claimed);
        }
        match self.record_resume_applied(bus, session_id, key, epoch).await {
            Ok(applied) => Ok(Self::answer(session_id, key, &applied)),
            Err(error) => {
                // The claim stands; the command must not stay `accepted` for it.
                self.settle_command_later(bus, session_id, "resume", key, false);
                Err(error)
            }
        }
    }

    /// The turn a resume claimed goes on, in the background: the press is answered as soon as
    /// the claim is recorded.
    fn drive_resumed(self: &Rc<Self>, bus: &Bus, record: &Value) {
        let request = TurnRequest {
            session_id: record["session_id"].as_str().unwrap_or_default().to_string(),
            turn_id: record["turn_id"].as_str().unwrap_or_default().to_string(),
            step: record["step"].as_u64().unwrap_or(0),
        };
        let (worker, bus) = (Rc::clone(self), bus.clone());
        tokio::task::spawn_local(async move { worker.drive_on(&bus, request).await });
    }

    async fn record_resume_applied(
        &self,
        bus: &Bus,
        session_id: &str,
        key: &str,
        epoch: u64,
    ) -> Result<Value, ErrorBody> {
        let now = self.now();
        self.update_command(bus, session_id, key, &|c| {
            c["state"] = json!("applied");
            c["outcome"] = json!(format!("epoch {epoch}"));
            c["settled_at_ms"] = json!(now);
        })
        .await
    }

    /// A resume whose claim did not land: another claim won, or (read back after a claim with
    /// no answer) the turn is still paused and the press may be made again.
    async fn record_resume_rejected(
        &self,
        bus: &Bus,
        session_id: &str,
        key: &str,
        found: &Value,
    ) -> Result<Value, ErrorBody> {
        let why = if found["status"] == json!("paused") {
            "the claim did not land: the turn is still paused"
        } else {
            "another claim on the turn won"
        };
        let now = self.now();
        self.update_command(bus, session_id, key, &|c| {
            c["state"] = json!("rejected");
            c["why"] = json!(why);
            c["settled_at_ms"] = json!(now);
        })
        .await
    }

    /// A cancel, stop or pause of `turn_id` accepted and not yet applied: the one this worker
    /// accepted itself, else (unless cancellation is kept in memory only) one in the session's
    /// durable control record, which this worker then remembers.
    pub(super) async fn accepted_command(
        &self,
        bus: &Bus,
        session_id: &str,
        turn_id: &str,
    ) -> Result<Option<(String, String)>, ErrorBody> {
        if let Some(pending) = self.pending_control(session_id) {
            return Ok(Some(pending));
        }
        if self.policy == Policy::InMemoryCancel {
            return Ok(None);
        }
        let (control, _) = self.control_record(bus, session_id).await?;
        let accepted = control["commands"].as_object().and_then(|commands| {
            commands.iter().find(|(_, c)| {
                let waiting = match crate::planted!("ref-settled-pause-taken-as-waiting") {
                    true => c["state"] != json!("rejected") && c["state"] != json!("expired"),
                    false => c["state"] == json!("accepted"),
                };
                // (The known-bad policy takes a command of any turn of the session for this one's.)
                let of_turn = c["turn_id"] == json!(turn_id) || self.policy == Policy::CommandForAnyTurn;
                waiting && of_turn && c["command"] != json!("resume")
            })
        });
        let Some((key, command)) = accepted else { return Ok(None) };
        let pending = (command["command"].as_str().unwrap_or_default().to_string(), key.clone());
        self.controls.borrow_mut().insert(session_id.to_string(), pending.clone());
        Ok(Some(pending))
    }

    /// The safe point before an effect is sent: the durable control record is read, so a
    /// cancellation accepted by any worker stops the turn here. A record that cannot be read
    /// stops it too: sending without knowing could be sending after a cancellation.
    pub(super) async fn check_control_durably(&self, bus: &Bus, record: &Value) -> Result<(), Stop> {
        let session_id = record["session_id"].as_str().unwrap_or_default();
        let turn_id = record["turn_id"].as_str().unwrap_or_default();
        let writes_before = self.control_writes.get();
        self.stop_for_accepted_command(bus, session_id, turn_id).await?;
        // A command this worker records meanwhile may reach the store after the read above and
        // before the send that follows: wait until any such write is over and, if one was sent
        // since the read began, read again (whatever its answer was, even none: the store says
        // whether it was recorded), with nothing but the send after.
        let lock = self.control_lock(session_id);
        // `try_lock` first: even uncontended, `lock().await` spends tokio's cooperative budget
        // and may yield, letting other tasks run between this check and the send.
        let _recording = match lock.try_lock() {
            Ok(guard) => guard,
            Err(_) => lock.lock().await,
        };
        if self.control_writes.get() != writes_before {
            return self.stop_for_accepted_command(bus, session_id, turn_id).await;
        }
        self.check_control(session_id)
    }

    /// A stop for the command the turn's session accepted and has not applied, if any; a stop
    /// too when that cannot be known.
    async fn stop_for_accepted_command(&self, bus: &Bus, session_id: &str, turn_id: &str) -> Result<(), Stop> {
        match self.accepted_command(bus, session_id, turn_id).await {
            Ok(Some((kind, key))) => Err(Stop::Control { kind, key }),
            Ok(None) => Ok(()),
            Err(error) => Err(Stop::Failed(super::StepFailure {
                during: "control".into(),
                error: crate::bus::InvokeError::Rejected(error),
            })),
        }
    }

    /// Learns, at the start of a turn, the commands its session has accepted and not applied,
    /// from the store: a command this worker accepted may have been applied by another since
    /// (and the turn resumed after it), so what it remembers is read again.
    /// [`names_another_turn`], but for the known-bad policy, which applies a command to whichever
    /// turn its session holds.
    pub(super) fn names_another_turn(&self, turn_id: &Value, turn: &Value) -> bool {
        self.policy != Policy::CommandForAnyTurn && names_another_turn(turn_id, turn)
    }

    pub(super) async fn load_commands(&self, bus: &Bus, session_id: &str, turn_id: &str) {
        if !matches!(self.policy, Policy::RememberedCommands | Policy::InMemoryCancel) {
            self.controls.borrow_mut().remove(session_id);
        }
        let _ = self.accepted_command(bus, session_id, turn_id).await;
    }
}

/// Whether a command recorded for turn `turn_id` finds another turn in the session's record
/// `turn`: its own has ended (turns of a session follow one another in one record). A command
/// recorded with no turn, or a record naming none, is taken as the same turn.
pub(super) fn names_another_turn(turn_id: &Value, turn: &Value) -> bool {
    matches!((turn_id.as_str(), turn["turn_id"].as_str()), (Some(of), Some(now)) if of != now)
}
