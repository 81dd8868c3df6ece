//! The system under test: a harness, behind one narrow seam.
//!
//! A harness is a [`HarnessFactory`]: it declares the parts of the contract it serves (and so
//! the functions its workers register), where it keeps its durable state ([`RecordLayout`]), and
//! starts a worker — a [`Provider`] on the bus — afresh on every (re)start of a harness host,
//! with a [`HarnessEnv`]. The rig drives it only through the bus and judges it only from what
//! the services saw, so any implementation can be put in front of the same scenario files; the
//! reference harness ([`ReferenceHarness`]) is just the default one, built on this module's
//! public API alone.

mod reference;

use crate::bus::Provider;
use crate::capability::Capabilities;
use crate::clock::Clock;
use crate::cut::Interrupt;
use crate::layout::RecordLayout;
use crate::trace::NoteSink;
use rand_chacha::ChaCha8Rng;
use serde_json::json;
use std::cell::RefCell;
use std::rc::Rc;

pub(crate) use reference::longest_own_wait_ms;
pub use reference::{Policy, ReferenceHarness};

/// A harness implementation the rig can run scenarios against.
///
/// `Send + Sync` because one factory serves runs on several threads at once; each run builds its
/// own workers from it on its own thread, so the workers themselves need neither.
///
/// What a worker serves is said once, by [`Self::capabilities`]: the trait has no list of
/// functions to override beside it (one that disagreed would register functions the rig never
/// routes to, or skip files the harness could run), so a harness written against an older API
/// that still overrides `functions` does not compile:
///
/// ```compile_fail,E0407
/// use rig::{HarnessEnv, HarnessFactory, Provider};
/// use std::rc::Rc;
///
/// struct Mine;
///
/// impl HarnessFactory for Mine {
///     fn name(&self) -> &str { "mine" }
///     fn functions(&self) -> Vec<String> { vec!["turn".into(), "cancel".into()] }
///     fn start(&self, _policy: &str, _env: HarnessEnv) -> Rc<dyn Provider> { unimplemented!() }
/// }
/// ```
pub trait HarnessFactory: Send + Sync {
    /// A short name for reports (`reference`, `naive`, ...).
    fn name(&self) -> &str;

    /// The scenario policy sections (`[policy.NAME]`) this harness answers to. A harness that
    /// means to be correct answers to `reference`: it is held to the reference expectations.
    fn policies(&self) -> Vec<String> {
        vec!["reference".into()]
    }

    /// Where it keeps turns, actions, queued input and ownership in the state store.
    fn layout(&self) -> RecordLayout {
        RecordLayout::default()
    }

    /// The parts of the harness contract it serves. A scenario run that needs one it lacks is
    /// skipped, with the reason, never passed or failed (see [`crate::Capability`] for the set, and
    /// [`crate::Scenario::requirements`] for how a file's needs are derived). By default only
    /// `turns`: declare each further one as you implement it. The functions each worker
    /// registers follow from them ([`Capabilities::functions`]): there is no second list to
    /// keep in step, so a harness cannot serve a function it does not declare, nor declare one
    /// it does not register.
    fn capabilities(&self) -> Capabilities {
        Capabilities::default()
    }

    /// Whether it is held to the reference harness's particulars: the expectations of each
    /// `[policy.NAME]` section beyond the shared `[expect]` (how the reference harness shows that
    /// policy: its write counts, reply fields, action ids) and those on the reference harness's
    /// notes. Only the reference harness (or a faithful port of it) should say yes; every other
    /// harness is judged by the shared `[expect]` (the harness contract, see
    /// `rig/docs/contract.md`), the oracles, and what its policy declares (`violations`,
    /// `breaks`).
    fn reference_particulars(&self) -> bool {
        false
    }

    /// Whether its workers wait on time only through `env.clock` (never `tokio::time`) and
    /// spawn tasks only with `tokio::task::spawn_local`. Such a worker's host skips the
    /// simulation steps in which none of its tasks was woken, which makes runs faster and
    /// changes nothing else; a tokio timer in a host that skips would fire late, so the default
    /// is no.
    fn waits_on_rig_clock_only(&self) -> bool {
        false
    }

    /// Starts one worker, as `policy` (one of [`Self::policies`]), on the host `env.host`.
    fn start(&self, policy: &str, env: HarnessEnv) -> Rc<dyn Provider>;
}

/// The rig's hold over a worker's process: process cuts at named points, and pauses.
///
/// Named points ([`crate::cut::INTERRUPT_POINTS`]): `before_submission` (intent recorded,
/// request not sent), `after_acceptance` (the service answered, the outcome not yet recorded)
/// and `after_completion` (the outcome recorded).
pub trait ProcessControl {
    /// What happens to `worker` at `point` this time, if anything.
    fn interrupt(&self, worker: &str, point: &str) -> Option<Interrupt>;
    /// Until when `worker` is paused, if it is.
    fn paused_until(&self, worker: &str) -> Option<u64>;
    fn pause(&self, worker: &str, until_ms: u64);
}

/// What the rig gives a harness worker when its host starts.
#[derive(Clone)]
pub struct HarnessEnv {
    pub host: String,
    pub clock: Rc<Clock>,
    /// The worker's own seeded stream (turn ids, action ids, keys); it survives restarts, so
    /// ids drawn before and after a crash never collide.
    pub rng: Rc<RefCell<ChaCha8Rng>>,
    pub config: HarnessConfig,
    /// Where the worker reports its decisions; they go into the trace as notes.
    pub note: NoteSink,
    pub process: Rc<dyn ProcessControl>,
    /// This start's handle on the bus, for work the worker begins by itself (a recovery sweep
    /// at start, retries in the background); calls it serves come with their own.
    pub bus: crate::bus::Bus,
}

impl HarnessEnv {
    /// A fresh UUID from the worker's seeded stream.
    pub fn new_id(&self) -> String {
        crate::streams::uuid(&mut self.rng.borrow_mut())
    }

    /// Reports a decision for the trace.
    pub fn note(&self, what: &str, detail: serde_json::Value) {
        (self.note)(what, detail);
    }

    /// This worker's own function of the given name (`harness::turn` on host `harness`).
    pub fn function(&self, name: &str) -> String {
        format!("{}::{name}", self.host)
    }

    /// A named interruption point: the rig may freeze the worker here for good (until it is
    /// crashed) or pause it for a while; a pause set from outside is honoured here too.
    pub async fn checkpoint(&self, point: &str, action_id: &str) {
        match self.process.interrupt(&self.host, point) {
            // A crash takes the host down from outside; until it does, nothing goes on here.
            Some(Interrupt::Freeze | Interrupt::Crash) => {
                self.note("interrupted", json!({ "point": point, "action_id": action_id, "freeze": true }));
                std::future::pending::<()>().await;
            }
            Some(Interrupt::Pause { ms }) => {
                self.note("interrupted", json!({ "point": point, "action_id": action_id, "pause_ms": ms }));
                self.process.pause(&self.host, self.clock.now_ms().saturating_add(ms));
            }
            None => {}
        }
        self.wait_while_paused().await;
    }

    /// Blocks while the rig has this worker paused (a stop-the-world pause, as a long GC or a
    /// suspended VM would cause).
    pub async fn wait_while_paused(&self) {
        while let Some(until) = self.process.paused_until(&self.host) {
            if until <= self.clock.now_ms() {
                break;
            }
            self.clock.sleep_until(until).await;
        }
    }
}

/// The system prompt unless a scenario's `[world] system_prompt` says otherwise.
pub const DEFAULT_SYSTEM_PROMPT: &str =
    "You are a durable agent harness. Use the tools offered when the task needs them.";

/// The harness's timeouts and limits, as a scenario's `[world]` sets them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HarnessConfig {
    /// Deadline of state and session calls (the seed's fixtures shorten it to 300 ms).
    pub session_timeout_ms: u64,
    pub model_timeout_ms: u64,
    /// Enqueue attempts when reseeding queued input as a new turn.
    pub enqueue_attempts: u32,
    /// The queue new turns go through.
    pub turn_queue: String,
    /// Retries of deferred work (terminalisation, reconciliation, reseeding) before giving up.
    pub terminalize_attempts: u32,
    pub terminalize_backoff_ms: u64,
    /// How long a worker goes on settling what it left to the background (a command, a claim,
    /// an admission, a deferred terminal state, a turn it drives on by itself) before it gives
    /// up: long enough to outlast an outage, retried with backoff all the while.
    pub settle_within_ms: u64,
    /// How long an exported session waits for an import to take its turn over before the worker
    /// that exported it takes it back.
    pub handover_ms: u64,
    /// Time to live of a session's ownership lease; 0 runs without ownership.
    pub lease_ttl_ms: u64,
    /// Deadline of an effect request.
    pub tool_timeout_ms: u64,
    /// The tools the harness may dispatch, as the world's services document them.
    pub tools: Vec<Tool>,
    /// The system prompt every generation request carries.
    pub system_prompt: String,
    /// The functions bound to the harness's hook points and lifecycle triggers.
    pub bindings: Vec<Binding>,
    /// Whether the world has versioned configuration (the `config` service): a turn then pins
    /// the production version (`config::resolve`) when it is created and runs on it
    /// (`config::get`), and consults the safety overlay (`config::overlay`) at each safe point;
    /// `system_prompt` and `tools` are then the world's defaults, not what a turn offers.
    pub versioned_config: bool,
}

/// A tool the harness may dispatch, as its service documents it to the harness and the harness
/// offers it to the model.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Tool {
    /// The name the model calls it by (`ticket.create`).
    pub name: String,
    /// The service function a call of it invokes (`ticket::create`).
    pub function: String,
    /// What the model is told it does, and the JSON schema of its arguments.
    pub description: String,
    pub parameters: serde_json::Value,
    /// Whether it is safe to run again after an interruption (`replay: 'safe'`).
    pub replay_safe: bool,
    /// The service's namespace: it answers `{service}::status` (by idempotency key) and
    /// `{service}::lookup` (by client reference) about an action.
    pub service: String,
    /// What the service guarantees: they decide how far a negative reconciliation can be trusted.
    pub idempotency: bool,
    pub idempotency_window_ms: u64,
    pub lookup: bool,
}

/// Where a binding attaches to the harness.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum BindingPoint {
    /// A hook consulted before a tool call runs: it may let it continue, change its arguments,
    /// hold it for a release, or deny it.
    PreTrigger,
    /// Told once a turn's terminal state is durable.
    TurnCompleted,
}

impl BindingPoint {
    pub const ALL: [BindingPoint; 2] = [BindingPoint::PreTrigger, BindingPoint::TurnCompleted];

    pub fn name(self) -> &'static str {
        match self {
            BindingPoint::PreTrigger => "pre-trigger",
            BindingPoint::TurnCompleted => "turn-completed",
        }
    }
}

/// A function bound to a hook point or a lifecycle trigger of the harness.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Binding {
    pub trigger: BindingPoint,
    /// The function invoked.
    pub function: String,
    /// For hooks: the tool functions it is consulted for (empty: every tool).
    pub functions: Vec<String>,
    /// For hooks: lower runs first; equal priorities run in the order they were bound.
    pub priority: i64,
}

impl Default for HarnessConfig {
    fn default() -> Self {
        Self {
            session_timeout_ms: 30_000,
            model_timeout_ms: 60_000,
            enqueue_attempts: 5,
            turn_queue: "harness-turn".into(),
            terminalize_attempts: 8,
            terminalize_backoff_ms: 100,
            settle_within_ms: 120_000,
            handover_ms: 30_000,
            lease_ttl_ms: 0,
            tool_timeout_ms: 30_000,
            tools: Vec::new(),
            system_prompt: DEFAULT_SYSTEM_PROMPT.to_string(),
            bindings: Vec::new(),
            versioned_config: false,
        }
    }
}
