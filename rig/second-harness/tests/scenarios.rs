//! The shipped catalogue against the second harness: every file it has the capabilities for
//! runs, each seed twice with equal trace hashes, with a snapshot per file.

rig::scenario_tests!(harness = second_harness::factory(), scenarios = "../../scenarios", snapshots = "snapshots");
