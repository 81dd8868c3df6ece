//! Asking the model: what each generation is sent (the session's transcript, with the results
//! of earlier tool rounds; the tools offered; the system prompt) and how a streamed reply is
//! assembled from its frames.
//!
//! A generation request names the harness's own `{host}::stream` function and a stream id. A
//! reply the model streams arrives there frame by frame (`text_delta` with its `delta`,
//! `tool_call` with `tool` and `args`), before the reply itself, which says how many frames it
//! sent. Frames live in the worker's memory: a crash loses them with the reply they belong to.
//! A stream that arrives incomplete fails the model step; it is never taken for the whole reply.

use super::{Policy, StepFailure, Worker};
use crate::bus::{Bus, ErrorBody, InvokeError};
use serde_json::{json, Value};
use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;

/// How often the worker lets frames already delivered be taken in before it counts them.
const FRAME_YIELDS_MAX: u32 = 4;

/// A worker's in-memory state of its generations.
#[derive(Default)]
pub(super) struct Generations {
    /// Frames received, by stream id, with their sequence numbers.
    streams: RefCell<BTreeMap<String, Vec<(u64, Value)>>>,
    /// Generations asked so far: each gets its own stream id.
    asked: Cell<u64>,
    /// Under `stale-context`: the messages read when each turn (by id) first asked.
    contexts: RefCell<BTreeMap<String, Value>>,
}

fn failure(error: InvokeError) -> StepFailure {
    StepFailure { during: "model::generate".into(), error }
}

impl Worker {
    /// Reads the session's transcript and asks the model for the current step.
    pub(super) async fn ask_model(&self, bus: &Bus, record: &mut Value) -> Result<Value, StepFailure> {
        let offer = self.offer(bus, record).await?;
        let messages = self.context(bus, record).await?;
        let request_id = format!("{}:{}", record["turn_id"].as_str().unwrap_or(""), record["step"]);
        let asked = self.generations.asked.get() + 1;
        self.generations.asked.set(asked);
        let stream_id = format!("{request_id}#{asked}");
        // The messages and tools are moved in: `json!` would copy each node of them through its
        // serializer. Same document (an object's keys are ordered whatever the insertion order).
        let mut fields = serde_json::Map::new();
        fields.insert("session_id".into(), record["session_id"].clone());
        fields.insert("turn_id".into(), record["turn_id"].clone());
        fields.insert("step".into(), record["step"].clone());
        fields.insert("request_id".into(), request_id.into());
        fields.insert("system_prompt".into(), offer.system_prompt.into());
        fields.insert("messages".into(), messages);
        fields.insert("tools".into(), Value::Array(offer.tools));
        fields.insert("stream_to".into(), self.env.function("stream").into());
        fields.insert("stream_id".into(), stream_id.clone().into());
        fields.extend(offer.versions);
        let request = Value::Object(fields);
        let reply = bus.invoke("model::generate", request, self.env.config.model_timeout_ms).await;
        let reply = match reply {
            Ok(reply) => reply,
            Err(error) => {
                self.generations.streams.borrow_mut().remove(&stream_id);
                return Err(failure(error));
            }
        };
        match reply["streamed"].as_u64() {
            None => Ok(reply),
            Some(sent) => self.assemble(bus, record, &stream_id, sent).await,
        }
    }

    /// The messages a generation is sent: the session's transcript as it is now (under
    /// `stale-context`, as it was when the turn first asked).
    async fn context(&self, bus: &Bus, record: &Value) -> Result<Value, StepFailure> {
        let turn_id = record["turn_id"].as_str().unwrap_or_default().to_string();
        let stale = self.policy == Policy::StaleContext;
        if let Some(messages) = self.generations.contexts.borrow().get(&turn_id).filter(|_| stale) {
            return Ok(messages.clone());
        }
        let timeout = self.env.config.session_timeout_ms;
        let read = bus.invoke("session::messages", json!({ "session_id": record["session_id"] }), timeout).await;
        // Taken out of the reply, which is dropped here: no copy.
        let mut read = read.map_err(|error| StepFailure { during: "session::messages".into(), error })?;
        let messages = read.get_mut("entries").map(Value::take).unwrap_or_default();
        if stale {
            self.generations.contexts.borrow_mut().insert(turn_id, messages.clone());
        }
        Ok(messages)
    }

    /// Takes in one frame of a streamed reply (`{host}::stream`).
    pub(super) fn take_frame(&self, data: &Value) -> Result<Value, ErrorBody> {
        let (Some(stream_id), Some(seq)) = (data["stream_id"].as_str(), data["seq"].as_u64()) else {
            return Err(ErrorBody::new("bad_request", "a frame needs `stream_id` and `seq`"));
        };
        let mut streams = self.generations.streams.borrow_mut();
        streams.entry(stream_id.to_string()).or_default().push((seq, data["frame"].clone()));
        Ok(json!({ "taken": true }))
    }

    /// The reply a stream of `sent` frames makes: its text deltas joined, its tool calls in
    /// order; an error if any frame is missing.
    async fn assemble(&self, bus: &Bus, record: &Value, stream_id: &str, sent: u64) -> Result<Value, StepFailure> {
        for _ in 0..FRAME_YIELDS_MAX {
            let arrived = self.generations.streams.borrow().get(stream_id).map_or(0, Vec::len);
            if arrived as u64 >= sent {
                break;
            }
            tokio::task::yield_now().await;
        }
        let mut frames = self.generations.streams.borrow_mut().remove(stream_id).unwrap_or_default();
        // Frames may arrive out of order (the network does not promise otherwise): their
        // sequence numbers say where each goes. The bug of `arrival-order-stream` trusts arrival.
        if self.policy != Policy::ArrivalOrderStream {
            frames.sort_by_key(|(seq, _)| *seq);
        }
        frames.dedup_by_key(|(seq, _)| *seq);
        if frames.len() as u64 != sent {
            let message = format!("{} of the {sent} frames of the streamed reply arrived", frames.len());
            return Err(failure(InvokeError::Rejected(ErrorBody::new("stream_incomplete", message))));
        }
        let mut text = String::new();
        let mut tool_calls = Vec::new();
        for (_, frame) in &frames {
            match frame["type"].as_str() {
                Some("text_delta") => {
                    let delta = frame["delta"].as_str().unwrap_or_default();
                    if self.policy == Policy::EntryPerDelta {
                        // The bug: each delta is made durable as a message of its own.
                        let entry = json!({ "role": "assistant", "text": delta });
                        self.append_entry(bus, &record["session_id"], None, entry).await;
                    }
                    text.push_str(delta);
                }
                Some("tool_call") => {
                    let mut call = json!({ "tool": frame["tool"], "args": frame["args"] });
                    if let Some(id) = frame["id"].as_str() {
                        call["id"] = json!(id);
                    }
                    tool_calls.push(call);
                }
                _ => {}
            }
        }
        let mut reply = json!({ "text": text });
        if !tool_calls.is_empty() {
            reply["tool_calls"] = json!(tool_calls);
        }
        Ok(reply)
    }
}
