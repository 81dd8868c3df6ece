//! `rig bench`: what it counts and how it compares, end to end. No assertion here is on a
//! speed (those belong to the benchmark itself, and to the nightly's check of the guard on its
//! runner): a planted slowdown far beyond any noise must be called a regression, and the
//! figures must add up.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("rig sits in the workspace").to_path_buf()
}

fn rig(args: &[&str], planted: Option<&str>) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_rig"));
    command.current_dir(workspace()).args(args).env_remove("RIG_BENCH_PLANTED_SLOWDOWN");
    if let Some(percent) = planted {
        command.env("RIG_BENCH_PLANTED_SLOWDOWN", percent);
    }
    command.output().expect("the rig binary runs")
}

const FILE: &str = "scenarios/incident-001/finalization/lost-ack.toml";
/// Its known-bad policy repeats more work than its fault allows: each of its runs needs its
/// uncut run simulated (the reference policy's runs do not).
const RECOVERY: &str = "scenarios/runtime/recovery-cost/crash-after-three-rounds.toml";

#[test]
fn a_pass_counts_judged_runs_each_pass_cold_and_a_planted_slowdown_against_its_baseline_is_a_regression() {
    let baseline = Path::new(env!("CARGO_TARGET_TMPDIR")).join("bench-baseline.json");
    let common = [
        "bench",
        FILE,
        RECOVERY,
        "--seeds",
        "0..3",
        "--passes",
        "2",
        "--sweep",
        "none",
        "--explore",
        "none",
        "-j",
        "1",
    ];
    let write = [&common[..], &["--write-baseline", baseline.to_str().unwrap()]].concat();
    let out = rig(&write, None);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    // Five policies over the two files: 5 x 3 judged runs a pass; the uncut runs simulated for
    // them are not counted as runs.
    assert!(stdout.contains("total: 15 judged runs a pass, 0 failed, 0 skipped"), "{stdout}");
    // Every pass starts cold: the second simulates the same uncut runs again, none remembered.
    // Seven: every policy's runs have a fault fire, so `outcome` needs each policy's uncut run at
    // the canonical seed 0 (five), and none differs from it in a way the contract forbids (a
    // turn failed by the delay is a permitted end); `recovery-cost` needs the known-bad
    // `redo-completed-rounds`' own uncut run at seeds 1 and 2 (at seed 0 it is the canonical one).
    assert!(stdout.contains("uncut runs: 7 simulated a pass (46.7 % of judged runs; passes: 7, 7)"), "{stdout}");
    let figures: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&baseline).unwrap()).unwrap();
    assert_eq!((figures["runs"].as_u64(), figures["uncut_runs"].as_u64()), (Some(15), Some(7)), "{figures}");
    assert_eq!(figures["files"][FILE]["runs"], 9);
    assert_eq!(figures["files"][RECOVERY]["runs"], 6);

    // Four times the CPU per run: a regression whatever else the machine is doing.
    let compare = [&common[..], &["--baseline", baseline.to_str().unwrap()]].concat();
    let out = rig(&compare, Some("300"));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(stdout.contains("CPU per run: ") && stdout.contains("REGRESSION"), "{stdout}");
    assert!(stdout.contains("verdict: REGRESSION: CPU per run, runs/s per core slower by more than 10 %"), "{stdout}");

    // Another selection is not compared.
    let other = ["bench", FILE, RECOVERY, "--seeds", "0..4", "--sweep", "none", "--explore", "none", "-j", "1"];
    let out = rig(&[&other[..], &["--baseline", baseline.to_str().unwrap()]].concat(), None);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("seeds 0..3"), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn against_another_binary_the_planted_slowdown_is_this_binarys_alone() {
    let this = env!("CARGO_BIN_EXE_rig");
    let args = ["bench", "--against", this, FILE, "--seeds", "0..2", "--rounds", "1"];
    let out = rig(&args, Some("300"));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("1 of 1 files pass under both"), "{stdout}");
    // Its three policies under two seeds.
    assert!(stdout.contains("round 1 A: 6 runs") && stdout.contains("round 1 B: 6 runs"), "{stdout}");
    let ratio = stdout.lines().find(|l| l.starts_with("B/A CPU per pass: ")).expect("the ratio");
    let ratio: f64 = ratio["B/A CPU per pass: ".len()..].split_whitespace().next().unwrap().parse().unwrap();
    // B's runs burn three times their CPU again, but a pass's CPU also holds the fixed cost of
    // starting and loading, the same for both: on a loaded machine the ratio of six tiny runs
    // was 1.86 (two cores, a workspace test build beside it), so the bound leaves that margin.
    assert!(ratio > 1.3, "B burns three times its runs' CPU again: {stdout}");
    assert!(stdout.contains("REGRESSION"), "{stdout}");
    // Without it, the same binary twice is judged against the threshold asked for.
    let out = rig(&[&args[..], &["--threshold", "100"]].concat(), None);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    assert!(stdout.contains("B/A CPU per pass: "), "{stdout}");
}

/// An older binary that does not know a key a newer file uses refuses the whole selection. The
/// comparison says so, leaves that file out by name, and compares the rest: before, it printed
/// "0 of N files pass under both" and nothing about why.
#[test]
fn against_a_binary_that_cannot_read_a_file_names_it_and_compares_the_rest() {
    use std::os::unix::fs::PermissionsExt;
    const NEWER: &str = "scenarios/smoke/healthy-turn.toml";
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("bench-against-unreadable");
    std::fs::create_dir_all(&dir).expect("a temporary folder");
    // A stand-in for an older rig: it rejects NEWER as a real one rejects an unknown key (the
    // error names the file, exit 2, no run), and runs everything else as this binary does.
    let old = dir.join("old-rig");
    let script = format!(
        "#!/bin/sh\nfor arg in \"$@\"; do\n  if [ \"$arg\" = {NEWER} ]; then\n    echo \"error: {NEWER}:50:1: unknown field \\`new_key\\`\" >&2\n    exit 2\n  fi\ndone\nexec {} \"$@\"\n",
        env!("CARGO_BIN_EXE_rig")
    );
    std::fs::write(&old, script).expect("the stand-in is written");
    std::fs::set_permissions(&old, std::fs::Permissions::from_mode(0o755)).expect("the stand-in runs");
    let old = old.display().to_string();
    let out =
        rig(&["bench", "--against", &old, FILE, NEWER, "--seeds", "0..1", "--rounds", "1", "--threshold", "100"], None);
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "{stdout}{stderr}");
    assert!(stderr.contains("cannot read the selection") && stderr.contains("unknown field `new_key`"), "{stderr}");
    assert!(stdout.contains(&format!("left out: {NEWER} (A cannot read it: error: {NEWER}:50:1:")), "{stdout}");
    assert!(stdout.contains("1 of 2 files pass under both (1 left out as unreadable by one of them)"), "{stdout}");
    assert!(stdout.contains("round 1 A: 3 runs") && stdout.contains("round 1 B: 3 runs"), "{stdout}");
}
