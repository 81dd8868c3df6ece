//! The software of each simulated host: the engine, the drop-proxy, a double behind its cuts,
//! and the connection loop every worker runs.

use super::world::World;
use crate::bus::{websocket, Answer, Bus, Connection, Engine, ErrorBody, Invocation, Provider};
use crate::cut::{Refusal, ServiceFault};
use crate::queue::{QueueEnv, QueueWorker};
use crate::services::SharedDouble;
use crate::topology::{ENGINE, PROXY, QUEUE};
use crate::trace::EventKind;
use doubles::Call;
use serde_json::Value;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::Notify;
use turmoil::net::{TcpListener, TcpStream};

/// The port the engine (and the proxy in front of it) listens on.
pub const ENGINE_PORT: u16 = 9000;
/// The longest pause between reconnection attempts of a worker.
const RECONNECT_BACKOFF_MS_MAX: u64 = 1_000;

/// How a worker reaches the host it dials: turmoil's TCP in the simulation; live mode opens
/// in-memory streams to its engine.
pub trait Dial: 'static {
    type Stream: AsyncRead + AsyncWrite + Unpin + 'static;
    /// Opens a stream to `target`.
    fn open(&self, target: &str) -> impl Future<Output = std::io::Result<Self::Stream>>;
    /// The request path a worker named `name` connects at.
    fn path(&self, name: &str) -> String;
}

/// The simulated network: every host listens on [`ENGINE_PORT`]; workers connect at `/`.
pub struct SimulatedNetwork;

impl Dial for SimulatedNetwork {
    type Stream = TcpStream;

    fn open(&self, target: &str) -> impl Future<Output = std::io::Result<TcpStream>> {
        let target = target.to_string();
        async move { TcpStream::connect((target.as_str(), ENGINE_PORT)).await }
    }

    fn path(&self, _name: &str) -> String {
        "/".to_string()
    }
}

/// The host at the other end of an accepted connection.
fn peer_host(address: std::net::SocketAddr) -> String {
    turmoil::reverse_lookup(address.ip()).unwrap_or_else(|| address.ip().to_string())
}

/// The engine host: accepts worker connections and routes between them.
pub async fn engine(world: Rc<World>) -> turmoil::Result {
    let engine = Engine::new(Rc::clone(&world) as Rc<dyn crate::bus::BusObserver>);
    let listener = TcpListener::bind(("0.0.0.0", ENGINE_PORT)).await?;
    loop {
        let (stream, address) = listener.accept().await?;
        let severed = world.open_link(ENGINE, &peer_host(address));
        let engine = Rc::clone(&engine);
        tokio::task::spawn_local(async move {
            if let Ok(socket) = websocket::accept(stream).await {
                engine.serve(socket, async move { severed.notified().await }).await;
            }
        });
    }
}

/// A worker host: connects to `target` (the engine, or the proxy in front of it), serves
/// `functions` with `provider`, and reconnects with capped backoff whenever the connection
/// drops, registering again as iii workers do. It does not try while the link is cut.
pub async fn worker<D: Dial>(
    world: Rc<World>,
    dial: D,
    target: String,
    name: String,
    functions: Vec<String>,
    provider: Rc<dyn Provider>,
    bus: Bus,
) -> turmoil::Result {
    let ids = world.stream(&name);
    let mut backoff_ms = 10;
    loop {
        if !world.is_cut(&name, &target) {
            if let Ok(stream) = dial.open(&target).await {
                let key = websocket::handshake_key(&mut world.stream(&format!("{name}/handshake")).borrow_mut());
                if let Ok(socket) = websocket::connect(stream, &target, &dial.path(&name), key).await {
                    backoff_ms = 10;
                    let severed = world.open_link(&name, &target);
                    let cut = async move { severed.notified().await };
                    Connection::run(
                        socket,
                        &name,
                        functions.clone(),
                        Rc::clone(&provider),
                        bus.clone(),
                        Rc::clone(&ids),
                        cut,
                    )
                    .await;
                }
            }
        }
        world.clock.sleep(backoff_ms).await;
        backoff_ms = (backoff_ms * 2).min(RECONNECT_BACKOFF_MS_MAX);
    }
}

/// The software of a double's host: the world's double, behind the run's service cuts, served
/// on the bus as a worker that dials `target`.
pub fn service_host<D: Dial>(
    world: &Rc<World>,
    dial: D,
    name: &str,
    target: &str,
    functions: &[String],
) -> impl Future<Output = turmoil::Result> {
    let double = world.services().iter().find(|(h, _)| *h == name).map(|(_, d)| Rc::clone(d));
    let double = double.expect("every service host has its double");
    let provider: Rc<dyn Provider> = ServiceHost::new(Rc::clone(world), name, double);
    let bus = Bus::new(Rc::clone(&world.clock));
    worker(Rc::clone(world), dial, target.to_string(), name.to_string(), functions.to_vec(), provider, bus)
}

/// The software of the queue's host: a fresh queue worker over the world's durable queues.
pub fn queue_host<D: Dial>(
    world: &Rc<World>,
    dial: D,
    name: &str,
    target: &str,
    functions: &[String],
) -> impl Future<Output = turmoil::Result> {
    let bus = Bus::new(Rc::clone(&world.clock));
    let note_world = Rc::clone(world);
    let env = QueueEnv {
        clock: Rc::clone(&world.clock),
        queues: Rc::clone(&world.queues),
        note: Rc::new(move |what, detail| note_world.note_event(QUEUE, what, detail)),
    };
    let queue = QueueWorker::start(env, bus.clone());
    worker(Rc::clone(world), dial, target.to_string(), name.to_string(), functions.to_vec(), queue, bus)
}

/// A double on the bus, behind the run's service cuts.
pub struct ServiceHost {
    world: Rc<World>,
    /// Its name, as every event it records carries it.
    host: crate::trace::Label,
    double: SharedDouble,
    /// Requests a `late` cut holds on the way, with their callers, in arrival order.
    held: std::cell::RefCell<Vec<(Arrived, Option<crate::trace::Label>)>>,
}

/// An invocation as a double's host holds it: its payload shared with the trace's `call` event
/// rather than copied into it.
struct Arrived {
    invocation_id: String,
    function_id: String,
    data: Arc<Value>,
}

impl From<Invocation> for Arrived {
    fn from(call: Invocation) -> Self {
        Self { invocation_id: call.invocation_id, function_id: call.function_id, data: Arc::new(call.data) }
    }
}

impl ServiceHost {
    pub fn new(world: Rc<World>, host: &str, double: SharedDouble) -> Rc<Self> {
        Rc::new(Self { world, host: host.into(), double, held: Default::default() })
    }

    /// Lets the requests held on the way that `call` sends again (the same function, about the
    /// same action) take effect now, right after it: their callers gave up on them long ago,
    /// so their answers go nowhere.
    fn release_late(&self, call: &Arrived, bus: &Bus) {
        let same = |held: &Arrived| {
            held.function_id == call.function_id && held.data.get("action_id") == call.data.get("action_id")
        };
        if !self.held.borrow().iter().any(|(held, _)| same(held)) {
            return;
        }
        let (released, kept) = self.held.take().into_iter().partition(|(held, _)| same(held));
        *self.held.borrow_mut() = kept;
        for (held, caller) in released {
            let detail = serde_json::json!({ "function": held.function_id, "invocation_id": held.invocation_id });
            self.world.note_event(&self.host, "late_call_arrived", detail);
            let _ = self.apply(&held, caller.as_deref(), bus);
        }
    }

    /// Hands the call to the double. A reply carrying `frames` to a caller that named a
    /// `stream_to` function is streamed: each frame goes there first, as a fire-and-forget call
    /// (`{stream_id, seq, frame}`), and the reply says how many were sent (`streamed`).
    fn apply(&self, call: &Arrived, caller: Option<&str>, bus: &Bus) -> Result<Value, ErrorBody> {
        let mut observed = Vec::new();
        let now_ms = self.world.clock.now_ms();
        let reply = self.double.borrow_mut().handle(Call::shared(&call.function_id, &call.data, now_ms), &mut observed);
        self.world.record_observations(&self.host, caller, &call.invocation_id, observed);
        let mut reply = reply.map_err(|e| ErrorBody { code: e.code, message: e.message })?;
        // The reply's frames are looked at only for a caller that streams; each is moved out of
        // the reply into its own call (`json!` would copy it node by node).
        let stream_to = call.data["stream_to"].as_str();
        let fields = reply.as_object_mut().filter(|_| stream_to.is_some());
        if let Some((stream_to, fields)) = stream_to.zip(fields) {
            if let Some(frames) = fields.remove("frames") {
                let frames = match frames {
                    Value::Array(frames) => frames,
                    _ => Vec::new(),
                };
                let sent = frames.len();
                for (seq, frame) in frames.into_iter().enumerate() {
                    let mut data = serde_json::Map::new();
                    data.insert("stream_id".into(), call.data["stream_id"].clone());
                    data.insert("seq".into(), seq.into());
                    data.insert("frame".into(), frame);
                    bus.send_void(stream_to, Value::Object(data));
                }
                fields.insert("streamed".into(), sent.into());
            }
        }
        Ok(reply)
    }
}

impl Provider for ServiceHost {
    fn invoke(self: Rc<Self>, call: Invocation, bus: Bus) -> Pin<Box<dyn Future<Output = Answer>>> {
        Box::pin(async move {
            let world = &self.world;
            let call = Arrived::from(call);
            let caller = world.caller_of(&call.invocation_id);
            world.record_on(
                self.host.clone(),
                EventKind::Call {
                    service: self.host.clone(),
                    function: call.function_id.as_str().into(),
                    payload: Arc::clone(&call.data),
                    caller: caller.clone(),
                    invocation_id: Some(call.invocation_id.clone()).filter(|id| !id.is_empty()),
                },
            );
            let fault = world.cuts.borrow_mut().decide(&call.function_id, &call.data, world.clock.now_ms());
            let Some((cut, fault)) = fault else {
                let reply = self.apply(&call, caller.as_deref(), &bus);
                self.release_late(&call, &bus);
                return Some(reply);
            };
            // A request sent again that a cut takes: what it sends again arrived with it.
            self.release_late(&call, &bus);
            world.record(
                &self.host,
                EventKind::Cut { cut, action: fault.name().to_string(), function: call.function_id.clone() },
            );
            match fault {
                ServiceFault::Timeout => None,
                ServiceFault::Reject { code, message } => Some(Err(ErrorBody { code, message })),
                ServiceFault::LostAck => {
                    let _ = self.apply(&call, caller.as_deref(), &bus);
                    None
                }
                ServiceFault::Delay { ms } => {
                    let reply = self.apply(&call, caller.as_deref(), &bus);
                    world.clock.sleep(ms).await;
                    Some(reply)
                }
                // Held on the way until the caller sends it again (`release_late`).
                ServiceFault::Late => {
                    self.held.borrow_mut().push((call, caller));
                    None
                }
                ServiceFault::CrashCaller { after } => {
                    if after {
                        let _ = self.apply(&call, caller.as_deref(), &bus);
                    }
                    // The driver is the scenario itself and never crashes.
                    if let Some(caller) = caller.as_deref().filter(|c| *c != crate::topology::DRIVER) {
                        world.request_bounce(caller);
                    }
                    None
                }
                ServiceFault::CrashService => {
                    let _ = self.apply(&call, caller.as_deref(), &bus);
                    world.request_bounce(&self.host);
                    None
                }
                ServiceFault::CrashEngine => {
                    let _ = self.apply(&call, caller.as_deref(), &bus);
                    world.request_bounce(crate::topology::ENGINE);
                    None
                }
                ServiceFault::IsolateCaller { ms } => {
                    let _ = self.apply(&call, caller.as_deref(), &bus);
                    if let Some(caller) = caller.as_deref().filter(|c| *c != crate::topology::DRIVER) {
                        world.request_isolation(caller, world.clock.now_ms().saturating_add(ms));
                    }
                    None
                }
                // Down: nothing it asks takes effect, and the caller is refused or left waiting.
                ServiceFault::Outage { refuse, .. } => match refuse {
                    Refusal::Reject { code, message } => Some(Err(ErrorBody { code, message })),
                    Refusal::Timeout => None,
                },
                ServiceFault::PauseCaller { ms } => {
                    let reply = self.apply(&call, caller.as_deref(), &bus);
                    if let Some(caller) = caller.as_deref() {
                        use crate::harness::ProcessControl;
                        world.pause(caller, world.clock.now_ms().saturating_add(ms));
                    }
                    Some(reply)
                }
            }
        })
    }
}

/// The drop-proxy host: accepts worker connections on the engine's port, opens one upstream
/// connection to the engine for each, and relays frames under the world's proxy rules. It is
/// the same relay code the standalone `proxy` binary runs on real sockets.
pub async fn drop_proxy(world: Rc<World>) -> turmoil::Result {
    let rules = world.proxy_rules.borrow().clone().expect("a proxy host has rules");
    let upstream = proxy::UpstreamUrl::parse(&format!("ws://{ENGINE}:{ENGINE_PORT}/")).expect("a valid url");
    let listener = TcpListener::bind(("0.0.0.0", ENGINE_PORT)).await?;
    let mut connection = 0;
    loop {
        let (mut stream, address) = listener.accept().await?;
        connection += 1;
        let client_cut = world.open_link(PROXY, &peer_host(address));
        let (world, rules, upstream) = (Rc::clone(&world), Rc::clone(&rules), upstream.clone());
        tokio::task::spawn_local(async move {
            if world.is_cut(PROXY, ENGINE) {
                return;
            }
            let key = websocket::handshake_key(&mut world.stream("proxy/handshake").borrow_mut());
            let connect = |authority: String| async move {
                let (host, port) = authority.rsplit_once(':').unwrap_or((authority.as_str(), ""));
                TcpStream::connect((host, port.parse().unwrap_or(ENGINE_PORT))).await
            };
            match proxy::read_hello_or_reject(&mut stream).await {
                Ok(hello) => {
                    relay_client(&world, rules, stream, hello, &upstream, key, connect, client_cut, connection).await
                }
                Err(error) => {
                    world.note_event(PROXY, "proxy_handshake_failed", serde_json::json!({ "error": error.to_string() }))
                }
            }
        });
    }
}

/// One client of the drop-proxy, its opening request read: opens its upstream to the engine
/// with `connect`, answers it, and relays frames under the world's proxy rules until either side
/// ends or either link is cut. The same relay code the standalone `proxy` binary runs.
#[allow(clippy::too_many_arguments)]
pub async fn relay_client<C, U, F, Fut>(
    world: &Rc<World>,
    rules: proxy::SharedRules,
    client: C,
    hello: proxy::ClientHello,
    upstream: &proxy::UpstreamUrl,
    key: [u8; 16],
    connect: F,
    client_cut: Rc<Notify>,
    connection: u64,
) where
    C: AsyncRead + AsyncWrite + Unpin,
    U: AsyncRead + AsyncWrite + Unpin,
    F: FnOnce(String) -> Fut,
    Fut: Future<Output = std::io::Result<U>>,
{
    let config = crate::bus::websocket::config();
    match proxy::answer_hello(client, hello, upstream, key, config, connect, (std::future::pending(), 0)).await {
        Ok((client, upstream, _hello)) => {
            let upstream_cut = world.open_link(PROXY, ENGINE);
            let env = WorldProxyEnv { world: Rc::clone(world) };
            let relay = proxy::relay(client, upstream, rules, connection, &env);
            // Either link cut drops the whole relay, and with it both of its sockets.
            let end = tokio::select! {
                biased;
                () = client_cut.notified() => serde_json::json!({ "cut": "client link" }),
                () = upstream_cut.notified() => serde_json::json!({ "cut": "upstream link" }),
                end = relay => serde_json::to_value(&end).unwrap_or(Value::Null),
            };
            world.note_event(PROXY, "proxy_relay_ended", end);
        }
        Err(error) => {
            world.note_event(PROXY, "proxy_handshake_failed", serde_json::json!({ "error": error.to_string() }))
        }
    }
}

/// The proxy's view of the world: the rig's clock, and the trace for every frame a rule took.
struct WorldProxyEnv {
    world: Rc<World>,
}

impl proxy::ProxyEnv for WorldProxyEnv {
    fn now_us(&self) -> u64 {
        self.world.clock.now_ms() * 1_000
    }

    fn sleep(&self, ms: u64) -> Pin<Box<dyn Future<Output = ()> + '_>> {
        Box::pin(self.world.clock.sleep(ms))
    }

    fn record(&self, record: &proxy::FrameRecord<'_>) {
        let Some(rule) = record.rule else { return };
        let frame = proxy::frame_json(record.message)
            .unwrap_or_else(|| serde_json::json!({ "kind": record.kind.as_str(), "size": record.size }));
        let direction = record.direction.as_str().to_string();
        self.world.record(PROXY, EventKind::ProxyRule { rule, action: record.action.to_string(), direction, frame });
    }
}
