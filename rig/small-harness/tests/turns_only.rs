//! The shipped catalogue against the small harness declaring `turns` alone: what it skips, and
//! why, is the claim in `tests/skipped-turns-only.snap`.

rig::scenario_tests!(
    harness = small_harness::turns_only(),
    scenarios = "../../scenarios",
    skipped = "tests/skipped-turns-only.snap"
);
