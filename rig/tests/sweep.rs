//! Finding what nobody scripted, on the shipped workloads: a depth-1 sweep of a small workload
//! finds nothing under the reference harness; the same sweep under a known-bad policy finds the
//! oracle that catches it and writes it as a scenario that separates the two; an exploration
//! draws the same mix from the same seed and shrinks what fails.

use rig::explore::{self, SweepOptions, Verdict};
use rig::Scenario;
use std::path::Path;

fn workload(name: &str) -> Scenario {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scenarios/workloads").join(name);
    Scenario::load(&path).unwrap()
}

#[test]
fn a_depth_one_sweep_of_a_workload_finds_nothing_under_reference() {
    let report = explore::sweep(&rig::reference(), &workload("queued-successor.toml"), &SweepOptions::default());
    assert!(report.baseline_fired.is_empty(), "the uncut workload trips {:?}", report.baseline_fired);
    assert!(report.runs.len() > 100, "the cut space is the whole workload: {} runs", report.runs.len());
    let unreached = report.runs.iter().filter(|r| r.verdict == Verdict::Unreached).count();
    assert_eq!(unreached, 0, "every site of the uncut run is reached again with the same seed");
    let findings: Vec<String> = report
        .findings
        .iter()
        .map(|f| format!("{} with {}", f.oracle, f.placements.iter().map(|p| p.id()).collect::<Vec<_>>().join(" + ")))
        .collect();
    assert!(findings.is_empty(), "the reference harness has findings: {findings:#?}");
}

#[test]
fn a_sweep_under_a_known_bad_policy_rediscovers_it_as_a_scenario_that_separates_the_two() {
    let options = SweepOptions { policy: "assume-failed".into(), ..SweepOptions::default() };
    let report = explore::sweep(&rig::reference(), &workload("multi-round.toml"), &options);
    let finding = report.findings.iter().find(|f| f.oracle == "ledger").expect("`ledger` catches assume-failed");
    assert_eq!(finding.reference_fired.as_ref().map(|f| f.len()), Some(0), "the reference harness is clean there");
    let scenario =
        Scenario::parse(Path::new("finding.toml"), &finding.scenario_file).expect("a finding is a valid scenario");
    for policy in ["reference", "assume-failed"] {
        let run = scenario.run_of(policy).expect("both policies are declared");
        let outcome = rig::run(&scenario, run, 0);
        assert!(outcome.passed, "{policy}: {}", rig::report::human(&outcome));
    }
    let fired = rig::run(&scenario, scenario.run_of("assume-failed").unwrap(), 0);
    assert!(fired.violations.iter().any(|v| v.oracle.name() == "ledger"), "the finding fires under the bad policy");
}

#[test]
fn an_exploration_replays_its_seed_and_shrinks_to_the_cuts_that_matter() {
    let scenario = workload("multi-round.toml");
    let harness = rig::reference();
    // Seeds draw their mix from a stream of their own: the same seed, the same mix, bit for bit.
    let first = explore::explore(&harness, &scenario, "replay-unfinished", 25, false);
    let again = explore::explore(&harness, &scenario, "replay-unfinished", 25, false);
    assert_eq!(first.mix, again.mix);
    assert_eq!(first.fired, again.fired);
    let failing = (0..60)
        .map(|seed| explore::explore(&harness, &scenario, "replay-unfinished", seed, false))
        .find(|e| e.shrunk.is_some())
        .expect("some seed's mix catches replay-unfinished");
    let shrunk = failing.shrunk.unwrap();
    assert!(shrunk.placements.len() <= 2, "shrunk to {} cuts", shrunk.placements.len());
    assert!(shrunk.placements.len() <= failing.mix.len());
    let scenario = Scenario::parse(Path::new("shrunk.toml"), &shrunk.scenario_file).unwrap();
    let outcome = rig::run(&scenario, scenario.run_of("replay-unfinished").unwrap(), failing.seed);
    assert!(outcome.passed, "the shrunk file still catches the policy: {}", rig::report::human(&outcome));
}

/// A shrunk finding must still be the cuts' doing. Shrinking once removed the workload step that
/// delivered the turn: the seeded `running` turn was then left running with no cut at all, so
/// `liveness` still fired, and the written file (no delivery, cuts that never fire) reproduced
/// nothing the cuts did.
#[test]
fn a_shrunk_finding_trips_its_oracle_only_with_its_cuts() {
    let scenario = workload("queued-successor.toml");
    let harness = rig::reference();
    // `swallow` (the released binary) never recovers a turn whose terminal write failed: some
    // seed's mix leaves it running, and `liveness` catches it. (Which seed depends on the kinds
    // of cut the space has, so the test looks for one.)
    let shrunk = (0..60)
        .filter_map(|seed| explore::explore(&harness, &scenario, "swallow", seed, false).shrunk)
        .find(|shrunk| shrunk.oracle == "liveness")
        .expect("some seed's mix leaves a turn running under swallow");
    let file = Scenario::parse(Path::new("shrunk.toml"), &shrunk.scenario_file).unwrap();
    let run = file.run_of("swallow").unwrap();
    let with_cuts = rig::run(&file, run, shrunk.seed);
    assert!(
        with_cuts.violations.iter().any(|v| v.oracle.name() == shrunk.oracle),
        "{}",
        rig::report::human(&with_cuts)
    );
    let mut without = file.clone();
    without.cuts.clear();
    let bare = rig::run(&without, without.run_of("swallow").unwrap(), shrunk.seed);
    assert!(
        !bare.violations.iter().any(|v| v.oracle.name() == shrunk.oracle),
        "the shrunk file trips `{}` with no cut at all:\n{}",
        shrunk.oracle,
        shrunk.scenario_file
    );
}
