//! `PATH=VALUE` conditions over JSON documents.
//!
//! One matcher serves every place that selects something by its JSON fields: proxy rules select
//! frames, service cuts select calls, scenario expectations select trace events. A value is
//! compared with the *text* of the field, so `step=1`, `skipped=true` and `next_step=null` all
//! read the same on a command line as in a TOML file.

use serde_json::Value;
use std::fmt;

/// One condition: the field at a dotted path has the given text.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct FieldMatch {
    path: Vec<String>,
    expected: String,
    /// Set by a typed `null` (JSON's): only a `null` field matches, never the string `"null"`.
    only_null: bool,
    /// The integer whose JSON text `expected` is, if it is one (`1`, `-3`; not `01` or `+1`),
    /// so an integer field is compared without writing it out.
    integer: Option<i128>,
}

/// Why a `PATH=VALUE` condition could not be read.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FieldMatchError {
    #[error("expected PATH=VALUE, found `{0}`")]
    MissingEquals(String),
    #[error("empty segment in path `{0}` (expected names separated by single dots)")]
    EmptySegment(String),
}

impl FieldMatch {
    /// A condition on the field at `path` (dot-separated object keys or array indices).
    pub fn new(path: &str, expected: impl Into<String>) -> Result<Self, FieldMatchError> {
        if path.is_empty() || path.split('.').any(str::is_empty) {
            return Err(FieldMatchError::EmptySegment(path.to_string()));
        }
        let expected: String = expected.into();
        let integer = expected.parse::<i128>().ok().filter(|n| n.to_string() == expected);
        Ok(Self { path: path.split('.').map(str::to_string).collect(), expected, only_null: false, integer })
    }

    /// A condition that the field at `path` is JSON `null` (a string `"null"` does not match).
    pub fn null(path: &str) -> Result<Self, FieldMatchError> {
        Ok(Self { only_null: true, ..Self::new(path, "null")? })
    }

    /// Reads `PATH=VALUE`; everything after the first `=` is the value.
    pub fn parse(text: &str) -> Result<Self, FieldMatchError> {
        let (path, value) = text.split_once('=').ok_or_else(|| FieldMatchError::MissingEquals(text.to_string()))?;
        Self::new(path, value)
    }

    /// The dotted path this condition reads.
    pub fn path(&self) -> String {
        self.path.join(".")
    }

    /// The text the field must have.
    pub fn expected(&self) -> &str {
        &self.expected
    }

    /// Whether `document` has this field with this text. A missing field never matches.
    pub fn matches(&self, document: &Value) -> bool {
        lookup(document, &self.path).is_some_and(|found| self.holds_for(found))
    }

    /// Whether a field with this value satisfies the condition.
    pub(crate) fn holds_for(&self, found: &Value) -> bool {
        match found {
            Value::Null => self.expected == "null",
            _ if self.only_null => false,
            Value::String(text) => *text == self.expected,
            other => value_text(other) == self.expected,
        }
    }

    /// Whether a field read by a [`Projection`](crate::project::Projection) satisfies it.
    pub(crate) fn holds_for_found(&self, found: &crate::project::Found<'_>) -> bool {
        use crate::project::Found;
        match found {
            Found::Null => self.expected == "null",
            _ if self.only_null => false,
            Found::Str(text) => *text == self.expected,
            Found::Bool(b) => self.expected == if *b { "true" } else { "false" },
            Found::Integer(n) => self.integer == Some(*n),
            Found::Other(text) => *text == self.expected,
        }
    }

    /// The path's segments.
    pub(crate) fn segments(&self) -> &[String] {
        &self.path
    }
}

impl fmt::Display for FieldMatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}={}", self.path(), self.expected)
    }
}

/// The field at a dotted path; array elements are addressed by their index.
pub fn lookup<'a>(document: &'a Value, path: &[String]) -> Option<&'a Value> {
    path.iter().try_fold(document, |node, segment| match node {
        Value::Object(map) => map.get(segment),
        Value::Array(items) => segment.parse::<usize>().ok().and_then(|i| items.get(i)),
        _ => None,
    })
}

/// The text a field is compared by: strings bare, everything else as compact JSON.
pub fn value_text(value: &Value) -> String {
    match value {
        Value::String(text) => text.clone(),
        other => other.to_string(),
    }
}

/// Whether every condition holds (an empty list always holds).
pub fn all_match(conditions: &[FieldMatch], document: &Value) -> bool {
    conditions.iter().all(|c| c.matches(document))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn matches_nested_fields_by_text() {
        let frame = json!({"type": "invocationresult", "result": {"session_id": "s1", "step": 1, "next": null}});
        assert!(FieldMatch::parse("type=invocationresult").unwrap().matches(&frame));
        assert!(FieldMatch::parse("result.session_id=s1").unwrap().matches(&frame));
        assert!(FieldMatch::parse("result.step=1").unwrap().matches(&frame));
        assert!(FieldMatch::parse("result.next=null").unwrap().matches(&frame));
        assert!(!FieldMatch::parse("result.session_id=s2").unwrap().matches(&frame));
        assert!(!FieldMatch::parse("result.missing=null").unwrap().matches(&frame));
        assert!(!FieldMatch::parse("type.inner=x").unwrap().matches(&frame));
    }

    #[test]
    fn value_keeps_later_equals_signs_and_arrays_take_indices() {
        let m = FieldMatch::parse("a.0=x=y").unwrap();
        assert_eq!(m.expected(), "x=y");
        assert!(m.matches(&json!({"a": ["x=y"]})));
    }

    #[test]
    fn a_typed_null_matches_only_null_and_a_condition_reads_as_written() {
        use crate::project::Found;
        let null = FieldMatch::null("a").unwrap();
        assert!(null.holds_for_found(&Found::Null));
        assert!(!null.holds_for_found(&Found::Str("null".into())), "the string `null` is no null");
        assert!(!null.holds_for(&serde_json::json!("null")));
        let text = FieldMatch::parse("a=null").unwrap();
        assert!(text.holds_for_found(&Found::Str("null".into())) && text.holds_for_found(&Found::Null));
        assert_eq!(FieldMatch::parse("result.step=1").unwrap().to_string(), "result.step=1");
    }

    #[test]
    fn rejects_malformed_conditions() {
        assert_eq!(FieldMatch::parse("type"), Err(FieldMatchError::MissingEquals("type".into())));
        assert!(matches!(FieldMatch::parse("a..b=1"), Err(FieldMatchError::EmptySegment(_))));
        assert!(matches!(FieldMatch::parse("=1"), Err(FieldMatchError::EmptySegment(_))));
    }
}
