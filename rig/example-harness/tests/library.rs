//! The library is the command line, for a harness that is not the rig's: `rig::run_with`,
//! `explore::sweep` and `explore::explore` skip what the naive harness does not declare with the
//! very reason its binary prints, and count what they did as its summary lines say it; and a
//! sweep does not hide a new violation behind an oracle the uncut run already trips.

use rig::explore::{self, ExploreTally, SweepOptions, SweepTally, Verdict};
use rig::Scenario;
use std::path::{Path, PathBuf};
use std::process::Command;

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn load(relative: &str) -> Scenario {
    Scenario::load(&workspace().join("scenarios").join(relative)).unwrap()
}

/// The lines the naive harness's binary prints for `args`.
fn naive(args: &[&str]) -> Vec<String> {
    let out = Command::new(env!("CARGO_BIN_EXE_naive-harness"))
        .args(args)
        .current_dir(workspace())
        .output()
        .expect("the binary runs");
    String::from_utf8_lossy(&out.stdout).lines().map(str::to_string).collect()
}

/// A file whose story cancels a turn, and a workload that asks for the status of one: neither is
/// the naive harness's (it declares turns, switch and checkpoints).
const CANCELS: &str = "control/cancel/survives-a-restart.toml";
const ASKS_STATUS: &str = "workloads/status-during-and-after.toml";
/// A workload it serves, and whose uncut run already trips `stranded`: it leaves the input
/// queued meanwhile where it is.
const LEAVES_INPUT: &str = "workloads/queued-successor.toml";

#[test]
fn run_with_skips_what_the_harness_does_not_declare_as_the_command_line_does() {
    let harness = naive_harness::factory();
    let scenario = load(CANCELS);
    let skip = rig::run_with(&harness, &scenario, scenario.run_of("reference").unwrap(), 0)
        .err()
        .expect("the naive harness does not cancel");
    assert_eq!(skip.capabilities(), vec!["cancel"]);
    assert_eq!(Some(&skip), scenario.skip_for(harness.as_ref(), "reference").as_ref(), "scenario_tests! skips by this");
    let printed = naive(&["run", &format!("scenarios/{CANCELS}"), "--policy", "reference"]);
    let line = rig::report::skip_line(&format!("scenarios/{CANCELS}"), "reference", &skip);
    assert!(printed.contains(&line), "the binary prints the same skip:\n{line}\n{printed:#?}");
}

#[test]
fn sweep_and_explore_skip_and_count_as_the_command_line_does() {
    let harness = naive_harness::factory();
    let (skipped, served) = (load(ASKS_STATUS), load(LEAVES_INPUT));
    let options = SweepOptions::default();

    let not_swept = explore::sweep(&harness, &skipped, &options).err().expect("status is not served");
    assert_eq!(not_swept.capabilities(), vec!["status"]);
    let not_explored = explore::explore(&harness, &skipped, "reference", 0, false).expect_err("nor explored");
    assert_eq!(not_explored, not_swept);

    let mut sweeps = SweepTally::default();
    for scenario in [&skipped, &served] {
        sweeps.add(&explore::sweep(&harness, scenario, &options));
    }
    let printed = naive(&["sweep", &format!("scenarios/{ASKS_STATUS}"), &format!("scenarios/{LEAVES_INPUT}")]);
    let line = rig::report::skip_line(&format!("scenarios/{ASKS_STATUS}"), "reference", &not_swept);
    assert!(printed.contains(&line), "the same skip:\n{line}\n{printed:#?}");
    assert_eq!(printed.last(), Some(&sweeps.summary("naive")), "the same summary");
    assert_eq!((sweeps.swept, sweeps.skipped), (1, 1));

    let mut explorations = ExploreTally::default();
    for scenario in [&skipped, &served] {
        for seed in 0..3 {
            explorations.add(&explore::explore(&harness, scenario, "reference", seed, false));
        }
    }
    let printed = naive(&[
        "explore",
        &format!("scenarios/{ASKS_STATUS}"),
        &format!("scenarios/{LEAVES_INPUT}"),
        "--seeds",
        "0..3",
        "--jobs",
        "1",
    ]);
    assert_eq!(printed.last(), Some(&explorations.summary("naive")), "the same summary");
    assert_eq!((explorations.explored, explorations.skipped), (3, 3));
}

/// The uncut run of the queued successor already trips `stranded` (the input the naive harness
/// leaves queued). Cut off from the engine mid-turn, it also loses the delivery itself: the
/// queue gives it up, and no handler takes it. That is `stranded` again, about something else,
/// and a finding: told apart by what the violation is about, not by the oracle's name.
#[test]
fn a_new_violation_of_an_oracle_the_uncut_run_trips_is_a_finding() {
    let harness = naive_harness::factory();
    let plan = explore::plan(&harness, &load(LEAVES_INPUT), &SweepOptions::default()).expect("served");
    assert!(plan.baseline_fired.contains("stranded"), "{:?}", plan.baseline_fired);
    let isolated = plan
        .jobs
        .iter()
        .find(|job| job[0].id() == "isolate-caller @ call session::append[session_id=s1]#1")
        .expect("the placement is in the cut space");
    let run = explore::run_job(&harness, &plan, isolated);
    assert_eq!(run.verdict, Verdict::Fired(["stranded".to_string()].into()), "a dead letter nobody took");
    // A placement that changes nothing of what the uncut run trips is clean, `stranded` and all.
    let delayed = plan.jobs.iter().find(|job| job[0].id().starts_with("delay @ call session::messages")).unwrap();
    assert_eq!(explore::run_job(&harness, &plan, delayed).verdict, Verdict::Clean);
}

/// What a run says when a scripted cut never fired names what the harness did not do: the
/// call it never made, the point it never reached; and an expectation that found nothing says
/// when nothing of its kind happened at all.
#[test]
fn a_cut_that_never_fired_names_what_the_harness_never_did() {
    let harness = naive_harness::factory();
    let scenario = load("regressions/lease-grant-answer-lost.toml");
    let outcome = rig::run_with(&harness, &scenario, scenario.run_of("reference").unwrap(), 0).expect("served");
    let said = outcome.failures.join("\n");
    assert!(
        said.contains(
            "cut #1 (lost-ack on state::acquire-lease) never fired: nothing called `state::acquire-lease` in this run: \
             harness `naive` never made the call it targets"
        ),
        "{said}"
    );
    assert!(said.contains("found 0 (the run has no event [kind=lease] at all: no lease was granted in it"), "{said}");

    // A turn with no tool call reaches no point around an effect.
    let source = std::fs::read_to_string(workspace().join("scenarios/smoke/healthy-turn.toml")).unwrap()
        + "\n[[interrupt]]\nworker = \"harness\"\npoint = \"before_submission\"\naction = \"pause\"\npause_ms = 10\n";
    let scenario = Scenario::parse(Path::new("interrupted.toml"), &source).unwrap();
    let outcome = rig::run_with(&harness, &scenario, scenario.run_of("reference").unwrap(), 0).expect("served");
    let said = outcome.failures.join("\n");
    assert!(
        said.contains(
            "interrupt #1 (pause harness at before_submission) never fired: `harness` never reached \
             `before_submission`: harness `naive` never called its checkpoint there"
        ),
        "{said}"
    );
}
