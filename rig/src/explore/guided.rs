//! `rig explore --mode guided`: an explorer with memory. Most bugs of a durable harness show
//! under one fault at the right place, so it opens with the uncut run's own placements, the most
//! promising first (a crash of the caller just after or before a write or an effect, then a
//! write of unknown outcome: a lost acknowledgement, a timeout; see [`opening_order`]), several
//! at distinct sites in one run. Each opening run in which a fault of unknown outcome fired and
//! nothing failed is followed by runs that add a second fault on the same action or record, at
//! its next calls (where the retry, readback or reconciliation the first one caused is). Once
//! the opening is done it keeps a corpus of the fault mixes whose runs reached an abstract state
//! (or a transition) no earlier run reached ([`super::state`]), and spends its runs changing one
//! of them a little: a second fault on the same action or record, after the first fired; a cut
//! moved to a neighbouring site; another kind of cut at the same site; another timing; one more
//! cut anywhere in that mix's run; one cut fewer. A fixed share of runs, from the first on, are
//! the swarm's fresh draws (`--mode swarm` draws only those), so what the swarm's mixes find the
//! guided explorer keeps drawing too. Sites come from the run of the
//! mix changed, not only the uncut run, so a fault can go at a call only an earlier fault caused.
//!
//! A campaign over runs `A..B` of one workload is deterministic: every run uses simulation seed
//! `A` (so a site seen in one run is where a cut lands in the next), run `i` draws its change
//! from a stream of its own (`i`), and the runs are made in batches of [`GUIDED_BATCH`] whose
//! mixes come from the corpus as the batches before left it, so the same runs are made for any
//! number of threads, and `A..N+1` makes the first runs of `A..B` again.

use super::space::{cut_space_at, outage_bound_ms, Kind, Placement, Site, SpaceOptions};
use super::state::{Abstraction, Coverage, Novelty, Trajectory};
use super::swarm::{draw, shrink, Target, MIX_CUTS_MAX};
use super::{bare_run, fired, fired_beyond, run_placed_at, runnable_space, workload, Finding, Runs};
use crate::capability::Skip;
use crate::run::RunOutcome;
use crate::scenario::Scenario;
use crate::streams::component_stream;
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use std::collections::{BTreeSet, VecDeque};
use std::ops::Range;

/// How many runs are drawn from the corpus at once: the unit of determinism for any `--jobs`.
pub const GUIDED_BATCH: usize = 16;

/// The share of runs that are the swarm's fresh draws, from the first run on.
const FRESH_SHARE: f64 = 0.25;

/// How many of the opening's placements one run tries, each at a site of its own.
const OPENING_CUTS: usize = 4;

/// How many of the next sites on the same action or record a fault of unknown outcome is
/// followed to by a second fault.
const FOLLOW_SITES: usize = 3;

/// Faults after which the caller cannot know whether its call took effect: what a retry, a
/// readback or a reconciliation is for, and where a second fault on the same subject bites.
const UNKNOWN_OUTCOME: [Kind; 4] = [Kind::Timeout, Kind::LostAck, Kind::Delay, Kind::Late];

/// The second faults an unknown outcome is followed by: the caller dying around its next call
/// about the same thing, or that call's outcome unknown too.
const FOLLOW_KINDS: [Kind; 4] = [Kind::CrashCallerBefore, Kind::CrashCallerAfter, Kind::Timeout, Kind::LostAck];

/// How promising a kind of cut is alone, lower first: the crack between "the action happened"
/// and "we recorded that it happened" opens widest when the caller dies right after (or before)
/// a write or an effect; then a call whose outcome the caller cannot know; then a refused or
/// late one; then a dead service, engine or link; then a frame lost, doubled or out of order;
/// then a long outage or pause, which takes every call it covers.
fn kind_rank(kind: Kind) -> u8 {
    match kind {
        Kind::CrashCallerAfter | Kind::Crash => 0,
        Kind::CrashCallerBefore => 1,
        Kind::LostAck | Kind::Timeout => 2,
        Kind::Reject | Kind::Delay | Kind::Late => 3,
        Kind::CrashService | Kind::CrashEngine | Kind::IsolateCaller => 4,
        Kind::Drop | Kind::Duplicate | Kind::Reorder => 5,
        Kind::Outage | Kind::OutageTimeout | Kind::PauseCaller | Kind::Pause => 6,
    }
}

/// The opening's order of the uncut run's placements (`space`, in the run's order): by the
/// kind's promise ([`kind_rank`]), then the site's ([`Site::promise`]: effects, then commits
/// and acknowledgements), then the run's order.
pub fn opening_order(space: &[Placement]) -> Vec<Placement> {
    let mut order: Vec<(usize, &Placement)> = space.iter().enumerate().collect();
    order.sort_by_key(|(at, p)| (kind_rank(p.kind), std::cmp::Reverse(p.site.promise()), *at));
    order.into_iter().map(|(_, p)| p.clone()).collect()
}

/// A run to make: its number, and the mix it tries.
#[derive(Debug, Clone)]
pub struct Trial {
    pub index: u64,
    pub mix: Vec<Placement>,
    /// The corpus entry it changes (`None`: a fresh draw, the opening or a follow-up).
    parent: Option<usize>,
    /// Where the mix comes from.
    source: Source,
}

/// Where a trial's mix comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    /// The swarm's fresh draw.
    Fresh,
    /// The opening's next placements.
    Opening,
    /// An opening run's mix with a second fault on the subject of one of its cuts.
    FollowUp,
    /// A change of a corpus entry.
    Corpus,
}

/// A run made: what it tried, what fired, where it went.
#[derive(Debug, Clone)]
pub struct Tried {
    pub index: u64,
    pub mix: Vec<Placement>,
    /// Oracles the mix made fire beyond the uncut run's violations.
    pub fired: BTreeSet<String>,
    pub trajectory: Trajectory,
    /// The cuts of the mix that fired, for shrinking.
    fired_cuts: Vec<Placement>,
    /// Where each cut of the mix first fired in the run (a trace event), if it did.
    fired_at: Vec<Option<usize>>,
    /// Every placement the run offers, with its trace position: where the next changes go.
    sites: Vec<(usize, Placement)>,
    parent: Option<usize>,
    source: Source,
}

/// A mix worth changing: it reached something new.
#[derive(Debug, Clone)]
struct Entry {
    mix: Vec<Placement>,
    fired_at: Vec<Option<usize>>,
    sites: Vec<(usize, Placement)>,
    /// How much it found that was new, and how often it was changed since.
    novelty: usize,
    picks: u32,
}

/// A guided exploration of one workload over a range of runs: [`Campaign::batch`] draws the next
/// trials from the corpus, [`Campaign::try_mix`] makes one (on any thread), [`Campaign::fold`]
/// takes its result back in order, and [`Campaign::shrink`] makes a failing one a finding.
pub struct Campaign<'a> {
    harness: &'a dyn Runs,
    pub workload: Scenario,
    /// The workload as the harness runs it ([`Runs::wired`]): what the cuts' bounds are read from.
    wired: Scenario,
    pub policy: String,
    /// The simulation seed of every run: the first of the range.
    pub seed: u64,
    runs: Range<u64>,
    next: u64,
    baseline: RunOutcome,
    /// Oracles the uncut run itself trips.
    pub uncut_fired: BTreeSet<String>,
    space: Vec<Placement>,
    abstraction: Abstraction,
    pub coverage: Coverage,
    corpus: Vec<Entry>,
    /// The uncut run's placements not tried yet, in [`opening_order`].
    opening: VecDeque<Placement>,
    /// Opening placements that did not fire in their run, put back once.
    put_back: BTreeSet<Placement>,
    /// Mixes with a second fault after an unknown outcome, to try next.
    follow_ups: VecDeque<Vec<Placement>>,
}

impl<'a> Campaign<'a> {
    /// Runs the uncut workload and starts the corpus with it; `Err` with why, when the harness
    /// cannot run the workload (as `rig explore` skips it).
    pub fn new(
        harness: &'a dyn Runs,
        scenario: &Scenario,
        policy: &str,
        runs: Range<u64>,
        keep_cuts: bool,
    ) -> Result<Self, Skip> {
        let workload = workload(scenario, keep_cuts);
        if let Some(skip) = harness.skip(&workload, policy) {
            return Err(skip);
        }
        let seed = runs.start;
        let baseline = harness.run(&workload, &bare_run(policy), seed);
        let space = runnable_space(harness, &workload, &baseline, &SpaceOptions::default());
        let abstraction = Abstraction::new(&workload, harness.layout());
        let wired = harness.wired(&workload).into_owned();
        let mut coverage = Coverage::default();
        coverage.add(&abstraction.trajectory(baseline.trace.events()));
        let opening = opening_order(&space).into();
        let root = Entry {
            mix: Vec::new(),
            fired_at: Vec::new(),
            sites: cut_space_at(&wired, &baseline, &SpaceOptions::default(), true),
            novelty: 1,
            picks: 0,
        };
        Ok(Self {
            harness,
            uncut_fired: fired(&baseline),
            policy: policy.to_string(),
            seed,
            next: runs.start,
            runs,
            workload,
            wired,
            baseline,
            space,
            abstraction,
            coverage,
            corpus: vec![root],
            opening,
            put_back: BTreeSet::new(),
            follow_ups: VecDeque::new(),
        })
    }

    /// The mixes of the corpus entries kept so far (the uncut run's empty mix first).
    pub fn corpus(&self) -> impl Iterator<Item = &[Placement]> {
        self.corpus.iter().map(|entry| entry.mix.as_slice())
    }

    /// The next trials (at most [`GUIDED_BATCH`]), drawn from the corpus as it is now; none once
    /// the range is done.
    pub fn batch(&mut self) -> Vec<Trial> {
        let end = self.runs.end.min(self.next.saturating_add(GUIDED_BATCH as u64));
        let trials = (self.next..end).map(|index| self.trial(index)).collect();
        self.next = end;
        trials
    }

    fn trial(&mut self, index: u64) -> Trial {
        let mut rng = component_stream(index, "explore/guided");
        if rng.random_bool(FRESH_SHARE) {
            let mix = draw(index, &self.space, &self.wired);
            return Trial { index, mix, parent: None, source: Source::Fresh };
        }
        // While both have runs to make, the opening and the follow-ups of its runs take turns.
        let follow_first = index % 2 == 1 || self.opening.is_empty();
        if follow_first {
            if let Some(mix) = self.follow_ups.pop_front() {
                return Trial { index, mix, parent: None, source: Source::FollowUp };
            }
        }
        let mix = self.next_opening();
        if !mix.is_empty() {
            return Trial { index, mix, parent: None, source: Source::Opening };
        }
        if let Some(mix) = self.follow_ups.pop_front() {
            return Trial { index, mix, parent: None, source: Source::FollowUp };
        }
        let parent = self.pick(&mut rng);
        self.corpus[parent].picks += 1;
        let mix = mutate(&self.corpus[parent], &self.wired, &mut rng);
        Trial { index, mix, parent: Some(parent), source: Source::Corpus }
    }

    /// The opening's next placements, at most [`OPENING_CUTS`], each at a site of its own (a
    /// placement at a site already taken waits for the next run).
    fn next_opening(&mut self) -> Vec<Placement> {
        let mut mix: Vec<Placement> = Vec::new();
        let mut at = 0;
        while mix.len() < OPENING_CUTS && at < self.opening.len() {
            if mix.iter().any(|p| p.site == self.opening[at].site) {
                at += 1;
                continue;
            }
            mix.extend(self.opening.remove(at));
        }
        mix
    }

    /// A corpus entry: those that found more, were changed less and hold fewer cuts are likelier.
    fn pick(&self, rng: &mut ChaCha8Rng) -> usize {
        let weight = |entry: &Entry| {
            (1.0 + entry.novelty as f64) / (1.0 + f64::from(entry.picks)).sqrt() / (1.0 + entry.mix.len() as f64)
        };
        let total: f64 = self.corpus.iter().map(weight).sum();
        let mut at = rng.random::<f64>() * total;
        for (index, entry) in self.corpus.iter().enumerate() {
            at -= weight(entry);
            if at <= 0.0 {
                return index;
            }
        }
        self.corpus.len() - 1
    }

    /// Makes one trial's run (any thread).
    pub fn try_mix(&self, trial: &Trial) -> Tried {
        let (outcome, indices) = run_placed_at(self.harness, &self.workload, &trial.mix, &self.policy, self.seed);
        let fired_at: Vec<Option<usize>> =
            trial.mix.iter().zip(&indices).map(|(p, i)| p.fired_at(&outcome, *i)).collect();
        let fired_cuts =
            trial.mix.iter().zip(&fired_at).filter(|(_, at)| at.is_some()).map(|(p, _)| p.clone()).collect();
        Tried {
            index: trial.index,
            mix: trial.mix.clone(),
            fired: if trial.mix.is_empty() { BTreeSet::new() } else { fired_beyond(&outcome, &self.baseline) },
            trajectory: self.abstraction.trajectory(outcome.trace.events()),
            fired_cuts,
            fired_at,
            sites: cut_space_at(&self.wired, &outcome, &SpaceOptions::default(), true),
            parent: trial.parent,
            source: trial.source,
        }
    }

    /// Takes a run back (in the order of the trials): its coverage, and the corpus keeps its mix
    /// if it reached something new without failing (a failure is a finding, not a place to
    /// search from).
    pub fn fold(&mut self, tried: Tried) -> Novelty {
        if tried.source == Source::Opening {
            self.follow_opening(&tried);
        }
        let novelty = self.coverage.add(&tried.trajectory);
        if novelty.is_new() && tried.fired.is_empty() && !tried.mix.is_empty() {
            if let Some(parent) = tried.parent {
                // A change that found something: its parent is worth changing again.
                self.corpus[parent].novelty += 1;
            }
            self.corpus.push(Entry {
                mix: tried.mix,
                fired_at: tried.fired_at,
                sites: tried.sites,
                novelty: novelty.states * 2 + novelty.transitions,
                picks: 0,
            });
        }
        novelty
    }

    /// What an opening run leaves to do: its placements that did not fire go back to the end of
    /// the opening (once: an earlier cut of the run may have taken their call); and if nothing
    /// failed, each fault of unknown outcome that fired is followed by a second fault at each
    /// of the next [`FOLLOW_SITES`] sites about the same action or record.
    fn follow_opening(&mut self, tried: &Tried) {
        for (placement, at) in tried.mix.iter().zip(&tried.fired_at) {
            if at.is_none() && self.put_back.insert(placement.clone()) {
                self.opening.push_back(placement.clone());
            }
        }
        if !tried.fired.is_empty() {
            return;
        }
        for (placement, at) in tried.mix.iter().zip(&tried.fired_at) {
            let (Some(after), Some(subject)) = (*at, placement.site.subject()) else { continue };
            if !UNKNOWN_OUTCOME.contains(&placement.kind) {
                continue;
            }
            let mut sites: Vec<&Site> = Vec::new();
            for (at, next) in &tried.sites {
                let follows = *at > after && next.site.subject().as_ref() == Some(&subject);
                if !follows || !FOLLOW_KINDS.contains(&next.kind) || holds(&tried.mix, next) {
                    continue;
                }
                if !sites.contains(&&next.site) {
                    if sites.len() == FOLLOW_SITES {
                        break;
                    }
                    sites.push(&next.site);
                }
                let mut mix = tried.mix.clone();
                mix.push(next.clone());
                self.follow_ups.push_back(mix);
            }
        }
    }

    /// A failing run's mix shrunk to a finding (as an exploration's), with the runs it took.
    pub fn shrink(&self, tried: &Tried) -> Option<(Finding, usize)> {
        let oracle = tried.fired.iter().next()?;
        let target =
            Target { workload: &self.workload, uncut: &self.baseline, policy: &self.policy, seed: self.seed, oracle };
        Some(shrink(self.harness, &target, tried.fired_cuts.clone(), "guided exploration"))
    }
}

/// One change of an entry's mix.
fn mutate(entry: &Entry, workload: &Scenario, rng: &mut ChaCha8Rng) -> Vec<Placement> {
    // Weights: a second fault on the same thing, a cut anywhere, a neighbouring site, another
    // kind, another timing, one cut fewer.
    const WEIGHTS: [u32; 6] = [5, 2, 2, 2, 1, 1];
    let mut mix = entry.mix.clone();
    for _ in 0..8 {
        let mut roll = rng.random_range(0..WEIGHTS.iter().sum::<u32>());
        let op = WEIGHTS.iter().position(|weight| match roll.checked_sub(*weight) {
            Some(rest) => {
                roll = rest;
                false
            }
            None => true,
        });
        let changed = match op {
            Some(0) => same_subject(entry, &mut mix, rng),
            Some(1) => anywhere(entry, &mut mix, rng),
            Some(2) => neighbour(entry, &mut mix, rng),
            Some(3) => other_kind(entry, &mut mix, rng),
            Some(4) => retime(&mut mix, workload, rng),
            _ => fewer(&mut mix, rng),
        };
        if changed {
            break;
        }
    }
    mix
}

/// Whether `mix` already holds a cut of this kind at this site.
fn holds(mix: &[Placement], candidate: &Placement) -> bool {
    mix.iter().any(|p| p.site == candidate.site && p.kind == candidate.kind)
}

/// Adds a placement, dropping the oldest cut of a full mix.
fn push(mix: &mut Vec<Placement>, placement: Placement) {
    if mix.len() >= MIX_CUTS_MAX {
        mix.remove(0);
    }
    mix.push(placement);
}

fn choose<'p>(candidates: &[&'p Placement], rng: &mut ChaCha8Rng) -> Option<&'p Placement> {
    (!candidates.is_empty()).then(|| candidates[rng.random_range(0..candidates.len())])
}

/// A second fault on the action or record one of the mix's cuts is about, at a call of it the
/// run made after that cut fired.
fn same_subject(entry: &Entry, mix: &mut Vec<Placement>, rng: &mut ChaCha8Rng) -> bool {
    let anchors: Vec<(usize, String)> =
        entry.mix.iter().zip(&entry.fired_at).filter_map(|(p, at)| Some(((*at)?, p.site.subject()?))).collect();
    if anchors.is_empty() {
        return false;
    }
    let (after, subject) = &anchors[rng.random_range(0..anchors.len())];
    let candidates: Vec<&Placement> = entry
        .sites
        .iter()
        .filter(|(at, p)| at > after && p.site.subject().as_ref() == Some(subject) && !holds(mix, p))
        .map(|(_, p)| p)
        .collect();
    choose(&candidates, rng).is_some_and(|p| {
        push(mix, p.clone());
        true
    })
}

/// One more cut anywhere in the entry's run.
fn anywhere(entry: &Entry, mix: &mut Vec<Placement>, rng: &mut ChaCha8Rng) -> bool {
    let candidates: Vec<&Placement> = entry.sites.iter().filter(|(_, p)| !holds(mix, p)).map(|(_, p)| p).collect();
    choose(&candidates, rng).is_some_and(|p| {
        push(mix, p.clone());
        true
    })
}

/// A cut of the mix moved to a neighbouring site: the one before or after it of its class, or
/// a site up to two away in the run, keeping its kind where the new site has it.
fn neighbour(entry: &Entry, mix: &mut [Placement], rng: &mut ChaCha8Rng) -> bool {
    if mix.is_empty() {
        return false;
    }
    let which = rng.random_range(0..mix.len());
    let cut = mix[which].clone();
    // The run's sites in order, each once (a site offers several kinds, listed together).
    let mut sites: Vec<&Site> = Vec::new();
    for (_, p) in &entry.sites {
        if sites.last() != Some(&&p.site) {
            sites.push(&p.site);
        }
    }
    let Some(here) = sites.iter().position(|site| **site == cut.site) else { return false };
    let next_of_class = |site: &Site| site.class() == cut.site.class() && site.nth().abs_diff(cut.site.nth()) == 1;
    let nearby: Vec<&Site> = sites
        .iter()
        .enumerate()
        .filter(|(i, site)| *i != here && (i.abs_diff(here) <= 2 || next_of_class(site)))
        .map(|(_, site)| *site)
        .collect();
    if nearby.is_empty() {
        return false;
    }
    let site = nearby[rng.random_range(0..nearby.len())];
    let at_site: Vec<&Placement> = entry.sites.iter().map(|(_, p)| p).filter(|p| p.site == *site).collect();
    let moved = at_site.iter().find(|p| p.kind == cut.kind).copied().or_else(|| choose(&at_site, rng));
    match moved {
        Some(p) if !holds(mix, p) => {
            mix[which] = p.clone();
            true
        }
        _ => false,
    }
}

/// Another kind of cut at the site of one of the mix's cuts.
fn other_kind(entry: &Entry, mix: &mut [Placement], rng: &mut ChaCha8Rng) -> bool {
    if mix.is_empty() {
        return false;
    }
    let which = rng.random_range(0..mix.len());
    let site = mix[which].site.clone();
    let candidates: Vec<&Placement> =
        entry.sites.iter().map(|(_, p)| p).filter(|p| p.site == site && !holds(mix, p)).collect();
    choose(&candidates, rng).is_some_and(|p| {
        mix[which] = p.clone();
        true
    })
}

/// Another timing for a cut that has one: a delay, a pause, an isolation, an outage.
fn retime(mix: &mut [Placement], workload: &Scenario, rng: &mut ChaCha8Rng) -> bool {
    let timed: Vec<usize> = (0..mix.len()).filter(|i| mix[*i].ms.is_some()).collect();
    if timed.is_empty() {
        return false;
    }
    let which = timed[rng.random_range(0..timed.len())];
    let ms = mix[which].ms.unwrap_or(1).max(1);
    let ttl = workload.world.harness.lease_ttl_ms.max(1_000);
    mix[which].ms = Some(match mix[which].kind {
        Kind::Pause | Kind::PauseCaller => rng.random_range(ttl..=ttl.saturating_mul(4)),
        // Never past what the world lets a harness survive (space.rs, `outage_bound_ms`).
        Kind::Outage | Kind::OutageTimeout => {
            rng.random_range(ms / 2..=ms.saturating_mul(2)).clamp(1, outage_bound_ms(workload).max(1))
        }
        _ => rng.random_range(ms / 2..=ms.saturating_mul(2)).max(1),
    });
    true
}

/// One cut fewer.
fn fewer(mix: &mut Vec<Placement>, rng: &mut ChaCha8Rng) -> bool {
    if mix.len() < 2 {
        return false;
    }
    mix.remove(rng.random_range(0..mix.len()));
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    /// A call site about `about`, the `nth` of its class.
    fn call(function: &str, about: &[(&str, &str)], nth: u64, kind: Kind) -> Placement {
        let about = about.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        Placement { site: Site::Call { function: function.into(), about, nth }, kind, ms: None }
    }

    /// A write of the turn record of session s1 (subject `record harness_turn/s1`).
    fn record(nth: u64, kind: Kind) -> Placement {
        call("state::set", &[("scope", "harness_turn"), ("key", "s1")], nth, kind)
    }

    /// A request of the effect of action a1 (subject `action a1`).
    fn action(nth: u64, kind: Kind) -> Placement {
        call("ticket::create", &[("action_id", "a1")], nth, kind)
    }

    fn point(nth: u64, kind: Kind) -> Placement {
        let site = Site::Point { worker: "harness".into(), point: "before_submission".into(), nth };
        Placement { site, kind, ms: None }
    }

    fn frame(nth: u64, kind: Kind) -> Placement {
        let site = Site::Frame {
            worker: "harness".into(),
            up: true,
            frame: "invocationresult".into(),
            function: "harness::turn".into(),
            nth,
        };
        Placement { site, kind, ms: None }
    }

    fn timed(mut placement: Placement, ms: u64) -> Placement {
        placement.ms = Some(ms);
        placement
    }

    fn multi_round() -> Scenario {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scenarios/workloads/multi-round.toml");
        Scenario::load(&path).unwrap()
    }

    /// A campaign of the reference harness over `runs` of multi-round.toml (one uncut run made).
    fn campaign(harness: &dyn Runs, runs: Range<u64>) -> Campaign<'_> {
        Campaign::new(harness, &multi_round(), "reference", runs, false).unwrap()
    }

    fn entry(mix: Vec<Placement>, fired_at: Vec<Option<usize>>, sites: Vec<(usize, Placement)>) -> Entry {
        Entry { mix, fired_at, sites, novelty: 1, picks: 0 }
    }

    fn rng(seed: u64) -> ChaCha8Rng {
        component_stream(seed, "explore/guided/test")
    }

    /// The opening tries the crash of the caller right after a write or an effect first, then
    /// right before, then a call of unknown outcome, a refused or late one, a dead service, a
    /// lost or doubled frame, a long outage or pause; within a kind's rank, effects before
    /// writes and points before reads; otherwise in the run's order.
    #[test]
    fn the_opening_ranks_by_kind_then_by_site_then_by_the_runs_order() {
        let space = vec![
            point(1, Kind::Pause),                     // 0: rank 6
            frame(1, Kind::Drop),                      // 1: rank 5
            record(1, Kind::CrashService),             // 2: rank 4
            record(1, Kind::Reject),                   // 3: rank 3
            call("state::get", &[], 1, Kind::Timeout), // 4: rank 2, a read
            action(1, Kind::Timeout),                  // 5: rank 2, an effect
            record(1, Kind::CrashCallerBefore),        // 6: rank 1
            record(2, Kind::CrashCallerAfter),         // 7: rank 0, a write
            point(2, Kind::Crash),                     // 8: rank 0, a point
            action(1, Kind::CrashCallerAfter),         // 9: rank 0, an effect
            record(1, Kind::LostAck),                  // 10: rank 2, a write
            timed(record(1, Kind::Outage), 1_000),     // 11: rank 6
            timed(record(1, Kind::Delay), 1_000),      // 12: rank 3
            record(1, Kind::IsolateCaller),            // 13: rank 4
        ];
        let order: Vec<usize> =
            opening_order(&space).iter().map(|p| space.iter().position(|q| q == p).unwrap()).collect();
        assert_eq!(order, [9, 7, 8, 6, 5, 10, 4, 3, 12, 2, 13, 1, 0, 11]);
        let ranks: Vec<u8> = [
            Kind::CrashCallerAfter,
            Kind::CrashCallerBefore,
            Kind::Timeout,
            Kind::Late,
            Kind::CrashEngine,
            Kind::Duplicate,
            Kind::PauseCaller,
        ]
        .map(kind_rank)
        .to_vec();
        assert_eq!(ranks, [0, 1, 2, 3, 4, 5, 6]);
    }

    /// Each opening run takes the next four placements at four distinct sites; a placement at a
    /// site already taken waits, in its place, for the next run.
    #[test]
    fn an_opening_run_takes_the_next_four_placements_at_distinct_sites() {
        let harness = crate::reference();
        let mut campaign = campaign(&harness, 0..16);
        let (after, before) = (record(1, Kind::CrashCallerAfter), record(1, Kind::CrashCallerBefore));
        let others: Vec<Placement> = (1..=5).map(|nth| action(nth, Kind::CrashCallerAfter)).collect();
        campaign.opening = [after.clone(), before.clone()].into_iter().chain(others.iter().cloned()).collect();
        assert_eq!(campaign.next_opening(), [after, others[0].clone(), others[1].clone(), others[2].clone()]);
        assert_eq!(Vec::from(campaign.opening.clone()), [before.clone(), others[3].clone(), others[4].clone()]);
        assert_eq!(campaign.next_opening(), [before, others[3].clone(), others[4].clone()]);
        assert!(campaign.next_opening().is_empty() && campaign.opening.is_empty());
    }

    /// An opening run's placements that did not fire go back to the opening, once; a fault of
    /// unknown outcome that fired, in a run where nothing failed, is followed by a second fault
    /// of a following kind at each of the next three sites about the same record, after it fired.
    #[test]
    fn an_opening_run_follows_an_unknown_outcome_at_the_next_three_sites_of_its_subject() {
        let harness = crate::reference();
        let mut campaign = campaign(&harness, 0..16);
        campaign.opening.clear();
        let unknown = record(1, Kind::Timeout);
        let crash = action(1, Kind::CrashCallerAfter);
        let unfired = point(1, Kind::Crash);
        let mix = vec![unknown.clone(), crash.clone(), unfired.clone()];
        let sites = vec![
            (4, record(1, Kind::CrashCallerBefore)), // before the fault fired
            (5, record(1, Kind::LostAck)),           // where it fired
            (6, record(1, Kind::Timeout)),           // the mix holds it
            (7, record(2, Kind::Timeout)),
            (7, record(2, Kind::Reject)), // not a second fault it is followed by
            (7, record(2, Kind::LostAck)),
            (8, action(2, Kind::Timeout)), // the crash's subject: a crash is no unknown outcome
            (8, call("state::set", &[("scope", "harness_turn"), ("key", "s2")], 1, Kind::Timeout)),
            (9, record(3, Kind::CrashCallerBefore)),
            (10, record(4, Kind::CrashCallerAfter)),
            (11, record(5, Kind::Timeout)), // a fourth site
        ];
        let tried = |fired: &[&str]| Tried {
            index: 0,
            mix: mix.clone(),
            fired: fired.iter().map(|s| s.to_string()).collect(),
            trajectory: Trajectory::default(),
            fired_cuts: Vec::new(),
            fired_at: vec![Some(5), Some(6), None],
            sites: sites.clone(),
            parent: None,
            source: Source::Opening,
        };
        campaign.follow_opening(&tried(&["ledger"]));
        assert!(campaign.follow_ups.is_empty(), "a failing run is a finding, not followed");
        assert_eq!(campaign.opening, std::slice::from_ref(&unfired));
        campaign.follow_opening(&tried(&[]));
        assert_eq!(campaign.opening, std::slice::from_ref(&unfired), "put back once");
        let followed: Vec<Placement> = campaign.follow_ups.iter().map(|m| m.last().unwrap().clone()).collect();
        assert_eq!(
            followed,
            [
                record(2, Kind::Timeout),
                record(2, Kind::LostAck),
                record(3, Kind::CrashCallerBefore),
                record(4, Kind::CrashCallerAfter)
            ]
        );
        assert!(campaign.follow_ups.iter().all(|m| m[..3] == mix[..]), "each the run's mix and one more cut");
    }

    fn tried(mix: Vec<Placement>, states: &[u64], fired: bool, parent: Option<usize>, source: Source) -> Tried {
        Tried {
            index: 0,
            fired_at: vec![None; mix.len()],
            mix,
            fired: if fired { BTreeSet::from(["ledger".to_string()]) } else { BTreeSet::new() },
            trajectory: Trajectory { states: states.to_vec() },
            fired_cuts: Vec::new(),
            sites: Vec::new(),
            parent,
            source,
        }
    }

    /// The corpus keeps a mix that reached a new state or transition without failing, valued by
    /// how much it found (a state twice a transition); the entry it changed gains a point.
    #[test]
    fn the_corpus_keeps_a_clean_mix_that_reached_something_new() {
        let harness = crate::reference();
        let mut campaign = campaign(&harness, 0..16);
        let opening = campaign.opening.len();
        let cut = vec![record(1, Kind::Timeout)];
        let novelty = campaign.fold(tried(cut.clone(), &[1_000, 1_001, 1_002], false, Some(0), Source::Corpus));
        assert_eq!(novelty, Novelty { states: 3, transitions: 2 });
        assert_eq!(campaign.corpus.len(), 2);
        assert_eq!((campaign.corpus[0].novelty, campaign.corpus[1].novelty), (2, 3 * 2 + 2));
        assert_eq!(campaign.opening.len(), opening, "only an opening run puts its unfired cuts back");
        assert!(!campaign.fold(tried(cut.clone(), &[1_000, 1_001], false, Some(0), Source::Corpus)).is_new());
        assert!(campaign.fold(tried(cut.clone(), &[1_003], true, Some(0), Source::Corpus)).is_new());
        assert!(campaign.fold(tried(Vec::new(), &[1_004], false, Some(0), Source::Corpus)).is_new());
        assert_eq!(campaign.corpus.len(), 2, "a failing run and the uncut mix are not kept");
        assert_eq!(campaign.corpus[0].novelty, 2);
        campaign.fold(tried(cut.clone(), &[1_005], false, None, Source::Opening));
        assert_eq!((campaign.corpus.len(), campaign.corpus[0].novelty), (3, 2), "no parent to credit");
        assert_eq!(campaign.opening.len(), opening + 1, "an opening run's cut that did not fire goes back");
        let kept: Vec<&[Placement]> = campaign.corpus().collect();
        assert_eq!(kept, [&[][..], &cut[..], &cut[..]], "the uncut run's empty mix first");
    }

    /// A failing run shrinks to a finding of the first oracle it tripped, made of the cuts that
    /// fired; a run that tripped nothing is none.
    #[test]
    fn a_failing_run_shrinks_to_a_finding_of_its_cuts_that_fired() {
        let harness = crate::reference();
        let campaign = Campaign::new(&harness, &multi_round(), "replay-unfinished", 0..16, false).unwrap();
        let crash = call("ticket::create", &[("action_id", "t1:1:0")], 1, Kind::CrashCallerAfter);
        let unfired = record(1_000, Kind::Timeout);
        let mut failing = tried(vec![crash.clone(), unfired], &[], true, None, Source::Fresh);
        failing.fired = BTreeSet::from(["blind-replay".to_string()]);
        failing.fired_cuts = vec![crash.clone()];
        let (finding, runs) = campaign.shrink(&failing).expect("a finding");
        assert_eq!((finding.oracle.as_str(), &finding.placements[..]), ("blind-replay", &[crash][..]));
        assert!(runs > 1, "{runs}");
        assert!(campaign.shrink(&tried(Vec::new(), &[], false, None, Source::Fresh)).is_none());
    }

    /// Runs are drawn in batches of sixteen up to the range's end; about a quarter are fresh
    /// draws; while both have runs, an odd run takes a follow-up and an even one the opening;
    /// with neither, a run changes a corpus entry.
    #[test]
    fn trials_take_turns_between_the_opening_and_its_follow_ups_then_change_the_corpus() {
        let harness = crate::reference();
        let mut campaign = campaign(&harness, 0..40);
        campaign.opening = (1..=200).map(|nth| action(nth, Kind::CrashCallerAfter)).collect();
        let follow_up = vec![record(1, Kind::Timeout), record(2, Kind::LostAck)];
        campaign.follow_ups = vec![follow_up.clone(); 200].into();
        let mut trials = campaign.batch();
        assert_eq!(trials.len(), GUIDED_BATCH);
        trials.extend(campaign.batch());
        assert_eq!(trials.len(), 32);
        assert_eq!(trials.iter().map(|t| t.index).collect::<Vec<_>>(), (0..32).collect::<Vec<_>>());
        let fresh = trials.iter().filter(|t| t.source == Source::Fresh).count();
        assert!((3..=14).contains(&fresh), "about a quarter fresh: {fresh}");
        for trial in trials.iter().filter(|t| t.source != Source::Fresh) {
            let (source, odd) = (trial.source, trial.index % 2 == 1);
            assert_eq!(source, if odd { Source::FollowUp } else { Source::Opening }, "run {}", trial.index);
            assert_eq!(trial.mix.len(), if odd { 2 } else { 4 });
        }
        campaign.opening.clear();
        campaign.follow_ups.clear();
        let last = campaign.batch();
        assert_eq!(last.len(), 8, "the range ends at 40");
        assert!(campaign.batch().is_empty());
        let changes: Vec<&Trial> = last.iter().filter(|t| t.source != Source::Fresh).collect();
        // (A change of the uncut run's empty mix can only add a cut anywhere, drawn 8 times at most.)
        assert!(changes.iter().all(|t| t.source == Source::Corpus && t.parent == Some(0) && t.mix.len() <= 1));
        assert_eq!(campaign.corpus[0].picks as usize, changes.len());

        // The opening run out, the follow-ups go on at even runs too.
        let mut campaign = self::campaign(&harness, 0..16);
        campaign.opening.clear();
        campaign.follow_ups = vec![follow_up; 16].into();
        assert!(campaign.batch().iter().all(|t| matches!(t.source, Source::Fresh | Source::FollowUp)));
    }

    /// An entry is picked in proportion to one more than its novelty, over the square root of
    /// one more than its picks, over one more than its cuts.
    #[test]
    fn an_entry_is_picked_by_what_it_found_how_often_it_was_picked_and_its_size() {
        let harness = crate::reference();
        let mut campaign = campaign(&harness, 0..16);
        let with = |cuts: usize, novelty: usize, picks: u32| Entry {
            mix: vec![record(1, Kind::Timeout); cuts],
            fired_at: Vec::new(),
            sites: Vec::new(),
            novelty,
            picks,
        };
        // Weights 2, 1.5 and 0.25.
        campaign.corpus = vec![with(0, 1, 0), with(1, 5, 3), with(3, 0, 0)];
        let mut counts = [0usize; 3];
        let mut rng = rng(0);
        for _ in 0..6_000 {
            counts[campaign.pick(&mut rng)] += 1;
        }
        let shares = counts.map(|n| n as f64 / 6_000.0);
        for (share, expected) in shares.iter().zip([2.0 / 3.75, 1.5 / 3.75, 0.25 / 3.75]) {
            assert!((share - expected).abs() < 0.03, "{shares:?}");
        }
    }

    /// The sites of an entry's run, in trace order: record writes of session s1 at 1, 3, 5 (the
    /// first two offering a timeout and a lost acknowledgement), an effect request at 2, a point.
    fn entry_sites() -> Vec<(usize, Placement)> {
        vec![
            (1, record(1, Kind::Timeout)),
            (1, record(1, Kind::LostAck)),
            (2, action(1, Kind::Timeout)),
            (3, record(2, Kind::Timeout)),
            (3, record(2, Kind::LostAck)),
            (usize::MAX, point(1, Kind::Crash)),
            (5, record(3, Kind::Timeout)),
        ]
    }

    #[test]
    fn a_second_fault_on_the_same_subject_goes_after_the_first_fired() {
        let mut added = BTreeSet::new();
        let fired = entry(vec![record(1, Kind::Timeout)], vec![Some(1)], entry_sites());
        for seed in 0..60 {
            let mut mix = fired.mix.clone();
            assert!(same_subject(&fired, &mut mix, &mut rng(seed)));
            assert_eq!((mix.len(), &mix[0]), (2, &fired.mix[0]));
            added.insert(mix[1].clone());
        }
        let expected = [record(2, Kind::Timeout), record(2, Kind::LostAck), record(3, Kind::Timeout)];
        assert_eq!(added, expected.into_iter().collect());
        let unfired = entry(vec![record(1, Kind::Timeout)], vec![None], entry_sites());
        assert!(!same_subject(&unfired, &mut unfired.mix.clone(), &mut rng(0)), "no cut fired: no anchor");
        let late = entry(vec![record(1, Kind::Timeout)], vec![Some(5)], entry_sites());
        assert!(!same_subject(&late, &mut late.mix.clone(), &mut rng(0)), "nothing about it after");
    }

    #[test]
    fn one_more_cut_goes_anywhere_the_mix_does_not_hold_yet() {
        let sites = entry_sites();
        let entry = entry(vec![record(1, Kind::Timeout)], vec![Some(1)], sites.clone());
        let mut added = BTreeSet::new();
        for seed in 0..100 {
            let mut mix = entry.mix.clone();
            assert!(anywhere(&entry, &mut mix, &mut rng(seed)));
            added.insert(mix[1].clone());
        }
        let expected: BTreeSet<Placement> = sites.into_iter().skip(1).map(|(_, p)| p).collect();
        assert_eq!(added, expected);
        let full = entry_sites().into_iter().map(|(_, p)| p).collect();
        let held = self::entry(full, Vec::new(), entry_sites());
        assert!(!anywhere(&held, &mut held.mix.clone(), &mut rng(0)), "every site held");
    }

    /// A cut moves to a site up to two away in the run, or to the one before or after it of its
    /// class, keeping its kind where the new site has it.
    #[test]
    fn a_cut_moves_to_a_neighbouring_site_keeping_its_kind_where_it_can() {
        let sites = vec![
            (1, record(2, Kind::Timeout)),
            (1, record(2, Kind::LostAck)),
            (2, action(1, Kind::Timeout)),
            (2, action(1, Kind::LostAck)),
            (usize::MAX, point(1, Kind::Crash)),
            (4, frame(1, Kind::Drop)),
            (5, record(3, Kind::LostAck)),
            (5, record(3, Kind::Timeout)),
            (6, record(5, Kind::Timeout)),
        ];
        let entry = entry(vec![record(2, Kind::Timeout)], vec![Some(1)], sites);
        let mut moved = BTreeSet::new();
        for seed in 0..100 {
            let mut mix = entry.mix.clone();
            assert!(neighbour(&entry, &mut mix, &mut rng(seed)));
            assert_eq!(mix.len(), 1);
            moved.insert(mix[0].clone());
        }
        let expected = [action(1, Kind::Timeout), point(1, Kind::Crash), record(3, Kind::Timeout)];
        assert_eq!(moved, expected.into_iter().collect());
        assert!(!neighbour(&entry, &mut [], &mut rng(0)));
        let elsewhere = self::entry(vec![record(9, Kind::Timeout)], vec![None], entry.sites.clone());
        assert!(!neighbour(&elsewhere, &mut elsewhere.mix.clone(), &mut rng(0)), "a site not in the run");
        let alone = self::entry(vec![record(2, Kind::Timeout)], vec![None], entry.sites[..2].to_vec());
        assert!(!neighbour(&alone, &mut alone.mix.clone(), &mut rng(0)), "no other site");
        // A move onto a cut the mix holds already is no move.
        let two = vec![record(2, Kind::Timeout), action(1, Kind::Timeout)];
        let both = self::entry(two.clone(), vec![Some(1), Some(2)], entry.sites.clone());
        let mut refused = 0;
        for seed in 0..100 {
            let mut mix = two.clone();
            if !neighbour(&both, &mut mix, &mut rng(seed)) {
                refused += 1;
                assert_eq!(mix, two);
            }
            assert_ne!(mix[0], mix[1], "seed {seed}");
        }
        assert!(refused > 0);
    }

    #[test]
    fn another_kind_of_cut_goes_at_the_same_site() {
        let entry = entry(vec![record(2, Kind::Timeout)], vec![Some(3)], entry_sites());
        for seed in 0..20 {
            let mut mix = entry.mix.clone();
            assert!(other_kind(&entry, &mut mix, &mut rng(seed)));
            assert_eq!(mix, [record(2, Kind::LostAck)]);
        }
        let alone = self::entry(vec![record(3, Kind::Timeout)], vec![None], entry_sites());
        assert!(!other_kind(&alone, &mut alone.mix.clone(), &mut rng(0)), "no other kind there");
        assert!(!other_kind(&entry, &mut [], &mut rng(0)));
    }

    /// A delay is retimed between half and twice its length; a pause across one to four lease
    /// lifetimes; an outage the same as a delay, never past the workload's outage bound.
    #[test]
    fn a_timed_cut_is_retimed_within_its_bounds() {
        let workload = multi_round();
        let ttl = workload.world.harness.lease_ttl_ms.max(1_000);
        let bound = outage_bound_ms(&workload);
        assert!(!retime(&mut [record(1, Kind::Timeout)], &workload, &mut rng(0)), "no timing to change");
        let (mut delays, mut outages) = (BTreeSet::new(), BTreeSet::new());
        for seed in 0..100 {
            let mut mix = [record(1, Kind::Timeout), timed(record(2, Kind::Delay), 1_000)];
            assert!(retime(&mut mix, &workload, &mut rng(seed)));
            assert_eq!(mix[0].ms, None);
            let ms = mix[1].ms.unwrap();
            assert!((500..=2_000).contains(&ms), "{ms}");
            delays.insert(ms);
            let mut pause = [timed(point(1, Kind::Pause), 10)];
            retime(&mut pause, &workload, &mut rng(seed));
            assert!((ttl..=4 * ttl).contains(&pause[0].ms.unwrap()), "{:?}", pause[0].ms);
            let mut outage = [timed(record(1, Kind::Outage), bound * 10)];
            retime(&mut outage, &workload, &mut rng(seed));
            assert_eq!(outage[0].ms, Some(bound), "never past the bound");
            let mut short = [timed(record(1, Kind::OutageTimeout), 1_000)];
            retime(&mut short, &workload, &mut rng(seed));
            assert!((500..=2_000.min(bound)).contains(&short[0].ms.unwrap()), "{:?}", short[0].ms);
            outages.insert(short[0].ms.unwrap());
        }
        assert!(delays.iter().any(|ms| *ms < 1_000) && delays.iter().any(|ms| *ms > 1_000), "{delays:?}");
        assert!(outages.iter().any(|ms| *ms < 1_000) && outages.len() > 10, "{outages:?}");
    }

    #[test]
    fn a_mix_loses_a_cut_only_when_it_has_two_and_a_full_one_drops_its_oldest() {
        let mut one = vec![record(1, Kind::Timeout)];
        assert!(!fewer(&mut one, &mut rng(0)));
        assert_eq!(one.len(), 1);
        let two = vec![record(1, Kind::Timeout), record(2, Kind::Timeout)];
        let mut left = BTreeSet::new();
        for seed in 0..20 {
            let mut mix = two.clone();
            assert!(fewer(&mut mix, &mut rng(seed)));
            assert_eq!(mix.len(), 1);
            left.insert(mix[0].clone());
        }
        assert_eq!(left, two.iter().cloned().collect());

        let mut mix: Vec<Placement> = (1..MIX_CUTS_MAX as u64).map(|nth| record(nth, Kind::Timeout)).collect();
        push(&mut mix, action(1, Kind::Timeout));
        assert_eq!((mix.len(), &mix[0]), (MIX_CUTS_MAX, &record(1, Kind::Timeout)));
        push(&mut mix, action(2, Kind::Timeout));
        assert_eq!((mix.len(), &mix[0]), (MIX_CUTS_MAX, &record(2, Kind::Timeout)), "the oldest went");
        assert_eq!(mix.last(), Some(&action(2, Kind::Timeout)));

        assert!(holds(&mix, &record(2, Kind::Timeout)));
        assert!(!holds(&mix, &record(2, Kind::LostAck)), "another kind at the site");
        assert!(!holds(&mix, &record(9, Kind::Timeout)), "the kind at another site");
    }

    /// Each change is drawn by its weight, and one that cannot apply draws again: a mix of one
    /// untimed cut gets a second fault on its subject, a cut anywhere, a neighbouring site or
    /// another kind, never a retiming or one cut fewer.
    #[test]
    fn a_change_is_drawn_by_its_weight_among_those_that_apply() {
        let entry = entry(vec![record(1, Kind::Timeout)], vec![Some(1)], entry_sites());
        let workload = multi_round();
        let (mut same, mut other_added, mut moved, mut kind) = (0, 0, 0, 0);
        for seed in 0..400 {
            let mix = mutate(&entry, &workload, &mut rng(seed));
            match mix.len() {
                2 if mix[1].site.subject() == entry.mix[0].site.subject() => same += 1,
                2 => other_added += 1,
                1 if mix[0].site != entry.mix[0].site => moved += 1,
                1 if mix[0].kind != entry.mix[0].kind => kind += 1,
                _ => panic!("seed {seed}: {mix:?}"),
            }
        }
        // Weights 5 (the same subject), 2 (anywhere: 4 of its 6 sites are the same subject's),
        // 2 and 2 of the 11 of 13 that apply here: about 230, 24, 73 and 73 of 400.
        let counts = (same, other_added, moved, kind);
        assert!((190..=270).contains(&same), "{counts:?}");
        assert!((8..=45).contains(&other_added), "{counts:?}");
        assert!((45..=105).contains(&moved), "{counts:?}");
        assert!((45..=105).contains(&kind), "{counts:?}");
        // A timed cut can be retimed too (weight 1 of the 12 of 13 that apply: about 33 of 400).
        let delayed = self::entry(vec![timed(record(2, Kind::Delay), 1_000)], vec![Some(3)], entry_sites());
        let retimed = (0..400)
            .map(|seed| mutate(&delayed, &workload, &mut rng(seed)))
            .filter(|mix| mix.len() == 1 && mix[0].site == delayed.mix[0].site && mix[0].kind == Kind::Delay)
            .filter(|mix| mix[0].ms != Some(1_000))
            .count();
        assert!((15..=75).contains(&retimed), "{retimed}");
    }
}
