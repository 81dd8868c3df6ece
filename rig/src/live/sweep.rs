//! Sweeping and exploring a harness process live: every run of `rig sweep --live` and `rig
//! explore --live` is a live run against processes the rig starts (`--spawn`), each run on a
//! port of its own, so `--jobs N` runs N worlds side by side.

use super::{prepare_live, run_live, LiveListener, LiveOptions, Processes, SpawnOptions};
use crate::capability::{Capabilities, Skip};
use crate::explore::Runs;
use crate::harness::HarnessFactory;
use crate::run::{shell_word, Rerun, RunOutcome};
use crate::scenario::{PolicyRun, Scenario};
use crate::trace::Trace;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};

/// The name a live harness is reported by.
const LIVE_HARNESS: &str = "live";

/// How the runs of a live sweep or exploration are made.
#[derive(Debug, Clone)]
pub struct LiveSweepOptions {
    /// Starts the harness process (`--spawn`).
    pub spawn: SpawnOptions,
    /// Multiplies every timing of the scenarios (`--time-scale`).
    pub time_scale: Option<f64>,
    /// How long to wait for the harness to register, at the start and after a restart (ms).
    pub connect_timeout_ms: u64,
    /// How long nothing must happen before a healed world whose turns have ended is settled.
    pub quiet_ms: u64,
    /// The binary that reruns a run live: `rig`.
    pub program: String,
}

/// The runs of a sweep or an exploration, made live. Findings under a known-bad policy are
/// checked against `reference` in the simulation (a live process has one behaviour: the one
/// its command starts).
pub struct LiveRuns {
    options: LiveSweepOptions,
    reference: Arc<dyn HarnessFactory>,
    /// Ports no run is using: a run takes one, or binds a fresh one, and gives it back.
    idle: Mutex<Vec<LiveListener>>,
}

impl LiveRuns {
    pub fn new(options: LiveSweepOptions, reference: Arc<dyn HarnessFactory>) -> Self {
        Self { options, reference, idle: Mutex::new(Vec::new()) }
    }

    /// The command that runs a scenario file (`file`, a shell word) live again as these runs do
    /// (not a replay).
    pub fn command(&self, file: &str, policy: &str, seed: u64) -> String {
        let mut command = format!(
            "{} live {file} --spawn {} --policy {policy}",
            self.options.program,
            shell_word(&self.options.spawn.command)
        );
        if let Some(scale) = self.options.time_scale {
            command.push_str(&format!(" --time-scale {scale}"));
        }
        if seed != 0 {
            command.push_str(&format!(" --seed {seed}"));
        }
        command
    }

    /// The arguments that make a sweep or an exploration live, for its repro line.
    pub fn flags(&self) -> String {
        let mut flags = format!(" --live --spawn {}", shell_word(&self.options.spawn.command));
        if let Some(scale) = self.options.time_scale {
            flags.push_str(&format!(" --time-scale {scale}"));
        }
        flags
    }

    fn listener(&self) -> std::io::Result<LiveListener> {
        let idle = self.idle.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).pop();
        match idle {
            Some(listener) => Ok(listener),
            None => LiveListener::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, 0))),
        }
    }

    fn live(&self, scenario: &Scenario, run: &PolicyRun, seed: u64, scale: f64) -> Result<RunOutcome, String> {
        let prepared =
            prepare_live(scenario, Some(&run.policy), Some(scale), Processes::Owned).map_err(|r| r.join("; "))?;
        let listener = self.listener().map_err(|e| format!("cannot listen on a free loopback port: {e}"))?;
        let absolute = std::path::absolute(&scenario.path).unwrap_or_else(|_| scenario.path.clone());
        let options = LiveOptions {
            policy: run.policy.clone(),
            seed,
            time_scale: scale,
            connect_timeout_ms: self.options.connect_timeout_ms,
            quiet_ms: self.options.quiet_ms,
            command: self.command(&shell_word(&absolute.to_string_lossy()), &run.policy, seed),
            spawn: Some(self.options.spawn.clone()),
        };
        let outcome = run_live(&listener, &prepared, run, &options);
        self.idle.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).push(listener);
        outcome
    }
}

impl Runs for LiveRuns {
    fn name(&self) -> &str {
        LIVE_HARNESS
    }

    /// A live run, made again slower while it is void, as `rig live` does (see
    /// [`super::VOID_RETRIES`]). One still void after every retry is judged as it ran, saying
    /// so on standard error: a sweep has no verdict for "no verdict", and counting it clean
    /// would hide what it found (a finding is replayed when it is written, and said `NOT
    /// REPRODUCED` when the replay does not trip it). A run a signal stopped fires nothing.
    fn run(&self, scenario: &Scenario, run: &PolicyRun, seed: u64) -> RunOutcome {
        let mut scale = self.options.time_scale.unwrap_or(1.0);
        for attempt in 1.. {
            let started = std::time::Instant::now();
            let mut outcome =
                self.live(scenario, run, seed, scale).unwrap_or_else(|why| not_run(scenario, run, seed, why, started));
            let Some(why) = outcome.void.clone() else { return outcome };
            let path = scenario.path.display();
            if crate::interrupt::requested() {
                outcome.violations.clear();
                return outcome;
            }
            if attempt > super::VOID_RETRIES {
                eprintln!("rig: live: {path} [{}] void after every retry ({why}); judged as it ran", run.policy);
                outcome.void = None;
                outcome.passed = outcome.failures.is_empty();
                return outcome;
            }
            let asked = self.options.time_scale.unwrap_or(1.0);
            let (next, ready) = super::slower(scenario, &run.policy, (asked, scale), Processes::Owned);
            let Some(ready) = ready else { return outcome };
            let waited = super::wait_for_time_kept(super::late_ms_max(&ready.scenario));
            eprintln!(
                "rig: live: {path} [{}] void ({why}); making it again at time scale {next} (the machine kept time \
                 again after {waited} ms)",
                run.policy
            );
            scale = next;
        }
        unreachable!("the attempts end by returning")
    }

    fn skip(&self, workload: &Scenario, policy: &str) -> Option<Skip> {
        // A live worker's capabilities are not declared to a sweep: it is taken to serve the
        // contract, and what live mode cannot do is what it skips.
        let unmet = workload.requirements(policy, false).unmet(LIVE_HARNESS, &Capabilities::all());
        unmet.or_else(|| {
            prepare_live(workload, Some(policy), self.options.time_scale, Processes::Owned)
                .err()
                .map(|why| Skip::not_live(LIVE_HARNESS, why))
        })
    }

    fn cannot(&self, scenario: &Scenario) -> Option<Vec<String>> {
        prepare_live(scenario, None, self.options.time_scale, Processes::Owned).err()
    }

    fn reference(&self) -> &dyn Runs {
        &self.reference
    }
}

/// A run that could not be made at all: failed, saying why, with nothing in its trace.
fn not_run(scenario: &Scenario, run: &PolicyRun, seed: u64, why: String, started: std::time::Instant) -> RunOutcome {
    let trace = Trace::default();
    RunOutcome {
        scenario: scenario.path.display().to_string(),
        harness: "live".into(),
        policy: run.policy.clone(),
        seed,
        passed: false,
        trace_hash: trace.hash(),
        sim_ms: 0,
        wall_us: u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX),
        steps: 0,
        effects: Default::default(),
        violations: Vec::new(),
        expected_violations: Vec::new(),
        failures: vec![format!("the live run could not be made: {why}")],
        notes: Vec::new(),
        broke: Vec::new(),
        rpc: Default::default(),
        state: Vec::new(),
        actions: Vec::new(),
        interrupt_points: Default::default(),
        trace,
        live: None,
        void: None,
        recovery: None,
        rerun: Rerun::Unknown,
    }
}
