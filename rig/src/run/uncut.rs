//! The uncut run of a workload (see [`crate::recovery`]): the scenario with its scripted faults
//! taken out, run when something needs it and remembered.
//!
//! **When it is run.** Only when a verdict depends on it: the `outcome` oracle needs the one at
//! the canonical seed (`run::CANONICAL_UNCUT_SEED`) for every run in which a fault fired (but in
//! a file whose outcome depends on its faults by design), and the one at the run's own seed when
//! the canonical one finds a difference; `recovery-cost` needs it when the run repeated more work than the allowance
//! ([`crate::recovery::Recovery::needs_uncut`]; a run whose own repeats are within the bound
//! passes whatever its uncut run did, and its report leaves the uncut figures out). A run with no
//! scripted faults is its own uncut run, and one whose every step completed is remembered as the
//! uncut run of its workload (an uncut run goes on past a step that cannot complete, a judged
//! run does not: after such a step the two differ). So a sweep or an exploration, whose every
//! placement shares one seed's uncut run with the workload's own run, never simulates it again.
//!
//! **What it remembers.** Per (harness, policy, seed, workload) an [`UncutRun`]: its work
//! ([`Measured`], for `recovery-cost`) and its outcome ([`Outcome`]: what the workload came to
//! without the faults, which the `outcome` oracle holds a run with faults to). The workload is
//! everything the simulation depends on: the world, the script's steps and the proxy's place,
//! not the cuts, interrupts and proxy rules (taken out), the expectations or the file's name, so
//! two files that script different faults on one workload share its uncut run; and not the step
//! mode (`tick_idle_hosts`), which changes no outcome.
//!
//! **How long.** The memory is the process's, bounded ([`REMEMBERED_MAX`] runs, and apart from
//! them [`CANONICAL_MAX`] at the canonical seed; each starts over when full). [`forget`] empties it: `rig bench` starts each pass cold with it, so a figure never
//! depends on what an earlier pass left behind.
//!
//! `run::uncut_run` gives a run's [`UncutRun`], simulating it on the first call for its workload
//! and seed.

use crate::oracle::Outcome;
use crate::recovery::Measured;
use crate::scenario::{Scenario, WorldSetup};
use crate::sim::NetworkConfig;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::hash::{DefaultHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// The most uncut runs remembered at once; the memory starts over when it is full. Enough for a
/// sweep's or an exploration's placements of one workload over a few hundred seeds, which find
/// their workload's uncut run from moments before; at 1,024 the memory of a catalogue pass (most
/// of whose runs have no fault and are remembered, each with its transcripts and store) raised
/// the peak memory by 14 MiB, to half as much again as before it.
pub const REMEMBERED_MAX: usize = 256;

/// One uncut run of a workload: its work and what it came to.
#[derive(Debug, Clone)]
pub struct UncutRun {
    pub work: Measured,
    /// What it came to, for the `outcome` oracle: faults may delay an outcome, never change it.
    pub outcome: Outcome,
}

/// The scenario with its scripted faults taken out, or `None` when it has none (a run of it is
/// its own uncut run).
pub(super) fn uncut(scenario: &Scenario) -> Option<Scenario> {
    if !has_faults(scenario) {
        return None;
    }
    let mut uncut = scenario.clone();
    uncut.cuts.clear();
    uncut.interrupts.clear();
    if let Some(proxy) = &mut uncut.proxy {
        proxy.rules.clear();
        proxy.optional.clear();
    }
    Some(uncut)
}

/// Whether the scenario scripts any fault: a cut, an interrupt or a proxy rule.
pub(super) fn has_faults(scenario: &Scenario) -> bool {
    let rules = scenario.proxy.as_ref().is_some_and(|p| !p.rules.is_empty());
    !scenario.cuts.is_empty() || !scenario.interrupts.is_empty() || rules
}

/// Which uncut run: two independent 64-bit digests of everything it depends on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct Key(u64, u64);

/// Two independent 64-bit digests of the scenario's workload, with different salts.
fn workload_digest(scenario: &Scenario) -> (u64, u64) {
    let mut text = String::new();
    write_workload(&mut text, scenario);
    let mut digests = (DefaultHasher::new(), DefaultHasher::new());
    digests.0.write_u8(1);
    digests.1.write_u8(2);
    digests.0.write(text.as_bytes());
    digests.1.write(text.as_bytes());
    (digests.0.finish(), digests.1.finish())
}

/// Keeps the workload digest of each scenario with it (see [`crate::scenario::WorkloadDigest`]),
/// for a command that runs the files as it loaded them: the binding that holds them is not
/// mutable, so nothing changes them from now on.
pub(crate) fn keep_workload_digests(scenarios: &[Scenario]) {
    for scenario in scenarios {
        scenario.workload_digest.0.get_or_init(|| workload_digest(scenario));
    }
}

/// The key of the uncut run of `scenario`'s workload under `harness`, `policy` and `seed`: the
/// workload's digest (kept with the scenario, or made now) with the three digested again, twice
/// (no copy of the scenario).
pub(super) fn key(harness: &str, policy: &str, seed: u64, scenario: &Scenario) -> Key {
    let workload = match scenario.workload_digest.0.get() {
        Some(&kept) => {
            debug_assert_eq!(kept, workload_digest(scenario), "a scenario changed after its digest was kept");
            kept
        }
        None => workload_digest(scenario),
    };
    let digest = |salt: u8, workload: u64| {
        let mut digest = DefaultHasher::new();
        digest.write_u8(salt);
        // Each text ends with a zero byte, which no name holds: "ab" + "c" is not "a" + "bc".
        for text in [harness, policy] {
            digest.write(text.as_bytes());
            digest.write_u8(0);
        }
        digest.write_u64(seed);
        digest.write_u64(workload);
        digest.finish()
    };
    Key(digest(1, workload.0), digest(2, workload.1))
}

/// Writes everything of the scenario the uncut run depends on into `text` (the harness, the
/// policy and the seed are [`key`]'s).
fn write_workload(text: &mut String, scenario: &Scenario) {
    // Every field by name, so a new one is a compile error here until it is placed: in the key
    // (it changes the simulation) or left out with the reason.
    let WorldSetup {
        harness: config,
        network,
        liveness_ms,
        effects_per_action_max: _, // judging only
        recovery_per_fault_max: _, // judging only
        records,
        messages,
        model,
        model_deterministic,
        queues,
        services,
        replacement,
    } = &scenario.world;
    let NetworkConfig {
        tick_ms,
        latency_ms_min,
        latency_ms_max,
        duration_ms_max,
        steps_max,
        tick_idle_hosts: _,
        harness_restart_ms,
    } = network;
    let proxy = scenario.proxy.as_ref().map(|p| &p.worker);
    let _ = write!(
        text,
        "{config:?}{tick_ms},{latency_ms_min},{latency_ms_max},{duration_ms_max},\
         {steps_max},{harness_restart_ms}\u{0}{liveness_ms}{records:?}{messages:?}{model:?}{model_deterministic}{queues:?}{services:?}\
         {replacement}\u{0}{proxy:?}\u{0}{:?}",
        scenario.steps
    );
}

/// The memory: uncut runs at the canonical seed (`run::CANONICAL_UNCUT_SEED`) apart from the
/// others, so that a catalogue pass, which reads one per file and policy for every seed and
/// remembers a run of every file with no faults, never pushes them out.
#[derive(Default)]
struct Memory {
    canonical: BTreeMap<Key, Arc<UncutRun>>,
    others: BTreeMap<Key, Arc<UncutRun>>,
}

impl Memory {
    fn part(&mut self, canonical: bool) -> (&mut BTreeMap<Key, Arc<UncutRun>>, usize) {
        if canonical {
            (&mut self.canonical, CANONICAL_MAX)
        } else {
            (&mut self.others, REMEMBERED_MAX)
        }
    }
}

/// The most canonical uncut runs remembered at once: one per workload and policy (a few hundred
/// in the shipped catalogue), each only its outcome and work.
pub const CANONICAL_MAX: usize = 4096;

fn remembered() -> &'static Mutex<Memory> {
    static REMEMBERED: std::sync::OnceLock<Mutex<Memory>> = std::sync::OnceLock::new();
    REMEMBERED.get_or_init(Mutex::default)
}

/// The uncut run under `key`, if one was remembered (`canonical`: at the canonical seed).
pub(super) fn recall(key: Key, canonical: bool) -> Option<Arc<UncutRun>> {
    remembered().lock().expect("the memory of uncut runs").part(canonical).0.get(&key).cloned()
}

/// Remembers `run` as the uncut run under `key` (`canonical`: at the canonical seed).
pub(super) fn remember(key: Key, canonical: bool, run: Arc<UncutRun>) {
    let mut memory = remembered().lock().expect("the memory of uncut runs");
    let (memory, max) = memory.part(canonical);
    if memory.len() >= max && !memory.contains_key(&key) {
        memory.clear();
    }
    memory.insert(key, run);
}

/// Forgets every uncut run, and the tally of those simulated: what comes next starts cold.
pub fn forget() {
    *remembered().lock().expect("the memory of uncut runs") = Memory::default();
    SIMULATED.store(0, Ordering::Relaxed);
    SIMULATED_NS.store(0, Ordering::Relaxed);
}

/// Uncut runs simulated since the last [`forget`], and the CPU time they took (nanoseconds):
/// `rig bench` reports their share of the time.
static SIMULATED: AtomicU64 = AtomicU64::new(0);
static SIMULATED_NS: AtomicU64 = AtomicU64::new(0);

pub(super) fn count_simulated(cpu_ns: u64) {
    SIMULATED.fetch_add(1, Ordering::Relaxed);
    SIMULATED_NS.fetch_add(cpu_ns, Ordering::Relaxed);
}

/// How many uncut runs were simulated since the last [`forget`], and their CPU time in
/// nanoseconds (0 where the platform cannot tell).
pub fn tally() -> (u64, u64) {
    (SIMULATED.load(Ordering::Relaxed), SIMULATED_NS.load(Ordering::Relaxed))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn scenario(text: &str) -> Scenario {
        Scenario::parse(Path::new("t.toml"), text).expect("a valid scenario")
    }

    const WORKLOAD: &str = r#"
[[world.record]]
scope = "harness_turn"
key = "s1"
value = { session_id = "s1", turn_id = "t1", status = "running", step = 1, turn_count = 1 }

[[step]]
invoke = { function = "harness::turn", payload = { session_id = "s1", turn_id = "t1", step = 1 }, name = "turn" }

[policy.reference]
"#;

    #[test]
    fn the_key_is_the_workload_not_its_faults_expectations_or_name() {
        let bare = scenario(WORKLOAD);
        let cut = format!(
            "about = \"x\"\n[[cut]]\nfunction = \"session::messages\"\naction = \"timeout\"\n{WORKLOAD}\n[expect]\neffects = {{}}\n"
        );
        let mut cut = scenario(&cut);
        cut.path = "elsewhere.toml".into();
        let key = |s: &Scenario| super::key("reference", "reference", 3, s);
        assert_eq!(key(&bare), key(&cut), "the cuts, the expectations and the file's name are not the workload");
        let mut stepped = bare.clone();
        stepped.world.network.tick_idle_hosts = true;
        assert_eq!(key(&bare), key(&stepped), "the step mode changes no outcome");
        let mut later = bare.clone();
        later.world.liveness_ms += 1;
        assert_ne!(key(&bare), key(&later));
        let mut fewer = bare.clone();
        fewer.steps.clear();
        assert_ne!(key(&bare), key(&fewer));
        assert_ne!(key(&bare), super::key("reference", "reference", 4, &bare), "the seed");
        assert_ne!(key(&bare), super::key("reference", "swallow", 3, &bare), "the policy");
        assert_ne!(key(&bare), super::key("other", "reference", 3, &bare), "the harness");
        assert!(!has_faults(&bare) && has_faults(&cut));
        assert!(uncut(&bare).is_none());
        assert!(!has_faults(&uncut(&cut).expect("it has a cut")));
    }

    /// The shipped sweep workload, bare and with a cut that loses a ticket acknowledgement.
    fn multi_round() -> (Scenario, Scenario) {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scenarios/workloads/multi-round.toml");
        let text = std::fs::read_to_string(&path).expect("the shipped workload");
        let cut = "[[cut]]\nfunction = \"ticket::create\"\naction = \"lost-ack\"\n";
        let (bare, faulted) = (scenario(&text), scenario(&format!("{text}\n{cut}")));
        assert!(!has_faults(&bare) && has_faults(&faulted));
        (bare, faulted)
    }

    #[test]
    fn the_uncut_run_keeps_the_workloads_outcome_and_a_bare_run_that_completed_is_that_run() {
        let harness = crate::run::reference();
        let (bare, faulted) = multi_round();
        let made = crate::run::uncut_run(&harness, &faulted, "reference", 5).expect("the file scripts a fault");
        let outcome = &made.outcome.sessions["s1"];
        // What the workload comes to without the cut, by its own expectations: the turn
        // completed, two tickets, the transcript ends with the model's final text.
        let ends: Vec<(&str, &str)> = outcome.turns.iter().map(|t| (t.turn_id.as_str(), t.status.as_str())).collect();
        assert_eq!(ends, [("t1", "completed")]);
        assert_eq!(outcome.effects.values().sum::<u64>(), 2);
        assert_eq!(outcome.answers.last().map(String::as_str), Some("Both tickets are open."));
        // The bare file's judged run completed every step: it is the same run, so it can stand
        // for the uncut run the memory keeps (the memory relies on this).
        let (world, ended, failures) =
            crate::run::simulate(&harness, &bare, "reference", 5, crate::run::Simulation::Judged);
        assert!(failures.is_empty() && ended.settled.steps_completed, "{failures:?}");
        let judged = crate::run::uncut_of(&harness, &bare, &world);
        assert_eq!(judged.outcome, made.outcome);
        assert_eq!(judged.work, made.work);
        // A correct harness's run with the cut comes to the same end by another way, after a
        // fault the uncut run never saw.
        let (world, _, _) = crate::run::simulate(&harness, &faulted, "reference", 5, crate::run::Simulation::Judged);
        let own = crate::run::uncut_of(&harness, &faulted, &world);
        assert_eq!(own.outcome, made.outcome);
        assert!(crate::recovery::faults(world.trace().events()) > 0, "the cut fired");
    }
}
