//! `rig explore`: a random fault mix per seed from the cut space; every failure shrunk and
//! written as a minimal scenario file.

use super::artifacts::write_finding;
use super::parallel::{for_each_ordered, Jobs};
use super::progress::Progress;
use super::sweep::{known_policy, output_folder, reference_note};
use super::{bad_input, load_scenarios, output, parse_seed_range, EXIT_BAD_INPUT, EXIT_FAILED};
use rig::explore;
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
}

pub fn command(args: ExploreArgs) -> ExitCode {
    let seeds = match (args.seed, &args.seeds) {
        (Some(seed), _) => seed..seed + 1,
        (None, Some(range)) => range.clone(),
        (None, None) => return bad_input("give `--seeds A..B` or `--seed N`"),
    };
    if let Err(code) = known_policy(&args.policy).and_then(|()| output_folder(args.out.as_deref())) {
        return code;
    }
    let Some(scenarios) = load_scenarios(&args.paths) else { return ExitCode::from(EXIT_BAD_INPUT) };
    let harness = rig::reference();
    let (mut explored, mut failing) = (0u64, 0u64);
    let jobs =
        output::while_wanted(scenarios.iter().flat_map(|scenario| seeds.clone().map(move |seed| (scenario, seed))));
    let total = (scenarios.len() as u64).saturating_mul(seeds.end.saturating_sub(seeds.start));
    let progress = Progress::new(total);
    // Each seed is explored (and shrunk) on one worker; findings are printed in seed order.
    for_each_ordered(
        jobs,
        args.jobs.workers(total),
        |(scenario, seed)| (scenario, explore::explore(&harness, scenario, &args.policy, seed, args.keep_cuts)),
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
            progress.out(&format!(
                "    repro: rig explore {} --policy {} --seed {seed}",
                scenario.path.display(),
                args.policy
            ));
            if let Some(shrunk) = &exploration.shrunk {
                let cuts: Vec<String> = shrunk.placements.iter().map(|p| p.id()).collect();
                let written = args
                    .out
                    .as_ref()
                    .map(|folder| format!(" -> {}", write_finding(folder, shrunk)))
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
    out!("explored {explored} seed(s): {} clean, {failing} failing", explored - failing);
    if failing > 0 {
        ExitCode::from(EXIT_FAILED)
    } else {
        ExitCode::SUCCESS
    }
}
