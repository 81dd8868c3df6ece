//! The JSONL log of real mode: one line per frame and per connection event.
//!
//! Writing it must not slow the frames it describes. A frame line is written straight into an
//! in-memory buffer (no JSON tree, no allocation per field), and full buffers go to a thread
//! that writes the file, so the forwarding thread never waits on the disk unless the disk
//! falls more than a few buffers behind (then it waits: the log loses no line, and its memory
//! stays bounded).

use crate::relay::FrameRecord;
use serde_json::{json, Value};
use std::cell::RefCell;
use std::fs::File;
use std::io::Write;
use std::path::Path;
use std::sync::mpsc::{sync_channel, SyncSender};
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
}

impl Log {
    /// Creates the file and starts its writing thread.
    pub(crate) fn create(path: &Path, payloads: bool) -> std::io::Result<Log> {
        let mut file = File::create(path)?;
        let (sender, buffers) = sync_channel::<Vec<u8>>(BUFFERS_IN_FLIGHT);
        let shown = path.display().to_string();
        let thread = std::thread::Builder::new().name("proxy-log".into()).spawn(move || {
            let mut failed = false;
            for buffer in buffers {
                if let Err(e) = file.write_all(&buffer) {
                    // A full disk must not stop the traffic: reported once, lines are lost.
                    if !std::mem::replace(&mut failed, true) {
                        eprintln!("proxy: writing the log {shown} failed: {e}");
                    }
                }
            }
            let _ = file.flush();
        })?;
        Ok(Log {
            buffer: RefCell::new(Vec::with_capacity(HANDOFF_BYTES)),
            writer: RefCell::new(Some((sender, thread))),
            payloads,
            start: Instant::now(),
        })
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
    write!(
        out,
        "\"conn\":{},\"direction\":\"{}\",\"event\":\"frame\",\"kind\":\"{}\",",
        record.conn,
        record.direction.as_str(),
        record.kind.as_str()
    )?;
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
    write!(out, ",\"size\":{},\"t_us\":{}}}", record.size, record.t_us)
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
