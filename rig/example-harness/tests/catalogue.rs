//! The shipped catalogue against the naive harness: the scenario files written for the reference
//! harness catch the naive one's mistakes, judged from what the services saw. Each expected
//! catch below follows from one of the mistakes listed in `src/lib.rs`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// One shipped scenario under the naive harness, as it claims (`reference`), seed 0.
struct Verdict {
    fired: BTreeSet<&'static str>,
    passed: bool,
    /// Why the file is skipped for it: a capability it does not declare. The run is made all the
    /// same, to show what skipping spares it.
    skipped: Option<rig::Skip>,
}

/// Every shipped scenario, run as the naive harness claims (`reference`), seed 0: the oracles
/// that fired, whether the run met the file's expectations, and whether it is skipped.
fn verdicts() -> BTreeMap<String, Verdict> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scenarios");
    let files = rig::scenario_files(std::slice::from_ref(&root)).unwrap();
    let harness = naive_harness::factory();
    let mut verdicts = BTreeMap::new();
    for file in files {
        let scenario = rig::Scenario::load(&file).unwrap();
        let Some(reference) = scenario.run_of("reference") else { continue };
        let skipped = scenario.skip_for(harness.as_ref(), "reference");
        // Made even when skipped, to show what the skip spares it.
        let outcome = rig::run_unchecked(&harness, &scenario, reference, 0);
        let fired = outcome.violations.iter().map(|v| v.oracle.name()).collect();
        let name = file.strip_prefix(&root).unwrap().with_extension("").display().to_string();
        verdicts.insert(name, Verdict { fired, passed: outcome.passed, skipped });
    }
    verdicts
}

#[test]
fn the_catalogue_catches_the_naive_harness() {
    let verdicts = verdicts();
    for (name, verdict) in &verdicts {
        let fired: Vec<&str> = verdict.fired.iter().copied().collect();
        let shown = match &verdict.skipped {
            Some(skip) => format!(
                "skip ({}; would {})",
                skip.capabilities().join(","),
                if verdict.passed { "pass" } else { "fail" }
            ),
            None if verdict.passed => "pass".into(),
            None => "FAIL".into(),
        };
        println!("{name:<60} {shown} [{}]", fired.join(", "));
    }
    let run: Vec<&Verdict> = verdicts.values().filter(|v| v.skipped.is_none()).collect();
    let skipped: Vec<&Verdict> = verdicts.values().filter(|v| v.skipped.is_some()).collect();
    println!(
        "{} files: {} run ({} passed, {} failed), {} skipped by capability ({} of them would fail)",
        verdicts.len(),
        run.len(),
        run.iter().filter(|v| v.passed).count(),
        run.iter().filter(|v| !v.passed).count(),
        skipped.len(),
        skipped.iter().filter(|v| !v.passed).count()
    );
    // (scenario, oracle that must fire, the mistake it catches)
    let expected = [
        ("incident-001/finalization/write-timeout", "liveness", "swallowed finalisation errors"),
        ("incident-001/finalization/write-rejected", "liveness", "swallowed finalisation errors"),
        ("incident-001/finalization/lost-ack", "truthful-reply", "reports `running` over a durable `failed`"),
        ("incident-001/finalization/reseed-without-queue", "stranded", "queued input left where it is"),
        ("harness-switch/accepted-not-recorded-idempotent", "ledger", "no intent recorded before the effect"),
        (
            "harness-switch/stale-worker",
            "monotonic",
            "no lease and no fencing token: a paused worker's late write lands",
        ),
        ("regressions/provider-stopped-mid-call", "ledger", "an unanswered request taken for a failure"),
        (
            "regressions/reconciliation-cannot-get-through",
            "blind-replay",
            "an unanswered request sent again, under a new key, without asking the service",
        ),
    ];
    let mut missed = Vec::new();
    for (scenario, oracle, mistake) in expected {
        let caught = verdicts.get(scenario).is_some_and(|v| v.skipped.is_none() && v.fired.contains(oracle));
        if !caught {
            missed.push(format!("{scenario}: `{oracle}` did not fire ({mistake})"));
        }
    }
    // Caught by the scenario's shared `[expect]` (the contract: the ledger, the turn record, the
    // generations), not by an always-on oracle and not by the reference harness's particulars,
    // which judge only the reference harness.
    let failing_on_expectations = [
        (
            "harness-switch/interrupt-before-submission",
            "the import reruns the turn and drops the unfinished action (no ticket, no action done)",
        ),
        (
            "restarts/engine-restart-queued-turn",
            "it trusts a redelivery of a turn that already failed: asks the model and rewrites it completed",
        ),
    ];
    for (scenario, mistake) in failing_on_expectations {
        if verdicts.get(scenario).is_none_or(|v| v.skipped.is_some() || v.passed) {
            missed.push(format!("{scenario}: passed ({mistake})"));
        }
    }
    assert!(missed.is_empty(), "the catalogue missed: {missed:#?}");
    let failing = run.iter().filter(|v| !v.passed).count();
    assert!(failing * 2 > run.len(), "a naive harness fails most of the files it runs ({failing} of {})", run.len());
    // What it does not declare is skipped, never run into: a dead-letter handler it never had
    // is not one of its bugs.
    assert!(
        verdicts
            .get("regressions/dead-lettered-turn")
            .is_some_and(|v| v.skipped.as_ref().is_some_and(|s| s.capabilities() == ["dead-letters"])),
        "a file configuring a dead-letter handler is skipped for a harness without one"
    );
}

/// What the naive harness skips of the shipped catalogue, and why, is a claim checked in beside
/// this test: a change in what it declares, or in how a file's needs are derived, is a diff of
/// `tests/skipped.snap`, never files passing quietly as ignored.
#[test]
fn what_it_skips_is_a_checked_claim() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let harness = naive_harness::factory();
    let checked = rig::testing::check_skipped_claims(
        harness.as_ref(),
        &root.join("../../scenarios"),
        &root.join("tests/skipped.snap"),
    );
    checked.unwrap_or_else(|failure| panic!("{failure}"));
}
