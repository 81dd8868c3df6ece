//! The engine: routes invocations between workers by function id.
//!
//! It keeps the caller's invocation id end to end, answers `function_not_found` for a function
//! nobody registered, answers `invocation_stopped` to callers whose provider disconnected
//! mid-call, discards results of fire-and-forget (`void`) invocations, and sends `enqueue`
//! invocations to whichever worker provides the queue. Its routing table lives in the host, so
//! a crash of the engine loses it, as it would in production.
//!
//! A worker may name itself (`engine::workers::register`) at any time, before or after it
//! registers its functions, with or without waiting for an answer: the iii SDKs send it as a
//! fire-and-forget call after their functions.

use super::protocol::{codes, Action, ErrorBody, Frame};
use super::{BusObserver, FrameDirection, OUTBOX_CAPACITY};
use futures_util::{SinkExt, StreamExt};
use serde_json::json;
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

/// The function a queue worker provides for `enqueue` actions.
pub const QUEUE_ENQUEUE: &str = "engine::queue::enqueue";
/// The function a worker invokes first to name itself.
pub const WORKERS_REGISTER: &str = "engine::workers::register";

/// The routing engine of one simulated (or real) bus.
pub struct Engine {
    state: RefCell<Routing>,
    observer: Rc<dyn BusObserver>,
}

#[derive(Default)]
struct Routing {
    next_connection: u64,
    connections: BTreeMap<u64, Peer>,
    providers: BTreeMap<String, u64>,
    pending: BTreeMap<String, Route>,
}

struct Peer {
    name: String,
    outbox: mpsc::Sender<Message>,
}

struct Route {
    caller: Option<u64>,
    provider: u64,
    function_id: String,
}

impl Engine {
    pub fn new(observer: Rc<dyn BusObserver>) -> Rc<Self> {
        Rc::new(Self { state: RefCell::default(), observer })
    }

    /// Serves one worker connection until it closes or `cut` completes (the network between
    /// them was cut: the engine sees the connection drop, as the worker does on its side).
    pub async fn serve<S>(self: Rc<Self>, socket: WebSocketStream<S>, cut: impl std::future::Future<Output = ()>)
    where
        S: AsyncRead + AsyncWrite + Unpin + 'static,
    {
        let (mut sink, mut stream) = socket.split();
        let (outbox, mut outgoing) = mpsc::channel::<Message>(OUTBOX_CAPACITY);
        let id = {
            let mut state = self.state.borrow_mut();
            state.next_connection += 1;
            let id = state.next_connection;
            state.connections.insert(id, Peer { name: format!("worker-{id}"), outbox });
            id
        };
        let writer = tokio::task::spawn_local(async move {
            while let Some(message) = outgoing.recv().await {
                if sink.send(message).await.is_err() {
                    break;
                }
            }
        });
        self.send(id, Frame::WorkerRegistered { worker_id: format!("worker-{id}") });
        let reading = async {
            while let Some(Ok(message)) = stream.next().await {
                match message {
                    Message::Text(text) => match serde_json::from_str::<Frame>(&text) {
                        Ok(frame) => self.receive(id, frame),
                        Err(error) => {
                            self.observer.note("engine", "unreadable_frame", json!({ "error": error.to_string() }))
                        }
                    },
                    Message::Close(_) => break,
                    _ => {}
                }
            }
        };
        tokio::select! {
            biased;
            () = cut => {}
            () = reading => {}
        }
        self.disconnect(id);
        writer.abort();
    }

    fn peer_name(&self, id: u64) -> String {
        self.state.borrow().connections.get(&id).map_or_else(|| format!("worker-{id}"), |p| p.name.clone())
    }

    fn send(&self, to: u64, frame: Frame) {
        let name = self.peer_name(to);
        self.observer.frame(FrameDirection::Out, &name, &frame);
        let text = serde_json::to_string(&frame).expect("frames serialize");
        let full = {
            let state = self.state.borrow();
            let Some(peer) = state.connections.get(&to) else {
                return;
            };
            peer.outbox.try_send(Message::text(text)).is_err()
        };
        if full {
            // A worker that cannot keep up is cut off rather than buffered without bound.
            self.observer.note("engine", "outbox_full", json!({ "peer": name, "capacity": OUTBOX_CAPACITY }));
            self.disconnect(to);
        }
    }

    fn reply_error(&self, to: u64, invocation_id: String, function_id: String, error: ErrorBody) {
        self.send(to, Frame::InvocationResult { invocation_id, function_id, result: None, error: Some(error) });
    }

    fn receive(&self, from: u64, frame: Frame) {
        let name = self.peer_name(from);
        self.observer.frame(FrameDirection::In, &name, &frame);
        match frame {
            Frame::RegisterFunction { id, .. } => {
                self.state.borrow_mut().providers.insert(id, from);
            }
            Frame::InvokeFunction { invocation_id, function_id, data, action } => {
                self.route(from, invocation_id, function_id, data, action);
            }
            Frame::InvocationResult { invocation_id, result, error, .. } => {
                let route = self.state.borrow_mut().pending.remove(&invocation_id);
                // A result nobody waits for (late, or for a void call) is dropped here.
                if let Some(Route { caller: Some(caller), function_id, .. }) = route {
                    self.send(caller, Frame::InvocationResult { invocation_id, function_id, result, error });
                }
            }
            Frame::WorkerRegistered { .. } | Frame::Other => {}
        }
    }

    fn route(
        &self,
        from: u64,
        invocation_id: Option<String>,
        function_id: String,
        data: serde_json::Value,
        action: Option<Action>,
    ) {
        if function_id == WORKERS_REGISTER {
            if let (Some(name), Some(peer)) =
                (data.get("name").and_then(|n| n.as_str()), self.state.borrow_mut().connections.get_mut(&from))
            {
                peer.name = name.to_string();
            }
            let result = Some(json!({ "registered": true }));
            if let (Some(invocation_id), false) = (invocation_id, action == Some(Action::Void)) {
                self.send(from, Frame::InvocationResult { invocation_id, function_id, result, error: None });
            }
            return;
        }
        // A call without an id can get no answer: it is fire-and-forget whatever it says.
        let Some(invocation_id) = invocation_id else {
            return self.forward_void(function_id, data);
        };
        let (target, forwarded, caller) = match &action {
            Some(Action::Enqueue { queue }) => (
                QUEUE_ENQUEUE.to_string(),
                json!({ "queue": queue, "function_id": function_id, "data": data }),
                Some(from),
            ),
            Some(Action::Void) => (function_id.clone(), data, None),
            None => (function_id.clone(), data, Some(from)),
        };
        let provider = self.state.borrow().providers.get(&target).copied();
        let Some(provider) = provider else {
            if caller.is_some() {
                self.reply_error(from, invocation_id, function_id, ErrorBody::new(codes::FUNCTION_NOT_FOUND, target));
            }
            return;
        };
        self.state.borrow_mut().pending.insert(invocation_id.clone(), Route { caller, provider, function_id });
        self.send(
            provider,
            Frame::InvokeFunction {
                invocation_id: Some(invocation_id),
                function_id: target,
                data: forwarded,
                action: None,
            },
        );
    }

    /// Hands an id-less call to its provider, if any; nobody hears of the outcome.
    fn forward_void(&self, function_id: String, data: serde_json::Value) {
        let provider = self.state.borrow().providers.get(&function_id).copied();
        if let Some(provider) = provider {
            self.send(provider, Frame::InvokeFunction { invocation_id: None, function_id, data, action: None });
        }
    }

    fn disconnect(&self, id: u64) {
        let stopped: Vec<(String, Route)> = {
            let mut state = self.state.borrow_mut();
            if state.connections.remove(&id).is_none() {
                return;
            }
            state.providers.retain(|_, provider| *provider != id);
            let pending = std::mem::take(&mut state.pending);
            let (stopped, kept): (Vec<_>, Vec<_>) = pending.into_iter().partition(|(_, route)| route.provider == id);
            state.pending = kept.into_iter().collect();
            stopped
        };
        for (invocation_id, route) in stopped {
            if let Some(caller) = route.caller {
                let error = ErrorBody::new(codes::INVOCATION_STOPPED, "provider disconnected");
                self.reply_error(caller, invocation_id, route.function_id, error);
            }
        }
    }
}
