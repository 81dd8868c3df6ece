//! The shipped catalogue against the naive harness: the scenario files written for the reference
//! harness catch the naive one's mistakes, judged from what the services saw. Each expected
//! catch below follows from one of the mistakes listed in `src/lib.rs`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Every shipped scenario, run as the naive harness claims (`reference`), seed 0: the oracles
/// that fired and whether the run met the file's expectations.
fn verdicts() -> BTreeMap<String, (BTreeSet<&'static str>, bool)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scenarios");
    let files = rig::scenario_files(std::slice::from_ref(&root)).unwrap();
    let harness = naive_harness::factory();
    let mut verdicts = BTreeMap::new();
    for file in files {
        let scenario = rig::Scenario::load(&file).unwrap();
        let Some(reference) = scenario.run_of("reference") else { continue };
        let outcome = rig::run_with(&harness, &scenario, reference, 0);
        let fired = outcome.violations.iter().map(|v| v.oracle.name()).collect();
        let name = file.strip_prefix(&root).unwrap().with_extension("").display().to_string();
        verdicts.insert(name, (fired, outcome.passed));
    }
    verdicts
}

#[test]
fn the_catalogue_catches_the_naive_harness() {
    let verdicts = verdicts();
    for (name, (fired, passed)) in &verdicts {
        let fired: Vec<&str> = fired.iter().copied().collect();
        println!("{:<60} {} [{}]", name, if *passed { "pass" } else { "FAIL" }, fired.join(", "));
    }
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
        ("regressions/dead-lettered-turn", "stranded", "dead letters refused"),
        ("regressions/provider-stopped-mid-call", "ledger", "an unanswered request taken for a failure"),
    ];
    let mut missed = Vec::new();
    for (scenario, oracle, mistake) in expected {
        let caught = verdicts.get(scenario).is_some_and(|(fired, _)| fired.contains(oracle));
        if !caught {
            missed.push(format!("{scenario}: `{oracle}` did not fire ({mistake})"));
        }
    }
    // Caught by the scenario's own expectations rather than an always-on oracle.
    let failing_on_expectations = [
        ("harness-switch/interrupt-before-submission", "the import reruns the turn and drops the unfinished action"),
        ("smoke/healthy-turn", "the reply lacks `next_step` and the record its `turn_count`"),
    ];
    for (scenario, mistake) in failing_on_expectations {
        if verdicts.get(scenario).is_none_or(|(_, passed)| *passed) {
            missed.push(format!("{scenario}: passed ({mistake})"));
        }
    }
    assert!(missed.is_empty(), "the catalogue missed: {missed:#?}");
    let failing = verdicts.values().filter(|(_, passed)| !passed).count();
    assert!(
        failing * 2 > verdicts.len(),
        "a naive harness fails most of the catalogue ({failing} of {})",
        verdicts.len()
    );
}
