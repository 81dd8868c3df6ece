//! Real mode: the proxy on TCP sockets, with a JSONL log and the admin endpoint.
//!
//! Everything runs on one thread (a tokio `LocalSet`): connections share the rule set through
//! `Rc<RefCell<_>>` exactly as they do in the simulation, and one core is plenty for a proxy
//! that mostly waits on its peers.

use crate::admin::{serve_admin, AdminState};
use crate::handshake::{handshake, HandshakeError, UpstreamUrl};
use crate::relay::{relay, FrameRecord, ProxyEnv, RelayEnd, SharedRules};
use crate::rule::{load_rules_file, Rule, RuleSet};
use rand::RngCore;
use rand_chacha::rand_core::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde_json::{json, Value};
use std::cell::{Cell, RefCell};
use std::fs::File;
use std::future::Future;
use std::io::{BufWriter, Write};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::rc::Rc;
use std::time::{Duration, Instant};
use tokio::io::BufReader;
use tokio::net::{TcpListener, TcpStream};
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::Message;

/// How long a client has to finish both opening handshakes.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Read buffer in front of each socket. tungstenite asks the stream for little more than the
/// frame it is parsing, so without it the proxy makes about one `recv` per frame per side.
const SOCKET_READ_BUFFER: usize = 64 * 1024;
/// How often the log is flushed while frames flow (and at each connection's end).
const LOG_FLUSH_INTERVAL: Duration = Duration::from_millis(200);

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
    /// Most clients served at once; more are answered 503.
    #[arg(long, default_value_t = 256)]
    pub max_connections: usize,
}

/// Why the proxy could not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The arguments, a rule or the rules file are wrong: exit code 2.
    #[error("{0}")]
    Input(String),
    /// Something outside the input failed (binding, the log file): exit code 1.
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

/// The JSONL log, buffered; flushed on a timer, at each connection's end and at shutdown.
struct Log {
    out: RefCell<BufWriter<File>>,
    payloads: bool,
    start: Instant,
}

impl Log {
    fn line(&self, value: &Value) {
        let mut out = self.out.borrow_mut();
        // A full disk must not stop the traffic: log errors are reported once per flush.
        let _ = serde_json::to_writer(&mut *out, value);
        let _ = out.write_all(b"\n");
    }

    fn flush(&self) {
        if let Err(e) = self.out.borrow_mut().flush() {
            eprintln!("proxy: writing the log failed: {e}");
        }
    }

    fn event(&self, mut value: Value) {
        if let Value::Object(map) = &mut value {
            map.insert("t_us".into(), json!(self.start.elapsed().as_micros() as u64));
        }
        self.line(&value);
    }
}

/// Real mode's environment: tokio time, and the JSONL log if there is one.
struct RealEnv {
    start: Instant,
    log: Option<Rc<Log>>,
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
        let Some(log) = &self.log else { return };
        let mut line = match serde_json::to_value(record) {
            Ok(Value::Object(map)) => map,
            _ => return,
        };
        line.insert("event".into(), json!("frame"));
        if let Message::Close(frame) = record.message {
            line.insert("close_code".into(), json!(frame.as_ref().map(|f| u16::from(f.code))));
            line.insert("close_reason".into(), json!(frame.as_ref().map(|f| f.reason.as_str())));
        }
        if log.payloads {
            match record.message {
                Message::Text(text) => {
                    line.insert("payload".into(), json!(text.as_str()));
                }
                Message::Binary(bytes) | Message::Ping(bytes) | Message::Pong(bytes) => {
                    line.insert("payload_base64".into(), json!(data_encoding::BASE64.encode(bytes)));
                }
                _ => {}
            }
        }
        log.line(&Value::Object(line));
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
        let rules =
            RuleSet::with_rules(args.seed, rules_from_args(&args)?).map_err(|e| ServeError::Input(e.to_string()))?;
        if let Some(admin) = args.admin {
            if !admin.ip().is_loopback() {
                return Err(ServeError::Input(format!(
                    "--admin {admin}: the admin API changes the proxy's behaviour, so it binds loopback addresses only"
                )));
            }
        }
        if args.max_frame_bytes == 0 || args.max_connections == 0 {
            return Err(ServeError::Input("--max-frame-bytes and --max-connections must be positive".into()));
        }
        if args.name.is_empty() || args.name.contains(['/', '?', '#', ' ']) {
            return Err(ServeError::Input(format!(
                "--name `{}`: expected a name without `/`, `?`, `#` or spaces",
                args.name
            )));
        }
        let listener = TcpListener::bind(args.listen)
            .await
            .map_err(|e| ServeError::Io(format!("binding --listen {}: {e}", args.listen)))?;
        let admin = match args.admin {
            Some(addr) => Some(
                TcpListener::bind(addr).await.map_err(|e| ServeError::Io(format!("binding --admin {addr}: {e}")))?,
            ),
            None => None,
        };
        let log = match &args.log {
            Some(path) => {
                let file = File::create(path).map_err(|e| ServeError::Io(format!("--log {}: {e}", path.display())))?;
                Some(Rc::new(Log {
                    out: RefCell::new(BufWriter::with_capacity(64 * 1024, file)),
                    payloads: args.log_payloads,
                    start: Instant::now(),
                }))
            }
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

    /// Serves clients until ctrl-c or SIGTERM. Must run inside a `LocalSet`.
    pub async fn run(self) -> Result<(), ServeError> {
        let start = self.log.as_ref().map_or_else(Instant::now, |l| l.start);
        let env = Rc::new(RealEnv { start, log: self.log.clone() });
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
        let config = WebSocketConfig::default()
            .max_message_size(Some(self.args.max_frame_bytes))
            .max_frame_size(Some(self.args.max_frame_bytes))
            // Bounded write buffer: a peer that stops reading stalls its sender, never grows memory.
            .max_write_buffer_size(self.args.max_frame_bytes.saturating_mul(2).max(1 << 20));
        // Upstream handshake keys come from their own stream of the seeded generator, so they
        // do not shift the probability draws of the rules.
        let mut keys = ChaCha8Rng::seed_from_u64(self.args.seed);
        keys.set_stream(1);
        let active = Rc::new(Cell::new(0usize));
        let mut next_conn = 0u64;
        let shutdown = shutdown_signal();
        tokio::pin!(shutdown);
        loop {
            let accepted = tokio::select! {
                biased;
                _ = &mut shutdown => break,
                accepted = self.listener.accept() => accepted,
            };
            let (mut stream, peer) = match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of file descriptors and the like: back off instead of spinning.
                    eprintln!("proxy: accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            next_conn += 1;
            let conn = next_conn;
            let _ = stream.set_nodelay(true);
            if active.get() >= self.args.max_connections {
                let message = format!("proxy: more than {} clients at once", self.args.max_connections);
                if let Some(log) = &self.log {
                    log.event(json!({"event": "rejected", "conn": conn, "peer": peer.to_string(), "error": message}));
                }
                tokio::task::spawn_local(async move {
                    let _ = tokio::time::timeout(
                        HANDSHAKE_TIMEOUT,
                        crate::handshake::reject_client(&mut stream, 503, &message),
                    )
                    .await;
                });
                continue;
            }
            let mut key = [0u8; 16];
            keys.fill_bytes(&mut key);
            active.set(active.get() + 1);
            let (env, rules, active, upstream) =
                (env.clone(), self.rules.clone(), active.clone(), self.upstream.clone());
            tokio::task::spawn_local(async move {
                serve_connection(stream, peer, conn, key, &upstream, config, rules, &env).await;
                active.set(active.get() - 1);
            });
        }
        if let Some(log) = &self.log {
            log.event(json!({"event": "stop"}));
            log.flush();
        }
        Ok(())
    }
}

#[allow(clippy::too_many_arguments)]
async fn serve_connection(
    stream: TcpStream,
    peer: SocketAddr,
    conn: u64,
    key: [u8; 16],
    upstream: &UpstreamUrl,
    config: WebSocketConfig,
    rules: SharedRules,
    env: &RealEnv,
) {
    let log = |value: Value| {
        if let Some(log) = &env.log {
            log.event(value);
        }
    };
    let connect = |authority: String| async move {
        let stream = TcpStream::connect(authority).await?;
        let _ = stream.set_nodelay(true);
        Ok(BufReader::with_capacity(SOCKET_READ_BUFFER, stream))
    };
    let stream = BufReader::with_capacity(SOCKET_READ_BUFFER, stream);
    let opened = tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake(stream, upstream, key, config, connect)).await;
    let (client, upstream_ws, hello) = match opened {
        Ok(Ok(opened)) => opened,
        Ok(Err(error)) => {
            let event = match error {
                HandshakeError::Unreachable { .. }
                | HandshakeError::Refused { .. }
                | HandshakeError::BadResponse { .. } => "upstream_error",
                _ => "handshake_error",
            };
            eprintln!("proxy: conn {conn} from {peer}: {error}");
            log(json!({"event": event, "conn": conn, "peer": peer.to_string(), "error": error.to_string()}));
            return;
        }
        Err(_) => {
            let error = format!("handshake not finished within {}s", HANDSHAKE_TIMEOUT.as_secs());
            eprintln!("proxy: conn {conn} from {peer}: {error}");
            log(json!({"event": "handshake_error", "conn": conn, "peer": peer.to_string(), "error": error}));
            return;
        }
    };
    log(
        json!({"event": "open", "conn": conn, "peer": peer.to_string(), "path": hello.path, "protocols": hello.protocols}),
    );
    let end: RelayEnd = relay(client, upstream_ws, rules, conn, env).await;
    let mut line = serde_json::to_value(&end).unwrap_or(Value::Null);
    if let Value::Object(map) = &mut line {
        map.insert("event".into(), json!("end"));
        map.insert("conn".into(), json!(conn));
    }
    log(line);
    if let Some(log) = &env.log {
        log.flush();
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
            println!("proxy listening on {}", proxy.listen_addr());
            if let Some(admin) = proxy.admin_addr() {
                println!("admin listening on {admin}");
            }
            let _ = std::io::stdout().flush();
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
