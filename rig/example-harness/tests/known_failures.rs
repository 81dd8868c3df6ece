//! The naive harness as a team adopts the rig with a harness that is not yet clean: the
//! finalization files of incident 001 as its test suite, with the failures its flaws cause today
//! listed in `known-failures.toml` (written by `RIG_WRITE_BASELINE=1 cargo test -p naive-harness
//! --test known_failures`). The suite is green while the harness fails only on those; a new
//! failure fails it, and so does a listed one that passes now (a fixed flaw: take it out).
rig::scenario_tests!(
    harness = naive_harness::factory(),
    scenarios = "../../scenarios/incident-001/finalization",
    baseline = "known-failures.toml"
);
