//! The explorer's abstract state is read through the record layout and what the services saw,
//! so it means the same for this harness as for the reference: the same workload, run by two
//! correct harnesses, ends in the same abstract state; and a guided exploration of it is
//! deterministic here too (see [`rig::testing::check_abstract_state`]).

use std::path::Path;

#[test]
fn workloads_end_in_the_reference_abstract_state_and_guided_exploration_repeats() {
    let workloads = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scenarios/workloads");
    rig::testing::check_abstract_state(&second_harness::factory(), &workloads);
}
