//! Finding what nobody scripted: `sweep` tries every cut at every place one uncut run offers
//! (and bounded pairs), `explore` draws a random fault mix per seed from the same space and
//! shrinks what fails; every finding comes back as a minimal scenario file.
//!
//! Runs are judged by the always-on oracles only: a scenario's own expectations count calls and
//! effects of its scripted story, which an injected cut changes on purpose. An oracle the uncut
//! run already trips is not a finding of any cut. A cut that never fired left the run uncut:
//! its site was not reached, which is no finding either.
//!
//! These are library entry points too, for any harness: [`sweep`] (or [`plan`], [`run_job`] and
//! [`report`] to spread the runs over threads as `rig sweep` does) and [`explore`], which shrinks
//! each failure it finds (to the cuts that fired, then one cut and one step at a time) into
//! [`Exploration::shrunk`]. They are the command line's searches: a workload whose story uses
//! what the harness does not declare is skipped with the same reason ([`Runs::skip`]), a cut
//! that makes an oracle the uncut run already trips fire about something else is a finding
//! ([`fired_beyond`]), and [`SweepTally`] and [`ExploreTally`] count and say what many of them
//! came to, as the summary lines of `rig sweep` and `rig explore` do. A [`Finding`]'s `scenario_file` is a scenario file of its own; the
//! CLI adds the line that replays it with its binary. They make their runs through [`Runs`]: any
//! harness factory in the simulation, or a harness process live (`rig sweep --live`).
//!
//! ```
//! use rig::explore::{self, SweepOptions};
//! use std::path::Path;
//!
//! let harness = rig::reference(); // your own factory here
//! let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scenarios/smoke/healthy-turn.toml");
//! let workload = rig::Scenario::load(&file).unwrap();
//!
//! // Every cut at every place the uncut run offers. (This workload's turn is invoked directly,
//! // not through a queue, so a dropped invocation leaves it running: `liveness` findings.)
//! // `Err` says why a harness cannot run a workload (what its story uses that the harness does
//! // not declare): it is skipped, as `rig sweep` skips it.
//! let swept = explore::sweep(&harness, &workload, &SweepOptions::default()).expect("the reference serves it");
//! assert!(!swept.runs.is_empty());
//! for finding in &swept.findings {
//!     println!("`{}` with {} cut(s): {}", finding.oracle, finding.placements.len(), finding.file_name);
//! }
//!
//! // One seed's random fault mix; a failure comes back shrunk, as a scenario file.
//! let exploration = explore::explore(&harness, &workload, "reference", 7, false).expect("the reference serves it");
//! if let Some(finding) = &exploration.shrunk {
//!     println!("{} -> {}\n{}", finding.oracle, finding.file_name, finding.scenario_file);
//! }
//! ```

pub mod bench;
mod file;
mod guided;
mod space;
mod state;
mod swarm;
mod sweep;

pub use guided::{opening_order, Campaign, Trial, Tried, GUIDED_BATCH};
pub use space::follow_ups;
pub use space::{cut_space, unminted, Kind, Placement, Site, SpaceOptions};
pub use state::{Abstraction, Coverage, Novelty, Trajectory, CURVE_STRETCH};
pub use swarm::{explore, Exploration, ExploreTally, ExploredFinding, Unit};
pub use sweep::{
    plan, plan_pairs, report, run_job, sweep, Certificate, Pairs, SweepOptions, SweepPlan, SweepReport, SweepRun,
    SweepTally, Verdict, PAIRS_DEFAULT,
};

use crate::capability::Skip;
use crate::harness::HarnessFactory;
use crate::run::{run_unchecked, RunOutcome};
use crate::scenario::{PolicyRun, Scenario};
use std::collections::BTreeSet;
use std::sync::Arc;

/// What makes the runs of a sweep or an exploration: a harness factory, in the simulation (what
/// every `Arc<dyn HarnessFactory>` is), or a harness process run live.
pub trait Runs: Sync {
    /// The harness's name, for what found a finding.
    fn name(&self) -> &str;
    /// One run of `scenario` under `run`'s policy, made whether or not the harness serves what
    /// it needs: [`sweep`], [`plan`] and [`explore`] ask [`Runs::skip`] first.
    fn run(&self, scenario: &Scenario, run: &PolicyRun, seed: u64) -> RunOutcome;
    /// Why `workload` (a scenario's workload, as a sweep or an exploration runs it: its
    /// scripted cuts removed unless kept) cannot be run under `policy`: what its story uses that
    /// the harness does not declare, or what this way of running cannot do. The same skip as
    /// every command's and `scenario_tests!`'s.
    fn skip(&self, workload: &Scenario, policy: &str) -> Option<Skip>;
    /// `workload` as this harness runs it: a queue's dead letters wired to a handler only for a
    /// harness that serves `dead-letters` ([`Scenario::wired_for`]). What the world lets a
    /// harness survive (the outage bound) is read from it, not from the file.
    fn wired<'s>(&self, workload: &'s Scenario) -> std::borrow::Cow<'s, Scenario> {
        std::borrow::Cow::Borrowed(workload)
    }
    /// Why `scenario` cannot be run this way (a cut only the simulation can make, live); such
    /// placements are left out of the cut space.
    fn cannot(&self, _scenario: &Scenario) -> Option<Vec<String>> {
        None
    }
    /// What a finding made under a known-bad policy is checked against, under `reference`.
    fn reference(&self) -> &dyn Runs;
    /// Where the harness keeps its records, as the abstract state of a run reads them
    /// ([`Abstraction`]); the reference harness's unless said otherwise.
    fn layout(&self) -> crate::RecordLayout {
        crate::RecordLayout::default()
    }
}

impl Runs for Arc<dyn HarnessFactory> {
    fn name(&self) -> &str {
        self.as_ref().name()
    }

    fn run(&self, scenario: &Scenario, run: &PolicyRun, seed: u64) -> RunOutcome {
        run_unchecked(self, scenario, run, seed)
    }

    fn skip(&self, workload: &Scenario, policy: &str) -> Option<Skip> {
        workload.skip_for(self.as_ref(), policy)
    }

    fn wired<'s>(&self, workload: &'s Scenario) -> std::borrow::Cow<'s, Scenario> {
        workload.wired_for(&self.as_ref().capabilities())
    }

    fn reference(&self) -> &dyn Runs {
        self
    }

    fn layout(&self) -> crate::RecordLayout {
        self.as_ref().layout()
    }
}

/// What the workload of `scenario` (as a sweep or exploration runs it, its scripted cuts kept or
/// not) needs of a harness, and whether `harness` serves it: the line `rig sweep --list` and
/// `rig explore --list` print, and whether the workload would be swept.
pub fn needs_line(harness: &dyn Runs, scenario: &Scenario, policy: &str, keep_cuts: bool) -> (String, bool) {
    let workload = workload(scenario, keep_cuts);
    let needs: Vec<String> = workload
        .requirements(policy, false)
        .iter()
        .map(|(capability, why)| match capability {
            crate::Capability::Turns => capability.to_string(),
            _ => format!("{capability} ({why})"),
        })
        .collect();
    let needs = if needs.is_empty() { "nothing".to_string() } else { needs.join(", ") };
    let path = scenario.path.display();
    match harness.skip(&workload, policy) {
        None => (format!("{path} [{policy}]: needs {needs}; harness `{}` serves it", harness.name()), true),
        Some(skip) => {
            let mut why = Vec::new();
            if !skip.missing.is_empty() {
                why.push(format!("harness `{}` does not declare {}", skip.harness, skip.capabilities().join(", ")));
            }
            if !skip.cannot.is_empty() {
                why.push(format!("cannot run live: {}", skip.cannot.join("; ")));
            }
            (format!("{path} [{policy}]: needs {needs}; skipped: {}", why.join("; ")), false)
        }
    }
}

/// The cut space of `workload` that `harness` can run.
fn runnable_space(
    harness: &dyn Runs,
    workload: &Scenario,
    baseline: &RunOutcome,
    options: &SpaceOptions,
) -> Vec<Placement> {
    let mut space = cut_space(&harness.wired(workload), baseline, options);
    space.retain(|placement| {
        let mut variant = workload.clone();
        placement.apply(&mut variant);
        harness.cannot(&variant).is_none()
    });
    space
}

/// Something the rig found: an oracle a placement of cuts makes fire, as a scenario file.
#[derive(Debug, Clone)]
pub struct Finding {
    /// The oracle that fired (or `limit` for a run that hit a limit).
    pub oracle: String,
    pub placements: Vec<Placement>,
    pub policy: String,
    pub seed: u64,
    /// The path of the scenario whose workload it was found in.
    pub workload: String,
    /// The scenario file that reproduces it.
    pub scenario_file: String,
    /// A file name for it: the workload's stem, the oracle and the placements' classes.
    pub file_name: String,
    /// For a finding under a known-bad policy: the oracles the same cuts make fire under the
    /// reference harness (none, if the file really separates the two).
    pub reference_fired: Option<BTreeSet<String>>,
    /// The other runs that came to the same [`Signature`], as a person names them: the other
    /// placements of a sweep (`crash-service @ call state::set[...]#3`), or `seed 9` of an
    /// exploration. This finding is the first of them.
    pub also: Vec<String>,
    /// The file's header comment: what found it, and what fires with which cuts.
    header: Vec<String>,
    /// The file from `about` on.
    body: String,
}

/// What makes two findings one finding: the workload, the oracle, and each cut's kind and class
/// of site, without which of its like the site was, the cut's timing, or an id the harness minted
/// at random ([`unminted`]). Many seeds of an exploration shrink to one signature; a sweep keeps
/// one finding per signature.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Signature {
    pub workload: String,
    pub oracle: String,
    /// Each cut's [`Placement::signature_class`], sorted: a set of cuts, whatever order they
    /// were drawn in, with the ids the harness minted at random left out.
    pub cuts: Vec<String>,
}

impl Signature {
    pub fn of(workload: &str, oracle: &str, placements: &[Placement]) -> Self {
        let mut cuts: Vec<String> = placements.iter().map(Placement::signature_class).collect();
        cuts.sort();
        Self { workload: workload.to_string(), oracle: oracle.to_string(), cuts }
    }
}

impl std::fmt::Display for Signature {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "`{}` with {}", self.oracle, self.cuts.join(" + "))
    }
}

/// The header line of a finding's file that counts the runs that came to it, after the count.
pub(crate) const ALSO_NOTE: &str = " runs in all came to the same finding (the same oracle, kinds and sites of cut)";
/// The header line of a finding's file that names them.
pub(crate) const ALSO_NOTE_OTHERS: &str = "The others: ";

/// How many other runs a finding's file and line name before they say how many more there are.
pub const ALSO_LISTED_MAX: usize = 20;

impl Finding {
    pub fn signature(&self) -> Signature {
        Signature::of(&self.workload, &self.oracle, &self.placements)
    }

    /// How many runs came to this finding: this one and [`Finding::also`].
    pub fn count(&self) -> usize {
        1 + self.also.len()
    }

    /// The other runs, listed (the first [`ALSO_LISTED_MAX`], then how many more).
    pub fn also_listed(&self) -> String {
        let listed = &self.also[..self.also.len().min(ALSO_LISTED_MAX)];
        match self.also.len() - listed.len() {
            0 => listed.join("; "),
            more => format!("{} and {more} more", listed.join("; ")),
        }
    }

    /// The scenario file, with `notes` (comment lines, such as the command that replays it)
    /// after the header's account of what was found.
    pub fn file_text(&self, notes: &[String]) -> String {
        let mut text = String::new();
        for line in self.header.iter().chain(notes) {
            text.push_str(line);
            text.push('\n');
        }
        if !self.also.is_empty() {
            text.push_str(&format!("# {}{}.\n", self.count(), ALSO_NOTE));
            text.push_str(&format!("# {}{}.\n", ALSO_NOTE_OTHERS, self.also_listed()));
        }
        text.push_str("# A correct harness trips no oracle here; move it into scenarios/ as a regression test.\n");
        text.push_str(&self.body);
        text
    }

    /// Checks the finding against the reference harness, for a finding under another policy.
    pub fn check_reference(&mut self, harness: &dyn Runs, workload: &Scenario, removed: &BTreeSet<usize>) {
        if self.policy == "reference" {
            return;
        }
        let variant = without_steps(workload, removed);
        let reference = harness.reference();
        let (outcome, _) = run_placed(reference, &variant, &self.placements, "reference", self.seed);
        let baseline = reference.run(&variant, &bare_run("reference"), self.seed);
        self.reference_fired = Some(fired_beyond(&outcome, &baseline));
    }
}

/// The workload of a scenario, as sweep and explore run it: with its scripted cuts removed,
/// unless asked to keep them.
pub fn workload(scenario: &Scenario, keep_cuts: bool) -> Scenario {
    let mut workload = scenario.clone();
    if !keep_cuts {
        workload.cuts.clear();
        workload.interrupts.clear();
        workload.proxy = None;
    }
    workload
}

/// A policy run with nothing to expect: only the oracles judge.
pub fn bare_run(policy: &str) -> PolicyRun {
    PolicyRun {
        policy: policy.to_string(),
        expected_violations: BTreeSet::new(),
        expectations: Vec::new(),
        particulars: Vec::new(),
        broken: Vec::new(),
    }
}

/// The oracles a run tripped, by name, plus `limit` when it hit one.
pub fn fired(outcome: &RunOutcome) -> BTreeSet<String> {
    let mut fired: BTreeSet<String> = outcome.violations.iter().map(|v| v.oracle.name().to_string()).collect();
    if outcome.failures.iter().any(|f| f.starts_with("limit reached") || f.starts_with("a host's software failed")) {
        fired.insert("limit".into());
    }
    fired
}

/// The oracles `outcome` trips beyond what `uncut` (the same workload's uncut run) already
/// trips: an oracle with a violation the uncut run does not have, told apart by what each
/// violation is about (its oracle and detail, without its timings), not by the oracle's name
/// alone, so a cut that makes an oracle the workload already trips fire about something else
/// is not hidden behind it; and `limit` when the run hit one and the uncut run did not.
pub fn fired_beyond(outcome: &RunOutcome, uncut: &RunOutcome) -> BTreeSet<String> {
    let known: BTreeSet<String> = uncut.violations.iter().map(violation_key).collect();
    let mut new: BTreeSet<String> = outcome
        .violations
        .iter()
        .filter(|v| !known.contains(&violation_key(v)))
        .map(|v| v.oracle.name().to_string())
        .collect();
    if fired(outcome).contains("limit") && !fired(uncut).contains("limit") {
        new.insert("limit".into());
    }
    new
}

/// A violation as [`fired_beyond`] tells one from another: its oracle and its detail, with every
/// time in it (`1200 ms`) left out, since a cut moves when things happen without changing what
/// went wrong.
fn violation_key(violation: &crate::oracle::Violation) -> String {
    let mut key = format!("{}: ", violation.oracle.name());
    let detail = violation.detail.as_str();
    let mut rest = detail;
    while let Some(start) = rest.find(|c: char| c.is_ascii_digit()) {
        let digits_end = rest[start..].find(|c: char| !c.is_ascii_digit()).map_or(rest.len(), |end| start + end);
        // A number is a time when " ms" follows it, and it starts a word.
        let starts_word = !rest[..start].ends_with(|c: char| c.is_alphanumeric() || c == '_' || c == ':');
        let time = starts_word && rest[digits_end..].starts_with(" ms");
        key.push_str(&rest[..start]);
        key.push_str(if time { "N" } else { &rest[start..digits_end] });
        rest = &rest[digits_end..];
    }
    key.push_str(rest);
    key
}

/// Runs `scenario` with `placements` added; with, for each, the index of the cut it added among
/// its sort (see [`Placement::fired`]).
pub(crate) fn run_placed_at(
    harness: &dyn Runs,
    scenario: &Scenario,
    placements: &[Placement],
    policy: &str,
    seed: u64,
) -> (RunOutcome, Vec<usize>) {
    let mut variant = scenario.clone();
    let indices = space::apply_all(placements, &mut variant);
    (harness.run(&variant, &bare_run(policy), seed), indices)
}

/// Runs `scenario` with `placements` added; whether every placement fired.
pub(crate) fn run_placed(
    harness: &dyn Runs,
    scenario: &Scenario,
    placements: &[Placement],
    policy: &str,
    seed: u64,
) -> (RunOutcome, bool) {
    let (outcome, indices) = run_placed_at(harness, scenario, placements, policy, seed);
    let reached = placements.iter().zip(&indices).all(|(p, i)| p.fired(&outcome, *i));
    (outcome, reached)
}

fn slug(text: &str) -> String {
    let mut slug = String::new();
    for c in text.chars() {
        if c.is_ascii_alphanumeric() {
            slug.push(c.to_ascii_lowercase());
        } else if !slug.ends_with('-') {
            slug.push('-');
        }
    }
    slug.trim_matches('-').chars().take(90).collect()
}

/// The oracle a finding is about, and every oracle its run trips (that one among them).
#[derive(Clone, Copy)]
pub(crate) struct Found<'a> {
    pub oracle: &'a str,
    pub fired: &'a BTreeSet<String>,
}

/// `workload` without the steps at `removed`, as shrinking leaves it.
pub(crate) fn without_steps(workload: &Scenario, removed: &BTreeSet<usize>) -> Scenario {
    let mut variant = workload.clone();
    variant.steps =
        workload.steps.iter().enumerate().filter(|(i, _)| !removed.contains(i)).map(|(_, s)| s.clone()).collect();
    variant
}

/// Writes a finding as a scenario file: the workload (its world and steps, without the
/// expectations its own story made, and without the steps shrinking removed), the cuts that
/// trigger it, what was found, and what each policy must show: a correct harness trips no
/// oracle; the policy it was found under trips the one found. `found_by` says what found it
/// (`exploration of harness `naive``); the command that replays it is the caller's to add, since
/// only the caller knows what runs this harness.
pub(crate) fn finding(
    scenario: &Scenario,
    placements: &[Placement],
    policy: &str,
    found: Found<'_>,
    seed: u64,
    removed_steps: &BTreeSet<usize>,
    found_by: &str,
) -> Finding {
    let Found { oracle, fired } = found;
    let ids: Vec<String> = placements.iter().map(Placement::id).collect();
    let about =
        format!("The {found_by} found `{oracle}` under policy `{policy}` (seed {seed}) with: {}", ids.join("; "));
    let contents = file::Contents { about: &about, placements, policy, oracle, fired, removed_steps };
    let body = file::scenario_toml(scenario, &contents);
    let (cuts, them) = if placements.len() == 1 { ("this cut", "it") } else { ("these cuts", "them") };
    let mut header = vec![
        format!("# Found by the {found_by}, under policy `{policy}` with seed {seed},"),
        format!("# on {}: `{oracle}` fires with {cuts} (and not without {them}):", scenario.path.display()),
    ];
    header.extend(ids.iter().map(|id| format!("#   {id}")));
    let classes: Vec<String> = placements.iter().map(Placement::class).collect();
    let file_name = format!("{}--{oracle}--{}.toml", scenario.name(), slug(&classes.join("--")));
    let mut finding = Finding {
        oracle: oracle.into(),
        placements: placements.to_vec(),
        policy: policy.into(),
        seed,
        workload: scenario.path.display().to_string(),
        scenario_file: String::new(),
        file_name,
        reference_fired: None,
        also: Vec::new(),
        header,
        body,
    };
    finding.scenario_file = finding.file_text(&[]);
    finding
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn scripted() -> Scenario {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scenarios/incident-001/finalization/lost-ack.toml");
        Scenario::load(&path).unwrap()
    }

    #[test]
    fn a_finding_scripts_the_cuts_its_workload_ran_with_and_no_others() {
        let original = scripted();
        assert!(!original.cuts.is_empty(), "the file scripts a cut of its own");
        let bare = finding(
            &workload(&original, false),
            &[],
            "reference",
            Found { oracle: "liveness", fired: &BTreeSet::new() },
            0,
            &BTreeSet::new(),
            "test",
        );
        let bare = Scenario::parse(Path::new("bare.toml"), &bare.scenario_file).unwrap();
        assert!(bare.cuts.is_empty(), "the sweep ran without the scripted cut, so the finding must too");
        let kept = finding(
            &workload(&original, true),
            &[],
            "reference",
            Found { oracle: "liveness", fired: &BTreeSet::new() },
            0,
            &BTreeSet::new(),
            "test",
        );
        let kept = Scenario::parse(Path::new("kept.toml"), &kept.scenario_file).unwrap();
        assert_eq!(kept.cuts.len(), original.cuts.len(), "--keep-cuts keeps them in the finding too");
    }

    fn crash_at_write(nth: u64) -> Placement {
        Placement {
            site: space::Site::Call {
                function: "state::set".into(),
                about: vec![("scope".into(), "harness_turn".into())],
                nth,
            },
            kind: space::Kind::CrashCallerAfter,
            ms: None,
        }
    }

    fn drop_result() -> Placement {
        Placement {
            site: space::Site::Frame {
                worker: "harness".into(),
                up: true,
                frame: "invocationresult".into(),
                function: "harness::turn".into(),
                nth: 1,
            },
            kind: space::Kind::Drop,
            ms: None,
        }
    }

    fn found_in_multi_round(placements: &[Placement], policy: &str) -> Finding {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scenarios/workloads/multi-round.toml");
        let scenario = workload(&Scenario::load(&path).unwrap(), false);
        let fired = BTreeSet::from(["ledger".to_string()]);
        let found = Found { oracle: "ledger", fired: &fired };
        finding(&scenario, placements, policy, found, 3, &BTreeSet::new(), "sweep of harness `reference`")
    }

    #[test]
    fn a_signature_is_the_oracle_and_the_cuts_classes_in_any_order() {
        let (first, second) = (crash_at_write(2), drop_result());
        let signature = Signature::of("w.toml", "ledger", &[second.clone(), first.clone()]);
        assert_eq!(signature, Signature::of("w.toml", "ledger", &[first.clone(), second.clone()]));
        assert_eq!(signature, Signature::of("w.toml", "ledger", &[crash_at_write(5), second.clone()]), "any ordinal");
        assert_ne!(signature, Signature::of("w.toml", "effects", &[first.clone(), second.clone()]));
        assert_eq!(
            signature.to_string(),
            "`ledger` with crash-caller-after @ call state::set[scope=harness_turn] + \
             drop @ frame invocationresult harness::turn from harness"
        );
    }

    #[test]
    fn a_finding_counts_and_lists_the_other_runs_that_came_to_it() {
        let mut found = found_in_multi_round(&[crash_at_write(2)], "unguarded");
        assert_eq!(found.count(), 1);
        assert!(!found.file_text(&[]).contains(ALSO_NOTE), "no other run, no line about them");

        found.also = vec!["seed 4".into(), "seed 9".into()];
        assert_eq!((found.count(), found.also_listed()), (3, "seed 4; seed 9".to_string()));
        let text = found.file_text(&["# replay: rig explore FILE --seeds 3..4".into()]);
        let lines: Vec<&str> = text.lines().collect();
        let at =
            |line: &str| lines.iter().position(|l| *l == line).unwrap_or_else(|| panic!("no `{line}` in:\n{text}"));
        let (replay, count, others) = (
            at("# replay: rig explore FILE --seeds 3..4"),
            at(&format!("# 3{ALSO_NOTE}.")),
            at(&format!("# {ALSO_NOTE_OTHERS}seed 4; seed 9.")),
        );
        assert!(replay < count && count < others, "the notes, then how many, then which:\n{text}");

        found.also = (1..=ALSO_LISTED_MAX + 2).map(|seed| format!("seed {seed}")).collect();
        let listed = found.also_listed();
        assert_eq!(found.count(), ALSO_LISTED_MAX + 3);
        assert!(listed.starts_with("seed 1; seed 2; ") && listed.ends_with("; seed 20 and 2 more"), "{listed}");
    }

    #[test]
    fn a_finding_is_named_by_its_workload_oracle_and_cut_classes() {
        let one = found_in_multi_round(&[crash_at_write(2)], "unguarded");
        assert_eq!(one.file_name, "multi-round--ledger--crash-caller-after-call-state-set-scope-harness-turn.toml");
        assert!(
            one.scenario_file.contains("`ledger` fires with this cut (and not without it):\n"),
            "{}",
            one.scenario_file
        );
        let two = found_in_multi_round(&[crash_at_write(2), drop_result()], "unguarded");
        assert!(two.scenario_file.contains("`ledger` fires with these cuts (and not without them):\n"));
        assert_eq!(slug("  A--b__C  "), "a-b-c", "runs of anything else become one dash, none at the ends");
        assert_eq!(slug(&"x".repeat(200)).len(), 90, "a file name stays short");
    }

    #[test]
    fn a_harness_runs_under_its_own_name() {
        let reference = crate::reference();
        assert_eq!(Runs::name(&reference), "reference");
    }

    /// `limit` stands for a run that ended on a limit or a host's failure, not on an oracle.
    #[test]
    fn a_limit_or_a_failed_host_fires_limit_and_nothing_else_does() {
        let scenario = scripted();
        let mut outcome = crate::run::run(&scenario, &scenario.runs[0], 0);
        outcome.violations.clear();
        let fired_by = |outcome: &mut RunOutcome, failure: &str| {
            outcome.failures = vec![failure.to_string()];
            fired(outcome)
        };
        let limit = BTreeSet::from(["limit".to_string()]);
        assert_eq!(fired_by(&mut outcome, "limit reached: 10000 steps (seed 0)"), limit);
        assert_eq!(fired_by(&mut outcome, "a host's software failed: it panicked (seed 0)"), limit);
        assert_eq!(fired_by(&mut outcome, "state harness_turn/s1: status expected = failed"), BTreeSet::new());
    }

    /// Whether the first and the thousandth placement at a site fired, in one run of `scenario`
    /// with both applied.
    fn first_and_thousandth_fired(mut scenario: Scenario, at: impl Fn(u64) -> Placement) -> (bool, bool) {
        let placements = [at(1), at(1_000)];
        let indices = space::apply_all(&placements, &mut scenario);
        let outcome = crate::run::run(&scenario, &scenario.runs[0], 0);
        (placements[0].fired(&outcome, indices[0]), placements[1].fired(&outcome, indices[1]))
    }

    /// A placement fired when the trace shows its own cut taking a call; one at a site the run
    /// never reached did not.
    #[test]
    fn a_placement_fired_only_if_its_own_cut_took_a_call() {
        let at = |nth: u64| Placement {
            site: space::Site::Call { function: "state::get".into(), about: Vec::new(), nth },
            kind: space::Kind::Delay,
            ms: Some(10),
        };
        let (first, thousandth) = first_and_thousandth_fired(workload(&scripted(), false), at);
        assert!(first, "the first read is in every run");
        assert!(!thousandth, "no run reads a thousand times");
    }

    /// The same for a process cut: a placement at a named point fired when the trace shows its
    /// own interrupt taking the worker there.
    #[test]
    fn a_point_placement_fired_only_if_its_own_interrupt_took_the_worker() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scenarios/workloads/multi-round.toml");
        let at = |nth: u64| Placement {
            site: space::Site::Point { worker: "harness".into(), point: "before_submission".into(), nth },
            kind: space::Kind::Pause,
            ms: Some(10),
        };
        let (first, thousandth) = first_and_thousandth_fired(workload(&Scenario::load(&path).unwrap(), false), at);
        assert!(first, "the first submission is in every run");
        assert!(!thousandth, "no run submits a thousand times");
    }

    fn violation(oracle: crate::oracle::Oracle, detail: &str) -> crate::oracle::Violation {
        crate::oracle::Violation { oracle, detail: detail.into() }
    }

    /// A violation is told from another by its oracle and what it says, its times left out: a
    /// number is a time where it starts a word and ` ms` follows it, and no other number is.
    #[test]
    fn a_violation_is_its_oracle_and_detail_without_its_times() {
        use crate::oracle::Oracle::{Ledger, Liveness};
        let key = |oracle, detail: &str| violation_key(&violation(oracle, detail));
        assert_eq!(
            key(Liveness, "turn t1 running at 61200 ms, since 1200 ms"),
            "liveness: turn t1 running at N ms, since N ms"
        );
        assert_eq!(key(Liveness, "1200 ms late"), "liveness: N ms late", "at the start of the detail too");
        assert_eq!(
            key(Liveness, "turn t12 at step 3 of 5"),
            "liveness: turn t12 at step 3 of 5",
            "counts and ids stay"
        );
        for kept in ["held t15 ms", "held x_15 ms", "held at:15 ms", "held 15ms"] {
            assert_eq!(key(Liveness, kept), format!("liveness: {kept}"), "no time: part of a word, or no ` ms`");
        }
        assert_ne!(key(Ledger, "action a1"), key(Liveness, "action a1"), "the oracle is part of it");
    }

    /// Beyond the uncut run: a violation it does not have (another oracle, or the same oracle
    /// about something else), its own at other times not; and `limit` only if the uncut run did
    /// not hit one too.
    #[test]
    fn beyond_the_uncut_run_is_what_it_does_not_have_at_any_time() {
        use crate::oracle::Oracle::{Ledger, Liveness};
        let scenario = scripted();
        let outcome = |violations: Vec<crate::oracle::Violation>, limit: bool| {
            let mut outcome = crate::run::run(&scenario, &scenario.runs[0], 0);
            outcome.violations = violations;
            outcome.failures = if limit { vec!["limit reached: 10000 steps (seed 0)".into()] } else { Vec::new() };
            outcome
        };
        let uncut = outcome(vec![violation(Liveness, "turn t1 running at 1200 ms")], false);
        let names = |names: &[&str]| names.iter().map(|n| n.to_string()).collect::<BTreeSet<String>>();
        let later = outcome(vec![violation(Liveness, "turn t1 running at 5400 ms")], false);
        assert_eq!(fired_beyond(&later, &uncut), names(&[]), "the same violation, later");
        let other =
            outcome(vec![violation(Liveness, "turn t1 running at 5400 ms"), violation(Ledger, "action a1")], false);
        assert_eq!(fired_beyond(&other, &uncut), names(&["ledger"]));
        let elsewhere = outcome(vec![violation(Liveness, "turn t2 running at 1200 ms")], false);
        assert_eq!(fired_beyond(&elsewhere, &uncut), names(&["liveness"]), "the same oracle about another turn");
        let limited = outcome(vec![violation(Liveness, "turn t1 running at 1200 ms")], true);
        assert_eq!(fired_beyond(&limited, &uncut), names(&["limit"]));
        let both_limited = outcome(Vec::new(), true);
        assert_eq!(fired_beyond(&limited, &both_limited), names(&["liveness"]), "the uncut run hit the limit too");
    }

    struct TurnsOnly;

    impl HarnessFactory for TurnsOnly {
        fn name(&self) -> &str {
            "turns-only"
        }

        fn layout(&self) -> crate::RecordLayout {
            crate::RecordLayout { turn_scope: "turns_only_turn".into(), ..Default::default() }
        }

        fn start(&self, _policy: &str, _env: crate::HarnessEnv) -> std::rc::Rc<dyn crate::Provider> {
            unreachable!("listed and skipped, never run")
        }
    }

    /// `--list`'s line: what the workload needs (`turns` bare, every other need with why), and
    /// whether the harness serves it or what it lacks.
    #[test]
    fn the_list_line_says_what_a_workload_needs_and_whether_the_harness_serves_it() {
        let source = r#"about = "needs"
[[step]]
invoke = { function = "harness::turn", payload = { session_id = "s1", input = "hi" } }

[[step]]
invoke = { function = "harness::status", payload = { session_id = "s1" } }

[policy.reference]
"#;
        let scenario = Scenario::parse(Path::new("needs.toml"), source).unwrap();
        let (line, serves) = needs_line(&crate::reference(), &scenario, "reference", false);
        assert!(serves, "{line}");
        assert!(line.starts_with("needs.toml [reference]: needs turns, status ("), "{line}");
        assert!(line.ends_with("; harness `reference` serves it"), "{line}");
        let turns_only: Arc<dyn HarnessFactory> = Arc::new(TurnsOnly);
        let (line, serves) = needs_line(&turns_only, &scenario, "reference", false);
        assert!(!serves, "{line}");
        assert!(line.starts_with("needs.toml [reference]: needs turns, status ("), "{line}");
        assert!(line.ends_with("; skipped: harness `turns-only` does not declare status"), "{line}");
    }

    /// A harness keeps its records where its layout says, and a sweep reads its runs there.
    #[test]
    fn a_harness_is_read_through_its_own_layout() {
        let turns_only: Arc<dyn HarnessFactory> = Arc::new(TurnsOnly);
        assert_eq!(Runs::layout(&turns_only).turn_scope, "turns_only_turn");
        assert_eq!(Runs::layout(&crate::reference()), crate::RecordLayout::default());
    }

    /// A way of running that says nothing of its wiring runs the workload as written.
    #[test]
    fn a_runs_without_wiring_of_its_own_runs_the_workload_as_written() {
        struct Plain;
        impl Runs for Plain {
            fn name(&self) -> &str {
                "plain"
            }
            fn run(&self, _: &Scenario, _: &PolicyRun, _: u64) -> RunOutcome {
                unreachable!("not run")
            }
            fn skip(&self, _: &Scenario, _: &str) -> Option<Skip> {
                None
            }
            fn reference(&self) -> &dyn Runs {
                self
            }
        }
        let scenario = scripted();
        let wired = Plain.wired(&scenario);
        assert!(matches!(wired, std::borrow::Cow::Borrowed(w) if std::ptr::eq(w, &scenario)));
    }

    /// A finding under a known-bad policy is checked under the reference harness (which trips
    /// nothing with a cut a correct harness rides out); one found under the reference is not.
    #[test]
    fn a_finding_under_a_known_bad_policy_is_checked_against_the_reference() {
        let harness = crate::reference();
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scenarios/workloads/multi-round.toml");
        let scenario = workload(&Scenario::load(&path).unwrap(), false);
        let mut bad = found_in_multi_round(&[crash_at_write(2)], "unguarded");
        bad.check_reference(&harness, &scenario, &BTreeSet::new());
        assert_eq!(bad.reference_fired, Some(BTreeSet::new()), "the reference rides the crash out");
        let mut reference = found_in_multi_round(&[crash_at_write(2)], "reference");
        reference.check_reference(&harness, &scenario, &BTreeSet::new());
        assert_eq!(reference.reference_fired, None, "nothing to check it against");
    }

    /// The space a sweep draws from is the cut space less what this way of running cannot make.
    #[test]
    fn the_runnable_space_leaves_out_what_the_harness_cannot_run() {
        struct NoProcessCuts(Arc<dyn HarnessFactory>);
        impl Runs for NoProcessCuts {
            fn name(&self) -> &str {
                "no-process-cuts"
            }
            fn run(&self, scenario: &Scenario, run: &PolicyRun, seed: u64) -> RunOutcome {
                self.0.run(scenario, run, seed)
            }
            fn skip(&self, workload: &Scenario, policy: &str) -> Option<Skip> {
                self.0.skip(workload, policy)
            }
            fn cannot(&self, scenario: &Scenario) -> Option<Vec<String>> {
                (!scenario.interrupts.is_empty()).then(|| vec!["no process cuts".to_string()])
            }
            fn reference(&self) -> &dyn Runs {
                self
            }
        }
        let harness = crate::reference();
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scenarios/workloads/multi-round.toml");
        let scenario = workload(&Scenario::load(&path).unwrap(), false);
        let baseline = Runs::run(&harness, &scenario, &bare_run("reference"), 0);
        let options = SpaceOptions::default();
        let whole = cut_space(&scenario, &baseline, &options);
        assert!(whole.iter().any(|p| matches!(p.site, space::Site::Point { .. })), "the space has process cuts");
        assert_eq!(runnable_space(&harness, &scenario, &baseline, &options), whole, "the simulation runs them all");
        let without = runnable_space(&NoProcessCuts(harness), &scenario, &baseline, &options);
        let expected: Vec<Placement> =
            whole.into_iter().filter(|p| !matches!(p.site, space::Site::Point { .. })).collect();
        assert!(!expected.is_empty());
        assert_eq!(without, expected);
    }
}
