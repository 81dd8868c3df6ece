//! `rig sweep`: every placement of the cut space at depth 1, then bounded pairs: a second cut on
//! the same action or record after each single one, then the others most promising first (sites
//! next to effects, commits and acknowledgements). What it covered is counted (abstract states,
//! and for a clean sweep a [`Certificate`]).

use super::space::{follow_ups as follow_ups_in, Placement, SpaceOptions};
use super::state::{Abstraction, Coverage, Trajectory};
use super::{
    bare_run, finding, fired, fired_beyond, run_placed_at, runnable_space, workload, Finding, Found, Runs, Signature,
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
    /// The abstract states the run went through.
    pub trajectory: Trajectory,
    /// At depth 2, for a single placement that left the run clean: where a second fault on the
    /// same action or record can go in that run, after the first fired (the retry, readback or
    /// reconciliation it caused among them). [`plan_pairs`] pairs the placement with each.
    pub follow_ups: Vec<Placement>,
}

/// The pairs a depth-2 sweep planned, and those its budget left out.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Pairs {
    /// A single placement that left the run clean, and a second cut on the same action or
    /// record in that run, after it fired.
    pub same_subject: usize,
    pub same_subject_left: usize,
    /// Two placements of the uncut run at different sites, most promising first.
    pub others: usize,
    pub others_left: usize,
}

/// The workload, its uncut run and the placements to try: everything the runs need, so they
/// can be made in any order, on any thread. At depth 2 the jobs are first the single
/// placements; once they have run, [`plan_pairs`] adds the pairs.
pub struct SweepPlan {
    pub workload: Scenario,
    pub options: SweepOptions,
    pub baseline: RunOutcome,
    /// Oracles the uncut run already trips. A run's finding is a violation the uncut run does
    /// not have ([`super::fired_beyond`]), of these oracles too.
    pub baseline_fired: BTreeSet<String>,
    pub jobs: Vec<Vec<Placement>>,
    /// How many of the jobs are single placements (the first ones), and how many singles the
    /// budget left out.
    pub singles: usize,
    pub singles_left: usize,
    pub pairs: Pairs,
    /// Runs the budget left out: singles and pairs.
    pub skipped: usize,
    /// What a run's abstract state is read from, and the uncut run's trajectory.
    pub abstraction: Abstraction,
    pub baseline_trajectory: Trajectory,
    budget: usize,
}

/// What a sweep found, what it covered, and, if clean, what that means.
pub struct SweepReport {
    pub baseline_fired: BTreeSet<String>,
    pub baseline_failures: Vec<String>,
    pub runs: Vec<SweepRun>,
    /// One per [`Signature`], the first found, with the runs that came to the same named in it.
    pub findings: Vec<Finding>,
    pub skipped: usize,
    /// The abstract states and transitions the uncut run and every run of the sweep reached.
    pub coverage: Coverage,
    pub certificate: Certificate,
}

/// Runs the uncut workload and lays out the single placements of the sweep (at depth 2,
/// [`plan_pairs`] adds the pairs once they have run); `Err` with why, when the harness cannot
/// run the workload ([`Runs::skip`]): nothing is run then.
pub fn plan(harness: &dyn Runs, scenario: &Scenario, options: &SweepOptions) -> Result<SweepPlan, Skip> {
    let workload = workload(scenario, options.keep_cuts);
    if let Some(skip) = harness.skip(&workload, &options.policy) {
        return Err(skip);
    }
    let baseline = harness.run(&workload, &bare_run(&options.policy), options.seed);
    let baseline_fired = fired(&baseline);
    let singles = runnable_space(harness, &workload, &baseline, &options.space);
    let budget = options.budget.unwrap_or(match options.depth {
        1 => singles.len(),
        _ => singles.len() + PAIRS_DEFAULT,
    });
    let mut jobs: Vec<Vec<Placement>> = singles.iter().map(|p| vec![p.clone()]).collect();
    let singles_left = jobs.len().saturating_sub(budget);
    jobs.truncate(budget);
    let abstraction = Abstraction::new(&workload, harness.layout());
    let baseline_trajectory = abstraction.trajectory(baseline.trace.events());
    Ok(SweepPlan {
        workload,
        options: options.clone(),
        baseline,
        baseline_fired,
        singles: jobs.len(),
        jobs,
        singles_left,
        pairs: Pairs::default(),
        skipped: singles_left,
        abstraction,
        baseline_trajectory,
        budget,
    })
}

/// At depth 2, once the single placements have run (`singles`, in plan order): adds the pairs,
/// within the budget. First a second cut on the same action or record, after the first fired,
/// for every single placement that left its run clean (the calls a fault causes, such as a
/// retry, a readback or a reconciliation, exist only in that fault's run, so no pair of the
/// uncut run's sites can reach them); then pairs of the uncut run's placements at two sites,
/// most promising first. What does not fit is counted, never dropped silently.
pub fn plan_pairs(plan: &mut SweepPlan, singles: &[SweepRun]) {
    if plan.options.depth < 2 {
        return;
    }
    let mut seen: BTreeSet<Vec<String>> = BTreeSet::new();
    let mut key = |pair: &[Placement]| {
        let mut ids: Vec<String> = pair.iter().map(Placement::id).collect();
        ids.sort();
        seen.insert(ids)
    };
    let mut same_subject = Vec::new();
    for run in singles.iter().filter(|run| run.placements.len() == 1) {
        for follow_up in &run.follow_ups {
            let pair = vec![run.placements[0].clone(), follow_up.clone()];
            if key(&pair) {
                same_subject.push(pair);
            }
        }
    }
    let room = plan.budget.saturating_sub(plan.jobs.len());
    plan.pairs.same_subject = same_subject.len().min(room);
    plan.pairs.same_subject_left = same_subject.len() - plan.pairs.same_subject;
    plan.jobs.extend(same_subject.into_iter().take(room));

    let singles: Vec<&Placement> = plan.jobs[..plan.singles].iter().map(|job| &job[0]).collect();
    let mut others: Vec<(u8, usize, usize)> = Vec::new();
    for (i, a) in singles.iter().enumerate() {
        for (j, b) in singles.iter().enumerate().skip(i + 1) {
            if a.site != b.site {
                others.push((a.site.promise() + b.site.promise(), i, j));
            }
        }
    }
    // Most promising first; ties in the order the sites came.
    others.sort_by(|x, y| y.0.cmp(&x.0).then(x.1.cmp(&y.1)).then(x.2.cmp(&y.2)));
    let others: Vec<Vec<Placement>> = others
        .into_iter()
        .map(|(_, i, j)| vec![singles[i].clone(), singles[j].clone()])
        .filter(|pair| key(pair))
        .collect();
    let room = plan.budget.saturating_sub(plan.jobs.len());
    plan.pairs.others = others.len().min(room);
    plan.pairs.others_left = others.len() - plan.pairs.others;
    plan.jobs.extend(others.into_iter().take(room));
    plan.skipped = plan.singles_left + plan.pairs.same_subject_left + plan.pairs.others_left;
}

/// Makes one run of the plan.
pub fn run_job(harness: &dyn Runs, plan: &SweepPlan, placements: &[Placement]) -> SweepRun {
    let options = &plan.options;
    let (outcome, indices) = run_placed_at(harness, &plan.workload, placements, &options.policy, options.seed);
    let reached = placements.iter().zip(&indices).all(|(p, i)| p.fired(&outcome, *i));
    let new = fired_beyond(&outcome, &plan.baseline);
    let verdict = if !reached {
        Verdict::Unreached
    } else if new.is_empty() {
        Verdict::Clean
    } else {
        Verdict::Fired(new)
    };
    let mut follow_ups = Vec::new();
    if let ([single], [index], Verdict::Clean, true) = (placements, &indices[..], &verdict, options.depth >= 2) {
        let fired_at = single.fired_at(&outcome, *index).unwrap_or(usize::MAX);
        if let Some(subject) = single.site.subject() {
            follow_ups = follow_ups_in(&harness.wired(&plan.workload), &outcome, &options.space, fired_at, &subject);
            follow_ups.retain(|q| q.site != single.site);
        }
    }
    let trajectory = plan.abstraction.trajectory(outcome.trace.events());
    SweepRun { placements: placements.to_vec(), verdict, wall_us: outcome.wall_us, trajectory, follow_ups }
}

/// Folds the runs (in plan order) into findings: one per [`Signature`], the first run found,
/// naming the others in [`Finding::also`]; each checked against the reference harness when it
/// was found under another policy. With them, what the sweep covered.
pub fn report(harness: &dyn Runs, plan: SweepPlan, runs: Vec<SweepRun>) -> SweepReport {
    let mut findings: BTreeMap<Signature, Finding> = BTreeMap::new();
    let mut coverage = Coverage::default();
    coverage.add(&plan.baseline_trajectory);
    for run in &runs {
        coverage.add(&run.trajectory);
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
    let singles = &runs[..plan.singles.min(runs.len())];
    let sites: BTreeSet<&super::space::Site> = singles.iter().map(|run| &run.placements[0].site).collect();
    let certificate = Certificate {
        depth: plan.options.depth,
        singles: singles.len(),
        singles_left: plan.singles_left,
        sites: sites.len(),
        pairs: plan.pairs,
        unreached: runs.iter().filter(|run| run.verdict == Verdict::Unreached).count(),
        uncut_fired: plan.baseline_fired.clone(),
        findings: findings.len(),
    };
    SweepReport {
        baseline_fired: plan.baseline_fired,
        baseline_failures: plan.baseline.failures,
        runs,
        findings,
        skipped: plan.skipped,
        coverage,
        certificate,
    }
}

/// What a sweep covered and what it left out. For a sweep with no finding, its
/// [`Certificate::statement`] says what that "clean" is worth: which cuts and pairs were tried,
/// and what was not (pairs over the budget, placements whose site was never reached, violations
/// the uncut run already has).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Certificate {
    pub depth: u8,
    /// Single placements run, and those the budget left out.
    pub singles: usize,
    pub singles_left: usize,
    /// The distinct sites of those single placements.
    pub sites: usize,
    pub pairs: Pairs,
    /// Runs whose placements did not all reach their site.
    pub unreached: usize,
    /// Oracles the uncut run already trips.
    pub uncut_fired: BTreeSet<String>,
    /// Distinct findings: a certificate is a statement about a sweep that has none.
    pub findings: usize,
}

impl Certificate {
    pub fn clean(&self) -> bool {
        self.findings == 0
    }

    /// What was covered (`every single cut at the 87 sites of the uncut run (351 placements)
    /// ... : no finding`), then what was not. For a sweep with findings, how many.
    pub fn statement(&self) -> String {
        let n = |count: usize| thousands(count);
        let mut covered = if self.singles_left == 0 {
            format!("every single cut at the {} sites of the uncut run ({} placements)", n(self.sites), n(self.singles))
        } else {
            format!("{} single cuts at {} sites of the uncut run", n(self.singles), n(self.sites))
        };
        if self.depth >= 2 {
            let pairs = &self.pairs;
            if pairs.same_subject_left == 0 {
                covered.push_str(&format!(
                    ", every second cut on the same action or record after each that left its run clean ({} pairs)",
                    n(pairs.same_subject)
                ));
            } else {
                covered.push_str(&format!(
                    ", {} pairs of a cut and a second cut on the same action or record after it",
                    n(pairs.same_subject)
                ));
            }
            covered.push_str(&format!(" and {} other pairs", n(pairs.others)));
        }
        let verdict = match self.findings {
            0 => "no finding".to_string(),
            1 => "1 distinct finding".to_string(),
            found => format!("{found} distinct findings"),
        };
        let mut left = Vec::new();
        if self.singles_left > 0 {
            left.push(format!("{} single cuts over the budget", n(self.singles_left)));
        }
        if self.pairs.same_subject_left > 0 {
            left.push(format!("{} pairs on one action or record over the budget", n(self.pairs.same_subject_left)));
        }
        if self.depth >= 2 && self.pairs.others_left > 0 {
            left.push(format!("{} other pairs over the budget", n(self.pairs.others_left)));
        }
        if self.depth < 2 {
            left.push("pairs of cuts (--depth 2)".to_string());
        }
        if self.unreached > 0 {
            left.push(format!("{} runs whose cut never reached its site", n(self.unreached)));
        }
        if !self.uncut_fired.is_empty() {
            let oracles: Vec<&str> = self.uncut_fired.iter().map(String::as_str).collect();
            left.push(format!(
                "violations the uncut run already has ({}: a cut's violation of these counts only when it is about something else)",
                oracles.join(", ")
            ));
        }
        let mut statement = format!("{covered}: {verdict}");
        if !left.is_empty() {
            statement.push_str(&format!("; not covered: {}", left.join("; ")));
        }
        statement
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "clean": self.clean(),
            "statement": self.statement(),
            "depth": self.depth,
            "singles": self.singles,
            "singles_over_budget": self.singles_left,
            "sites": self.sites,
            "pairs_same_subject": self.pairs.same_subject,
            "pairs_same_subject_over_budget": self.pairs.same_subject_left,
            "pairs_other": self.pairs.others,
            "pairs_other_over_budget": self.pairs.others_left,
            "unreached": self.unreached,
            "uncut_fired": self.uncut_fired,
        })
    }
}

/// `12,345`.
fn thousands(count: usize) -> String {
    let digits = count.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Sweeps `scenario`'s workload under `options`, one run after another; `Err` with why, when
/// the harness cannot run the workload, as `rig sweep` skips it.
pub fn sweep(harness: &dyn Runs, scenario: &Scenario, options: &SweepOptions) -> Result<SweepReport, Skip> {
    let mut plan = plan(harness, scenario, options)?;
    let mut runs: Vec<SweepRun> = plan.jobs.iter().map(|job| run_job(harness, &plan, job)).collect();
    plan_pairs(&mut plan, &runs);
    let pairs: Vec<SweepRun> = plan.jobs[runs.len()..].iter().map(|job| run_job(harness, &plan, job)).collect();
    runs.extend(pairs);
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

#[cfg(test)]
mod tests {
    use super::super::space::{Kind, Site};
    use super::*;
    use std::path::Path;

    fn multi_round() -> Scenario {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scenarios/workloads/multi-round.toml");
        Scenario::load(&path).unwrap()
    }

    fn call(function: &str, key: &str, nth: u64, kind: Kind) -> Placement {
        let about = vec![("scope".to_string(), "harness_turn".to_string()), ("key".to_string(), key.to_string())];
        Placement { site: Site::Call { function: function.into(), about, nth }, kind, ms: None }
    }

    fn clean_run(placements: Vec<Placement>, follow_ups: Vec<Placement>) -> SweepRun {
        SweepRun { placements, verdict: Verdict::Clean, wall_us: 0, trajectory: Trajectory::default(), follow_ups }
    }

    fn certificate() -> Certificate {
        Certificate {
            depth: 1,
            singles: 1_234,
            singles_left: 0,
            sites: 87,
            pairs: Pairs { others_left: 5, ..Pairs::default() },
            unreached: 0,
            uncut_fired: BTreeSet::new(),
            findings: 0,
        }
    }

    /// What a sweep covered, and each thing it did not, in words, with every count.
    #[test]
    fn a_certificate_says_what_was_covered_and_each_thing_that_was_not() {
        let clean = certificate();
        assert!(clean.clean());
        assert_eq!(
            clean.statement(),
            "every single cut at the 87 sites of the uncut run (1,234 placements): no finding; \
             not covered: pairs of cuts (--depth 2)"
        );
        let json = clean.json();
        assert_eq!((json["clean"].as_bool(), json["singles"].as_u64()), (Some(true), Some(1_234)));
        assert_eq!(json["statement"].as_str(), Some(clean.statement().as_str()));
        assert_eq!((json["pairs_other_over_budget"].as_u64(), json["depth"].as_u64()), (Some(5), Some(1)));

        let partial = Certificate {
            depth: 2,
            singles: 40,
            singles_left: 5,
            sites: 12,
            pairs: Pairs { same_subject: 7, same_subject_left: 0, others: 1_000, others_left: 2_500 },
            unreached: 3,
            uncut_fired: BTreeSet::from(["liveness".to_string(), "ledger".to_string()]),
            findings: 1,
        };
        assert!(!partial.clean());
        assert_eq!(
            partial.statement(),
            "40 single cuts at 12 sites of the uncut run, every second cut on the same action or record \
             after each that left its run clean (7 pairs) and 1,000 other pairs: 1 distinct finding; \
             not covered: 5 single cuts over the budget; 2,500 other pairs over the budget; 3 runs whose \
             cut never reached its site; violations the uncut run already has (ledger, liveness: a cut's \
             violation of these counts only when it is about something else)"
        );
        let pairs_left = Certificate {
            depth: 2,
            singles: 5,
            sites: 2,
            pairs: Pairs { same_subject: 3, same_subject_left: 4, others: 0, others_left: 0 },
            findings: 2,
            ..certificate()
        };
        assert_eq!(
            pairs_left.statement(),
            "every single cut at the 2 sites of the uncut run (5 placements), 3 pairs of a cut and a second \
             cut on the same action or record after it and 0 other pairs: 2 distinct findings; \
             not covered: 4 pairs on one action or record over the budget"
        );
        let all = Certificate { depth: 2, pairs: Pairs::default(), ..certificate() };
        assert!(all.statement().ends_with("(0 pairs) and 0 other pairs: no finding"), "{}", all.statement());
    }

    #[test]
    fn counts_are_written_with_a_comma_every_three_digits() {
        let written: Vec<String> = [0, 7, 999, 1_000, 12_345, 123_456, 1_234_567].map(thousands).to_vec();
        assert_eq!(written, ["0", "7", "999", "1,000", "12,345", "123,456", "1,234,567"]);
    }

    fn report_of(baseline_fired: &[&str], findings: Vec<Finding>) -> SweepReport {
        SweepReport {
            baseline_fired: baseline_fired.iter().map(|s| s.to_string()).collect(),
            baseline_failures: Vec::new(),
            runs: Vec::new(),
            findings,
            skipped: 0,
            coverage: Coverage::default(),
            certificate: certificate(),
        }
    }

    fn a_finding() -> Finding {
        let fired = BTreeSet::from(["ledger".to_string()]);
        let found = Found { oracle: "ledger", fired: &fired };
        finding(&workload(&multi_round(), false), &[], "reference", found, 0, &BTreeSet::new(), "test")
    }

    /// The summary line counts workloads swept, those with anything found (a finding or an
    /// oracle the uncut run trips), the distinct findings and the workloads skipped.
    #[test]
    fn the_tally_counts_workloads_with_findings_and_skips() {
        assert!(!report_of(&[], Vec::new()).found_anything());
        assert!(report_of(&["liveness"], Vec::new()).found_anything());
        assert!(report_of(&[], vec![a_finding()]).found_anything());
        let mut tally = SweepTally::default();
        tally.add(&Ok(report_of(&[], Vec::new())));
        tally.add(&Ok(report_of(&[], vec![a_finding(), a_finding()])));
        tally.add(&Ok(report_of(&["liveness"], Vec::new())));
        tally.add(&Err(Skip::not_live("h", vec!["a reason".into()])));
        tally.add(&Err(Skip::not_live("h", vec!["a reason".into()])));
        assert_eq!(tally, SweepTally { swept: 3, with_findings: 2, distinct: 2, skipped: 2 });
        assert_eq!(
            tally.summary("x"),
            "swept 3 workload(s): 2 with findings (2 distinct findings), 2 skipped (harness x)"
        );
        let one = SweepTally { swept: 1, with_findings: 1, distinct: 1, skipped: 0 };
        assert_eq!(
            one.summary("x"),
            "swept 1 workload(s): 1 with findings (1 distinct finding), 0 skipped (harness x)"
        );
    }

    /// Pairs at depth 2: first each clean single with each of its follow-ups (a pair planned once
    /// in either order), then the others at two sites, the most promising sites first (ties in
    /// the singles' order), all within the budget, what is left out counted.
    #[test]
    fn pairs_are_planned_same_subject_first_then_by_promise_within_the_budget() {
        let harness = crate::reference();
        let options = SweepOptions { depth: 2, ..SweepOptions::default() };
        let mut plan = plan(&harness, &multi_round(), &options).unwrap();
        let read = Placement {
            site: Site::Call { function: "state::get".into(), about: Vec::new(), nth: 1 },
            kind: Kind::Timeout,
            ms: None,
        }; // promise 1
        let write = call("state::set", "s1", 1, Kind::Timeout); // 2
        let write_lost = call("state::set", "s1", 1, Kind::LostAck); // 2, the same site
        let effect = Placement {
            site: Site::Call { function: "ticket::create".into(), about: Vec::new(), nth: 1 },
            kind: Kind::CrashCallerAfter,
            ms: None,
        }; // 3
        let point = Placement {
            site: Site::Point { worker: "harness".into(), point: "before_submission".into(), nth: 1 },
            kind: Kind::Crash,
            ms: None,
        }; // 2
        let singles = [read.clone(), write.clone(), write_lost.clone(), effect.clone(), point.clone()];
        let follow_up = call("state::set", "s1", 2, Kind::Timeout);
        let runs = vec![
            clean_run(vec![read.clone()], Vec::new()),
            clean_run(vec![write.clone()], vec![follow_up.clone()]),
            clean_run(vec![write_lost.clone()], Vec::new()),
            clean_run(vec![effect.clone()], vec![write.clone()]), // a pair the others hold too
            clean_run(vec![point.clone()], Vec::new()),
            clean_run(vec![read.clone(), write.clone()], vec![point.clone()]), // no single
        ];
        let pair = |a: &Placement, b: &Placement| vec![a.clone(), b.clone()];
        let others = [
            pair(&write_lost, &effect), // 5
            pair(&effect, &point),      // 5
            pair(&read, &effect),       // 4
            pair(&write, &point),       // 4
            pair(&write_lost, &point),  // 4
            pair(&read, &write),        // 3
            pair(&read, &write_lost),   // 3
            pair(&read, &point),        // 3
        ];
        let fresh = |plan: &mut SweepPlan, budget: usize| {
            plan.jobs = singles.iter().map(|p| vec![p.clone()]).collect();
            plan.singles = singles.len();
            plan.singles_left = 2;
            plan.budget = budget;
        };

        fresh(&mut plan, 5 + 2 + 3);
        plan_pairs(&mut plan, &runs);
        let mut expected = vec![pair(&write, &follow_up), pair(&effect, &write)];
        expected.extend(others[..3].iter().cloned());
        assert_eq!(plan.jobs[5..], expected[..]);
        assert_eq!(plan.pairs, Pairs { same_subject: 2, same_subject_left: 0, others: 3, others_left: 5 });
        assert_eq!(plan.skipped, 2 + 5);

        fresh(&mut plan, 5 + 1);
        plan_pairs(&mut plan, &runs);
        assert_eq!(plan.jobs[5..], [pair(&write, &follow_up)]);
        assert_eq!(plan.pairs, Pairs { same_subject: 1, same_subject_left: 1, others: 0, others_left: 8 });
        assert_eq!(plan.skipped, 2 + 1 + 8);

        fresh(&mut plan, 100);
        plan_pairs(&mut plan, &runs);
        let mut expected = vec![pair(&write, &follow_up), pair(&effect, &write)];
        expected.extend(others.iter().cloned());
        assert_eq!(plan.jobs[5..], expected[..]);

        let mut shallow = plan_of_depth(1);
        let (jobs, skipped) = (shallow.jobs.clone(), shallow.skipped);
        shallow.budget += 100;
        plan_pairs(&mut shallow, &runs);
        assert_eq!((shallow.jobs, shallow.pairs, shallow.skipped), (jobs, Pairs::default(), skipped), "no pairs");
    }

    fn plan_of_depth(depth: u8) -> SweepPlan {
        let options = SweepOptions { depth, ..SweepOptions::default() };
        plan(&crate::reference(), &multi_round(), &options).unwrap()
    }

    /// At depth 2 a clean single's run lists where a second fault on its subject can go, after
    /// it fired and never at its own site; at depth 1 it lists nothing.
    #[test]
    fn a_clean_single_lists_its_follow_ups_at_depth_two_only() {
        let harness = crate::reference();
        let write = call("state::set", "s1", 1, Kind::Timeout);
        let deep = plan_of_depth(2);
        let run = run_job(&harness, &deep, std::slice::from_ref(&write));
        assert_eq!(run.verdict, Verdict::Clean);
        assert!(!run.follow_ups.is_empty(), "the turn record is written again after the timeout");
        assert!(run.follow_ups.iter().all(|p| p.site != write.site && p.site.subject() == write.site.subject()));
        assert!(run_job(&harness, &plan_of_depth(1), std::slice::from_ref(&write)).follow_ups.is_empty());
    }

    /// The certificate counts the runs whose cut never reached its site.
    #[test]
    fn a_report_counts_the_runs_that_did_not_reach_their_site() {
        let plan = plan_of_depth(1);
        let mut unreached = clean_run(vec![call("state::set", "s1", 1_000, Kind::Timeout)], Vec::new());
        unreached.verdict = Verdict::Unreached;
        let reached = |nth: u64| clean_run(vec![call("state::set", "s1", nth, Kind::Timeout)], Vec::new());
        let runs = vec![reached(1), unreached, reached(2)];
        let report = report(&crate::reference(), plan, runs);
        assert_eq!((report.certificate.unreached, report.certificate.findings), (1, 0));
    }
}
