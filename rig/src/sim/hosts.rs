//! The software of each simulated host: the engine, a double behind its cuts, a harness
//! worker, and the scenario's driver.

use super::world::{SharedDouble, World};
use crate::bus::{
    websocket, Action, Answer, Bus, Connection, Engine, ErrorBody, Invocation, Provider,
};
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

/// A worker host: connects to the engine, serves `functions` with `provider`, and reconnects
/// with capped backoff whenever the connection drops.
pub async fn worker(
    world: Rc<World>,
    name: String,
    functions: Vec<String>,
    provider: Rc<dyn Provider>,
    bus: Bus,
) -> turmoil::Result {
    let ids = world.stream(&name);
    let mut backoff_ms = 10;
    loop {
        if let Ok(stream) = TcpStream::connect((ENGINE_HOST, ENGINE_PORT)).await {
            let key = websocket::handshake_key(
                &mut world.stream(&format!("{name}/handshake")).borrow_mut(),
            );
            let handshake = websocket::connect(stream, ENGINE_HOST, "/", key).await;
            if let Ok(socket) = handshake {
                backoff_ms = 10;
                Connection::run(
                    socket,
                    &name,
                    functions.clone(),
                    Rc::clone(&provider),
                    bus.clone(),
                    Rc::clone(&ids),
                )
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
        Rc::new(Self {
            world,
            host,
            double,
        })
    }

    fn apply(&self, call: &Invocation) -> Result<Value, ErrorBody> {
        let mut observed = Vec::new();
        let now_ms = self.world.clock.now_ms();
        let reply = self.double.borrow_mut().handle(
            Call {
                function: &call.function_id,
                payload: &call.data,
                now_ms,
            },
            &mut observed,
        );
        self.world.record_observations(self.host, observed);
        reply.map_err(|e| ErrorBody {
            code: e.code,
            message: e.message,
        })
    }
}

impl Provider for ServiceHost {
    fn invoke(
        self: Rc<Self>,
        call: Invocation,
        _bus: Bus,
    ) -> Pin<Box<dyn Future<Output = Answer>>> {
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
            let fault = world
                .cuts
                .borrow_mut()
                .decide(&call.function_id, &call.data);
            let Some((cut, fault)) = fault else {
                return Some(self.apply(&call));
            };
            world.record(
                self.host,
                EventKind::Cut {
                    cut,
                    action: fault.name().to_string(),
                    function: call.function_id.clone(),
                },
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
    fn invoke(
        self: Rc<Self>,
        _call: Invocation,
        _bus: Bus,
    ) -> Pin<Box<dyn Future<Output = Answer>>> {
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
pub async fn driver(
    world: Rc<World>,
    bus: Bus,
    mut calls: mpsc::UnboundedReceiver<DriverCall>,
) -> turmoil::Result {
    let connection = {
        let (world, bus) = (Rc::clone(&world), bus.clone());
        tokio::task::spawn_local(async move {
            worker(
                world,
                "driver".into(),
                Vec::new(),
                Rc::new(NoFunctions),
                bus,
            )
            .await
        })
    };
    while let Some(call) = calls.recv().await {
        let (world, bus) = (Rc::clone(&world), bus.clone());
        tokio::task::spawn_local(async move {
            let outcome = match bus
                .invoke_with(&call.function, call.payload, call.action, call.timeout_ms)
                .await
            {
                Ok(result) => serde_json::json!({ "outcome": "ok", "result": result }),
                Err(error) => error.to_json(),
            };
            world
                .rpc
                .borrow_mut()
                .insert(call.name.clone(), outcome.clone());
            world.record(
                "driver",
                EventKind::Rpc {
                    name: call.name,
                    function: call.function,
                    outcome,
                },
            );
        });
    }
    connection.abort();
    Ok(())
}
