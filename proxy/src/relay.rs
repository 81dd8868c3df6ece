//! The forwarding core: one client, one upstream, rules in between.
//!
//! It is the same code on real sockets and in the rig's simulated network, so it is generic over
//! the stream type and takes everything that differs between the two worlds from a [`ProxyEnv`]:
//! the clock, sleeping and the record of frames. It never spawns, never reads the wall clock,
//! never touches a tokio timer and never draws unseeded randomness; both directions run in the
//! one future it returns, polled in a fixed order, and frames held by `delay` rules wait in a
//! queue inside it, each with its own release time; a frame a `reorder` rule holds waits beside
//! that queue for its partner, or its limit.

use crate::rule::{Action, Decision, Direction, FrameKind, RuleHit, RuleSet};
use crate::wire::{CloseWitness, Wire};
use futures_util::future::{poll_fn, select, Either, FutureExt};
use futures_util::{Sink, Stream};
use serde::Serialize;
use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_tungstenite::tungstenite::error::ProtocolError;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::{Error as WsError, Message};
use tokio_tungstenite::WebSocketStream;

/// How long, after one side has closed, the relay waits for the close handshake to finish.
pub const CLOSE_GRACE_MS: u64 = 1_000;
/// The most payload bytes one direction holds for `delay` rules (a frame larger than this is
/// still held when it is the only one). While the limit is reached the direction reads
/// nothing more, as when its destination stops reading.
pub const MAX_HELD_BYTES: usize = 4 * 1024 * 1024;
/// What a held frame costs beyond its payload, for the limit above.
const HELD_FRAME_OVERHEAD: usize = 64;

/// What the relay needs from the world around it.
pub trait ProxyEnv {
    /// Microseconds since the proxy started (real mode) or simulated time.
    fn now_us(&self) -> u64;
    /// A future that completes `ms` milliseconds from now.
    fn sleep(&self, ms: u64) -> Pin<Box<dyn Future<Output = ()> + '_>>;
    /// Called once for every frame read from either peer, after the rules decided on it.
    fn record(&self, record: &FrameRecord<'_>);
    /// Whether [`record`](Self::record) does anything. An environment that keeps no record
    /// returns `false`, and the relay then skips building one (reading the clock for each
    /// frame is a measurable share of the relay's time).
    fn records(&self) -> bool {
        true
    }
    /// A future that completes when the proxy is stopping: the relay then closes both peers
    /// with `1001` and ends with [`RelayEnd::Shutdown`]. By default it never completes.
    fn stopping(&self) -> Pin<Box<dyn Future<Output = ()> + '_>> {
        Box::pin(std::future::pending())
    }
}

/// One frame as the log and the simulation trace see it.
#[derive(Clone, Debug, Serialize)]
pub struct FrameRecord<'a> {
    /// Microseconds from [`ProxyEnv::now_us`] when the frame was read.
    pub t_us: u64,
    pub conn: u64,
    pub direction: Direction,
    pub kind: FrameKind,
    /// Payload bytes (for a close frame: code and reason).
    pub size: usize,
    /// Index of the rule that fired, in the rule set at that moment.
    pub rule: Option<usize>,
    pub rule_name: Option<&'a str>,
    /// `forward`, `drop`, `delay`, `duplicate`, `close` or `reorder` (held for its partner), or
    /// `refuse` for a close frame whose code may not be sent (`message` is the frame as it
    /// arrived). A frame `reorder` held is recorded again when it leaves: `reordered` right
    /// behind its partner, `reorder-expired` at its limit with no partner seen.
    pub action: &'static str,
    /// The frame itself, for a log that wants payloads.
    #[serde(skip)]
    pub message: &'a Message,
}

/// Which peer of a relay.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Side {
    Client,
    Upstream,
}

impl Side {
    fn source_of(direction: Direction) -> Side {
        match direction {
            Direction::Up => Side::Client,
            Direction::Down => Side::Upstream,
        }
    }

    fn other(self) -> Side {
        match self {
            Side::Client => Side::Upstream,
            Side::Upstream => Side::Client,
        }
    }

    fn as_str(self) -> &'static str {
        match self {
            Side::Client => "client",
            Side::Upstream => "upstream",
        }
    }
}

/// Why a relay ended.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "end", rename_all = "snake_case")]
pub enum RelayEnd {
    /// A peer sent a close frame; it was forwarded to the other peer unchanged.
    Closed { by: Side, code: Option<u16>, reason: String },
    /// A `close` rule fired; both peers were sent this code and reason.
    RuleClose { rule: String, code: u16, reason: String },
    /// A peer went away without a close frame (EOF, reset, or a protocol error). The other
    /// peer's connection was dropped without one too, so it sees an abnormal closure (1006)
    /// just as it would without the proxy; the faulty peer was sent `code` if one applies.
    Dropped { side: Side, error: String, code: Option<u16> },
    /// A peer sent a close frame with a code no peer may send (`received`; RFC 6455 section
    /// 7.4). It cannot be passed on: the proxy answered that peer `1002`, and closed the
    /// other peer with `code` (`1002`) itself.
    InvalidClose { by: Side, received: u16, code: u16 },
    /// The proxy is stopping: both peers were sent `code` (`1001`, going away).
    Shutdown { code: u16 },
}

/// The rules a relay consults: shared with the admin endpoint and the other connections.
pub type SharedRules = Rc<RefCell<RuleSet>>;

/// The frame's JSON, if it is a text frame holding JSON. Binary frames never are.
pub fn frame_json(message: &Message) -> Option<serde_json::Value> {
    match message {
        Message::Text(text) => serde_json::from_str(text.as_str()).ok(),
        _ => None,
    }
}

/// The kind and payload size of a frame.
pub fn frame_kind(message: &Message) -> (FrameKind, usize) {
    match message {
        Message::Text(t) => (FrameKind::Text, t.len()),
        Message::Binary(b) => (FrameKind::Binary, b.len()),
        Message::Ping(b) => (FrameKind::Ping, b.len()),
        Message::Pong(b) => (FrameKind::Pong, b.len()),
        Message::Close(c) => (FrameKind::Close, c.as_ref().map_or(0, |c| 2 + c.reason.len())),
        // Never produced by reading; counted as binary so the match stays total.
        Message::Frame(f) => (FrameKind::Binary, f.payload().len()),
    }
}

/// How one direction's pump ended.
enum PumpEnd {
    /// The source sent a close frame; it was passed on (or, with an invalid code, answered by
    /// the proxy) and the source drained.
    Closed,
    /// A `close` rule fired.
    RuleClose { rule: String, code: u16, reason: String },
    /// The source failed or ended without a close frame.
    SourceGone { error: String, code: Option<u16> },
    /// Writing to the destination failed: it went away.
    DestGone { error: String },
}

/// The first close frame either peer sent: who sent it, the frame, and for a frame whose code
/// may not be sent, that code (the frame is then the one the proxy sent instead).
struct CloseSeen {
    by: Side,
    frame: Option<CloseFrame>,
    invalid_code: Option<u16>,
}

type FirstClose = RefCell<Option<CloseSeen>>;

/// The close code owed to a peer whose read failed, when it broke the protocol.
fn close_code_for(error: &WsError) -> Option<u16> {
    match error {
        WsError::Capacity(_) => Some(1009),
        WsError::Utf8(_) => Some(1007),
        WsError::Protocol(ProtocolError::ResetWithoutClosingHandshake) => None,
        WsError::Protocol(_) => Some(1002),
        _ => None,
    }
}

/// One WebSocket of a relay, read by one direction and written by the other. Both directions
/// run in one task, so each borrow lasts one poll and never meets the other's.
type Socket<S> = RefCell<WebSocketStream<Wire<S>>>;

async fn next_message<S: AsyncRead + AsyncWrite + Unpin>(socket: &Socket<S>) -> Option<Result<Message, WsError>> {
    poll_fn(|cx| Pin::new(&mut *socket.borrow_mut()).poll_next(cx)).await
}

/// Waits, if the socket had stopped taking bytes, until what was queued has been written out.
async fn ready<S: AsyncRead + AsyncWrite + Unpin>(socket: &Socket<S>) -> Result<(), WsError> {
    poll_fn(|cx| Pin::new(&mut *socket.borrow_mut()).poll_ready(cx)).await
}

/// Queues a message for `socket` (after [`ready`]).
async fn feed<S: AsyncRead + AsyncWrite + Unpin>(socket: &Socket<S>, message: Message) -> Result<(), WsError> {
    ready(socket).await?;
    Pin::new(&mut *socket.borrow_mut()).start_send(message)
}

async fn flush<S: AsyncRead + AsyncWrite + Unpin>(socket: &Socket<S>) -> Result<(), WsError> {
    poll_fn(|cx| Pin::new(&mut *socket.borrow_mut()).poll_flush(cx)).await
}

async fn send<S: AsyncRead + AsyncWrite + Unpin>(socket: &Socket<S>, message: Message) -> Result<(), WsError> {
    feed(socket, message).await?;
    flush(socket).await
}

/// Reads a peer until its connection ends, so a pending close reply gets flushed.
async fn drain<S: AsyncRead + AsyncWrite + Unpin>(socket: &Socket<S>) {
    // Bounded: after a close frame tungstenite yields nothing but the end of the stream.
    for _ in 0..64 {
        match next_message(socket).await {
            Some(Ok(_)) => {}
            Some(Err(_)) | None => return,
        }
    }
}

/// Closes a peer that broke the protocol: sends it `code`, ends the proxy's side of the TCP
/// stream, and reads (and discards) whatever it is still sending until it closes its side.
/// Closing with unread bytes would make the kernel answer with a reset, and the peer would
/// lose the close frame.
async fn refuse<S: AsyncRead + AsyncWrite + Unpin>(socket: &Socket<S>, code: u16, reason: &str) {
    let _ = send(socket, close_message(code, reason)).await;
    // Each borrow lasts one poll, as everywhere in the relay.
    let _ = poll_fn(|cx| Pin::new(socket.borrow_mut().get_mut()).poll_shutdown(cx)).await;
    let mut sink = [0u8; 4096];
    loop {
        let read = poll_fn(|cx| {
            let mut buffer = ReadBuf::new(&mut sink);
            Pin::new(socket.borrow_mut().get_mut()).poll_read(cx, &mut buffer).map_ok(|()| buffer.filled().len())
        })
        .await;
        if !matches!(read, Ok(n) if n > 0) {
            return;
        }
    }
}

/// A frame held back by a `delay` rule (or queued behind one), and when it may leave.
struct Held {
    message: Message,
    /// [`ProxyEnv::now_us`] time after which it may leave; 0 for "as soon as it is first".
    release_us: u64,
}

impl Held {
    fn cost(&self) -> usize {
        frame_kind(&self.message).1 + HELD_FRAME_OVERHEAD
    }
}

/// A frame a `reorder` rule holds until its partner has passed; `frame.release_us` is the
/// limit after which it leaves anyway.
struct Reordered {
    frame: Held,
    rule: RuleHit,
}

/// A copy of a message that owns its payload alone: a payload read from the socket shares
/// its allocation with the frames read with it, which a held frame must not keep alive.
fn detached(message: Message) -> Message {
    match message {
        Message::Text(text) => Message::text(text.as_str().to_owned()),
        Message::Binary(bytes) => Message::binary(bytes.to_vec()),
        other => other,
    }
}

/// The close frame as it arrived, when tungstenite replaced one whose code may not be sent.
fn invalid_close(frame: &Option<CloseFrame>, witness: &CloseWitness) -> Option<(u16, String)> {
    let frame = frame.as_ref()?;
    if frame.code != CloseCode::Protocol || frame.reason.as_str() != "Protocol violation" {
        return None;
    }
    match witness.last_close()? {
        (Some(code), reason) if !CloseCode::from(code).is_allowed() => Some((code, reason)),
        _ => None,
    }
}

struct Pump<'a, C, U, E> {
    direction: Direction,
    first_close: &'a FirstClose,
    conn: u64,
    rules: &'a SharedRules,
    env: &'a E,
    source: &'a Socket<C>,
    witness: CloseWitness,
    dest: &'a Socket<U>,
    /// When the last frame this direction holds may leave (0 when it holds none).
    held_until_us: &'a Cell<u64>,
}

impl<C, U, E> Pump<'_, C, U, E>
where
    C: AsyncRead + AsyncWrite + Unpin,
    U: AsyncRead + AsyncWrite + Unpin,
    E: ProxyEnv,
{
    fn record(&self, kind: FrameKind, size: usize, decision: &Decision, action: &'static str, message: &Message) {
        if self.env.records() {
            self.env.record(&FrameRecord {
                t_us: self.env.now_us(),
                conn: self.conn,
                direction: self.direction,
                kind,
                size,
                rule: decision.rule.as_ref().map(|r| r.index),
                rule_name: decision.rule.as_ref().map(|r| r.name.as_str()),
                action,
                message,
            });
        }
    }

    /// Notes the source's close frame; returns the frame to send on, and whether it replaces
    /// one whose code may not be sent.
    fn note_close(&self, frame: Option<CloseFrame>) -> Option<Message> {
        let by = Side::source_of(self.direction);
        let invalid = invalid_close(&frame, &self.witness);
        let (frame, invalid_code) = match invalid {
            Some((code, reason)) => {
                let arrived = Message::Close(Some(CloseFrame { code: CloseCode::from(code), reason: reason.into() }));
                let (kind, size) = frame_kind(&arrived);
                self.record(kind, size, &Decision::forward(), "refuse", &arrived);
                let reason = format!("proxy: the {} sent close code {code}, which may not be sent", by.as_str());
                (Some(CloseFrame { code: CloseCode::Protocol, reason: reason.into() }), Some(code))
            }
            None => {
                let message = Message::Close(frame);
                let (kind, size) = frame_kind(&message);
                self.record(kind, size, &Decision::forward(), "forward", &message);
                let Message::Close(frame) = message else { unreachable!("built as a close frame above") };
                (frame, None)
            }
        };
        let mut first = self.first_close.borrow_mut();
        // Only the first close frame is passed on: the other is the reply to it, which the
        // proxy already sent on that hop.
        if first.is_some() {
            return None;
        }
        *first = Some(CloseSeen { by, frame: frame.clone(), invalid_code });
        Some(Message::Close(frame))
    }

    /// Sends the close frame on (if it is the first) and reads the source until it ends.
    async fn pass_close(&self, close: Option<Message>) -> PumpEnd {
        if let Some(close) = close {
            let _ = send(self.dest, close).await;
        }
        let _ = select(Box::pin(drain(self.source)), self.env.sleep(CLOSE_GRACE_MS)).await;
        PumpEnd::Closed
    }

    /// Records a frame a `reorder` rule held as it leaves.
    fn record_release(&self, reordered: &Reordered, action: &'static str) {
        let (kind, size) = frame_kind(&reordered.frame.message);
        let decision = Decision { rule: Some(reordered.rule.clone()), action: Action::Forward };
        self.record(kind, size, &decision, action, &reordered.frame.message);
    }

    /// Sends a frame on now, or behind the frames `delay` holds, keeping its place.
    async fn pass_on(
        &self,
        held: &mut VecDeque<Held>,
        held_bytes: &mut usize,
        message: Message,
    ) -> Result<(), PumpEnd> {
        if held.is_empty() {
            return feed(self.dest, message).await.map_err(|e| PumpEnd::DestGone { error: e.to_string() });
        }
        let frame = Held { message, release_us: 0 };
        *held_bytes += frame.cost();
        held.push_back(frame);
        Ok(())
    }

    /// When the next held frame may leave: the first `delay` holds, or a `reorder` limit.
    fn next_release_us(held: &VecDeque<Held>, reordered: &[Reordered]) -> Option<u64> {
        let limits = reordered.iter().map(|r| r.frame.release_us);
        held.front().map(|f| f.release_us).into_iter().chain(limits).min()
    }

    async fn run(self) -> PumpEnd {
        let mut held: VecDeque<Held> = VecDeque::new();
        let mut held_bytes = 0usize;
        // Frames `reorder` rules hold for their partners, in the order they arrived.
        let mut reordered: Vec<Reordered> = Vec::new();
        // The close frame read from the source while frames were held; it leaves after them.
        let mut held_close: Option<Option<Message>> = None;
        loop {
            // Held frames whose time has come leave, in order.
            while let Some(front) = held.front() {
                if front.release_us > self.env.now_us() {
                    break;
                }
                let Some(frame) = held.pop_front() else { break };
                held_bytes -= frame.cost();
                if let Err(e) = feed(self.dest, frame.message).await {
                    return PumpEnd::DestGone { error: e.to_string() };
                }
            }
            // A reordered frame whose partner never came leaves at its limit.
            while let Some(index) = reordered.iter().position(|r| r.frame.release_us <= self.env.now_us()) {
                let expired = reordered.remove(index);
                held_bytes -= expired.frame.cost();
                self.record_release(&expired, "reorder-expired");
                if let Err(end) = self.pass_on(&mut held, &mut held_bytes, expired.frame.message).await {
                    return end;
                }
            }
            if held.is_empty() && reordered.is_empty() {
                self.held_until_us.set(0);
                if let Some(close) = held_close.take() {
                    return self.pass_close(close).await;
                }
            }
            // Nothing more is read while the destination has not taken what it was given: a
            // peer that does not read makes the proxy hold one message for it, not two.
            if let Err(e) = ready(self.dest).await {
                return PumpEnd::DestGone { error: e.to_string() };
            }
            let room =
                held_close.is_none() && ((held.is_empty() && reordered.is_empty()) || held_bytes < MAX_HELD_BYTES);
            // Frames already buffered are written without a flush in between, and the
            // destination is flushed once the source has nothing ready: batching under load,
            // no added latency when idle.
            let buffered = if room {
                poll_fn(|cx| Pin::new(&mut *self.source.borrow_mut()).poll_next(cx)).now_or_never()
            } else {
                None
            };
            let next = match buffered {
                Some(next) => next,
                None => {
                    if let Err(e) = flush(self.dest).await {
                        return PumpEnd::DestGone { error: e.to_string() };
                    }
                    match Self::next_release_us(&held, &reordered) {
                        None => next_message(self.source).await,
                        Some(release_us) => {
                            let wait_ms = release_us.saturating_sub(self.env.now_us()).div_ceil(1000);
                            tokio::select! {
                                biased;
                                next = next_message(self.source), if room => next,
                                () = self.env.sleep(wait_ms) => continue,
                            }
                        }
                    }
                }
            };
            let message = match next {
                Some(Ok(message)) => message,
                ended => {
                    // Frames the source sent before it went away are still owed to the other
                    // peer: pass on what is held and buffered (within the grace period) before
                    // the relay drops both connections.
                    let owed = async {
                        let reordered = reordered.drain(..).map(|r| r.frame);
                        for frame in held.drain(..).chain(reordered) {
                            let wait_ms = frame.release_us.saturating_sub(self.env.now_us()).div_ceil(1000);
                            if wait_ms > 0 {
                                self.env.sleep(wait_ms).await;
                            }
                            if feed(self.dest, frame.message).await.is_err() {
                                return;
                            }
                        }
                        let _ = flush(self.dest).await;
                    };
                    let _ = select(Box::pin(owed), self.env.sleep(CLOSE_GRACE_MS)).await;
                    return match ended {
                        Some(Err(error)) => {
                            PumpEnd::SourceGone { code: close_code_for(&error), error: error.to_string() }
                        }
                        _ => PumpEnd::SourceGone { error: "connection ended without a close frame".into(), code: None },
                    };
                }
            };
            let (kind, size) = frame_kind(&message);
            if let Message::Close(frame) = message {
                let close = self.note_close(frame);
                if held.is_empty() && reordered.is_empty() {
                    return self.pass_close(close).await;
                }
                held_close = Some(close);
                continue;
            }
            if !matches!(kind, FrameKind::Text | FrameKind::Binary) {
                // Control frames are never cut or held: a keepalive ping passes a delayed frame.
                self.record(kind, size, &Decision::forward(), "forward", &message);
                if let Err(e) = feed(self.dest, message).await {
                    return PumpEnd::DestGone { error: e.to_string() };
                }
                continue;
            }
            let (decision, partner) = {
                let text = match &message {
                    Message::Text(text) => Some(text.as_str()),
                    _ => None,
                };
                let rules = &self.rules;
                // The partner of a held frame: the next frame its rule selects. That rule does
                // not take it again; any other rule may.
                let partner =
                    reordered.iter().position(|r| rules.borrow().selects(&r.rule.name, self.direction, kind, text));
                let except = partner.map(|index| reordered[index].rule.name.clone());
                (rules.borrow_mut().decide_frame_except(self.direction, kind, text, except.as_deref()), partner)
            };
            self.record(kind, size, &decision, decision.action.as_str(), &message);
            let copies = match decision.action {
                Action::Forward => 1,
                Action::Drop => 0,
                Action::Duplicate => 2,
                Action::Delay(ms) => {
                    // Each delayed frame is held for its own delay from its arrival; frames
                    // behind it wait for it, so order is kept.
                    let release_us = self.env.now_us().saturating_add(ms.saturating_mul(1000)).max(1);
                    let frame = Held { message: detached(message), release_us };
                    held_bytes += frame.cost();
                    self.held_until_us.set(self.held_until_us.get().max(release_us));
                    held.push_back(frame);
                    // A delayed partner still passes first: what it released queues behind it.
                    if let Some(index) = partner {
                        let released = reordered.remove(index);
                        self.record_release(&released, "reordered");
                        held.push_back(Held { message: released.frame.message, release_us: 0 });
                    }
                    continue;
                }
                Action::Close { code, reason } => {
                    return PumpEnd::RuleClose { rule: decision.rule.map(|r| r.name).unwrap_or_default(), code, reason }
                }
                Action::Reorder(ms) => {
                    let release_us = self.env.now_us().saturating_add(ms.saturating_mul(1000)).max(1);
                    let frame = Held { message: detached(message), release_us };
                    held_bytes += frame.cost();
                    self.held_until_us.set(self.held_until_us.get().max(release_us));
                    let rule = decision.rule.expect("a rule decided to reorder");
                    reordered.push(Reordered { frame, rule });
                    continue;
                }
            };
            let mut remaining = copies;
            let mut message = Some(message);
            while remaining > 0 {
                remaining -= 1;
                let this = if remaining > 0 { message.clone() } else { message.take() };
                let Some(this) = this else { break };
                if held.is_empty() {
                    if let Err(e) = feed(self.dest, this).await {
                        return PumpEnd::DestGone { error: e.to_string() };
                    }
                } else {
                    // Behind a held frame: it keeps its place.
                    let frame = Held { message: detached(this), release_us: 0 };
                    held_bytes += frame.cost();
                    held.push_back(frame);
                }
            }
            // The partner has passed (unless a rule dropped it): the frame held for it follows.
            if let (Some(index), true) = (partner, copies > 0) {
                let released = reordered.remove(index);
                held_bytes -= released.frame.cost();
                self.record_release(&released, "reordered");
                if let Err(end) = self.pass_on(&mut held, &mut held_bytes, released.frame.message).await {
                    return end;
                }
            }
        }
    }
}

fn close_message(code: u16, reason: &str) -> Message {
    Message::Close(Some(CloseFrame { code: CloseCode::from(code), reason: reason.to_string().into() }))
}

/// Waits for a pump still running after the other ended, at most the grace period after the
/// last frame it holds may leave.
async fn finish<E: ProxyEnv>(env: &E, other: Pin<Box<dyn Future<Output = PumpEnd> + '_>>, held_until_us: u64) {
    let wait_ms = CLOSE_GRACE_MS + held_until_us.saturating_sub(env.now_us()).div_ceil(1000);
    let _ = select(other, env.sleep(wait_ms)).await;
}

/// Forwards frames between `client` and `upstream` until either side closes, applying `rules`.
///
/// Both directions run concurrently inside this one future, polled client-to-upstream first;
/// each forwards with backpressure (no queue of its own beyond the frames `delay` rules
/// hold). A peer's close frame is forwarded unchanged to the other peer and the relay then
/// waits up to [`CLOSE_GRACE_MS`] for the close handshakes to finish. A peer that vanishes
/// without a close frame makes the relay drop the other connection without one too. The
/// sockets are the ones [`handshake`](crate::handshake) returns (or any stream in a [`Wire`]).
pub async fn relay<C, U, E>(
    client: WebSocketStream<Wire<C>>,
    upstream: WebSocketStream<Wire<U>>,
    rules: SharedRules,
    conn: u64,
    env: &E,
) -> RelayEnd
where
    C: AsyncRead + AsyncWrite + Unpin,
    U: AsyncRead + AsyncWrite + Unpin,
    E: ProxyEnv,
{
    let (client_witness, upstream_witness) = (client.get_ref().witness(), upstream.get_ref().witness());
    let (client, upstream) = (RefCell::new(client), RefCell::new(upstream));
    let first_close = FirstClose::default();
    let (up_held, down_held) = (Cell::new(0u64), Cell::new(0u64));
    // Boxed as one trait-object type so `select` can hand back whichever is still running.
    type PumpFuture<'a> = Pin<Box<dyn Future<Output = PumpEnd> + 'a>>;
    let up: PumpFuture<'_> = Box::pin(
        Pump {
            direction: Direction::Up,
            first_close: &first_close,
            conn,
            rules: &rules,
            env,
            source: &client,
            witness: client_witness,
            dest: &upstream,
            held_until_us: &up_held,
        }
        .run(),
    );
    let down: PumpFuture<'_> = Box::pin(
        Pump {
            direction: Direction::Down,
            first_close: &first_close,
            conn,
            rules: &rules,
            env,
            source: &upstream,
            witness: upstream_witness,
            dest: &client,
            held_until_us: &down_held,
        }
        .run(),
    );
    // `select` polls its first future first on every wake: a fixed order, no random draw.
    let pumps = select(up, down);
    let stopping = env.stopping();
    let (first_source, end, other) = match select(pumps, stopping).await {
        Either::Left((Either::Left((end, other)), _)) => (Side::Client, end, other),
        Either::Left((Either::Right((end, other)), _)) => (Side::Upstream, end, other),
        Either::Right(((), _pumps)) => {
            drop(_pumps);
            let message = close_message(1001, "proxy shutting down");
            let close_both = async {
                let _ = futures_util::future::join(send(&client, message.clone()), send(&upstream, message)).await;
                futures_util::future::join(drain(&client), drain(&upstream)).await;
            };
            let _ = select(Box::pin(close_both), env.sleep(CLOSE_GRACE_MS)).await;
            return RelayEnd::Shutdown { code: 1001 };
        }
    };
    let closed = first_close.borrow_mut().take();
    if let Some(CloseSeen { by, frame, invalid_code }) = closed {
        // A peer closed. Whichever pump ended first (the one that saw the close, or the other
        // failing to write to the closing peer), the one still running carries the rest: the
        // frames it holds, then the other peer's reply, until its connection ends.
        let other_held = if first_source == Side::Client { down_held.get() } else { up_held.get() };
        finish(env, other, other_held).await;
        let code = frame.as_ref().map(|f| u16::from(f.code));
        return match invalid_code {
            Some(received) => RelayEnd::InvalidClose { by, received, code: code.unwrap_or(1002) },
            None => RelayEnd::Closed { by, code, reason: frame.map(|f| f.reason.to_string()).unwrap_or_default() },
        };
    }
    // Cut the other direction, mid-frame if need be: the connection is ending.
    drop(other);
    match end {
        // A pump ends `Closed` only after recording the close frame, handled above.
        PumpEnd::Closed => RelayEnd::Closed { by: first_source, code: None, reason: String::new() },
        PumpEnd::RuleClose { rule, code, reason } => {
            let message = close_message(code, &reason);
            let close_both = async {
                let _ = send(&client, message.clone()).await;
                let _ = send(&upstream, message).await;
                futures_util::future::join(drain(&client), drain(&upstream)).await;
            };
            let _ = select(Box::pin(close_both), env.sleep(CLOSE_GRACE_MS)).await;
            RelayEnd::RuleClose { rule, code, reason }
        }
        PumpEnd::SourceGone { error, code } => {
            if let Some(code) = code {
                let reason = match code {
                    1009 => "message too big",
                    1007 => "invalid utf-8",
                    _ => "protocol error",
                };
                let refused: Pin<Box<dyn Future<Output = ()> + '_>> = match first_source {
                    Side::Client => Box::pin(refuse(&client, code, reason)),
                    Side::Upstream => Box::pin(refuse(&upstream, code, reason)),
                };
                let _ = select(refused, env.sleep(CLOSE_GRACE_MS)).await;
            }
            RelayEnd::Dropped { side: first_source, error, code }
        }
        PumpEnd::DestGone { error } => RelayEnd::Dropped { side: first_source.other(), error, code: None },
    }
    // Returning drops both connections; a peer still connected sees its TCP stream end.
}
