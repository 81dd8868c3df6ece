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
//! fire-and-forget call after their functions. A connection served under a fixed name
//! ([`Engine::serve_named`]: live mode names an external worker by the host it connects as)
//! keeps that name whatever the worker calls itself.
//!
//! An iii SDK worker that reconnects opens with `reattach {previous_worker_id}`: its earlier
//! connection is over (retired now if the engine has not noticed yet), and results of the calls
//! it made there are delivered on the new connection, since the SDK matches results by
//! invocation id whatever connection they come on. Only a connection of the same name may take
//! over another: a worker cannot reattach as someone else.
//!
//! Functions can have owners ([`Engine::reserve`]): live mode reserves the rig's own functions
//! (`state::get`, `model::generate`, `rig::config`, ...) for the rig's hosts, so a worker that
//! registers one is refused, with the reason noted, instead of taking the rig's place.
//!
//! A frame larger than the bus takes ([`super::websocket::FRAME_BYTES_MAX`]) is answered with a
//! close frame `1009` (message too big), as RFC 6455 says, not a dropped connection.

use super::local::{self, Outbox};
use super::protocol::{codes, Action, ErrorBody, Frame};
use super::{websocket, wire, BusObserver, FrameDirection, OUTBOX_CAPACITY};
use crate::trace::Label;
use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::Notify;
use tokio_tungstenite::tungstenite::{self, protocol::frame::coding::CloseCode, Message, Utf8Bytes};
use tokio_tungstenite::WebSocketStream;

/// How long the engine waits for its close frame to go out to a peer it closes, and then for the
/// peer to finish sending what it was sending: real time, and only on that path.
const CLOSE_GRACE: std::time::Duration = std::time::Duration::from_secs(2);

/// The function a queue worker provides for `enqueue` actions.
pub const QUEUE_ENQUEUE: &str = "engine::queue::enqueue";
/// The function a worker invokes first to name itself.
pub const WORKERS_REGISTER: &str = "engine::workers::register";

/// The routing engine of one simulated (or real) bus.
pub struct Engine {
    state: RefCell<Routing>,
    observer: Rc<dyn BusObserver>,
    /// Functions only the connection of one name may register: function -> owner.
    owners: RefCell<BTreeMap<String, String>>,
}

#[derive(Default)]
struct Routing {
    next_connection: u64,
    connections: BTreeMap<u64, Peer>,
    providers: BTreeMap<String, u64>,
    pending: BTreeMap<String, Route>,
}

struct Peer {
    /// Shared with every frame's report and kept in its trace event as it is (a count, not a
    /// copy, per frame).
    name: Label,
    /// Named by whoever serves the connection: `engine::workers::register` does not rename it.
    pinned: bool,
    outbox: Outbox<Message>,
    /// Fires when the engine itself ends the connection (a reattach retired it).
    retired: Rc<Notify>,
}

struct Route {
    caller: Option<u64>,
    provider: u64,
    function_id: String,
}

impl Engine {
    pub fn new(observer: Rc<dyn BusObserver>) -> Rc<Self> {
        Self::numbered_after(observer, 0)
    }

    /// An engine whose connections are numbered after `after`: a restarted engine on a live
    /// listener, so that a worker reattaching with an id the previous engine gave it cannot
    /// name one of this engine's connections.
    pub fn numbered_after(observer: Rc<dyn BusObserver>, after: u64) -> Rc<Self> {
        let state = Routing { next_connection: after, ..Routing::default() };
        Rc::new(Self { state: RefCell::new(state), observer, owners: RefCell::default() })
    }

    /// Reserves functions for their owners: a `registerfunction` of one from a connection of
    /// another name is refused (and reported to the observer).
    pub fn reserve(&self, owners: impl IntoIterator<Item = (String, String)>) {
        self.owners.borrow_mut().extend(owners);
    }

    /// How many invocations the engine has routed and not seen answered: a caller is waiting
    /// for each (live mode's quiet judgement needs to know).
    pub fn invocations_pending(&self) -> usize {
        self.state.borrow().pending.len()
    }

    /// How many connections have been numbered so far (the last number given).
    pub fn connections_numbered(&self) -> u64 {
        self.state.borrow().next_connection
    }

    /// Serves one worker connection until it closes or `cut` completes (the network between
    /// them was cut: the engine sees the connection drop, as the worker does on its side).
    pub async fn serve<S>(self: Rc<Self>, socket: WebSocketStream<S>, cut: impl std::future::Future<Output = ()>)
    where
        S: AsyncRead + AsyncWrite + Unpin + 'static,
    {
        self.serve_named(socket, None, cut).await;
    }

    /// [`Self::serve`], under a fixed peer name when `name` is given.
    pub async fn serve_named<S>(
        self: Rc<Self>,
        socket: WebSocketStream<S>,
        name: Option<String>,
        cut: impl std::future::Future<Output = ()>,
    ) where
        S: AsyncRead + AsyncWrite + Unpin + 'static,
    {
        let (mut sink, mut stream) = local::split(socket);
        let (outbox, mut outgoing) = local::outbox::<Message>(OUTBOX_CAPACITY);
        let retired = Rc::new(Notify::new());
        let id = {
            let mut state = self.state.borrow_mut();
            state.next_connection += 1;
            let id = state.next_connection;
            let (name, pinned) = match name {
                Some(name) => (Label::from(name), true),
                None => (Label::from(format!("worker-{id}")), false),
            };
            state.connections.insert(id, Peer { name, pinned, outbox, retired: Rc::clone(&retired) });
            id
        };
        self.observer.connected(&self.peer_name(id), &format!("worker-{id}"));
        // The writer hands the sink back once the outbox closes, for a close frame of the engine's own.
        let mut writer = tokio::task::spawn_local(async move {
            while let Some(message) = outgoing.recv().await {
                if sink.send(message).await.is_err() {
                    break;
                }
            }
            sink
        });
        self.send(id, Frame::WorkerRegistered { worker_id: format!("worker-{id}") });
        let reading = async {
            loop {
                match stream.next().await {
                    Some(Ok(Message::Text(text))) => match wire::decode_known(&text) {
                        Ok((frame, known)) => self.receive(id, frame, known),
                        Err(error) => {
                            self.observer.note("engine", "unreadable_frame", json!({ "error": error.to_string() }))
                        }
                    },
                    Some(Ok(Message::Close(_))) | None => return None,
                    Some(Ok(_)) => {}
                    Some(Err(tungstenite::Error::Capacity(error))) => return Some(error.to_string()),
                    Some(Err(_)) => return None,
                }
            }
        };
        let (why, too_big) = tokio::select! {
            biased;
            () = cut => ("the network was cut", None),
            () = retired.notified() => ("replaced by the worker's reconnection", None),
            too_big = reading => match too_big {
                Some(error) => ("it sent a frame larger than the bus takes", Some(error)),
                None => ("closed by the worker", None),
            },
        };
        let name = self.peer_name(id);
        self.disconnect(id, why);
        let Some(error) = too_big else { return writer.abort() };
        self.observer.note("engine", "frame_too_big", json!({ "peer": &*name, "error": error }));
        // The outbox closed with the connection: what was queued goes out, then the close.
        let Ok(Ok(sink)) = tokio::time::timeout(CLOSE_GRACE, &mut writer).await else { return writer.abort() };
        if let Some(socket) = stream.reunite(sink) {
            // Boxed: the rare path's state stays out of every connection task's future.
            Box::pin(websocket::refuse(socket, CloseCode::Size, &error, CLOSE_GRACE)).await;
        }
    }

    fn peer_name(&self, id: u64) -> Label {
        self.state.borrow().connections.get(&id).map_or_else(|| Label::from(format!("worker-{id}")), |p| p.name.clone())
    }

    fn send(&self, to: u64, frame: Frame) {
        self.send_known(to, frame, None);
    }

    /// [`Self::send`], with the frame's own text when it is known ([`wire::decode_known`]): a
    /// frame passed on unchanged is not written out again.
    fn send_known(&self, to: u64, frame: Frame, known: Option<Utf8Bytes>) {
        let name = self.peer_name(to);
        self.observer.frame(FrameDirection::Out, &name, &frame);
        let full = {
            let state = self.state.borrow();
            let Some(peer) = state.connections.get(&to) else {
                return;
            };
            let message = match known {
                Some(text) => wire::encode_known(frame, text),
                None => wire::encode(frame),
            };
            peer.outbox.try_send(message).is_err()
        };
        if full {
            // A worker that cannot keep up is cut off rather than buffered without bound.
            self.observer.note("engine", "outbox_full", json!({ "peer": &*name, "capacity": OUTBOX_CAPACITY }));
            self.disconnect(to, "its outbox was full");
        }
    }

    fn reply_error(&self, to: u64, invocation_id: String, function_id: String, error: ErrorBody) {
        self.send(to, Frame::InvocationResult { invocation_id, function_id, result: None, error: Some(error) });
    }

    /// Acts on a frame from connection `from`; `known` is its own text, when that is known
    /// ([`wire::decode_known`]).
    fn receive(&self, from: u64, frame: Frame, known: Option<Utf8Bytes>) {
        let name = self.peer_name(from);
        self.observer.frame(FrameDirection::In, &name, &frame);
        match frame {
            Frame::RegisterFunction { id, .. } => {
                let owner = self.owners.borrow().get(&id).cloned();
                match owner {
                    Some(owner) if *owner != *name => {
                        let why = format!(
                            "refused `registerfunction {id}` from `{name}`: `{id}` is the rig's own, served by `{owner}`"
                        );
                        self.observer.refused(&name, &why);
                    }
                    _ => {
                        self.state.borrow_mut().providers.insert(id, from);
                    }
                }
            }
            Frame::UnregisterFunction { id } => {
                let mut state = self.state.borrow_mut();
                if state.providers.get(&id) == Some(&from) {
                    state.providers.remove(&id);
                }
            }
            Frame::Reattach { previous_worker_id, .. } => self.reattach(from, &previous_worker_id),
            Frame::InvokeFunction { invocation_id, function_id, data, action } => {
                // Sent on as it came when it has no action: its text is the text to send.
                let known = known.filter(|_| action.is_none());
                self.route(from, invocation_id, function_id, data, action, known);
            }
            Frame::InvocationResult { invocation_id, function_id: answered, result, error } => {
                let route = self.state.borrow_mut().pending.remove(&invocation_id);
                // A result nobody waits for (late, or for a void call) is dropped here.
                if let Some(Route { caller: Some(caller), function_id, .. }) = route {
                    let known = known.filter(|_| answered == function_id);
                    let frame = Frame::InvocationResult { invocation_id, function_id, result, error };
                    self.send_known(caller, frame, known);
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
        known: Option<Utf8Bytes>,
    ) {
        if function_id == WORKERS_REGISTER {
            if let (Some(name), Some(peer)) =
                (data.get("name").and_then(|n| n.as_str()), self.state.borrow_mut().connections.get_mut(&from))
            {
                if !peer.pinned {
                    peer.name = Label::from(name);
                }
            }
            let result = Some(json!({ "registered": true }));
            if let (Some(invocation_id), false) = (invocation_id, action == Some(Action::Void)) {
                self.send(from, Frame::InvocationResult { invocation_id, function_id, result, error: None });
            }
            return;
        }
        // A call without an id can get no answer: it is fire-and-forget whatever it says.
        let Some(invocation_id) = invocation_id else {
            return self.forward_void(function_id, data, known);
        };
        let (target, forwarded, caller) = match &action {
            Some(Action::Enqueue { queue }) => {
                // The payload moved in: `json!` would write it out through its serializer, node
                // by node, to come to the same value.
                let mut fields = serde_json::Map::new();
                fields.insert("queue".into(), queue.as_str().into());
                fields.insert("function_id".into(), function_id.as_str().into());
                fields.insert("data".into(), data);
                (QUEUE_ENQUEUE.to_string(), Value::Object(fields), Some(from))
            }
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
        // Only a call without an action goes on as it came (`known` is `None` otherwise).
        let frame = Frame::InvokeFunction {
            invocation_id: Some(invocation_id),
            function_id: target,
            data: forwarded,
            action: None,
        };
        self.send_known(provider, frame, known);
    }

    /// Hands an id-less call to its provider, if any; nobody hears of the outcome.
    fn forward_void(&self, function_id: String, data: serde_json::Value, known: Option<Utf8Bytes>) {
        let provider = self.state.borrow().providers.get(&function_id).copied();
        if let Some(provider) = provider {
            let frame = Frame::InvokeFunction { invocation_id: None, function_id, data, action: None };
            self.send_known(provider, frame, known);
        }
    }

    /// A worker reconnected as `from`: its connection `previous` (its `worker_id`) is over, and
    /// the results of the calls it made there go to the new connection.
    fn reattach(&self, from: u64, previous: &str) {
        let Some(old) = previous.strip_prefix("worker-").and_then(|n| n.parse::<u64>().ok()) else {
            return;
        };
        if old == from {
            return;
        }
        let (name, old_name) =
            (self.peer_name(from), self.state.borrow().connections.get(&old).map(|p| p.name.clone()));
        if let Some(old_name) = old_name.filter(|old_name| *old_name != name) {
            let why = format!("refused `reattach {previous}` from `{name}`: that connection is `{old_name}`'s");
            return self.observer.refused(&name, &why);
        }
        let retired = self.state.borrow().connections.get(&old).map(|peer| Rc::clone(&peer.retired));
        if let Some(retired) = retired {
            self.disconnect(old, "replaced by the worker's reconnection");
            retired.notify_one();
        }
        for route in self.state.borrow_mut().pending.values_mut() {
            if route.caller == Some(old) {
                route.caller = Some(from);
            }
        }
    }

    fn disconnect(&self, id: u64, why: &str) {
        let (name, stopped): (Label, Vec<(String, Route)>) = {
            let mut state = self.state.borrow_mut();
            // Its outbox goes here, before the replies below wake anyone: the order tasks wake
            // in is part of a simulated run.
            let Some(Peer { name, .. }) = state.connections.remove(&id) else {
                return;
            };
            state.providers.retain(|_, provider| *provider != id);
            let pending = std::mem::take(&mut state.pending);
            let (stopped, kept): (Vec<_>, Vec<_>) = pending.into_iter().partition(|(_, route)| route.provider == id);
            state.pending = kept.into_iter().collect();
            (name, stopped)
        };
        self.observer.disconnected(&name, why);
        for (invocation_id, route) in stopped {
            if let Some(caller) = route.caller {
                let error = ErrorBody::new(codes::INVOCATION_STOPPED, "provider disconnected");
                self.reply_error(caller, invocation_id, route.function_id, error);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bus::websocket;
    use serde_json::Value;
    use tokio::io::DuplexStream;

    struct Silent;

    impl BusObserver for Silent {
        fn frame(&self, _direction: FrameDirection, _peer: &Label, _frame: &Frame) {}
        fn note(&self, _host: &str, _what: &str, _detail: Value) {}
    }

    /// Keeps what the engine refused and noted.
    #[derive(Default)]
    struct Notes(RefCell<Vec<String>>);

    impl BusObserver for Notes {
        fn frame(&self, _direction: FrameDirection, _peer: &Label, _frame: &Frame) {}
        fn note(&self, _host: &str, what: &str, detail: Value) {
            self.0.borrow_mut().push(format!("{what} {detail}"));
        }
        fn refused(&self, _peer: &str, why: &str) {
            self.0.borrow_mut().push(why.to_string());
        }
    }

    type Client = WebSocketStream<DuplexStream>;

    async fn connect(engine: &Rc<Engine>) -> Client {
        connect_named(engine, None).await
    }

    /// A connection the engine serves under `name`, as live mode names every connection.
    async fn connect_named(engine: &Rc<Engine>, name: Option<&str>) -> Client {
        let (client, server) = tokio::io::duplex(64 * 1024);
        let (engine, name) = (Rc::clone(engine), name.map(str::to_string));
        tokio::task::spawn_local(async move {
            let socket = websocket::accept(server).await.expect("handshake");
            engine.serve_named(socket, name, std::future::pending()).await;
        });
        websocket::connect(client, "engine", "/", [7; 16]).await.expect("handshake")
    }

    fn on_a_local_runtime(test: impl std::future::Future<Output = ()>) {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
        tokio::task::LocalSet::new().block_on(&runtime, test);
    }

    /// Issue 21: a live worker registered `state::get` and closed, and the run hung; with
    /// `model::generate`, the real worker's turn failed `function_not_found`.
    #[test]
    fn a_reserved_function_stays_with_its_owner() {
        on_a_local_runtime(async {
            let notes = Rc::new(Notes::default());
            let engine = Engine::new(Rc::clone(&notes) as Rc<dyn BusObserver>);
            engine.reserve([("state::get".to_string(), "store".to_string())]);
            let mut store = connect_named(&engine, Some("store")).await;
            assert_eq!(next(&mut store).await["type"], "workerregistered");
            send(&mut store, json!({"type": "registerfunction", "id": "state::get"})).await;
            let mut hostile = connect_named(&engine, Some("harness")).await;
            next(&mut hostile).await;
            send(&mut hostile, json!({"type": "registerfunction", "id": "state::get"})).await;
            send(&mut hostile, json!({"type": "registerfunction", "id": "harness::turn"})).await;
            send(&mut hostile, json!({"type": "invokefunction", "invocation_id": "i1", "function_id": "state::get"}))
                .await;
            assert_eq!(next(&mut store).await["invocation_id"], "i1", "the store still serves state::get");
            drop(hostile);
            let mut caller = connect(&engine).await;
            next(&mut caller).await;
            send(&mut caller, json!({"type": "invokefunction", "invocation_id": "i2", "function_id": "state::get"}))
                .await;
            assert_eq!(next(&mut store).await["invocation_id"], "i2", "and after the worker that tried has gone");
            let notes = notes.0.borrow();
            assert!(
                notes.iter().any(|n| n.contains("refused `registerfunction state::get` from `harness`")),
                "{notes:?}"
            );
            assert!(
                !notes.iter().any(|n| n.contains("harness::turn")),
                "an unreserved function is the worker's: {notes:?}"
            );
        });
    }

    /// Issue 21: `reattach` naming an internal worker's id gave the connection that worker's
    /// identity: its connection was retired and its results rerouted.
    #[test]
    fn a_worker_cannot_reattach_as_another_host() {
        on_a_local_runtime(async {
            let notes = Rc::new(Notes::default());
            let engine = Engine::new(Rc::clone(&notes) as Rc<dyn BusObserver>);
            let mut store = connect_named(&engine, Some("store")).await;
            let store_id = next(&mut store).await["worker_id"].clone();
            send(&mut store, json!({"type": "registerfunction", "id": "state::get"})).await;
            send(&mut store, json!({"type": "invokefunction", "invocation_id": "s1", "function_id": "nobody"})).await;
            assert_eq!(next(&mut store).await["error"]["code"], codes::FUNCTION_NOT_FOUND);
            let mut hostile = connect_named(&engine, Some("harness")).await;
            next(&mut hostile).await;
            send(&mut hostile, json!({"type": "reattach", "previous_worker_id": store_id})).await;
            send(&mut hostile, json!({"type": "invokefunction", "invocation_id": "i1", "function_id": "state::get"}))
                .await;
            assert_eq!(next(&mut store).await["invocation_id"], "i1", "the store's connection is still the store's");
            assert!(
                notes.0.borrow().iter().any(|n| n.contains("refused `reattach") && n.contains("`store`'s")),
                "{:?}",
                notes.0.borrow()
            );
        });
    }

    /// Issue 21: a 64 MiB frame dropped the connection with no close frame (the peer saw 1006).
    #[test]
    fn a_frame_too_big_for_the_bus_is_answered_1009() {
        on_a_local_runtime(async {
            let notes = Rc::new(Notes::default());
            let engine = Engine::new(Rc::clone(&notes) as Rc<dyn BusObserver>);
            let client = connect(&engine).await;
            let (mut sink, mut stream) = client.split();
            let too_big = vec![b'x'; websocket::FRAME_BYTES_MAX + 1];
            // Sent while the engine closes: it reads (and discards) the rest, so the send ends.
            let sending = tokio::task::spawn_local(async move { sink.send(Message::binary(too_big)).await });
            let close = loop {
                let message = tokio::time::timeout(std::time::Duration::from_secs(10), stream.next())
                    .await
                    .expect("an answer within 10 s");
                match message {
                    Some(Ok(Message::Close(frame))) => break frame,
                    Some(Ok(_)) => continue,
                    other => panic!("the connection ended without a close frame: {other:?}"),
                }
            };
            assert_eq!(close.map(|c| c.code), Some(CloseCode::Size));
            let _ = sending.await;
            assert!(notes.0.borrow().iter().any(|n| n.starts_with("frame_too_big")), "{:?}", notes.0.borrow());
        });
    }

    async fn send(client: &mut Client, frame: Value) {
        client.send(Message::text(frame.to_string())).await.expect("send");
    }

    async fn next(client: &mut Client) -> Value {
        loop {
            let message = tokio::time::timeout(std::time::Duration::from_secs(5), client.next())
                .await
                .expect("a frame within 5 s")
                .expect("open")
                .expect("readable");
            if let Message::Text(text) = message {
                return serde_json::from_str(&text).expect("JSON");
            }
        }
    }

    /// As an iii SDK worker reconnects: a result for a call it made on its old connection
    /// reaches it on the new one, and a function it withdraws is no longer routed to it.
    #[test]
    fn a_reattached_worker_gets_its_results_and_unregistered_functions_are_gone() {
        on_a_local_runtime(async {
            let engine = Engine::new(Rc::new(Silent));
            let mut provider = connect(&engine).await;
            assert_eq!(next(&mut provider).await["type"], "workerregistered");
            send(&mut provider, json!({"type": "registerfunction", "id": "f"})).await;
            let mut caller = connect(&engine).await;
            let first_id = next(&mut caller).await["worker_id"].clone();
            send(&mut caller, json!({"type": "invokefunction", "invocation_id": "i1", "function_id": "f"})).await;
            assert_eq!(next(&mut provider).await["invocation_id"], "i1");
            drop(caller);
            let mut again = connect(&engine).await;
            assert_eq!(next(&mut again).await["type"], "workerregistered");
            send(&mut again, json!({"type": "reattach", "previous_worker_id": first_id})).await;
            // A round trip on the same connection: the engine has read the reattach before it.
            send(&mut again, json!({"type": "invokefunction", "invocation_id": "p", "function_id": "nobody"})).await;
            assert_eq!(next(&mut again).await["error"]["code"], codes::FUNCTION_NOT_FOUND);
            send(
                &mut provider,
                json!({"type": "invocationresult", "invocation_id": "i1", "function_id": "f", "result": 1}),
            )
            .await;
            let result = next(&mut again).await;
            assert_eq!((result["invocation_id"].as_str(), result["result"].as_i64()), (Some("i1"), Some(1)));
            send(&mut provider, json!({"type": "unregisterfunction", "id": "f"})).await;
            send(&mut again, json!({"type": "invokefunction", "invocation_id": "i2", "function_id": "f"})).await;
            assert_eq!(next(&mut again).await["error"]["code"], codes::FUNCTION_NOT_FOUND);
        });
    }
}
