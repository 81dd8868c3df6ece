//! What the proxy holds and allocates, counted by a global allocator that tallies the
//! allocations of the threads a test marks (the proxy's thread, or the one running a relay).
//!
//! Counts, not timings: they are the same on a loaded machine as on an idle one.

use futures_util::{SinkExt, StreamExt};
use proxy::{relay, FrameRecord, ProxyEnv, Rule, RuleSet, Wire};
use std::cell::RefCell;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Mutex;
use std::time::{Duration, Instant};
use tokio::net::{TcpListener, TcpStream};
use tokio_tungstenite::tungstenite::Message;

#[path = "../src/counting_alloc.rs"]
mod counting_alloc;

use counting_alloc::{allocations, live_bytes, track};

#[global_allocator]
static ALLOCATOR: counting_alloc::Counting = counting_alloc::Counting;

/// One test at a time: the counters are shared by every thread a test marks.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// Starts a thread running `serve` on its own single-threaded runtime and LocalSet.
fn spawn_runtime<F, Fut>(track_it: bool, serve: F)
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future<Output = ()> + 'static,
{
    std::thread::spawn(move || {
        track(track_it);
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
        tokio::task::LocalSet::new().block_on(&runtime, serve());
    });
}

/// A far end on its own (untracked) thread: `on_connect` runs for every WebSocket it accepts.
fn far_end<F, Fut>(on_connect: F) -> SocketAddr
where
    F: Fn(tokio_tungstenite::WebSocketStream<TcpStream>) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + 'static,
{
    let (tx, rx) = std::sync::mpsc::channel();
    spawn_runtime(false, move || async move {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        tx.send(listener.local_addr().unwrap()).unwrap();
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            let Ok(ws) = tokio_tungstenite::accept_async(stream).await else { continue };
            tokio::task::spawn_local(on_connect(ws));
        }
    });
    rx.recv().unwrap()
}

fn echo_server() -> SocketAddr {
    far_end(|mut ws| async move {
        while let Some(Ok(message)) = ws.next().await {
            if (message.is_text() || message.is_binary()) && ws.send(message).await.is_err() {
                break;
            }
        }
    })
}

/// The proxy in this process, on a tracked thread, with these arguments.
fn proxy(args: &[&str]) -> SocketAddr {
    use clap::Parser;
    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: proxy::ProxyArgs,
    }
    let cli = Cli::parse_from(["proxy"].iter().chain(args));
    let (tx, rx) = std::sync::mpsc::channel();
    spawn_runtime(true, move || async move {
        let bound = proxy::Proxy::bind(cli.args).await.expect("bind the proxy");
        tx.send(bound.listen_addr()).unwrap();
        let _ = bound.run().await;
    });
    rx.recv().unwrap()
}

/// The tracked threads' live bytes, once they stop changing (the proxy has settled).
fn settled_live_bytes() -> isize {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut last = live_bytes();
    let mut stable_since = Instant::now();
    while Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
        let now = live_bytes();
        if now != last {
            (last, stable_since) = (now, Instant::now());
        } else if stable_since.elapsed() > Duration::from_millis(500) {
            break;
        }
    }
    last
}

async fn connect(addr: SocketAddr) -> tokio_tungstenite::WebSocketStream<TcpStream> {
    let stream = TcpStream::connect(addr).await.unwrap();
    tokio_tungstenite::client_async(format!("ws://{addr}/"), stream).await.expect("client handshake").0
}

#[test]
fn an_idle_connection_holds_little_memory() {
    let _serial = serial();
    let echo = echo_server();
    let through = proxy(&["--upstream", &format!("ws://{echo}")]);
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(async {
        // One connection first, so what every connection shares (the runtime's tables) is counted out.
        let mut first = connect(through).await;
        first.send(Message::text("warm")).await.unwrap();
        first.next().await.unwrap().unwrap();
        let before = settled_live_bytes();
        let mut idle = Vec::new();
        for i in 0..50 {
            let mut ws = connect(through).await;
            ws.send(Message::text(format!("hello {i}"))).await.unwrap();
            ws.next().await.unwrap().unwrap();
            idle.push(ws);
        }
        let per_connection = (settled_live_bytes() - before) / 50;
        assert!(per_connection <= 32 * 1024, "an idle connection holds {per_connection} bytes");
        drop(idle);
    });
}

#[test]
fn a_client_that_stops_reading_holds_at_most_two_messages() {
    let _serial = serial();
    const MIB: usize = 1024 * 1024;
    // The far end pushes 24 messages of 1 MiB at a client that never reads them.
    let pusher = far_end(|mut ws| async move {
        for i in 0..24u8 {
            if ws.send(Message::binary(vec![i; MIB])).await.is_err() {
                return;
            }
        }
        while ws.next().await.is_some() {}
    });
    let through = proxy(&["--upstream", &format!("ws://{pusher}"), "--max-frame-bytes", &MIB.to_string()]);
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(async {
        let before = settled_live_bytes();
        let stalled = connect(through).await;
        let held = settled_live_bytes() - before;
        // The documented bound for one stalled direction: one message in the stalled peer's
        // write buffer, the read buffer of the last message from the other peer (tungstenite
        // keeps it), and the small buffers (README, "Memory").
        assert!(held as usize <= 2 * MIB + 256 * 1024, "a stalled client holds {held} bytes");
        drop(stalled);
    });
}

/// An environment that keeps no record and never sleeps (no rule here delays).
struct Quiet;

impl ProxyEnv for Quiet {
    fn now_us(&self) -> u64 {
        0
    }
    fn sleep(&self, _ms: u64) -> Pin<Box<dyn Future<Output = ()> + '_>> {
        Box::pin(std::future::ready(()))
    }
    fn record(&self, _record: &FrameRecord<'_>) {}
    fn records(&self) -> bool {
        false
    }
}

/// Allocations made while `frames` JSON frames go up through a relay with these rules and come
/// back from an echo, all on this (tracked) thread.
fn allocations_relaying(rules: &[String], frames: usize) -> usize {
    let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
    let frame = serde_json::json!({
        "type": "invocationresult", "invocation_id": "4f2c1f0e-8d8a-4c3e-9f5e-2b7d1c9a6e10",
        "function_id": "harness::turn",
        "result": {"session_id": "s1", "step": 7, "status": "ok", "messages": (0..12).map(|i| serde_json::json!({
            "role": if i % 2 == 0 { "user" } else { "assistant" }, "content": format!("message number {i} of the turn"),
            "tokens": i * 17, "tools": ["search", "fetch"]
        })).collect::<Vec<_>>()}
    })
    .to_string();
    runtime.block_on(async {
        use tokio_tungstenite::tungstenite::protocol::Role;
        use tokio_tungstenite::WebSocketStream;
        let (client_end, proxy_client_side) = tokio::io::duplex(256 * 1024);
        let (proxy_upstream_side, server_end) = tokio::io::duplex(256 * 1024);
        let mut client = WebSocketStream::from_raw_socket(client_end, Role::Client, None).await;
        let proxy_client =
            WebSocketStream::from_raw_socket(Wire::new(proxy_client_side, Vec::new()), Role::Server, None).await;
        let proxy_upstream =
            WebSocketStream::from_raw_socket(Wire::new(proxy_upstream_side, Vec::new()), Role::Client, None).await;
        let mut server = WebSocketStream::from_raw_socket(server_end, Role::Server, None).await;
        let rules = RuleSet::with_rules(0, rules.iter().map(|r| Rule::parse(r).unwrap())).unwrap();
        let relay = relay(proxy_client, proxy_upstream, Rc::new(RefCell::new(rules)), 1, &Quiet);
        let echo = async {
            while let Some(Ok(message)) = server.next().await {
                if message.is_text() && server.send(message).await.is_err() {
                    break;
                }
            }
        };
        let drive = async {
            track(true);
            let start = allocations();
            for _ in 0..frames {
                client.send(Message::text(frame.clone())).await.unwrap();
                client.next().await.unwrap().unwrap();
            }
            let counted = allocations() - start;
            track(false);
            client.close(None).await.unwrap();
            counted
        };
        let (_, _, counted) = tokio::join!(relay, echo, drive);
        counted
    })
}

#[test]
fn field_rules_do_not_build_a_json_tree_per_frame() {
    let _serial = serial();
    let frames = 200;
    let plain = allocations_relaying(&[], frames);
    // Ten rules with field conditions, none matching, so each frame is tried against all ten.
    let rules: Vec<String> =
        (0..10).map(|i| format!("drop always up type=invocationresult result.step={}", 100 + i)).collect();
    let with_rules = allocations_relaying(&rules, frames);
    let extra = (with_rules as f64 - plain as f64) / frames as f64;
    assert!(extra < 3.0, "ten field rules cost {extra:.1} allocations per frame ({plain} without, {with_rules} with)");
}

/// Allocations on the proxy's thread while `frames` frames go through it and back.
fn proxy_allocations(args: &[&str], frames: usize) -> usize {
    let echo = echo_server();
    let upstream = format!("ws://{echo}");
    let through = proxy(&[&["--upstream", upstream.as_str()], args].concat());
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(async {
        let mut ws = connect(through).await;
        let frame = Message::text(r#"{"type":"invocationresult","result":{"session_id":"s1","step":1}}"#);
        ws.send(frame.clone()).await.unwrap();
        ws.next().await.unwrap().unwrap();
        let start = allocations();
        for _ in 0..frames {
            ws.send(frame.clone()).await.unwrap();
            ws.next().await.unwrap().unwrap();
        }
        allocations() - start
    })
}

#[test]
fn logging_a_frame_costs_no_allocation_per_field() {
    let _serial = serial();
    let frames = 500;
    let log =
        std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("proxy-memory-{}.jsonl", std::process::id()));
    let plain = proxy_allocations(&[], frames);
    let logged = proxy_allocations(&["--log", log.to_str().unwrap()], frames);
    let extra = (logged as f64 - plain as f64) / frames as f64 / 2.0;
    assert!(extra < 1.0, "logging cost {extra:.1} allocations per frame ({plain} without --log, {logged} with)");
}
