//! `rig explore`: a random fault mix per seed from the cut space (the swarm, the default), or
//! mixes guided by the abstract states earlier runs reached (`--mode guided`); every failure
//! shrunk and written as a minimal scenario file; the abstract states each workload's runs
//! reached counted.

use super::artifacts::write_finding;
use super::baseline::{BaselineArgs, Strict};
use super::live::LiveSweepArgs;
use super::parallel::{for_each_ordered, Jobs};
use super::progress::Progress;
use super::sweep::{known_policy, output_folder, record_finding, reference_note};
use super::{bad_input, load_scenarios, output, parse_seed_range, Harness, Quiet, EXIT_BAD_INPUT, EXIT_FAILED};
use crate::baseline::{self, FindingKey, Search};
use crate::explore::{self, Campaign, Coverage, ExploreTally, ExploredFinding, Runs, Unit};
use crate::{report, LiveRuns};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct ExploreArgs {
    /// Scenario files or folders whose workloads to explore.
    #[arg(required = true)]
    pub paths: Vec<PathBuf>,
    /// The runs to make, `A..B`: as a swarm, seed N draws its own mix; guided, run N changes a
    /// mix the runs before it found (every run on simulation seed A).
    #[arg(long, value_parser = parse_seed_range, allow_hyphen_values = true, conflicts_with = "seed")]
    pub seeds: Option<std::ops::Range<u64>>,
    /// Replay one seed's mix (a swarm's).
    #[arg(long, value_parser = super::parse_seed, allow_hyphen_values = true)]
    pub seed: Option<u64>,
    /// `swarm`: every seed a fresh random mix, with no memory; `guided`: the uncut run's most
    /// promising cuts first, a second fault after each unknown outcome, then the mixes that
    /// reached new abstract states, changed (a quarter of the runs fresh mixes throughout). The
    /// guided explorer finds the benchmark's bugs in a quarter of the swarm's runs (README); the
    /// swarm stays the default, its seeds each a mix of their own (rig/docs/explore.md).
    #[arg(long, value_enum, default_value_t = Mode::Swarm)]
    pub mode: Mode,
    /// One JSON object per workload (its findings and coverage) and one for the summary,
    /// instead of the lines a person reads.
    #[arg(long)]
    pub json: bool,
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

/// How an exploration chooses its mixes.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// A fresh random mix per seed, with no memory.
    Swarm,
    /// The most promising single cuts first, then the mixes that reached new abstract states,
    /// changed.
    Guided,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::Guided => "guided",
            Mode::Swarm => "swarm",
        }
    }
}

pub(crate) fn command(args: ExploreArgs, harness: &Harness) -> ExitCode {
    let seeds = match (args.seed, &args.seeds, args.mode) {
        (Some(_), _, Mode::Guided) if !args.list => {
            return bad_input(
                "a guided exploration's run depends on the runs before it: give `--seeds A..B` (its first runs \
                 are those of any longer range from A); `--seed N` replays a swarm's seed",
            )
        }
        (Some(seed), _, _) => seed..seed + 1,
        (None, Some(range), _) => range.clone(),
        (None, None, _) if args.list => 0..1,
        (None, None, _) => return bad_input("give `--seeds A..B` or `--seed N`"),
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
    let total = (scenarios.len() as u64).saturating_mul(seeds.end.saturating_sub(seeds.start));
    let progress = Progress::new(total);
    let failed = |explored: &Result<explore::Exploration, crate::Skip>| {
        explored.as_ref().is_ok_and(|e| !e.fired.is_empty() || !e.uncut_fired.is_empty())
    };
    if args.mode == Mode::Guided {
        tally.unit = Unit::Run;
    }
    let unit = tally.unit.name();
    // What a guided campaign reached, per workload (a swarm's seeds add theirs to the tally).
    let mut guided_coverage: Vec<(String, Coverage)> = Vec::new();
    // Each seed (or run) in order: counted, its FAIL lines printed, its uncut run's violations
    // recorded.
    let mut take = |scenario: &crate::Scenario, explored: Result<explore::Exploration, crate::Skip>| {
        let number = tally.add(&explored);
        if let Ok(exploration) = &explored {
            if args.mode == Mode::Swarm {
                let path = scenario.path.display().to_string();
                tally.cover(&path, &[&exploration.uncut_trajectory, &exploration.trajectory]);
            }
        }
        if !failed(&explored) {
            return;
        }
        let Ok(exploration) = explored else { return };
        let fail = |fired: &std::collections::BTreeSet<String>, what: String| {
            if !args.quiet.failures_only && !args.json {
                let fired: Vec<&str> = fired.iter().map(String::as_str).collect();
                let (path, seed) = (scenario.path.display(), exploration.seed);
                progress.out(&format!("FAIL {path} [{}] {unit} {seed}: [{}] {what}", args.policy, fired.join(", ")));
            }
        };
        if !exploration.uncut_fired.is_empty() {
            // As a sweep says it: what the mix adds is judged beyond what the workload trips.
            fail(&exploration.uncut_fired, "on the uncut workload itself".to_string());
            for oracle in &exploration.uncut_fired {
                let key = FindingKey::uncut(&scenario.path, &args.policy, oracle);
                let again =
                    || explore_again(&scenario.path, exploration.seed, seeds.start, &args, harness, live.as_ref());
                ledger.record(key, exploration.seed, again, None);
            }
        }
        if exploration.fired.is_empty() {
            return;
        }
        let mix: Vec<String> = exploration.mix.iter().map(|p| p.id()).collect();
        let finding = number.map(|n| format!(" (finding #{n})")).unwrap_or_default();
        fail(&exploration.fired, format!("with {}{finding}", mix.join(" + ")));
    };
    match args.mode {
        Mode::Swarm => {
            let jobs = output::while_wanted(
                scenarios.iter().flat_map(|scenario| seeds.clone().map(move |seed| (scenario, seed))),
            );
            // Each seed is explored (and shrunk) on one worker; failing seeds are printed in seed
            // order, each naming the finding it shrank to.
            for_each_ordered(
                jobs,
                args.jobs.workers(total),
                |(scenario, seed)| (scenario, explore::explore(made_by, scenario, &args.policy, seed, args.keep_cuts)),
                |_, (_, explored)| progress.completed(failed(explored), None),
                |_, (scenario, explored)| take(scenario, explored),
            );
        }
        Mode::Guided => {
            for scenario in &scenarios {
                if output::lost() {
                    break;
                }
                let mut campaign = match Campaign::new(made_by, scenario, &args.policy, seeds.clone(), args.keep_cuts) {
                    Ok(campaign) => campaign,
                    Err(skip) => {
                        take(scenario, Err(skip));
                        continue;
                    }
                };
                let mut uncut_fired = campaign.uncut_fired.clone();
                loop {
                    let trials = campaign.batch();
                    if trials.is_empty() || output::lost() {
                        break;
                    }
                    // Each run (and, if it fails, its shrinking) on a worker; taken back in order,
                    // and only then does the corpus learn from them: the same runs for any --jobs.
                    let made = super::parallel::map_ordered(
                        trials.iter(),
                        args.jobs.workers(trials.len() as u64),
                        |trial| {
                            let tried = campaign.try_mix(trial);
                            let shrunk = campaign.shrink(&tried);
                            (tried, shrunk)
                        },
                        |_, (tried, _)| progress.completed(!tried.fired.is_empty(), None),
                    );
                    for (tried, shrunk) in made {
                        let exploration = explore::Exploration {
                            seed: tried.index,
                            mix: tried.mix.clone(),
                            fired: tried.fired.clone(),
                            // The uncut run is the campaign's: said once, with its first run.
                            uncut_fired: std::mem::take(&mut uncut_fired),
                            runs: 1 + shrunk.as_ref().map_or(0, |(_, runs)| *runs),
                            shrunk: shrunk.map(|(finding, _)| finding),
                            uncut_trajectory: explore::Trajectory::default(),
                            trajectory: explore::Trajectory::default(),
                        };
                        take(scenario, Ok(exploration));
                        campaign.fold(tried);
                    }
                }
                guided_coverage.push((scenario.path.display().to_string(), campaign.coverage.clone()));
            }
        }
    }
    tally.coverage.extend(guided_coverage);
    progress.finish();
    let mut found_json = Vec::new();
    for (number, each) in tally.findings.iter().enumerate() {
        let written = args.out.as_ref().map(|folder| write_finding(folder, &each.finding, harness, live.as_ref()));
        let workload = Path::new(&each.finding.workload);
        // A swarm's finding is made again by its seed; a guided one by its runs up to its first.
        let first = first_of(each, &args);
        let again = || explore_again(workload, first, seeds.start, &args, harness, live.as_ref());
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
        if args.json {
            found_json.push(serde_json::json!({
                "workload": each.finding.workload,
                "oracle": each.finding.oracle,
                "signature": each.finding.signature().to_string(),
                "cuts": each.finding.placements.iter().map(|p| p.id()).collect::<Vec<_>>(),
                tally.unit.name(): each.seeds,
                "seed": each.finding.seed,
                "repro": again(),
                "reference_fired": each.finding.reference_fired,
                "file": written.as_ref().and_then(|w| w.file.as_ref()).map(|f| f.display().to_string()),
                "new": if label.is_empty() { None } else { Some(label == "NEW ") },
            }));
            continue;
        }
        if args.quiet.failures_only && label == "known " {
            continue;
        }
        print_finding(number + 1, each, label, written.map(|w| w.line), &args, seeds.start, harness, live.as_ref());
    }
    if args.json {
        for (workload, coverage) in &tally.coverage {
            let findings: Vec<&serde_json::Value> =
                found_json.iter().filter(|found| found["workload"] == workload.as_str()).collect();
            out!(
                "{}",
                serde_json::json!({
                    "workload": workload,
                    "policy": args.policy,
                    "mode": args.mode.name(),
                    "findings": findings,
                    "coverage": coverage.json(),
                })
            );
        }
    } else if !args.quiet.failures_only {
        for (workload, coverage) in &tally.coverage {
            out!("coverage of {workload}: {}", coverage.summary());
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
                "mode": args.mode.name(),
                "explored": tally.explored,
                "failing": tally.failing,
                "distinct_findings": tally.findings.len(),
                "skipped": tally.skipped,
                "harness": made_by.name(),
            })
        );
        if let Some(line) = super::interrupted_json(tally.explored, total) {
            out!("{line}");
        }
    } else {
        out!("{}", tally.summary(made_by.name()));
        if let Some(line) = super::interrupted(tally.explored, total) {
            out!("{line}");
        }
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

/// The seed a swarm's finding was first found with, or the run of a guided exploration.
fn first_of(found: &ExploredFinding, args: &ExploreArgs) -> u64 {
    match args.mode {
        Mode::Swarm => found.finding.seed,
        Mode::Guided => found.seeds[0],
    }
}

/// The command that explores `workload` again up to `first`: a swarm's seed (the same mix, bit
/// for bit), or a guided exploration's runs from `start` up to that one (each depends on those
/// before it).
fn explore_again(
    workload: &Path,
    first: u64,
    start: u64,
    args: &ExploreArgs,
    harness: &Harness,
    live: Option<&LiveRuns>,
) -> String {
    let path = std::path::absolute(workload).unwrap_or_else(|_| workload.to_path_buf());
    let which = match args.mode {
        Mode::Swarm => format!("--seed {first}"),
        Mode::Guided => format!("--mode guided --seeds {start}..{}", first + 1),
    };
    format!(
        "{} explore {} --policy {} {which}{}{}",
        harness.program,
        crate::run::shell_word(&path.to_string_lossy()),
        args.policy,
        if args.keep_cuts { " --keep-cuts" } else { "" },
        live.map(|live| live.flags()).unwrap_or_default()
    )
}

/// A finding, once: whether the baseline knows it (`label`), its signature, the seeds (or
/// runs) that shrank to it, the repro of the first, its cuts, and the line naming the file
/// written for it.
#[allow(clippy::too_many_arguments)]
fn print_finding(
    number: usize,
    found: &ExploredFinding,
    label: &str,
    written: Option<String>,
    args: &ExploreArgs,
    start: u64,
    harness: &Harness,
    live: Option<&LiveRuns>,
) {
    let ExploredFinding { finding, seeds, runs } = found;
    let unit = match args.mode {
        Mode::Swarm => "seed",
        Mode::Guided => "run",
    };
    let first = first_of(found, args);
    let which = match seeds.len() {
        1 => format!("{unit} {first}"),
        n => format!("{n} {unit}s: {}", report::seed_list(seeds, n as u64)),
    };
    out!("{label}finding #{number} {} on {} [{}], {which}", finding.signature(), finding.workload, finding.policy);
    out!("    repro: {}", explore_again(Path::new(&finding.workload), first, start, args, harness, live));
    let cuts: Vec<String> = finding.placements.iter().map(|p| p.id()).collect();
    let written = written.map(|line| format!(" -> {line}")).unwrap_or_default();
    out!(
        "    shrunk to {} cut(s) in {runs} runs: {}{}{written}",
        cuts.len(),
        cuts.join(" + "),
        reference_note(finding)
    );
}
