//! The live network: the engine's listening socket for external workers, in-memory streams for
//! the rig's own hosts, and the routing of every connection by the path it asks for.
//!
//! A worker says which host it is by its request path: `/` is `harness` (so an iii SDK worker
//! pointed at `ws://127.0.0.1:PORT` needs nothing more), `/NAME` is the host `NAME`. The engine
//! names the connection after that host whatever the worker calls itself, so the trace, the
//! oracles and the expectations read the same names as in the simulation. The SDK's telemetry
//! connection (`…/otel`) is accepted and drained, and is no worker. A worker the scenario put
//! behind the drop-proxy is relayed to the engine through the proxy crate's relay code under the
//! scenario's rules, as in the simulation.

use crate::bus::{websocket, BusObserver, Engine, Frame, FrameDirection, WORKERS_REGISTER};
use crate::sim::hosts::{relay_client, Dial, ENGINE_PORT};
use crate::sim::world::World;
use crate::topology::{ENGINE, HARNESS, PROXY};
use crate::trace::Label;
use futures_util::StreamExt;
use serde_json::{json, Value};
use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::rc::Rc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, DuplexStream};
use tokio::sync::mpsc;

/// How long a connecting worker may take to send its opening request.
const HELLO_MS_MAX: u64 = 10_000;
/// The buffer of an in-memory link between two of the rig's own hosts.
const LINK_BYTES: usize = 64 * 1024;

/// The engine currently running, and where in-memory connections to it go in.
struct RunningEngine {
    engine: Rc<Engine>,
    inbox: mpsc::UnboundedSender<DuplexStream>,
}

/// Everything that routes connections to a run's engine.
pub struct Net {
    world: Rc<World>,
    observer: Rc<LiveObserver>,
    listener: std::net::TcpListener,
    engine: RefCell<Option<RunningEngine>>,
    /// Connections the engines of this run have numbered so far (kept across engine restarts).
    numbered: Cell<u64>,
    /// The hosts that may connect: the rig's own (in memory only) and the external harness
    /// hosts (on the listening socket).
    hosts: BTreeSet<String>,
    external: BTreeSet<String>,
    /// The rig's own functions, by the host that serves them: no external worker may register one.
    owners: BTreeMap<String, String>,
    /// The worker the scenario put behind the drop-proxy.
    proxied: Option<String>,
    /// External hosts the script crashed and has not restarted: their reconnections are refused.
    crashed: RefCell<BTreeSet<String>>,
    /// How many times each external host was crashed in this run.
    crashes: RefCell<BTreeMap<String, u64>>,
    relays: Cell<u64>,
    /// With `--spawn`: the key every process of this run has in its URL. A connection from the
    /// network without it is no process of this run's (a worker of an earlier run on this
    /// port, reconnecting) and is refused.
    run_key: RefCell<Option<String>>,
}

/// The query parameter that carries a run's key in the URLs of the processes the rig starts.
pub const RUN_KEY_PARAMETER: &str = "rig-run";

impl Net {
    pub fn new(
        world: Rc<World>,
        listener: std::net::TcpListener,
        hosts: BTreeSet<String>,
        external: BTreeSet<String>,
        owners: BTreeMap<String, String>,
        proxied: Option<String>,
    ) -> Rc<Self> {
        let observer =
            Rc::new(LiveObserver { world: Rc::clone(&world), external: external.clone(), open: RefCell::default() });
        Rc::new(Self {
            world,
            observer,
            listener,
            engine: RefCell::default(),
            numbered: Cell::new(0),
            hosts,
            external,
            owners,
            proxied,
            crashed: RefCell::default(),
            crashes: RefCell::default(),
            relays: Cell::new(0),
            run_key: RefCell::default(),
        })
    }

    /// Only processes whose URL carries `key` may connect from the network from now on.
    pub fn require_key(&self, key: &str) {
        *self.run_key.borrow_mut() = Some(key.to_string());
    }

    /// Why a connection from the network asking for `target` (path and query) is not one of this
    /// run's processes, when the run's processes are the rig's.
    fn stranger(&self, target: &str) -> Option<String> {
        let key = self.run_key.borrow();
        let key = key.as_deref()?;
        let query = target.split_once('?').map_or("", |(_, query)| query);
        let carries = query.split('&').any(|pair| pair == format!("{RUN_KEY_PARAMETER}={key}"));
        (!carries).then(|| {
            format!(
                "refused a connection at `{target}`: not a process this run started (its URL lacks this run's \
                 {RUN_KEY_PARAMETER} key; a worker of an earlier run on this port?)"
            )
        })
    }

    /// The host a worker dials: the proxy when the scenario put it behind one.
    pub fn dials(&self, host: &str) -> &'static str {
        if self.proxied.as_deref() == Some(host) {
            PROXY
        } else {
            ENGINE
        }
    }

    /// An external host is crashed: its connections drop and its reconnections are refused.
    pub fn crash_external(&self, host: &str) {
        self.crashed.borrow_mut().insert(host.to_string());
        *self.crashes.borrow_mut().entry(host.to_string()).or_default() += 1;
        self.world.sever(self.dials(host), host);
    }

    /// How many invocations the running engine has routed and not seen answered.
    pub fn invocations_pending(&self) -> usize {
        self.current_engine().map_or(0, |engine| engine.invocations_pending())
    }

    /// Whether an external worker of `host` has a connection to the engine open now.
    pub fn connected(&self, host: &str) -> bool {
        self.observer.open.borrow().get(host).is_some_and(|open| *open > 0)
    }

    /// How many times the script crashed `host` so far.
    pub fn crashes(&self, host: &str) -> u64 {
        self.crashes.borrow().get(host).copied().unwrap_or(0)
    }

    pub fn restart_external(&self, host: &str) {
        self.crashed.borrow_mut().remove(host);
        self.world.mend(self.dials(host), host);
    }

    /// The engine is gone (its host crashed): in-memory connections are refused until it is back.
    pub fn engine_stopped(&self) {
        if let Some(running) = self.engine.borrow_mut().take() {
            self.numbered.set(running.engine.connections_numbered());
        }
    }

    fn current_engine(&self) -> Option<Rc<Engine>> {
        self.engine.borrow().as_ref().map(|running| Rc::clone(&running.engine))
    }

    /// Which host a request path names, or why none. A connection from the network can only
    /// be an external harness host: the rig's own hosts connect in memory, and a worker that
    /// asked for `/store` would otherwise be served under the store's name.
    fn host_for(&self, path: &str, from_network: bool) -> Result<String, String> {
        let name = path.trim_matches('/');
        let name = if name.is_empty() { HARNESS } else { name };
        let hosts = if from_network { &self.external } else { &self.hosts };
        if hosts.contains(name) {
            return Ok(name.to_string());
        }
        let external: Vec<&str> = self.external.iter().map(String::as_str).collect();
        Err(format!(
            "rig live: no worker host `{name}` in this run; connect at / (the `harness` host) or at /HOST for one of: {}",
            external.join(", ")
        ))
    }

    /// Why a connection of `host` is refused now, if it is.
    fn refusal(&self, host: &str) -> Option<String> {
        if self.crashed.borrow().contains(host) {
            return Some(format!("rig live: `{host}` is crashed in this run (a `crash` step) until it is restarted"));
        }
        let target = self.dials(host);
        self.world.is_cut(target, host).then(|| {
            format!("rig live: the link between `{host}` and `{target}` is cut in this run (a `partition` step)")
        })
    }
}

/// How the rig's own hosts reach the engine: an in-memory stream into its accept loop, at the
/// path naming the host.
#[derive(Clone)]
pub struct InMemory(pub Rc<Net>);

impl Dial for InMemory {
    type Stream = DuplexStream;

    fn open(&self, _target: &str) -> impl Future<Output = std::io::Result<DuplexStream>> {
        let (near, far) = tokio::io::duplex(LINK_BYTES);
        let sent = self.0.engine.borrow().as_ref().is_some_and(|running| running.inbox.send(far).is_ok());
        async move {
            if sent {
                Ok(near)
            } else {
                Err(std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "the engine is not running"))
            }
        }
    }

    fn path(&self, name: &str) -> String {
        format!("/{name}")
    }
}

/// The engine host: a fresh engine, the listening socket for external workers and the inbox of
/// in-memory connections, each connection served on its own task until the host is crashed.
pub async fn engine_host(net: Rc<Net>) {
    let engine = Engine::numbered_after(Rc::clone(&net.observer) as Rc<dyn BusObserver>, net.numbered.get());
    engine.reserve(net.owners.clone());
    let (inbox, mut incoming) = mpsc::unbounded_channel();
    *net.engine.borrow_mut() = Some(RunningEngine { engine, inbox });
    let listener = match net.listener.try_clone().and_then(tokio::net::TcpListener::from_std) {
        Ok(listener) => listener,
        Err(error) => {
            net.world.note_event(ENGINE, "listener_failed", json!({ "error": error.to_string() }));
            return;
        }
    };
    loop {
        tokio::select! {
            biased;
            Some(stream) = incoming.recv() => {
                tokio::task::spawn_local(connection(Rc::clone(&net), stream, false));
            }
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    let _ = stream.set_nodelay(true);
                    tokio::task::spawn_local(connection(Rc::clone(&net), stream, true));
                }
                // Out of descriptors, or a connection reset before it was taken: try again shortly.
                Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            },
        }
    }
}

/// One connection, from its opening request to its end; `from_network` for one accepted on the
/// listening socket.
async fn connection<S: AsyncRead + AsyncWrite + Unpin + 'static>(net: Rc<Net>, mut stream: S, from_network: bool) {
    let hello = tokio::time::timeout(Duration::from_millis(HELLO_MS_MAX), proxy::read_hello_or_reject(&mut stream));
    let Ok(Ok(hello)) = hello.await else { return };
    let path = hello.path.split('?').next().unwrap_or("/").to_string();
    if path.ends_with("/otel") {
        return drain_telemetry(stream, hello).await;
    }
    if let Some(why) = net.stranger(&hello.path).filter(|_| from_network) {
        net.observer.refused("?", &why);
        return drop(proxy::reject_client(&mut stream, 403, &format!("rig live: {why}")).await);
    }
    let host = match net.host_for(&path, from_network) {
        Ok(host) => host,
        Err(why) => return drop(proxy::reject_client(&mut stream, 404, &why).await),
    };
    if let Some(why) = net.refusal(&host) {
        return drop(proxy::reject_client(&mut stream, 503, &why).await);
    }
    if net.dials(&host) == PROXY {
        return relay(net, stream, hello, host).await;
    }
    let Some(engine) = net.current_engine() else { return };
    let Ok(socket) = proxy::accept_client(stream, hello, &proxy::UpstreamAnswer::default(), websocket::config()).await
    else {
        return;
    };
    let severed = net.world.open_link(ENGINE, &host);
    engine.serve_named(socket, Some(host), async move { severed.notified().await }).await;
}

/// A worker behind the drop-proxy: relayed to the engine under the scenario's rules, through an
/// in-memory upstream the engine serves under the worker's host name.
async fn relay<S: AsyncRead + AsyncWrite + Unpin + 'static>(
    net: Rc<Net>,
    client: S,
    hello: proxy::ClientHello,
    host: String,
) {
    let world = Rc::clone(&net.world);
    let Some(rules) = world.proxy_rules.borrow().clone() else { return };
    if world.is_cut(PROXY, ENGINE) {
        return;
    }
    let client_cut = world.open_link(PROXY, &host);
    let connection = net.relays.get() + 1;
    net.relays.set(connection);
    let key = websocket::handshake_key(&mut world.stream("proxy/handshake").borrow_mut());
    let upstream = proxy::UpstreamUrl::parse(&format!("ws://{ENGINE}:{ENGINE_PORT}/")).expect("a valid url");
    let engine_world = Rc::clone(&world);
    let connect = move |_authority: String| async move {
        let engine = net
            .current_engine()
            .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "the engine is not running"))?;
        let (near, far) = tokio::io::duplex(LINK_BYTES);
        tokio::task::spawn_local(async move {
            if let Ok(socket) = websocket::accept(far).await {
                let severed = engine_world.open_link(ENGINE, PROXY);
                engine.serve_named(socket, Some(host), async move { severed.notified().await }).await;
            }
        });
        Ok(near)
    };
    relay_client(&world, rules, client, hello, &upstream, key, connect, client_cut, connection).await;
}

/// The iii SDK's telemetry connection: accepted, read until it closes, and dropped.
async fn drain_telemetry<S: AsyncRead + AsyncWrite + Unpin>(stream: S, hello: proxy::ClientHello) {
    let answer = proxy::UpstreamAnswer::default();
    if let Ok(mut socket) = proxy::accept_client(stream, hello, &answer, websocket::config()).await {
        while let Some(Ok(_)) = socket.next().await {}
    }
}

/// The engine's observer live: the world's trace, plus what the simulation has no need to say:
/// when an external worker connects, names itself and disconnects, and why.
struct LiveObserver {
    world: Rc<World>,
    external: BTreeSet<String>,
    /// The connections each external host has open.
    open: RefCell<BTreeMap<String, u64>>,
}

impl BusObserver for LiveObserver {
    fn frame(&self, direction: FrameDirection, peer: &Label, frame: &Frame) {
        BusObserver::frame(&*self.world, direction, peer, frame);
        if let (FrameDirection::In, Frame::InvokeFunction { function_id, data, .. }) = (direction, frame) {
            if function_id == WORKERS_REGISTER && self.external.contains(peer.as_str()) {
                let field = |name: &str| data.get(name).cloned().unwrap_or(Value::Null);
                let detail = json!({ "peer": peer, "name": field("name"), "runtime": field("runtime"), "version": field("version") });
                self.world.note_event(ENGINE, "worker_named", detail);
            }
        }
    }

    fn note(&self, host: &str, what: &str, detail: Value) {
        self.world.note_event(host, what, detail);
    }

    fn connected(&self, peer: &str, worker_id: &str) {
        if self.external.contains(peer) {
            *self.open.borrow_mut().entry(peer.to_string()).or_default() += 1;
            self.world.note_event(ENGINE, "worker_connected", json!({ "peer": peer, "worker_id": worker_id }));
        }
    }

    fn disconnected(&self, peer: &str, why: &str) {
        if self.external.contains(peer) {
            if let Some(open) = self.open.borrow_mut().get_mut(peer) {
                *open = open.saturating_sub(1);
            }
            self.world.note_event(ENGINE, "worker_disconnected", json!({ "peer": peer, "why": why }));
        }
    }

    /// In the trace, and said at once on stderr: a worker that tries this is worth knowing about
    /// while the run goes on.
    fn refused(&self, peer: &str, why: &str) {
        self.world.note_event(ENGINE, "refused", json!({ "peer": peer, "why": why }));
        eprintln!("rig live: {why}");
    }
}
