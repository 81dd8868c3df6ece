//! A frame-aware WebSocket fault proxy.
//!
//! It forwards every WebSocket message between a client and its upstream unchanged, except
//! where a rule selects a frame by its JSON fields and drops, delays, duplicates it or closes
//! the connection. The same forwarding code runs on real sockets and inside the rig's
//! simulated network, so it is generic over the stream type.

mod field;

pub use field::{all_match, lookup, value_text, FieldMatch, FieldMatchError};
