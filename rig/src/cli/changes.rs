//! `rig changes`: what a night's runs failed on and found, against everything the nights before
//! found, from the baseline files each shard wrote (`--write-baseline`): each failure and finding
//! new, ongoing or gone (or known, where a team's baseline lists it), a new one with its repro
//! line and the command that bisects the commit that introduced it. This is the nightly's report
//! (`.github/workflows/nightly.yml`); it works on any such files.
//!
//! The nights' seeds differ, so what one night does not find may only be undrawn. What the
//! nights before found and this night did not is run again from its repro (its file at its seed):
//! it is gone only when that passes now, and it stays known (ongoing) while it fails. The file
//! written for the next night (`--write-baseline`) holds everything still known, with a copy of
//! each finding's scenario file beside it, so one folder is the whole memory of the nightly.

use super::{bad_input, Harness, EXIT_FAILED};
use crate::baseline::{shown, Baseline, Entry, FailureKey, FindingKey, Search, What};
use crate::explore;
use crate::run::shell_word;
use crate::scenario::Scenario;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct ChangesArgs {
    /// What this night failed on and found: baseline files written with --write-baseline (one
    /// per shard and command), merged.
    #[arg(long = "now", value_name = "FILE", required = true, num_args = 1..)]
    pub now: Vec<PathBuf>,
    /// What the nights before found (the file the last `rig changes --write-baseline` wrote).
    /// Without it, everything found is new.
    #[arg(long, value_name = "FILE")]
    pub since: Option<PathBuf>,
    /// Failures and findings known for good (a team's baseline): found, they are `known`, not new.
    #[arg(long, value_name = "FILE")]
    pub baseline: Option<PathBuf>,
    /// The commit the night before ran (where the new ones did not show): with --bad, each new
    /// one comes with the command that bisects the commit that introduced it.
    #[arg(long, value_name = "COMMIT", requires = "bad")]
    pub good: Option<String>,
    /// The commit this night ran.
    #[arg(long, value_name = "COMMIT", requires = "good")]
    pub bad: Option<String>,
    /// The bisect script the printed command runs (`git bisect run` over a repro line).
    #[arg(long, value_name = "PATH", default_value = ".ci/bisect-finding")]
    pub bisect_with: String,
    /// Write everything still known (this night's, and the nights before's whose repro still
    /// fails) to FILE for the next night, each finding's scenario file copied into the folder
    /// FILE's stem names (`state.findings/` beside `state.toml`).
    #[arg(long, value_name = "FILE")]
    pub write_baseline: Option<PathBuf>,
    /// A gone failure or finding fails the command too.
    #[arg(long)]
    pub strict: bool,
    /// Also list what is ongoing and known, not only what changed.
    #[arg(long)]
    pub all: bool,
}

/// Where a failure or finding stands against the nights before.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Change {
    /// Found, and never before.
    New,
    /// Found before, not this night, and its repro passes now.
    Gone,
    /// Found this night and before.
    Ongoing,
    /// Found before, not this night, and its repro still fails: only undrawn.
    Undrawn,
    /// Found before, not this night, and its repro could not be run again (why).
    Unchecked(String),
    /// Found, and listed in the team's baseline.
    Known,
}

impl Change {
    fn label(&self) -> &'static str {
        match self {
            Change::New => "NEW",
            Change::Gone => "GONE",
            Change::Ongoing | Change::Undrawn => "ongoing",
            Change::Unchecked(_) => "unchecked",
            Change::Known => "known",
        }
    }

    /// Whether the next night still counts it as known.
    fn kept(&self) -> bool {
        !matches!(self, Change::Gone)
    }
}

/// What reproduces an entry: a scenario file run under a policy at a seed.
#[derive(Debug, Clone)]
struct Rerun {
    file: PathBuf,
    policy: String,
    seed: u64,
}

impl Rerun {
    fn args(&self) -> String {
        format!("{} --policy {} --seed {}", shell_word(&shown(&self.file)), self.policy, self.seed)
    }
}

/// One line of the report.
struct Item {
    change: Change,
    what: String,
    seed: Option<u64>,
    rerun: Option<Rerun>,
    /// What reproduces it where no file does (a sweep's finding).
    repro: Option<String>,
}

pub(crate) fn command(args: ChangesArgs, harness: &Harness) -> ExitCode {
    let read = |path: &Path| Baseline::load(path).map_err(|error| bad_input(&format!("bad baseline: {error}")));
    let mut now: Vec<Baseline> = Vec::new();
    for path in &args.now {
        match read(path) {
            Ok(baseline) => now.push(baseline),
            Err(code) => return code,
        }
    }
    let since = match args.since.as_deref().map(read).transpose() {
        Ok(since) => since,
        Err(code) => return code,
    };
    let known = match args.baseline.as_deref().map(read).transpose() {
        Ok(known) => known,
        Err(code) => return code,
    };
    let harnesses: BTreeSet<&str> =
        now.iter().chain(&since).chain(&known).filter_map(|b| b.harness.as_deref()).collect();
    if harnesses.len() > 1 {
        let names: Vec<&str> = harnesses.into_iter().collect();
        return bad_input(&format!("these baselines list the failures of different harnesses: {}", names.join(", ")));
    }
    let name = harnesses.into_iter().next().unwrap_or(harness.name()).to_string();
    // What was found before and not now is run again, by this binary's harness: only if it is
    // the harness that found it.
    let recheck = if name == harness.name() {
        Ok(harness)
    } else {
        Err(format!("found by harness `{name}`, and this binary runs `{}`", harness.name()))
    };
    let out_path = args.write_baseline.clone().unwrap_or_else(|| PathBuf::from("changes.toml"));
    let tonight = merge(&out_path, &name, &now);
    let empty = Baseline::empty(Path::new("none.toml"), &name);
    let before = since.as_ref().unwrap_or(&empty);
    let listed = known.as_ref().unwrap_or(&empty);
    let program = &harness.program;

    let mut items = Vec::new();
    let mut written = Baseline::empty(&out_path, &name);
    for (change, entry) in
        compare(&tonight.failures, &before.failures, &listed.failures, |e| recheck_failure(recheck.clone(), e))
    {
        let FailureKey { file, policy, .. } = &entry.key;
        let rerun = Rerun { file: file.clone(), policy: policy.clone(), seed: entry.seed.unwrap_or(0) };
        let item =
            Item { change, what: format!("failure {}", entry.key), seed: entry.seed, rerun: Some(rerun), repro: None };
        if item.change.kept() {
            written.failures.push(entry.clone());
        }
        items.push(item);
    }
    for search in [Search::Sweep, Search::Explore] {
        let recheck = |entry: &Entry<FindingKey>| recheck_finding(recheck.clone(), entry);
        for (change, entry) in
            compare(tonight.findings(search), before.findings(search), listed.findings(search), recheck)
        {
            let FindingKey { workload, policy, .. } = &entry.key;
            let seed = entry.seed.unwrap_or(0);
            // A finding's own scenario file reruns it; one of the uncut workload is the search's.
            let rerun = entry.shrunk.clone().map(|file| Rerun { file, policy: policy.clone(), seed });
            let repro =
                format!("{program} {} {} --policy {policy} --seed {seed}", search.name(), shell_word(&shown(workload)));
            let item = Item {
                change,
                what: format!("{} finding {}", search.name(), entry.key),
                seed: entry.seed,
                rerun,
                repro: Some(repro),
            };
            if item.change.kept() {
                let mut kept = entry.clone();
                if let Some(shrunk) = &kept.shrunk {
                    kept.shrunk = Some(keep_file(&out_path, shrunk, args.write_baseline.is_some()));
                }
                match search {
                    Search::Sweep => written.sweep.push(kept),
                    Search::Explore => written.explore.push(kept),
                }
            }
            items.push(item);
        }
    }
    items.sort_by_key(|item| item.change.clone());

    let bisect = args.good.as_ref().zip(args.bad.as_ref());
    for item in &items {
        let changed = matches!(item.change, Change::New | Change::Gone);
        if !args.all && !changed {
            continue;
        }
        let seed = match (item.seed, &item.change) {
            (Some(seed), Change::New | Change::Ongoing | Change::Known) => format!(" (seed {seed})"),
            (Some(seed), _) => format!(" (last seen at seed {seed})"),
            (None, _) => String::new(),
        };
        out!("{:<9} {}{seed}", item.change.label(), item.what);
        match (&item.change, &item.rerun, &item.repro) {
            (Change::Gone, Some(rerun), _) => out!("    passes now: {program} run {}", rerun.args()),
            (Change::Undrawn, Some(rerun), _) => {
                out!("    not found this time, and still fails: {program} run {}", rerun.args())
            }
            (Change::Unchecked(why), _, _) => out!("    not found this time, and not run again: {why}"),
            (_, Some(rerun), _) => out!("    repro: {program} run {}", rerun.args()),
            (_, None, Some(repro)) => out!("    repro: {repro}"),
            (_, None, None) => {}
        }
        if let (Change::New, Some((good, bad)), Some(rerun)) = (&item.change, bisect, &item.rerun) {
            out!("    bisect: {}{} {good} {bad} {}", bisect_env(program), args.bisect_with, rerun.args());
        }
    }
    let count = |wanted: fn(&Change) -> bool| items.iter().filter(|item| wanted(&item.change)).count();
    let new = count(|c| *c == Change::New);
    let gone = count(|c| *c == Change::Gone);
    let since_what = match &args.since {
        Some(path) => format!("since {}", path.display()),
        None => "with nothing before (every failure and finding is new)".to_string(),
    };
    let known_what = match &args.baseline {
        Some(path) => format!(", {} known ({})", count(|c| *c == Change::Known), path.display()),
        None => String::new(),
    };
    let undrawn = count(|c| *c == Change::Undrawn);
    let unchecked = count(|c| matches!(c, Change::Unchecked(_)));
    out!(
        "changes {since_what}: {new} new, {} ongoing ({undrawn} of them not found this time, whose repro still fails){known_what}, {gone} gone{}",
        count(|c| matches!(c, Change::Ongoing | Change::Undrawn)),
        if unchecked > 0 { format!(", {unchecked} not found this time and not run again") } else { String::new() }
    );
    if let Some(path) = &args.write_baseline {
        if let Err(error) = written.write() {
            return bad_input(&format!("cannot write the baseline {}: {error}", path.display()));
        }
        err!(
            "wrote {}: {} failure(s) and {} finding(s) known, for the next night's --since",
            path.display(),
            written.failures.len(),
            written.sweep.len() + written.explore.len()
        );
    }
    if new > 0 || (args.strict && gone > 0) {
        ExitCode::from(EXIT_FAILED)
    } else {
        ExitCode::SUCCESS
    }
}

/// Where the next night finds a finding's scenario file: copied, when writing, into the folder
/// beside the written file named after its stem (`state.findings/`), so that one folder holds
/// all the nightly remembers; else where it is.
fn keep_file(out: &Path, file: &Path, writing: bool) -> PathBuf {
    if !writing {
        return file.to_path_buf();
    }
    let stem = out.file_stem().map_or_else(|| "baseline".into(), |s| s.to_string_lossy().into_owned());
    let folder = out.with_file_name(format!("{stem}.findings"));
    let Some(name) = file.file_name() else { return file.to_path_buf() };
    let copy = folder.join(name);
    if crate::baseline::absolute(&copy) == crate::baseline::absolute(file) {
        return copy;
    }
    let copied = std::fs::create_dir_all(&folder).and_then(|()| std::fs::copy(file, &copy));
    match copied {
        Ok(_) => crate::baseline::absolute(&copy),
        Err(error) => {
            err!("rig changes: cannot keep {} in {}: {error}", file.display(), folder.display());
            file.to_path_buf()
        }
    }
}

/// `RIG_BIN=... RIG_PROFILE=...` for the bisect script, when the binary that printed the repro
/// is not a release build of `rig`: the script builds and runs that binary at each commit.
fn bisect_env(program: &str) -> String {
    let path = Path::new(program);
    let bin = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "rig".into());
    let profile = path.parent().and_then(Path::file_name).map(|n| n.to_string_lossy().into_owned());
    let mut env = String::new();
    if bin != "rig" {
        env.push_str(&format!("RIG_BIN={} ", shell_word(&bin)));
    }
    if profile.as_deref() == Some("debug") {
        env.push_str("RIG_PROFILE=dev ");
    }
    env
}

/// Many files' entries as one baseline at `path`: each key once, with the lowest seed that
/// showed it (and that seed's file).
fn merge(path: &Path, harness: &str, files: &[Baseline]) -> Baseline {
    let mut merged = Baseline::empty(path, harness);
    merged.failures = merge_list(files.iter().map(|b| b.failures.as_slice()));
    merged.sweep = merge_list(files.iter().map(|b| b.findings(Search::Sweep)));
    merged.explore = merge_list(files.iter().map(|b| b.findings(Search::Explore)));
    merged
}

fn merge_list<'a, K: Ord + Clone + 'a>(lists: impl Iterator<Item = &'a [Entry<K>]>) -> Vec<Entry<K>> {
    let mut by_key: BTreeMap<K, Entry<K>> = BTreeMap::new();
    for entry in lists.flatten() {
        match by_key.get_mut(&entry.key) {
            Some(kept) if entry.seed.unwrap_or(u64::MAX) < kept.seed.unwrap_or(u64::MAX) => {
                let note = kept.note.take().or(entry.note.clone());
                *kept = Entry { note, line: 0, ..entry.clone() };
            }
            Some(kept) => {
                if kept.note.is_none() {
                    kept.note = entry.note.clone();
                }
            }
            None => {
                by_key.insert(entry.key.clone(), Entry { line: 0, ..entry.clone() });
            }
        }
    }
    by_key.into_values().collect()
}

/// Each entry of `now` (new; ongoing when `before` has it; known when `known` lists it), then
/// each of `before` that `now` lacks, run again (`recheck`): gone when its repro passes now.
fn compare<'a, K: Ord>(
    now: &'a [Entry<K>],
    before: &'a [Entry<K>],
    known: &'a [Entry<K>],
    recheck: impl Fn(&Entry<K>) -> Change,
) -> Vec<(Change, &'a Entry<K>)> {
    let keys = |list: &'a [Entry<K>]| list.iter().map(|e| &e.key).collect::<BTreeSet<&K>>();
    let (now_keys, before_keys, known_keys) = (keys(now), keys(before), keys(known));
    let mut changes: Vec<(Change, &Entry<K>)> = now
        .iter()
        .map(|entry| {
            let change = if before_keys.contains(&entry.key) {
                Change::Ongoing
            } else if known_keys.contains(&entry.key) {
                Change::Known
            } else {
                Change::New
            };
            (change, entry)
        })
        .collect();
    changes.extend(before.iter().filter(|entry| !now_keys.contains(&entry.key)).map(|entry| (recheck(entry), entry)));
    changes
}

/// A failure found before: gone when its file's run under its policy at its seed no longer
/// fails on it.
fn recheck_failure(harness: Result<&Harness, String>, entry: &Entry<FailureKey>) -> Change {
    let harness = match harness {
        Ok(harness) => harness,
        Err(why) => return Change::Unchecked(why),
    };
    let FailureKey { file, policy, what } = &entry.key;
    let scenario = match Scenario::load(file) {
        Ok(scenario) => scenario,
        Err(error) => return Change::Unchecked(format!("{error}")),
    };
    let Some(run) = scenario.run_of(policy) else {
        return Change::Unchecked(format!("{} declares no policy `{policy}` now", shown(file)));
    };
    if let Some(skip) = harness.skip(&scenario, policy) {
        return Change::Unchecked(format!("skipped now: {skip}"));
    }
    let outcome = harness.run(&scenario, run, entry.seed.unwrap_or(0));
    let fails: BTreeSet<What> = outcome.failures.iter().map(|f| What::of(f)).collect();
    if fails.contains(what) {
        Change::Undrawn
    } else {
        Change::Gone
    }
}

/// A finding found before: gone when its scenario file (for one on the uncut workload, the
/// workload) no longer trips its oracle at its seed.
fn recheck_finding(harness: Result<&Harness, String>, entry: &Entry<FindingKey>) -> Change {
    let harness = match harness {
        Ok(harness) => harness,
        Err(why) => return Change::Unchecked(why),
    };
    let FindingKey { workload, policy, oracle, cuts } = &entry.key;
    let (file, uncut) = match (&entry.shrunk, cuts.is_empty()) {
        (Some(shrunk), _) => (shrunk, false),
        (None, true) => (workload, true),
        (None, false) => {
            return Change::Unchecked("no scenario file of it was kept (write findings with --out)".into())
        }
    };
    let scenario = match Scenario::load(file) {
        Ok(scenario) => scenario,
        Err(error) => return Change::Unchecked(format!("{error}")),
    };
    let scenario = if uncut { explore::workload(&scenario, false) } else { scenario };
    if let Some(skip) = harness.skip(&scenario, policy) {
        return Change::Unchecked(format!("skipped now: {skip}"));
    }
    let outcome = harness.run(&scenario, &explore::bare_run(policy), entry.seed.unwrap_or(0));
    if explore::fired(&outcome).contains(oracle) {
        Change::Undrawn
    } else {
        Change::Gone
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(key: &str, seed: u64) -> Entry<String> {
        Entry { key: key.to_string(), seed: Some(seed), shrunk: None, note: None, line: 3 }
    }

    #[test]
    fn shards_merge_into_each_key_once_at_its_lowest_seed() {
        let one = [entry("a", 7), entry("b", 2)];
        let two = [entry("a", 3), Entry { note: Some("kept".into()), ..entry("b", 9) }];
        let merged = merge_list([one.as_slice(), two.as_slice()].into_iter());
        assert_eq!(merged.len(), 2);
        assert_eq!((merged[0].key.as_str(), merged[0].seed), ("a", Some(3)));
        assert_eq!((merged[1].key.as_str(), merged[1].seed, merged[1].note.as_deref()), ("b", Some(2), Some("kept")));
        assert!(merged.iter().all(|e| e.line == 0), "a merged entry is read from no line");
    }

    #[test]
    fn each_entry_is_new_ongoing_known_or_rechecked() {
        let now = [entry("found-before", 0), entry("listed", 0), entry("fresh", 0)];
        let before = [entry("found-before", 1), entry("fixed", 4), entry("undrawn", 5)];
        let known = [entry("listed", 0)];
        let recheck = |e: &Entry<String>| if e.key == "fixed" { Change::Gone } else { Change::Undrawn };
        let changes: Vec<(Change, &str)> =
            compare(&now, &before, &known, recheck).into_iter().map(|(c, e)| (c, e.key.as_str())).collect();
        assert_eq!(
            changes,
            vec![
                (Change::Ongoing, "found-before"),
                (Change::Known, "listed"),
                (Change::New, "fresh"),
                (Change::Gone, "fixed"),
                (Change::Undrawn, "undrawn"),
            ]
        );
    }

    #[test]
    fn the_bisect_script_builds_the_binary_that_printed_the_repro() {
        assert_eq!(bisect_env("rig"), "");
        assert_eq!(bisect_env("/w/target/release/rig"), "");
        assert_eq!(bisect_env("/w/target/debug/naive-harness"), "RIG_BIN=naive-harness RIG_PROFILE=dev ");
    }
}
