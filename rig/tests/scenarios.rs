//! Every file under `scenarios/` is its own test: each of its policies runs from several seeds,
//! twice per seed with equal trace hashes, must meet its expectations, and its outcome summary
//! must match the insta snapshot under `snapshots/` with the same path and stem.
//!
//! A scenario's failed expectations are reported before its snapshot is compared, so a snapshot
//! diff never hides them.

use rig::{report, run, Scenario};
use std::path::{Path, PathBuf};

/// Seeds every scenario runs under in `cargo test`; the snapshot shows the first.
const SEEDS: std::ops::Range<u64> = 0..4;

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("rig sits in the workspace").to_path_buf()
}

fn run_scenario(path: &Path) -> datatest_stable::Result<()> {
    let scenarios = workspace().join("scenarios");
    let relative = path.canonicalize()?.strip_prefix(scenarios.canonicalize()?)?.to_path_buf();
    let source = std::fs::read_to_string(path)?;
    // Named as users type it from the workspace root, so failure repro lines work as printed.
    let scenario = Scenario::parse(&Path::new("scenarios").join(&relative), &source)?;

    let mut failures = Vec::new();
    let mut first_seed = Vec::new();
    for policy_run in &scenario.runs {
        for seed in SEEDS {
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
            if seed == SEEDS.start {
                first_seed.push(first);
            }
        }
    }
    if !failures.is_empty() {
        return Err(failures.join("\n").into());
    }

    let snapshot = report::snapshot(
        scenario.about.as_deref().unwrap_or("(no description)"),
        &first_seed.iter().collect::<Vec<_>>(),
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
