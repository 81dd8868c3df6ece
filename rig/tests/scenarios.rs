//! Every file under `scenarios/` is its own test: each of its policies runs from several seeds,
//! twice per seed with equal trace hashes, must meet its expectations, and its outcome summary
//! must match the insta snapshot under `snapshots/` with the same path and stem.
//!
//! A scenario's failed expectations are reported before its snapshot is compared, so a snapshot
//! diff never hides them.
//!
//! `RIG_SEEDS=A..B` widens (or moves) the seeds, `RIG_SEED=N` pins one, as madsim's
//! `MADSIM_TEST_SEED` does: `RIG_SEEDS=0..1000 cargo test --test scenarios`. The snapshot is
//! always of seed 0, whatever the seeds.

use rig::{report, run, Scenario};
use std::path::{Path, PathBuf};

/// Seeds every scenario runs under in `cargo test` unless the environment says otherwise.
const SEEDS: std::ops::Range<u64> = 0..4;
/// The seed whose runs the snapshots show.
const SNAPSHOT_SEED: u64 = 0;

/// The seeds to run: `RIG_SEED=N`, else `RIG_SEEDS=A..B`, else [`SEEDS`].
fn seeds() -> Result<std::ops::Range<u64>, String> {
    let read = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
    if let Some(seed) = read("RIG_SEED") {
        let seed: u64 = seed.trim().parse().map_err(|_| format!("RIG_SEED={seed}: expected a seed, a number"))?;
        return Ok(seed..seed.saturating_add(1));
    }
    let Some(range) = read("RIG_SEEDS") else { return Ok(SEEDS) };
    let parsed =
        range.trim().split_once("..").and_then(|(a, b)| Some((a.parse::<u64>().ok()?, b.parse::<u64>().ok()?)));
    match parsed {
        Some((start, end)) if start < end => Ok(start..end),
        _ => Err(format!("RIG_SEEDS={range}: expected A..B with A < B, as in RIG_SEEDS=0..1000")),
    }
}

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("rig sits in the workspace").to_path_buf()
}

fn run_scenario(path: &Path) -> datatest_stable::Result<()> {
    let scenarios = workspace().join("scenarios");
    let relative = path.canonicalize()?.strip_prefix(scenarios.canonicalize()?)?.to_path_buf();
    let source = std::fs::read_to_string(path)?;
    // Named by its absolute path, so failure repro lines work as printed from any folder.
    let scenario = Scenario::parse(&scenarios.join(&relative), &source)?;
    let seeds = seeds()?;

    let mut failures = Vec::new();
    let mut snapshot_runs = Vec::new();
    for policy_run in &scenario.runs {
        if !seeds.contains(&SNAPSHOT_SEED) {
            snapshot_runs.push(run(&scenario, policy_run, SNAPSHOT_SEED));
        }
        for seed in seeds.clone() {
            let first = run(&scenario, policy_run, seed);
            let second = run(&scenario, policy_run, seed);
            if first.trace_hash != second.trace_hash {
                failures.push(format!(
                    "[{}] seed {seed} is not reproducible: trace hashes {} and {}",
                    policy_run.policy, first.trace_hash, second.trace_hash
                ));
            }
            if !first.passed {
                failures.push(report::human(&first));
            }
            if seed == SNAPSHOT_SEED {
                snapshot_runs.push(first);
            }
        }
    }
    if !failures.is_empty() {
        return Err(failures.join("\n").into());
    }

    let snapshot = report::snapshot(
        scenario.about.as_deref().unwrap_or("(no description)"),
        &snapshot_runs.iter().collect::<Vec<_>>(),
    );
    let snapshot_folder = workspace().join("snapshots").join(relative.parent().unwrap_or(Path::new("")));
    let stem = relative.file_stem().expect("scenario files have names").to_string_lossy().into_owned();
    let mut settings = insta::Settings::clone_current();
    settings.set_snapshot_path(snapshot_folder);
    settings.set_prepend_module_to_snapshot(false);
    settings.set_omit_expression(true);
    settings.set_input_file(path);
    settings.bind(|| insta::assert_snapshot!(stem, snapshot));
    Ok(())
}

datatest_stable::harness! {
    { test = run_scenario, root = "../scenarios", pattern = r"\.toml$" },
}
