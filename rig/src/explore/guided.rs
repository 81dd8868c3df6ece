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
