//! `rig sweep`: every placement of the cut space at depth 1, then bounded pairs, most promising
//! first (sites next to effects, commits and acknowledgements).

use super::space::{Placement, SpaceOptions};
use super::{
    bare_run, finding, fired, fired_beyond, run_placed, runnable_space, workload, Finding, Found, Runs, Signature,
};
use crate::capability::Skip;
use crate::run::RunOutcome;
use crate::scenario::Scenario;
use std::collections::btree_map::Entry;
use std::collections::{BTreeMap, BTreeSet};

/// What to sweep and how far.
#[derive(Debug, Clone)]
pub struct SweepOptions {
    pub policy: String,
    /// 1: every placement alone; 2: then pairs of them.
    pub depth: u8,
    /// The most runs (placements and pairs together); pairs are cut first.
    pub budget: Option<usize>,
    /// Keep the scenario's own scripted cuts in the workload (by default they are removed).
    pub keep_cuts: bool,
    pub seed: u64,
    pub space: SpaceOptions,
}

impl Default for SweepOptions {
    fn default() -> Self {
        Self {
            policy: "reference".into(),
            depth: 1,
            budget: None,
            keep_cuts: false,
            seed: 0,
            space: SpaceOptions::default(),
        }
    }
}

/// How pairs are bounded when no budget is given: runs beyond the single placements.
pub const PAIRS_DEFAULT: usize = 1_000;

/// How one run of the sweep ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// No oracle fired beyond what the uncut run already trips (see [`super::fired_beyond`]).
    Clean,
    /// A placement never fired: the run did not reach its site.
    Unreached,
    /// These oracles fired (or `limit`).
    Fired(BTreeSet<String>),
}

/// One run of the sweep.
#[derive(Debug, Clone)]
pub struct SweepRun {
    pub placements: Vec<Placement>,
    pub verdict: Verdict,
    pub wall_us: u64,
}

/// The workload, its uncut run and the placements to try: everything the runs need, so they
/// can be made in any order, on any thread.
pub struct SweepPlan {
    pub workload: Scenario,
    pub options: SweepOptions,
    pub baseline: RunOutcome,
    /// Oracles the uncut run already trips. A run's finding is a violation the uncut run does
    /// not have ([`super::fired_beyond`]), of these oracles too.
    pub baseline_fired: BTreeSet<String>,
    pub jobs: Vec<Vec<Placement>>,
    /// Pairs the budget left out.
    pub skipped: usize,
}

/// What a sweep found.
pub struct SweepReport {
    pub baseline_fired: BTreeSet<String>,
    pub baseline_failures: Vec<String>,
    pub runs: Vec<SweepRun>,
    /// One per [`Signature`], the first found, with the runs that came to the same named in it.
    pub findings: Vec<Finding>,
    pub skipped: usize,
}

/// Runs the uncut workload and lays out every run of the sweep; `Err` with why, when the
/// harness cannot run the workload ([`Runs::skip`]): nothing is run then.
pub fn plan(harness: &dyn Runs, scenario: &Scenario, options: &SweepOptions) -> Result<SweepPlan, Skip> {
    let workload = workload(scenario, options.keep_cuts);
    if let Some(skip) = harness.skip(&workload, &options.policy) {
        return Err(skip);
    }
    let baseline = harness.run(&workload, &bare_run(&options.policy), options.seed);
    let baseline_fired = fired(&baseline);
    let singles = runnable_space(harness, &workload, &baseline, &options.space);
    let mut jobs: Vec<Vec<Placement>> = singles.iter().map(|p| vec![p.clone()]).collect();
    let budget = options.budget.unwrap_or(match options.depth {
        1 => singles.len(),
        _ => singles.len() + PAIRS_DEFAULT,
    });
    let mut skipped = 0;
    if options.depth >= 2 {
        let mut pairs: Vec<(u8, usize, usize)> = Vec::new();
        for (i, a) in singles.iter().enumerate() {
            for (j, b) in singles.iter().enumerate().skip(i + 1) {
                if a.site != b.site {
                    pairs.push((a.site.promise() + b.site.promise(), i, j));
                }
            }
        }
        // Most promising first; ties in the order the sites came.
        pairs.sort_by(|x, y| y.0.cmp(&x.0).then(x.1.cmp(&y.1)).then(x.2.cmp(&y.2)));
        let room = budget.saturating_sub(jobs.len());
        skipped = pairs.len().saturating_sub(room);
        jobs.extend(pairs.into_iter().take(room).map(|(_, i, j)| vec![singles[i].clone(), singles[j].clone()]));
    }
    if jobs.len() > budget {
        skipped += jobs.len() - budget;
        jobs.truncate(budget);
    }
    Ok(SweepPlan { workload, options: options.clone(), baseline, baseline_fired, jobs, skipped })
}

/// Makes one run of the plan.
pub fn run_job(harness: &dyn Runs, plan: &SweepPlan, placements: &[Placement]) -> SweepRun {
    let (outcome, reached) = run_placed(harness, &plan.workload, placements, &plan.options.policy, plan.options.seed);
    let new = fired_beyond(&outcome, &plan.baseline);
    let verdict = if !reached {
        Verdict::Unreached
    } else if new.is_empty() {
        Verdict::Clean
    } else {
        Verdict::Fired(new)
    };
    SweepRun { placements: placements.to_vec(), verdict, wall_us: outcome.wall_us }
}

/// Folds the runs (in plan order) into findings: one per [`Signature`], the first run found,
/// naming the others in [`Finding::also`]; each checked against the reference harness when it
/// was found under another policy.
pub fn report(harness: &dyn Runs, plan: SweepPlan, runs: Vec<SweepRun>) -> SweepReport {
    let mut findings: BTreeMap<Signature, Finding> = BTreeMap::new();
    for run in &runs {
        let Verdict::Fired(oracles) = &run.verdict else { continue };
        let workload = plan.workload.path.display().to_string();
        // The file replays the whole run: what the uncut run trips fires there too.
        let all: BTreeSet<String> = oracles.union(&plan.baseline_fired).cloned().collect();
        for oracle in oracles {
            match findings.entry(Signature::of(&workload, oracle, &run.placements)) {
                Entry::Vacant(entry) => {
                    entry.insert(finding(
                        &plan.workload,
                        &run.placements,
                        &plan.options.policy,
                        Found { oracle, fired: &all },
                        plan.options.seed,
                        &BTreeSet::new(),
                        &format!("sweep of harness `{}`", harness.name()),
                    ));
                }
                Entry::Occupied(mut entry) => {
                    let ids: Vec<String> = run.placements.iter().map(Placement::id).collect();
                    entry.get_mut().also.push(ids.join(" + "));
                }
            }
        }
    }
    let mut findings: Vec<Finding> = findings.into_values().collect();
    for finding in &mut findings {
        finding.check_reference(harness, &plan.workload, &BTreeSet::new());
        finding.scenario_file = finding.file_text(&[]);
    }
    SweepReport {
        baseline_fired: plan.baseline_fired,
        baseline_failures: plan.baseline.failures,
        runs,
        findings,
        skipped: plan.skipped,
    }
}

/// Sweeps `scenario`'s workload under `options`, one run after another; `Err` with why, when
/// the harness cannot run the workload, as `rig sweep` skips it.
pub fn sweep(harness: &dyn Runs, scenario: &Scenario, options: &SweepOptions) -> Result<SweepReport, Skip> {
    let plan = plan(harness, scenario, options)?;
    let runs = plan.jobs.iter().map(|job| run_job(harness, &plan, job)).collect();
    Ok(report(harness, plan, runs))
}

/// What the sweeps of many workloads came to, as `rig sweep`'s summary line says it: add each
/// workload's [`sweep`] (or skip), then [`SweepTally::summary`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SweepTally {
    /// Workloads swept.
    pub swept: u64,
    /// Of them, those with a finding, or whose uncut run already trips an oracle.
    pub with_findings: u64,
    /// Distinct findings, one per signature, over every workload.
    pub distinct: usize,
    /// Workloads skipped: the harness lacks what they need.
    pub skipped: u64,
}

impl SweepTally {
    /// Counts one workload's sweep, or its skip.
    pub fn add(&mut self, swept: &Result<SweepReport, Skip>) {
        match swept {
            Ok(report) => self.count(report),
            Err(_) => self.skipped += 1,
        }
    }

    /// Counts one workload's sweep.
    pub fn count(&mut self, report: &SweepReport) {
        self.swept += 1;
        self.with_findings += u64::from(report.found_anything());
        self.distinct += report.findings.len();
    }

    /// `swept 3 workload(s): 1 with findings (4 distinct findings), 0 skipped (harness NAME)`.
    pub fn summary(&self, harness: &str) -> String {
        format!(
            "swept {} workload(s): {} with findings ({} distinct finding{}), {} skipped (harness {harness})",
            self.swept,
            self.with_findings,
            self.distinct,
            if self.distinct == 1 { "" } else { "s" },
            self.skipped
        )
    }
}

impl SweepReport {
    /// Whether the sweep found anything: a finding, or an oracle its uncut run trips.
    pub fn found_anything(&self) -> bool {
        !self.baseline_fired.is_empty() || !self.findings.is_empty()
    }
}
