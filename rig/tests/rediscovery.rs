//! Rediscovery (issue 24, item 5): every known-bad policy of the reference harness is found again
//! by the oracles alone, from a workload of `scenarios/workloads/` (no scripted cuts, its turns
//! delivered through a queue), while the reference harness is clean there. The table is the one in
//! rig/docs/explore.md ("Rediscovery"); the policies are those of rig/docs/oracles.md ("Harness
//! policies"). Both documents are read here, so neither can drift from what is tested.
//!
//! Each row is checked the cheap way by default (the uncut run, or the few seeds of an
//! exploration that find it); `RIG_REDISCOVERY_SWEEPS=1` (the nightly workflow) also sweeps
//! every workload at depth 1 under the reference harness and requires it clean.

use rig::explore::{self, SweepOptions, Verdict};
use rig::Scenario;
use std::collections::BTreeSet;
use std::ops::Range;
use std::path::{Path, PathBuf};

/// How a policy is found from its workload.
#[derive(Debug, Clone)]
enum Search {
    /// The uncut run already trips the oracle: no cut is needed.
    Uncut,
    /// `rig explore --seeds A..B --policy P`: some seed's mix trips the oracle (the uncut run
    /// does not).
    Explore(Range<u64>),
    /// `rig sweep --policy P` (depth 1): the placement of this id (one of the sweep's runs)
    /// trips the oracle; the same placement under the reference harness trips nothing. The
    /// whole sweep is the nightly's (`RIG_REDISCOVERY_SWEEPS=1`).
    Sweep(&'static str),
}

struct Row {
    policy: &'static str,
    workload: &'static str,
    search: Search,
    oracle: &'static str,
}

const fn row(policy: &'static str, workload: &'static str, search: Search, oracle: &'static str) -> Row {
    Row { policy, workload, search, oracle }
}

use Search::{Explore, Sweep, Uncut};

/// Policy, workload, how it is found, the oracle that finds it (one the policy declares).
fn table() -> Vec<Row> {
    vec![
        row("swallow", "queued-successor.toml", Explore(9..10), "liveness"),
        row("propagate", "multi-round.toml", Explore(9..10), "liveness"),
        row("unguarded", "multi-round.toml", Explore(6..7), "monotonic"),
        row(
            "replay-unfinished",
            "switch-with-lease.toml",
            Sweep("crash-caller-after @ call ticket::create[action_id=t1:1:0]#1"),
            "blind-replay",
        ),
        row(
            "fresh-key",
            "switch-with-lease.toml",
            Sweep("isolate-caller @ call ticket::create[action_id=t1:1:0]#1"),
            "effects",
        ),
        row(
            "no-fencing",
            "switch-with-lease.toml",
            Sweep("isolate-caller @ call session::append[session_id=s1]#1"),
            "one-owner",
        ),
        row("assume-failed", "multi-round.toml", Explore(48..49), "ledger"),
        row("close-unsettled", "multi-round.toml", Explore(15..16), "calls-closed"),
        row("results-only-when-answered", "multi-round.toml", Explore(13..14), "calls-closed"),
        row("in-memory-cancel", "cancel-after-a-lookup.toml", Explore(7..8), "cancellation"),
        row("reset-on-retry", "budget-across-a-retry.toml", Explore(6..7), "budget"),
        row("mint-child-budget", "budget-across-a-child.toml", Uncut, "budget"),
        row("readmit-consumed-input", "queued-successor.toml", Explore(20..21), "admitted-once"),
        row("unrecorded-actions", "multi-round.toml", Uncut, "ledger"),
        row("unconfirmed-reply", "multi-round.toml", Explore(45..46), "truthful-reply"),
        row("applied-on-accept", "cancel-after-a-lookup.toml", Uncut, "truthful-reply"),
        row("keep-lease", "switch-with-lease.toml", Uncut, "liveness"),
        row("cancel-counts-reads", "cancel-after-a-lookup.toml", Uncut, "cancellation"),
        row("stale-reply", "multi-round.toml", Uncut, "truthful-reply"),
        row("fence-effects-only", "takeover-while-running.toml", Explore(123..124), "one-owner"),
        row("latest-on-resume", "config-promoted-and-withdrawn.toml", Explore(16..17), "pinned-config"),
        row("overlay-pinned", "config-promoted-and-withdrawn.toml", Uncut, "safety-overlay"),
        row("call-unavailable", "config-promoted-and-withdrawn.toml", Uncut, "safety-overlay"),
        row("drop-unavailable", "config-promoted-and-withdrawn.toml", Uncut, "calls-closed"),
        row("cancel-by-clock", "cancel-during-an-effect.toml", Uncut, "cancellation"),
        row(
            "redo-completed-rounds",
            "long-turn.toml",
            Sweep("crash @ point harness@after_completion#2"),
            "recovery-cost",
        ),
        row("status-from-memory", "status-during-and-after.toml", Uncut, "truthful-reply"),
        row("hold-drops-mutations", "hook-chain-held-and-released.toml", Uncut, "hook-arguments"),
        row("release-original-arguments", "hook-chain-held-and-released.toml", Uncut, "hook-arguments"),
        row(
            "in-memory-expiry",
            "approval-expires-before-a-late-release.toml",
            Sweep("crash-caller-before @ call state::set[scope=harness_turn key=s1 value.status=held]#1"),
            "approval-expiry",
        ),
        row("stale-context", "multi-round.toml", Uncut, "model-context"),
        row("entry-per-delta", "streamed-replies.toml", Uncut, "whole-replies"),
        row(
            "arrival-order-stream",
            "streamed-replies.toml",
            Sweep("reorder @ frame invokefunction harness::stream to harness#2"),
            "whole-replies",
        ),
        row("resume-without-cas", "paused-then-resumed-twice.toml", Uncut, "one-owner"),
        row("assume-sent", "multi-round.toml", Explore(0..1), "ledger"),
        row("remove-before-admit", "queued-successor.toml", Explore(2..3), "stranded"),
        row("skip-says-running", "budget-across-a-retry.toml", Explore(0..1), "truthful-reply"),
        row("no-renewal", "switch-with-lease.toml", Explore(307..308), "recovery-cost"),
        row("blind-dead-letter", "budget-across-a-retry.toml", Explore(0..1), "truthful-reply"),
        row("hold-turn-only", "hook-chain-held-and-released.toml", Uncut, "liveness"),
        row("run-on-expiry", "approval-expires-before-a-late-release.toml", Uncut, "approval-expiry"),
        row("unversioned-requests", "config-promoted-and-withdrawn.toml", Uncut, "pinned-config"),
        row("hold-over-the-end", "budget-across-a-retry.toml", Explore(0..1), "monotonic"),
        row("timeout-as-cancelled", "multi-round.toml", Explore(11..12), "outcome"),
        row("retry-as-new-action", "multi-round.toml", Explore(4..5), "ledger"),
        row("unkeyed-answer", "multi-round.toml", Explore(6..7), "outcome"),
    ]
}

/// The known-bad policies no sweep or exploration of a workload finds, with why.
const NOT_BY_ORACLES: [(&str, &str); 5] = [
    (
        "remembered-commands",
        "no workload presses a pause on a worker other than the one running the turn, then resumes it there",
    ),
    ("dedupe-queued-only", "no workload sends a message again under its idempotency key"),
    ("overlay-of-the-first-turn", "no workload with versioned configuration runs a second turn of a session"),
    (
        "command-without-cas",
        "no workload applies a command to a parked turn while a Resume on another worker claims it",
    ),
    (
        "command-for-any-turn",
        "no workload leaves a command waiting for a turn that has ended while its session goes on to a later turn",
    ),
];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn workload(name: &str) -> Scenario {
    Scenario::load(&root().join("scenarios/workloads").join(name)).unwrap()
}

/// The workload as sweeps and explorations run it: without scripted cuts.
fn uncut(scenario: &Scenario) -> Scenario {
    let mut bare = scenario.clone();
    bare.cuts.clear();
    bare.interrupts.clear();
    bare.proxy = None;
    bare
}

fn fired_uncut(scenario: &Scenario, policy: &str, seed: u64) -> BTreeSet<String> {
    explore::fired(&rig::run(&uncut(scenario), &explore::bare_run(policy), seed))
}

/// The rows of a Markdown table under `heading` in `doc`: each row's cells, without backticks.
fn doc_table(doc: &str, heading: &str) -> Vec<Vec<String>> {
    let text = std::fs::read_to_string(root().join(doc)).unwrap();
    let section = text.split(heading).nth(1).unwrap_or_else(|| panic!("{doc} has no `{heading}`"));
    section
        .lines()
        .skip_while(|line| !line.starts_with('|'))
        .take_while(|line| line.starts_with('|'))
        .skip(2)
        .map(|line| line.trim().trim_matches('|').split('|').map(|cell| cell.trim().replace('`', "")).collect())
        .collect()
}

#[test]
fn the_table_covers_every_known_bad_policy_with_an_oracle_it_declares() {
    let policies = doc_table("rig/docs/oracles.md", "## Harness policies");
    let known_bad: BTreeSet<String> =
        policies.iter().map(|cells| cells[0].clone()).filter(|p| p != "reference").collect();
    assert!(known_bad.len() > 30, "the policy table of oracles.md: {known_bad:?}");
    let rows = table();
    let listed: BTreeSet<String> =
        rows.iter().map(|r| r.policy.to_string()).chain(NOT_BY_ORACLES.iter().map(|(p, _)| p.to_string())).collect();
    assert_eq!(listed, known_bad, "every known-bad policy is rediscovered or said not to be rediscoverable");
    for r in &rows {
        let cells = policies.iter().find(|cells| cells[0] == r.policy).unwrap();
        let caught_by = &cells[2];
        assert!(
            caught_by.split(',').any(|oracle| oracle.trim() == r.oracle),
            "{}: `{}` is not among the oracles oracles.md says catch it ({caught_by})",
            r.policy,
            r.oracle
        );
    }
}

#[test]
fn the_rediscovery_section_of_explore_md_is_this_table() {
    let documented: Vec<Vec<String>> = doc_table("rig/docs/explore.md", "## Rediscovery");
    let expected: Vec<Vec<String>> = table()
        .iter()
        .map(|r| {
            let how = match &r.search {
                Uncut => "the uncut run".to_string(),
                Explore(seeds) => format!("explore --seeds {}..{}", seeds.start, seeds.end),
                Sweep(id) => format!("sweep: {id}"),
            };
            vec![r.policy.to_string(), r.workload.to_string(), how, r.oracle.to_string()]
        })
        .chain(
            NOT_BY_ORACLES
                .iter()
                .map(|(p, why)| vec![p.to_string(), "none".into(), why.replace('`', ""), "none".into()]),
        )
        .collect();
    assert_eq!(documented, expected, "rig/docs/explore.md's Rediscovery table");
}

#[test]
fn every_known_bad_policy_is_rediscovered_from_its_workload_and_the_reference_is_clean_there() {
    let harness = rig::reference();
    let mut failures = Vec::new();
    for r in table() {
        let scenario = workload(r.workload);
        let label = format!("{} on {} ({:?})", r.policy, r.workload, r.search);
        match &r.search {
            Uncut => {
                let fired = fired_uncut(&scenario, r.policy, 0);
                if !fired.contains(r.oracle) {
                    failures.push(format!("{label}: the uncut run trips {fired:?}, not `{}`", r.oracle));
                }
                let reference = fired_uncut(&scenario, "reference", 0);
                if !reference.is_empty() {
                    failures.push(format!("{label}: the reference harness trips {reference:?} uncut"));
                }
            }
            Sweep(id) => {
                let verdict = |policy: &str| {
                    let options = SweepOptions { policy: policy.into(), ..SweepOptions::default() };
                    let plan = explore::plan(&harness, &scenario, &options).expect("the harness serves the workload");
                    let job = plan.jobs.iter().find(|job| job.len() == 1 && job[0].id() == *id)?;
                    Some(explore::run_job(&harness, &plan, job).verdict)
                };
                match verdict(r.policy) {
                    Some(Verdict::Fired(oracles)) if oracles.contains(r.oracle) => {}
                    other => failures.push(format!("{label}: the sweep's run of it ends {other:?}")),
                }
                match verdict("reference") {
                    Some(Verdict::Clean) => {}
                    other => failures.push(format!("{label}: under reference, the same placement ends {other:?}")),
                }
            }
            Explore(seeds) => {
                if fired_uncut(&scenario, r.policy, 0).contains(r.oracle) {
                    failures.push(format!("{label}: the uncut run already trips `{}`: say Uncut", r.oracle));
                }
                let found = seeds.clone().find_map(|seed| {
                    let exploration = explore::explore(&harness, &scenario, r.policy, seed, false)
                        .expect("the harness serves the workload");
                    exploration.fired.contains(r.oracle).then_some(exploration)
                });
                match found {
                    None => failures.push(format!("{label}: no seed's mix trips `{}`", r.oracle)),
                    Some(exploration) => {
                        let shrunk = exploration.shrunk.expect("a failing mix is shrunk");
                        if shrunk.oracle == r.oracle && shrunk.reference_fired.as_ref().is_some_and(|f| !f.is_empty()) {
                            failures.push(format!(
                                "{label}: the shrunk cuts trip {:?} under reference too",
                                shrunk.reference_fired
                            ));
                        }
                    }
                }
                for seed in seeds.clone() {
                    let reference = explore::explore(&harness, &scenario, "reference", seed, false)
                        .expect("the harness serves the workload");
                    if !reference.fired.is_empty() {
                        failures.push(format!("{label}: reference seed {seed} trips {:?}", reference.fired));
                    }
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The costly half of "the reference harness is clean there": every placement of a depth-1 sweep
/// of each workload of the table. Nightly only (`RIG_REDISCOVERY_SWEEPS=1`).
#[test]
fn a_depth_one_sweep_of_every_rediscovery_workload_is_clean_under_reference() {
    if std::env::var_os("RIG_REDISCOVERY_SWEEPS").is_none() {
        eprintln!("skipped: set RIG_REDISCOVERY_SWEEPS=1 to sweep every rediscovery workload (the nightly does)");
        return;
    }
    let workloads: BTreeSet<&str> = table().iter().map(|r| r.workload).collect();
    let mut dirty = Vec::new();
    for name in workloads {
        let report = explore::sweep(&rig::reference(), &workload(name), &SweepOptions::default())
            .expect("the harness serves the workload");
        if !report.baseline_fired.is_empty() || !report.findings.is_empty() {
            dirty.push(format!(
                "{name}: uncut {:?}, findings {:?}",
                report.baseline_fired,
                report.findings.iter().map(|f| format!("{} with {:?}", f.oracle, f.placements)).collect::<Vec<_>>()
            ));
        }
    }
    assert!(dirty.is_empty(), "{}", dirty.join("\n"));
}
