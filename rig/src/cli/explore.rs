//! `rig explore`: a random fault mix per seed from the cut space; every failure shrunk and
//! written as a minimal scenario file.

use super::artifacts::write_finding;
use super::live::{workload_skip, LiveSweepArgs};
use super::parallel::{for_each_ordered, Jobs};
use super::progress::Progress;
use super::sweep::{known_policy, output_folder, reference_note};
use super::{bad_input, load_scenarios, output, parse_seed_range, Harness, EXIT_BAD_INPUT, EXIT_FAILED};
use crate::explore::{self, Runs};
use crate::report;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct ExploreArgs {
    /// Scenario files or folders whose workloads to explore.
    #[arg(required = true)]
    pub paths: Vec<PathBuf>,
    /// Seeds to explore, `A..B`: each draws its own fault mix.
    #[arg(long, value_parser = parse_seed_range, conflicts_with = "seed")]
    pub seeds: Option<std::ops::Range<u64>>,
    /// Replay one seed's mix.
    #[arg(long)]
    pub seed: Option<u64>,
    /// The harness policy to explore.
    #[arg(long, default_value = "reference")]
    pub policy: String,
    /// Write each shrunk failure here as a scenario file, with the timeline, trace and repro of
    /// its replay beside it.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Keep the scenario's own scripted cuts in the workload (removed by default).
    #[arg(long)]
    pub keep_cuts: bool,
    #[command(flatten)]
    pub jobs: Jobs,
    #[command(flatten)]
    pub live: LiveSweepArgs,
}

pub(crate) fn command(args: ExploreArgs, harness: &Harness) -> ExitCode {
    let seeds = match (args.seed, &args.seeds) {
        (Some(seed), _) => seed..seed + 1,
        (None, Some(range)) => range.clone(),
        (None, None) => return bad_input("give `--seeds A..B` or `--seed N`"),
    };
    if let Err(code) = known_policy(harness, &args.policy).and_then(|()| output_folder(args.out.as_deref())) {
        return code;
    }
    let Some(mut scenarios) = load_scenarios(&args.paths) else { return ExitCode::from(EXIT_BAD_INPUT) };
    let live = match args.live.runs(harness, args.out.as_deref()) {
        Ok(live) => live,
        Err(code) => return code,
    };
    let made_by: &dyn Runs = match &live {
        Some(live) => live,
        None => &harness.factory,
    };
    let per_scenario = seeds.end.saturating_sub(seeds.start);
    let mut skipped = 0u64;
    let skip = |scenario: &crate::Scenario| match &live {
        Some(live) => workload_skip(live, scenario, &args.policy, args.keep_cuts),
        None => harness.skip(scenario, &args.policy),
    };
    scenarios.retain(|scenario| match skip(scenario) {
        Some(skip) => {
            out!("{}", report::skip_line(&scenario.path.display().to_string(), &args.policy, &skip));
            skipped = skipped.saturating_add(per_scenario);
            false
        }
        None => true,
    });
    let (mut explored, mut failing) = (0u64, 0u64);
    let jobs =
        output::while_wanted(scenarios.iter().flat_map(|scenario| seeds.clone().map(move |seed| (scenario, seed))));
    let total = (scenarios.len() as u64).saturating_mul(seeds.end.saturating_sub(seeds.start));
    let progress = Progress::new(total);
    // Each seed is explored (and shrunk) on one worker; findings are printed in seed order.
    for_each_ordered(
        jobs,
        args.jobs.workers(total),
        |(scenario, seed)| (scenario, explore::explore(made_by, scenario, &args.policy, seed, args.keep_cuts)),
        |_, _| progress.completed(None),
        |_, (scenario, exploration)| {
            explored += 1;
            if exploration.fired.is_empty() {
                return;
            }
            failing += 1;
            let seed = exploration.seed;
            let mix: Vec<String> = exploration.mix.iter().map(|p| p.id()).collect();
            let fired: Vec<&str> = exploration.fired.iter().map(String::as_str).collect();
            progress.out(&format!(
                "FAIL {} [{}] seed {seed}: [{}] with {}",
                scenario.path.display(),
                args.policy,
                fired.join(", "),
                mix.join(" + ")
            ));
            let path = std::path::absolute(&scenario.path).unwrap_or_else(|_| scenario.path.clone());
            progress.out(&format!(
                "    repro: {} explore {} --policy {} --seed {seed}{}{}",
                harness.program,
                crate::run::shell_word(&path.to_string_lossy()),
                args.policy,
                if args.keep_cuts { " --keep-cuts" } else { "" },
                live.as_ref().map(|live| live.flags()).unwrap_or_default()
            ));
            if let Some(shrunk) = &exploration.shrunk {
                let cuts: Vec<String> = shrunk.placements.iter().map(|p| p.id()).collect();
                let written = args
                    .out
                    .as_ref()
                    .map(|folder| format!(" -> {}", write_finding(folder, shrunk, harness, live.as_ref())))
                    .unwrap_or_default();
                progress.out(&format!(
                    "    shrunk to {} cut(s) in {} runs: {}{}{written}",
                    cuts.len(),
                    exploration.runs,
                    cuts.join(" + "),
                    reference_note(shrunk)
                ));
            }
        },
    );
    progress.finish();
    out!(
        "explored {explored} seed(s): {} clean, {failing} failing, {skipped} skipped (harness {})",
        explored - failing,
        made_by.name()
    );
    if failing > 0 {
        ExitCode::from(EXIT_FAILED)
    } else if explored == 0 {
        bad_input("every workload was skipped: harness lacks what they need, so nothing was explored")
    } else {
        ExitCode::SUCCESS
    }
}
