//! What of a scenario can be run live, and at what speed.
//!
//! Live mode waits out every timing of a scenario in real time, and reaches into a harness only
//! through the bus. So a scenario is refused, with what stands in the way named, when it needs
//! something only the simulation can do (stop a worker at a point inside its code, pause its
//! process, hold bytes in flight), or when one of its timings is impractical in real time. An
//! explicit `--time-scale` multiplies every timing of the scenario; nothing is ever shortened
//! silently, and a scaled run says so.

use crate::expect::Expectation;
use crate::scenario::{Scenario, Step};
use crate::sim::NetworkConfig;
use crate::topology;

/// The longest a live run waits out any one scenario timing, in real milliseconds.
pub const WAIT_MS_MAX: u64 = 120_000;
/// The shortest deadline a harness is given live: below it, round trips on real sockets (and
/// a loaded machine) would decide the run rather than the scenario.
pub const DEADLINE_MS_MIN: u64 = 50;

/// A timer of the live clock may fire this share of the shortest deadline the harness is given
/// late, and the run still counts (see [`late_ms_max`]).
pub const LATE_SHARE: f64 = 0.5;
/// The bound on lateness is never tighter than this (a loaded machine's scheduling) ...
pub const LATE_MS_MIN: u64 = 10;
/// ... nor looser than this: a second of real time the world did not see is a run of its own.
pub const LATE_MS_CAP: u64 = 1_000;

/// How late (real milliseconds) a timer may fire in a run of `scenario` (its timings as the run
/// makes them, scaled) before the run is void: half the shortest timing that decides what
/// happens (a deadline the harness is given, a delay, a backoff, a visibility deadline, a lease;
/// not the limits a correct run stays inside, such as `liveness_ms`, nor a polling cadence),
/// between [`LATE_MS_MIN`] and [`LATE_MS_CAP`]. Two timings a scenario plays against each other
/// (a visibility deadline and a delay, say) differ by at least the shortest of them only in
/// general, but a stall of half of it leaves the other half: the verdict would otherwise be the
/// machine's, not the harness's. (Deadlines alone missed incident 001's redelivery: its second
/// delivery outlives the first turn by a 100 ms backoff, and a harness process 150 ms slow
/// under load turned it into a dead letter.)
pub fn late_ms_max(scenario: &Scenario) -> u64 {
    let shortest = timings(scenario)
        .iter()
        .filter(|t| t.kind != TimingKind::Bound && t.ms > 0)
        .map(|t| t.ms)
        .min()
        .unwrap_or(LATE_MS_CAP * 4);
    ((shortest as f64 * LATE_SHARE) as u64).clamp(LATE_MS_MIN, LATE_MS_CAP)
}

/// Whose the harness processes of a live run are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Processes {
    /// Someone else started them; they connect. The rig can drop their connections, no more.
    Connected,
    /// The rig starts them (`--spawn`): it can kill, restart, stop and continue them.
    Owned,
}

/// A scenario ready to run live, and what of it the real world does not honour.
pub struct LiveScenario {
    pub scenario: Scenario,
    /// Settings that mean nothing on real sockets (simulated latency), each in a sentence.
    pub ignored: Vec<String>,
}

/// A timing of a scenario: where it is written, how long, and what it is.
struct Timing {
    place: String,
    ms: u64,
    kind: TimingKind,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum TimingKind {
    /// Something the run may wait out in full, whose length decides what happens (a delay, a
    /// backoff, a visibility deadline, a lease).
    Wait,
    /// A limit the run may wait out in full, which a correct run stays well inside (the
    /// liveness bound, a step's `within_ms`), or a cadence (a queue's polling).
    Bound,
    /// A deadline a harness must meet on real sockets.
    Deadline,
}

/// Whether `time_scale` is one live mode can apply: a positive number.
pub fn check_time_scale(time_scale: f64) -> Result<(), String> {
    if time_scale.is_finite() && time_scale > 0.0 {
        Ok(())
    } else {
        Err(format!("--time-scale {time_scale}: expected a positive number (0.25 runs every timing 4x faster)"))
    }
}

/// Checks that `scenario` can run live with its harness `processes` and applies `time_scale`
/// (1 when not given; see [`check_time_scale`]) to every timing in it. When it cannot, why,
/// each reason a sentence saying what cannot be done live and what to do instead. Only the
/// expectations of `policy` (every policy's when `None`) decide whether a scale may apply: a
/// timed expectation of one policy does not stop another's run from being slowed.
pub fn prepare_live(
    scenario: &Scenario,
    policy: Option<&str>,
    time_scale: Option<f64>,
    processes: Processes,
) -> Result<LiveScenario, Vec<String>> {
    let scale = time_scale.unwrap_or(1.0);
    check_time_scale(scale).map_err(|why| vec![why])?;
    let unsupported = unsupported(scenario, processes);
    if !unsupported.is_empty() {
        return Err(unsupported);
    }
    if scale != 1.0 {
        if let Some(place) = timed_expectation(scenario, policy) {
            return Err(vec![format!(
                "{place} tests the time of an event, which --time-scale would move; run it unscaled"
            )]);
        }
    }
    let timings = timings(scenario);
    let too_long: Vec<&Timing> = timings.iter().filter(|t| scaled(t.ms, scale) > WAIT_MS_MAX).collect();
    if !too_long.is_empty() {
        let longest = too_long.iter().map(|t| t.ms).max().unwrap_or(WAIT_MS_MAX);
        let fits = WAIT_MS_MAX as f64 / longest as f64;
        let listed: Vec<String> =
            too_long.iter().map(|t| format!("{} = {} ms (live: {} ms)", t.place, t.ms, scaled(t.ms, scale))).collect();
        return Err(vec![format!(
            "timings impractical in real time (live mode waits them out, at most {WAIT_MS_MAX} ms each): {}; run with \
             --time-scale {} or less to scale every timing of the scenario, or shorten them in the file",
            listed.join(", "),
            floor_3(fits)
        )]);
    }
    let too_short: Vec<String> = timings
        .iter()
        .filter(|t| t.kind == TimingKind::Deadline && t.ms >= DEADLINE_MS_MIN && scaled(t.ms, scale) < DEADLINE_MS_MIN)
        .map(|t| format!("{} = {} ms becomes {} ms", t.place, t.ms, scaled(t.ms, scale)))
        .collect();
    if !too_short.is_empty() {
        return Err(vec![format!(
            "--time-scale {scale} makes deadlines shorter than live mode can keep on real sockets ({DEADLINE_MS_MIN} \
             ms): {}",
            too_short.join(", ")
        )]);
    }
    Ok(LiveScenario { scenario: scale_scenario(scenario, scale), ignored: ignored(scenario) })
}

/// What the scenario needs that live mode cannot do with `processes`, one sentence each.
fn unsupported(scenario: &Scenario, processes: Processes) -> Vec<String> {
    const OWN: &str = "which needs the rig to own the harness process: run with --spawn CMD";
    let owned = processes == Processes::Owned;
    let mut found = Vec::new();
    for (index, cut) in scenario.interrupts.iter().enumerate() {
        found.push(format!(
            "[[interrupt]] #{} ({} `{}` at `{}`) stops a harness worker at a point inside its own code, which a process \
             does not show from outside (its calls go through the engine; the point between them does not)",
            index + 1,
            cut.interrupt.name(),
            cut.worker,
            cut.point
        ));
    }
    for (index, cut) in scenario.cuts.iter().enumerate() {
        let why = match cut.fault {
            crate::cut::ServiceFault::PauseCaller { .. } if !owned => {
                format!("stops the calling worker's whole process for a while, {OWN}")
            }
            crate::cut::ServiceFault::IsolateCaller { .. } => {
                "cuts the calling worker off from the engine for a while \
                 and then repairs the link, which only the simulation's runner times; live, script it with `partition` \
                 and `repair` steps"
                    .to_string()
            }
            _ => continue,
        };
        found.push(format!("[[cut]] #{} ({} on `{}`) {why}", index + 1, cut.fault.name(), cut.function));
    }
    for (index, step) in scenario.steps.iter().enumerate() {
        let why = match step {
            Step::Pause { host, .. } if !owned => {
                format!("`pause = {{ host = \"{host}\", ... }}` stops a worker's whole process for a while, {OWN}")
            }
            Step::Hold(a, b) | Step::Release(a, b) => format!(
                "`{} = [\"{a}\", \"{b}\"]` holds a link's bytes in flight, which needs the simulated network; live mode \
                 can cut a link (`partition`) or delay frames (a `[[proxy.rule]]`)",
                if matches!(step, Step::Hold(..)) { "hold" } else { "release" }
            ),
            Step::Crash(host) | Step::Restart(host) if host == topology::PROXY => format!(
                "`{} = \"proxy\"`: live, the proxy is the rig's relay inside its engine and has no process of its own",
                if matches!(step, Step::Crash(..)) { "crash" } else { "restart" }
            ),
            _ => continue,
        };
        found.push(format!("step {}: {why}", index + 1));
    }
    found
}

/// An expectation or step condition on `at_ms`, which a time scale would move.
fn timed_expectation(scenario: &Scenario, policy: Option<&str>) -> Option<String> {
    let timed = |conditions: &[crate::condition::Condition]| conditions.iter().any(|c| c.path() == "at_ms");
    for run in scenario.runs.iter().filter(|run| policy.is_none_or(|policy| run.policy == policy)) {
        // A policy's own expectations too; and an event timed after another (`after`, `by_ms`)
        // is a time as much as `at_ms` is.
        for expectation in run.expectations.iter().chain(&run.particulars) {
            if let Expectation::Events(events) = expectation {
                if timed(&events.conditions) || events.after.is_some() {
                    return Some(format!("an `[[expect.events]]` entry of [policy.{}]", run.policy));
                }
            }
        }
    }
    scenario.steps.iter().enumerate().find_map(|(index, step)| match step {
        Step::WaitUntil { conditions, .. } if timed(conditions) => Some(format!("step {}", index + 1)),
        _ => None,
    })
}

/// Every timing of the scenario a live run may wait out or must meet.
fn timings(scenario: &Scenario) -> Vec<Timing> {
    let world = &scenario.world;
    let harness = &world.harness;
    let mut timings = Vec::new();
    let mut add = |place: String, ms: u64, kind: TimingKind| timings.push(Timing { place, ms, kind });
    add("[world] liveness_ms".into(), world.liveness_ms, TimingKind::Bound);
    add("[world] session_timeout_ms".into(), harness.session_timeout_ms, TimingKind::Deadline);
    add("[world] model_timeout_ms".into(), harness.model_timeout_ms, TimingKind::Deadline);
    add("[world] tool_timeout_ms".into(), harness.tool_timeout_ms, TimingKind::Deadline);
    add("[world] terminalize_backoff_ms".into(), harness.terminalize_backoff_ms, TimingKind::Wait);
    add("[world] handover_ms".into(), harness.handover_ms, TimingKind::Wait);
    add("[world] lease_ttl_ms".into(), harness.lease_ttl_ms, TimingKind::Wait);
    for (name, queue) in &world.queues {
        add(format!("[world.queue.{name}] timeout_ms"), queue.timeout_ms, TimingKind::Wait);
        add(format!("[world.queue.{name}] backoff_ms"), queue.backoff_ms, TimingKind::Wait);
        add(format!("[world.queue.{name}] poll_interval_ms"), queue.poll_interval_ms, TimingKind::Bound);
    }
    for (index, cut) in scenario.cuts.iter().enumerate() {
        match cut.fault {
            crate::cut::ServiceFault::Delay { ms } => {
                add(format!("[[cut]] #{} delay_ms", index + 1), ms, TimingKind::Wait)
            }
            crate::cut::ServiceFault::Outage { ms, .. } => {
                add(format!("[[cut]] #{} for_ms", index + 1), ms, TimingKind::Wait)
            }
            _ => {}
        }
    }
    for (index, rule) in scenario.proxy.iter().flat_map(|p| p.rules.iter()).enumerate() {
        if let Some(ms) = rule.delay_ms {
            add(format!("[[proxy.rule]] #{} delay_ms", index + 1), ms, TimingKind::Wait);
        }
    }
    for (index, step) in scenario.steps.iter().enumerate() {
        let place = |what: &str| format!("step {} {what}", index + 1);
        match step {
            Step::Invoke { call, .. } => add(place("timeout_ms"), call.timeout_ms, TimingKind::Bound),
            Step::Await { within_ms, .. } | Step::WaitUntil { within_ms, .. } => {
                add(place("within_ms"), *within_ms, TimingKind::Bound)
            }
            Step::WaitMs(ms) => add(place("wait_ms"), *ms, TimingKind::Wait),
            _ => {}
        }
    }
    timings
}

fn scaled(ms: u64, scale: f64) -> u64 {
    if scale == 1.0 {
        return ms;
    }
    // A timing that was there stays there: never scaled to nothing.
    ((ms as f64 * scale).round() as u64).max(u64::from(ms > 0))
}

/// The largest multiple of 0.001 not above `value`, for a suggestion that really fits.
fn floor_3(value: f64) -> f64 {
    (value * 1000.0).floor() / 1000.0
}

/// A copy of the scenario with every timing multiplied by `scale`.
fn scale_scenario(scenario: &Scenario, scale: f64) -> Scenario {
    let mut scenario = scenario.clone();
    if scale == 1.0 {
        return scenario;
    }
    let s = |ms: &mut u64| *ms = scaled(*ms, scale);
    let world = &mut scenario.world;
    s(&mut world.liveness_ms);
    s(&mut world.network.duration_ms_max);
    let harness = &mut world.harness;
    for ms in [
        &mut harness.session_timeout_ms,
        &mut harness.model_timeout_ms,
        &mut harness.tool_timeout_ms,
        &mut harness.terminalize_backoff_ms,
        &mut harness.settle_within_ms,
        &mut harness.handover_ms,
        &mut harness.lease_ttl_ms,
    ] {
        s(ms);
    }
    for tool in &mut harness.tools {
        s(&mut tool.idempotency_window_ms);
    }
    if let Some(tickets) = &mut world.services.tickets {
        s(&mut tickets.idempotency_window_ms);
    }
    for service in world.services.declared.values_mut() {
        s(&mut service.idempotency_window_ms);
    }
    for (_, queue) in &mut world.queues {
        s(&mut queue.timeout_ms);
        s(&mut queue.backoff_ms);
        s(&mut queue.poll_interval_ms);
    }
    for cut in &mut scenario.cuts {
        if let crate::cut::ServiceFault::Delay { ms } | crate::cut::ServiceFault::Outage { ms, .. } = &mut cut.fault {
            s(ms);
        }
    }
    for rule in scenario.proxy.iter_mut().flat_map(|p| p.rules.iter_mut()) {
        if let Some(ms) = &mut rule.delay_ms {
            s(ms);
        }
    }
    for step in &mut scenario.steps {
        match step {
            Step::Invoke { call, .. } => s(&mut call.timeout_ms),
            Step::Await { within_ms, .. } | Step::WaitUntil { within_ms, .. } => s(within_ms),
            Step::WaitMs(ms) => s(ms),
            _ => {}
        }
    }
    scenario
}

/// Network settings of the simulation that a real network does not honour.
fn ignored(scenario: &Scenario) -> Vec<String> {
    let network = &scenario.world.network;
    let default = NetworkConfig::default();
    let mut ignored = Vec::new();
    if (network.latency_ms_min, network.latency_ms_max) != (default.latency_ms_min, default.latency_ms_max) {
        ignored.push(format!(
            "latency_ms_min/max ({}..{} ms) are not applied: the network is real loopback",
            network.latency_ms_min, network.latency_ms_max
        ));
    }
    if network.harness_restart_ms != default.harness_restart_ms {
        ignored.push(format!(
            "harness_restart_ms ({} ms) is not applied: a restarted harness process takes the time it takes, which \
             the report gives for each restart",
            network.harness_restart_ms
        ));
    }
    if network.tick_ms != default.tick_ms {
        ignored.push(format!("tick_ms ({} ms) is not applied: time is real", network.tick_ms));
    }
    ignored
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn scenario(text: &str) -> Scenario {
        Scenario::parse(Path::new("live.toml"), text).expect("a valid scenario")
    }

    const TURN: &str = "[[step]]\ninvoke = { function = \"harness::turn\", payload = { session_id = \"s1\" } }\n";

    #[test]
    fn steps_only_the_simulation_can_do_are_refused_by_name() {
        let paused =
            scenario(&format!("{TURN}[[step]]\npause = {{ host = \"harness\", ms = 100 }}\n[policy.reference]\n"));
        let error = prepare_live(&paused, None, None, Processes::Connected).err().expect("refused").join("\n");
        assert!(error.contains("step 2") && error.contains("pause"), "{error}");
        let pause_caller = scenario(&format!(
            "{TURN}[[cut]]\nfunction = \"state::set\"\naction = \"pause-caller\"\npause_ms = 100\n[policy.reference]\n"
        ));
        let error = prepare_live(&pause_caller, None, None, Processes::Connected).err().expect("refused").join("\n");
        assert!(error.contains("[[cut]] #1 (pause-caller on `state::set`)"), "{error}");
        let isolate_caller = scenario(&format!(
            "{TURN}[[cut]]\nfunction = \"state::set\"\naction = \"isolate-caller\"\nisolate_ms = 100\n[policy.reference]\n"
        ));
        let error = prepare_live(&isolate_caller, None, None, Processes::Connected).err().expect("refused").join("\n");
        assert!(
            error.contains("[[cut]] #1 (isolate-caller on `state::set`)") && error.contains("partition"),
            "{error}"
        );
    }

    #[test]
    fn pauses_of_a_harness_process_run_when_the_rig_owns_it() {
        let paused =
            scenario(&format!("{TURN}[[step]]\npause = {{ host = \"harness\", ms = 100 }}\n[policy.reference]\n"));
        let error = prepare_live(&paused, None, None, Processes::Connected).err().expect("refused").join("\n");
        assert!(error.contains("--spawn"), "{error}");
        assert!(prepare_live(&paused, None, None, Processes::Owned).is_ok());
        let pause_caller = scenario(&format!(
            "{TURN}[[cut]]\nfunction = \"state::set\"\naction = \"pause-caller\"\npause_ms = 100\n[policy.reference]\n"
        ));
        assert!(prepare_live(&pause_caller, None, None, Processes::Owned).is_ok());
    }

    #[test]
    fn a_timed_expectation_stops_a_scale_for_its_own_policy_only() {
        let timed = scenario(&format!(
            "{TURN}[expect]\ncalls = {{ \"model::generate\" = 1 }}\n[policy.reference]\nexpect.events = [\n  {{ match = \
             {{ kind = \"commit\", at_ms = {{ le = 500 }} }}, count_min = 1 }},\n]\n[policy.swallow]\nviolations = \
             [\"liveness\"]\nexpect.calls = {{ \"model::generate\" = 0 }}\n"
        ));
        let error =
            prepare_live(&timed, Some("reference"), Some(2.0), Processes::Owned).err().expect("refused").join("\n");
        assert!(error.contains("[policy.reference]") && error.contains("run it unscaled"), "{error}");
        assert!(prepare_live(&timed, None, Some(2.0), Processes::Owned).is_err(), "every policy's expectations count");
        let swallow =
            prepare_live(&timed, Some("swallow"), Some(2.0), Processes::Owned).expect("another policy scales");
        assert_eq!(swallow.scenario.world.liveness_ms, timed.world.liveness_ms * 2);
        assert!(prepare_live(&timed, Some("reference"), None, Processes::Owned).is_ok(), "unscaled, it runs");
    }

    #[test]
    fn impractical_timings_are_refused_unless_scaled_and_a_scale_is_applied_everywhere() {
        let slow =
            scenario(&format!("[world]\nliveness_ms = 600000\nsession_timeout_ms = 1000\n{TURN}[policy.reference]\n"));
        let error = prepare_live(&slow, None, None, Processes::Connected).err().expect("refused").join("\n");
        assert!(error.contains("liveness_ms = 600000") && error.contains("--time-scale 0.2"), "{error}");
        let scaled = prepare_live(&slow, None, Some(0.1), Processes::Connected).expect("fits when scaled").scenario;
        assert_eq!((scaled.world.liveness_ms, scaled.world.harness.session_timeout_ms), (60_000, 100));
        let Step::Invoke { call, .. } = &scaled.steps[0] else { panic!("an invoke") };
        assert_eq!(call.timeout_ms, 1_000, "the invoke's default 10 s deadline is scaled too");
        let error =
            prepare_live(&slow, None, Some(0.01), Processes::Connected).err().expect("deadlines too short").join("\n");
        assert!(error.contains("session_timeout_ms = 1000 ms becomes 10 ms"), "{error}");
    }
}
