//! Frames to and from their WebSocket text, with a memory of the frames this thread sent.
//!
//! In a simulated run every end of every connection is in this process, so each frame was read
//! back from text this process wrote a moment earlier: reading it again (a JSON parse, payload
//! and all) was the largest single cost of a simulated step. A sender here keeps the frame it
//! wrote, under its text, when the frame reads back as itself; a receiver given those exact
//! bytes takes the frame back instead of parsing them. What a receiver gets is always what
//! [`Frame::from_wire`] reads from the text (the bytes on the wire do not change), so a run is
//! the same whether or not the memory holds its frames: it only saves work. Text from anywhere
//! else (a real worker in live mode, a frame a proxy rewrote) is not in it and is read as before.

use super::protocol::Frame;
use serde_json::Value;
use std::cell::RefCell;
use std::collections::HashMap;
use tokio_tungstenite::tungstenite::{Message, Utf8Bytes};

/// The most frames remembered on a thread. Frames lost on the way (a partition, a crash) are
/// never taken back: past this many, the memory starts over, which costs only the parse.
const REMEMBERED_MAX: usize = 1_024;

thread_local! {
    // Keyed by the exact text; never iterated, so its order cannot show anywhere.
    static SENT: RefCell<HashMap<Utf8Bytes, Frame>> = RefCell::new(HashMap::new());
}

/// The frame as a WebSocket text message, its frame remembered when it reads back as itself.
pub fn encode(frame: Frame) -> Message {
    let text = Utf8Bytes::from(serde_json::to_string(&frame).expect("frames serialize"));
    if reads_back(&frame) {
        SENT.with(|sent| {
            let mut sent = sent.borrow_mut();
            if sent.len() >= REMEMBERED_MAX {
                sent.clear();
            }
            sent.insert(text.clone(), frame);
        });
    }
    Message::Text(text)
}

/// The frame a text message holds: exactly [`Frame::from_wire`]'s result, taken from the memory
/// when this thread sent these bytes.
pub fn decode(text: &str) -> Result<Frame, serde_json::Error> {
    match SENT.with(|sent| sent.borrow_mut().remove(text)) {
        Some(frame) => Ok(frame),
        None => Frame::from_wire(text),
    }
}

/// Whether [`Frame::from_wire`] reads the frame's own text back as an equal frame. Not for a
/// result of `null`, which reads back as no result; not for anything holding a fractional
/// number, which serde_json reads back to within a rounding, not always to the bit; not for a
/// kind the rig does not act on.
fn reads_back(frame: &Frame) -> bool {
    match frame {
        Frame::InvokeFunction { data, .. } => exact(data),
        Frame::InvocationResult { result, .. } => match result {
            Some(Value::Null) => false,
            Some(result) => exact(result),
            None => true,
        },
        Frame::WorkerRegistered { .. }
        | Frame::RegisterFunction { .. }
        | Frame::Reattach { .. }
        | Frame::UnregisterFunction { .. } => true,
        Frame::Other => false,
    }
}

/// Whether a JSON value holds no fractional number.
fn exact(value: &Value) -> bool {
    match value {
        Value::Number(number) => !number.is_f64(),
        Value::Array(items) => items.iter().all(exact),
        Value::Object(fields) => fields.values().all(exact),
        Value::Null | Value::Bool(_) | Value::String(_) => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bus::{Action, ErrorBody};
    use serde_json::json;

    fn frames() -> Vec<Frame> {
        let awkward = || String::from("q\"\\\n\t\u{1}é ☃");
        vec![
            Frame::WorkerRegistered { worker_id: "worker-1".into() },
            Frame::RegisterFunction { id: awkward(), description: None },
            Frame::RegisterFunction { id: "f".into(), description: Some(awkward()) },
            Frame::InvokeFunction { invocation_id: None, function_id: "f".into(), data: Value::Null, action: None },
            Frame::InvokeFunction {
                invocation_id: Some("i".into()),
                function_id: "f".into(),
                data: json!({ "b": [1, -2, u64::MAX, i64::MIN, null, true], "a": { "z": awkward(), "y": {} } }),
                action: Some(Action::Enqueue { queue: "q".into() }),
            },
            Frame::InvokeFunction {
                invocation_id: None,
                function_id: "f".into(),
                data: json!([]),
                action: Some(Action::Void),
            },
            Frame::InvokeFunction {
                invocation_id: None,
                function_id: "f".into(),
                data: json!({ "x": 0.1, "y": 1e300 }),
                action: None,
            },
            Frame::InvocationResult {
                invocation_id: "i".into(),
                function_id: "f".into(),
                result: Some(json!({ "ok": true, "n": 3 })),
                error: None,
            },
            Frame::InvocationResult {
                invocation_id: "i".into(),
                function_id: "f".into(),
                result: Some(Value::Null),
                error: None,
            },
            Frame::InvocationResult { invocation_id: "i".into(), function_id: "f".into(), result: None, error: None },
            Frame::InvocationResult {
                invocation_id: "i".into(),
                function_id: "f".into(),
                result: None,
                error: Some(ErrorBody::new("c", awkward())),
            },
            Frame::Reattach { previous_worker_id: "worker-3".into(), reattach_token: Some("t".into()) },
            Frame::Reattach { previous_worker_id: "worker-3".into(), reattach_token: None },
            Frame::UnregisterFunction { id: "f".into() },
            Frame::Other,
        ]
    }

    /// What a receiver gets for a frame this thread sent is what reading its text gives, for
    /// every kind and every awkward field, remembered or not.
    #[test]
    fn a_remembered_frame_is_what_reading_its_text_gives() {
        for frame in frames() {
            let Message::Text(text) = encode(frame.clone()) else { panic!("a text message") };
            let read = Frame::from_wire(&text).expect("our own frames read");
            assert_eq!(decode(&text).expect("our own frames decode"), read, "{frame:?}");
            if reads_back(&frame) {
                assert_eq!(read, frame, "a frame remembered must read back as itself");
            }
            // Taken once: the same bytes again are read, and give the same frame.
            assert_eq!(decode(&text).expect("read again"), read);
        }
    }

    #[test]
    fn text_not_sent_here_is_read() {
        let text = r#"{"function_id":"f","type":"invokefunction","data":{"x":1}}"#;
        assert_eq!(decode(text).unwrap(), Frame::from_wire(text).unwrap());
        assert_eq!(decode("nonsense").unwrap_err().to_string(), Frame::from_wire("nonsense").unwrap_err().to_string());
    }

    #[test]
    fn the_memory_stays_bounded() {
        for n in 0..REMEMBERED_MAX * 3 {
            encode(Frame::UnregisterFunction { id: format!("f{n}") });
        }
        assert!(SENT.with(|sent| sent.borrow().len()) <= REMEMBERED_MAX);
    }
}
