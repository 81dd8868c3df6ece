//! `rig bench`: runs per second and simulated-to-wall time per scenario file, on one core and
//! on all of them.

use super::parallel::Jobs;
use super::{
    load_scenarios, parse_seed_range, run_all, run_count, run_jobs, Done, Harness, Pair, EXIT_BAD_INPUT, EXIT_FAILED,
};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct BenchArgs {
    /// Scenario files or folders to measure.
    #[arg(default_value = "scenarios")]
    pub paths: Vec<PathBuf>,
    /// Seeds to run every scenario and policy under, `A..B`.
    #[arg(long, default_value = "0..200", value_parser = parse_seed_range, allow_hyphen_values = true)]
    pub seeds: std::ops::Range<u64>,
    /// Also time a depth-1 sweep of this workload (none: skip it).
    #[arg(long, default_value = "scenarios/workloads/multi-round.toml")]
    pub sweep: Option<PathBuf>,
    #[command(flatten)]
    pub jobs: Jobs,
}

/// What one scenario file cost.
#[derive(Default)]
struct Cost {
    runs: u64,
    wall_us: u64,
    sim_ms: u64,
    failed: u64,
}

pub(crate) fn command(args: BenchArgs, harness: &Harness) -> ExitCode {
    let Some(scenarios) = load_scenarios(&args.paths) else { return ExitCode::from(EXIT_BAD_INPUT) };
    // Every policy the harness answers to; the runs it cannot serve are counted, not timed.
    let policies = harness.factory.policies();
    let (mut selected, mut file_of, mut skipped) = (Vec::new(), Vec::new(), 0u64);
    for (file, scenario) in scenarios.iter().enumerate() {
        for policy_run in scenario.runs.iter().filter(|r| policies.contains(&r.policy)) {
            match harness.skip(scenario, &policy_run.policy) {
                Some(_) => skipped += 1,
                None => {
                    selected.push(Pair { scenario, policy_run, skip: None });
                    // The scenario file of each (scenario, policy) pair, by its position in `scenarios`.
                    file_of.push(file);
                }
            }
        }
    }
    let workers = args.jobs.workers(run_count(&selected, &args.seeds));
    let seeds = args.seeds.end - args.seeds.start;
    out!(
        "rig bench: harness {}, {} jobs, seeds {}..{} ({seeds} per scenario and policy)",
        harness.name(),
        workers,
        args.seeds.start,
        args.seeds.end
    );
    out!("{:<64} {:>6} {:>11} {:>9} {:>11} {:>10}", "scenario", "runs", "wall/run", "runs/s", "sim/run", "sim/wall");
    let mut costs: Vec<Cost> = scenarios.iter().map(|_| Cost::default()).collect();
    let clock = std::time::Instant::now();
    run_all(
        run_jobs(&selected, &args.seeds),
        run_count(&selected, &args.seeds),
        workers,
        harness,
        true,
        |pair, done| {
            let Done::Ran(outcome) = done else { return };
            let cost = &mut costs[file_of[pair]];
            cost.runs += 1;
            cost.wall_us += outcome.wall_us.max(1);
            cost.sim_ms += outcome.sim_ms;
            cost.failed += u64::from(!outcome.passed);
        },
    );
    let elapsed_us = u64::try_from(clock.elapsed().as_micros()).unwrap_or(u64::MAX).max(1);
    for (scenario, cost) in scenarios.iter().zip(&costs).filter(|(_, cost)| cost.runs > 0) {
        let runs = cost.runs.max(1);
        out!(
            "{:<64} {:>6} {:>9}us {:>9.0} {:>9}ms {:>9.0}x",
            scenario.path.display(),
            cost.runs,
            cost.wall_us / runs,
            cost.runs as f64 / (cost.wall_us as f64 / 1e6),
            cost.sim_ms / runs,
            (cost.sim_ms as f64 * 1e3) / cost.wall_us.max(1) as f64
        );
    }
    let all_runs: u64 = costs.iter().map(|c| c.runs).sum();
    let busy_us: u64 = costs.iter().map(|c| c.wall_us).sum();
    let mut failed: u64 = costs.iter().map(|c| c.failed).sum();
    // Runs per second of one core: each run's own wall time. Runs per second in all: the
    // whole catalogue over the elapsed time, with every worker busy.
    out!(
        "total: {all_runs} runs, {:.0} runs/s per core, {:.0} runs/s with {workers} jobs ({:.2} runs at once on average), {failed} failed, {} skipped",
        all_runs as f64 / (busy_us.max(1) as f64 / 1e6),
        all_runs as f64 / (elapsed_us as f64 / 1e6),
        busy_us as f64 / elapsed_us as f64,
        skipped.saturating_mul(seeds)
    );
    if let Some(line) = super::interrupted(all_runs, run_count(&selected, &args.seeds)) {
        out!("{line} (the figures above are of the runs made)");
    }
    if let Some(workload) = args.sweep.as_ref().filter(|w| w.exists() && !crate::interrupt::requested()) {
        failed += super::sweep::bench(workload, harness);
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
