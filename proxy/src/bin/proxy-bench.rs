//! `proxy-bench`: what the proxy costs, measured over loopback in one run.
//!
//! An in-process echo server is the far end. The same client measures it directly and through
//! three proxies: plain (no rules, no log), with `--log`, and with ten rules whose field
//! conditions never match (so every frame is tried against all ten): throughput as 1 KiB JSON
//! text frames per second with the frames pipelined, and latency as round-trip percentiles with
//! one frame in flight. Each side runs on its own thread and runtime, as separate processes
//! would. Rounds alternate the paths, and the best round of each counts, which filters out noise
//! from other work on the machine. Last, it opens idle connections through the plain proxy and
//! reports the heap its thread holds per connection, counted by this binary's allocator.
//!
//! `--burst N` and `--slowloris N,N,...` measure instead how the proxy takes hostile load: how
//! many of N clients connecting at once fail to open a WebSocket, and how long a real client
//! waits to be served while N sockets that connect and say nothing are open.

use futures_util::{FutureExt, SinkExt, StreamExt};
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use tokio::net::{TcpListener, TcpStream};
use tokio_tungstenite::tungstenite::Message;

#[path = "../counting_alloc.rs"]
mod counting_alloc;

/// Counts the heap of the plain proxy's thread, for the memory figure.
#[global_allocator]
static ALLOCATOR: counting_alloc::Counting = counting_alloc::Counting;

/// The paths measured, in the order of the table.
const PATHS: [&str; 4] = ["direct", "proxy", "proxy --log", "proxy 10 rules"];

struct Options {
    frames: usize,
    latency_frames: usize,
    size: usize,
    rounds: usize,
    /// Profiling aid: measure only this path's throughput (`direct` or `proxy`), no latency.
    only: Option<String>,
    /// Idle connections opened for the memory figure.
    idle: usize,
    /// Clients connecting at once, for the burst figure (0: not measured).
    burst: usize,
    /// Silent sockets held open while a real client connects, one measurement each.
    slowloris: Vec<usize>,
    /// The proxy's `--max-handshakes` under hostile load (0: its default).
    max_handshakes: usize,
}

fn options() -> Result<Options, String> {
    let mut options = Options {
        frames: 20_000,
        latency_frames: 5_000,
        size: 1024,
        rounds: 3,
        only: None,
        idle: 200,
        burst: 0,
        slowloris: Vec::new(),
        max_handshakes: 0,
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value = args.next().ok_or_else(|| format!("{flag} needs a value"))?;
        if flag == "--only" {
            if value != "direct" && value != "proxy" {
                return Err(format!("--only: expected `direct` or `proxy`, not `{value}`"));
            }
            options.only = Some(value);
            continue;
        }
        if flag == "--slowloris" {
            let counts: Result<Vec<usize>, _> = value.split(',').map(str::parse).collect();
            options.slowloris =
                counts.map_err(|_| format!("--slowloris: expected counts such as 150,193,260, not `{value}`"))?;
            continue;
        }
        let value: usize = value.parse().map_err(|_| format!("{flag}: `{value}` is not a positive integer"))?;
        let slot = match flag.as_str() {
            "--frames" => &mut options.frames,
            "--latency-frames" => &mut options.latency_frames,
            "--size" => &mut options.size,
            "--rounds" => &mut options.rounds,
            "--idle" => &mut options.idle,
            "--burst" => &mut options.burst,
            "--max-handshakes" => &mut options.max_handshakes,
            _ => {
                return Err(format!(
                    "unknown flag {flag}; expected --frames, --latency-frames, --size, --rounds, --idle, --only, --burst, --slowloris, --max-handshakes"
                ))
            }
        };
        // Bounded so a typo cannot make a run take hours.
        if value == 0 || value > 10_000_000 {
            return Err(format!("{flag}: {value} is outside 1..=10000000"));
        }
        *slot = value;
    }
    Ok(options)
}

/// Starts a thread running `serve` on its own single-threaded runtime and LocalSet.
fn spawn_runtime<F, Fut>(name: &str, track: bool, serve: F)
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + 'static,
{
    let thread = std::thread::Builder::new().name(name.to_string());
    thread
        .spawn(move || {
            counting_alloc::track(track);
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
            tokio::task::LocalSet::new().block_on(&runtime, serve());
        })
        .expect("spawn a thread");
}

/// The far end: echoes every data frame, flushing once no more frames are ready.
async fn echo_server(listener: TcpListener) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let _ = stream.set_nodelay(true);
        tokio::task::spawn_local(async move {
            let Ok(mut ws) = tokio_tungstenite::accept_async(stream).await else {
                return;
            };
            loop {
                let next = match ws.next().now_or_never() {
                    Some(next) => next,
                    None => {
                        if ws.flush().await.is_err() {
                            return;
                        }
                        ws.next().await
                    }
                };
                match next {
                    Some(Ok(message)) if message.is_text() || message.is_binary() => {
                        if ws.feed(message).await.is_err() {
                            return;
                        }
                    }
                    Some(Ok(_)) => {}
                    _ => return,
                }
            }
        });
    }
}

async fn connect(addr: SocketAddr) -> tokio_tungstenite::WebSocketStream<TcpStream> {
    let stream = TcpStream::connect(addr).await.expect("connect");
    stream.set_nodelay(true).expect("nodelay");
    let (ws, _) =
        tokio_tungstenite::client_async(format!("ws://{addr}/bench"), stream).await.expect("client handshake");
    ws
}

/// Frames per second with `frames` frames pipelined (sent by one task, counted by another).
async fn throughput(addr: SocketAddr, frames: usize, payload: &str) -> f64 {
    let ws = connect(addr).await;
    let (mut tx, mut rx) = ws.split();
    let message = Message::text(payload.to_string());
    let start = Instant::now();
    let send = async {
        for _ in 0..frames {
            tx.feed(message.clone()).await.expect("send");
        }
        tx.flush().await.expect("flush");
    };
    let receive = async {
        let mut got = 0;
        while got < frames {
            match rx.next().await {
                Some(Ok(Message::Text(_))) => got += 1,
                Some(Ok(_)) => {}
                other => panic!("stream ended early: {other:?}"),
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(120), futures_util::future::join(send, receive))
        .await
        .expect("throughput run finished within 120 s");
    let elapsed = start.elapsed();
    let _ = tx.close().await;
    frames as f64 / elapsed.as_secs_f64()
}

/// Round-trip times in microseconds, one frame in flight, sorted.
async fn latencies(addr: SocketAddr, frames: usize, payload: &str) -> Vec<f64> {
    let mut ws = connect(addr).await;
    let message = Message::text(payload.to_string());
    let mut samples = Vec::with_capacity(frames);
    let run = async {
        for _ in 0..frames {
            let start = Instant::now();
            ws.send(message.clone()).await.expect("send");
            loop {
                match ws.next().await {
                    Some(Ok(Message::Text(_))) => break,
                    Some(Ok(_)) => {}
                    other => panic!("stream ended early: {other:?}"),
                }
            }
            samples.push(start.elapsed().as_nanos() as f64 / 1000.0);
        }
    };
    tokio::time::timeout(Duration::from_secs(120), run).await.expect("latency run finished within 120 s");
    let _ = ws.close(None).await;
    samples.sort_by(f64::total_cmp);
    samples
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[index.min(sorted.len() - 1)]
}

/// A 1 KiB-ish JSON frame of the shape the rules are written for, padded to `size` bytes.
fn json_payload(size: usize) -> String {
    let head = r#"{"type":"invocationresult","function_id":"harness::turn","invocation_id":"4f2c1f0e","result":{"session_id":"s1","step":1,"text":""#;
    let tail = r#""}}"#;
    format!("{head}{}{tail}", "x".repeat(size.saturating_sub(head.len() + tail.len())))
}

/// Starts a proxy on its own thread in front of `echo`; returns where clients connect.
fn start_proxy(echo: SocketAddr, extra: &[String], track: bool) -> SocketAddr {
    let (tx, rx) = std::sync::mpsc::channel();
    let mut argv: Vec<String> = vec!["proxy".into(), "--upstream".into(), format!("ws://{echo}")];
    argv.extend(extra.iter().cloned());
    spawn_runtime("proxy", track, move || async move {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            args: proxy::ProxyArgs,
        }
        let cli = Cli::parse_from(argv);
        let bound = proxy::Proxy::bind(cli.args).await.expect("bind the proxy");
        tx.send(bound.listen_addr()).expect("report");
        let _ = bound.run().await;
    });
    rx.recv().expect("proxy started")
}

/// The proxy thread's heap per idle connection: `idle` connections, each after one echo.
async fn idle_bytes(through: SocketAddr, idle: usize, payload: &str) -> isize {
    let settle = || async {
        let mut last = counting_alloc::live_bytes();
        for _ in 0..40 {
            tokio::time::sleep(Duration::from_millis(50)).await;
            let now = counting_alloc::live_bytes();
            if now == last {
                break;
            }
            last = now;
        }
        last
    };
    let mut first = connect(through).await;
    first.send(Message::text(payload.to_string())).await.expect("send");
    first.next().await.expect("echo").expect("echo");
    let before = settle().await;
    let mut open = Vec::with_capacity(idle);
    for _ in 0..idle {
        let mut ws = connect(through).await;
        ws.send(Message::text(payload.to_string())).await.expect("send");
        ws.next().await.expect("echo").expect("echo");
        open.push(ws);
    }
    let held = (settle().await - before) / idle as isize;
    drop(open);
    held
}

/// How long one hostile-load client may take to be served before it counts as failed.
const SERVED_WITHIN: Duration = Duration::from_secs(30);

/// Opens a WebSocket through `addr` and has one frame echoed: how long that took.
async fn served(addr: SocketAddr, payload: &str) -> Result<Duration, String> {
    let started = Instant::now();
    let open = async {
        let stream = TcpStream::connect(addr).await.map_err(|e| format!("connect: {e}"))?;
        let (mut ws, _) = tokio_tungstenite::client_async(format!("ws://{addr}/bench"), stream)
            .await
            .map_err(|e| format!("handshake: {e}"))?;
        ws.send(Message::text(payload.to_string())).await.map_err(|e| format!("send: {e}"))?;
        match ws.next().await {
            Some(Ok(_)) => Ok(ws),
            other => Err(format!("no echo: {other:?}")),
        }
    };
    match tokio::time::timeout(SERVED_WITHIN, open).await {
        Ok(Ok(ws)) => {
            let took = started.elapsed();
            // Held a while, as clients that stay would, so a burst's clients overlap.
            tokio::time::sleep(Duration::from_millis(500)).await;
            drop(ws);
            Ok(took)
        }
        Ok(Err(e)) => Err(e),
        Err(_) => Err(format!("not served within {SERVED_WITHIN:?}")),
    }
}

/// What a burst of clients met.
struct Burst {
    /// Failures by kind (`connect`, `handshake`, `not served within ...`).
    failed: std::collections::BTreeMap<String, usize>,
    /// How long each served client took to be served, sorted.
    served: Vec<Duration>,
}

/// The kernel's count of connections dropped because a listener's accept queue was full
/// (Linux: `ListenOverflows` in /proc/net/netstat), for every listener of the machine.
fn listen_overflows() -> Option<u64> {
    let netstat = std::fs::read_to_string("/proc/net/netstat").ok()?;
    let mut tcp_ext = netstat.lines().filter(|line| line.starts_with("TcpExt:"));
    let (names, values) = (tcp_ext.next()?, tcp_ext.next()?);
    let at = names.split_whitespace().position(|name| name == "ListenOverflows")?;
    values.split_whitespace().nth(at)?.parse().ok()
}

/// `clients` clients connecting at once through `addr`.
async fn burst(addr: SocketAddr, clients: usize, payload: &str) -> Burst {
    let attempts = (0..clients).map(|_| served(addr, payload));
    let mut result = Burst { failed: Default::default(), served: Vec::new() };
    for outcome in futures_util::future::join_all(attempts).await {
        match outcome {
            Ok(took) => result.served.push(took),
            Err(error) => {
                *result.failed.entry(error.split(':').next().unwrap_or_default().to_string()).or_insert(0) += 1
            }
        }
    }
    result.served.sort();
    result
}

/// What a real client met while silent sockets were open.
struct Slowloris {
    /// Silent sockets whose connect completed (the others were not taken by the kernel).
    connected: usize,
    /// The proxy thread's heap per connected silent socket.
    held: isize,
    /// How long the real client took to be served, or why it was not.
    served: Result<Duration, String>,
}

/// How long a real client waits to be served while `idle` silent sockets are open.
async fn slowloris(addr: SocketAddr, idle: usize, payload: &str) -> Slowloris {
    let before = counting_alloc::live_bytes();
    let mut silent = Vec::with_capacity(idle);
    for _ in 0..idle {
        // A connect that does not complete soon is a socket the kernel's accept queue could not
        // take: not counted as connected (it is what the real client would meet too).
        if let Ok(Ok(stream)) = tokio::time::timeout(Duration::from_millis(200), TcpStream::connect(addr)).await {
            silent.push(stream);
        }
    }
    // Let the proxy take them in before the real client comes.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let connected = silent.len();
    let held = (counting_alloc::live_bytes() - before) / connected.max(1) as isize;
    let served = served(addr, payload).await;
    drop(silent);
    Slowloris { connected, held, served }
}

/// `--burst` and `--slowloris`: a fresh proxy for each measurement, so one does not start
/// with what the other left behind.
fn hostile_load(echo: SocketAddr, options: &Options) {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
    let payload = json_payload(options.size);
    let handshakes = match options.max_handshakes {
        0 => vec![],
        n => vec!["--max-handshakes".to_string(), n.to_string()],
    };
    if options.burst > 0 {
        // Enough WebSocket slots for every client: the figure is about opening, not the cap.
        let mut slots = vec!["--max-connections".to_string(), options.burst.to_string()];
        slots.extend(handshakes.iter().cloned());
        let proxy = start_proxy(echo, &slots, false);
        let overflows_before = listen_overflows();
        let burst = runtime.block_on(burst(proxy, options.burst, &payload));
        let overflows = match (overflows_before, listen_overflows()) {
            (Some(before), Some(after)) => format!("{}", after - before),
            _ => "not known here".to_string(),
        };
        let failed: usize = burst.failed.values().sum();
        let at = |p: f64| {
            burst.served.get(((burst.served.len() as f64 - 1.0) * p) as usize).map_or(0.0, |d| d.as_secs_f64())
        };
        let over = |s: u64| burst.served.iter().filter(|d| **d >= Duration::from_secs(s)).count();
        println!(
            "burst: {} clients at once: {failed} failed to open within {SERVED_WITHIN:?} {:?}; served ones took p50 {:.3} s, p99 {:.3} s, max {:.3} s ({} 5 s or more); connections the kernel dropped for want of room in an accept queue meanwhile (every listener of the machine): {overflows}",
            options.burst, burst.failed, at(0.5), at(0.99), at(1.0), over(5)
        );
    }
    for &idle in &options.slowloris {
        // Tracked: the proxy's heap per silent socket. (One tracked proxy at a time.)
        let proxy = start_proxy(echo, &handshakes, true);
        let Slowloris { connected, held, served } = runtime.block_on(slowloris(proxy, idle, &payload));
        let sockets = format!("{idle} silent sockets ({connected} connected, {held} B of the proxy's heap each)");
        match served {
            Ok(waited) => println!("slowloris: {sockets}, a real client served in {:.3} s", waited.as_secs_f64()),
            Err(why) => println!("slowloris: {sockets}, a real client was not served: {why}"),
        }
    }
}

fn main() {
    let options = match options() {
        Ok(options) => options,
        Err(e) => {
            eprintln!("proxy-bench: {e}");
            std::process::exit(2);
        }
    };
    let (echo_tx, echo_rx) = std::sync::mpsc::channel();
    spawn_runtime("echo", false, move || async move {
        // The system's backlog, so a burst through the proxy measures the proxy, not this queue.
        let socket = tokio::net::TcpSocket::new_v4().expect("a socket");
        socket.bind("127.0.0.1:0".parse().expect("an address")).expect("bind the echo server");
        let listener = socket.listen(i32::MAX as u32).expect("listen");
        echo_tx.send(listener.local_addr().expect("echo address")).expect("report");
        echo_server(listener).await;
    });
    let echo = echo_rx.recv().expect("echo server started");
    if options.burst > 0 || !options.slowloris.is_empty() {
        return hostile_load(echo, &options);
    }
    let log = std::env::temp_dir().join(format!("proxy-bench-{}.jsonl", std::process::id()));
    let ten_rules: Vec<String> = (0..10)
        .flat_map(|i| ["--rule".to_string(), format!("drop always type=invocationresult result.step={}", 100 + i)])
        .collect();
    let addrs = [
        echo,
        start_proxy(echo, &[], true),
        start_proxy(echo, &["--log".to_string(), log.display().to_string()], false),
        start_proxy(echo, &ten_rules, false),
    ];

    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
    let payload = json_payload(options.size);
    let mut best = [0f64; 4];
    let mut latency: [Option<Vec<f64>>; 4] = Default::default();
    let mut idle = 0;
    runtime.block_on(async {
        // Warm-up: connections, allocator and caches.
        for addr in addrs {
            throughput(addr, 1000, &payload).await;
        }
        if let Some(only) = &options.only {
            let addr = if only == "direct" { addrs[0] } else { addrs[1] };
            for _ in 0..options.rounds {
                let rate = throughput(addr, options.frames, &payload).await;
                println!("{only}: {rate:.0} frames/s");
            }
            std::process::exit(0);
        }
        for _ in 0..options.rounds {
            for (i, addr) in addrs.into_iter().enumerate() {
                best[i] = best[i].max(throughput(addr, options.frames, &payload).await);
            }
            for (i, addr) in addrs.into_iter().enumerate() {
                let samples = latencies(addr, options.latency_frames, &payload).await;
                // The round with the lowest p50 stands for each path.
                if latency[i].as_ref().is_none_or(|l| percentile(&samples, 0.5) < percentile(l, 0.5)) {
                    latency[i] = Some(samples);
                }
            }
        }
        idle = idle_bytes(addrs[1], options.idle, &payload).await;
    });
    let _ = std::fs::remove_file(&log);
    let latency: Vec<Vec<f64>> = latency.into_iter().map(Option::unwrap_or_default).collect();
    let (d50, d99) = (percentile(&latency[0], 0.5), percentile(&latency[0], 0.99));
    println!(
        "{} B JSON text frames over loopback; throughput: {} frames pipelined, best of {} rounds; latency: {} round trips, one in flight",
        options.size, options.frames, options.rounds, options.latency_frames
    );
    println!(
        "{:<16} {:>10} {:>9} {:>11} {:>11} {:>12} {:>12}",
        "path", "frames/s", "% direct", "rtt p50 µs", "rtt p99 µs", "added p50 µs", "added p99 µs"
    );
    for (i, path) in PATHS.iter().enumerate() {
        let (p50, p99) = (percentile(&latency[i], 0.5), percentile(&latency[i], 0.99));
        println!(
            "{path:<16} {:>10.0} {:>8.1}% {p50:>11.1} {p99:>11.1} {:>12.1} {:>12.1}",
            best[i],
            100.0 * best[i] / best[0],
            p50 - d50,
            p99 - d99
        );
    }
    println!(
        "memory per idle connection: {} bytes of the proxy thread's heap ({} connections, one echo each; kernel socket buffers not counted)",
        idle, options.idle
    );
}
