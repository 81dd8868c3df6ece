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

use super::protocol::{Action, ErrorBody, Frame};
use serde::Serialize;
use serde_json::Value;
use std::cell::RefCell;
use std::collections::VecDeque;
use tokio_tungstenite::tungstenite::{Message, Utf8Bytes};

/// The most frames remembered on a thread. Frames lost on the way (a partition, a crash) are
/// never taken back: past this many, the oldest is forgotten, which costs only its parse should
/// it arrive after all.
const REMEMBERED_MAX: usize = 1_024;

thread_local! {
    // Oldest first. Looked through from the newest: the frame a receiver takes was sent a
    // moment ago, after the frames that were lost and before only those still on their way.
    static SENT: RefCell<VecDeque<Sent>> = const { RefCell::new(VecDeque::new()) };
}

/// A frame this thread sent, under its text.
///
/// Found by a look through the few frames on their way rather than by a hash of the text: a
/// hash of the text's ends (a multiply per eight bytes, each waiting for the one before) for
/// every frame sent and taken was about 1 % of a catalogue pass's CPU time (under perf), and
/// the table's insert and removal as much again, for a memory that holds eight or nine frames
/// at a time, the one taken about the fifth from the newest (measured over a catalogue). An
/// entry is told apart by the text's length and eight of its bytes first ([`probe`]), and only
/// then compared in full: a frame is only ever taken for its exact text.
struct Sent {
    len: usize,
    probe: u64,
    text: Utf8Bytes,
    frame: Frame,
}

/// Where [`probe`] reads: the eight bytes after `{"type":"invocationresult","invocation_id":"`
/// (44 bytes), the invocation id's first characters in a result, and in an invocation (three
/// bytes shorter) its third to tenth: what tells apart the frames on their way at one time.
const PROBE_AT: usize = 44;

/// Eight bytes of a text, from [`PROBE_AT`] or its last eight if it is shorter (all of it, padded
/// with zeros, below eight).
fn probe(text: &[u8]) -> u64 {
    let mut word = [0u8; 8];
    let at = text.len().min(PROBE_AT + 8).saturating_sub(8);
    let end = text.len().min(at + 8);
    word[..end - at].copy_from_slice(&text[at..end]);
    u64::from_le_bytes(word)
}

/// The frame as a WebSocket text message, its frame remembered when it reads back as itself.
pub fn encode(frame: Frame) -> Message {
    let (text, has_fraction) = written(&frame);
    let text = Utf8Bytes::from(text);
    if reads_back(&frame, has_fraction) {
        remember(text.clone(), frame);
    }
    Message::Text(text)
}

/// The frame's text (serde_json's compact form), and whether it holds a fractional number.
/// Written here field by field, a payload by [`Text::value`], in the derived writer's order:
/// an invocation and a result are nearly every frame sent, and a connection's registrations
/// (a third of the frames written) went through serde_json's serializer.
fn written(frame: &Frame) -> (String, bool) {
    let mut out = Text { out: String::with_capacity(FRAME_CAPACITY), scratch: Vec::new(), wrote_fraction: false };
    match frame {
        // The derived writer's order: the tag, then the fields as declared, those it skips left out.
        Frame::InvokeFunction { invocation_id, function_id, data, action } => {
            out.raw("{\"type\":\"invokefunction\"");
            if let Some(invocation_id) = invocation_id {
                out.raw(",\"invocation_id\":");
                out.text(invocation_id);
            }
            out.raw(",\"function_id\":");
            out.text(function_id);
            out.raw(",\"data\":");
            out.value(data);
            if let Some(action) = action {
                out.raw(",\"action\":");
                out.action(action);
            }
            out.raw("}");
        }
        Frame::InvocationResult { invocation_id, function_id, result, error } => {
            out.raw("{\"type\":\"invocationresult\",\"invocation_id\":");
            out.text(invocation_id);
            out.raw(",\"function_id\":");
            out.text(function_id);
            if let Some(result) = result {
                out.raw(",\"result\":");
                out.value(result);
            }
            if let Some(error) = error {
                out.raw(",\"error\":");
                out.error(error);
            }
            out.raw("}");
        }
        Frame::WorkerRegistered { worker_id } => {
            out.raw("{\"type\":\"workerregistered\",\"worker_id\":");
            out.text(worker_id);
            out.raw("}");
        }
        Frame::RegisterFunction { id, description } => {
            out.raw("{\"type\":\"registerfunction\",\"id\":");
            out.text(id);
            if let Some(description) = description {
                out.raw(",\"description\":");
                out.text(description);
            }
            out.raw("}");
        }
        Frame::Reattach { previous_worker_id, reattach_token } => {
            out.raw("{\"type\":\"reattach\",\"previous_worker_id\":");
            out.text(previous_worker_id);
            if let Some(reattach_token) = reattach_token {
                out.raw(",\"reattach_token\":");
                out.text(reattach_token);
            }
            out.raw("}");
        }
        Frame::UnregisterFunction { id } => {
            out.raw("{\"type\":\"unregisterfunction\",\"id\":");
            out.text(id);
            out.raw("}");
        }
        Frame::Other => out.serde(frame),
    }
    (out.out, out.wrote_fraction)
}

/// The room a frame's text starts with: 94 % of a catalogue's frames fit (46 % within 128 bytes,
/// the room it started with before, which half of them outgrew and were copied to grow).
const FRAME_CAPACITY: usize = 512;

/// The room serde_json's pieces start with ([`Text::serde`]): a number.
const SCRATCH_CAPACITY: usize = 128;

/// serde_json's compact text, to the byte, written without serde for the values frames carry:
/// serde_json looks at a text a byte at a time for characters to escape and goes through its
/// serializer's state for every field, and writing frames was about 6 % of a run's instructions
/// (under callgrind). Notes whether it wrote a fractional number, as [`NotesFractions`] does.
///
/// Written as a `String` piece by piece (every piece is a `str` or serde_json's text), so that
/// the finished frame is not looked through again to be taken for UTF-8.
struct Text {
    out: String,
    /// Where serde_json writes, for the few pieces it writes (fractions), before they join
    /// [`Text::out`].
    scratch: Vec<u8>,
    wrote_fraction: bool,
}

impl Text {
    fn raw(&mut self, text: &str) {
        self.out.push_str(text);
    }

    /// Anything as serde_json writes it, fractions noted: a fractional number, or a frame of a
    /// kind the rig does not act on.
    fn serde(&mut self, value: &(impl Serialize + ?Sized)) {
        let mut formatter = NotesFractions::default();
        self.scratch.clear();
        self.scratch.reserve(SCRATCH_CAPACITY);
        value
            .serialize(&mut serde_json::Serializer::with_formatter(&mut self.scratch, &mut formatter))
            .expect("frames serialize");
        self.out.push_str(std::str::from_utf8(&self.scratch).expect("serde_json writes UTF-8"));
        self.wrote_fraction |= formatter.wrote_fraction;
    }

    /// An action as its derived writer writes it: its tag, then its fields.
    fn action(&mut self, action: &Action) {
        match action {
            Action::Void => self.raw("{\"type\":\"void\"}"),
            Action::Enqueue { queue } => {
                self.raw("{\"type\":\"enqueue\",\"queue\":");
                self.text(queue);
                self.raw("}");
            }
        }
    }

    /// An error body as its derived writer writes it.
    fn error(&mut self, error: &ErrorBody) {
        self.raw("{\"code\":");
        self.text(&error.code);
        self.raw(",\"message\":");
        self.text(&error.message);
        self.raw("}");
    }

    /// A string, quoted: as it is when it has nothing to escape (most have nothing), else with
    /// serde_json's escapes.
    fn text(&mut self, text: &str) {
        self.out.reserve(text.len() + 2);
        self.out.push('"');
        if crate::json_text::plain(text) {
            self.out.push_str(text);
        } else {
            self.escaped(text);
        }
        self.out.push('"');
    }

    /// A string's characters as serde_json escapes them: `"` and `\` behind a backslash, the
    /// control characters that have a short escape with it (`\b`, `\t`, `\n`, `\f`, `\r`), the
    /// others as `\u00` and two lowercase hex digits; everything else (DEL and all of non-ASCII
    /// included) as it is.
    fn escaped(&mut self, text: &str) {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let mut start = 0;
        for (at, byte) in text.bytes().enumerate() {
            let short = ESCAPES[usize::from(byte)];
            if short == 0 {
                continue;
            }
            // Every byte escaped is ASCII, so `at` falls between two characters.
            self.out.push_str(&text[start..at]);
            self.out.push('\\');
            self.out.push(char::from(short));
            if short == b'u' {
                self.out.push_str("00");
                self.out.push(char::from(HEX[usize::from(byte >> 4)]));
                self.out.push(char::from(HEX[usize::from(byte & 0xf)]));
            }
            start = at + 1;
        }
        self.out.push_str(&text[start..]);
    }

    /// An integer in decimal, as serde_json (itoa) writes it.
    fn decimal(&mut self, negative: bool, n: u64) {
        if negative {
            self.out.push('-');
        }
        let digits = &mut [0; 20];
        self.out.push_str(std::str::from_utf8(crate::json_text::decimal(n, digits)).expect("decimal digits"));
    }

    /// A JSON value as serde_json writes it: keys in the map's order, integers in decimal,
    /// fractional numbers through serde_json (ryu).
    fn value(&mut self, value: &Value) {
        match value {
            Value::Null => self.raw("null"),
            Value::Bool(true) => self.raw("true"),
            Value::Bool(false) => self.raw("false"),
            Value::Number(number) => match (number.as_u64(), number.as_i64()) {
                (Some(n), _) => self.decimal(false, n),
                (None, Some(n)) => self.decimal(n < 0, n.unsigned_abs()),
                (None, None) => self.serde(number),
            },
            Value::String(text) => self.text(text),
            Value::Array(items) => {
                self.out.push('[');
                for (index, item) in items.iter().enumerate() {
                    if index > 0 {
                        self.out.push(',');
                    }
                    self.value(item);
                }
                self.out.push(']');
            }
            Value::Object(fields) => {
                self.out.push('{');
                for (index, (key, item)) in fields.iter().enumerate() {
                    if index > 0 {
                        self.out.push(',');
                    }
                    self.text(key);
                    self.out.push(':');
                    self.value(item);
                }
                self.out.push('}');
            }
        }
    }
}

/// What follows the backslash in serde_json's escape of each byte, `0` for a byte written as it
/// is (a look-up per byte, as serde_json's own).
const ESCAPES: [u8; 256] = {
    let mut escapes = [0u8; 256];
    let mut byte = 0;
    while byte < 0x20 {
        escapes[byte] = b'u';
        byte += 1;
    }
    escapes[0x08] = b'b';
    escapes[0x09] = b't';
    escapes[0x0a] = b'n';
    escapes[0x0c] = b'f';
    escapes[0x0d] = b'r';
    escapes[b'"' as usize] = b'"';
    escapes[b'\\' as usize] = b'\\';
    escapes
};

/// serde_json's compact output, to the byte, noting whether it wrote a fractional number: a
/// frame's numbers are all in its payload, so that says whether the payload is [`exact`]
/// without walking it again after writing it.
#[derive(Default)]
struct NotesFractions {
    wrote_fraction: bool,
}

impl serde_json::ser::Formatter for &mut NotesFractions {
    fn write_f32<W: ?Sized + std::io::Write>(&mut self, writer: &mut W, value: f32) -> std::io::Result<()> {
        self.wrote_fraction = true;
        serde_json::ser::CompactFormatter.write_f32(writer, value)
    }

    fn write_f64<W: ?Sized + std::io::Write>(&mut self, writer: &mut W, value: f64) -> std::io::Result<()> {
        self.wrote_fraction = true;
        serde_json::ser::CompactFormatter.write_f64(writer, value)
    }
}

/// [`encode`] for a frame whose text is known already: `text` is what [`decode_known`] gave
/// with an equal frame. The engine passes a frame on unchanged so (most invocations and their
/// results), without writing its payload out again.
pub fn encode_known(frame: Frame, text: Utf8Bytes) -> Message {
    debug_assert_eq!(serde_json::to_string(&frame).expect("frames serialize"), text.as_str());
    remember(text.clone(), frame);
    Message::Text(text)
}

fn remember(text: Utf8Bytes, frame: Frame) {
    let (len, probe) = (text.len(), probe(text.as_bytes()));
    SENT.with(|sent| {
        let mut sent = sent.borrow_mut();
        if sent.len() >= REMEMBERED_MAX {
            sent.pop_front();
        }
        sent.push_back(Sent { len, probe, text, frame });
    });
}

/// The frame remembered under exactly `text`, taken out of the memory.
fn take(text: &str) -> Option<Frame> {
    let (len, probe) = (text.len(), probe(text.as_bytes()));
    SENT.with(|sent| {
        let mut sent = sent.borrow_mut();
        let at = sent.iter().rposition(|s| s.len == len && s.probe == probe && s.text.as_str() == text)?;
        // The newest frame takes its place rather than every newer one moving up: the order is
        // only where the look starts, and a frame held whole is too big to move around.
        sent.swap_remove_back(at).map(|s| s.frame)
    })
}

/// The frame a text message holds: exactly [`Frame::from_wire`]'s result, taken from the memory
/// when this thread sent these bytes.
pub fn decode(text: &str) -> Result<Frame, serde_json::Error> {
    match take(text) {
        Some(frame) => Ok(frame),
        None => Frame::from_wire(text),
    }
}

/// [`decode`], with the text back when it is known to be the frame's own ([`encode`]'s, to the
/// byte), which holds for a frame taken from the memory: an equal frame sent on may then go
/// with it ([`encode_known`]). Text from anywhere else is read, and not given back: its bytes
/// may say the frame differently (spacing, field order), and what goes on is always ours.
pub fn decode_known(text: &Utf8Bytes) -> Result<(Frame, Option<Utf8Bytes>), serde_json::Error> {
    match take(text.as_str()) {
        Some(frame) => Ok((frame, Some(text.clone()))),
        None => Frame::from_wire(text).map(|frame| (frame, None)),
    }
}

/// Whether [`Frame::from_wire`] reads the frame's own text back as an equal frame, given
/// whether that text holds a fractional number (see [`NotesFractions`]). Not for a result of
/// `null`, which reads back as no result; not for anything holding a fractional number, which
/// serde_json reads back to within a rounding, not always to the bit; not for a kind the rig
/// does not act on.
fn reads_back(frame: &Frame, has_fraction: bool) -> bool {
    match frame {
        Frame::InvokeFunction { .. } => !has_fraction,
        Frame::InvocationResult { result, .. } => match result {
            Some(Value::Null) => false,
            Some(_) => !has_fraction,
            None => true,
        },
        Frame::WorkerRegistered { .. }
        | Frame::RegisterFunction { .. }
        | Frame::Reattach { .. }
        | Frame::UnregisterFunction { .. } => true,
        Frame::Other => false,
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

    /// Whether a JSON value holds no fractional number.
    fn exact(value: &Value) -> bool {
        match value {
            Value::Number(number) => !number.is_f64(),
            Value::Array(items) => items.iter().all(exact),
            Value::Object(fields) => fields.values().all(exact),
            Value::Null | Value::Bool(_) | Value::String(_) => true,
        }
    }

    /// Whether the frame's fields hold a fractional number, found by walking them.
    fn has_fraction(frame: &Frame) -> bool {
        match frame {
            Frame::InvokeFunction { data, .. } => !exact(data),
            Frame::InvocationResult { result: Some(result), .. } => !exact(result),
            _ => false,
        }
    }

    /// The frame as remembered by [`encode`]: whether its text reads back as itself.
    fn remembered(frame: &Frame) -> bool {
        reads_back(frame, has_fraction(frame))
    }

    /// The text is serde_json's own, and the fraction noted while writing it is the one
    /// walking the frame finds, for numbers of every kind, nested or not.
    #[test]
    fn a_text_is_serde_jsons_and_its_fractions_are_noted() {
        let mut all = frames();
        for number in [json!(0.5), json!(-0.0), json!(1e300), json!(u64::MAX), json!(i64::MIN), json!(7)] {
            all.push(Frame::InvokeFunction {
                invocation_id: None,
                function_id: "f".into(),
                data: json!({ "deep": [{ "n": number.clone() }] }),
                action: None,
            });
            all.push(Frame::InvocationResult {
                invocation_id: "i".into(),
                function_id: "f".into(),
                result: Some(number),
                error: None,
            });
        }
        for frame in all {
            let (text, fraction) = written(&frame);
            assert_eq!(text, serde_json::to_string(&frame).unwrap());
            assert_eq!(fraction, has_fraction(&frame), "{frame:?}");
        }
    }

    /// Payloads of every shape (nested, empty, numbers of every kind, texts with something to
    /// escape at every place within the eight bytes looked at together, and non-ASCII ones) are
    /// written as serde_json writes them, in invocations and results alike.
    #[test]
    fn payloads_of_every_shape_are_written_as_serde_json_writes_them() {
        // A seeded generator: the same values on every run.
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut next = move |below: u64| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state % below
        };
        let pieces = ["a", "é", "☃", "\"", "\\", "\n", "\u{1}", "\u{1f}", " ", "\u{7f}", "0123456", "x"];
        fn value(next: &mut impl FnMut(u64) -> u64, pieces: &[&str], depth: u32) -> Value {
            let text = |next: &mut dyn FnMut(u64) -> u64| -> String {
                (0..next(20)).map(|_| pieces[next(pieces.len() as u64) as usize]).collect()
            };
            match next(if depth > 3 { 6 } else { 8 }) {
                0 => Value::Null,
                1 => Value::Bool(next(2) == 0),
                2 => json!(next(u64::MAX)),
                3 => json!(-(next(i64::MAX as u64) as i64) - 1),
                4 => json!((next(1_000_000) as f64) / 7.0),
                5 => Value::String(text(next)),
                6 => Value::Array((0..next(4)).map(|_| value(next, pieces, depth + 1)).collect()),
                _ => Value::Object((0..next(4)).map(|_| (text(next), value(next, pieces, depth + 1))).collect()),
            }
        }
        for _ in 0..2_000 {
            let data = value(&mut next, &pieces, 0);
            let id: String = (0..next(12)).map(|_| pieces[next(pieces.len() as u64) as usize]).collect();
            for frame in [
                Frame::InvokeFunction {
                    invocation_id: Some(id.clone()),
                    function_id: id.clone(),
                    data: data.clone(),
                    action: None,
                },
                Frame::InvokeFunction {
                    invocation_id: None,
                    function_id: "f".into(),
                    data: data.clone(),
                    action: Some(Action::Enqueue { queue: id.clone() }),
                },
                Frame::InvocationResult {
                    invocation_id: id.clone(),
                    function_id: "f".into(),
                    result: Some(data.clone()),
                    error: Some(ErrorBody::new("c", id.clone())),
                },
            ] {
                let (text, fraction) = written(&frame);
                assert_eq!(text, serde_json::to_string(&frame).unwrap());
                assert_eq!(fraction, has_fraction(&frame), "{frame:?}");
            }
        }
    }

    /// Every character alone, and beside others, in a text is written as serde_json writes it.
    #[test]
    fn every_character_is_escaped_as_serde_json_escapes_it() {
        let characters = (0..=0x80u32).chain([0xe9, 0x2603, 0x1f600]).filter_map(char::from_u32);
        for character in characters {
            for text in [character.to_string(), format!("a{character}b\"{character}\\")] {
                let mut out = Text { out: String::new(), scratch: Vec::new(), wrote_fraction: false };
                out.text(&text);
                assert_eq!(out.out, serde_json::to_string(&text).unwrap(), "{character:?}");
            }
        }
    }

    /// What a receiver gets for a frame this thread sent is what reading its text gives, for
    /// every kind and every awkward field, remembered or not.
    #[test]
    fn a_remembered_frame_is_what_reading_its_text_gives() {
        for frame in frames() {
            let Message::Text(text) = encode(frame.clone()) else { panic!("a text message") };
            let read = Frame::from_wire(&text).expect("our own frames read");
            assert_eq!(decode(&text).expect("our own frames decode"), read, "{frame:?}");
            if remembered(&frame) {
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

    /// A frame decoded with its own text goes on with it, and reads back the same at the next
    /// hop; text not sent here comes back without one.
    #[test]
    fn a_known_text_goes_on_unchanged() {
        for frame in frames().into_iter().filter(remembered) {
            let Message::Text(text) = encode(frame.clone()) else { panic!("a text message") };
            let (decoded, known) = decode_known(&text).expect("our own frames decode");
            assert_eq!(decoded, frame);
            let known = known.expect("a remembered frame's text is known");
            assert_eq!(known.as_str(), serde_json::to_string(&frame).unwrap());
            let Message::Text(again) = encode_known(decoded, known) else { panic!("a text message") };
            assert_eq!(again, text);
            assert_eq!(decode(&again).expect("read at the next hop"), frame);
        }
        let text = Utf8Bytes::from(r#"{"function_id":"f","type":"invokefunction","data":{"x":1}}"#);
        let (frame, known) = decode_known(&text).unwrap();
        assert_eq!(frame, Frame::from_wire(&text).unwrap());
        assert!(known.is_none(), "text written elsewhere is not passed on as it is");
    }

    /// Texts of one length, alike where they are probed and differing only further on, are
    /// told apart (the probe only narrows the look; the texts are compared).
    #[test]
    fn texts_alike_where_they_are_probed_are_told_apart() {
        let frame = |middle: &str| Frame::InvokeFunction {
            invocation_id: Some("i".into()),
            function_id: "f".into(),
            data: serde_json::json!({ "pad": "x".repeat(PROBE_AT + 8), "middle": middle, "end": "y" }),
            action: None,
        };
        let (a, b) = (frame("a"), frame("b"));
        let (Message::Text(text_a), Message::Text(text_b)) = (encode(a.clone()), encode(b.clone())) else {
            panic!("text messages")
        };
        assert_eq!((text_a.len(), probe(text_a.as_bytes())), (text_b.len(), probe(text_b.as_bytes())));
        assert_eq!(decode(&text_b).unwrap(), b);
        assert_eq!(decode(&text_a).unwrap(), a);
    }

    /// The probe reads the eight bytes at [`PROBE_AT`], or a shorter text's last eight, or all
    /// of a text under eight bytes: for texts of every length.
    #[test]
    fn the_probe_reads_eight_bytes_of_any_text() {
        let text: Vec<u8> = (0..80u8).collect();
        for len in 0..=text.len() {
            let (at, end) = match len {
                0..8 => (0, len),
                8..=51 => (len - 8, len),
                _ => (PROBE_AT, PROBE_AT + 8),
            };
            let mut word = [0u8; 8];
            word[..end - at].copy_from_slice(&text[at..end]);
            assert_eq!(probe(&text[..len]), u64::from_le_bytes(word), "{len}");
        }
    }

    #[test]
    fn the_memory_stays_bounded_and_forgets_the_oldest_first() {
        let text = |n: usize| match encode(Frame::UnregisterFunction { id: format!("f{n}") }) {
            Message::Text(text) => text,
            _ => panic!("a text message"),
        };
        let first = text(0);
        let kept: Vec<_> = (1..REMEMBERED_MAX * 3).map(text).collect();
        assert!(SENT.with(|sent| sent.borrow().len()) <= REMEMBERED_MAX);
        assert!(take(&first).is_none(), "the oldest is forgotten");
        let newest = kept.last().expect("frames sent");
        assert_eq!(take(newest), Some(Frame::UnregisterFunction { id: format!("f{}", REMEMBERED_MAX * 3 - 1) }));
        assert!(take(newest).is_none(), "taken once");
    }
}
