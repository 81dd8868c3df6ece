//! Finding what nobody scripted, on the shipped workloads: a depth-1 sweep of a small workload
//! finds nothing under the reference harness; the same sweep under a known-bad policy finds the
//! oracle that catches it and writes it as a scenario that separates the two; an exploration
//! draws the same mix from the same seed and shrinks what fails.

use rig::explore::{self, Kind, Placement, Site, SweepOptions, Verdict};
use rig::{EventKind, Scenario};
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

fn workload(name: &str) -> Scenario {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scenarios/workloads").join(name);
    Scenario::load(&path).unwrap()
}

#[test]
fn a_depth_one_sweep_of_a_workload_finds_nothing_under_reference() {
    // (queued-successor.toml was this workload until outages joined the cut space: a store down
    // past the reference harness's background retries strands its queued input, a known gap of
    // rig/docs/explore.md.)
    let report = explore::sweep(&rig::reference(), &workload("multi-round.toml"), &SweepOptions::default())
        .expect("the harness serves the workload");
    assert!(report.baseline_fired.is_empty(), "the uncut workload trips {:?}", report.baseline_fired);
    assert!(report.runs.len() > 100, "the cut space is the whole workload: {} runs", report.runs.len());
    let unreached = report.runs.iter().filter(|r| r.verdict == Verdict::Unreached).count();
    assert_eq!(unreached, 0, "every site of the uncut run is reached again with the same seed");
    let findings: Vec<String> = report
        .findings
        .iter()
        .map(|f| format!("{} with {}", f.oracle, f.placements.iter().map(|p| p.id()).collect::<Vec<_>>().join(" + ")))
        .collect();
    assert!(findings.is_empty(), "the reference harness has findings: {findings:#?}");
}

#[test]
fn a_sweep_under_a_known_bad_policy_rediscovers_it_as_a_scenario_that_separates_the_two() {
    let options = SweepOptions { policy: "assume-failed".into(), ..SweepOptions::default() };
    let report = explore::sweep(&rig::reference(), &workload("multi-round.toml"), &options)
        .expect("the harness serves the workload");
    let finding = report.findings.iter().find(|f| f.oracle == "ledger").expect("`ledger` catches assume-failed");
    assert_eq!(finding.reference_fired.as_ref().map(|f| f.len()), Some(0), "the reference harness is clean there");
    let scenario =
        Scenario::parse(Path::new("finding.toml"), &finding.scenario_file).expect("a finding is a valid scenario");
    for policy in ["reference", "assume-failed"] {
        let run = scenario.run_of(policy).expect("both policies are declared");
        let outcome = rig::run(&scenario, run, 0);
        assert!(outcome.passed, "{policy}: {}", rig::report::human(&outcome));
    }
    let fired = rig::run(&scenario, scenario.run_of("assume-failed").unwrap(), 0);
    assert!(fired.violations.iter().any(|v| v.oracle.name() == "ledger"), "the finding fires under the bad policy");
}

#[test]
fn an_exploration_replays_its_seed_and_shrinks_to_the_cuts_that_matter() {
    let scenario = workload("multi-round.toml");
    let harness = rig::reference();
    // Seeds draw their mix from a stream of their own: the same seed, the same mix, bit for bit.
    let first =
        explore::explore(&harness, &scenario, "replay-unfinished", 25, false).expect("the harness serves the workload");
    let again =
        explore::explore(&harness, &scenario, "replay-unfinished", 25, false).expect("the harness serves the workload");
    assert_eq!(first.mix, again.mix);
    assert_eq!(first.fired, again.fired);
    let failing = (0..60)
        .map(|seed| {
            explore::explore(&harness, &scenario, "replay-unfinished", seed, false)
                .expect("the harness serves the workload")
        })
        .find(|e| e.shrunk.is_some())
        .expect("some seed's mix catches replay-unfinished");
    let shrunk = failing.shrunk.unwrap();
    assert!(shrunk.placements.len() <= 2, "shrunk to {} cuts", shrunk.placements.len());
    assert!(shrunk.placements.len() <= failing.mix.len());
    // It shrinks for the first oracle the mix fired, and keeps that one to the end.
    assert_eq!(Some(&shrunk.oracle), failing.fired.iter().next(), "the mix fired {:?}", failing.fired);
    reproduces(&shrunk).unwrap_or_else(|e| panic!("the shrunk file still catches the policy: {e}"));
}

/// A shrunk finding must still be the cuts' doing. Shrinking once removed the workload step that
/// delivered the turn: the seeded `running` turn was then left running with no cut at all, so
/// `liveness` still fired, and the written file (no delivery, cuts that never fire) reproduced
/// nothing the cuts did.
#[test]
fn a_shrunk_finding_trips_its_oracle_only_with_its_cuts() {
    let scenario = workload("queued-successor.toml");
    let harness = rig::reference();
    // `swallow` (the released binary) never recovers a turn whose terminal write failed: some
    // seed's mix leaves it running, and `liveness` catches it. (Which seed depends on the kinds
    // of cut the space has, so the test looks for one.)
    let shrunk = (0..60)
        .filter_map(|seed| {
            explore::explore(&harness, &scenario, "swallow", seed, false)
                .expect("the harness serves the workload")
                .shrunk
        })
        .find(|shrunk| shrunk.oracle == "liveness")
        .expect("some seed's mix leaves a turn running under swallow");
    let file = Scenario::parse(Path::new("shrunk.toml"), &shrunk.scenario_file).unwrap();
    let run = file.run_of("swallow").unwrap();
    let with_cuts = rig::run(&file, run, shrunk.seed);
    assert!(
        with_cuts.violations.iter().any(|v| v.oracle.name() == shrunk.oracle),
        "{}",
        rig::report::human(&with_cuts)
    );
    let mut without = file.clone();
    without.cuts.clear();
    let bare = rig::run(&without, without.run_of("swallow").unwrap(), shrunk.seed);
    assert!(
        !bare.violations.iter().any(|v| v.oracle.name() == shrunk.oracle),
        "the shrunk file trips `{}` with no cut at all:\n{}",
        shrunk.oracle,
        shrunk.scenario_file
    );
    reproduces(&shrunk).unwrap_or_else(|e| panic!("the shrunk file does not reproduce: {e}"));
}

// The cut space as a product: every site of the uncut run, by class, with the kinds of cut that
// apply there. Each test derives what the space must hold from the uncut run's trace alone,
// as `rig/src/explore/space.rs` documents it, and compares exactly.

/// How many like sites the space tries per class (`SpaceOptions::default().nth_max`).
const NTH_MAX: u64 = 4;
/// What a call is about, as the space names it: scope, key, status, session, action, owner.
const IDENTITY: [&str; 6] = ["scope", "key", "value.status", "session_id", "action_id", "owner"];
/// The calls that change something: every crash kind applies there.
const WRITES: [&str; 9] = [
    "state::set",
    "state::delete",
    "state::compare-and-set",
    "state::acquire-lease",
    "state::renew-lease",
    "state::release-lease",
    "session::append",
    "session::set-status",
    "ticket::create",
];

fn is_worker(name: &str) -> bool {
    name == "harness" || name == "replacement"
}

/// The uncut run of a workload under `reference` and the space the sweep derives from it.
fn space_of(name: &str) -> (rig::RunOutcome, Scenario, Vec<Placement>) {
    let plan = explore::plan(&rig::reference(), &workload(name), &SweepOptions::default())
        .expect("the harness serves the workload");
    let singles = plan.jobs.iter().map(|job| job[0].clone()).collect();
    (plan.baseline, plan.workload, singles)
}

/// The sites of `class` the space must hold: the 1st up to the `NTH_MAX`th of each like group.
fn expected_sites(groups: BTreeMap<Site, u64>) -> BTreeSet<Site> {
    let mut sites = BTreeSet::new();
    for (site, count) in groups {
        for nth in 1..=count.min(NTH_MAX) {
            sites.insert(match site.clone() {
                Site::Call { function, about, .. } => Site::Call { function, about, nth },
                Site::Frame { worker, up, frame, function, .. } => Site::Frame { worker, up, frame, function, nth },
                Site::Point { worker, point, .. } => Site::Point { worker, point, nth },
            });
        }
    }
    sites
}

/// Every call a worker made to a double, grouped as the space groups them (nth left 0).
fn worker_calls(baseline: &rig::RunOutcome) -> BTreeMap<Site, u64> {
    let mut groups = BTreeMap::new();
    for event in baseline.trace.events() {
        let EventKind::Call { function, payload, caller: Some(caller), .. } = &event.kind else { continue };
        if !is_worker(caller) {
            continue;
        }
        let about = IDENTITY
            .iter()
            .filter_map(|path| {
                let segments: Vec<String> = path.split('.').map(str::to_string).collect();
                proxy::lookup(payload, &segments)
                    .filter(|v| !v.is_null())
                    .map(|v| (path.to_string(), proxy::value_text(v)))
            })
            .collect();
        *groups.entry(Site::Call { function: function.to_string(), about, nth: 0 }).or_default() += 1;
    }
    groups
}

fn kinds_at(space: &[Placement], site: &Site) -> BTreeSet<Kind> {
    space.iter().filter(|p| p.site == *site).map(|p| p.kind).collect()
}

#[test]
fn the_cut_space_lists_every_call_a_worker_makes_to_a_double_with_the_read_kinds() {
    let (baseline, _, space) = space_of("switch-with-lease.toml");
    let expected = expected_sites(worker_calls(&baseline));
    let listed: BTreeSet<Site> =
        space.iter().filter(|p| matches!(p.site, Site::Call { .. })).map(|p| p.site.clone()).collect();
    assert_eq!(listed, expected, "the call sites of the uncut run");
    let doubles: BTreeSet<&str> = expected
        .iter()
        .filter_map(|s| match s {
            Site::Call { function, .. } => function.split("::").next(),
            _ => None,
        })
        .collect();
    assert_eq!(doubles, BTreeSet::from(["model", "session", "state", "ticket"]), "the workload calls every double");
    for site in &expected {
        let kinds = kinds_at(&space, site);
        for kind in [Kind::Timeout, Kind::Reject, Kind::Delay] {
            assert!(kinds.contains(&kind), "{site}: no {}", kind.name());
        }
    }
}

/// A call the scenario's driver makes to a double (an operator promoting a version, withdrawing
/// a service) is the story, not a worker's: the space cuts no such call.
#[test]
fn the_cut_space_leaves_the_drivers_own_calls_alone() {
    let (baseline, _, space) = space_of("config-promoted-and-withdrawn.toml");
    let called_by = |who: &str| -> BTreeSet<String> {
        baseline
            .trace
            .events()
            .iter()
            .filter_map(|e| match &e.kind {
                EventKind::Call { function, caller: Some(caller), .. } if caller == who => Some(function.to_string()),
                _ => None,
            })
            .collect()
    };
    let driver_only: BTreeSet<String> = called_by("driver").difference(&called_by("harness")).cloned().collect();
    assert!(driver_only.contains("config::withdraw"), "the workload's operator withdraws a service: {driver_only:?}");
    let cut =
        |function: &String| space.iter().any(|p| matches!(&p.site, Site::Call { function: f, .. } if f == function));
    assert!(!driver_only.iter().any(cut), "a driver's call in the space");
}

#[test]
fn a_delay_is_just_past_the_deadline_of_the_call_it_delays() {
    let (_, workload, space) = space_of("switch-with-lease.toml");
    let config = &workload.world.harness;
    for placement in space.iter().filter(|p| p.kind == Kind::Delay) {
        let Site::Call { function, .. } = &placement.site else { panic!("a delay on a call") };
        let deadline = match function.split("::").next() {
            Some("model") => config.model_timeout_ms,
            Some("ticket") => config.tool_timeout_ms,
            _ => config.session_timeout_ms,
        };
        // Just past it: the late reply still arrives while the run goes on, to a caller that
        // has given up on it.
        assert!(
            placement.ms.is_some_and(|ms| ms > deadline && ms <= deadline + 1_000),
            "{}: {:?} is not just past {deadline} ms",
            placement.id(),
            placement.ms
        );
    }
}

#[test]
fn the_cut_space_offers_every_crash_kind_at_every_write_and_none_at_a_read() {
    let (baseline, workload, space) = space_of("switch-with-lease.toml");
    let crashes = [
        Kind::LostAck,
        Kind::CrashCallerBefore,
        Kind::CrashCallerAfter,
        Kind::CrashService,
        Kind::CrashEngine,
        Kind::IsolateCaller,
    ];
    let pause_ms = (workload.world.harness.lease_ttl_ms * 3).max(5_000);
    let mut writes = 0;
    for site in expected_sites(worker_calls(&baseline)) {
        let Site::Call { function, .. } = &site else { unreachable!() };
        let kinds = kinds_at(&space, &site);
        let is_write = WRITES.contains(&function.as_str());
        writes += usize::from(is_write);
        for kind in crashes {
            assert_eq!(
                kinds.contains(&kind),
                is_write,
                "{site}: {} {}",
                kind.name(),
                if is_write { "missing" } else { "at a read" }
            );
        }
        for placement in space.iter().filter(|p| p.site == site && p.kind == Kind::IsolateCaller) {
            assert_eq!(placement.ms, Some(pause_ms), "{}", placement.id());
        }
    }
    assert!(writes > 0, "the workload writes");
}

#[test]
fn the_cut_space_pauses_the_caller_at_every_lease_grant_and_nowhere_else() {
    let (baseline, workload, space) = space_of("switch-with-lease.toml");
    let grants = baseline.trace.events().iter().filter(|e| matches!(e.kind, EventKind::Lease { .. })).count();
    assert!(grants >= 2, "the workload grants the lease to both workers: {grants}");
    let pause_ms = (workload.world.harness.lease_ttl_ms * 3).max(5_000);
    let acquisitions: BTreeSet<Site> = expected_sites(worker_calls(&baseline))
        .into_iter()
        .filter(|s| matches!(s, Site::Call { function, .. } if function == "state::acquire-lease"))
        .collect();
    let paused: BTreeSet<Site> = space.iter().filter(|p| p.kind == Kind::PauseCaller).map(|p| p.site.clone()).collect();
    assert_eq!(paused, acquisitions, "a pause past the lease at each acquisition, and only there");
    assert!(space.iter().filter(|p| p.kind == Kind::PauseCaller).all(|p| p.ms == Some(pause_ms)));
}

#[test]
fn the_cut_space_drops_and_duplicates_every_frame_kind_at_the_engine() {
    let (baseline, _, space) = space_of("switch-with-lease.toml");
    let mut groups: BTreeMap<Site, u64> = BTreeMap::new();
    for event in baseline.trace.events() {
        let EventKind::Frame { direction, peer, frame, function_id: Some(function), .. } = &event.kind else {
            continue;
        };
        if is_worker(peer) && matches!(*frame, "invokefunction" | "invocationresult") {
            let site = Site::Frame {
                worker: peer.to_string(),
                up: *direction == "in",
                frame: frame.to_string(),
                function: function.to_string(),
                nth: 0,
            };
            *groups.entry(site).or_default() += 1;
        }
    }
    let kinds: BTreeSet<(String, bool)> = groups
        .keys()
        .filter_map(|s| match s {
            Site::Frame { frame, up, .. } => Some((frame.clone(), *up)),
            _ => None,
        })
        .collect();
    assert_eq!(kinds.len(), 4, "invocations and results, both ways: {kinds:?}");
    let expected = expected_sites(groups);
    let listed: BTreeSet<Site> =
        space.iter().filter(|p| matches!(p.site, Site::Frame { .. })).map(|p| p.site.clone()).collect();
    assert_eq!(listed, expected, "the frame sites of the uncut run");
    for site in &expected {
        assert_eq!(kinds_at(&space, site), BTreeSet::from([Kind::Drop, Kind::Duplicate]), "{site}");
    }
}

#[test]
fn the_cut_space_reorders_every_fire_and_forget_frame_to_a_worker_and_nothing_else() {
    // The streamed answer's frames are the only calls nobody answers: each of them (up to the
    // space's bound) is held back for the next; answered frames, and frames from a worker, are not.
    let (baseline, _, space) = space_of("streamed-replies.toml");
    let mut groups: BTreeMap<Site, u64> = BTreeMap::new();
    for event in baseline.trace.events() {
        let EventKind::Frame { direction, peer, frame, function_id: Some(function), invocation_id } = &event.kind
        else {
            continue;
        };
        if peer == "harness" && *direction == "out" && *frame == "invokefunction" && invocation_id.is_none() {
            let site = Site::Frame {
                worker: peer.to_string(),
                up: false,
                frame: frame.to_string(),
                function: function.to_string(),
                nth: 0,
            };
            *groups.entry(site).or_default() += 1;
        }
    }
    let streamed: Vec<u64> = groups.values().copied().collect();
    assert_eq!(streamed, [5], "one stream of five frames: start, three deltas, stop");
    let reordered: BTreeSet<Site> = space.iter().filter(|p| p.kind == Kind::Reorder).map(|p| p.site.clone()).collect();
    assert_eq!(reordered, expected_sites(groups), "each streamed frame, up to the bound, and nothing else");
    assert!(space.iter().filter(|p| p.kind == Kind::Reorder).all(|p| p.ms.is_none()));
    let (_, _, unstreamed) = space_of("switch-with-lease.toml");
    assert!(unstreamed.iter().all(|p| p.kind != Kind::Reorder), "no stream, nothing to reorder");
}

#[test]
fn a_scripted_proxy_in_front_of_one_worker_leaves_only_its_frames_to_cut() {
    // A proxy fronts one worker: a sweep that keeps the file's own cuts adds its frame rules to
    // that proxy, so it lists the frames of that worker and of no other.
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scenarios/workloads/switch-with-lease.toml");
    let text = std::fs::read_to_string(&path).unwrap() + "\n[proxy]\nworker = \"replacement\"\n";
    let scenario = Scenario::parse(&path, &text).unwrap();
    let options = SweepOptions { keep_cuts: true, ..SweepOptions::default() };
    let plan = explore::plan(&rig::reference(), &scenario, &options).expect("the harness serves the workload");
    let workers: BTreeSet<String> = plan
        .jobs
        .iter()
        .filter_map(|job| match &job[0].site {
            Site::Frame { worker, .. } => Some(worker.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(workers, BTreeSet::from(["replacement".to_string()]), "the proxied worker's frames alone");
}

#[test]
fn the_cut_space_crashes_and_pauses_every_worker_at_every_interrupt_point() {
    let (baseline, _, space) = space_of("switch-with-lease.toml");
    let reached: BTreeSet<&str> = baseline.interrupt_points.keys().map(|(_, point)| point.as_str()).collect();
    assert_eq!(reached, rig::INTERRUPT_POINTS.into_iter().collect(), "the workload reaches every point");
    let groups: BTreeMap<Site, u64> = baseline
        .interrupt_points
        .iter()
        .map(|((worker, point), n)| (Site::Point { worker: worker.clone(), point: point.clone(), nth: 0 }, *n))
        .collect();
    let expected = expected_sites(groups);
    let listed: BTreeSet<Site> =
        space.iter().filter(|p| matches!(p.site, Site::Point { .. })).map(|p| p.site.clone()).collect();
    assert_eq!(listed, expected, "the interrupt points of the uncut run");
    for site in &expected {
        assert_eq!(kinds_at(&space, site), BTreeSet::from([Kind::Crash, Kind::Pause]), "{site}");
    }
}

/// A finding is a scenario file of its own: run under each policy it declares, it shows what it
/// says (the known-bad policy trips what the finding found, the reference harness nothing).
fn reproduces(finding: &explore::Finding) -> Result<(), String> {
    let file = Scenario::parse(Path::new(&finding.file_name), &finding.scenario_file).map_err(|e| e.to_string())?;
    for run in &file.runs {
        let outcome = rig::run(&file, run, finding.seed);
        if !outcome.passed {
            return Err(format!("{}\n{}", rig::report::human(&outcome), finding.scenario_file));
        }
    }
    Ok(())
}

/// Two ways findings once failed as files: a run that tripped three oracles was written as three
/// files declaring one each (each failed on the other two), and a workload step the cuts kept
/// from completing (a `wait_until` for an acknowledgement that never came) failed the file.
#[test]
fn every_finding_a_sweep_writes_reproduces() {
    let options = SweepOptions { policy: "no-fencing".into(), ..SweepOptions::default() };
    let report = explore::sweep(&rig::reference(), &workload("switch-with-lease.toml"), &options)
        .expect("the harness serves the workload");
    let oracles: BTreeSet<&str> = report.findings.iter().map(|f| f.oracle.as_str()).collect();
    // Every oracle rig/docs/oracles.md says catches no-fencing (one-owner by who sent each commit).
    let catching = BTreeSet::from(["blind-replay", "effects", "monotonic", "one-owner"]);
    assert_eq!(oracles, catching, "the sweep rediscovers no-fencing");
    let failing: Vec<String> = report
        .findings
        .iter()
        .filter(|f| f.reference_fired.as_ref().is_some_and(BTreeSet::is_empty))
        .filter_map(|f| reproduces(f).err().map(|e| format!("{} ({}): {e}", f.file_name, f.oracle)))
        .collect();
    assert!(
        failing.is_empty(),
        "{} of {} findings do not reproduce:\n{}",
        failing.len(),
        report.findings.len(),
        failing.join("\n\n")
    );
}

/// A harness that counts the runs made through it.
struct Counted {
    inner: std::sync::Arc<dyn rig::HarnessFactory>,
    runs: std::sync::atomic::AtomicUsize,
}

impl explore::Runs for Counted {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn run(&self, scenario: &Scenario, run: &rig::PolicyRun, seed: u64) -> rig::RunOutcome {
        self.runs.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        explore::Runs::run(&self.inner, scenario, run, seed)
    }

    fn skip(&self, workload: &Scenario, policy: &str) -> Option<rig::Skip> {
        explore::Runs::skip(&self.inner, workload, policy)
    }

    fn reference(&self) -> &dyn explore::Runs {
        &self.inner
    }
}

/// An exploration reports the runs it made, and its shrinking drops the cuts the finding does not
/// need.
#[test]
fn an_exploration_counts_its_runs_and_drops_the_cuts_it_does_not_need() {
    let scenario = workload("multi-round.toml");
    let harness = Counted { inner: rig::reference(), runs: Default::default() };
    let found = (0..60)
        .map(|seed| {
            harness.runs.store(0, std::sync::atomic::Ordering::Relaxed);
            let exploration = explore::explore(&harness, &scenario, "replay-unfinished", seed, false)
                .expect("the harness serves the workload");
            (exploration, harness.runs.load(std::sync::atomic::Ordering::Relaxed))
        })
        .find(|(e, _)| e.shrunk.is_some() && e.mix.len() > 1);
    let (exploration, made) = found.expect("a seed whose mix of several cuts catches replay-unfinished");
    assert_eq!(exploration.runs, made, "the runs an exploration reports are the runs it made");
    assert!(exploration.shrunk.is_some_and(|shrunk| shrunk.placements.len() < exploration.mix.len()));
}

/// Depth 2 runs the single placements first; then pairs each that left its run clean with a
/// second cut on the same action or record at a call of that run after the first cut fired (its
/// retry, readback or reconciliation among them: calls the uncut run never made); then pairs of
/// the uncut run's placements at two sites, the most promising first; as many as the budget
/// leaves room for, and what does not fit is counted as skipped, never dropped silently.
#[test]
fn a_depth_two_sweep_pairs_a_second_cut_on_the_same_subject_then_the_most_promising_pairs() {
    let (harness, scenario) = (rig::reference(), workload("switch-with-lease.toml"));
    let plan = |depth: u8, budget: Option<usize>| {
        explore::plan(&harness, &scenario, &SweepOptions { depth, budget, ..SweepOptions::default() })
            .expect("the harness serves the workload")
    };
    let one = plan(1, None);
    assert!(one.jobs.iter().all(|job| job.len() == 1) && one.skipped == 0);
    let singles: Vec<Placement> = one.jobs.iter().map(|job| job[0].clone()).collect();
    // The singles' runs, as a depth-2 sweep makes them (the same for any budget that fits them).
    let runs: Vec<explore::SweepRun> = {
        let two = plan(2, None);
        assert_eq!(two.jobs.len(), singles.len(), "the pairs wait for the singles' runs");
        two.jobs.iter().map(|job| explore::run_job(&harness, &two, job)).collect()
    };
    let paired = |budget: Option<usize>| {
        let mut two = plan(2, budget);
        explore::plan_pairs(&mut two, &runs);
        two
    };
    // Each pair once, whichever of its cuts came first.
    let key = |pair: &[Placement]| {
        let mut ids: Vec<String> = pair.iter().map(Placement::id).collect();
        ids.sort();
        ids
    };
    let mut seen: BTreeSet<Vec<String>> = BTreeSet::new();
    let mut same_subject: Vec<Vec<Placement>> = Vec::new();
    for run in runs.iter().filter(|run| run.verdict == Verdict::Clean) {
        for follow_up in &run.follow_ups {
            assert_eq!(follow_up.site.subject(), run.placements[0].site.subject());
            assert_ne!(follow_up.site, run.placements[0].site);
            let pair = vec![run.placements[0].clone(), follow_up.clone()];
            if seen.insert(key(&pair)) {
                same_subject.push(pair);
            }
        }
    }
    assert!(runs.iter().all(|run| run.verdict == Verdict::Clean || run.follow_ups.is_empty()));
    assert!(same_subject.len() > 10, "a retry or a readback follows many a cut: {}", same_subject.len());
    // Some second cut lands at a call the uncut run never made.
    assert!(same_subject.iter().any(|pair| !singles.iter().any(|single| single.site == pair[1].site)));
    let mut others: Vec<(usize, usize)> = (0..singles.len())
        .flat_map(|i| (i + 1..singles.len()).map(move |j| (i, j)))
        .filter(|&(i, j)| singles[i].site != singles[j].site)
        .collect();
    let sum = |&(i, j): &(usize, usize)| singles[i].site.promise() + singles[j].site.promise();
    // By the sum of the two sites' promise, highest first, ties in the order the singles came;
    // a pair already tried on one subject is not tried again.
    others.sort_by_key(|pair| (std::cmp::Reverse(sum(pair)), *pair));
    others.retain(|&(i, j)| seen.insert(key(&[singles[i].clone(), singles[j].clone()])));
    let possible = same_subject.len() + others.len();

    let all = paired(Some(singles.len() + possible));
    assert_eq!(all.skipped, 0);
    let expected: Vec<Vec<Placement>> = same_subject
        .iter()
        .cloned()
        .chain(others.iter().map(|&(i, j)| vec![singles[i].clone(), singles[j].clone()]))
        .collect();
    let planned = &all.jobs[singles.len()..];
    assert_eq!(planned.len(), expected.len());
    let first_difference = planned.iter().zip(&expected).position(|(planned, expected)| planned != expected);
    assert_eq!(first_difference, None, "the same subject's pairs, then the others by their promise");
    let promises: BTreeSet<u8> = singles.iter().map(|single| single.site.promise()).collect();
    assert!(promises.len() > 2, "the workload offers sites of three promises, so sums and ties tell orders apart");

    let two = paired(None);
    assert_eq!(two.jobs.len() - singles.len(), possible.min(explore::PAIRS_DEFAULT));
    assert_eq!(two.jobs.len() - singles.len() + two.skipped, possible, "a pair that does not fit is counted");
    let tight = paired(Some(singles.len() + 3));
    assert_eq!((tight.jobs.len(), tight.skipped), (singles.len() + 3, possible - 3));
    assert_eq!(tight.jobs[singles.len()..], expected[..3], "the same subject's pairs first");
    let tighter = plan(1, Some(5));
    assert_eq!((tighter.jobs.len(), tighter.skipped), (5, singles.len() - 5));
}

/// A guided campaign of `runs` under `reference`, made in order on this thread: `each` sees every
/// run made before the campaign takes it back.
fn campaign<'a>(
    harness: &'a dyn explore::Runs,
    scenario: &Scenario,
    runs: std::ops::Range<u64>,
    mut each: impl FnMut(&explore::Tried),
) -> explore::Campaign<'a> {
    let mut campaign = explore::Campaign::new(harness, scenario, "reference", runs, false).unwrap();
    loop {
        let trials = campaign.batch();
        if trials.is_empty() {
            return campaign;
        }
        for trial in &trials {
            let tried = campaign.try_mix(trial);
            each(&tried);
            campaign.fold(tried);
        }
    }
}

/// A guided exploration's runs come from its range alone: the same range makes the same runs,
/// corpus and coverage again, and a shorter range from the same start makes the first of them.
#[test]
fn a_guided_exploration_makes_the_same_runs_from_the_same_range_and_a_shorter_one_its_first() {
    let (harness, scenario) = (rig::reference(), workload("switch-with-lease.toml"));
    let explore = |runs: std::ops::Range<u64>| {
        let mut made = Vec::new();
        let campaign = campaign(&harness, &scenario, runs, |tried| {
            made.push((tried.index, tried.mix.iter().map(Placement::id).collect::<Vec<_>>(), tried.fired.clone()));
        });
        let corpus: Vec<Vec<String>> = campaign.corpus().map(|mix| mix.iter().map(Placement::id).collect()).collect();
        (made, corpus, campaign.coverage.states(), campaign.coverage.transitions())
    };
    let long = explore(3..67);
    assert_eq!(long.0.len(), 64);
    assert!(long.1.len() > 4, "runs that reached new abstract states are kept: {:?}", long.1);
    assert!(long.2 > 20, "{} abstract states", long.2);
    // Most runs change a kept mix: some mix of two or more cuts was made.
    assert!(long.0.iter().any(|(_, mix, _)| mix.len() >= 2));
    assert_eq!(explore(3..67), long);
    let short = explore(3..35);
    assert_eq!(short.0[..], long.0[..32], "the first runs of a longer range");
}

/// A guided exploration opens with the uncut run's own placements, the most promising first (the
/// caller crashed just after a write or an effect before anything else), four at distinct sites
/// a run; and an opening run in which a call's outcome was left unknown (a timeout, a lost
/// acknowledgement) is followed by runs that add a second fault on the same action or record,
/// at a call the run made after the first fault fired.
#[test]
fn a_guided_exploration_opens_with_the_most_promising_single_cuts_and_follows_an_unknown_outcome() {
    let (harness, scenario) = (rig::reference(), workload("multi-round.toml"));
    let (_, _, space) = space_of("multi-round.toml");
    let opening = explore::opening_order(&space);
    assert_eq!(opening.len(), space.len(), "every placement of the uncut run, once");
    assert_eq!(opening.iter().collect::<BTreeSet<_>>(), space.iter().collect::<BTreeSet<_>>());
    let first = &opening[0];
    assert_eq!(first.kind, Kind::CrashCallerAfter, "{}", first.id());
    assert!(first.id().contains("ticket::create"), "an effect's site first: {}", first.id());
    let rank = |p: &Placement| opening.iter().position(|q| q == p).unwrap();
    let crashes_after = opening.iter().take_while(|p| matches!(p.kind, Kind::CrashCallerAfter | Kind::Crash)).count();
    assert!(crashes_after > 8, "every write and point first crashes its caller: {crashes_after}");
    let timeout = opening.iter().find(|p| p.kind == Kind::Timeout).unwrap();
    let outage = opening.iter().find(|p| p.kind.is_outage()).unwrap();
    assert!(rank(timeout) < rank(outage), "a call of unknown outcome before a service down for a while");

    let mut mixes = Vec::new();
    campaign(&harness, &scenario, 0..96, |tried| mixes.push(tried.mix.clone()));
    // The opening's first run: its first four placements at distinct sites.
    let mut group: Vec<Placement> = Vec::new();
    for placement in &opening {
        if group.len() < 4 && !group.iter().any(|p| p.site == placement.site) {
            group.push(placement.clone());
        }
    }
    assert!(
        mixes.contains(&group),
        "the opening's first four: {:?}",
        group.iter().map(Placement::id).collect::<Vec<_>>()
    );
    // Only a follow-up holds five cuts: an opening run holds four, a fresh draw at most four.
    let followed = mixes.iter().filter(|mix| mix.len() == 5).find(|mix| {
        let (last, rest) = mix.split_last().unwrap();
        let subject = last.site.subject();
        subject.is_some()
            && rest.iter().any(|p| matches!(p.kind, Kind::Timeout | Kind::LostAck) && p.site.subject() == subject)
    });
    assert!(followed.is_some(), "a second fault on the subject of an unknown outcome");
}

/// The benchmark's judge: a run finds a bug only where the reference is clean with the same
/// cuts, so the reference policy itself, hunted, is never found however much its runs trip.
#[test]
fn the_benchmark_finds_a_bug_where_the_reference_is_clean_and_the_reference_never() {
    use explore::bench::{hunt, Searcher};
    let harness = rig::reference();
    let scenario = workload("streamed-replies.toml");
    let found = hunt(&harness, &scenario, "arrival-order-stream", None, Searcher::Depth1, 0, 10_000).unwrap();
    let first = found.first.expect("a reorder of a streamed frame is among the sweep's placements");
    assert_eq!(found.runs, first, "the hunt stops at its first finding");
    assert_eq!(found.oracle.as_deref(), Some("whole-replies"));
    assert!(found.cuts[0].starts_with("reorder @"), "{:?}", found.cuts);
    let again = hunt(&harness, &scenario, "arrival-order-stream", None, Searcher::Guided, 0, 64).unwrap();
    assert_eq!(again, hunt(&harness, &scenario, "arrival-order-stream", None, Searcher::Guided, 0, 64).unwrap());
    let reference = hunt(&harness, &scenario, "reference", None, Searcher::Swarm, 0, 30).unwrap();
    assert_eq!((reference.first, reference.runs), (None, 30));
}

/// A clean sweep says what it covered and what it did not; coverage counts abstract states.
#[test]
fn a_clean_sweep_states_what_it_covered_and_what_it_left_out() {
    let options = SweepOptions { budget: Some(40), ..SweepOptions::default() };
    let report = explore::sweep(&rig::reference(), &workload("multi-round.toml"), &options).unwrap();
    assert!(report.findings.is_empty() && report.certificate.clean());
    let statement = report.certificate.statement();
    assert!(statement.starts_with("40 single cuts at "), "{statement}");
    assert!(statement.contains(": no finding; not covered: "), "{statement}");
    assert!(statement.contains(" single cuts over the budget") && statement.contains("pairs of cuts (--depth 2)"));
    assert!(report.coverage.states() > 10 && report.coverage.transitions() >= report.coverage.states() - 1);
    assert_eq!(report.coverage.runs(), 41, "the uncut run and the sweep's");
}
