//! Running one scenario under one policy from one seed, against one harness.

use crate::bus::Bus;
use crate::capability::Skip;
use crate::cut::{CutTable, ProcessCutTable};
use crate::expect::{self, effect_counts, Expectation, Observed};
use crate::harness::{HarnessEnv, HarnessFactory, ReferenceHarness};
use crate::layout::RecordLayout;
use crate::oracle::{self, Evidence, Oracle, Violation};
use crate::recovery::{self, Recovery};
use crate::scenario::{PolicyRun, Scenario};
use crate::script::{run_script, Settled};
use crate::sim::hosts::{self, SimulatedNetwork};
use crate::sim::world::World;
use crate::sim::Runner;
use crate::topology::{Plan, Role, Topology};
use crate::trace::{EventKind, Trace};
use doubles::{ScriptedModel, ScriptedReply, SessionService, StateStore};
use serde_json::Value;
use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::rc::Rc;
use std::sync::Arc;

pub(crate) mod cpu;
mod uncut;

pub(crate) use uncut::keep_workload_digests;
pub use uncut::{forget as forget_uncut_runs, tally as uncut_tally, UncutRun};

/// Everything one run produced.
pub struct RunOutcome {
    pub scenario: String,
    /// The harness that ran (`reference` unless a user's).
    pub harness: String,
    pub policy: String,
    pub seed: u64,
    pub passed: bool,
    pub trace_hash: String,
    pub sim_ms: u64,
    pub wall_us: u64,
    pub steps: u64,
    pub effects: BTreeMap<String, u64>,
    pub violations: Vec<Violation>,
    pub expected_violations: Vec<Oracle>,
    pub failures: Vec<String>,
    /// What the report says beside the verdict, one sentence each: what the run reached that the
    /// file did not show it would (a message that ran out of deliveries, for a harness without
    /// a dead-letter handler), and when.
    pub notes: Vec<String>,
    /// How the expectations a known-bad policy breaks on purpose failed, one line each: the
    /// planted bug as the run showed it.
    pub broke: Vec<String>,
    pub rpc: BTreeMap<String, Value>,
    /// The store's records at the end, each shared with the store (and the trace's commit of it).
    pub state: Vec<(String, String, doubles::Kept)>,
    /// Every recorded action at the end of the run: complete, held or unsettled, with owners.
    pub actions: Vec<ActionStatus>,
    /// How often each worker reached each named interruption point, as `((worker, point), n)`:
    /// where process cuts can go.
    pub interrupt_points: BTreeMap<(String, String), u64>,
    /// Its work beyond the uncut workload's, and the bound on it; `None` for a live run.
    pub recovery: Option<Recovery>,
    pub trace: Trace,
    /// A live run's command line: it runs the scenario again against the same kind of worker,
    /// but there is no bit-for-bit replay of a live run. `None` for a simulated run.
    pub live: Option<String>,
    /// Why this run is no verdict, neither passed nor failed: a live run the machine did not
    /// keep real time for, or one a signal stopped (see `rig/docs/live.md`). Always `None` for a
    /// simulated run, whose time is its own.
    pub void: Option<String>,
    /// What reruns this simulated run's harness (see [`RunOutcome::repro`]).
    pub rerun: Rerun,
}

/// What reruns a simulated run: the repro line names the command that reruns *its* harness.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rerun {
    /// A command line running the harness's CLI: `rig` for the reference harness, a user's
    /// binary built on `rig::cli::main`. The repro is `PROGRAM run FILE --policy P --seed N`.
    Cli(String),
    /// A whole command line of its own, such as the one test that ran it.
    Command(String),
    /// No command line is known to run this harness.
    Unknown,
}

impl Rerun {
    /// What reruns runs of `harness` when nothing else is known: `rig` runs the reference.
    pub fn default_for(harness: &str) -> Self {
        if harness == "reference" {
            Rerun::Cli("rig".into())
        } else {
            Rerun::Unknown
        }
    }
}

/// Where one action stands at the end of a run, as the person approving a switch needs it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ActionStatus {
    pub session_id: String,
    pub action_id: String,
    pub tool: String,
    /// `complete` (a confirmed outcome: done, or definitely not done), `held` (needs a person)
    /// or `unsettled` (it may have happened; nothing has established it).
    pub class: String,
    pub status: String,
    pub owner: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

impl RunOutcome {
    /// The actions that are not complete.
    pub fn unresolved(&self) -> impl Iterator<Item = &ActionStatus> {
        self.actions.iter().filter(|a| a.class != "complete")
    }

    /// The shell command that replays this run, with its own harness, from any folder: its
    /// CLI ([`Rerun::Cli`]) on the scenario's absolute path, or the command line that ran it. For
    /// a live run: the command that runs it again.
    pub fn repro(&self) -> String {
        if let Some(command) = &self.live {
            return command.clone();
        }
        let path = std::path::Path::new(&self.scenario);
        let absolute = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
        let arguments =
            format!("run {} --policy {} --seed {}", shell_word(&absolute.to_string_lossy()), self.policy, self.seed);
        match &self.rerun {
            Rerun::Cli(program) => format!("{program} {arguments}"),
            Rerun::Command(command) => command.clone(),
            Rerun::Unknown => format!(
                "(no command line is known to run harness `{}`: give its crate a binary calling rig::cli::main, then BINARY {arguments})",
                self.harness
            ),
        }
    }
}

/// `text` as one shell word: as it is when it is plain, single-quoted otherwise.
pub(crate) fn shell_word(text: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "/._-+:@,=".contains(c);
    if !text.is_empty() && text.chars().all(plain) {
        text.to_string()
    } else {
        format!("'{}'", text.replace('\'', "'\\''"))
    }
}

/// Reads every action from the final turn records, through the harness's record layout; the
/// owner is the session's lease holder when there is one, else the worker that recorded it.
fn action_statuses(store: &StateStore, layout: &RecordLayout) -> Vec<ActionStatus> {
    let mut statuses = Vec::new();
    for (scope, session_id, record) in store.records() {
        if scope != layout.turn_scope {
            continue;
        }
        let holder = store.lease(&layout.owner_scope, session_id).map(|lease| lease.owner);
        for (action_id, entry) in layout.turn_actions(store, session_id, record) {
            let recorded_by = entry["owner"].as_str().unwrap_or("");
            statuses.push(ActionStatus {
                session_id: session_id.to_string(),
                action_id: action_id.to_string(),
                tool: entry["tool"].as_str().unwrap_or("").to_string(),
                class: layout.classify(entry).name().to_string(),
                status: layout.action_status(entry).to_string(),
                owner: holder.clone().unwrap_or_else(|| recorded_by.to_string()),
                reason: layout.held_reason(entry).map(str::to_string),
            });
        }
    }
    statuses
}

/// Runs `scenario` under `run.policy` from `seed`, against the reference harness.
pub fn run(scenario: &Scenario, run: &PolicyRun, seed: u64) -> RunOutcome {
    // The reference harness serves the whole contract: nothing is skipped for it.
    run_unchecked(&reference(), scenario, run, seed)
}

/// The reference harness, as a factory to hand to [`run_with`].
pub fn reference() -> Arc<dyn HarnessFactory> {
    Arc::new(ReferenceHarness)
}

/// Runs `scenario` under `run.policy` from `seed`, against `harness`, when the harness serves
/// what the run needs; otherwise the run is not made, and the [`Skip`] says why (what the file's
/// story uses that the harness does not declare), as every command and `scenario_tests!` say it.
pub fn run_with(
    harness: &Arc<dyn HarnessFactory>,
    scenario: &Scenario,
    run: &PolicyRun,
    seed: u64,
) -> Result<RunOutcome, Skip> {
    match scenario.skip_for(harness.as_ref(), &run.policy) {
        Some(skip) => Err(skip),
        None => Ok(run_unchecked(harness, scenario, run, seed)),
    }
}

/// [`run_with`] without the check: the run is made even when the harness does not declare what
/// it needs. For showing what a skip spares a harness, and for callers that checked already;
/// a verdict of such a run judges a harness on a part of the contract it never claimed.
pub fn run_unchecked(harness: &Arc<dyn HarnessFactory>, scenario: &Scenario, run: &PolicyRun, seed: u64) -> RunOutcome {
    let (declared, file) = (harness.capabilities(), scenario);
    let wired = file.wired_for(&declared);
    let scenario = wired.as_ref();
    // Every log line of the run names it: scenario, policy and seed. At level error, the span is
    // on whenever anything at all is logged, so even a warning alone carries it.
    let _span = tracing::error_span!(target: "rig::trace", "run", scenario = %scenario.path.display(), policy = %run.policy, seed).entered();
    // Wall time is measured for the report only; nothing in the run reads it.
    let started = std::time::Instant::now();
    let (world, mut ended, failures) = simulate(harness, scenario, &run.policy, seed, Simulation::Judged);
    ended.started = started;
    // Made once for the run: each is a fresh set of owned texts, and judging reads them often.
    let (layout, effects) = (harness.layout(), scenario.world.services.effect_functions());
    let read = Read { layout: &layout, effects: &effects };
    ended.outcome = outcome_to_judge(harness, scenario, &run.policy, seed, &world, &ended.settled, read);
    ended.uncut = ended.outcome.as_ref().map(|(_, uncut)| Arc::clone(uncut));
    ended.recovery = Some(measure_recovery(harness, scenario, &run.policy, seed, &world, &ended, read));
    let judged = Judged { name: harness.name(), layout, reference_particulars: harness.reference_particulars() };
    let mut outcome = judge(&world, scenario, run, seed, &judged, ended, failures);
    let reached = file.reached_undeclared(harness.name(), &declared, outcome.trace.events());
    outcome.notes.extend(reached);
    outcome
}

/// How a run's harness keeps its records and which of the world's calls are effects, made once
/// per run for everything that reads a run's events.
#[derive(Clone, Copy)]
struct Read<'a> {
    layout: &'a RecordLayout,
    effects: &'a crate::services::EffectFunctions,
}

/// What a simulation is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Simulation {
    /// A run to judge: it stops at a step that cannot complete, and its trace is hashed.
    Judged,
    /// An uncut run: it goes on past a step that cannot complete (a wait for a fault that is not
    /// there), and nothing reads its trace hash.
    Uncut,
}

/// Runs the scenario's world and script, to be judged or measured as an uncut run.
fn simulate(
    harness: &Arc<dyn HarnessFactory>,
    scenario: &Scenario,
    policy: &str,
    seed: u64,
    simulation: Simulation,
) -> (Rc<World>, Ended, Vec<String>) {
    let started = std::time::Instant::now();
    let proxy_worker = scenario.proxy.as_ref().map(|p| p.worker.clone());
    let topology = topology_of(scenario.world.plan(harness.capabilities().functions(), proxy_worker));
    let world = seeded_world(scenario, seed);
    if simulation == Simulation::Uncut {
        world.trace_unhashed();
    }
    let mut runner = Runner::new(Rc::clone(&world), scenario.world.network.clone());
    add_hosts(&mut runner, &topology, scenario, harness, policy);
    let mut failures = Vec::new();
    let keep_going = simulation == Simulation::Uncut;
    // A task that panics is dropped by its runtime, leaving only a deadline to show for it.
    let (settled, panics, more) =
        crate::panics::capture(|| run_script(&mut runner, &topology, scenario, seed, keep_going, &mut failures));
    let harness_hosts: Vec<String> =
        topology.hosts().iter().filter(|h| h.role == Role::Harness).map(|h| h.name.clone()).collect();
    failures.extend(panics.iter().map(|panic| crate::panics::failure(panic, &harness_hosts)));
    if more > 0 {
        failures.push(format!("{more} more panic(s) during the run"));
    }
    let ended = Ended {
        at_ms: runner.now_ms(),
        steps: runner.steps(),
        settled,
        started,
        recovery: None,
        uncut: None,
        outcome: None,
    };
    drop(runner);
    (world, ended, failures)
}

thread_local! {
    /// The plan the last run on this thread was wired from, and its topology: the runs of one
    /// file and harness (each seed and policy, and the uncut runs among them) share one rather
    /// than each listing its hosts and naming their functions again (0.6 % of a run's
    /// instructions, under callgrind). Only a run with an equal plan shares it, so a run is
    /// wired the same whatever ran before it.
    static LAST_TOPOLOGY: RefCell<Option<(Plan, Rc<Topology>)>> = const { RefCell::new(None) };
}

/// The topology of `plan`: the last run's when its plan was the same.
fn topology_of(plan: Plan) -> Rc<Topology> {
    LAST_TOPOLOGY.with(|last| {
        let mut last = last.borrow_mut();
        match &*last {
            Some((made_for, topology)) if *made_for == plan => Rc::clone(topology),
            _ => {
                let topology = Rc::new(Topology::new(&plan));
                *last = Some((plan, Rc::clone(&topology)));
                topology
            }
        }
    })
}

/// The seed whose uncut run is the workload's outcome a run is held to first (see
/// [`outcome_to_judge`]).
pub const CANONICAL_UNCUT_SEED: u64 = 0;

/// What the `outcome` oracle holds a finished run to: its own outcome and its workload's uncut
/// run at its seed; `None` when there is nothing to judge.
///
/// Nothing to judge: a file whose outcome depends on its faults by design; a run in which no
/// fault fired (it is its own uncut run); and a run whose outcome differs from what its workload
/// comes to uncut at [`CANONICAL_UNCUT_SEED`] in no way the contract forbids: an outcome the
/// workload comes to without faults, but for the permitted differences, was not changed by them.
/// Only a run the canonical uncut run finds fault with is held to its own seed's uncut run (the
/// one the verdict is about), which is simulated then. So a catalogue pass simulates one uncut
/// run per file and policy, not one per seed, and the verdict still never depends on what else
/// ran in the process: the uncut runs it reads are fixed by the file, policy and seed (the memory
/// only spares simulating them again). What this gives up: a run that came to what the workload
/// comes to uncut under another timing (the canonical seed's) and not under its own passes.
fn outcome_to_judge(
    harness: &Arc<dyn HarnessFactory>,
    scenario: &Scenario,
    policy: &str,
    seed: u64,
    world: &World,
    settled: &Settled,
    read: Read<'_>,
) -> Option<(oracle::Outcome, Arc<UncutRun>)> {
    if scenario.outcome_depends_on_faults.is_some() || !uncut::has_faults(scenario) {
        return None;
    }
    let run = {
        let trace = world.trace();
        let fault = |kind: &EventKind| {
            matches!(kind, EventKind::Cut { .. } | EventKind::Interrupt { .. } | EventKind::ProxyRule { .. })
        };
        if !trace.events().iter().any(|event| fault(&event.kind)) {
            return None;
        }
        let (store, sessions) = (world.store.borrow(), world.session.borrow());
        oracle::Outcome::of(trace.events(), &store, &sessions, &outcome_workload(scenario), read.layout, read.effects)
    };
    let canonical = uncut_run(harness, scenario, policy, CANONICAL_UNCUT_SEED)?;
    let against = outcome_judged(&run, &canonical.outcome, scenario, settled, read.layout);
    if oracle::outcome_differences(&against, read.layout, read.effects).is_empty() {
        return None;
    }
    let own = if seed == CANONICAL_UNCUT_SEED { canonical } else { uncut_run(harness, scenario, policy, seed)? };
    Some((run, own))
}

/// What the `outcome` oracle needs to hold `run` to `uncut`.
fn outcome_judged<'a>(
    run: &'a oracle::Outcome,
    uncut: &'a oracle::Outcome,
    scenario: &Scenario,
    settled: &Settled,
    layout: &RecordLayout,
) -> oracle::OutcomeJudged<'a> {
    oracle::OutcomeJudged {
        run,
        uncut,
        script_complete: settled.steps_completed,
        deterministic_model: scenario.world.model_deterministic,
        written_by_script: written_turns(&scenario.steps, &layout.turn_scope),
    }
}

/// The uncut run of `scenario`'s workload under `policy` and `seed` (see [`uncut`]): remembered,
/// or simulated now and remembered. `None` when the scenario scripts no fault: its own run is
/// its uncut run.
pub(crate) fn uncut_run(
    harness: &Arc<dyn HarnessFactory>,
    scenario: &Scenario,
    policy: &str,
    seed: u64,
) -> Option<Arc<uncut::UncutRun>> {
    if !uncut::has_faults(scenario) {
        return None;
    }
    // The key leaves the faults out, so the scenario's is its workload's: the workload is
    // copied out of it only when it is to be simulated.
    let key = uncut::key(harness.name(), policy, seed, scenario);
    let canonical = seed == CANONICAL_UNCUT_SEED;
    if let Some(made) = uncut::recall(key, canonical) {
        return Some(made);
    }
    let workload = uncut::uncut(scenario)?;
    let started = cpu::thread_ns();
    let (world, _, _) = simulate(harness, &workload, policy, seed, Simulation::Uncut);
    let made = Arc::new(uncut_of(harness, &workload, &world));
    drop(world);
    uncut::count_simulated(cpu::thread_ns().saturating_sub(started));
    uncut::remember(key, canonical, Arc::clone(&made));
    Some(made)
}

/// What a finished run came to, as an uncut run of its workload.
fn uncut_of(harness: &Arc<dyn HarnessFactory>, scenario: &Scenario, world: &World) -> uncut::UncutRun {
    let (effects, layout) = (scenario.world.services.effect_functions(), harness.layout());
    let read = Read { layout: &layout, effects: &effects };
    let work = recovery::measure(world.trace().events(), read.effects, read.layout);
    uncut_measured(scenario, world, work, read)
}

/// [`uncut_of`] for a run whose work is measured already.
fn uncut_measured(scenario: &Scenario, world: &World, work: recovery::Measured, read: Read<'_>) -> uncut::UncutRun {
    let trace = world.trace();
    let (store, sessions) = (world.store.borrow(), world.session.borrow());
    let outcome =
        oracle::Outcome::of(trace.events(), &store, &sessions, &outcome_workload(scenario), read.layout, read.effects);
    uncut::UncutRun { work, outcome }
}

/// The functions of a harness's control commands (on whichever host the script invokes them):
/// a release or denial of a held call, and the commands of the control record.
const COMMANDS: [&str; 5] = ["resolve", "stop", "cancel", "pause", "resume"];

/// What reading a run's outcome needs of its scenario: the seeded records, the cuts that refuse
/// a call outright, the script's control commands and the sessions they name.
fn outcome_workload(scenario: &Scenario) -> oracle::OutcomeWorkload<'_> {
    use crate::cut::{Refusal, ServiceFault};
    let refusing = (scenario.cuts.iter().enumerate())
        .filter(|(_, cut)| {
            matches!(
                cut.fault,
                ServiceFault::Reject { .. } | ServiceFault::Outage { refuse: Refusal::Reject { .. }, .. }
            )
        })
        .map(|(index, _)| index)
        .collect();
    let mut commanded = BTreeMap::new();
    for step in &scenario.steps {
        let crate::scenario::Step::Invoke { call, .. } = step else { continue };
        let function = call.function.split_once("::").map_or("", |(_, function)| function);
        if let (true, Some(session)) = (COMMANDS.contains(&function), call.payload["session_id"].as_str()) {
            commanded.insert(call.name.clone(), session.to_string());
        }
    }
    oracle::OutcomeWorkload { seeded: &scenario.world.records, refusing, commanded }
}

/// The run's work against the same workload run uncut (see [`crate::recovery`]): the uncut run
/// is simulated only when the verdict depends on it. A run with no scripted faults is its own
/// uncut run, and is remembered as its workload's when every step completed.
fn measure_recovery(
    harness: &Arc<dyn HarnessFactory>,
    scenario: &Scenario,
    policy: &str,
    seed: u64,
    world: &World,
    ended: &Ended,
    read: Read<'_>,
) -> Recovery {
    let (settled, uncut) = (&ended.settled, ended.uncut.as_deref());
    let mut recovery = {
        let trace = world.trace();
        Recovery {
            run: recovery::measure(trace.events(), read.effects, read.layout),
            uncut: None,
            faults: recovery::faults(trace.events()),
            turns: recovery::turns(trace.events(), read.layout),
            per_fault_max: scenario.world.recovery_per_fault_max,
        }
    };
    if !uncut::has_faults(scenario) {
        recovery.uncut = Some(recovery.run);
        if settled.steps_completed {
            let key = uncut::key(harness.name(), policy, seed, scenario);
            let made = uncut_measured(scenario, world, recovery.run, read);
            uncut::remember(key, seed == CANONICAL_UNCUT_SEED, Arc::new(made));
        }
    } else if recovery.needs_uncut() {
        // Not otherwise, even when the memory holds it: what a run reports never depends on what
        // ran before it in the process.
        recovery.uncut = match uncut {
            Some(made) => Some(made.work),
            None => uncut_run(harness, scenario, policy, seed).map(|made| made.work),
        };
    }
    recovery
}

/// How a run ended, for judging it.
pub(crate) struct Ended {
    pub at_ms: u64,
    /// Simulation steps taken (none live).
    pub steps: u64,
    pub settled: Settled,
    /// When the run started, on the wall clock, for the report only.
    pub started: std::time::Instant,
    /// Its work against its uncut workload's (not measured live).
    pub recovery: Option<Recovery>,
    /// Its workload's uncut run at its seed, when the `outcome` oracle needed it (see
    /// [`outcome_to_judge`]); `recovery-cost` reads its work then rather than simulate it again.
    pub uncut: Option<Arc<UncutRun>>,
    /// What the run came to, and the uncut run the `outcome` oracle holds it to.
    pub outcome: Option<(oracle::Outcome, Arc<UncutRun>)>,
}

/// What judging needs to know of the harness that ran.
pub(crate) struct Judged<'a> {
    pub name: &'a str,
    pub layout: RecordLayout,
    /// Whether the reference harness's particulars apply to it: each policy section's own
    /// expectations, and those on the reference harness's notes.
    pub reference_particulars: bool,
}

/// Judges a finished run from its world: the oracles, the scenario's expectations for the
/// policy run, cuts that never fired; and gathers what the report shows.
pub(crate) fn judge(
    world: &World,
    scenario: &Scenario,
    run: &PolicyRun,
    seed: u64,
    harness: &Judged<'_>,
    ended: Ended,
    mut failures: Vec<String>,
) -> RunOutcome {
    let Ended { at_ms: ended_at_ms, steps, settled, started, recovery, uncut: _, outcome } = ended;
    let trace = world.take_trace();
    let store = world.store.borrow();
    let sessions = world.session.borrow();
    let unused = world.unused_script();
    let generations = world.generations();
    let queues = world.queues.borrow();
    let layout = &harness.layout;
    let (replies, unjudged) = world.replies();
    if unjudged > 0 {
        failures
            .push(format!("{unjudged} replies to the queue or to workers were too many to keep, and went unjudged"));
    }
    let violations = oracle::check(&Evidence {
        events: trace.events(),
        replies: &replies,
        store: &store,
        sessions: &sessions,
        layout,
        dead_letters: queues.unresolved_dead_letters(),
        given_up: queues.given_up(),
        effect_functions: scenario.world.services.effect_functions(),
        healed_at_ms: settled.healed_at_ms,
        ended_at_ms,
        quiescent: settled.quiescent,
        effects_per_action_max: scenario.world.effects_per_action_max,
        recovery: recovery.as_ref(),
        config: scenario.world.services.config.as_ref(),
        tool_functions: scenario.world.harness.tools.iter().map(|t| (t.name.clone(), t.function.clone())).collect(),
        hook_replies: scenario.world.services.plain_replies(),
        generations: &generations,
        seeded: &scenario.world.records,
        sends: sent_messages(&scenario.steps[..settled.steps_begun.min(scenario.steps.len())]),
        outcome: outcome.as_ref().map(|(run, uncut)| outcome_judged(run, &uncut.outcome, scenario, &settled, layout)),
    });
    judge_violations(&violations, run, &mut failures);
    failures.extend(vacuous_cuts(world, scenario, &trace, harness.name));
    let effects = effect_counts(trace.events());
    // Taken, not copied: the world is not read for them again after its judgement.
    let rpc = world.rpc.take();
    let applicable = applicable_expectations(run, harness.reference_particulars);
    let observed = Observed {
        rpc: &rpc,
        store: &store,
        events: trace.events(),
        effects: &effects,
        sessions: &sessions,
        unused: &unused,
        layout,
    };
    failures.extend(expect::check(&applicable, &observed));
    let broke = expect::broken(&run.broken, &observed);
    failures.extend(expect::check_broken(&broke));
    let state = store.kept().map(|(s, k, v)| (s.to_string(), k.to_string(), v.clone())).collect();
    let actions = action_statuses(&store, layout);
    RunOutcome {
        scenario: scenario.path.display().to_string(),
        harness: harness.name.to_string(),
        policy: run.policy.clone(),
        seed,
        passed: failures.is_empty(),
        trace_hash: trace.hash(),
        sim_ms: ended_at_ms,
        wall_us: u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX),
        steps,
        effects,
        violations,
        expected_violations: run.expected_violations.iter().copied().collect(),
        failures,
        notes: Vec::new(),
        broke: broke.into_iter().flat_map(|(_, failed)| failed).collect(),
        rpc,
        state,
        actions,
        interrupt_points: world.arrivals(),
        recovery,
        trace,
        live: None,
        void: None,
        rerun: Rerun::default_for(harness.name),
    }
}

/// The messages the client sent with the driver's invocations among `steps` (those begun): one
/// per idempotency key, or per invocation without one.
/// The keys of the turn records the script writes itself (`put` steps into the turn scope).
fn written_turns(steps: &[crate::scenario::Step], turn_scope: &str) -> BTreeSet<String> {
    let put = |step: &crate::scenario::Step| match step {
        crate::scenario::Step::Put { scope, key, .. } if scope == turn_scope => Some(key.clone()),
        _ => None,
    };
    steps.iter().filter_map(put).collect()
}

fn sent_messages(steps: &[crate::scenario::Step]) -> Vec<oracle::Sent> {
    steps
        .iter()
        .filter_map(|step| match step {
            crate::scenario::Step::Invoke { call, .. } if call.function.ends_with("::send") => {
                let session_id = call.payload["session_id"].as_str()?.to_string();
                let identity = match call.payload["idempotency_key"].as_str() {
                    Some(key) => format!("key:{key}"),
                    None => format!("step:{}", call.name),
                };
                Some(oracle::Sent { session_id, identity })
            }
            _ => None,
        })
        .collect()
}

/// What a run of `run` is held to: the shared `[expect]` it keeps (the harness contract), and
/// for the reference harness its particulars too (the policy section's own expectations). An
/// expectation on the reference harness's notes judges only the reference harness, wherever the
/// file puts it.
fn applicable_expectations(run: &PolicyRun, reference_particulars: bool) -> Vec<Expectation> {
    let particulars = run.particulars.iter().filter(|_| reference_particulars);
    run.expectations
        .iter()
        .chain(particulars)
        .filter(|e| reference_particulars || !e.reads_harness_notes())
        .cloned()
        .collect()
}

/// A known-bad policy must trip exactly the oracles it declares; any other trip is a failure.
fn judge_violations(violations: &[Violation], run: &PolicyRun, failures: &mut Vec<String>) {
    let expected = &run.expected_violations;
    let fired: BTreeSet<Oracle> = violations.iter().map(|v| v.oracle).collect();
    // A known-bad policy changes what its runs come to as a rule it breaks would have it, so
    // `outcome` may fire beside what its section lists without being listed; listed, it must.
    let known_bad = !expected.is_empty() || !run.broken.is_empty();
    let excused = |oracle: Oracle| expected.contains(&oracle) || (known_bad && oracle == Oracle::Outcome);
    for violation in violations.iter().filter(|v| !excused(v.oracle)) {
        failures.push(format!("oracle `{}` fired: {}", violation.oracle.name(), violation.detail));
    }
    for oracle in expected.difference(&fired) {
        failures.push(format!("oracle `{}` was expected to fire under this policy, and did not", oracle.name()));
    }
}

/// A scripted cut that never fired tested nothing: the run says so, and why, in terms of what
/// the harness did (a call it never made, a point it never reached), unless the file marked the
/// cut optional.
fn vacuous_cuts(world: &World, scenario: &Scenario, trace: &Trace, harness: &str) -> Vec<String> {
    const UNTESTED: &str = "the run did not test it (mark it `optional = true` if that is expected)";
    let mut failures = Vec::new();
    for (index, cut) in world.cuts.borrow().cuts().iter().enumerate() {
        if cut.trigger.is_vacuous() {
            let calls = trace
                .events()
                .iter()
                .filter(|e| matches!(&e.kind, EventKind::Call { function, .. } if *function == cut.function))
                .count();
            let why = match (calls, cut.trigger.matched()) {
                (0, _) => format!(
                    "nothing called `{}` in this run: harness `{harness}` never made the call it targets",
                    cut.function
                ),
                (calls, 0) => {
                    let conditions: Vec<String> = cut.conditions.iter().map(ToString::to_string).collect();
                    format!(
                        "none of the {calls} call(s) of `{}` met its match ({})",
                        cut.function,
                        conditions.join(", ")
                    )
                }
                (_, matched) => format!(
                    "{matched} matching call(s) of `{}` came, all of them let through (`skip = {}`) or after the heal",
                    cut.function, cut.trigger.skip
                ),
            };
            failures.push(format!(
                "cut #{} ({} on {}) never fired: {why}; {UNTESTED}",
                index + 1,
                cut.fault.name(),
                cut.function
            ));
        }
    }
    let arrivals = world.arrivals();
    for (index, cut) in world.process_cuts.borrow().cuts().iter().enumerate() {
        if cut.trigger.is_vacuous() {
            let reached = arrivals.get(&(cut.worker.clone(), cut.point.clone())).copied().unwrap_or(0);
            let why = match reached {
                0 => format!(
                    "`{}` never reached `{}`: harness `{harness}` never called its checkpoint there",
                    cut.worker, cut.point
                ),
                n => format!(
                    "`{}` reached `{}` {n} time(s), all of them let through (`skip = {}`)",
                    cut.worker, cut.point, cut.trigger.skip
                ),
            };
            failures.push(format!(
                "interrupt #{} ({} {} at {}) never fired: {why}; {UNTESTED}",
                index + 1,
                cut.interrupt.name(),
                cut.worker,
                cut.point
            ));
        }
    }
    if let Some(proxy) = &scenario.proxy {
        // A `reorder` rule fired only once a frame it held left behind its partner: held and
        // sent at its limit, it reordered nothing.
        let fired: BTreeSet<usize> = trace
            .events()
            .iter()
            .filter_map(|e| match &e.kind {
                EventKind::ProxyRule { rule, action, .. } if action != "reorder" && action != "reorder-expired" => {
                    Some(*rule)
                }
                _ => None,
            })
            .collect();
        for (index, rule) in proxy.rules.iter().enumerate() {
            if !fired.contains(&index) && !proxy.optional[index] {
                failures.push(format!(
                    "proxy rule #{} ({}) never fired: the run did not test it (mark it `optional = true` if that is expected)",
                    index + 1,
                    rule.label()
                ));
            }
        }
    }
    failures
}

/// The world a run starts from: the scenario's doubles and records, its cuts, its queues.
pub(crate) fn seeded_world(scenario: &Scenario, seed: u64) -> Rc<World> {
    let setup = &scenario.world;
    let mut store = StateStore::new();
    for (scope, key, value) in &setup.records {
        store.seed(scope, key, value.clone());
    }
    let mut session = SessionService::new();
    for (session_id, message) in &setup.messages {
        session.seed_message(session_id, message.clone());
    }
    let store = Rc::new(RefCell::new(store));
    let session = Rc::new(RefCell::new(session));
    let model =
        ScriptedModel::scripted(setup.model.iter().map(scripted_reply)).deterministic(setup.model_deterministic);
    let services = setup.services.build(Rc::clone(&store), Rc::clone(&session), model);
    let world = World::new(
        seed,
        store,
        session,
        services,
        CutTable::new(scenario.cuts.iter().cloned()),
        ProcessCutTable::new(scenario.interrupts.iter().cloned()),
    );
    for (name, config) in &setup.queues {
        world.queues.borrow_mut().define(name, config.clone());
    }
    if let Some(proxy) = &scenario.proxy {
        let rules = proxy::RuleSet::with_rules(seed, proxy.rules.iter().cloned()).expect("validated rules");
        *world.proxy_rules.borrow_mut() = Some(Rc::new(RefCell::new(rules)));
    }
    world
}

/// A scenario's scripted reply as the model double takes it: the conditions on the request it
/// answers become its check.
fn scripted_reply(reply: &crate::scenario::ModelReply) -> ScriptedReply {
    let conditions = reply.expect.clone();
    let expect: Option<doubles::RequestCheck> = (!conditions.is_empty()).then(|| {
        Rc::new(move |request: &Value| {
            conditions.iter().filter(|c| !c.matches(request)).map(|c| c.explain(request)).collect::<Vec<_>>()
        }) as doubles::RequestCheck
    });
    ScriptedReply { reply: reply.reply.clone(), expect, optional: reply.optional }
}

/// Starts every host of the topology on the simulated network.
fn add_hosts(
    runner: &mut Runner,
    topology: &Topology,
    scenario: &Scenario,
    harness: &Arc<dyn HarnessFactory>,
    policy: &str,
) {
    let world = Rc::clone(&runner.world);
    for host in topology.hosts() {
        if let Some(target) = &host.dials {
            runner.note_dial(&host.name, target);
        }
        let functions: Vec<String> = host.functions.iter().cloned().collect();
        let (world, name, target) = (Rc::clone(&world), host.name.clone(), host.dials.clone().unwrap_or_default());
        match host.role {
            Role::Engine => runner.host(&name, move || hosts::engine(Rc::clone(&world))),
            Role::Proxy => runner.host(&name, move || hosts::drop_proxy(Rc::clone(&world))),
            Role::Service => runner
                .host(&host.name, move || hosts::service_host(&world, SimulatedNetwork, &name, &target, &functions)),
            Role::Queue => {
                runner.host(&host.name, move || hosts::queue_host(&world, SimulatedNetwork, &name, &target, &functions))
            }
            Role::Harness => {
                // A fresh worker on every start: whatever it held in memory died with the crash.
                let skips_idle = harness.waits_on_rig_clock_only();
                let (harness, policy) = (Arc::clone(harness), policy.to_string());
                let env = harness_env(&world, &name, &scenario.world.harness);
                runner.host(&host.name, move || {
                    let bus = Bus::new(Rc::clone(&world.clock));
                    let provider = harness.start(&policy, HarnessEnv { bus: bus.clone(), ..env.clone() });
                    let (target, name, functions) = (target.clone(), name.clone(), functions.clone());
                    hosts::worker(Rc::clone(&world), SimulatedNetwork, target, name, functions, provider, bus)
                });
                runner.starts_slowly(&host.name);
                if !skips_idle {
                    continue;
                }
            }
            Role::Driver => continue,
        }
        // The rig's own software waits on the world's clock alone.
        runner.skip_idle_ticks(&host.name);
    }
    runner.add_driver();
}

fn harness_env(world: &Rc<World>, host: &str, config: &crate::harness::HarnessConfig) -> HarnessEnv {
    let (note_world, note_host) = (Rc::clone(world), host.to_string());
    HarnessEnv {
        host: host.to_string(),
        clock: Rc::clone(&world.clock),
        // Its own stream: ids the harness draws do not shift when the bus draws one more invocation id.
        rng: world.stream(&format!("{host}/harness")),
        config: config.clone(),
        note: Rc::new(move |what, detail| note_world.note_event(&note_host, what, detail)),
        process: Rc::clone(world) as Rc<dyn crate::harness::ProcessControl>,
        bus: Bus::new(Rc::clone(&world.clock)),
    }
}
