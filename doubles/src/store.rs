use crate::service::{text_field, Call, Double, Observation, ServiceError};
use serde_json::{json, Value};
use std::collections::BTreeMap;

/// The durable state store: scoped keys with versions and compare-and-set.
///
/// Its contents live outside any simulated host, so they survive a crash of every host, its
/// own included: a commit is durable the moment it is applied.
#[derive(Debug, Default, Clone)]
pub struct StateStore {
    records: BTreeMap<(String, String), Versioned>,
}

#[derive(Debug, Clone, PartialEq)]
struct Versioned {
    value: Value,
    version: u64,
}

impl StateStore {
    pub const FUNCTIONS: &'static [&'static str] = &[
        "state::get",
        "state::set",
        "state::delete",
        "state::list",
        "state::compare-and-set",
    ];

    pub fn new() -> Self {
        Self::default()
    }

    /// Writes a record directly, as a scenario's seeded world (or an outside actor) does;
    /// returns its new version.
    pub fn seed(&mut self, scope: &str, key: &str, value: Value) -> u64 {
        self.write(scope, key, value)
    }

    pub fn get(&self, scope: &str, key: &str) -> Option<&Value> {
        self.records
            .get(&(scope.to_string(), key.to_string()))
            .map(|r| &r.value)
    }

    /// Every record as `(scope, key, value)`, ordered by scope then key.
    pub fn records(&self) -> impl Iterator<Item = (&str, &str, &Value)> {
        self.records
            .iter()
            .map(|((s, k), r)| (s.as_str(), k.as_str(), &r.value))
    }

    fn version(&self, scope: &str, key: &str) -> u64 {
        self.records
            .get(&(scope.to_string(), key.to_string()))
            .map_or(0, |r| r.version)
    }

    fn write(&mut self, scope: &str, key: &str, value: Value) -> u64 {
        let version = self.version(scope, key) + 1;
        self.records.insert(
            (scope.to_string(), key.to_string()),
            Versioned { value, version },
        );
        version
    }

    fn set(
        &mut self,
        payload: &Value,
        observed: &mut Vec<Observation>,
    ) -> Result<Value, ServiceError> {
        let (scope, key) = (text_field(payload, "scope")?, text_field(payload, "key")?);
        let value = payload.get("value").cloned().unwrap_or(Value::Null);
        let version = self.write(scope, key, value.clone());
        observed.push(Observation::Commit {
            scope: scope.into(),
            key: key.into(),
            value: Some(value),
            version,
        });
        Ok(json!({ "version": version }))
    }

    fn delete(
        &mut self,
        payload: &Value,
        observed: &mut Vec<Observation>,
    ) -> Result<Value, ServiceError> {
        let (scope, key) = (text_field(payload, "scope")?, text_field(payload, "key")?);
        let removed = self.records.remove(&(scope.to_string(), key.to_string()));
        if let Some(old) = &removed {
            observed.push(Observation::Commit {
                scope: scope.into(),
                key: key.into(),
                value: None,
                version: old.version + 1,
            });
        }
        Ok(json!({ "deleted": removed.is_some() }))
    }

    fn list(&self, payload: &Value) -> Result<Value, ServiceError> {
        let scope = text_field(payload, "scope")?;
        let entries: Vec<Value> = self
            .records
            .iter()
            .filter(|((s, _), _)| s == scope)
            .map(|((_, k), r)| json!({ "key": k, "value": r.value, "version": r.version }))
            .collect();
        Ok(Value::Array(entries))
    }

    fn compare_and_set(
        &mut self,
        payload: &Value,
        observed: &mut Vec<Observation>,
    ) -> Result<Value, ServiceError> {
        let (scope, key) = (text_field(payload, "scope")?, text_field(payload, "key")?);
        let expected = payload
            .get("expected_version")
            .and_then(Value::as_u64)
            .ok_or_else(|| ServiceError::bad_request("missing integer field `expected_version`"))?;
        let current = self.version(scope, key);
        if current != expected {
            return Ok(json!({ "swapped": false, "version": current }));
        }
        self.set(payload, observed)
            .map(|_| json!({ "swapped": true, "version": current + 1 }))
    }
}

impl Double for StateStore {
    fn name(&self) -> &'static str {
        "store"
    }

    fn functions(&self) -> &'static [&'static str] {
        Self::FUNCTIONS
    }

    fn handle(
        &mut self,
        call: Call<'_>,
        observed: &mut Vec<Observation>,
    ) -> Result<Value, ServiceError> {
        let payload = call.payload;
        match call.function {
            "state::get" => {
                let (scope, key) = (text_field(payload, "scope")?, text_field(payload, "key")?);
                Ok(self.get(scope, key).cloned().unwrap_or(Value::Null))
            }
            "state::set" => self.set(payload, observed),
            "state::delete" => self.delete(payload, observed),
            "state::list" => self.list(payload),
            "state::compare-and-set" => self.compare_and_set(payload, observed),
            other => Err(ServiceError::new("function_not_found", other)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call<'a>(function: &'a str, payload: &'a Value) -> Call<'a> {
        Call {
            function,
            payload,
            now_ms: 0,
        }
    }

    #[test]
    fn set_get_delete_round_trip_and_versions_increase() {
        let mut store = StateStore::new();
        let mut seen = Vec::new();
        let set = json!({"scope": "t", "key": "k", "value": {"a": 1}});
        assert_eq!(
            store.handle(call("state::set", &set), &mut seen).unwrap(),
            json!({"version": 1})
        );
        assert_eq!(
            store.handle(call("state::set", &set), &mut seen).unwrap(),
            json!({"version": 2})
        );
        let get = json!({"scope": "t", "key": "k"});
        assert_eq!(
            store.handle(call("state::get", &get), &mut seen).unwrap(),
            json!({"a": 1})
        );
        store
            .handle(call("state::delete", &get), &mut seen)
            .unwrap();
        assert_eq!(
            store.handle(call("state::get", &get), &mut seen).unwrap(),
            Value::Null
        );
        assert_eq!(seen.len(), 3, "two writes and one delete took effect");
    }

    #[test]
    fn compare_and_set_swaps_only_on_the_expected_version() {
        let mut store = StateStore::new();
        let mut seen = Vec::new();
        let stale = json!({"scope": "t", "key": "k", "expected_version": 1, "value": 1});
        assert_eq!(
            store
                .handle(call("state::compare-and-set", &stale), &mut seen)
                .unwrap(),
            json!({"swapped": false, "version": 0})
        );
        let fresh = json!({"scope": "t", "key": "k", "expected_version": 0, "value": 1});
        assert_eq!(
            store
                .handle(call("state::compare-and-set", &fresh), &mut seen)
                .unwrap(),
            json!({"swapped": true, "version": 1})
        );
        assert_eq!(seen.len(), 1);
    }

    #[test]
    fn list_is_ordered_by_key_within_a_scope() {
        let mut store = StateStore::new();
        store.seed("q", "b", json!(2));
        store.seed("q", "a", json!(1));
        store.seed("other", "a", json!(0));
        let listed = store
            .handle(call("state::list", &json!({"scope": "q"})), &mut Vec::new())
            .unwrap();
        let keys: Vec<_> = listed
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["key"].clone())
            .collect();
        assert_eq!(keys, vec![json!("a"), json!("b")]);
    }

    #[test]
    fn malformed_calls_are_rejected_not_panicked_on() {
        let mut store = StateStore::new();
        let err = store
            .handle(call("state::get", &json!({"scope": 1})), &mut Vec::new())
            .unwrap_err();
        assert_eq!(err.code, "bad_request");
    }
}
