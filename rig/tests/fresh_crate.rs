//! The library builds as documented: a crate outside the workspace, depending on `rig` by path
//! with nothing copied into its manifest (no `[patch]`, no profile), builds and runs its
//! one-line scenario test, and that test writes the first snapshot of its new scenario file.
//!
//! It shares this build's target directory, profile settings and lock file, so it compiles only
//! the rig's own crates again (outside the workspace they are built as dependencies: about a
//! minute of compiling, again after every change under `rig/`) and the fresh crate, and needs no
//! network (`--offline`). That minute is CI's to spend: with `CI` set (or `RIG_FRESH_CRATE=1`)
//! the check runs; otherwise it is reported *ignored*, saying how to run it.

use libtest_mimic::{Arguments, Completion, Failed, Trial};
use std::path::{Path, PathBuf};
use std::process::Command;

mod outside;

fn main() {
    let trial = Trial::ignorable_test(
        "a_crate_outside_the_workspace_builds_on_rig_by_path_and_runs_its_one_line_test",
        fresh_crate,
    );
    libtest_mimic::run(&Arguments::from_args(), vec![trial]).exit();
}

fn set(name: &str) -> bool {
    std::env::var(name).is_ok_and(|v| !v.is_empty() && v != "false" && v != "0")
}

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// The profile folder this test was built in (`.../target/debug`, from
/// `.../target/debug/deps/fresh_crate-...`).
fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.ancestors().nth(2).expect("target/PROFILE/deps/EXE").to_path_buf()
}

/// The target directory this test was built in.
fn target_dir() -> PathBuf {
    profile_dir().parent().expect("target/PROFILE").to_path_buf()
}

/// The profile this test was built with and the workspace's settings of it, as cargo arguments:
/// the fresh crate's manifest stays as a user writes it.
fn profile_arguments() -> Vec<String> {
    let release = profile_dir().ends_with("release");
    let settings = outside::settings(&workspace(), if release { "release" } else { "dev" });
    let release = release.then(|| "--release".to_string());
    release.into_iter().chain(settings.into_iter().flat_map(|s| ["--config".to_string(), s])).collect()
}

fn write(path: &Path, text: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

fn fresh_crate() -> Result<Completion, Failed> {
    if !set("CI") && !set("RIG_FRESH_CRATE") {
        return Ok(Completion::ignored_with(
            "builds the rig again outside the workspace (about a minute); CI runs it, RIG_FRESH_CRATE=1 runs it here",
        ));
    }
    let root = Path::new(env!("CARGO_TARGET_TMPDIR")).join("fresh-crate");
    let _ = std::fs::remove_dir_all(&root);
    let rig = Path::new(env!("CARGO_MANIFEST_DIR"));
    write(
        &root.join("Cargo.toml"),
        &format!(
            "[package]\nname = \"fresh\"\nversion = \"0.1.0\"\nedition = \"2021\"\n\n\
             [dependencies]\nrig = {{ path = {:?} }}\n\n\
             [[test]]\nname = \"scenarios\"\nharness = false\n\n\
             # Not part of any workspace above it.\n[workspace]\n",
            rig.display().to_string()
        ),
    );
    write(
        &root.join("src/lib.rs"),
        "pub fn factory() -> std::sync::Arc<dyn rig::HarnessFactory> {\n    rig::reference()\n}\n",
    );
    write(
        &root.join("tests/scenarios.rs"),
        "rig::scenario_tests!(harness = fresh::factory(), scenarios = \"scenarios\", snapshots = \"snapshots\");\n",
    );
    let scenario = std::fs::read_to_string(workspace().join("scenarios/smoke/healthy-turn.toml")).unwrap();
    write(&root.join("scenarios/healthy-turn.toml"), &scenario);
    // The same versions as the workspace, resolved offline.
    std::fs::copy(workspace().join("Cargo.lock"), root.join("Cargo.lock")).unwrap();

    let out = Command::new(env!("CARGO"))
        // The workspace's own profile settings, so that the dependencies built here are the
        // workspace's builds and shared.
        .args(["test", "--offline", "--test", "scenarios"])
        .args(profile_arguments())
        .current_dir(&root)
        .env("CARGO_TARGET_DIR", target_dir())
        .env("RIG_SEED", "0")
        .env_remove("CI")
        .env_remove("TF_BUILD")
        .output()
        .map_err(|e| format!("cargo: {e}"))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() || !stdout.contains("test rig_scenario_test::healthy-turn.toml ... ok") {
        return Err(format!("the fresh crate's test failed:\n{stdout}\n{stderr}").into());
    }
    let snapshot = std::fs::read_to_string(root.join("snapshots/healthy-turn.snap"))
        .map_err(|e| format!("its first snapshot was not written: {e}"))?;
    if !snapshot.contains("## propagate, reference, swallow (seed 0)") {
        return Err(format!("an unexpected first snapshot:\n{snapshot}").into());
    }
    Ok(Completion::Completed)
}
