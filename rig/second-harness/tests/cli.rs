//! The second harness's own binary (`rig::cli::main`): the catalogue runs under it, its summary
//! names it, and the repro line a failure prints reruns the second harness (not the
//! reference), bit for bit, from any folder.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn second(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_second-harness")).args(args).output().expect("the binary runs")
}

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn scratch(name: &str) -> PathBuf {
    let folder = Path::new(env!("CARGO_TARGET_TMPDIR")).join("second-cli").join(name);
    let _ = std::fs::remove_dir_all(&folder);
    std::fs::create_dir_all(&folder).unwrap();
    folder
}

#[test]
fn the_catalogue_runs_under_the_second_harness() {
    let smoke = workspace().join("scenarios/smoke");
    let out = second(&["run", smoke.to_str().unwrap(), "--seeds", "0..2", "-q"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.trim_end().ends_with("0 failed, 0 skipped (harness second)"), "{stdout}");
}

#[test]
fn a_failed_run_reruns_the_second_harness_from_its_repro() {
    // A healthy turn held to a count no correct harness meets: it fails, and says how to rerun.
    let file = scratch("repro").join("asks-twice.toml");
    std::fs::write(
        &file,
        r#"about = "A healthy turn, expected (wrongly) to ask the model twice."

[[world.record]]
scope = "harness_turn"
key = "s1"
value = { session_id = "s1", turn_id = "t1", status = "running", step = 1 }

[[world.model]]
text = "hi"

[[step]]
invoke = { function = "harness::turn", payload = { session_id = "s1", turn_id = "t1", step = 1 }, name = "turn" }

[expect]
calls = { "model::generate" = 2 }

[policy.reference]
"#,
    )
    .unwrap();
    let out = second(&["run", file.to_str().unwrap(), "--seed", "3", "--json"]);
    assert_eq!(out.status.code(), Some(1));
    let first: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON line");
    assert_eq!(first["harness"], "second", "{first}");
    assert_eq!(first["passed"], false, "{first}");
    assert!(first["trace_hash"].as_str().is_some_and(|hash| !hash.is_empty()), "{first}");
    let repro = first["repro"].as_str().expect("a repro line");
    assert!(repro.starts_with(env!("CARGO_BIN_EXE_second-harness")), "the repro names this binary: {repro}");

    // Pasted in another folder, it reruns the same run of the second harness.
    let again = Command::new("sh")
        .arg("-c")
        .arg(format!("{repro} --json"))
        .current_dir(std::env::temp_dir())
        .output()
        .expect("sh runs");
    assert_eq!(again.status.code(), Some(1));
    let rerun: serde_json::Value = serde_json::from_slice(&again.stdout).expect("one JSON line");
    assert_eq!(rerun["harness"], "second", "{rerun}");
    assert_eq!(rerun["seed"], 3);
    assert_eq!(rerun["trace_hash"], first["trace_hash"], "the repro replays the run bit for bit: {repro}");
    assert_eq!(rerun["failures"], first["failures"]);
}
