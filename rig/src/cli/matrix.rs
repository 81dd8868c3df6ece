//! `rig matrix`: many seeds, one shard of them, for CI.

use super::{bad_input, load_scenarios, parse_seed_range, selected_runs, EXIT_BAD_INPUT, EXIT_FAILED};
use rig::{report, run};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct MatrixArgs {
    /// Scenario files or folders.
    #[arg(required = true)]
    pub paths: Vec<PathBuf>,
    /// Seeds to run, `A..B`.
    #[arg(long, value_parser = parse_seed_range)]
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

pub fn command(args: MatrixArgs) -> ExitCode {
    let Some(scenarios) = load_scenarios(&args.paths) else { return ExitCode::from(EXIT_BAD_INPUT) };
    let selected = match selected_runs(&scenarios, args.policy.as_deref()) {
        Ok(selected) => selected,
        Err(message) => return bad_input(&message),
    };
    if let Some(path) = &args.junit {
        if let Err(error) = std::fs::write(path, "") {
            return bad_input(&format!("cannot write the JUnit report {}: {error}", path.display()));
        }
    }
    let (shard, shards) = args.shard.unwrap_or((1, 1));
    let mut cases = Vec::new();
    let mut index = 0u64;
    for (scenario, policy_run) in selected {
        let mut case = report::MatrixCase::new(scenario.path.display().to_string(), policy_run.policy.clone());
        for seed in args.seeds.clone() {
            index += 1;
            // Triples are dealt to shards in a fixed order, so N runners cover each run once.
            if (index - 1) % shards != shard - 1 {
                continue;
            }
            case.record(&run(scenario, policy_run, seed));
        }
        if case.runs > 0 {
            cases.push(case);
        }
    }
    out!("{}", report::matrix_summary(&cases, (shard, shards)));
    if let Some(path) = &args.junit {
        if let Err(error) = std::fs::write(path, report::junit(&cases)) {
            return bad_input(&format!("cannot write the JUnit report {}: {error}", path.display()));
        }
    }
    if cases.iter().any(|c| c.failed > 0) {
        ExitCode::from(EXIT_FAILED)
    } else {
        ExitCode::SUCCESS
    }
}
