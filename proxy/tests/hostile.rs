//! The proxy binary against peers that misbehave, written byte by byte on raw sockets: clients
//! that never finish a handshake, browsers reaching the admin endpoint, upstreams that never
//! answer or answer garbage, close frames with codes no peer may send, and a process out of
//! file descriptors.
//!
//! The far end is a fake upstream on a thread: it answers each handshake the way a test asks
//! and reports what it read.

mod common;

use common::{admin, http, read_log, start_proxy, start_proxy_with, temp_path, wait_exit, STARTUP_TIMEOUT};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::mpsc;
use std::time::{Duration, Instant};
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;

/// How the fake upstream answers each opening request.
#[derive(Clone)]
enum Answer {
    /// Accepts the TCP connection and never writes a byte.
    Silent,
    /// Writes this text and closes.
    Garbage(&'static str),
    /// Answers `101` with these extra header lines, then reports each frame it reads.
    Upgrade(&'static str),
    /// Answers with this whole response head (status line and headers, no blank line).
    Refuse(&'static str),
}

/// What the fake upstream saw: each request head, and each frame as (opcode, payload).
enum Seen {
    Request(String),
    Frame(u8, Vec<u8>),
}

/// Reads an HTTP head through the blank line.
fn read_head(stream: &mut TcpStream) -> String {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match stream.read(&mut byte) {
            Ok(1) => head.push(byte[0]),
            _ => break,
        }
    }
    String::from_utf8_lossy(&head).into_owned()
}

fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines().find_map(|line| {
        let (key, value) = line.split_once(':')?;
        key.trim().eq_ignore_ascii_case(name).then(|| value.trim())
    })
}

/// Reads one WebSocket frame (unmasking it if masked): opcode and payload.
fn read_frame(stream: &mut TcpStream) -> Option<(u8, Vec<u8>)> {
    let mut head = [0u8; 2];
    stream.read_exact(&mut head).ok()?;
    let mut len = u64::from(head[1] & 0x7f);
    if len == 126 {
        let mut ext = [0u8; 2];
        stream.read_exact(&mut ext).ok()?;
        len = u64::from(u16::from_be_bytes(ext));
    } else if len == 127 {
        let mut ext = [0u8; 8];
        stream.read_exact(&mut ext).ok()?;
        len = u64::from_be_bytes(ext);
    }
    let mut mask = [0u8; 4];
    if head[1] & 0x80 != 0 {
        stream.read_exact(&mut mask).ok()?;
    }
    let mut payload = vec![0u8; len as usize];
    stream.read_exact(&mut payload).ok()?;
    for (i, byte) in payload.iter_mut().enumerate() {
        *byte ^= mask[i % 4];
    }
    Some((head[0] & 0x0f, payload))
}

/// A masked frame as a client sends it.
fn client_frame(opcode: u8, payload: &[u8]) -> Vec<u8> {
    assert!(payload.len() < 126);
    let mask = [1u8, 2, 3, 4];
    let mut frame = vec![0x80 | opcode, 0x80 | payload.len() as u8];
    frame.extend_from_slice(&mask);
    frame.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
    frame
}

/// Starts a fake upstream answering every connection with `answer`; returns its port and what it sees.
fn fake_upstream(answer: Answer) -> (u16, mpsc::Receiver<Seen>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind the fake upstream");
    let port = listener.local_addr().unwrap().port();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        // Connections are kept until the test process ends, so a silent one stays silent.
        let mut kept = Vec::new();
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let (tx, answer) = (tx.clone(), answer.clone());
            if let Answer::Silent = answer {
                kept.push(stream);
                continue;
            }
            std::thread::spawn(move || {
                let head = read_head(&mut stream);
                let _ = tx.send(Seen::Request(head.clone()));
                match answer {
                    Answer::Silent => {}
                    Answer::Garbage(text) => {
                        let _ = stream.write_all(text.as_bytes());
                    }
                    Answer::Refuse(response) => {
                        let _ = write!(stream, "{response}\r\nContent-Length: 0\r\n\r\n");
                        std::thread::sleep(Duration::from_secs(1));
                    }
                    Answer::Upgrade(extra) => {
                        let key = header(&head, "sec-websocket-key").unwrap_or("");
                        let _ = write!(
                            stream,
                            "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
                             Sec-WebSocket-Accept: {}\r\n{extra}\r\n",
                            derive_accept_key(key.as_bytes())
                        );
                        while let Some((opcode, payload)) = read_frame(&mut stream) {
                            let _ = tx.send(Seen::Frame(opcode, payload));
                        }
                    }
                }
            });
        }
    });
    (port, rx)
}

fn upgrade_request(target: &str, host: &str) -> String {
    format!(
        "GET {target} HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
    )
}

/// Opens a WebSocket through the proxy by hand; returns the socket and the response head.
fn raw_client(addr: &str, target: &str) -> (TcpStream, String) {
    let mut stream = TcpStream::connect(addr).expect("connect to the proxy");
    stream.set_read_timeout(Some(STARTUP_TIMEOUT)).unwrap();
    stream.write_all(upgrade_request(target, addr).as_bytes()).unwrap();
    let head = read_head(&mut stream);
    (stream, head)
}

fn status_of(head: &str) -> u16 {
    head.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or_else(|| panic!("no HTTP status in {head:?}"))
}

fn next_request(seen: &mpsc::Receiver<Seen>) -> String {
    loop {
        match seen.recv_timeout(STARTUP_TIMEOUT).expect("the upstream saw a request") {
            Seen::Request(head) => return head,
            Seen::Frame(..) => {}
        }
    }
}

#[test]
fn clients_that_never_send_a_request_do_not_take_the_websocket_slots() {
    let (port, _seen) = fake_upstream(Answer::Upgrade(""));
    let proxy = start_proxy(&format!("ws://127.0.0.1:{port}"), &["--max-connections", "4"]);
    // Ten sockets that connect and say nothing: more than there are WebSocket slots.
    let idle: Vec<TcpStream> = (0..10).map(|_| TcpStream::connect(&proxy.addr).unwrap()).collect();
    std::thread::sleep(Duration::from_millis(200));
    let (_ws, head) = raw_client(&proxy.addr, "/real");
    assert_eq!(status_of(&head), 101, "a real client was turned away: {head}");
    drop(idle);
}

#[test]
fn pending_handshakes_have_their_own_budget_and_a_deadline() {
    let (port, _seen) = fake_upstream(Answer::Upgrade(""));
    let proxy = start_proxy(
        &format!("ws://127.0.0.1:{port}"),
        &["--max-connections", "4", "--max-handshakes", "2", "--handshake-timeout-ms", "500"],
    );
    let mut idle: Vec<TcpStream> = (0..6).map(|_| TcpStream::connect(&proxy.addr).unwrap()).collect();
    // The silent sockets are let go at their deadline, so a real client queued behind them
    // gets its WebSocket.
    let (_ws, head) = raw_client(&proxy.addr, "/real");
    assert_eq!(status_of(&head), 101, "{head}");
    for socket in &mut idle {
        socket.set_read_timeout(Some(STARTUP_TIMEOUT)).unwrap();
        let mut rest = Vec::new();
        // Whatever the proxy says (a 408 or nothing), it ends the connection.
        let _ = socket.read_to_end(&mut rest);
    }
}

#[test]
fn the_admin_api_refuses_requests_a_browser_could_send() {
    let (port, _seen) = fake_upstream(Answer::Silent);
    let proxy = start_proxy(&format!("ws://127.0.0.1:{port}"), &["--admin", "127.0.0.1:0"]);
    let addr = proxy.admin.clone().unwrap();
    let admin_port = addr.rsplit_once(':').unwrap().1;
    let rule = "drop always";
    let post = "POST /proxies/default/toxics HTTP/1.1\r\n";
    for (what, head) in [
        ("a foreign Host (DNS rebinding)", format!("{post}Host: evil.example:{admin_port}\r\n")),
        ("no Host", post.to_string()),
        ("an Origin", format!("{post}Host: {addr}\r\nOrigin: http://evil.example\r\nContent-Type: text/plain\r\n")),
        (
            "a browser's user agent",
            format!("{post}Host: {addr}\r\nUser-Agent: Mozilla/5.0 (X11; Linux x86_64) Firefox/140.0\r\n"),
        ),
    ] {
        let (status, response) = http(&addr, &head, rule);
        assert_eq!(status, 403, "{what}: {response}");
    }
    let (_, body) = admin(&addr, "GET", "/proxies/default/toxics", "");
    assert_eq!(body.trim(), "[]", "a refused request added a rule");
    // What curl sends to `localhost:PORT` is fine.
    let (status, response) =
        http(&addr, &format!("{post}Host: localhost:{admin_port}\r\nUser-Agent: curl/8.5.0\r\n"), rule);
    assert_eq!(status, 200, "{response}");
}

/// The client gets a 502, and the log blames the upstream, not the client.
fn upstream_fails(answer: Answer, log_name: &str) {
    let (port, _seen) = fake_upstream(answer);
    let log = temp_path(log_name);
    let proxy = start_proxy(&format!("ws://127.0.0.1:{port}"), &["--log", log.to_str().unwrap()]);
    let (_socket, head) = raw_client(&proxy.addr, "/");
    assert_eq!(status_of(&head), 502, "{head}");
    let lines = read_log(&log, "upstream_error");
    assert!(lines.iter().any(|l| l["event"] == "upstream_error"), "{lines:#?}");
    assert!(!lines.iter().any(|l| l["event"] == "handshake_error"), "{lines:#?}");
}

#[test]
fn an_upstream_that_never_answers_gives_a_502_and_an_upstream_error() {
    upstream_fails(Answer::Silent, "silent-upstream.jsonl");
}

#[test]
fn an_upstream_that_answers_garbage_is_an_upstream_error() {
    upstream_fails(Answer::Garbage("garbage\n"), "garbage-upstream.jsonl");
}

#[test]
fn the_upstream_s_handshake_headers_reach_the_client() {
    let (port, _seen) = fake_upstream(Answer::Upgrade("Set-Cookie: session=abc; HttpOnly\r\n"));
    let proxy = start_proxy(&format!("ws://127.0.0.1:{port}"), &[]);
    let (_socket, head) = raw_client(&proxy.addr, "/");
    assert_eq!(status_of(&head), 101, "{head}");
    assert_eq!(header(&head, "set-cookie"), Some("session=abc; HttpOnly"), "{head}");

    for (response, name, value) in [
        (
            "HTTP/1.1 401 Unauthorized\r\nWWW-Authenticate: Bearer realm=\"rig\"",
            "www-authenticate",
            "Bearer realm=\"rig\"",
        ),
        ("HTTP/1.1 302 Found\r\nLocation: ws://elsewhere.example/bus", "location", "ws://elsewhere.example/bus"),
    ] {
        let (port, _seen) = fake_upstream(Answer::Refuse(response));
        let proxy = start_proxy(&format!("ws://127.0.0.1:{port}"), &[]);
        let (_socket, head) = raw_client(&proxy.addr, "/");
        assert_eq!(status_of(&head), status_of(response), "{head}");
        assert_eq!(header(&head, name), Some(value), "{head}");
    }
}

#[test]
fn an_absolute_form_target_is_sent_upstream_as_its_path() {
    let (port, seen) = fake_upstream(Answer::Refuse("HTTP/1.1 404 Not Found"));
    let proxy = start_proxy(&format!("ws://127.0.0.1:{port}"), &[]);
    let (_socket, head) = raw_client(&proxy.addr, &format!("http://{}/abs/path?x=1", proxy.addr));
    assert_eq!(status_of(&head), 404, "{head}");
    let request = next_request(&seen);
    assert!(request.starts_with("GET /abs/path?x=1 HTTP/1.1\r\n"), "{request}");
}

#[test]
fn an_invalid_close_code_is_logged_as_it_arrived_and_the_proxy_closes_the_other_side() {
    let (port, seen) = fake_upstream(Answer::Upgrade(""));
    let log = temp_path("invalid-close.jsonl");
    let proxy = start_proxy(&format!("ws://127.0.0.1:{port}"), &["--log", log.to_str().unwrap()]);
    let (mut client, head) = raw_client(&proxy.addr, "/bad-close");
    assert_eq!(status_of(&head), 101, "{head}");
    // 999 is below the range of close codes (RFC 6455 section 7.4).
    let mut payload = 999u16.to_be_bytes().to_vec();
    payload.extend_from_slice(b"bad");
    client.write_all(&client_frame(0x8, &payload)).unwrap();
    let (opcode, reply) = read_frame(&mut client).expect("a close frame back");
    assert_eq!((opcode, u16::from_be_bytes([reply[0], reply[1]])), (0x8, 1002));
    let upstream_close = loop {
        if let Seen::Frame(0x8, payload) = seen.recv_timeout(STARTUP_TIMEOUT).expect("the upstream got a close frame") {
            break payload;
        }
    };
    assert_eq!(u16::from_be_bytes([upstream_close[0], upstream_close[1]]), 1002);
    let lines = read_log(&log, "\"event\":\"end\"");
    let close = lines
        .iter()
        .find(|l| l["event"] == "frame" && l["kind"] == "close" && l["direction"] == "up")
        .unwrap_or_else(|| panic!("no close frame line: {lines:#?}"));
    assert_eq!((close["close_code"].clone(), close["close_reason"].clone()), (999.into(), "bad".into()), "{close}");
    let end = lines.iter().find(|l| l["event"] == "end").unwrap();
    assert_eq!(end["end"], "invalid_close", "{end}");
    assert_eq!(
        (end["by"].clone(), end["received"].clone(), end["code"].clone()),
        ("client".into(), 999.into(), 1002.into())
    );
}

/// User plus system CPU time of a process so far, in seconds (Linux `/proc`).
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("read /proc/PID/stat");
    // Fields after the command name, which is in parentheses and may hold spaces.
    let fields: Vec<&str> = stat.rsplit_once(')').unwrap().1.split_whitespace().collect();
    let ticks: f64 = fields[11].parse::<f64>().unwrap() + fields[12].parse::<f64>().unwrap();
    ticks / 100.0
}

#[test]
fn the_admin_accept_loop_backs_off_and_logs_once_when_descriptors_run_out() {
    let (port, _seen) = fake_upstream(Answer::Silent);
    let proxy = start_proxy_with("ulimit -n 24;", &format!("ws://127.0.0.1:{port}"), &["--admin", "127.0.0.1:0"]);
    let addr = proxy.admin.clone().unwrap();
    // Idle admin connections hold descriptors until the request deadline: more than there are.
    let _held: Vec<TcpStream> = (0..40).filter_map(|_| TcpStream::connect(&addr).ok()).collect();
    std::thread::sleep(Duration::from_millis(500));
    let (start, cpu_start) = (Instant::now(), cpu_seconds(proxy.pid()));
    std::thread::sleep(Duration::from_millis(1500));
    let busy = (cpu_seconds(proxy.pid()) - cpu_start) / start.elapsed().as_secs_f64();
    let stderr = proxy.stderr_text();
    let reports = stderr.lines().filter(|l| l.contains("admin") && l.contains("accept")).count();
    assert_eq!(reports, 1, "expected one report of the failing admin accept:\n{stderr}");
    assert!(busy < 0.25, "the proxy used {:.0}% of a core while out of descriptors", busy * 100.0);
}

/// Issue 21, item 16: sockets that connect and say nothing held the handshake slots until their
/// deadline, so a real client waited about ceil(N / slots) deadlines (and, with a second's grace
/// before a place was given up, ceil(N / slots) seconds). With a one-minute deadline and 25 times
/// as many silent sockets as places, either proxy left the real client unanswered for longer than
/// `raw_client` waits (15 s); now the oldest silent socket gives up its place to each newer
/// client at once, and the real client is served as soon as it is accepted.
#[test]
fn silent_sockets_do_not_hold_a_real_client_back_until_their_deadline() {
    let (port, _seen) = fake_upstream(Answer::Upgrade(""));
    let log = temp_path("slowloris.jsonl");
    let proxy = start_proxy(
        &format!("ws://127.0.0.1:{port}"),
        &["--max-handshakes", "4", "--handshake-timeout-ms", "60000", "--log", log.to_str().unwrap()],
    );
    let mut idle: Vec<TcpStream> = (0..100).map(|_| TcpStream::connect(&proxy.addr).unwrap()).collect();
    let (_ws, head) = raw_client(&proxy.addr, "/real");
    assert_eq!(status_of(&head), 101, "{head}");
    // The first silent socket gave up its place first, and was told why.
    idle[0].set_read_timeout(Some(STARTUP_TIMEOUT)).unwrap();
    let told = read_head(&mut idle[0]);
    assert_eq!(status_of(&told), 503, "{told}");
    // At least the 96 silent sockets beyond the 4 places were told to go; their lines reach the
    // file at the log's next flush, so it is read until they are all there (or the deadline).
    let evictions = || {
        read_log(&log, "had waited longest")
            .iter()
            .filter(|l| {
                l["event"] == "handshake_error" && l["error"].as_str().is_some_and(|e| e.contains("had waited longest"))
            })
            .count()
    };
    let deadline = Instant::now() + STARTUP_TIMEOUT;
    while evictions() < 96 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(evictions() >= 96, "every silent socket that gave up its place is in the log: {}", evictions());
}

/// Issue 21, item 15: the listen backlog was 128 and accepting stopped at the handshake slots,
/// so beyond about 192 sockets that say nothing, connects timed out in the kernel, with nothing
/// in the proxy's log. Every one of 600 now connects at once, and a real client is still served.
#[test]
fn a_burst_of_connections_is_taken_in_not_left_to_time_out_in_the_kernel() {
    let (port, _seen) = fake_upstream(Answer::Upgrade(""));
    let proxy = start_proxy(&format!("ws://127.0.0.1:{port}"), &["--handshake-timeout-ms", "60000"]);
    let addr: std::net::SocketAddr = proxy.addr.parse().unwrap();
    let held: Vec<TcpStream> = (0..600)
        .map(|n| {
            TcpStream::connect_timeout(&addr, Duration::from_secs(10))
                .unwrap_or_else(|e| panic!("connection {n} of the burst was not taken: {e}"))
        })
        .collect();
    let (_ws, head) = raw_client(&proxy.addr, "/real");
    assert_eq!(status_of(&head), 101, "{head}");
    drop(held);
}

/// Issue 21, item 12: `--log /dev/full` printed one line and went on with the log lost.
#[test]
fn a_log_that_cannot_be_written_stops_the_proxy_with_the_reason() {
    let (port, _seen) = fake_upstream(Answer::Upgrade(""));
    let mut proxy = start_proxy(&format!("ws://127.0.0.1:{port}"), &["--log", "/dev/full"]);
    let code = wait_exit(&mut proxy.running.child, STARTUP_TIMEOUT);
    assert_eq!(code, Some(1), "the documented exit for a log that fails: {}", proxy.stderr_text());
    let stderr = proxy.stderr_text();
    assert!(stderr.contains("writing the log /dev/full failed") && stderr.contains("No space left"), "{stderr}");
}

/// Silent sockets that take every file descriptor the proxy may have give them back, so a real
/// client is not left waiting for their deadline either. 200 of them against 16 descriptors:
/// before, the real client waited in the kernel for a minute's deadline; with a second's grace
/// before the silent sockets gave their descriptors back (about 7 a second), for about 30 s;
/// now they are shed as the descriptors run out.
#[test]
fn silent_sockets_that_take_every_descriptor_give_them_back() {
    let (port, _seen) = fake_upstream(Answer::Upgrade(""));
    let proxy =
        start_proxy_with("ulimit -n 16;", &format!("ws://127.0.0.1:{port}"), &["--handshake-timeout-ms", "60000"]);
    let _idle: Vec<TcpStream> = (0..200).filter_map(|_| TcpStream::connect(&proxy.addr).ok()).collect();
    let (_ws, head) = raw_client(&proxy.addr, "/real");
    assert_eq!(status_of(&head), 101, "{head}");
    let stderr = proxy.stderr_text();
    assert!(stderr.contains("out of file descriptors"), "the descriptors ran out, and said so: {stderr}");
}
