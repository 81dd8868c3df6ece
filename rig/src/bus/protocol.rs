//! The frame shapes of the bus, as the iii engine speaks them: one JSON object per WebSocket
//! text frame, the kind in `type`, lowercase with no separators.

use serde::{Deserialize, Serialize};
use serde_json::Value;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum Frame {
    /// engine → worker, the first frame on every connection.
    WorkerRegistered { worker_id: String },
    /// worker → engine; the engine sends no acknowledgement.
    RegisterFunction {
        id: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        description: Option<String>,
    },
    /// caller → engine → provider, with the caller's invocation id kept end to end. A
    /// fire-and-forget call may come without an id (the iii SDKs send `void` calls so), and
    /// without `data` when the payload is empty.
    InvokeFunction {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        invocation_id: Option<String>,
        function_id: String,
        #[serde(default)]
        data: Value,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        action: Option<Action>,
    },
    /// provider → engine → caller.
    InvocationResult {
        invocation_id: String,
        function_id: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        result: Option<Value>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<ErrorBody>,
    },
    /// worker → engine, first on every reconnection of an iii SDK worker: the connection that
    /// worker had before is over, and the calls it was waiting on are answered here from now on.
    Reattach {
        previous_worker_id: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reattach_token: Option<String>,
    },
    /// worker → engine: it stops serving a function it registered.
    UnregisterFunction { id: String },
    /// Any frame kind the rig does not act on (telemetry, triggers): read and ignored.
    #[serde(other)]
    Other,
}

impl Frame {
    /// The wire name of the frame kind.
    pub fn kind(&self) -> &'static str {
        match self {
            Frame::WorkerRegistered { .. } => "workerregistered",
            Frame::RegisterFunction { .. } => "registerfunction",
            Frame::InvokeFunction { .. } => "invokefunction",
            Frame::InvocationResult { .. } => "invocationresult",
            Frame::Reattach { .. } => "reattach",
            Frame::UnregisterFunction { .. } => "unregisterfunction",
            Frame::Other => "other",
        }
    }

    pub fn function_id(&self) -> Option<&str> {
        match self {
            Frame::RegisterFunction { id, .. } | Frame::UnregisterFunction { id } => Some(id),
            Frame::InvokeFunction { function_id, .. } | Frame::InvocationResult { function_id, .. } => {
                Some(function_id)
            }
            Frame::WorkerRegistered { .. } | Frame::Reattach { .. } | Frame::Other => None,
        }
    }

    pub fn invocation_id(&self) -> Option<&str> {
        match self {
            Frame::InvokeFunction { invocation_id, .. } => invocation_id.as_deref(),
            Frame::InvocationResult { invocation_id, .. } => Some(invocation_id),
            _ => None,
        }
    }
}

/// How the engine should treat an invocation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum Action {
    /// Fire and forget: the provider's result is discarded.
    Void,
    /// Through the queue: the caller gets the queue's receipt, the provider runs on delivery.
    Enqueue { queue: String },
}

/// An error result, as the engine and providers report it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    pub code: String,
    pub message: String,
}

impl ErrorBody {
    pub fn new(code: &str, message: impl Into<String>) -> Self {
        Self { code: code.to_string(), message: message.into() }
    }
}

/// Error codes the real engine uses, kept verbatim so doubles behave like it.
pub mod codes {
    pub const FUNCTION_NOT_FOUND: &str = "function_not_found";
    pub const INVOCATION_STOPPED: &str = "invocation_stopped";
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn wire_names_are_lowercase_without_separators() {
        let frame = Frame::InvocationResult {
            invocation_id: "i1".into(),
            function_id: "harness::turn".into(),
            result: Some(json!({"status": "failed"})),
            error: None,
        };
        let wire = serde_json::to_value(&frame).unwrap();
        assert_eq!(wire["type"], "invocationresult");
        assert!(wire.get("error").is_none());
        let enqueue = json!({"type": "invokefunction", "invocation_id": "i2", "function_id": "f", "data": {},
                             "action": {"type": "enqueue", "queue": "harness-turn"}});
        let parsed: Frame = serde_json::from_value(enqueue).unwrap();
        assert!(matches!(parsed, Frame::InvokeFunction { action: Some(Action::Enqueue { .. }), .. }));
        // As the iii SDKs send a fire-and-forget call with an empty payload.
        let void =
            json!({"type": "invokefunction", "function_id": "engine::workers::register", "action": {"type": "void"}});
        let parsed: Frame = serde_json::from_value(void).unwrap();
        assert!(matches!(parsed, Frame::InvokeFunction { invocation_id: None, data: Value::Null, .. }));
        let unknown: Frame = serde_json::from_value(json!({"type": "registertrigger", "id": "t"})).unwrap();
        assert_eq!(unknown, Frame::Other);
        // As the iii SDKs open every reconnection, and withdraw a function.
        let reattach: Frame =
            serde_json::from_value(json!({"type": "reattach", "previous_worker_id": "worker-3"})).unwrap();
        assert_eq!(reattach, Frame::Reattach { previous_worker_id: "worker-3".into(), reattach_token: None });
        let unregister: Frame = serde_json::from_value(json!({"type": "unregisterfunction", "id": "f"})).unwrap();
        assert_eq!(unregister.function_id(), Some("f"));
    }
}
