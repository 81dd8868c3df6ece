//! Reading only the fields the rules ask about from a frame's JSON text.
//!
//! Building a `serde_json::Value` for every frame allocates every key and string of it, most
//! of which no rule reads. Here the frame is walked once along the paths the rules name:
//! those fields are kept (strings borrowed from the frame when they have no escapes), what
//! lies between them is skipped without being built (but checked), and the walk stops as
//! soon as every path has been found: the rest of the frame is not read at all. A frame that
//! is not valid JSON up to that point has no fields; a path missing from the frame means the
//! whole frame is read (and checked) before the answer is "missing". Where an object has a
//! key twice, the first one counts.

use crate::field::value_text;
use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::Value;
use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;

/// A field's value as conditions compare it.
#[derive(Debug, PartialEq)]
pub(crate) enum Found<'a> {
    /// A JSON string, unescaped.
    Str(Cow<'a, str>),
    Null,
    Bool(bool),
    /// An integer (kept as a number: no text is made for it).
    Integer(i128),
    /// Any other value, as compact JSON text (`1.5`, `{"a":1}`).
    Other(String),
}

/// The paths the rules read, as a tree walked once per frame.
#[derive(Clone, Debug, Default)]
pub(crate) struct Projection {
    root: Node,
    paths: usize,
}

#[derive(Clone, Debug, Default)]
struct Node {
    /// Set when a path ends here: its index in the projection.
    leaf: Option<usize>,
    children: BTreeMap<String, Node>,
}

impl Projection {
    /// Adds a path (dotted segments) and returns its index; a path added twice has one index.
    pub(crate) fn add(&mut self, segments: &[String]) -> usize {
        let mut node = &mut self.root;
        for segment in segments {
            node = node.children.entry(segment.clone()).or_default();
        }
        *node.leaf.get_or_insert_with(|| {
            self.paths += 1;
            self.paths - 1
        })
    }

    /// The value at each path, by index; `None` when `text` is not JSON (as far as it is read).
    pub(crate) fn read<'a>(&self, text: &'a str) -> Option<Values<'a>> {
        let mut found = Fields { values: Values::new(self.paths), missing: self.paths, stopped: false };
        let mut deserializer = serde_json::Deserializer::from_str(text);
        match (NodeSeed { node: &self.root, found: &mut found }).deserialize(&mut deserializer) {
            Ok(()) => deserializer.end().ok()?,
            Err(_) if found.stopped => {}
            Err(_) => return None,
        }
        Some(found.values)
    }
}

/// Rule sets name few paths: up to this many, their values are kept on the stack.
const INLINE_PATHS: usize = 8;

/// The value found at each path, by index.
// Large on purpose: it lives on the stack for one frame; boxing it is the allocation it avoids.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Values<'a> {
    Inline([Option<Found<'a>>; INLINE_PATHS]),
    Heap(Vec<Option<Found<'a>>>),
}

impl<'a> Values<'a> {
    fn new(paths: usize) -> Self {
        if paths <= INLINE_PATHS {
            Values::Inline(std::array::from_fn(|_| None))
        } else {
            let mut values = Vec::new();
            values.resize_with(paths, || None);
            Values::Heap(values)
        }
    }
}

impl<'a> std::ops::Index<usize> for Values<'a> {
    type Output = Option<Found<'a>>;
    fn index(&self, index: usize) -> &Self::Output {
        match self {
            Values::Inline(values) => &values[index],
            Values::Heap(values) => &values[index],
        }
    }
}

impl std::ops::IndexMut<usize> for Values<'_> {
    fn index_mut(&mut self, index: usize) -> &mut Self::Output {
        match self {
            Values::Inline(values) => &mut values[index],
            Values::Heap(values) => &mut values[index],
        }
    }
}

/// The fields found so far, by path index, and how many paths are still missing.
struct Fields<'a> {
    values: Values<'a>,
    missing: usize,
    /// Set when the walk was ended early on purpose: its error means "all found".
    stopped: bool,
}

impl<'a> Fields<'a> {
    /// Keeps the first value found for a path; `true` once every path has one.
    fn set(&mut self, index: usize, value: Found<'a>) -> bool {
        if self.values[index].is_none() {
            self.values[index] = Some(value);
            self.missing -= 1;
        }
        self.missing == 0
    }
}

/// Walks one value along a node of the tree.
struct NodeSeed<'n, 'f, 'a> {
    node: &'n Node,
    found: &'f mut Fields<'a>,
}

impl<'de> DeserializeSeed<'de> for NodeSeed<'_, '_, 'de> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        if let Some(index) = self.node.leaf {
            // A path ends here: this value is kept, and any path under it is read from it.
            let found = deserializer.deserialize_any(LeafVisitor)?;
            if !self.node.children.is_empty() {
                if let Found::Other(text) = &found {
                    if let Ok(value) = serde_json::from_str::<Value>(text) {
                        fill_from_value(self.node, &value, self.found);
                    }
                }
            }
            if self.found.set(index, found) {
                // Ends the walk: nothing after this field is read. (serde's error is the one
                // allocation a frame costs, cheaper than reading a long payload to its end.)
                self.found.stopped = true;
                return Err(serde::de::Error::custom(""));
            }
            Ok(())
        } else if self.node.children.is_empty() {
            deserializer.deserialize_ignored_any(IgnoredAny).map(|_| ())
        } else {
            deserializer.deserialize_any(self)
        }
    }
}

/// Fills the paths under `node` from an already built value.
fn fill_from_value(node: &Node, value: &Value, found: &mut Fields<'_>) {
    for (segment, child) in &node.children {
        let next = match value {
            Value::Object(map) => map.get(segment),
            Value::Array(items) => segment.parse::<usize>().ok().and_then(|i| items.get(i)),
            _ => None,
        };
        let Some(next) = next else { continue };
        if let Some(index) = child.leaf {
            let value = match next {
                Value::String(text) => Found::Str(Cow::Owned(text.clone())),
                Value::Null => Found::Null,
                Value::Bool(b) => Found::Bool(*b),
                Value::Number(n) => match n.as_i64().map(i128::from).or(n.as_u64().map(i128::from)) {
                    Some(n) => Found::Integer(n),
                    None => Found::Other(value_text(next)),
                },
                other => Found::Other(value_text(other)),
            };
            found.set(index, value);
        }
        fill_from_value(child, next, found);
    }
}

impl<'de> Visitor<'de> for NodeSeed<'_, '_, 'de> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_map<M: MapAccess<'de>>(self, mut map: M) -> Result<(), M::Error> {
        while let Some(key) = map.next_key_seed(KeySeed)? {
            match self.node.children.get(key.as_ref()) {
                Some(child) => map.next_value_seed(NodeSeed { node: child, found: &mut *self.found })?,
                None => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(())
    }

    fn visit_seq<S: SeqAccess<'de>>(self, mut seq: S) -> Result<(), S::Error> {
        let mut index = 0usize;
        loop {
            let child = self.node.children.get(index.to_string().as_str());
            let more = match child {
                Some(child) => seq.next_element_seed(NodeSeed { node: child, found: &mut *self.found })?.is_some(),
                None => seq.next_element::<IgnoredAny>()?.is_some(),
            };
            if !more {
                return Ok(());
            }
            index += 1;
        }
    }

    // A scalar where the rules expect an object or array: no path under it exists.
    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        Ok(())
    }
    fn visit_i64<E>(self, _: i64) -> Result<(), E> {
        Ok(())
    }
    fn visit_u64<E>(self, _: u64) -> Result<(), E> {
        Ok(())
    }
    fn visit_f64<E>(self, _: f64) -> Result<(), E> {
        Ok(())
    }
    fn visit_str<E>(self, _: &str) -> Result<(), E> {
        Ok(())
    }
    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }
}

/// An object key, borrowed from the frame when it has no escapes.
struct KeySeed;

impl<'de> DeserializeSeed<'de> for KeySeed {
    type Value = Cow<'de, str>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_str(StrVisitor)
    }
}

struct StrVisitor;

impl<'de> Visitor<'de> for StrVisitor {
    type Value = Cow<'de, str>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a string")
    }
    fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Self::Value, E> {
        Ok(Cow::Borrowed(v))
    }
    fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
        Ok(Cow::Owned(v.to_string()))
    }
    fn visit_string<E>(self, v: String) -> Result<Self::Value, E> {
        Ok(Cow::Owned(v))
    }
}

/// The value at the end of a path, as [`Found`].
struct LeafVisitor;

impl<'de> Visitor<'de> for LeafVisitor {
    type Value = Found<'de>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Self::Value, E> {
        Ok(Found::Str(Cow::Borrowed(v)))
    }
    fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
        Ok(Found::Str(Cow::Owned(v.to_string())))
    }
    fn visit_string<E>(self, v: String) -> Result<Self::Value, E> {
        Ok(Found::Str(Cow::Owned(v)))
    }
    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(Found::Null)
    }
    fn visit_bool<E>(self, v: bool) -> Result<Self::Value, E> {
        Ok(Found::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Self::Value, E> {
        Ok(Found::Integer(v.into()))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Self::Value, E> {
        Ok(Found::Integer(v.into()))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Self::Value, E> {
        Ok(Found::Other(value_text(&Value::from(v))))
    }
    fn visit_map<M: MapAccess<'de>>(self, map: M) -> Result<Self::Value, M::Error> {
        let value: Value = serde::Deserialize::deserialize(serde::de::value::MapAccessDeserializer::new(map))?;
        Ok(Found::Other(value_text(&value)))
    }
    fn visit_seq<S: SeqAccess<'de>>(self, seq: S) -> Result<Self::Value, S::Error> {
        let value: Value = serde::Deserialize::deserialize(serde::de::value::SeqAccessDeserializer::new(seq))?;
        Ok(Found::Other(value_text(&value)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::field::FieldMatch;
    use serde_json::json;

    /// Every condition reads the same through the projection as through a whole `Value`.
    #[test]
    fn agrees_with_the_value_tree() {
        let frame = json!({
            "type": "invocationresult", "esc": "a\"b", "n": 1.5, "i": -3, "t": true, "z": null, "s": "null",
            "result": {"session_id": "s1", "list": [10, {"k": "v"}], "obj": {"a": [1, 2]}},
        });
        let text = frame.to_string();
        let conditions = [
            "type=invocationresult",
            "esc=a\"b",
            "n=1.5",
            "i=-3",
            "t=true",
            "z=null",
            "s=null",
            "result.session_id=s1",
            "result.list.0=10",
            "result.list.1.k=v",
            "result.list.1={\"k\":\"v\"}",
            "result.obj={\"a\":[1,2]}",
            "result.obj.a.1=2",
            "missing=x",
            "type.deeper=x",
            "result.list.7=1",
            "result=x",
        ];
        let mut projection = Projection::default();
        let matches: Vec<(FieldMatch, usize)> = conditions
            .iter()
            .map(|c| FieldMatch::parse(c).unwrap())
            .map(|m| {
                let index = projection.add(m.segments());
                (m, index)
            })
            .collect();
        let found = projection.read(&text).expect("valid JSON");
        for (condition, index) in &matches {
            let projected = found[*index].as_ref().is_some_and(|f| condition.holds_for_found(f));
            assert_eq!(projected, condition.matches(&frame), "{condition}");
        }
        assert!(projection.read("{\"type\": \"x\", \"missing\"").is_none(), "not JSON: no fields");
        assert!(projection.read("{} trailing").is_none());
        // Arrays walked element by element when no path ends at them, and the walk goes on
        // past them; a key with an escape is unescaped before it is looked up.
        let frame = json!({"list": [10, {"k": "v"}, 12], "we\"ird": 1, "after": "a"});
        let conditions = ["list.0=10", "list.1.k=v", "list.2=12", "list.3=x", "we\"ird=1", "after=a"];
        let mut projection = Projection::default();
        let indices: Vec<usize> =
            conditions.iter().map(|c| projection.add(FieldMatch::parse(c).unwrap().segments())).collect();
        let text = frame.to_string();
        let found = projection.read(&text).expect("valid JSON");
        for (condition, index) in conditions.iter().zip(indices) {
            let condition = FieldMatch::parse(condition).unwrap();
            let projected = found[index].as_ref().is_some_and(|f| condition.holds_for_found(f));
            assert_eq!(projected, condition.matches(&frame), "{condition}");
            assert_eq!(projected, condition.path() != "list.3", "{condition}");
        }
        // Once every path is found, the rest is not read.
        let mut one = Projection::default();
        one.add(&["type".to_string()]);
        let found = one.read("{\"type\": \"x\", \"then\": [not json").expect("read up to `type`");
        assert_eq!(found[0], Some(Found::Str(Cow::Borrowed("x"))));
    }
}
