//! `rig live --baseline`: a harness process in any language, not yet clean, is judged by a
//! baseline of its known failures as a harness in Rust is (`rig/example-harness/tests/baseline.rs`
//! has the other commands). The external harness here is the rig's own reference harness as a
//! process, made to behave as its known-bad `swallow` policy (a finalisation write whose
//! acknowledgement is lost is taken for a failure and swallowed: it replies `running` over a
//! durable `failed`), and judged as a correct harness is.

use std::path::{Path, PathBuf};
use std::process::Command;

fn team() -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("live-baseline");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("scenarios")).unwrap();
    let finalization = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scenarios/incident-001/finalization");
    for name in ["lost-ack.toml", "healthy.toml"] {
        std::fs::copy(finalization.join(name), dir.join("scenarios").join(name)).unwrap();
    }
    dir
}

fn live(dir: &Path, extra: &[&str]) -> (Option<i32>, String) {
    let spawn = format!("{} harness --policy swallow", env!("CARGO_BIN_EXE_rig"));
    let out = Command::new(env!("CARGO_BIN_EXE_rig"))
        .args(["live", "scenarios", "--spawn", &spawn, "--logs", "processes"])
        .args(extra)
        .current_dir(dir)
        .output()
        .expect("rig runs");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.code(), text)
}

#[test]
fn live_runs_pass_known_failures_and_fail_regressions_and_stale_entries() {
    let dir = team();
    let (code, out) = live(&dir, &["--write-baseline", "live-baseline.toml"]);
    assert_eq!(code, Some(0), "writing a baseline records the failures: {out}");
    let written = std::fs::read_to_string(dir.join("live-baseline.toml")).unwrap();
    assert!(written.contains("harness = \"live\"\n"), "{written}");
    let truthful =
        r#"  { file = "scenarios/lost-ack.toml", policy = "reference", oracle = "truthful-reply", seed = 0 },"#;
    assert!(written.contains(&format!("\n{truthful}\n")), "a `running` reply over a durable `failed`:\n{written}");
    assert!(!written.contains("healthy.toml"), "{written}");

    let (code, out) = live(&dir, &["--baseline", "live-baseline.toml"]);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains(" known failure(s) still failing, 0 new, 0 stale"), "{out}");

    let regressed: String = written.lines().filter(|l| *l != truthful).map(|l| format!("{l}\n")).collect();
    std::fs::write(dir.join("regressed.toml"), regressed).unwrap();
    let (code, out) = live(&dir, &["--baseline", "regressed.toml"]);
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.contains("NEW   scenarios/lost-ack.toml [reference] oracle `truthful-reply`: not in the baseline"),
        "{out}"
    );

    let passing = r#"  { file = "scenarios/healthy.toml", policy = "reference", oracle = "liveness", seed = 0 },"#;
    let stale = written.replacen("\nfailures = [\n", &format!("\nfailures = [\n{passing}\n"), 1);
    std::fs::write(dir.join("stale.toml"), &stale).unwrap();
    let (code, out) = live(&dir, &["--baseline", "stale.toml"]);
    assert_eq!(code, Some(1), "{out}");
    let at = stale.lines().position(|l| l == passing).unwrap() + 1;
    assert!(
        out.contains(&format!(
            "STALE stale.toml:{at}: scenarios/healthy.toml [reference] oracle `liveness` is listed, and no longer fails on it at seed 0"
        )),
        "{out}"
    );
}
