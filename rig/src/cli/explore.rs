//! `rig explore`: a random fault mix per seed from the cut space; every failure shrunk and
//! written as a minimal scenario file.

use super::artifacts::write_finding;
use super::baseline::{BaselineArgs, Strict};
use super::live::LiveSweepArgs;
use super::parallel::{for_each_ordered, Jobs};
use super::progress::Progress;
use super::sweep::{known_policy, output_folder, record_finding, reference_note};
use super::{bad_input, load_scenarios, output, parse_seed_range, Harness, Quiet, EXIT_BAD_INPUT, EXIT_FAILED};
use crate::baseline::{self, FindingKey, Search};
use crate::explore::{self, ExploreTally, ExploredFinding, Runs};
use crate::{report, LiveRuns};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct ExploreArgs {
    /// Scenario files or folders whose workloads to explore.
    #[arg(required = true)]
    pub paths: Vec<PathBuf>,
    /// Seeds to explore, `A..B`: each draws its own fault mix.
    #[arg(long, value_parser = parse_seed_range, allow_hyphen_values = true, conflicts_with = "seed")]
    pub seeds: Option<std::ops::Range<u64>>,
    /// Replay one seed's mix.
    #[arg(long, value_parser = super::parse_seed, allow_hyphen_values = true)]
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
    /// Run nothing: list each workload's needs, and whether this harness serves it.
    #[arg(long)]
    pub list: bool,
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

pub(crate) fn command(args: ExploreArgs, harness: &Harness) -> ExitCode {
    let seeds = match (args.seed, &args.seeds) {
        (Some(seed), _) => seed..seed + 1,
        (None, Some(range)) => range.clone(),
        (None, None) if args.list => 0..1,
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
    if args.list {
        return super::sweep::list_needs(made_by, &scenarios, &args.policy, args.keep_cuts);
    }
    let known = match args.baseline.load(made_by.name()) {
        Ok(known) => known,
        Err(code) => return code,
    };
    let mut ledger = baseline::Findings::new(Search::Explore);
    let per_scenario = seeds.end.saturating_sub(seeds.start);
    let mut tally = ExploreTally::default();
    // A workload the harness cannot run is skipped whole, as each of its seeds would be.
    scenarios.retain(|scenario| match made_by.skip(&explore::workload(scenario, args.keep_cuts), &args.policy) {
        Some(skip) => {
            if !args.quiet.failures_only {
                out!("{}", report::skip_line(&scenario.path.display().to_string(), &args.policy, &skip));
            }
            tally.skip(per_scenario);
            false
        }
        None => true,
    });
    for scenario in &scenarios {
        ledger.searched(&scenario.path, &args.policy);
    }
    let jobs =
        output::while_wanted(scenarios.iter().flat_map(|scenario| seeds.clone().map(move |seed| (scenario, seed))));
    let total = (scenarios.len() as u64).saturating_mul(seeds.end.saturating_sub(seeds.start));
    let progress = Progress::new(total);
    let failed = |explored: &Result<explore::Exploration, crate::Skip>| {
        explored.as_ref().is_ok_and(|e| !e.fired.is_empty() || !e.uncut_fired.is_empty())
    };
    // Each seed is explored (and shrunk) on one worker; failing seeds are printed in seed order,
    // each naming the finding it shrank to.
    for_each_ordered(
        jobs,
        args.jobs.workers(total),
        |(scenario, seed)| (scenario, explore::explore(made_by, scenario, &args.policy, seed, args.keep_cuts)),
        |_, (_, explored)| progress.completed(failed(explored), None),
        |_, (scenario, explored)| {
            let number = tally.add(&explored);
            if !failed(&explored) {
                return;
            }
            let Ok(exploration) = explored else { return };
            let fail = |fired: &std::collections::BTreeSet<String>, what: String| {
                if !args.quiet.failures_only {
                    let fired: Vec<&str> = fired.iter().map(String::as_str).collect();
                    let (path, seed) = (scenario.path.display(), exploration.seed);
                    progress.out(&format!("FAIL {path} [{}] seed {seed}: [{}] {what}", args.policy, fired.join(", ")));
                }
            };
            if !exploration.uncut_fired.is_empty() {
                // As a sweep says it: what the mix adds is judged beyond what the workload trips.
                fail(&exploration.uncut_fired, "on the uncut workload itself".to_string());
                for oracle in &exploration.uncut_fired {
                    let key = FindingKey::uncut(&scenario.path, &args.policy, oracle);
                    let again = || explore_again(&scenario.path, exploration.seed, &args, harness, live.as_ref());
                    ledger.record(key, exploration.seed, again, None);
                }
            }
            if exploration.fired.is_empty() {
                return;
            }
            let mix: Vec<String> = exploration.mix.iter().map(|p| p.id()).collect();
            let finding = number.map(|n| format!(" (finding #{n})")).unwrap_or_default();
            fail(&exploration.fired, format!("with {}{finding}", mix.join(" + ")));
        },
    );
    progress.finish();
    for (number, each) in tally.findings.iter().enumerate() {
        let written = args.out.as_ref().map(|folder| write_finding(folder, &each.finding, harness, live.as_ref()));
        let workload = Path::new(&each.finding.workload);
        let again = || explore_again(workload, each.finding.seed, &args, harness, live.as_ref());
        let key = record_finding(&mut ledger, &each.finding, written.as_ref(), &again);
        for &seed in each.seeds.iter().skip(1) {
            ledger.record(key.clone(), seed, String::new, None);
        }
        // With a baseline, each finding says whether it is new; under -q only new ones are printed.
        let label = match &known.judged {
            Some(baseline) if baseline.lists_finding(Search::Explore, &key) => "known ",
            Some(_) => "NEW ",
            None => "",
        };
        if args.quiet.failures_only && label == "known " {
            continue;
        }
        print_finding(number + 1, each, label, written.map(|w| w.line), &args, harness, live.as_ref());
    }
    let judged = match known.findings_end(&ledger, args.strict.strict, &mut |line| out!("{line}")) {
        Ok(judged) => judged,
        Err(code) => return code,
    };
    out!("{}", tally.summary(made_by.name()));
    if let Some(line) = super::interrupted(tally.explored, total) {
        out!("{line}");
    }
    if tally.explored > 0 && judged.is_some() {
        if judged == Some(true) {
            ExitCode::SUCCESS
        } else {
            ExitCode::from(EXIT_FAILED)
        }
    } else if tally.failing > 0 {
        ExitCode::from(EXIT_FAILED)
    } else if tally.explored == 0 {
        bad_input("every workload was skipped: harness lacks what they need, so nothing was explored")
    } else {
        ExitCode::SUCCESS
    }
}

/// The command that explores `workload` at `seed` again: the same mix, bit for bit.
fn explore_again(workload: &Path, seed: u64, args: &ExploreArgs, harness: &Harness, live: Option<&LiveRuns>) -> String {
    let path = std::path::absolute(workload).unwrap_or_else(|_| workload.to_path_buf());
    format!(
        "{} explore {} --policy {} --seed {seed}{}{}",
        harness.program,
        crate::run::shell_word(&path.to_string_lossy()),
        args.policy,
        if args.keep_cuts { " --keep-cuts" } else { "" },
        live.map(|live| live.flags()).unwrap_or_default()
    )
}

/// A finding, once: whether the baseline knows it (`label`), its signature, the seeds that
/// shrank to it, the repro of the first, its cuts, and the line naming the file written for it.
fn print_finding(
    number: usize,
    found: &ExploredFinding,
    label: &str,
    written: Option<String>,
    args: &ExploreArgs,
    harness: &Harness,
    live: Option<&LiveRuns>,
) {
    let ExploredFinding { finding, seeds, runs } = found;
    let seeds = match seeds.len() {
        1 => format!("seed {}", finding.seed),
        n => format!("{n} seeds: {}", report::seed_list(seeds, n as u64)),
    };
    out!("{label}finding #{number} {} on {} [{}], {seeds}", finding.signature(), finding.workload, finding.policy);
    out!("    repro: {}", explore_again(Path::new(&finding.workload), finding.seed, args, harness, live));
    let cuts: Vec<String> = finding.placements.iter().map(|p| p.id()).collect();
    let written = written.map(|line| format!(" -> {line}")).unwrap_or_default();
    out!(
        "    shrunk to {} cut(s) in {runs} runs: {}{}{written}",
        cuts.len(),
        cuts.join(" + "),
        reference_note(finding)
    );
}
