//! The naive harness against its own scenario files: one test per file, each seed twice with
//! equal trace hashes, and an insta snapshot per file. This is all it takes.

rig::scenario_tests!(harness = naive_harness::factory(), scenarios = "scenarios", snapshots = "snapshots");
