//! `rig harness`: the reference harness as an external process, for live runs.
//!
//! It connects to an engine (`rig live`) as a worker of one harness host, registers that host's
//! functions and serves them with the reference harness, and connects again with capped backoff
//! whenever its connection drops, as an iii worker does.
//!
//! On every connection it first asks `rig::config` which run it serves, and the run's harness
//! settings. Its worker lives as long as one *incarnation* of its host, which the rig names in
//! that answer: the same run, and no `crash` of the host since. So a connection dropped by a
//! partition leaves the worker and its background work in place, and a `crash = "harness"` or a
//! new run starts it afresh, as in the simulation; the worker of a finished incarnation is
//! dropped with everything it started, so nothing of one run reaches the next. It reports its
//! decisions to `rig::note`, so expectations on the reference harness's notes apply to it live.

use super::rigfns::{config_from_json, REFERENCE_NOTES, RIG_CONFIG, RIG_NOTE};
use crate::bus::{websocket, Bus, Connection, Frame, Provider};
use crate::clock::Clock;
use crate::cut::Interrupt;
use crate::harness::{longest_own_wait_ms, HarnessEnv, HarnessFactory, Policy, ProcessControl, ReferenceHarness};
use crate::streams::{component_stream, uuid};
use crate::topology::{HARNESS, HARNESS_FUNCTIONS};
use futures_util::{SinkExt, StreamExt};
use rand_chacha::ChaCha8Rng;
use serde_json::{json, Value};
use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::time::{Duration, Instant};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};
use tokio::task::{JoinHandle, LocalSet};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

/// How long one connection attempt (TCP, the WebSocket handshake, the run's settings) may take.
const CONNECT_MS_MAX: u64 = 5_000;
/// Backoff between connection attempts: from the first to the cap, doubling.
const RECONNECT_MS_FIRST: u64 = 100;
const RECONNECT_MS_MAX: u64 = 2_000;
/// Beyond its longest wait, what scheduling may take on a loaded machine.
const QUIET_SLACK_MS: u64 = 250;

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
    // A query (the run key in the URL `rig live --spawn` gives) is passed on as it is.
    let (base, query) = match process.url.split_once('?') {
        Some((base, query)) => (base, format!("?{query}")),
        None => (process.url.as_str(), String::new()),
    };
    let url = proxy::UpstreamUrl::parse(base)?;
    if let Some(policy) = &process.policy {
        check_policy(policy)?;
    }
    if process.host.is_empty() || !process.host.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_') {
        return Err(format!("--host `{}`: expected a host name such as `harness` or `replacement`", process.host));
    }
    let path = match (url.prefix.as_str(), process.host.as_str()) {
        ("", HARNESS) => "/".to_string(),
        ("", host) => format!("/{host}"),
        (prefix, _) => prefix.to_string(),
    } + &query;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the runtime: {e}"))?;
    let process = Process {
        request: process.clone(),
        authority: url.authority(),
        path,
        // One stream for the process's life: ids drawn by later incarnations never repeat earlier
        // ones. Seeded afresh for every process, as the simulation's stream survives a host's
        // restarts: a process started again after a crash (`rig live --spawn`) must not draw the
        // idempotency keys of the one before it, which the services would take for repeats.
        rng: Rc::new(RefCell::new(component_stream(process_seed(), &process.host))),
        current: RefCell::new(None),
    };
    LocalSet::new().block_on(&runtime, async {
        let mut backoff_ms = RECONNECT_MS_FIRST;
        loop {
            match process.serve_once().await {
                Ok(()) => {
                    eprintln!("rig harness: the connection to {} ended; connecting again", process.request.url);
                    backoff_ms = RECONNECT_MS_FIRST;
                }
                Err(why) => eprintln!("rig harness: {why}; trying again in {backoff_ms} ms"),
            }
            tokio::time::sleep(Duration::from_millis(backoff_ms)).await;
            backoff_ms = (backoff_ms * 2).min(RECONNECT_MS_MAX);
        }
    })
}

/// A seed no other process draws: a live process is not seeded by the rig, and two processes
/// of one host must never draw the same ids.
fn process_seed() -> u64 {
    let since_epoch = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    (since_epoch.as_nanos() as u64).rotate_left(20) ^ u64::from(std::process::id())
}

fn check_policy(policy: &str) -> Result<Policy, String> {
    Policy::from_name(policy).ok_or_else(|| {
        let known: Vec<&str> = Policy::ALL.iter().map(|p| p.name()).collect();
        format!("unknown policy `{policy}`, expected one of {}", known.join(", "))
    })
}

type Socket = WebSocketStream<TcpStream>;
type Job = Pin<Box<dyn Future<Output = ()>>>;

/// The process: what it was asked to be, and the incarnation it serves now.
struct Process {
    request: HarnessProcess,
    authority: String,
    path: String,
    rng: Rc<RefCell<ChaCha8Rng>>,
    current: RefCell<Option<Incarnation>>,
}

/// One life of the worker: its bus (which every connection of the incarnation serves), and
/// the task set everything it starts runs in, dropped when the incarnation ends.
struct Incarnation {
    key: String,
    bus: Bus,
    worker: Rc<dyn Provider>,
    jobs: mpsc::UnboundedSender<Job>,
    tasks: JoinHandle<()>,
}

impl Drop for Incarnation {
    fn drop(&mut self) {
        self.tasks.abort();
    }
}

impl Process {
    /// One connection: connects, learns the run, serves until the connection ends.
    async fn serve_once(&self) -> Result<(), String> {
        let mut socket = self.connect().await?;
        let host = &self.request.host;
        let run = bounded("the run's settings", config(&mut socket, host, &self.rng, None)).await??;
        // Then the longest it waits by itself under those settings, so a quiet world is judged
        // at once.
        let settings = config_from_json(&run["config"]).map_err(|e| format!("{RIG_CONFIG} answered badly: {e}"))?;
        let quiet = longest_own_wait_ms(&settings).saturating_add(QUIET_SLACK_MS);
        bounded("declaring its waits", config(&mut socket, host, &self.rng, Some(quiet))).await??;
        let key = run["incarnation"].as_str().unwrap_or_default().to_string();
        let same = self.current.borrow().as_ref().is_some_and(|life| life.key == key && !key.is_empty());
        if !same {
            // The old incarnation, and everything it started, ends here.
            self.current.replace(None);
            self.current.replace(Some(self.incarnation(key, &run)?));
        }
        let (bus, worker, jobs) = {
            let current = self.current.borrow();
            let life = current.as_ref().expect("an incarnation was just chosen");
            (life.bus.clone(), Rc::clone(&life.worker), life.jobs.clone())
        };
        let functions = HARNESS_FUNCTIONS.iter().map(|f| format!("{}::{f}", self.request.host)).collect();
        let ids = Rc::clone(&self.rng);
        let (ended, end) = oneshot::channel();
        let serving: Job = Box::pin(async move {
            Connection::run(socket, "rig-harness", functions, worker, bus, ids, std::future::pending()).await;
            let _ = ended.send(());
        });
        jobs.send(serving).map_err(|_| "the worker's task set is gone".to_string())?;
        // Ends with the connection, or with the incarnation (a newer one replaced it).
        let _ = end.await;
        Ok(())
    }

    async fn connect(&self) -> Result<Socket, String> {
        let authority = &self.authority;
        let stream = bounded(&format!("connecting to {authority}"), TcpStream::connect(authority))
            .await?
            .map_err(|e| format!("cannot connect to {authority}: {e}"))?;
        let _ = stream.set_nodelay(true);
        let key = websocket::handshake_key(&mut self.rng.borrow_mut());
        let handshake = websocket::connect(stream, authority, &self.path, key);
        bounded("the WebSocket handshake", handshake)
            .await?
            .map_err(|e| format!("the WebSocket handshake with ws://{authority}{} failed: {e}", self.path))
    }

    /// Starts a worker for a new incarnation, with the run's settings.
    fn incarnation(&self, key: String, run: &Value) -> Result<Incarnation, String> {
        let policy = match &self.request.policy {
            Some(policy) => policy.clone(),
            None => run["policy"].as_str().unwrap_or("reference").to_string(),
        };
        let policy = check_policy(&policy)?;
        let config = config_from_json(&run["config"]).map_err(|e| format!("{RIG_CONFIG} answered badly: {e}"))?;
        eprintln!(
            "rig harness: serving {} as `{}`, policy `{}`",
            run["scenario"].as_str().unwrap_or("a run"),
            self.request.host,
            policy.name()
        );
        let clock = Clock::new();
        let bus = Bus::new(Rc::clone(&clock));
        let (notes, host) = (bus.clone(), self.request.host.clone());
        let env = HarnessEnv {
            host: self.request.host.clone(),
            clock: Rc::clone(&clock),
            rng: Rc::clone(&self.rng),
            config,
            note: Rc::new(move |what, detail| {
                notes.send_void(RIG_NOTE, json!({ "host": host, "what": what, "detail": detail }));
            }),
            process: Rc::new(Unmanaged),
            bus: bus.clone(),
        };
        let set = LocalSet::new();
        let late_notes = bus.clone();
        let host = self.request.host.clone();
        let late = move |ms: u64| {
            let detail = json!({ "ms": ms });
            late_notes.send_void(RIG_NOTE, json!({ "host": host, "what": LATE_NOTE, "detail": detail }));
        };
        // Tasks the worker starts by itself (its recovery sweep) belong to this incarnation too.
        let worker = {
            let _inside = set.enter();
            ReferenceHarness.start(policy.name(), env)
        };
        let (jobs, mut incoming) = mpsc::unbounded_channel::<Job>();
        set.spawn_local(drive_clock(clock, late));
        // Whatever it is handed runs in this set, and so do the tasks those start.
        set.spawn_local(async move {
            while let Some(job) = incoming.recv().await {
                tokio::task::spawn_local(job);
            }
        });
        Ok(Incarnation { key, bus, worker, jobs, tasks: tokio::task::spawn_local(set) })
    }
}

/// At most [`CONNECT_MS_MAX`] for one part of connecting.
async fn bounded<T>(what: &str, future: impl Future<Output = T>) -> Result<T, String> {
    tokio::time::timeout(Duration::from_millis(CONNECT_MS_MAX), future)
        .await
        .map_err(|_| format!("{what} took over {CONNECT_MS_MAX} ms"))
}

/// Asks `rig::config` on a fresh connection, before serving anything: which run, which
/// incarnation of the host, and its settings; with `quiet_after_ms`, it tells the rig too.
async fn config(
    socket: &mut Socket,
    host: &str,
    rng: &Rc<RefCell<ChaCha8Rng>>,
    quiet_after_ms: Option<u64>,
) -> Result<Value, String> {
    let invocation_id = uuid(&mut rng.borrow_mut());
    let mut data = json!({ "host": host, "notes": REFERENCE_NOTES });
    if let Some(quiet_after_ms) = quiet_after_ms {
        data["quiet_after_ms"] = json!(quiet_after_ms);
    }
    let ask = Frame::InvokeFunction {
        invocation_id: Some(invocation_id.clone()),
        function_id: RIG_CONFIG.to_string(),
        data,
        action: None,
    };
    let text = serde_json::to_string(&ask).expect("frames serialize");
    socket.send(Message::text(text)).await.map_err(|e| format!("{RIG_CONFIG}: {e}"))?;
    while let Some(message) = socket.next().await {
        let Ok(Message::Text(text)) = message else { continue };
        if let Ok(Frame::InvocationResult { invocation_id: id, result, error, .. }) = Frame::from_wire(&text) {
            if id == invocation_id {
                return match (result, error) {
                    (_, Some(error)) => Err(format!("{RIG_CONFIG}: {}: {}", error.code, error.message)),
                    (Some(result), None) => Ok(result),
                    (None, None) => Err(format!("{RIG_CONFIG} answered nothing")),
                };
            }
        }
    }
    Err(format!("the connection closed before {RIG_CONFIG} answered"))
}

/// Moves the worker's clock with real time, looking every millisecond; each time it wakes later
/// than ever before in this incarnation (by [`LATE_REPORTED_MS_MIN`] or more), it tells the rig
/// (`late`): a process the machine starved acts late, which the rig cannot see from outside.
async fn drive_clock(clock: Rc<Clock>, late: impl Fn(u64)) {
    let started = Instant::now();
    let since = |at: Instant| u64::try_from(at.elapsed().as_millis()).unwrap_or(u64::MAX);
    let mut reported = LATE_REPORTED_MS_MIN.saturating_sub(1);
    loop {
        clock.advance_to(since(started));
        let slept = Instant::now();
        tokio::time::sleep(Duration::from_millis(1)).await;
        let ms = since(slept).saturating_sub(1);
        if ms > reported {
            reported = ms;
            late(ms);
        }
    }
}

/// The note `rig harness` sends `rig::note` when its clock woke late (`detail.ms`): the rig
/// counts it as it counts its own timers' lateness (see `rig/docs/live.md`).
pub const LATE_NOTE: &str = "clock_late";
/// Lateness under this is not reported: scheduling noise on any machine.
const LATE_REPORTED_MS_MIN: u64 = 10;

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
