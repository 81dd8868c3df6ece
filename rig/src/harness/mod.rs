//! The system under test: a harness worker, behind one narrow trait.
//!
//! A harness is a [`Provider`] that names the functions it serves. The rig starts it afresh on
//! every (re)start of its host, hands it a [`HarnessEnv`], and drives it only through the bus,
//! so another harness implementation can be driven by the same scenario files.

mod actions;
mod ownership;
mod reference;

use crate::bus::Provider;
use crate::sim::clock::Clock;
use rand_chacha::ChaCha8Rng;
use serde_json::Value;
use std::cell::RefCell;
use std::rc::Rc;

pub use actions::classify;
pub use ownership::OWNER_SCOPE;
pub use reference::{Policy, ReferenceHarness};

/// What the rig does to a worker that reaches a named interruption point.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Interrupt {
    /// Stop right there and never go on (the scenario then crashes or abandons the worker).
    Freeze,
    /// Stop the whole worker for `ms` milliseconds (its lease renewals too), then go on.
    Pause { ms: u64 },
}

/// The rig's hold over a worker's process: interruptions at named points and pauses.
///
/// Named points: `before_submission` (intent recorded, request not sent),
/// `after_acceptance` (the service answered, the outcome not yet recorded) and
/// `after_completion` (the outcome recorded).
pub trait ProcessControl {
    /// What happens to `worker` at `point` this time, if anything.
    fn interrupt(&self, worker: &str, point: &str) -> Option<Interrupt>;
    /// Until when `worker` is paused, if it is.
    fn paused_until(&self, worker: &str) -> Option<u64>;
    fn pause(&self, worker: &str, until_ms: u64);
}

/// A harness worker on the bus.
pub trait Harness: Provider {
    /// The functions it registers with the engine.
    fn functions(&self) -> Vec<String>;
}

/// Where a harness reports a decision (`what`, with details) for the trace.
pub type NoteSink = Rc<dyn Fn(&str, Value)>;

/// What the rig gives a harness when its host starts.
#[derive(Clone)]
pub struct HarnessEnv {
    pub host: String,
    pub clock: Rc<Clock>,
    /// The harness's own seeded stream (turn ids, action ids).
    pub rng: Rc<RefCell<ChaCha8Rng>>,
    pub config: HarnessConfig,
    /// Where the harness reports its decisions; they go into the trace as notes.
    pub note: NoteSink,
    pub process: Rc<dyn ProcessControl>,
}

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
    /// Terminalisation retries after an unconfirmed finalisation (reference policy).
    pub terminalize_attempts: u32,
    pub terminalize_backoff_ms: u64,
    /// Time to live of a session's ownership lease; 0 runs without ownership.
    pub lease_ttl_ms: u64,
    /// Deadline of an effect request.
    pub tool_timeout_ms: u64,
    /// What the ticket service guarantees, as documented to the harness: it decides how far a
    /// negative reconciliation can be trusted.
    pub tickets: doubles::TicketConfig,
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
            lease_ttl_ms: 0,
            tool_timeout_ms: 30_000,
            tickets: doubles::TicketConfig::default(),
        }
    }
}
