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

/// Every field of every frame kind, for reading a frame in one pass: the derived reader of an
/// internally tagged enum first buffers the whole frame (payload included) and then reads it a
/// second time, which made it the largest single cost of a simulated run.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AnyFrame {
    #[serde(rename = "type")]
    kind: String,
    worker_id: Option<String>,
    id: Option<String>,
    description: Option<String>,
    invocation_id: Option<String>,
    function_id: Option<String>,
    data: Option<Value>,
    action: Option<Action>,
    result: Option<Value>,
    error: Option<ErrorBody>,
    previous_worker_id: Option<String>,
    reattach_token: Option<String>,
}

impl AnyFrame {
    /// The frame, when this one has its kind's required fields. A field of another kind is
    /// ignored, as the derived reader ignores it (one of the wrong type already failed to read).
    fn into_frame(self) -> Option<Frame> {
        Some(match self.kind.as_str() {
            "workerregistered" => Frame::WorkerRegistered { worker_id: self.worker_id? },
            "registerfunction" => Frame::RegisterFunction { id: self.id?, description: self.description },
            "invokefunction" => Frame::InvokeFunction {
                invocation_id: self.invocation_id,
                function_id: self.function_id?,
                data: self.data.unwrap_or_default(),
                action: self.action,
            },
            "invocationresult" => Frame::InvocationResult {
                invocation_id: self.invocation_id?,
                function_id: self.function_id?,
                result: self.result,
                error: self.error,
            },
            "reattach" => {
                Frame::Reattach { previous_worker_id: self.previous_worker_id?, reattach_token: self.reattach_token }
            }
            "unregisterfunction" => Frame::UnregisterFunction { id: self.id? },
            _ => return None,
        })
    }
}

impl Frame {
    /// Reads a frame from a WebSocket text message. Exactly the derived reader's result and
    /// error, faster: a frame of a known kind with its required fields is read in one pass, and
    /// anything else (unknown kinds, unknown, missing or mistyped fields, bad JSON) is left to the
    /// derived reader.
    pub fn from_wire(text: &str) -> Result<Frame, serde_json::Error> {
        match serde_json::from_str::<AnyFrame>(text).ok().and_then(AnyFrame::into_frame) {
            Some(frame) => Ok(frame),
            None => serde_json::from_str(text),
        }
    }

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
    fn the_fast_reader_gives_the_derived_readers_result_and_error() {
        let texts = [
            r#"{"type":"workerregistered","worker_id":"worker-1"}"#,
            r#"{"type":"registerfunction","id":"harness::turn"}"#,
            r#"{"type":"registerfunction","id":"f","description":"d"}"#,
            r#"{"type":"registerfunction","id":"f","description":null}"#,
            r#"{"type":"invokefunction","invocation_id":"i1","function_id":"f","data":{"b":[1,2.5,-3],"a":"x"}}"#,
            r#"{"type":"invokefunction","function_id":"f"}"#,
            r#"{"type":"invokefunction","function_id":"f","data":null,"invocation_id":null}"#,
            r#"{"type":"invokefunction","function_id":"f","data":1,"action":{"type":"enqueue","queue":"q"}}"#,
            r#"{"type":"invokefunction","function_id":"f","action":{"type":"void"}}"#,
            r#"{"type":"invokefunction","function_id":"f","action":{"type":"nonsense"}}"#,
            r#"{"type":"invocationresult","invocation_id":"i1","function_id":"f","result":{"ok":true}}"#,
            r#"{"type":"invocationresult","invocation_id":"i1","function_id":"f","result":null}"#,
            r#"{"type":"invocationresult","invocation_id":"i1","function_id":"f","error":{"code":"c","message":"m"}}"#,
            r#"{"type":"invocationresult","invocation_id":"i1","function_id":"f","error":{"code":"c"}}"#,
            r#"{"type":"invocationresult","function_id":"f"}"#,
            r#"{"type":"invocationresult","invocation_id":null,"function_id":"f"}"#,
            r#"{"type":"reattach","previous_worker_id":"worker-3","reattach_token":"t"}"#,
            r#"{"type":"unregisterfunction","id":"f"}"#,
            r#"{"type":"unregisterfunction","id":"f","id":"g"}"#,
            r#"{"type":"registertrigger","id":"t","trigger_type":"cron"}"#,
            r#"{"type":"invokefunction","function_id":"f","traceparent":"00-ab"}"#,
            r#"{"type":"invokefunction","function_id":7}"#,
            r#"{"type":"workerregistered","worker_id":"w","id":"extra"}"#,
            r#"{"type":"workerregistered","worker_id":"w","id":5}"#,
            r#"{"type":"invokefunction","function_id":"f","result":{"x":1},"error":null}"#,
            r#"{"function_id":"f"}"#,
            r#"{"type":5}"#,
            r#"{"type":"invokefunction","function_id":"f""#,
            r#"[1,2]"#,
            "",
        ];
        for text in texts {
            let fast = Frame::from_wire(text).map_err(|e| e.to_string());
            let derived = serde_json::from_str::<Frame>(text).map_err(|e| e.to_string());
            assert_eq!(fast, derived, "{text}");
        }
    }

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
