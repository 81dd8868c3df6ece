//! The trace: every observable event of a run, stamped with simulated time.
//!
//! The trace hash is a SHA-256 digest of the canonical trace (one compact JSON object per event,
//! fields in declaration order, object keys sorted), so the same seed gives the same hash on
//! every run and every machine.

use serde::Serialize;
use serde_json::Value;
use sha2::{Digest, Sha256};

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
    /// A call arriving at a double, before any cut decides its fate.
    Call { service: String, function: String, payload: Value },
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
    },
    /// The store granted or renewed a lease on an ownership domain (`scope/key`).
    Lease { domain: String, owner: String, token: u64, expires_at_ms: u64 },
    /// The store judged a write protected by a fence (the lease of `domain`).
    Fenced { scope: String, key: String, domain: String, token: u64, accepted: bool },
    /// A cut fired on a call.
    Cut { cut: usize, action: String, function: String },
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
}
