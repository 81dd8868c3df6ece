//! The naive harness's own binary (`rig::cli::main`) closes the debug loop: what its sweep and
//! explore find reruns, from the repro they print, with the naive harness (not the reference),
//! and fails the same way with the same trace hash; what it cannot serve is skipped, in the
//! summary, the JSON and the JUnit report.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn naive(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_naive-harness")).args(args).output().expect("the binary runs")
}

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn scratch(name: &str) -> PathBuf {
    let folder = Path::new(env!("CARGO_TARGET_TMPDIR")).join("naive-cli").join(name);
    let _ = std::fs::remove_dir_all(&folder);
    std::fs::create_dir_all(&folder).unwrap();
    folder
}

/// `(command, trace hash)` of every `(replay: COMMAND; trace hash HASH)` in `stdout`.
fn replays(stdout: &str) -> Vec<(String, String)> {
    stdout
        .split("(replay: ")
        .skip(1)
        .filter_map(|rest| {
            let (command, rest) = rest.split_once("; trace hash ")?;
            let hash = rest.split(')').next()?;
            Some((command.to_string(), hash.to_string()))
        })
        .collect()
}

/// Runs a printed repro from another folder, as a person would paste it, with `--json`.
fn rerun(command: &str) -> serde_json::Value {
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!("{command} --json"))
        .current_dir(std::env::temp_dir())
        .output()
        .expect("sh runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "a finding's repro fails: {stdout}");
    serde_json::from_str(stdout.lines().next().expect("one JSON line")).unwrap()
}

fn assert_reruns_the_naive_harness(stdout: &str) {
    let found = replays(stdout);
    assert!(!found.is_empty(), "no written finding with its replay: {stdout}");
    for (command, hash) in found.iter().take(3) {
        assert!(command.starts_with(env!("CARGO_BIN_EXE_naive-harness")), "the repro names this binary: {command}");
        let run = rerun(command);
        assert_eq!(run["harness"], "naive", "{run}");
        assert_eq!(run["trace_hash"], hash.as_str(), "the repro replays the run bit for bit: {command}");
        assert_eq!(run["passed"], false);
    }
}

#[test]
fn a_swept_finding_reruns_the_naive_harness_from_its_repro() {
    let out_dir = scratch("sweep");
    let workload = Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios/opens-a-ticket.toml");
    let out = naive(&["sweep", workload.to_str().unwrap(), "--out", out_dir.to_str().unwrap(), "--jobs", "1"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "the sweep finds the naive harness's bugs: {stdout}");
    assert!(stdout.contains("(harness naive)"), "{stdout}");
    assert_reruns_the_naive_harness(&stdout);
    // The file and the script beside it name the same binary.
    let script = std::fs::read_dir(&out_dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.to_string_lossy().ends_with(".repro.sh"))
        .expect("a repro script");
    let text = std::fs::read_to_string(&script).unwrap();
    assert!(text.contains(env!("CARGO_BIN_EXE_naive-harness")), "{text}");
    let finding = std::fs::read_to_string(script.to_string_lossy().replace(".repro.sh", ".toml")).unwrap();
    assert!(finding.contains(&format!("# Replay it with `{} run <this file>", env!("CARGO_BIN_EXE_naive-harness"))));
}

#[test]
fn an_explored_finding_reruns_the_naive_harness_from_its_repro() {
    let out_dir = scratch("explore");
    let workload = Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios/opens-a-ticket.toml");
    let out = naive(&[
        "explore",
        workload.to_str().unwrap(),
        "--seeds",
        "0..6",
        "--out",
        out_dir.to_str().unwrap(),
        "--jobs",
        "1",
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(stdout.contains(&format!("repro: {} explore", env!("CARGO_BIN_EXE_naive-harness"))), "{stdout}");
    assert_reruns_the_naive_harness(&stdout);
}

#[test]
fn what_it_cannot_serve_is_skipped_everywhere_and_only_skips_exit_2() {
    let cancel = workspace().join("scenarios/control/cancel");
    // Every file of the folder needs `cancel`, however many the catalogue holds.
    let files = std::fs::read_dir(&cancel)
        .unwrap()
        .filter(|entry| entry.as_ref().unwrap().path().extension().is_some_and(|ext| ext == "toml"))
        .count();
    assert!(files > 1, "scenarios/control/cancel holds the files this test skips");
    // A file it runs and fails at the contract (it swallows the failed write: `liveness`).
    let failing = workspace().join("scenarios/incident-001/finalization/write-timeout.toml");
    let (cancel, failing) = (cancel.to_str().unwrap(), failing.to_str().unwrap());

    let only_skips = naive(&["run", cancel]);
    let stdout = String::from_utf8_lossy(&only_skips.stdout);
    assert_eq!(only_skips.status.code(), Some(2), "nothing tested is no green: {stdout}");
    assert!(
        stdout.contains("SKIP ") && stdout.contains("needs cancel (step #3 invoke.function = \"harness::cancel\")")
    );
    assert!(stdout.ends_with(&format!("0 passed, 0 failed, {files} skipped (harness naive)\n")), "{stdout}");

    let json = naive(&["run", cancel, failing, "--json", "--seeds", "0..2"]);
    let lines: Vec<serde_json::Value> =
        String::from_utf8_lossy(&json.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 2 * files + 2, "one line per run, the skipped ones too");
    let skipped: Vec<_> = lines.iter().filter(|l| !l["skipped"].is_null()).collect();
    assert_eq!(skipped.len(), 2 * files);
    assert!(skipped.iter().all(|l| l["passed"].is_null() && l["missing"] == serde_json::json!(["cancel"])));

    let junit = scratch("junit").join("junit.xml");
    let matrix = naive(&["matrix", cancel, failing, "--seeds", "0..2", "--junit", junit.to_str().unwrap()]);
    let stdout = String::from_utf8_lossy(&matrix.stdout);
    let summary = format!("shard 1/1: 0 passed, 2 failed, {} skipped (harness naive)", 2 * files);
    assert!(stdout.contains(&summary), "{stdout}");
    let xml = std::fs::read_to_string(&junit).unwrap();
    assert_eq!(xml.matches("<skipped").count(), files, "{xml}");
    assert!(xml.contains("needs cancel"), "{xml}");
}
