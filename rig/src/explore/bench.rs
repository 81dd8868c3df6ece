//! `rig explore-bench`: how many runs each way of searching takes to find a bug, over a fixed
//! set of buggy harnesses (issue 37, item 2). A bug is a harness policy explored on one workload;
//! each is hunted by a depth-1 sweep, a depth-2 sweep, the swarm (`explore --mode swarm`) and
//! the guided explorer (`explore`, its default), the last two from several starting seeds.
//!
//! A run *finds the bug* when it trips an oracle beyond what the workload's uncut run trips
//! (as sweep and explore judge it) and the same cuts at the same seed under the reference
//! policy do not trip that oracle: the harness's known gaps, which any policy shares, are not
//! the bug. The runs counted are the runs with cuts in the order the searcher makes them (a
//! swarm seed's own uncut run, the runs that shrink a finding and the reference's check of it
//! are not counted), so the figure is the searcher's cost to the first finding, whatever the
//! number of threads.

use super::guided::Campaign;
use super::space::{Placement, SpaceOptions};
use super::swarm::draw;
use super::sweep::{plan, plan_pairs, run_job, SweepOptions, Verdict};
use super::{bare_run, fired_beyond, run_placed, runnable_space, workload, Runs};
use crate::capability::Skip;
use crate::run::RunOutcome;
use crate::scenario::Scenario;
use std::collections::{BTreeMap, BTreeSet};

/// A known-bad policy of the reference harness and the workload of `scenarios/workloads/` it is
/// hunted on: every policy whose bug takes at least one cut to show (the uncut run of its
/// workload does not trip it), with the workload the rediscovery table
/// (`rig/tests/rediscovery.rs`) finds it from. Fixed before the explorer was tuned against it.
pub const REFERENCE_BUGS: [(&str, &str); 18] = [
    ("swallow", "queued-successor.toml"),
    ("propagate", "multi-round.toml"),
    ("unguarded", "multi-round.toml"),
    ("replay-unfinished", "switch-with-lease.toml"),
    ("fresh-key", "switch-with-lease.toml"),
    ("no-fencing", "switch-with-lease.toml"),
    ("assume-failed", "multi-round.toml"),
    ("close-unsettled", "multi-round.toml"),
    ("results-only-when-answered", "multi-round.toml"),
    ("in-memory-cancel", "cancel-after-a-lookup.toml"),
    ("reset-on-retry", "budget-across-a-retry.toml"),
    ("readmit-consumed-input", "queued-successor.toml"),
    ("unconfirmed-reply", "multi-round.toml"),
    ("fence-effects-only", "takeover-while-running.toml"),
    ("latest-on-resume", "config-promoted-and-withdrawn.toml"),
    ("redo-completed-rounds", "long-turn.toml"),
    ("in-memory-expiry", "approval-expires-before-a-late-release.toml"),
    ("arrival-order-stream", "streamed-replies.toml"),
];

/// Bugs planted in the small harness (`rig/small-harness`, a team's first harness written from
/// the docs; `.cargo/planted.toml`) and the workload each is hunted on, run by its own binary
/// built with the `planted` feature: each of its planted bugs that a depth-1 or depth-2 sweep of
/// `multi-round.toml` (its richest workload) finds, and the two about queued input on
/// `input-queued-any-harness.toml`, where they are found. One takes two faults on one record: a
/// read-back after a write of unknown outcome that compares only the status (the write must
/// fail, then the one that reads it back must be cut too). Left out, since no sweep of those
/// workloads finds them: a "not done" decided for a requested action, a lease renewed while
/// paused, a key check trusted past its window (the README says so). Fixed before the explorer
/// was tuned against it; the retry under a fresh idempotency key joined once the `late` cut
/// could show it (a request landing after its retry, at `rounds-any-harness.toml`, whose ticket
/// service keeps keys).
pub const SMALL_HARNESS_BUGS: [(&str, &str); 8] = [
    ("small-done-recorded-before-acceptance", "multi-round.toml"),
    ("small-end-answered-before-it-is-durable", "multi-round.toml"),
    ("small-settled-result-not-transcribed", "multi-round.toml"),
    ("small-current-only-at-the-delivered-step", "multi-round.toml"),
    ("small-readback-compares-the-status", "multi-round.toml"),
    ("small-input-removed-before-admission", "input-queued-any-harness.toml"),
    ("small-spent-input-admitted-again", "input-queued-any-harness.toml"),
    ("small-retry-under-a-fresh-key", "rounds-any-harness.toml"),
];

/// A way of searching for a bug.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Searcher {
    /// `rig sweep --depth 1`: every single placement of the uncut run, in the sweep's order.
    Depth1,
    /// `rig sweep --depth 2`: the single placements, then the pairs within the default budget.
    Depth2,
    /// `rig explore --mode swarm`: a fresh random mix per seed, from the starting seed on.
    Swarm,
    /// `rig explore` (guided): a campaign over runs from the starting seed on.
    Guided,
}

impl Searcher {
    pub const ALL: [Searcher; 4] = [Searcher::Depth1, Searcher::Depth2, Searcher::Swarm, Searcher::Guided];

    pub fn name(self) -> &'static str {
        match self {
            Searcher::Depth1 => "depth-1",
            Searcher::Depth2 => "depth-2",
            Searcher::Swarm => "swarm",
            Searcher::Guided => "guided",
        }
    }

    /// Whether its runs depend on a starting seed (and so are measured from several).
    pub fn seeded(self) -> bool {
        matches!(self, Searcher::Swarm | Searcher::Guided)
    }
}

/// One search for one bug.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Hunt {
    /// The run (from 1) that first found the bug; `None` if no run within the cap did.
    pub first: Option<u64>,
    /// Runs with cuts made: up to the first finding, or all the searcher had (or the cap).
    pub runs: u64,
    /// The oracle that found it and the cuts of that run.
    pub oracle: Option<String>,
    pub cuts: Vec<String>,
    /// The finding's run had two cuts about one action or record (a retry, a readback or a
    /// reconciliation of it met a second fault).
    pub same_subject: bool,
    /// A signal stopped the search before it found the bug or ran out of runs: no figure.
    pub interrupted: bool,
}

/// Tells a run that tripped an oracle with the bug apart from the harness's known gaps: the same
/// cuts at the same seed under the reference policy, with no planted bug on.
struct Judge<'a> {
    harness: &'a dyn Runs,
    workload: &'a Scenario,
    /// The bug is a planted one: the judge's runs turn it off.
    planted: bool,
    /// The reference policy's uncut run at each seed asked about.
    uncut: BTreeMap<u64, RunOutcome>,
}

impl Judge<'_> {
    /// The first oracle of `fired` (tripped with the bug) the reference does not trip with the
    /// same cuts at the same seed.
    fn bug(&mut self, placements: &[Placement], seed: u64, fired: &BTreeSet<String>) -> Option<String> {
        if fired.is_empty() {
            return None;
        }
        let (harness, workload) = (self.harness.reference(), self.workload);
        let known = |uncut: &mut BTreeMap<u64, RunOutcome>| {
            let uncut = uncut.entry(seed).or_insert_with(|| harness.run(workload, &bare_run("reference"), seed));
            let (outcome, _) = run_placed(harness, workload, placements, "reference", seed);
            fired_beyond(&outcome, uncut)
        };
        let known =
            if self.planted { crate::planted::scoped(None, || known(&mut self.uncut)) } else { known(&mut self.uncut) };
        fired.iter().find(|oracle| !known.contains(*oracle)).cloned()
    }
}

/// The bug found by the run just made.
fn found(hunt: &mut Hunt, oracle: String, placements: &[Placement]) {
    hunt.first = Some(hunt.runs);
    hunt.oracle = Some(oracle);
    hunt.cuts = placements.iter().map(Placement::id).collect();
    let subjects: Vec<Option<String>> = placements.iter().map(|p| p.site.subject()).collect();
    hunt.same_subject = subjects.len() == 2 && subjects[0].is_some() && subjects[0] == subjects[1];
}

/// Hunts the bug `policy` shows on `scenario`'s workload with `searcher` (with the planted bug
/// `planted` on: see [`crate::planted::scoped`]): from `start` (the sweeps' simulation seed is
/// always 0), for at most `cap` runs with cuts (a sweep has its own end: its plan). `Err` when
/// the harness cannot run the workload.
pub fn hunt(
    harness: &dyn Runs,
    scenario: &Scenario,
    policy: &str,
    planted: Option<&str>,
    searcher: Searcher,
    start: u64,
    cap: u64,
) -> Result<Hunt, Skip> {
    match planted {
        Some(bug) => {
            crate::planted::scoped(Some(bug), || search(harness, scenario, policy, true, searcher, start, cap))
        }
        None => search(harness, scenario, policy, false, searcher, start, cap),
    }
}

fn search(
    harness: &dyn Runs,
    scenario: &Scenario,
    policy: &str,
    planted: bool,
    searcher: Searcher,
    start: u64,
    cap: u64,
) -> Result<Hunt, Skip> {
    let workload = workload(scenario, false);
    if let Some(skip) = harness.skip(&workload, policy) {
        return Err(skip);
    }
    if crate::interrupt::requested() {
        return Ok(Hunt { interrupted: true, ..Hunt::default() });
    }
    let mut judge = Judge { harness, workload: &workload, planted, uncut: BTreeMap::new() };
    let mut hunt = Hunt::default();
    // A signal (`rig::interrupt`) stops the search before its next run.
    let stop = |hunt: &mut Hunt| {
        hunt.interrupted = crate::interrupt::requested();
        hunt.interrupted
    };
    match searcher {
        Searcher::Depth1 | Searcher::Depth2 => {
            let depth = if searcher == Searcher::Depth1 { 1 } else { 2 };
            let options = SweepOptions { policy: policy.to_string(), depth, ..SweepOptions::default() };
            let mut plan = plan(harness, scenario, &options)?;
            let mut runs = Vec::new();
            let mut next = 0;
            loop {
                while next < plan.jobs.len() && hunt.runs < cap {
                    if stop(&mut hunt) {
                        return Ok(hunt);
                    }
                    let run = run_job(harness, &plan, &plan.jobs[next]);
                    next += 1;
                    hunt.runs += 1;
                    if let Verdict::Fired(oracles) = &run.verdict {
                        if let Some(oracle) = judge.bug(&run.placements, options.seed, oracles) {
                            found(&mut hunt, oracle, &run.placements);
                            return Ok(hunt);
                        }
                    }
                    runs.push(run);
                }
                // The singles are done: a depth-2 sweep goes on with its pairs, once.
                if depth < 2 || next > plan.singles || hunt.runs >= cap {
                    return Ok(hunt);
                }
                plan_pairs(&mut plan, &runs);
                if plan.jobs.len() == next {
                    return Ok(hunt);
                }
            }
        }
        Searcher::Swarm => {
            for seed in start..start.saturating_add(cap) {
                if stop(&mut hunt) {
                    return Ok(hunt);
                }
                let baseline = harness.run(&workload, &bare_run(policy), seed);
                let space = runnable_space(harness, &workload, &baseline, &SpaceOptions::default());
                let mix = draw(seed, &space, &harness.wired(&workload));
                if mix.is_empty() {
                    continue;
                }
                hunt.runs += 1;
                let (outcome, _) = run_placed(harness, &workload, &mix, policy, seed);
                let fired = fired_beyond(&outcome, &baseline);
                if let Some(oracle) = judge.bug(&mix, seed, &fired) {
                    found(&mut hunt, oracle, &mix);
                    return Ok(hunt);
                }
            }
            Ok(hunt)
        }
        Searcher::Guided => {
            let mut campaign = Campaign::new(harness, scenario, policy, start..start.saturating_add(cap), false)?;
            loop {
                let trials = campaign.batch();
                if trials.is_empty() {
                    return Ok(hunt);
                }
                let mut made = Vec::with_capacity(trials.len());
                for trial in &trials {
                    if stop(&mut hunt) {
                        return Ok(hunt);
                    }
                    let tried = campaign.try_mix(trial);
                    hunt.runs += 1;
                    if let Some(oracle) = judge.bug(&tried.mix, campaign.seed, &tried.fired) {
                        found(&mut hunt, oracle, &tried.mix);
                        return Ok(hunt);
                    }
                    made.push(tried);
                }
                for tried in made {
                    campaign.fold(tried);
                }
            }
        }
    }
}

/// The median of runs to a first finding, a search that found nothing counting as more than
/// any that did: `None` when that is the median.
pub fn median(firsts: &[Option<u64>]) -> Option<u64> {
    if firsts.is_empty() {
        return None;
    }
    let mut sorted: Vec<u64> = firsts.iter().map(|first| first.unwrap_or(u64::MAX)).collect();
    sorted.sort_unstable();
    let middle = sorted.len() / 2;
    let median = if sorted.len() % 2 == 1 {
        sorted[middle]
    } else {
        let (low, high) = (sorted[middle - 1], sorted[middle]);
        if high == u64::MAX {
            u64::MAX
        } else {
            (low + high).div_ceil(2)
        }
    };
    (median != u64::MAX).then_some(median)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cut::Interrupt;
    use crate::explore::space::{Kind, Site};
    use crate::explore::sweep::sweep;
    use crate::HarnessFactory;
    use std::path::Path;
    use std::sync::Arc;

    #[test]
    fn a_search_that_found_nothing_counts_as_more_than_any_that_did() {
        assert_eq!(median(&[Some(5), None, Some(1)]), Some(5));
        assert_eq!(median(&[Some(5), None, None]), None);
        assert_eq!(median(&[Some(4), Some(7)]), Some(6));
        assert_eq!(median(&[Some(4), None]), None);
        assert_eq!(median(&[]), None);
    }

    fn multi_round() -> Scenario {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scenarios/workloads/multi-round.toml");
        Scenario::load(&path).unwrap()
    }

    /// The names `--searcher` takes and the JSON and the table are keyed by
    /// (rig/docs/explore.md); only the swarm and the guided explorer start from a seed.
    #[test]
    fn each_searcher_has_its_command_line_name_and_only_the_explorers_are_seeded() {
        let named: Vec<(&str, bool)> = Searcher::ALL.iter().map(|s| (s.name(), s.seeded())).collect();
        assert_eq!(named, [("depth-1", false), ("depth-2", false), ("swarm", true), ("guided", true)]);
    }

    /// A finding's run is the run just made; its cuts are "about one subject" only when they are
    /// two cuts about the same action or record.
    #[test]
    fn a_finding_names_its_run_oracle_and_cuts_and_whether_both_cuts_are_about_one_subject() {
        let at = |action: Option<&str>, nth: u64| {
            let about = action.map(|a| vec![("action_id".to_string(), a.to_string())]).unwrap_or_default();
            Placement {
                site: Site::Call { function: "ticket::create".into(), about, nth },
                kind: Kind::Timeout,
                ms: None,
            }
        };
        let mut hunt = Hunt { runs: 7, ..Hunt::default() };
        found(&mut hunt, "ledger".into(), &[at(Some("a1"), 1), at(Some("a1"), 2)]);
        assert_eq!((hunt.first, hunt.oracle.as_deref(), hunt.same_subject), (Some(7), Some("ledger"), true));
        assert_eq!(hunt.cuts, [at(Some("a1"), 1).id(), at(Some("a1"), 2).id()]);
        let same_subject = |placements: &[Placement]| {
            let mut hunt = Hunt::default();
            found(&mut hunt, "ledger".into(), placements);
            hunt.same_subject
        };
        assert!(!same_subject(&[at(Some("a1"), 1), at(Some("a2"), 1)]), "two actions");
        assert!(!same_subject(&[at(None, 1), at(None, 2)]), "about no action or record");
        assert!(!same_subject(&[at(Some("a1"), 1)]), "one cut");
        assert!(!same_subject(&[at(Some("a1"), 1), at(Some("a1"), 2), at(Some("a1"), 3)]), "three cuts");
    }

    /// Each searcher's runs to the first finding of a bug the uncut run does not show
    /// (`propagate` on `multi-round.toml`: a store error passed on as the turn's reply, which
    /// the second single of the sweep's order already shows as an untruthful reply; a swarm's
    /// mix may show it by another oracle first): the hunt stops at the finding,
    /// and with a cap below it finds nothing in as many runs as the cap.
    #[test]
    fn each_searcher_stops_at_its_first_finding_and_finds_nothing_below_it() {
        let harness = crate::reference();
        let scenario = multi_round();
        let plan =
            plan(&harness, &scenario, &SweepOptions { policy: "propagate".into(), ..SweepOptions::default() }).unwrap();
        for searcher in Searcher::ALL {
            let hunt = |cap: u64| search(&harness, &scenario, "propagate", false, searcher, 0, cap).unwrap();
            let found = hunt(64);
            let first = found.first.unwrap_or_else(|| panic!("{searcher:?}: {found:?}"));
            assert!(first >= 1 && found.runs == first, "{searcher:?}: {found:?}");
            assert!(found.oracle.is_some() && !found.interrupted && !found.cuts.is_empty(), "{searcher:?}: {found:?}");
            if !searcher.seeded() {
                // The sweeps' order: the finding is a single of the plan, the same at either depth.
                assert_eq!((first, found.oracle.as_deref()), (2, Some("truthful-reply")), "{searcher:?}");
                assert_eq!(found.cuts, plan.jobs[1].iter().map(Placement::id).collect::<Vec<_>>());
            }
            assert_eq!(hunt(first), found, "{searcher:?}: a cap at the finding");
            let short = hunt(first - 1);
            assert_eq!((short.first, short.runs, short.oracle), (None, first - 1, None), "{searcher:?}");
        }
        let from_hunt = hunt(&harness, &scenario, "propagate", None, Searcher::Depth1, 0, 64).unwrap();
        assert_eq!(from_hunt.first, Some(2), "no planted bug: the same search");
    }

    /// The reference harness with only the crashes at one interruption point of one worker
    /// runnable: a cut space of a few singles and fewer pairs, so a sweep can be run to its end.
    struct CrashesAt {
        inner: Arc<dyn HarnessFactory>,
        worker: String,
        point: String,
    }

    impl Runs for CrashesAt {
        fn name(&self) -> &str {
            "crashes-at"
        }
        fn run(&self, scenario: &Scenario, run: &crate::scenario::PolicyRun, seed: u64) -> RunOutcome {
            Runs::run(&self.inner, scenario, run, seed)
        }
        fn skip(&self, workload: &Scenario, policy: &str) -> Option<Skip> {
            Runs::skip(&self.inner, workload, policy)
        }
        fn cannot(&self, scenario: &Scenario) -> Option<Vec<String>> {
            let only = scenario.interrupts.iter().all(|cut| {
                (cut.worker.as_str(), cut.point.as_str(), cut.interrupt)
                    == (self.worker.as_str(), self.point.as_str(), Interrupt::Crash)
            });
            (!only || !scenario.cuts.is_empty() || scenario.proxy.is_some()).then(|| vec!["not this crash".into()])
        }
        fn reference(&self) -> &dyn Runs {
            self
        }
    }

    fn crashes_at_first_point(scenario: &Scenario) -> CrashesAt {
        let inner = crate::reference();
        let uncut = Runs::run(&inner, &workload(scenario, false), &bare_run("reference"), 0);
        let ((worker, point), _) =
            uncut.interrupt_points.iter().find(|(_, n)| **n >= 2).expect("a point reached twice");
        CrashesAt { inner, worker: worker.clone(), point: point.clone() }
    }

    /// A search that finds nothing (the reference policy hunted) makes every run its searcher
    /// has and no more: a depth-1 sweep its singles, a depth-2 sweep the singles then the pairs
    /// (the runs `rig sweep` makes at each depth), each up to the cap; the swarm and the guided
    /// explorer count their runs with cuts up to the cap.
    #[test]
    fn a_search_that_finds_nothing_makes_every_run_of_its_searcher_up_to_the_cap() {
        let scenario = multi_round();
        let harness = crashes_at_first_point(&scenario);
        let swept = |depth: u8| {
            let options = SweepOptions { depth, ..SweepOptions::default() };
            let report = sweep(&harness, &scenario, &options).unwrap();
            assert!(report.findings.is_empty(), "the reference's own sweep is clean");
            report.runs.len() as u64
        };
        let (singles, all) = (swept(1), swept(2));
        assert!(singles >= 2 && all > singles, "singles {singles}, with pairs {all}");
        let hunt = |searcher: Searcher, cap: u64| {
            let hunt = search(&harness, &scenario, "reference", false, searcher, 0, cap).unwrap();
            assert_eq!((hunt.first, hunt.interrupted), (None, false), "{searcher:?}");
            hunt.runs
        };
        assert_eq!(hunt(Searcher::Depth1, 1_000), singles);
        assert_eq!(hunt(Searcher::Depth1, singles + 1), singles, "no pairs at depth 1");
        assert_eq!(hunt(Searcher::Depth2, 1_000), all);
        assert_eq!(hunt(Searcher::Depth2, singles), singles, "the cap met with the singles");
        assert_eq!(hunt(Searcher::Depth2, singles + 1), singles + 1, "the cap met among the pairs");
        assert_eq!(hunt(Searcher::Depth1, 1), 1);
        for searcher in [Searcher::Swarm, Searcher::Guided] {
            let runs = hunt(searcher, 6);
            assert!((1..=6).contains(&runs), "{searcher:?}: {runs}");
        }
    }

    /// A search begun after a signal (a job `explore-bench` had not started when Ctrl-C came)
    /// makes no run and says it was cut short, so the table gives it no figure instead of
    /// counting a search that found nothing. A signal is the whole process's, so the search is
    /// made in a child process: this test binary running this test alone.
    #[test]
    fn a_search_begun_after_a_signal_makes_no_run_and_says_it_was_cut_short() {
        const CHILD: &str = "RIG_BENCH_TEST_SIGNALLED_CHILD";
        let name = "explore::bench::tests::a_search_begun_after_a_signal_makes_no_run_and_says_it_was_cut_short";
        if std::env::var_os(CHILD).is_none() {
            let child = std::process::Command::new(std::env::current_exe().unwrap())
                .args([name, "--exact", "--test-threads", "1", "--nocapture"])
                .env(CHILD, "1")
                .output()
                .unwrap();
            let (out, err) = (String::from_utf8_lossy(&child.stdout), String::from_utf8_lossy(&child.stderr));
            assert!(child.status.success() && out.contains("1 passed"), "the child: {}\n{out}\n{err}", child.status);
            return;
        }
        crate::interrupt::wind_down();
        // SAFETY: raising a signal whose handler `wind_down` has just put in place.
        assert_eq!(unsafe { libc::raise(libc::SIGTERM) }, 0);
        let heard = (0..2_000).any(|_| {
            std::thread::sleep(std::time::Duration::from_millis(5));
            crate::interrupt::requested()
        });
        assert!(heard, "the signal was recorded");
        let (harness, scenario) = (crate::reference(), multi_round());
        for searcher in Searcher::ALL {
            let hunt = search(&harness, &scenario, "propagate", false, searcher, 0, 64).unwrap();
            assert_eq!(hunt, Hunt { interrupted: true, ..Hunt::default() }, "{searcher:?}");
        }
    }
}
