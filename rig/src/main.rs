//! The `rig` command line.

use clap::{Parser, Subcommand};
use rig::{report, run, PolicyRun, Scenario};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[derive(Parser)]
#[command(name = "rig", version, about = "A deterministic fault-injection test rig for durable agent harnesses")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run scenario files (or every .toml file under a folder) and report each run.
    Run(RunArgs),
    /// Run many seeds, one shard of them, for CI: failing pairs with a repro each, JUnit XML.
    Matrix(MatrixArgs),
    /// Measure the rig: runs per second and simulated-to-wall time per scenario file.
    Bench(BenchArgs),
    /// Put the frame-aware WebSocket drop-proxy between two real processes.
    Proxy(proxy::ProxyArgs),
}

#[derive(clap::Args)]
struct MatrixArgs {
    /// Scenario files or folders.
    #[arg(required = true)]
    paths: Vec<PathBuf>,
    /// Seeds to run, `A..B`.
    #[arg(long, value_parser = parse_seed_range)]
    seeds: std::ops::Range<u64>,
    /// Run only shard K of N (`K/N`, K from 1): every N-th run, so runners split the work.
    #[arg(long, value_parser = parse_shard)]
    shard: Option<(u64, u64)>,
    /// Run only this policy.
    #[arg(long)]
    policy: Option<String>,
    /// Write a JUnit XML report here: one test case per scenario and policy.
    #[arg(long)]
    junit: Option<PathBuf>,
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

#[derive(clap::Args)]
struct BenchArgs {
    /// Scenario files or folders to measure.
    #[arg(default_value = "scenarios")]
    paths: Vec<PathBuf>,
    /// Seeds to run every scenario and policy under, `A..B`.
    #[arg(long, default_value = "0..200", value_parser = parse_seed_range)]
    seeds: std::ops::Range<u64>,
}

#[derive(clap::Args)]
struct RunArgs {
    /// Scenario files or folders (searched recursively for .toml files).
    #[arg(required = true)]
    paths: Vec<PathBuf>,
    /// Run this one seed.
    #[arg(long, conflicts_with = "seeds")]
    seed: Option<u64>,
    /// Run a range of seeds, `A..B` (B excluded).
    #[arg(long, value_parser = parse_seed_range)]
    seeds: Option<std::ops::Range<u64>>,
    /// Run only this policy (by default every policy the scenario declares).
    #[arg(long)]
    policy: Option<String>,
    /// One JSON object per line per run instead of the human report.
    #[arg(long)]
    json: bool,
    /// Write the full trace of every run as JSON lines to this file (`-`: standard output).
    #[arg(long)]
    trace: Option<PathBuf>,
}

fn parse_seed_range(text: &str) -> Result<std::ops::Range<u64>, String> {
    let (start, end) = text.split_once("..").ok_or_else(|| format!("expected A..B, found `{text}`"))?;
    let start: u64 = start.parse().map_err(|_| format!("`{start}` is not a seed"))?;
    let end: u64 = end.parse().map_err(|_| format!("`{end}` is not a seed"))?;
    if end <= start {
        return Err(format!("the range {start}..{end} is empty"));
    }
    Ok(start..end)
}

/// Exit codes other tools rely on.
const EXIT_FAILED: u8 = 1;
const EXIT_BAD_INPUT: u8 = 2;

/// Writes a line to standard output. A closed pipe (`rig run ... | head`) is not an error
/// worth a panic: the rest of the output is simply not wanted.
macro_rules! out {
    ($($arg:tt)*) => {{
        let _ = writeln!(std::io::stdout().lock(), $($arg)*);
    }};
}

/// Writes a line to standard error, which may be closed too.
macro_rules! err {
    ($($arg:tt)*) => {{
        let _ = writeln!(std::io::stderr().lock(), $($arg)*);
    }};
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .without_time()
        .init();
    match Cli::parse().command {
        Command::Run(args) => run_command(args),
        Command::Matrix(args) => matrix_command(args),
        Command::Bench(args) => bench_command(args),
        Command::Proxy(args) => ExitCode::from(u8::try_from(proxy::run(args)).unwrap_or(1)),
    }
}

/// Bad input: said once, and the exit status other tools rely on.
fn bad_input(message: &str) -> ExitCode {
    err!("error: {message}");
    ExitCode::from(EXIT_BAD_INPUT)
}

/// Loads every scenario under `paths`, reporting each bad one; `None` when any was bad.
fn load_scenarios(paths: &[PathBuf]) -> Option<Vec<Scenario>> {
    let files = match scenario_files(paths) {
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
fn selected_runs<'a>(
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

fn matrix_command(args: MatrixArgs) -> ExitCode {
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

fn bench_command(args: BenchArgs) -> ExitCode {
    let Some(scenarios) = load_scenarios(&args.paths) else { return ExitCode::from(EXIT_BAD_INPUT) };
    let seeds = args.seeds.end - args.seeds.start;
    out!(
        "rig bench: release build, one core, seeds {}..{} ({seeds} per scenario and policy)",
        args.seeds.start,
        args.seeds.end
    );
    out!("{:<64} {:>6} {:>11} {:>9} {:>11} {:>10}", "scenario", "runs", "wall/run", "runs/s", "sim/run", "sim/wall");
    let (mut all_runs, mut all_wall_us, mut failed) = (0u64, 0u64, 0u64);
    for scenario in &scenarios {
        let (mut runs, mut wall_us, mut sim_ms) = (0u64, 0u64, 0u64);
        for policy_run in &scenario.runs {
            for seed in args.seeds.clone() {
                let outcome = run(scenario, policy_run, seed);
                runs += 1;
                wall_us += outcome.wall_us.max(1);
                sim_ms += outcome.sim_ms;
                failed += u64::from(!outcome.passed);
            }
        }
        let per_run_us = wall_us / runs.max(1);
        out!(
            "{:<64} {:>6} {:>9}us {:>9.0} {:>9}ms {:>9.0}x",
            scenario.path.display(),
            runs,
            per_run_us,
            runs as f64 / (wall_us as f64 / 1e6),
            sim_ms / runs.max(1),
            (sim_ms as f64 * 1e3) / wall_us as f64
        );
        all_runs += runs;
        all_wall_us += wall_us;
    }
    out!(
        "total: {all_runs} runs, {:.0} runs/s on one core, {failed} failed",
        all_runs as f64 / (all_wall_us as f64 / 1e6)
    );
    if let Some(peak) = peak_memory_kib() {
        out!("peak resident memory: {} MiB", peak / 1024);
    }
    if failed > 0 {
        ExitCode::from(EXIT_FAILED)
    } else {
        ExitCode::SUCCESS
    }
}

/// The process's peak resident set size, where the platform tells it (Linux).
fn peak_memory_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// Every scenario file under the given paths, sorted and each once, so runs are listed in a
/// stable order. Symbolic links are followed; a loop among them is reported once.
fn scenario_files(paths: &[PathBuf]) -> Result<Vec<PathBuf>, Vec<String>> {
    let mut files = Vec::new();
    let mut errors = std::collections::BTreeSet::new();
    for path in paths {
        if !path.exists() {
            errors.insert(format!("{}: no such file or folder", path.display()));
            continue;
        }
        for entry in walkdir::WalkDir::new(path).follow_links(true).sort_by_file_name() {
            match entry {
                Ok(entry) if entry.file_type().is_file() && is_scenario(entry.path()) => {
                    files.push(entry.path().to_path_buf())
                }
                Ok(_) => {}
                Err(error) => {
                    let at = error.path().map_or_else(|| path.display().to_string(), |p| p.display().to_string());
                    let why = match error.loop_ancestor() {
                        Some(ancestor) => format!("a symbolic link loops back to {}", ancestor.display()),
                        None => error.io_error().map_or_else(|| error.to_string(), ToString::to_string),
                    };
                    errors.insert(format!("{at}: {why}"));
                }
            }
        }
    }
    if !errors.is_empty() {
        return Err(errors.into_iter().collect());
    }
    if files.is_empty() {
        return Err(vec!["no scenario files (*.toml) under the given paths".into()]);
    }
    files.sort();
    files.dedup();
    Ok(files)
}

fn is_scenario(path: &Path) -> bool {
    path.extension().is_some_and(|e| e == "toml")
}

/// Where `--trace` goes: a file, or standard output for `-`.
fn trace_sink(path: &Path) -> std::io::Result<Box<dyn std::io::Write>> {
    if path == Path::new("-") {
        Ok(Box::new(std::io::stdout()))
    } else {
        Ok(Box::new(std::io::BufWriter::new(std::fs::File::create(path)?)))
    }
}

fn run_command(args: RunArgs) -> ExitCode {
    // Load everything first: a bad file is reported before any run starts.
    let Some(scenarios) = load_scenarios(&args.paths) else { return ExitCode::from(EXIT_BAD_INPUT) };
    let selected = match selected_runs(&scenarios, args.policy.as_deref()) {
        Ok(selected) => selected,
        Err(message) => return bad_input(&message),
    };
    let seeds = match (args.seed, args.seeds) {
        (Some(seed), _) => seed..seed + 1,
        (None, Some(range)) => range,
        (None, None) => 0..1,
    };
    let mut trace_out = match args.trace.as_deref().map(trace_sink).transpose() {
        Ok(sink) => sink,
        Err(error) => return bad_input(&format!("cannot write the trace file: {error}")),
    };
    let (mut passed, mut failed) = (0u64, 0u64);
    for (scenario, policy_run) in selected {
        for seed in seeds.clone() {
            let outcome = run(scenario, policy_run, seed);
            if args.json {
                out!("{}", report::json_line(&outcome));
            } else {
                out!("{}", report::human(&outcome));
            }
            if let Some(sink) = trace_out.as_mut() {
                for event in outcome.trace.json_lines() {
                    let scenario = serde_json::json!(outcome.scenario);
                    let _ = writeln!(
                        sink,
                        "{{\"scenario\":{scenario},\"policy\":\"{}\",\"seed\":{seed},\"event\":{event}}}",
                        outcome.policy
                    );
                }
            }
            if outcome.passed {
                passed += 1
            } else {
                failed += 1
            }
        }
    }
    if let Some(sink) = trace_out.as_mut() {
        let _ = sink.flush();
    }
    if !args.json {
        out!("{passed} passed, {failed} failed");
    }
    if failed > 0 {
        ExitCode::from(EXIT_FAILED)
    } else {
        ExitCode::SUCCESS
    }
}
