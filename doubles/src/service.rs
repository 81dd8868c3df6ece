use serde_json::Value;
use std::sync::Arc;

/// One request to a double, as it arrived.
#[derive(Debug, Clone, Copy)]
pub struct Call<'a> {
    pub function: &'a str,
    pub payload: &'a Value,
    /// Simulated milliseconds since the start of the run.
    pub now_ms: u64,
    /// The same payload as its host holds it, shared (with the rig's trace), when it is so held:
    /// a double that keeps part of it (the store a written value) keeps it through this instead
    /// of a copy. `None` when the caller lends the payload only; the double then copies what it
    /// keeps.
    pub shared: Option<&'a Arc<Value>>,
}

impl<'a> Call<'a> {
    /// A call whose payload is only lent.
    pub fn new(function: &'a str, payload: &'a Value, now_ms: u64) -> Self {
        Self { function, payload, now_ms, shared: None }
    }

    /// A call whose payload its host holds shared: what a double keeps of it is shared too.
    pub fn shared(function: &'a str, payload: &'a Arc<Value>, now_ms: u64) -> Self {
        Self { function, payload, now_ms, shared: Some(payload) }
    }

    /// The payload's field `field` as a double keeps it: shared with the payload when the host
    /// shares it, else a copy. `null` when the field is absent.
    pub fn keep(&self, field: &'static str) -> Kept {
        match self.shared {
            Some(whole) => Kept(Repr::Field(Arc::clone(whole), field)),
            None => Kept::from(self.payload.get(field).cloned().unwrap_or(Value::Null)),
        }
    }
}

/// A JSON value as a double keeps it (a record the store holds, as its commit carries it): a
/// value of its own, or a field of a request's payload shared with whoever else holds that
/// payload, rather than a copy of every node of it. It reads as the value ([`std::ops::Deref`]);
/// equality, debug output and serialisation are the value's.
#[derive(Clone)]
pub struct Kept(Repr);

#[derive(Clone)]
enum Repr {
    Whole(Arc<Value>),
    /// The field of a payload (`null` if it has none: as the copy would have been).
    Field(Arc<Value>, &'static str),
}

static NULL: Value = Value::Null;

impl std::ops::Deref for Kept {
    type Target = Value;

    fn deref(&self) -> &Value {
        match &self.0 {
            Repr::Whole(value) => value,
            Repr::Field(payload, field) => payload.get(*field).unwrap_or(&NULL),
        }
    }
}

impl From<Value> for Kept {
    fn from(value: Value) -> Self {
        Kept(Repr::Whole(Arc::new(value)))
    }
}

impl From<Arc<Value>> for Kept {
    fn from(value: Arc<Value>) -> Self {
        Kept(Repr::Whole(value))
    }
}

impl PartialEq for Kept {
    fn eq(&self, other: &Self) -> bool {
        **self == **other
    }
}

impl std::fmt::Debug for Kept {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        Value::fmt(self, f)
    }
}

impl serde::Serialize for Kept {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        Value::serialize(self, serializer)
    }
}

/// An error reply from a double: a definite "no", never an unknown outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceError {
    pub code: String,
    pub message: String,
}

impl ServiceError {
    pub fn new(code: &str, message: impl Into<String>) -> Self {
        Self { code: code.to_string(), message: message.into() }
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new("bad_request", message)
    }
}

/// What a double saw happen durably while handling a call. The rig turns these into trace
/// events; the system under test never sees them.
#[derive(Debug, Clone, PartialEq)]
pub enum Observation {
    /// A state write took effect (`value: None` is a delete): the value as the store keeps it.
    Commit { scope: String, key: String, value: Option<Kept>, version: u64 },
    /// A request for an external effect reached the service; the ledger keeps every one.
    Effect(EffectRecord),
    /// The state store granted (or renewed) a lease: `owner` holds the ownership domain
    /// `scope/key` under fencing token `token` until `expires_at_ms` (simulated ms).
    ///
    /// Emitted on every acquisition, each of which issues a new, strictly greater token, and
    /// on every renewal, which repeats the token of the grant it extends with the new expiry
    /// (so a renewal is recognisable by its token not being new). The rig needs every grant:
    /// the fencing oracle judges, from the services' view, that no write or effect carrying a
    /// token older than the latest granted for its domain was accepted, so it must learn each
    /// token the moment it is issued.
    Lease { scope: String, key: String, owner: String, token: u64, expires_at_ms: u64 },
    /// A state write that named a fence (the lease protecting it) was judged: `scope`/`key`
    /// is the record written, `domain` the lease as `"lease_scope/lease_key"`, `token` the
    /// token the writer carried, `accepted` whether the fence let it through (the token was
    /// not older than the lease's latest).
    ///
    /// Emitted for every fenced write attempt, accepted or not; an accepted one that changed
    /// the record is also followed by its `Commit`. (An accepted fence does not imply a write:
    /// a compare-and-set on the wrong version or a delete of a missing key writes nothing.)
    /// The rig needs every one: the fencing oracle checks each acceptance against the tokens
    /// granted so far, and counts rejections as the fence doing its job.
    Fenced { scope: String, key: String, domain: String, token: u64, accepted: bool },
    /// The double's own account of a request its script did not provide for (a scripted model
    /// reply that expected another request, a generation beyond the script). The rig records it
    /// as a note from the double's host.
    Note { what: String, detail: Value },
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
    /// The ownership domain the token was issued for (`scope/key` of the lease).
    pub fencing_domain: Option<String>,
    /// Whether the effect happened (a new object exists) because of this request.
    pub accepted: bool,
    /// Why: `created`, `duplicate key`, `stale token`, ...
    pub reason: String,
}

/// A service the harness depends on.
pub trait Double {
    /// The name the service is known by in scenario files and traces.
    fn name(&self) -> &str;
    /// The bus functions it serves.
    fn functions(&self) -> Vec<String>;
    /// Handles one call. Observations are appended to `observed` only for what took effect.
    fn handle(&mut self, call: Call<'_>, observed: &mut Vec<Observation>) -> Result<Value, ServiceError>;
    /// Learns that the store granted `token` for the ownership domain `domain`: a service that
    /// enforces fencing raises its bar. Most services ignore it.
    fn observe_grant(&mut self, _domain: &str, _token: u64) {}
    /// What the scenario scripted for this double that the run never used (a scripted model
    /// reply nobody asked for), one line each. Most doubles script nothing.
    fn unused(&self) -> Vec<String> {
        Vec::new()
    }
    /// The generations a model double answered, in order. Other doubles answer none.
    fn generations(&self) -> Vec<crate::Generation> {
        Vec::new()
    }
}

/// A service's function names as owned strings.
pub(crate) fn owned(functions: &[&str]) -> Vec<String> {
    functions.iter().map(|f| f.to_string()).collect()
}

/// A required string field of a payload.
pub(crate) fn text_field<'a>(payload: &'a Value, field: &str) -> Result<&'a str, ServiceError> {
    payload
        .get(field)
        .and_then(Value::as_str)
        .ok_or_else(|| ServiceError::bad_request(format!("missing string field `{field}`")))
}

/// A required non-negative integer field of a payload.
pub(crate) fn u64_field(payload: &Value, field: &str) -> Result<u64, ServiceError> {
    payload
        .get(field)
        .and_then(Value::as_u64)
        .ok_or_else(|| ServiceError::bad_request(format!("missing non-negative integer field `{field}`")))
}

/// An optional string field of a payload: absent and `null` are `None`, any other
/// non-string is a bad request.
pub(crate) fn optional_text_field<'a>(payload: &'a Value, field: &str) -> Result<Option<&'a str>, ServiceError> {
    match payload.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(text)) => Ok(Some(text)),
        Some(_) => Err(ServiceError::bad_request(format!("field `{field}` must be a string"))),
    }
}

/// An optional object field of a payload: absent and `null` are `None`, any other
/// non-object is a bad request.
pub(crate) fn optional_object_field<'a>(payload: &'a Value, field: &str) -> Result<Option<&'a Value>, ServiceError> {
    match payload.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(object @ Value::Object(_)) => Ok(Some(object)),
        Some(_) => Err(ServiceError::bad_request(format!("field `{field}` must be an object"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A value kept as a field of a shared payload is the value a copy would have been: equal to
    /// it, unequal to another, and shown and serialised as it.
    #[test]
    fn a_kept_field_reads_compares_shows_and_serialises_as_its_value() {
        let payload = Arc::new(json!({ "scope": "runs", "value": { "status": "done", "n": 1 } }));
        let shared = Call::shared("state::set", &payload, 0).keep("value");
        let copied = Call::new("state::set", &payload, 0).keep("value");
        let other = Kept::from(json!({ "status": "running", "n": 1 }));

        assert_eq!(*shared, payload["value"]);
        assert_eq!(shared, copied);
        assert_ne!(shared, other);
        assert_eq!(format!("{shared:?}"), format!("{:?}", payload["value"]));
        assert_eq!(serde_json::to_string(&shared).unwrap(), payload["value"].to_string());
        assert_eq!(
            *Call::shared("state::set", &payload, 0).keep("absent"),
            Value::Null,
            "an absent field reads as null"
        );
    }
}
