//! Live runs against real harness processes give the simulated verdicts.
//!
//! Each check starts its own `rig live` on 127.0.0.1 port 0 and a harness process pointed at
//! it: `rig harness` (the reference harness as a process) or the Python worker in `tests/live/`
//! on the real `iii-sdk` from PyPI, which the tests install (pinned) into a virtual environment
//! under the target directory when it is missing (`proxy/tests/common/installs.rs`, shared with
//! the proxy's tests). Every wait is bounded, on events (lines of
//! output, process exits) rather than sleeps, and every process a check starts is killed when
//! it ends, however it ends. The checks run side by side: they spend most of their time waiting
//! out liveness bounds, in real time.

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

#[path = "../../proxy/tests/common/installs.rs"]
mod installs;

/// The SDK and the WebSocket library the Python worker was validated against.
const PYTHON_PACKAGES: [&str; 2] = ["iii-sdk==0.25.0", "websockets==17.4"];
/// The node worker's SDK: the newest `iii-sdk` on npm.
const NODE_SDK: &str = "0.22.1";
/// The most one `rig live` command may take: its runs wait out liveness bounds in real time, and
/// a void run is made again slower (up to five times).
const LIVE_RUN_MAX: Duration = Duration::from_secs(900);
const STARTUP_MAX: Duration = Duration::from_secs(30);
/// The time scale of the runs that wait out a liveness bound: a 60 s bound becomes 30 s, and the
/// finalisation files' 300 ms deadlines 150 ms, ample for a loopback round trip on a loaded machine.
const TIME_SCALE: &str = "0.5";
/// The files checked live: the smoke scenario and the finalisation suite.
const SUITE: [&str; 2] = ["scenarios/smoke", "scenarios/incident-001/finalization"];

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("rig sits in the workspace").to_path_buf()
}

/// A process killed when the check ends, however it ends.
struct Running {
    child: Child,
    what: String,
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Makes `command` start a session of its own. The checks run side by side, and beside them this
/// binary simulates (the verdicts to compare with, a whole sweep): where Linux shares the CPU
/// between sessions (autogroup scheduling), every process of one session shares one share, so
/// on a loaded machine that work and the other checks' runs made each live run's timers late
/// (issue 35: 17 of 59 runs void after every retry at load 12 to 16, all in this binary's one
/// session). A session of its own gives each live run its own share, as a user's `rig live`
/// started from a terminal of its own has.
fn own_session(command: &mut Command) -> &mut Command {
    use std::os::unix::process::CommandExt;
    // SAFETY: setsid is async-signal-safe and touches no memory of ours; it runs in the child
    // between fork and exec.
    unsafe {
        command.pre_exec(|| {
            libc::setsid();
            Ok(())
        })
    }
}

/// Reads a stream's lines on a thread, so waiting for one can time out.
fn lines(stream: impl std::io::Read + Send + 'static) -> mpsc::Receiver<String> {
    let (sender, receiver) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stream).lines().map_while(Result::ok) {
            if sender.send(line).is_err() {
                break;
            }
        }
    });
    receiver
}

/// One verdict: a scenario file under a policy, passed or not, with the oracles that fired.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Verdict {
    scenario: String,
    policy: String,
    passed: bool,
    oracles: Vec<String>,
}

/// A `rig live` command, started: its address, its JSON lines, its stderr.
struct Live {
    running: Running,
    url: String,
    stdout: mpsc::Receiver<String>,
    stderr: mpsc::Receiver<String>,
}

fn start_live(paths: &[&str], extra: &[&str]) -> Live {
    start_live_with(paths, extra, &[])
}

/// [`start_live`] with `envs` set for `rig live`, and so for the processes it starts.
fn start_live_with(paths: &[&str], extra: &[&str], envs: &[(&str, PathBuf)]) -> Live {
    let mut child = own_session(&mut Command::new(env!("CARGO_BIN_EXE_rig")))
        .current_dir(workspace())
        .arg("live")
        .args(paths)
        .args(["--listen", "127.0.0.1:0", "--json"])
        .args(extra)
        .envs(envs.iter().map(|(name, value)| (*name, value)))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start rig live");
    let stdout = lines(child.stdout.take().expect("piped"));
    let stderr = lines(child.stderr.take().expect("piped"));
    let running = Running { child, what: format!("rig live {}", paths.join(" ")) };
    let first = stderr.recv_timeout(STARTUP_MAX).unwrap_or_else(|_| panic!("{} printed nothing", running.what));
    let url = first
        .split_whitespace()
        .find(|word| word.starts_with("ws://"))
        .unwrap_or_else(|| panic!("no address in `{first}`"))
        .trim_end_matches('/')
        .to_string();
    Live { running, url, stdout, stderr }
}

impl Live {
    /// Waits (bounded) for `rig live` to finish; its exit code and verdicts.
    fn finish(self) -> (Option<i32>, Vec<Verdict>) {
        let (code, runs) = self.finish_runs();
        let mut verdicts: Vec<Verdict> = runs.iter().map(verdict).collect();
        verdicts.sort();
        (code, verdicts)
    }

    /// Waits (bounded) for `rig live` to finish; its exit code and its JSON line per run made.
    fn finish_runs(mut self) -> (Option<i32>, Vec<serde_json::Value>) {
        let started = Instant::now();
        let status = loop {
            if let Some(status) = self.running.child.try_wait().expect("wait for rig live") {
                break status;
            }
            if started.elapsed() > LIVE_RUN_MAX {
                let stderr: Vec<String> = self.stderr.try_iter().collect();
                panic!("{} took over {LIVE_RUN_MAX:?}; stderr:\n{}", self.running.what, stderr.join("\n"));
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        let lines: Vec<serde_json::Value> = self
            .stdout
            .iter()
            .map(|line| serde_json::from_str::<serde_json::Value>(&line).expect("one JSON object per line"))
            // The line a signal leaves at the end is no run (`{"interrupted": ...}`).
            .filter(|run| run["skipped"].is_null() && run["interrupted"].is_null())
            .inspect(|run| {
                assert!(run["live"]["replay"].as_str().is_some_and(|r| r.contains("cannot be replayed")), "{run}")
            })
            .collect();
        (status.code(), judged(lines))
    }
}

/// Runs made by this binary's checks, and how many of them stayed void after every retry.
static RUNS_MADE: AtomicUsize = AtomicUsize::new(0);
static RUNS_VOID: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// The runs of this thread's checks that stayed void after every retry: no verdict to
    /// compare (see [`judged`]).
    static VOID: std::cell::RefCell<BTreeSet<(String, String)>> = Default::default();
}

/// The runs of a `rig live` that gave a verdict. A void run (the machine did not keep real time:
/// rig/docs/live.md) is made again slower by `rig live`, and its last attempt stands; one void
/// after every retry is no verdict, so it is left out of the comparison with the simulation and
/// counted. Issue 35 asks that on a loaded machine at most 1 run in 20 ends void: a check may
/// have one void run per 20 runs it made (one, of fewer than 40); the binary's tally so far is
/// printed (`--nocapture`) for the count over every check.
fn judged(lines: Vec<serde_json::Value>) -> Vec<serde_json::Value> {
    let key = |run: &serde_json::Value| (run["scenario"].to_string(), run["policy"].to_string());
    let (mut attempts_void, mut runs, mut void) = (0, Vec::new(), Vec::new());
    for (index, run) in lines.iter().enumerate() {
        if run["void"].is_null() {
            assert!(run["passed"].is_boolean(), "a verdict: {run}");
            runs.push(run.clone());
            continue;
        }
        assert!(run["passed"].is_null() && run["violations"] == serde_json::json!([]), "no verdict: {run}");
        attempts_void += 1;
        if lines.get(index + 1).is_none_or(|next| key(next) != key(run)) {
            void.push(run.clone());
        }
    }
    eprintln!(
        "rig live: {} run(s), {attempts_void} void attempt(s), {} void after every retry{}",
        runs.len() + void.len(),
        void.len(),
        void.iter()
            .map(|run| format!("; {} [{}]: {}", run["scenario"], run["policy"], run["void"]))
            .collect::<String>()
    );
    let late = void.iter().filter(|run| !run["void"].as_str().unwrap_or_default().starts_with("interrupted")).count();
    let made = RUNS_MADE.fetch_add(runs.len() + void.len(), Ordering::SeqCst) + runs.len() + void.len();
    let voided = RUNS_VOID.fetch_add(late, Ordering::SeqCst) + late;
    eprintln!("rig live: so far in this binary, {voided} of {made} run(s) void after every retry");
    let mine = runs.len() + void.len();
    assert!(late * 20 <= mine.max(20), "{late} of {mine} runs void: more than 1 in 20");
    VOID.with(|voided| {
        voided.borrow_mut().extend(void.iter().map(|run| {
            let text = |field: &str| run[field].as_str().unwrap_or_default().to_string();
            (text("scenario"), text("policy"))
        }))
    });
    runs
}

fn verdict(run: &serde_json::Value) -> Verdict {
    let text = |field: &str| run[field].as_str().unwrap_or_default().to_string();
    let oracles = run["violations"].as_array().into_iter().flatten();
    Verdict {
        scenario: text("scenario"),
        policy: text("policy"),
        passed: run["passed"].as_bool().unwrap_or(false),
        oracles: oracles.map(|o| o.as_str().unwrap_or_default().to_string()).collect(),
    }
}

/// The simulated verdicts of `files` under `policy`, seed 0.
fn simulated_of(files: &[&str], policy: &str) -> Vec<Verdict> {
    let mut verdicts: Vec<Verdict> = files
        .iter()
        .map(|file| {
            let scenario = rig::Scenario::load(&workspace().join(file)).expect("a valid scenario");
            let outcome = rig::run(&scenario, scenario.run_of(policy).expect("the file declares the policy"), 0);
            let fired = outcome.violations.iter().map(|v| v.oracle.name().to_string()).collect::<BTreeSet<_>>();
            Verdict {
                scenario: file.to_string(),
                policy: policy.into(),
                passed: outcome.passed,
                oracles: fired.into_iter().collect(),
            }
        })
        .collect();
    verdicts.sort();
    verdicts
}

/// The simulated verdicts of the suite under `policy`, seed 0.
fn simulated(policy: &str) -> Vec<Verdict> {
    let mut verdicts = Vec::new();
    for folder in SUITE {
        let mut files: Vec<PathBuf> = std::fs::read_dir(workspace().join(folder))
            .expect("the suite's folder")
            .map(|entry| entry.expect("an entry").path())
            .filter(|path| path.extension().is_some_and(|e| e == "toml"))
            .collect();
        files.sort();
        for file in files {
            let name = Path::new(folder).join(file.file_name().expect("a file name"));
            let source = std::fs::read_to_string(&file).expect("readable");
            let scenario = rig::Scenario::parse(&name, &source).expect("a valid scenario");
            let run = scenario.run_of(policy).expect("the suite declares every policy checked");
            let outcome = rig::run(&scenario, run, 0);
            let fired: BTreeSet<String> = outcome.violations.iter().map(|v| v.oracle.name().to_string()).collect();
            verdicts.push(Verdict {
                scenario: name.display().to_string(),
                policy: policy.to_string(),
                passed: outcome.passed,
                oracles: fired.into_iter().collect(),
            });
        }
    }
    verdicts.sort();
    verdicts
}

/// Runs `rig live` on `paths` against a harness process `harness(url)` starts; the verdicts.
fn live_against(paths: &[&str], extra: &[&str], harness: impl FnOnce(&str) -> Running) -> Vec<Verdict> {
    let live = start_live(paths, extra);
    let worker = harness(&live.url);
    let what = worker.what.clone();
    let (code, runs) = live.finish_runs();
    drop(worker);
    assert!(matches!(code, Some(0 | 1 | 75)), "rig live against {what} exited {code:?}: {runs:#?}");
    // What went wrong in each run, for a verdict that differs from the simulated one.
    for run in runs.iter().filter(|run| !run["failures"].as_array().is_none_or(Vec::is_empty)) {
        eprintln!("{} [{}] against {what}: {}", run["scenario"], run["policy"], run["failures"]);
    }
    verdicts(&runs)
}

/// `rig harness` connected to `url`, as `policy`.
fn rig_harness(url: &str, policy: &str) -> Running {
    let child = own_session(&mut Command::new(env!("CARGO_BIN_EXE_rig")))
        .args(["harness", "--connect", url, "--policy", policy])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start rig harness");
    Running { child, what: format!("rig harness --policy {policy}") }
}

/// The pinned SDK in a virtual environment under the target directory (never the user's own
/// Python), installed from PyPI when it is missing. Fails, never skips, when that is not possible.
fn sdk() -> &'static installs::Venv {
    static VENV: std::sync::OnceLock<Result<installs::Venv, String>> = std::sync::OnceLock::new();
    VENV.get_or_init(|| installs::python_venv("live-python", &PYTHON_PACKAGES)).as_ref().unwrap_or_else(|why| {
        panic!("the Python iii SDK could not be installed ({}): {why}", PYTHON_PACKAGES.join(", "))
    })
}

/// The command that starts the Python worker (`--swallow`: the variant with incident 001's bug),
/// for `rig live --spawn`, and the environment it needs.
fn python_worker(swallow: bool) -> (String, Vec<(&'static str, PathBuf)>) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests").join("live").join("harness_worker.py");
    let command =
        format!("{} {}{}", sdk().python().display(), script.display(), if swallow { " --swallow" } else { "" });
    // The SDK leaves a marker file under ~/.iii when it is killed: keep it in the target dir.
    let home = Path::new(env!("CARGO_TARGET_TMPDIR")).join("live-python-home");
    std::fs::create_dir_all(&home).expect("a home for the worker");
    (command, vec![("HOME", home)])
}

/// `rig live --spawn` on `paths` with the Python worker; the runs' JSON lines.
fn live_python(paths: &[&str], extra: &[&str], swallow: bool) -> Vec<serde_json::Value> {
    let (spawn, envs) = python_worker(swallow);
    let extra: Vec<&str> = extra.iter().copied().chain(["--spawn", &spawn]).collect();
    let (code, runs) = start_live_with(paths, &extra, &envs).finish_runs();
    assert!(matches!(code, Some(0 | 1 | 75)), "rig live against the Python worker exited {code:?}: {runs:#?}");
    runs
}

fn verdicts(runs: &[serde_json::Value]) -> Vec<Verdict> {
    let mut verdicts: Vec<Verdict> = runs.iter().map(verdict).collect();
    verdicts.sort();
    verdicts
}

/// Where the node worker runs: an npm prefix under the target directory with the pinned SDK,
/// and the worker's script copied beside its `node_modules` (an ES module finds its packages
/// from where it lies). Installed from npm when missing; fails, never skips, when it cannot be.
fn node_worker() -> PathBuf {
    static SCRIPT: std::sync::OnceLock<Result<PathBuf, String>> = std::sync::OnceLock::new();
    let script = SCRIPT.get_or_init(|| {
        let modules = installs::npm_prefix("live-node", "iii-sdk", NODE_SDK)?;
        let prefix = modules.parent().expect("node_modules sits in its prefix");
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests").join("live").join("harness_worker.mjs");
        let copy = prefix.join(format!("harness_worker.{}.mjs", std::process::id()));
        std::fs::copy(&script, &copy).map_err(|e| format!("cannot copy {}: {e}", script.display()))?;
        Ok(copy)
    });
    script.clone().unwrap_or_else(|why| panic!("the node iii SDK {NODE_SDK} could not be installed: {why}"))
}

/// A harness for node, on the newest `iii-sdk` on npm, started by the rig: it passes smoke and
/// the finalisation suite with the simulated verdicts.
#[test]
fn a_node_harness_on_the_iii_sdk_from_npm_gives_the_simulated_verdicts() {
    let spawn = format!("node {}", node_worker().display());
    let (code, runs) = start_live(&SUITE, &["--policy", "reference", "--spawn", &spawn]).finish_runs();
    assert!(matches!(code, Some(0 | 1 | 75)), "rig live against the node worker exited {code:?}: {runs:#?}");
    for run in runs.iter().filter(|run| run["passed"] != true) {
        eprintln!("{} against the node worker: {}", run["scenario"], run["failures"]);
    }
    assert_same(verdicts(&runs), simulated("reference"), "the node worker");
}

/// The live verdicts are the simulated ones, but for the runs that stayed void (see [`judged`]).
fn assert_same(live: Vec<Verdict>, simulated: Vec<Verdict>, against: &str) {
    let voided = VOID.with(|voided| voided.borrow().clone());
    let simulated: Vec<Verdict> =
        simulated.into_iter().filter(|v| !voided.contains(&(v.scenario.clone(), v.policy.clone()))).collect();
    assert_eq!(live, simulated, "live verdicts against {against} (left) differ from the simulated ones (right)");
}

/// The reference harness as a process gives the simulated verdicts on the suite, under the
/// correct policy and both of incident 001's known-bad ones, one `rig live` per policy side by
/// side. A run whose turn never ends is judged as soon as its world is provably quiet (`rig
/// harness` says how long it may wait by itself), not at the end of its liveness bound.
///
/// On a loaded machine `redelivered-while-running` gave `stranded` without a timer late past
/// its bound: its second delivery's visibility deadline outlives the first turn's end by the
/// queue's 100 ms backoff only, and the harness's thirty-odd trips in between took longer under
/// load. The rig now measures that work's lateness too (rig/docs/live.md): such a run is void
/// and made again slower, never a verdict.
#[test]
fn the_reference_harness_as_a_process_gives_the_simulated_verdicts() {
    std::thread::scope(|scope| {
        let checks: Vec<_> = ["reference", "swallow", "propagate"]
            .into_iter()
            .map(|policy| {
                scope.spawn(move || {
                    let mut extra = vec!["--policy", policy];
                    if policy != "reference" {
                        extra.extend(["--time-scale", TIME_SCALE]);
                    }
                    let live = live_against(&SUITE, &extra, |url| rig_harness(url, policy));
                    assert_same(live, simulated(policy), &format!("rig harness --policy {policy}"));
                })
            })
            .collect();
        for check in checks {
            check.join().expect("a check");
        }
    });
}

/// A harness in another language, on the real iii SDK, started by the rig: it passes the suite
/// with the simulated verdicts; its swallowing variant gives the known-bad policy's simulated
/// verdicts, and is caught by `liveness` when judged as a correct harness, as soon as the world
/// is provably quiet (the worker says how long it may wait by itself) rather than at the end of
/// the liveness bound. (The swallowing variant runs on the cases that exercise its bug.)
#[test]
fn a_python_harness_on_the_real_iii_sdk_gives_the_simulated_verdicts() {
    sdk();
    const BUGGY: [&str; 2] =
        ["scenarios/incident-001/finalization/lost-ack.toml", "scenarios/incident-001/finalization/read-timeout.toml"];
    std::thread::scope(|scope| {
        let correct = scope.spawn(|| {
            let live = verdicts(&live_python(&SUITE, &["--policy", "reference"], false));
            assert!(live.iter().all(|v| v.passed), "{live:#?}");
            assert_same(live, simulated("reference"), "the Python worker");
        });
        let swallowing = scope.spawn(|| {
            let scaled = ["--policy", "swallow", "--time-scale", TIME_SCALE];
            let live = verdicts(&live_python(&BUGGY, &scaled, true));
            assert_same(live, simulated_of(&BUGGY, "swallow"), "the swallowing Python worker");
        });
        let caught = scope.spawn(|| {
            let file = ["scenarios/incident-001/finalization/write-rejected.toml"];
            let scaled = ["--policy", "reference", "--time-scale", TIME_SCALE];
            let runs = live_python(&file, &scaled, true);
            let live = verdicts(&runs);
            assert_eq!(live.len(), 1, "{live:#?}");
            assert!(!live[0].passed && live[0].oracles.contains(&"liveness".to_string()), "{live:#?}");
            let liveness = runs[0]["violation_details"].to_string();
            assert!(liveness.contains("the world went quiet"), "judged at the liveness bound: {liveness}");
        });
        for check in [correct, swallowing, caught] {
            check.join().expect("a check");
        }
    });
}

/// Without a worker, a live run waits a bounded time and says what is missing and where to
/// connect; a process the rig started that ends by itself fails its run at once, quoting its
/// output; a scenario that needs the simulation is skipped, naming the step, and a command that
/// could run nothing else says so.
#[test]
fn a_missing_worker_a_dead_process_and_a_simulation_only_step_are_reported_clearly() {
    let rig_live = |args: &[&str]| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_rig"));
        command.current_dir(workspace()).arg("live").args(args).args(["--listen", "127.0.0.1:0"]);
        // Bounded by --connect-timeout-ms; a skip comes before anything runs.
        command.output().expect("rig live runs")
    };
    let alone = rig_live(&["scenarios/smoke/healthy-turn.toml", "--connect-timeout-ms", "1000"]);
    assert_eq!(alone.status.code(), Some(1));
    let stdout = String::from_utf8_lossy(&alone.stdout);
    assert!(stdout.contains("no worker registered harness::turn within 1000 ms"), "{stdout}");
    assert!(stdout.contains("no worker connected as `harness`") && stdout.contains("ws://127.0.0.1:"), "{stdout}");
    let dead = rig_live(&["scenarios/smoke/healthy-turn.toml", "--spawn", "echo about to go; exit 3"]);
    assert_eq!(dead.status.code(), Some(1));
    let stdout = String::from_utf8_lossy(&dead.stdout);
    assert!(stdout.contains("the harness process of `harness` ended by itself"), "{stdout}");
    assert!(stdout.contains("exit status 3") && stdout.contains("about to go"), "{stdout}");
    let refused = rig_live(&["scenarios/harness-switch/stale-worker.toml"]);
    assert_eq!(refused.status.code(), Some(2));
    let stdout = String::from_utf8_lossy(&refused.stdout);
    assert!(
        stdout.contains("SKIP scenarios/harness-switch/stale-worker.toml [reference]: cannot run live"),
        "{stdout}"
    );
    assert!(stdout.contains("[[interrupt]] #1"), "{stdout}");
    assert!(String::from_utf8_lossy(&refused.stderr).contains("every run was skipped"));
}

/// Whether the process `pid` is gone (or a zombie nobody has reaped yet, which runs nothing),
/// waiting a little for a SIGKILL to be delivered.
fn gone(pid: u64) -> bool {
    let dead = || match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat.rsplit_once(") ").is_some_and(|(_, rest)| rest.starts_with('Z')),
    };
    let started = Instant::now();
    while !dead() {
        if started.elapsed() > Duration::from_secs(5) {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    true
}

/// With `--spawn` the rig owns the harness process: cuts and steps that crash a host kill it
/// (its group) and start it again, as a supervisor would, and a pause stops and continues it;
/// the rig's own store and engine crash as before. The verdicts are the simulated ones; each
/// process start has its own output file, and none is left running.
#[test]
fn a_spawned_harness_is_killed_restarted_and_paused_as_a_host_is() {
    let files = [
        "scenarios/regressions/child-turn-store-crash.toml",
        "scenarios/regressions/successor-enqueued-across-an-engine-restart.toml",
        "scenarios/regressions/owed-terminal-state-not-recorded.toml",
        "scenarios/regressions/crash-mid-turn-redelivered.toml",
        "scenarios/restarts/paused-worker-does-nothing.toml",
    ];
    let trace = Path::new(env!("CARGO_TARGET_TMPDIR")).join("live-spawned.jsonl");
    let rig = format!("{} harness", env!("CARGO_BIN_EXE_rig"));
    let live = start_live(&files, &["--spawn", &rig, "--trace", trace.to_str().unwrap()]);
    let (code, runs) = live.finish_runs();
    assert!(matches!(code, Some(0 | 1 | 75)), "{runs:#?}");
    for run in runs.iter().filter(|run| run["passed"] != true) {
        eprintln!("{} against a spawned rig harness: {}", run["scenario"], run["failures"]);
    }
    assert_same(verdicts(&runs), simulated_of(&files, "reference"), "a spawned rig harness");
    let trace = std::fs::read_to_string(&trace).expect("the trace was written");
    for host in ["store", "engine", "harness"] {
        let restarted = format!("\"action\":\"crash and restart\",\"target\":\"{host}\"");
        assert!(trace.contains(&restarted), "no crash of `{host}` in the live trace");
    }
    let notes: Vec<serde_json::Value> = trace
        .lines()
        .map(|line| serde_json::from_str::<serde_json::Value>(line).expect("a JSON line"))
        .filter(|line| line["event"]["what"].as_str().is_some_and(|what| what.starts_with("process_")))
        .collect();
    // The notes of a file's last attempt, the one that gave its verdict: a void run made again
    // (rig/docs/live.md) starts its process afresh at 0 ms, and a void attempt stops as soon as it
    // is void, perhaps before its crash or its pause (one at load 15 had started its process and
    // killed nothing). None for a file void after every retry: no verdict, nothing to check.
    let voided = VOID.with(|voided| voided.borrow().clone());
    let last_attempt = |scenario: &str| {
        if voided.contains(&(scenario.to_string(), "reference".to_string())) {
            return None;
        }
        let mine: Vec<&serde_json::Value> = notes.iter().filter(|n| n["scenario"].as_str() == Some(scenario)).collect();
        let first_start = |n: &&serde_json::Value| n["event"]["what"] == "process_started" && n["event"]["at_ms"] == 0;
        let begun = mine.iter().rposition(first_start).expect("the process started");
        Some(mine[begun..].to_vec())
    };
    let count = |notes: &[&serde_json::Value], what: &str| notes.iter().filter(|n| n["event"]["what"] == what).count();
    if let Some(last) = last_attempt("scenarios/regressions/crash-mid-turn-redelivered.toml") {
        assert_eq!((count(&last, "process_killed"), count(&last, "process_started")), (1, 2), "{last:#?}");
    }
    if let Some(last) = last_attempt("scenarios/restarts/paused-worker-does-nothing.toml") {
        assert_eq!((count(&last, "process_stopped"), count(&last, "process_continued")), (1, 1), "{last:#?}");
    }
    for started in notes.iter().filter(|n| n["event"]["what"] == "process_started") {
        let detail = &started["event"]["detail"];
        let output = detail["output"].as_str().expect("an output file");
        assert!(Path::new(output).is_file(), "no output file {output}");
        let pid = detail["pid"].as_u64().expect("a pid");
        assert!(gone(pid), "process {pid} ({output}) outlived its run");
    }
}

/// Ctrl-C stops `rig live` and every process it started, their children included.
#[test]
fn no_harness_process_outlives_rig_live_stopped_by_ctrl_c() {
    let pids = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("live-ctrl-c-{}.pids", std::process::id()));
    let _ = std::fs::remove_file(&pids);
    // The harness, and a child of its own that would outlive it if only the first were killed.
    let spawn = format!(
        "echo $$ >> {pids}; sleep 600 & echo $! >> {pids}; exec {} harness",
        env!("CARGO_BIN_EXE_rig"),
        pids = pids.display()
    );
    // A healed world settles only after --quiet-ms of quiet: the run is still going when stopped.
    let live = start_live(&["scenarios/smoke/healthy-turn.toml"], &["--spawn", &spawn, "--quiet-ms", "600000"]);
    let started = Instant::now();
    let written = loop {
        let written: Vec<u64> = std::fs::read_to_string(&pids)
            .unwrap_or_default()
            .lines()
            .filter_map(|line| line.trim().parse().ok())
            .collect();
        if written.len() == 2 {
            break written;
        }
        assert!(started.elapsed() < STARTUP_MAX, "the harness process never started");
        std::thread::sleep(Duration::from_millis(20));
    };
    let rig = live.running.child.id().to_string();
    assert!(Command::new("kill").args(["-INT", &rig]).status().expect("kill").success());
    let (code, _) = live.finish_runs();
    assert_eq!(code, Some(130), "rig live stopped by SIGINT");
    for pid in written {
        assert!(gone(pid), "process {pid} outlived rig live");
    }
}

/// Issue 21, items 10 and 11, over real TCP: a connection that asks to be one of the rig's
/// own hosts is refused at its handshake; one that registers the rig's functions
/// (`state::get`, `model::generate`, ...) or reattaches as an internal worker id is refused
/// with a logged reason, and the run goes on and passes against the real harness that comes
/// next; a 64 MiB frame is answered with a close frame 1009, not a dropped connection.
#[test]
fn a_hostile_worker_is_refused_and_the_run_goes_on() {
    use tokio_tungstenite::tungstenite::{self, protocol::frame::coding::CloseCode, Message};
    let live = start_live(&["scenarios/smoke/healthy-turn.toml"], &["--policy", "reference"]);
    let address = live.url.trim_start_matches("ws://").to_string();
    let open = |path: &str| {
        let stream = std::net::TcpStream::connect(&address).expect("connect to rig live");
        stream.set_read_timeout(Some(STARTUP_MAX)).expect("a read timeout");
        tungstenite::client(format!("{}{path}", live.url), stream).map(|(socket, _)| socket).map_err(|e| match e {
            tungstenite::HandshakeError::Failure(tungstenite::Error::Http(answer)) => answer.status().as_u16(),
            other => panic!("the handshake broke: {other}"),
        })
    };
    assert_eq!(open("/store").err(), Some(404), "the store is the rig's own host, no worker's");
    let mut hostile = open("/").expect("a worker may connect as `harness`");
    let registered = hostile.read().expect("workerregistered");
    assert!(registered.to_text().unwrap_or_default().contains("workerregistered"), "{registered}");
    for function in ["state::get", "state::set", "model::generate", "session::messages", "rig::config"] {
        let frame = serde_json::json!({ "type": "registerfunction", "id": function });
        hostile.send(Message::text(frame.to_string())).expect("send");
    }
    for worker in 1..=12 {
        let frame = serde_json::json!({ "type": "reattach", "previous_worker_id": format!("worker-{worker}") });
        hostile.send(Message::text(frame.to_string())).expect("send");
    }
    // The engine reads the frames in order: every refusal above is made before this frame.
    hostile.send(Message::binary(vec![0u8; 64 << 20])).expect("the engine reads what it is sent");
    let close = loop {
        match hostile.read() {
            Ok(Message::Close(frame)) => break frame,
            Ok(_) => continue,
            Err(error) => panic!("the connection ended without a close frame: {error}"),
        }
    };
    assert_eq!(close.map(|c| c.code), Some(CloseCode::Size), "1009: message too big");
    drop(hostile);
    let mut refusals = Vec::new();
    while refusals.len() < 2 {
        let line = live.stderr.recv_timeout(STARTUP_MAX).expect("rig live says what it refused");
        if line.contains("refused `registerfunction state::get`") || line.contains("refused `reattach") {
            refusals.push(line);
        }
    }
    let worker = rig_harness(&live.url, "reference");
    let (code, verdicts) = live.finish();
    drop(worker);
    assert_eq!(code, Some(0), "{verdicts:#?}");
    assert!(verdicts.len() == 1 && verdicts[0].passed, "{verdicts:#?}");
}

/// `rig sweep --live` sweeps the Python worker's swallowing variant live, each cut run against a
/// process the rig starts, and finds what the simulated sweep of the `swallow` policy finds: the
/// first placements of the live cut space (the worker's own calls to the rig, then the turn's
/// invocation) include a drop of the turn's invocation, which leaves the turn running
/// (`liveness`). Its finding is written as a scenario file that says how to rerun it live, and
/// its live replay trips the oracle again. (The whole sweep, 86 live runs, is in the notes: too
/// long for a test.)
#[test]
fn a_live_sweep_of_the_swallowing_python_worker_finds_what_the_simulated_sweep_finds() {
    let file = "scenarios/incident-001/finalization/healthy.toml";
    let workload = rig::Scenario::load(&workspace().join(file)).expect("a valid scenario");
    let options = rig::explore::SweepOptions { policy: "swallow".into(), ..Default::default() };
    let simulated: BTreeSet<(String, String)> = rig::explore::sweep(&rig::reference(), &workload, &options)
        .expect("the harness serves the workload")
        .findings
        .iter()
        .map(|f| (f.oracle.clone(), f.placements.iter().map(|p| p.id()).collect::<Vec<_>>().join(" + ")))
        .collect();
    let (spawn, envs) = python_worker(true);
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("live-sweep-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let mut command = Command::new(env!("CARGO_BIN_EXE_rig"));
    own_session(&mut command)
        .current_dir(workspace())
        .args(["sweep", file, "--policy", "swallow", "--live", "--spawn", &spawn]);
    command.args(["--time-scale", TIME_SCALE, "--budget", "7", "--jobs", "2", "--out", out.to_str().unwrap()]);
    let output = bounded(command.envs(envs.iter().map(|(name, value)| (*name, value))));
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(1), "a finding exits 1:\n{stdout}");
    assert!(stdout.contains("(harness live)") && stdout.contains("  live: the uncut run "), "{stdout}");
    let found: Vec<&str> = stdout.lines().filter(|line| line.starts_with("  finding `")).collect();
    let matched: Vec<&&str> = found
        .iter()
        .filter(|line| simulated.iter().any(|(oracle, ids)| line.starts_with(&format!("  finding `{oracle}`: {ids} "))))
        .collect();
    assert!(!matched.is_empty(), "no live finding is a simulated one ({simulated:#?}):\n{stdout}");
    for line in matched {
        assert!(line.contains(" live ") && line.contains("--spawn") && !line.contains("NOT REPRODUCED"), "{line}");
        let written = line.split(" -> ").nth(1).and_then(|rest| rest.split(" (replay: ").next()).expect("a file");
        let text = std::fs::read_to_string(written).expect("the finding was written");
        // The replay line follows the finding's header (which says what found it, and with which cut).
        let header = text.lines().take_while(|l| l.starts_with('#'));
        assert!(header.clone().any(|l| l.starts_with("# Replay it live with `")), "{text}");
    }
    let processes = std::fs::read_dir(out.join("processes")).expect("the processes' output").count();
    assert!(processes >= 8, "one output file per process start: {processes}");
}

/// Runs `command` to its end, bounded by [`LIVE_RUN_MAX`].
fn bounded(command: &mut Command) -> std::process::Output {
    let child = command.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("start rig");
    let (sender, receiver) = mpsc::channel();
    let pid = child.id();
    std::thread::spawn(move || drop(sender.send(child.wait_with_output())));
    match receiver.recv_timeout(LIVE_RUN_MAX) {
        Ok(output) => output.expect("rig ran"),
        Err(_) => {
            // SIGTERM: rig kills every process it started before it exits.
            let _ = Command::new("kill").arg(pid.to_string()).status();
            panic!("rig took over {LIVE_RUN_MAX:?}");
        }
    }
}

/// With `--spawn`, only the processes the run started may connect: each has the run's key in
/// its URL, so a worker of another run that happens to reconnect to this port (an earlier
/// `rig live` on the same port number, say) is refused (403) instead of serving this run's turn.
#[test]
fn a_worker_the_run_did_not_start_is_refused_under_spawn() {
    use tokio_tungstenite::tungstenite;
    // The run's own harness connects a moment later; the stranger comes first.
    let spawn = format!("sleep 1; exec {} harness", env!("CARGO_BIN_EXE_rig"));
    let live = start_live(&["scenarios/smoke/healthy-turn.toml"], &["--spawn", &spawn]);
    let address = live.url.trim_start_matches("ws://").to_string();
    let stream = std::net::TcpStream::connect(&address).expect("connect to rig live");
    stream.set_read_timeout(Some(STARTUP_MAX)).expect("a read timeout");
    let status = match tungstenite::client(format!("{}/", live.url), stream) {
        Ok(_) => None,
        Err(tungstenite::HandshakeError::Failure(tungstenite::Error::Http(answer))) => Some(answer.status().as_u16()),
        Err(other) => panic!("the handshake broke: {other}"),
    };
    assert_eq!(status, Some(403), "a connection without the run's key is refused");
    let (code, verdicts) = live.finish();
    assert_eq!(code, Some(0), "{verdicts:#?}");
    assert!(verdicts.len() == 1 && verdicts[0].passed, "{verdicts:#?}");
}

/// Issue 35, item 2: a live run on a machine that did not keep real time gave a verdict anyway
/// (under load, `redelivered-while-running` gave `stranded` besides `truthful-reply`). Here the
/// machine stalls for certain: `rig live` itself is stopped (SIGSTOP) for 800 ms in the middle of
/// its run, so its clock's timers fire that late. The run is void, saying why, neither passed
/// nor failed, and is made again at twice the time scale, which passes; the summary counts both.
#[test]
fn a_run_the_machine_did_not_keep_time_for_is_void_and_made_again_slower() {
    let logs = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("live-stalled-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&logs);
    let rig_harness = format!("{} harness", env!("CARGO_BIN_EXE_rig"));
    // A healed world settles after --quiet-ms of quiet: the run is still going when stalled.
    let extra = ["--spawn", &rig_harness, "--quiet-ms", "5000", "--logs", logs.to_str().unwrap()];
    // Its deadlines are 300 ms: the bound is 150 ms.
    let live = start_live(&["scenarios/incident-001/finalization/healthy.toml"], &extra);
    // `rig harness` says it serves the run once it has the run's settings, just before it
    // registers; the turn is over within moments of that, and then 5 s of quiet follow.
    let serving =
        || {
            std::fs::read_dir(&logs).into_iter().flatten().flatten().any(|entry| {
                std::fs::read_to_string(entry.path()).is_ok_and(|text| text.contains("rig harness: serving"))
            })
        };
    let since = Instant::now();
    while !serving() {
        assert!(since.elapsed() < STARTUP_MAX, "the harness process never served the run");
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(1000));
    let rig = live.running.child.id().to_string();
    assert!(Command::new("kill").args(["-STOP", &rig]).status().expect("kill").success());
    std::thread::sleep(Duration::from_millis(800));
    assert!(Command::new("kill").args(["-CONT", &rig]).status().expect("kill").success());
    let mut live = live;
    let (code, lines) = {
        let started = Instant::now();
        let status = loop {
            if let Some(status) = live.running.child.try_wait().expect("wait for rig live") {
                break status;
            }
            assert!(started.elapsed() < LIVE_RUN_MAX, "rig live took too long");
            std::thread::sleep(Duration::from_millis(100));
        };
        let lines: Vec<serde_json::Value> =
            live.stdout.iter().map(|line| serde_json::from_str(&line).expect("a JSON line")).collect();
        (status.code(), lines)
    };
    assert_eq!(code, Some(0), "{lines:#?}");
    // The retry waited for the machine to keep time again, rather than start in the stall.
    let stderr: Vec<String> = live.stderr.try_iter().collect();
    assert!(stderr.iter().any(|line| line.contains("(the machine kept time again after ")), "{stderr:#?}");
    // (On a loaded machine the slower attempt may be void too, and is made again slower still.)
    assert!((2..=6).contains(&lines.len()), "a void attempt, then the run made again: {lines:#?}");
    let (void, again) = (&lines[0], &lines[lines.len() - 1]);
    assert!(lines[1..lines.len() - 1].iter().all(|line| !line["void"].is_null()), "{lines:#?}");
    let why = void["void"].as_str().unwrap_or_default();
    assert!(why.contains("did not keep real time") && why.contains("ms late"), "{void}");
    assert!(void["passed"].is_null() && void["failures"].as_array().is_some_and(|f| f.len() == 1), "{void}");
    assert_eq!(again["passed"], true, "{again}");
    assert!(again["void"].is_null(), "{again}");
    let attempt = lines.len() as u64;
    // Twice slower, and no slower than that: at 4x its 60 s liveness bound would be past the
    // 120 s live mode waits out, so a further retry stays at 2.
    let scale = if lines.len() > 1 { 2.0 } else { 1.0 };
    assert_eq!((again["live"]["attempt"].as_u64(), again["live"]["time_scale"].as_f64()), (Some(attempt), Some(scale)));
}

/// Issue 38: a harness process that is slow to start again gives a live verdict the instant
/// restart of the simulation does not: killed mid-turn, it takes a second to serve again (as an
/// interpreter loading its SDK takes most of a second), in which the queue redelivers the turn
/// into nothing and gives up (three redeliveries 100 ms apart, 200 ms apart at time scale 2,
/// the slowest a void run of it is made again at). The report gives each restart's measured time, and, as the verdict differs from
/// the simulated one, names the setting that reproduces it in the simulation; simulated with
/// it, the run gives the live verdict.
#[test]
fn a_slow_restart_is_measured_and_the_setting_that_reproduces_it_is_named() {
    // The shipped file, but for its last step's wait for the turn to complete: live, a turn that
    // never ends is waited for to the end of it (60 s, 120 s for a retry at twice the scale).
    let shipped = std::fs::read_to_string(workspace().join("scenarios/regressions/crash-mid-turn-redelivered.toml"))
        .expect("the shipped file");
    let copy = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("slow-restart-{}.toml", std::process::id()));
    std::fs::write(&copy, shipped.replace("within_ms = 60_000", "within_ms = 5_000")).expect("a copy");
    let file = copy.to_str().expect("a path");
    let spawn = format!("sleep 1; exec {} harness", env!("CARGO_BIN_EXE_rig"));
    let (code, runs) = start_live(&[file], &["--spawn", &spawn]).finish_runs();
    assert!(matches!(code, Some(1 | 75)), "{runs:#?}");
    if runs.is_empty() {
        // Void after every retry (counted by `judged`): no verdict to compare.
        return;
    }
    let [run] = runs.as_slice() else { panic!("one run with a verdict: {runs:#?}") };
    let notes: Vec<&str> = run["notes"].as_array().expect("notes").iter().filter_map(|n| n.as_str()).collect();
    let measured: Vec<u64> = notes
        .iter()
        .filter_map(|note| note.split_once(" ms, served again ")?.1.split_once(" ms later")?.0.parse().ok())
        .collect();
    let [took] = measured.as_slice() else { panic!("one restart measured: {notes:#?}") };
    assert!((1_000..2_400).contains(took), "the restart took the process's second and a little more: {notes:#?}");
    let named = notes.iter().find(|n| n.contains("harness_restart_ms = ")).unwrap_or_else(|| panic!("{notes:#?}"));
    assert!(
        named.contains("the verdict differs from the simulated one (PASS)") && named.ends_with(", as live"),
        "{named}"
    );
    // The simulation says the same with the setting the report names.
    let mut scenario = rig::Scenario::load(&copy).expect("a valid scenario");
    let run_of = scenario.run_of("reference").expect("reference").clone();
    assert!(rig::run(&scenario, &run_of, 0).passed, "instant restarts pass");
    let setting: u64 = named
        .split_once("harness_restart_ms = ")
        .and_then(|(_, rest)| rest.split_once('`'))
        .and_then(|(ms, _)| ms.parse().ok())
        .expect("the setting's value");
    scenario.world.network.harness_restart_ms = setting;
    let slow = rig::run(&scenario, &run_of, 0);
    let fired: BTreeSet<String> = slow.violations.iter().map(|v| v.oracle.name().to_string()).collect();
    assert_eq!(
        verdict(run),
        Verdict {
            scenario: file.into(),
            policy: "reference".into(),
            passed: slow.passed,
            oracles: fired.into_iter().collect()
        }
    );
    assert!(!slow.passed, "{:#?}", slow.failures);
}

/// The restarts a live run measured (`served again N ms later`), in real milliseconds.
fn measured_restarts(run: &serde_json::Value) -> Vec<u64> {
    let notes = run["notes"].as_array().into_iter().flatten().filter_map(|note| note.as_str());
    notes.filter_map(|note| note.split_once(" ms, served again ")?.1.split_once(" ms later")?.0.parse().ok()).collect()
}

/// Issue 38, item 6: the Python worker on the real iii SDK serves tool rounds (planned in the
/// turn record, each action's intent recorded before its effect, resumed from the record after
/// a crash), so it runs `regressions/crash-mid-turn-redelivered.toml` as shipped: killed after
/// its first round, started again by the rig. An interpreter loading the SDK takes most of a
/// second to serve again; meanwhile the file's queue redelivers three times, 100 ms apart, into
/// nothing, and gives the turn up. The report gives the restart's measured time and, as the
/// verdict differs from the instant restart's, names `harness_restart_ms` set to it; the
/// simulation with that setting gives the live verdict. With a queue patient enough to outlast
/// the restart (2 s backoff, 5 redeliveries: the same file otherwise), the worker resumes the
/// turn at its second round and passes, as the simulation with its measured restart does: no
/// round asked of the model twice, no ticket opened twice.
#[test]
fn the_python_worker_killed_mid_turn_gives_the_verdict_simulated_with_its_measured_restart() {
    sdk();
    let shipped = "scenarios/regressions/crash-mid-turn-redelivered.toml";
    let source = std::fs::read_to_string(workspace().join(shipped)).expect("the shipped file");
    assert!(source.contains("\nbackoff_ms = 100\n"), "the shipped file's queue changed: update this test");
    let patient = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("patient-queue-{}.toml", std::process::id()));
    std::fs::write(&patient, source.replace("\nbackoff_ms = 100\n", "\nbackoff_ms = 2_000\nmax_retries = 5\n"))
        .expect("a copy");
    let patient = patient.to_str().expect("a path").to_string();
    let runs = live_python(&[shipped, &patient], &["--policy", "reference"], false);
    for run in &runs {
        eprintln!("{} [python worker]: passed {}, notes {}", run["scenario"], run["passed"], run["notes"]);
        let file = run["scenario"].as_str().expect("a scenario");
        let [took] = measured_restarts(run)[..] else { panic!("one restart measured: {run}") };
        let scale = run["live"]["time_scale"].as_f64().expect("a time scale");
        // The file's own milliseconds, as the report names them.
        let setting = (took as f64 / scale).round() as u64;
        let mut scenario = rig::Scenario::load(&workspace().join(file)).expect("a valid scenario");
        let policy = scenario.run_of("reference").expect("reference").clone();
        let instant = rig::run(&scenario, &policy, 0);
        assert!(instant.passed, "a correct harness restarted at once passes {file}: {:#?}", instant.failures);
        scenario.world.network.harness_restart_ms = setting;
        let slow = rig::run(&scenario, &policy, 0);
        let fired: BTreeSet<String> = slow.violations.iter().map(|v| v.oracle.name().to_string()).collect();
        let simulated = Verdict {
            scenario: file.into(),
            policy: "reference".into(),
            passed: slow.passed,
            oracles: fired.into_iter().collect(),
        };
        assert_eq!(verdict(run), simulated, "live (left) and simulated with `harness_restart_ms = {setting}` (right)");
        let notes = run["notes"].to_string();
        if file == shipped {
            // Most of a second to serve again: past the queue's three redeliveries 100 ms apart.
            assert!(!slow.passed && setting > 300, "restarted in {took} ms: {notes}");
            assert!(notes.contains(&format!("harness_restart_ms = {setting}` the run gives FAIL")), "{notes}");
            assert!(notes.contains(", as live"), "{notes}");
        } else {
            assert!(slow.passed, "a queue patient for 10 s outlasts a restart of {took} ms: {notes}");
            let actions = run["actions"].as_array().expect("the run's actions");
            assert!(actions.len() == 2 && actions.iter().all(|a| a["status"] == "complete"), "two tickets: {run}");
        }
    }
}
