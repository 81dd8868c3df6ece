//! The nightly's report names the commit that brought a new finding in: on a made-up history in
//! a temporary git repository, a tiny harness crate on the rig (the reference harness under its
//! own name) takes up a known-bad behaviour on purpose at a known commit (it retries an
//! unfinished ticket blindly after a restart: the reference's `replay-unfinished` policy). The
//! night before that commit sweeps a workload clean; the night after finds `blind-replay`;
//! `changes` between the two nights' files reports each finding as new, with the
//! `.ci/bisect-finding` command that bisects it; run as printed, that command names the commit.
//!
//! It builds the crate outside the workspace (as `fresh_crate.rs` does, sharing this build's
//! target directory: about a minute of compiling the rig's own crates) and again at each commit
//! the bisection tries (seconds each). That is CI's to spend: with `CI` set (or `RIG_BISECT=1`)
//! it runs; otherwise it is reported *ignored*, saying how to run it.

use libtest_mimic::{Arguments, Completion, Failed, Trial};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

mod outside;

fn main() {
    let trial = Trial::ignorable_test("a_new_finding_bisects_to_the_commit_that_introduced_it", bisect);
    libtest_mimic::run(&Arguments::from_args(), vec![trial]).exit();
}

fn set(name: &str) -> bool {
    std::env::var(name).is_ok_and(|v| !v.is_empty() && v != "false" && v != "0")
}

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// The target directory this test was built in (`.../target` from `.../target/PROFILE/deps/EXE`).
fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.ancestors().nth(3).expect("target/PROFILE/deps/EXE").to_path_buf()
}

fn write(path: &Path, text: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

/// The tiny harness: the reference harness under its own name, which from the commit that sets
/// `RETRY_UNFINISHED` runs its blind-retry policy wherever it is asked to be correct.
fn harness_source(retry_unfinished: bool) -> String {
    format!(
        r#"//! A tiny harness on the rig, with a history.
use rig::{{Capabilities, HarnessEnv, HarnessFactory, Provider, RecordLayout}};
use std::rc::Rc;
use std::sync::Arc;

/// Whether a restarted worker sends a ticket request it finds unfinished again, blindly.
const RETRY_UNFINISHED: bool = {retry_unfinished};

struct Tiny(Arc<dyn HarnessFactory>);

impl HarnessFactory for Tiny {{
    fn name(&self) -> &str {{
        "tiny"
    }}
    fn policies(&self) -> Vec<String> {{
        self.0.policies()
    }}
    fn layout(&self) -> RecordLayout {{
        self.0.layout()
    }}
    fn capabilities(&self) -> Capabilities {{
        self.0.capabilities()
    }}
    fn reference_particulars(&self) -> bool {{
        self.0.reference_particulars()
    }}
    fn waits_on_rig_clock_only(&self) -> bool {{
        self.0.waits_on_rig_clock_only()
    }}
    fn start(&self, policy: &str, env: HarnessEnv) -> Rc<dyn Provider> {{
        let policy = if RETRY_UNFINISHED && policy == "reference" {{ "replay-unfinished" }} else {{ policy }};
        self.0.start(policy, env)
    }}
}}

fn main() -> std::process::ExitCode {{
    rig::cli::main(Arc::new(Tiny(rig::reference())))
}}
"#
    )
}

/// Runs `program` in `dir` with `args`, offline, building into this test's target directory.
fn run(dir: &Path, program: &str, args: &[&str]) -> Output {
    Command::new(program)
        .args(args)
        .current_dir(dir)
        .env("CARGO_TARGET_DIR", target_dir())
        .env("CARGO_NET_OFFLINE", "true")
        .env_remove("CI")
        .output()
        .unwrap_or_else(|e| panic!("{program}: {e}"))
}

fn text(out: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

fn git(dir: &Path, args: &[&str]) -> Result<String, Failed> {
    let out = run(dir, "git", args);
    if !out.status.success() {
        return Err(format!("git {}: {}", args.join(" "), text(&out)).into());
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn commit(dir: &Path, message: &str) -> Result<String, Failed> {
    git(dir, &["add", "-A"])?;
    git(dir, &["commit", "-q", "-m", message])?;
    git(dir, &["rev-parse", "HEAD"])
}

/// Builds the tiny harness at the checked-out commit; the binary.
fn build(dir: &Path) -> Result<PathBuf, Failed> {
    let out = run(dir, env!("CARGO"), &["build", "--quiet", "--bin", "tiny"]);
    if !out.status.success() {
        return Err(format!("the tiny harness does not build:\n{}", text(&out)).into());
    }
    Ok(target_dir().join("debug/tiny"))
}

fn bisect() -> Result<Completion, Failed> {
    if !set("CI") && !set("RIG_BISECT") {
        return Ok(Completion::ignored_with(
            "builds a crate outside the workspace at several commits (a few minutes); CI runs it, RIG_BISECT=1 runs it here",
        ));
    }
    let root = Path::new(env!("CARGO_TARGET_TMPDIR")).join("bisect-history");
    let _ = std::fs::remove_dir_all(&root);
    let rig = Path::new(env!("CARGO_MANIFEST_DIR"));
    // The workspace's own profile settings, so the dependencies built here are its builds, shared.
    let profile: String =
        outside::settings(&workspace(), "dev").iter().map(|s| format!("{}\n", &s["profile.".len()..])).collect();
    write(
        &root.join("Cargo.toml"),
        &format!(
            "[package]\nname = \"tiny\"\nversion = \"0.1.0\"\nedition = \"2021\"\n\n\
             [dependencies]\nrig = {{ path = {:?} }}\n\n[profile]\n{profile}\n[workspace]\n",
            rig.display().to_string()
        ),
    );
    std::fs::copy(workspace().join("Cargo.lock"), root.join("Cargo.lock")).unwrap();
    write(&root.join("src/main.rs"), &harness_source(false));
    let workload = std::fs::read_to_string(workspace().join("scenarios/workloads/switch-with-lease.toml")).unwrap();
    write(&root.join("workloads/switch-with-lease.toml"), &workload);
    write(&root.join(".gitignore"), "/nights/\n");
    git(&root, &["init", "-q", "-b", "main"])?;
    git(&root, &["config", "user.name", "rig"])?;
    git(&root, &["config", "user.email", "rig@example.invalid"])?;
    git(&root, &["config", "commit.gpgsign", "false"])?;
    let good = commit(&root, "A tiny harness on the rig")?;
    write(&root.join("README.md"), "# tiny\n");
    commit(&root, "README")?;
    write(&root.join("src/main.rs"), &harness_source(true));
    let introduced = commit(&root, "Retry an unfinished ticket after a restart")?;
    write(&root.join("README.md"), "# tiny\n\nA harness.\n");
    commit(&root, "README: what it is")?;
    write(&root.join("NOTES.md"), "nothing\n");
    let bad = commit(&root, "Notes")?;

    // The night before: the commit everything began with sweeps the workload clean.
    git(&root, &["checkout", "-q", &good])?;
    let tiny = build(&root)?;
    let tiny = tiny.to_str().unwrap();
    let night = run(
        &root,
        tiny,
        &["sweep", "workloads/switch-with-lease.toml", "-q", "--write-baseline", "nights/1/sweep.toml"],
    );
    if night.status.code() != Some(0) {
        return Err(format!("the night before should sweep clean:\n{}", text(&night)).into());
    }
    let first = run(&root, tiny, &["changes", "--now", "nights/1/sweep.toml", "--write-baseline", "nights/state.toml"]);
    if first.status.code() != Some(0) {
        return Err(format!("a clean first night has nothing new:\n{}", text(&first)).into());
    }

    // This night: the last commit finds `blind-replay`, each finding new, with its bisect command.
    git(&root, &["checkout", "-q", "main"])?;
    build(&root)?;
    let night = run(
        &root,
        tiny,
        &[
            "sweep",
            "workloads/switch-with-lease.toml",
            "-q",
            "--out",
            "nights/2/sweep",
            "--write-baseline",
            "nights/2/sweep.toml",
        ],
    );
    if !text(&night).contains("finding `blind-replay`") {
        return Err(format!("this night's sweep should find `blind-replay`:\n{}", text(&night)).into());
    }
    let script = workspace().join(".ci/bisect-finding");
    let changes = run(
        &root,
        tiny,
        &[
            "changes",
            "--since",
            "nights/state.toml",
            "--now",
            "nights/2/sweep.toml",
            "--good",
            &good,
            "--bad",
            &bad,
            "--bisect-with",
            script.to_str().unwrap(),
        ],
    );
    let report = String::from_utf8_lossy(&changes.stdout).into_owned();
    if changes.status.code() != Some(1) || !report.contains("NEW       sweep finding `blind-replay`") {
        return Err(format!("the night's report should show new findings, and fail:\n{}", text(&changes)).into());
    }
    let summary = report.lines().last().unwrap_or_default();
    if !summary.starts_with("changes since nights/state.toml: ") || !summary.contains(" new, 0 ongoing") {
        return Err(format!("a summary of what changed: {summary}").into());
    }
    let command = report
        .lines()
        .find_map(|line| line.trim().strip_prefix("bisect: "))
        .ok_or_else(|| format!("no bisect command for a new finding:\n{report}"))?;
    if !command.starts_with(&format!("RIG_BIN=tiny RIG_PROFILE=dev {} {good} {bad} ", script.display())) {
        return Err(format!("the bisect command builds the tiny harness between the two nights: {command}").into());
    }
    // Run as printed, from the repository, as a person would paste it.
    let bisected = run(&root, "sh", &["-c", command]);
    let log = text(&bisected);
    let named = log.lines().last().unwrap_or_default();
    if !bisected.status.success() || !named.starts_with(&format!("first bad commit: {introduced} ")) {
        return Err(format!("bisect should name {introduced}:\n{log}").into());
    }
    if !log.contains(&format!("{introduced} is the first bad commit")) {
        return Err(format!("git bisect itself should name it:\n{log}").into());
    }
    if git(&root, &["rev-parse", "--abbrev-ref", "HEAD"])? != "main" {
        return Err("the bisection leaves the checkout where it was".into());
    }
    Ok(Completion::Completed)
}
