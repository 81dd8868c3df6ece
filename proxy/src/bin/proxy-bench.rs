//! `proxy-bench`: what the proxy costs, measured over loopback in one run.
//!
//! An in-process echo server is the far end. The same client measures it directly and through
//! the proxy (no rules, no log): throughput as 1 KiB text frames per second with the frames
//! pipelined, and latency as round-trip percentiles with one frame in flight. Each side runs on
//! its own thread and runtime, as separate processes would. Rounds alternate direct and proxy,
//! and the best round of each counts, which filters out noise from other work on the machine.

use futures_util::{FutureExt, SinkExt, StreamExt};
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use tokio::net::{TcpListener, TcpStream};
use tokio_tungstenite::tungstenite::Message;

struct Options {
    frames: usize,
    latency_frames: usize,
    size: usize,
    rounds: usize,
    /// Profiling aid: measure only this path's throughput (`direct` or `proxy`), no latency.
    only: Option<String>,
}

fn options() -> Result<Options, String> {
    let mut options = Options { frames: 20_000, latency_frames: 5_000, size: 1024, rounds: 3, only: None };
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
        let value: usize = value.parse().map_err(|_| format!("{flag}: `{value}` is not a positive integer"))?;
        let slot = match flag.as_str() {
            "--frames" => &mut options.frames,
            "--latency-frames" => &mut options.latency_frames,
            "--size" => &mut options.size,
            "--rounds" => &mut options.rounds,
            _ => return Err(format!("unknown flag {flag}; expected --frames, --latency-frames, --size, --rounds")),
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
fn spawn_runtime<F, Fut>(name: &str, serve: F)
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + 'static,
{
    let thread = std::thread::Builder::new().name(name.to_string());
    thread
        .spawn(move || {
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

fn main() {
    let options = match options() {
        Ok(options) => options,
        Err(e) => {
            eprintln!("proxy-bench: {e}");
            std::process::exit(2);
        }
    };
    let (echo_tx, echo_rx) = std::sync::mpsc::channel();
    spawn_runtime("echo", move || async move {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind the echo server");
        echo_tx.send(listener.local_addr().expect("echo address")).expect("report");
        echo_server(listener).await;
    });
    let echo = echo_rx.recv().expect("echo server started");
    let (proxy_tx, proxy_rx) = std::sync::mpsc::channel();
    spawn_runtime("proxy", move || async move {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            args: proxy::ProxyArgs,
        }
        let cli = Cli::parse_from(["proxy", "--upstream", &format!("ws://{echo}")]);
        let bound = proxy::Proxy::bind(cli.args).await.expect("bind the proxy");
        proxy_tx.send(bound.listen_addr()).expect("report");
        let _ = bound.run().await;
    });
    let through = proxy_rx.recv().expect("proxy started");

    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
    let payload = "x".repeat(options.size);
    let (mut best_direct, mut best_proxy) = (0f64, 0f64);
    let (mut lat_direct, mut lat_proxy): (Option<Vec<f64>>, Option<Vec<f64>>) = (None, None);
    runtime.block_on(async {
        // Warm-up: connections, allocator and caches.
        throughput(echo, 1000, &payload).await;
        throughput(through, 1000, &payload).await;
        if let Some(only) = &options.only {
            let addr = if only == "direct" { echo } else { through };
            for _ in 0..options.rounds {
                let rate = throughput(addr, options.frames, &payload).await;
                println!("{only}: {rate:.0} frames/s");
            }
            std::process::exit(0);
        }
        for _ in 0..options.rounds {
            best_direct = best_direct.max(throughput(echo, options.frames, &payload).await);
            best_proxy = best_proxy.max(throughput(through, options.frames, &payload).await);
            let direct = latencies(echo, options.latency_frames, &payload).await;
            let proxied = latencies(through, options.latency_frames, &payload).await;
            // The round with the lowest p50 stands for each path.
            if lat_direct.as_ref().is_none_or(|l| percentile(&direct, 0.5) < percentile(l, 0.5)) {
                lat_direct = Some(direct);
            }
            if lat_proxy.as_ref().is_none_or(|l| percentile(&proxied, 0.5) < percentile(l, 0.5)) {
                lat_proxy = Some(proxied);
            }
        }
    });
    let (direct, proxied) = (lat_direct.unwrap_or_default(), lat_proxy.unwrap_or_default());
    let (d50, d99) = (percentile(&direct, 0.5), percentile(&direct, 0.99));
    let (p50, p99) = (percentile(&proxied, 0.5), percentile(&proxied, 0.99));
    println!(
        "{} B text frames over loopback; throughput: {} frames pipelined, best of {} rounds; latency: {} round trips, one in flight",
        options.size, options.frames, options.rounds, options.latency_frames
    );
    println!("{:<10} {:>14} {:>12} {:>12}", "path", "frames/s", "rtt p50 µs", "rtt p99 µs");
    println!("{:<10} {:>14.0} {:>12.1} {:>12.1}", "direct", best_direct, d50, d99);
    println!("{:<10} {:>14.0} {:>12.1} {:>12.1}", "proxy", best_proxy, p50, p99);
    println!(
        "proxy throughput {:.1}% of direct (target >= 80%); added latency p50 {:.1} µs, p99 {:.1} µs (target p99 <= 200 µs)",
        100.0 * best_proxy / best_direct,
        p50 - d50,
        p99 - d99
    );
}
