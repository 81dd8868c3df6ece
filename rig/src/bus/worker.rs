//! A worker's side of the bus: invoke functions with caller-side deadlines, and serve the
//! functions it registered.

use super::engine::WORKERS_REGISTER;
use super::local::{self, Outbox};
use super::protocol::{codes, Action, ErrorBody, Frame};
use super::wire;
use super::OUTBOX_CAPACITY;
use crate::clock::{within, Clock};
use crate::streams::uuid;
use futures_util::{SinkExt, StreamExt};
use rand_chacha::ChaCha8Rng;
use serde_json::{json, Value};
use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::oneshot;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

/// One invocation a provider is asked to handle.
#[derive(Debug, Clone)]
pub struct Invocation {
    pub invocation_id: String,
    pub function_id: String,
    pub data: Value,
}

/// What a provider answers: a result, an error, or (`None`) nothing at all, which is how a
/// cut makes a reply go missing.
pub type Answer = Option<Result<Value, ErrorBody>>;

/// Something that serves functions on the bus: a double behind its cuts, a harness, a queue.
pub trait Provider {
    fn invoke(self: Rc<Self>, call: Invocation, bus: Bus) -> Pin<Box<dyn Future<Output = Answer>>>;
}

/// Why an invocation produced no result. A timeout is not a rejection: after a timeout the
/// caller cannot know whether the call took effect.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvokeError {
    #[error("invocation timed out after {after_ms} ms")]
    Timeout { after_ms: u64 },
    #[error("{}: {}", .0.code, .0.message)]
    Rejected(ErrorBody),
    /// Not connected: the request was never sent.
    #[error("not connected to the engine")]
    Disconnected,
    /// The request was sent, then the connection closed before any reply.
    #[error("the engine connection closed before a reply")]
    Lost,
}

impl InvokeError {
    pub fn is_timeout(&self) -> bool {
        matches!(self, InvokeError::Timeout { .. })
    }

    /// Whether the call may have taken effect although no result came back: a timeout, a lost
    /// connection, or a provider that disconnected mid-call (`invocation_stopped`). A rejection
    /// or a call never sent is a definite "it did not happen".
    pub fn outcome_unknown(&self) -> bool {
        match self {
            InvokeError::Timeout { .. } | InvokeError::Lost => true,
            InvokeError::Rejected(body) => body.code == codes::INVOCATION_STOPPED,
            InvokeError::Disconnected => false,
        }
    }

    /// The error as a JSON document, for traces and RPC outcomes.
    pub fn to_json(&self) -> Value {
        match self {
            InvokeError::Timeout { after_ms } => {
                json!({ "outcome": "timeout", "after_ms": after_ms })
            }
            InvokeError::Rejected(body) => json!({ "outcome": "error", "error": body }),
            InvokeError::Disconnected => json!({ "outcome": "disconnected" }),
            InvokeError::Lost => json!({ "outcome": "connection_lost" }),
        }
    }
}

/// One live connection of a worker to the engine.
pub struct Connection {
    outbox: Outbox<Message>,
    pending: RefCell<BTreeMap<String, oneshot::Sender<Result<Value, ErrorBody>>>>,
    closed: Cell<bool>,
    clock: Rc<Clock>,
    ids: Rc<RefCell<ChaCha8Rng>>,
}

impl Connection {
    fn send(&self, frame: Frame) -> bool {
        !self.closed.get() && self.outbox.try_send(wire::encode(frame)).is_ok()
    }

    async fn invoke(
        &self,
        function_id: &str,
        data: Value,
        action: Option<Action>,
        timeout_ms: u64,
    ) -> Result<Value, InvokeError> {
        let invocation_id = uuid(&mut self.ids.borrow_mut());
        let (reply, answer) = oneshot::channel();
        self.pending.borrow_mut().insert(invocation_id.clone(), reply);
        let frame = Frame::InvokeFunction {
            invocation_id: Some(invocation_id.clone()),
            function_id: function_id.to_string(),
            data,
            action,
        };
        if !self.send(frame) {
            self.pending.borrow_mut().remove(&invocation_id);
            return Err(InvokeError::Disconnected);
        }
        let outcome = within(&self.clock, timeout_ms, answer).await;
        self.pending.borrow_mut().remove(&invocation_id);
        match outcome {
            Ok(Ok(Ok(result))) => Ok(result),
            Ok(Ok(Err(error))) => Err(InvokeError::Rejected(error)),
            Ok(Err(_)) => Err(InvokeError::Lost),
            Err(_) => Err(InvokeError::Timeout { after_ms: timeout_ms }),
        }
    }

    /// Runs a worker on an open WebSocket: names itself, registers `functions`, serves calls
    /// with `provider`, and makes the connection available through `bus` while it lasts: until
    /// the engine closes it or `cut` completes (the network between them was cut).
    pub async fn run<S>(
        socket: WebSocketStream<S>,
        name: &str,
        functions: Vec<String>,
        provider: Rc<dyn Provider>,
        bus: Bus,
        ids: Rc<RefCell<ChaCha8Rng>>,
        cut: impl Future<Output = ()>,
    ) where
        S: AsyncRead + AsyncWrite + Unpin + 'static,
    {
        let (mut sink, mut stream) = local::split(socket);
        let (outbox, mut outgoing) = local::outbox::<Message>(OUTBOX_CAPACITY);
        let writer = tokio::task::spawn_local(async move {
            while let Some(message) = outgoing.recv().await {
                if sink.send(message).await.is_err() {
                    break;
                }
            }
        });
        let connection = Rc::new(Connection {
            outbox,
            pending: RefCell::default(),
            closed: Cell::new(false),
            clock: Rc::clone(&bus.clock),
            ids,
        });
        bus.attach(Rc::clone(&connection));
        // Functions first, then the worker's name as a fire-and-forget call, as the iii SDKs do:
        // nothing waits on an answer, so a lost reply cannot hold registration up.
        for id in functions {
            connection.send(Frame::RegisterFunction { id, description: None });
        }
        connection.send(Frame::InvokeFunction {
            invocation_id: None,
            function_id: WORKERS_REGISTER.to_string(),
            data: json!({ "name": name }),
            action: Some(Action::Void),
        });
        let serving = async {
            while let Some(Ok(message)) = stream.next().await {
                let Message::Text(text) = message else {
                    continue;
                };
                match wire::decode(&text) {
                    Ok(Frame::InvokeFunction { invocation_id, function_id, data, .. }) => {
                        let call =
                            Invocation { invocation_id: invocation_id.clone().unwrap_or_default(), function_id, data };
                        let (connection, provider, bus) = (Rc::clone(&connection), Rc::clone(&provider), bus.clone());
                        tokio::task::spawn_local(async move {
                            let function_id = call.function_id.clone();
                            let answer = provider.invoke(call, bus).await;
                            // A call without an id is fire-and-forget: nobody waits for its answer.
                            if let (Some(answer), Some(invocation_id)) = (answer, invocation_id) {
                                let (result, error) = match answer {
                                    Ok(result) => (Some(result), None),
                                    Err(error) => (None, Some(error)),
                                };
                                connection.send(Frame::InvocationResult { invocation_id, function_id, result, error });
                            }
                        });
                    }
                    Ok(Frame::InvocationResult { invocation_id, result, error, .. }) => {
                        if let Some(reply) = connection.pending.borrow_mut().remove(&invocation_id) {
                            let _ = reply.send(match error {
                                Some(error) => Err(error),
                                None => Ok(result.unwrap_or(Value::Null)),
                            });
                        }
                    }
                    Ok(_) | Err(_) => {}
                }
            }
        };
        tokio::select! {
            biased;
            () = cut => {}
            () = serving => {}
        }
        connection.closed.set(true);
        connection.pending.borrow_mut().clear();
        bus.detach(&connection);
        writer.abort();
    }
}

/// A worker's handle on the bus that outlives any one connection: invocations go over the
/// current connection, and fail as `Disconnected` while there is none.
#[derive(Clone)]
pub struct Bus {
    current: Rc<RefCell<Option<Rc<Connection>>>>,
    clock: Rc<Clock>,
}

impl Bus {
    pub fn new(clock: Rc<Clock>) -> Self {
        Self { current: Rc::default(), clock }
    }

    pub fn is_connected(&self) -> bool {
        self.current.borrow().is_some()
    }

    fn attach(&self, connection: Rc<Connection>) {
        *self.current.borrow_mut() = Some(connection);
    }

    fn detach(&self, connection: &Rc<Connection>) {
        let mut current = self.current.borrow_mut();
        if current.as_ref().is_some_and(|c| Rc::ptr_eq(c, connection)) {
            *current = None;
        }
    }

    /// Invokes a function and waits for its result at most `timeout_ms`.
    pub async fn invoke(&self, function_id: &str, data: Value, timeout_ms: u64) -> Result<Value, InvokeError> {
        self.invoke_with(function_id, data, None, timeout_ms).await
    }

    /// Sends a fire-and-forget call as the iii SDKs do (`void`, no invocation id, so no
    /// answer): whether it was sent. Nothing waits, so it is for reports that may be lost.
    pub fn send_void(&self, function_id: &str, data: Value) -> bool {
        let frame = Frame::InvokeFunction {
            invocation_id: None,
            function_id: function_id.to_string(),
            data,
            action: Some(Action::Void),
        };
        self.current.borrow().as_ref().is_some_and(|connection| connection.send(frame))
    }

    /// Invokes with an engine action (`void`, `enqueue`).
    pub async fn invoke_with(
        &self,
        function_id: &str,
        data: Value,
        action: Option<Action>,
        timeout_ms: u64,
    ) -> Result<Value, InvokeError> {
        let connection = self.current.borrow().clone();
        match connection {
            Some(connection) => connection.invoke(function_id, data, action, timeout_ms).await,
            None => Err(InvokeError::Disconnected),
        }
    }
}
