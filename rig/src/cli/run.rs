//! `rig run`: scenario files, each policy, each seed, reported one line (or one JSON object) each.

use super::baseline::BaselineArgs;
use super::parallel::{for_each_ordered, Jobs};
use super::progress::Progress;
use super::{
    bad_input, create_output, load_scenarios, parse_seed_range, run_count, run_jobs, selected_runs, trace_lines,
    trace_sink, Done, Harness, Quiet, Tally, EXIT_BAD_INPUT,
};
use crate::baseline::{Baseline, Failures};
use crate::report;
use crate::run::RunOutcome;
use crate::timeline;
use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

/// A timeline page is for reading: this many runs at most, so nobody draws ten thousand by accident.
const DRAWN_RUNS_MAX: u64 = 16;

#[derive(clap::Args)]
pub struct RunArgs {
    /// Scenario files or folders (searched recursively for .toml files).
    #[arg(required = true)]
    pub paths: Vec<PathBuf>,
    /// Run this one seed.
    #[arg(long, conflicts_with = "seeds", value_parser = super::parse_seed, allow_hyphen_values = true)]
    pub seed: Option<u64>,
    /// Run a range of seeds, `A..B` (B excluded).
    #[arg(long, value_parser = parse_seed_range, allow_hyphen_values = true)]
    pub seeds: Option<std::ops::Range<u64>>,
    /// Run only this policy (by default every policy the scenario declares).
    #[arg(long)]
    pub policy: Option<String>,
    /// One JSON object per line per run instead of the human report.
    #[arg(long)]
    pub json: bool,
    /// Write the full trace of every run as JSON lines to this file (`-`: standard output).
    #[arg(long)]
    pub trace: Option<PathBuf>,
    /// Draw the runs as a timeline: one self-contained HTML page (inline SVG, no network).
    #[arg(long, value_name = "FILE")]
    pub timeline: Option<PathBuf>,
    /// Draw the runs as Mermaid sequence diagrams in a Markdown file (renders in a pull request).
    #[arg(long, value_name = "FILE")]
    pub mermaid: Option<PathBuf>,
    #[command(flatten)]
    pub quiet: Quiet,
    #[command(flatten)]
    pub jobs: Jobs,
    #[command(flatten)]
    pub baseline: BaselineArgs,
}

/// A way of drawing runs: the HTML timeline or the Mermaid diagram.
type Drawing = fn(&[&RunOutcome]) -> String;

/// One finished job, rendered on the worker that ran it.
struct Rendered {
    done: Done,
    /// What it prints, if anything: a skipped pair says so once, at its first seed; with
    /// `--failures-only`, only a failed run prints.
    report: Option<String>,
    trace_lines: String,
}

impl Rendered {
    fn failed(&self) -> bool {
        matches!(&self.done, Done::Ran(outcome) if !outcome.passed)
    }
}

/// How a run is printed: its report (human or JSON, or none when only failures are wanted) and
/// its trace lines.
#[derive(Clone, Copy)]
struct Rendering<'a> {
    first_seed: u64,
    json: bool,
    with_trace: bool,
    failures_only: bool,
    /// What failures are known: under `--failures-only` a known failure is not printed, and its
    /// JSON says whether it is known.
    baseline: Option<&'a Baseline>,
}

fn render(done: Done, how: Rendering) -> Rendered {
    let Rendering { first_seed, json, with_trace, failures_only, baseline } = how;
    let outcome = match &done {
        Done::Skipped(_) if failures_only => return Rendered { done, report: None, trace_lines: String::new() },
        Done::Skipped(skipped) => {
            let report = if json {
                Some(report::skip_json(skipped).to_string())
            } else {
                (skipped.seed == first_seed)
                    .then(|| report::skip_line(&skipped.scenario, &skipped.policy, &skipped.skip))
            };
            return Rendered { done, report, trace_lines: String::new() };
        }
        Done::Ran(outcome) => outcome,
    };
    let unlisted = baseline.filter(|_| !outcome.passed).map(|baseline| Failures::unlisted(outcome, baseline));
    let known = unlisted.as_ref().is_some_and(Vec::is_empty);
    let report = if failures_only && (outcome.passed || known) {
        None
    } else if json {
        let mut line = report::json_line(outcome);
        if let Some(unlisted) = &unlisted {
            let new: Vec<String> = unlisted.iter().map(ToString::to_string).collect();
            line["baseline"] = if known { "known".into() } else { serde_json::json!({ "new": new }) };
        }
        Some(line.to_string())
    } else {
        Some(report::human(outcome))
    };
    let trace_lines = if with_trace { trace_lines(outcome) } else { String::new() };
    Rendered { done, report, trace_lines }
}

pub(crate) fn command(args: RunArgs, harness: &Harness) -> ExitCode {
    // Load everything first: a bad file is reported before any run starts.
    let Some(scenarios) = load_scenarios(&args.paths) else { return ExitCode::from(EXIT_BAD_INPUT) };
    crate::run::keep_workload_digests(&scenarios);
    let selected = match selected_runs(&scenarios, args.policy.as_deref(), harness) {
        Ok(selected) => selected,
        Err(message) => return bad_input(&message),
    };
    let seeds = match (args.seed, args.seeds.clone()) {
        (Some(seed), _) => seed..seed.saturating_add(1),
        (None, Some(range)) => range,
        (None, None) => 0..1,
    };
    let total = run_count(&selected, &seeds);
    let drawing = args.timeline.is_some() || args.mermaid.is_some();
    if drawing && total > DRAWN_RUNS_MAX {
        return bad_input(&format!(
            "--timeline and --mermaid draw at most {DRAWN_RUNS_MAX} runs, and this selects {total}: choose one with --policy and --seed"
        ));
    }
    let known = match args.baseline.load(harness.name()) {
        Ok(known) => known,
        Err(code) => return code,
    };
    let mut ledger = Failures::new(known.judged.iter().chain(known.write.iter()));
    let mut trace_out = match args.trace.as_deref().map(trace_sink).transpose() {
        Ok(sink) => sink,
        Err(code) => return code,
    };
    let mut pictures = Vec::new();
    let drawings: [(&Option<PathBuf>, &str, Drawing); 2] =
        [(&args.timeline, "timeline", timeline::html), (&args.mermaid, "Mermaid diagram", timeline::mermaid)];
    for (path, what, draw) in drawings {
        if let Some(path) = path {
            match create_output(path, what) {
                Ok(file) => pictures.push((path, file, draw)),
                Err(code) => return code,
            }
        }
    }

    let how = Rendering {
        first_seed: seeds.start,
        json: args.json,
        with_trace: trace_out.is_some(),
        failures_only: args.quiet.failures_only,
        baseline: known.judged.as_ref(),
    };
    let progress = Progress::new(total);
    let mut tally = Tally::default();
    let mut drawn: Vec<RunOutcome> = Vec::new();
    for_each_ordered(
        run_jobs(&selected, &seeds),
        args.jobs.workers(total),
        |job| render(job.run(harness), how),
        |_, rendered| progress.completed(rendered.failed(), None),
        |_, rendered| {
            if let Some(report) = &rendered.report {
                progress.out(report);
            }
            if let Some(sink) = trace_out.as_mut() {
                sink.write(rendered.trace_lines.as_bytes());
            }
            tally.count(&rendered.done);
            if let (true, Done::Ran(outcome)) = (known.any(), &rendered.done) {
                ledger.record(outcome);
            }
            if let (true, Done::Ran(outcome)) = (drawing, rendered.done) {
                drawn.push(outcome);
            }
        },
    );
    progress.finish();
    if let Err(code) = trace_out.map_or(Ok(()), |sink| sink.finish()) {
        return code;
    }
    let drawn: Vec<&RunOutcome> = drawn.iter().collect();
    for (path, mut file, draw) in pictures {
        if let Err(error) = file.write_all(draw(&drawn).as_bytes()) {
            return bad_input(&format!("cannot write {}: {error}", path.display()));
        }
        err!("wrote {}", path.display());
    }
    let made = tally.passed + tally.failed + tally.skipped;
    // With --json, standard output holds only JSON objects: the baseline's lines go to stderr.
    let json = args.json;
    let judged = match known.failures_end(&ledger, &mut |line| if json { err!("{line}") } else { out!("{line}") }) {
        Ok(judged) => judged,
        Err(code) => return code,
    };
    if args.json {
        if let Some(line) = super::interrupted_json(made, total) {
            out!("{line}");
        }
    } else {
        out!("{}", tally.summary(harness));
        if let Some(line) = super::interrupted(made, total) {
            out!("{line}");
        }
    }
    tally.judged_exit_code(judged)
}
