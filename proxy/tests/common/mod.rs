//! What the proxy's process-level tests share: starting the proxy binary, reading its log,
//! talking to its admin endpoint, and killing whatever a test started when it ends.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

pub mod installs;

pub const STARTUP_TIMEOUT: Duration = Duration::from_secs(15);

/// A child process killed when the test ends, however it ends.
pub struct Running {
    pub child: Child,
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Reads a child's stdout lines on a thread, so waiting for one can time out.
pub fn stdout_lines(child: &mut Child) -> mpsc::Receiver<String> {
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

pub fn next_line(lines: &mpsc::Receiver<String>, what: &str) -> String {
    lines.recv_timeout(STARTUP_TIMEOUT).unwrap_or_else(|_| panic!("{what} printed nothing within {STARTUP_TIMEOUT:?}"))
}

/// A started proxy: the process, its address and its admin address.
pub struct ProxyProcess {
    pub running: Running,
    pub addr: String,
    pub admin: Option<String>,
    /// Where its stderr goes (a file, so a chatty proxy never blocks on a full pipe).
    pub stderr: PathBuf,
}

impl ProxyProcess {
    pub fn pid(&self) -> u32 {
        self.running.child.id()
    }

    pub fn stderr_text(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }
}

/// Starts the proxy binary through `sh -c` so a test can set limits first (`ulimit -n N; `).
pub fn start_proxy_with(shell_prefix: &str, upstream: &str, extra: &[&str]) -> ProxyProcess {
    let mut command = if shell_prefix.is_empty() {
        Command::new(env!("CARGO_BIN_EXE_proxy"))
    } else {
        let mut command = Command::new("sh");
        command.args(["-c", &format!("{shell_prefix} exec \"$0\" \"$@\""), env!("CARGO_BIN_EXE_proxy")]);
        command
    };
    static STARTED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let stderr = temp_path(&format!("proxy-{}.stderr", STARTED.fetch_add(1, std::sync::atomic::Ordering::Relaxed)));
    let mut child = command
        .args(["--listen", "127.0.0.1:0", "--upstream", upstream])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&stderr).expect("create the stderr file"))
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
    ProxyProcess { running, addr, admin, stderr }
}

pub fn start_proxy(upstream: &str, extra: &[&str]) -> ProxyProcess {
    start_proxy_with("", upstream, extra)
}

/// A scratch file of this test process, under the target directory.
pub fn temp_path(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("proxy-tests-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("create a temp dir");
    dir.join(name)
}

/// Lines of the JSONL log, once it holds `lines_with` (the log is flushed at each connection end).
pub fn read_log(path: &Path, lines_with: &str) -> Vec<serde_json::Value> {
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

/// One raw HTTP/1.1 request (head lines given whole); returns status and the whole response.
pub fn http(addr: &str, head: &str, body: &str) -> (u16, String) {
    let mut stream = TcpStream::connect(addr).expect("connect");
    stream.set_read_timeout(Some(STARTUP_TIMEOUT)).unwrap();
    write!(stream, "{head}Content-Length: {}\r\n\r\n{body}", body.len()).unwrap();
    let mut response = Vec::new();
    let _ = stream.read_to_end(&mut response);
    let response = String::from_utf8_lossy(&response).into_owned();
    let status =
        response.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or_else(|| panic!("bad response {response:?}"));
    (status, response)
}

/// One request to the admin endpoint as a script (curl) sends it; returns status and body.
pub fn admin(addr: &str, method: &str, path: &str, body: &str) -> (u16, String) {
    let (status, response) = http(addr, &format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\n"), body);
    let body = response.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
    (status, body)
}

/// The proxy binary's exit code and stderr for these arguments (it must exit by itself).
pub fn proxy_exit(args: &[&str]) -> (i32, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_proxy"))
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run the proxy binary");
    (output.status.code().unwrap_or(-1), String::from_utf8_lossy(&output.stderr).into_owned())
}

/// Waits for a child to exit by itself, at most `within`; its exit code, or `None` if it did not.
pub fn wait_exit(child: &mut Child, within: Duration) -> Option<i32> {
    let deadline = Instant::now() + within;
    loop {
        if let Some(status) = child.try_wait().expect("wait for a child") {
            return Some(status.code().unwrap_or(-1));
        }
        if Instant::now() > deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Sends a signal by name (`TERM`, ...) to a process.
pub fn signal(pid: u32, name: &str) {
    let status = Command::new("kill").args([&format!("-{name}"), &pid.to_string()]).status().expect("run kill");
    assert!(status.success(), "kill -{name} {pid} failed");
}
