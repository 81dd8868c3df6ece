//! The software of each simulated host: the engine, a double behind its cuts, a harness
//! worker, and the scenario's driver.

use super::world::{SharedDouble, World};
use crate::bus::{websocket, Action, Answer, Bus, Connection, Engine, ErrorBody, Invocation, Provider};
use crate::cut::ServiceFault;
use crate::trace::EventKind;
use doubles::Call;
use serde_json::Value;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use tokio::sync::mpsc;
use turmoil::net::{TcpListener, TcpStream};

/// The engine's port on its host.
pub const ENGINE_PORT: u16 = 9000;
/// The engine's host name.
pub const ENGINE_HOST: &str = "engine";
/// The longest pause between reconnection attempts of a worker.
const RECONNECT_BACKOFF_MS_MAX: u64 = 1_000;

/// The engine host: accepts worker connections and routes between them.
pub async fn engine(world: Rc<World>) -> turmoil::Result {
    let engine = Engine::new(world);
    let listener = TcpListener::bind(("0.0.0.0", ENGINE_PORT)).await?;
    loop {
        let (stream, _) = listener.accept().await?;
        let engine = Rc::clone(&engine);
        tokio::task::spawn_local(async move {
            if let Ok(socket) = websocket::accept(stream).await {
                engine.serve(socket).await;
            }
        });
    }
}

/// A worker host: connects to the engine (at `engine`, which may be a proxy in front of it),
/// serves `functions` with `provider`, and reconnects with capped backoff whenever the
/// connection drops.
pub async fn worker(
    world: Rc<World>,
    engine: &'static str,
    name: String,
    functions: Vec<String>,
    provider: Rc<dyn Provider>,
    bus: Bus,
) -> turmoil::Result {
    let ids = world.stream(&name);
    let mut backoff_ms = 10;
    loop {
        if let Ok(stream) = TcpStream::connect((engine, ENGINE_PORT)).await {
            let key = websocket::handshake_key(&mut world.stream(&format!("{name}/handshake")).borrow_mut());
            let handshake = websocket::connect(stream, engine, "/", key).await;
            if let Ok(socket) = handshake {
                backoff_ms = 10;
                Connection::run(socket, &name, functions.clone(), Rc::clone(&provider), bus.clone(), Rc::clone(&ids))
                    .await;
            }
        }
        world.clock.sleep(backoff_ms).await;
        backoff_ms = (backoff_ms * 2).min(RECONNECT_BACKOFF_MS_MAX);
    }
}

/// A double on the bus, behind the run's service cuts.
pub struct ServiceHost {
    world: Rc<World>,
    host: &'static str,
    double: SharedDouble,
}

impl ServiceHost {
    pub fn new(world: Rc<World>, host: &'static str, double: SharedDouble) -> Rc<Self> {
        Rc::new(Self { world, host, double })
    }

    fn apply(&self, call: &Invocation) -> Result<Value, ErrorBody> {
        let mut observed = Vec::new();
        let now_ms = self.world.clock.now_ms();
        let reply = self
            .double
            .borrow_mut()
            .handle(Call { function: &call.function_id, payload: &call.data, now_ms }, &mut observed);
        self.world.record_observations(self.host, observed);
        reply.map_err(|e| ErrorBody { code: e.code, message: e.message })
    }
}

impl Provider for ServiceHost {
    fn invoke(self: Rc<Self>, call: Invocation, _bus: Bus) -> Pin<Box<dyn Future<Output = Answer>>> {
        Box::pin(async move {
            let world = &self.world;
            world.record(
                self.host,
                EventKind::Call {
                    service: self.host.to_string(),
                    function: call.function_id.clone(),
                    payload: call.data.clone(),
                },
            );
            let fault = world.cuts.borrow_mut().decide(&call.function_id, &call.data);
            let Some((cut, fault)) = fault else {
                return Some(self.apply(&call));
            };
            world.record(
                self.host,
                EventKind::Cut { cut, action: fault.name().to_string(), function: call.function_id.clone() },
            );
            match fault {
                ServiceFault::Timeout => None,
                ServiceFault::Reject { code, message } => Some(Err(ErrorBody { code, message })),
                ServiceFault::LostAck => {
                    let _ = self.apply(&call);
                    None
                }
                ServiceFault::Delay { ms } => {
                    let reply = self.apply(&call);
                    world.clock.sleep(ms).await;
                    Some(reply)
                }
            }
        })
    }
}

/// A provider with no functions, for workers that only call.
pub struct NoFunctions;

impl Provider for NoFunctions {
    fn invoke(self: Rc<Self>, _call: Invocation, _bus: Bus) -> Pin<Box<dyn Future<Output = Answer>>> {
        Box::pin(async { None })
    }
}

/// An invocation the scenario's driver makes.
#[derive(Debug, Clone)]
pub struct DriverCall {
    pub name: String,
    pub function: String,
    pub payload: Value,
    pub action: Option<Action>,
    pub timeout_ms: u64,
}

/// The driver: the scenario's own client on the bus. It makes the invocations the runner hands
/// it and records each outcome under the scenario's name for it.
pub async fn driver(world: Rc<World>, bus: Bus, mut calls: mpsc::UnboundedReceiver<DriverCall>) -> turmoil::Result {
    let connection = {
        let (world, bus) = (Rc::clone(&world), bus.clone());
        tokio::task::spawn_local(async move {
            worker(world, ENGINE_HOST, "driver".into(), Vec::new(), Rc::new(NoFunctions), bus).await
        })
    };
    while let Some(call) = calls.recv().await {
        let (world, bus) = (Rc::clone(&world), bus.clone());
        tokio::task::spawn_local(async move {
            let outcome = match bus.invoke_with(&call.function, call.payload, call.action, call.timeout_ms).await {
                Ok(result) => serde_json::json!({ "outcome": "ok", "result": result }),
                Err(error) => error.to_json(),
            };
            world.rpc.borrow_mut().insert(call.name.clone(), outcome.clone());
            world.record("driver", EventKind::Rpc { name: call.name, function: call.function, outcome });
        });
    }
    connection.abort();
    Ok(())
}

/// The drop-proxy's host name; a worker placed behind it connects here instead of the engine.
pub const PROXY_HOST: &str = "proxy";

/// The drop-proxy host: accepts worker connections on the engine's port, opens one upstream
/// connection to the engine for each, and relays frames under the world's proxy rules. It is
/// the same relay code the standalone `proxy` binary runs on real sockets.
pub async fn drop_proxy(world: Rc<World>) -> turmoil::Result {
    let rules = world.proxy_rules.borrow().clone().expect("a proxy host has rules");
    let upstream = proxy::UpstreamUrl::parse(&format!("ws://{ENGINE_HOST}:{ENGINE_PORT}/")).expect("a valid url");
    let listener = TcpListener::bind(("0.0.0.0", ENGINE_PORT)).await?;
    let mut connection = 0;
    loop {
        let (stream, _) = listener.accept().await?;
        connection += 1;
        let (world, rules, upstream) = (Rc::clone(&world), Rc::clone(&rules), upstream.clone());
        tokio::task::spawn_local(async move {
            let key = websocket::handshake_key(&mut world.stream("proxy/handshake").borrow_mut());
            let connect = |authority: String| async move {
                let (host, port) = authority.rsplit_once(':').unwrap_or((authority.as_str(), ""));
                TcpStream::connect((host, port.parse().unwrap_or(ENGINE_PORT))).await
            };
            let config = tokio_tungstenite::tungstenite::protocol::WebSocketConfig::default();
            match proxy::handshake(stream, &upstream, key, config, connect).await {
                Ok((client, upstream, _hello)) => {
                    let env = SimProxyEnv { world: Rc::clone(&world) };
                    let end = proxy::relay(client, upstream, rules, connection, &env).await;
                    world.note_event(
                        PROXY_HOST,
                        "proxy_relay_ended",
                        serde_json::to_value(&end).unwrap_or(Value::Null),
                    );
                }
                Err(error) => world.note_event(
                    PROXY_HOST,
                    "proxy_handshake_failed",
                    serde_json::json!({ "error": error.to_string() }),
                ),
            }
        });
    }
}

/// The proxy's view of the simulation: the rig's clock, and the trace for every frame a rule took.
struct SimProxyEnv {
    world: Rc<World>,
}

impl proxy::ProxyEnv for SimProxyEnv {
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
        self.world
            .record(PROXY_HOST, EventKind::ProxyRule { rule, action: record.action.to_string(), direction, frame });
    }
}
