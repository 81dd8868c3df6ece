//! Live runs: the same scenario files against real harness processes, in any language.
//!
//! The scenario's engine, doubles, queue and driver run in real time on one thread, the engine
//! listening on a real socket and speaking the iii wire protocol, so a worker built on an iii SDK
//! connects unchanged. The rig waits (bounded) until external workers have registered the
//! functions the scenario invokes, runs the script through the same code as the simulation
//! ([`crate::script`]), applies the same cuts (service cuts at the doubles, frame rules in the
//! proxy's relay, `crash` as a dropped connection the worker must survive by reconnecting), and
//! judges with the same oracles and expectations ([`crate::run::judge`]).
//!
//! What differs, and is said in the output: time is real, so a run takes as long as its
//! timings (scaled only by an explicit `--time-scale`); nothing is seeded outside the rig, so a
//! live trace is recorded the same way but never replays bit for bit; a run settles when every
//! turn has ended and nothing has happened for a quiet period, since an external process's own
//! timers cannot be seen.

mod harness;
mod net;
mod plan;
mod rigfns;
mod runner;
mod spawn;
mod sweep;

pub use harness::{serve_harness, HarnessProcess};
pub use plan::{check_time_scale, late_ms_max, prepare_live, LiveScenario, Processes};
pub use rigfns::{config_json, RIG_CONFIG, RIG_NOTE};
pub use spawn::{SpawnOptions, HOST_VARIABLE, URL_VARIABLE};
pub use sweep::{LiveRuns, LiveSweepOptions};

use crate::bus::Bus;
use crate::layout::RecordLayout;
use crate::run::{judge, seeded_world, Ended, Judged, RunOutcome};
use crate::scenario::{PolicyRun, Scenario, Step};
use crate::script::{registered_functions, run_script, Registrations, Settled, WorldDriver};
use crate::sim::hosts::worker;
use crate::sim::world::World;
use crate::topology::{self, Role, Topology, ENGINE, HARNESS};
use crate::trace::EventKind;
use net::{InMemory, Net};
use rigfns::{RigFunctions, RunInfo, RIG};
use runner::{Bounds, LiveRunner, Software};
use spawn::Supervisor;
use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::rc::Rc;
use std::time::Instant;

/// Runs started by this process, for run ids.
static RUNS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// The engine's socket for external workers, bound once and served run after run.
pub struct LiveListener {
    listener: std::net::TcpListener,
    address: SocketAddr,
}

impl LiveListener {
    pub fn bind(address: SocketAddr) -> std::io::Result<Self> {
        let listener = std::net::TcpListener::bind(address)?;
        listener.set_nonblocking(true)?;
        let address = listener.local_addr()?;
        Ok(Self { listener, address })
    }

    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// Where a worker of `host` connects.
    pub fn url(&self, host: &str) -> String {
        if host == HARNESS {
            format!("ws://{}/", self.address)
        } else {
            format!("ws://{}/{host}", self.address)
        }
    }
}

/// How to run live.
#[derive(Debug, Clone)]
pub struct LiveOptions {
    /// The `[policy.NAME]` section the external harness is judged by.
    pub policy: String,
    /// The seed of the rig's own draws (ids, handshake keys, proxy rule chances).
    pub seed: u64,
    /// The scale already applied to the scenario's timings, for `rig::config` and the report.
    pub time_scale: f64,
    /// How long to wait for external workers to register (at the start, after a restart), in
    /// real milliseconds.
    pub connect_timeout_ms: u64,
    /// How long nothing must happen before a healed world whose turns have ended is settled.
    pub quiet_ms: u64,
    /// The command line that runs the same again, for the report.
    pub command: String,
    /// Start the harness processes, one per external host, instead of waiting for them.
    pub spawn: Option<SpawnOptions>,
}

/// Runs one policy run of a prepared scenario live, against whatever workers connect to
/// `listener`. `Err` when the run could not be set up at all (no runtime, no socket).
pub fn run_live(
    listener: &LiveListener,
    prepared: &LiveScenario,
    run: &PolicyRun,
    options: &LiveOptions,
) -> Result<RunOutcome, String> {
    let scenario = &prepared.scenario;
    let _span =
        tracing::info_span!(target: "rig::trace", "live", scenario = %scenario.path.display(), policy = %run.policy)
            .entered();
    let started = Instant::now();
    let proxy_worker = scenario.proxy.as_ref().map(|p| p.worker.clone());
    let topology = Topology::new(&scenario.world.plan(external_functions(scenario), proxy_worker.clone()));
    let external: BTreeSet<String> =
        topology.hosts().iter().filter(|h| h.role == Role::Harness).map(|h| h.name.clone()).collect();
    let mut hosts: BTreeSet<String> = topology
        .hosts()
        .iter()
        .filter(|h| !matches!(h.role, Role::Engine | Role::Proxy))
        .map(|h| h.name.clone())
        .collect();
    hosts.insert(RIG.to_string());
    let world = seeded_world(scenario, options.seed);
    let socket = listener.listener.try_clone().map_err(|e| format!("cannot share the listening socket: {e}"))?;
    let net = Net::new(Rc::clone(&world), socket, hosts, external.clone(), rig_owned(&topology), proxy_worker);
    let reference_particulars = Rc::new(Cell::new(false));
    let declared_quiet: Rc<RefCell<BTreeMap<String, u64>>> = Rc::default();
    let run_number = RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let info = RunInfo {
        run_id: format!("{}:{run_number}", std::process::id()),
        scenario: scenario.path.display().to_string(),
        policy: run.policy.clone(),
        time_scale: options.time_scale,
        config: scenario.world.harness.clone(),
        hosts: external.clone(),
    };
    let functions = RigFunctions {
        world: Rc::clone(&world),
        net: Rc::clone(&net),
        run: info,
        reference_particulars: Rc::clone(&reference_particulars),
        declared_quiet: Rc::clone(&declared_quiet),
    };
    // The run's id is the key of the processes it starts: no other run, of this rig or another,
    // has it.
    let key = format!("{}-{run_number}", std::process::id());
    if options.spawn.is_some() {
        net.require_key(&key);
    }
    let rig = rig_host(&world, &net, functions);
    let layout = RecordLayout::default();
    let bounds = Bounds {
        ready_ms_max: options.connect_timeout_ms,
        quiet_ms: options.quiet_ms,
        duration_ms_max: scenario.world.network.duration_ms_max,
        late_ms_max: late_ms_max(scenario),
    };
    let mut runner =
        LiveRunner::start(Rc::clone(&world), net, &topology, vec![(RIG.to_string(), rig)], layout.clone(), bounds)
            .map_err(|e| format!("cannot start the live runtime: {e}"))?;
    runner.watch_quiet(declared_quiet);
    if let Some(spawn) = &options.spawn {
        let url = |host: &str| format!("{}?{}={key}", listener.url(host), net::RUN_KEY_PARAMETER);
        let urls = external.iter().map(|host| (host.clone(), url(host))).collect();
        let label = format!("{}.{}.run{run_number}", scenario.name(), run.policy);
        runner.own_processes(Supervisor::new(spawn.clone(), label, urls))?;
    }
    let mut failures = Vec::new();
    let missing = wait_for_workers(&mut runner, &topology, listener, options.connect_timeout_ms);
    let settled = match &missing {
        Some(_) => Settled { healed_at_ms: runner.now_ms(), quiescent: false, steps_completed: false, steps_begun: 0 },
        None => run_script(&mut runner, &topology, scenario, options.seed, false, &mut failures),
    };
    if runner.process_failed() {
        failures.extend(runner.process_failures());
    } else {
        failures.extend(gone_workers(&world, &external));
    }
    let ended =
        Ended { at_ms: runner.now_ms(), steps: 0, settled, started, recovery: None, uncut: None, outcome: None };
    let (own, late_ms_max) = runner.lateness();
    let work = runner.work_late();
    let (restarts, never_back) = runner.restarts();
    let profile = runner.tick_profile();
    world.note_event(
        RIG,
        "clock_profile",
        serde_json::json!({
            "ticks": profile.ticks, "p50_ms": profile.p50_ms, "p90_ms": profile.p90_ms, "p99_ms": profile.p99_ms,
            "max_ms": own.ms, "bound_ms": late_ms_max,
            "work_late_ms": work.ms, "work_trips": work.trips, "work_within_ms": work.within_ms
        }),
    );
    drop(runner);
    // How late the harness processes said their own clocks woke, if they say it (`rig harness`
    // does): a starved process acts late however punctual the rig was.
    let reported = {
        // The first lateness a process reports after the rig continued it (SIGCONT, the end of a
        // scripted pause) is the pause's, not the machine's.
        let mut continued: BTreeSet<String> = BTreeSet::new();
        let mut worst: Option<(String, u64)> = None;
        for event in world.trace().events() {
            let EventKind::Note { what, detail } = &event.kind else { continue };
            if what == "process_continued" && event.host == RIG {
                continued.insert(detail["host"].as_str().unwrap_or_default().to_string());
            } else if what == harness::LATE_NOTE
                && external.contains(event.host.as_str())
                && !continued.remove(event.host.as_str())
            {
                let ms = detail["ms"].as_u64().unwrap_or(0);
                if worst.as_ref().is_none_or(|(_, worst)| ms > *worst) {
                    worst = Some((event.host.to_string(), ms));
                }
            }
        }
        worst
    };
    let late = reported.filter(|(_, ms)| *ms > own.ms);
    let name = worker_name(&world, HARNESS).map_or_else(|| "live".to_string(), |name| format!("live:{name}"));
    let judged = Judged { name: &name, layout, reference_particulars: reference_particulars.get() };
    let mut outcome = judge(&world, scenario, run, options.seed, &judged, ended, failures);
    if let Some(missing) = missing {
        // Nothing ran: what the oracles and expectations would say of an untouched world is noise.
        (outcome.violations, outcome.failures, outcome.passed) = (Vec::new(), vec![missing], false);
    }
    outcome.live = Some(options.command.clone());
    outcome.notes.extend(restart_notes(&restarts, &never_back));
    outcome.void = match crate::interrupt::received() {
        Some(signal) => Some(format!("interrupted by {}: the run was stopped before its end", signal.name())),
        None => match late {
            Some((host, ms)) if ms > late_ms_max => Some(format!(
                "the machine did not keep real time: the harness process of `{host}` said its clock woke {ms} ms late, \
                 over the bound of {late_ms_max} ms at time scale {}",
                options.time_scale
            )),
            None if own.ms > late_ms_max => Some(format!(
                "the machine did not keep real time: a timer of the live clock due at {} ms fired {} ms late, over \
                 the bound of {late_ms_max} ms at time scale {}",
                own.due_ms, own.ms, options.time_scale
            )),
            _ if work.ms > late_ms_max => Some(format!(
                "the machine did not keep real time: the harness's work ran {} ms late in all over its {} trips to \
                 and from the engine within {} ms (ending {} ms into the run), over the bound of {late_ms_max} ms at time scale {}",
                work.ms, work.trips, work.within_ms, work.at_ms, options.time_scale
            )),
            _ => None,
        },
    };
    if outcome.void.is_none() {
        outcome.notes.extend(slow_restart(scenario, run, options, &outcome, &restarts));
    }
    if outcome.void.is_some() {
        // No verdict: what the oracles saw stays in the outcome (a live sweep may still want it,
        // see `LiveRuns`), but every report of a void run shows only why it is void.
        outcome.passed = false;
    }
    Ok(outcome)
}

/// What the report says of the run's restarts of external hosts: how long each took to serve
/// again, and which never did.
fn restart_notes(restarts: &[runner::Restart], never_back: &[(String, u64)]) -> Vec<String> {
    let mut notes: Vec<String> = restarts
        .iter()
        .map(|r| {
            format!("live: `{}`, restarted at {} ms, served again {} ms later (real time)", r.host, r.at_ms, r.took_ms)
        })
        .collect();
    notes.extend(never_back.iter().map(|(host, at_ms)| {
        format!("live: `{host}`, restarted at {at_ms} ms, had not registered its functions again when the run ended")
    }));
    notes
}

/// A simulated run restarts a harness worker at once (`harness_restart_ms = 0`); a real
/// process takes the time it takes, in which a queue may redeliver into nothing and give up.
/// When the live verdict differs from the reference harness's simulated one under the same
/// policy (what a correct harness gives) and a harness host was restarted, this says which
/// restart took longest and what the simulation gives with that restart time: the setting
/// that reproduces the live run there.
fn slow_restart(
    scenario: &Scenario,
    run: &PolicyRun,
    options: &LiveOptions,
    live: &RunOutcome,
    restarts: &[runner::Restart],
) -> Option<String> {
    let slowest = restarts.iter().max_by_key(|r| r.took_ms)?;
    let simulated = crate::run::run(scenario, run, options.seed);
    if verdict(&simulated) == verdict(live) {
        return None;
    }
    // The file's own milliseconds: the run's timings were multiplied by the time scale.
    let in_file = (slowest.took_ms as f64 / options.time_scale).round() as u64;
    let mut slow = scenario.clone();
    slow.world.network.harness_restart_ms = slowest.took_ms;
    let reproduced = crate::run::run(&slow, run, options.seed);
    let same = if verdict(&reproduced) == verdict(live) { "as live" } else { "still not as live" };
    Some(format!(
        "live: the verdict differs from the simulated one ({}), in which a restarted worker serves again at \
         once; `{}` took {} ms to serve again after its restart at {} ms: simulated with `[world] \
         harness_restart_ms = {in_file}` the run gives {}, {same}",
        verdict_text(&simulated),
        slowest.host,
        slowest.took_ms,
        slowest.at_ms,
        verdict_text(&reproduced)
    ))
}

/// A run's verdict: passed or not, and the oracles that fired.
fn verdict(outcome: &RunOutcome) -> (bool, BTreeSet<&'static str>) {
    (outcome.passed, outcome.violations.iter().map(|v| v.oracle.name()).collect())
}

fn verdict_text(outcome: &RunOutcome) -> String {
    let (passed, oracles) = verdict(outcome);
    match (passed, oracles.is_empty()) {
        (true, _) => "PASS".to_string(),
        (false, true) => "FAIL".to_string(),
        (false, false) => format!("FAIL: {}", oracles.into_iter().collect::<Vec<_>>().join(", ")),
    }
}

/// How many times a void live run is made again, each time [`RETRY_SLOWER`] times slower, at
/// most [`SLOWER_MAX`] times slower than asked (or at the same scale when its timings cannot be
/// slowed further), each retry once the machine keeps time again ([`wait_for_time_kept`]).
/// Five: on a machine loaded to 17 on two cores, one live run in three was void at its first
/// attempt and one in twenty was still void after two retries, mostly at a scale it could not
/// be slowed past (a stall of the whole machine, 150 to 550 ms); at load 13 to 14, a file the
/// tests run at half speed (its first attempts at scales 0.5 and 1, only the last two at 2, as
/// far as its liveness bound lets it be slowed) was still void after three retries in one run
/// in two of a check: the retries came in the very stall that voided the run.
pub const VOID_RETRIES: u32 = 5;
/// What each retry of a void live run multiplies its time scale by.
pub const RETRY_SLOWER: f64 = 2.0;
/// How much slower than asked a retry may be made.
pub const SLOWER_MAX: f64 = 8.0;
/// How long the machine must keep time before a void run is made again, and how long a retry
/// waits for that at most (then it is made anyway).
const TIME_KEPT_FOR_MS: u64 = 1_000;
const TIME_KEPT_WAIT_MS_MAX: u64 = 20_000;

/// Waits until this process's millisecond timer has woken within half of `late_ms_max` of its
/// time for [`TIME_KEPT_FOR_MS`] in a row, at most [`TIME_KEPT_WAIT_MS_MAX`] (or until a signal
/// asks the rig to stop): a void run made again at once, in the stall of the machine that
/// voided it, is void again. How long it waited, in milliseconds.
pub fn wait_for_time_kept(late_ms_max: u64) -> u64 {
    let tick = std::time::Duration::from_millis(1);
    let tolerance = std::time::Duration::from_millis((late_ms_max / 2).max(1));
    let (started, mut kept_since) = (Instant::now(), Instant::now());
    while started.elapsed().as_millis() < u128::from(TIME_KEPT_WAIT_MS_MAX) && !crate::interrupt::requested() {
        let asleep = Instant::now();
        std::thread::sleep(tick);
        if asleep.elapsed().saturating_sub(tick) > tolerance {
            kept_since = Instant::now();
        } else if kept_since.elapsed().as_millis() >= u128::from(TIME_KEPT_FOR_MS) {
            break;
        }
    }
    u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// The time scale to make a void run again at, and the scenario at that scale: [`RETRY_SLOWER`]
/// times slower, or as it was when it is already [`SLOWER_MAX`] times slower than `asked` or its
/// timings cannot be slowed (one would be longer than live mode waits out, or the scenario
/// tests the time of an event).
pub fn slower(
    scenario: &Scenario,
    policy: &str,
    (asked, time_scale): (f64, f64),
    processes: Processes,
) -> (f64, Option<LiveScenario>) {
    let slower = time_scale * RETRY_SLOWER;
    if slower > asked * SLOWER_MAX {
        return (time_scale, prepare_live(scenario, Some(policy), Some(time_scale), processes).ok());
    }
    match prepare_live(scenario, Some(policy), Some(slower), processes) {
        Ok(ready) => (slower, Some(ready)),
        Err(_) => (time_scale, prepare_live(scenario, Some(policy), Some(time_scale), processes).ok()),
    }
}

/// The harness functions a scenario calls (by name after `{host}::`): what external workers
/// must register before the script starts.
fn external_functions(scenario: &Scenario) -> Vec<String> {
    let mut hosts = vec![HARNESS];
    if scenario.world.replacement {
        hosts.push(topology::REPLACEMENT);
    }
    let invoked = scenario.steps.iter().filter_map(|step| match step {
        Step::Invoke { call, .. } => Some(call.function.as_str()),
        _ => None,
    });
    let dead_letters = scenario.world.queues.iter().filter_map(|(_, q)| q.dead_letter_function.as_deref());
    let names: BTreeSet<String> = invoked
        .chain(dead_letters)
        .filter_map(|function| function.split_once("::"))
        .filter(|(host, _)| hosts.contains(host))
        .map(|(_, name)| name.to_string())
        .collect();
    names.into_iter().collect()
}

/// Every function the rig's own hosts serve (the engine's, the doubles', the queue's, `rig::*`),
/// with the host serving it: what no external worker may register.
fn rig_owned(topology: &Topology) -> BTreeMap<String, String> {
    let own = topology.hosts().iter().filter(|h| h.role != Role::Harness);
    let mut owners: BTreeMap<String, String> =
        own.flat_map(|h| h.functions.iter().map(|f| (f.clone(), h.name.clone()))).collect();
    owners.extend([RIG_CONFIG, RIG_NOTE].map(|f| (f.to_string(), RIG.to_string())));
    owners
}

/// The host serving the rig's own functions for external harnesses.
fn rig_host(world: &Rc<World>, net: &Rc<Net>, functions: RigFunctions) -> Software {
    let (world, dial, provider) = (Rc::clone(world), InMemory(Rc::clone(net)), Rc::new(functions));
    let names = vec![RIG_CONFIG.to_string(), RIG_NOTE.to_string()];
    Rc::new(move || {
        let bus = Bus::new(Rc::clone(&world.clock));
        let running =
            worker(Rc::clone(&world), dial.clone(), ENGINE.into(), RIG.into(), names.clone(), provider.clone(), bus);
        Box::pin(async move { drop(running.await) })
    })
}

/// Waits until the driver is connected and every function of the world is registered, the
/// external workers' included; says what is missing and how to provide it if that takes longer
/// than `within_ms`.
fn wait_for_workers(
    runner: &mut LiveRunner,
    topology: &Topology,
    listener: &LiveListener,
    within_ms: u64,
) -> Option<String> {
    let mut everything = topology.registered_after_restart(ENGINE, &BTreeSet::new());
    everything.extend([RIG_CONFIG.to_string(), RIG_NOTE.to_string()]);
    let within = std::time::Duration::from_millis(within_ms);
    let mut registrations = Registrations::since(0, &everything);
    let mut up = |r: &LiveRunner| r.driver_connected() && registrations.all_in(r.world());
    // A process of the rig's that ended before registering will not register later.
    if runner.wait_until_up(within, |r| up(r) || r.process_failed()) && !runner.process_failed() {
        return None;
    }
    if runner.process_failed() {
        return Some(runner.process_failures().join("; "));
    }
    let registered = registered_functions(runner.world(), 0);
    let mut lines = Vec::new();
    for host in topology.hosts().iter().filter(|h| h.role == Role::Harness) {
        let missing: Vec<&str> =
            host.functions.iter().filter(|f| !registered.contains(*f)).map(String::as_str).collect();
        if missing.is_empty() {
            continue;
        }
        let seen = match worker_name(runner.world(), &host.name) {
            Some(name) => {
                format!("a worker connected as `{}` (it calls itself `{name}`) but did not register them", host.name)
            }
            None if connected(runner.world(), &host.name) => {
                format!("a worker connected as `{}` but did not register them", host.name)
            }
            None => format!("no worker connected as `{}`", host.name),
        };
        let line = match runner.process_output(&host.name) {
            Some(log) => format!(
                "no worker registered {} within {within_ms} ms ({seen}), though the rig started its process with \
                 {} set to {}; its output ({}) ends:\n{}",
                missing.join(", "),
                spawn::URL_VARIABLE,
                listener.url(&host.name),
                log.display(),
                spawn::tail(&log, 12)
            ),
            None => format!(
                "no worker registered {} within {within_ms} ms ({seen}): start your harness process with its engine URL \
                 set to {} and have it register {}",
                missing.join(", "),
                listener.url(&host.name),
                missing.join(", ")
            ),
        };
        lines.push(line);
    }
    if lines.is_empty() {
        let missing: Vec<&str> = everything.iter().filter(|f| !registered.contains(*f)).map(String::as_str).collect();
        lines.push(format!(
            "the rig's own hosts did not come up within {within_ms} ms (missing {})",
            missing.join(", ")
        ));
    }
    Some(lines.join("; "))
}

/// The engine's notes about an external worker: `worker_connected`, `worker_named`, ...
fn worker_notes<'a>(world: &'a World, what: &'a str, host: &'a str) -> Vec<serde_json::Value> {
    world
        .trace()
        .events()
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::Note { what: w, detail } if w == what && detail["peer"] == host && e.host == ENGINE => {
                Some(detail.clone())
            }
            _ => None,
        })
        .collect()
}

fn connected(world: &World, host: &str) -> bool {
    !worker_notes(world, "worker_connected", host).is_empty()
}

/// What the external worker of `host` last called itself.
fn worker_name(world: &World, host: &str) -> Option<String> {
    let named = worker_notes(world, "worker_named", host);
    named.last().and_then(|detail| detail["name"].as_str().map(str::to_string))
}

/// External workers that closed their connection themselves and were not connected at the end:
/// a process that died or gave up, which says more than whatever failed after it.
fn gone_workers(world: &World, external: &BTreeSet<String>) -> Vec<String> {
    let mut gone = Vec::new();
    for host in external {
        let mut open = 0i64;
        let mut last_close: Option<(u64, String)> = None;
        for event in world.trace().events() {
            let EventKind::Note { what, detail } = &event.kind else { continue };
            if event.host != ENGINE || detail["peer"] != host.as_str() {
                continue;
            }
            match what.as_str() {
                "worker_connected" => open += 1,
                "worker_disconnected" => {
                    open -= 1;
                    last_close = Some((event.at_ms, detail["why"].as_str().unwrap_or("?").to_string()));
                }
                _ => {}
            }
        }
        if let (true, Some((at_ms, why))) = (open <= 0, last_close) {
            if why == "closed by the worker" {
                gone.push(format!(
                    "the external worker `{host}` disconnected at {at_ms} ms ({why}) and was not connected again when the run ended"
                ));
            }
        }
    }
    gone
}
