//! The forwarding core: one client, one upstream, rules in between.
//!
//! It is the same code on real sockets and in the rig's simulated network, so it is generic over
//! the stream type and takes everything that differs between the two worlds from a [`ProxyEnv`]:
//! the clock, sleeping and the record of frames. It never spawns, never reads the wall clock,
//! never touches a tokio timer and never draws unseeded randomness; both directions run in the
//! one future it returns, polled in a fixed order.

use crate::rule::{Action, Decision, Direction, FrameKind, RuleSet};
use futures_util::future::{select, Either, FutureExt};
use futures_util::stream::{SplitSink, SplitStream};
use futures_util::{SinkExt, StreamExt};
use serde::Serialize;
use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_tungstenite::tungstenite::error::{CapacityError, ProtocolError};
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::{Error as WsError, Message};
use tokio_tungstenite::WebSocketStream;

/// How long, after one side has closed, the relay waits for the close handshake to finish.
pub const CLOSE_GRACE_MS: u64 = 1_000;

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
    /// `forward`, `drop`, `delay`, `duplicate` or `close`.
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
    /// The source sent a close frame; it was passed on and the source drained.
    Closed,
    /// A `close` rule fired.
    RuleClose { rule: String, code: u16, reason: String },
    /// The source failed or ended without a close frame.
    SourceGone { error: String, code: Option<u16> },
    /// Writing to the destination failed: it went away.
    DestGone { error: String },
}

/// The first close frame either peer sent, and who sent it.
type FirstClose = RefCell<Option<(Side, Option<CloseFrame>)>>;

/// The close code owed to a peer whose read failed, when it broke the protocol.
fn close_code_for(error: &WsError) -> Option<u16> {
    match error {
        WsError::Capacity(CapacityError::MessageTooLong { .. }) => Some(1009),
        WsError::Capacity(_) => Some(1009),
        WsError::Utf8(_) => Some(1007),
        WsError::Protocol(ProtocolError::ResetWithoutClosingHandshake) => None,
        WsError::Protocol(_) => Some(1002),
        _ => None,
    }
}

struct Pump<'a, C, U, E> {
    direction: Direction,
    first_close: &'a FirstClose,
    conn: u64,
    rules: &'a SharedRules,
    env: &'a E,
    source: &'a mut SplitStream<WebSocketStream<C>>,
    dest: &'a mut SplitSink<WebSocketStream<U>, Message>,
}

impl<C, U, E> Pump<'_, C, U, E>
where
    C: AsyncRead + AsyncWrite + Unpin,
    U: AsyncRead + AsyncWrite + Unpin,
    E: ProxyEnv,
{
    async fn run(self) -> PumpEnd {
        let Pump { direction, first_close, conn, rules, env, source, dest } = self;
        loop {
            // Frames already buffered are written without a flush in between, and the
            // destination is flushed once the source has nothing ready: batching under load,
            // no added latency when idle.
            let next = match source.next().now_or_never() {
                Some(next) => next,
                None => {
                    if let Err(e) = dest.flush().await {
                        return PumpEnd::DestGone { error: e.to_string() };
                    }
                    source.next().await
                }
            };
            let message = match next {
                Some(Ok(message)) => message,
                ended => {
                    // Frames the source sent before it went away are still owed to the other
                    // peer: pass on what is buffered (within the grace period) before the
                    // relay drops both connections.
                    let _ = select(dest.flush(), env.sleep(CLOSE_GRACE_MS)).await;
                    return match ended {
                        Some(Err(error)) => {
                            PumpEnd::SourceGone { code: close_code_for(&error), error: error.to_string() }
                        }
                        _ => PumpEnd::SourceGone { error: "connection ended without a close frame".into(), code: None },
                    };
                }
            };
            let (kind, size) = frame_kind(&message);
            let decision = if matches!(kind, FrameKind::Text | FrameKind::Binary) {
                rules.borrow_mut().decide_with(direction, kind, || frame_json(&message))
            } else {
                Decision::forward()
            };
            if env.records() {
                env.record(&FrameRecord {
                    t_us: env.now_us(),
                    conn,
                    direction,
                    kind,
                    size,
                    rule: decision.rule.as_ref().map(|r| r.index),
                    rule_name: decision.rule.as_ref().map(|r| r.name.as_str()),
                    action: decision.action.as_str(),
                    message: &message,
                });
            }
            if let Message::Close(frame) = message {
                // The RefCell borrow ends in this statement, before any await.
                let forward = {
                    let mut first = first_close.borrow_mut();
                    let forward = first.is_none();
                    if forward {
                        *first = Some((Side::source_of(direction), frame.clone()));
                    }
                    forward
                };
                // Only the first close frame is passed on: the other is the reply to it,
                // which the proxy already sent on that hop.
                if forward {
                    // Send then flush: the close frame must leave now, not with a later batch.
                    let _ = dest.send(Message::Close(frame)).await;
                }
                // Reading on flushes this hop's close reply and sees the connection end.
                let _ = select(Box::pin(drain(source)), env.sleep(CLOSE_GRACE_MS)).await;
                return PumpEnd::Closed;
            }
            let sent = match decision.action {
                Action::Forward => dest.feed(message).await,
                Action::Drop => Ok(()),
                Action::Delay(ms) => {
                    // Frames ahead of this one leave now, not after the delay.
                    match dest.flush().await {
                        Ok(()) => {
                            // Holding the frame here holds the frames behind it too: order is kept.
                            env.sleep(ms).await;
                            dest.send(message).await
                        }
                        Err(e) => Err(e),
                    }
                }
                Action::Duplicate => match dest.feed(message.clone()).await {
                    Ok(()) => dest.feed(message).await,
                    Err(e) => Err(e),
                },
                Action::Close { code, reason } => {
                    return PumpEnd::RuleClose { rule: decision.rule.map(|r| r.name).unwrap_or_default(), code, reason }
                }
            };
            if let Err(e) = sent {
                return PumpEnd::DestGone { error: e.to_string() };
            }
        }
    }
}

/// Reads a peer until its connection ends, so a pending close reply gets flushed.
async fn drain<S: AsyncRead + AsyncWrite + Unpin>(source: &mut SplitStream<WebSocketStream<S>>) {
    // Bounded: after a close frame tungstenite yields nothing but the end of the stream.
    for _ in 0..64 {
        match source.next().await {
            Some(Ok(_)) => {}
            Some(Err(_)) | None => return,
        }
    }
}

fn close_message(code: u16, reason: &str) -> Message {
    Message::Close(Some(CloseFrame { code: CloseCode::from(code), reason: reason.to_string().into() }))
}

/// Forwards frames between `client` and `upstream` until either side closes, applying `rules`.
///
/// Both directions run concurrently inside this one future, polled client-to-upstream first;
/// each forwards with backpressure (`feed`/`send`, no queue of its own). A peer's close frame
/// is forwarded unchanged to the other peer and the relay then waits up to
/// [`CLOSE_GRACE_MS`] for the close handshakes to finish. A peer that vanishes without a close
/// frame makes the relay drop the other connection without one too.
pub async fn relay<C, U, E>(
    client: WebSocketStream<C>,
    upstream: WebSocketStream<U>,
    rules: SharedRules,
    conn: u64,
    env: &E,
) -> RelayEnd
where
    C: AsyncRead + AsyncWrite + Unpin,
    U: AsyncRead + AsyncWrite + Unpin,
    E: ProxyEnv,
{
    let (mut client_tx, mut client_rx) = client.split();
    let (mut upstream_tx, mut upstream_rx) = upstream.split();
    let first_close = FirstClose::default();
    // Boxed as one trait-object type so `select` can hand back whichever is still running.
    type PumpFuture<'a> = Pin<Box<dyn Future<Output = PumpEnd> + 'a>>;
    let up: PumpFuture<'_> = Box::pin(
        Pump {
            direction: Direction::Up,
            first_close: &first_close,
            conn,
            rules: &rules,
            env,
            source: &mut client_rx,
            dest: &mut upstream_tx,
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
            source: &mut upstream_rx,
            dest: &mut client_tx,
        }
        .run(),
    );
    // `select` polls its first future first on every wake: a fixed order, no random draw.
    let (first_source, end, other) = match select(up, down).await {
        Either::Left((end, other)) => (Side::Client, end, other),
        Either::Right((end, other)) => (Side::Upstream, end, other),
    };
    let closed = first_close.borrow().clone();
    if let Some((by, frame)) = closed {
        // A peer closed cleanly. Whichever pump ended first (the one that saw the close, or
        // the other failing to write to the closing peer), the one still running carries
        // the other peer's reply until its connection ends, within the grace period.
        let _ = select(other, env.sleep(CLOSE_GRACE_MS)).await;
        return RelayEnd::Closed {
            by,
            code: frame.as_ref().map(|f| u16::from(f.code)),
            reason: frame.map(|f| f.reason.to_string()).unwrap_or_default(),
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
                let _ = client_tx.send(message.clone()).await;
                let _ = upstream_tx.send(message).await;
                futures_util::future::join(drain(&mut client_rx), drain(&mut upstream_rx)).await;
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
                let send = async {
                    let _ = match first_source {
                        Side::Client => client_tx.send(close_message(code, reason)).await,
                        Side::Upstream => upstream_tx.send(close_message(code, reason)).await,
                    };
                };
                let _ = select(Box::pin(send), env.sleep(CLOSE_GRACE_MS)).await;
            }
            RelayEnd::Dropped { side: first_source, error, code }
        }
        PumpEnd::DestGone { error } => RelayEnd::Dropped {
            side: match first_source {
                Side::Client => Side::Upstream,
                Side::Upstream => Side::Client,
            },
            error,
            code: None,
        },
    }
    // Returning drops both connections; a peer still connected sees its TCP stream end.
}
