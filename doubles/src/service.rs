use serde_json::Value;

/// One request to a double, as it arrived.
#[derive(Debug, Clone, Copy)]
pub struct Call<'a> {
    pub function: &'a str,
    pub payload: &'a Value,
    /// Simulated milliseconds since the start of the run.
    pub now_ms: u64,
}

/// An error reply from a double: a definite "no", never an unknown outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceError {
    pub code: String,
    pub message: String,
}

impl ServiceError {
    pub fn new(code: &str, message: impl Into<String>) -> Self {
        Self {
            code: code.to_string(),
            message: message.into(),
        }
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new("bad_request", message)
    }
}

/// What a double saw happen durably while handling a call. The rig turns these into trace
/// events; the system under test never sees them.
#[derive(Debug, Clone, PartialEq)]
pub enum Observation {
    /// A state write took effect (`value: None` is a delete).
    Commit {
        scope: String,
        key: String,
        value: Option<Value>,
        version: u64,
    },
    /// A request for an external effect reached the service; the ledger keeps every one.
    Effect(EffectRecord),
}

/// One line of the effect ledger: a request for an external effect and what became of it.
/// Only the services write it; the system under test can neither read nor write it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EffectRecord {
    /// What kind of effect, e.g. `ticket.create`.
    pub kind: String,
    /// The logical action the request belongs to.
    pub action_id: String,
    pub idempotency_key: Option<String>,
    pub fencing_token: Option<u64>,
    /// Whether the effect happened (a new object exists) because of this request.
    pub accepted: bool,
    /// Why: `created`, `duplicate key`, `stale token`, ...
    pub reason: String,
}

/// A service the harness depends on.
pub trait Double {
    /// The name the service is known by in scenario files and traces.
    fn name(&self) -> &'static str;
    /// The bus functions it serves.
    fn functions(&self) -> &'static [&'static str];
    /// Handles one call. Observations are appended to `observed` only for what took effect.
    fn handle(
        &mut self,
        call: Call<'_>,
        observed: &mut Vec<Observation>,
    ) -> Result<Value, ServiceError>;
}

/// A required string field of a payload.
pub(crate) fn text_field<'a>(payload: &'a Value, field: &str) -> Result<&'a str, ServiceError> {
    payload
        .get(field)
        .and_then(Value::as_str)
        .ok_or_else(|| ServiceError::bad_request(format!("missing string field `{field}`")))
}
