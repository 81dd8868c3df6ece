//! The session transcript of tool use: the model's function calls and their results, written to
//! the session so the next generation is sent what the tools did.
//!
//! The durable turn record is the source of truth; the transcript is written from it, under a
//! key per entry (the round's calls, each action's result, each admitted input), so writing it
//! again (a retry after an unknown outcome, a turn resumed after a crash) leaves one entry each.
//! A call is closed by a result once its action settles, whether the service answered or
//! reconciliation found out; a turn that ends with a call never run closes it with an error
//! result, so no transcript keeps a call open.

use super::{Policy, Worker};
use crate::bus::Bus;
use crate::harness::HarnessEnv;
use serde_json::{json, Value};

/// The id of the `index`-th tool call of the record's current round: its action id, and the
/// function call's id in the transcript.
pub(super) fn action_id(record: &Value, index: usize) -> String {
    format!("{}:{}:{index}", record["turn_id"].as_str().unwrap_or(""), record["step"])
}

/// The id the transcript gives the `index`-th call of the current round: the model's own call id
/// when it gave one, else the action id.
pub(super) fn call_id(record: &Value, index: usize) -> String {
    match record["reply"]["tool_calls"][index]["id"].as_str() {
        Some(id) => id.to_string(),
        None => action_id(record, index),
    }
}

/// The tool calls of the record's current round, as the recorded reply lists them.
fn round_calls(record: &Value) -> Vec<Value> {
    record["reply"]["tool_calls"].as_array().cloned().unwrap_or_default()
}

/// What a settled action's result shows the model: the service's `content` when it gives one,
/// else the whole result as text; and whether it is an error.
fn result_content(result: &Value) -> (Value, bool) {
    let content = match &result["content"] {
        Value::Array(_) => result["content"].clone(),
        _ => json!([{ "type": "text", "text": result.to_string() }]),
    };
    (content, result["is_error"] == json!(true))
}

impl Worker {
    /// Appends `entry` to the session's transcript, under `key` when given; whether it got
    /// through now. A keyed append (the session keeps one entry per key) is tried
    /// `terminalize_attempts` times at once; if none got through, it goes on in the background on
    /// the settlement schedule ([`super::finalize::Retry`]) until it lands or `settle_within_ms`
    /// has passed, like any other settlement: a session down longer than a few tries must not
    /// leave a call the turn made, or its result, out of the transcript for good.
    pub(super) async fn append_entry(&self, bus: &Bus, session_id: &Value, key: Option<String>, entry: Value) -> bool {
        let attempts = if key.is_some() { self.env.config.terminalize_attempts.max(1) } else { 1 };
        self.append_entry_tried(bus, session_id, key, entry, attempts).await
    }

    /// [`Self::append_entry`], tried `attempts` times at once before the background takes a keyed
    /// entry over.
    pub(super) async fn append_entry_tried(
        &self,
        bus: &Bus,
        session_id: &Value,
        key: Option<String>,
        mut entry: Value,
        attempts: u32,
    ) -> bool {
        let keyed = key.is_some();
        if let Some(key) = key {
            entry["entry_key"] = json!(key);
        }
        let attempts = attempts.max(1);
        let entry_key = entry.get("entry_key").cloned().unwrap_or(Value::Null);
        // The entry is moved in (`json!` would copy each node of it through its serializer).
        let mut append = serde_json::Map::new();
        append.insert("session_id".into(), session_id.clone());
        append.insert("entry".into(), entry);
        let mut append = Value::Object(append);
        let mut last_error = String::new();
        for attempt in 1..=attempts {
            // A later try, or the background for a keyed entry, still needs the request; an
            // unkeyed entry's last try does not, so it takes it.
            let request = if keyed || attempt < attempts { append.clone() } else { std::mem::take(&mut append) };
            match bus.invoke("session::append", request, self.env.config.session_timeout_ms).await {
                Ok(_) => return true,
                Err(error) => last_error = error.to_string(),
            }
            if attempt < attempts {
                self.env.clock.sleep(self.deferred_backoff(attempt)).await;
            }
        }
        self.note("transcript_append_failed", json!({ "entry_key": entry_key, "error": last_error }));
        if keyed {
            let (env, bus) = (self.env.clone(), bus.clone());
            tokio::task::spawn_local(append_later(env, bus, append));
        }
        false
    }

    /// Writes the input a turn was admitted from (queued messages) to the transcript; whether
    /// all of it is there now.
    pub(super) async fn transcribe_input(&self, bus: &Bus, record: &Value) -> bool {
        let inputs = record["input"].as_array().cloned().unwrap_or_default();
        let mut written = true;
        if let Some(mut entry) = record[super::finalize::PREDECESSOR_ENTRY].as_object().cloned() {
            let key = entry.remove("entry_key").and_then(|k| k.as_str().map(str::to_string));
            written &= self.append_entry(bus, &record["session_id"], key, Value::Object(entry)).await;
        }
        for (index, message) in inputs.into_iter().enumerate() {
            let from = record["input_keys"][index].as_str().map_or_else(|| index.to_string(), str::to_string);
            let key = format!("{}:input:{from}", record["turn_id"].as_str().unwrap_or(""));
            written &= self.append_entry(bus, &record["session_id"], Some(key), message).await;
        }
        written
    }

    /// Writes the current round's function calls to the transcript, as one assistant entry;
    /// whether it is there now.
    pub(super) async fn transcribe_calls(&self, bus: &Bus, record: &Value) -> bool {
        let calls = round_calls(record);
        if calls.is_empty() {
            return true;
        }
        let blocks: Vec<Value> = calls
            .iter()
            .enumerate()
            .map(|(index, call)| {
                json!({ "type": "function_call", "id": call_id(record, index), "function_id": call["tool"], "arguments": call["args"] })
            })
            .collect();
        let key = format!("{}:{}:calls", record["turn_id"].as_str().unwrap_or(""), record["step"]);
        self.append_entry(bus, &record["session_id"], Some(key), json!({ "role": "assistant", "content": blocks }))
            .await
    }

    /// Writes a result for every call of the current round whose action has settled; when the
    /// turn is `closing`, a call whose action never ran gets an error result instead. Whether
    /// every result is there now.
    pub(super) async fn transcribe_results(&self, bus: &Bus, record: &Value, closing: bool) -> bool {
        let mut written = true;
        for (index, call) in round_calls(record).iter().enumerate() {
            let id = action_id(record, index);
            let action = &record["calls"][&id];
            let (content, is_error) = match action["status"].as_str() {
                Some("complete") => result_content(&action["result"]),
                Some("failed") => (json!([{ "type": "text", "text": action["error"] }]), true),
                _ if closing => (json!([{ "type": "text", "text": "not run: the turn ended before it ran" }]), true),
                _ => continue,
            };
            if self.policy == Policy::ResultsOnlyWhenAnswered && !action["result"]["reconciled_by"].is_null() {
                // The bug: an outcome found by reconciliation never reaches the transcript.
                continue;
            }
            let mut entry = json!({
                "role": "function_result", "function_call_id": call_id(record, index), "function_id": call["tool"],
                "content": content, "is_error": is_error,
            });
            if !action["unavailable"].is_null() {
                // A call of a tool the safety overlay took away: why, for the model to act on.
                entry["error"] = action["unavailable"].clone();
            }
            written &= self.append_entry(bus, &record["session_id"], Some(format!("{id}:result")), entry).await;
        }
        written
    }
}

/// A keyed transcript entry whose tries at once all failed, appended in the background on the
/// settlement schedule until it lands (the session keeps one entry per key, so a try whose
/// answer was lost and a later one leave one entry), or `settle_within_ms` has passed.
async fn append_later(env: HarnessEnv, bus: Bus, append: Value) {
    let key = append["entry"]["entry_key"].clone();
    let mut retry = super::finalize::Retry::begin(&env);
    while retry.next(&env, &bus).await {
        if bus.invoke("session::append", append.clone(), env.config.session_timeout_ms).await.is_ok() {
            env.note("transcript_append_settled", json!({ "entry_key": key, "attempt": retry.attempt() }));
            return;
        }
    }
    env.note("transcript_append_abandoned", json!({ "entry_key": key, "attempts": retry.attempt() }));
}
