//! A frame-aware WebSocket fault proxy.
//!
//! It forwards every WebSocket message between a client and its upstream unchanged, except
//! where a rule selects a frame by its JSON fields and drops, delays, duplicates it or closes
//! the connection. The same forwarding code runs on real sockets and inside the rig's
//! simulated network, so it is generic over the stream type.
//!
//! - Rules: [`Rule`] (the TOML/JSON shape, and [`Rule::parse`] for the command-line form),
//!   [`RuleSet::decide_frame`] for the verdict on one frame.
//! - The simulation seam: [`handshake`] opens both sides over any streams (each socket in a
//!   [`Wire`]), [`relay`] forwards between them, taking clock, sleep, frame records and the
//!   stop signal from a [`ProxyEnv`].
//! - Real mode: [`ProxyArgs`] and [`serve`] (what the `proxy` binary runs), or [`Proxy`] to
//!   bind first and learn the addresses.

mod admin;
mod field;
mod handshake;
mod log;
mod project;
mod relay;
mod rule;
mod serve;
mod wire;

pub use field::{all_match, lookup, value_text, FieldMatch, FieldMatchError};
pub use handshake::{
    accept_client, answer_hello, connect_upstream, handshake, read_client_hello, read_hello_or_reject, reject_client,
    upstream_request, ClientHello, HandshakeError, Opened, UpstreamAnswer, UpstreamUrl, MAX_HEAD_BYTES,
};
pub use relay::{
    frame_json, frame_kind, relay, FrameRecord, ProxyEnv, RelayEnd, SharedRules, Side, CLOSE_GRACE_MS, MAX_HELD_BYTES,
};
pub use rule::{
    load_rules_file, parse_rules_toml, Action, ActionKind, Count, Decision, Direction, Directions, FrameKind,
    KindFilter, MatchValue, Rule, RuleError, RuleHit, RuleSet, RuleStatus, MAX_CLOSE_REASON_BYTES, MAX_DELAY_MS,
    MAX_RULES,
};
pub use serve::{
    rules_from_args, run, serve, websocket_config, Proxy, ProxyArgs, ServeError, READ_BUFFER_BYTES, WRITE_BUFFER_BYTES,
};
pub use wire::{CloseWitness, Wire};
