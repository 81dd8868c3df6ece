//! `rig bench`: runs per second and simulated-to-wall time per scenario file.

use super::{load_scenarios, parse_seed_range, EXIT_BAD_INPUT, EXIT_FAILED};
use rig::run;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct BenchArgs {
    /// Scenario files or folders to measure.
    #[arg(default_value = "scenarios")]
    pub paths: Vec<PathBuf>,
    /// Seeds to run every scenario and policy under, `A..B`.
    #[arg(long, default_value = "0..200", value_parser = parse_seed_range)]
    pub seeds: std::ops::Range<u64>,
    /// Also time a depth-1 sweep of this workload (none: skip it).
    #[arg(long, default_value = "scenarios/workloads/multi-round.toml")]
    pub sweep: Option<PathBuf>,
}

pub fn command(args: BenchArgs) -> ExitCode {
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
    if let Some(workload) = args.sweep.as_ref().filter(|w| w.exists()) {
        failed += super::sweep::bench(workload);
    }
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
