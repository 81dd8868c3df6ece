//! `rig explore-bench`: runs to the first finding of each bug of a fixed set, under a depth-1
//! sweep, a depth-2 sweep, the swarm and the guided explorer (medians over several starting
//! seeds for the last two), and whether the guided explorer meets issue 37's targets. See
//! [`crate::explore::bench`] for what counts as finding a bug and which runs are counted.

use super::parallel::{map_ordered, Jobs};
use super::progress::Progress;
use super::{bad_input, Harness, EXIT_BAD_INPUT, EXIT_FAILED};
use crate::explore::bench::{hunt, median, Hunt, Searcher, REFERENCE_BUGS};
use crate::explore::Runs;
use crate::Scenario;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct ExploreBenchArgs {
    /// The folder of the bugs' workloads.
    #[arg(long, default_value = "scenarios/workloads")]
    pub workloads: PathBuf,
    /// A bug to hunt, `POLICY@WORKLOAD` (a file of the workloads folder); repeat for several.
    /// Default: the reference harness's known-bad policies that take a cut to show, each on its
    /// workload (with another harness, say which).
    #[arg(long = "bug", value_name = "POLICY@WORKLOAD")]
    pub bugs: Vec<String>,
    /// The most runs with cuts a swarm or guided search makes for one bug from one seed.
    #[arg(long, default_value_t = 2_000)]
    pub cap: u64,
    /// How many starting seeds the swarm and the guided explorer are measured from (0, 100000,
    /// 200000, ...): the figure is their median.
    #[arg(long, default_value_t = 5)]
    pub explorer_seeds: u64,
    /// One JSON object per bug and one for the summary, instead of the table.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub jobs: Jobs,
}

/// How far apart the starting seeds are: far enough that no two searches share a run.
const SEED_STRIDE: u64 = 100_000;

/// The bug's row: its searches' results, in [`Searcher::ALL`] order, each a list (one per
/// starting seed; a sweep has one).
struct Row {
    policy: String,
    workload: String,
    hunts: Vec<Vec<Hunt>>,
}

impl Row {
    fn firsts(&self, searcher: Searcher) -> Vec<Option<u64>> {
        self.hunts[searcher as usize].iter().map(|hunt| hunt.first).collect()
    }

    fn median(&self, searcher: Searcher) -> Option<u64> {
        median(&self.firsts(searcher))
    }

    /// Needs two faults on one action or record: no single cut finds it, a depth-2 sweep's
    /// pair on one subject does.
    fn needs_two_on_one(&self) -> bool {
        let depth1 = &self.hunts[Searcher::Depth1 as usize][0];
        let depth2 = &self.hunts[Searcher::Depth2 as usize][0];
        depth1.first.is_none() && depth2.same_subject
    }
}

pub(crate) fn command(args: ExploreBenchArgs, harness: &Harness) -> ExitCode {
    let bugs: Vec<(String, String)> = if args.bugs.is_empty() {
        if harness.name() != "reference" {
            return bad_input("name the bugs of this harness to hunt: `--bug POLICY@WORKLOAD`");
        }
        REFERENCE_BUGS.iter().map(|(policy, workload)| (policy.to_string(), workload.to_string())).collect()
    } else {
        let mut bugs = Vec::new();
        for bug in &args.bugs {
            let Some((policy, workload)) = bug.split_once('@') else {
                return bad_input(&format!("`--bug {bug}`: expected POLICY@WORKLOAD"));
            };
            bugs.push((policy.to_string(), workload.to_string()));
        }
        bugs
    };
    if args.explorer_seeds == 0 || args.cap == 0 {
        return bad_input("`--explorer-seeds` and `--cap` must be at least 1");
    }
    let policies = harness.factory.policies();
    let mut scenarios = Vec::new();
    for (policy, workload) in &bugs {
        if !policies.contains(policy) {
            return bad_input(&format!("harness `{}` has no policy `{policy}`", harness.name()));
        }
        let path = args.workloads.join(workload);
        match Scenario::load(&path) {
            Ok(scenario) => scenarios.push(scenario),
            Err(error) => {
                err!("error: {error}");
                return ExitCode::from(EXIT_BAD_INPUT);
            }
        }
    }
    let starts: Vec<u64> = (0..args.explorer_seeds).map(|k| k * SEED_STRIDE).collect();
    // Every search is its own job: a bug, a searcher, a starting seed.
    let mut jobs = Vec::new();
    for bug in 0..bugs.len() {
        for searcher in Searcher::ALL {
            let seeds: &[u64] = if searcher.seeded() { &starts } else { &[0] };
            jobs.extend(seeds.iter().map(|start| (bug, searcher, *start)));
        }
    }
    let progress = Progress::new(jobs.len() as u64);
    let made_by: &dyn Runs = &harness.factory;
    let results = map_ordered(
        jobs.clone(),
        args.jobs.workers(jobs.len() as u64),
        |(bug, searcher, start)| hunt(made_by, &scenarios[bug], &bugs[bug].0, searcher, start, args.cap),
        |_, result| progress.completed(result.as_ref().is_ok_and(|hunt| hunt.first.is_none()), None),
    );
    progress.finish();
    let mut rows: Vec<Row> = bugs
        .iter()
        .map(|(policy, workload)| Row {
            policy: policy.clone(),
            workload: workload.clone(),
            hunts: vec![Vec::new(); Searcher::ALL.len()],
        })
        .collect();
    for ((bug, searcher, _), result) in jobs.iter().zip(results) {
        match result {
            Ok(hunt) => rows[*bug].hunts[*searcher as usize].push(hunt),
            Err(skip) => {
                err!("error: {}: {skip}", bugs[*bug].1);
                return ExitCode::from(EXIT_BAD_INPUT);
            }
        }
    }
    let summary = Summary::of(&rows, args.cap);
    if args.json {
        for row in &rows {
            out!("{}", row_json(row));
        }
        out!("{}", summary.json(harness.name(), &args, &starts));
    } else {
        print_table(&rows, &args, harness.name(), &starts);
        for line in summary.lines() {
            out!("{line}");
        }
    }
    if summary.met() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(EXIT_FAILED)
    }
}

/// `12`, or `-` when nothing was found (within the cap, or the sweep's plan).
fn cell(first: Option<u64>) -> String {
    first.map_or_else(|| "-".to_string(), |n| n.to_string())
}

/// A seeded searcher's cell: the median, with each seed's figure.
fn seeded_cell(row: &Row, searcher: Searcher) -> String {
    let each: Vec<String> = row.firsts(searcher).into_iter().map(cell).collect();
    format!("{} ({})", cell(row.median(searcher)), each.join(" "))
}

fn print_table(rows: &[Row], args: &ExploreBenchArgs, harness: &str, starts: &[u64]) {
    out!(
        "rig explore-bench: harness {harness}, {} bugs; runs with cuts to the first finding (-: none); swarm and \
         guided capped at {} runs, median over starting seeds {}",
        rows.len(),
        args.cap,
        starts.iter().map(u64::to_string).collect::<Vec<_>>().join(", ")
    );
    out!(
        "{:<28} {:<44} {:>8} {:>8} {:<34} {:<34} oracle",
        "bug",
        "workload",
        "depth-1",
        "depth-2",
        "swarm (each seed)",
        "guided (each seed)"
    );
    for row in rows {
        let oracle = row.hunts.iter().flatten().find_map(|hunt| hunt.oracle.clone()).unwrap_or_default();
        out!(
            "{:<28} {:<44} {:>8} {:>8} {:<34} {:<34} {oracle}",
            row.policy,
            row.workload,
            cell(row.hunts[Searcher::Depth1 as usize][0].first),
            cell(row.hunts[Searcher::Depth2 as usize][0].first),
            seeded_cell(row, Searcher::Swarm),
            seeded_cell(row, Searcher::Guided),
        );
    }
}

fn row_json(row: &Row) -> serde_json::Value {
    let searches: serde_json::Map<String, serde_json::Value> = Searcher::ALL
        .iter()
        .map(|searcher| {
            let hunts = &row.hunts[*searcher as usize];
            let each: Vec<serde_json::Value> = hunts
                .iter()
                .map(|hunt| {
                    serde_json::json!({
                        "first": hunt.first,
                        "runs": hunt.runs,
                        "oracle": hunt.oracle,
                        "cuts": hunt.cuts,
                    })
                })
                .collect();
            (searcher.name().to_string(), serde_json::json!({ "median": row.median(*searcher), "each": each }))
        })
        .collect();
    serde_json::json!({
        "bug": row.policy,
        "workload": row.workload,
        "needs_two_faults_on_one_action": row.needs_two_on_one(),
        "searches": searches,
    })
}

/// The set's figures against issue 37's targets.
struct Summary {
    bugs: usize,
    cap: u64,
    /// Per searcher: bugs found (by the median), the median over the set, runs made.
    found: Vec<usize>,
    medians: Vec<Option<u64>>,
    runs: Vec<u64>,
    /// Bugs that take two faults on one action, and their guided medians.
    two_on_one: Vec<(String, Option<u64>)>,
    /// Bugs the swarm finds within 2,000 runs (by its median) that the guided explorer does not.
    lost: Vec<String>,
}

/// What "the swarm finds it" means for the no-loss target.
const SWARM_FINDS_WITHIN: u64 = 2_000;
/// The target for a bug that needs two faults on one action.
const TWO_ON_ONE_WITHIN: u64 = 300;
/// The target ratio of the swarm's median to the guided explorer's.
const RATIO_TARGET: f64 = 3.0;

impl Summary {
    fn of(rows: &[Row], cap: u64) -> Self {
        let per = |searcher: Searcher| rows.iter().map(|row| row.median(searcher)).collect::<Vec<_>>();
        Summary {
            bugs: rows.len(),
            cap,
            found: Searcher::ALL.iter().map(|s| per(*s).iter().filter(|m| m.is_some()).count()).collect(),
            medians: Searcher::ALL.iter().map(|s| median(&per(*s))).collect(),
            runs: Searcher::ALL
                .iter()
                .map(|s| rows.iter().flat_map(|row| &row.hunts[*s as usize]).map(|hunt| hunt.runs).sum())
                .collect(),
            two_on_one: rows
                .iter()
                .filter(|row| row.needs_two_on_one())
                .map(|row| (row.policy.clone(), row.median(Searcher::Guided)))
                .collect(),
            lost: rows
                .iter()
                .filter(|row| row.median(Searcher::Swarm).is_some_and(|m| m <= SWARM_FINDS_WITHIN))
                .filter(|row| row.median(Searcher::Guided).is_none())
                .map(|row| row.policy.clone())
                .collect(),
        }
    }

    /// The swarm's median over the guided explorer's (a median of nothing found counts as the cap).
    fn ratio(&self) -> f64 {
        let at = |searcher: Searcher| self.medians[searcher as usize].unwrap_or(self.cap + 1).max(1) as f64;
        at(Searcher::Swarm) / at(Searcher::Guided)
    }

    /// Met when the set has such bugs and each is found in time: a set without one measures
    /// nothing of it.
    fn two_on_one_met(&self) -> bool {
        !self.two_on_one.is_empty() && self.two_on_one.iter().all(|(_, m)| m.is_some_and(|m| m <= TWO_ON_ONE_WITHIN))
    }

    fn met(&self) -> bool {
        self.ratio() >= RATIO_TARGET && self.two_on_one_met() && self.lost.is_empty()
    }

    fn lines(&self) -> Vec<String> {
        let verdict = |met: bool| if met { "met" } else { "NOT met" };
        let each = |f: &dyn Fn(usize) -> String| {
            Searcher::ALL.iter().map(|s| format!("{} {}", s.name(), f(*s as usize))).collect::<Vec<_>>().join(", ")
        };
        let two: Vec<String> = self.two_on_one.iter().map(|(bug, m)| format!("{bug} {}", cell(*m))).collect();
        vec![
            format!("found: {} (of {} bugs)", each(&|i| self.found[i].to_string()), self.bugs),
            format!("median runs to the first finding over the set: {}", each(&|i| cell(self.medians[i]))),
            format!("runs made: {}", each(&|i| self.runs[i].to_string())),
            format!(
                "target: the guided median at least {RATIO_TARGET}x below the swarm's: {:.1}x, {}",
                self.ratio(),
                verdict(self.ratio() >= RATIO_TARGET)
            ),
            format!(
                "target: every bug that takes two faults on one action found within {TWO_ON_ONE_WITHIN} runs: {}, {}",
                if two.is_empty() { "no such bug in the set".to_string() } else { two.join(", ") },
                if two.is_empty() { "not measured" } else { verdict(self.two_on_one_met()) }
            ),
            format!(
                "target: no bug the swarm finds within {SWARM_FINDS_WITHIN} runs is lost: {}, {}",
                if self.lost.is_empty() { "none lost".to_string() } else { format!("lost {}", self.lost.join(", ")) },
                verdict(self.lost.is_empty())
            ),
        ]
    }

    fn json(&self, harness: &str, args: &ExploreBenchArgs, starts: &[u64]) -> serde_json::Value {
        let by = |values: &dyn Fn(usize) -> serde_json::Value| {
            Searcher::ALL
                .iter()
                .map(|s| (s.name().to_string(), values(*s as usize)))
                .collect::<serde_json::Map<String, serde_json::Value>>()
        };
        serde_json::json!({
            "summary": self.lines().join("; "),
            "harness": harness,
            "bugs": self.bugs,
            "cap": args.cap,
            "starting_seeds": starts,
            "found": by(&|i| self.found[i].into()),
            "median": by(&|i| self.medians[i].into()),
            "runs": by(&|i| self.runs[i].into()),
            "ratio_swarm_to_guided": self.ratio(),
            "two_faults_on_one_action": self.two_on_one.iter().map(|(bug, m)| serde_json::json!({"bug": bug, "guided_median": m})).collect::<Vec<_>>(),
            "lost": self.lost,
            "targets_met": self.met(),
        })
    }
}
