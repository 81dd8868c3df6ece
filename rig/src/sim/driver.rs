//! The driver: the scenario's own client on the bus. It makes the invocations the runner hands
//! it and records each outcome under the scenario's name for it.

use super::hosts::{worker, Dial};
use super::world::World;
use crate::bus::{Action, Answer, Bus, Invocation, Provider};
use crate::topology::{DRIVER, ENGINE};
use crate::trace::EventKind;
use serde_json::Value;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use tokio::sync::mpsc;

/// An invocation the scenario's driver makes.
#[derive(Debug, Clone)]
pub struct DriverCall {
    pub name: String,
    pub function: String,
    pub payload: Value,
    pub action: Option<Action>,
    pub timeout_ms: u64,
}

/// A provider with no functions, for the driver, which only calls.
struct NoFunctions;

impl Provider for NoFunctions {
    fn invoke(self: Rc<Self>, _call: Invocation, _bus: Bus) -> Pin<Box<dyn Future<Output = Answer>>> {
        Box::pin(async { None })
    }
}

/// Runs the driver until the runner drops its sender.
pub async fn driver<D: Dial>(
    world: Rc<World>,
    dial: D,
    bus: Bus,
    mut calls: mpsc::UnboundedReceiver<DriverCall>,
) -> turmoil::Result {
    let connection = {
        let (world, bus) = (Rc::clone(&world), bus.clone());
        tokio::task::spawn_local(async move {
            worker(world, dial, ENGINE.into(), DRIVER.into(), Vec::new(), Rc::new(NoFunctions), bus).await
        })
    };
    while let Some(call) = calls.recv().await {
        let (world, bus) = (Rc::clone(&world), bus.clone());
        tokio::task::spawn_local(async move {
            let outcome = match bus.invoke_with(&call.function, call.payload, call.action, call.timeout_ms).await {
                // Moved in: `json!` would copy the result node by node.
                Ok(result) => {
                    let mut outcome = serde_json::Map::new();
                    outcome.insert("outcome".into(), "ok".into());
                    outcome.insert("result".into(), result);
                    serde_json::Value::Object(outcome)
                }
                Err(error) => error.to_json(),
            };
            world.rpc.borrow_mut().insert(call.name.clone(), outcome.clone());
            world.record(DRIVER, EventKind::Rpc { name: call.name, function: call.function, outcome });
        });
    }
    connection.abort();
    Ok(())
}
