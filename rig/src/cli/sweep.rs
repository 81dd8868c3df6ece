//! `rig sweep`: every cut at every place one uncut run offers, then bounded pairs; each finding
//! written as a minimal scenario file; what was covered counted, and for a clean sweep stated.

use super::artifacts::write_finding;
use super::baseline::{BaselineArgs, Strict};
use super::live::LiveSweepArgs;
use super::parallel::{map_ordered, Jobs};
use super::progress::Progress;
use super::{bad_input, load_scenarios, output, Harness, Quiet, EXIT_BAD_INPUT, EXIT_FAILED};
use crate::baseline::{FindingKey, Findings, Search};
use crate::explore::{self, Runs, SpaceOptions, SweepOptions, SweepTally, Verdict};
use crate::report;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct SweepArgs {
    /// Scenario files (or folders) whose workloads to sweep.
    #[arg(required = true)]
    pub paths: Vec<PathBuf>,
    /// The harness policy to sweep.
    #[arg(long, default_value = "reference")]
    pub policy: String,
    /// 1: every cut alone; 2: then pairs of cuts, most promising first.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(1..=2))]
    pub depth: u8,
    /// The most runs per workload, at least 1 (pairs are the first to go).
    #[arg(long, value_parser = budget)]
    pub budget: Option<usize>,
    /// Write each finding here as a scenario file, with the timeline, trace and repro of its
    /// replay beside it.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// The seed of every run.
    #[arg(long, default_value_t = 0, value_parser = super::parse_seed, allow_hyphen_values = true)]
    pub seed: u64,
    /// Keep the scenario's own scripted cuts in the workload (removed by default).
    #[arg(long)]
    pub keep_cuts: bool,
    /// The most like sites tried per class of site (the first, second, ... call of a kind).
    #[arg(long, default_value_t = SpaceOptions::default().nth_max)]
    pub nth_max: u64,
    /// List every run, clean and unreached ones too.
    #[arg(long)]
    pub all: bool,
    /// Run nothing: list each workload's needs, and whether this harness serves it.
    #[arg(long)]
    pub list: bool,
    /// One JSON object per workload (its runs, findings, coverage and certificate) and one for
    /// the summary, instead of the lines a person reads.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub quiet: Quiet,
    #[command(flatten)]
    pub jobs: Jobs,
    #[command(flatten)]
    pub live: LiveSweepArgs,
    #[command(flatten)]
    pub baseline: BaselineArgs,
    #[command(flatten)]
    pub strict: Strict,
}

/// A budget of no runs would sweep nothing and report a clean workload.
fn budget(text: &str) -> Result<usize, String> {
    match text.parse::<usize>() {
        Ok(0) => Err("a budget of 0 runs would sweep nothing; expected at least 1".into()),
        Ok(runs) => Ok(runs),
        Err(_) => Err(format!("`{text}` is not a number of runs")),
    }
}

/// The policy named on the command line, if the harness answers to it.
pub(crate) fn known_policy(harness: &Harness, name: &str) -> Result<(), ExitCode> {
    harness.known_policy(name).map_err(|why| bad_input(&why))
}

/// The folder findings go to, made if need be; checked before any run.
pub(crate) fn output_folder(out: Option<&Path>) -> Result<(), ExitCode> {
    match out {
        Some(folder) => std::fs::create_dir_all(folder)
            .map_err(|e| bad_input(&format!("cannot write findings to {}: {e}", folder.display()))),
        None => Ok(()),
    }
}

/// How the reference harness fares on a finding made under another policy.
pub(crate) fn reference_note(finding: &explore::Finding) -> String {
    match &finding.reference_fired {
        None => String::new(),
        Some(fired) if fired.is_empty() => " (reference: clean)".into(),
        Some(fired) => format!(" (reference trips it too: {})", fired.iter().cloned().collect::<Vec<_>>().join(", ")),
    }
}

pub(crate) fn command(args: SweepArgs, harness: &Harness) -> ExitCode {
    if let Err(code) = known_policy(harness, &args.policy).and_then(|()| output_folder(args.out.as_deref())) {
        return code;
    }
    let Some(scenarios) = load_scenarios(&args.paths) else { return ExitCode::from(EXIT_BAD_INPUT) };
    let live = match args.live.runs(harness, args.out.as_deref()) {
        Ok(live) => live,
        Err(code) => return code,
    };
    let made_by: &dyn Runs = match &live {
        Some(live) => live,
        None => &harness.factory,
    };
    if args.list {
        return list_needs(made_by, &scenarios, &args.policy, args.keep_cuts);
    }
    let known = match args.baseline.load(made_by.name()) {
        Ok(known) => known,
        Err(code) => return code,
    };
    let mut ledger = Findings::new(Search::Sweep);
    // With a baseline, each finding says whether it is new; under -q only new ones are printed.
    let label = |key: &FindingKey| match &known.judged {
        Some(baseline) if baseline.lists_finding(Search::Sweep, key) => "known ",
        Some(_) => "NEW ",
        None => "",
    };
    let quiet_known = |key: &FindingKey| args.quiet.failures_only && label(key) == "known ";
    let options = SweepOptions {
        policy: args.policy.clone(),
        depth: args.depth,
        budget: args.budget,
        keep_cuts: args.keep_cuts,
        seed: args.seed,
        space: SpaceOptions { nth_max: args.nth_max },
    };
    let mut anything = false;
    let mut tally = SweepTally::default();
    for scenario in &scenarios {
        if output::lost() || crate::interrupt::requested() {
            break;
        }
        // Wall time, for the summary line only: the uncut run and the sweep's, as they took.
        let started = std::time::Instant::now();
        let mut plan = match explore::plan(made_by, scenario, &options) {
            Ok(plan) => plan,
            Err(skip) => {
                let path = scenario.path.display().to_string();
                if args.json {
                    out!(
                        "{}",
                        serde_json::json!({ "workload": path, "policy": args.policy, "skipped": skip.to_string() })
                    );
                } else if !args.quiet.failures_only {
                    out!("{}", report::skip_line(&path, &args.policy, &skip));
                }
                tally.add(&Err(skip));
                continue;
            }
        };
        // The single cuts, then (at depth 2) the pairs they lead to.
        let mut runs = run_jobs(made_by, &plan, 0, &args);
        explore::plan_pairs(&mut plan, &runs);
        if plan.jobs.len() > runs.len() && !output::lost() {
            let pairs = run_jobs(made_by, &plan, runs.len(), &args);
            runs.extend(pairs);
        }
        let elapsed = started.elapsed();
        let baseline_us = plan.baseline.wall_us;
        let report = explore::report(made_by, plan, runs);
        tally.count(&report);
        ledger.searched(&scenario.path, &args.policy);
        let uncut_keys: Vec<FindingKey> = report
            .baseline_fired
            .iter()
            .map(|oracle| FindingKey::uncut(&scenario.path, &args.policy, oracle))
            .collect();
        let sweep_again = || {
            let path = std::path::absolute(&scenario.path).unwrap_or_else(|_| scenario.path.clone());
            format!(
                "{} sweep {} --policy {} --seed {} --depth {}{}",
                harness.program,
                crate::run::shell_word(&path.to_string_lossy()),
                args.policy,
                args.seed,
                args.depth,
                if args.keep_cuts { " --keep-cuts" } else { "" }
            )
        };
        for key in &uncut_keys {
            ledger.record(key.clone(), args.seed, sweep_again, None);
        }
        if args.json {
            anything |= report.found_anything();
            let written: Vec<Option<String>> = report
                .findings
                .iter()
                .map(|finding| {
                    let written =
                        args.out.as_ref().map(|folder| write_finding(folder, finding, harness, live.as_ref()));
                    record_finding(&mut ledger, finding, written.as_ref(), &sweep_again);
                    written.and_then(|w| w.file).map(|file| file.display().to_string())
                })
                .collect();
            out!("{}", sweep_json(scenario, &args, &report, &written));
            continue;
        }
        let finding_keys: Vec<FindingKey> = report.findings.iter().map(FindingKey::of).collect();
        let news = uncut_keys.iter().chain(&finding_keys).any(|key| !quiet_known(key));
        if args.quiet.failures_only && (!report.found_anything() || !news) {
            // Nothing to print; a finding is still written where asked.
            for finding in &report.findings {
                let written = args.out.as_ref().map(|folder| write_finding(folder, finding, harness, live.as_ref()));
                record_finding(&mut ledger, finding, written.as_ref(), &sweep_again);
            }
            continue;
        }
        out!("sweep {} [{}] depth {} seed {}", scenario.path.display(), args.policy, args.depth, args.seed);
        for failure in report::bounds::failures(&report.baseline_failures) {
            out!("  note: the uncut workload: {}", failure.lines().next().unwrap_or_default());
        }
        if !report.baseline_fired.is_empty() {
            anything = true;
            for (oracle, key) in report.baseline_fired.iter().zip(&uncut_keys) {
                if !quiet_known(key) {
                    out!("  {}FIRED   [{oracle}] on the uncut workload itself", label(key));
                }
            }
        }
        let (mut clean, mut unreached, mut fired_runs) = (0, 0, 0);
        for run in &report.runs {
            let ids: Vec<String> = run.placements.iter().map(|p| p.id()).collect();
            let (verdict, oracles) = match &run.verdict {
                Verdict::Clean => {
                    clean += 1;
                    ("clean", String::new())
                }
                Verdict::Unreached => {
                    unreached += 1;
                    ("unreached", String::new())
                }
                Verdict::Fired(oracles) => {
                    fired_runs += 1;
                    ("FIRED", oracles.iter().cloned().collect::<Vec<_>>().join(", "))
                }
            };
            // Under --failures-only the findings say it, one per signature.
            if args.all || (matches!(run.verdict, Verdict::Fired(_)) && !args.quiet.failures_only) {
                out!("  {verdict:<9} {:<24} {}", oracles, ids.join(" + "));
            }
        }
        out!(
            "  {} runs in {:.2} s of wall time: {clean} clean, {fired_runs} fired, {unreached} unreached{}; {} distinct findings",
            report.runs.len(),
            elapsed.as_secs_f64(),
            if report.skipped > 0 { format!(", {} over the budget", report.skipped) } else { String::new() },
            report.findings.len()
        );
        if live.is_some() {
            out!("  {}", live_timings(baseline_us, &report.runs));
        }
        for finding in &report.findings {
            anything = true;
            let ids: Vec<String> = finding.placements.iter().map(|p| p.id()).collect();
            let written = args.out.as_ref().map(|folder| write_finding(folder, finding, harness, live.as_ref()));
            let key = record_finding(&mut ledger, finding, written.as_ref(), &sweep_again);
            if quiet_known(&key) {
                continue;
            }
            let written = written.map(|w| format!(" -> {}", w.line)).unwrap_or_default();
            let runs = match finding.count() {
                1 => String::new(),
                n => format!(" ({n} runs came to it)"),
            };
            out!(
                "  {}finding `{}`: {}{runs}{}{written}",
                label(&key),
                finding.oracle,
                ids.join(" + "),
                reference_note(finding)
            );
        }
        out!("  coverage: {}", report.coverage.summary());
        if report.certificate.clean() {
            out!("  certificate: {}", report.certificate.statement());
        }
    }
    let judged = match known.findings_end(&ledger, args.strict.strict, &mut |line| out!("{line}")) {
        Ok(judged) => judged,
        Err(code) => return code,
    };
    if args.json {
        out!(
            "{}",
            serde_json::json!({
                "summary": tally.summary(made_by.name()),
                "swept": tally.swept,
                "with_findings": tally.with_findings,
                "distinct_findings": tally.distinct,
                "skipped": tally.skipped,
                "harness": made_by.name(),
            })
        );
    } else {
        out!("{}", tally.summary(made_by.name()));
    }
    if let Some(signal) = crate::interrupt::received() {
        out!(
            "interrupted by {}: the last workload swept in part, {} of {} not swept",
            signal.name(),
            (scenarios.len() as u64).saturating_sub(tally.swept + tally.skipped),
            scenarios.len()
        );
    }
    if tally.swept > 0 && judged.is_some() {
        if judged == Some(true) {
            ExitCode::SUCCESS
        } else {
            ExitCode::from(EXIT_FAILED)
        }
    } else if anything {
        ExitCode::from(EXIT_FAILED)
    } else if tally.swept == 0 {
        bad_input("every workload was skipped: harness lacks what they need, so nothing was swept")
    } else {
        ExitCode::SUCCESS
    }
}

/// `--list`: each workload's needs and whether `made_by` serves it, then how many it serves.
pub(crate) fn list_needs(made_by: &dyn Runs, scenarios: &[crate::Scenario], policy: &str, keep_cuts: bool) -> ExitCode {
    let mut served = 0;
    for scenario in scenarios {
        let (line, serves) = explore::needs_line(made_by, scenario, policy, keep_cuts);
        served += usize::from(serves);
        out!("{line}");
    }
    out!(
        "{} workload(s): harness `{}` serves {served}, skips {}",
        scenarios.len(),
        made_by.name(),
        scenarios.len() - served
    );
    ExitCode::SUCCESS
}

/// Records a sweep's (or an exploration's) finding, with the file written for it and the command
/// that replays that (else `search_again`); its key.
pub(crate) fn record_finding(
    ledger: &mut Findings,
    finding: &explore::Finding,
    written: Option<&super::artifacts::WrittenFinding>,
    search_again: &dyn Fn() -> String,
) -> FindingKey {
    let key = FindingKey::of(finding);
    let file = written.and_then(|w| w.file.clone());
    let replay = written.and_then(|w| w.replay.clone());
    ledger.record(key.clone(), finding.seed, || replay.unwrap_or_else(search_again), file);
    key
}

/// Runs the plan's jobs from `from` on, on every core, handed back in plan order.
fn run_jobs(made_by: &dyn Runs, plan: &explore::SweepPlan, from: usize, args: &SweepArgs) -> Vec<explore::SweepRun> {
    let jobs = &plan.jobs[from..];
    let progress = Progress::new(jobs.len() as u64);
    let runs = map_ordered(
        output::while_wanted(jobs.iter()),
        args.jobs.workers(jobs.len() as u64),
        |job| explore::run_job(made_by, plan, job),
        |_, run| progress.completed(matches!(run.verdict, explore::Verdict::Fired(_)), None),
    );
    progress.finish();
    runs
}

/// A workload's sweep as one JSON object: what was run, what fired, each finding (with the file
/// it was written to), the coverage and the certificate.
fn sweep_json(
    scenario: &crate::Scenario,
    args: &SweepArgs,
    report: &explore::SweepReport,
    written: &[Option<String>],
) -> serde_json::Value {
    let count = |verdict: fn(&Verdict) -> bool| report.runs.iter().filter(|run| verdict(&run.verdict)).count();
    let findings: Vec<serde_json::Value> = report
        .findings
        .iter()
        .zip(written)
        .map(|(finding, file)| {
            serde_json::json!({
                "oracle": finding.oracle,
                "cuts": finding.placements.iter().map(|p| p.id()).collect::<Vec<_>>(),
                "signature": finding.signature().to_string(),
                "runs": finding.count(),
                "reference_fired": finding.reference_fired,
                "file": file,
            })
        })
        .collect();
    serde_json::json!({
        "workload": scenario.path.display().to_string(),
        "policy": args.policy,
        "depth": args.depth,
        "seed": args.seed,
        "runs": report.runs.len(),
        "clean": count(|v| *v == Verdict::Clean),
        "fired": count(|v| matches!(v, Verdict::Fired(_))),
        "unreached": count(|v| *v == Verdict::Unreached),
        "over_budget": report.skipped,
        "uncut_fired": report.baseline_fired,
        "findings": findings,
        "coverage": report.coverage.json(),
        "certificate": report.certificate.json(),
    })
}

/// How long the live runs took, each in real time: a live sweep's cost is its slowest runs.
fn live_timings(baseline_us: u64, runs: &[explore::SweepRun]) -> String {
    let seconds = |us: u64| us as f64 / 1e6;
    let mut walls: Vec<u64> = runs.iter().map(|r| r.wall_us).collect();
    walls.sort_unstable();
    let mean = walls.iter().sum::<u64>().checked_div(walls.len() as u64).unwrap_or(0);
    format!(
        "live: the uncut run {:.2} s; the cut runs {:.2} s on average, {:.2} s to {:.2} s (wall time each)",
        seconds(baseline_us),
        seconds(mean),
        seconds(walls.first().copied().unwrap_or(0)),
        seconds(walls.last().copied().unwrap_or(0))
    )
}
