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
use std::sync::mpsc;
use std::time::{Duration, Instant};

#[path = "../../proxy/tests/common/installs.rs"]
mod installs;

/// The SDK and the WebSocket library the Python worker was validated against.
const PYTHON_PACKAGES: [&str; 2] = ["iii-sdk==0.25.0", "websockets==17.4"];
/// The most one `rig live` command may take: its runs wait out liveness bounds in real time.
const LIVE_RUN_MAX: Duration = Duration::from_secs(600);
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
    let mut child = Command::new(env!("CARGO_BIN_EXE_rig"))
        .current_dir(workspace())
        .arg("live")
        .args(paths)
        .args(["--listen", "127.0.0.1:0", "--json"])
        .args(extra)
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
    fn finish(mut self) -> (Option<i32>, Vec<Verdict>) {
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
        let mut verdicts: Vec<Verdict> = self
            .stdout
            .iter()
            .map(|line| {
                let run: serde_json::Value = serde_json::from_str(&line).expect("one JSON object per line");
                assert!(run["live"]["replay"].as_str().is_some_and(|r| r.contains("cannot be replayed")), "{run}");
                let text = |field: &str| run[field].as_str().unwrap_or_default().to_string();
                let oracles = run["violations"].as_array().into_iter().flatten();
                Verdict {
                    scenario: text("scenario"),
                    policy: text("policy"),
                    passed: run["passed"].as_bool().unwrap_or(false),
                    oracles: oracles.map(|o| o.as_str().unwrap_or_default().to_string()).collect(),
                }
            })
            .collect();
        verdicts.sort();
        (status.code(), verdicts)
    }
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
    let (code, verdicts) = live.finish();
    drop(worker);
    assert!(matches!(code, Some(0 | 1)), "rig live against {what} exited {code:?}: {verdicts:#?}");
    verdicts
}

/// `rig harness` connected to `url`, as `policy`.
fn rig_harness(url: &str, policy: &str) -> Running {
    let child = Command::new(env!("CARGO_BIN_EXE_rig"))
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

/// The Python worker connected to `url`; `--swallow` for the variant with incident 001's bug.
fn python_worker(url: &str, swallow: bool) -> Running {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests").join("live").join("harness_worker.py");
    let mut command = sdk().command();
    command.arg(script).args(["--url", url]);
    if swallow {
        command.arg("--swallow");
    }
    // The SDK leaves a marker file under ~/.iii when it is killed: keep it in the target dir.
    let home = Path::new(env!("CARGO_TARGET_TMPDIR")).join("live-python-home");
    std::fs::create_dir_all(&home).expect("a home for the worker");
    let child = command.env("HOME", home).stdout(Stdio::null()).stderr(Stdio::null()).spawn().expect("start python");
    Running { child, what: format!("the Python worker{}", if swallow { " (swallowing)" } else { "" }) }
}

fn assert_same(live: Vec<Verdict>, simulated: Vec<Verdict>, against: &str) {
    assert_eq!(live, simulated, "live verdicts against {against} (left) differ from the simulated ones (right)");
}

/// The reference harness as a process gives the simulated verdicts on the suite, under the
/// correct policy and both of incident 001's known-bad ones. A run whose turn never ends waits
/// out its whole liveness bound, so each of those gets a `rig live` of its own, side by side.
#[test]
fn the_reference_harness_as_a_process_gives_the_simulated_verdicts() {
    let mut groups: Vec<(&str, Vec<String>)> = Vec::new();
    for policy in ["reference", "swallow", "propagate"] {
        let (slow, quick): (Vec<Verdict>, Vec<Verdict>) =
            simulated(policy).into_iter().partition(|v| v.oracles.contains(&"liveness".to_string()));
        groups.push((policy, quick.into_iter().map(|v| v.scenario).collect()));
        groups.extend(slow.into_iter().map(|v| (policy, vec![v.scenario])));
    }
    let live: Vec<(&str, Vec<Verdict>)> = std::thread::scope(|scope| {
        let checks: Vec<_> = groups
            .iter()
            .map(|(policy, files)| {
                scope.spawn(move || {
                    let paths: Vec<&str> = files.iter().map(String::as_str).collect();
                    let mut extra = vec!["--policy", *policy];
                    if *policy != "reference" {
                        extra.extend(["--time-scale", TIME_SCALE]);
                    }
                    (*policy, live_against(&paths, &extra, |url| rig_harness(url, policy)))
                })
            })
            .collect();
        checks.into_iter().map(|check| check.join().expect("a check")).collect()
    });
    for policy in ["reference", "swallow", "propagate"] {
        let mut verdicts: Vec<Verdict> =
            live.iter().filter(|(p, _)| *p == policy).flat_map(|(_, verdicts)| verdicts.clone()).collect();
        verdicts.sort();
        assert_same(verdicts, simulated(policy), &format!("rig harness --policy {policy}"));
    }
}

/// A harness in another language, on the real iii SDK: it passes the suite with the simulated
/// verdicts; its swallowing variant gives the known-bad policy's simulated verdicts, and is
/// caught by `liveness` when judged as a correct harness. (The swallowing variant runs on the
/// cases that exercise its bug, not the whole suite: each of them waits out a liveness bound.)
#[test]
fn a_python_harness_on_the_real_iii_sdk_gives_the_simulated_verdicts() {
    sdk();
    const BUGGY: [&str; 2] =
        ["scenarios/incident-001/finalization/lost-ack.toml", "scenarios/incident-001/finalization/read-timeout.toml"];
    std::thread::scope(|scope| {
        let correct = scope.spawn(|| {
            let live = live_against(&SUITE, &["--policy", "reference"], |url| python_worker(url, false));
            assert!(live.iter().all(|v| v.passed), "{live:#?}");
            assert_same(live, simulated("reference"), "the Python worker");
        });
        let swallowing = scope.spawn(|| {
            let scaled = ["--policy", "swallow", "--time-scale", TIME_SCALE];
            let live = live_against(&BUGGY, &scaled, |url| python_worker(url, true));
            let expected: Vec<Verdict> =
                simulated("swallow").into_iter().filter(|v| BUGGY.contains(&v.scenario.as_str())).collect();
            assert_same(live, expected, "the swallowing Python worker");
        });
        let caught = scope.spawn(|| {
            let file = ["scenarios/incident-001/finalization/write-rejected.toml"];
            let scaled = ["--policy", "reference", "--time-scale", TIME_SCALE];
            let live = live_against(&file, &scaled, |url| python_worker(url, true));
            assert_eq!(live.len(), 1, "{live:#?}");
            assert!(!live[0].passed && live[0].oracles.contains(&"liveness".to_string()), "{live:#?}");
        });
        for check in [correct, swallowing, caught] {
            check.join().expect("a check");
        }
    });
}

/// Without a worker, a live run waits a bounded time and says what is missing and where to
/// connect; a scenario that needs the simulation is refused, naming the step.
#[test]
fn a_missing_worker_and_a_simulation_only_step_are_reported_clearly() {
    let rig_live = |args: &[&str]| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_rig"));
        command.current_dir(workspace()).arg("live").args(args).args(["--listen", "127.0.0.1:0"]);
        // Bounded by --connect-timeout-ms; a refusal comes before anything runs.
        command.output().expect("rig live runs")
    };
    let alone = rig_live(&["scenarios/smoke/healthy-turn.toml", "--connect-timeout-ms", "1000"]);
    assert_eq!(alone.status.code(), Some(1));
    let stdout = String::from_utf8_lossy(&alone.stdout);
    assert!(stdout.contains("no worker registered harness::turn within 1000 ms"), "{stdout}");
    assert!(stdout.contains("no worker connected as `harness`") && stdout.contains("ws://127.0.0.1:"), "{stdout}");
    let refused = rig_live(&["scenarios/harness-switch/stale-worker.toml"]);
    assert_eq!(refused.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("cannot be run live") && stderr.contains("[[interrupt]] #1"), "{stderr}");
}

/// Cuts that crash a host crash it live too: the rig's own store and engine lose their software
/// and start afresh, and the harness process has its connections dropped (`rig harness` then
/// starts afresh, as after a crash). The verdicts are the simulated ones.
#[test]
fn cuts_that_crash_a_host_crash_it_live() {
    let files = [
        "scenarios/regressions/child-turn-store-crash.toml",
        "scenarios/regressions/successor-enqueued-across-an-engine-restart.toml",
        "scenarios/regressions/owed-terminal-state-not-recorded.toml",
    ];
    let trace = Path::new(env!("CARGO_TARGET_TMPDIR")).join("live-crash-cuts.jsonl");
    let live = live_against(&files, &["--trace", trace.to_str().unwrap()], |url| rig_harness(url, "reference"));
    let mut simulated: Vec<Verdict> = files
        .iter()
        .map(|file| {
            let scenario = rig::Scenario::load(&workspace().join(file)).expect("a valid scenario");
            let outcome = rig::run(&scenario, scenario.run_of("reference").expect("reference"), 0);
            let fired = outcome.violations.iter().map(|v| v.oracle.name().to_string()).collect::<BTreeSet<_>>();
            Verdict {
                scenario: file.to_string(),
                policy: "reference".into(),
                passed: outcome.passed,
                oracles: fired.into_iter().collect(),
            }
        })
        .collect();
    simulated.sort();
    assert_same(live, simulated, "rig harness --policy reference");
    let trace = std::fs::read_to_string(&trace).expect("the trace was written");
    for host in ["store", "engine", "harness"] {
        let restarted = format!("\"action\":\"crash and restart\",\"target\":\"{host}\"");
        assert!(trace.contains(&restarted), "no crash of `{host}` in the live trace");
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
