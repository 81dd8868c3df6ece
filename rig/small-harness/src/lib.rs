//! A small correct harness, written from the rig's manual alone (`rig/docs/contract.md`,
//! `rig/docs/your-harness.md`), as a team adopting the rig writes its first one: it serves
//! turns, and calls its checkpoints around each effect, and nothing else of the contract (no
//! dead-letter handler, no `send`, `status`, switch or control commands). It exists to show what
//! such a harness gets of the rig: which shipped files it runs (its skip list is a checked-in
//! claim, `tests/skipped.snap`), and that the workloads it can serve sweep and explore from its
//! own command line.
//!
//! Its design, chosen to differ from both other correct harnesses where the contract leaves room:
//! - everything about a turn is in its turn record: the actions of every round are a field of it
//!   (`actions`, keyed by action id), so one whole-record write records a round's plan, an
//!   action's request, or its outcome;
//! - action ids are `{turn}/{step}.{index}` and idempotency keys are derived from them, so the
//!   same logical action has the same id and key whoever plans it again;
//! - a round is planned (every call of it recorded, not yet requested) before any of its
//!   effects is requested, and each action is marked requested just before its request leaves;
//! - an end it cannot record is answered to the caller with an error, and nothing of it is kept
//!   in memory: a redelivery runs the turn on from its record (the contract makes it current),
//!   and finds a completed turn's answer already in the transcript;
//! - a completed turn's answer is recorded with its end (`answer`), then presented, so whoever
//!   finds the turn ended (a stale delivery, the turn admitted next) can present it again.
//!
//! `factory()` declares `turns` and `checkpoints`; `turns_only()` is the same harness declaring
//! `turns` alone.
//!
//! **Planted bugs.** The harness also carries the realistic bugs a team's first harness has (an
//! action recorded done before any service accepted it, queued input removed before its turn is
//! written, an end answered before it is durable, ...), each behind a switch `rig::planted!("id")`
//! that compiles away in every ordinary build. The ids, with a line each, are the entries with
//! `harness = "small-harness"` in `.cargo/planted.toml`. To run the harness with one of them on,
//! build with the feature and name it in `RIG_PLANTED`:
//!
//! ```sh
//! cargo build --release -p small-harness --features planted
//! RIG_PLANTED=small-done-recorded-before-acceptance \
//!     target/release/small-harness explore scenarios/workloads --seeds 0..100 -q
//! ```
//!
//! (`rig/src/planted.rs` is the switch; `.ci/planted`, `just planted`, measures which layer of
//! the rig catches each bug.)

mod actions;
mod input;
mod store;
mod turn;

use rig::{
    Answer, Bus, Capabilities, Capability, ErrorBody, HarnessEnv, HarnessFactory, Invocation, Provider, RecordLayout,
};
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;

/// The field of a turn record holding its actions, keyed by action id.
pub const ACTIONS_FIELD: &str = "actions";
/// The field of a completed turn's record holding its answer as the transcript shows it (with
/// its `entry_key`), recorded with the end before the answer is appended.
pub(crate) const ANSWER_FIELD: &str = "answer";
/// The field of a turn admitted from queued input holding its predecessor's answer, put into
/// the transcript before the turn's input: the worker that ended the predecessor may have died
/// retrying that append, and nothing else says it is owed once the new record is written.
pub(crate) const PREDECESSOR_ANSWER_FIELD: &str = "predecessor_answer";

/// An action's statuses in this harness's layout.
pub(crate) mod status {
    /// Planned with its round, not yet requested: nothing can have happened.
    pub const PLANNED: &str = "planned";
    /// Its request may have left: its outcome is unknown until the service answers or is asked.
    pub const REQUESTED: &str = "requested";
    pub const DONE: &str = "done";
    pub const NOT_DONE: &str = "not-done";
    pub const HELD: &str = "held";
}

/// The small harness, as a factory the rig starts workers from.
#[derive(Debug, Clone, Copy)]
pub struct SmallHarness {
    /// Whether it declares `checkpoints` (its workers call them either way).
    checkpoints: bool,
}

impl HarnessFactory for SmallHarness {
    fn name(&self) -> &str {
        if self.checkpoints {
            "small"
        } else {
            "small-turns-only"
        }
    }

    fn capabilities(&self) -> Capabilities {
        let checkpoints = self.checkpoints.then_some(Capability::Checkpoints);
        [Capability::Turns].into_iter().chain(checkpoints).collect()
    }

    fn layout(&self) -> RecordLayout {
        RecordLayout {
            actions_field: ACTIONS_FIELD.into(),
            action_done_statuses: vec![status::DONE.into()],
            action_failed_statuses: vec![status::NOT_DONE.into()],
            action_held_status: status::HELD.into(),
            ..RecordLayout::default()
        }
    }

    /// It waits on the rig's clock only, and spawns with `spawn_local`.
    fn waits_on_rig_clock_only(&self) -> bool {
        true
    }

    fn start(&self, _policy: &str, env: HarnessEnv) -> Rc<dyn Provider> {
        let worker =
            Rc::new(Worker { env, leases: RefCell::default(), busy: RefCell::default(), enqueued: RefCell::default() });
        tokio::task::spawn_local(Rc::clone(&worker).recover_on_start());
        worker
    }
}

/// The harness declaring `turns` and `checkpoints`, to hand to `rig::run_with`,
/// `rig::scenario_tests!` or `rig::cli::main`.
pub fn factory() -> Arc<dyn HarnessFactory> {
    Arc::new(SmallHarness { checkpoints: true })
}

/// The same harness declaring `turns` alone.
pub fn turns_only() -> Arc<dyn HarnessFactory> {
    Arc::new(SmallHarness { checkpoints: false })
}

/// One worker. What it holds lives in memory only, and is gone with a restart.
pub(crate) struct Worker {
    pub(crate) env: HarnessEnv,
    /// The session leases it holds: the token, and the task renewing it.
    pub(crate) leases: RefCell<BTreeMap<String, store::Lease>>,
    /// One delivery at a time works on a session; another waits for it, then reads where the
    /// first left the turn.
    busy: RefCell<BTreeMap<String, Rc<tokio::sync::Mutex<()>>>>,
    /// The new turns this start of the worker put on the turn queue: what it finds recorded and
    /// not among them, as it starts, a dead predecessor may have left off the queue.
    pub(crate) enqueued: RefCell<std::collections::BTreeSet<String>>,
}

impl Worker {
    pub(crate) fn session_lock(&self, session: &str) -> Rc<tokio::sync::Mutex<()>> {
        Rc::clone(self.busy.borrow_mut().entry(session.to_string()).or_default())
    }
}

impl Provider for Worker {
    fn invoke(self: Rc<Self>, call: Invocation, bus: Bus) -> Pin<Box<dyn Future<Output = Answer>>> {
        Box::pin(async move {
            let name = call.function_id.rsplit("::").next().unwrap_or_default().to_string();
            Some(match name.as_str() {
                "turn" => self.deliver(&bus, &call.data).await,
                _ => Err(ErrorBody::new("function_not_found", format!("the small harness serves no `{name}`"))),
            })
        })
    }
}

/// A text field of a request, or `bad_request`.
pub(crate) fn text(data: &serde_json::Value, field: &str) -> Result<String, ErrorBody> {
    data[field].as_str().map(str::to_string).ok_or_else(|| ErrorBody::new("bad_request", format!("`{field}` missing")))
}
