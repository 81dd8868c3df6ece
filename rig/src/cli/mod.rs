//! What every command shares: output that is checked ([`output`]), exit codes, loading the
//! scenario files, choosing the runs.

use rig::{PolicyRun, RunOutcome, Scenario};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

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
pub mod artifacts;
pub mod bench;
pub mod explore;
pub mod harness;
pub mod live;
pub mod matrix;
pub mod output;
pub mod parallel;
pub mod progress;
pub mod run;
pub mod sweep;

/// Exit codes other tools rely on.
pub const EXIT_FAILED: u8 = 1;
pub const EXIT_BAD_INPUT: u8 = 2;

pub fn parse_seed_range(text: &str) -> Result<std::ops::Range<u64>, String> {
    let (start, end) = text.split_once("..").ok_or_else(|| format!("expected A..B, found `{text}`"))?;
    let start: u64 = start.parse().map_err(|_| format!("`{start}` is not a seed"))?;
    let end: u64 = end.parse().map_err(|_| format!("`{end}` is not a seed"))?;
    if end <= start {
        return Err(format!("the range {start}..{end} is empty"));
    }
    Ok(start..end)
}

/// Where `--trace` goes: a file, or standard output for `-`.
pub fn trace_sink(path: &Path) -> Result<output::Output, ExitCode> {
    output::Output::create(path, "trace file")
}

/// A run's trace as JSON lines, each naming the run.
pub fn trace_lines(outcome: &rig::RunOutcome) -> String {
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
    let files = match rig::scenario_files(paths) {
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

/// The (scenario, policy run) pairs to run: every policy each scenario declares, or only the
/// one asked for. Asking for a policy no scenario declares is bad input, not zero runs.
pub fn selected_runs<'a>(
    scenarios: &'a [Scenario],
    policy: Option<&str>,
) -> Result<Vec<(&'a Scenario, &'a PolicyRun)>, String> {
    if let Some(name) = policy {
        if rig::Policy::from_name(name).is_none() {
            let known: Vec<_> = rig::Policy::ALL.iter().map(|p| p.name()).collect();
            return Err(format!("unknown policy `{name}`, expected one of {}", known.join(", ")));
        }
    }
    let selected: Vec<_> = scenarios
        .iter()
        .flat_map(|s| s.runs.iter().map(move |r| (s, r)))
        .filter(|(_, r)| policy.is_none_or(|p| p == r.policy))
        .collect();
    if selected.is_empty() {
        let declared: std::collections::BTreeSet<&str> =
            scenarios.iter().flat_map(|s| s.runs.iter().map(|r| r.policy.as_str())).collect();
        return Err(format!(
            "no scenario under the given paths declares policy `{}`, so nothing would run; they declare {}",
            policy.unwrap_or_default(),
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
}

impl RunJob<'_> {
    pub fn run(self) -> RunOutcome {
        rig::run(self.scenario, self.policy_run, self.seed)
    }
}

/// Every run of the selection under every seed, in the order they are reported: scenario by
/// scenario, policy by policy, seed by seed. Made as they are taken, so a seed range larger
/// than memory is only a long night, not an allocation failure; none is made once an output
/// has failed.
pub fn run_jobs<'a>(
    selected: &[(&'a Scenario, &'a PolicyRun)],
    seeds: &std::ops::Range<u64>,
) -> impl Iterator<Item = RunJob<'a>> + Send + 'a {
    let (selected, seeds) = (selected.to_vec(), seeds.clone());
    let jobs = selected.into_iter().enumerate().flat_map(move |(pair, (scenario, policy_run))| {
        seeds.clone().map(move |seed| RunJob { pair, scenario, policy_run, seed })
    });
    output::while_wanted(jobs)
}

/// How many runs [`run_jobs`] makes.
pub fn run_count(selected: &[(&Scenario, &PolicyRun)], seeds: &std::ops::Range<u64>) -> u64 {
    (selected.len() as u64).saturating_mul(seeds.end.saturating_sub(seeds.start))
}

/// Runs every job on `workers` threads with a progress bar (`total` runs), printing each failing
/// run the moment it fails; `in_order` receives each job's (pair, outcome) in input order.
pub fn run_all<'a>(
    jobs: impl Iterator<Item = RunJob<'a>> + Send,
    total: u64,
    workers: std::num::NonZeroUsize,
    mut in_order: impl FnMut(usize, RunOutcome),
) {
    let progress = progress::Progress::new(total);
    parallel::for_each_ordered(
        jobs,
        workers,
        |job| (job.pair, job.run()),
        |_, (_, outcome)| progress.completed((!outcome.passed).then(|| rig::report::failure_line(outcome)).as_deref()),
        |_, (pair, outcome)| in_order(pair, outcome),
    );
    progress.finish();
}

/// Creates an output file before any run starts, so a bad path is bad input, not an hour of
/// runs thrown away at the end.
pub fn create_output(path: &Path, what: &str) -> Result<std::fs::File, ExitCode> {
    std::fs::File::create(path)
        .map_err(|error| bad_input(&format!("cannot write the {what} {}: {error}", path.display())))
}
