//! The bus: an engine and its workers speaking JSON frames over WebSocket.
//!
//! Everything here is generic over the byte stream, so the same engine and workers run on
//! turmoil's simulated TCP and on real sockets.

mod engine;
mod local;
pub mod protocol;
pub mod websocket;
mod wire;
mod worker;

pub use engine::{Engine, QUEUE_ENQUEUE, WORKERS_REGISTER};
pub use protocol::{Action, ErrorBody, Frame};
pub use worker::{Answer, Bus, Connection, Invocation, InvokeError, Provider};

/// The most frames waiting to be written to one peer; a peer that falls further behind is
/// disconnected (a reported outcome) rather than buffered without bound.
pub const OUTBOX_CAPACITY: usize = 4_096;

/// Which way a frame crossed the engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrameDirection {
    In,
    Out,
}

/// Where the bus reports what it saw. The simulation records it in the trace.
pub trait BusObserver {
    /// `peer` is the engine's own label for the connection, shared with the frame's record
    /// rather than copied into it (a record per frame, most of a run's).
    fn frame(&self, direction: FrameDirection, peer: &crate::trace::Label, frame: &Frame);
    fn note(&self, host: &str, what: &str, detail: serde_json::Value);
    /// A worker connected, as `peer` (its name so far) with the engine's `worker_id` for it.
    /// The simulation keeps no record of it (its frames tell the story); live mode does.
    fn connected(&self, _peer: &str, _worker_id: &str) {}
    /// A worker's connection ended, and why (`closed by the worker`, `the network was cut` ...).
    fn disconnected(&self, _peer: &str, _why: &str) {}
    /// The engine refused a frame of `peer` that would have taken what is not its own (a
    /// reserved function, another connection's identity), and goes on; `why` says it in full.
    fn refused(&self, peer: &str, why: &str) {
        self.note("engine", "refused", serde_json::json!({ "peer": peer, "why": why }));
    }
}
