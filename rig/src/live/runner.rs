//! The live runner: one run's world on real sockets, in real time.
//!
//! Everything of the run lives on one thread, in one tokio current-thread runtime, as the
//! simulation's hosts do (the world is shared `Rc` state). Each of the rig's own hosts runs in a
//! task set of its own, so crashing it drops everything it had started, as a crash does in the
//! simulation. The runner drives the world only while the script waits, and advances the
//! world's clock from the wall clock as it goes: live, a millisecond is a real one. The clock
//! starts when the world is up (every worker registered), so the scenario's times count from
//! there, as in the simulation, however long an external process took to connect.

use super::net::{engine_host, InMemory, Net};
use super::rigfns::RIG;
use super::spawn::{tail, Supervisor};
use crate::bus::Bus;
use crate::layout::RecordLayout;
use crate::script::WorldDriver;
use crate::sim::driver::{driver, DriverCall};
use crate::sim::hosts::{queue_host, service_host};
use crate::sim::world::World;
use crate::sim::{Stop, WaitEnd};
use crate::topology::{Role, Topology, ENGINE};
use serde_json::json;
use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tokio::task::{JoinHandle, LocalSet};

/// How often the runner looks at the world while it waits and nothing happens, in real
/// milliseconds (it looks at once after every event).
const LOOK_MS: u64 = 1;

/// The software of one of the rig's own hosts, built afresh on every (re)start.
pub type Software = Rc<dyn Fn() -> Pin<Box<dyn Future<Output = ()>>>>;

/// The bounds of a live run, in real milliseconds.
pub struct Bounds {
    /// How long the world may take to come up, and a host to register again after a restart.
    pub ready_ms_max: u64,
    /// How long nothing must happen before a healed world whose turns have all ended counts as
    /// settled.
    pub quiet_ms: u64,
    /// Past this, the run stops and reports the limit.
    pub duration_ms_max: u64,
    /// A timer of the live clock firing later than this (real milliseconds) makes the run void:
    /// the machine did not keep real time (see [`super::late_ms_max`]).
    pub late_ms_max: u64,
}

/// The latest a timer of the live clock fired, once the clock started: how far real time got
/// ahead of the world.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Lateness {
    /// How late, in real milliseconds.
    pub ms: u64,
    /// When it was due, in scenario milliseconds.
    pub due_ms: u64,
}

/// How late the harness processes' work ran, measured on its trips: every frame to or from an
/// external worker waited for a process to be scheduled, on this machine, about as long as the
/// runner's own ticks were waking late just then (the simulation spends no such time: its trips
/// take their latency, and work none); a stall a tick measured is charged once, at half its
/// length, to the frames it held (they arrived at any moment of it). A harness's round of work is many trips, each late by a
/// millisecond or a few on a loaded machine though no single timer is late past the bound;
/// their sum within the span of the shortest deciding timing is what the machine took from the
/// margins the scenario plays with (incident 001's redelivery outlives the first turn's end by
/// a 100 ms backoff, and the harness's thirty-odd trips in between ate it under load).
struct WorkLateness {
    /// The span summed over, in real milliseconds: the shortest deciding timing.
    window_ms: u64,
    /// The trace position up to which frames have been counted.
    scanned: usize,
    /// How late the runner's ticks have been waking lately, beyond a millisecond timer's own
    /// rounding, in thousandths of a millisecond (a moving average).
    recent_micros: u64,
    /// A stall the latest tick measured, not yet charged to a trip.
    stall_ms: u64,
    /// What was charged within the window: when, and how much.
    charged: std::collections::VecDeque<(u64, u64)>,
    sum_micros: u64,
    trips: u64,
    worst: WorkLate,
}

/// The most the harness processes' work ran late within one window.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WorkLate {
    /// How late, in all, in real milliseconds.
    pub ms: u64,
    /// Over how many trips.
    pub trips: u64,
    /// Within how long a span (real milliseconds), ending when (real milliseconds into the run).
    pub within_ms: u64,
    pub at_ms: u64,
}

impl WorkLateness {
    fn new(window_ms: u64) -> Self {
        Self {
            window_ms,
            scanned: 0,
            recent_micros: 0,
            stall_ms: 0,
            charged: std::collections::VecDeque::new(),
            sum_micros: 0,
            trips: 0,
            worst: WorkLate::default(),
        }
    }

    /// A tick of the runner woke `late_ms` late.
    fn tick(&mut self, late_ms: u64) {
        // A millisecond timer wakes up to a millisecond late on an idle machine.
        let beyond = late_ms.saturating_sub(1);
        self.recent_micros = (self.recent_micros * 7 + beyond * 1_000) / 8;
        self.stall_ms = beyond;
    }

    /// Charges `trips` new frames of external workers at `now` (real milliseconds): those that
    /// waited in the stall the latest tick measured waited together, once; each also waits as
    /// long as ticks have lately.
    fn count(&mut self, now: u64, trips: u64) {
        while self.charged.front().is_some_and(|(at, _)| now.saturating_sub(*at) >= self.window_ms) {
            let (_, micros) = self.charged.pop_front().expect("a charge");
            self.sum_micros -= micros;
            self.trips -= 1;
        }
        if trips == 0 {
            return;
        }
        // The frames a stall held arrived at any moment of it: on average, they waited half.
        let stall = std::mem::take(&mut self.stall_ms) * 1_000 / 2;
        for trip in 0..trips {
            let micros = self.recent_micros + if trip == 0 { stall } else { 0 };
            self.charged.push_back((now, micros));
            self.sum_micros += micros;
            self.trips += 1;
        }
        let ms = self.sum_micros / 1_000;
        if ms > self.worst.ms {
            self.worst = WorkLate { ms, trips: self.trips, within_ms: self.window_ms, at_ms: now };
        }
    }
}

/// Tick lateness is counted by the millisecond up to this.
const TICK_BUCKETS: usize = 1_001;

/// How late the runner's own ticks woke over a run: the typical lateness, besides the worst.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TickProfile {
    pub ticks: u64,
    pub p50_ms: u64,
    pub p90_ms: u64,
    pub p99_ms: u64,
}

/// How many lines of a process's output a failure quotes.
const OUTPUT_LINES: usize = 12;

/// A live world and the hosts the rig runs in it.
pub struct LiveRunner {
    /// Declared before the runtime: dropped first, inside it (see `Drop`).
    local: LocalSet,
    runtime: tokio::runtime::Runtime,
    world: Rc<World>,
    net: Rc<Net>,
    layout: RecordLayout,
    bounds: Bounds,
    software: BTreeMap<String, Software>,
    running: BTreeMap<String, JoinHandle<()>>,
    /// External hosts, whose software is the user's process.
    external: BTreeSet<String>,
    crashed: BTreeSet<String>,
    driver: (Bus, mpsc::UnboundedSender<DriverCall>),
    /// When the world's clock started (`None`: it stands at 0 until the world is up).
    clock_started: Option<Instant>,
    /// The external hosts' processes, when the rig owns them (`--spawn`).
    processes: RefCell<Option<Supervisor>>,
    /// What went wrong with those processes (one ended by itself, one could not start).
    process_failures: RefCell<Vec<String>>,
    /// How long each external worker said it may stay quiet before doing something by itself
    /// (`quiet_after_ms` to `rig::config`); see [`Self::provably_quiet`].
    declared_quiet: Rc<RefCell<BTreeMap<String, u64>>>,
    /// The latest a timer fired so far (see [`Self::look`]).
    late: std::cell::Cell<Lateness>,
    /// How many of the runner's own ticks woke how late (by the millisecond; the last bucket
    /// holds everything later).
    ticks: RefCell<Vec<u64>>,
    /// The lateness of the harness processes' work (see [`WorkLateness`]).
    work: RefCell<WorkLateness>,
    /// The functions each external host registers: it is back after a restart once it has
    /// registered them all again.
    functions: BTreeMap<String, BTreeSet<String>>,
    /// External hosts started again and not yet back (see [`Self::watch_restarts`]).
    restarting: RefCell<BTreeMap<String, Restarting>>,
    /// How long each restart of an external host took, in order.
    restarts: RefCell<Vec<Restart>>,
}

/// A restart of an external host being timed.
struct Restarting {
    since: Instant,
    at_ms: u64,
    /// The trace position up to which its registrations have been looked for.
    scanned: usize,
    missing: BTreeSet<String>,
}

/// One restart of an external host, measured: from the moment the rig started it again (its
/// process started, or its connections allowed again) to the last of its functions registered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Restart {
    pub host: String,
    /// When it was restarted, in scenario milliseconds.
    pub at_ms: u64,
    /// How long it took to serve again, in real milliseconds.
    pub took_ms: u64,
}

impl LiveRunner {
    /// Starts the rig's hosts of `topology` (the engine, the doubles, the queue, the driver, and
    /// `extra` hosts of the rig's own); harness hosts are left to external processes.
    pub fn start(
        world: Rc<World>,
        net: Rc<Net>,
        topology: &Topology,
        extra: Vec<(String, Software)>,
        layout: RecordLayout,
        bounds: Bounds,
    ) -> std::io::Result<Self> {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        let mut software: BTreeMap<String, Software> = extra.into_iter().collect();
        let mut external = BTreeSet::new();
        let functions = topology
            .hosts()
            .iter()
            .filter(|h| h.role == Role::Harness)
            .map(|h| (h.name.clone(), h.functions.iter().cloned().collect()))
            .collect();
        for host in topology.hosts() {
            let functions: Vec<String> = host.functions.iter().cloned().collect();
            let (world, dial, name) = (Rc::clone(&world), InMemory(Rc::clone(&net)), host.name.clone());
            let target = host.dials.clone().unwrap_or_default();
            let built: Software = match host.role {
                Role::Engine => {
                    let net = Rc::clone(&net);
                    Rc::new(move || Box::pin(engine_host(Rc::clone(&net))))
                }
                Role::Service => Rc::new(move || {
                    let host = service_host(&world, dial.clone(), &name, &target, &functions);
                    Box::pin(async move { drop(host.await) })
                }),
                Role::Queue => Rc::new(move || {
                    let host = queue_host(&world, dial.clone(), &name, &target, &functions);
                    Box::pin(async move { drop(host.await) })
                }),
                Role::Harness => {
                    external.insert(host.name.clone());
                    continue;
                }
                Role::Proxy | Role::Driver => continue,
            };
            software.insert(host.name.clone(), built);
        }
        let (sender, calls) = mpsc::unbounded_channel();
        let bus = Bus::new(Rc::clone(&world.clock));
        // The bound is half the shortest deciding timing: the work is summed over all of it.
        let window_ms = bounds.late_ms_max.saturating_mul(2);
        let mut runner = Self {
            local: LocalSet::new(),
            runtime,
            world,
            net,
            layout,
            bounds,
            software,
            running: BTreeMap::new(),
            external,
            crashed: BTreeSet::new(),
            driver: (bus, sender),
            clock_started: None,
            processes: RefCell::new(None),
            process_failures: RefCell::default(),
            declared_quiet: Rc::default(),
            late: std::cell::Cell::default(),
            ticks: RefCell::new(vec![0; TICK_BUCKETS]),
            work: RefCell::new(WorkLateness::new(window_ms)),
            functions,
            restarting: RefCell::default(),
            restarts: RefCell::default(),
        };
        let names: Vec<String> = runner.software.keys().cloned().collect();
        names.iter().for_each(|name| runner.start_host(name));
        // The driver is the scenario itself: it never crashes, so it needs no task set of its own.
        let dial = InMemory(Rc::clone(&runner.net));
        runner.local.spawn_local(driver(Rc::clone(&runner.world), dial, runner.driver.0.clone(), calls));
        Ok(runner)
    }

    /// Real milliseconds since the world's clock started.
    fn elapsed_ms(&self) -> u64 {
        self.clock_started.map_or(0, |started| u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX))
    }

    /// Brings the world's clock up to real time, firing the timers now due, and measures how
    /// late they fire. The runner looks every [`LOOK_MS`] (and at every event), so a timer
    /// fires within a millisecond or two of its moment on a machine that keeps up; `previous`
    /// is when it last looked, in real milliseconds: its own tick, due [`LOOK_MS`] after, is a
    /// timer of the clock too, so a stall with no timer of the world pending is measured as well.
    fn look(&self, previous: Option<u64>) -> u64 {
        let now = self.elapsed_ms();
        if self.clock_started.is_some() {
            let world_timer = self.world.clock.next_deadline().filter(|due| *due < now).map(|due| (now - due, due));
            // A look an event woke before the tick was due says nothing of the machine.
            if let Some(at) = previous.filter(|at| now >= at + LOOK_MS) {
                let late = now - (at + LOOK_MS);
                let mut ticks = self.ticks.borrow_mut();
                let bucket = usize::try_from(late).unwrap_or(usize::MAX).min(ticks.len() - 1);
                ticks[bucket] += 1;
                self.work.borrow_mut().tick(late);
            }
            self.count_trips();
            let tick = previous.map(|at| at + LOOK_MS).filter(|due| *due < now).map(|due| (now - due, due));
            for (ms, due_ms) in [world_timer, tick].into_iter().flatten() {
                if ms > self.late.get().ms {
                    self.late.set(Lateness { ms, due_ms });
                }
            }
        }
        self.world.clock.advance_to(now);
        now
    }

    /// Starts timing a restart of the external `host`: it was just started again.
    fn restart_begun(&self, host: &str) {
        let missing = self.functions.get(host).cloned().unwrap_or_default();
        let timing = Restarting {
            since: Instant::now(),
            at_ms: self.world.clock.now_ms(),
            scanned: self.world.trace().events().len(),
            missing,
        };
        self.restarting.borrow_mut().insert(host.to_string(), timing);
    }

    /// Ends the timing of each restarted external host that has registered all its functions
    /// again, noting how long it took (`restart_measured`).
    fn watch_restarts(&self) {
        let mut restarting = self.restarting.borrow_mut();
        if restarting.is_empty() {
            return;
        }
        let trace = self.world.trace();
        let events = trace.events();
        let mut back = Vec::new();
        for (host, timing) in restarting.iter_mut() {
            for event in &events[timing.scanned.min(events.len())..] {
                if let crate::trace::EventKind::Frame {
                    frame: "registerfunction",
                    direction: "in",
                    function_id: Some(function),
                    ..
                } = &event.kind
                {
                    timing.missing.remove(function.as_str());
                }
            }
            timing.scanned = events.len();
            if timing.missing.is_empty() {
                let took_ms = u64::try_from(timing.since.elapsed().as_millis()).unwrap_or(u64::MAX);
                back.push(Restart { host: host.clone(), at_ms: timing.at_ms, took_ms });
            }
        }
        drop(trace);
        for restart in back {
            restarting.remove(&restart.host);
            let detail = json!({ "host": restart.host, "at_ms": restart.at_ms, "took_ms": restart.took_ms });
            self.world.note_event(RIG, "restart_measured", detail);
            self.restarts.borrow_mut().push(restart);
        }
    }

    /// How long each restart of an external host took, and the hosts started again that never
    /// came back (with when they were restarted).
    pub fn restarts(&self) -> (Vec<Restart>, Vec<(String, u64)>) {
        let pending = self.restarting.borrow().iter().map(|(host, t)| (host.clone(), t.at_ms)).collect();
        (self.restarts.borrow().clone(), pending)
    }

    /// Counts the frames to and from external workers since the last look as trips of their
    /// work (see [`WorkLateness`]).
    fn count_trips(&self) {
        let mut work = self.work.borrow_mut();
        let trace = self.world.trace();
        let events = trace.events();
        let new = &events[work.scanned.min(events.len())..];
        // A note to the rig (`rig::note`, fire-and-forget) is no trip of the work: nothing waits
        // for it.
        let trips = new
            .iter()
            .filter(|e| {
                matches!(&e.kind, crate::trace::EventKind::Frame { peer, function_id, .. }
                    if self.external.contains(peer.as_str()) && function_id.as_deref() != Some(super::RIG_NOTE))
            })
            .count() as u64;
        work.scanned = events.len();
        drop(trace);
        // In real milliseconds since the clock started, as the window is.
        let now = self.elapsed_ms();
        work.count(now, trips);
    }

    /// The most the harness processes' work ran late within the span of the shortest deciding
    /// timing (see [`WorkLateness`]).
    pub fn work_late(&self) -> WorkLate {
        self.work.borrow().worst
    }

    /// How late the runner's ticks woke in this run, by percentile.
    pub fn tick_profile(&self) -> TickProfile {
        let ticks = self.ticks.borrow();
        let total: u64 = ticks.iter().sum();
        let at = |share: f64| {
            let wanted = ((total as f64) * share).ceil().max(1.0) as u64;
            let mut seen = 0;
            ticks.iter().position(|count| {
                seen += count;
                seen >= wanted
            })
        };
        let ms = |share: f64| at(share).map_or(0, |bucket| bucket as u64);
        TickProfile { ticks: total, p50_ms: ms(0.5), p90_ms: ms(0.9), p99_ms: ms(0.99) }
    }

    /// The latest a timer of the live clock fired in this run, and the bound it is held to.
    pub fn lateness(&self) -> (Lateness, u64) {
        (self.late.get(), self.bounds.late_ms_max)
    }

    /// Owns the external hosts' processes from now on: starts one for each, which the run's
    /// crashes kill, its restarts start again and its pauses stop.
    pub fn own_processes(&mut self, supervisor: Supervisor) -> Result<(), String> {
        let hosts: Vec<String> = supervisor.hosts().cloned().collect();
        *self.processes.get_mut() = Some(supervisor);
        hosts.iter().try_for_each(|host| self.start_process(host))
    }

    /// Reads the external workers' declarations of how long they may stay quiet.
    pub fn watch_quiet(&mut self, declared: Rc<RefCell<BTreeMap<String, u64>>>) {
        self.declared_quiet = declared;
    }

    /// Whether some owned process ended by itself (or could not start).
    pub fn process_failed(&self) -> bool {
        !self.process_failures.borrow().is_empty()
    }

    /// What went wrong with the owned processes, one sentence each.
    pub fn process_failures(&self) -> Vec<String> {
        self.process_failures.borrow().clone()
    }

    /// Hosts whose owned process ended by itself.
    pub fn process_output(&self, host: &str) -> Option<std::path::PathBuf> {
        self.processes.borrow().as_ref().and_then(|p| p.log(host))
    }

    fn start_process(&self, host: &str) -> Result<(), String> {
        let mut processes = self.processes.borrow_mut();
        let Some(processes) = processes.as_mut() else { return Ok(()) };
        match processes.start(host) {
            Ok((pid, log)) => {
                let detail = json!({ "host": host, "pid": pid, "group": pid, "output": log.display().to_string() });
                self.world.note_event(RIG, "process_started", detail);
                Ok(())
            }
            Err(why) => {
                self.process_failures.borrow_mut().push(why.clone());
                Err(why)
            }
        }
    }

    fn kill_process(&self, host: &str) {
        let mut processes = self.processes.borrow_mut();
        if processes.as_mut().is_some_and(|p| p.kill(host)) {
            self.world.note_event(RIG, "process_killed", json!({ "host": host, "signal": "SIGKILL" }));
        }
    }

    /// Keeps the owned processes in step with the world: stopped while the world has their
    /// host paused, continued when the pause ends; one that ended by itself is reported.
    fn supervise(&self) {
        let mut processes = self.processes.borrow_mut();
        let Some(processes) = processes.as_mut() else { return };
        let now = self.world.clock.now_ms();
        let paused: BTreeSet<String> = self.world.pauses_after(now).into_iter().map(|(host, _)| host).collect();
        for host in processes.stopped().difference(&paused) {
            if processes.set_stopped(host, false) {
                self.world.note_event(RIG, "process_continued", json!({ "host": host, "signal": "SIGCONT" }));
            }
        }
        for host in paused.iter().filter(|h| self.external.contains(*h)) {
            if processes.set_stopped(host, true) {
                self.world.note_event(RIG, "process_stopped", json!({ "host": host, "signal": "SIGSTOP" }));
            }
        }
        for exit in processes.reap() {
            let output = exit.log.display().to_string();
            self.world.note_event(
                RIG,
                "process_exited",
                json!({ "host": exit.host, "status": exit.status, "output": output }),
            );
            self.process_failures.borrow_mut().push(format!(
                "the harness process of `{}` ended by itself at {now} ms ({}); its output ({output}) ends:\n{}",
                exit.host,
                exit.status,
                tail(&exit.log, OUTPUT_LINES)
            ));
        }
    }

    /// Waits, the clock standing at 0, until `ready` holds (then starts the clock) or `within`
    /// passes in real time. Whether the world came up.
    pub fn wait_until_up(&mut self, within: Duration, mut ready: impl FnMut(&Self) -> bool) -> bool {
        let deadline = Instant::now() + within;
        let up = self.drive(|runner| {
            if ready(runner) {
                return Some(true);
            }
            (Instant::now() >= deadline || crate::interrupt::requested()).then_some(false)
        });
        self.clock_started = Some(Instant::now());
        up
    }

    /// Starts a host's software in a task set of its own; built inside it, so whatever it
    /// spawns as it starts belongs to the host too.
    fn start_host(&mut self, name: &str) {
        let Some(software) = self.software.get(name).cloned() else { return };
        let set = LocalSet::new();
        set.spawn_local(async move { software().await });
        self.running.insert(name.to_string(), self.local.spawn_local(set));
    }

    fn stop_host(&mut self, name: &str) {
        if name == ENGINE {
            self.net.engine_stopped();
        }
        if let Some(running) = self.running.remove(name) {
            running.abort();
        }
    }

    /// Runs the world in real time until `check` has an answer, looking every millisecond, and
    /// crashes and restarts the hosts cuts ask for as it goes.
    fn drive<T>(&mut self, mut check: impl FnMut(&Self) -> Option<T>) -> T {
        loop {
            if let Some(answer) = self.drive_until_bounce(&mut check) {
                return answer;
            }
            self.bounce_requested_hosts();
        }
    }

    /// [`Self::drive`] until `check` has an answer (`Some`) or a cut asks for a host to be
    /// crashed (`None`).
    fn drive_until_bounce<T>(&self, check: &mut impl FnMut(&Self) -> Option<T>) -> Option<T> {
        let watched = self.world.watch();
        self.local.block_on(&self.runtime, async {
            let mut looked = None;
            loop {
                looked = Some(self.look(looked));
                self.supervise();
                self.watch_restarts();
                if self.world.has_bounces() {
                    return None;
                }
                if let Some(answer) = check(self) {
                    return Some(answer);
                }
                // At the next event, or a millisecond later for the clock.
                tokio::select! {
                    biased;
                    () = watched.notified() => {}
                    () = tokio::time::sleep(Duration::from_millis(LOOK_MS)) => {}
                }
            }
        })
    }

    /// Crashes and at once restarts each host a cut asked for (`crash-service`, `crash-engine`,
    /// `crash-caller-*`): the rig's own hosts lose their software and start afresh; an external
    /// worker has its connections dropped and may connect again at once, as for a `crash` and
    /// `restart` of its host, and a process the rig owns is killed and started again.
    fn bounce_requested_hosts(&mut self) {
        for host in self.world.take_bounces() {
            self.world.record(
                "rig",
                crate::trace::EventKind::Control { action: "crash and restart".into(), target: host.clone() },
            );
            self.world.end_pause(&host);
            if self.external.contains(&host) {
                self.net.crash_external(&host);
                self.kill_process(&host);
                self.net.restart_external(&host);
                let _ = self.start_process(&host);
                self.restart_begun(&host);
            } else {
                self.stop_host(&host);
                self.start_host(&host);
            }
        }
    }

    /// A limit the run reached, a signal that asked the command to stop, or lateness that made
    /// the run void already: the script ends at once (such a run is void, see
    /// [`super::run_live`]).
    fn limit(&self) -> Option<Stop> {
        if let Some(signal) = crate::interrupt::received() {
            return Some(Stop::Limit(format!("interrupted by {}", signal.name())));
        }
        // A run already void has no verdict to reach: the rest of it (a liveness bound waited
        // out, say) would only delay its retry.
        let bound = self.bounds.late_ms_max;
        if self.late.get().ms > bound || self.work.borrow().worst.ms > bound {
            return Some(Stop::Limit("the machine did not keep real time".into()));
        }
        let max = self.bounds.duration_ms_max;
        (self.world.clock.now_ms() > max).then(|| {
            let what = format!("run duration {max} ms");
            self.world.record("rig", crate::trace::EventKind::Limit { what: what.clone() });
            Stop::Limit(what)
        })
    }

    /// Whether nothing can happen any more, though a turn has not ended: no timer of the rig is
    /// pending (the caller checks), no invocation is in flight (so nobody waits for an answer,
    /// and no call's deadline is running anywhere), nothing has happened for `quiet_for`, and
    /// every external worker is connected and said (`quiet_after_ms` to `rig::config`) that it
    /// does nothing by itself after staying quiet that long: every wait of its own between two
    /// of its calls (a backoff, a timer) is shorter. Without that word from every one of them
    /// nothing is provable, as their timers cannot be seen from outside.
    fn provably_quiet(&self, quiet_for: u64) -> bool {
        if self.net.invocations_pending() > 0 {
            return false;
        }
        let declared = self.declared_quiet.borrow();
        self.external.iter().all(|host| {
            !self.crashed.contains(host)
                && self.net.connected(host)
                && declared.get(host).is_some_and(|quiet_after_ms| quiet_for >= *quiet_after_ms)
        })
    }

    /// Whether every turn in the store has ended: terminal, or held with a reason.
    fn turns_settled(&self) -> bool {
        let store = self.world.store.borrow();
        let layout = &self.layout;
        let settled = store
            .records()
            .filter(|(scope, _, _)| *scope == layout.turn_scope)
            .all(|(_, _, record)| layout.is_terminal(record) || layout.is_held_with_reason(record));
        settled
    }
}

impl Drop for LiveRunner {
    /// Ends the run: the processes it owns are killed, and every task and socket is dropped
    /// inside the runtime that made them.
    fn drop(&mut self) {
        drop(self.processes.get_mut().take());
        let _inside = self.runtime.enter();
        drop(std::mem::take(&mut self.local));
    }
}

impl WorldDriver for LiveRunner {
    fn world(&self) -> &Rc<World> {
        &self.world
    }

    fn now_ms(&self) -> u64 {
        self.look(None);
        self.world.clock.now_ms()
    }

    fn ready_ms_max(&self) -> u64 {
        self.bounds.ready_ms_max
    }

    fn driver_connected(&self) -> bool {
        self.driver.0.is_connected()
    }

    fn invoke(&mut self, call: DriverCall) {
        let _ = self.driver.1.send(call);
    }

    /// Live, nothing is ever known to be impossible (an external process may act at any
    /// time), so a wait ends when `done` holds or at its deadline, never stalled.
    fn run_until(&mut self, deadline_ms: Option<u64>, mut done: impl FnMut(&Self) -> bool) -> Result<WaitEnd, Stop> {
        self.drive(|runner| {
            if done(runner) {
                return Some(Ok(WaitEnd::Met));
            }
            if deadline_ms.is_some_and(|deadline| runner.world.clock.now_ms() >= deadline) {
                return Some(Ok(WaitEnd::Deadline));
            }
            runner.limit().map(Err)
        })
    }

    /// Time passes in real time: the world runs meanwhile.
    fn skip_to(&mut self, at_ms: u64) -> Result<(), Stop> {
        self.run_until(Some(at_ms), |_| false).map(drop)
    }

    /// Settled live means: no timer of the rig is pending, nothing has happened for the quiet
    /// period, and either every turn has ended or the world is provably quiet (see
    /// [`Self::provably_quiet`]). Otherwise a turn that has not ended is given the whole
    /// liveness bound: an external harness's own timers cannot be seen.
    fn settle(&mut self, deadline_ms: u64) -> Result<bool, Stop> {
        let (mut seen, mut quiet_since) = (self.world.activity(), self.world.clock.now_ms());
        let quiet_ms = self.bounds.quiet_ms;
        self.drive(|runner| {
            let now = runner.world.clock.now_ms();
            if runner.world.activity() != seen {
                (seen, quiet_since) = (runner.world.activity(), now);
            }
            if now >= deadline_ms {
                return Some(Ok(false));
            }
            let quiet_for = now.saturating_sub(quiet_since);
            if quiet_for >= quiet_ms
                && runner.world.clock.next_deadline().is_none()
                && (runner.turns_settled() || runner.provably_quiet(quiet_for))
            {
                return Some(Ok(true));
            }
            runner.limit().map(Err)
        })
    }

    fn crashed(&self) -> &BTreeSet<String> {
        &self.crashed
    }

    fn crash(&mut self, host: &str) {
        self.world.record_control("crash", host);
        self.world.end_pause(host);
        if self.external.contains(host) {
            self.net.crash_external(host);
            self.kill_process(host);
        } else {
            self.stop_host(host);
        }
        self.crashed.insert(host.to_string());
    }

    /// A restart starts the host's software from scratch, running or not: an owned process is
    /// killed first.
    fn restart(&mut self, host: &str) {
        self.world.record_control("restart", host);
        self.world.end_pause(host);
        self.kill_process(host);
        self.bring_back(host);
    }

    fn partition(&mut self, a: &str, b: &str) {
        self.world.record_control("partition", &format!("{a}<->{b}"));
        self.world.sever(a, b);
    }

    fn repair(&mut self, a: &str, b: &str) {
        self.world.record_control("repair", &format!("{a}<->{b}"));
        self.world.mend(a, b);
    }

    /// Refused before a live run starts ([`super::plan`]); a no-op should it ever get here.
    fn hold(&mut self, a: &str, b: &str) {
        tracing::warn!("live mode cannot hold {a}<->{b}");
    }

    fn release(&mut self, a: &str, b: &str) {
        tracing::warn!("live mode cannot release {a}<->{b}");
    }

    fn heal(&mut self) {
        self.world.record_control("heal", "all");
        self.world.heal_faults();
        for host in std::mem::take(&mut self.crashed) {
            self.bring_back(&host);
        }
    }
}

impl LiveRunner {
    fn bring_back(&mut self, host: &str) {
        if self.external.contains(host) {
            self.net.restart_external(host);
            let gone = self.processes.borrow().as_ref().is_some_and(|p| !p.is_running(host));
            if gone {
                let _ = self.start_process(host);
            }
            self.restart_begun(host);
        } else if !self.running.contains_key(host) {
            self.start_host(host);
        }
        self.crashed.remove(host);
    }
}
