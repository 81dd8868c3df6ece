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
//! [`Exploration::shrunk`]. A [`Finding`]'s `scenario_file` is a scenario file of its own; the
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
//! let swept = explore::sweep(&harness, &workload, &SweepOptions::default());
//! assert!(!swept.runs.is_empty());
//! for finding in &swept.findings {
//!     println!("`{}` with {} cut(s): {}", finding.oracle, finding.placements.len(), finding.file_name);
//! }
//!
//! // One seed's random fault mix; a failure comes back shrunk, as a scenario file.
//! let exploration = explore::explore(&harness, &workload, "reference", 7, false);
//! if let Some(finding) = &exploration.shrunk {
//!     println!("{} -> {}\n{}", finding.oracle, finding.file_name, finding.scenario_file);
//! }
//! ```

mod space;
mod swarm;
mod sweep;

pub use space::{cut_space, Kind, Placement, Site, SpaceOptions};
pub use swarm::{explore, Exploration};
pub use sweep::{plan, report, run_job, sweep, SweepOptions, SweepPlan, SweepReport, SweepRun, Verdict, PAIRS_DEFAULT};

use crate::harness::HarnessFactory;
use crate::run::{run_with, RunOutcome};
use crate::scenario::{PolicyRun, Scenario};
use std::collections::BTreeSet;
use std::sync::Arc;

/// What makes the runs of a sweep or an exploration: a harness factory, in the simulation (what
/// every `Arc<dyn HarnessFactory>` is), or a harness process run live.
pub trait Runs: Sync {
    /// The harness's name, for what found a finding.
    fn name(&self) -> &str;
    /// One run of `scenario` under `run`'s policy.
    fn run(&self, scenario: &Scenario, run: &PolicyRun, seed: u64) -> RunOutcome;
    /// Why `scenario` cannot be run this way (a cut only the simulation can make, live); such
    /// placements are left out of the cut space.
    fn cannot(&self, _scenario: &Scenario) -> Option<Vec<String>> {
        None
    }
    /// What a finding made under a known-bad policy is checked against, under `reference`.
    fn reference(&self) -> &dyn Runs;
}

impl Runs for Arc<dyn HarnessFactory> {
    fn name(&self) -> &str {
        self.as_ref().name()
    }

    fn run(&self, scenario: &Scenario, run: &PolicyRun, seed: u64) -> RunOutcome {
        run_with(self, scenario, run, seed)
    }

    fn reference(&self) -> &dyn Runs {
        self
    }
}

/// The cut space of `workload` that `harness` can run.
fn runnable_space(
    harness: &dyn Runs,
    workload: &Scenario,
    baseline: &RunOutcome,
    options: &SpaceOptions,
) -> Vec<Placement> {
    let mut space = cut_space(workload, baseline, options);
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
    /// The scenario file that reproduces it.
    pub scenario_file: String,
    /// A file name for it: the workload's stem, the oracle and the placements' classes.
    pub file_name: String,
    /// For a finding under a known-bad policy: the oracles the same cuts make fire under the
    /// reference harness (none, if the file really separates the two).
    pub reference_fired: Option<BTreeSet<String>>,
}

impl Finding {
    /// Checks the finding against the reference harness, for a finding under another policy.
    pub fn check_reference(&mut self, harness: &dyn Runs, workload: &Scenario, removed: &BTreeSet<usize>) {
        if self.policy == "reference" {
            return;
        }
        let variant = without_steps(workload, removed);
        let reference = harness.reference();
        let (outcome, _) = run_placed(reference, &variant, &self.placements, "reference", self.seed);
        let baseline = reference.run(&variant, &bare_run("reference"), self.seed);
        self.reference_fired = Some(fired(&outcome).difference(&fired(&baseline)).cloned().collect());
    }
}

/// The workload of a scenario: with its scripted cuts removed, unless asked to keep them.
pub(crate) fn workload(scenario: &Scenario, keep_cuts: bool) -> Scenario {
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

/// Runs `scenario` with `placements` added; `None` when some placement never fired.
pub(crate) fn run_placed(
    harness: &dyn Runs,
    scenario: &Scenario,
    placements: &[Placement],
    policy: &str,
    seed: u64,
) -> (RunOutcome, bool) {
    let mut variant = scenario.clone();
    let indices = space::apply_all(placements, &mut variant);
    let outcome = harness.run(&variant, &bare_run(policy), seed);
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
/// oracle; the policy it was found under trips the one found, and whatever else the same run
/// trips (`also`), or the file would fail on them. `found_by` says what found it
/// (`sweep of harness `naive``); the command that replays it is the caller's to add, since only
/// the caller knows what runs this harness.
pub(crate) fn finding(
    scenario: &Scenario,
    placements: &[Placement],
    policy: &str,
    found: Found<'_>,
    seed: u64,
    removed_steps: &BTreeSet<usize>,
    found_by: &str,
) -> Finding {
    let Found { oracle, fired: also } = found;
    let mut table: toml::Table = toml::from_str(&scenario.source).expect("a loaded scenario parses");
    for key in ["about", "expect", "policy"] {
        table.remove(key);
    }
    // The file's text still has the scripted cuts a workload may have run without: the finding
    // must script what was run, or it does not reproduce.
    let dropped = [
        ("cut", scenario.cuts.is_empty()),
        ("interrupt", scenario.interrupts.is_empty()),
        ("proxy", scenario.proxy.is_none()),
    ];
    for (key, _) in dropped.iter().filter(|(_, empty)| *empty) {
        table.remove(*key);
    }
    // The cuts change the story the workload was written for (a step they keep from completing,
    // a scripted reply they leave unasked or asked differently): the file is judged by the
    // oracles alone, as the run that found it was.
    table.insert("oracles_only".into(), toml::Value::Boolean(true));
    if let Some(toml::Value::Array(steps)) = table.get_mut("step") {
        let kept: Vec<toml::Value> =
            steps.iter().enumerate().filter(|(i, _)| !removed_steps.contains(i)).map(|(_, s)| s.clone()).collect();
        *steps = kept;
    }
    let ids: Vec<String> = placements.iter().map(Placement::id).collect();
    let about =
        format!("The {found_by} found `{oracle}` under policy `{policy}` (seed {seed}) with: {}", ids.join("; "));
    for placement in placements {
        add_cut(&mut table, placement);
    }
    let mut policies = toml::Table::new();
    policies.insert("reference".into(), toml::Value::Table(toml::Table::new()));
    if policy != "reference" && oracle != "limit" {
        let mut bad = toml::Table::new();
        let mut violations: BTreeSet<&str> = also.iter().map(String::as_str).filter(|o| *o != "limit").collect();
        violations.insert(oracle);
        let violations = violations.into_iter().map(|o| toml::Value::String(o.into())).collect();
        bad.insert("violations".into(), toml::Value::Array(violations));
        policies.insert(policy.into(), toml::Value::Table(bad));
    }
    table.insert("policy".into(), toml::Value::Table(policies));
    let mut text = format!(
        "# Found by the {found_by} from {} under policy `{policy}`, seed {seed}.\n\
         # A correct harness trips no oracle here; move it into scenarios/ as a regression test.\n",
        scenario.path.display()
    );
    table.insert("about".into(), toml::Value::String(about));
    text.push_str(&toml::to_string_pretty(&table).expect("a scenario table serializes"));
    let classes: Vec<String> = placements.iter().map(Placement::class).collect();
    let file_name = format!("{}--{oracle}--{}.toml", scenario.name(), slug(&classes.join("--")));
    Finding {
        oracle: oracle.into(),
        placements: placements.to_vec(),
        policy: policy.into(),
        seed,
        scenario_file: text,
        file_name,
        reference_fired: None,
    }
}

/// A placement as the scenario-file table that scripts it.
fn add_cut(table: &mut toml::Table, placement: &Placement) {
    let mut cut = toml::Table::new();
    let text = |s: &str| toml::Value::String(s.to_string());
    let number = |n: u64| toml::Value::Integer(i64::try_from(n).unwrap_or(i64::MAX));
    let push = |table: &mut toml::Table, key: &str, value: toml::Table| {
        let entry = table.entry(key.to_string()).or_insert_with(|| toml::Value::Array(Vec::new()));
        if let toml::Value::Array(items) = entry {
            items.push(toml::Value::Table(value));
        }
    };
    match &placement.site {
        Site::Call { function, about, nth } => {
            cut.insert("function".into(), text(function));
            if !about.is_empty() {
                let conditions: toml::Table = about.iter().map(|(k, v)| (k.clone(), text(v))).collect();
                cut.insert("match".into(), toml::Value::Table(conditions));
            }
            cut.insert("action".into(), text(placement.kind.name()));
            match placement.kind {
                Kind::Delay => drop(cut.insert("delay_ms".into(), number(placement.ms.unwrap_or(0)))),
                Kind::PauseCaller => drop(cut.insert("pause_ms".into(), number(placement.ms.unwrap_or(0)))),
                Kind::IsolateCaller => drop(cut.insert("isolate_ms".into(), number(placement.ms.unwrap_or(0)))),
                _ => {}
            }
            cut.insert("skip".into(), number(nth - 1));
            push(table, "cut", cut);
        }
        Site::Point { worker, point, nth } => {
            cut.insert("worker".into(), text(worker));
            cut.insert("point".into(), text(point));
            cut.insert("action".into(), text(placement.kind.name()));
            if placement.kind == Kind::Pause {
                cut.insert("pause_ms".into(), number(placement.ms.unwrap_or(0)));
            }
            cut.insert("skip".into(), number(nth - 1));
            push(table, "interrupt", cut);
        }
        Site::Frame { worker, up, frame, function, nth } => {
            cut.insert("action".into(), text(placement.kind.name()));
            cut.insert("count".into(), text("once"));
            cut.insert("skip".into(), number(nth - 1));
            cut.insert("direction".into(), text(if *up { "up" } else { "down" }));
            let conditions: toml::Table =
                [("type".to_string(), text(frame)), ("function_id".to_string(), text(function))].into_iter().collect();
            cut.insert("match".into(), toml::Value::Table(conditions));
            let proxy = table.entry("proxy".to_string()).or_insert_with(|| toml::Value::Table(toml::Table::new()));
            if let toml::Value::Table(proxy) = proxy {
                proxy.entry("worker".to_string()).or_insert_with(|| text(worker));
                push(proxy, "rule", cut);
            }
        }
    }
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
}
