//! `rig run`: scenario files, each policy, each seed, reported one line (or one JSON object) each.

use super::{bad_input, load_scenarios, parse_seed_range, selected_runs, EXIT_BAD_INPUT, EXIT_FAILED};
use rig::{report, run};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct RunArgs {
    /// Scenario files or folders (searched recursively for .toml files).
    #[arg(required = true)]
    pub paths: Vec<PathBuf>,
    /// Run this one seed.
    #[arg(long, conflicts_with = "seeds")]
    pub seed: Option<u64>,
    /// Run a range of seeds, `A..B` (B excluded).
    #[arg(long, value_parser = parse_seed_range)]
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
}

/// Where `--trace` goes: a file, or standard output for `-`.
fn trace_sink(path: &Path) -> std::io::Result<Box<dyn std::io::Write>> {
    if path == Path::new("-") {
        Ok(Box::new(std::io::stdout()))
    } else {
        Ok(Box::new(std::io::BufWriter::new(std::fs::File::create(path)?)))
    }
}

pub fn command(args: RunArgs) -> ExitCode {
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
