//! `scenario_tests!`'s checks, as a user's crate meets them: a file needing a capability the
//! harness lacks is skipped with the reason (a failure where every file must run); failures read
//! as text; a new file writes its first snapshot and passes, a changed snapshot fails, and in CI
//! a missing one fails.
//!
//! One test, because it sets `CI` for a while (the environment is the whole process's).

use rig::testing::{Checked, Suite};
use rig::{Capabilities, HarnessEnv, HarnessFactory, Provider, ReferenceHarness};
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::Arc;

/// The reference harness, declaring only `turns`.
struct TurnsOnly;

impl HarnessFactory for TurnsOnly {
    fn name(&self) -> &str {
        "turns-only"
    }
    fn capabilities(&self) -> Capabilities {
        Capabilities::default()
    }
    fn start(&self, policy: &str, env: HarnessEnv) -> Rc<dyn Provider> {
        ReferenceHarness.start(policy, env)
    }
}

const HEALTHY: &str = r#"about = "A healthy turn."
[[world.record]]
scope = "harness_turn"
key = "s1"
value = { session_id = "s1", turn_id = "t1", status = "running", step = 1, turn_count = 0, depth = 0, abort = false, calls = {} }
[[world.model]]
text = "hi there"
[[step]]
invoke = { function = "harness::turn", payload = { session_id = "s1", turn_id = "t1", step = 1, depth = 0 }, name = "turn" }
[expect]
state."harness_turn/s1" = { status = "completed" }
[policy.reference]
"#;

/// A fresh folder of scenario files (and one for snapshots) under the target directory.
fn folder(name: &str, files: &[(&str, String)]) -> PathBuf {
    let root = Path::new(env!("CARGO_TARGET_TMPDIR")).join("suite").join(name);
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(root.join("scenarios")).unwrap();
    for (file, text) in files {
        std::fs::write(root.join("scenarios").join(file), text).unwrap();
    }
    root
}

fn suite(harness: Arc<dyn HarnessFactory>, root: &Path) -> Suite {
    let root = root.to_str().unwrap();
    Suite::new(harness, root, "scenarios").with_snapshots(root, "snapshots").in_test_target(root, "mine", "scenarios")
}

#[test]
fn skips_failures_and_snapshots_as_a_user_meets_them() {
    std::env::remove_var("CI");
    std::env::remove_var("TF_BUILD");
    std::env::set_var("RIG_SEED", "0");
    let switch = HEALTHY.replace(
        "[expect]",
        "[[step]]\ninvoke = { function = \"harness::export\", payload = { session_id = \"s1\" }, name = \"export\" }\n[expect]",
    );
    let failing = HEALTHY.replace("status = \"completed\" }", "status = \"failed\" }");
    let root =
        folder("user", &[("healthy.toml", HEALTHY.to_string()), ("switch.toml", switch), ("failing.toml", failing)]);
    let turns_only = suite(Arc::new(TurnsOnly), &root);
    let scenarios = root.join("scenarios");

    // A capability the harness lacks: skipped, saying what and where.
    let skipped = turns_only.check(&scenarios.join("switch.toml")).unwrap();
    let Checked::Skipped(why) = skipped else { panic!("not skipped: {skipped:?}") };
    assert_eq!(
        why,
        "[reference] skipped: needs switch (step #2 invoke.function = \"harness::export\"), and harness `turns-only` \
         does not declare it"
    );
    // A suite that requires every file to run fails it instead, saying what it would skip.
    let required = suite(Arc::new(TurnsOnly), &root).every_file_runs();
    let refused = required.check(&scenarios.join("switch.toml")).unwrap_err();
    assert!(refused.contains("requires every file to run under harness `turns-only`"), "{refused}");
    assert!(refused.contains(&why), "{refused}");
    let without_snapshots = Suite::new(Arc::new(TurnsOnly), root.to_str().unwrap(), "scenarios").every_file_runs();
    assert_eq!(without_snapshots.check(&scenarios.join("healthy.toml")), Ok(Checked::Passed), "a file it runs");
    // The reference has it: the same file runs.
    assert_eq!(suite(rig::reference(), &root).check(&scenarios.join("switch.toml")), Ok(Checked::Passed));

    // A failure is text with its own lines, and names the test that reruns it.
    let failed = turns_only.check(&scenarios.join("failing.toml")).unwrap_err();
    assert!(failed.lines().count() > 5 && !failed.contains("\\n"), "{failed}");
    assert!(failed.contains("status expected = failed, found `completed`"), "{failed}");
    let repro = failed.lines().find(|l| l.contains("repro:")).expect("a repro line");
    assert!(
        repro.contains("RIG_SEED=0 cargo test --manifest-path")
            && repro.contains("-p mine --test scenarios -- rig_scenario_test::failing.toml --exact"),
        "{repro}"
    );

    // No snapshot yet: written, and the first run passes; the next run compares with it.
    let snapshot = root.join("snapshots/healthy.snap");
    assert_eq!(turns_only.check(&scenarios.join("healthy.toml")), Ok(Checked::Passed));
    let written = std::fs::read_to_string(&snapshot).expect("the first snapshot is written");
    assert!(written.starts_with("---\nsource: ") && written.contains("\n---\nA healthy turn.\n"), "{written}");
    assert_eq!(turns_only.check(&scenarios.join("healthy.toml")), Ok(Checked::Passed));

    // A changed snapshot fails, and is not overwritten.
    std::fs::write(&snapshot, written.replace("A healthy turn.", "A claim nobody made.")).unwrap();
    let check = std::panic::AssertUnwindSafe(|| turns_only.check(&scenarios.join("healthy.toml")));
    let changed = std::panic::catch_unwind(check);
    assert!(changed.is_err(), "a changed snapshot fails");
    assert!(std::fs::read_to_string(&snapshot).unwrap().contains("A claim nobody made."));
    let _ = std::fs::remove_file(snapshot.with_extension("snap.new"));

    // In CI a missing snapshot fails, saying what to do, and nothing is written.
    std::fs::remove_file(&snapshot).unwrap();
    std::env::set_var("CI", "true");
    let missing = turns_only.check(&scenarios.join("healthy.toml"));
    std::env::remove_var("CI");
    let missing = missing.unwrap_err();
    assert!(missing.contains("no snapshot") && missing.contains("commit it"), "{missing}");
    assert!(!snapshot.exists());
}
