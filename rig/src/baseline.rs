//! A baseline: the failures and findings a team already knows of, so that a run says only what
//! changed. A team adopting the rig with a harness that is not yet clean lists what fails today
//! (`--write-baseline FILE`), and from then on `--baseline FILE` passes while nothing but those
//! fails: an unlisted failure is a regression, and a listed one that passes now makes the file
//! stale (it must be taken out, so the baseline only ever shrinks by a decision). Findings of
//! `sweep` and `explore` are new, still there or gone; a gone finding is only news (what an
//! exploration draws may change between versions) unless the command is `--strict`.
//!
//! The file is TOML, one entry per line, sorted, paths relative to the file's own folder, so that
//! it reads and diffs well and means the same on every machine:
//!
//! ```toml
//! harness = "naive"
//!
//! failures = [
//!   { file = "scenarios/smoke/healthy-turn.toml", policy = "reference", oracle = "liveness", seed = 0 },
//!   { file = "scenarios/smoke/healthy-turn.toml", policy = "reference", expectation = "state harness_turn/s1", seed = 0 },
//! ]
//!
//! sweep = [
//!   { workload = "scenarios/workloads/multi-round.toml", policy = "reference", oracle = "ledger", cuts = ["lost-ack @ call ticket::create[action_id=t1:1:0]"], seed = 0 },
//! ]
//!
//! explore = []
//! ```
//!
//! A failure is keyed by its file, its policy and what failed: an oracle that fired (`oracle`), or
//! an expectation (`expectation`, what it checks without the values it found: `state
//! harness_turn/s1`, `rpc `turn``, `effects `ticket::create``). A finding is keyed by its
//! signature ([`crate::explore::Signature`]): the workload, the oracle, and each cut's kind and
//! class of site, without which of its like the site was, the cut's timing, or an id the harness
//! minted at random (`<id>`), so that the same bug found under other seeds is the same entry; an
//! oracle the uncut workload already trips has no cuts. `seed` (the lowest seed that showed it), `shrunk`
//! (a finding's scenario file, when written) and `note` are not part of the key: a note is kept
//! when the file is written again.

use crate::oracle::Oracle;
use crate::run::RunOutcome;
use crate::suggest::did_you_mean;
use serde::Deserialize;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::{Component, Path, PathBuf};

/// What a failing run failed on: an oracle that fired, or an expectation that did not hold
/// (named by what it checks, not by the values it found, which a fix or another seed changes).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum What {
    Oracle(String),
    Expectation(String),
}

impl What {
    /// What one of a run's failure lines ([`RunOutcome::failures`]) is about: `oracle `X` fired:
    /// ...` is the oracle; any other line is named by its text up to its first `: ` (outside
    /// brackets and backticks), without a trailing `at N ms`: `state harness_turn/s1`,
    /// `rpc `turn``, `events [kind=call function=ticket::create]`, `model script`, `step 2`.
    pub fn of(failure: &str) -> What {
        let line = failure.lines().next().unwrap_or_default().trim();
        if let Some((name, rest)) = line.strip_prefix("oracle `").and_then(|rest| rest.split_once('`')) {
            if rest.starts_with(" fired") {
                return What::Oracle(name.to_string());
            }
        }
        let mut head = head_of(line);
        // `events [...] at 1200 ms`: when it happened is not what it is.
        if let Some((before, after)) = head.rsplit_once(" at ") {
            if after.strip_suffix(" ms").is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit())) {
                head = before;
            }
        }
        What::Expectation(head.to_string())
    }
}

/// `text` up to its first `: ` outside `[...]`, `(...)` and backticks.
fn head_of(text: &str) -> &str {
    let (mut depth, mut quoted) = (0i32, false);
    for (at, c) in text.char_indices() {
        match c {
            '`' => quoted = !quoted,
            '[' | '(' if !quoted => depth += 1,
            ']' | ')' if !quoted => depth -= 1,
            ':' if !quoted && depth <= 0 && text[at + 1..].starts_with(' ') => return &text[..at],
            _ => {}
        }
    }
    text
}

impl fmt::Display for What {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            What::Oracle(name) => write!(f, "oracle `{name}`"),
            What::Expectation(text) => write!(f, "{text}"),
        }
    }
}

/// A known failure: a scenario file (its absolute path), a policy and what failed.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct FailureKey {
    pub file: PathBuf,
    pub policy: String,
    pub what: What,
}

impl fmt::Display for FailureKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} [{}] {}", shown(&self.file), self.policy, self.what)
    }
}

/// A known finding: its signature (the workload's absolute path, the oracle, each cut's kind and
/// class of site, sorted) and the policy it was found under.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct FindingKey {
    pub workload: PathBuf,
    pub policy: String,
    pub oracle: String,
    pub cuts: Vec<String>,
}

impl FindingKey {
    /// The key of a sweep's or an exploration's finding.
    pub fn of(finding: &crate::explore::Finding) -> Self {
        let signature = finding.signature();
        Self {
            workload: absolute(Path::new(&signature.workload)),
            policy: finding.policy.clone(),
            oracle: signature.oracle,
            cuts: signature.cuts,
        }
    }

    /// An oracle the uncut workload already trips: a finding with no cuts.
    pub fn uncut(workload: &Path, policy: &str, oracle: &str) -> Self {
        Self { workload: absolute(workload), policy: policy.into(), oracle: oracle.into(), cuts: Vec::new() }
    }
}

impl fmt::Display for FindingKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.cuts.as_slice() {
            [] => write!(f, "`{}` on the uncut workload {} [{}]", self.oracle, shown(&self.workload), self.policy),
            cuts => {
                write!(f, "`{}` with {} on {} [{}]", self.oracle, cuts.join(" + "), shown(&self.workload), self.policy)
            }
        }
    }
}

/// One entry of a baseline: its key, and what is kept beside it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry<K> {
    pub key: K,
    /// The lowest seed that showed it (for a sweep, the sweep's seed).
    pub seed: Option<u64>,
    /// A finding's scenario file, where one was written (absolute).
    pub shrunk: Option<PathBuf>,
    /// The team's own words about it; kept when the file is written again.
    pub note: Option<String>,
    /// Its line in the file it was read from (0 for one made by a run).
    pub line: usize,
}

impl<K> Entry<K> {
    fn new(key: K, seed: Option<u64>) -> Self {
        Self { key, seed, shrunk: None, note: None, line: 0 }
    }
}

/// Which search a finding came from: each keeps a list of its own, since a sweep and an
/// exploration of one workload find different things.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Search {
    Sweep,
    Explore,
}

impl Search {
    pub fn name(self) -> &'static str {
        match self {
            Search::Sweep => "sweep",
            Search::Explore => "explore",
        }
    }
}

/// A baseline file, read or to be written.
#[derive(Debug, Clone)]
pub struct Baseline {
    /// The file, as it was named.
    pub path: PathBuf,
    /// The harness whose failures and findings it lists.
    pub harness: Option<String>,
    pub failures: Vec<Entry<FailureKey>>,
    pub sweep: Vec<Entry<FindingKey>>,
    pub explore: Vec<Entry<FindingKey>>,
}

/// A baseline that could not be read: where, and what was expected.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{path}{}: {message}", if *.line == 0 { String::new() } else { format!(":{line}:{column}") })]
pub struct BaselineError {
    pub path: String,
    pub line: usize,
    pub column: usize,
    pub message: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    harness: Option<String>,
    #[serde(default)]
    failures: Vec<toml::Spanned<RawFailure>>,
    #[serde(default)]
    sweep: Vec<toml::Spanned<RawFinding>>,
    #[serde(default)]
    explore: Vec<toml::Spanned<RawFinding>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFailure {
    file: String,
    policy: String,
    oracle: Option<toml::Spanned<String>>,
    expectation: Option<String>,
    seed: Option<u64>,
    note: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFinding {
    workload: String,
    policy: String,
    oracle: toml::Spanned<String>,
    #[serde(default)]
    cuts: Vec<String>,
    seed: Option<u64>,
    shrunk: Option<String>,
    note: Option<String>,
}

/// What a finding's `oracle` may name: an oracle, or `limit` (a run that hit a limit).
fn finding_oracles() -> impl Iterator<Item = &'static str> {
    Oracle::ALL.iter().map(|o| o.name()).chain(["limit"])
}

impl Baseline {
    /// An empty baseline, to be written to `path`, for `harness`.
    pub fn empty(path: &Path, harness: &str) -> Self {
        Self {
            path: path.to_path_buf(),
            harness: Some(harness.into()),
            failures: Vec::new(),
            sweep: Vec::new(),
            explore: Vec::new(),
        }
    }

    /// Reads a baseline file.
    pub fn load(path: &Path) -> Result<Self, BaselineError> {
        let text = std::fs::read_to_string(path).map_err(|error| BaselineError {
            path: path.display().to_string(),
            line: 0,
            column: 0,
            message: format!("cannot read the baseline: {error}"),
        })?;
        Self::parse(path, &text)
    }

    /// The baseline `text`, read as the file at `path` (whose folder its paths are relative to).
    pub fn parse(path: &Path, text: &str) -> Result<Self, BaselineError> {
        let at = |span: std::ops::Range<usize>, message: String| {
            let before = &text[..span.start.min(text.len())];
            BaselineError {
                path: path.display().to_string(),
                line: before.matches('\n').count() + 1,
                column: before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1,
                message,
            }
        };
        let raw: RawFile = toml::from_str(text).map_err(|error| {
            let message = error.message().trim().to_string();
            let hint = match message.strip_prefix("unknown field `") {
                Some(rest) => {
                    let mut quoted = rest.split('`').step_by(2);
                    let wrong = quoted.next().unwrap_or_default();
                    did_you_mean(wrong, quoted)
                }
                None => String::new(),
            };
            at(error.span().unwrap_or(0..0), format!("{message}{hint}"))
        })?;
        let root = folder_of(path);
        let line_of = |span: &std::ops::Range<usize>| text[..span.start.min(text.len())].matches('\n').count() + 1;
        let mut baseline = Self {
            path: path.to_path_buf(),
            harness: raw.harness,
            failures: Vec::new(),
            sweep: Vec::new(),
            explore: Vec::new(),
        };
        let mut seen: BTreeMap<String, usize> = BTreeMap::new();
        let mut once = |key: String, span: &std::ops::Range<usize>| match seen.insert(key, line_of(span)) {
            Some(first) => Err(at(span.clone(), format!("this entry is listed already, on line {first}"))),
            None => Ok(()),
        };
        for spanned in raw.failures {
            let span = spanned.span();
            let entry = spanned.into_inner();
            let what = match (entry.oracle, entry.expectation) {
                (Some(oracle), None) => {
                    let name = oracle.get_ref();
                    if Oracle::from_name(name).is_none() {
                        let names = Oracle::ALL.iter().map(|o| o.name());
                        return Err(at(
                            oracle.span(),
                            format!("unknown oracle `{name}`{}", did_you_mean(name, names.clone())),
                        ));
                    }
                    What::Oracle(oracle.into_inner())
                }
                (None, Some(expectation)) => What::Expectation(expectation),
                (Some(_), Some(_)) => {
                    return Err(at(span, "a failure is an `oracle` or an `expectation`, not both".into()));
                }
                (None, None) => {
                    return Err(at(
                        span,
                        "a failure needs what failed: `oracle = \"NAME\"` or `expectation = \"...\"`".into(),
                    ));
                }
            };
            let key = FailureKey { file: resolve(&root, &entry.file), policy: entry.policy, what };
            once(format!("failure {key:?}"), &span)?;
            baseline.failures.push(Entry {
                key,
                seed: entry.seed,
                shrunk: None,
                note: entry.note,
                line: line_of(&span),
            });
        }
        for (search, list) in [(Search::Sweep, raw.sweep), (Search::Explore, raw.explore)] {
            for spanned in list {
                let span = spanned.span();
                let entry = spanned.into_inner();
                let oracle = entry.oracle.get_ref();
                if !finding_oracles().any(|name| name == oracle) {
                    return Err(at(
                        entry.oracle.span(),
                        format!("unknown oracle `{oracle}`{}", did_you_mean(oracle, finding_oracles())),
                    ));
                }
                let mut cuts = entry.cuts;
                cuts.sort();
                let key = FindingKey {
                    workload: resolve(&root, &entry.workload),
                    policy: entry.policy,
                    oracle: entry.oracle.into_inner(),
                    cuts,
                };
                once(format!("{} {key:?}", search.name()), &span)?;
                let listed = Entry {
                    key,
                    seed: entry.seed,
                    shrunk: entry.shrunk.map(|shrunk| resolve(&root, &shrunk)),
                    note: entry.note,
                    line: line_of(&span),
                };
                baseline.findings_mut(search).push(listed);
            }
        }
        Ok(baseline)
    }

    pub fn findings(&self, search: Search) -> &[Entry<FindingKey>] {
        match search {
            Search::Sweep => &self.sweep,
            Search::Explore => &self.explore,
        }
    }

    /// Whether this baseline lists `key` among the findings of `search`.
    pub fn lists_finding(&self, search: Search, key: &FindingKey) -> bool {
        self.findings(search).iter().any(|e| e.key == *key)
    }

    fn findings_mut(&mut self, search: Search) -> &mut Vec<Entry<FindingKey>> {
        match search {
            Search::Sweep => &mut self.sweep,
            Search::Explore => &mut self.explore,
        }
    }

    /// `path:LINE` of an entry read from this file.
    pub fn at<K>(&self, entry: &Entry<K>) -> String {
        format!("{}:{}", self.path.display(), entry.line)
    }

    /// The file's text: a header saying what it is, the harness, and the three lists, one entry a
    /// line, sorted, with paths relative to the file's folder.
    pub fn render(&self) -> String {
        let root = folder_of(&self.path);
        let mut text = String::from(HEADER);
        if let Some(harness) = &self.harness {
            text.push_str(&format!("harness = {}\n", quote(harness)));
        }
        // Sorted as the lines read, so that `sort` agrees and a diff shows entries, not moves.
        let mut lines: Vec<String> = self
            .failures
            .iter()
            .map(|entry| {
                let FailureKey { file, policy, what } = &entry.key;
                let what = match what {
                    What::Oracle(name) => format!("oracle = {}", quote(name)),
                    What::Expectation(text) => format!("expectation = {}", quote(text)),
                };
                let mut fields = vec![
                    format!("file = {}", quote(&relative(&root, file))),
                    format!("policy = {}", quote(policy)),
                    what,
                ];
                fields.extend(extras(entry, &root));
                format!("{{ {} }}", fields.join(", "))
            })
            .collect();
        lines.sort();
        push_list(&mut text, "failures", &lines);
        for search in [Search::Sweep, Search::Explore] {
            let mut lines: Vec<String> = self
                .findings(search)
                .iter()
                .map(|entry| {
                    let FindingKey { workload, policy, oracle, cuts } = &entry.key;
                    let cuts: Vec<String> = cuts.iter().map(|c| quote(c)).collect();
                    let mut fields = vec![
                        format!("workload = {}", quote(&relative(&root, workload))),
                        format!("policy = {}", quote(policy)),
                        format!("oracle = {}", quote(oracle)),
                        format!("cuts = [{}]", cuts.join(", ")),
                    ];
                    fields.extend(extras(entry, &root));
                    format!("{{ {} }}", fields.join(", "))
                })
                .collect();
            lines.sort();
            push_list(&mut text, search.name(), &lines);
        }
        text
    }

    /// Writes [`Baseline::render`] to its path, making its folder if need be; atomically (a
    /// file beside it, renamed over it), so a reader never sees half a file and a command that
    /// dies leaves the old one.
    pub fn write(&self) -> std::io::Result<()> {
        if let Some(folder) = self.path.parent().filter(|f| !f.as_os_str().is_empty()) {
            std::fs::create_dir_all(folder)?;
        }
        let partial = self.path.with_extension("toml.partial");
        std::fs::write(&partial, self.render()).and_then(|()| std::fs::rename(&partial, &self.path)).inspect_err(|_| {
            let _ = std::fs::remove_file(&partial);
        })
    }
}

const HEADER: &str = "\
# Known failures and findings: what `--baseline` accepts as known (rig/docs/your-harness.md#a-baseline-of-known-failures).
# A run that fails only on what `failures` lists passes; an unlisted failure is a regression; a
# listed failure that passes now makes this file stale. Findings of sweep and explore are new,
# known or gone. Paths are relative to this file's folder. `--write-baseline` writes the file
# again, keeping each entry's `note`.
";

fn push_list(text: &mut String, name: &str, lines: &[String]) {
    if lines.is_empty() {
        text.push_str(&format!("\n{name} = []\n"));
        return;
    }
    text.push_str(&format!("\n{name} = [\n"));
    for line in lines {
        text.push_str(&format!("  {line},\n"));
    }
    text.push_str("]\n");
}

/// The fields of an entry beyond its key.
fn extras<K>(entry: &Entry<K>, root: &Path) -> Vec<String> {
    let mut fields = Vec::new();
    if let Some(seed) = entry.seed {
        fields.push(format!("seed = {seed}"));
    }
    if let Some(shrunk) = &entry.shrunk {
        fields.push(format!("shrunk = {}", quote(&relative(root, shrunk))));
    }
    if let Some(note) = &entry.note {
        fields.push(format!("note = {}", quote(note)));
    }
    fields
}

/// `text` as a TOML string.
fn quote(text: &str) -> String {
    toml::Value::String(text.to_string()).to_string()
}

/// The absolute folder a baseline's paths are relative to.
fn folder_of(path: &Path) -> PathBuf {
    let folder = path.parent().filter(|f| !f.as_os_str().is_empty()).unwrap_or(Path::new("."));
    absolute(folder)
}

/// A path of the file, relative to `root`, as an absolute path.
fn resolve(root: &Path, listed: &str) -> PathBuf {
    absolute(&root.join(listed))
}

/// `path` made absolute, through the real folders where it exists (so that a path given through
/// a symbolic link or with `..` is the same path), else lexically.
pub fn absolute(path: &Path) -> PathBuf {
    if let Ok(real) = path.canonicalize() {
        return real;
    }
    let whole = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    let mut normal = PathBuf::new();
    for part in whole.components() {
        match part {
            Component::CurDir => {}
            Component::ParentDir => {
                normal.pop();
            }
            other => normal.push(other),
        }
    }
    // The deepest folder of it that exists, through its real path.
    let mut existing = normal.clone();
    let mut rest = Vec::new();
    while !existing.exists() {
        match existing.file_name() {
            Some(name) => rest.push(name.to_os_string()),
            None => return normal,
        }
        if !existing.pop() {
            return normal;
        }
    }
    let mut real = existing.canonicalize().unwrap_or(existing);
    real.extend(rest.iter().rev());
    real
}

/// `path` relative to the folder `root` (both absolute), with `/` between its parts.
pub fn relative(root: &Path, path: &Path) -> String {
    let root: Vec<Component> = root.components().collect();
    let target: Vec<Component> = path.components().collect();
    let common = root.iter().zip(&target).take_while(|(a, b)| a == b).count();
    // Nothing in common but the file system's root: no relative path says more than the whole one.
    if common <= 1 {
        return path.display().to_string();
    }
    let mut parts: Vec<String> = vec!["..".to_string(); root.len() - common];
    parts.extend(target[common..].iter().map(|c| c.as_os_str().to_string_lossy().into_owned()));
    parts.join("/")
}

/// A path as a person at this terminal reads it: relative to the current folder when under it.
pub fn shown(path: &Path) -> String {
    let here = std::env::current_dir().ok().map(|d| absolute(&d));
    match here.and_then(|here| path.strip_prefix(&here).ok().map(Path::to_path_buf)) {
        Some(inside) if !inside.as_os_str().is_empty() => {
            inside.components().map(|c| c.as_os_str().to_string_lossy().into_owned()).collect::<Vec<_>>().join("/")
        }
        _ => path.display().to_string(),
    }
}

/// How often a failure or finding showed, and where first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    /// The lowest seed that showed it.
    pub seed: u64,
    /// How many runs (or, for an exploration, seeds) showed it.
    pub count: u64,
    /// The command that reruns its lowest seed.
    pub repro: String,
    /// A finding's scenario file, where one was written.
    pub shrunk: Option<PathBuf>,
}

impl Seen {
    fn add(&mut self, seed: u64, repro: impl FnOnce() -> String) {
        self.count += 1;
        if seed < self.seed {
            self.seed = seed;
            self.repro = repro();
        }
    }
}

/// What a command's runs failed on, for judging against a baseline and writing one: every run's
/// (file, policy) pair, the seeds of each listed entry that were run, and each failure with the
/// lowest seed that showed it.
#[derive(Debug, Default)]
pub struct Failures {
    /// The seeds listed entries name, per pair: whether they were run says whether an entry
    /// that did not show passes now.
    listed_seeds: BTreeMap<(PathBuf, String), BTreeSet<u64>>,
    /// Every pair with a run made, and which of its listed seeds were run.
    ran: BTreeMap<(PathBuf, String), BTreeSet<u64>>,
    pub failed: BTreeMap<FailureKey, Seen>,
    /// Absolute paths of the scenario files met, by the name the runs gave them.
    paths: BTreeMap<String, PathBuf>,
}

/// A run's failures judged against a baseline.
#[derive(Debug, Default)]
pub struct FailureVerdict {
    /// Listed, and still failing.
    pub known: Vec<(FailureKey, Seen)>,
    /// Not listed: regressions.
    pub new: Vec<(FailureKey, Seen)>,
    /// Listed, and the run that showed it passes it now: the baseline is stale. With the seed it
    /// was run at, when the entry names one.
    pub stale: Vec<Entry<FailureKey>>,
    /// Listed, but not checked: its file and policy were not run, or not at its seed.
    pub unchecked: usize,
}

impl FailureVerdict {
    /// Whether the runs pass the baseline: nothing new, nothing stale.
    pub fn passed(&self) -> bool {
        self.new.is_empty() && self.stale.is_empty()
    }
}

impl Failures {
    /// A ledger that can tell a listed entry's seed from the others, for each of `baselines`.
    pub fn new<'a>(baselines: impl IntoIterator<Item = &'a Baseline>) -> Self {
        let mut ledger = Self::default();
        for baseline in baselines {
            for entry in &baseline.failures {
                let pair = (entry.key.file.clone(), entry.key.policy.clone());
                let seeds = ledger.listed_seeds.entry(pair).or_default();
                seeds.extend(entry.seed);
            }
        }
        ledger
    }

    fn path(&mut self, scenario: &str) -> PathBuf {
        self.paths.entry(scenario.to_string()).or_insert_with(|| absolute(Path::new(scenario))).clone()
    }

    /// One run, made.
    pub fn record(&mut self, outcome: &RunOutcome) {
        let pair = (self.path(&outcome.scenario), outcome.policy.clone());
        let listed = self.listed_seeds.get(&pair).is_some_and(|seeds| seeds.contains(&outcome.seed));
        let ran = self.ran.entry(pair.clone()).or_default();
        if listed {
            ran.insert(outcome.seed);
        }
        if outcome.passed {
            return;
        }
        let whats: BTreeSet<What> = outcome.failures.iter().map(|f| What::of(f)).collect();
        for what in whats {
            let key = FailureKey { file: pair.0.clone(), policy: pair.1.clone(), what };
            match self.failed.get_mut(&key) {
                Some(seen) => seen.add(outcome.seed, || outcome.repro()),
                None => {
                    let seen = Seen { seed: outcome.seed, count: 1, repro: outcome.repro(), shrunk: None };
                    self.failed.insert(key, seen);
                }
            }
        }
    }

    /// What a failing run failed on that `baseline` does not list (nothing, for a known
    /// failure).
    pub fn unlisted(outcome: &RunOutcome, baseline: &Baseline) -> Vec<What> {
        let file = absolute(Path::new(&outcome.scenario));
        let whats: BTreeSet<What> = outcome.failures.iter().map(|f| What::of(f)).collect();
        whats
            .into_iter()
            .filter(|what| {
                !baseline
                    .failures
                    .iter()
                    .any(|e| e.key.file == file && e.key.policy == outcome.policy && e.key.what == *what)
            })
            .collect()
    }

    /// Whether everything the runs of `scenario` under `policy` failed on is listed in
    /// `baseline`: a known failure.
    pub fn all_listed(&self, scenario: &str, policy: &str, baseline: &Baseline) -> bool {
        let file = absolute(Path::new(scenario));
        let listed: BTreeSet<&FailureKey> = baseline.failures.iter().map(|e| &e.key).collect();
        self.failed.keys().filter(|k| k.file == file && k.policy == policy).all(|k| listed.contains(k))
    }

    /// Whether a listed entry was contradicted: its pair was run (at its seed, if it names one)
    /// and it did not show.
    fn stale(&self, entry: &Entry<FailureKey>) -> Option<bool> {
        if self.failed.contains_key(&entry.key) {
            return Some(false);
        }
        let ran = self.ran.get(&(entry.key.file.clone(), entry.key.policy.clone()))?;
        match entry.seed {
            Some(seed) if !ran.contains(&seed) => None,
            _ => Some(true),
        }
    }

    /// The runs judged against `baseline`.
    pub fn judge(&self, baseline: &Baseline) -> FailureVerdict {
        let mut verdict = FailureVerdict::default();
        let listed: BTreeSet<&FailureKey> = baseline.failures.iter().map(|e| &e.key).collect();
        for (key, seen) in &self.failed {
            let into = if listed.contains(key) { &mut verdict.known } else { &mut verdict.new };
            into.push((key.clone(), seen.clone()));
        }
        for entry in &baseline.failures {
            match self.stale(entry) {
                Some(true) => verdict.stale.push(entry.clone()),
                Some(false) => {}
                None => verdict.unchecked += 1,
            }
        }
        verdict
    }

    /// The baseline `base` brought up to date with these runs: its entries these runs
    /// contradicted left out, the ones they could not check kept, every failure they showed
    /// listed (with the lowest seed that showed it, and the entry's note if it had one).
    pub fn written(&self, base: &Baseline) -> Baseline {
        let mut written = base.clone();
        let notes: BTreeMap<&FailureKey, &Option<String>> = base.failures.iter().map(|e| (&e.key, &e.note)).collect();
        let mut failures: Vec<Entry<FailureKey>> =
            base.failures.iter().filter(|e| self.stale(e).is_none()).cloned().collect();
        for (key, seen) in &self.failed {
            let mut entry = Entry::new(key.clone(), Some(seen.seed));
            entry.note = notes.get(key).and_then(|note| (*note).clone());
            failures.push(entry);
        }
        written.failures = failures;
        written
    }
}

/// The findings of a sweep or an exploration, for judging against a baseline and writing one:
/// every (workload, policy) searched, and each finding with the first seed that showed it.
#[derive(Debug)]
pub struct Findings {
    pub search: Search,
    /// Every (workload, policy) searched: a listed finding of one of them that was not found is
    /// gone.
    searched: BTreeSet<(PathBuf, String)>,
    pub found: BTreeMap<FindingKey, Seen>,
}

/// A search's findings judged against a baseline.
#[derive(Debug, Default)]
pub struct FindingVerdict {
    /// Listed, and found again.
    pub known: Vec<FindingKey>,
    /// Not listed.
    pub new: Vec<FindingKey>,
    /// Listed for a workload searched, and not found this time.
    pub gone: Vec<Entry<FindingKey>>,
    /// Listed for workloads or policies not searched.
    pub unchecked: usize,
}

impl Findings {
    pub fn new(search: Search) -> Self {
        Self { search, searched: BTreeSet::new(), found: BTreeMap::new() }
    }

    /// A workload searched under `policy`.
    pub fn searched(&mut self, workload: &Path, policy: &str) {
        self.searched.insert((absolute(workload), policy.to_string()));
    }

    /// A finding, found at `seed`.
    pub fn record(&mut self, key: FindingKey, seed: u64, repro: impl FnOnce() -> String, shrunk: Option<PathBuf>) {
        match self.found.get_mut(&key) {
            Some(seen) => {
                let before = seen.seed;
                seen.add(seed, repro);
                if seen.seed != before || seen.shrunk.is_none() {
                    seen.shrunk = shrunk.map(|p| absolute(&p)).or(seen.shrunk.take());
                }
            }
            None => {
                let seen = Seen { seed, count: 1, repro: repro(), shrunk: shrunk.map(|p| absolute(&p)) };
                self.found.insert(key, seen);
            }
        }
    }

    fn in_scope(&self, key: &FindingKey) -> bool {
        self.searched.contains(&(key.workload.clone(), key.policy.clone()))
    }

    pub fn judge(&self, baseline: &Baseline) -> FindingVerdict {
        let mut verdict = FindingVerdict::default();
        let listed: BTreeSet<&FindingKey> = baseline.findings(self.search).iter().map(|e| &e.key).collect();
        for key in self.found.keys() {
            let into = if listed.contains(key) { &mut verdict.known } else { &mut verdict.new };
            into.push(key.clone());
        }
        for entry in baseline.findings(self.search) {
            if self.found.contains_key(&entry.key) {
                continue;
            }
            if self.in_scope(&entry.key) {
                verdict.gone.push(entry.clone());
            } else {
                verdict.unchecked += 1;
            }
        }
        verdict
    }

    /// `base` brought up to date: this search's entries for the workloads searched replaced by
    /// what was found (each with its note kept), everything else as it was.
    pub fn written(&self, base: &Baseline) -> Baseline {
        let mut written = base.clone();
        let notes: BTreeMap<&FindingKey, &Option<String>> =
            base.findings(self.search).iter().map(|e| (&e.key, &e.note)).collect();
        let mut list: Vec<Entry<FindingKey>> =
            base.findings(self.search).iter().filter(|e| !self.in_scope(&e.key)).cloned().collect();
        for (key, seen) in &self.found {
            let mut entry = Entry::new(key.clone(), Some(seen.seed));
            entry.shrunk = seen.shrunk.clone();
            entry.note = notes.get(key).and_then(|note| (*note).clone());
            list.push(entry);
        }
        *written.findings_mut(self.search) = list;
        written
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failure_is_named_by_what_it_checks_not_by_what_it_found() {
        let oracle = What::of("oracle `liveness` fired: turn t1 of s1 is still `running` at the end");
        assert_eq!(oracle, What::Oracle("liveness".into()));
        let cases = [
            ("state harness_turn/s1: status expected = failed, found running", "state harness_turn/s1"),
            ("rpc `turn`: result.status = done (outcome {\"outcome\":\"ok\"})", "rpc `turn`"),
            ("effects `ticket::create`: expected 1, the ledger shows 2", "effects `ticket::create`"),
            ("events [kind=call, function=state::set]: expected 2, found 3", "events [kind=call, function=state::set]"),
            ("events [kind=rpc] at 1200 ms: 30 ms after [kind=call] at 1170 ms, expected >= 50", "events [kind=rpc]"),
            ("model script: generation 3 at 150 ms: no reply left", "model script"),
            ("limit reached: 10000 steps (seed 7)", "limit reached"),
            ("step 2: `turn` did not answer within 5000 ms", "step 2"),
            (
                "oracle `budget` was expected to fire under this policy, and did not",
                "oracle `budget` was expected to fire under this policy, and did not",
            ),
            ("state a/b: `value.note: x` differs", "state a/b"),
        ];
        for (line, what) in cases {
            assert_eq!(What::of(line), What::Expectation(what.into()), "{line}");
        }
        assert_eq!(
            What::of("transcript s1 entry #2: role = user\nmore"),
            What::Expectation("transcript s1 entry #2".into())
        );
    }

    fn folder(name: &str) -> PathBuf {
        let folder = std::env::temp_dir().join(format!("rig-baseline-unit-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&folder);
        std::fs::create_dir_all(folder.join("scenarios/deep")).unwrap();
        absolute(&folder)
    }

    #[test]
    fn paths_are_relative_to_the_file_and_the_same_from_any_folder() {
        let root = folder("paths");
        let file = root.join("scenarios/deep/x.toml");
        std::fs::write(&file, "").unwrap();
        assert_eq!(relative(&root, &file), "scenarios/deep/x.toml");
        assert_eq!(relative(&root.join("scenarios/other"), &file), "../deep/x.toml");
        assert_eq!(absolute(&root.join("scenarios/./deep/../deep/x.toml")), file);
        assert_eq!(absolute(&root.join("scenarios/gone/../y.toml")), root.join("scenarios/y.toml"), "missing: lexical");

        let text = "harness = \"naive\"\nfailures = [\n  { file = \"scenarios/deep/x.toml\", policy = \"reference\", oracle = \"liveness\", seed = 3 },\n]\n";
        let baseline = Baseline::parse(&root.join("b.toml"), text).unwrap();
        assert_eq!(baseline.failures[0].key.file, file);
        assert_eq!(baseline.failures[0].line, 3);
        // Rendered to a file elsewhere, the same entry is written relative to that file.
        let mut moved = baseline.clone();
        moved.path = root.join("scenarios/other/b.toml");
        assert!(moved.render().contains("file = \"../deep/x.toml\""), "{}", moved.render());
        let again = Baseline::parse(&moved.path, &moved.render()).unwrap();
        assert_eq!(again.failures, vec![Entry { line: 9, ..baseline.failures[0].clone() }]);
    }

    #[test]
    fn a_written_baseline_reads_back_the_same_sorted_one_entry_a_line() {
        let root = folder("round-trip");
        let path = root.join("b.toml");
        let mut baseline = Baseline::empty(&path, "naive");
        let key = |file: &str, what: What| FailureKey { file: root.join(file), policy: "reference".into(), what };
        baseline.failures.push(Entry::new(key("z.toml", What::Oracle("ledger".into())), Some(4)));
        baseline.failures.push(Entry {
            note: Some("ticket \"12\"".into()),
            ..Entry::new(key("a.toml", What::Expectation("rpc `turn`".into())), Some(0))
        });
        baseline.explore.push(Entry {
            shrunk: Some(root.join("found/w--x.toml")),
            ..Entry::new(
                FindingKey {
                    workload: root.join("w.toml"),
                    policy: "reference".into(),
                    oracle: "stranded".into(),
                    cuts: vec!["crash-engine @ call state::set[scope=harness_turn]".into()],
                },
                Some(9),
            )
        });
        let text = baseline.render();
        let a = text.find("a.toml").unwrap();
        let z = text.find("z.toml").unwrap();
        assert!(a < z, "sorted:\n{text}");
        assert!(text.contains("\nsweep = []\n"), "{text}");
        assert!(text.contains(
            "  { workload = \"w.toml\", policy = \"reference\", oracle = \"stranded\", cuts = [\"crash-engine @ call state::set[scope=harness_turn]\"], seed = 9, shrunk = \"found/w--x.toml\" },\n"
        ), "{text}");
        let read = Baseline::parse(&path, &text).unwrap();
        assert_eq!(read.render(), text);
        assert_eq!(read.failures[0].note.as_deref(), Some("ticket \"12\""));
        assert_eq!(read.explore[0].shrunk, Some(root.join("found/w--x.toml")));
    }

    #[test]
    fn a_malformed_baseline_says_where_and_what_was_expected() {
        let path = Path::new("known.toml");
        let error = |text: &str| Baseline::parse(path, text).unwrap_err().to_string();
        assert_eq!(
            error("failures = [\n  { file = \"a.toml\", policy = \"reference\", oracle = \"livenes\" },\n]\n"),
            "known.toml:2:53: unknown oracle `livenes` (did you mean `liveness`?)"
        );
        let missing = error("failures = [\n  { file = \"a.toml\", policy = \"reference\" },\n]\n");
        assert!(missing.starts_with("known.toml:2:3: a failure needs what failed"), "{missing}");
        let unknown = error("failures = [{ file = \"a.toml\", policy = \"p\", oracle = \"ledger\", seeds = 3 }]\n");
        assert!(unknown.starts_with("known.toml:1:") && unknown.contains("unknown field `seeds`"), "{unknown}");
        assert!(unknown.contains("did you mean `seed`?"), "{unknown}");
        let twice = error(
            "explore = [\n  { workload = \"w.toml\", policy = \"p\", oracle = \"ledger\" },\n  { workload = \"w.toml\", policy = \"p\", oracle = \"ledger\", cuts = [] },\n]\n",
        );
        assert_eq!(twice, "known.toml:3:3: this entry is listed already, on line 2");
        let syntax = error("failures = [\n  { file = \"a.toml\", policy = }\n]\n");
        assert!(syntax.starts_with("known.toml:2:"), "{syntax}");
        let both = error("failures = [{ file = \"a\", policy = \"p\", oracle = \"ledger\", expectation = \"x\" }]");
        assert!(both.contains("not both"), "{both}");
    }
}
