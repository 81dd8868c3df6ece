//! `rig explore`: swarm testing. Each seed draws a fault mix from the cut space (which kinds of
//! cut are enabled at all, how many cuts, which places, which timings) from a stream of its own,
//! runs it, and shrinks a failure: first to the cuts that fired, then by removing cuts one at a
//! time, then the workload's steps, while the same oracle still fires. The same seed always
//! draws the same mix, so `rig explore FILE --seed N` replays it bit for bit.

use super::space::{outage_bound_ms, Kind, Placement, SpaceOptions};
use super::state::{Abstraction, Coverage, Novelty, Trajectory};
use super::{
    bare_run, finding, fired, fired_beyond, run_placed, run_placed_at, runnable_space, without_steps, workload,
    Finding, Found, Runs, Signature,
};
use crate::capability::Skip;
use crate::run::RunOutcome;
use crate::scenario::Scenario;
use crate::streams::component_stream;
use rand::Rng;
use std::collections::{BTreeMap, BTreeSet};

/// The most cuts one seed's mix holds.
pub const MIX_CUTS_MAX: usize = 4;

/// What one seed of exploration did and found.
#[derive(Debug, Clone)]
pub struct Exploration {
    pub seed: u64,
    /// The fault mix the seed drew.
    pub mix: Vec<Placement>,
    /// Oracles the mix made fire beyond the uncut run's violations (see [`super::fired_beyond`]).
    pub fired: BTreeSet<String>,
    /// Oracles the uncut run itself trips: a finding of the workload, not of any mix.
    pub uncut_fired: BTreeSet<String>,
    /// The failure, shrunk, as a scenario file.
    pub shrunk: Option<Finding>,
    /// Runs made, the uncut one and the shrinking ones included.
    pub runs: usize,
    /// The abstract states the uncut run went through, and the mix's run (empty if it made
    /// none).
    pub uncut_trajectory: Trajectory,
    pub trajectory: Trajectory,
}

/// Draws a fault mix for `seed` from `space`.
pub(super) fn draw(seed: u64, space: &[Placement], workload: &Scenario) -> Vec<Placement> {
    let mut rng = component_stream(seed, "explore");
    let mut enabled: Vec<Kind> = Kind::ALL.into_iter().filter(|_| rng.random_bool(0.5)).collect();
    if enabled.is_empty() {
        enabled.push(Kind::ALL[rng.random_range(0..Kind::ALL.len())]);
    }
    if enabled.contains(&Kind::Delay) {
        enabled.push(Kind::Reorder);
    }
    let candidates: Vec<&Placement> = space.iter().filter(|p| enabled.contains(&p.kind)).collect();
    let mut mix = draw_from(&mut rng, &candidates, workload);
    add_outage(seed, space, outage_bound_ms(workload), &mut mix);
    add_late(seed, space, &mut mix);
    mix
}

/// A late request, drawn from a stream of its own as an outage is (so that a seed that draws
/// none keeps the mix it drew before late requests were in the cut space): on for half the
/// seeds whose space has one, one late request at an effect's call site, added to the mix (in
/// place of its last cut that is no outage when the mix is full).
fn add_late(seed: u64, space: &[Placement], mix: &mut Vec<Placement>) {
    let mut rng = component_stream(seed, "explore/late");
    let lates: Vec<&Placement> = space.iter().filter(|p| p.kind == Kind::Late).collect();
    if lates.is_empty() || !rng.random_bool(0.5) {
        return;
    }
    let late = lates[rng.random_range(0..lates.len())].clone();
    if mix.iter().any(|p| p.site == late.site) {
        return;
    }
    if mix.len() >= MIX_CUTS_MAX {
        match mix.iter().rposition(|p| !p.kind.is_outage()) {
            Some(last) => drop(mix.remove(last)),
            None => return,
        }
    }
    mix.push(late);
}

/// An outage, drawn from a stream of its own so that a seed that draws none keeps the mix it drew
/// before outages were in the cut space: on for half the seeds, as any kind of cut, one outage
/// at a call site of the space with its length drawn around the space's (never past
/// `longest_ms`, what the world lets a harness survive), added to the mix (in place of its last
/// cut when the mix is full).
fn add_outage(seed: u64, space: &[Placement], longest_ms: u64, mix: &mut Vec<Placement>) {
    let mut rng = component_stream(seed, "explore/outage");
    let outages: Vec<&Placement> = space.iter().filter(|p| p.kind.is_outage()).collect();
    if outages.is_empty() || !rng.random_bool(0.5) {
        return;
    }
    let mut outage = outages[rng.random_range(0..outages.len())].clone();
    outage.ms = outage.ms.map(|ms| rng.random_range(ms / 2..=ms.saturating_add(ms / 2)).clamp(1, longest_ms.max(1)));
    if mix.iter().any(|p| p.site == outage.site) {
        return;
    }
    if mix.len() >= MIX_CUTS_MAX {
        mix.pop();
    }
    mix.push(outage);
}

/// How many cuts, which of `candidates`, and their timings.
fn draw_from(rng: &mut rand_chacha::ChaCha8Rng, candidates: &[&Placement], workload: &Scenario) -> Vec<Placement> {
    if candidates.is_empty() {
        return Vec::new();
    }
    let wanted = rng.random_range(1..=MIX_CUTS_MAX).min(candidates.len());
    let mut chosen = BTreeSet::new();
    while chosen.len() < wanted {
        chosen.insert(rng.random_range(0..candidates.len()));
    }
    let ttl = workload.world.harness.lease_ttl_ms.max(1_000);
    chosen
        .into_iter()
        .map(|i| {
            let mut placement = candidates[i].clone();
            // Timings are part of the mix: a delay somewhere past the deadline, a pause across
            // one to four lease lifetimes.
            placement.ms = match placement.kind {
                Kind::Delay => placement.ms.map(|past| rng.random_range(past..=past.saturating_mul(3))),
                Kind::Pause | Kind::PauseCaller => Some(rng.random_range(ttl..=ttl.saturating_mul(4))),
                // Cut off from a moment to longer than the sweep's isolation.
                Kind::IsolateCaller => placement.ms.map(|ms| rng.random_range(ms / 10..=ms.saturating_mul(2))),
                _ => placement.ms,
            };
            placement
        })
        .collect()
}

/// What shrinking keeps to: the workload, its uncut run, the policy, seed and oracle.
pub(super) struct Target<'a> {
    pub workload: &'a Scenario,
    pub uncut: &'a RunOutcome,
    pub policy: &'a str,
    pub seed: u64,
    pub oracle: &'a str,
}

/// Whether `placements` on the workload with `removed` steps still make `oracle` fire beyond
/// the workload's uncut run, and are still why it fires: without some steps the workload alone
/// can trip it (a seeded running turn whose delivery was a removed step is left running, and
/// `liveness` fires with no cut at all), and a finding shrunk into that is no finding.
fn still_fires(harness: &dyn Runs, target: &Target<'_>, placements: &[Placement], removed: &BTreeSet<usize>) -> bool {
    let Target { workload, uncut, policy, seed, oracle } = *target;
    let variant = without_steps(workload, removed);
    let (outcome, _) = run_placed(harness, &variant, placements, policy, seed);
    if !fired_beyond(&outcome, uncut).contains(oracle) {
        return false;
    }
    // The whole workload's uncut run does not have it (that is how it was chosen); a shorter one
    // may.
    removed.is_empty() || fired_beyond(&outcome, &harness.run(&variant, &bare_run(policy), seed)).contains(oracle)
}

/// Drops one cut at a time, in order, while what is left still `fires`, never the last one:
/// the cuts kept and how many tries it took.
fn drop_cuts(mut cuts: Vec<Placement>, mut fires: impl FnMut(&[Placement]) -> bool) -> (Vec<Placement>, usize) {
    let (mut index, mut tries) = (0, 0);
    while index < cuts.len() && cuts.len() > 1 {
        let mut fewer = cuts.clone();
        fewer.remove(index);
        tries += 1;
        if fires(&fewer) {
            cuts = fewer;
        } else {
            index += 1;
        }
    }
    (cuts, tries)
}

/// Explores one seed of `scenario`'s workload under `policy`; `Err` with why, when the harness
/// cannot run the workload ([`Runs::skip`]), as `rig explore` skips it: nothing is run then.
pub fn explore(
    harness: &dyn Runs,
    scenario: &Scenario,
    policy: &str,
    seed: u64,
    keep_cuts: bool,
) -> Result<Exploration, Skip> {
    let workload = workload(scenario, keep_cuts);
    if let Some(skip) = harness.skip(&workload, policy) {
        return Err(skip);
    }
    let baseline = harness.run(&workload, &bare_run(policy), seed);
    let baseline_fired = fired(&baseline);
    let space = runnable_space(harness, &workload, &baseline, &SpaceOptions::default());
    let mix = draw(seed, &space, &harness.wired(&workload));
    let mut exploration = Exploration {
        seed,
        mix: mix.clone(),
        fired: BTreeSet::new(),
        uncut_fired: baseline_fired.clone(),
        shrunk: None,
        runs: 1,
        uncut_trajectory: Abstraction::new(&workload, harness.layout()).trajectory(baseline.trace.events()),
        trajectory: Trajectory::default(),
    };
    if mix.is_empty() {
        return Ok(exploration);
    }
    let (outcome, indices) = run_placed_at(harness, &workload, &mix, policy, seed);
    exploration.runs += 1;
    exploration.trajectory = Abstraction::new(&workload, harness.layout()).trajectory(outcome.trace.events());
    exploration.fired = fired_beyond(&outcome, &baseline);
    let Some(oracle) = exploration.fired.iter().next().cloned() else { return Ok(exploration) };
    let fired_cuts: Vec<Placement> =
        mix.iter().zip(&indices).filter(|(p, i)| p.fired(&outcome, **i)).map(|(p, _)| p.clone()).collect();
    let target = Target { workload: &workload, uncut: &baseline, policy, seed, oracle: &oracle };
    let (shrunk, runs) = shrink(harness, &target, fired_cuts, "exploration");
    exploration.runs += runs;
    exploration.shrunk = Some(shrunk);
    Ok(exploration)
}

/// Shrinks a failing mix's cuts that fired (only those can matter): drops one cut at a time
/// while the oracle still fires, then the workload's steps, last first; then writes the finding
/// (`found_by` says by what: `exploration`), checked against the reference harness. With the
/// runs it took.
pub(super) fn shrink(
    harness: &dyn Runs,
    target: &Target<'_>,
    fired_cuts: Vec<Placement>,
    found_by: &str,
) -> (Finding, usize) {
    let Target { workload, policy, seed, oracle, .. } = *target;
    let none_removed = BTreeSet::new();
    let (cuts, mut runs) = drop_cuts(fired_cuts, |fewer| still_fires(harness, target, fewer, &none_removed));
    // Then the workload's steps, last first, so later steps go before the ones they follow.
    let mut removed = none_removed;
    for step in (0..workload.steps.len()).rev() {
        let mut fewer = removed.clone();
        fewer.insert(step);
        runs += 1;
        if still_fires(harness, target, &cuts, &fewer) {
            removed = fewer;
        }
    }
    // What the shrunk run trips besides the oracle it was shrunk for: its file must say so.
    let (outcome, _) = run_placed(harness, &without_steps(workload, &removed), &cuts, policy, seed);
    runs += 1;
    let found_by = format!("{found_by} of harness `{}`", harness.name());
    let found = Found { oracle, fired: &fired(&outcome) };
    let mut shrunk = finding(workload, &cuts, policy, found, seed, &removed, &found_by);
    shrunk.check_reference(harness, workload, &removed);
    (shrunk, runs)
}

/// What an exploration numbers its runs by.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Unit {
    /// A swarm's seeds: each its own mix and its own simulation seed.
    #[default]
    Seed,
    /// A guided exploration's runs, one simulation seed for all.
    Run,
}

impl Unit {
    pub fn name(self) -> &'static str {
        match self {
            Unit::Seed => "seed",
            Unit::Run => "run",
        }
    }
}

/// One finding of an exploration: the first seed's shrunk finding (naming in
/// [`Finding::also`] the seeds that shrank to the same), every such seed, and the runs the first
/// seed's exploration took.
#[derive(Debug, Clone)]
pub struct ExploredFinding {
    pub finding: Finding,
    pub seeds: Vec<u64>,
    pub runs: usize,
}

/// What an exploration of many seeds (and workloads) came to, as `rig explore` counts it and
/// says it in its summary line: add each seed's [`explore`] (or skip), then
/// [`ExploreTally::summary`]. Findings are kept one per [`Signature`], in the order first found.
#[derive(Debug, Clone, Default)]
pub struct ExploreTally {
    /// What an exploration's numbered runs are: the seeds of a swarm, or the runs of a guided
    /// exploration (whose simulation seed is the first of its range).
    pub unit: Unit,
    /// The abstract states each workload's runs reached, by its path ([`ExploreTally::cover`]).
    pub coverage: BTreeMap<String, Coverage>,
    pub explored: u64,
    /// Seeds whose mix made an oracle fire, or whose uncut workload already trips one.
    pub failing: u64,
    /// Seeds not explored: the harness lacks what their workload needs.
    pub skipped: u64,
    pub findings: Vec<ExploredFinding>,
    numbers: BTreeMap<Signature, usize>,
}

impl ExploreTally {
    /// Counts one seed's exploration, or its skip; the number (from 1) of the finding it shrank
    /// to, shared with every seed of the same signature.
    pub fn add(&mut self, explored: &Result<Exploration, Skip>) -> Option<usize> {
        let exploration = match explored {
            Ok(exploration) => exploration,
            Err(_) => {
                self.skipped += 1;
                return None;
            }
        };
        self.explored += 1;
        if exploration.fired.is_empty() && exploration.uncut_fired.is_empty() {
            return None;
        }
        self.failing += 1;
        let shrunk = exploration.shrunk.clone()?;
        let signature = shrunk.signature();
        let seed = exploration.seed;
        if let Some(&index) = self.numbers.get(&signature) {
            let found = &mut self.findings[index];
            found.finding.also.push(format!("{} {seed}", self.unit.name()));
            found.seeds.push(seed);
            return Some(index + 1);
        }
        self.numbers.insert(signature, self.findings.len());
        self.findings.push(ExploredFinding { seeds: vec![seed], finding: shrunk, runs: exploration.runs });
        Some(self.findings.len())
    }

    /// Adds what one seed of `workload` reached (its uncut run and its mix's) to the workload's
    /// coverage.
    pub fn cover(&mut self, workload: &str, trajectories: &[&Trajectory]) -> Novelty {
        self.coverage.entry(workload.to_string()).or_default().add_all(trajectories)
    }

    /// Counts `seeds` seeds of a workload skipped whole, without exploring them one by one.
    pub fn skip(&mut self, seeds: u64) {
        self.skipped = self.skipped.saturating_add(seeds);
    }

    /// `explored 80 seed(s): 65 clean, 15 failing (11 distinct findings), 0 skipped (harness NAME)`.
    pub fn summary(&self, harness: &str) -> String {
        let distinct = self.findings.len();
        format!(
            "explored {} {}(s): {} clean, {} failing ({distinct} distinct finding{}), {} skipped (harness {harness})",
            self.explored,
            self.unit.name(),
            self.explored - self.failing,
            self.failing,
            if distinct == 1 { "" } else { "s" },
            self.skipped
        )
    }
}

#[cfg(test)]
mod tests {
    use super::super::space::Site;
    use super::*;
    use std::path::Path;

    fn placement(nth: u64, kind: Kind, ms: Option<u64>) -> Placement {
        Placement { site: Site::Call { function: "state::set".into(), about: Vec::new(), nth }, kind, ms }
    }

    /// A mix is at most four distinct placements of the space, with its timings drawn: a delay
    /// from its deadline-passing length to three times it, a pause across one to four lease
    /// lifetimes, an isolation from a tenth of the sweep's to twice it.
    #[test]
    fn a_mix_is_a_few_distinct_placements_with_drawn_timings() {
        let source = "about = \"mix\"\n[world]\nlease_ttl_ms = 3000\n\n[[step]]\nwait_ms = 1\n\n[policy.reference]\n";
        let workload = Scenario::parse(Path::new("mix.toml"), source).unwrap();
        let space: Vec<Placement> = (1..=8)
            .flat_map(|nth| {
                [
                    placement(nth, Kind::Delay, Some(1_000)),
                    placement(nth, Kind::PauseCaller, Some(1)),
                    placement(nth, Kind::IsolateCaller, Some(1_000)),
                    placement(nth, Kind::Timeout, None),
                ]
            })
            .collect();
        let (mut drawn_delays, mut drawn_isolations) = (BTreeSet::new(), BTreeSet::new());
        for seed in 0..300 {
            let mix = draw(seed, &space, &workload);
            // None when the kinds the seed enabled are not in this space.
            assert!(mix.len() <= MIX_CUTS_MAX, "seed {seed}: {} cuts", mix.len());
            let sites: BTreeSet<_> = mix.iter().map(|p| (&p.site, p.kind)).collect();
            assert_eq!(sites.len(), mix.len(), "seed {seed}: a placement twice");
            for p in &mix {
                let ms = p.ms.unwrap_or(0);
                match p.kind {
                    Kind::Delay => assert!((1_000..=3_000).contains(&ms), "seed {seed}: delay {ms}"),
                    Kind::PauseCaller => assert!((3_000..=12_000).contains(&ms), "seed {seed}: pause {ms}"),
                    Kind::IsolateCaller => assert!((100..=2_000).contains(&ms), "seed {seed}: isolation {ms}"),
                    _ => assert_eq!(p.ms, None),
                }
                match p.kind {
                    Kind::Delay => drawn_delays.insert(ms),
                    Kind::IsolateCaller => drawn_isolations.insert(ms),
                    _ => false,
                };
            }
            assert_eq!(mix, draw(seed, &space, &workload), "seed {seed} draws the same mix again");
        }
        assert!(drawn_delays.len() > 10, "delays are drawn, not fixed: {drawn_delays:?}");
        assert!(drawn_isolations.len() > 10, "isolations are drawn, not fixed: {drawn_isolations:?}");
    }

    #[test]
    fn a_reorder_is_drawn_exactly_when_delays_are() {
        let source = "about = \"mix\"\n[[step]]\nwait_ms = 1\n\n[policy.reference]\n";
        let workload = Scenario::parse(Path::new("mix.toml"), source).unwrap();
        // A space of delays and reorders only: a seed draws from it iff it enabled delays.
        let delays: Vec<Placement> = (1..=4).map(|nth| placement(nth, Kind::Delay, Some(1_000))).collect();
        let reorders: Vec<Placement> = (1..=4).map(|nth| placement(nth, Kind::Reorder, None)).collect();
        let both: Vec<Placement> = delays.iter().chain(&reorders).cloned().collect();
        let mut reordered = 0;
        for seed in 0..200 {
            let with_delays = !draw(seed, &delays, &workload).is_empty();
            assert_eq!(!draw(seed, &reorders, &workload).is_empty(), with_delays, "seed {seed}");
            let mix = draw(seed, &both, &workload);
            reordered += mix.iter().filter(|p| p.kind == Kind::Reorder).count();
            assert!(mix.iter().all(|p| p.kind != Kind::Reorder || p.ms.is_none()), "seed {seed}: {mix:?}");
        }
        assert!(reordered > 0, "some seed reorders a frame");
    }

    /// Outages joined the space after seeds had names: a seed draws from the same space what it
    /// drew before, and half of them add one outage (in place of the last cut of a full mix).
    #[test]
    fn an_outage_joins_half_the_mixes_and_changes_nothing_else_they_draw() {
        let source = "about = \"mix\"\n[[step]]\nwait_ms = 1\n\n[policy.reference]\n";
        let workload = Scenario::parse(Path::new("mix.toml"), source).unwrap();
        let before: Vec<Placement> = (1..=8).map(|nth| placement(nth, Kind::Timeout, None)).collect();
        let outages: Vec<Placement> = (1..=2).map(|nth| placement(nth + 10, Kind::Outage, Some(10_000))).collect();
        let with: Vec<Placement> = before.iter().chain(&outages).cloned().collect();
        let (mut added, mut lengths) = (0, BTreeSet::new());
        for seed in 0..200 {
            let (old, new) = (draw(seed, &before, &workload), draw(seed, &with, &workload));
            let (kept, outage): (Vec<Placement>, Vec<Placement>) = new.into_iter().partition(|p| !p.kind.is_outage());
            assert!(outage.len() <= 1, "seed {seed}: {outage:?}");
            if outage.is_empty() {
                assert_eq!(kept, old, "seed {seed}: a mix without an outage is the one drawn before");
                continue;
            }
            added += 1;
            let len = if old.len() == MIX_CUTS_MAX { old.len() - 1 } else { old.len() };
            assert_eq!(kept, old[..len], "seed {seed}");
            let ms = outage[0].ms.unwrap_or(0);
            assert!((5_000..=15_000).contains(&ms), "seed {seed}: its length is drawn around the space's: {ms}");
            lengths.insert(ms);
        }
        assert!((60..=140).contains(&added), "about half the seeds draw an outage: {added}");
        assert!(
            lengths.iter().any(|ms| *ms < 10_000) && lengths.iter().any(|ms| *ms > 10_000),
            "shorter and longer than the space's: {lengths:?}"
        );
    }

    /// Late requests joined the space after seeds had names: a seed draws what it drew before,
    /// and about half of them add one late request (in place of the last cut of a full mix).
    #[test]
    fn a_late_request_joins_half_the_mixes_and_changes_nothing_else_they_draw() {
        let source = "about = \"mix\"\n[[step]]\nwait_ms = 1\n\n[policy.reference]\n";
        let workload = Scenario::parse(Path::new("mix.toml"), source).unwrap();
        let before: Vec<Placement> = (1..=8).map(|nth| placement(nth, Kind::Timeout, None)).collect();
        let lates = (1..=2).map(|nth| placement(nth + 10, Kind::Late, None));
        let with: Vec<Placement> = before.iter().cloned().chain(lates).collect();
        let mut added = 0;
        for seed in 0..200 {
            let (old, new) = (draw(seed, &before, &workload), draw(seed, &with, &workload));
            let (kept, late): (Vec<Placement>, Vec<Placement>) = new.into_iter().partition(|p| p.kind != Kind::Late);
            assert!(late.len() <= 1, "seed {seed}: {late:?}");
            if late.is_empty() {
                assert_eq!(kept, old, "seed {seed}: a mix without a late request is the one drawn before");
                continue;
            }
            added += 1;
            let len = if old.len() == MIX_CUTS_MAX { old.len() - 1 } else { old.len() };
            assert_eq!(kept, old[..len], "seed {seed}");
        }
        assert!((60..=140).contains(&added), "about half the seeds draw a late request: {added}");
    }

    #[test]
    fn shrinking_drops_each_cut_the_finding_does_not_need_and_keeps_one() {
        let [a, b, c] = [1, 2, 3].map(|nth| placement(nth, Kind::Timeout, None));
        let needs = |kept: &[Placement]| {
            let kept = kept.to_vec();
            move |fewer: &[Placement]| kept.iter().all(|k| fewer.contains(k))
        };
        // The last cut alone is needed: the first two go, one try each, and nothing is tried
        // once one cut is left.
        assert_eq!(
            drop_cuts(vec![a.clone(), b.clone(), c.clone()], needs(std::slice::from_ref(&c))),
            (vec![c.clone()], 2)
        );
        // The first two are needed: each is tried and kept, the third goes, and shrinking stops
        // at the end of the list.
        let both = vec![a.clone(), b.clone()];
        assert_eq!(drop_cuts(vec![a.clone(), b.clone(), c.clone()], needs(&both)), (both, 3));
        // A single cut is never tried: a finding needs at least one.
        assert_eq!(drop_cuts(vec![a.clone()], |_| true), (vec![a], 0));
    }

    /// A workload step the finding does not need may go: with a late status read removed, the
    /// cut still trips the oracle, and the shortened workload alone does not.
    #[test]
    fn a_step_the_finding_does_not_need_may_be_removed() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scenarios/workloads/multi-round.toml");
        let text = std::fs::read_to_string(&path).unwrap()
            + "\n[[step]]\ninvoke = { function = \"harness::status\", payload = { session_id = \"s1\" }, name = \"late\" }\n";
        let workload = super::super::workload(&Scenario::parse(&path, &text).unwrap(), false);
        let crash = Placement {
            site: Site::Call {
                function: "ticket::create".into(),
                about: vec![("action_id".into(), "t1:1:0".into())],
                nth: 1,
            },
            kind: Kind::CrashCallerAfter,
            ms: None,
        };
        let harness = crate::reference();
        let late = BTreeSet::from([workload.steps.len() - 1]);
        let policy = "replay-unfinished";
        let uncut = Runs::run(&harness, &workload, &bare_run(policy), 0);
        let target = Target { workload: &workload, uncut: &uncut, policy, seed: 0, oracle: "blind-replay" };
        let fires = |removed: &BTreeSet<usize>| still_fires(&harness, &target, std::slice::from_ref(&crash), removed);
        assert!(fires(&BTreeSet::new()), "the cut trips blind-replay under replay-unfinished");
        assert!(fires(&late), "and still does without the late status read");
    }

    /// A late request that joins a full mix takes the place of its last cut that is no outage:
    /// the outage the seed drew stays.
    #[test]
    fn a_late_request_in_a_full_mix_keeps_its_outage() {
        let source = "about = \"mix\"\n[[step]]\nwait_ms = 1\n\n[policy.reference]\n";
        let workload = Scenario::parse(Path::new("mix.toml"), source).unwrap();
        let before: Vec<Placement> = (1..=8)
            .map(|nth| placement(nth, Kind::Timeout, None))
            .chain((1..=2).map(|nth| placement(nth + 10, Kind::Outage, Some(10_000))))
            .collect();
        let with: Vec<Placement> = before.iter().cloned().chain([placement(20, Kind::Late, None)]).collect();
        let mut replaced = 0;
        for seed in 0..300 {
            let (old, new) = (draw(seed, &before, &workload), draw(seed, &with, &workload));
            let Some(late) = new.iter().position(|p| p.kind == Kind::Late) else {
                assert_eq!(new, old, "seed {seed}");
                continue;
            };
            let mut expected = old.clone();
            if old.len() == MIX_CUTS_MAX {
                let last = old.iter().rposition(|p| !p.kind.is_outage()).expect("a full mix holds other cuts");
                expected.remove(last);
                replaced += usize::from(old.iter().any(|p| p.kind.is_outage()));
            }
            let mut kept = new.clone();
            kept.remove(late);
            assert_eq!(kept, expected, "seed {seed}");
        }
        assert!(replaced > 0, "some full mix with an outage drew a late request");
    }

    /// Shrinking keeps a cut only while it still trips the oracle: a cut that trips nothing does
    /// not, and neither does one whose shortened workload trips the oracle on its own.
    #[test]
    fn a_cut_that_trips_nothing_does_not_still_fire() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scenarios/workloads/multi-round.toml");
        let workload = super::super::workload(&Scenario::load(&path).unwrap(), false);
        let harness = crate::reference();
        let policy = "replay-unfinished";
        let uncut = Runs::run(&harness, &workload, &bare_run(policy), 0);
        let target = Target { workload: &workload, uncut: &uncut, policy, seed: 0, oracle: "blind-replay" };
        let unreached = placement(1_000, Kind::Timeout, None);
        assert!(!still_fires(&harness, &target, &[unreached], &BTreeSet::new()), "no cut fired, nothing found");
    }

    fn names(oracles: &[&str]) -> BTreeSet<String> {
        oracles.iter().map(|o| o.to_string()).collect()
    }

    fn explored(seed: u64, fired: &[&str], uncut_fired: &[&str], shrunk: Option<Finding>) -> Result<Exploration, Skip> {
        Ok(Exploration {
            seed,
            mix: Vec::new(),
            fired: names(fired),
            uncut_fired: names(uncut_fired),
            shrunk,
            runs: 10 + usize::try_from(seed).unwrap(),
            uncut_trajectory: Trajectory::default(),
            trajectory: Trajectory::default(),
        })
    }

    /// The summary line counts seeds explored, clean, failing (a mix that trips an oracle, or a
    /// workload that trips one uncut) and skipped; findings are numbered from 1 by signature,
    /// a later seed of the same one named in its file.
    #[test]
    fn the_tally_counts_seeds_and_numbers_findings_by_signature() {
        let source = "about = \"w\"\n[[step]]\nwait_ms = 1\n\n[policy.reference]\n";
        let workload = Scenario::parse(Path::new("w.toml"), source).unwrap();
        let found = |oracle: &str, nth: u64| {
            let fired = names(&[oracle]);
            let placements = [placement(nth, Kind::Timeout, None)];
            let found = Found { oracle, fired: &fired };
            finding(&workload, &placements, "unguarded", found, 0, &BTreeSet::new(), "test")
        };
        let mut tally = ExploreTally::default();
        assert_eq!(tally.add(&explored(1, &[], &[], None)), None, "clean");
        assert_eq!(tally.add(&explored(2, &["ledger"], &[], Some(found("ledger", 1)))), Some(1));
        assert_eq!(tally.add(&explored(3, &["effects"], &[], Some(found("effects", 1)))), Some(2));
        assert_eq!(tally.add(&explored(4, &["ledger"], &[], Some(found("ledger", 3)))), Some(1), "any ordinal");
        assert_eq!(tally.add(&explored(5, &[], &["liveness"], None)), None, "failing uncut: no mix to shrink");
        assert_eq!(tally.add(&Err(Skip::not_live("h", vec!["a reason".into()]))), None);
        tally.skip(3);
        assert_eq!((tally.explored, tally.failing, tally.skipped), (5, 4, 4));
        let first = &tally.findings[0];
        assert_eq!((&first.seeds, first.runs, &first.finding.also), (&vec![2, 4], 12, &vec!["seed 4".to_string()]));
        assert_eq!(
            tally.summary("x"),
            "explored 5 seed(s): 1 clean, 4 failing (2 distinct findings), 4 skipped (harness x)"
        );
        let mut guided = ExploreTally { unit: Unit::Run, ..ExploreTally::default() };
        guided.add(&explored(7, &["ledger"], &[], Some(found("ledger", 1))));
        guided.add(&explored(8, &["ledger"], &[], Some(found("ledger", 2))));
        assert_eq!(guided.findings[0].finding.also, ["run 8"]);
        assert_eq!(
            guided.summary("x"),
            "explored 2 run(s): 0 clean, 2 failing (1 distinct finding), 0 skipped (harness x)"
        );
        let reached = Trajectory { states: vec![1, 2] };
        assert_eq!(guided.cover("w.toml", &[&reached]), Novelty { states: 2, transitions: 1 });
        assert!(!guided.cover("w.toml", &[&reached]).is_new(), "the same workload's coverage");
        assert_eq!(guided.coverage["w.toml"].states(), 2);
    }

    /// A harness that counts the runs made through it.
    struct Counted {
        inner: std::sync::Arc<dyn crate::HarnessFactory>,
        runs: std::sync::atomic::AtomicUsize,
    }

    impl Runs for Counted {
        fn name(&self) -> &str {
            self.inner.name()
        }

        fn run(&self, scenario: &Scenario, run: &crate::scenario::PolicyRun, seed: u64) -> RunOutcome {
            self.runs.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            Runs::run(&self.inner, scenario, run, seed)
        }

        fn skip(&self, workload: &Scenario, policy: &str) -> Option<Skip> {
            Runs::skip(&self.inner, workload, policy)
        }

        fn reference(&self) -> &dyn Runs {
            &self.inner
        }
    }

    /// The runs an exploration reports are the runs it made through the harness: the uncut run,
    /// the mix's, and each of shrinking's, seed by seed, up to one whose mix shrank.
    #[test]
    fn an_exploration_reports_the_runs_it_made() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scenarios/workloads/multi-round.toml");
        let scenario = Scenario::load(&path).unwrap();
        let harness = Counted { inner: crate::reference(), runs: Default::default() };
        let shrunk = (0..60).find(|&seed| {
            harness.runs.store(0, std::sync::atomic::Ordering::Relaxed);
            let exploration = explore(&harness, &scenario, "replay-unfinished", seed, false).unwrap();
            let made = harness.runs.load(std::sync::atomic::Ordering::Relaxed);
            assert_eq!(exploration.runs, made, "seed {seed}");
            exploration.shrunk.is_some() && exploration.mix.len() > 1
        });
        assert!(shrunk.is_some(), "a seed whose mix of several cuts trips replay-unfinished, shrunk");
    }

    /// Which seeds draw an outage, and which a late request, is the first coin of the stream each
    /// has of its own (`explore/outage`, `explore/late`), on when it comes up true: a seed's mix is
    /// its streams' draws, so `--seed N` and a baseline naming seed N draw it again.
    #[test]
    fn an_outage_and_a_late_request_are_each_the_first_coin_of_their_own_stream() {
        let source = "about = \"mix\"\n[[step]]\nwait_ms = 1\n\n[policy.reference]\n";
        let workload = Scenario::parse(Path::new("mix.toml"), source).unwrap();
        let space =
            [placement(1, Kind::Timeout, None), placement(2, Kind::Outage, Some(10)), placement(3, Kind::Late, None)];
        for seed in 0..100 {
            let mix = draw(seed, &space, &workload);
            let coin = |stream: &str| component_stream(seed, stream).random_bool(0.5);
            assert_eq!(mix.iter().any(|p| p.kind == Kind::Outage), coin("explore/outage"), "seed {seed}: {mix:?}");
            assert_eq!(mix.iter().any(|p| p.kind == Kind::Late), coin("explore/late"), "seed {seed}: {mix:?}");
        }
    }
}
