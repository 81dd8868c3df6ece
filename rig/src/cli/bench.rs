//! `rig bench`: what the rig costs, and whether that moved.
//!
//! **The catalogue.** Every run of the selection (scenario file × policy × seed), `--passes`
//! times, each pass cold: the memory of uncut runs is emptied first, so a figure never depends
//! on what an earlier pass left. Only judged runs count (an uncut run simulated for a verdict is
//! part of the run that needed it; a skipped run costs nothing). Per run, the CPU time of the
//! thread that made it: on a shared machine wall time measures the machine, CPU time the rig.
//! Per file, CPU per run and runs/s of one core; in all, CPU per run and runs/s per core (the
//! median pass), runs/s with every worker busy, how many uncut runs were simulated and their
//! share of the time, and the peak resident memory.
//!
//! **Exploration.** A depth-1 sweep of one workload and a few seeds of exploration of the
//! workloads: runs/s per core and the uncut runs' share, each started cold.
//!
//! **Against a baseline.** `--write-baseline FILE` records the figures; `--baseline FILE`
//! compares this run's with them, figure by figure, and says by how much each moved: a change
//! under 5 % is no change, one over `--threshold` (10 %) a regression or an improvement (a
//! slower figure over it exits 1). Only figures of the same selection compare: a baseline of other
//! files, seeds or jobs is refused.
//!
//! **Against another binary.** `--against BINARY` runs `BINARY run PATHS --seeds S --jobs 1
//! --json` and this binary's own, in turn (A B A B, `--rounds` of each), on the files both pass,
//! and compares their CPU per pass: a ratio from one machine at one time, with whatever else the
//! machine does landing on both. `.ci/bench-against` builds an earlier revision and calls it
//! (`just bench-against REV`).
//!
//! **A planted slowdown** shows the guard bites: with `RIG_BENCH_PLANTED_SLOWDOWN=P` in its
//! environment, each judged run of this binary spends P % more CPU time doing nothing (the
//! `--against` binary is run without it). The nightly checks both ways.

use super::parallel::{for_each_ordered, Jobs};
use super::progress::Progress;
use super::{load_scenarios, parse_seed_range, run_count, run_jobs, Done, Harness, Pair, EXIT_BAD_INPUT, EXIT_FAILED};
use crate::run::cpu;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct BenchArgs {
    /// Scenario files or folders to measure.
    #[arg(default_value = "scenarios")]
    pub paths: Vec<PathBuf>,
    /// Seeds to run every scenario and policy under, `A..B`.
    #[arg(long, default_value = "0..200", value_parser = parse_seed_range, allow_hyphen_values = true)]
    pub seeds: std::ops::Range<u64>,
    /// Passes over the selection, each cold; the figures are the median pass's.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=100))]
    pub passes: u64,
    /// Also time a depth-1 sweep of this workload (none: skip it).
    #[arg(long, default_value = "scenarios/workloads/multi-round.toml")]
    pub sweep: Option<PathBuf>,
    /// Also time `rig explore` of these workloads (a file or folder; none: skip it).
    #[arg(long, default_value = "scenarios/workloads")]
    pub explore: Option<PathBuf>,
    /// The seeds `--explore` explores each workload under.
    #[arg(long, default_value = "0..4", value_parser = parse_seed_range, allow_hyphen_values = true)]
    pub explore_seeds: std::ops::Range<u64>,
    /// Compare the figures with those recorded in FILE (`--write-baseline`) and say how much
    /// each moved; exit 1 when one got slower by more than `--threshold`.
    #[arg(long, value_name = "FILE")]
    pub baseline: Option<PathBuf>,
    /// Record the figures in FILE (JSON), as a baseline to compare later runs with.
    #[arg(long, value_name = "FILE")]
    pub write_baseline: Option<PathBuf>,
    /// Compare with another rig binary instead, paired: BINARY and this one run the files both
    /// pass in turn (`--rounds` each, A B A B), `run --jobs 1`, CPU time per pass.
    #[arg(long, value_name = "BINARY", conflicts_with_all = ["baseline", "write_baseline"])]
    pub against: Option<PathBuf>,
    /// How many timed passes of each binary `--against` makes.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u64).range(1..=100))]
    pub rounds: u64,
    /// The change, in percent, that counts as a regression (or an improvement).
    #[arg(long, default_value_t = 10.0)]
    pub threshold: f64,
    #[command(flatten)]
    pub jobs: Jobs,
}

/// A change under this many percent is no change at all.
const NO_CHANGE_PERCENT: f64 = 5.0;
/// The environment variable of the planted slowdown (see the module's documentation).
pub const PLANTED_SLOWDOWN: &str = "RIG_BENCH_PLANTED_SLOWDOWN";

/// The figures of one `rig bench`, as `--write-baseline` records them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Figures {
    pub harness: String,
    pub seeds: String,
    pub jobs: usize,
    pub passes: u64,
    /// Judged runs in a pass.
    pub runs: u64,
    /// CPU time per judged run, in microseconds (the median pass).
    pub cpu_per_run_us: f64,
    pub runs_per_s_per_core: f64,
    /// Uncut runs simulated in a pass, and their share of the CPU time.
    pub uncut_runs: u64,
    pub uncut_share: f64,
    pub peak_memory_mib: f64,
    pub sweep: Option<Exploring>,
    pub explore: Option<Exploring>,
    /// Per scenario file: judged runs in a pass and CPU per run (over every pass).
    pub files: BTreeMap<String, FileFigures>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileFigures {
    pub runs: u64,
    pub cpu_per_run_us: f64,
}

/// Exploration's speed: runs made (judged runs, shrinking included) per second of one core.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Exploring {
    pub what: String,
    pub runs: u64,
    pub runs_per_s_per_core: f64,
    pub uncut_runs: u64,
    pub uncut_share: f64,
}

/// What one scenario file cost in one pass.
#[derive(Default, Clone)]
struct Cost {
    runs: u64,
    cpu_ns: u64,
    wall_us: u64,
    sim_ms: u64,
    failed: u64,
}

/// One pass over the selection.
struct Pass {
    files: Vec<Cost>,
    wall_ns: u64,
    uncut_runs: u64,
    uncut_ns: u64,
}

impl Pass {
    fn runs(&self) -> u64 {
        self.files.iter().map(|c| c.runs).sum()
    }

    fn cpu_ns(&self) -> u64 {
        self.files.iter().map(|c| c.cpu_ns).sum()
    }
}

pub(crate) fn command(args: BenchArgs, harness: &Harness) -> ExitCode {
    if let Some(other) = &args.against {
        return against(&args, other, harness);
    }
    let baseline = match args.baseline.as_deref().map(read_baseline).transpose() {
        Ok(baseline) => baseline,
        Err(error) => {
            err!("error: {error}");
            return ExitCode::from(EXIT_BAD_INPUT);
        }
    };
    let Some(scenarios) = load_scenarios(&args.paths) else { return ExitCode::from(EXIT_BAD_INPUT) };
    crate::run::keep_workload_digests(&scenarios);
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
        "rig bench: harness {}, {} jobs, seeds {}..{} ({seeds} per scenario and policy), {} pass(es), each cold",
        harness.name(),
        workers,
        args.seeds.start,
        args.seeds.end,
        args.passes
    );
    let mut passes: Vec<Pass> =
        (0..args.passes).map(|_| pass(&selected, &file_of, scenarios.len(), &args.seeds, workers, harness)).collect();
    // The median pass by CPU per run (the slower of the middle two).
    passes.sort_by_key(|p| p.cpu_ns() / p.runs().max(1));
    let median = &passes[passes.len() / 2];
    out!("{:<64} {:>6} {:>11} {:>9} {:>11} {:>10}", "scenario", "runs", "CPU/run", "runs/s", "sim/run", "sim/wall");
    let mut files = BTreeMap::new();
    let mut failed = 0;
    for (index, scenario) in scenarios.iter().enumerate() {
        let mut all = Cost::default();
        for pass in &passes {
            let cost = &pass.files[index];
            all = Cost {
                runs: all.runs + cost.runs,
                cpu_ns: all.cpu_ns + cost.cpu_ns,
                wall_us: all.wall_us + cost.wall_us,
                sim_ms: all.sim_ms + cost.sim_ms,
                failed: all.failed.max(cost.failed),
            };
        }
        if all.runs == 0 {
            continue;
        }
        failed += all.failed;
        let cpu_per_run_us = all.cpu_ns as f64 / 1e3 / all.runs as f64;
        out!(
            "{:<64} {:>6} {:>9.0}us {:>9.0} {:>9}ms {:>9.0}x",
            scenario.path.display(),
            all.runs / args.passes,
            cpu_per_run_us,
            1e6 / cpu_per_run_us.max(1e-3),
            all.sim_ms / all.runs,
            (all.sim_ms as f64 * 1e3) / all.wall_us.max(1) as f64
        );
        files.insert(
            scenario.path.display().to_string(),
            FileFigures { runs: all.runs / args.passes, cpu_per_run_us: round(cpu_per_run_us) },
        );
    }
    let (runs, cpu_ns) = (median.runs(), median.cpu_ns().max(1));
    let cpu_per_run_us = cpu_ns as f64 / 1e3 / runs.max(1) as f64;
    let spread: Vec<String> =
        passes.iter().map(|p| format!("{:.0}", p.cpu_ns() as f64 / 1e3 / p.runs().max(1) as f64)).collect();
    out!(
        "total: {runs} judged runs a pass, {failed} failed, {} skipped; CPU per run {cpu_per_run_us:.0} us (passes: {} us), {:.0} runs/s per core, {:.0} runs/s with {workers} jobs",
        skipped.saturating_mul(seeds),
        spread.join(", "),
        runs as f64 * 1e9 / cpu_ns as f64,
        runs as f64 * 1e9 / median.wall_ns.max(1) as f64,
    );
    let uncut_share = median.uncut_ns as f64 / cpu_ns as f64;
    let each: Vec<String> = passes.iter().map(|p| p.uncut_runs.to_string()).collect();
    out!(
        "uncut runs: {} simulated a pass ({:.1} % of judged runs; passes: {}), {:.1} % of the CPU time",
        median.uncut_runs,
        median.uncut_runs as f64 * 100.0 / runs.max(1) as f64,
        each.join(", "),
        uncut_share * 100.0
    );
    let made: u64 = passes.iter().map(Pass::runs).sum();
    if let Some(line) = super::interrupted(made, run_count(&selected, &args.seeds).saturating_mul(args.passes)) {
        out!("{line} (the figures above are of the runs made)");
    }
    let going = |path: &&PathBuf| path.exists() && !crate::interrupt::requested();
    let sweep = args.sweep.as_ref().filter(going).and_then(|workload| sweep(workload, harness));
    let explore = args.explore.as_ref().filter(going).and_then(|w| explore(w, &args.explore_seeds, harness));
    failed += [&sweep, &explore].iter().filter_map(|e| e.as_ref()).map(|(_, failed)| failed).sum::<u64>();
    let peak = peak_memory_kib().unwrap_or(0);
    out!("peak resident memory: {} MiB", peak / 1024);
    let figures = Figures {
        harness: harness.name().to_string(),
        seeds: format!("{}..{}", args.seeds.start, args.seeds.end),
        jobs: workers.get(),
        passes: args.passes,
        runs,
        cpu_per_run_us: round(cpu_per_run_us),
        runs_per_s_per_core: round(runs as f64 * 1e9 / cpu_ns as f64),
        uncut_runs: median.uncut_runs,
        uncut_share: round(uncut_share),
        peak_memory_mib: round(peak as f64 / 1024.0),
        sweep: sweep.map(|(figures, _)| figures),
        explore: explore.map(|(figures, _)| figures),
        files,
    };
    if let Some(path) = &args.write_baseline {
        let text = serde_json::to_string_pretty(&figures).expect("figures serialize") + "\n";
        if let Err(error) = std::fs::write(path, text) {
            err!("error: cannot write the baseline {}: {error}", path.display());
            return ExitCode::from(EXIT_BAD_INPUT);
        }
        out!("baseline written to {}", path.display());
    }
    let mut slower = false;
    if let (Some(baseline), Some(path)) = (&baseline, &args.baseline) {
        match compare(baseline, &figures, args.threshold) {
            Ok(comparison) => {
                out!("against the baseline {}:", path.display());
                for line in &comparison.lines {
                    out!("  {line}");
                }
                out!("{}", comparison.verdict);
                slower = comparison.slower;
            }
            Err(why) => {
                err!("error: the baseline {} is not comparable: {why}", path.display());
                return ExitCode::from(EXIT_BAD_INPUT);
            }
        }
    }
    if failed > 0 || slower {
        ExitCode::from(EXIT_FAILED)
    } else {
        ExitCode::SUCCESS
    }
}

/// Rounds a figure to three decimals, so a baseline file reads well.
fn round(value: f64) -> f64 {
    (value * 1e3).round() / 1e3
}

/// One cold pass over the selection: each judged run's CPU time on its own thread.
fn pass(
    selected: &[Pair],
    file_of: &[usize],
    files: usize,
    seeds: &std::ops::Range<u64>,
    workers: std::num::NonZeroUsize,
    harness: &Harness,
) -> Pass {
    crate::run::forget_uncut_runs();
    let mut costs = vec![Cost::default(); files];
    let progress = Progress::new(run_count(selected, seeds));
    let clock = std::time::Instant::now();
    for_each_ordered(
        run_jobs(selected, seeds),
        workers,
        |job| {
            let started = cpu::thread_ns();
            let pair = job.pair;
            let done = job.run(harness);
            (pair, done, cpu::thread_ns().saturating_sub(started))
        },
        |_, (_, done, _)| progress.completed(matches!(done, Done::Ran(outcome) if !outcome.passed), None),
        |_, (pair, done, cpu_ns)| {
            let Done::Ran(outcome) = done else { return };
            let cost = &mut costs[file_of[pair]];
            cost.runs += 1;
            cost.cpu_ns += cpu_ns.max(1);
            cost.wall_us += outcome.wall_us.max(1);
            cost.sim_ms += outcome.sim_ms;
            cost.failed += u64::from(!outcome.passed);
        },
    );
    progress.finish();
    let wall_ns = u64::try_from(clock.elapsed().as_nanos()).unwrap_or(u64::MAX);
    let (uncut_runs, uncut_ns) = crate::run::uncut_tally();
    Pass { files: costs, wall_ns, uncut_runs, uncut_ns }
}

/// A depth-1 sweep of `workload` under the reference policy, cold, on this thread.
fn sweep(workload: &Path, harness: &Harness) -> Option<(Exploring, u64)> {
    let Ok(scenario) = crate::Scenario::load(workload) else {
        err!("error: cannot load the sweep workload {}", workload.display());
        return Some((exploring(workload.display().to_string(), 0, 1, (0, 0)), 1));
    };
    let options = crate::explore::SweepOptions::default();
    crate::run::forget_uncut_runs();
    let started = cpu::thread_ns();
    let report = match crate::explore::sweep(&harness.factory, &scenario, &options) {
        Ok(report) => report,
        Err(skip) => {
            out!("sweep: {}", crate::report::skip_line(&workload.display().to_string(), &options.policy, &skip));
            return None;
        }
    };
    let cpu_ns = cpu::thread_ns().saturating_sub(started).max(1);
    let runs = report.runs.len() as u64 + 1;
    let figures = exploring(format!("sweep {} depth 1", workload.display()), runs, cpu_ns, crate::run::uncut_tally());
    out!(
        "sweep: {} depth 1 under {}: {runs} runs, {:.0} runs/s per core, uncut runs {} ({:.1} % of the CPU time), {} findings",
        workload.display(),
        harness.name(),
        figures.runs_per_s_per_core,
        figures.uncut_runs,
        figures.uncut_share * 100.0,
        report.findings.len()
    );
    let failed = u64::from(!report.findings.is_empty() || !report.baseline_fired.is_empty());
    Some((figures, failed))
}

/// `rig explore` of the workloads under `path` for `seeds` under the reference policy, cold, on
/// this thread.
fn explore(path: &Path, seeds: &std::ops::Range<u64>, harness: &Harness) -> Option<(Exploring, u64)> {
    let scenarios = load_scenarios(&[path.to_path_buf()])?;
    let policy = "reference";
    crate::run::forget_uncut_runs();
    let started = cpu::thread_ns();
    let (mut runs, mut failing, mut explored) = (0u64, 0u64, 0u64);
    for scenario in &scenarios {
        for seed in seeds.clone() {
            // A workload the harness cannot run is skipped, as `rig explore` skips it.
            let Ok(exploration) = crate::explore::explore(&harness.factory, scenario, policy, seed, false) else {
                break;
            };
            runs += exploration.runs as u64;
            explored += 1;
            failing += u64::from(!exploration.fired.is_empty() || !exploration.uncut_fired.is_empty());
        }
    }
    if explored == 0 {
        return None;
    }
    let cpu_ns = cpu::thread_ns().saturating_sub(started).max(1);
    let what = format!("explore {} seeds {}..{}", path.display(), seeds.start, seeds.end);
    let figures = exploring(what, runs, cpu_ns, crate::run::uncut_tally());
    out!(
        "explore: {} under {policy}, seeds {}..{}: {explored} seed(s) of {} workload(s), {runs} runs, {:.0} runs/s per core, uncut runs {} ({:.1} % of the CPU time), {failing} failing",
        path.display(),
        seeds.start,
        seeds.end,
        explored / (seeds.end - seeds.start).max(1),
        figures.runs_per_s_per_core,
        figures.uncut_runs,
        figures.uncut_share * 100.0,
    );
    Some((figures, failing))
}

fn exploring(what: String, runs: u64, cpu_ns: u64, (uncut_runs, uncut_ns): (u64, u64)) -> Exploring {
    Exploring {
        what,
        runs,
        runs_per_s_per_core: round(runs as f64 * 1e9 / cpu_ns as f64),
        uncut_runs,
        uncut_share: round(uncut_ns as f64 / cpu_ns as f64),
    }
}

fn read_baseline(path: &Path) -> Result<Figures, String> {
    let text =
        std::fs::read_to_string(path).map_err(|e| format!("cannot read the baseline {}: {e}", path.display()))?;
    serde_json::from_str(&text)
        .map_err(|e| format!("{}: not a baseline of `rig bench --write-baseline`: {e}", path.display()))
}

/// How one set of figures compares with a baseline.
#[derive(Debug)]
struct Comparison {
    lines: Vec<String>,
    verdict: String,
    /// A figure got slower by more than the threshold.
    slower: bool,
}

/// How `now` moved from `then`, for a figure where more is better (`higher_better`) or worse.
fn change(then: f64, now: f64) -> f64 {
    if then == 0.0 {
        return 0.0;
    }
    (now / then - 1.0) * 100.0
}

/// Words for a change of `percent` in a figure, against the threshold: under
/// [`NO_CHANGE_PERCENT`] no change; over the threshold a regression or an improvement.
fn judge(percent: f64, higher_better: bool, threshold: f64) -> (&'static str, bool) {
    let worse = if higher_better { -percent } else { percent };
    if percent.abs() < NO_CHANGE_PERCENT {
        ("no change", false)
    } else if worse > threshold {
        ("REGRESSION", true)
    } else if -worse > threshold {
        ("improvement", false)
    } else if worse > 0.0 {
        ("slower, within the threshold", false)
    } else {
        ("faster, within the threshold", false)
    }
}

/// Compares `now` with `then`, figure by figure. Only the same selection compares: the same
/// harness, seeds and jobs, and every file with the same runs.
fn compare(then: &Figures, now: &Figures, threshold: f64) -> Result<Comparison, String> {
    if (then.harness.as_str(), then.seeds.as_str(), then.jobs) != (now.harness.as_str(), now.seeds.as_str(), now.jobs) {
        return Err(format!(
            "it was recorded for harness {}, seeds {}, {} jobs; this is harness {}, seeds {}, {} jobs",
            then.harness, then.seeds, then.jobs, now.harness, now.seeds, now.jobs
        ));
    }
    let runs = |figures: &Figures| figures.files.iter().map(|(f, c)| (f.clone(), c.runs)).collect::<BTreeMap<_, _>>();
    if runs(then) != runs(now) {
        let differ: std::collections::BTreeSet<&String> = then
            .files
            .keys()
            .chain(now.files.keys())
            .filter(|f| then.files.get(*f).map(|c| c.runs) != now.files.get(*f).map(|c| c.runs))
            .collect();
        let named: Vec<&str> = differ.iter().take(3).map(|f| f.as_str()).collect();
        return Err(format!("{} file(s) differ in their runs (such as {})", differ.len(), named.join(", ")));
    }
    let mut lines = Vec::new();
    let mut slower = Vec::new();
    let mut figure = |name: &str, then: f64, now: f64, unit: &str, higher_better: bool, judged: bool| {
        let percent = change(then, now);
        let (words, worse) = if judged { judge(percent, higher_better, threshold) } else { ("not judged", false) };
        if worse {
            slower.push(name.to_string());
        }
        format!("{name}: {then:.1}{unit} -> {now:.1}{unit} ({percent:+.1} %): {words}")
    };
    lines.push(figure("CPU per run", then.cpu_per_run_us, now.cpu_per_run_us, " us", false, true));
    lines.push(figure("runs/s per core", then.runs_per_s_per_core, now.runs_per_s_per_core, "", true, true));
    lines.push(figure("peak memory", then.peak_memory_mib, now.peak_memory_mib, " MiB", false, true));
    // The uncut runs' share is how the time splits, not how much it is.
    lines.push(figure("uncut runs' share", then.uncut_share * 100.0, now.uncut_share * 100.0, " %", false, false));
    for (name, then, now) in [("sweep", &then.sweep, &now.sweep), ("explore", &then.explore, &now.explore)] {
        match (then, now) {
            (Some(then), Some(now)) if then.what == now.what && then.runs == now.runs => lines.push(figure(
                &format!("{name} runs/s per core"),
                then.runs_per_s_per_core,
                now.runs_per_s_per_core,
                "",
                true,
                true,
            )),
            (None, None) => {}
            _ => lines.push(format!("{name}: not the same in both, not compared")),
        }
    }
    let mut moved: Vec<(f64, &String)> = now
        .files
        .iter()
        .map(|(file, now)| (change(then.files[file].cpu_per_run_us, now.cpu_per_run_us), file))
        .collect();
    moved.sort_by(|a, b| b.0.abs().total_cmp(&a.0.abs()));
    let most: Vec<String> = moved.iter().take(3).map(|(percent, file)| format!("{file} {percent:+.1} %")).collect();
    if !most.is_empty() {
        lines.push(format!("CPU per run moved most in: {}", most.join(", ")));
    }
    let verdict = if slower.is_empty() {
        format!("verdict: no figure slower by more than {threshold} %")
    } else {
        format!("verdict: REGRESSION: {} slower by more than {threshold} %", slower.join(", "))
    };
    Ok(Comparison { lines, verdict, slower: !slower.is_empty() })
}

/// The process's peak resident set size, where the platform tells it (Linux).
fn peak_memory_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// One binary's pass, as `--against` times it.
struct Timed {
    cpu_ns: u64,
    peak_kib: u64,
    runs: u64,
}

/// What one binary's pass made: its figures, which files passed every run, and, when it could
/// not read its input (exit status 2, no run made), the error lines it printed.
struct BinaryPass {
    timed: Timed,
    passed: BTreeMap<String, bool>,
    load_errors: Option<Vec<String>>,
}

/// Runs `binary run FILES --seeds S --jobs 1 --json`, and says which files passed every run.
fn run_binary(
    binary: &Path,
    files: &[PathBuf],
    seeds: &std::ops::Range<u64>,
    planted: bool,
) -> Result<BinaryPass, String> {
    use std::io::Read;
    let mut command = std::process::Command::new(binary);
    command.arg("run").args(files).args([
        "--seeds",
        &format!("{}..{}", seeds.start, seeds.end),
        "--jobs",
        "1",
        "--json",
    ]);
    if !planted {
        command.env_remove(PLANTED_SLOWDOWN);
    }
    let mut child = command
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run {}: {e}", binary.display()))?;
    // Its errors are read on the side, so that neither stream fills while the other is read.
    let mut stderr = child.stderr.take().expect("piped");
    let errors = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        text
    });
    let mut output = String::new();
    child.stdout.take().expect("piped").read_to_string(&mut output).map_err(|e| e.to_string())?;
    let errors = errors.join().unwrap_or_default();
    // Its own CPU time and peak memory, from the kernel's account of it.
    let (mut status, mut usage) = (0, unsafe { std::mem::zeroed::<libc::rusage>() });
    let pid = libc::pid_t::try_from(child.id()).map_err(|e| e.to_string())?;
    // SAFETY: `status` and `usage` are valid for the call to fill in; the child is ours, not yet waited for.
    if unsafe { libc::wait4(pid, &mut status, 0, &mut usage) } != pid {
        return Err(format!("cannot wait for {}", binary.display()));
    }
    let ns = |t: libc::timeval| {
        u64::try_from(t.tv_sec).unwrap_or(0) * 1_000_000_000 + u64::try_from(t.tv_usec).unwrap_or(0) * 1_000
    };
    let mut passed: BTreeMap<String, bool> = BTreeMap::new();
    let mut runs = 0;
    for line in output.lines() {
        let Ok(run) = serde_json::from_str::<serde_json::Value>(line) else { continue };
        let (Some(scenario), true) = (run["scenario"].as_str(), run["skipped"].is_null()) else { continue };
        runs += 1;
        let ok = passed.entry(scenario.to_string()).or_insert(true);
        *ok = *ok && run["passed"] == true;
    }
    let timed = Timed {
        cpu_ns: ns(usage.ru_utime) + ns(usage.ru_stime),
        peak_kib: u64::try_from(usage.ru_maxrss).unwrap_or(0),
        runs,
    };
    // `rig run` exits 2 without a run when it cannot read a file (or an argument).
    let bad_input = libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == i32::from(EXIT_BAD_INPUT);
    let load_errors = (bad_input && runs == 0).then(|| {
        let lines: Vec<String> = errors.lines().filter(|l| !l.trim().is_empty()).map(str::to_string).collect();
        if lines.is_empty() {
            vec!["error: (it printed no reason)".to_string()]
        } else {
            lines
        }
    });
    Ok(BinaryPass { timed, passed, load_errors })
}

/// Files a binary cannot read, each with its error.
type Rejected = Vec<(PathBuf, String)>;

/// The files of `files` that `binary` can read, with the error of each it cannot. A binary
/// that rejects one file (an older one, say, that does not know a newer key) rejects the whole
/// selection, so the files its errors name are left out and the rest tried again; if its errors
/// name none, each file is tried alone. Each try runs the first seed only.
fn readable(
    binary: &Path,
    files: &[PathBuf],
    first: Vec<String>,
    seeds: &std::ops::Range<u64>,
) -> Result<(Vec<PathBuf>, Rejected), String> {
    let named = |file: &PathBuf, error: &str| error.contains(&format!("{}:", file.display()));
    let mut rejected: Rejected = Vec::new();
    for file in files {
        if let Some(error) = first.iter().find(|e| named(file, e)) {
            rejected.push((file.clone(), error.clone()));
        }
    }
    let one = seeds.start..seeds.start.saturating_add(1);
    let mut kept: Vec<PathBuf> = files.iter().filter(|f| !rejected.iter().any(|(r, _)| r == *f)).cloned().collect();
    if !rejected.is_empty() && !kept.is_empty() && run_binary(binary, &kept, &one, false)?.load_errors.is_none() {
        return Ok((kept, rejected));
    }
    (kept, rejected) = (Vec::new(), Vec::new());
    for file in files {
        match run_binary(binary, std::slice::from_ref(file), &one, false)?.load_errors {
            None => kept.push(file.clone()),
            Some(errors) => rejected.push((file.clone(), errors.into_iter().next().unwrap_or_default())),
        }
    }
    Ok((kept, rejected))
}

/// `--against`: the other binary (A) and this one (B), in turn, on the files both pass.
fn against(args: &BenchArgs, other: &Path, harness: &Harness) -> ExitCode {
    let files = match crate::scenario::files(&args.paths) {
        Ok(files) => files,
        Err(errors) => {
            errors.iter().for_each(|e| err!("error: {e}"));
            return ExitCode::from(EXIT_BAD_INPUT);
        }
    };
    let this = match std::env::current_exe() {
        Ok(this) => this,
        Err(error) => {
            err!("error: cannot find this binary: {error}");
            return ExitCode::from(EXIT_BAD_INPUT);
        }
    };
    let planted = std::env::var_os(PLANTED_SLOWDOWN).is_some();
    let seeds = &args.seeds;
    out!(
        "rig bench --against {}: A = {}, B = this binary ({}){}; seeds {}..{}, --jobs 1, {} round(s) of A B",
        other.display(),
        other.display(),
        harness.name(),
        if planted { ", with the planted slowdown" } else { "" },
        seeds.start,
        seeds.end,
        args.rounds
    );
    // A first, untimed pass of each finds the files both pass: a file one of them fails (or
    // cannot read) does different work in each.
    let mut common: Vec<PathBuf> = Vec::new();
    let mut unread = 0;
    let mut passes = Vec::new();
    for (which, binary, planted) in [("A", other, false), ("B", this.as_path(), planted)] {
        let pass = match run_binary(binary, &files, seeds, planted) {
            Ok(BinaryPass { load_errors: Some(errors), .. }) => {
                // Said, not swallowed: otherwise no file "passes under both" and nothing says why.
                err!("{which} ({}) cannot read the selection:", binary.display());
                errors.iter().take(5).for_each(|e| err!("  {e}"));
                let (kept, rejected) = match readable(binary, &files, errors, seeds) {
                    Ok(found) => found,
                    Err(error) => {
                        err!("error: {error}");
                        return ExitCode::from(EXIT_BAD_INPUT);
                    }
                };
                for (file, error) in &rejected {
                    out!("left out: {} ({which} cannot read it: {error})", file.display());
                }
                unread += rejected.len();
                if kept.is_empty() {
                    Ok(BinaryPass {
                        timed: Timed { cpu_ns: 0, peak_kib: 0, runs: 0 },
                        passed: BTreeMap::new(),
                        load_errors: None,
                    })
                } else {
                    run_binary(binary, &kept, seeds, planted)
                }
            }
            other => other,
        };
        match pass {
            Ok(pass) => passes.push(pass.passed),
            Err(error) => {
                err!("error: {error}");
                return ExitCode::from(EXIT_BAD_INPUT);
            }
        }
    }
    for file in &files {
        let name = file.display().to_string();
        if passes.iter().all(|passed| passed.get(&name) == Some(&true)) {
            common.push(file.clone());
        }
    }
    let unread = if unread > 0 { format!(" ({unread} left out as unreadable by one of them)") } else { String::new() };
    out!("{} of {} files pass under both{unread}", common.len(), files.len());
    if common.is_empty() {
        err!("error: no file passes under both binaries: nothing to compare");
        return ExitCode::from(EXIT_BAD_INPUT);
    }
    let (mut a, mut b): (Vec<Timed>, Vec<Timed>) = (Vec::new(), Vec::new());
    for round in 1..=args.rounds {
        for (which, binary, times, planted) in [("A", other, &mut a, false), ("B", this.as_path(), &mut b, planted)] {
            match run_binary(binary, &common, seeds, planted) {
                Ok(BinaryPass { timed, .. }) => {
                    out!(
                        "  round {round} {which}: {} runs, {:.2} s CPU, {} MiB",
                        timed.runs,
                        timed.cpu_ns as f64 / 1e9,
                        timed.peak_kib / 1024
                    );
                    times.push(timed);
                }
                Err(error) => {
                    err!("error: {error}");
                    return ExitCode::from(EXIT_BAD_INPUT);
                }
            }
        }
    }
    // The middle value; of an even number, the mean of the middle two.
    let median = |times: &[Timed], f: fn(&Timed) -> u64| {
        let mut values: Vec<u64> = times.iter().map(f).collect();
        values.sort_unstable();
        let middle = values.len() / 2;
        if values.len() % 2 == 0 {
            (values[middle - 1] + values[middle]) / 2
        } else {
            values[middle]
        }
    };
    let (a_cpu, b_cpu) = (median(&a, |t| t.cpu_ns), median(&b, |t| t.cpu_ns));
    let runs = a[0].runs;
    if a.iter().chain(&b).any(|t| t.runs != runs) {
        err!("error: the two binaries made different numbers of runs of the same files");
        return ExitCode::from(EXIT_BAD_INPUT);
    }
    let ratios: Vec<f64> = a.iter().zip(&b).map(|(a, b)| b.cpu_ns as f64 / a.cpu_ns.max(1) as f64).collect();
    let (low, high) = ratios.iter().fold((f64::MAX, 0f64), |(l, h), r| (l.min(*r), h.max(*r)));
    let percent = change(a_cpu as f64, b_cpu as f64);
    let (words, slower) = judge(percent, false, args.threshold);
    out!(
        "A: {:.2} s CPU per pass ({:.0} runs/s per core); B: {:.2} s ({:.0} runs/s per core); {runs} runs a pass",
        a_cpu as f64 / 1e9,
        runs as f64 * 1e9 / a_cpu.max(1) as f64,
        b_cpu as f64 / 1e9,
        runs as f64 * 1e9 / b_cpu.max(1) as f64,
    );
    out!(
        "B/A CPU per pass: {:.3} (rounds {low:.3} to {high:.3}), {percent:+.1} %: {words}; peak memory {} MiB vs {} MiB",
        b_cpu as f64 / a_cpu.max(1) as f64,
        median(&a, |t| t.peak_kib) / 1024,
        median(&b, |t| t.peak_kib) / 1024
    );
    if slower {
        ExitCode::from(EXIT_FAILED)
    } else {
        ExitCode::SUCCESS
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn figures(cpu_per_run_us: f64) -> Figures {
        let file = |cpu_per_run_us| FileFigures { runs: 20, cpu_per_run_us };
        Figures {
            harness: "reference".into(),
            seeds: "0..20".into(),
            jobs: 1,
            passes: 3,
            runs: 40,
            cpu_per_run_us,
            runs_per_s_per_core: 1e6 / cpu_per_run_us,
            uncut_runs: 2,
            uncut_share: 0.01,
            peak_memory_mib: 30.0,
            sweep: Some(Exploring {
                what: "sweep w depth 1".into(),
                runs: 50,
                runs_per_s_per_core: 1e6 / cpu_per_run_us,
                uncut_runs: 0,
                uncut_share: 0.0,
            }),
            explore: None,
            files: [("a.toml".to_string(), file(cpu_per_run_us)), ("b.toml".to_string(), file(cpu_per_run_us * 2.0))]
                .into(),
        }
    }

    #[test]
    fn a_planted_fifteen_percent_is_a_regression_and_the_same_figures_no_change() {
        let then = figures(1000.0);
        let same = compare(&then, &then, 10.0).unwrap();
        assert!(!same.slower, "{same:?}");
        assert!(same.lines[0].contains("(+0.0 %): no change"), "{same:?}");
        let slowed = compare(&then, &figures(1150.0), 10.0).unwrap();
        assert!(slowed.slower, "{slowed:?}");
        assert!(slowed.lines[0].contains("(+15.0 %): REGRESSION"), "{slowed:?}");
        assert!(slowed.lines[1].contains("-13.0 %): REGRESSION"), "runs/s fell by as much: {slowed:?}");
        assert!(slowed.verdict.starts_with("verdict: REGRESSION: CPU per run, runs/s per core"), "{slowed:?}");
        let noise = compare(&then, &figures(1040.0), 10.0).unwrap();
        assert!(!noise.slower && noise.lines[0].contains("no change"), "{noise:?}");
        let faster = compare(&then, &figures(800.0), 10.0).unwrap();
        assert!(!faster.slower && faster.lines[0].contains("improvement"), "{faster:?}");
        let some = compare(&then, &figures(1070.0), 10.0).unwrap();
        assert!(!some.slower && some.lines[0].contains("slower, within the threshold"), "{some:?}");
    }

    #[test]
    fn only_the_same_selection_compares() {
        let then = figures(1000.0);
        let mut other = figures(1000.0);
        other.seeds = "0..30".into();
        assert!(compare(&then, &other, 10.0).unwrap_err().contains("seeds 0..20"));
        let mut other = figures(1000.0);
        other.files.get_mut("b.toml").unwrap().runs = 21;
        assert!(compare(&then, &other, 10.0).unwrap_err().contains("1 file(s) differ in their runs (such as b.toml)"));
    }

    #[test]
    fn a_baseline_reads_back_as_written() {
        let then = figures(1234.5);
        let text = serde_json::to_string_pretty(&then).unwrap();
        assert_eq!(serde_json::from_str::<Figures>(&text).unwrap(), then);
    }
}
