//! Every file under `scenarios/` is its own test, against the reference harness: each policy it
//! declares, from several seeds (`RIG_SEEDS=A..B` or `RIG_SEED=N` to choose), twice per seed with
//! equal trace hashes; its outcome must match the insta snapshot under `snapshots/` with the same
//! path and stem. This is the same macro a user's crate runs against its own harness. The
//! reference declares the whole contract and every policy a file names, so a file it would skip
//! fails here rather than passing as ignored; `tests/skipped.snap` claims as much.

rig::scenario_tests!(
    harness = rig::reference(),
    scenarios = "../scenarios",
    snapshots = "../snapshots",
    every_file_runs = true,
    skipped = "tests/skipped.snap"
);
