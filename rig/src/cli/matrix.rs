//! `rig matrix`: many seeds, one shard of them, for CI.

use super::artifacts;
use super::baseline::BaselineArgs;
use super::parallel::{map_ordered, Jobs};
use super::{
    bad_input, create_output, load_scenarios, parse_seed_range, run_all, run_count, run_jobs, selected_runs, Done,
    Harness, Pair, Quiet, RunJob, Tally, EXIT_BAD_INPUT, EXIT_FAILED,
};
use crate::baseline::Failures;
use crate::report::{self, MatrixCase};
use crate::run::RunOutcome;
use sha2::{Digest, Sha256};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct MatrixArgs {
    /// Scenario files or folders.
    #[arg(required = true)]
    pub paths: Vec<PathBuf>,
    /// Seeds to run, `A..B`.
    #[arg(long, value_parser = parse_seed_range, allow_hyphen_values = true)]
    pub seeds: std::ops::Range<u64>,
    /// Run only shard K of N (`K/N`, K from 1): every N-th run, so runners split the work.
    #[arg(long, value_parser = parse_shard)]
    pub shard: Option<(u64, u64)>,
    /// Run only this policy.
    #[arg(long)]
    pub policy: Option<String>,
    /// Write a JUnit XML report here: one test case per scenario and policy.
    #[arg(long)]
    pub junit: Option<PathBuf>,
    /// For each failing scenario and policy, replay its lowest failing seed and write its
    /// timeline (HTML), trace (JSON lines) and repro command into this folder.
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    #[command(flatten)]
    pub quiet: Quiet,
    #[command(flatten)]
    pub jobs: Jobs,
    #[command(flatten)]
    pub baseline: BaselineArgs,
}

fn parse_shard(text: &str) -> Result<(u64, u64), String> {
    let (k, n) = text.split_once('/').ok_or_else(|| format!("expected K/N, found `{text}`"))?;
    let (k, n): (u64, u64) = (
        k.parse().map_err(|_| format!("`{k}` is not a number"))?,
        n.parse().map_err(|_| format!("`{n}` is not a number"))?,
    );
    if n == 0 || k == 0 || k > n {
        return Err(format!("shard {k}/{n}: expected 1 <= K <= N"));
    }
    Ok((k, n))
}

pub(crate) fn command(args: MatrixArgs, harness: &Harness) -> ExitCode {
    let Some(scenarios) = load_scenarios(&args.paths) else { return ExitCode::from(EXIT_BAD_INPUT) };
    let selected = match selected_runs(&scenarios, args.policy.as_deref(), harness) {
        Ok(selected) => selected,
        Err(message) => return bad_input(&message),
    };
    // Outputs are checked before the first run: a bad path is bad input, not a lost night.
    let junit_file = match args.junit.as_deref().map(|path| create_output(path, "JUnit report")).transpose() {
        Ok(file) => file,
        Err(code) => return code,
    };
    if let Some(folder) = &args.out {
        if let Err(error) = std::fs::create_dir_all(folder) {
            return bad_input(&format!("cannot write failing runs into {}: {error}", folder.display()));
        }
    }
    let known = match args.baseline.load(harness.name()) {
        Ok(known) => known,
        Err(code) => return code,
    };
    let mut ledger = Failures::new(known.judged.iter().chain(known.write.iter()));
    let started = std::time::SystemTime::now();
    let clock = std::time::Instant::now();
    let (shard, shards) = args.shard.unwrap_or((1, 1));
    // Runs are dealt to shards in a fixed order, so N runners cover each run exactly once.
    let jobs = run_jobs(&selected, &args.seeds)
        .enumerate()
        .filter(move |(index, _)| *index as u64 % shards == shard - 1)
        .map(|(_, job)| job);
    let all = run_count(&selected, &args.seeds);
    let in_shard = all / shards + u64::from(all % shards > shard - 1);
    let mut cases: Vec<MatrixCase> = selected
        .iter()
        .map(|chosen| MatrixCase::new(chosen.scenario.path.display().to_string(), chosen.policy_run.policy.clone()))
        .collect();
    let mut digest = Sha256::new();
    let mut tally = Tally::default();
    let workers = args.jobs.workers(in_shard);
    let failures_only = args.quiet.failures_only;
    // With --out, each case's lowest failing run: what its files are written from when a signal
    // leaves no time to replay it.
    let mut lowest: Vec<Option<RunOutcome>> = cases.iter().map(|_| None).collect();
    run_all(jobs, in_shard, workers, harness, !failures_only, |pair, done| {
        tally.count(&done);
        let line = match &done {
            Done::Ran(outcome) => {
                cases[pair].record(outcome);
                if known.any() {
                    ledger.record(outcome);
                }
                format!(
                    "{}\t{}\t{}\t{}\t{}\n",
                    outcome.scenario, outcome.policy, outcome.seed, outcome.passed, outcome.trace_hash
                )
            }
            Done::Skipped(skipped) => {
                cases[pair].record_skip(&skipped.skip);
                format!("{}\t{}\t{}\tskipped\n", skipped.scenario, skipped.policy, skipped.seed)
            }
        };
        digest.update(line.as_bytes());
        if let Done::Ran(outcome) = done {
            let lower = lowest[pair].as_ref().is_none_or(|kept| outcome.seed < kept.seed);
            if args.out.is_some() && !outcome.passed && lower {
                lowest[pair] = Some(outcome);
            }
        }
    });
    if let Some(baseline) = &known.judged {
        for case in cases.iter_mut().filter(|case| case.failed > 0) {
            if ledger.all_listed(&case.scenario, &case.policy, baseline) {
                case.known = Some(baseline.path.display().to_string());
            }
        }
    }
    let made = tally.passed + tally.failed + tally.skipped;
    let interrupted = super::interrupted(made, in_shard);
    let unreproducible = match (&args.out, &interrupted) {
        (Some(folder), None) => write_failures(&selected, &mut cases, folder, workers, harness),
        // A signal asked for no new run: the files come from the runs themselves, not replayed.
        (Some(folder), Some(_)) => {
            for (case, outcome) in cases.iter_mut().zip(&lowest) {
                if let (Some(first), Some(outcome)) = (case.first_failure.as_mut(), outcome) {
                    first.artifacts = artifacts::write_run(outcome, folder, &artifacts::run_stem(outcome));
                    first.artifacts.push("(not replayed: the matrix was interrupted)".into());
                }
            }
            Vec::new()
        }
        (None, _) => Vec::new(),
    };
    cases.retain(|case| case.runs > 0 || case.skipped > 0);
    out!("{}", report::matrix_summary(&cases, (shard, shards), harness.name(), failures_only));
    if let Some(line) = &interrupted {
        out!("{line}");
    }
    if args.out.is_none() && !failures_only && cases.iter().any(|c| c.failed > 0) {
        out!("(--out DIR writes each failing case's timeline, trace and repro, from a replay of its lowest seed)");
    }
    for line in &unreproducible {
        out!("{line}");
    }
    let digest: String = digest.finalize().iter().take(16).map(|b| format!("{b:02x}")).collect();
    out!("runs digest {digest} (every run's verdict and trace hash, in order: equal for any --jobs)");
    let judged = match known.failures_end(&ledger, &mut |line| out!("{line}")) {
        Ok(judged) => judged,
        Err(code) => return code,
    };
    if let Some(mut file) = junit_file {
        let suite = report::JunitSuite {
            harness: harness.name(),
            shard: (shard, shards),
            seeds: &args.seeds,
            policy: args.policy.as_deref(),
            started,
            elapsed: clock.elapsed(),
            interrupted: interrupted.as_deref(),
        };
        let written =
            report::junit(&cases, &suite).and_then(|xml| file.write_all(xml.as_bytes()).map_err(|e| e.to_string()));
        if let Err(error) = written {
            let path = args.junit.as_deref().unwrap_or(Path::new("?"));
            return bad_input(&format!("cannot write the JUnit report {}: {error}", path.display()));
        }
    }
    if !unreproducible.is_empty() {
        return ExitCode::from(EXIT_FAILED);
    }
    tally.judged_exit_code(judged)
}

/// Replays each failing case's lowest seed and writes its timeline, trace and repro into
/// `folder`, naming them in the case's report. `cases` line up with `selected`. Returns a line for every replay whose trace
/// differed from the first run's: a run that does not reproduce is a bug of its own.
fn write_failures(
    selected: &[Pair],
    cases: &mut [MatrixCase],
    folder: &Path,
    workers: std::num::NonZeroUsize,
    harness: &Harness,
) -> Vec<String> {
    let replays: Vec<(usize, RunJob)> = cases
        .iter()
        .enumerate()
        .filter_map(|(pair, case)| {
            let seed = case.first_failure.as_ref()?.seed;
            let chosen = &selected[pair];
            Some((pair, RunJob { pair, scenario: chosen.scenario, policy_run: chosen.policy_run, seed, skip: None }))
        })
        .collect();
    let replayed = map_ordered(replays, workers, |(index, job)| (index, job.run(harness)), |_, _| {});
    let mut unreproducible = Vec::new();
    for (index, done) in replayed {
        let Done::Ran(outcome) = done else { continue };
        let Some(first) = cases[index].first_failure.as_mut() else { continue };
        if outcome.trace_hash != first.trace_hash {
            unreproducible.push(format!(
                "NOT REPRODUCIBLE {} [{}] seed {}: trace hash {} on the first run, {} on the replay",
                outcome.scenario, outcome.policy, outcome.seed, first.trace_hash, outcome.trace_hash
            ));
        }
        first.artifacts = artifacts::write_run(&outcome, folder, &artifacts::run_stem(&outcome));
    }
    unreproducible
}
