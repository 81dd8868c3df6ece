//! The JSONL log of real mode: one line per frame and per connection event.
//!
//! Writing it must not slow the frames it describes. A frame line is written straight into an
//! in-memory buffer (no JSON tree, no allocation per field), and full buffers go to a thread
//! that writes the file, so the forwarding thread never waits on the disk unless the disk
//! falls more than a few buffers behind (then it waits: the log loses no line, and its memory
//! stays bounded). A write that fails (a full disk) is not survived quietly: the proxy is told
//! ([`Log::failed`]) and stops, since a log with lines missing would mislead whoever reads it.

use crate::relay::FrameRecord;
use serde_json::{json, Value};
use std::borrow::Cow;
use std::cell::RefCell;
use std::fs::File;
use std::io::Write;
use std::path::Path;
use std::sync::mpsc::{sync_channel, SyncSender};
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;
use std::time::Instant;
use tokio_tungstenite::tungstenite::Message;

/// A buffer this full is handed to the writing thread.
const HANDOFF_BYTES: usize = 64 * 1024;
/// Buffers handed off but not yet written, at most, before the proxy waits for the disk.
const BUFFERS_IN_FLIGHT: usize = 16;

/// The way to the writing thread, and the thread (taken at shutdown).
type Writer = (SyncSender<Vec<u8>>, JoinHandle<()>);

/// The log: see the module documentation.
pub(crate) struct Log {
    buffer: RefCell<Vec<u8>>,
    writer: RefCell<Option<Writer>>,
    payloads: bool,
    start: Instant,
    /// Why writing the file failed, once it has, and who to tell.
    failure: Arc<Failure>,
}

/// The first write error of the log's thread, for the proxy's thread.
#[derive(Default)]
struct Failure {
    why: OnceLock<String>,
    told: tokio::sync::Notify,
}

impl Log {
    /// Creates the file and starts its writing thread.
    pub(crate) fn create(path: &Path, payloads: bool) -> std::io::Result<Log> {
        let mut file = File::create(path)?;
        let (sender, buffers) = sync_channel::<Vec<u8>>(BUFFERS_IN_FLIGHT);
        let shown = path.display().to_string();
        let failure = Arc::new(Failure::default());
        let told = Arc::clone(&failure);
        let thread = std::thread::Builder::new().name("proxy-log".into()).spawn(move || {
            for buffer in buffers {
                // After a failure the buffers are still taken, so forwarding never waits on them.
                if told.why.get().is_none() {
                    if let Err(e) = file.write_all(&buffer).and_then(|()| file.flush()) {
                        let _ = told.why.set(format!("writing the log {shown} failed: {e}"));
                        told.told.notify_one();
                    }
                }
            }
        })?;
        Ok(Log {
            buffer: RefCell::new(Vec::with_capacity(HANDOFF_BYTES)),
            writer: RefCell::new(Some((sender, thread))),
            payloads,
            start: Instant::now(),
            failure,
        })
    }

    /// Waits until a write of the log has failed; why.
    pub(crate) async fn failed(&self) -> String {
        loop {
            if let Some(why) = self.failure.why.get() {
                return why.clone();
            }
            self.failure.told.notified().await;
        }
    }

    /// When the proxy started, as `t_us` counts.
    pub(crate) fn start(&self) -> Instant {
        self.start
    }

    fn t_us(&self) -> u64 {
        self.start.elapsed().as_micros() as u64
    }

    /// Appends one line, built by `write`; hands the buffer off once it is full.
    fn line(&self, write: impl FnOnce(&mut Vec<u8>)) {
        let full = {
            let mut buffer = self.buffer.borrow_mut();
            write(&mut buffer);
            buffer.push(b'\n');
            buffer.len() >= HANDOFF_BYTES
        };
        if full {
            self.flush();
        }
    }

    /// A connection or admin event: `value` with `t_us` added. Keys come out in alphabetical order.
    pub(crate) fn event(&self, mut value: Value) {
        if let Value::Object(map) = &mut value {
            map.insert("t_us".into(), json!(self.t_us()));
        }
        self.line(|out| {
            let _ = serde_json::to_writer(out, &value);
        });
    }

    /// A frame line, keys in alphabetical order as [`event`](Self::event) writes them.
    pub(crate) fn frame(&self, record: &FrameRecord<'_>) {
        self.line(|out| {
            let _ = write_frame(out, record, self.payloads);
        });
    }

    /// Hands what is buffered to the writing thread.
    pub(crate) fn flush(&self) {
        let buffer = {
            let mut buffer = self.buffer.borrow_mut();
            if buffer.is_empty() {
                return;
            }
            std::mem::replace(&mut *buffer, Vec::with_capacity(HANDOFF_BYTES))
        };
        if let Some((sender, _)) = &*self.writer.borrow() {
            let _ = sender.send(buffer);
        }
    }

    /// Writes everything out and stops the writing thread (at shutdown).
    pub(crate) fn close(&self) {
        self.flush();
        if let Some((sender, thread)) = self.writer.borrow_mut().take() {
            drop(sender);
            let _ = thread.join();
        }
    }
}

/// What a frame line says of a JSON text frame without `--log-payloads`: the fields that name
/// the frame in the iii protocol, and that rules match on (`type`, `function_id`,
/// `invocation_id`), when they are strings at the top level of an object.
///
/// Read by a scan of the text, not a parse: a JSON tree (or serde's skipping of the fields it
/// does not want) allocates for every frame, and a frame line allocates nothing (an escaped
/// string value is decoded, the one exception). The scan follows strings and nesting; a text
/// it cannot follow to the object's end gives no summary.
#[derive(Default)]
struct Summary<'a> {
    frame_type: Option<Cow<'a, str>>,
    function_id: Option<Cow<'a, str>>,
    invocation_id: Option<Cow<'a, str>>,
}

impl<'a> Summary<'a> {
    fn of(message: &'a Message) -> Self {
        match message {
            Message::Text(text) => Self::scan(text.as_str()).unwrap_or_default(),
            _ => Self::default(),
        }
    }

    fn scan(text: &'a str) -> Option<Self> {
        let bytes = text.as_bytes();
        let mut summary = Self::default();
        let mut at = skip_space(bytes, 0);
        (bytes.get(at) == Some(&b'{')).then_some(())?;
        at = skip_space(bytes, at + 1);
        if bytes.get(at) == Some(&b'}') {
            return Some(summary);
        }
        loop {
            let key_end = string_end(bytes, at)?;
            let key = &text[at..key_end];
            at = skip_space(bytes, key_end);
            (bytes.get(at) == Some(&b':')).then_some(())?;
            let start = skip_space(bytes, at + 1);
            let end = value_end(bytes, start)?;
            let slot = match key {
                "\"type\"" => Some(&mut summary.frame_type),
                "\"function_id\"" => Some(&mut summary.function_id),
                "\"invocation_id\"" => Some(&mut summary.invocation_id),
                _ => None,
            };
            if let (Some(slot), Some(b'"')) = (slot, bytes.get(start)) {
                let inner = &text[start + 1..end - 1];
                *slot = Some(match inner.contains('\\') {
                    false => Cow::Borrowed(inner),
                    true => Cow::Owned(serde_json::from_str(&text[start..end]).ok()?),
                });
            }
            at = skip_space(bytes, end);
            match bytes.get(at) {
                Some(b',') => at = skip_space(bytes, at + 1),
                Some(b'}') => return (skip_space(bytes, at + 1) == bytes.len()).then_some(summary),
                _ => return None,
            }
        }
    }
}

fn skip_space(bytes: &[u8], mut at: usize) -> usize {
    while bytes.get(at).is_some_and(|b| matches!(b, b' ' | b'\t' | b'\n' | b'\r')) {
        at += 1;
    }
    at
}

/// Just past the string that starts at `at` (its closing quote).
fn string_end(bytes: &[u8], at: usize) -> Option<usize> {
    (bytes.get(at) == Some(&b'"')).then_some(())?;
    let mut i = at + 1;
    loop {
        match bytes.get(i)? {
            b'"' => return Some(i + 1),
            b'\\' => i += 2,
            _ => i += 1,
        }
    }
}

/// Just past the value that starts at `at`: a string, a nested object or array (followed by
/// its depth), or a bare word (number, `true`, `false`, `null`).
fn value_end(bytes: &[u8], at: usize) -> Option<usize> {
    match bytes.get(at)? {
        b'"' => string_end(bytes, at),
        b'{' | b'[' => {
            let (mut depth, mut i) = (0usize, at);
            loop {
                match bytes.get(i)? {
                    b'"' => i = string_end(bytes, i)?,
                    b'{' | b'[' => (depth, i) = (depth + 1, i + 1),
                    b'}' | b']' => {
                        depth -= 1;
                        i += 1;
                        if depth == 0 {
                            return Some(i);
                        }
                    }
                    _ => i += 1,
                }
            }
        }
        _ => {
            let length =
                bytes[at..].iter().position(|b| matches!(b, b',' | b'}' | b']' | b' ' | b'\t' | b'\n' | b'\r'));
            let end = at + length.unwrap_or(bytes.len() - at);
            (end > at).then_some(end)
        }
    }
}

/// `,"key":"value"` for each field a summary has, keys in the order given.
fn write_fields(out: &mut Vec<u8>, fields: &[(&str, Option<&str>)]) -> std::io::Result<()> {
    for (key, value) in fields {
        if let Some(value) = value {
            write!(out, ",\"{key}\":")?;
            string(out, value)?;
        }
    }
    Ok(())
}

/// A JSON string, escaped.
fn string(out: &mut Vec<u8>, text: &str) -> std::io::Result<()> {
    serde_json::to_writer(out, text).map_err(std::io::Error::other)
}

fn write_frame(out: &mut Vec<u8>, record: &FrameRecord<'_>, payloads: bool) -> std::io::Result<()> {
    write!(out, "{{\"action\":\"{}\",", record.action)?;
    if let Message::Close(frame) = record.message {
        match frame {
            Some(frame) => {
                write!(out, "\"close_code\":{},\"close_reason\":", u16::from(frame.code))?;
                string(out, frame.reason.as_str())?;
                out.push(b',');
            }
            None => out.extend_from_slice(b"\"close_code\":null,\"close_reason\":null,"),
        }
    }
    let summary = Summary::of(record.message);
    write!(out, "\"conn\":{},\"direction\":\"{}\",\"event\":\"frame\"", record.conn, record.direction.as_str())?;
    write_fields(
        out,
        &[("function_id", summary.function_id.as_deref()), ("invocation_id", summary.invocation_id.as_deref())],
    )?;
    write!(out, ",\"kind\":\"{}\",", record.kind.as_str())?;
    if payloads {
        match record.message {
            Message::Text(text) => {
                out.extend_from_slice(b"\"payload\":");
                string(out, text.as_str())?;
                out.push(b',');
            }
            Message::Binary(bytes) | Message::Ping(bytes) | Message::Pong(bytes) => {
                write!(out, "\"payload_base64\":\"{}\",", data_encoding::BASE64.encode(bytes))?;
            }
            _ => {}
        }
    }
    match record.rule {
        Some(rule) => write!(out, "\"rule\":{rule},\"rule_name\":")?,
        None => out.extend_from_slice(b"\"rule\":null,\"rule_name\":"),
    }
    match record.rule_name {
        Some(name) => string(out, name)?,
        None => out.extend_from_slice(b"null"),
    }
    write!(out, ",\"size\":{},\"t_us\":{}", record.size, record.t_us)?;
    write_fields(out, &[("type", summary.frame_type.as_deref())])?;
    out.push(b'}');
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rule::{Direction, FrameKind};
    use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
    use tokio_tungstenite::tungstenite::protocol::CloseFrame;

    /// The line a `serde_json::Value` would give, built the slow way: what the log wrote before.
    fn slow_line(record: &FrameRecord<'_>, payloads: bool) -> Value {
        let mut line = match serde_json::to_value(record) {
            Ok(Value::Object(map)) => map,
            _ => unreachable!(),
        };
        line.insert("event".into(), json!("frame"));
        if let Message::Text(text) = record.message {
            if let Ok(Value::Object(frame)) = serde_json::from_str::<Value>(text.as_str()) {
                for key in ["type", "function_id", "invocation_id"] {
                    if let Some(Value::String(value)) = frame.get(key) {
                        line.insert(key.into(), json!(value));
                    }
                }
            }
        }
        if let Message::Close(frame) = record.message {
            line.insert("close_code".into(), json!(frame.as_ref().map(|f| u16::from(f.code))));
            line.insert("close_reason".into(), json!(frame.as_ref().map(|f| f.reason.as_str())));
        }
        if payloads {
            match record.message {
                Message::Text(text) => {
                    line.insert("payload".into(), json!(text.as_str()));
                }
                Message::Binary(b) | Message::Ping(b) | Message::Pong(b) => {
                    line.insert("payload_base64".into(), json!(data_encoding::BASE64.encode(b)));
                }
                _ => {}
            }
        }
        Value::Object(line)
    }

    #[test]
    fn frame_lines_are_the_json_a_value_would_give() {
        let messages = [
            Message::text("say \"hi\" \u{1}\n ☃"),
            Message::text(
                r#"{"type":"invocationresult","function_id":"harness::turn","invocation_id":"i-1","result":{"a":[1,{"b":"c"}]}}"#,
            ),
            Message::text(r#"{"type":"invokefunction","function_id":"say \"hi\" ☃","data":{}}"#),
            Message::text(r#"{"type":7,"function_id":null}"#),
            Message::text(r#"[{"type":"not an object"}]"#),
            Message::text(r#" { "data" : { "type" : "nested" } , "type" : "invokefunction" , "n" : -1.5e3 } "#),
            Message::text(r#"{"type":"cut short","data":{"#),
            Message::text("{}"),
            Message::binary(vec![0, 1, 2, 255]),
            Message::Ping(b"p".to_vec().into()),
            Message::Close(None),
            Message::Close(Some(CloseFrame { code: CloseCode::from(4000), reason: "bye \"now\"".into() })),
        ];
        for message in &messages {
            for (rule, rule_name) in [(None, None), (Some(3), Some("cut \"it\""))] {
                for payloads in [false, true] {
                    let (kind, size) = crate::relay::frame_kind(message);
                    let record = FrameRecord {
                        t_us: 42,
                        conn: 7,
                        direction: Direction::Down,
                        kind,
                        size,
                        rule,
                        rule_name,
                        action: "drop",
                        message,
                    };
                    let mut out = Vec::new();
                    write_frame(&mut out, &record, payloads).unwrap();
                    let fast = String::from_utf8(out).unwrap();
                    let slow = serde_json::to_string(&slow_line(&record, payloads)).unwrap();
                    assert_eq!(fast, slow);
                    let _ = FrameKind::Text;
                }
            }
        }
    }
}
