//! The proxy between real third-party peers: a Python `websockets` client and server.
//!
//! Each test starts its own server, proxy and client processes on 127.0.0.1 port 0 and bounds
//! every wait, killing what it started when it ends. The Python scripts are in `tests/peers/`;
//! the client runs one named scenario and exits 0 when all of its checks hold.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// The peer these tests were validated against; installed by the tests when it is missing.
const WEBSOCKETS: &str = "websockets==17.4";
const STARTUP_TIMEOUT: Duration = Duration::from_secs(15);
const CLIENT_TIMEOUT: Duration = Duration::from_secs(60);

fn peers_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests").join("peers")
}

fn websockets_version() -> Result<String, String> {
    let output = Command::new("python3")
        .args(["-c", "import websockets; print(websockets.__version__)"])
        .output()
        .map_err(|e| format!("cannot run python3 ({e}); these tests need python3"))?;
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).trim().to_string())
    } else {
        Err(String::from_utf8_lossy(&output.stderr).into_owned())
    }
}

/// Makes sure the real peer is there: installs it with pip when it is missing (once per test
/// process, however many tests ask), and fails, never skips, when that is not possible.
fn require_websockets() {
    static INSTALLED: std::sync::OnceLock<Result<String, String>> = std::sync::OnceLock::new();
    let outcome = INSTALLED.get_or_init(|| {
        if let Ok(version) = websockets_version() {
            return Ok(version);
        }
        let install = Command::new("python3")
            .args(["-m", "pip", "install", "--quiet", "--disable-pip-version-check", WEBSOCKETS])
            .output()
            .map_err(|e| format!("cannot run pip ({e})"))?;
        if !install.status.success() {
            return Err(format!("`pip install {WEBSOCKETS}` failed:\n{}", String::from_utf8_lossy(&install.stderr)));
        }
        websockets_version()
    });
    if let Err(why) = outcome {
        panic!("the python module `websockets` is missing and could not be installed ({WEBSOCKETS}): {why}");
    }
}

/// A child process killed when the test ends, however it ends.
struct Running {
    child: Child,
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Reads a child's stdout lines on a thread, so waiting for one can time out.
fn stdout_lines(child: &mut Child) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    let stdout = child.stdout.take().expect("stdout is piped");
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

fn next_line(lines: &mpsc::Receiver<String>, what: &str) -> String {
    lines.recv_timeout(STARTUP_TIMEOUT).unwrap_or_else(|_| panic!("{what} printed nothing within {STARTUP_TIMEOUT:?}"))
}

/// Starts the Python server; returns it and its port.
fn start_server() -> (Running, u16) {
    require_websockets();
    let mut child = Command::new("python3")
        .arg(peers_dir().join("server.py"))
        .stdout(Stdio::piped())
        .spawn()
        .expect("start python3 server.py");
    let lines = stdout_lines(&mut child);
    let running = Running { child };
    let port = next_line(&lines, "server.py").trim().parse().expect("server.py prints its port");
    (running, port)
}

/// A started proxy: its address, admin address and log path.
struct ProxyProcess {
    _running: Running,
    addr: String,
    admin: Option<String>,
}

fn start_proxy(upstream: &str, extra: &[&str]) -> ProxyProcess {
    let mut child = Command::new(env!("CARGO_BIN_EXE_proxy"))
        .args(["--listen", "127.0.0.1:0", "--upstream", upstream])
        .args(extra)
        .stdout(Stdio::piped())
        .spawn()
        .expect("start the proxy binary");
    let lines = stdout_lines(&mut child);
    let running = Running { child };
    let first = next_line(&lines, "proxy");
    let addr = first
        .strip_prefix("proxy listening on ")
        .unwrap_or_else(|| panic!("unexpected first line {first:?}"))
        .to_string();
    let admin = extra.contains(&"--admin").then(|| {
        let line = next_line(&lines, "proxy");
        line.strip_prefix("admin listening on ").unwrap_or_else(|| panic!("unexpected admin line {line:?}")).to_string()
    });
    ProxyProcess { _running: running, addr, admin }
}

/// Runs one client scenario against `url`; panics with its output unless it passes in time.
fn run_client(url: &str, scenario: &str) -> String {
    let mut child = Command::new("python3")
        .arg(peers_dir().join("client.py"))
        .args([url, scenario])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start python3 client.py");
    let deadline = Instant::now() + CLIENT_TIMEOUT;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for client.py") {
            break Some(status);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut out = String::new();
    let mut err = String::new();
    child.stdout.take().map(|mut s| s.read_to_string(&mut out));
    child.stderr.take().map(|mut s| s.read_to_string(&mut err));
    match status {
        Some(status) if status.success() => out,
        Some(status) => panic!("scenario {scenario} failed ({status}):\n{out}\n{err}"),
        None => {
            panic!("scenario {scenario} did not finish within {CLIENT_TIMEOUT:?}:\n{out}\n{err}")
        }
    }
}

/// Server, proxy with these arguments, and one client scenario through the proxy.
fn through_proxy(scenario: &str, proxy_args: &[&str]) -> String {
    let (_server, port) = start_server();
    let proxy = start_proxy(&format!("ws://127.0.0.1:{port}"), proxy_args);
    run_client(&format!("ws://{}", proxy.addr), scenario)
}

fn temp_path(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("proxy-tests-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("create a temp dir");
    dir.join(name)
}

/// Lines of the JSONL log, once it holds `lines_with` (the log is flushed at each connection end).
fn read_log(path: &Path, lines_with: &str) -> Vec<serde_json::Value> {
    let deadline = Instant::now() + STARTUP_TIMEOUT;
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        if text.contains(lines_with) || Instant::now() > deadline {
            return text
                .lines()
                .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("log line {l:?}: {e}")))
                .collect();
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn text_and_binary_pass_unchanged() {
    through_proxy("text_binary", &[]);
}

#[test]
fn non_json_text_never_breaks_the_matcher() {
    through_proxy("non_json", &["--rule", "drop always type=x", "--rule", "delay=1 always text result.id=1"]);
}

#[test]
fn ping_and_pong_are_forwarded() {
    let log = temp_path("ping.jsonl");
    through_proxy("ping_pong", &["--log", log.to_str().unwrap()]);
    let lines = read_log(&log, "\"event\":\"end\"");
    let saw = |direction: &str, kind: &str| {
        lines
            .iter()
            .any(|l| l["event"] == "frame" && l["direction"] == direction && l["kind"] == kind && l["size"] == 11)
    };
    // The client's ping reached the server and the server's pong came back, and the other way round.
    assert!(saw("up", "ping") && saw("down", "pong"), "{lines:#?}");
    assert!(saw("down", "ping") && saw("up", "pong"), "{lines:#?}");
}

#[test]
fn fragmented_messages_arrive_whole() {
    through_proxy("fragmented", &[]);
}

#[test]
fn client_close_code_and_reason_reach_the_server() {
    through_proxy("client_close", &[]);
}

#[test]
fn server_close_code_and_reason_reach_the_client() {
    through_proxy("server_close", &[]);
}

#[test]
fn an_upstream_reset_ends_the_client_abnormally() {
    through_proxy("upstream_reset", &[]);
}

#[test]
fn large_frames_pass() {
    through_proxy("large", &[]);
}

#[test]
fn an_oversized_message_is_refused_with_1009() {
    through_proxy("oversize", &["--max-frame-bytes", "1048576"]);
}

#[test]
fn path_query_subprotocol_and_headers_reach_the_upstream() {
    through_proxy("handshake_passthrough", &[]);
}

#[test]
fn an_unreachable_upstream_gives_the_client_a_502_and_a_log_line() {
    // A port that was free a moment ago: nothing listens there.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let log = temp_path("unreachable.jsonl");
    let proxy = start_proxy(&format!("ws://127.0.0.1:{port}"), &["--log", log.to_str().unwrap()]);
    run_client(&format!("ws://{}", proxy.addr), "unreachable");
    let lines = read_log(&log, "upstream_error");
    assert!(
        lines
            .iter()
            .any(|l| l["event"] == "upstream_error" && l["error"].as_str().unwrap_or("").contains("unreachable")),
        "{lines:#?}"
    );
}

#[test]
fn drops_exactly_the_one_invocationresult_going_up() {
    let log = temp_path("drop-up.jsonl");
    through_proxy(
        "drop_one_up",
        &[
            "--rule",
            "drop once up type=invocationresult function_id=harness::turn result.session_id=s1",
            "--log",
            log.to_str().unwrap(),
        ],
    );
    let lines = read_log(&log, "\"event\":\"end\"");
    let dropped: Vec<_> = lines.iter().filter(|l| l["action"] == "drop").collect();
    assert_eq!(dropped.len(), 1, "{dropped:#?}");
    assert_eq!(dropped[0]["rule"], 0);
    assert_eq!(dropped[0]["rule_name"], "rule-1");
    assert_eq!(dropped[0]["direction"], "up");
    assert!(dropped[0].get("payload").is_none(), "payloads are logged only with --log-payloads");
}

#[test]
fn drops_exactly_the_one_invocationresult_coming_down_from_a_rules_file() {
    let rules = temp_path("drop-down.toml");
    std::fs::write(
        &rules,
        r#"
[[rule]]
action = "drop"
count = "once"
direction = "down"
match = { type = "invocationresult", function_id = "harness::turn", "result.session_id" = "s1" }
"#,
    )
    .unwrap();
    let log = temp_path("drop-down.jsonl");
    through_proxy(
        "drop_one_down",
        &["--rules", rules.to_str().unwrap(), "--log", log.to_str().unwrap(), "--log-payloads"],
    );
    let lines = read_log(&log, "\"event\":\"end\"");
    let dropped: Vec<_> = lines.iter().filter(|l| l["action"] == "drop").collect();
    assert_eq!(dropped.len(), 1, "{dropped:#?}");
    let payload: serde_json::Value = serde_json::from_str(dropped[0]["payload"].as_str().unwrap()).unwrap();
    assert_eq!(payload["id"], 17);
}

#[test]
fn duplicates_and_delays_keep_order() {
    through_proxy(
        "duplicate_and_delay",
        &["--rule", "duplicate once up text=dup", "--rule", "delay=300 once up text=slow"],
    );
}

#[test]
fn a_close_rule_closes_both_peers_with_its_code() {
    through_proxy("rule_close", &["--rule", "close=4100:cut_by_rule once up type=cut"]);
}

/// One HTTP/1.1 request to the admin endpoint; returns status and body.
fn admin(addr: &str, method: &str, path: &str, body: &str) -> (u16, String) {
    let mut stream = TcpStream::connect(addr).expect("connect to the admin endpoint");
    stream.set_read_timeout(Some(STARTUP_TIMEOUT)).unwrap();
    write!(stream, "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: {}\r\n\r\n{body}", body.len()).unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).expect("read the admin response");
    let status =
        response.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or_else(|| panic!("bad response {response:?}"));
    let body = response.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
    (status, body)
}

#[test]
fn the_admin_api_adds_lists_and_removes_rules() {
    let (_server, port) = start_server();
    let proxy = start_proxy(
        &format!("ws://127.0.0.1:{port}"),
        &["--admin", "127.0.0.1:0", "--name", "bus", "--rule", "delay=1 always binary"],
    );
    let admin_addr = proxy.admin.clone().unwrap();
    let url = format!("ws://{}", proxy.addr);

    let (status, body) = admin(&admin_addr, "GET", "/proxies/bus/toxics", "");
    assert_eq!(status, 200, "{body}");
    let listed: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(listed[0]["name"], "rule-1");

    let (status, body) = admin(
        &admin_addr,
        "POST",
        "/proxies/bus/toxics",
        r#"{"name": "cut", "action": "drop", "direction": "up", "match": {"type": "admin"}}"#,
    );
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"remaining\":1"), "{body}");
    run_client(&url, "admin_drop");
    // Used up: the same frame now passes.
    run_client(&url, "passes_all");

    let (status, body) = admin(&admin_addr, "POST", "/proxies/bus/toxics", "drop always up type=admin");
    assert_eq!(status, 200, "{body}");
    let (status, _) = admin(&admin_addr, "DELETE", "/proxies/bus/toxics/cut", "");
    assert_eq!(status, 204);
    let (status, _) = admin(&admin_addr, "DELETE", "/proxies/bus/toxics/cut", "");
    assert_eq!(status, 404);
    let (status, body) = admin(&admin_addr, "POST", "/proxies/bus/toxics", r#"{"action": "drop", "cuont": 1}"#);
    assert_eq!(status, 400);
    assert!(body.contains("cuont"), "{body}");
    let (status, body) = admin(&admin_addr, "GET", "/proxies/other/toxics", "");
    assert_eq!(status, 404, "{body}");

    let (status, _) = admin(&admin_addr, "POST", "/reset", "");
    assert_eq!(status, 204);
    let (_, body) = admin(&admin_addr, "GET", "/proxies/bus/toxics", "");
    assert_eq!(body.trim(), "[]");
    run_client(&url, "passes_all");
}

/// The proxy binary's exit code and stderr for these arguments (it must exit by itself).
fn proxy_exit(args: &[&str]) -> (i32, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_proxy"))
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run the proxy binary");
    (output.status.code().unwrap_or(-1), String::from_utf8_lossy(&output.stderr).into_owned())
}

#[test]
fn bad_input_exits_2_with_a_clear_error() {
    let up = ["--upstream", "ws://127.0.0.1:9"];
    let (code, err) = proxy_exit(&[&up[..], &["--rule", "drop sideways"]].concat());
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("rule `drop sideways`") && err.contains("unexpected word `sideways`"), "{err}");

    let rules = temp_path("bad.toml");
    std::fs::write(&rules, "[[rule]]\naction = \"drop\"\ncount = \"twice\"\n").unwrap();
    let (code, err) = proxy_exit(&[&up[..], &["--rules", rules.to_str().unwrap()]].concat());
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("bad.toml") && err.contains("line 3"), "{err}");

    let (code, err) = proxy_exit(&["--upstream", "http://x"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("ws://HOST:PORT"), "{err}");

    let (code, err) = proxy_exit(&[&up[..], &["--admin", "0.0.0.0:0"]].concat());
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("loopback"), "{err}");

    let (code, err) = proxy_exit(&["--listen", "nonsense", "--upstream", "ws://127.0.0.1:9"]);
    assert_eq!(code, 2, "{err}");
}
