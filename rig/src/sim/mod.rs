//! The simulation facade: the one place turmoil is configured and stepped.
//!
//! Every Builder option is set here explicitly (turmoil's defaults include an OS-seeded RNG and
//! a wall-clock epoch), hosts are added here, and the [`Runner`] steps the simulation, fires the
//! facade clock's timers, and warps the clock across quiescent stretches.

pub mod driver;
pub mod hosts;
pub mod world;

pub use driver::DriverCall;

use crate::bus::Bus;
use crate::trace::EventKind;
use std::collections::{BTreeMap, BTreeSet};
use std::rc::Rc;
use std::time::{Duration, UNIX_EPOCH};
use tokio::sync::mpsc;
use world::World;

/// The network and time knobs of one simulated world.
#[derive(Debug, Clone, PartialEq)]
pub struct NetworkConfig {
    pub tick_ms: u64,
    pub latency_ms_min: u64,
    pub latency_ms_max: u64,
    /// The simulated time after which a run stops and reports the limit.
    pub duration_ms_max: u64,
    /// The most simulation steps a run may take, however little simulated time they cover.
    pub steps_max: u64,
    /// Tick every host on every step, as turmoil upstream does, instead of letting the rig's
    /// hosts skip the steps in which none of their tasks was woken. Slower, and the same run:
    /// a test holds the two to equal trace hashes.
    pub tick_idle_hosts: bool,
    /// How long a restarted harness worker takes before its software runs again (a process
    /// starting: an interpreter, its imports, its connection). 0, the default, restarts it at
    /// once; live mode measures a real process's restarts and names this setting when the
    /// difference decides a verdict (rig/docs/live.md).
    pub harness_restart_ms: u64,
}

impl Default for NetworkConfig {
    fn default() -> Self {
        Self {
            tick_ms: 1,
            latency_ms_min: 1,
            latency_ms_max: 3,
            duration_ms_max: 7_200_000,
            steps_max: 2_000_000,
            tick_idle_hosts: false,
            harness_restart_ms: 0,
        }
    }
}

/// How long the world may take to come up before the script starts, and a host to register
/// again after a restart.
pub const READY_MS_MAX: u64 = 5_000;

/// A fixed epoch (2026-01-01T00:00:00Z), so nothing in a run depends on when it ran.
const EPOCH_SECS: u64 = 1_767_225_600;

/// Builds the turmoil simulation with every option set from the seed and the config.
fn build(seed: u64, config: &NetworkConfig) -> turmoil::Sim<'static> {
    turmoil::Builder::new()
        .rng_seed(seed)
        .epoch(UNIX_EPOCH + Duration::from_secs(EPOCH_SECS))
        .tick_duration(Duration::from_millis(config.tick_ms))
        .min_message_latency(Duration::from_millis(config.latency_ms_min))
        .max_message_latency(Duration::from_millis(config.latency_ms_max))
        // turmoil's elapsed time never runs ahead of the rig's clock, so its own bound is only a
        // backstop behind `duration_ms_max`.
        .simulation_duration(Duration::from_millis(config.duration_ms_max.saturating_add(1_000)))
        .fail_rate(0.0)
        .repair_rate(1.0)
        .tcp_capacity(65_536)
        .udp_capacity(64)
        .ephemeral_ports(49_152..=65_535)
        .ip_version(turmoil::IpVersion::V4)
        // Host order within a step is drawn from the seeded RNG, so seeds explore interleavings.
        .enable_random_order()
        .build()
}

/// Why a run stopped before its script finished.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stop {
    /// A limit was hit (simulated duration, steps); the run reports it with its seed.
    Limit(String),
    /// A host's software failed.
    HostFailed(String),
}

/// How a bounded wait ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitEnd {
    Met,
    Deadline,
    /// Nothing is in flight and no timer is pending: nothing can ever happen again.
    Stalled,
}

/// Steps one simulated world and controls its hosts.
pub struct Runner {
    sim: turmoil::Sim<'static>,
    pub world: Rc<World>,
    config: NetworkConfig,
    warp_ms: u64,
    quiet_steps: u32,
    steps: u64,
    crashed: BTreeSet<String>,
    cut_links: BTreeSet<(String, String)>,
    /// Links whose messages are held: they cannot arrive before a release, so they do not keep
    /// the world busy.
    held: BTreeSet<(std::net::IpAddr, std::net::IpAddr)>,
    driver: Option<(Bus, mpsc::UnboundedSender<DriverCall>)>,
    /// Hosts whose process is stopped for a pause: turmoil does not tick them.
    frozen: BTreeSet<String>,
    /// The host each host dials (the engine, or the proxy in front of it).
    dials: BTreeMap<String, String>,
    /// Links an `isolate-caller` cut partitioned, with when each is repaired.
    isolated: BTreeMap<(String, String), u64>,
    /// Hosts whose software takes time to start again after a restart (harness workers, by
    /// `harness_restart_ms`), with that time.
    slow_starts: BTreeMap<String, u64>,
    /// Restarted hosts whose software has not started yet, with when it starts.
    starting: BTreeMap<String, u64>,
}

impl Runner {
    pub fn new(world: Rc<World>, config: NetworkConfig) -> Self {
        let sim = build(world.seed, &config);
        Self {
            sim,
            world,
            config,
            warp_ms: 0,
            quiet_steps: 0,
            steps: 0,
            crashed: BTreeSet::new(),
            frozen: BTreeSet::new(),
            dials: BTreeMap::new(),
            isolated: BTreeMap::new(),
            cut_links: BTreeSet::new(),
            held: BTreeSet::new(),
            driver: None,
            slow_starts: BTreeMap::new(),
            starting: BTreeMap::new(),
        }
    }

    /// Makes `host`'s software take the world's `harness_restart_ms` to start again after each
    /// restart (a crash and restart cut's, a `restart` step's, a heal's).
    pub fn starts_slowly(&mut self, host: &str) {
        if self.config.harness_restart_ms > 0 {
            self.slow_starts.insert(host.to_string(), self.config.harness_restart_ms);
        }
    }

    /// Starts `host`'s software again: at once, or, for a host that starts slowly, once its
    /// start time has passed (it stays down meanwhile, as a process still starting serves
    /// nothing).
    fn start_again(&mut self, host: &str) {
        match self.slow_starts.get(host) {
            Some(ms) => {
                self.sim.crash(host);
                let at = self.now_ms().saturating_add(*ms);
                self.starting.insert(host.to_string(), at);
            }
            None => self.sim.bounce(host),
        }
    }

    /// Starts the software of the restarted hosts whose start time has come.
    fn start_hosts_due(&mut self, now: u64) {
        let due: Vec<String> = self.starting.iter().filter(|(_, at)| **at <= now).map(|(h, _)| h.clone()).collect();
        for host in due {
            self.starting.remove(&host);
            let took = self.slow_starts.get(&host).copied().unwrap_or_default();
            self.world.note_event("rig", "host_started", serde_json::json!({ "host": host, "after_ms": took }));
            self.sim.bounce(host.as_str());
        }
    }

    /// Adds a host whose software is rebuilt from `software` on every restart.
    pub fn host<F, Fut>(&mut self, name: &str, software: F)
    where
        F: Fn() -> Fut + 'static,
        Fut: std::future::Future<Output = turmoil::Result> + 'static,
    {
        self.sim.host(name, software);
    }

    /// Lets a host skip the steps in which none of its tasks was woken. Only for software that
    /// waits on the rig's clock alone (a tokio timer would fire late) and spawns with
    /// `spawn_local`: the steps it skips are ones in which it would have done nothing.
    pub fn skip_idle_ticks(&mut self, name: &str) {
        if !self.config.tick_idle_hosts {
            self.sim.skip_idle_ticks(name);
        }
    }

    /// Adds the scenario's driver, the client through which steps invoke functions.
    pub fn add_driver(&mut self) {
        let (sender, receiver) = mpsc::unbounded_channel();
        let bus = Bus::new(Rc::clone(&self.world.clock));
        let driver = driver::driver(Rc::clone(&self.world), hosts::SimulatedNetwork, bus.clone(), receiver);
        self.sim.client(crate::topology::DRIVER, driver);
        self.skip_idle_ticks(crate::topology::DRIVER);
        self.driver = Some((bus, sender));
    }

    pub fn driver_connected(&self) -> bool {
        self.driver.as_ref().is_some_and(|(bus, _)| bus.is_connected())
    }

    /// Hands an invocation to the driver; its outcome lands in `world.rpc` under `call.name`.
    pub fn invoke(&mut self, call: DriverCall) {
        if let Some((_, sender)) = &self.driver {
            let _ = sender.send(call);
        }
    }

    /// Simulated milliseconds since the start of the run.
    pub fn now_ms(&self) -> u64 {
        u64::try_from(self.sim.elapsed().as_millis()).unwrap_or(u64::MAX).saturating_add(self.warp_ms)
    }

    pub fn steps(&self) -> u64 {
        self.steps
    }

    /// Messages on the network that can still arrive (those on held links cannot, until released).
    fn in_flight(&self) -> usize {
        // Asked after every quiet step; most runs hold no link, and then there is nothing to look up.
        let none_held = self.held.is_empty();
        self.sim.messages_on_the_way(|pair| none_held || !self.held.contains(&pair))
    }

    /// The pair of addresses turmoil keys a link by (ordered).
    fn link_pair(&self, a: &str, b: &str) -> (std::net::IpAddr, std::net::IpAddr) {
        let (a, b) = (self.sim.lookup(a), self.sim.lookup(b));
        if a <= b {
            (a, b)
        } else {
            (b, a)
        }
    }

    /// Runs one tick: fires the timers due now, steps every host, and notes whether anything
    /// happened.
    pub fn step(&mut self) -> Result<(), Stop> {
        let now = self.now_ms();
        if now > self.config.duration_ms_max {
            return Err(self.limit(format!("simulated duration {} ms", self.config.duration_ms_max)));
        }
        if self.steps >= self.config.steps_max {
            return Err(self.limit(format!("{} simulation steps", self.config.steps_max)));
        }
        self.freeze_paused_hosts(now);
        self.repair_isolations_due(now);
        let woken = self.world.clock.advance_to(now);
        self.start_hosts_due(now);
        let activity = self.world.activity();
        self.sim.step().map_err(|error| Stop::HostFailed(error.to_string()))?;
        self.steps += 1;
        for host in self.world.take_bounces() {
            self.world.record("rig", EventKind::Control { action: "crash and restart".into(), target: host.clone() });
            self.world.end_pause(&host);
            self.start_again(&host);
        }
        for (host, until) in self.world.take_isolations() {
            self.isolate(&host, until);
        }
        let quiet = woken == 0 && self.world.activity() == activity && self.in_flight() == 0;
        self.quiet_steps = if quiet { self.quiet_steps + 1 } else { 0 };
        Ok(())
    }

    /// Stops the processes the world has paused and resumes those whose pause is over: a paused
    /// host runs nothing at all (it neither answers nor sends), as a suspended process, whatever
    /// its software would rather do.
    fn freeze_paused_hosts(&mut self, now: u64) {
        // Called on every step: with no pause anywhere there is nothing to list.
        if self.frozen.is_empty() && !self.world.has_pauses() {
            return;
        }
        let paused: BTreeSet<String> = self.world.pauses_after(now).into_iter().map(|(host, _)| host).collect();
        for host in self.frozen.difference(&paused) {
            self.sim.freeze(host.as_str(), false);
        }
        for host in paused.difference(&self.frozen) {
            self.sim.freeze(host.as_str(), true);
        }
        self.frozen = paused;
    }

    /// The next moment something is due: a timer on the world's clock, a pause's end, or the
    /// repair of a link a cut isolated.
    fn next_deadline(&self) -> Option<u64> {
        let now = self.now_ms();
        let pause_end = self.world.pauses_after(now).into_iter().map(|(_, until)| until).min();
        let repair = self.isolated.values().copied().min();
        let start = self.starting.values().copied().min();
        [self.world.clock.next_deadline(), pause_end, repair, start].into_iter().flatten().min()
    }

    /// Records the host `host` dials, for cuts that isolate it.
    pub fn note_dial(&mut self, host: &str, target: &str) {
        self.dials.insert(host.to_string(), target.to_string());
    }

    /// Cuts `host` off from what it dials until `until`, unless the script already has that
    /// link cut (its own `repair` decides then).
    fn isolate(&mut self, host: &str, until: u64) {
        let target = self.dials.get(host).cloned().unwrap_or_else(|| crate::topology::ENGINE.to_string());
        let link = (host.to_string(), target.clone());
        // The script may have named the link either way round.
        let cut = self.cut_links.contains(&link)
            || (!crate::planted!("isolation-checks-the-link-one-way")
                && self.cut_links.contains(&(target.clone(), host.to_string())));
        if cut && !self.isolated.contains_key(&link) {
            return;
        }
        if !cut {
            self.partition(host, &target);
        }
        let repair = self.isolated.entry(link).or_insert(until);
        *repair = (*repair).max(until);
    }

    /// Repairs the links whose isolation is over.
    fn repair_isolations_due(&mut self, now: u64) {
        let due: Vec<(String, String)> =
            self.isolated.iter().filter(|(_, until)| **until <= now).map(|(link, _)| link.clone()).collect();
        for (a, b) in due {
            self.isolated.remove(&(a.clone(), b.clone()));
            self.repair(&a, &b);
        }
    }

    fn limit(&self, what: String) -> Stop {
        self.world.record("rig", EventKind::Limit { what: what.clone() });
        Stop::Limit(what)
    }

    /// Steps until `done` holds, `deadline_ms` passes, or the world stalls (quiet, with no timer
    /// pending: nothing can ever happen again). Quiescent stretches are skipped by warping the
    /// clock to the next timer. The world is judged quiet afresh: whatever the script did just
    /// before (an invocation handed to the driver, a restart) gets its steps to show.
    pub fn run_until(
        &mut self,
        deadline_ms: Option<u64>,
        mut done: impl FnMut(&Self) -> bool,
    ) -> Result<WaitEnd, Stop> {
        self.quiet_steps = 0;
        loop {
            if done(self) {
                return Ok(WaitEnd::Met);
            }
            let now = self.now_ms();
            if deadline_ms.is_some_and(|deadline| now >= deadline) {
                return Ok(WaitEnd::Deadline);
            }
            // Two quiet steps in a row: every host ran to idle and nothing crossed the network.
            if self.quiet_steps >= 2 {
                match self.next_deadline() {
                    Some(next) => self.warp_ms += next.min(deadline_ms.unwrap_or(u64::MAX)).saturating_sub(now),
                    None => return Ok(WaitEnd::Stalled),
                }
                self.quiet_steps = 0;
            }
            self.step()?;
        }
    }

    /// Lets simulated time pass up to `at_ms` in a world where nothing can happen meanwhile;
    /// past the run's duration bound that is the limit, reported, not a silent jump. The clock
    /// moves at once, so whatever the script does next is stamped with the new time.
    pub fn skip_to(&mut self, at_ms: u64) -> Result<(), Stop> {
        if at_ms > self.config.duration_ms_max {
            return Err(self.limit(format!("simulated duration {} ms", self.config.duration_ms_max)));
        }
        self.warp_ms += at_ms.saturating_sub(self.now_ms());
        self.world.clock.advance_to(self.now_ms());
        Ok(())
    }

    /// The hosts crashed and not yet restarted.
    pub fn crashed(&self) -> &BTreeSet<String> {
        &self.crashed
    }

    /// Crashes a host: its software stops and its in-memory state is lost.
    pub fn crash(&mut self, host: &str) {
        self.world.record_control("crash", host);
        self.world.end_pause(host);
        self.sim.crash(host);
        // A host crashed again before it had started stays down until it is restarted.
        self.starting.remove(host);
        self.crashed.insert(host.to_string());
    }

    /// Restarts a host's software from scratch.
    pub fn restart(&mut self, host: &str) {
        self.world.record_control("restart", host);
        self.world.end_pause(host);
        self.start_again(host);
        self.crashed.remove(host);
    }

    /// Cuts the network between two hosts in both directions: what is in flight is lost, every
    /// connection across the link drops on both sides, and no new one can be opened until the
    /// link is repaired.
    pub fn partition(&mut self, a: &str, b: &str) {
        self.world.record_control("partition", &format!("{a}<->{b}"));
        self.sim.partition(a, b);
        self.world.sever(a, b);
        self.cut_links.insert((a.to_string(), b.to_string()));
    }

    pub fn repair(&mut self, a: &str, b: &str) {
        self.world.record_control("repair", &format!("{a}<->{b}"));
        self.sim.repair(a, b);
        self.world.mend(a, b);
        self.cut_links.remove(&(a.to_string(), b.to_string()));
    }

    /// Holds messages between two hosts until released.
    pub fn hold(&mut self, a: &str, b: &str) {
        self.world.record_control("hold", &format!("{a}<->{b}"));
        self.sim.hold(a, b);
        self.cut_links.insert((a.to_string(), b.to_string()));
        let pair = self.link_pair(a, b);
        self.held.insert(pair);
    }

    pub fn release(&mut self, a: &str, b: &str) {
        self.world.record_control("release", &format!("{a}<->{b}"));
        // turmoil's release leaves the link healthy: held and partitioned are one link state.
        self.sim.release(a, b);
        self.cut_links.remove(&(a.to_string(), b.to_string()));
        let pair = self.link_pair(a, b);
        self.held.remove(&pair);
    }

    /// Heals every fault: disarms the cuts, releases and repairs every link, restarts every
    /// crashed host.
    pub fn heal(&mut self) {
        self.world.record_control("heal", "all");
        self.world.heal_faults();
        self.held.clear();
        self.isolated.clear();
        for (a, b) in std::mem::take(&mut self.cut_links) {
            self.sim.release(a.as_str(), b.as_str());
            self.sim.repair(a.as_str(), b.as_str());
        }
        for host in std::mem::take(&mut self.crashed) {
            self.start_again(&host);
        }
    }
}
