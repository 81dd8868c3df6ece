//! The reference harness: a durable turn loop, with its recovery behaviour as named policies.
//!
//! A turn reads its record, reads the session's messages, calls the model, runs the model's tool
//! calls as durable actions, and finalises: it records the terminal state, presents it on the
//! session (best effort), and reseeds input queued meanwhile as a new turn. It is built on the
//! rig's public harness API alone ([`crate::HarnessFactory`], [`crate::Provider`],
//! [`crate::HarnessEnv`]), as a user's harness would be.
//!
//! The policies, correct and known-bad:
//!
//! - `reference`: errors surface; a terminal write whose outcome is unknown is confirmed by one
//!   exact whole-record readback; an unconfirmed finalisation is retried later as
//!   terminalisation only (never re-running model or tool steps), and however the terminal
//!   state gets confirmed, the reply is presented and queued input reseeded; an action whose
//!   outcome is unknown (a timeout, a lost connection, a provider stopped mid-call) is
//!   reconciled with its service before anything is re-sent, and a turn is never closed over an
//!   unsettled action; a dead-lettered turn is held with the dead letter named.
//! - `swallow`, the released 1.8.13 binary of incident 001: a read error while finalising
//!   becomes "no record", a failed finalisation becomes `running, skipped, no next_step`.
//! - `propagate`, the seed's later main: errors surface to the caller, under a per-session
//!   lock, and nothing recovers.
//! - `unguarded`: no stale-turn guard: a redelivered old turn is marked running again.
//! - `replay-unfinished` / `fresh-key`: on import, unfinished actions are sent again blindly /
//!   with a new idempotency key.
//! - `no-fencing`: leases without tokens on writes and effects.
//! - `assume-failed`: an effect request with no result is recorded as failed, never reconciled.
//! - `close-unsettled`: a failing turn is closed without settling its actions first.
//! - `results-only-when-answered`: a tool result enters the transcript only when the service
//!   answered the call; an outcome found by reconciliation leaves the call open there.
//! - `stale-context`: every generation of a turn is sent the messages read when it first asked,
//!   so tool results are never fed back to the model.
//! - `entry-per-delta`: a streamed reply's text enters the transcript delta by delta, one
//!   message each.
//! - `hold-drops-mutations`: a hook that holds a call loses its own changes to the arguments.
//! - `release-original-arguments`: a released call runs with the model's arguments, whatever
//!   the hooks changed.
//! - `in-memory-cancel`: a cancellation is kept in memory only, lost with the worker.
//! - `reset-on-retry`: a turn's budget counts start over whenever it is taken up again.
//! - `mint-child-budget`: a delegated child gets a budget of its own instead of a share.
//! - `resume-without-cas`: a resume claims the paused turn with a plain write.
//! - `arrival-order-stream`: a streamed reply is assembled in the order its frames arrived,
//!   not by their sequence numbers.
//! - `readmit-consumed-input`: input whose entry could not be removed after it was admitted is
//!   admitted again by the next finalisation.
//! - `cancel-by-clock`: how a cancellation ended is judged by the clock: an effect counts only
//!   if its recorded completion came after the cancel was requested (an action settled by
//!   reconciliation carries no completion time, so it never counts).
//! - `stale-reply`: a turn delivery is answered with the status the turn had when it began
//!   (`running`), however it ended.
//! - `fence-effects-only`: the lease's token goes with effect requests but not with the
//!   harness's own turn writes, so a worker whose lease ran out still writes the turn.
//! - `unrecorded-actions`: tool calls run from memory; no action is ever written to the turn
//!   record.
//! - `unconfirmed-reply`: a terminal state whose write went unconfirmed is replied as if it
//!   were recorded.
//! - `applied-on-accept`: a control command accepted while its turn is busy is replied
//!   `applied` before it takes effect.
//! - `keep-lease`: a worker never hands a lease back; it renews it for as long as it lives.
//! - `cancel-counts-reads`: a cancelled turn counts every call it completed as an effect, the
//!   tools that only read included.
//! - `redo-completed-rounds`: a turn taken up again after an interruption is run again from the
//!   step it was delivered at: every completed round is asked of the model again (its actions,
//!   recorded complete, are not sent again).
//! - `latest-on-resume`: a turn taken up again runs on the version production points at then,
//!   not the one it was pinned to.
//! - `overlay-pinned`: the safety overlay is read once per turn and kept with it, so a tool
//!   revoked or withdrawn later is still offered and called.
//! - `call-unavailable`: the overlay is read, and the tools it took away are offered and called
//!   anyway.
//! - `drop-unavailable`: a call of a tool the overlay took away is skipped, with no result.
//! - `in-memory-expiry`: a held call's approval expiry is kept in the holding worker's memory
//!   only, lost with it.
//! - `status-from-memory`: `status` answers from the worker's memory of the session (what it
//!   last read for a client), not from the store: a client that comes back is told what the
//!   session was when it left.
//! - `assume-sent`: an action found begun and unsettled when its turn is taken up again is taken
//!   as sent and done, without asking its service.
//! - `remove-before-admit`: queued input is removed before the turn made of it is written: a
//!   turn whose write fails leaves the input gone.
//! - `skip-says-running`: a delivery that is not current is answered `running` (what it was
//!   delivered for), as the seed's skip was, whatever the store holds.
//! - `no-renewal`: a session's lease is taken and never renewed: a turn that outlasts its time to
//!   live loses it mid-turn to whoever asks.
//! - `blind-dead-letter`: the dead-letter handler answers that it held the turn a dead letter
//!   carried without looking at it: a turn that ended meanwhile is said to be `held`.
//! - `hold-turn-only`: a call a hook holds is not recorded held, only its turn is: no release can
//!   find it.
//! - `remembered-commands`: a worker applies a command it accepted from its memory, whatever the
//!   store says of it since: a pause applied elsewhere, then resumed, pauses the turn again.
//! - `dedupe-queued-only`: `send` deduplicates a key only while its message waits in the queue:
//!   a message sent again after its first copy started a turn starts another.
//! - `run-on-expiry`: a held call whose approval expires is taken as approved when it does: it
//!   runs at its expiry, with no release.
//! - `unversioned-requests`: a generation request is assembled from the turn's pinned version
//!   (its system prompt and model profile) but does not say which version that is.
//! - `overlay-of-the-first-turn`: the worker reads the safety overlay naming the first turn of
//!   the session it read it for (a turn id it keeps in memory), so a later turn of the session is
//!   never looked at for itself.
//! - `hold-over-the-end`: the dead-letter handler writes the turn a dead letter carried `held`
//!   without looking at its status, and the worker's writes carry no guard against reopening an
//!   ended turn: a turn that ended meanwhile is taken back from its end.
//! - `timeout-as-cancelled`: a turn whose step timed out is recorded `cancelled`, as a task its
//!   timeout cancelled, not `failed`.
//! - `retry-as-new-action`: an effect request whose answer was lost (a timeout) is sent again at
//!   once as a new action, with a new id and key, and the call is done when an attempt answers.
//! - `unkeyed-answer`: a turn's answer enters the transcript without an entry key, so presenting
//!   it again (as whoever finds the turn ended does) appends a second copy.
//! - `command-without-cas`: a command applied to a turn no delivery runs here (parked, held) is
//!   written with a plain write fenced by the lease token alone, not over the version read: a
//!   rival's Resume claim, which raises the epoch and takes no lease, is written over.
//! - `command-for-any-turn`: a command is applied to whichever turn its session holds when it is
//!   applied, not the one it was recorded for: a cancel, stop, pause or resume left waiting for a
//!   turn that has ended moves the session's later turn (the reference harness's behaviour
//!   before 56cfa8c).

mod actions;
mod approvals;
mod budget;
mod control;
mod finalize;
mod generation;
mod hooks;
mod ownership;
mod public;
mod runtime;
mod shape;
mod switch;
mod transcript;
mod versions;

use crate::bus::{Answer, Bus, ErrorBody, Invocation, InvokeError, Provider};
use crate::harness::{HarnessEnv, HarnessFactory};
pub(crate) use finalize::longest_own_wait_ms;
use ownership::HeldLease;
use serde::Deserialize;
use serde_json::{json, Value};
use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;

const TURN_SCOPE: &str = "harness_turn";
const QUEUE_SCOPE: &str = "harness_queue";
const TERMINAL: [&str; 3] = ["completed", "failed", "cancelled"];
/// The field of a turn record naming the worker that drives the turn on by itself: it released a
/// held call of it, denied a call whose approval expired, or resumed it. No queue delivers the
/// turn again, so that worker retries it while it lives, and a worker of its host that starts
/// drives it on (`recover_on_start`).
const DRIVEN_BY: &str = "driven_by";

/// How the reference harness behaves where harnesses go wrong.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Policy {
    Swallow,
    Propagate,
    Reference,
    Unguarded,
    ReplayUnfinished,
    FreshKey,
    NoFencing,
    AssumeFailed,
    CloseUnsettled,
    ResultsOnlyWhenAnswered,
    StaleContext,
    EntryPerDelta,
    HoldDropsMutations,
    ReleaseOriginalArguments,
    InMemoryCancel,
    ResetOnRetry,
    MintChildBudget,
    ResumeWithoutCas,
    ReadmitConsumedInput,
    ArrivalOrderStream,
    CancelByClock,
    StaleReply,
    FenceEffectsOnly,
    UnrecordedActions,
    UnconfirmedReply,
    AppliedOnAccept,
    KeepLease,
    CancelCountsReads,
    RedoCompletedRounds,
    LatestOnResume,
    OverlayPinned,
    CallUnavailable,
    DropUnavailable,
    InMemoryExpiry,
    StatusFromMemory,
    AssumeSent,
    RemoveBeforeAdmit,
    SkipSaysRunning,
    NoRenewal,
    BlindDeadLetter,
    HoldTurnOnly,
    RememberedCommands,
    DedupeQueuedOnly,
    RunOnExpiry,
    UnversionedRequests,
    OverlayOfTheFirstTurn,
    HoldOverTheEnd,
    TimeoutAsCancelled,
    RetryAsNewAction,
    UnkeyedAnswer,
    CommandWithoutCas,
    CommandForAnyTurn,
}

impl Policy {
    pub const ALL: [Policy; 52] = [
        Policy::Swallow,
        Policy::Propagate,
        Policy::Reference,
        Policy::Unguarded,
        Policy::ReplayUnfinished,
        Policy::FreshKey,
        Policy::NoFencing,
        Policy::AssumeFailed,
        Policy::CloseUnsettled,
        Policy::ResultsOnlyWhenAnswered,
        Policy::StaleContext,
        Policy::EntryPerDelta,
        Policy::HoldDropsMutations,
        Policy::ReleaseOriginalArguments,
        Policy::InMemoryCancel,
        Policy::ResetOnRetry,
        Policy::MintChildBudget,
        Policy::ResumeWithoutCas,
        Policy::ReadmitConsumedInput,
        Policy::ArrivalOrderStream,
        Policy::CancelByClock,
        Policy::StaleReply,
        Policy::FenceEffectsOnly,
        Policy::UnrecordedActions,
        Policy::UnconfirmedReply,
        Policy::AppliedOnAccept,
        Policy::KeepLease,
        Policy::CancelCountsReads,
        Policy::RedoCompletedRounds,
        Policy::LatestOnResume,
        Policy::OverlayPinned,
        Policy::CallUnavailable,
        Policy::DropUnavailable,
        Policy::InMemoryExpiry,
        Policy::StatusFromMemory,
        Policy::AssumeSent,
        Policy::RemoveBeforeAdmit,
        Policy::SkipSaysRunning,
        Policy::NoRenewal,
        Policy::BlindDeadLetter,
        Policy::HoldTurnOnly,
        Policy::RememberedCommands,
        Policy::DedupeQueuedOnly,
        Policy::RunOnExpiry,
        Policy::UnversionedRequests,
        Policy::OverlayOfTheFirstTurn,
        Policy::HoldOverTheEnd,
        Policy::TimeoutAsCancelled,
        Policy::RetryAsNewAction,
        Policy::UnkeyedAnswer,
        Policy::CommandWithoutCas,
        Policy::CommandForAnyTurn,
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
            Policy::AssumeFailed => "assume-failed",
            Policy::CloseUnsettled => "close-unsettled",
            Policy::ResultsOnlyWhenAnswered => "results-only-when-answered",
            Policy::StaleContext => "stale-context",
            Policy::EntryPerDelta => "entry-per-delta",
            Policy::HoldDropsMutations => "hold-drops-mutations",
            Policy::ReleaseOriginalArguments => "release-original-arguments",
            Policy::InMemoryCancel => "in-memory-cancel",
            Policy::ResetOnRetry => "reset-on-retry",
            Policy::MintChildBudget => "mint-child-budget",
            Policy::ResumeWithoutCas => "resume-without-cas",
            Policy::ReadmitConsumedInput => "readmit-consumed-input",
            Policy::ArrivalOrderStream => "arrival-order-stream",
            Policy::CancelByClock => "cancel-by-clock",
            Policy::StaleReply => "stale-reply",
            Policy::FenceEffectsOnly => "fence-effects-only",
            Policy::UnrecordedActions => "unrecorded-actions",
            Policy::UnconfirmedReply => "unconfirmed-reply",
            Policy::AppliedOnAccept => "applied-on-accept",
            Policy::KeepLease => "keep-lease",
            Policy::CancelCountsReads => "cancel-counts-reads",
            Policy::RedoCompletedRounds => "redo-completed-rounds",
            Policy::LatestOnResume => "latest-on-resume",
            Policy::OverlayPinned => "overlay-pinned",
            Policy::CallUnavailable => "call-unavailable",
            Policy::DropUnavailable => "drop-unavailable",
            Policy::InMemoryExpiry => "in-memory-expiry",
            Policy::StatusFromMemory => "status-from-memory",
            Policy::AssumeSent => "assume-sent",
            Policy::RemoveBeforeAdmit => "remove-before-admit",
            Policy::SkipSaysRunning => "skip-says-running",
            Policy::NoRenewal => "no-renewal",
            Policy::BlindDeadLetter => "blind-dead-letter",
            Policy::HoldTurnOnly => "hold-turn-only",
            Policy::RememberedCommands => "remembered-commands",
            Policy::DedupeQueuedOnly => "dedupe-queued-only",
            Policy::RunOnExpiry => "run-on-expiry",
            Policy::UnversionedRequests => "unversioned-requests",
            Policy::OverlayOfTheFirstTurn => "overlay-of-the-first-turn",
            Policy::HoldOverTheEnd => "hold-over-the-end",
            Policy::TimeoutAsCancelled => "timeout-as-cancelled",
            Policy::RetryAsNewAction => "retry-as-new-action",
            Policy::UnkeyedAnswer => "unkeyed-answer",
            Policy::CommandWithoutCas => "command-without-cas",
            Policy::CommandForAnyTurn => "command-for-any-turn",
        }
    }

    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|p| p.name() == name)
    }

    /// Whether failed finalisation is confirmed, retried and surfaced, dead letters held and
    /// stranded input reseeded later (everything but the two incident-001 baselines).
    fn recovers(self) -> bool {
        !matches!(self, Policy::Swallow | Policy::Propagate)
    }

    fn locks_sessions(self) -> bool {
        self != Policy::Swallow
    }

    /// Whether an action of unknown outcome is reconciled before a turn is closed over it.
    fn settles_before_closing(self) -> bool {
        self.recovers() && self != Policy::CloseUnsettled
    }
}

/// The reference harness: the rig's default [`HarnessFactory`], one worker per harness host.
#[derive(Debug, Default, Clone, Copy)]
pub struct ReferenceHarness;

impl HarnessFactory for ReferenceHarness {
    fn name(&self) -> &str {
        "reference"
    }

    fn policies(&self) -> Vec<String> {
        Policy::ALL.iter().map(|p| p.name().to_string()).collect()
    }

    fn reference_particulars(&self) -> bool {
        true
    }

    fn waits_on_rig_clock_only(&self) -> bool {
        true
    }

    /// The whole contract.
    fn capabilities(&self) -> crate::capability::Capabilities {
        crate::capability::Capabilities::all()
    }

    fn start(&self, policy: &str, env: HarnessEnv) -> Rc<dyn Provider> {
        let policy = Policy::from_name(policy).unwrap_or(Policy::Reference);
        let worker = Worker::new(policy, env);
        if policy.recovers() {
            tokio::task::spawn_local(Rc::clone(&worker).recover_on_start());
        }
        worker
    }
}

#[derive(Debug, Clone, Deserialize)]
struct TurnRequest {
    session_id: String,
    turn_id: String,
    step: u64,
}

/// A step of the turn that failed, and how.
#[derive(Debug, Clone)]
struct StepFailure {
    during: String,
    error: InvokeError,
}

impl StepFailure {
    fn summary(&self) -> String {
        format!("{}: {}", self.during, self.error)
    }
}

/// Why driving a turn stopped before it could be completed.
#[derive(Debug, Clone)]
enum Stop {
    /// A step failed: the turn is finalised as failed.
    Failed(StepFailure),
    /// An action's outcome cannot be established: the turn is held for a person.
    Held { reason: String },
    /// A newer owner holds the session: this worker must not write anything more.
    FencedOut,
    /// A control command (`kind`, by its idempotency key) takes effect at this safe point.
    Control { kind: String, key: String },
}

/// One reference harness worker, started afresh on every (re)start of its host.
struct Worker {
    policy: Policy,
    env: HarnessEnv,
    session_locks: RefCell<BTreeMap<String, Rc<tokio::sync::Mutex<()>>>>,
    leases: RefCell<BTreeMap<String, HeldLease>>,
    /// The token last granted per session, kept after the lease is gone.
    tokens: RefCell<BTreeMap<String, u64>>,
    /// Sessions whose turn has a terminalisation pending in the background: a redelivery of
    /// that turn must not run it again.
    pending_terminal: RefCell<BTreeMap<String, finalize::PendingTerminal>>,
    /// Generations asked and the frames of streamed replies, in memory.
    generations: generation::Generations,
    /// Control commands accepted per session and not applied yet: `(kind, idempotency key)`.
    controls: RefCell<BTreeMap<String, (String, String)>>,
    /// One lock per session for control commands, apart from the turn's: a command is recorded
    /// while the turn runs, and takes effect at the turn's next safe point.
    control_locks: RefCell<BTreeMap<String, Rc<tokio::sync::Mutex<()>>>>,
    /// How many command writes this worker has sent to the store: a check before an effect
    /// that saw this change while it read knows a command may have been recorded meanwhile.
    control_writes: Cell<u64>,
    /// Sessions this worker exported and has not imported again: it starts nothing for them.
    exported: RefCell<std::collections::BTreeSet<String>>,
    /// Configuration versions read so far, by version: they never change.
    manifests: RefCell<BTreeMap<String, Value>>,
    /// Approval expiries kept in memory, by action id (only under `in-memory-expiry`).
    expiries: RefCell<BTreeMap<String, u64>>,
    /// The turn each session's overlay was first read for (only under `overlay-of-the-first-turn`).
    overlay_turns: RefCell<BTreeMap<String, Value>>,
    /// The last `status` answer per session, by session (only under `status-from-memory`).
    status_memory: RefCell<BTreeMap<String, Value>>,
    /// Commands being settled in the background, by session and idempotency key: one settlement
    /// each, however many paths find it waiting.
    settling: RefCell<std::collections::BTreeSet<(String, String)>>,
    /// One lock per `send` idempotency key: two copies of one send (the network delivers at
    /// least once) are answered one after the other, the second from what the first recorded.
    send_locks: RefCell<BTreeMap<String, Rc<tokio::sync::Mutex<()>>>>,
    /// The answers of the last [`public::ANSWERED_SENDS_MAX`] sends by invocation id, oldest
    /// first: a copy of one invocation the network delivered again gets the first copy's answer,
    /// whether or not the send carried an idempotency key.
    answered_sends: RefCell<std::collections::VecDeque<(String, Result<Value, ErrorBody>)>>,
    /// Sessions this worker exported whose hand-over it is watching: taken back if no import
    /// takes their turn over within `handover_ms`.
    handing_over: RefCell<std::collections::BTreeSet<String>>,
}

impl Worker {
    fn new(policy: Policy, env: HarnessEnv) -> Rc<Self> {
        Rc::new(Self {
            policy,
            env,
            session_locks: RefCell::default(),
            leases: RefCell::default(),
            tokens: RefCell::default(),
            pending_terminal: RefCell::default(),
            generations: generation::Generations::default(),
            controls: RefCell::default(),
            control_locks: RefCell::default(),
            control_writes: Cell::new(0),
            exported: RefCell::default(),
            manifests: RefCell::default(),
            expiries: RefCell::default(),
            overlay_turns: RefCell::default(),
            status_memory: RefCell::default(),
            settling: RefCell::default(),
            send_locks: RefCell::default(),
            answered_sends: RefCell::default(),
            handing_over: RefCell::default(),
        })
    }

    fn note(&self, what: &str, detail: Value) {
        self.env.note(what, detail);
    }

    fn now(&self) -> u64 {
        self.env.clock.now_ms()
    }

    fn session_lock(&self, session_id: &str) -> Rc<tokio::sync::Mutex<()>> {
        Rc::clone(self.session_locks.borrow_mut().entry(session_id.to_string()).or_default())
    }

    fn send_lock(&self, key: &str) -> Rc<tokio::sync::Mutex<()>> {
        Rc::clone(self.send_locks.borrow_mut().entry(key.to_string()).or_default())
    }

    fn control_lock(&self, session_id: &str) -> Rc<tokio::sync::Mutex<()>> {
        Rc::clone(self.control_locks.borrow_mut().entry(session_id.to_string()).or_default())
    }

    /// Ownership covers a call's work: once it is done, however it ended, the lease is handed
    /// back, unless a terminalisation of the session is still pending (it will need the token).
    async fn hand_back(&self, bus: &Bus, session_id: &str) {
        if self.policy != Policy::KeepLease && !self.pending_terminal.borrow().contains_key(session_id) {
            self.release_lease(bus, session_id).await;
        }
    }

    async fn turn(self: &Rc<Self>, bus: &Bus, request: TurnRequest) -> Result<Value, ErrorBody> {
        let lock = self.session_lock(&request.session_id);
        let _guard = if self.policy.locks_sessions() { Some(lock.lock().await) } else { None };
        if self.policy.recovers() && self.exported.borrow().contains(&request.session_id) {
            // Handed over: this worker takes nothing of the session any more, its lease included
            // (one it could not give back would keep the importing worker out until it ran out).
            self.note(
                "handed_over_skipped",
                json!({ "session_id": request.session_id, "turn_id": request.turn_id, "to": "the harness that imports it" }),
            );
            return Ok(self.skipped(&request, "the session was handed over to the harness that imports it"));
        }
        if let Err(not_owner) = self.ensure_ownership(bus, &request.session_id).await {
            return not_owner.answer(&request.session_id);
        }
        let mut result = self.owned_turn(bus, request.clone()).await;
        self.hand_back(bus, &request.session_id).await;
        if let (Policy::StaleReply, Ok(reply)) = (self.policy, &mut result) {
            // The known-bad answer: what the turn was when the delivery came, not what it became.
            if reply["status"].as_str().is_some_and(|status| TERMINAL.contains(&status)) {
                reply["status"] = json!("running");
            }
        }
        result
    }

    /// A turn delivery once this worker owns the session.
    async fn owned_turn(self: &Rc<Self>, bus: &Bus, request: TurnRequest) -> Result<Value, ErrorBody> {
        let pending = self.pending_terminal.borrow().get(&request.session_id).cloned();
        if let Some(pending) = pending.filter(|p| p.turn_id == request.turn_id) {
            // Only terminalisation may touch this turn now; it is under way in the background.
            // The delivery is answered once what it owes is durable, and not before.
            return match pending.left_in_record {
                true => Ok(self.skipped(&request, "terminalization pending")),
                false => self.owe_terminal_durably(bus, &request).await,
            };
        }
        let record = self.get_turn(bus, &request.session_id).await.map_err(|e| error_body("get_turn", &e))?;
        if let Some(to) = self.handed_to(&request.session_id, record.as_ref()) {
            self.note(
                "handed_over_skipped",
                json!({ "session_id": request.session_id, "turn_id": request.turn_id, "to": to }),
            );
            return Ok(self.skipped(&request, &format!("the session was handed over to {to}")));
        }
        let record = match (self.policy, record) {
            (Policy::Unguarded, Some(record)) => Some(self.resume_as_delivered(bus, &request, record).await?),
            (_, record) => record,
        };
        let Some(record) = record.clone().filter(|r| is_current(r, &request)) else {
            // The stale-turn guard: a delivery for a turn that is no longer current runs nothing.
            self.note(
                "stale_turn_skipped",
                json!({ "session_id": request.session_id, "turn_id": request.turn_id, "step": request.step }),
            );
            if self.policy.recovers() {
                // It came back because its delivery failed, perhaps mid-finalisation: whatever
                // admission that finalisation left unfinished is finished now.
                self.finish_admission(bus, &request, record.as_ref()).await;
            }
            if crate::planted!("ref-stale-delivery-answered-running") {
                let mut reply = self.skipped(&request, "stale");
                reply["status"] = json!("running");
                return Ok(reply);
            }
            return Ok(self.skipped(&request, "stale"));
        };
        if record["step"] != json!(request.step) {
            self.note(
                "turn_resumed",
                json!({ "session_id": request.session_id, "turn_id": request.turn_id, "delivered_step": request.step, "step": record["step"] }),
            );
        }
        self.load_commands(bus, &request.session_id, &request.turn_id).await;
        let mut record = record;
        self.redo_completed_rounds(&request, &mut record);
        if let Err(stop) = self.resume_budget(bus, &mut record).await {
            return self.stopped(bus, &request, stop).await;
        }
        self.finish(bus, &request, record).await
    }

    /// Drives a current turn to its end and finalises it by how it ended.
    async fn finish(self: &Rc<Self>, bus: &Bus, request: &TurnRequest, record: Value) -> Result<Value, ErrorBody> {
        match self.drive(bus, record).await {
            Ok((record, reply)) => self.complete(bus, request, record, reply).await,
            Err(stop) => self.stopped(bus, request, stop).await,
        }
    }

    /// Finalises a turn by how driving it stopped.
    async fn stopped(self: &Rc<Self>, bus: &Bus, request: &TurnRequest, stop: Stop) -> Result<Value, ErrorBody> {
        match stop {
            Stop::Failed(failure) => self.fail_turn(bus, request, failure).await,
            Stop::Held { reason } => self.hold_turn(bus, request, &reason).await,
            Stop::FencedOut => self.fenced_out(request),
            Stop::Control { kind, key } => {
                self.apply_control(bus, &request.session_id, &kind, &key).await?;
                let record = self.get_turn(bus, &request.session_id).await.ok().flatten().unwrap_or(Value::Null);
                Ok(json!({
                    "session_id": request.session_id, "turn_id": request.turn_id, "status": record["status"],
                    "skipped": false, "next_step": null, "control": kind, "cancellation": record["cancellation"],
                }))
            }
        }
    }

    /// The answer to a delivery whose work a newer lease cut short. Not a success for the
    /// recovering policies: the newer grant may have been this worker's own (a duplicated or
    /// retried acquisition), and the turn still needs an owner, so the queue delivers it again
    /// and the redelivery asks for the lease (refused if another worker really holds it).
    fn fenced_out(&self, request: &TurnRequest) -> Result<Value, ErrorBody> {
        if self.policy.recovers() && !crate::planted!("ref-fenced-out-answered-as-done") {
            return Err(ErrorBody::new("fenced_out", "a newer lease cut this work short; deliver it again"));
        }
        Ok(json!({
            "session_id": request.session_id, "turn_id": request.turn_id, "status": "fenced",
            "skipped": true, "next_step": null, "reason": "a newer owner holds the session",
        }))
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

    /// The session's turn record. One of the wrong shape, unless it has ended, is first set aside
    /// for a person ([`shape::set_aside`]); until that is written, reading it is an error.
    async fn get_turn(&self, bus: &Bus, session_id: &str) -> Result<Option<Value>, InvokeError> {
        let record = bus
            .invoke("state::get", json!({ "scope": TURN_SCOPE, "key": session_id }), self.env.config.session_timeout_ms)
            .await?;
        if record.is_null() || is_terminal(&record) {
            return Ok(Some(record).filter(|r| !r.is_null()));
        }
        let Some(flaw) = shape::turn_record_flaw(&record) else { return Ok(Some(record)) };
        let aside = shape::set_aside(session_id, &record, &flaw, self.now());
        self.note("malformed_record_set_aside", json!({ "session_id": session_id, "flaw": flaw }));
        match self.put_turn(bus, &aside).await {
            Ok(()) => Ok(Some(aside)),
            Err(error) => Err(InvokeError::Rejected(ErrorBody::new(
                "malformed_record",
                format!("the turn record of {session_id} is malformed ({flaw}) and could not be set aside: {error}"),
            ))),
        }
    }

    /// Writes a turn record, once more with the identical record if the first write's outcome
    /// is unknown.
    async fn put_turn(&self, bus: &Bus, record: &Value) -> Result<(), InvokeError> {
        // The second write is made only when it is needed, from the same record under the first
        // one's fence, so it is the identical request: a copy kept for a retry that seldom comes
        // cost a copy of the whole record on every write.
        let fence = self.store_fence(record["session_id"].as_str().unwrap_or_default());
        let timeout = self.env.config.session_timeout_ms;
        match bus.invoke("state::set", self.turn_write_fenced(record, fence.clone()), timeout).await {
            Err(error) if error.outcome_unknown() => {
                bus.invoke("state::set", self.turn_write_fenced(record, fence), timeout).await.map(drop)
            }
            other => other.map(drop),
        }
    }

    /// Writes a turn record over its stored `version` (a compare-and-set, guarded and fenced as
    /// [`Self::put_turn`]): whether it landed. After an unknown outcome the store is asked: the
    /// record stored as written landed; anything else did not.
    pub(super) async fn put_turn_over(&self, bus: &Bus, record: &Value, version: u64) -> Result<bool, InvokeError> {
        let mut write = self.turn_write(record);
        write["expected_version"] = json!(version);
        let session_id = record["session_id"].as_str().unwrap_or_default();
        match bus.invoke("state::compare-and-set", write, self.env.config.session_timeout_ms).await {
            Ok(answer) => Ok(answer["swapped"] == json!(true)),
            Err(error) if error.outcome_unknown() => match self.get_turn(bus, session_id).await {
                Ok(stored) => Ok(stored.as_ref() == Some(record)),
                Err(_) => Err(error),
            },
            Err(error) => Err(error),
        }
    }

    /// The store request that writes `record`: guarded against reopening an ended turn, and
    /// under this worker's fence when it holds one.
    fn turn_write(&self, record: &Value) -> Value {
        self.turn_write_fenced(record, self.store_fence(record["session_id"].as_str().unwrap_or_default()))
    }

    /// [`Self::turn_write`] under `fence`.
    fn turn_write_fenced(&self, record: &Value, fence: Option<Value>) -> Value {
        // The record is copied in as it is: `json!` would write it out through its serializer,
        // node by node, to come to the same value.
        let mut write = serde_json::Map::new();
        write.insert("scope".into(), TURN_SCOPE.into());
        write.insert("key".into(), record["session_id"].clone());
        write.insert("value".into(), record.clone());
        let mut write = Value::Object(write);
        if self.policy == Policy::UnrecordedActions {
            // The known-bad loop keeps its actions in memory: the record never names one.
            write["value"]["calls"] = json!({});
        }
        if !matches!(self.policy, Policy::Unguarded | Policy::NoFencing | Policy::HoldOverTheEnd) {
            // The store refuses to reopen an ended turn: a late or stale writer cannot undo it.
            write["guard"] = json!({ "key": "turn_id", "status": "status", "final": TERMINAL });
        }
        if let Some(fence) = fence {
            write["fence"] = fence;
        }
        write
    }

    /// Writes a new turn record (a delegated child, a turn `send` starts), which must not be
    /// left behind unknown: nothing else would ever run it. After an unknown outcome the same
    /// record is written again, with backoff while the store is away (a refusal of a later try
    /// says nothing of the first), up to `terminalize_attempts` tries.
    pub(super) async fn create_turn_record(&self, bus: &Bus, record: &Value) -> Result<(), InvokeError> {
        let (write, timeout) = (self.turn_write(record), self.env.config.session_timeout_ms);
        let mut error = match bus.invoke("state::set", write.clone(), timeout).await {
            Err(error) if error.outcome_unknown() => error,
            other => return other.map(drop),
        };
        for attempt in 1..=self.env.config.terminalize_attempts {
            self.env.clock.sleep(self.deferred_backoff(attempt)).await;
            match bus.invoke("state::set", write.clone(), timeout).await {
                Ok(_) => return Ok(()),
                Err(again) => error = again,
            }
        }
        Err(error)
    }

    /// Writes the turn record under this worker's fence; a stale-token rejection means the
    /// session has a newer owner.
    async fn write(&self, bus: &Bus, record: &Value) -> Result<(), Stop> {
        match self.put_turn(bus, record).await {
            Ok(()) => Ok(()),
            Err(error) => Err(self.stop_for(record["session_id"].as_str().unwrap_or(""), "state::set", error)),
        }
    }

    fn stop_for(&self, session_id: &str, during: &str, error: InvokeError) -> Stop {
        match &error {
            InvokeError::Rejected(body) if body.code == "stale_token" => {
                self.note(
                    "fenced_out",
                    json!({ "session_id": session_id, "during": during, "token": self.lease_token(session_id) }),
                );
                self.forget_lease(session_id);
                Stop::FencedOut
            }
            _ => Stop::Failed(StepFailure { during: during.to_string(), error }),
        }
    }

    /// The seed's `skipped(session_id)`: running, no next step, whatever the reason. The
    /// recovering policies say `skipped` and why instead, so a skip is never mistaken for a turn
    /// that is still running.
    fn skipped(&self, request: &TurnRequest, reason: &str) -> Value {
        let mut result = json!({
            "session_id": request.session_id, "turn_id": request.turn_id, "status": "running",
            "skipped": true, "next_step": null,
        });
        if self.policy.recovers() {
            result["reason"] = json!(reason);
            if self.policy != Policy::SkipSaysRunning {
                result["status"] = json!("skipped");
            }
        }
        result
    }

    /// The queue's dead-letter handler: the turn a dead letter carried is held for a person,
    /// with the dead letter named. A call that names only the session (an import, say) carried
    /// whichever turn of that session is running: refusing it would strand the dead letter, as
    /// the queue offers it again and again. The incident-001 baselines have no such handler.
    async fn dead_letter(self: &Rc<Self>, bus: &Bus, letter: &Value) -> Result<Value, ErrorBody> {
        if !self.policy.recovers() {
            return Err(ErrorBody::new("not_implemented", "this harness has no dead-letter handling"));
        }
        let data = &letter["data"];
        let Some(session_id) = data["session_id"].as_str() else {
            return Err(ErrorBody::new("bad_request", "a dead letter must carry `data.session_id`"));
        };
        let turn_id = data["turn_id"].as_str();
        if self.exported.borrow().contains(session_id) {
            // A session this worker exported and nobody has imported yet. An import the queue
            // gave up on leaves the switch half done: the session is taken back now, and its
            // turn driven on here (an error until that is done, so the queue offers it again).
            // Anything else the session's new harness holds as it must, once it imports it.
            if !letter["function_id"].as_str().is_some_and(|f| f.ends_with("::import")) {
                return Ok(
                    json!({ "held": false, "reason": "the session was handed over to the harness that imports it" }),
                );
            }
            return match self.take_back(bus, session_id).await {
                true => Ok(json!({ "held": false, "session_id": session_id,
                                   "reason": "the import was given up on: the switch is undone" })),
                false => Err(ErrorBody::new("unavailable", "the session could not be taken back yet")),
            };
        }
        if let Ok(Some(record)) = self.get_turn(bus, session_id).await {
            // A session handed over to another harness is that harness's to deal with: taking its
            // lease here, even for a moment, would only fence its worker's writes out.
            if let Some(to) = self.handed_to(session_id, Some(&record)) {
                return Ok(json!({ "held": false, "reason": format!("the session was handed over to {to}") }));
            }
            // A dead letter of a turn that has ended, or that another turn has followed, holds
            // nothing: it is answered without waiting for the session, whose worker may be busy
            // with the turn after it for as long as a model call takes (the queue would offer it
            // again later and later, until after nobody is listening).
            // (The known-bad `blind-dead-letter` keeps its wrong answer, given further down.)
            let moved_on = turn_id.is_some_and(|turn_id| record["turn_id"] != json!(turn_id) || is_terminal(&record));
            if moved_on && !matches!(self.policy, Policy::BlindDeadLetter | Policy::HoldOverTheEnd) {
                return Ok(json!({ "held": false, "reason": "the turn it carried is no longer running" }));
            }
        }
        let lock = self.session_lock(session_id);
        let _guard = lock.lock().await;
        if let Err(not_owner) = self.ensure_ownership(bus, session_id).await {
            return Err(ErrorBody::new("not_owner", not_owner.reason()));
        }
        let result = match self.hold_dead_letter(bus, session_id, turn_id, letter).await {
            // The turn this dead letter holds (now, or on an earlier offer whose answer was lost)
            // may have a cancel waiting: until it is applied, the dead letter is not done with,
            // and the queue offers it again.
            Ok(outcome) => match self.held_by(bus, session_id, letter).await {
                Ok(true) if crate::planted!("ref-dead-letter-done-before-its-cancel") => {
                    let _ = self.apply_waiting_cancellations(bus, session_id).await;
                    Ok(outcome)
                }
                Ok(true) => self.apply_waiting_cancellations(bus, session_id).await.map(|()| outcome),
                Ok(false) => Ok(outcome),
                Err(error) => Err(error),
            },
            other => other,
        };
        self.hand_back(bus, session_id).await;
        result
    }

    /// Whether the session's turn is held for this dead letter.
    async fn held_by(&self, bus: &Bus, session_id: &str, letter: &Value) -> Result<bool, ErrorBody> {
        let record = self.get_turn(bus, session_id).await.map_err(|error| error_body("get_turn", &error))?;
        Ok(record.is_some_and(|record| {
            record["status"] == json!("held") && record["dead_letter"]["message_id"] == letter["message_id"]
        }))
    }

    /// Holds the turn a dead letter carried (the session's running turn, when it names none),
    /// once this worker owns its session.
    async fn hold_dead_letter(
        &self,
        bus: &Bus,
        session_id: &str,
        turn_id: Option<&str>,
        letter: &Value,
    ) -> Result<Value, ErrorBody> {
        let mut record = match self.get_turn(bus, session_id).await {
            Ok(Some(record)) => record,
            Ok(None) => return Ok(json!({ "held": false, "reason": "no turn record" })),
            Err(error) => return Err(error_body("get_turn", &error)),
        };
        if let Some(to) = self.handed_to(session_id, Some(&record)) {
            // Its new harness holds what it must: this one changes nothing.
            return Ok(json!({ "held": false, "reason": format!("the session was handed over to {to}") }));
        }
        let carried = turn_id.is_none_or(|turn_id| record["turn_id"] == json!(turn_id));
        if self.policy == Policy::BlindDeadLetter && record["status"] != json!("running") {
            // The known-bad answer: held, as the handler always answers, whatever the turn became.
            let turn_id = turn_id.map_or_else(|| record["turn_id"].clone(), |turn_id| json!(turn_id));
            return Ok(json!({ "held": true, "session_id": session_id, "turn_id": turn_id, "status": "held" }));
        }
        if carried && is_terminal(&record) && crate::planted!("ref-dead-letter-says-held-about-an-ended-turn") {
            return Ok(
                json!({ "held": true, "session_id": session_id, "turn_id": record["turn_id"], "status": "held" }),
            );
        }
        // (The known-bad `hold-over-the-end` holds the turn whatever it became.)
        if !carried || (record["status"] != json!("running") && self.policy != Policy::HoldOverTheEnd) {
            return Ok(json!({ "held": false, "reason": "the turn it carried is no longer running" }));
        }
        let turn_id = record["turn_id"].as_str().unwrap_or_default().to_string();
        let reason = format!(
            "dead-lettered: queue `{}` gave up on message {} after {} deliveries ({})",
            letter["queue"].as_str().unwrap_or("?"),
            letter["message_id"].as_str().unwrap_or("?"),
            letter["deliveries"],
            letter["reason"].as_str().unwrap_or("no reason given")
        );
        record["status"] = json!("held");
        record["held_reason"] = json!(reason);
        record["dead_letter"] = json!({ "queue": letter["queue"], "message_id": letter["message_id"],
                                        "deliveries": letter["deliveries"], "reason": letter["reason"] });
        record["updated_at"] = json!(self.now());
        let written = self.write(bus, &record).await;
        if !crate::planted!("ref-dead-letter-answered-before-its-hold-is-durable") {
            written.map_err(|_| ErrorBody::new("unavailable", "could not record the hold"))?;
        }
        self.note("turn_held", json!({ "session_id": session_id, "turn_id": turn_id, "reason": reason }));
        Ok(json!({ "held": true, "session_id": session_id, "turn_id": turn_id }))
    }
}

impl Provider for Worker {
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
                command if crate::topology::CONTROL_FUNCTIONS.contains(&command) => {
                    self.command(&bus, command, &call.data).await
                }
                "dead-letter" => self.dead_letter(&bus, &call.data).await,
                "status" => self.status(&bus, &call.data).await,
                "send" => self.send_once(&bus, &call.invocation_id, &call.data).await,
                "resolve" => self.resolve(&bus, &call.data).await,
                "stream" => self.take_frame(&call.data),
                _ => Err(ErrorBody::new("function_not_found", call.function_id)),
            })
        })
    }
}

fn is_terminal(record: &Value) -> bool {
    record["status"].as_str().is_some_and(|s| TERMINAL.contains(&s))
}

/// Whether a delivery is for the turn the record says is running. A turn advances its own step
/// after every tool round, so the record may be past the delivered step: that delivery started
/// this very turn (a redelivery after a crash resumes it from the record). A delivery for
/// another turn, for a step the record never reached, or for a turn that is no longer running
/// is stale.
fn is_current(record: &Value, request: &TurnRequest) -> bool {
    record["turn_id"] == json!(request.turn_id)
        && record["status"] == json!("running")
        && record["step"].as_u64().is_some_and(|step| match crate::planted!("ref-current-only-at-the-delivered-step") {
            true => step == request.step,
            false => step >= request.step,
        })
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
        InvokeError::Disconnected | InvokeError::Lost => ErrorBody::new("disconnected", format!("{during}: {error}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(turn: &str, step: u64) -> TurnRequest {
        TurnRequest { session_id: "s1".into(), turn_id: turn.into(), step }
    }

    #[test]
    fn a_delivery_is_current_for_its_running_turn_at_or_past_its_step() {
        let record = json!({"turn_id": "t1", "status": "running", "step": 2});
        assert!(is_current(&record, &request("t1", 2)));
        assert!(is_current(&record, &request("t1", 1)), "the turn advanced past the delivered step");
        assert!(!is_current(&record, &request("t1", 3)), "a step the record never reached");
        assert!(!is_current(&record, &request("t0", 1)), "another turn");
        assert!(!is_current(&json!({"turn_id": "t1", "status": "failed", "step": 2}), &request("t1", 2)));
    }

    #[test]
    fn the_reference_is_rerun_by_rig_and_held_to_its_particulars() {
        // Its runs' repro lines name the `rig` binary, by this name (any other harness's name
        // their own command), and its report lines leave the harness unnamed.
        assert_eq!(crate::run::Rerun::default_for(ReferenceHarness.name()), crate::run::Rerun::Cli("rig".into()));
        // The `[policy.reference]` sections describe this harness: its suite is held to them
        // (a port of it could say yes too; a harness of its own says no).
        assert!(ReferenceHarness.reference_particulars());
    }
}
