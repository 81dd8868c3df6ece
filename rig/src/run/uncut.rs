//! The uncut run of a workload (see [`crate::recovery`]): the scenario with its scripted faults
//! taken out, run once and remembered. The uncut run is deterministic, so it is remembered per
//! (harness, policy, seed, workload): the two runs of a determinism check, and every placement a
//! sweep or exploration tries on one seed, share one.

use crate::harness::HarnessFactory;
use crate::recovery::Measured;
use crate::scenario::Scenario;
use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex};

/// The most uncut runs remembered at once; the memory starts over when it is full.
const REMEMBERED_MAX: usize = 4096;

/// The scenario with its scripted faults taken out, or `None` when it has none (a run of it is
/// its own uncut run).
pub(super) fn uncut(scenario: &Scenario) -> Option<Scenario> {
    let rules = scenario.proxy.as_ref().is_some_and(|p| !p.rules.is_empty());
    if scenario.cuts.is_empty() && scenario.interrupts.is_empty() && !rules {
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

type Remembered = Mutex<BTreeMap<(u64, u64), Measured>>;

fn remembered() -> &'static Remembered {
    static REMEMBERED: std::sync::OnceLock<Remembered> = std::sync::OnceLock::new();
    REMEMBERED.get_or_init(Remembered::default)
}

/// A key for one uncut run: two independent 64-bit digests of everything it depends on (the
/// scenario as loaded, the step mode left out: it changes no outcome).
fn key(harness: &str, policy: &str, seed: u64, uncut: &Scenario) -> (u64, u64) {
    let mut normalised = uncut.clone();
    normalised.world.network.tick_idle_hosts = false;
    let text = format!("{harness}\u{0}{policy}\u{0}{seed}\u{0}{normalised:?}");
    let digest = |salt: u8| {
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        salt.hash(&mut hasher);
        text.hash(&mut hasher);
        hasher.finish()
    };
    (digest(1), digest(2))
}

/// The work of `uncut`'s run (see [`uncut`]), run through `simulate` the first time it is
/// asked for and remembered after.
pub(super) fn uncut_work(
    harness: &Arc<dyn HarnessFactory>,
    uncut: &Scenario,
    policy: &str,
    seed: u64,
    simulate: impl FnOnce() -> Measured,
) -> Measured {
    let key = key(harness.name(), policy, seed, uncut);
    if let Some(work) = remembered().lock().expect("the memory of uncut runs").get(&key) {
        return *work;
    }
    let work = simulate();
    let mut memory = remembered().lock().expect("the memory of uncut runs");
    if memory.len() >= REMEMBERED_MAX {
        memory.clear();
    }
    memory.insert(key, work);
    work
}
