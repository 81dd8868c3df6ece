//! Running one scenario under one policy from one seed.

use crate::bus::{Bus, Provider};
use crate::cut::CutTable;
use crate::expect::{self, effect_counts, Observed};
use crate::harness::{Harness, HarnessEnv, Policy, ReferenceHarness};
use crate::oracle::{self, Evidence, Oracle, Violation};
use crate::queue::{self, QueueWorker};
use crate::scenario::{PolicyRun, Scenario, Step};
use crate::sim::hosts::{self, ServiceHost};
use crate::sim::world::World;
use crate::sim::{Runner, Stop, WaitEnd};
use crate::trace::{EventKind, Trace};
use doubles::{ScriptedModel, SessionService, StateStore};
use proxy::all_match;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::rc::Rc;

/// How long the world may take to come up before the script starts.
const READY_MS_MAX: u64 = 5_000;
/// Extra time a blocking invoke waits beyond the invocation's own deadline.
const INVOKE_GRACE_MS: u64 = 1_000;

/// Everything one run produced.
pub struct RunOutcome {
    pub scenario: String,
    pub policy: Policy,
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
    pub rpc: BTreeMap<String, Value>,
    pub state: Vec<(String, String, Value)>,
    /// Every recorded action at the end of the run: complete, resumable or held, with owners.
    pub actions: Vec<ActionStatus>,
    pub trace: Trace,
}

/// Where one action stands at the end of a run, as the person approving a switch needs it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ActionStatus {
    pub session_id: String,
    pub action_id: String,
    pub tool: String,
    /// `complete`, `resumable` (not yet done, safe to continue) or `held` (needs a person).
    pub class: String,
    pub owner: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

impl RunOutcome {
    /// The actions that are not complete.
    pub fn unresolved(&self) -> impl Iterator<Item = &ActionStatus> {
        self.actions.iter().filter(|a| a.class != "complete")
    }
}

/// Reads every action from the final turn records; the owner is the session's lease holder
/// when there is one, else the worker that recorded the action.
fn action_statuses(store: &doubles::StateStore) -> Vec<ActionStatus> {
    let mut statuses = Vec::new();
    for (scope, session_id, record) in store.records() {
        if scope != crate::oracle::TURN_SCOPE {
            continue;
        }
        let holder = store.lease(crate::harness::OWNER_SCOPE, session_id).map(|lease| lease.owner.clone());
        let report = crate::harness::classify(record, holder.as_deref().unwrap_or(""));
        for class in ["complete", "resumable", "held"] {
            for line in report[class].as_array().into_iter().flatten() {
                let recorded_by =
                    record["calls"][line["action_id"].as_str().unwrap_or("")]["owner"].as_str().unwrap_or("");
                statuses.push(ActionStatus {
                    session_id: session_id.to_string(),
                    action_id: line["action_id"].as_str().unwrap_or("").to_string(),
                    tool: line["tool"].as_str().unwrap_or("").to_string(),
                    class: class.to_string(),
                    owner: holder.clone().unwrap_or_else(|| recorded_by.to_string()),
                    reason: line["reason"].as_str().map(str::to_string),
                });
            }
        }
    }
    statuses
}

impl RunOutcome {
    /// The shell command that replays this run.
    pub fn repro(&self) -> String {
        format!(
            "cargo run --release -p rig -- run {} --policy {} --seed {}",
            self.scenario,
            self.policy.name(),
            self.seed
        )
    }
}

/// Runs `scenario` under `run.policy` from `seed`.
pub fn run(scenario: &Scenario, run: &PolicyRun, seed: u64) -> RunOutcome {
    // Wall time is measured for the report only; nothing in the run reads it.
    let started = std::time::Instant::now();
    let world = seeded_world(scenario, seed);
    let mut runner = Runner::new(Rc::clone(&world), scenario.world.network.clone());
    add_hosts(&mut runner, scenario, run.policy);
    let mut failures = Vec::new();
    let (healed_at_ms, quiescent) = match execute(&mut runner, scenario, &mut failures) {
        Ok(settled) => settled,
        Err(stop) => {
            failures.push(match stop {
                Stop::Limit(what) => format!("limit reached: {what} (seed {seed})"),
                Stop::HostFailed(why) => format!("a host's software failed: {why} (seed {seed})"),
            });
            (runner.now_ms(), false)
        }
    };
    let ended_at_ms = runner.now_ms();
    let steps = runner.steps();
    drop(runner);

    let trace = world.take_trace();
    let store = world.store.borrow();
    let violations = oracle::check(&Evidence {
        events: trace.events(),
        store: &store,
        healed_at_ms,
        ended_at_ms,
        quiescent,
        effects_per_action_max: scenario.world.effects_per_action_max,
    });
    judge_violations(&violations, &run.expected_violations, &mut failures);
    let effects = effect_counts(trace.events());
    let rpc = world.rpc.borrow().clone();
    failures.extend(expect::check(
        &run.expectations,
        &Observed { rpc: &rpc, store: &store, events: trace.events(), effects: &effects },
    ));
    let state = store.records().map(|(s, k, v)| (s.to_string(), k.to_string(), v.clone())).collect();
    let actions = action_statuses(&store);
    RunOutcome {
        scenario: scenario.path.display().to_string(),
        policy: run.policy,
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
        rpc,
        state,
        actions,
        trace,
    }
}

/// A known-bad policy must trip exactly the oracles it declares; any other trip is a failure.
fn judge_violations(violations: &[Violation], expected: &BTreeSet<Oracle>, failures: &mut Vec<String>) {
    let fired: BTreeSet<Oracle> = violations.iter().map(|v| v.oracle).collect();
    for violation in violations.iter().filter(|v| !expected.contains(&v.oracle)) {
        failures.push(format!("oracle `{}` fired: {}", violation.oracle.name(), violation.detail));
    }
    for oracle in expected.difference(&fired) {
        failures.push(format!("oracle `{}` was expected to fire under this policy, and did not", oracle.name()));
    }
}

fn seeded_world(scenario: &Scenario, seed: u64) -> Rc<World> {
    let setup = &scenario.world;
    let mut store = StateStore::new();
    for (scope, key, value) in &setup.records {
        store.seed(scope, key, value.clone());
    }
    let mut session = SessionService::new();
    for (session_id, message) in &setup.messages {
        session.seed_message(session_id, message.clone());
    }
    let model = ScriptedModel::new(setup.model.iter().cloned());
    let tickets = setup.tickets.clone().map(doubles::TicketService::new);
    World::new(
        seed,
        CutTable::new(scenario.cuts.iter().cloned()),
        (store, session, model, tickets),
        scenario.interrupts.clone(),
    )
}

fn add_hosts(runner: &mut Runner, scenario: &Scenario, policy: Policy) {
    let world = Rc::clone(&runner.world);
    // A worker placed behind the proxy dials the proxy where the others dial the engine.
    let engine_for = |host: &str| match &scenario.proxy {
        Some(proxy) if proxy.worker == host => hosts::PROXY_HOST,
        _ => hosts::ENGINE_HOST,
    };
    {
        let world = Rc::clone(&world);
        runner.host(hosts::ENGINE_HOST, move || hosts::engine(Rc::clone(&world)));
    }
    if let Some(proxy) = &scenario.proxy {
        let rules = proxy::RuleSet::with_rules(world.seed, proxy.rules.iter().cloned()).expect("validated rules");
        *world.proxy_rules.borrow_mut() = Some(Rc::new(std::cell::RefCell::new(rules)));
        let world = Rc::clone(&world);
        runner.host(hosts::PROXY_HOST, move || hosts::drop_proxy(Rc::clone(&world)));
    }
    for (host, double) in world.services() {
        let functions: Vec<String> = double.borrow().functions().iter().map(|f| f.to_string()).collect();
        let (world, engine) = (Rc::clone(&world), engine_for(host));
        runner.host(host, move || {
            let provider: Rc<dyn Provider> = ServiceHost::new(Rc::clone(&world), host, Rc::clone(&double));
            let bus = Bus::new(Rc::clone(&world.clock));
            hosts::worker(Rc::clone(&world), engine, host.to_string(), functions.clone(), provider, bus)
        });
    }
    if !scenario.world.queues.is_empty() {
        for (name, config) in &scenario.world.queues {
            world.queues.borrow_mut().define(name, config.clone());
        }
        let (world, engine) = (Rc::clone(&world), engine_for(queue::HOST));
        runner.host(queue::HOST, move || {
            let bus = Bus::new(Rc::clone(&world.clock));
            let worker = QueueWorker::start(Rc::clone(&world), bus.clone());
            let functions = queue::FUNCTIONS.iter().map(|f| f.to_string()).collect();
            hosts::worker(Rc::clone(&world), engine, queue::HOST.into(), functions, worker, bus)
        });
    }
    for worker in harness_workers(scenario) {
        let (world, config, engine) = (Rc::clone(&world), scenario.world.harness.clone(), engine_for(worker));
        runner.host(worker, move || {
            // A fresh harness on every start: whatever it held in memory died with the crash.
            let harness = ReferenceHarness::new(policy, harness_env(&world, worker, &config));
            let functions = harness.functions();
            hosts::worker(
                Rc::clone(&world),
                engine,
                worker.into(),
                functions,
                harness,
                Bus::new(Rc::clone(&world.clock)),
            )
        });
    }
    runner.add_driver();
}

/// The harness workers of a scenario's world.
fn harness_workers(scenario: &Scenario) -> Vec<&'static str> {
    crate::scenario::HARNESS_WORKERS.into_iter().filter(|w| *w == "harness" || scenario.world.replacement).collect()
}

fn harness_env(world: &Rc<World>, worker: &'static str, config: &crate::harness::HarnessConfig) -> HarnessEnv {
    let note_world = Rc::clone(world);
    HarnessEnv {
        host: worker.into(),
        clock: Rc::clone(&world.clock),
        rng: world.stream(worker),
        config: config.clone(),
        note: Rc::new(move |what, detail| note_world.note_event(worker, what, detail)),
        process: Rc::clone(world) as Rc<dyn crate::harness::ProcessControl>,
    }
}

/// The functions each worker host registers.
fn functions_by_host(world: &World, scenario: &Scenario) -> BTreeMap<String, BTreeSet<String>> {
    let mut hosts: BTreeMap<String, BTreeSet<String>> = world
        .services()
        .iter()
        .map(|(host, double)| (host.to_string(), double.borrow().functions().iter().map(|f| f.to_string()).collect()))
        .collect();
    for worker in harness_workers(scenario) {
        hosts.insert(worker.into(), ["turn", "export", "import"].map(|name| format!("{worker}::{name}")).into());
    }
    if !scenario.world.queues.is_empty() {
        hosts.insert(queue::HOST.into(), queue::FUNCTIONS.iter().map(|f| f.to_string()).collect());
    }
    hosts
}

/// Whether every function in `expected` was registered at the engine since trace position `since`.
fn registered_since(runner: &Runner, since: usize, expected: &BTreeSet<String>) -> bool {
    let trace = runner.world.trace();
    let registered: BTreeSet<&str> = trace.events()[since.min(trace.events().len())..]
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::Frame { frame: "registerfunction", direction: "in", function_id, .. } => function_id.as_deref(),
            _ => None,
        })
        .collect();
    expected.iter().all(|f| registered.contains(f.as_str()))
}

/// Runs the script, heals every fault, and lets the world settle. Returns when it healed and
/// whether it settled into quiescence (rather than running into the liveness bound).
fn execute(runner: &mut Runner, scenario: &Scenario, failures: &mut Vec<String>) -> Result<(u64, bool), Stop> {
    let by_host = functions_by_host(&runner.world, scenario);
    let everything: BTreeSet<String> = by_host.values().flatten().cloned().collect();
    if runner.run_until(Some(READY_MS_MAX), |r| r.driver_connected() && registered_since(r, 0, &everything))?
        != WaitEnd::Met
    {
        failures.push(format!("the world did not come up within {READY_MS_MAX} ms"));
        return Ok((runner.now_ms(), false));
    }
    for (index, step) in scenario.steps.iter().enumerate() {
        if let Some(failure) = execute_step(runner, step, &by_host)? {
            failures.push(format!("step {}: {failure}", index + 1));
            break;
        }
    }
    runner.heal();
    let healed_at_ms = runner.now_ms();
    let settled = runner.run_until(Some(healed_at_ms.saturating_add(scenario.world.liveness_ms)), |_| false)?;
    Ok((healed_at_ms, settled == WaitEnd::Stalled))
}

fn wait_for_rpc(runner: &mut Runner, name: &str, within_ms: u64) -> Result<Option<String>, Stop> {
    let deadline = runner.now_ms().saturating_add(within_ms);
    let end = runner.run_until(Some(deadline), |r| r.world.rpc.borrow().contains_key(name))?;
    Ok((end != WaitEnd::Met).then(|| format!("no outcome for `{name}` within {within_ms} ms ({end:?})")))
}

/// Runs one step; `Some(reason)` when the step itself could not complete.
fn execute_step(
    runner: &mut Runner,
    step: &Step,
    by_host: &BTreeMap<String, BTreeSet<String>>,
) -> Result<Option<String>, Stop> {
    match step {
        Step::Invoke { call, detach } => {
            runner.invoke(call.clone());
            if !detach {
                return wait_for_rpc(runner, &call.name, call.timeout_ms.saturating_add(INVOKE_GRACE_MS));
            }
        }
        Step::Await { name, within_ms } => return wait_for_rpc(runner, name, *within_ms),
        Step::WaitMs(ms) => {
            let deadline = runner.now_ms().saturating_add(*ms);
            if runner.run_until(Some(deadline), |_| false)? == WaitEnd::Stalled {
                runner.skip_to(deadline)?;
            }
        }
        Step::WaitUntil { conditions, nth, within_ms } => {
            let deadline = runner.now_ms().saturating_add(*within_ms);
            let (mut cursor, mut seen) = (0, 0);
            let end = runner.run_until(Some(deadline), |r| {
                let trace = r.world.trace();
                let events = trace.events();
                seen += events[cursor..].iter().filter(|e| all_match(conditions, &e.to_json())).count() as u64;
                cursor = events.len();
                seen >= *nth
            })?;
            if end != WaitEnd::Met {
                let wanted: Vec<String> = conditions.iter().map(ToString::to_string).collect();
                return Ok(Some(format!(
                    "no event #{nth} matching [{}] within {within_ms} ms ({end:?})",
                    wanted.join(", ")
                )));
            }
        }
        Step::Put { scope, key, value } => {
            let world = &runner.world;
            let version = world.store.borrow_mut().seed(scope, key, value.clone());
            world.record(
                "driver",
                EventKind::Commit { scope: scope.clone(), key: key.clone(), value: value.clone(), version },
            );
        }
        Step::Crash(host) => runner.crash(host),
        Step::Restart(host) => {
            // Back means registered again: a restarted engine waits for every worker, a worker
            // for its own functions.
            let since = runner.world.trace().events().len();
            runner.restart(host);
            let expected = match by_host.get(host) {
                Some(functions) => functions.clone(),
                None if host == crate::sim::hosts::ENGINE_HOST => by_host.values().flatten().cloned().collect(),
                None => BTreeSet::new(),
            };
            let deadline = runner.now_ms().saturating_add(READY_MS_MAX);
            if runner.run_until(Some(deadline), |r| registered_since(r, since, &expected))? != WaitEnd::Met {
                return Ok(Some(format!("`{host}` did not come back within {READY_MS_MAX} ms of its restart")));
            }
        }
        Step::Partition(a, b) => runner.partition(a, b),
        Step::Repair(a, b) => runner.repair(a, b),
        Step::Hold(a, b) => runner.hold(a, b),
        Step::Release(a, b) => runner.release(a, b),
        Step::Heal => runner.heal(),
        Step::Pause { host, ms } => {
            use crate::harness::ProcessControl;
            let until = runner.now_ms().saturating_add(*ms);
            runner.world.pause(host, until);
        }
    }
    Ok(None)
}
