use crate::service::{text_field, Call, Double, Observation, ServiceError};
use serde_json::{json, Value};
use std::collections::BTreeMap;

/// The session service: a session's message log (its transcript) and its status.
///
/// An append may carry an `entry_key`: appending an entry under a key the log already holds
/// leaves the log as it is and answers with the earlier entry (`duplicate: true`), so a harness
/// can repeat an append whose outcome it does not know, or transcribe a resumed turn again,
/// without duplicating anything. The rig reads transcripts in the iii session shape: a function
/// call is a `{type: "function_call", id}` block in an entry's `content`, and its result an entry
/// with `role: "function_result"` and `function_call_id`.
#[derive(Debug, Default, Clone)]
pub struct SessionService {
    sessions: BTreeMap<String, Session>,
}

#[derive(Debug, Default, Clone)]
struct Session {
    entries: Vec<Value>,
    status: Option<String>,
}

impl SessionService {
    pub const FUNCTIONS: &'static [&'static str] = &["session::messages", "session::append", "session::set-status"];

    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a message to a session's log before the run starts.
    pub fn seed_message(&mut self, session_id: &str, message: Value) {
        self.sessions.entry(session_id.to_string()).or_default().entries.push(message);
    }

    /// The status last set on a session, if any.
    pub fn status(&self, session_id: &str) -> Option<&str> {
        self.sessions.get(session_id).and_then(|s| s.status.as_deref())
    }

    /// A session's log, oldest first.
    pub fn entries(&self, session_id: &str) -> &[Value] {
        self.sessions.get(session_id).map_or(&[], |s| s.entries.as_slice())
    }

    /// Every session's log, by session id.
    pub fn transcripts(&self) -> impl Iterator<Item = (&str, &[Value])> {
        self.sessions.iter().map(|(id, session)| (id.as_str(), session.entries.as_slice()))
    }
}

impl Double for SessionService {
    fn name(&self) -> &str {
        "session"
    }

    fn functions(&self) -> Vec<String> {
        crate::service::owned(Self::FUNCTIONS)
    }

    fn handle(&mut self, call: Call<'_>, _observed: &mut Vec<Observation>) -> Result<Value, ServiceError> {
        let session_id = text_field(call.payload, "session_id")?;
        match call.function {
            "session::messages" => {
                // Copied in, where `json!` would write each entry out node by node to the same value.
                let entries = Value::Array(self.entries(session_id).to_vec());
                Ok(Value::Object([("entries".to_string(), entries)].into_iter().collect()))
            }
            "session::append" => {
                let session = self.sessions.entry(session_id.to_string()).or_default();
                let key = call.payload.pointer("/entry/entry_key").and_then(Value::as_str);
                if let Some(earlier) = key.and_then(|key| session.entries.iter().find(|e| e["entry_key"] == key)) {
                    return Ok(json!({ "entry_id": earlier["entry_id"], "duplicate": true }));
                }
                let entry_id = format!("e{}", session.entries.len() + 1);
                let mut entry = call.payload.get("entry").cloned().unwrap_or(Value::Null);
                if let Value::Object(fields) = &mut entry {
                    fields.insert("entry_id".into(), json!(entry_id));
                }
                session.entries.push(entry);
                Ok(json!({ "entry_id": entry_id }))
            }
            "session::set-status" => {
                let status = text_field(call.payload, "status")?;
                self.sessions.entry(session_id.to_string()).or_default().status = Some(status.to_string());
                Ok(json!({}))
            }
            other => Err(ServiceError::new("function_not_found", other)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn append_then_read_back_in_order() {
        let mut service = SessionService::new();
        service.seed_message("s1", json!({"role": "user", "content": "hi"}));
        let append = json!({"session_id": "s1", "entry": {"role": "assistant", "content": "hello"}});
        let reply = service.handle(Call::new("session::append", &append, 0), &mut Vec::new()).unwrap();
        assert_eq!(reply, json!({"entry_id": "e2"}));
        let read = json!({"session_id": "s1"});
        let messages = service.handle(Call::new("session::messages", &read, 0), &mut Vec::new()).unwrap();
        assert_eq!(messages["entries"][1]["content"], json!("hello"));
        assert_eq!(messages["entries"].as_array().unwrap().len(), 2);
    }

    #[test]
    fn a_status_set_is_read_back_for_its_session_only() {
        let mut service = SessionService::new();
        assert_eq!(service.status("s1"), None);
        let set = json!({"session_id": "s1", "status": "presenting"});
        service.handle(Call::new("session::set-status", &set, 0), &mut Vec::new()).unwrap();
        assert_eq!((service.status("s1"), service.status("s2")), (Some("presenting"), None));
    }

    #[test]
    fn an_append_under_a_known_key_is_kept_once() {
        let mut service = SessionService::new();
        let append = json!({"session_id": "s1", "entry": {"role": "function_result", "entry_key": "a1:result"}});
        let call = Call::new("session::append", &append, 0);
        assert_eq!(service.handle(call, &mut Vec::new()).unwrap(), json!({"entry_id": "e1"}));
        assert_eq!(service.handle(call, &mut Vec::new()).unwrap(), json!({"entry_id": "e1", "duplicate": true}));
        assert_eq!(service.entries("s1").len(), 1);
    }
}
