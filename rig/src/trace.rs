//! The trace: every observable event of a run, stamped with simulated time.
//!
//! The trace hash is a SHA-256 digest of the canonical trace (one compact JSON object per event,
//! fields in declaration order, object keys sorted), so the same seed gives the same hash on
//! every run and every machine.

use crate::condition::Condition;
use serde::Serialize;
use serde_json::Value;
use sha2::{Digest, Sha256};
use std::borrow::Cow;
use std::cell::OnceCell;
use std::ops::Range;
use std::sync::Arc;

/// Where a component reports a decision (`what`, with details) for the trace.
pub type NoteSink = std::rc::Rc<dyn Fn(&str, Value)>;

/// A host's or a function's name in the trace, shared rather than copied where the name is
/// known already: the engine's name on every frame event (some 200 a run), a double's host on
/// every event it records, a call's caller as the world noted it. Made once where the recorder
/// holds the name, never looked up (an interning table's lookups cost more instructions than the
/// allocations they saved, under callgrind). Serialized, compared and ordered as its text.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Label(Arc<str>);

impl Label {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::ops::Deref for Label {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl std::borrow::Borrow<str> for Label {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl AsRef<str> for Label {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl From<&str> for Label {
    fn from(text: &str) -> Self {
        Self(Arc::from(text))
    }
}

impl From<String> for Label {
    fn from(text: String) -> Self {
        Self(Arc::from(text))
    }
}

impl From<&Label> for String {
    fn from(label: &Label) -> Self {
        label.0.to_string()
    }
}

impl PartialEq<str> for Label {
    fn eq(&self, other: &str) -> bool {
        *self.0 == *other
    }
}

impl PartialEq<&str> for Label {
    fn eq(&self, other: &&str) -> bool {
        *self.0 == **other
    }
}

impl PartialEq<String> for Label {
    fn eq(&self, other: &String) -> bool {
        *self.0 == **other
    }
}

impl PartialEq<Label> for str {
    fn eq(&self, other: &Label) -> bool {
        *self == *other.0
    }
}

impl PartialEq<Label> for &str {
    fn eq(&self, other: &Label) -> bool {
        **self == *other.0
    }
}

impl PartialEq<Label> for String {
    fn eq(&self, other: &Label) -> bool {
        **self == *other.0
    }
}

impl std::fmt::Display for Label {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // `pad`, not `write_str`: the timeline and `render` align hosts by width.
        f.pad(&self.0)
    }
}

impl std::fmt::Debug for Label {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(&*self.0, f)
    }
}

impl Serialize for Label {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.0)
    }
}

/// One observable event.
#[derive(Debug, Clone, Serialize)]
pub struct Event {
    pub at_ms: u64,
    /// The host the event happened on (or `rig` for the runner itself).
    pub host: Label,
    #[serde(flatten)]
    pub kind: EventKind,
}

/// What happened. Serialized with a `kind` tag, which expectations match on.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum EventKind {
    /// A bus frame seen by the engine, `direction` relative to the engine (`in` or `out`).
    Frame {
        direction: &'static str,
        peer: Label,
        frame: &'static str,
        #[serde(skip_serializing_if = "Option::is_none")]
        function_id: Option<Label>,
        #[serde(skip_serializing_if = "Option::is_none")]
        invocation_id: Option<Label>,
    },
    /// A call arriving at a double, before any cut decides its fate: who sent it (the worker
    /// the engine received it from) and under which invocation id (a frame the network
    /// repeated arrives again under the same id).
    ///
    /// The payload is the one the double handles, shared rather than copied: a turn record's
    /// write is the largest value a run moves, and a copy for the trace cost its every node
    /// twice more (made, then dropped).
    Call {
        service: Label,
        function: Label,
        #[serde(serialize_with = "shared")]
        payload: Arc<Value>,
        #[serde(skip_serializing_if = "Option::is_none")]
        caller: Option<Label>,
        #[serde(skip_serializing_if = "Option::is_none")]
        invocation_id: Option<String>,
    },
    /// A state write that took effect (`value: null` for a delete): the value the store keeps,
    /// shared with it rather than copied.
    Commit { scope: String, key: String, value: doubles::Kept, version: u64 },
    /// A request for an external effect, as the service's ledger recorded it. Boxed: its nine
    /// fields took 184 bytes, and every event was as large as the largest kind (216 bytes, where
    /// a frame event needs about half). Each event is moved into the trace, and a move that
    /// large was a call to `memmove` (the largest caller of it, under `perf`); effects are a few
    /// events a run, frames most of them.
    Effect(Box<EffectEvent>),
    /// The store granted or renewed a lease on an ownership domain (`scope/key`).
    Lease { domain: String, owner: String, token: u64, expires_at_ms: u64 },
    /// The store judged a write protected by a fence (the lease of `domain`).
    Fenced { scope: String, key: String, domain: String, token: u64, accepted: bool },
    /// A cut fired on a call.
    Cut { cut: usize, action: String, function: String },
    /// A process cut fired: a worker was frozen or paused at a named point.
    Interrupt { interrupt: usize, worker: String, point: String, action: String },
    /// A frame matched a proxy rule.
    ProxyRule { rule: usize, action: String, direction: String, frame: Value },
    /// The outcome of an invocation made by the scenario's driver.
    Rpc { name: String, function: String, outcome: Value },
    /// The runner changed the world: crash, restart, partition, repair, heal.
    Control { action: String, target: String },
    /// A component's own account of a decision (a harness finalisation retry, a queue redelivery).
    Note { what: String, detail: Value },
    /// A limit was hit; the run stops here and reports it.
    Limit { what: String },
}

/// A request for an external effect, as the service's ledger recorded it ([`EventKind::Effect`]).
#[derive(Debug, Clone, Serialize)]
pub struct EffectEvent {
    pub effect: String,
    pub action: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub domain: Option<String>,
    pub accepted: bool,
    pub reason: String,
    /// The worker whose request it was, and the request's invocation id.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub by: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub invocation_id: Option<String>,
}

/// A shared value, serialized as the value itself (without serde's `rc` feature, whose one use
/// here would not be worth every crate that depends on serde building again).
fn shared<S: serde::Serializer>(value: &Arc<Value>, serializer: S) -> Result<S::Ok, S::Error> {
    Value::serialize(value, serializer)
}

/// The room a trace makes for events at its first (see [`Trace::push`]): more than most runs
/// record (a median of about 220 events, under 2 % of runs above 512), so that few runs move
/// their events to a larger buffer halfway (when it was 256, about 40 % did).
const EVENTS_AT_ONCE: usize = 512;

/// How many bytes of canonical lines [`Trace::push`] keeps before the digest takes them.
const PENDING_MAX: usize = 8 * 1024;

/// The events of one run, in order, with a running digest.
#[derive(Default)]
pub struct Trace {
    events: Vec<Event>,
    digest: Sha256,
    /// The canonical lines not yet digested: the digest takes them some kilobytes at a time,
    /// not a line at a time (each call copies the line's last part block into its own buffer).
    /// One buffer for the whole run.
    pending: Vec<u8>,
    /// No digest is kept (an uncut run's, which nothing reads): [`Trace::hash`] is not its hash.
    unhashed: bool,
}

impl Trace {
    /// A trace that keeps no digest, for a run whose hash nothing reads.
    pub(crate) fn unhashed() -> Self {
        Self { unhashed: true, ..Self::default() }
    }

    pub fn push(&mut self, event: Event) {
        if self.events.capacity() == 0 {
            // A run records a few hundred events: room for them at once, rather than a copy of
            // every event so far at each doubling from four.
            self.events.reserve(EVENTS_AT_ONCE);
        }
        if !self.unhashed {
            event.write_canonical(&mut self.pending);
            self.pending.push(b'\n');
            if self.pending.len() >= PENDING_MAX {
                self.digest.update(&self.pending);
                self.pending.clear();
            }
        }
        self.events.push(event);
    }

    pub fn events(&self) -> &[Event] {
        &self.events
    }

    /// The hex digest of the canonical trace so far.
    pub fn hash(&self) -> String {
        debug_assert!(!self.unhashed, "the hash of a trace that keeps none");
        // Two digits a byte from a table: a `format!` a byte made 32 small texts a run.
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        let mut hex = String::with_capacity(64);
        let mut digest = self.digest.clone();
        digest.update(&self.pending);
        for byte in digest.finalize() {
            hex.push(char::from(DIGITS[usize::from(byte >> 4)]));
            hex.push(char::from(DIGITS[usize::from(byte & 0xf)]));
        }
        hex
    }

    /// The canonical JSON lines, for `--trace FILE`.
    pub fn json_lines(&self) -> impl Iterator<Item = String> + '_ {
        self.events.iter().map(|e| serde_json::to_string(e).expect("trace events serialize"))
    }
}

/// A field's name: bare, for the document, and as the canonical line writes it (`,"name":`),
/// so that the line copies one constant per key rather than writing it in four pieces (the keys
/// were a third of the line's writing, under callgrind).
#[derive(Clone, Copy)]
struct Name {
    bare: &'static str,
    quoted: &'static str,
}

macro_rules! name {
    ($name:literal) => {
        Name { bare: $name, quoted: concat!(",\"", $name, "\":") }
    };
}

/// Where an event's fields go, in declaration order, as the derived form has them: the canonical
/// line ([`Canonical`]) and the JSON document ([`Document`]) are both made from the one listing
/// of [`Event::fields`].
trait Fields<'e> {
    fn text(&mut self, name: Name, value: &'e str);
    fn number(&mut self, name: Name, value: u64);
    fn flag(&mut self, name: Name, value: bool);
    fn json(&mut self, name: Name, value: &'e Value);

    /// A text the rig names itself (an event's kind, a frame's kind and direction), which has
    /// nothing to escape: the canonical line writes it without looking at its bytes.
    fn word(&mut self, name: Name, value: &'static str) {
        self.text(name, value);
    }

    fn some_text(&mut self, name: Name, value: &'e Option<impl AsRef<str>>) {
        if let Some(value) = value {
            self.text(name, value.as_ref());
        }
    }
}

/// Writes the compact JSON of the event, exactly as `serde_json::to_writer` writes its derived
/// form (a test holds the two to equal bytes for every kind), without the derived form's detour:
/// the flattened `kind` makes the derived serializer buffer every event as a map.
struct Canonical<'a> {
    out: &'a mut Vec<u8>,
    /// Whether a field was written yet (every later one follows a comma).
    started: bool,
}

impl Canonical<'_> {
    fn raw(&mut self, text: &str) {
        self.out.extend_from_slice(text.as_bytes());
    }

    /// `"name":`, after a comma for every field but the first. Each branch copies a constant
    /// of its own (where this is inlined, its length is known, and the copy is a move or two);
    /// choosing the slice first and copying it after made the length a variable, and every key
    /// a call to `memmove` (about 0.4 % of the catalogue's CPU under `perf`).
    fn key(&mut self, name: Name) {
        let quoted = name.quoted.as_bytes();
        if self.started {
            self.out.extend_from_slice(quoted);
        } else {
            self.started = true;
            self.out.extend_from_slice(&quoted[1..]);
        }
    }
}

impl Fields<'_> for Canonical<'_> {
    fn text(&mut self, name: Name, value: &str) {
        self.key(name);
        write_text(self.out, value);
    }

    fn word(&mut self, name: Name, value: &'static str) {
        debug_assert!(crate::json_text::plain(value), "{value:?} has something to escape");
        self.key(name);
        write_plain(self.out, value);
    }

    fn number(&mut self, name: Name, value: u64) {
        self.key(name);
        crate::json_text::write_decimal(self.out, false, value);
    }

    fn flag(&mut self, name: Name, value: bool) {
        self.key(name);
        self.raw(if value { "true" } else { "false" });
    }

    fn json(&mut self, name: Name, value: &Value) {
        self.key(name);
        write_json(self.out, value);
    }
}

/// `text` as serde_json writes it. Most texts (hosts, kinds, function and invocation ids, the
/// keys and texts of payloads) have nothing to escape: they are written as they are, between
/// quotes; the rest go through serde_json.
fn write_text(out: &mut Vec<u8>, text: &str) {
    if crate::json_text::plain(text) {
        write_plain(out, text);
    } else {
        serde_json::to_writer(&mut *out, text).expect("writing to memory");
    }
}

/// A text with nothing to escape, between quotes, as serde_json writes it.
fn write_plain(out: &mut Vec<u8>, text: &str) {
    out.reserve(text.len() + 2);
    out.push(b'"');
    out.extend_from_slice(text.as_bytes());
    out.push(b'"');
}

/// A JSON value as `serde_json::to_writer` writes it (compact, an object's entries in the map's
/// order), to the byte: texts and unsigned integers by [`write_text`] and [`crate::json_text::write_decimal`], any
/// other number by serde_json itself. Payloads and records are most of a trace's bytes, and
/// serde_json's serializer spent more on its plumbing per node than on the bytes.
fn write_json(out: &mut Vec<u8>, value: &Value) {
    match value {
        Value::Null => out.extend_from_slice(b"null"),
        Value::Bool(true) => out.extend_from_slice(b"true"),
        Value::Bool(false) => out.extend_from_slice(b"false"),
        Value::Number(number) => match number.as_u64() {
            Some(number) => crate::json_text::write_decimal(out, false, number),
            None => serde_json::to_writer(&mut *out, number).expect("writing to memory"),
        },
        Value::String(text) => write_text(out, text),
        Value::Array(items) => {
            out.push(b'[');
            for (index, item) in items.iter().enumerate() {
                if index > 0 {
                    out.push(b',');
                }
                write_json(out, item);
            }
            out.push(b']');
        }
        Value::Object(entries) => {
            out.push(b'{');
            for (index, (key, item)) in entries.iter().enumerate() {
                if index > 0 {
                    out.push(b',');
                }
                write_text(out, key);
                out.push(b':');
                write_json(out, item);
            }
            out.push(b'}');
        }
    }
}

/// An event's JSON document, field by field (see [`Event::to_json`]).
struct Document(serde_json::Map<String, Value>);

impl Fields<'_> for Document {
    fn text(&mut self, name: Name, value: &str) {
        self.0.insert(name.bare.to_string(), Value::String(value.to_string()));
    }

    fn number(&mut self, name: Name, value: u64) {
        self.0.insert(name.bare.to_string(), Value::from(value));
    }

    fn flag(&mut self, name: Name, value: bool) {
        self.0.insert(name.bare.to_string(), Value::Bool(value));
    }

    fn json(&mut self, name: Name, value: &Value) {
        self.0.insert(name.bare.to_string(), value.clone());
    }
}

/// One field of an event's document, by name (see [`Event::field`]).
struct Field<'n, 'e> {
    name: &'n str,
    value: Option<Found<'e>>,
}

/// A field's value as the event holds it: a text borrowed as it is (not made a JSON string).
enum Found<'e> {
    Text(&'e str),
    Value(Cow<'e, Value>),
}

impl<'e> Fields<'e> for Field<'_, 'e> {
    fn text(&mut self, name: Name, value: &'e str) {
        if name.bare == self.name {
            self.value = Some(Found::Text(value));
        }
    }

    fn number(&mut self, name: Name, value: u64) {
        if name.bare == self.name {
            self.value = Some(Found::Value(Cow::Owned(Value::from(value))));
        }
    }

    fn flag(&mut self, name: Name, value: bool) {
        if name.bare == self.name {
            self.value = Some(Found::Value(Cow::Owned(Value::Bool(value))));
        }
    }

    fn json(&mut self, name: Name, value: &'e Value) {
        if name.bare == self.name {
            self.value = Some(Found::Value(Cow::Borrowed(value)));
        }
    }
}

impl Event {
    /// Appends the event's canonical line (without its newline) to `out`: the bytes the trace
    /// hash is made of.
    fn write_canonical(&self, out: &mut Vec<u8>) {
        let mut line = Canonical { out, started: false };
        line.raw("{");
        self.fields(&mut line);
        line.raw("}");
    }

    /// The event as a JSON document, as expectations and oracles match it: the derived form's
    /// document (a test holds the two equal for every kind), built field by field, without the
    /// derived serializer's detour through a buffered map for the flattened `kind`.
    pub fn to_json(&self) -> Value {
        let mut document = Document(serde_json::Map::new());
        self.fields(&mut document);
        Value::Object(document.0)
    }

    /// The value of the document's top-level field `name` ([`Event::to_json`]'s), without making
    /// the document: its JSON fields borrowed, the rest made.
    pub fn field(&self, name: &str) -> Option<Cow<'_, Value>> {
        self.found(name).map(|found| match found {
            Found::Text(text) => Cow::Owned(Value::String(text.to_string())),
            Found::Value(value) => value,
        })
    }

    /// Whether the event's document meets `condition`, judged on the one field it reads (a text
    /// field as it is: [`Condition::matches_text_field`]).
    fn meets(&self, condition: &Condition) -> bool {
        match self.found(condition.field()) {
            Some(Found::Text(text)) => condition.matches_text_field(text),
            Some(Found::Value(value)) => condition.matches_field(Some(&value)),
            None => condition.matches_field(None),
        }
    }

    fn found(&self, name: &str) -> Option<Found<'_>> {
        let mut field = Field { name, value: None };
        self.fields(&mut field);
        field.value
    }

    /// Hands every field of the event to `to`, in the derived form's order.
    fn fields<'e>(&'e self, to: &mut impl Fields<'e>) {
        to.number(name!("at_ms"), self.at_ms);
        to.text(name!("host"), &self.host);
        to.word(name!("kind"), self.kind.name());
        match &self.kind {
            EventKind::Frame { direction, peer, frame, function_id, invocation_id } => {
                to.word(name!("direction"), direction);
                to.text(name!("peer"), peer);
                to.word(name!("frame"), frame);
                to.some_text(name!("function_id"), function_id);
                to.some_text(name!("invocation_id"), invocation_id);
            }
            EventKind::Call { service, function, payload, caller, invocation_id } => {
                to.text(name!("service"), service);
                to.text(name!("function"), function);
                to.json(name!("payload"), payload);
                to.some_text(name!("caller"), caller);
                to.some_text(name!("invocation_id"), invocation_id);
            }
            EventKind::Commit { scope, key, value, version } => {
                to.text(name!("scope"), scope);
                to.text(name!("key"), key);
                to.json(name!("value"), value);
                to.number(name!("version"), *version);
            }
            EventKind::Effect(ledgered) => {
                let EffectEvent { effect, action, idempotency_key, token, domain, accepted, reason, by, invocation_id } =
                    &**ledgered;
                to.text(name!("effect"), effect);
                to.text(name!("action"), action);
                to.some_text(name!("idempotency_key"), idempotency_key);
                if let Some(token) = token {
                    to.number(name!("token"), *token);
                }
                to.some_text(name!("domain"), domain);
                to.flag(name!("accepted"), *accepted);
                to.text(name!("reason"), reason);
                to.some_text(name!("by"), by);
                to.some_text(name!("invocation_id"), invocation_id);
            }
            EventKind::Lease { domain, owner, token, expires_at_ms } => {
                to.text(name!("domain"), domain);
                to.text(name!("owner"), owner);
                to.number(name!("token"), *token);
                to.number(name!("expires_at_ms"), *expires_at_ms);
            }
            EventKind::Fenced { scope, key, domain, token, accepted } => {
                to.text(name!("scope"), scope);
                to.text(name!("key"), key);
                to.text(name!("domain"), domain);
                to.number(name!("token"), *token);
                to.flag(name!("accepted"), *accepted);
            }
            EventKind::Cut { cut, action, function } => {
                to.number(name!("cut"), *cut as u64);
                to.text(name!("action"), action);
                to.text(name!("function"), function);
            }
            EventKind::Interrupt { interrupt, worker, point, action } => {
                to.number(name!("interrupt"), *interrupt as u64);
                to.text(name!("worker"), worker);
                to.text(name!("point"), point);
                to.text(name!("action"), action);
            }
            EventKind::ProxyRule { rule, action, direction, frame } => {
                to.number(name!("rule"), *rule as u64);
                to.text(name!("action"), action);
                to.text(name!("direction"), direction);
                to.json(name!("frame"), frame);
            }
            EventKind::Rpc { name, function, outcome } => {
                to.text(name!("name"), name);
                to.text(name!("function"), function);
                to.json(name!("outcome"), outcome);
            }
            EventKind::Control { action, target } => {
                to.text(name!("action"), action);
                to.text(name!("target"), target);
            }
            EventKind::Note { what, detail } => {
                to.text(name!("what"), what);
                to.json(name!("detail"), detail);
            }
            EventKind::Limit { what } => to.text(name!("what"), what),
        }
    }

    /// Frames are the bulk of a trace and rarely the story; everything else is.
    pub fn is_key(&self) -> bool {
        !matches!(self.kind, EventKind::Frame { .. })
    }

    /// The event on one line: time, host, what (long payloads cut short).
    pub fn render(&self) -> String {
        format!("{:>9} ms  {:<8} {}", self.at_ms, self.host, self.kind.describe(Some(PAYLOAD_CHARS_MAX)))
    }
}

/// The events of a trace as the JSON documents conditions match. Conditions are judged on the
/// fields they read ([`Event::field`]), and a document is made only for an event that meets them
/// all (once, when it is first found): most events meet no condition of an expectation, and
/// making each one's document (a map of a dozen entries, its JSON values copied) cost more than
/// judging it.
pub struct Documents<'a> {
    events: &'a [Event],
    converted: Vec<OnceCell<Value>>,
}

impl<'a> Documents<'a> {
    pub fn new(events: &'a [Event]) -> Self {
        Self { events, converted: std::iter::repeat_with(OnceCell::new).take(events.len()).collect() }
    }

    /// The documents of the events in `range` that meet every condition, in order.
    pub fn matching(&self, conditions: &[Condition], range: Range<usize>) -> Vec<&Value> {
        let mut found = Vec::new();
        meeting(self.events, conditions, range, |index| {
            found.push(self.converted[index].get_or_init(|| self.events[index].to_json()));
        });
        found
    }
}

/// How many of `events` meet every condition: as many as [`Documents::matching`] finds, without
/// making a document. A `wait_until` step counts the events each simulation step adds.
pub fn count_matching(events: &[Event], conditions: &[Condition]) -> u64 {
    let mut count = 0;
    meeting(events, conditions, 0..events.len(), |_| count += 1);
    count
}

/// Hands `found` the index of every event in `range` that meets every condition, in order.
fn meeting(events: &[Event], conditions: &[Condition], range: Range<usize>, mut found: impl FnMut(usize)) {
    // The kind alone decides the conditions on it: they are judged once per kind, on the kind's
    // name as the document's `kind` field has it.
    let mut kind_holds = [None::<bool>; EventKind::COUNT];
    for index in range {
        let event = &events[index];
        let holds = *kind_holds[event.kind.ordinal()].get_or_insert_with(|| {
            let kind = event.kind.name();
            conditions.iter().filter(|c| c.is_on_field("kind")).all(|c| c.matches_text_field(kind))
        });
        if holds && conditions.iter().all(|c| event.meets(c)) {
            found(index);
        }
    }
}

/// How long a payload may get in a one-line rendering before it is cut.
const PAYLOAD_CHARS_MAX: usize = 160;

fn shorten(value: &Value, limit: Option<usize>) -> String {
    let text = value.to_string();
    match limit {
        Some(limit) if text.chars().count() > limit => format!("{}…", text.chars().take(limit).collect::<String>()),
        _ => text,
    }
}

impl EventKind {
    /// How many kinds there are: [`EventKind::ordinal`] is below it.
    const COUNT: usize = 13;

    /// The kind's place in the declaration, for tables by kind.
    fn ordinal(&self) -> usize {
        match self {
            EventKind::Frame { .. } => 0,
            EventKind::Call { .. } => 1,
            EventKind::Commit { .. } => 2,
            EventKind::Effect(_) => 3,
            EventKind::Lease { .. } => 4,
            EventKind::Fenced { .. } => 5,
            EventKind::Cut { .. } => 6,
            EventKind::Interrupt { .. } => 7,
            EventKind::ProxyRule { .. } => 8,
            EventKind::Rpc { .. } => 9,
            EventKind::Control { .. } => 10,
            EventKind::Note { .. } => 11,
            EventKind::Limit { .. } => 12,
        }
    }

    /// The ledger line, when the event is one.
    pub fn effect(&self) -> Option<&EffectEvent> {
        match self {
            EventKind::Effect(ledgered) => Some(ledgered),
            _ => None,
        }
    }

    /// The `kind` tag the event is serialized under.
    pub fn name(&self) -> &'static str {
        match self {
            EventKind::Frame { .. } => "frame",
            EventKind::Call { .. } => "call",
            EventKind::Commit { .. } => "commit",
            EventKind::Effect(_) => "effect",
            EventKind::Lease { .. } => "lease",
            EventKind::Fenced { .. } => "fenced",
            EventKind::Cut { .. } => "cut",
            EventKind::Interrupt { .. } => "interrupt",
            EventKind::ProxyRule { .. } => "proxy_rule",
            EventKind::Rpc { .. } => "rpc",
            EventKind::Control { .. } => "control",
            EventKind::Note { .. } => "note",
            EventKind::Limit { .. } => "limit",
        }
    }

    /// What happened, in words; payloads cut at `limit` characters when one is given.
    pub fn describe(&self, limit: Option<usize>) -> String {
        let short = |value: &Value| shorten(value, limit);
        match self {
            EventKind::Frame { direction, peer, frame, function_id, .. } => {
                format!("frame {direction} {peer} {frame} {}", function_id.as_deref().unwrap_or(""))
            }
            EventKind::Call { function, payload, caller, .. } => {
                format!(
                    "call {function} {}{}",
                    short(payload),
                    caller.as_ref().map_or(String::new(), |c| format!(" from {c}"))
                )
            }
            EventKind::Commit { scope, key, value, version } => {
                format!("commit {scope}/{key} v{version} {}", short(value))
            }
            EventKind::Effect(ledgered) => {
                let EffectEvent { effect, action, idempotency_key, token, accepted, reason, by, .. } = &**ledgered;
                format!(
                    "effect {effect} action={action} key={} token={} {} ({reason}){}",
                    idempotency_key.as_deref().unwrap_or("-"),
                    token.map_or_else(|| "-".to_string(), |t| t.to_string()),
                    if *accepted { "accepted" } else { "refused" },
                    by.as_ref().map_or(String::new(), |b| format!(" from {b}"))
                )
            }
            EventKind::Lease { domain, owner, token, expires_at_ms } => {
                format!("lease {domain} to {owner} token={token} until {expires_at_ms} ms")
            }
            EventKind::Fenced { scope, key, domain, token, accepted } => format!(
                "fenced write {scope}/{key} under {domain} token={token} {}",
                if *accepted { "accepted" } else { "rejected" }
            ),
            EventKind::Cut { cut, action, function } => format!("cut #{} {action} on {function}", cut + 1),
            EventKind::Interrupt { interrupt, worker, point, action } => {
                format!("interrupt #{} {action} {worker} at {point}", interrupt + 1)
            }
            EventKind::ProxyRule { rule, action, direction, frame } => {
                format!("proxy rule #{} {action} {direction} {}", rule + 1, short(frame))
            }
            EventKind::Rpc { name, function, outcome } => format!("rpc {name} ({function}) -> {}", short(outcome)),
            EventKind::Control { action, target } => format!("{action} {target}"),
            EventKind::Note { what, detail } => format!("note {what} {}", short(detail)),
            EventKind::Limit { what } => format!("LIMIT {what}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::condition::{Condition, Test};
    use serde_json::json;

    fn every_kind() -> Vec<EventKind> {
        let text = || String::from("x");
        vec![
            EventKind::Frame {
                direction: "in",
                peer: text().into(),
                frame: "invokefunction",
                function_id: None,
                invocation_id: None,
            },
            EventKind::Call {
                service: text().into(),
                function: text().into(),
                payload: Value::Null.into(),
                caller: None,
                invocation_id: None,
            },
            EventKind::Commit { scope: text(), key: text(), value: Value::Null.into(), version: 1 },
            EventKind::Effect(Box::new(EffectEvent {
                effect: text(),
                action: text(),
                idempotency_key: None,
                token: None,
                domain: None,
                accepted: true,
                reason: text(),
                by: None,
                invocation_id: None,
            })),
            EventKind::Lease { domain: text(), owner: text(), token: 1, expires_at_ms: 1 },
            EventKind::Fenced { scope: text(), key: text(), domain: text(), token: 1, accepted: false },
            EventKind::Cut { cut: 0, action: text(), function: text() },
            EventKind::Interrupt { interrupt: 0, worker: text(), point: text(), action: text() },
            EventKind::ProxyRule { rule: 0, action: text(), direction: text(), frame: Value::Null },
            EventKind::Rpc { name: text(), function: text(), outcome: Value::Null },
            EventKind::Control { action: text(), target: text() },
            EventKind::Note { what: text(), detail: Value::Null },
            EventKind::Limit { what: text() },
        ]
    }

    /// An event moves into the trace as a few register copies rather than a call to `memmove`
    /// (LLVM copies up to 128 bytes inline): a kind whose fields grow past that is boxed, as
    /// `Effect` is.
    #[test]
    fn an_event_moves_inline() {
        assert!(std::mem::size_of::<Event>() <= 128, "an event takes {} bytes", std::mem::size_of::<Event>());
    }

    #[test]
    fn every_kind_has_its_own_ordinal_below_the_count() {
        let kinds = every_kind();
        let ordinals: std::collections::BTreeSet<usize> = kinds.iter().map(EventKind::ordinal).collect();
        assert_eq!(ordinals.len(), kinds.len());
        assert_eq!(kinds.len(), EventKind::COUNT);
        assert!(ordinals.iter().all(|o| *o < EventKind::COUNT));
    }

    #[test]
    fn every_kind_is_named_as_it_is_serialized() {
        for kind in every_kind() {
            let event = Event { at_ms: 0, host: "h".into(), kind };
            assert_eq!(event.to_json()["kind"], event.kind.name(), "{event:?}");
        }
    }

    #[test]
    fn the_canonical_line_is_the_derived_json_to_the_byte() {
        let awkward = || String::from("q\"\\\n\t\u{1}é ☃");
        let mut kinds = every_kind();
        // Every optional field present, awkward text and nested values.
        kinds.push(EventKind::Frame {
            direction: "out",
            peer: awkward().into(),
            frame: "invocationresult",
            function_id: Some(awkward().into()),
            invocation_id: Some("i".into()),
        });
        kinds.push(EventKind::Call {
            service: awkward().into(),
            function: "f".into(),
            payload: json!({ "b": [1, -2, 2.5, null, true], "a": { "z": "x\u{7f}", "y": {} } }).into(),
            caller: Some(awkward().into()),
            invocation_id: Some("i".into()),
        });
        kinds.push(EventKind::Effect(Box::new(EffectEvent {
            effect: "e".into(),
            action: awkward(),
            idempotency_key: Some("k".into()),
            token: Some(u64::MAX),
            domain: Some("d".into()),
            accepted: false,
            reason: awkward(),
            by: Some("w".into()),
            invocation_id: Some("i".into()),
        })));
        kinds.push(EventKind::Cut { cut: usize::MAX, action: awkward(), function: "f".into() });
        kinds.push(EventKind::Note { what: awkward(), detail: json!([{ "k": 1e300 }, "s"]) });
        // Keys to escape, empty containers, the integers at their edges, floats serde_json writes
        // its own way.
        kinds.push(EventKind::Rpc {
            name: "r".into(),
            function: "f".into(),
            outcome: json!({ "q\"k\n": [[], {}, [[]], u64::MAX, 0, i64::MIN, -1, -0.0, 0.1, 1e-7, 2.0, "a\u{1f}b"], "": "" }),
        });
        // Text with nothing to escape, beyond ASCII and at its edges (DEL, space), as it is.
        kinds.push(EventKind::Control { action: "é ☃ \u{7f}~".into(), target: " ".into() });
        for (at, kind) in kinds.into_iter().enumerate() {
            let event = Event { at_ms: at as u64 * 1_000_003, host: awkward().into(), kind };
            let mut line = Vec::new();
            event.write_canonical(&mut line);
            let derived = serde_json::to_vec(&event).unwrap();
            assert_eq!(String::from_utf8(line).unwrap(), String::from_utf8(derived).unwrap(), "{event:?}");
            assert_eq!(event.to_json(), serde_json::to_value(&event).unwrap(), "{event:?}");
        }
    }

    fn condition(path: &str, text: &str) -> Condition {
        Condition::equals(path, text).unwrap()
    }

    #[test]
    fn documents_match_as_the_whole_event_does() {
        let mut kinds = every_kind();
        kinds.push(EventKind::Call {
            service: "s".into(),
            function: "f".into(),
            payload: json!({ "k": 1, "list": [{ "k": "v" }] }).into(),
            caller: Some("w".into()),
            invocation_id: Some("i".into()),
        });
        kinds.push(EventKind::Note { what: "w".into(), detail: json!([{ "k": 1e300 }]) });
        let events: Vec<Event> = kinds
            .into_iter()
            .enumerate()
            .map(|(at, kind)| Event { at_ms: at as u64, host: "h".into(), kind })
            .collect();
        let documents = Documents::new(&events);
        let selections = [
            vec![condition("kind", "note")],
            vec![condition("host", "h")],
            vec![condition("kind", "rpc"), condition("name", "x")],
            vec![condition("kind", "rpc"), condition("name", "y")],
            vec![Condition::new("kind", vec![Test::Ne("frame".into())]).unwrap(), condition("action", "x")],
            // Into a JSON field, a number, a flag, a field some kinds lack, and one none has.
            vec![condition("payload.k", "1")],
            vec![condition("payload.list.0.k", "v")],
            vec![condition("payload.list.1.k", "v")],
            vec![condition("detail.0.k", "1e300")],
            vec![condition("at_ms", "3")],
            vec![condition("accepted", "false")],
            vec![Condition::new("invocation_id", vec![Test::Ne("i".into())]).unwrap()],
            vec![Condition::new("nowhere", vec![Test::Ne("x".into())]).unwrap()],
            vec![condition("kind", "effect"), Condition::new("token", vec![Test::Ne("0".into())]).unwrap()],
        ];
        for conditions in selections {
            let whole: Vec<Value> =
                events.iter().map(Event::to_json).filter(|d| conditions.iter().all(|c| c.matches(d))).collect();
            let found: Vec<Value> = documents.matching(&conditions, 0..events.len()).into_iter().cloned().collect();
            assert_eq!(found, whole, "{conditions:?}");
            assert_eq!(count_matching(&events, &conditions), whole.len() as u64, "{conditions:?}");
        }
        // Judged on the fields alone, a condition into a JSON field still finds its event.
        let found = documents.matching(&[condition("payload.list.0.k", "v")], 0..events.len());
        assert_eq!(found.len(), 1);
        assert_eq!(found[0]["caller"], "w");
        let limit = events.iter().position(|e| matches!(e.kind, EventKind::Limit { .. })).unwrap();
        assert_eq!(documents.matching(&[condition("kind", "limit")], 0..limit), Vec::<&Value>::new());
    }
}
