//! `rig explore-bench`: runs to the first finding of each bug of a fixed set, under a depth-1
//! sweep, a depth-2 sweep, the swarm and the guided explorer (medians over several starting
//! seeds for the last two), and whether the guided explorer meets issue 37's targets. See
//! [`crate::explore::bench`] for what counts as finding a bug and which runs are counted.
//!
//! A first SIGINT, SIGTERM or SIGHUP ([`crate::interrupt`]) stops every search before its next
//! run and passes the signal on to the small harness's binary, which stops its own the same way;
//! the table is printed with the searches made (a search the signal cut short has no figure),
//! no target is judged, and the command exits with the signal's status.

use super::parallel::{map_ordered, Jobs};
use super::progress::Progress;
use super::{bad_input, Harness, EXIT_BAD_INPUT, EXIT_FAILED};
use crate::explore::bench::{hunt, median, Hunt, Searcher, REFERENCE_BUGS, SMALL_HARNESS_BUGS};
use crate::explore::Runs;
use crate::Scenario;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::Duration;

#[derive(clap::Args)]
pub struct ExploreBenchArgs {
    /// The folder of the bugs' workloads.
    #[arg(long, default_value = "scenarios/workloads")]
    pub workloads: PathBuf,
    /// A bug to hunt, `POLICY@WORKLOAD` (a file of the workloads folder); repeat for several.
    /// Default: the reference harness's known-bad policies that take a cut to show, each on its
    /// workload, and the small harness's planted bugs (with another harness, say which).
    #[arg(long = "bug", value_name = "POLICY@WORKLOAD")]
    pub bugs: Vec<String>,
    /// A planted bug of this binary's harness to hunt, `ID@WORKLOAD` (`.cargo/planted.toml`;
    /// the binary must be built with the `planted` feature); repeat for several.
    #[arg(long = "planted", value_name = "ID@WORKLOAD")]
    pub planted: Vec<String>,
    /// The small harness's binary built with its planted bugs, which hunts them for the default
    /// set (`cargo build --release -p small-harness --features planted`). Default: the
    /// `small-harness` beside this binary.
    #[arg(long, value_name = "PATH")]
    pub small_harness: Option<PathBuf>,
    /// The default set without the small harness's planted bugs.
    #[arg(long, conflicts_with = "small_harness")]
    pub without_small_harness: bool,
    /// Run only this searcher (`depth-1`, `depth-2`, `swarm`, `guided`); repeat for several.
    /// Default: all four. The targets are judged only with `swarm` and `guided` both run.
    #[arg(long = "searcher", value_name = "NAME", value_parser = parse_searcher)]
    pub searchers: Vec<Searcher>,
    /// The table as Markdown (the README's), instead of text.
    #[arg(long, conflicts_with = "json")]
    pub markdown: bool,
    /// The most runs with cuts a swarm or guided search makes for one bug from one seed.
    #[arg(long, default_value_t = 2_000)]
    pub cap: u64,
    /// How many starting seeds the swarm and the guided explorer are measured from (0, 100000,
    /// 200000, ...): the figure is their median.
    #[arg(long, default_value_t = 5)]
    pub explorer_seeds: u64,
    /// One JSON object per bug and one for the summary, instead of the table.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub jobs: Jobs,
}

fn parse_searcher(name: &str) -> Result<Searcher, String> {
    Searcher::ALL.into_iter().find(|s| s.name() == name).ok_or_else(|| {
        let names: Vec<&str> = Searcher::ALL.iter().map(|s| s.name()).collect();
        format!("expected one of {}", names.join(", "))
    })
}

/// How far apart the starting seeds are: far enough that no two searches share a run.
const SEED_STRIDE: u64 = 100_000;

/// A bug of the set: a known-bad policy, or a planted bug under the harness's `reference`.
#[derive(Clone)]
struct Bug {
    policy: String,
    planted: Option<String>,
    workload: String,
}

impl Bug {
    /// `ID@WORKLOAD` or `POLICY@WORKLOAD`, as the option takes it.
    fn parse(option: &str, text: &str, planted: bool) -> Result<Self, String> {
        let Some((name, workload)) = text.split_once('@').filter(|(n, w)| !n.is_empty() && !w.is_empty()) else {
            let shape = if planted { "ID@WORKLOAD" } else { "POLICY@WORKLOAD" };
            return Err(format!("`{option} {text}`: expected {shape}"));
        };
        Ok(match planted {
            true => Bug { policy: "reference".into(), planted: Some(name.into()), workload: workload.into() },
            false => Bug { policy: name.into(), planted: None, workload: workload.into() },
        })
    }

    fn name(&self) -> &str {
        self.planted.as_deref().unwrap_or(&self.policy)
    }
}

/// The bug's row: its searches' results, in [`Searcher::ALL`] order, each a list (one per
/// starting seed; a sweep has one).
struct Row {
    /// The harness it is planted in, or whose policy it is.
    harness: String,
    bug: String,
    workload: String,
    hunts: Vec<Vec<Hunt>>,
}

impl Row {
    fn firsts(&self, searcher: Searcher) -> Vec<Option<u64>> {
        self.hunts[searcher as usize].iter().map(|hunt| hunt.first).collect()
    }

    fn median(&self, searcher: Searcher) -> Option<u64> {
        median(&self.firsts(searcher))
    }

    /// Needs two faults on one action or record: no single cut finds it, a depth-2 sweep's
    /// pair on one subject does.
    fn needs_two_on_one(&self) -> bool {
        let (Some(depth1), Some(depth2)) =
            (self.hunts[Searcher::Depth1 as usize].first(), self.hunts[Searcher::Depth2 as usize].first())
        else {
            return false;
        };
        depth1.first.is_none() && depth2.same_subject
    }
}

pub(crate) fn command(args: ExploreBenchArgs, harness: &Harness) -> ExitCode {
    let default_set = args.bugs.is_empty() && args.planted.is_empty();
    let mut bugs: Vec<Bug> = Vec::new();
    if default_set {
        if harness.name() != "reference" {
            return bad_input(
                "name the bugs of this harness to hunt: `--bug POLICY@WORKLOAD` or `--planted ID@WORKLOAD`",
            );
        }
        bugs.extend(REFERENCE_BUGS.iter().map(|(policy, workload)| Bug {
            policy: policy.to_string(),
            planted: None,
            workload: workload.to_string(),
        }));
    }
    for (option, texts, planted) in [("--bug", &args.bugs, false), ("--planted", &args.planted, true)] {
        for text in texts {
            match Bug::parse(option, text, planted) {
                Ok(bug) => bugs.push(bug),
                Err(message) => return bad_input(&message),
            }
        }
    }
    if args.explorer_seeds == 0 || args.cap == 0 {
        return bad_input("`--explorer-seeds` and `--cap` must be at least 1");
    }
    if bugs.iter().any(|bug| bug.planted.is_some()) && !crate::planted::BUILT_IN {
        return bad_input(
            "this binary has no planted bugs: build it with the `planted` feature (`--features rig/planted`)",
        );
    }
    // The small harness's planted bugs are hunted by its own binary: found before any run.
    let small = if default_set && !args.without_small_harness {
        match small_harness_binary(args.small_harness.as_deref()) {
            Ok(path) => Some(path),
            Err(message) => return bad_input(&message),
        }
    } else {
        None
    };
    let policies = harness.factory.policies();
    let mut scenarios = Vec::new();
    for bug in &bugs {
        if !policies.contains(&bug.policy) {
            return bad_input(&format!("harness `{}` has no policy `{}`", harness.name(), bug.policy));
        }
        let path = args.workloads.join(&bug.workload);
        match Scenario::load(&path) {
            Ok(scenario) => scenarios.push(scenario),
            Err(error) => {
                err!("error: {error}");
                return ExitCode::from(EXIT_BAD_INPUT);
            }
        }
    }
    let starts: Vec<u64> = (0..args.explorer_seeds).map(|k| k * SEED_STRIDE).collect();
    // Every search is its own job: a bug, a searcher, a starting seed.
    let mut jobs = Vec::new();
    let searchers: Vec<Searcher> =
        Searcher::ALL.into_iter().filter(|s| args.searchers.is_empty() || args.searchers.contains(s)).collect();
    for bug in 0..bugs.len() {
        for &searcher in &searchers {
            let seeds: &[u64] = if searcher.seeded() { &starts } else { &[0] };
            jobs.extend(seeds.iter().map(|start| (bug, searcher, *start)));
        }
    }
    let progress = Progress::new(jobs.len() as u64);
    let made_by: &dyn Runs = &harness.factory;
    let results = map_ordered(
        jobs.clone(),
        args.jobs.workers(jobs.len() as u64),
        |(bug, searcher, start)| {
            let Bug { policy, planted, .. } = &bugs[bug];
            hunt(made_by, &scenarios[bug], policy, planted.as_deref(), searcher, start, args.cap)
        },
        |_, result| progress.completed(result.as_ref().is_ok_and(|hunt| hunt.first.is_none()), None),
    );
    progress.finish();
    let mut rows: Vec<Row> = bugs
        .iter()
        .map(|bug| Row {
            harness: harness.name().to_string(),
            bug: bug.name().to_string(),
            workload: bug.workload.clone(),
            hunts: vec![Vec::new(); Searcher::ALL.len()],
        })
        .collect();
    for ((bug, searcher, _), result) in jobs.iter().zip(results) {
        match result {
            // Cut short by a signal: no figure.
            Ok(hunt) if hunt.interrupted => {}
            Ok(hunt) => rows[*bug].hunts[*searcher as usize].push(hunt),
            Err(skip) => {
                err!("error: {}: {skip}", bugs[*bug].workload);
                return ExitCode::from(EXIT_BAD_INPUT);
            }
        }
    }
    if let Some(binary) = small.filter(|_| !crate::interrupt::requested()) {
        match small_harness_rows(&binary, &args) {
            Ok(more) => rows.extend(more),
            Err(message) => {
                err!("error: {message}");
                return ExitCode::from(EXIT_BAD_INPUT);
            }
        }
    }
    let mut summary = Summary::of(&rows, args.cap);
    summary.interrupted = crate::interrupt::received().map(|signal| {
        let made: usize = rows.iter().flat_map(|row| &row.hunts).map(Vec::len).sum();
        let planned =
            jobs.len() + if default_set && !args.without_small_harness { small_jobs(&args, &starts) } else { 0 };
        format!("interrupted by {}: {made} of {planned} searches made, no more started", signal.name())
    });
    if args.json {
        for row in &rows {
            out!("{}", row_json(row));
        }
        out!("{}", summary.json(harness.name(), &args, &starts));
    } else if args.markdown {
        print_markdown(&rows);
        out!("");
        out!("```text");
        for line in summary.lines() {
            out!("{line}");
        }
        out!("```");
    } else {
        print_table(&rows, &args, harness.name(), &starts);
        for line in summary.lines() {
            out!("{line}");
        }
    }
    if summary.met() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(EXIT_FAILED)
    }
}

/// `12`, or `-` when nothing was found (within the cap, or the sweep's plan).
fn cell(first: Option<u64>) -> String {
    first.map_or_else(|| "-".to_string(), |n| n.to_string())
}

/// A sweep's cell: its one search's figure (`n/a`: not run).
fn sweep_cell(row: &Row, searcher: Searcher) -> String {
    row.hunts[searcher as usize].first().map_or_else(|| "n/a".to_string(), |hunt| cell(hunt.first))
}

/// A seeded searcher's cell: the median, with each seed's figure (`n/a`: not run).
fn seeded_cell(row: &Row, searcher: Searcher) -> String {
    if row.hunts[searcher as usize].is_empty() {
        return "n/a".to_string();
    }
    let each: Vec<String> = row.firsts(searcher).into_iter().map(cell).collect();
    format!("{} ({})", cell(row.median(searcher)), each.join(" "))
}

/// The small harness's binary: as given, or beside this one; it must have the planted bugs in.
fn small_harness_binary(given: Option<&Path>) -> Result<PathBuf, String> {
    let hint = "the default set's planted bugs are hunted by the small harness's binary built with them \
                (`cargo build --release -p small-harness --features planted`, then `--small-harness PATH` \
                unless it is beside this binary), or leave them out with `--without-small-harness`";
    let path = match given {
        Some(path) => path.to_path_buf(),
        None => std::env::current_exe()
            .ok()
            .and_then(|exe| Some(exe.parent()?.join(format!("small-harness{}", std::env::consts::EXE_SUFFIX))))
            .ok_or_else(|| format!("cannot tell where this binary is: {hint}"))?,
    };
    if !path.is_file() {
        return Err(format!("{}: no such binary: {hint}", path.display()));
    }
    Ok(path)
}

/// The searches the small harness's binary makes for the default set.
fn small_jobs(args: &ExploreBenchArgs, starts: &[u64]) -> usize {
    Searcher::ALL
        .into_iter()
        .filter(|s| args.searchers.is_empty() || args.searchers.contains(s))
        .map(|s| if s.seeded() { starts.len() } else { 1 })
        .sum::<usize>()
        * SMALL_HARNESS_BUGS.len()
}

/// A child process that is killed and reaped if it is still running when this is dropped: an
/// early return or a panic leaves no orphan burning a core.
struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        if matches!(self.0.try_wait(), Ok(None)) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// Runs `command` with its standard output read in full, passing on to it the first signal that
/// asks this process to stop (so that it winds down as this one does, and says what it did).
fn output_passing_signals(command: &mut Command) -> std::io::Result<(std::process::ExitStatus, String)> {
    let mut child = Reaped(command.stdout(Stdio::piped()).spawn()?);
    let mut stdout = child.0.stdout.take().ok_or_else(|| std::io::Error::other("no standard output"))?;
    // Read on a thread of its own, so a child writing more than a pipe holds never waits on us.
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        stdout.read_to_string(&mut text).map(|_| text)
    });
    let mut passed_on = false;
    let status = loop {
        if let Some(status) = child.0.try_wait()? {
            break status;
        }
        if let Some(signal) = crate::interrupt::received().filter(|_| !passed_on) {
            passed_on = true;
            if let Ok(pid) = libc::pid_t::try_from(child.0.id()) {
                // SAFETY: kill takes two integers and touches no memory of ours.
                unsafe { libc::kill(pid, signal.number()) };
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let text = reader.join().map_err(|_| std::io::Error::other("the reader of its output panicked"))??;
    Ok((status, text))
}

/// The small harness's planted bugs hunted by its binary (`small-harness explore-bench
/// --planted ... --json`: each bug on in the runs that hunt it, off in the runs that judge a
/// finding), as rows of this table. Its progress goes to standard error, as this one's does.
fn small_harness_rows(binary: &Path, args: &ExploreBenchArgs) -> Result<Vec<Row>, String> {
    let mut command = Command::new(binary);
    command
        .arg("explore-bench")
        .arg("--workloads")
        .arg(&args.workloads)
        .args(["--cap", &args.cap.to_string(), "--explorer-seeds", &args.explorer_seeds.to_string(), "--json"])
        .env_remove(crate::planted::VARIABLE)
        .stdin(Stdio::null())
        .stderr(Stdio::inherit());
    if let Some(jobs) = args.jobs.jobs {
        command.args(["--jobs", &jobs.to_string()]);
    }
    for searcher in &args.searchers {
        command.args(["--searcher", searcher.name()]);
    }
    for (id, workload) in SMALL_HARNESS_BUGS {
        command.arg("--planted").arg(format!("{id}@{workload}"));
    }
    let shown = binary.display();
    let (status, stdout) = output_passing_signals(&mut command).map_err(|error| format!("{shown}: {error}"))?;
    // 0: every target met, 1: one not met; anything else is the child's error (said on stderr),
    // unless a signal this process passed on stopped it (it printed what it made).
    let stopped =
        crate::interrupt::received().is_some_and(|signal| status.code() == Some(i32::from(signal.exit_status())));
    if !matches!(status.code(), Some(0 | 1)) && !stopped {
        return Err(format!("{shown} explore-bench: {status}"));
    }
    let rows: Vec<Row> = stdout
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|value| value.get("bug").is_some())
        .map(|value| row_from_json(&value))
        .collect::<Option<_>>()
        .ok_or_else(|| format!("{shown} explore-bench: a row of its `--json` is not one this binary reads"))?;
    // A child a signal stopped may not have got to print its rows at all.
    if rows.len() != SMALL_HARNESS_BUGS.len() && !stopped {
        return Err(format!("{shown} explore-bench: {} rows for {} bugs", rows.len(), SMALL_HARNESS_BUGS.len()));
    }
    Ok(rows)
}

/// A row read back from [`row_json`].
fn row_from_json(value: &serde_json::Value) -> Option<Row> {
    let text = |value: &serde_json::Value, key: &str| value.get(key)?.as_str().map(str::to_string);
    let searches = value.get("searches")?;
    let mut hunts = Vec::new();
    for searcher in Searcher::ALL {
        let each = searches.get(searcher.name())?.get("each")?.as_array()?;
        let mut found = Vec::new();
        for hunt in each {
            found.push(Hunt {
                first: hunt.get("first")?.as_u64(),
                runs: hunt.get("runs")?.as_u64()?,
                oracle: text(hunt, "oracle"),
                cuts: hunt
                    .get("cuts")?
                    .as_array()?
                    .iter()
                    .map(|c| c.as_str().map(str::to_string))
                    .collect::<Option<_>>()?,
                same_subject: hunt.get("same_subject")?.as_bool()?,
                interrupted: false,
            });
        }
        hunts.push(found);
    }
    Some(Row { harness: text(value, "harness")?, bug: text(value, "bug")?, workload: text(value, "workload")?, hunts })
}

/// The oracle of the row's first finding, by any searcher.
fn oracle(row: &Row) -> String {
    row.hunts.iter().flatten().find_map(|hunt| hunt.oracle.clone()).unwrap_or_default()
}

fn print_markdown(rows: &[Row]) {
    out!("| bug | harness | workload | depth-1 | depth-2 | swarm (each seed) | guided (each seed) | oracle |");
    out!("|---|---|---|---|---|---|---|---|");
    for row in rows {
        let two = if row.needs_two_on_one() { " (two faults on one action)" } else { "" };
        out!(
            "| `{}`{two} | {} | `{}` | {} | {} | {} | {} | `{}` |",
            row.bug,
            row.harness,
            row.workload,
            sweep_cell(row, Searcher::Depth1),
            sweep_cell(row, Searcher::Depth2),
            seeded_cell(row, Searcher::Swarm),
            seeded_cell(row, Searcher::Guided),
            oracle(row),
        );
    }
}

fn print_table(rows: &[Row], args: &ExploreBenchArgs, harness: &str, starts: &[u64]) {
    out!(
        "rig explore-bench: harness {harness}, {} bugs; runs with cuts to the first finding (-: none); swarm and \
         guided capped at {} runs, median over starting seeds {}",
        rows.len(),
        args.cap,
        starts.iter().map(u64::to_string).collect::<Vec<_>>().join(", ")
    );
    out!(
        "{:<44} {:<44} {:>8} {:>8} {:<34} {:<34} oracle",
        "bug",
        "workload",
        "depth-1",
        "depth-2",
        "swarm (each seed)",
        "guided (each seed)"
    );
    for row in rows {
        let oracle = oracle(row);
        let bug = if row.harness == harness { row.bug.clone() } else { format!("{}: {}", row.harness, row.bug) };
        out!(
            "{:<44} {:<44} {:>8} {:>8} {:<34} {:<34} {oracle}",
            bug,
            row.workload,
            sweep_cell(row, Searcher::Depth1),
            sweep_cell(row, Searcher::Depth2),
            seeded_cell(row, Searcher::Swarm),
            seeded_cell(row, Searcher::Guided),
        );
    }
}

fn row_json(row: &Row) -> serde_json::Value {
    let searches: serde_json::Map<String, serde_json::Value> = Searcher::ALL
        .iter()
        .map(|searcher| {
            let hunts = &row.hunts[*searcher as usize];
            let each: Vec<serde_json::Value> = hunts
                .iter()
                .map(|hunt| {
                    serde_json::json!({
                        "first": hunt.first,
                        "runs": hunt.runs,
                        "oracle": hunt.oracle,
                        "cuts": hunt.cuts,
                        "same_subject": hunt.same_subject,
                    })
                })
                .collect();
            (searcher.name().to_string(), serde_json::json!({ "median": row.median(*searcher), "each": each }))
        })
        .collect();
    serde_json::json!({
        "bug": row.bug,
        "harness": row.harness,
        "workload": row.workload,
        "needs_two_faults_on_one_action": row.needs_two_on_one(),
        "searches": searches,
    })
}

/// The set's figures against issue 37's targets.
struct Summary {
    bugs: usize,
    cap: u64,
    /// Per searcher: bugs found (by the median), the median over the set, runs made.
    found: Vec<usize>,
    medians: Vec<Option<u64>>,
    runs: Vec<u64>,
    /// Bugs that take two faults on one action, and their guided medians.
    two_on_one: Vec<(String, Option<u64>)>,
    /// Bugs the swarm finds within 2,000 runs (by its median) that the guided explorer does not.
    lost: Vec<String>,
    /// Every searcher ran on every bug (`--searcher` leaves some out: no target is met then).
    complete: bool,
    /// What a signal that stopped the searches left undone.
    interrupted: Option<String>,
}

/// What "the swarm finds it" means for the no-loss target.
const SWARM_FINDS_WITHIN: u64 = 2_000;
/// The target for a bug that needs two faults on one action.
const TWO_ON_ONE_WITHIN: u64 = 300;
/// The target ratio of the swarm's median to the guided explorer's.
const RATIO_TARGET: f64 = 3.0;

impl Summary {
    fn of(rows: &[Row], cap: u64) -> Self {
        let per = |searcher: Searcher| rows.iter().map(|row| row.median(searcher)).collect::<Vec<_>>();
        Summary {
            complete: rows.iter().all(|row| row.hunts.iter().all(|hunts| !hunts.is_empty())),
            bugs: rows.len(),
            cap,
            found: Searcher::ALL.iter().map(|s| per(*s).iter().filter(|m| m.is_some()).count()).collect(),
            medians: Searcher::ALL.iter().map(|s| median(&per(*s))).collect(),
            runs: Searcher::ALL
                .iter()
                .map(|s| rows.iter().flat_map(|row| &row.hunts[*s as usize]).map(|hunt| hunt.runs).sum())
                .collect(),
            two_on_one: rows
                .iter()
                .filter(|row| row.needs_two_on_one())
                .map(|row| (row.bug.clone(), row.median(Searcher::Guided)))
                .collect(),
            lost: rows
                .iter()
                .filter(|row| row.median(Searcher::Swarm).is_some_and(|m| m <= SWARM_FINDS_WITHIN))
                .filter(|row| row.median(Searcher::Guided).is_none())
                .map(|row| row.bug.clone())
                .collect(),
            interrupted: None,
        }
    }

    /// The swarm's median over the guided explorer's (a median of nothing found counts as the cap).
    fn ratio(&self) -> f64 {
        let at = |searcher: Searcher| self.medians[searcher as usize].unwrap_or(self.cap + 1).max(1) as f64;
        at(Searcher::Swarm) / at(Searcher::Guided)
    }

    /// Met when the set has such bugs and each is found in time: a set without one measures
    /// nothing of it.
    fn two_on_one_met(&self) -> bool {
        !self.two_on_one.is_empty() && self.two_on_one.iter().all(|(_, m)| m.is_some_and(|m| m <= TWO_ON_ONE_WITHIN))
    }

    fn met(&self) -> bool {
        self.complete
            && self.interrupted.is_none()
            && self.ratio() >= RATIO_TARGET
            && self.two_on_one_met()
            && self.lost.is_empty()
    }

    fn lines(&self) -> Vec<String> {
        let verdict = |met: bool| if met { "met" } else { "NOT met" };
        let each = |f: &dyn Fn(usize) -> String| {
            Searcher::ALL.iter().map(|s| format!("{} {}", s.name(), f(*s as usize))).collect::<Vec<_>>().join(", ")
        };
        let two: Vec<String> = self.two_on_one.iter().map(|(bug, m)| format!("{bug} {}", cell(*m))).collect();
        let mut lines = vec![
            format!("found: {} (of {} bugs)", each(&|i| self.found[i].to_string()), self.bugs),
            format!("median runs to the first finding over the set: {}", each(&|i| cell(self.medians[i]))),
            format!("runs made: {}", each(&|i| self.runs[i].to_string())),
            format!(
                "target: the guided median at least {RATIO_TARGET}x below the swarm's: {:.1}x, {}",
                self.ratio(),
                verdict(self.ratio() >= RATIO_TARGET)
            ),
            format!(
                "target: every bug that takes two faults on one action found within {TWO_ON_ONE_WITHIN} runs: {}, {}",
                if two.is_empty() { "no such bug in the set".to_string() } else { two.join(", ") },
                if two.is_empty() { "not measured" } else { verdict(self.two_on_one_met()) }
            ),
            format!(
                "target: no bug the swarm finds within {SWARM_FINDS_WITHIN} runs is lost: {}, {}",
                if self.lost.is_empty() { "none lost".to_string() } else { format!("lost {}", self.lost.join(", ")) },
                verdict(self.lost.is_empty())
            ),
        ];
        if let Some(line) = &self.interrupted {
            lines.push(line.clone());
            lines.push("targets NOT judged: a signal stopped the searches".to_string());
        } else if !self.complete {
            lines.push("targets NOT judged: `--searcher` left a searcher out".to_string());
        }
        lines
    }

    fn json(&self, harness: &str, args: &ExploreBenchArgs, starts: &[u64]) -> serde_json::Value {
        let by = |values: &dyn Fn(usize) -> serde_json::Value| {
            Searcher::ALL
                .iter()
                .map(|s| (s.name().to_string(), values(*s as usize)))
                .collect::<serde_json::Map<String, serde_json::Value>>()
        };
        serde_json::json!({
            "summary": self.lines().join("; "),
            "harness": harness,
            "bugs": self.bugs,
            "cap": args.cap,
            "starting_seeds": starts,
            "found": by(&|i| self.found[i].into()),
            "median": by(&|i| self.medians[i].into()),
            "runs": by(&|i| self.runs[i].into()),
            "ratio_swarm_to_guided": self.ratio(),
            "two_faults_on_one_action": self.two_on_one.iter().map(|(bug, m)| serde_json::json!({"bug": bug, "guided_median": m})).collect::<Vec<_>>(),
            "lost": self.lost,
            "targets_met": self.met(),
        })
    }
}
