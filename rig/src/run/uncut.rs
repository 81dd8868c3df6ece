//! The uncut run of a workload (see [`crate::recovery`]): the scenario with its scripted faults
//! taken out, run when something needs it and remembered.
//!
//! **When it is run.** Only when a verdict depends on it: `recovery-cost` needs it when the run
//! repeated more work than the allowance ([`crate::recovery::Recovery::needs_uncut`]); a run
//! whose own repeats are within the bound passes whatever its uncut run did. A run with no
//! scripted faults is its own uncut run, and one whose every step completed is remembered as the
//! uncut run of its workload (an uncut run goes on past a step that cannot complete, a judged
//! run does not: after such a step the two differ). So a sweep or an exploration, whose every
//! placement shares one seed's uncut run with the workload's own run, never simulates it again.
//!
//! **What it remembers.** Per (harness, policy, seed, workload) an [`UncutRun`]: its work
//! ([`Measured`], for `recovery-cost`) and its outcome ([`UncutOutcome`]: what the workload came
//! to without the faults, for an oracle that judges a run's outcome against it). The workload is
//! everything the simulation depends on: the world, the script's steps and the proxy's place,
//! not the cuts, interrupts and proxy rules (taken out), the expectations or the file's name, so
//! two files that script different faults on one workload share its uncut run; and not the step
//! mode (`tick_idle_hosts`), which changes no outcome.
//!
//! **How long.** The memory is the process's, bounded ([`REMEMBERED_MAX`] runs; it starts over
//! when full). [`forget`] empties it: `rig bench` starts each pass cold with it, so a figure never
//! depends on what an earlier pass left behind.
//!
//! For an outcome oracle (issue 39): `run::uncut_run` gives a run's [`UncutRun`], simulating it
//! on the first call for its workload and seed.

use crate::layout::RecordLayout;
use crate::recovery::Measured;
use crate::scenario::{Scenario, WorldSetup};
use crate::sim::NetworkConfig;
use crate::trace::{Event, EventKind};
use doubles::{SessionService, StateStore};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::hash::Hasher;
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
    pub outcome: UncutOutcome,
}

/// What an uncut run came to, read from what the services saw (the store, its commits, the
/// ledger, the session service), through the harness's record layout: the outcome a run of the
/// same workload with faults is held to, where faults may delay an outcome but not change it.
#[derive(Debug, Clone, Default)]
pub struct UncutOutcome {
    /// Every turn the store recorded, by turn id: the session it belongs to (its record's key)
    /// and the status of the last record committed for it.
    pub turns: BTreeMap<String, TurnEnd>,
    /// The store as the run left it: every record's last value, by (scope, key).
    pub store: BTreeMap<(String, String), serde_json::Value>,
    /// The effect ledger: every request for an external effect and what became of it, in order
    /// (the trace's `effect` events).
    pub ledger: Vec<Event>,
    /// Accepted effects per action id, from every effect service's ledger.
    pub effects: BTreeMap<String, u64>,
    /// Queued input: every key the input scope held, with the turns it was admitted into (turn
    /// ids, in commit order; empty when never admitted). Empty when the layout has no input scope.
    pub inputs: BTreeMap<String, Vec<String>>,
    /// The session service as the run left it: every session's transcript (the final answer is
    /// in it), read with [`SessionService::entries`].
    pub sessions: SessionService,
    /// Whether the run settled into quiescence, rather than running into its bound.
    pub quiescent: bool,
}

/// How one turn ended in an uncut run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TurnEnd {
    pub session: String,
    pub status: String,
}

impl UncutOutcome {
    /// The outcome of a finished run from its trace, its store and its session service.
    pub(crate) fn of(
        events: &[Event],
        store: &StateStore,
        sessions: &SessionService,
        layout: &RecordLayout,
        quiescent: bool,
    ) -> Self {
        let store = store.records().map(|(scope, key, value)| ((scope.to_string(), key.to_string()), value.clone()));
        let mut outcome =
            UncutOutcome { store: store.collect(), sessions: sessions.clone(), quiescent, ..UncutOutcome::default() };
        for event in events {
            match &event.kind {
                EventKind::Commit { scope, key, value, .. } if !value.is_null() => {
                    if *scope == layout.turn_scope {
                        let turn = layout.turn_id(value).to_string();
                        let admitted = layout.input_keys_field.as_ref().and_then(|field| value[field].as_array());
                        for input in admitted.into_iter().flatten().filter_map(|k| k.as_str()) {
                            let turns = outcome.inputs.entry(input.to_string()).or_default();
                            if !turns.contains(&turn) {
                                turns.push(turn.clone());
                            }
                        }
                        let end = TurnEnd { session: key.clone(), status: layout.status(value).to_string() };
                        outcome.turns.insert(turn, end);
                    } else if layout.input_scope.as_ref() == Some(scope) {
                        outcome.inputs.entry(key.clone()).or_default();
                    }
                }
                EventKind::Effect { action, accepted, .. } => {
                    if *accepted {
                        *outcome.effects.entry(action.clone()).or_default() += 1;
                    }
                    outcome.ledger.push(event.clone());
                }
                _ => {}
            }
        }
        outcome
    }
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

/// Two hashers fed the same text, with different salts.
struct Digest(std::collections::hash_map::DefaultHasher, std::collections::hash_map::DefaultHasher);

impl std::fmt::Write for Digest {
    fn write_str(&mut self, text: &str) -> std::fmt::Result {
        self.0.write(text.as_bytes());
        self.1.write(text.as_bytes());
        Ok(())
    }
}

/// The key of the uncut run of `scenario`'s workload under `harness`, `policy` and `seed`: what
/// the simulation depends on, written into the digests as it is formatted (no copy of the
/// scenario, no text kept).
pub(super) fn key(harness: &str, policy: &str, seed: u64, scenario: &Scenario) -> Key {
    let mut digest = Digest(Default::default(), Default::default());
    digest.0.write_u8(1);
    digest.1.write_u8(2);
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
        digest,
        "{harness}\u{0}{policy}\u{0}{seed}\u{0}{config:?}{tick_ms},{latency_ms_min},{latency_ms_max},{duration_ms_max},\
         {steps_max},{harness_restart_ms}\u{0}{liveness_ms}{records:?}{messages:?}{model:?}{model_deterministic}{queues:?}{services:?}\
         {replacement}\u{0}{proxy:?}\u{0}{:?}",
        scenario.steps
    );
    Key(digest.0.finish(), digest.1.finish())
}

type Remembered = Mutex<BTreeMap<Key, Arc<UncutRun>>>;

fn remembered() -> &'static Remembered {
    static REMEMBERED: std::sync::OnceLock<Remembered> = std::sync::OnceLock::new();
    REMEMBERED.get_or_init(Remembered::default)
}

/// The uncut run under `key`, if one was remembered.
pub(super) fn recall(key: Key) -> Option<Arc<UncutRun>> {
    remembered().lock().expect("the memory of uncut runs").get(&key).cloned()
}

/// Remembers `run` as the uncut run under `key`.
pub(super) fn remember(key: Key, run: Arc<UncutRun>) {
    let mut memory = remembered().lock().expect("the memory of uncut runs");
    if memory.len() >= REMEMBERED_MAX && !memory.contains_key(&key) {
        memory.clear();
    }
    memory.insert(key, run);
}

/// Forgets every uncut run, and the tally of those simulated: what comes next starts cold.
pub fn forget() {
    remembered().lock().expect("the memory of uncut runs").clear();
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
        let outcome = &made.outcome;
        // What the workload comes to without the cut, by its own expectations: the turn
        // completed, two tickets, the transcript ends with the model's final text.
        assert_eq!(outcome.turns["t1"], TurnEnd { session: "s1".into(), status: "completed".into() });
        assert_eq!(outcome.store[&("harness_turn".to_string(), "s1".to_string())]["status"], "completed");
        assert_eq!(
            outcome.ledger.iter().filter(|e| matches!(e.kind, EventKind::Effect { accepted: true, .. })).count(),
            2
        );
        assert_eq!(outcome.effects.values().sum::<u64>(), 2);
        let transcript = format!("{:?}", outcome.sessions.entries("s1"));
        assert!(transcript.contains("Both tickets are open."), "{transcript}");
        assert!(outcome.quiescent);
        // The bare file's judged run completed every step: it is the same run, so it can stand
        // for the uncut run the memory keeps (the memory relies on this).
        let (world, ended, failures) =
            crate::run::simulate(&harness, &bare, "reference", 5, crate::run::Simulation::Judged);
        assert!(failures.is_empty() && ended.settled.steps_completed, "{failures:?}");
        let judged = crate::run::uncut_of(&harness, &bare, &world, &ended.settled);
        assert_eq!(format!("{:?}", judged.outcome), format!("{outcome:?}"));
        assert_eq!(judged.work, made.work);
        // A correct harness's run with the cut comes to the same end by another way: the same
        // turn ends and accepted effects, after a fault the uncut run never saw.
        let (world, ended, _) =
            crate::run::simulate(&harness, &faulted, "reference", 5, crate::run::Simulation::Judged);
        let own = crate::run::uncut_of(&harness, &faulted, &world, &ended.settled);
        assert_eq!((&own.outcome.turns, &own.outcome.effects), (&outcome.turns, &outcome.effects));
        assert!(crate::recovery::faults(world.trace().events()) > 0, "the cut fired");
    }
}
