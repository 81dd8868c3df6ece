//! The proxy between real third-party peers: Python `websockets` and node's `ws`, each as
//! client and server.
//!
//! Each test starts its own server, proxy and client processes on 127.0.0.1 port 0 and bounds
//! every wait, killing what it started when it ends. The scripts are in `tests/peers/`
//! (`client.py`/`server.py`, `client.js`/`server.js`); a client runs one named scenario and
//! exits 0 when all of its checks hold. The tests install each peer under the target directory
//! when it is missing (`common/installs.rs`): nothing goes into the user's Python or node.

mod common;

use common::{
    admin, installs, next_line, proxy_exit, read_log, signal, start_proxy, stdout_lines, temp_path, wait_exit, Running,
};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// The peer these tests were validated against; installed by the tests (see `common/installs.rs`).
const WEBSOCKETS: &str = "websockets==17.4";
/// The second, independent peer: node's `ws`, installed into the target directory when missing.
const WS_VERSION: &str = "8.18.3";
const CLIENT_TIMEOUT: Duration = Duration::from_secs(60);

fn peers_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests").join("peers")
}

/// Python with the pinned `websockets`, in a virtual environment under the target directory.
fn python_peer() -> &'static installs::Venv {
    static VENV: std::sync::OnceLock<Result<installs::Venv, String>> = std::sync::OnceLock::new();
    VENV.get_or_init(|| installs::python_venv("proxy-python", &[WEBSOCKETS]))
        .as_ref()
        .unwrap_or_else(|why| panic!("the python module `websockets` could not be installed ({WEBSOCKETS}): {why}"))
}

/// The `node_modules` holding the pinned `ws`, an npm prefix under the target directory.
fn node_peer() -> &'static Path {
    static MODULES: std::sync::OnceLock<Result<PathBuf, String>> = std::sync::OnceLock::new();
    MODULES
        .get_or_init(|| installs::npm_prefix("proxy-node", "ws", WS_VERSION))
        .as_deref()
        .unwrap_or_else(|why| panic!("the node module `ws` could not be installed (ws@{WS_VERSION}): {why}"))
}

/// A third-party WebSocket implementation the tests run on both sides of the proxy.
#[derive(Clone, Copy, Debug)]
enum Peer {
    /// Python `websockets` (`client.py`, `server.py`).
    Python,
    /// Node's `ws` (`client.js`, `server.js`).
    Node,
}

impl Peer {
    /// The command running one of this peer's scripts (`client` or `server`), installed first.
    fn script(self, name: &str) -> Command {
        match self {
            Peer::Python => {
                let mut command = python_peer().command();
                command.arg(peers_dir().join(format!("{name}.py")));
                command
            }
            Peer::Node => {
                let mut command = Command::new("node");
                command.arg(peers_dir().join(format!("{name}.js")));
                command.env("NODE_PATH", node_peer()).env("TMPDIR", installs::temp_dir());
                command
            }
        }
    }
}

/// Starts a peer's server; returns it and its port.
fn start_server_of(peer: Peer) -> (Running, u16) {
    let mut child = peer.script("server").stdout(Stdio::piped()).spawn().expect("start the peer's server");
    let lines = stdout_lines(&mut child);
    let running = Running { child };
    let port = next_line(&lines, "the peer's server").trim().parse().expect("the server prints its port");
    (running, port)
}

fn start_server() -> (Running, u16) {
    start_server_of(Peer::Python)
}

/// Starts one client scenario against `url` with extra arguments, output piped.
fn spawn_client(peer: Peer, url: &str, scenario: &str, extra: &[&str]) -> Child {
    peer.script("client")
        .args([url, scenario])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the peer's client")
}

/// Waits for a client started by [`spawn_client`]; panics with its output unless it passes in time.
fn finish_client(mut child: Child, scenario: &str) -> String {
    let status = wait_exit(&mut child, CLIENT_TIMEOUT);
    if status.is_none() {
        let _ = child.kill();
        let _ = child.wait();
    }
    let mut out = String::new();
    let mut err = String::new();
    child.stdout.take().map(|mut s| s.read_to_string(&mut out));
    child.stderr.take().map(|mut s| s.read_to_string(&mut err));
    match status {
        Some(0) => out,
        Some(code) => panic!("scenario {scenario} failed (exit {code}):\n{out}\n{err}"),
        None => panic!("scenario {scenario} did not finish within {CLIENT_TIMEOUT:?}:\n{out}\n{err}"),
    }
}

/// Runs one Python client scenario against `url`; panics with its output unless it passes in time.
fn run_client(url: &str, scenario: &str) -> String {
    finish_client(spawn_client(Peer::Python, url, scenario, &[]), scenario)
}

/// A peer's server, a proxy with these arguments, and the same peer's client scenario through it.
fn through(peer: Peer, scenario: &str, proxy_args: &[&str]) -> String {
    let (_server, port) = start_server_of(peer);
    let proxy = start_proxy(&format!("ws://127.0.0.1:{port}"), proxy_args);
    finish_client(spawn_client(peer, &format!("ws://{}", proxy.addr), scenario, &[]), scenario)
}

/// Python server, proxy with these arguments, and one Python client scenario through the proxy.
fn through_proxy(scenario: &str, proxy_args: &[&str]) -> String {
    through(Peer::Python, scenario, proxy_args)
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

    for (flag, value, needle) in [
        ("--handshake-timeout-ms", "0", "expected 1 to 600000"),
        ("--max-handshakes", "0", "must be positive"),
        ("--max-handshakes", "many", "invalid value"),
    ] {
        let (code, err) = proxy_exit(&[&up[..], &[flag, value]].concat());
        assert_eq!(code, 2, "{flag} {value}: {err}");
        assert!(err.contains(needle) && !err.contains("panicked"), "{flag} {value}: {err}");
    }

    // A name taken twice in a rules file names the file.
    let rules = temp_path("twice.toml");
    std::fs::write(
        &rules,
        "[[rule]]\nname = \"cut\"\naction = \"drop\"\n[[rule]]\nname = \"cut\"\naction = \"drop\"\n",
    )
    .unwrap();
    let (code, err) = proxy_exit(&[&up[..], &["--rules", rules.to_str().unwrap()]].concat());
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("twice.toml") && err.contains("`cut`"), "{err}");
}

#[test]
fn delayed_frames_are_held_side_by_side_and_keep_order() {
    through_proxy("delays_together", &["--rule", "delay=300 always up text=slow"]);
}

#[test]
fn a_keepalive_survives_a_long_delay() {
    through_proxy("keepalive_during_delay", &["--rule", "delay=5000 once up type=slow"]);
}

#[test]
fn sigterm_closes_both_peers_with_1001_and_writes_the_end_lines() {
    let (_server, port) = start_server();
    let log = temp_path("sigterm.jsonl");
    let mut proxy = start_proxy(&format!("ws://127.0.0.1:{port}"), &["--log", log.to_str().unwrap()]);
    let server_url = format!("ws://127.0.0.1:{port}");
    let mut client = spawn_client(Peer::Python, &format!("ws://{}", proxy.addr), "shutdown", &[&server_url]);
    let lines = stdout_lines(&mut client);
    assert_eq!(next_line(&lines, "client.py"), "ready");
    signal(proxy.pid(), "TERM");
    let code = wait_exit(&mut proxy.running.child, Duration::from_secs(10));
    assert_eq!(code, Some(0), "the proxy did not stop cleanly on SIGTERM: {}", proxy.stderr_text());
    // The client's stdout is taken by the line reader; its exit code tells the outcome.
    let status = wait_exit(&mut client, CLIENT_TIMEOUT);
    let mut err = String::new();
    client.stderr.take().map(|mut s| s.read_to_string(&mut err));
    assert_eq!(status, Some(0), "client.py shutdown: {err}");
    let lines = read_log(&log, "\"event\":\"stop\"");
    let end = lines.iter().find(|l| l["event"] == "end").unwrap_or_else(|| panic!("no end line: {lines:#?}"));
    assert_eq!(end["end"], "shutdown", "{end}");
    assert_eq!(end["code"], 1001, "{end}");
    assert!(lines.last().is_some_and(|l| l["event"] == "stop"), "{lines:#?}");
}

/// The same transparency checks with node's `ws` on both sides: a second, independent
/// implementation of RFC 6455, so a behaviour that only one library tolerates shows up.
mod node {
    use super::{through, Peer};

    #[test]
    fn text_and_binary_pass_unchanged() {
        through(Peer::Node, "text_binary", &[]);
    }

    #[test]
    fn ping_and_pong_are_forwarded() {
        through(Peer::Node, "ping_pong", &[]);
    }

    #[test]
    fn close_codes_and_reasons_pass_both_ways() {
        through(Peer::Node, "client_close", &[]);
        through(Peer::Node, "server_close", &[]);
    }

    #[test]
    fn an_upstream_reset_ends_the_client_abnormally() {
        through(Peer::Node, "upstream_reset", &[]);
    }

    #[test]
    fn large_frames_pass() {
        through(Peer::Node, "large", &[]);
    }

    #[test]
    fn an_oversized_message_is_refused_with_1009() {
        through(Peer::Node, "oversize", &["--max-frame-bytes", "1048576"]);
    }

    #[test]
    fn delayed_frames_are_held_side_by_side_and_keep_order() {
        through(Peer::Node, "delays_together", &["--rule", "delay=300 always up text=slow"]);
    }

    #[test]
    fn a_keepalive_survives_a_long_delay() {
        through(Peer::Node, "keepalive_during_delay", &["--rule", "delay=5000 once up type=slow"]);
    }
}
