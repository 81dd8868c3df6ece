//! Scenario files as tests: the rig's own catalogue, or any folder of them against a harness of
//! yours, one test per file.
//!
//! Each file runs every policy it declares that the harness answers to
//! ([`HarnessFactory::policies`]), under several seeds (`0..4`, or `RIG_SEEDS=A..B` /
//! `RIG_SEED=N` from the environment, as madsim's `MADSIM_TEST_SEED`), each seed twice with equal
//! trace hashes (the second time with every host ticked on every step, so a host that skips
//! steps it needed shows too); every run must meet the file's expectations and trip exactly the
//! oracles its policy declares. Failures are reported first; then, when a snapshot folder is given
//! and the seeds include 0, seed 0's outcome is compared with the insta snapshot at the file's
//! path and stem.
//!
//! In your crate (`rig` as a dev-dependency, and `[[test]] name = "scenarios" harness = false`;
//! `rig/tests/scenarios.rs` and the example harness's `tests/scenarios.rs` are this line, compiled):
//!
//! ```text
//! // tests/scenarios.rs
//! rig::scenario_tests!(harness = my_harness::factory(), scenarios = "scenarios", snapshots = "snapshots");
//! ```

use crate::harness::HarnessFactory;
use crate::report;
use crate::run::run_with;
use crate::scenario::Scenario;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use datatest_stable;
pub use insta;

/// The seeds every file runs under unless the environment says otherwise.
pub const DEFAULT_SEEDS: Range<u64> = 0..4;
/// The seed whose outcome the snapshot shows.
pub const SNAPSHOT_SEED: u64 = 0;

/// The seeds to run: `RIG_SEED=N` pins one, `RIG_SEEDS=A..B` widens or moves the range.
pub fn seeds() -> Result<Range<u64>, String> {
    if let Ok(seed) = std::env::var("RIG_SEED") {
        let seed: u64 = seed.trim().parse().map_err(|_| format!("RIG_SEED=`{seed}`: expected a whole number"))?;
        return Ok(seed..seed + 1);
    }
    let Ok(range) = std::env::var("RIG_SEEDS") else { return Ok(DEFAULT_SEEDS) };
    let parsed = range.split_once("..").and_then(|(a, b)| Some((a.trim().parse().ok()?, b.trim().parse().ok()?)));
    match parsed {
        Some((start, end)) if start < end => Ok(start..end),
        _ => Err(format!("RIG_SEEDS=`{range}`: expected A..B with A < B")),
    }
}

/// A folder of scenario files and the harness to check them against.
pub struct Suite {
    harness: Arc<dyn HarnessFactory>,
    scenarios: PathBuf,
    snapshots: Option<PathBuf>,
}

impl Suite {
    /// Scenario files under `scenarios`, a path relative to `crate_root` (your crate's
    /// `env!("CARGO_MANIFEST_DIR")`).
    pub fn new(harness: Arc<dyn HarnessFactory>, crate_root: &str, scenarios: &str) -> Self {
        Self { harness, scenarios: Path::new(crate_root).join(scenarios), snapshots: None }
    }

    /// Compares each file's outcome with the insta snapshot of the same relative path and stem
    /// under `snapshots` (relative to the crate root too).
    pub fn with_snapshots(mut self, crate_root: &str, snapshots: &str) -> Self {
        self.snapshots = Some(Path::new(crate_root).join(snapshots));
        self
    }

    /// Checks one scenario file: runs, determinism, expectations and oracles, then the snapshot.
    pub fn check(&self, path: &Path) -> datatest_stable::Result<()> {
        let absolute = path.canonicalize()?;
        let relative = absolute.strip_prefix(self.scenarios.canonicalize()?)?.to_path_buf();
        let scenario = Scenario::parse(&absolute, &std::fs::read_to_string(&absolute)?)?;
        // The same world with every host ticked on every step, as turmoil upstream steps it.
        let mut every_tick = scenario.clone();
        every_tick.world.network.tick_idle_hosts = true;
        let seeds = seeds()?;
        let policies = self.harness.policies();
        let mut failures = Vec::new();
        let mut snapshot_runs = Vec::new();
        let mut ran = false;
        for policy_run in scenario.runs.iter().filter(|r| policies.contains(&r.policy)) {
            if self.snapshots.is_some() && !seeds.contains(&SNAPSHOT_SEED) {
                snapshot_runs.push(run_with(&self.harness, &scenario, policy_run, SNAPSHOT_SEED));
            }
            for seed in seeds.clone() {
                let first = run_with(&self.harness, &scenario, policy_run, seed);
                ran = true;
                let second = run_with(&self.harness, &every_tick, policy_run, seed);
                if first.trace_hash != second.trace_hash {
                    failures.push(format!(
                        "[{}] seed {seed} is not reproducible: trace hashes {} and {} (the second run \
                         ticked every host on every step; if `waits_on_rig_clock_only` is true, does \
                         the harness wait on a tokio timer?)",
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
        if !ran {
            eprintln!(
                "{}: declares none of the policies {} answers to; nothing ran",
                relative.display(),
                self.harness.name()
            );
            return Ok(());
        }
        // The snapshot is the claim about seed 0, whatever seeds were chosen.
        let Some(snapshots) = self.snapshots.as_ref() else { return Ok(()) };
        let outcomes: Vec<_> = snapshot_runs.iter().collect();
        let snapshot = report::snapshot(scenario.about.as_deref().unwrap_or("(no description)"), &outcomes);
        let stem = relative.file_stem().expect("scenario files have names").to_string_lossy().into_owned();
        let mut settings = insta::Settings::clone_current();
        settings.set_snapshot_path(snapshots.join(relative.parent().unwrap_or(Path::new(""))));
        settings.set_prepend_module_to_snapshot(false);
        settings.set_omit_expression(true);
        settings.set_input_file(&absolute);
        settings.bind(|| insta::assert_snapshot!(stem, snapshot));
        Ok(())
    }
}

/// One test per scenario file under a folder, checked against a harness (see [`Suite::check`]).
///
/// `harness` is an `Arc<dyn HarnessFactory>`; `scenarios` and `snapshots` are paths relative to
/// the calling crate's root; `snapshots` is optional. Use it in a test target with
/// `harness = false`.
#[macro_export]
macro_rules! scenario_tests {
    (harness = $harness:expr, scenarios = $scenarios:literal $(, snapshots = $snapshots:literal)? $(,)?) => {
        fn rig_scenario_test(path: &::std::path::Path) -> $crate::testing::datatest_stable::Result<()> {
            let suite = $crate::testing::Suite::new($harness, env!("CARGO_MANIFEST_DIR"), $scenarios);
            $( let suite = suite.with_snapshots(env!("CARGO_MANIFEST_DIR"), $snapshots); )?
            suite.check(path)
        }
        $crate::testing::datatest_stable::harness! {
            { test = rig_scenario_test, root = $scenarios, pattern = r"\.toml$" },
        }
    };
}
