//! Conditions over JSON documents: what cuts, waits and expectations select and assert.
//!
//! A condition names a field by a dotted path (object keys, or array indices) and says what it
//! must be. Written as `PATH = VALUE` it compares the field's *text* (strings bare, everything
//! else as compact JSON), so `step = 1`, `skipped = true` and `next_step = "null"` all work. A
//! table says more: `{ ne = "running" }`, `{ ge = 1_800_000, lt = 1_801_000 }`,
//! `{ absent = true }`, `{ one_of = ["completed", "held"] }`, `{ contains = "dead letter" }`,
//! `{ len = 0 }`;
//! every entry of the table must hold.

use proxy::{lookup, value_text};
use serde_json::Value;
use std::fmt;

/// One test a field's value must pass.
#[derive(Debug, Clone, PartialEq)]
pub enum Test {
    /// The field exists and has this text.
    Eq(String),
    /// The field is missing, or has another text.
    Ne(String),
    /// The field is a number in this relation to the bound.
    Lt(f64),
    Le(f64),
    Gt(f64),
    Ge(f64),
    /// The field is missing or JSON `null` (`true`), or present and not null (`false`).
    Absent(bool),
    /// The field's text is one of these.
    OneOf(Vec<String>),
    /// The field is a string containing this text, or an array with an element of this text.
    Contains(String),
    /// The field is an array (or object) of this many entries, or a string of this many
    /// characters.
    Len(usize),
}

impl Test {
    fn passes(&self, found: Option<&Value>) -> bool {
        let number = || found.and_then(Value::as_f64);
        match self {
            Test::Eq(text) => found.is_some_and(|v| has_text(v, text)),
            Test::Ne(text) => found.is_none_or(|v| !has_text(v, text)),
            Test::Lt(bound) => number().is_some_and(|n| n < *bound),
            Test::Le(bound) => number().is_some_and(|n| n <= *bound),
            Test::Gt(bound) => number().is_some_and(|n| n > *bound),
            Test::Ge(bound) => number().is_some_and(|n| n >= *bound),
            Test::Absent(absent) => found.is_none_or(Value::is_null) == *absent,
            Test::OneOf(texts) => found.is_some_and(|v| texts.iter().any(|text| has_text(v, text))),
            Test::Contains(text) => match found {
                Some(Value::String(s)) => s.contains(text.as_str()),
                Some(Value::Array(items)) => items.iter().any(|item| has_text(item, text)),
                _ => false,
            },
            Test::Len(len) => match found {
                Some(Value::Array(items)) => items.len() == *len,
                Some(Value::Object(fields)) => fields.len() == *len,
                Some(Value::String(text)) => text.chars().count() == *len,
                _ => false,
            },
        }
    }
}

impl Test {
    /// [`Test::passes`] for a field that is the string `own`, without making it a JSON value:
    /// the trace's text fields are judged as they are ([`Condition::matches_text_field`]).
    fn passes_text(&self, own: &str) -> bool {
        match self {
            Test::Eq(text) => own == text,
            Test::Ne(text) => own != text,
            // A string is no number.
            Test::Lt(_) | Test::Le(_) | Test::Gt(_) | Test::Ge(_) => false,
            Test::Absent(absent) => !*absent,
            Test::OneOf(texts) => texts.iter().any(|text| own == text),
            Test::Contains(text) => own.contains(text.as_str()),
            Test::Len(len) => own.chars().count() == *len,
        }
    }
}

/// Whether the value's text ([`value_text`]) is `text`, without writing the text of a string,
/// boolean or null out: conditions are judged on every event a wait or an expectation looks at.
fn has_text(value: &Value, text: &str) -> bool {
    match value {
        Value::String(own) => own == text,
        Value::Bool(true) => text == "true",
        Value::Bool(false) => text == "false",
        Value::Null => text == "null",
        other => value_text(other) == text,
    }
}

impl fmt::Display for Test {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Test::Eq(text) => write!(f, "= {text}"),
            Test::Ne(text) => write!(f, "!= {text}"),
            Test::Lt(bound) => write!(f, "< {bound}"),
            Test::Le(bound) => write!(f, "<= {bound}"),
            Test::Gt(bound) => write!(f, "> {bound}"),
            Test::Ge(bound) => write!(f, ">= {bound}"),
            Test::Absent(true) => write!(f, "absent"),
            Test::Absent(false) => write!(f, "present"),
            Test::OneOf(texts) => write!(f, "one of [{}]", texts.join(", ")),
            Test::Contains(text) => write!(f, "contains {text}"),
            Test::Len(len) => write!(f, "of length {len}"),
        }
    }
}

/// A field at a dotted path and the tests its value must pass.
#[derive(Debug, Clone, PartialEq)]
pub struct Condition {
    path: Vec<String>,
    tests: Vec<Test>,
}

/// Why a condition could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ConditionError(String);

/// The keys a condition table may hold.
pub const TEST_NAMES: [&str; 11] =
    ["eq", "ne", "lt", "le", "gt", "ge", "absent", "present", "one_of", "contains", "len"];

impl Condition {
    /// A condition that the field at `path` has the text `expected`.
    pub fn equals(path: &str, expected: impl Into<String>) -> Result<Self, ConditionError> {
        Self::new(path, vec![Test::Eq(expected.into())])
    }

    pub fn new(path: &str, tests: Vec<Test>) -> Result<Self, ConditionError> {
        if path.is_empty() || path.split('.').any(str::is_empty) {
            return Err(ConditionError(format!(
                "empty segment in path `{path}` (expected names separated by single dots)"
            )));
        }
        if tests.is_empty() {
            return Err(ConditionError(format!("`{path}`: a condition table needs at least one test")));
        }
        Ok(Self { path: path.split('.').map(str::to_string).collect(), tests })
    }

    /// Reads a condition as a scenario file writes it: a scalar compares the field's text, a
    /// table holds named tests ([`TEST_NAMES`]).
    pub fn from_toml(path: &str, value: &toml::Value) -> Result<Self, ConditionError> {
        let tests = match value {
            toml::Value::Table(table) => {
                table.iter().map(|(name, operand)| test(path, name, operand)).collect::<Result<_, _>>()?
            }
            scalar => vec![Test::Eq(scalar_text(path, scalar)?)],
        };
        Self::new(path, tests)
    }

    /// The dotted path this condition reads.
    pub fn path(&self) -> String {
        self.path.join(".")
    }

    /// The texts the field may have, when the condition names them (`= x` or `one_of`).
    pub fn accepted_texts(&self) -> Option<Vec<&str>> {
        self.tests.iter().find_map(|test| match test {
            Test::Eq(text) => Some(vec![text.as_str()]),
            Test::OneOf(texts) => Some(texts.iter().map(String::as_str).collect()),
            _ => None,
        })
    }

    /// Whether the condition is on this top-level field.
    pub fn is_on_field(&self, field: &str) -> bool {
        matches!(self.path.as_slice(), [only] if only == field)
    }

    /// Whether `document`'s field passes every test.
    pub fn matches(&self, document: &Value) -> bool {
        let found = lookup(document, &self.path);
        self.tests.iter().all(|t| t.passes(found))
    }

    /// The top-level field the condition reads (the first name of its path).
    pub fn field(&self) -> &str {
        &self.path[0]
    }

    /// [`Condition::matches`] given only the document's top-level field [`Condition::field`]
    /// (`None`: the document has none): the same verdict, without the rest of the document.
    pub fn matches_field(&self, field: Option<&Value>) -> bool {
        let found = field.and_then(|value| lookup(value, &self.path[1..]));
        self.tests.iter().all(|t| t.passes(found))
    }

    /// [`Condition::matches_field`] for a top-level field that is the string `text`, judged
    /// without a copy of it: the trace's texts (hosts, kinds, functions, ids) are judged for
    /// every event a wait or an expectation looks at, and a copy of each made a third of the
    /// allocations of a wait's count.
    pub fn matches_text_field(&self, text: &str) -> bool {
        if self.path.len() == 1 {
            self.tests.iter().all(|t| t.passes_text(text))
        } else {
            // A string has no fields to look into.
            self.tests.iter().all(|t| t.passes(None))
        }
    }

    /// Why `document` does not match, in words: the tests that failed and what was found.
    pub fn explain(&self, document: &Value) -> String {
        let found = lookup(document, &self.path);
        let failed: Vec<String> = self.tests.iter().filter(|t| !t.passes(found)).map(ToString::to_string).collect();
        let seen = found.map_or_else(|| "nothing".to_string(), |v| format!("`{}`", value_text(v)));
        format!("{} expected {}, found {seen}", self.path(), failed.join(" and "))
    }
}

impl fmt::Display for Condition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let tests: Vec<String> = self.tests.iter().map(ToString::to_string).collect();
        match self.tests.as_slice() {
            [Test::Eq(text)] => write!(f, "{}={text}", self.path()),
            _ => write!(f, "{} {}", self.path(), tests.join(" and ")),
        }
    }
}

/// Whether every condition holds (an empty list always holds).
pub fn all_hold(conditions: &[Condition], document: &Value) -> bool {
    conditions.iter().all(|c| c.matches(document))
}

fn scalar_text(path: &str, value: &toml::Value) -> Result<String, ConditionError> {
    Ok(match value {
        toml::Value::String(s) => s.clone(),
        toml::Value::Integer(i) => i.to_string(),
        toml::Value::Float(f) => f.to_string(),
        toml::Value::Boolean(b) => b.to_string(),
        _ => return Err(ConditionError(format!("`{path}`: expected a string, number or boolean to compare with"))),
    })
}

fn number(path: &str, name: &str, value: &toml::Value) -> Result<f64, ConditionError> {
    match value {
        toml::Value::Integer(i) => Ok(*i as f64),
        toml::Value::Float(f) => Ok(*f),
        _ => Err(ConditionError(format!("`{path}`: `{name}` expects a number"))),
    }
}

fn test(path: &str, name: &str, operand: &toml::Value) -> Result<Test, ConditionError> {
    let flag = |value: &toml::Value| {
        value.as_bool().ok_or_else(|| ConditionError(format!("`{path}`: `{name}` expects true or false")))
    };
    Ok(match name {
        "eq" => Test::Eq(scalar_text(path, operand)?),
        "ne" => Test::Ne(scalar_text(path, operand)?),
        "lt" => Test::Lt(number(path, name, operand)?),
        "le" => Test::Le(number(path, name, operand)?),
        "gt" => Test::Gt(number(path, name, operand)?),
        "ge" => Test::Ge(number(path, name, operand)?),
        "absent" => Test::Absent(flag(operand)?),
        "present" => Test::Absent(!flag(operand)?),
        "contains" => Test::Contains(scalar_text(path, operand)?),
        "len" => match operand {
            toml::Value::Integer(n) if *n >= 0 => Test::Len(*n as usize),
            _ => return Err(ConditionError(format!("`{path}`: `len` expects a whole number"))),
        },
        "one_of" => match operand {
            toml::Value::Array(items) if !items.is_empty() => {
                Test::OneOf(items.iter().map(|item| scalar_text(path, item)).collect::<Result<_, _>>()?)
            }
            _ => return Err(ConditionError(format!("`{path}`: `one_of` expects a non-empty list of values"))),
        },
        other => {
            return Err(ConditionError(format!(
                "`{path}`: unknown test `{other}`{}, expected one of {}",
                crate::suggest::did_you_mean(other, TEST_NAMES),
                TEST_NAMES.join(", ")
            )))
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn condition(path: &str, toml_value: &str) -> Condition {
        let value: toml::Value = toml::from_str::<toml::Table>(&format!("v = {toml_value}")).unwrap()["v"].clone();
        Condition::from_toml(path, &value).unwrap()
    }

    #[test]
    fn scalars_compare_the_fields_text() {
        let doc = json!({"status": "failed", "step": 2, "skipped": false, "next": null, "list": [{"a": "x"}]});
        assert!(condition("status", "\"failed\"").matches(&doc));
        assert!(condition("step", "2").matches(&doc));
        assert!(condition("skipped", "false").matches(&doc));
        assert!(condition("next", "\"null\"").matches(&doc));
        assert!(condition("list.0.a", "\"x\"").matches(&doc));
        assert!(!condition("missing", "\"null\"").matches(&doc));
    }

    #[test]
    fn tables_hold_every_test_they_name() {
        let doc = json!({"at_ms": 1_800_050, "status": "held", "reason": "dead letter m1", "tags": ["a", "b"]});
        assert!(condition("at_ms", "{ ge = 1_800_000, lt = 1_801_000 }").matches(&doc));
        assert!(!condition("at_ms", "{ ge = 1_800_000, lt = 1_800_050 }").matches(&doc));
        assert!(condition("status", "{ ne = \"running\" }").matches(&doc));
        assert!(condition("missing", "{ ne = \"running\" }").matches(&doc), "a missing field is not equal");
        assert!(condition("missing", "{ absent = true }").matches(&doc));
        assert!(condition("status", "{ present = true }").matches(&doc));
        assert!(condition("status", "{ one_of = [\"completed\", \"held\"] }").matches(&doc));
        assert!(condition("reason", "{ contains = \"dead letter\" }").matches(&doc));
        assert!(condition("tags", "{ contains = \"b\" }").matches(&doc));
        assert!(!condition("status", "{ gt = 1 }").matches(&doc), "a string is no number");
        assert!(condition("tags", "{ len = 2 }").matches(&doc));
        assert!(condition("status", "{ len = 4 }").matches(&doc));
        assert!(!condition("at_ms", "{ len = 0 }").matches(&doc), "a number has no length");
    }

    /// A text field is judged as its JSON string is, by every kind of test, at the field and
    /// beyond it.
    #[test]
    fn a_text_field_is_judged_as_its_string() {
        let tables = [
            "\"held\"",
            "\"\"",
            "{ ne = \"held\" }",
            "{ lt = 5 }",
            "{ ge = 0 }",
            "{ absent = true }",
            "{ present = true }",
            "{ one_of = [\"completed\", \"held\"] }",
            "{ contains = \"el\" }",
            "{ contains = \"\" }",
            "{ len = 4 }",
            "{ len = 2 }",
            "{ ne = \"x\", len = 1 }",
            "\"null\"",
        ];
        for table in tables {
            for text in ["held", "", "x", "é☃l", "null", "4"] {
                for path in ["status", "status.inner", "status.0"] {
                    let c = condition(path, table);
                    let string = Value::String(text.to_string());
                    assert_eq!(
                        c.matches_text_field(text),
                        c.matches_field(Some(&string)),
                        "{path} {table} on {text:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn explanations_name_the_failed_test_and_what_was_found() {
        let c = condition("at_ms", "{ ge = 10, lt = 20 }");
        assert_eq!(c.explain(&json!({"at_ms": 25})), "at_ms expected < 20, found `25`");
        assert_eq!(c.explain(&json!({})), "at_ms expected >= 10 and < 20, found nothing");
    }

    #[test]
    fn malformed_tables_are_errors_that_name_the_choices() {
        let value: toml::Value = toml::from_str::<toml::Table>("v = { contain = \"x\" }").unwrap()["v"].clone();
        let error = Condition::from_toml("reason", &value).unwrap_err();
        assert!(error.0.contains("did you mean `contains`"), "{error}");
        let empty: toml::Value = toml::from_str::<toml::Table>("v = {}").unwrap()["v"].clone();
        assert!(Condition::from_toml("at_ms", &empty).is_err());
        assert!(Condition::new("a..b", vec![Test::Eq("1".into())]).is_err());
    }

    fn table(toml_value: &str) -> toml::Value {
        toml::from_str::<toml::Table>(&format!("v = {toml_value}")).unwrap()["v"].clone()
    }

    fn error(path: &str, toml_value: &str) -> String {
        Condition::from_toml(path, &table(toml_value)).unwrap_err().to_string()
    }

    #[test]
    fn each_comparison_holds_exactly_up_to_its_bound() {
        // Below, at and above the bound, for each relation: a comparison off by one either way
        // (a deadline judged a tick early or late) fails here.
        let judge = |test: &str| [4, 5, 6].map(|n| condition("n", test).matches(&json!({ "n": n })));
        assert_eq!(judge("{ lt = 5 }"), [true, false, false]);
        assert_eq!(judge("{ le = 5 }"), [true, true, false]);
        assert_eq!(judge("{ gt = 5 }"), [false, false, true]);
        assert_eq!(judge("{ ge = 5 }"), [false, true, true]);
        // Fractional bounds are read as written, not rounded.
        assert_eq!(judge("{ lt = 4.5 }"), [true, false, false]);
        assert_eq!(judge("{ gt = 5.5 }"), [false, false, true]);
        assert!(!condition("n", "{ ge = 0 }").matches(&json!({})), "a missing field is no number");
    }

    #[test]
    fn absent_and_present_tell_a_missing_or_null_field_from_a_set_one() {
        let doc = json!({ "set": 0, "null": null });
        let judge = |test: &str| ["set", "null", "missing"].map(|path| condition(path, test).matches(&doc));
        assert_eq!(judge("{ absent = true }"), [false, true, true]);
        assert_eq!(judge("{ absent = false }"), [true, false, false]);
        assert_eq!(judge("{ present = true }"), [true, false, false]);
        assert_eq!(judge("{ present = false }"), [false, true, true]);
    }

    #[test]
    fn contains_and_len_judge_each_kind_of_value() {
        let doc = json!({
            "text": "dead letter m1", "list": ["a", 2, true], "fields": { "x": 1, "y": 2 }, "accented": "héllo", "n": 12
        });
        let judge = |path: &str, test: &str| condition(path, test).matches(&doc);
        assert!(judge("text", "{ contains = \"letter\" }"));
        assert!(!judge("text", "{ contains = \"parcel\" }"));
        // An array contains an element whose text is the operand, not one that merely differs.
        assert!(judge("list", "{ contains = \"a\" }"));
        assert!(judge("list", "{ contains = 2 }"));
        assert!(judge("list", "{ contains = true }"));
        assert!(!judge("list", "{ contains = \"b\" }"));
        assert!(!judge("n", "{ contains = \"1\" }"), "a number contains nothing");
        assert!(!judge("fields", "{ contains = \"x\" }"), "an object is judged by `len`, not `contains`");
        // Length: entries of an array or object, characters (not bytes) of a string.
        assert!(judge("list", "{ len = 3 }") && !judge("list", "{ len = 2 }"));
        assert!(judge("fields", "{ len = 2 }") && !judge("fields", "{ len = 1 }"));
        assert!(judge("accented", "{ len = 5 }") && !judge("accented", "{ len = 6 }"));
        assert!(!judge("missing", "{ len = 0 }"), "a missing field has no length");
    }

    #[test]
    fn scalars_of_every_kind_compare_as_text() {
        let doc = json!({ "s": "x", "i": 3, "f": 0.5, "b": true });
        for (path, value) in [("s", "\"x\""), ("i", "3"), ("f", "0.5"), ("b", "true")] {
            assert!(condition(path, value).matches(&doc), "{path} = {value}");
            assert!(condition(path, &format!("{{ eq = {value} }}")).matches(&doc), "{path} eq {value}");
            assert!(!condition(path, &format!("{{ ne = {value} }}")).matches(&doc), "{path} ne {value}");
            assert!(condition(path, &format!("{{ one_of = [\"other\", {value}] }}")).matches(&doc));
        }
        assert!(!condition("s", "\"y\"").matches(&doc));
        assert!(!condition("s", "{ one_of = [\"y\", \"z\"] }").matches(&doc));
        assert!(!condition("missing", "{ one_of = [\"null\"] }").matches(&doc));
    }

    #[test]
    fn what_a_condition_says_of_itself() {
        let c = condition("value.calls.t1", "{ one_of = [\"done\", \"held\"] }");
        assert_eq!(c.path(), "value.calls.t1");
        assert_eq!(c.accepted_texts(), Some(vec!["done", "held"]));
        assert_eq!(condition("status", "\"held\"").accepted_texts(), Some(vec!["held"]));
        assert_eq!(condition("status", "{ ne = \"held\" }").accepted_texts(), None);
        assert!(condition("kind", "\"note\"").is_on_field("kind"));
        assert!(!condition("kind", "\"note\"").is_on_field("what"));
        assert!(!condition("kind.x", "\"note\"").is_on_field("kind"), "a nested path is not the field");
        // How each test reads in a failure message.
        let shown = |test: &str| condition("f", test).to_string();
        assert_eq!(shown("\"x\""), "f=x");
        assert_eq!(shown("{ eq = \"x\" }"), "f=x");
        assert_eq!(shown("{ ne = \"x\" }"), "f != x");
        assert_eq!(shown("{ lt = 1 }"), "f < 1");
        assert_eq!(shown("{ le = 1 }"), "f <= 1");
        assert_eq!(shown("{ gt = 1 }"), "f > 1");
        assert_eq!(shown("{ ge = 1.5 }"), "f >= 1.5");
        assert_eq!(shown("{ absent = true }"), "f absent");
        assert_eq!(shown("{ present = true }"), "f present");
        assert_eq!(shown("{ one_of = [\"a\", 2] }"), "f one of [a, 2]");
        assert_eq!(shown("{ contains = \"a\" }"), "f contains a");
        assert_eq!(shown("{ len = 2 }"), "f of length 2");
        assert_eq!(shown("{ ge = 1, lt = 2 }"), "f >= 1 and < 2");
    }

    #[test]
    fn all_hold_needs_every_condition() {
        let doc = json!({ "a": 1, "b": 2 });
        assert!(all_hold(&[], &doc), "no condition holds of anything");
        assert!(all_hold(&[condition("a", "1"), condition("b", "2")], &doc));
        assert!(!all_hold(&[condition("a", "1"), condition("b", "3")], &doc));
        assert!(!all_hold(&[condition("a", "0"), condition("b", "2")], &doc));
    }

    #[test]
    fn each_malformed_operand_is_an_error_that_says_what_was_expected() {
        assert!(error("f", "[1]").contains("expected a string, number or boolean"));
        assert!(error("f", "{ eq = [1] }").contains("expected a string, number or boolean"));
        assert!(error("f", "{ lt = \"5\" }").contains("`lt` expects a number"));
        assert!(error("f", "{ ge = true }").contains("`ge` expects a number"));
        assert!(error("f", "{ absent = 1 }").contains("`absent` expects true or false"));
        assert!(error("f", "{ present = \"yes\" }").contains("`present` expects true or false"));
        assert!(error("f", "{ len = -1 }").contains("`len` expects a whole number"));
        assert!(error("f", "{ len = 1.5 }").contains("`len` expects a whole number"));
        assert!(error("f", "{ one_of = [] }").contains("`one_of` expects a non-empty list"));
        assert!(error("f", "{ one_of = \"a\" }").contains("`one_of` expects a non-empty list"));
        assert!(error("f", "{ one_of = [[1]] }").contains("expected a string, number or boolean"));
        assert!(error("", "1").contains("empty segment"));
        // The edges that are fine.
        assert!(condition("f", "{ len = 0 }").matches(&json!({ "f": [] })));
        assert!(condition("f", "{ one_of = [\"a\"] }").matches(&json!({ "f": "a" })));
        assert_eq!(Condition::equals("a.b", "1").unwrap(), condition("a.b", "\"1\""));
    }
}
