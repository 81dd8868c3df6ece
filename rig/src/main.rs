//! The `rig` command line.

use clap::{Parser, Subcommand};
use rig::{report, run, Policy, Scenario};
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
    /// Write the full trace of every run as JSON lines to this file.
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

/// Loads every scenario under `paths`, reporting each bad one; `None` when any was bad.
fn load_scenarios(paths: &[PathBuf]) -> Option<Vec<Scenario>> {
    let files = match scenario_files(paths) {
        Ok(files) => files,
        Err(error) => {
            eprintln!("error: {error}");
            return None;
        }
    };
    let mut scenarios = Vec::new();
    let mut bad_input = false;
    for file in &files {
        match Scenario::load(file) {
            Ok(scenario) => scenarios.push(scenario),
            Err(error) => {
                eprintln!("error: {error}");
                bad_input = true;
            }
        }
    }
    (!bad_input).then_some(scenarios)
}

fn policy_filter(name: Option<&str>) -> Result<Option<Policy>, ExitCode> {
    match name.map(|name| Policy::from_name(name).ok_or(name)) {
        Some(Err(name)) => {
            let known: Vec<_> = Policy::ALL.iter().map(|p| p.name()).collect();
            eprintln!("error: unknown policy `{name}`, expected one of {}", known.join(", "));
            Err(ExitCode::from(EXIT_BAD_INPUT))
        }
        Some(Ok(policy)) => Ok(Some(policy)),
        None => Ok(None),
    }
}

fn matrix_command(args: MatrixArgs) -> ExitCode {
    let policy = match policy_filter(args.policy.as_deref()) {
        Ok(policy) => policy,
        Err(code) => return code,
    };
    let Some(scenarios) = load_scenarios(&args.paths) else { return ExitCode::from(EXIT_BAD_INPUT) };
    let (shard, shards) = args.shard.unwrap_or((1, 1));
    let mut cases = Vec::new();
    let mut index = 0u64;
    for scenario in &scenarios {
        for policy_run in scenario.runs.iter().filter(|r| policy.is_none_or(|p| p == r.policy)) {
            let mut case = report::MatrixCase::new(scenario.path.display().to_string(), policy_run.policy.name());
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
    }
    let summary = report::matrix_summary(&cases, (shard, shards));
    println!("{summary}");
    if let Some(path) = &args.junit {
        if let Err(error) = std::fs::write(path, report::junit(&cases)) {
            eprintln!("error: cannot write {}: {error}", path.display());
            return ExitCode::from(EXIT_BAD_INPUT);
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
    println!(
        "rig bench: release build, one core, seeds {}..{} ({seeds} per scenario and policy)",
        args.seeds.start, args.seeds.end
    );
    println!(
        "{:<64} {:>6} {:>11} {:>9} {:>11} {:>10}",
        "scenario", "runs", "wall/run", "runs/s", "sim/run", "sim/wall"
    );
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
        println!(
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
    println!(
        "total: {all_runs} runs, {:.0} runs/s on one core, {failed} failed",
        all_runs as f64 / (all_wall_us as f64 / 1e6)
    );
    if let Some(peak) = peak_memory_kib() {
        println!("peak resident memory: {} MiB", peak / 1024);
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

/// Every scenario file under the given paths, sorted, so runs are listed in a stable order.
fn scenario_files(paths: &[PathBuf]) -> Result<Vec<PathBuf>, String> {
    let mut files = Vec::new();
    for path in paths {
        if path.is_dir() {
            collect_toml(path, &mut files).map_err(|e| format!("{}: cannot read the folder: {e}", path.display()))?;
        } else if path.is_file() {
            files.push(path.clone());
        } else {
            return Err(format!("{}: no such file or folder", path.display()));
        }
    }
    if files.is_empty() {
        return Err("no scenario files (*.toml) under the given paths".into());
    }
    files.sort();
    files.dedup();
    Ok(files)
}

fn collect_toml(folder: &Path, files: &mut Vec<PathBuf>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(folder)? {
        let path = entry?.path();
        if path.is_dir() {
            collect_toml(&path, files)?;
        } else if path.extension().is_some_and(|e| e == "toml") {
            files.push(path);
        }
    }
    Ok(())
}

fn run_command(args: RunArgs) -> ExitCode {
    let policy = match policy_filter(args.policy.as_deref()) {
        Ok(policy) => policy,
        Err(code) => return code,
    };
    // Load everything first: a bad file is reported before any run starts.
    let Some(scenarios) = load_scenarios(&args.paths) else { return ExitCode::from(EXIT_BAD_INPUT) };
    let seeds = match (args.seed, args.seeds) {
        (Some(seed), _) => seed..seed + 1,
        (None, Some(range)) => range,
        (None, None) => 0..1,
    };
    let mut trace_file = match args.trace.as_ref().map(std::fs::File::create).transpose() {
        Ok(file) => file.map(std::io::BufWriter::new),
        Err(error) => {
            eprintln!("error: cannot write the trace file: {error}");
            return ExitCode::from(EXIT_BAD_INPUT);
        }
    };
    let (mut passed, mut failed) = (0u64, 0u64);
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    for scenario in &scenarios {
        let runs: Vec<_> = scenario.runs.iter().filter(|r| policy.is_none_or(|p| p == r.policy)).collect();
        for policy_run in runs {
            for seed in seeds.clone() {
                let outcome = run(scenario, policy_run, seed);
                let line = if args.json { report::json_line(&outcome).to_string() } else { report::human(&outcome) };
                let _ = writeln!(out, "{line}");
                if let Some(file) = trace_file.as_mut() {
                    for event in outcome.trace.json_lines() {
                        let _ = writeln!(
                            file,
                            "{{\"scenario\":{},\"policy\":\"{}\",\"seed\":{},\"event\":{event}}}",
                            serde_json::json!(outcome.scenario),
                            outcome.policy.name(),
                            seed
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
    }
    if !args.json {
        let _ = writeln!(out, "{passed} passed, {failed} failed");
    }
    if failed > 0 {
        ExitCode::from(EXIT_FAILED)
    } else {
        ExitCode::SUCCESS
    }
}
