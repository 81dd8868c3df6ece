//! A scenario's script, run against a world: the steps, the final heal, the settling.
//!
//! One implementation for both kinds of run. A [`WorldDriver`] is what the script needs of a
//! world: time, bounded waits, the driver's invocations and the host and network controls. The
//! simulation's [`crate::sim::Runner`] is one (simulated time, turmoil's network); live mode's
//! runner is the other (real time, real sockets, real external workers).

use crate::scenario::{Scenario, Step};
use crate::sim::world::World;
use crate::sim::{DriverCall, Stop, WaitEnd};
use crate::topology::{self, Topology};
use crate::trace::EventKind;
use std::collections::BTreeSet;
use std::rc::Rc;

/// Extra time a blocking invoke waits beyond the invocation's own deadline.
const INVOKE_GRACE_MS: u64 = 1_000;

/// What a scenario's script needs of the world it runs in.
pub trait WorldDriver {
    fn world(&self) -> &Rc<World>;
    /// Milliseconds since the start of the run, on the world's clock.
    fn now_ms(&self) -> u64;
    /// How long the world may take to come up, and a host to register again after a restart.
    fn ready_ms_max(&self) -> u64;
    fn driver_connected(&self) -> bool;
    /// Hands an invocation to the scenario's driver; its outcome lands in `world.rpc`.
    fn invoke(&mut self, call: DriverCall);
    /// Lets the world run until `done` holds, `deadline_ms` passes, or nothing can happen any
    /// more (`Stalled`).
    fn run_until(&mut self, deadline_ms: Option<u64>, done: impl FnMut(&Self) -> bool) -> Result<WaitEnd, Stop>
    where
        Self: Sized;
    /// Lets time pass up to `at_ms` in a world where nothing can happen meanwhile.
    fn skip_to(&mut self, at_ms: u64) -> Result<(), Stop>;
    /// Lets the healed world settle, at most until `deadline_ms`: whether it settled into
    /// quiescence (rather than running into the bound).
    fn settle(&mut self, deadline_ms: u64) -> Result<bool, Stop>;
    /// The hosts crashed and not yet restarted.
    fn crashed(&self) -> &BTreeSet<String>;
    fn crash(&mut self, host: &str);
    fn restart(&mut self, host: &str);
    fn partition(&mut self, a: &str, b: &str);
    fn repair(&mut self, a: &str, b: &str);
    fn hold(&mut self, a: &str, b: &str);
    fn release(&mut self, a: &str, b: &str);
    /// Heals every fault: cuts, links, crashed hosts.
    fn heal(&mut self);
}

/// When a run healed and how it ended.
pub struct Settled {
    pub healed_at_ms: u64,
    /// Whether it settled into quiescence (rather than running into the liveness bound).
    pub quiescent: bool,
    /// Whether every step completed: `keep_going` made no difference to the run.
    pub steps_completed: bool,
    /// How many of the script's steps were begun: a step after them never happened (the script
    /// ended early), so the invocations it names were never sent.
    pub steps_begun: usize,
}

/// Runs the script, heals every fault and lets the world settle; what went wrong goes into
/// `failures`, a stop (a limit, a failed host) with the run's seed. A step that cannot complete
/// ends the script, unless `keep_going` (an uncut run measured for recovery cost goes on past
/// a wait for a fault that is not there).
pub fn run_script<D: WorldDriver>(
    runner: &mut D,
    topology: &Topology,
    scenario: &Scenario,
    seed: u64,
    keep_going: bool,
    failures: &mut Vec<String>,
) -> Settled {
    let mut steps_begun = 0;
    match execute(runner, topology, scenario, keep_going, failures, &mut steps_begun) {
        Ok(settled) => settled,
        Err(stop) => {
            failures.push(match stop {
                Stop::Limit(what) => format!("limit reached: {what} (seed {seed})"),
                Stop::HostFailed(why) => format!("a host's software failed: {why} (seed {seed})"),
            });
            // Not known to have completed every step (one may have failed before the stop).
            Settled { healed_at_ms: runner.now_ms(), quiescent: false, steps_completed: false, steps_begun }
        }
    }
}

/// The functions of a set not yet registered at the engine since a trace position, for a wait
/// that asks after every simulation step whether they all are: each ask looks only at the
/// events recorded since the one before. (Looking at every event since the position on each
/// step made a wait cost the square of its length: about 1 % of a run, under `perf`.)
pub struct Registrations<'a> {
    /// The events before this position were looked at.
    looked: usize,
    missing: BTreeSet<&'a str>,
}

impl<'a> Registrations<'a> {
    pub fn since(position: usize, expected: &'a BTreeSet<String>) -> Self {
        Self { looked: position, missing: expected.iter().map(String::as_str).collect() }
    }

    /// Whether every function of the set was registered by now.
    pub fn all_in(&mut self, world: &World) -> bool {
        let trace = world.trace();
        let events = trace.events();
        for function in events[self.looked.min(events.len())..].iter().filter_map(registered_function) {
            self.missing.remove(function);
        }
        self.looked = self.looked.max(events.len());
        self.missing.is_empty()
    }
}

/// The functions registered at the engine since trace position `since`.
pub fn registered_functions(world: &World, since: usize) -> BTreeSet<String> {
    let trace = world.trace();
    trace.events()[since.min(trace.events().len())..]
        .iter()
        .filter_map(registered_function)
        .map(str::to_string)
        .collect()
}

/// The function an event registered at the engine, if it is such a registration.
fn registered_function(event: &crate::trace::Event) -> Option<&str> {
    match &event.kind {
        EventKind::Frame { frame: "registerfunction", direction: "in", function_id, .. } => function_id.as_deref(),
        _ => None,
    }
}

fn execute<D: WorldDriver>(
    runner: &mut D,
    topology: &Topology,
    scenario: &Scenario,
    keep_going: bool,
    failures: &mut Vec<String>,
    steps_begun: &mut usize,
) -> Result<Settled, Stop> {
    let ready_ms_max = runner.ready_ms_max();
    let mut registrations = Registrations::since(0, topology.registered_at_start());
    if runner.run_until(Some(ready_ms_max), |r| r.driver_connected() && registrations.all_in(r.world()))?
        != WaitEnd::Met
    {
        failures.push(format!("the world did not come up within {ready_ms_max} ms"));
        return Ok(Settled { healed_at_ms: runner.now_ms(), quiescent: false, steps_completed: true, steps_begun: 0 });
    }
    let mut steps_completed = true;
    for (index, step) in scenario.steps.iter().enumerate() {
        *steps_begun = index + 1;
        if let Some(failure) = execute_step(runner, topology, step)? {
            steps_completed = false;
            if !scenario.oracles_only {
                failures.push(format!("step {}: {failure}", index + 1));
            }
            if !keep_going {
                break;
            }
        }
    }
    runner.heal();
    let healed_at_ms = runner.now_ms();
    let quiescent = runner.settle(healed_at_ms.saturating_add(scenario.world.liveness_ms))?;
    Ok(Settled { healed_at_ms, quiescent, steps_completed, steps_begun: *steps_begun })
}

fn wait_for_rpc<D: WorldDriver>(runner: &mut D, name: &str, within_ms: u64) -> Result<Option<String>, Stop> {
    let deadline = runner.now_ms().saturating_add(within_ms);
    let end = runner.run_until(Some(deadline), |r| r.world().rpc.borrow().contains_key(name))?;
    Ok((end != WaitEnd::Met).then(|| format!("no outcome for `{name}` within {within_ms} ms ({end:?})")))
}

/// After its link is repaired, the client is back once it has a connection again: its calls
/// would otherwise find none (`disconnected`) for as long as its reconnection backoff lasts.
fn wait_for_driver<D: WorldDriver>(runner: &mut D) -> Result<Option<String>, Stop> {
    let ready_ms_max = runner.ready_ms_max();
    let deadline = runner.now_ms().saturating_add(ready_ms_max);
    if runner.run_until(Some(deadline), |r| r.driver_connected())? != WaitEnd::Met {
        return Ok(Some(format!(
            "the driver did not connect again within {ready_ms_max} ms of the repair of its link"
        )));
    }
    Ok(None)
}

/// Runs one step; `Some(reason)` when the step itself could not complete.
fn execute_step<D: WorldDriver>(runner: &mut D, topology: &Topology, step: &Step) -> Result<Option<String>, Stop> {
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
                let trace = r.world().trace();
                let events = trace.events();
                let fresh = &events[cursor..];
                // Most steps add no event: nothing new to look at.
                if !fresh.is_empty() {
                    seen += crate::trace::count_matching(fresh, conditions);
                }
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
            let world = runner.world();
            let version = world.store.borrow_mut().seed(scope, key, value.clone());
            world.record(
                topology::DRIVER,
                EventKind::Commit { scope: scope.clone(), key: key.clone(), value: value.clone().into(), version },
            );
        }
        Step::Crash(host) => runner.crash(host),
        Step::Restart(host) => {
            // Back means registered again: a restarted engine waits for every host that is up, a
            // worker for its own functions.
            let since = runner.world().trace().events().len();
            let expected = topology.registered_after_restart(host, runner.crashed());
            runner.restart(host);
            let ready_ms_max = runner.ready_ms_max();
            let deadline = runner.now_ms().saturating_add(ready_ms_max);
            let mut registrations = Registrations::since(since, &expected);
            if runner.run_until(Some(deadline), |r| registrations.all_in(r.world()))? != WaitEnd::Met {
                let missing: Vec<&str> = expected.iter().map(String::as_str).collect();
                return Ok(Some(format!(
                    "`{host}` did not come back within {ready_ms_max} ms of its restart (waiting for {} to register)",
                    missing.join(", ")
                )));
            }
        }
        Step::Partition(a, b) => runner.partition(a, b),
        Step::Repair(a, b) => {
            runner.repair(a, b);
            if [a, b].iter().any(|host| host.as_str() == topology::DRIVER) {
                return wait_for_driver(runner);
            }
        }
        Step::Hold(a, b) => runner.hold(a, b),
        Step::Release(a, b) => runner.release(a, b),
        Step::Heal => runner.heal(),
        Step::Pause { host, ms } => {
            use crate::harness::ProcessControl;
            let until = runner.now_ms().saturating_add(*ms);
            runner.world().pause(host, until);
        }
    }
    Ok(None)
}

/// The simulation: simulated time, warped across quiet stretches, on turmoil's network.
impl WorldDriver for crate::sim::Runner {
    fn world(&self) -> &Rc<World> {
        &self.world
    }

    fn now_ms(&self) -> u64 {
        crate::sim::Runner::now_ms(self)
    }

    fn ready_ms_max(&self) -> u64 {
        crate::sim::READY_MS_MAX
    }

    fn driver_connected(&self) -> bool {
        crate::sim::Runner::driver_connected(self)
    }

    fn invoke(&mut self, call: DriverCall) {
        crate::sim::Runner::invoke(self, call);
    }

    fn run_until(&mut self, deadline_ms: Option<u64>, done: impl FnMut(&Self) -> bool) -> Result<WaitEnd, Stop> {
        crate::sim::Runner::run_until(self, deadline_ms, done)
    }

    fn skip_to(&mut self, at_ms: u64) -> Result<(), Stop> {
        crate::sim::Runner::skip_to(self, at_ms)
    }

    /// Settled means stalled: quiet, with no timer pending, so nothing can ever happen again.
    fn settle(&mut self, deadline_ms: u64) -> Result<bool, Stop> {
        Ok(crate::sim::Runner::run_until(self, Some(deadline_ms), |_| false)? == WaitEnd::Stalled)
    }

    fn crashed(&self) -> &BTreeSet<String> {
        crate::sim::Runner::crashed(self)
    }

    fn crash(&mut self, host: &str) {
        crate::sim::Runner::crash(self, host);
    }

    fn restart(&mut self, host: &str) {
        crate::sim::Runner::restart(self, host);
    }

    fn partition(&mut self, a: &str, b: &str) {
        crate::sim::Runner::partition(self, a, b);
    }

    fn repair(&mut self, a: &str, b: &str) {
        crate::sim::Runner::repair(self, a, b);
    }

    fn hold(&mut self, a: &str, b: &str) {
        crate::sim::Runner::hold(self, a, b);
    }

    fn release(&mut self, a: &str, b: &str) {
        crate::sim::Runner::release(self, a, b);
    }

    fn heal(&mut self) {
        crate::sim::Runner::heal(self);
    }
}
