//! A finding's signature stays the same from seed to seed for a harness that mints its ids at
//! random: the second harness names each action `act-<uuid>`, from the seed's stream. A baseline
//! keys findings by signature, and each night explores new seeds: with the ids in it, every
//! known finding would be new every night.

use rig::explore::{self, Signature, SweepOptions};
use rig::HarnessFactory;
use rig::Scenario;
use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;

/// Each single cut the sweep of `workload` at `seed` tries: its class as a cut names it, and as
/// a finding's signature holds it.
fn classes(harness: &Arc<dyn HarnessFactory>, workload: &str, seed: u64) -> (BTreeSet<String>, BTreeSet<String>) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scenarios/workloads").join(workload);
    let scenario = Scenario::load(&path).unwrap();
    let options = SweepOptions { seed, ..SweepOptions::default() };
    let plan = explore::plan(harness, &scenario, &options).expect("the harness serves the workload");
    let cut = plan.jobs.iter().map(|cuts| cuts[0].class()).collect();
    let signed = plan.jobs.iter().map(|cuts| Signature::of(workload, "ledger", cuts).cuts.join(" + ")).collect();
    (cut, signed)
}

#[test]
fn a_signature_does_not_move_with_the_seed_for_a_harness_that_mints_its_ids() {
    let harness = second_harness::factory();
    let (cut_0, signed_0) = classes(&harness, "rounds-any-harness.toml", 0);
    let (cut_1, signed_1) = classes(&harness, "rounds-any-harness.toml", 1);
    assert!(cut_0.iter().any(|c| c.contains("action_id=act-")), "{cut_0:#?}");
    assert_ne!(cut_0, cut_1, "its ids are drawn from the seed's stream, so its cuts name other calls");
    assert_eq!(signed_0, signed_1, "and its findings' signatures are the same");
    assert!(signed_0.iter().any(|c| c.contains("action_id=act-<id>]")), "{signed_0:#?}");
}
