//! `rig harness`: the reference harness as an external process, for live runs.
//!
//! It connects to an engine (`rig live`, or any iii engine that serves `rig::config`) as a
//! worker of one harness host, registers that host's functions, and serves them with the
//! reference harness. Whenever its connection drops it connects again with capped backoff, as
//! an iii worker does, and starts its worker afresh: a dropped connection costs it its memory,
//! as a restart does in the simulation (so `crash = "harness"` means the same in both). It
//! learns the run's harness settings from `rig::config` on its first call, and reports its
//! decisions to `rig::note`, so expectations on the reference harness's notes apply to it live.

use super::rigfns::{config_from_json, REFERENCE_NOTES, RIG_CONFIG, RIG_NOTE};
use crate::bus::{websocket, Answer, Bus, Connection, ErrorBody, Invocation, Provider};
use crate::clock::Clock;
use crate::cut::Interrupt;
use crate::harness::{HarnessEnv, HarnessFactory, Policy, ProcessControl, ReferenceHarness};
use crate::streams::component_stream;
use crate::topology::{HARNESS, HARNESS_FUNCTIONS};
use rand_chacha::ChaCha8Rng;
use serde_json::json;
use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::time::{Duration, Instant};

/// How long one connection attempt (TCP and the WebSocket handshake) may take.
const CONNECT_MS_MAX: u64 = 5_000;
/// Backoff between connection attempts: from the first to the cap, doubling.
const RECONNECT_MS_FIRST: u64 = 100;
const RECONNECT_MS_MAX: u64 = 2_000;
/// How long the first call may wait for the run's settings.
const CONFIG_MS_MAX: u64 = 5_000;

/// What `rig harness` is asked to be.
#[derive(Debug, Clone)]
pub struct HarnessProcess {
    /// The engine: `ws://HOST:PORT`, optionally with a path.
    pub url: String,
    /// The harness host it serves (`harness`, `replacement`).
    pub host: String,
    /// The policy to behave as; by default the one the run is judged by (from `rig::config`).
    pub policy: Option<String>,
}

/// Serves as a harness worker until the process is stopped. `Err` for bad arguments or a
/// runtime that cannot start; connection failures are retried, and reported on stderr.
pub fn serve_harness(process: &HarnessProcess) -> Result<(), String> {
    let url = proxy::UpstreamUrl::parse(&process.url)?;
    if let Some(policy) = &process.policy {
        check_policy(policy)?;
    }
    if !process.host.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_') || process.host.is_empty() {
        return Err(format!("--host `{}`: expected a host name such as `harness` or `replacement`", process.host));
    }
    let path = match (url.prefix.as_str(), process.host.as_str()) {
        ("", HARNESS) => "/".to_string(),
        ("", host) => format!("/{host}"),
        (prefix, _) => prefix.to_string(),
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the runtime: {e}"))?;
    // One stream for the process's life: ids drawn after a reconnection never repeat earlier ones.
    let rng = Rc::new(RefCell::new(component_stream(0, &process.host)));
    runtime.block_on(async {
        let mut backoff_ms = RECONNECT_MS_FIRST;
        loop {
            // Each connection gets a task set of its own: dropped with it, as a process is.
            let session = tokio::task::LocalSet::new();
            match session.run_until(serve_once(process, &url, &path, &rng)).await {
                Ok(()) => {
                    eprintln!("rig harness: the connection to {} ended; connecting again", process.url);
                    backoff_ms = RECONNECT_MS_FIRST;
                }
                Err(why) => eprintln!("rig harness: {why}; trying again in {backoff_ms} ms"),
            }
            drop(session);
            tokio::time::sleep(Duration::from_millis(backoff_ms)).await;
            backoff_ms = (backoff_ms * 2).min(RECONNECT_MS_MAX);
        }
    })
}

fn check_policy(policy: &str) -> Result<Policy, String> {
    Policy::from_name(policy).ok_or_else(|| {
        let known: Vec<&str> = Policy::ALL.iter().map(|p| p.name()).collect();
        format!("unknown policy `{policy}`, expected one of {}", known.join(", "))
    })
}

/// One connection: connects, serves the host's functions until the connection ends.
async fn serve_once(
    process: &HarnessProcess,
    url: &proxy::UpstreamUrl,
    path: &str,
    rng: &Rc<RefCell<ChaCha8Rng>>,
) -> Result<(), String> {
    let authority = url.authority();
    let bounded = Duration::from_millis(CONNECT_MS_MAX);
    let stream = tokio::time::timeout(bounded, tokio::net::TcpStream::connect(&authority))
        .await
        .map_err(|_| format!("connecting to {authority} took over {CONNECT_MS_MAX} ms"))?
        .map_err(|e| format!("cannot connect to {authority}: {e}"))?;
    let _ = stream.set_nodelay(true);
    let key = websocket::handshake_key(&mut rng.borrow_mut());
    let socket = tokio::time::timeout(bounded, websocket::connect(stream, &authority, path, key))
        .await
        .map_err(|_| format!("the WebSocket handshake with {authority} took over {CONNECT_MS_MAX} ms"))?
        .map_err(|e| format!("the WebSocket handshake with {authority}{path} failed: {e}"))?;
    eprintln!("rig harness: connected to ws://{authority}{path} as `{}`", process.host);
    let clock = Clock::new();
    tokio::task::spawn_local(drive_clock(Rc::clone(&clock)));
    let bus = Bus::new(Rc::clone(&clock));
    let worker = Rc::new(ExternalHarness {
        host: process.host.clone(),
        policy: process.policy.clone(),
        clock,
        rng: Rc::clone(rng),
        started: tokio::sync::OnceCell::new(),
    });
    let functions = HARNESS_FUNCTIONS.iter().map(|f| format!("{}::{f}", process.host)).collect();
    let name = "rig-harness";
    Connection::run(socket, name, functions, worker, bus, Rc::clone(rng), std::future::pending()).await;
    Ok(())
}

/// Moves the worker's clock with real time.
async fn drive_clock(clock: Rc<Clock>) {
    let started = Instant::now();
    loop {
        clock.advance_to(u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX));
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// The reference harness, started on the first call of a connection with the run's settings.
struct ExternalHarness {
    host: String,
    policy: Option<String>,
    clock: Rc<Clock>,
    rng: Rc<RefCell<ChaCha8Rng>>,
    started: tokio::sync::OnceCell<Rc<dyn Provider>>,
}

impl ExternalHarness {
    /// Asks the engine for the run's settings and starts the reference harness with them.
    async fn start(&self, bus: &Bus) -> Result<Rc<dyn Provider>, String> {
        let asked = json!({ "host": self.host, "notes": REFERENCE_NOTES });
        let run = bus.invoke(RIG_CONFIG, asked, CONFIG_MS_MAX).await.map_err(|e| format!("{RIG_CONFIG}: {e}"))?;
        let policy = match &self.policy {
            Some(policy) => policy.clone(),
            None => run["policy"].as_str().unwrap_or("reference").to_string(),
        };
        let policy = check_policy(&policy)?;
        let config = config_from_json(&run["config"]).map_err(|e| format!("{RIG_CONFIG} answered badly: {e}"))?;
        eprintln!("rig harness: serving {} as policy `{}`", run["scenario"].as_str().unwrap_or("a run"), policy.name());
        let (notes, host) = (bus.clone(), self.host.clone());
        let env = HarnessEnv {
            host: self.host.clone(),
            clock: Rc::clone(&self.clock),
            rng: Rc::clone(&self.rng),
            config,
            note: Rc::new(move |what, detail| {
                notes.send_void(RIG_NOTE, json!({ "host": host, "what": what, "detail": detail }));
            }),
            process: Rc::new(Unmanaged),
        };
        Ok(ReferenceHarness.start(policy.name(), env))
    }
}

impl Provider for ExternalHarness {
    fn invoke(self: Rc<Self>, call: Invocation, bus: Bus) -> Pin<Box<dyn Future<Output = Answer>>> {
        Box::pin(async move {
            let worker = match self.started.get_or_try_init(|| self.start(&bus)).await {
                Ok(worker) => Rc::clone(worker),
                Err(why) => {
                    eprintln!("rig harness: {why}");
                    return Some(Err(ErrorBody::new("harness_not_started", why)));
                }
            };
            worker.invoke(call, bus).await
        })
    }
}

/// A process nobody interrupts or pauses from inside: live, those cuts are refused.
struct Unmanaged;

impl ProcessControl for Unmanaged {
    fn interrupt(&self, _worker: &str, _point: &str) -> Option<Interrupt> {
        None
    }

    fn paused_until(&self, _worker: &str) -> Option<u64> {
        None
    }

    fn pause(&self, _worker: &str, _until_ms: u64) {}
}
