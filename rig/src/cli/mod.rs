//! The command line, for any harness: `rig::cli::main(factory)` in a `[[bin]]` of your crate
//! gives it the whole command set (`run`, `matrix`, `sweep`, `explore`, `bench`, timelines,
//! JUnit, `--jobs`) running *your* harness, and every repro line it prints, every finding file
//! and every `*.repro.sh` it writes names that binary, so it reruns your harness. The `rig`
//! binary is this with the reference harness, plus `live`, `harness` and `proxy`.
//!
//! ```no_run
//! // src/bin/my-harness.rs
//! fn main() -> std::process::ExitCode {
//!     rig::cli::main(rig::reference()) // your factory here: my_crate::factory()
//! }
//! ```
//!
//! Shared by every command: output that is checked ([`output`]), exit codes, loading the
//! scenario files, choosing the runs, skipping what the harness cannot serve.

use crate::capability::Skip;
use crate::harness::HarnessFactory;
use crate::report::{self, SkippedRun};
use crate::run::{run_unchecked, shell_word, Rerun, RunOutcome};
use crate::scenario::{PolicyRun, Scenario};
use clap::{CommandFactory as _, FromArgMatches as _};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

/// Writes a line to standard output; a failure is remembered and decides the exit status
/// (see [`output`]).
macro_rules! out {
    ($($arg:tt)*) => {
        crate::cli::output::line(format_args!($($arg)*))
    };
}

/// Writes a line to standard error, which may be closed: there is nowhere left to say so.
macro_rules! err {
    ($($arg:tt)*) => {{
        let _ = std::io::Write::write_fmt(&mut std::io::stderr().lock(), format_args!("{}\n", format_args!($($arg)*)));
    }};
}

// Declared after the macros above, which they use.
mod artifacts;
pub mod baseline;
pub mod bench;
pub mod changes;
pub mod explore;
pub mod explore_bench;
pub mod harness;
pub mod live;
pub mod matrix;
pub mod output;
mod parallel;
mod progress;
pub mod run;
pub mod sweep;

pub use parallel::Jobs;

/// `--failures-only` (`-q`), shared by every command that runs many runs: a long range of seeds
/// is read for what failed, not for the thousands of runs that passed.
#[derive(clap::Args, Clone, Copy, Debug, Default)]
pub struct Quiet {
    /// Print only what failed (failing runs, failing cases, findings) and the summary.
    #[arg(long = "failures-only", short = 'q')]
    pub failures_only: bool,
}

/// The commands that run a harness: what a binary on [`main`] has.
#[derive(clap::Subcommand)]
pub enum Command {
    /// Run scenario files (or every .toml file under a folder) and report each run.
    Run(run::RunArgs),
    /// Run many seeds, one shard of them, for CI: failing pairs with a repro each, JUnit XML.
    Matrix(matrix::MatrixArgs),
    /// Try every cut at every place one uncut run offers (and pairs); write each finding as a scenario.
    Sweep(sweep::SweepArgs),
    /// Draw a random fault mix per seed, shrink every failure, write it as a scenario.
    Explore(explore::ExploreArgs),
    /// Measure the searchers: runs to the first finding of each bug of a fixed set, under sweeps, the swarm and the guided explorer.
    ExploreBench(explore_bench::ExploreBenchArgs),
    /// Measure the rig: runs per second and simulated-to-wall time per scenario file.
    Bench(bench::BenchArgs),
    /// Compare a night's failures and findings (files --write-baseline wrote) with the night
    /// before's: new, ongoing, gone; a new one with its repro and the command that bisects it.
    Changes(changes::ChangesArgs),
}

impl Command {
    /// Runs the command. A first Ctrl-C, SIGTERM or SIGHUP stops it starting runs; it writes
    /// what it has, saying it was interrupted, and [`output::finish`] exits with the signal's
    /// status (see [`crate::interrupt`]).
    pub fn execute(self, harness: &Harness) -> ExitCode {
        crate::interrupt::wind_down();
        match self {
            Command::Run(args) => run::command(args, harness),
            Command::Matrix(args) => matrix::command(args, harness),
            Command::Sweep(args) => sweep::command(args, harness),
            Command::Explore(args) => explore::command(args, harness),
            Command::ExploreBench(args) => explore_bench::command(args, harness),
            Command::Bench(args) => bench::command(args, harness),
            Command::Changes(args) => changes::command(args, harness),
        }
    }
}

#[derive(clap::Parser)]
struct HarnessCli {
    #[command(subcommand)]
    command: Command,
}

/// The whole command line of a harness's own binary: parses the arguments, runs the command
/// against `factory`, and returns the exit status other tools rely on (0 passed, 1 failed, 2 bad
/// input or nothing run).
pub fn main(factory: Arc<dyn HarnessFactory>) -> ExitCode {
    init_logging();
    let harness = Harness::new(factory);
    let about = format!(
        "A deterministic fault-injection test rig, running harness `{}` (capabilities: {})",
        harness.name(),
        harness.factory.capabilities().names()
    );
    // Once per process: clap keeps command names for as long as it lives.
    let name: &'static str = Box::leak(harness.program_name().into_boxed_str());
    let matches = HarnessCli::command().name(name).about(about).get_matches();
    match HarnessCli::from_arg_matches(&matches) {
        Ok(cli) => output::finish(cli.command.execute(&harness)),
        Err(error) => error.exit(),
    }
}

/// Log output on standard error as `RUST_LOG` asks; colour only for a person at a terminal,
/// so logs captured by CI stay plain text.
pub fn init_logging() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .without_time()
        .try_init();
}

/// The harness a command runs, and the command line that runs it again: what every repro line,
/// finding file and `*.repro.sh` starts with.
pub struct Harness {
    pub factory: Arc<dyn HarnessFactory>,
    /// `rig`, or the path of this binary: see [`Harness::new`].
    pub program: String,
}

impl Harness {
    /// `factory`, rerun by this very binary: by its name when that name on the `PATH` is this
    /// file (an installed `rig`), else by its absolute path, which works from any folder
    /// without installing anything.
    pub fn new(factory: Arc<dyn HarnessFactory>) -> Self {
        Self { factory, program: this_program() }
    }

    pub fn name(&self) -> &str {
        self.factory.name()
    }

    /// The binary's file name, for help and messages.
    fn program_name(&self) -> String {
        let path = Path::new(&self.program);
        path.file_name().map_or_else(|| self.program.clone(), |name| name.to_string_lossy().into_owned())
    }

    /// One run, whose repro line reruns it with this binary.
    pub fn run(&self, scenario: &Scenario, policy_run: &PolicyRun, seed: u64) -> RunOutcome {
        let mut outcome = run_unchecked(&self.factory, scenario, policy_run, seed);
        outcome.rerun = Rerun::Cli(self.program.clone());
        outcome
    }

    /// Why this harness cannot make a run of `scenario` under `policy`, if it cannot.
    pub fn skip(&self, scenario: &Scenario, policy: &str) -> Option<Skip> {
        scenario.skip_for(self.factory.as_ref(), policy)
    }

    /// `policy` if this harness answers to it; bad input naming the ones it does otherwise.
    pub fn known_policy(&self, policy: &str) -> Result<(), String> {
        let policies = self.factory.policies();
        if policies.iter().any(|p| p == policy) {
            return Ok(());
        }
        Err(format!("unknown policy `{policy}`: harness `{}` answers to {}", self.name(), policies.join(", ")))
    }
}

/// The command that runs this binary again from any folder.
fn this_program() -> String {
    let Ok(exe) = std::env::current_exe() else { return "rig".into() };
    let exe = exe.canonicalize().unwrap_or(exe);
    let on_path = exe.file_name().and_then(|name| {
        let found =
            std::env::split_paths(&std::env::var_os("PATH")?).map(|dir| dir.join(name)).find(|p| p.is_file())?;
        (found.canonicalize().ok()? == exe).then(|| name.to_string_lossy().into_owned())
    });
    on_path.unwrap_or_else(|| shell_word(&exe.to_string_lossy()))
}

/// Exit codes other tools rely on.
pub const EXIT_FAILED: u8 = 1;
pub const EXIT_BAD_INPUT: u8 = 2;

/// One seed: every `--seed` takes it with hyphens let through, so `--seed -1` is told what a seed
/// is instead of being taken for an unknown flag.
pub fn parse_seed(text: &str) -> Result<u64, String> {
    text.parse().map_err(|_| format!("`{text}` is not a seed: a seed is a non-negative integer (0 to {})", u64::MAX))
}

/// What a command that a signal stopped says of its runs: `interrupted by SIGINT: 1234 of 84000
/// runs made`; `None` when no signal came.
pub fn interrupted(made: u64, total: u64) -> Option<String> {
    crate::interrupt::received()
        .map(|signal| format!("interrupted by {}: {made} of {total} runs made, no more started", signal.name()))
}

/// The `--json` line a command that a signal stopped ends with, after its runs' lines:
/// `{"interrupted":"SIGINT","runs_made":M,"runs_total":T}` (it has no `scenario`: it is no run).
pub fn interrupted_json(made: u64, total: u64) -> Option<serde_json::Value> {
    crate::interrupt::received()
        .map(|signal| serde_json::json!({ "interrupted": signal.name(), "runs_made": made, "runs_total": total }))
}

pub fn parse_seed_range(text: &str) -> Result<std::ops::Range<u64>, String> {
    let (start, end) = text.split_once("..").ok_or_else(|| format!("expected A..B, found `{text}`"))?;
    let (start, end) = (parse_seed(start)?, parse_seed(end)?);
    if end <= start {
        return Err(format!("the range {start}..{end} is empty"));
    }
    Ok(start..end)
}

/// Where `--trace` goes: a file, or standard output for `-`.
pub(crate) fn trace_sink(path: &Path) -> Result<output::Output, ExitCode> {
    output::Output::create(path, "trace file")
}

/// A run's trace as JSON lines, each naming the run.
pub(crate) fn trace_lines(outcome: &RunOutcome) -> String {
    let scenario = serde_json::json!(outcome.scenario);
    let mut lines = String::new();
    for event in outcome.trace.json_lines() {
        lines.push_str(&format!(
            "{{\"scenario\":{scenario},\"policy\":\"{}\",\"seed\":{},\"event\":{event}}}\n",
            outcome.policy, outcome.seed
        ));
    }
    lines
}

/// Bad input: said once, and the exit status other tools rely on.
pub fn bad_input(message: &str) -> ExitCode {
    err!("error: {message}");
    ExitCode::from(EXIT_BAD_INPUT)
}

/// Loads every scenario under `paths`, reporting each bad one; `None` when any was bad.
pub fn load_scenarios(paths: &[PathBuf]) -> Option<Vec<Scenario>> {
    let files = match crate::scenario::files(paths) {
        Ok(files) => files,
        Err(errors) => {
            errors.iter().for_each(|e| err!("error: {e}"));
            return None;
        }
    };
    let mut scenarios = Vec::new();
    let mut bad_input = false;
    for file in &files {
        match Scenario::load(file) {
            Ok(scenario) => scenarios.push(scenario),
            Err(error) => {
                err!("error: {error}");
                bad_input = true;
            }
        }
    }
    (!bad_input).then_some(scenarios)
}

/// One (scenario, policy) pair of a command's selection, and why the harness cannot make its
/// runs, when it cannot.
#[derive(Clone)]
pub struct Pair<'a> {
    pub scenario: &'a Scenario,
    pub policy_run: &'a PolicyRun,
    pub skip: Option<Skip>,
}

/// The (scenario, policy run) pairs to run: every policy each scenario declares that the harness
/// answers to, or only the one asked for; each with its skip when the harness lacks what the
/// run needs. Asking for a policy no scenario declares is bad input, not zero runs.
pub fn selected_runs<'a>(
    scenarios: &'a [Scenario],
    policy: Option<&str>,
    harness: &Harness,
) -> Result<Vec<Pair<'a>>, String> {
    if let Some(name) = policy {
        harness.known_policy(name)?;
    }
    let answered = harness.factory.policies();
    let selected: Vec<Pair> = scenarios
        .iter()
        .flat_map(|s| s.runs.iter().map(move |r| (s, r)))
        .filter(|(_, r)| policy.map_or_else(|| answered.contains(&r.policy), |p| p == r.policy))
        .map(|(scenario, policy_run)| Pair { scenario, policy_run, skip: harness.skip(scenario, &policy_run.policy) })
        .collect();
    if selected.is_empty() {
        let declared: std::collections::BTreeSet<&str> =
            scenarios.iter().flat_map(|s| s.runs.iter().map(|r| r.policy.as_str())).collect();
        let asked = match policy {
            Some(policy) => format!("policy `{policy}`"),
            None => format!("any policy harness `{}` answers to ({})", harness.name(), answered.join(", ")),
        };
        return Err(format!(
            "no scenario under the given paths declares {asked}, so nothing would run; they declare {}",
            declared.into_iter().collect::<Vec<_>>().join(", ")
        ));
    }
    Ok(selected)
}

/// One run to do: a scenario, one of its policies, a seed. Shared by reference with the worker
/// threads; the run itself happens on one of them.
#[derive(Clone, Copy)]
pub struct RunJob<'a> {
    /// The position of (scenario, policy) in the selection the job came from.
    pub pair: usize,
    pub scenario: &'a Scenario,
    pub policy_run: &'a PolicyRun,
    pub seed: u64,
    /// Why it is not made, when the harness cannot serve it.
    pub skip: Option<&'a Skip>,
}

/// A job's end: a run, or a run not made.
// Nearly every job is a run, and outcomes were always moved whole; a box would only add an
// allocation per run.
#[allow(clippy::large_enum_variant)]
pub enum Done {
    Ran(RunOutcome),
    Skipped(SkippedRun),
}

impl RunJob<'_> {
    pub fn run(self, harness: &Harness) -> Done {
        match self.skip {
            Some(skip) => Done::Skipped(SkippedRun {
                scenario: self.scenario.path.display().to_string(),
                policy: self.policy_run.policy.clone(),
                seed: self.seed,
                skip: skip.clone(),
            }),
            None => {
                let planted = planted_slowdown().map(|percent| (percent, crate::run::cpu::thread_ns()));
                let outcome = harness.run(self.scenario, self.policy_run, self.seed);
                if let Some((percent, started)) = planted {
                    let spent = crate::run::cpu::thread_ns().saturating_sub(started);
                    crate::run::cpu::burn(spent.saturating_mul(percent) / 100);
                }
                Done::Ran(outcome)
            }
        }
    }
}

/// The planted slowdown `rig bench` shows its guard bites with: the percent of a judged run's
/// CPU time each run spends again doing nothing, from the environment (see `cli::bench`).
fn planted_slowdown() -> Option<u64> {
    static PERCENT: std::sync::OnceLock<Option<u64>> = std::sync::OnceLock::new();
    *PERCENT.get_or_init(|| std::env::var(bench::PLANTED_SLOWDOWN).ok().and_then(|p| p.parse().ok()))
}

/// Every run of the selection under every seed, in the order they are reported: scenario by
/// scenario, policy by policy, seed by seed. Made as they are taken, so a seed range larger
/// than memory is only a long night, not an allocation failure; none is made once an output
/// has failed.
pub fn run_jobs<'a>(
    selected: &'a [Pair<'a>],
    seeds: &std::ops::Range<u64>,
) -> impl Iterator<Item = RunJob<'a>> + Send + 'a {
    let seeds = seeds.clone();
    let jobs = selected.iter().enumerate().flat_map(move |(pair, chosen)| {
        seeds.clone().map(move |seed| RunJob {
            pair,
            scenario: chosen.scenario,
            policy_run: chosen.policy_run,
            seed,
            skip: chosen.skip.as_ref(),
        })
    });
    output::while_wanted(jobs)
}

/// How many runs [`run_jobs`] makes.
pub fn run_count(selected: &[Pair], seeds: &std::ops::Range<u64>) -> u64 {
    (selected.len() as u64).saturating_mul(seeds.end.saturating_sub(seeds.start))
}

/// Runs every job on `workers` threads with a progress bar (`total` runs); `in_order` receives
/// each job's (pair, end) in input order. With `announce`, a pair's first failure is printed on
/// standard error the moment it happens, once per pair: one bug failing twenty seeds is one
/// line there, and the summary lists its seeds.
pub fn run_all<'a>(
    jobs: impl Iterator<Item = RunJob<'a>> + Send,
    total: u64,
    workers: std::num::NonZeroUsize,
    harness: &Harness,
    announce: bool,
    mut in_order: impl FnMut(usize, Done),
) {
    let progress = progress::Progress::new(total);
    let mut announced = std::collections::BTreeSet::new();
    parallel::for_each_ordered(
        jobs,
        workers,
        |job| (job.pair, job.run(harness)),
        |_, (pair, done)| {
            let failure = match done {
                Done::Ran(outcome) if !outcome.passed && announce && announced.insert(*pair) => {
                    Some(report::failure_line(outcome))
                }
                _ => None,
            };
            progress.completed(matches!(done, Done::Ran(outcome) if !outcome.passed), failure.as_deref())
        },
        |_, (pair, done)| in_order(pair, done),
    );
    progress.finish();
}

/// What a command's runs came to, and its exit status: 1 when a run failed; 2 when nothing ran
/// because everything was skipped (no false green); else 0.
#[derive(Debug, Default, Clone, Copy)]
pub struct Tally {
    pub passed: u64,
    pub failed: u64,
    pub skipped: u64,
}

impl Tally {
    pub fn count(&mut self, done: &Done) {
        match done {
            Done::Ran(outcome) if outcome.passed => self.passed += 1,
            Done::Ran(_) => self.failed += 1,
            Done::Skipped(_) => self.skipped += 1,
        }
    }

    /// `P passed, F failed, S skipped (harness NAME)`.
    pub fn summary(&self, harness: &Harness) -> String {
        format!("{} passed, {} failed, {} skipped (harness {})", self.passed, self.failed, self.skipped, harness.name())
    }

    /// [`Tally::exit_code`], or, when a baseline judged the runs (`Some(passed)`), the
    /// baseline's verdict: known failures pass, a regression or a stale entry fails. Nothing
    /// run is still no green.
    pub fn judged_exit_code(&self, baseline: Option<bool>) -> ExitCode {
        match baseline {
            Some(_) if self.passed == 0 && self.failed == 0 => self.exit_code(),
            Some(true) => ExitCode::SUCCESS,
            Some(false) => ExitCode::from(EXIT_FAILED),
            None => self.exit_code(),
        }
    }

    pub fn exit_code(&self) -> ExitCode {
        if self.failed > 0 {
            ExitCode::from(EXIT_FAILED)
        } else if self.passed == 0 && self.skipped > 0 {
            err!("error: every run was skipped: harness lacks what they need, so nothing was tested");
            ExitCode::from(EXIT_BAD_INPUT)
        } else {
            ExitCode::SUCCESS
        }
    }
}

/// Creates an output file before any run starts, so a bad path is bad input, not an hour of
/// runs thrown away at the end.
pub fn create_output(path: &Path, what: &str) -> Result<std::fs::File, ExitCode> {
    std::fs::File::create(path)
        .map_err(|error| bad_input(&format!("cannot write the {what} {}: {error}", path.display())))
}
