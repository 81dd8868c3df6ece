//! Scenario files as tests: the rig's own catalogue, or any folder of them against a harness of
//! yours, one test per file.
//!
//! Each file runs every policy it declares that the harness answers to
//! ([`HarnessFactory::policies`]), under several seeds (`0..4`, or `RIG_SEEDS=A..B` /
//! `RIG_SEED=N` from the environment, as madsim's `MADSIM_TEST_SEED`), each seed twice with equal
//! trace hashes (the second time with every host ticked on every step, so a host that skips
//! steps it needed shows too); every run must meet the file's expectations and trip exactly the
//! oracles its policy declares. Failures are reported first, as text, each with the command that
//! reruns it; then, when a snapshot folder is given and the seeds include 0, seed 0's outcome is
//! compared with the insta snapshot at the file's path and stem.
//!
//! A file that needs a capability the harness does not declare
//! ([`HarnessFactory::capabilities`]) is reported *ignored*, with what it needs and where the
//! file asks for it: never passed, never failed. A suite given `every_file_runs = true` fails such
//! a file instead, for a harness meant to run the whole folder (the reference over the
//! catalogue): a capability or policy it stopped declaring would otherwise pass files silently. A file with no snapshot yet writes its first
//! one and passes (say what it claims by reviewing and committing it); with `CI` set, a missing
//! snapshot fails instead, as insta does. A changed snapshot always fails.
//!
//! A suite given a baseline (`baseline = "rig-baseline.toml"`, a file `--write-baseline` wrote,
//! see [`crate::baseline`]) passes a file whose runs fail only on what the baseline lists for it
//! (reported *ignored*, `known failure: ...`), fails one that fails on anything else (a
//! regression) and fails one whose listed failure passes now (the baseline is stale: take the
//! entry out). `RIG_WRITE_BASELINE=1` writes the baseline from the files run instead (over its
//! entries for the files not run), and judges nothing.
//!
//! `RIG_MUTANTS=1` is the suite as mutation testing reads it (`cargo mutants`, see
//! `rig/docs/testing.md`): each seed runs once, without the every-host-ticked rerun, and no
//! snapshot is compared, so a mutant counts as caught only where an expectation or an oracle
//! fails. A snapshot is a claim for a reviewer, not a judgement: a mutant that only a snapshot
//! notices is a bug a user's harness suite would not see either.
//!
//! In your crate (`rig` as a dependency, and `[[test]] name = "scenarios" harness = false`;
//! `rig/tests/scenarios.rs` and the example harness's `tests/scenarios.rs` are this line, compiled):
//!
//! ```text
//! // tests/scenarios.rs
//! rig::scenario_tests!(harness = my_harness::factory(), scenarios = "scenarios", snapshots = "snapshots");
//! ```

use crate::baseline::{Baseline, Failures};
use crate::harness::HarnessFactory;
use crate::report;
use crate::run::{run_unchecked, shell_word, Rerun, RunOutcome};
use crate::scenario::{PolicyRun, Scenario};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::{Arc, Mutex};

pub use insta;
pub use libtest_mimic;

/// The seeds every file runs under unless the environment says otherwise.
pub const DEFAULT_SEEDS: Range<u64> = 0..4;
/// The seed whose outcome the snapshot shows.
pub const SNAPSHOT_SEED: u64 = 0;
/// What every test is named after, before the file's path: `rig_scenario_test::smoke/x.toml`.
pub const TEST_PREFIX: &str = "rig_scenario_test";

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

/// Whether the suite runs as mutation testing reads it (`RIG_MUTANTS=1`): once per seed, no
/// snapshots.
pub fn mutation_mode() -> bool {
    std::env::var("RIG_MUTANTS").is_ok_and(|v| v == "1")
}

/// Whether the suite writes its baseline (`RIG_WRITE_BASELINE=1`) rather than judging by it.
pub fn write_baseline_mode() -> bool {
    std::env::var("RIG_WRITE_BASELINE").is_ok_and(|v| v == "1")
}

/// How one file's check ended, when nothing failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Checked {
    Passed,
    /// Nothing ran, and why: the file needs a capability the harness lacks, or declares none
    /// of the policies it answers to.
    Skipped(String),
    /// Its runs failed, each only on what the suite's baseline lists: what they failed on.
    Known(String),
}

/// A suite's baseline: what it judges by (or writes), and every run's failures, for writing.
struct SuiteBaseline {
    path: PathBuf,
    /// The file as read (an empty one to write, when it is not there yet), or why it could not
    /// be read: every file's check then fails saying so.
    read: Result<Baseline, String>,
    write: bool,
    ledger: Mutex<Failures>,
}

/// The test target running a suite, so a failure names the command that reruns it.
#[derive(Debug, Clone)]
struct TestTarget {
    manifest: PathBuf,
    package: String,
    test: String,
}

/// A folder of scenario files and the harness to check them against.
pub struct Suite {
    harness: Arc<dyn HarnessFactory>,
    scenarios: PathBuf,
    snapshots: Option<PathBuf>,
    target: Option<TestTarget>,
    every_file_runs: bool,
    /// Where the claim of what the harness skips is kept (see [`skipped_claims`]).
    skipped: Option<PathBuf>,
    baseline: Option<SuiteBaseline>,
}

impl Suite {
    /// Scenario files under `scenarios`, a path relative to `crate_root` (your crate's
    /// `env!("CARGO_MANIFEST_DIR")`).
    pub fn new(harness: Arc<dyn HarnessFactory>, crate_root: &str, scenarios: &str) -> Self {
        Self {
            harness,
            scenarios: Path::new(crate_root).join(scenarios),
            snapshots: None,
            target: None,
            every_file_runs: false,
            skipped: None,
            baseline: None,
        }
    }

    /// Checks what the harness skips of the folder, and why, against the snapshot at `skipped`
    /// (relative to the crate root; see [`skipped_claims`]): one more test,
    /// `rig_scenario_test::(skipped)`.
    pub fn with_skipped_claims(mut self, crate_root: &str, skipped: &str) -> Self {
        self.skipped = Some(Path::new(crate_root).join(skipped));
        self
    }

    /// Judges failures by the baseline at `baseline` (relative to the crate root): a file whose
    /// runs fail only on what it lists is known, not failed; see the module's documentation.
    /// With `RIG_WRITE_BASELINE=1`, [`Suite::main`] writes it instead.
    pub fn with_baseline(mut self, crate_root: &str, baseline: &str) -> Self {
        let path = Path::new(crate_root).join(baseline);
        let write = write_baseline_mode();
        let read = if write && !path.exists() {
            Ok(Baseline::empty(&path, self.harness.name()))
        } else {
            Baseline::load(&path).map_err(|e| e.to_string()).and_then(|baseline| match &baseline.harness {
                Some(listed) if listed != self.harness.name() => Err(format!(
                    "the baseline {} lists the failures of harness `{listed}`, and this is harness `{}`",
                    path.display(),
                    self.harness.name()
                )),
                _ => Ok(baseline),
            })
        };
        let ledger = Mutex::new(Failures::new(read.as_ref().ok()));
        self.baseline = Some(SuiteBaseline { path, read, write, ledger });
        self
    }

    /// Writes the baseline given to [`Suite::with_baseline`] from the files checked, instead of
    /// judging by it: what `RIG_WRITE_BASELINE=1` does.
    pub fn writing_baseline(mut self) -> Self {
        if let Some(suite) = self.baseline.as_mut() {
            suite.write = true;
            if suite.read.is_err() && !suite.path.exists() {
                suite.read = Ok(Baseline::empty(&suite.path, self.harness.name()));
            }
        }
        self
    }

    /// Compares each file's outcome with the insta snapshot of the same relative path and stem
    /// under `snapshots` (relative to the crate root too).
    pub fn with_snapshots(mut self, crate_root: &str, snapshots: &str) -> Self {
        self.snapshots = Some(Path::new(crate_root).join(snapshots));
        self
    }

    /// Fails a file the harness would skip (a capability it does not declare, or none of the
    /// file's policies), where it is otherwise reported ignored: for a harness meant to run the
    /// whole folder, so that a capability or policy it stops declaring cannot turn files into
    /// silent passes.
    pub fn every_file_runs(mut self) -> Self {
        self.every_file_runs = true;
        self
    }

    /// Names the test target that runs this suite (`package`, the `[[test]]` name, in the crate
    /// at `crate_root`), so every failure comes with the `cargo test` line that reruns it.
    pub fn in_test_target(mut self, crate_root: &str, package: &str, test: &str) -> Self {
        let manifest = Path::new(crate_root).join("Cargo.toml");
        self.target = Some(TestTarget { manifest, package: package.into(), test: test.into() });
        self
    }

    /// The scenario files of the suite, sorted.
    pub fn files(&self) -> Result<Vec<PathBuf>, String> {
        crate::scenario_files(std::slice::from_ref(&self.scenarios)).map_err(|errors| errors.join("\n"))
    }

    /// The test name of a scenario file: `rig_scenario_test::` and its path under the folder.
    pub fn test_name(&self, path: &Path) -> String {
        let relative = path.strip_prefix(&self.scenarios).unwrap_or(path);
        let relative: Vec<String> =
            relative.components().map(|c| c.as_os_str().to_string_lossy().into_owned()).collect();
        format!("{TEST_PREFIX}::{}", relative.join("/"))
    }

    /// Runs the suite as a test binary (`harness = false`): one test per file, the usual
    /// `cargo test` arguments (filters, `--exact`, `--list`, `--ignored`, ...).
    pub fn main(self) -> ExitCode {
        let arguments = libtest_mimic::Arguments::from_args();
        let files = match self.files() {
            Ok(files) => files,
            Err(error) => {
                eprintln!("error: {error}");
                return ExitCode::FAILURE;
            }
        };
        let suite = Arc::new(self);
        let claims = suite.skipped.clone().map(|snapshot| {
            let suite = Arc::clone(&suite);
            libtest_mimic::Trial::test(format!("{TEST_PREFIX}::{SKIPPED_TEST}"), move || {
                check_skipped_claims(suite.harness.as_ref(), &suite.scenarios, &snapshot).map_err(Into::into)
            })
        });
        let trials = files
            .into_iter()
            .map(|file| {
                let suite = Arc::clone(&suite);
                libtest_mimic::Trial::ignorable_test(suite.test_name(&file), move || match suite.check(&file) {
                    Ok(Checked::Passed) => Ok(libtest_mimic::Completion::Completed),
                    Ok(Checked::Skipped(why)) => Ok(libtest_mimic::Completion::ignored_with(why)),
                    Ok(Checked::Known(what)) => Ok(libtest_mimic::Completion::ignored_with(what)),
                    Err(failures) => Err(failures.into()),
                })
            })
            .chain(claims)
            .collect();
        let conclusion = libtest_mimic::run(&arguments, trials);
        if let Err(error) = suite.write_baseline() {
            eprintln!("error: {error}");
            return ExitCode::FAILURE;
        }
        conclusion.exit_code()
    }

    /// With `RIG_WRITE_BASELINE=1`: writes the baseline from the files checked (over what it
    /// listed for the files not checked).
    pub fn write_baseline(&self) -> Result<(), String> {
        let Some(suite) = self.baseline.as_ref().filter(|b| b.write) else { return Ok(()) };
        let base = suite.read.as_ref().map_err(String::clone)?;
        let written = suite.ledger.lock().map_err(|_| "a test panicked while recording")?.written(base);
        written.write().map_err(|e| format!("cannot write the baseline {}: {e}", suite.path.display()))?;
        eprintln!("wrote the baseline {}: {} failure(s)", suite.path.display(), written.failures.len());
        Ok(())
    }

    /// Checks one scenario file: runs, determinism, expectations and oracles, then the snapshot.
    /// `Err` holds every failure, as text.
    pub fn check(&self, path: &Path) -> Result<Checked, String> {
        let absolute = path.canonicalize().map_err(|e| format!("{}: {e}", path.display()))?;
        let root = self.scenarios.canonicalize().map_err(|e| format!("{}: {e}", self.scenarios.display()))?;
        let relative = absolute.strip_prefix(&root).map_err(|e| e.to_string())?.to_path_buf();
        let source = std::fs::read_to_string(&absolute).map_err(|e| format!("{}: {e}", absolute.display()))?;
        let scenario = Scenario::parse(&absolute, &source).map_err(|e| e.to_string())?;
        let seeds = seeds()?;
        let mutation_mode = mutation_mode();
        let (runs, skipped) = self.runnable(&scenario);
        if self.every_file_runs && !skipped.is_empty() {
            return Err(format!(
                "{}: the suite requires every file to run under harness `{}`, and it would skip:\n  {}",
                relative.display(),
                self.harness.name(),
                skipped.join("\n  ")
            ));
        }
        if runs.is_empty() {
            return Ok(Checked::Skipped(skipped.join("; ")));
        }
        for skip in &skipped {
            eprintln!("{}: {skip}", relative.display());
        }
        let baseline = match &self.baseline {
            Some(suite) => Some((suite, suite.read.as_ref().map_err(|e| format!("bad baseline: {e}"))?)),
            None => None,
        };
        // This file's runs, judged by the baseline on their own: its entries for other files
        // are not this test's to judge.
        let mut judged = Failures::new(baseline.map(|(_, b)| b));
        let mut known = Vec::new();
        let mut failures = Vec::new();
        let mut snapshot_runs = Vec::new();
        for policy_run in runs {
            if self.snapshots.is_some() && !mutation_mode && !seeds.contains(&SNAPSHOT_SEED) {
                snapshot_runs.push(run_unchecked(&self.harness, &scenario, policy_run, SNAPSHOT_SEED));
            }
            for seed in seeds.clone() {
                let first = self.run(&scenario, policy_run, seed, &relative);
                if !mutation_mode {
                    failures.extend(self.reproducible(&scenario, policy_run, &first));
                }
                if let Some((suite, listed)) = baseline {
                    judged.record(&first);
                    suite.ledger.lock().map_err(|_| "a test panicked while recording")?.record(&first);
                    if !first.passed && !suite.write {
                        let unlisted = Failures::unlisted(&first, listed);
                        if unlisted.is_empty() {
                            known.extend(first.failures.iter().map(|f| crate::baseline::What::of(f).to_string()));
                            continue;
                        }
                        let what: Vec<String> = unlisted.iter().map(ToString::to_string).collect();
                        failures.push(format!(
                            "{}\n  (a regression: {} lists no {} of it)",
                            report::human(&first),
                            crate::baseline::shown(&suite.path),
                            what.join(", ")
                        ));
                        continue;
                    }
                    if !first.passed {
                        known.push("recorded in the baseline".into());
                        continue;
                    }
                }
                if !first.passed {
                    failures.push(report::human(&first));
                }
                if seed == SNAPSHOT_SEED {
                    snapshot_runs.push(first);
                }
            }
        }
        if let Some((_, listed)) = baseline.filter(|(suite, _)| !suite.write) {
            for entry in judged.judge(listed).stale {
                failures.push(format!(
                    "stale baseline: {} lists {}, and {}: take the entry out (or write the baseline again with RIG_WRITE_BASELINE=1)",
                    listed.at(&entry),
                    entry.key,
                    match entry.seed {
                        Some(seed) => format!("seed {seed} no longer fails on it"),
                        None => "no run fails on it now".to_string(),
                    }
                ));
            }
        }
        if !failures.is_empty() {
            return Err(failures.join("\n"));
        }
        if !known.is_empty() {
            known.sort();
            known.dedup();
            let from = self.baseline.as_ref().map(|b| crate::baseline::shown(&b.path)).unwrap_or_default();
            return Ok(Checked::Known(format!("known failure ({from}): {}", known.join("; "))));
        }
        // The snapshot is the claim about seed 0, whatever seeds were chosen.
        let Some(snapshots) = self.snapshots.as_ref().filter(|_| !mutation_mode) else { return Ok(Checked::Passed) };
        let outcomes: Vec<_> = snapshot_runs.iter().collect();
        let snapshot = report::snapshot(scenario.about.as_deref().unwrap_or("(no description)"), &outcomes);
        compare_snapshot(&snapshots.join(&relative), &absolute, &snapshot)?;
        Ok(Checked::Passed)
    }

    /// The policy runs of `scenario` this harness can make, and a line for each it cannot.
    fn runnable<'a>(&self, scenario: &'a Scenario) -> (Vec<&'a PolicyRun>, Vec<String>) {
        let policies = self.harness.policies();
        let mut runs = Vec::new();
        let mut skipped = Vec::new();
        for run in &scenario.runs {
            if !policies.contains(&run.policy) {
                continue;
            }
            match scenario.skip_for(self.harness.as_ref(), &run.policy) {
                Some(skip) => skipped.push(format!("[{}] skipped: {skip}", run.policy)),
                None => runs.push(run),
            }
        }
        if runs.is_empty() && skipped.is_empty() {
            skipped.push(format!("declares none of the policies harness `{}` answers to", self.harness.name()));
        }
        (runs, skipped)
    }

    /// One run, with the command line that reruns it as this suite's test.
    fn run(&self, scenario: &Scenario, policy_run: &PolicyRun, seed: u64, relative: &Path) -> RunOutcome {
        let mut outcome = run_unchecked(&self.harness, scenario, policy_run, seed);
        if let Some(target) = &self.target {
            let name = self.test_name(&self.scenarios.join(relative));
            outcome.rerun = Rerun::Command(format!(
                "RIG_SEED={seed} cargo test --manifest-path {} -p {} --test {} -- {} --exact",
                shell_word(&target.manifest.to_string_lossy()),
                target.package,
                target.test,
                shell_word(&name)
            ));
        }
        outcome
    }

    /// The same world with every host ticked on every step, as turmoil upstream steps it: the
    /// same trace, or a failure saying it is not.
    fn reproducible(&self, scenario: &Scenario, policy_run: &PolicyRun, first: &RunOutcome) -> Option<String> {
        let mut every_tick = scenario.clone();
        every_tick.world.network.tick_idle_hosts = true;
        let second = run_unchecked(&self.harness, &every_tick, policy_run, first.seed);
        (first.trace_hash != second.trace_hash).then(|| {
            format!(
                "[{}] seed {} is not reproducible: trace hashes {} and {} (the second run ticked every host on \
                 every step; if `waits_on_rig_clock_only` is true, does the harness wait on a tokio timer?)",
                policy_run.policy, first.seed, first.trace_hash, second.trace_hash
            )
        })
    }
}

/// The name of the test, after [`TEST_PREFIX`], that checks what a harness skips.
pub const SKIPPED_TEST: &str = "(skipped)";

/// What `harness` skips of the scenario files under `scenarios`, and why, as a claim to check in
/// and review: a line counting the files it runs and skips, then one line per run it does not
/// make (`FILE [POLICY]: needs ...`, what the file's story uses that the harness does not
/// declare, as every command says it). A file it runs under some of its policies and skips
/// under others is counted run. A change in what a harness declares, or in how a file's needs
/// are derived, shows as a diff of this claim rather than as files passing quietly as ignored.
pub fn skipped_claims(harness: &dyn HarnessFactory, scenarios: &Path) -> Result<String, String> {
    let files = crate::scenario_files(&[scenarios.to_path_buf()]).map_err(|errors| errors.join("\n"))?;
    let policies = harness.policies();
    let (mut run, mut lines) = (0usize, Vec::new());
    for file in &files {
        let scenario = Scenario::load(file).map_err(|e| e.to_string())?;
        let relative = file.strip_prefix(scenarios).unwrap_or(file);
        let relative: Vec<String> =
            relative.components().map(|c| c.as_os_str().to_string_lossy().into_owned()).collect();
        let name = relative.join("/");
        let mut runs_any = false;
        let mut answered = false;
        for policy_run in scenario.runs.iter().filter(|r| policies.contains(&r.policy)) {
            answered = true;
            match scenario.skip_for(harness, &policy_run.policy) {
                Some(skip) => lines.push(format!("{name} [{}]: {}", policy_run.policy, skip.without_harness())),
                None => runs_any = true,
            }
        }
        if !answered {
            lines.push(format!("{name}: declares none of the policies the harness answers to"));
        }
        run += usize::from(runs_any);
    }
    let declared = harness.capabilities().names().replace(',', ", ");
    let mut claims = format!(
        "harness `{}` (declares {declared}) runs {run} of {} files, skips {}\n",
        harness.name(),
        files.len(),
        files.len() - run
    );
    for line in lines {
        claims.push_str(&line);
        claims.push('\n');
    }
    Ok(claims)
}

/// Checks [`skipped_claims`] against the insta snapshot at `snapshot` (written, and passing, when
/// there is none yet outside CI, as a scenario file's is).
pub fn check_skipped_claims(harness: &dyn HarnessFactory, scenarios: &Path, snapshot: &Path) -> Result<(), String> {
    let claims = skipped_claims(harness, scenarios)?;
    let folder = scenarios.canonicalize().map_err(|e| format!("{}: {e}", scenarios.display()))?;
    compare_snapshot(&snapshot.with_extension("toml"), &folder, &claims)
}

/// Compares `snapshot` with the insta snapshot for the scenario file `input` at `at` (the file's
/// path under the snapshot folder; its extension becomes `.snap`). A missing one is written
/// (outside CI) and passes: a new scenario file passes its first run.
fn compare_snapshot(at: &Path, input: &Path, snapshot: &str) -> Result<(), String> {
    let file = at.with_extension("snap");
    if !file.exists() {
        return first_snapshot(&file, input, snapshot);
    }
    let stem = at.file_stem().expect("scenario files have names").to_string_lossy().into_owned();
    let mut settings = insta::Settings::clone_current();
    settings.set_snapshot_path(at.parent().unwrap_or(Path::new("")));
    settings.set_prepend_module_to_snapshot(false);
    settings.set_omit_expression(true);
    settings.set_input_file(input);
    settings.bind(|| insta::assert_snapshot!(stem, snapshot));
    Ok(())
}

/// Writes a scenario file's first snapshot, as insta writes one (`INSTA_UPDATE=always`), and
/// says so; in CI (`CI` set, as insta reads it) a missing snapshot is a failure instead: CI
/// checks claims, it does not make them.
fn first_snapshot(file: &Path, input: &Path, snapshot: &str) -> Result<(), String> {
    if in_ci() {
        return Err(format!(
            "no snapshot {} (CI is set, so none is written): run `cargo test` without CI, review the snapshot it writes and commit it",
            file.display()
        ));
    }
    let header = format!("---\nsource: rig/src/testing.rs\ninput_file: {}\n---\n", input_file_name(input));
    let body = if snapshot.ends_with('\n') { snapshot.to_string() } else { format!("{snapshot}\n") };
    if let Some(folder) = file.parent() {
        std::fs::create_dir_all(folder).map_err(|e| format!("cannot make {}: {e}", folder.display()))?;
    }
    std::fs::write(file, header + &body).map_err(|e| format!("cannot write {}: {e}", file.display()))?;
    eprintln!("wrote the first snapshot {}: review it, and commit it with the scenario file", file.display());
    Ok(())
}

/// Whether this runs in CI, as insta decides it (`CI` set to anything but `false`, `0` or
/// nothing; or Azure's `TF_BUILD`).
fn in_ci() -> bool {
    match std::env::var("CI").ok().as_deref() {
        Some("false" | "0" | "") => false,
        None => std::env::var("TF_BUILD").is_ok(),
        Some(_) => true,
    }
}

/// The scenario file as insta names an input file: relative to the workspace (the nearest
/// folder above it holding `Cargo.lock`), else as it is.
fn input_file_name(input: &Path) -> String {
    let workspace = input.ancestors().skip(1).find(|folder| folder.join("Cargo.lock").exists());
    let relative = workspace.and_then(|root| input.strip_prefix(root).ok()).unwrap_or(input);
    relative.components().map(|c| c.as_os_str().to_string_lossy().into_owned()).collect::<Vec<_>>().join("/")
}

/// One test per scenario file under a folder, checked against a harness (see [`Suite::check`]).
///
/// `harness` is an `Arc<dyn HarnessFactory>`; `scenarios` and `snapshots` are paths relative to
/// the calling crate's root; `snapshots` is optional; `every_file_runs = true` (optional, after
/// `snapshots`) fails a file the harness would skip ([`Suite::every_file_runs`]); `skipped =
/// "FILE.snap"` (optional) checks what the harness skips of the folder, and why, against that
/// snapshot ([`skipped_claims`]); `baseline = "FILE"` (optional, last) judges failures by a
/// baseline of known ones ([`Suite::with_baseline`]). Use it in a test target with `harness =
/// false`: it is the target's `main`.
#[macro_export]
macro_rules! scenario_tests {
    (harness = $harness:expr, scenarios = $scenarios:literal $(, snapshots = $snapshots:literal)? $(, every_file_runs = $every:literal)? $(, skipped = $skipped:literal)? $(, baseline = $baseline:literal)? $(,)?) => {
        fn main() -> ::std::process::ExitCode {
            let root = env!("CARGO_MANIFEST_DIR");
            let suite = $crate::testing::Suite::new($harness, root, $scenarios)
                .in_test_target(root, env!("CARGO_PKG_NAME"), env!("CARGO_CRATE_NAME"));
            $( let suite = suite.with_snapshots(root, $snapshots); )?
            $( let suite = if $every { suite.every_file_runs() } else { suite }; )?
            $( let suite = suite.with_skipped_claims(root, $skipped); )?
            $( let suite = suite.with_baseline(root, $baseline); )?
            suite.main()
        }
    };
}

/// The explorer's abstract state is read through the record layout and what the services saw,
/// so it means the same for `harness` as for the reference. Panics (for a test of the harness's
/// crate) unless the any-harness workloads in `workloads` that `harness` serves (at least one)
/// end in the abstract state they end in under the reference, and a guided exploration of one
/// makes the same runs again.
pub fn check_abstract_state(harness: &Arc<dyn HarnessFactory>, workloads: &Path) {
    use crate::explore::{self, Abstraction, Campaign, Runs};
    let workload =
        |name: &str| explore::workload(&Scenario::load(&workloads.join(name)).expect("a shipped workload"), false);
    let last_state = |harness: &Arc<dyn HarnessFactory>, scenario: &Scenario| {
        let outcome = Runs::run(harness, scenario, &explore::bare_run("reference"), 0);
        Abstraction::new(scenario, Runs::layout(harness)).last_state(outcome.trace.events())
    };
    let mut served = 0;
    for name in ["rounds-any-harness.toml", "input-queued-any-harness.toml", "lease-taken-over-any-harness.toml"] {
        let scenario = workload(name);
        if Runs::skip(harness, &scenario, "reference").is_some() {
            continue;
        }
        served += 1;
        let theirs = last_state(harness, &scenario);
        if name == "rounds-any-harness.toml" {
            assert!(theirs.contains("action 1: intent"), "the actions are read through the layout: {theirs}");
        }
        // How many grants a takeover took is each harness's own way with leases; what became of
        // the actions, turns, messages and inputs is the same.
        let outcome =
            |state: &str| state.split("; ").filter(|part| !part.starts_with("lease ")).collect::<Vec<_>>().join("; ");
        assert_eq!(outcome(&theirs), outcome(&last_state(&crate::reference(), &scenario)), "{name}");
    }
    assert!(served > 0, "the harness serves none of the any-harness workloads");

    let scenario = workload("rounds-any-harness.toml");
    let explore = || {
        let mut campaign = Campaign::new(harness, &scenario, "reference", 7..55, false).expect("a campaign");
        let mut runs = Vec::new();
        loop {
            let trials = campaign.batch();
            if trials.is_empty() {
                break;
            }
            for trial in &trials {
                let tried = campaign.try_mix(trial);
                runs.push((tried.mix.iter().map(|p| p.id()).collect::<Vec<_>>(), tried.fired.clone()));
                campaign.fold(tried);
            }
        }
        (runs, campaign.coverage.states(), campaign.corpus().count())
    };
    let (runs, states, corpus) = explore();
    assert_eq!(runs.len(), 48);
    assert!(corpus > 1, "some run reached a state the uncut run did not");
    assert_eq!(explore(), (runs, states, corpus), "a guided exploration makes the same runs again");
}
