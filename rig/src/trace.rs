//! The trace: every observable event of a run, stamped with simulated time.
//!
//! The trace hash is a SHA-256 digest of the canonical trace (one compact JSON object per event,
//! fields in declaration order, object keys sorted), so the same seed gives the same hash on
//! every run and every machine.

use serde::Serialize;
use serde_json::Value;
use sha2::{Digest, Sha256};

/// Where a component reports a decision (`what`, with details) for the trace.
pub type NoteSink = std::rc::Rc<dyn Fn(&str, Value)>;

/// One observable event.
#[derive(Debug, Clone, Serialize)]
pub struct Event {
    pub at_ms: u64,
    /// The host the event happened on (or `rig` for the runner itself).
    pub host: String,
    #[serde(flatten)]
    pub kind: EventKind,
}

/// What happened. Serialized with a `kind` tag, which expectations match on.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum EventKind {
    /// A bus frame seen by the engine, `direction` relative to the engine (`in` or `out`).
    Frame {
        direction: &'static str,
        peer: String,
        frame: &'static str,
        #[serde(skip_serializing_if = "Option::is_none")]
        function_id: Option<String>,
        #[serde(skip_serializing_if = "Option::is_none")]
        invocation_id: Option<String>,
    },
    /// A call arriving at a double, before any cut decides its fate: who sent it (the worker
    /// the engine received it from) and under which invocation id (a frame the network
    /// repeated arrives again under the same id).
    Call {
        service: String,
        function: String,
        payload: Value,
        #[serde(skip_serializing_if = "Option::is_none")]
        caller: Option<String>,
        #[serde(skip_serializing_if = "Option::is_none")]
        invocation_id: Option<String>,
    },
    /// A state write that took effect (`value: null` for a delete).
    Commit { scope: String, key: String, value: Value, version: u64 },
    /// A request for an external effect, as the service's ledger recorded it.
    Effect {
        effect: String,
        action: String,
        #[serde(skip_serializing_if = "Option::is_none")]
        idempotency_key: Option<String>,
        #[serde(skip_serializing_if = "Option::is_none")]
        token: Option<u64>,
        #[serde(skip_serializing_if = "Option::is_none")]
        domain: Option<String>,
        accepted: bool,
        reason: String,
        /// The worker whose request it was, and the request's invocation id.
        #[serde(skip_serializing_if = "Option::is_none")]
        by: Option<String>,
        #[serde(skip_serializing_if = "Option::is_none")]
        invocation_id: Option<String>,
    },
    /// The store granted or renewed a lease on an ownership domain (`scope/key`).
    Lease { domain: String, owner: String, token: u64, expires_at_ms: u64 },
    /// The store judged a write protected by a fence (the lease of `domain`).
    Fenced { scope: String, key: String, domain: String, token: u64, accepted: bool },
    /// A cut fired on a call.
    Cut { cut: usize, action: String, function: String },
    /// A process cut fired: a worker was frozen or paused at a named point.
    Interrupt { interrupt: usize, worker: String, point: String, action: String },
    /// A frame matched a proxy rule.
    ProxyRule { rule: usize, action: String, direction: String, frame: Value },
    /// The outcome of an invocation made by the scenario's driver.
    Rpc { name: String, function: String, outcome: Value },
    /// The runner changed the world: crash, restart, partition, repair, heal.
    Control { action: String, target: String },
    /// A component's own account of a decision (a harness finalisation retry, a queue redelivery).
    Note { what: String, detail: Value },
    /// A limit was hit; the run stops here and reports it.
    Limit { what: String },
}

/// The events of one run, in order, with a running digest.
#[derive(Default)]
pub struct Trace {
    events: Vec<Event>,
    digest: Sha256,
}

impl Trace {
    pub fn push(&mut self, event: Event) {
        let line = serde_json::to_string(&event).expect("trace events serialize");
        self.digest.update(line.as_bytes());
        self.digest.update(b"\n");
        self.events.push(event);
    }

    pub fn events(&self) -> &[Event] {
        &self.events
    }

    /// The hex digest of the canonical trace so far.
    pub fn hash(&self) -> String {
        self.digest.clone().finalize().iter().map(|b| format!("{b:02x}")).collect()
    }

    /// The canonical JSON lines, for `--trace FILE`.
    pub fn json_lines(&self) -> impl Iterator<Item = String> + '_ {
        self.events.iter().map(|e| serde_json::to_string(e).expect("trace events serialize"))
    }
}

impl Event {
    /// The event as a JSON document, as expectations and oracles match it.
    pub fn to_json(&self) -> Value {
        serde_json::to_value(self).expect("trace events serialize")
    }

    /// Frames are the bulk of a trace and rarely the story; everything else is.
    pub fn is_key(&self) -> bool {
        !matches!(self.kind, EventKind::Frame { .. })
    }

    /// The event on one line: time, host, what (long payloads cut short).
    pub fn render(&self) -> String {
        format!("{:>9} ms  {:<8} {}", self.at_ms, self.host, self.kind.describe(Some(PAYLOAD_CHARS_MAX)))
    }
}

/// How long a payload may get in a one-line rendering before it is cut.
const PAYLOAD_CHARS_MAX: usize = 160;

fn shorten(value: &Value, limit: Option<usize>) -> String {
    let text = value.to_string();
    match limit {
        Some(limit) if text.chars().count() > limit => format!("{}…", text.chars().take(limit).collect::<String>()),
        _ => text,
    }
}

impl EventKind {
    /// What happened, in words; payloads cut at `limit` characters when one is given.
    pub fn describe(&self, limit: Option<usize>) -> String {
        let short = |value: &Value| shorten(value, limit);
        match self {
            EventKind::Frame { direction, peer, frame, function_id, .. } => {
                format!("frame {direction} {peer} {frame} {}", function_id.as_deref().unwrap_or(""))
            }
            EventKind::Call { function, payload, caller, .. } => {
                format!(
                    "call {function} {}{}",
                    short(payload),
                    caller.as_ref().map_or(String::new(), |c| format!(" from {c}"))
                )
            }
            EventKind::Commit { scope, key, value, version } => {
                format!("commit {scope}/{key} v{version} {}", short(value))
            }
            EventKind::Effect { effect, action, idempotency_key, token, accepted, reason, by, .. } => format!(
                "effect {effect} action={action} key={} token={} {} ({reason}){}",
                idempotency_key.as_deref().unwrap_or("-"),
                token.map_or_else(|| "-".to_string(), |t| t.to_string()),
                if *accepted { "accepted" } else { "refused" },
                by.as_ref().map_or(String::new(), |b| format!(" from {b}"))
            ),
            EventKind::Lease { domain, owner, token, expires_at_ms } => {
                format!("lease {domain} to {owner} token={token} until {expires_at_ms} ms")
            }
            EventKind::Fenced { scope, key, domain, token, accepted } => format!(
                "fenced write {scope}/{key} under {domain} token={token} {}",
                if *accepted { "accepted" } else { "rejected" }
            ),
            EventKind::Cut { cut, action, function } => format!("cut #{} {action} on {function}", cut + 1),
            EventKind::Interrupt { interrupt, worker, point, action } => {
                format!("interrupt #{} {action} {worker} at {point}", interrupt + 1)
            }
            EventKind::ProxyRule { rule, action, direction, frame } => {
                format!("proxy rule #{} {action} {direction} {}", rule + 1, short(frame))
            }
            EventKind::Rpc { name, function, outcome } => format!("rpc {name} ({function}) -> {}", short(outcome)),
            EventKind::Control { action, target } => format!("{action} {target}"),
            EventKind::Note { what, detail } => format!("note {what} {}", short(detail)),
            EventKind::Limit { what } => format!("LIMIT {what}"),
        }
    }
}
