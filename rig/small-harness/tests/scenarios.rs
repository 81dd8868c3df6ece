//! The shipped catalogue against the small harness (`turns` and `checkpoints`): every file it
//! has the capabilities for runs, each seed twice with equal trace hashes, with a snapshot per
//! file; what it skips, and why, is the claim in `tests/skipped.snap`.

rig::scenario_tests!(
    harness = small_harness::factory(),
    scenarios = "../../scenarios",
    snapshots = "snapshots",
    skipped = "tests/skipped.snap"
);
