# Recipes for working on the rig. `just --list` shows them.

# Run every test: unit tests, one test per scenario file, snapshot checks. Every test binary
# runs, whichever fails first (the README's test command).
test:
    cargo test --workspace --no-fail-fast

# Run the shipped scenarios (or the given paths) and print one line per run. The dev profile,
# like `cargo test`, so the two share one build (its dependencies are optimised).
run *paths="scenarios":
    cargo run -p rig -- run {{paths}}

# Replay one run of a scenario from its seed, with its full trace written next to it.
replay file seed:
    cargo run -p rig -- run {{file}} --seed {{seed}} --trace {{file}}.seed{{seed}}.trace.jsonl

# Draw one run of a scenario as a timeline page and a Mermaid diagram next to the file.
timeline file seed policy="reference":
    cargo run -p rig -- run {{file}} --seed {{seed}} --policy {{policy}} --timeline {{file}}.seed{{seed}}.html --mermaid {{file}}.seed{{seed}}.md

# The nightly matrix on this machine (every core), failing runs written to failures/.
matrix seeds="0..2000":
    cargo run --release -p rig -- matrix scenarios --seeds {{seeds}} --junit junit.xml --out failures

# Install `rig` on the PATH, so repro lines run as printed from any folder.
install:
    cargo install --path rig --locked

# Review changed snapshots interactively (needs cargo-insta: cargo install cargo-insta).
review:
    cargo insta review --workspace

# Formatting and lints, as CI checks them.
lint:
    cargo fmt --all -- --check
    cargo clippy --workspace --all-targets -- -D warnings

# Speed and memory benchmarks (release build): the scenario catalogue (three cold passes, the
# sweep and explore figures), then the proxy.
bench:
    cargo run --release -p rig -- bench scenarios --seeds 0..20 --passes 3
    cargo run --release -p proxy --bin proxy-bench

# A profile-guided release build of `rig` (.ci/release-pgo): built instrumented, trained on the
# shipped catalogue, built again with the profile; the same runs for less CPU (README, "Speed"),
# for twice the build time. Prints the binary's path (target/pgo/use/release/rig).
release-pgo:
    .ci/release-pgo

# Record the catalogue's speed as a baseline, then compare later runs with it (same machine).
bench-baseline file="target/bench-baseline.json":
    cargo run --release -p rig -- bench scenarios --seeds 0..20 --passes 3 --write-baseline {{file}}

bench-compare file="target/bench-baseline.json":
    cargo run --release -p rig -- bench scenarios --seeds 0..20 --passes 3 --baseline {{file}}

# This checkout's speed against an earlier revision, paired (A B A B) on this machine: builds
# REV in its own worktree and target directory (target/bench-against/), runs both binaries in
# turn over REV's scenario files, and reports the ratio of CPU per pass.
bench-against rev seeds="0..20" rounds="4":
    .ci/bench-against {{rev}} {{seeds}} {{rounds}}

# Planted bugs (.cargo/planted.toml): which realistic bugs, each behind a switch compiled in only
# with the `planted` feature, the catalogue, sweep and explore, and the tests catch. One build
# serves every bug (`RIG_PLANTED=<id>` turns one on). Arguments go to .ci/planted, e.g.
# `just planted --all-layers --markdown`, `just planted --only small-retry-under-a-fresh-key`.
planted *args:
    .ci/planted {{args}}

# Mutation testing (cargo-mutants 27, `cargo install cargo-mutants --locked`): every mutant of
# the scoped code, one at a time, then the score per module. Hours on two cores; `shard=k/n`
# runs a slice, as the nightly does. rig/docs/testing.md says what it measures. Without debug
# info a mutant's rebuild takes well under half the time (it builds into the usual target/debug,
# so the next plain `cargo test` rebuilds once).
mutants shard="0/1":
    RIG_SEED=0 RIG_MUTANTS=1 CARGO_PROFILE_DEV_DEBUG=0 cargo mutants --shard {{shard}} -o target/mutants
    RIG_SEED=0 RIG_MUTANTS=1 CARGO_PROFILE_DEV_DEBUG=0 cargo mutants --config .cargo/mutants-explore.toml --shard {{shard}} -o target/mutants-explore
    .ci/mutants-report target/mutants target/mutants-explore

# Mutation testing of one module, the fast way: its mutants (a regex on their names, which start
# with the file's path) against the unit tests first, then what survived against the full
# selection; `.ci/mutants-report` reads both passes. For example
# `just mutants-module '^rig/src/oracle/' target/mutants-oracle`.
mutants-module re out="target/mutants-module" config=".cargo/mutants.toml":
    RIG_SEED=0 RIG_MUTANTS=1 CARGO_PROFILE_DEV_DEBUG=0 cargo mutants --config .cargo/mutants-unit.toml --re '{{re}}' -o {{out}}
    RIG_SEED=0 RIG_MUTANTS=1 CARGO_PROFILE_DEV_DEBUG=0 cargo mutants --config {{config}} --re '{{re}}' -o {{out}} --iterate
    .ci/mutants-report --files {{out}}/mutants.out.old {{out}}/mutants.out

