//! Real mode: the proxy on TCP sockets, with a JSONL log and the admin endpoint.
//!
//! Everything runs on one thread (a tokio `LocalSet`): connections share the rule set through
//! `Rc<RefCell<_>>` exactly as they do in the simulation, and one core is plenty for a proxy
//! that mostly waits on its peers.

use crate::admin::{serve_admin, AdminState};
use crate::handshake::{answer_hello, read_hello_or_reject, reject_client, UpstreamUrl};
use crate::log::Log;
use crate::relay::{relay, FrameRecord, ProxyEnv, RelayEnd, SharedRules};
use crate::rule::{load_rules_file, Rule, RuleSet};
use rand::RngCore;
use rand_chacha::rand_core::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde_json::{json, Value};
use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::future::Future;
use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::rc::Rc;
use std::time::{Duration, Instant};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::{watch, Notify};
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::WebSocketStream;

use crate::wire::Wire;

/// How often the log is flushed while frames flow (and at each connection's end).
const LOG_FLUSH_INTERVAL: Duration = Duration::from_millis(200);
/// tungstenite's read buffer, allocated with each WebSocket: kept small so an idle
/// connection holds little; the socket itself is read in larger chunks (see `Wire`).
pub const READ_BUFFER_BYTES: usize = 4 * 1024;
/// How much tungstenite queues before writing to the socket (the relay also writes whenever
/// its source has nothing more ready). The buffer keeps its size once grown.
pub const WRITE_BUFFER_BYTES: usize = 32 * 1024;
/// How long, after the last connection ends at shutdown, the proxy waits at most.
const SHUTDOWN_WAIT: Duration = Duration::from_millis(crate::relay::CLOSE_GRACE_MS + 2_000);

/// The WebSocket settings of both sides of every connection for a largest message size.
///
/// The write buffer may hold one whole message beyond the write threshold: the relay waits
/// for it to drain before it reads the next message (see `relay`), so that is all a peer
/// that stops reading makes the proxy hold.
pub fn websocket_config(max_frame_bytes: usize) -> WebSocketConfig {
    WebSocketConfig::default()
        .read_buffer_size(READ_BUFFER_BYTES)
        .write_buffer_size(WRITE_BUFFER_BYTES)
        // A frame's header is at most 14 bytes; control frames the library adds are tiny.
        .max_write_buffer_size(WRITE_BUFFER_BYTES.saturating_add(max_frame_bytes).saturating_add(1024))
        .max_message_size(Some(max_frame_bytes))
        .max_frame_size(Some(max_frame_bytes))
}

/// The proxy's command line; `rig proxy` mounts the same arguments.
#[derive(Clone, Debug, clap::Args)]
pub struct ProxyArgs {
    /// Address to accept WebSocket clients on (port 0 picks a free port; it is printed).
    #[arg(long, default_value = "127.0.0.1:0")]
    pub listen: SocketAddr,
    /// The server every client is connected to: ws://HOST:PORT[/PREFIX].
    #[arg(long)]
    pub upstream: String,
    /// A rule: `ACTION [COUNT] [DIRECTION] [KIND] [p=P] [--] [PATH=VALUE]...`; repeatable, first match wins.
    #[arg(long = "rule", value_name = "RULE")]
    pub rules: Vec<String>,
    /// A TOML file of `[[rule]]` tables, matched after the --rule rules.
    #[arg(long = "rules", value_name = "FILE")]
    pub rules_file: Option<PathBuf>,
    /// Write one JSON line per frame and connection event to this file.
    #[arg(long, value_name = "FILE.jsonl")]
    pub log: Option<PathBuf>,
    /// Include frame payloads in the log (text as is, binary as base64).
    #[arg(long)]
    pub log_payloads: bool,
    /// Serve the admin API on this loopback address.
    #[arg(long, value_name = "ADDR")]
    pub admin: Option<SocketAddr>,
    /// The proxy's name in the admin API.
    #[arg(long, default_value = "default")]
    pub name: String,
    /// Seed of the generator for rule probabilities and upstream handshake keys.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Largest message (and frame) accepted from either peer, in bytes.
    #[arg(long, default_value_t = 16 * 1024 * 1024)]
    pub max_frame_bytes: usize,
    /// Most WebSocket connections at once; a client whose request arrives beyond it is answered 503.
    #[arg(long, default_value_t = 256)]
    pub max_connections: usize,
    /// Most clients whose request is still being read at once; beyond it, the one that has been
    /// at it longest gives up its place (it is answered 503).
    #[arg(long, default_value_t = 4096)]
    pub max_handshakes: usize,
    /// How long a client has to send its request, and then the upstream to answer it, in ms.
    #[arg(long, default_value_t = 5_000)]
    pub handshake_timeout_ms: u64,
}

/// Why the proxy could not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The arguments, a rule or the rules file are wrong: exit code 2.
    #[error("{0}")]
    Input(String),
    /// Something outside the input failed (binding, creating or writing the log): exit code 1.
    #[error("{0}")]
    Io(String),
}

impl ServeError {
    /// The process exit code for this error: 2 for bad input, 1 otherwise.
    pub fn exit_code(&self) -> i32 {
        match self {
            ServeError::Input(_) => 2,
            ServeError::Io(_) => 1,
        }
    }
}

/// Real mode's environment: tokio time, the JSONL log if there is one, and the stop signal.
struct RealEnv {
    start: Instant,
    log: Option<Rc<Log>>,
    stop: watch::Receiver<bool>,
}

impl ProxyEnv for RealEnv {
    fn now_us(&self) -> u64 {
        self.start.elapsed().as_micros() as u64
    }

    fn sleep(&self, ms: u64) -> Pin<Box<dyn Future<Output = ()> + '_>> {
        Box::pin(tokio::time::sleep(Duration::from_millis(ms)))
    }

    fn records(&self) -> bool {
        self.log.is_some()
    }

    fn record(&self, record: &FrameRecord<'_>) {
        if let Some(log) = &self.log {
            log.frame(record);
        }
    }

    fn stopping(&self) -> Pin<Box<dyn Future<Output = ()> + '_>> {
        let mut stop = self.stop.clone();
        Box::pin(async move {
            let _ = stop.wait_for(|stopping| *stopping).await;
        })
    }
}

impl RealEnv {
    fn log(&self, value: Value) {
        if let Some(log) = &self.log {
            log.event(value);
        }
    }
}

/// The first failure of a listener's `accept` is reported, the next ones of the same run are
/// not; each is followed by a pause, so running out of file descriptors does not spin.
pub(crate) struct AcceptFailures {
    listener: &'static str,
    failing: bool,
}

impl AcceptFailures {
    pub(crate) fn new(listener: &'static str) -> Self {
        AcceptFailures { listener, failing: false }
    }

    /// Reports `error` if it starts a run of failures (to stderr and through `log`), then waits.
    pub(crate) async fn failed(&mut self, error: &std::io::Error, log: impl FnOnce(Value)) {
        if !self.failing {
            self.failing = true;
            eprintln!("proxy: {}: accept failed: {error}; retrying every 100 ms, quietly", self.listener);
            log(json!({"event": "accept_error", "listener": self.listener, "error": error.to_string()}));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    pub(crate) fn succeeded(&mut self) {
        if std::mem::take(&mut self.failing) {
            eprintln!("proxy: {}: new connections come through again", self.listener);
        }
    }
}

/// A bound proxy, ready to run: addresses are known before any client arrives.
pub struct Proxy {
    args: ProxyArgs,
    upstream: UpstreamUrl,
    listener: TcpListener,
    admin: Option<TcpListener>,
    rules: SharedRules,
    log: Option<Rc<Log>>,
}

/// Reads the rules of the command line, then those of the rules file.
pub fn rules_from_args(args: &ProxyArgs) -> Result<Vec<Rule>, ServeError> {
    let mut rules = args
        .rules
        .iter()
        .map(|text| Rule::parse(text))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| ServeError::Input(format!("--rule: {e}")))?;
    if let Some(path) = &args.rules_file {
        rules.extend(load_rules_file(path).map_err(|e| ServeError::Input(format!("--rules: {e}")))?);
    }
    Ok(rules)
}

impl Proxy {
    /// Checks the arguments, reads the rules, binds the sockets and opens the log.
    pub async fn bind(args: ProxyArgs) -> Result<Proxy, ServeError> {
        let upstream = UpstreamUrl::parse(&args.upstream).map_err(|e| ServeError::Input(format!("--upstream: {e}")))?;
        // Only a rules file names rules, so a name taken twice is the file's doing.
        let rules = RuleSet::with_rules(args.seed, rules_from_args(&args)?).map_err(|e| match &args.rules_file {
            Some(path) => ServeError::Input(format!("--rules {}: {e}", path.display())),
            None => ServeError::Input(e.to_string()),
        })?;
        if let Some(admin) = args.admin {
            if !admin.ip().is_loopback() {
                return Err(ServeError::Input(format!(
                    "--admin {admin}: the admin API changes the proxy's behaviour, so it binds loopback addresses only"
                )));
            }
        }
        if args.max_frame_bytes == 0 || args.max_connections == 0 || args.max_handshakes == 0 {
            return Err(ServeError::Input(
                "--max-frame-bytes, --max-connections and --max-handshakes must be positive".into(),
            ));
        }
        if args.handshake_timeout_ms == 0 || args.handshake_timeout_ms > 600_000 {
            return Err(ServeError::Input(format!(
                "--handshake-timeout-ms {}: expected 1 to 600000",
                args.handshake_timeout_ms
            )));
        }
        if args.name.is_empty() || args.name.contains(['/', '?', '#', ' ']) {
            return Err(ServeError::Input(format!(
                "--name `{}`: expected a name without `/`, `?`, `#` or spaces",
                args.name
            )));
        }
        let listener =
            listen(args.listen).map_err(|e| ServeError::Io(format!("binding --listen {}: {e}", args.listen)))?;
        let admin = match args.admin {
            Some(addr) => Some(listen(addr).map_err(|e| ServeError::Io(format!("binding --admin {addr}: {e}")))?),
            None => None,
        };
        let log = match &args.log {
            Some(path) => Some(Rc::new(
                Log::create(path, args.log_payloads)
                    .map_err(|e| ServeError::Io(format!("--log {}: {e}", path.display())))?,
            )),
            None => None,
        };
        Ok(Proxy { args, upstream, listener, admin, rules: Rc::new(RefCell::new(rules)), log })
    }

    /// Where clients connect.
    pub fn listen_addr(&self) -> SocketAddr {
        self.listener.local_addr().unwrap_or(self.args.listen)
    }

    /// Where the admin API answers, if it is on.
    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin.as_ref().and_then(|a| a.local_addr().ok())
    }

    /// The shared rules, for an embedding program that changes them directly.
    pub fn rules(&self) -> SharedRules {
        self.rules.clone()
    }

    /// Serves clients until ctrl-c or SIGTERM, then closes every connection with `1001`.
    /// Must run inside a `LocalSet`.
    pub async fn run(self) -> Result<(), ServeError> {
        let start = self.log.as_ref().map_or_else(Instant::now, |l| l.start());
        let (stop, stop_signal) = watch::channel(false);
        let env = Rc::new(RealEnv { start, log: self.log.clone(), stop: stop_signal });
        if let Some(log) = &self.log {
            log.event(json!({
                "event": "start", "listen": self.listen_addr().to_string(), "upstream": self.upstream.to_string(),
                "seed": self.args.seed, "rules": self.rules.borrow().rules(),
            }));
            let log = log.clone();
            tokio::task::spawn_local(async move {
                let mut tick = tokio::time::interval(LOG_FLUSH_INTERVAL);
                loop {
                    tick.tick().await;
                    log.flush();
                }
            });
        }
        if let Some(admin) = self.admin {
            let log = self.log.clone();
            let state = Rc::new(AdminState {
                name: self.args.name.clone(),
                listen: self.listener.local_addr().map(|a| a.to_string()).unwrap_or_default(),
                upstream: self.upstream.to_string(),
                rules: self.rules.clone(),
                on_change: Box::new(move |change: &Value| {
                    if let Some(log) = &log {
                        log.event(change.clone());
                    }
                }),
            });
            tokio::task::spawn_local(serve_admin(admin, state));
        }
        let limits = Rc::new(Limits {
            config: websocket_config(self.args.max_frame_bytes),
            handshake_timeout: Duration::from_millis(self.args.handshake_timeout_ms),
            max_connections: self.args.max_connections,
            max_handshakes: self.args.max_handshakes,
            connections: Cell::new(0),
            reading: RefCell::default(),
            reading_cap: Cell::new(self.args.max_handshakes),
            changed: Notify::new(),
        });
        // Upstream handshake keys come from their own stream of the seeded generator, so they
        // do not shift the probability draws of the rules.
        let mut keys = ChaCha8Rng::seed_from_u64(self.args.seed);
        keys.set_stream(1);
        let mut next_conn = 0u64;
        let mut failures = AcceptFailures::new("clients");
        let log = self.log.clone();
        // A log that can no longer be written stops the proxy as a signal would, and says why.
        let shutdown = async move {
            match &log {
                Some(log) => tokio::select! {
                    biased;
                    () = shutdown_signal() => None,
                    why = log.failed() => Some(why),
                },
                None => {
                    shutdown_signal().await;
                    None
                }
            }
        };
        tokio::pin!(shutdown);
        // Accepting never waits for the handshake budget: a real client queued in the kernel behind
        // sockets that say nothing is reached as fast as they can be accepted, not a budget's worth
        // per deadline.
        let stopped_by = loop {
            let accepted = tokio::select! {
                biased;
                why = &mut shutdown => break why,
                accepted = self.listener.accept() => accepted,
            };
            let (stream, peer) = match accepted {
                Ok(accepted) => {
                    failures.succeeded();
                    accepted
                }
                // Out of descriptors, perhaps to sockets that say nothing: the longest waiting of
                // them give theirs back (their tasks run, answer and close, while this one yields).
                Err(e) if out_of_descriptors(&e) && limits.shed_for_descriptors() => {
                    tokio::task::yield_now().await;
                    continue;
                }
                Err(e) => {
                    failures.failed(&e, |event| env.log(event)).await;
                    continue;
                }
            };
            limits.make_room();
            next_conn += 1;
            let _ = stream.set_nodelay(true);
            let mut key = [0u8; 16];
            keys.fill_bytes(&mut key);
            let place = limits.start_reading(next_conn);
            let connection = Connection { conn: next_conn, peer, key, place, limits: limits.clone(), env: env.clone() };
            let (rules, upstream) = (self.rules.clone(), self.upstream.clone());
            tokio::task::spawn_local(async move { connection.serve(stream, &upstream, rules).await });
        };
        // Every relay sees the signal, closes both peers with 1001 and logs its end.
        let _ = stop.send(true);
        let _ = tokio::time::timeout(SHUTDOWN_WAIT, async {
            while limits.connections.get() > 0 {
                limits.changed.notified().await;
            }
        })
        .await;
        if let Some(log) = &self.log {
            log.event(json!({"event": "stop"}));
            log.close();
        }
        match stopped_by {
            None => Ok(()),
            Some(why) => Err(ServeError::Io(format!("{why}; stopped rather than go on without the log"))),
        }
    }
}

/// The most a listen backlog can be: the kernel caps the value `listen` is given at its own
/// maximum (`net.core.somaxconn` on Linux, `kern.ipc.somaxconn` on BSD and macOS), so asking for
/// the largest `int` gets the system's backlog, not the standard library's 128.
const SYSTEM_BACKLOG: u32 = i32::MAX as u32;

/// A listening socket with the system's backlog, so a burst of connections waits in the kernel
/// for the accept loop instead of being dropped.
fn listen(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() { TcpSocket::new_v4()? } else { TcpSocket::new_v6()? };
    #[cfg(unix)]
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(SYSTEM_BACKLOG)
}

/// What every connection of one proxy shares: its settings and its counts.
struct Limits {
    config: WebSocketConfig,
    handshake_timeout: Duration,
    max_connections: usize,
    max_handshakes: usize,
    /// Clients whose request was read and that hold a WebSocket slot.
    connections: Cell<usize>,
    /// Clients whose request is still being read, oldest first, each with its place.
    reading: RefCell<BTreeMap<u64, Rc<Place>>>,
    /// How many may be reading at once: `max_handshakes`, or fewer since the descriptors ran out.
    reading_cap: Cell<usize>,
    /// Told whenever a count goes down.
    changed: Notify,
}

/// Why a client still sending its request was told to give up its place.
#[derive(Clone, Copy)]
enum Shed {
    /// `--max-handshakes` clients were sending theirs, and a newer one came.
    Budget,
    /// The proxy ran out of file descriptors.
    Descriptors,
}

/// A client's place among those sending their request: what tells it to give the place up.
#[derive(Default)]
struct Place {
    shed: Cell<Option<Shed>>,
    told: Notify,
}

impl Place {
    /// Waits until the client is told to give up its place; why.
    async fn given_up(&self) -> Shed {
        loop {
            if let Some(why) = self.shed.get() {
                return why;
            }
            self.told.notified().await;
        }
    }
}

/// Whether `accept` failed for want of file descriptors (`EMFILE`, `ENFILE`: the same numbers
/// on Linux, the BSDs and macOS).
fn out_of_descriptors(error: &std::io::Error) -> bool {
    cfg!(unix) && matches!(error.raw_os_error(), Some(23 | 24))
}

impl Limits {
    fn release(&self, count: &Cell<usize>) {
        count.set(count.get() - 1);
        self.changed.notify_waiters();
        self.changed.notify_one();
    }

    /// Room for one more client to send its request: at the budget, the client that has been
    /// at it longest gives up its place. So sockets that say nothing hold their places only
    /// until newer clients need them, however many there are, and a real client is not kept
    /// waiting for their deadlines.
    fn make_room(&self) {
        // The cap is at least 1, so a full table has a client to shed.
        while self.reading_count() >= self.reading_cap.get() {
            self.shed_oldest(Shed::Budget);
        }
    }

    fn reading_count(&self) -> usize {
        self.reading.borrow().len()
    }

    /// Tells the client that has been sending its request longest to give up its place; false
    /// if no client is sending one.
    fn shed_oldest(&self, why: Shed) -> bool {
        let Some((_, place)) = self.reading.borrow_mut().pop_first() else { return false };
        place.shed.set(Some(why));
        place.told.notify_one();
        true
    }

    /// The descriptors ran out: the older half of the clients sending their request give up
    /// their places, and until none is left sending, only as many as remain may be at once, so
    /// the descriptors freed stay free for the clients that do send a request, and for their
    /// upstreams. False if no client is sending one (the descriptors are the relays').
    fn shed_for_descriptors(&self) -> bool {
        let reading = self.reading_count();
        self.reading_cap.set((reading / 2).max(1));
        for _ in 0..reading - reading / 2 {
            self.shed_oldest(Shed::Descriptors);
        }
        reading > 0
    }

    /// Client `conn` starts sending its request; its place. A first client after all others
    /// are done has the whole budget again.
    fn start_reading(&self, conn: u64) -> Rc<Place> {
        let place = Rc::new(Place::default());
        let mut reading = self.reading.borrow_mut();
        if reading.is_empty() {
            self.reading_cap.set(self.max_handshakes);
        }
        reading.insert(conn, Rc::clone(&place));
        place
    }

    fn done_reading(&self, conn: u64) {
        self.reading.borrow_mut().remove(&conn);
    }
}

/// One accepted client, from its handshake to the end of its relay.
struct Connection {
    conn: u64,
    peer: SocketAddr,
    key: [u8; 16],
    /// Its place among the clients still sending their request, which newer ones may need.
    place: Rc<Place>,
    limits: Rc<Limits>,
    env: Rc<RealEnv>,
}

impl Connection {
    async fn serve(self, stream: TcpStream, upstream: &UpstreamUrl, rules: SharedRules) {
        let opened = self.handshake(stream, upstream).await;
        let Some((client, upstream_ws)) = opened else { return };
        // Boxed, as the opening is: a task is as large as its largest state, and a client that
        // has not sent its request yet should hold only what reading it takes.
        let end: RelayEnd = Box::pin(relay(client, upstream_ws, rules, self.conn, &*self.env)).await;
        let mut line = serde_json::to_value(&end).unwrap_or(Value::Null);
        if let Value::Object(map) = &mut line {
            map.insert("event".into(), json!("end"));
            map.insert("conn".into(), json!(self.conn));
        }
        self.env.log(line);
        if let Some(log) = &self.env.log {
            log.flush();
        }
        self.limits.release(&self.limits.connections);
    }

    fn error(&self, event: &str, error: &str) {
        eprintln!("proxy: conn {} from {}: {error}", self.conn, self.peer);
        self.env.log(json!({"event": event, "conn": self.conn, "peer": self.peer.to_string(), "error": error}));
    }

    /// Both handshakes: the client's request within the deadline (or until newer clients need its
    /// place), then [`Self::open`]; on success the connection holds a WebSocket slot.
    async fn handshake(
        &self,
        mut stream: TcpStream,
        upstream: &UpstreamUrl,
    ) -> Option<(WebSocketStream<Wire<TcpStream>>, WebSocketStream<Wire<TcpStream>>)> {
        let limits = &*self.limits;
        let ms = limits.handshake_timeout.as_millis() as u64;
        let read = tokio::select! {
            biased;
            why = self.place.given_up() => Err(why),
            read = tokio::time::timeout(limits.handshake_timeout, read_hello_or_reject(&mut stream)) => Ok(read),
        };
        limits.done_reading(self.conn);
        let (status, error) = match read {
            Ok(Ok(Ok(hello))) => return Box::pin(self.open(stream, hello, upstream)).await,
            Ok(Ok(Err(error))) => {
                self.error("handshake_error", &error.to_string());
                return None;
            }
            Ok(Err(_)) => (408, format!("no complete request within {ms} ms")),
            Err(Shed::Budget) => (
                503,
                format!(
                    "more than {} clients sending their request at once, and this one had waited longest",
                    limits.reading_cap.get()
                ),
            ),
            Err(Shed::Descriptors) => {
                (503, "out of file descriptors, and this one had waited longest to send its request".to_string())
            }
        };
        let _ = tokio::time::timeout(
            Duration::from_secs(1),
            reject_client(&mut stream, status, &format!("proxy: {error}")),
        )
        .await;
        self.error("handshake_error", &error);
        None
    }

    /// The rest of the opening, once the client's request is read: a WebSocket slot, then the
    /// upstream's handshake and the client's answer.
    async fn open(
        &self,
        mut stream: TcpStream,
        hello: crate::handshake::ClientHello,
        upstream: &UpstreamUrl,
    ) -> Option<(WebSocketStream<Wire<TcpStream>>, WebSocketStream<Wire<TcpStream>>)> {
        let limits = &*self.limits;
        let ms = limits.handshake_timeout.as_millis() as u64;
        if limits.connections.get() >= limits.max_connections {
            let message = format!("proxy: more than {} clients at once", limits.max_connections);
            self.env
                .log(json!({"event": "rejected", "conn": self.conn, "peer": self.peer.to_string(), "error": message}));
            let _ = tokio::time::timeout(Duration::from_secs(1), reject_client(&mut stream, 503, &message)).await;
            return None;
        }
        limits.connections.set(limits.connections.get() + 1);
        let connect = |authority: String| async move {
            let stream = TcpStream::connect(authority).await?;
            let _ = stream.set_nodelay(true);
            Ok(stream)
        };
        let deadline = (tokio::time::sleep(limits.handshake_timeout), ms);
        match answer_hello(stream, hello, upstream, self.key, limits.config, connect, deadline).await {
            Ok((client, upstream_ws, hello)) => {
                self.env.log(json!({
                    "event": "open", "conn": self.conn, "peer": self.peer.to_string(), "path": hello.path,
                    "protocols": hello.protocols,
                }));
                Some((client, upstream_ws))
            }
            Err(error) => {
                let event = if error.is_upstream() { "upstream_error" } else { "handshake_error" };
                self.error(event, &error.to_string());
                limits.release(&limits.connections);
                None
            }
        }
    }
}

async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    biased;
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// Runs the proxy until ctrl-c or SIGTERM, printing the bound addresses first.
///
/// The returned future is not `Send` (connections share rules through `Rc`): await it from
/// `main` (`#[tokio::main(flavor = "current_thread")]` or any `block_on`), not from `tokio::spawn`.
pub async fn serve(args: ProxyArgs) -> Result<(), ServeError> {
    let local = tokio::task::LocalSet::new();
    local
        .run_until(async move {
            let proxy = Proxy::bind(args).await?;
            // One line per address, printed and flushed before the first client is accepted,
            // so a script that asked for port 0 can read where to connect.
            let mut lines = format!("proxy listening on {}\n", proxy.listen_addr());
            if let Some(admin) = proxy.admin_addr() {
                lines.push_str(&format!("admin listening on {admin}\n"));
            }
            // A script reads where to connect here: if it cannot be said, the proxy is no use.
            let mut stdout = std::io::stdout();
            stdout
                .write_all(lines.as_bytes())
                .and_then(|()| stdout.flush())
                .map_err(|e| ServeError::Io(format!("cannot write the listening address to standard output: {e}")))?;
            proxy.run().await
        })
        .await
}

/// Runs the proxy on a fresh single-threaded runtime until it stops; returns the process exit
/// code (0, 1 for an I/O failure, 2 for bad input). What the `proxy` binary and `rig proxy` run.
pub fn run(args: ProxyArgs) -> i32 {
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("proxy: cannot start the runtime: {e}");
            return 1;
        }
    };
    match runtime.block_on(serve(args)) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("proxy: {e}");
            e.exit_code()
        }
    }
}
