//! Durable records of the wrong shape: the reference harness never acts on one, and never panics
//! on one.
//!
//! What the store holds may have been written by a bug elsewhere, an older harness or a hand edit.
//! Every field the harness writes into must be an object (or absent) before it writes there: a
//! turn record is an object, its actions an object of objects, its budget an object whose
//! counters are objects. A turn record that is not is set aside for a person: held, with what is
//! wrong, and the record as it was found kept whole under `malformed`.

use serde_json::{json, Value};

/// Fields of a turn record the harness writes into, and what each must be.
const OBJECT_FIELDS: [&str; 3] = ["calls", "reply", "budget"];
const BUDGET_OBJECT_FIELDS: [&str; 3] = ["used", "soft_passed", "limits"];

fn object_or_absent(value: &Value) -> bool {
    value.is_null() || value.is_object()
}

/// What is wrong with the shape of a turn record, if anything.
pub(super) fn turn_record_flaw(record: &Value) -> Option<String> {
    if !record.is_object() {
        return Some(format!("the turn record is not an object but `{record}`"));
    }
    for field in OBJECT_FIELDS {
        if !object_or_absent(&record[field]) {
            return Some(format!("`{field}` is not an object but `{}`", record[field]));
        }
    }
    for field in BUDGET_OBJECT_FIELDS {
        if !object_or_absent(&record["budget"][field]) {
            return Some(format!("`budget.{field}` is not an object but `{}`", record["budget"][field]));
        }
    }
    let calls = record["calls"].as_object().into_iter().flatten();
    let bad_call = calls.filter(|(_, entry)| !entry.is_object()).map(|(id, entry)| (id.clone(), entry.clone())).next();
    bad_call.map(|(id, entry)| format!("action `calls.{id}` is not an object but `{entry}`"))
}

/// The record that sets a malformed turn record aside: held for a person with the flaw as its
/// reason, keeping the turn's identity where it can be read, and the record as found.
pub(super) fn set_aside(session_id: &str, found: &Value, flaw: &str, now_ms: u64) -> Value {
    let mut record = json!({
        "session_id": session_id, "status": "held", "calls": {}, "updated_at": now_ms, "malformed": found,
        "held_reason": format!("the turn record is malformed ({flaw}): set aside for a person, as found, under `malformed`"),
    });
    if let Some(turn_id) = found["turn_id"].as_str() {
        record["turn_id"] = json!(turn_id);
    }
    if let Some(step) = found["step"].as_u64() {
        record["step"] = json!(step);
    }
    record
}

/// What is wrong with the shape of a session's control record, if anything.
pub(super) fn control_record_flaw(record: &Value) -> Option<String> {
    if !record.is_object() {
        return Some(format!("the control record is not an object but `{record}`"));
    }
    if !object_or_absent(&record["commands"]) {
        return Some(format!("`commands` is not an object but `{}`", record["commands"]));
    }
    let commands = record["commands"].as_object().into_iter().flatten();
    let bad = commands.filter(|(_, command)| !command.is_object()).map(|(key, _)| key.clone()).next();
    bad.map(|key| format!("command `{key}` is not an object"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_the_harness_would_write_into_wrongly_are_named() {
        assert_eq!(turn_record_flaw(&json!({"turn_id": "t1", "calls": {"a1": {"status": "started"}}})), None);
        assert_eq!(turn_record_flaw(&json!({"turn_id": "t1"})), None);
        assert!(turn_record_flaw(&json!(true)).unwrap().contains("not an object"));
        assert!(turn_record_flaw(&json!({"calls": {"a1": "x"}})).unwrap().contains("calls.a1"));
        assert!(turn_record_flaw(&json!({"calls": []})).unwrap().contains("`calls`"));
        assert!(turn_record_flaw(&json!({"budget": {"used": 3}})).unwrap().contains("budget.used"));
        assert!(control_record_flaw(&json!({"commands": {"c1": 1}})).unwrap().contains("c1"));
        assert_eq!(control_record_flaw(&json!({"commands": {}})), None);
    }

    #[test]
    fn a_record_set_aside_keeps_what_was_found_and_says_why() {
        let found = json!({"turn_id": "t1", "step": 2, "calls": {"a1": "x"}});
        let aside = set_aside("s1", &found, "action `calls.a1` is not an object", 7);
        assert_eq!(aside["status"], "held");
        assert_eq!((aside["turn_id"].clone(), aside["step"].clone()), (json!("t1"), json!(2)));
        assert_eq!(aside["malformed"], found);
        assert_eq!(turn_record_flaw(&aside), None);
        assert!(aside["held_reason"].as_str().unwrap().contains("calls.a1"));
    }
}
