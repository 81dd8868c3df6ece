use crate::service::{optional_object_field, text_field, u64_field, Call, Double, Kept, Observation, ServiceError};
use serde_json::{json, Value};
use std::collections::BTreeMap;

/// The durable state store: scoped keys with versions and compare-and-set, plus leases with
/// fencing tokens.
///
/// Its contents live outside any simulated host, so they survive a crash of every host, its
/// own included: a commit is durable the moment it is applied.
///
/// A lease names an ownership domain by `(scope, key)`. Every acquisition issues a fencing
/// token one greater than any token ever issued for that domain (tokens are never reused,
/// not even across releases). A write may name a lease as its fence; it is refused with
/// `stale_token` if its token is older than the newest token issued for that lease. Expiry
/// alone refuses nothing: only a newer grant does.
#[derive(Debug, Default, Clone)]
pub struct StateStore {
    /// By scope, then key: ordered by scope then key as one map of pairs would be, and looked up
    /// by the request's texts without making owned keys of them.
    records: BTreeMap<String, BTreeMap<String, Versioned>>,
    leases: BTreeMap<String, BTreeMap<String, LeaseSlot>>,
}

#[derive(Debug, Clone, PartialEq)]
struct Versioned {
    /// Shared with the commit observed when it was written (the rig's trace keeps the same
    /// value) and, when the request's host shares it, with the request it came in: no copy of
    /// every node of it.
    value: Kept,
    version: u64,
}

/// The entry of `scope/key` in a map by scope then key, made (with owned keys) only if missing.
fn entry_of<'m, T: Default>(map: &'m mut BTreeMap<String, BTreeMap<String, T>>, scope: &str, key: &str) -> &'m mut T {
    if !map.contains_key(scope) {
        map.insert(scope.to_string(), BTreeMap::new());
    }
    let keys = map.get_mut(scope).expect("just made");
    if !keys.contains_key(key) {
        keys.insert(key.to_string(), T::default());
    }
    keys.get_mut(key).expect("just made")
}

fn lookup<'m, T>(map: &'m BTreeMap<String, BTreeMap<String, T>>, scope: &str, key: &str) -> Option<&'m T> {
    map.get(scope)?.get(key)
}

/// A lease as the store holds it: who holds the ownership domain `scope/key`, under which
/// fencing token, until when. An expired lease stays visible until someone acquires,
/// renews or releases it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseView {
    pub scope: String,
    pub key: String,
    pub owner: String,
    pub token: u64,
    pub expires_at_ms: u64,
}

impl LeaseView {
    /// Whether the lease has expired at `now_ms` (expiry is inclusive: at `expires_at_ms`
    /// the lease is already free to acquire).
    pub fn expired_at(&self, now_ms: u64) -> bool {
        now_ms >= self.expires_at_ms
    }
}

/// One ownership domain: its current holder, if any, and the newest token ever issued.
#[derive(Debug, Default, Clone)]
struct LeaseSlot {
    holder: Option<LeaseView>,
    highest_token: u64,
}

/// A write's promise not to reopen what has ended: refused when the stored record is the same
/// unit of work (the same value at `key_field`) in a final state (its `status_field` one of
/// `final_states`) and the write would change it. Writing the identical final record again (the
/// retry of a write whose acknowledgement was lost) is allowed.
/// Read in place from the request: its texts borrowed, not copied.
struct Guard<'a> {
    key_field: &'a str,
    status_field: &'a str,
    /// Every one a string (checked by [`Guard::parse`]).
    final_states: &'a [Value],
}

impl<'a> Guard<'a> {
    fn parse(payload: &'a Value) -> Result<Option<Self>, ServiceError> {
        let Some(guard) = optional_object_field(payload, "guard")? else {
            return Ok(None);
        };
        let field = |e: ServiceError| ServiceError::bad_request(format!("guard: {}", e.message));
        let final_states = guard
            .get("final")
            .and_then(Value::as_array)
            .ok_or_else(|| ServiceError::bad_request("guard: missing list field `final`"))?;
        if !final_states.iter().all(Value::is_string) {
            return Err(ServiceError::bad_request("guard: `final` holds strings"));
        }
        Ok(Some(Self {
            key_field: text_field(guard, "key").map_err(field)?,
            status_field: text_field(guard, "status").map_err(field)?,
            final_states,
        }))
    }

    /// Why `value` may not replace `stored`, if it may not.
    fn refuses(&self, stored: &Value, value: &Value) -> Option<String> {
        let status = stored.get(self.status_field).and_then(Value::as_str)?;
        let same_unit = stored.get(self.key_field) == value.get(self.key_field);
        (same_unit && self.final_states.iter().any(|s| s.as_str() == Some(status)) && stored != value).then(|| {
            format!(
                "{} {} is already `{status}`; a final state is never written over",
                self.key_field, stored[self.key_field]
            )
        })
    }
}

/// The lease a write claims to be protected by.
struct Fence<'a> {
    scope: &'a str,
    key: &'a str,
    token: u64,
}

impl<'a> Fence<'a> {
    fn parse(payload: &'a Value) -> Result<Option<Self>, ServiceError> {
        let Some(fence) = optional_object_field(payload, "fence")? else {
            return Ok(None);
        };
        let field = |e: ServiceError| ServiceError::bad_request(format!("fence: {}", e.message));
        Ok(Some(Self {
            scope: text_field(fence, "scope").map_err(field)?,
            key: text_field(fence, "key").map_err(field)?,
            token: u64_field(fence, "token").map_err(field)?,
        }))
    }
}

impl StateStore {
    pub const FUNCTIONS: &'static [&'static str] = &[
        "state::get",
        "state::set",
        "state::delete",
        "state::list",
        "state::compare-and-set",
        "state::acquire-lease",
        "state::renew-lease",
        "state::release-lease",
        "state::get-lease",
    ];

    pub fn new() -> Self {
        Self::default()
    }

    /// Writes a record directly, as a scenario's seeded world (or an outside actor) does;
    /// returns its new version.
    pub fn seed(&mut self, scope: &str, key: &str, value: Value) -> u64 {
        self.write(scope, key, value.into())
    }

    pub fn get(&self, scope: &str, key: &str) -> Option<&Value> {
        lookup(&self.records, scope, key).map(|r| &*r.value)
    }

    /// Every record as `(scope, key, value)`, ordered by scope then key.
    pub fn records(&self) -> impl Iterator<Item = (&str, &str, &Value)> {
        self.records.iter().flat_map(|(s, keys)| keys.iter().map(move |(k, r)| (s.as_str(), k.as_str(), &*r.value)))
    }

    /// Every record as the store keeps it (shared, not copied), ordered by scope then key.
    pub fn kept(&self) -> impl Iterator<Item = (&str, &str, &Kept)> {
        self.records.iter().flat_map(|(s, keys)| keys.iter().map(move |(k, r)| (s.as_str(), k.as_str(), &r.value)))
    }

    /// The lease currently recorded for `scope/key` (possibly expired), if any.
    pub fn lease(&self, scope: &str, key: &str) -> Option<LeaseView> {
        lookup(&self.leases, scope, key).and_then(|slot| slot.holder.clone())
    }

    /// Every recorded lease (possibly expired), ordered by scope then key.
    pub fn leases(&self) -> Vec<LeaseView> {
        self.leases.values().flat_map(BTreeMap::values).filter_map(|slot| slot.holder.clone()).collect()
    }

    /// The newest fencing token ever issued for `scope/key`; 0 if none ever was. This is
    /// the bar a fenced write must reach, and it stays put across release and expiry.
    pub fn highest_token(&self, scope: &str, key: &str) -> u64 {
        lookup(&self.leases, scope, key).map_or(0, |slot| slot.highest_token)
    }

    fn version(&self, scope: &str, key: &str) -> u64 {
        lookup(&self.records, scope, key).map_or(0, |r| r.version)
    }

    fn write(&mut self, scope: &str, key: &str, value: Kept) -> u64 {
        let version = self.version(scope, key) + 1;
        if !self.records.contains_key(scope) {
            self.records.insert(scope.to_string(), BTreeMap::new());
        }
        let keys = self.records.get_mut(scope).expect("just made");
        match keys.get_mut(key) {
            Some(record) => *record = Versioned { value, version },
            None => {
                keys.insert(key.to_string(), Versioned { value, version });
            }
        }
        version
    }

    /// Judges a fenced write to `scope/key`: observes the verdict and refuses a stale token.
    fn admit(
        &self,
        fence: Option<&Fence<'_>>,
        scope: &str,
        key: &str,
        observed: &mut Vec<Observation>,
    ) -> Result<(), ServiceError> {
        let Some(fence) = fence else {
            return Ok(());
        };
        let current = self.highest_token(fence.scope, fence.key);
        let accepted = fence.token >= current;
        let domain = format!("{}/{}", fence.scope, fence.key);
        observed.push(Observation::Fenced {
            scope: scope.into(),
            key: key.into(),
            domain: domain.clone(),
            token: fence.token,
            accepted,
        });
        if accepted {
            Ok(())
        } else {
            Err(ServiceError::new(
                "stale_token",
                format!("token {} is older than token {current} of lease {domain}", fence.token),
            ))
        }
    }

    /// Writes and observes the commit; no checks.
    fn put(&mut self, scope: &str, key: &str, value: Kept, observed: &mut Vec<Observation>) -> u64 {
        let version = self.write(scope, key, value.clone());
        observed.push(Observation::Commit { scope: scope.into(), key: key.into(), value: Some(value), version });
        version
    }

    /// Refuses a guarded write that would change a record in a final state.
    fn check_guard(&self, payload: &Value, scope: &str, key: &str, value: &Value) -> Result<(), ServiceError> {
        let Some(guard) = Guard::parse(payload)? else { return Ok(()) };
        match self.get(scope, key).and_then(|stored| guard.refuses(stored, value)) {
            Some(why) => Err(ServiceError::new("final_state", why)),
            None => Ok(()),
        }
    }

    fn set(&mut self, call: &Call<'_>, observed: &mut Vec<Observation>) -> Result<Value, ServiceError> {
        let payload = call.payload;
        let (scope, key) = (text_field(payload, "scope")?, text_field(payload, "key")?);
        let fence = Fence::parse(payload)?;
        let value = call.keep("value");
        self.admit(fence.as_ref(), scope, key, observed)?;
        self.check_guard(payload, scope, key, &value)?;
        let version = self.put(scope, key, value, observed);
        Ok(json!({ "version": version }))
    }

    fn delete(&mut self, payload: &Value, observed: &mut Vec<Observation>) -> Result<Value, ServiceError> {
        let (scope, key) = (text_field(payload, "scope")?, text_field(payload, "key")?);
        let fence = Fence::parse(payload)?;
        self.admit(fence.as_ref(), scope, key, observed)?;
        let removed = self.records.get_mut(scope).and_then(|keys| keys.remove(key));
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
        let entries: Vec<Value> = (self.records.get(scope).into_iter().flatten())
            .map(|(k, r)| {
                // A copy of the value, rather than `json!` writing it out through its serializer.
                let mut entry = serde_json::Map::new();
                entry.insert("key".into(), k.as_str().into());
                entry.insert("value".into(), Value::clone(&r.value));
                entry.insert("version".into(), r.version.into());
                Value::Object(entry)
            })
            .collect();
        Ok(Value::Array(entries))
    }

    fn compare_and_set(&mut self, call: &Call<'_>, observed: &mut Vec<Observation>) -> Result<Value, ServiceError> {
        let payload = call.payload;
        let (scope, key) = (text_field(payload, "scope")?, text_field(payload, "key")?);
        let expected = payload
            .get("expected_version")
            .and_then(Value::as_u64)
            .ok_or_else(|| ServiceError::bad_request("missing integer field `expected_version`"))?;
        let fence = Fence::parse(payload)?;
        self.admit(fence.as_ref(), scope, key, observed)?;
        let current = self.version(scope, key);
        if current != expected {
            return Ok(json!({ "swapped": false, "version": current }));
        }
        let value = call.keep("value");
        self.check_guard(payload, scope, key, &value)?;
        let version = self.put(scope, key, value, observed);
        Ok(json!({ "swapped": true, "version": version }))
    }

    fn acquire_lease(
        &mut self,
        payload: &Value,
        now_ms: u64,
        observed: &mut Vec<Observation>,
    ) -> Result<Value, ServiceError> {
        let (scope, key) = (text_field(payload, "scope")?, text_field(payload, "key")?);
        let owner = text_field(payload, "owner")?;
        let ttl_ms = u64_field(payload, "ttl_ms")?;
        let slot = entry_of(&mut self.leases, scope, key);
        if let Some(holder) = &slot.holder {
            if holder.owner != owner && !holder.expired_at(now_ms) {
                return Ok(json!({
                    "granted": false,
                    "owner": holder.owner,
                    "expires_at_ms": holder.expires_at_ms,
                }));
            }
        }
        slot.highest_token += 1;
        let lease = LeaseView {
            scope: scope.into(),
            key: key.into(),
            owner: owner.into(),
            token: slot.highest_token,
            expires_at_ms: now_ms.saturating_add(ttl_ms),
        };
        let reply = json!({
            "granted": true,
            "token": lease.token,
            "expires_at_ms": lease.expires_at_ms,
        });
        observed.push(lease_observation(&lease));
        slot.holder = Some(lease);
        Ok(reply)
    }

    fn renew_lease(
        &mut self,
        payload: &Value,
        now_ms: u64,
        observed: &mut Vec<Observation>,
    ) -> Result<Value, ServiceError> {
        let (scope, key) = (text_field(payload, "scope")?, text_field(payload, "key")?);
        let owner = text_field(payload, "owner")?;
        let token = u64_field(payload, "token")?;
        let ttl_ms = u64_field(payload, "ttl_ms")?;
        let Some(slot) = self.leases.get_mut(scope).and_then(|keys| keys.get_mut(key)) else {
            return Ok(json!({ "renewed": false, "token": 0 }));
        };
        match &mut slot.holder {
            Some(holder) if holder.token == token && holder.owner == owner => {
                holder.expires_at_ms = now_ms.saturating_add(ttl_ms);
                observed.push(lease_observation(holder));
                Ok(json!({ "renewed": true, "expires_at_ms": holder.expires_at_ms }))
            }
            _ => Ok(json!({ "renewed": false, "token": slot.highest_token })),
        }
    }

    fn release_lease(&mut self, payload: &Value) -> Result<Value, ServiceError> {
        let (scope, key) = (text_field(payload, "scope")?, text_field(payload, "key")?);
        let owner = text_field(payload, "owner")?;
        let token = u64_field(payload, "token")?;
        let slot = self.leases.get_mut(scope).and_then(|keys| keys.get_mut(key));
        let released = match slot {
            Some(slot) => {
                let current = slot.holder.as_ref().is_some_and(|h| h.token == token && h.owner == owner);
                if current {
                    slot.holder = None;
                }
                current
            }
            None => false,
        };
        Ok(json!({ "released": released }))
    }

    fn get_lease(&self, payload: &Value, now_ms: u64) -> Result<Value, ServiceError> {
        let (scope, key) = (text_field(payload, "scope")?, text_field(payload, "key")?);
        Ok(self.lease(scope, key).map_or(Value::Null, |lease| {
            json!({
                "owner": lease.owner,
                "token": lease.token,
                "expires_at_ms": lease.expires_at_ms,
                "expired": lease.expired_at(now_ms),
            })
        }))
    }
}

fn lease_observation(lease: &LeaseView) -> Observation {
    Observation::Lease {
        scope: lease.scope.clone(),
        key: lease.key.clone(),
        owner: lease.owner.clone(),
        token: lease.token,
        expires_at_ms: lease.expires_at_ms,
    }
}

impl Double for StateStore {
    fn name(&self) -> &str {
        "store"
    }

    fn functions(&self) -> Vec<String> {
        crate::service::owned(Self::FUNCTIONS)
    }

    fn handle(&mut self, call: Call<'_>, observed: &mut Vec<Observation>) -> Result<Value, ServiceError> {
        let payload = call.payload;
        match call.function {
            "state::get" => {
                let (scope, key) = (text_field(payload, "scope")?, text_field(payload, "key")?);
                let value = self.get(scope, key).cloned().unwrap_or(Value::Null);
                // `versioned: true` asks for the version too, for a compare-and-set to follow.
                if payload.get("versioned") == Some(&Value::Bool(true)) {
                    // Moved in, where `json!` would write the copy out again node by node.
                    let mut reply = serde_json::Map::new();
                    reply.insert("value".into(), value);
                    reply.insert("version".into(), self.version(scope, key).into());
                    Ok(Value::Object(reply))
                } else {
                    Ok(value)
                }
            }
            "state::set" => self.set(&call, observed),
            "state::delete" => self.delete(payload, observed),
            "state::list" => self.list(payload),
            "state::compare-and-set" => self.compare_and_set(&call, observed),
            "state::acquire-lease" => self.acquire_lease(payload, call.now_ms, observed),
            "state::renew-lease" => self.renew_lease(payload, call.now_ms, observed),
            "state::release-lease" => self.release_lease(payload),
            "state::get-lease" => self.get_lease(payload, call.now_ms),
            other => Err(ServiceError::new("function_not_found", other)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call<'a>(function: &'a str, payload: &'a Value) -> Call<'a> {
        Call::new(function, payload, 0)
    }

    #[test]
    fn set_get_delete_round_trip_and_versions_increase() {
        let mut store = StateStore::new();
        let mut seen = Vec::new();
        let set = json!({"scope": "t", "key": "k", "value": {"a": 1}});
        assert_eq!(store.handle(call("state::set", &set), &mut seen).unwrap(), json!({"version": 1}));
        assert_eq!(store.handle(call("state::set", &set), &mut seen).unwrap(), json!({"version": 2}));
        let get = json!({"scope": "t", "key": "k"});
        assert_eq!(store.handle(call("state::get", &get), &mut seen).unwrap(), json!({"a": 1}));
        store.handle(call("state::delete", &get), &mut seen).unwrap();
        assert_eq!(store.handle(call("state::get", &get), &mut seen).unwrap(), Value::Null);
        assert_eq!(seen.len(), 3, "two writes and one delete took effect");
        assert!(
            matches!(&seen[2], Observation::Commit { value: None, version: 3, .. }),
            "a delete is the record's next version, with no value: {:?}",
            seen[2]
        );
    }

    #[test]
    fn compare_and_set_swaps_only_on_the_expected_version() {
        let mut store = StateStore::new();
        let mut seen = Vec::new();
        let stale = json!({"scope": "t", "key": "k", "expected_version": 1, "value": 1});
        assert_eq!(
            store.handle(call("state::compare-and-set", &stale), &mut seen).unwrap(),
            json!({"swapped": false, "version": 0})
        );
        let fresh = json!({"scope": "t", "key": "k", "expected_version": 0, "value": 1});
        assert_eq!(
            store.handle(call("state::compare-and-set", &fresh), &mut seen).unwrap(),
            json!({"swapped": true, "version": 1})
        );
        assert_eq!(seen.len(), 1);
    }

    #[test]
    fn a_guarded_write_never_reopens_a_final_record_but_may_repeat_it() {
        let mut store = StateStore::new();
        let mut seen = Vec::new();
        let guard = json!({"key": "turn_id", "status": "status", "final": ["completed", "cancelled"]});
        let write = |value: Value| json!({"scope": "t", "key": "s1", "value": value, "guard": guard});
        let done = json!({"turn_id": "t1", "status": "completed"});
        store.handle(call("state::set", &write(json!({"turn_id": "t1", "status": "running"}))), &mut seen).unwrap();
        store.handle(call("state::set", &write(done.clone())), &mut seen).unwrap();
        store.handle(call("state::set", &write(done.clone())), &mut seen).expect("the identical final record again");
        let reopen = store.handle(call("state::set", &write(json!({"turn_id": "t1", "status": "running"}))), &mut seen);
        assert_eq!(reopen.unwrap_err().code, "final_state");
        store
            .handle(call("state::set", &write(json!({"turn_id": "t2", "status": "running"}))), &mut seen)
            .expect("a new turn");
        let versioned =
            store.handle(call("state::get", &json!({"scope": "t", "key": "s1", "versioned": true})), &mut seen);
        assert_eq!(versioned.unwrap(), json!({"value": {"turn_id": "t2", "status": "running"}, "version": 4}));
    }

    #[test]
    fn a_write_whose_payload_its_host_shares_keeps_the_value_in_place() {
        let mut store = StateStore::new();
        let mut seen = Vec::new();
        let shared = std::sync::Arc::new(json!({"scope": "t", "key": "k", "value": {"a": [1, 2.5]}}));
        store.handle(Call::shared("state::set", &shared, 0), &mut seen).unwrap();
        let stored = store.get("t", "k").unwrap();
        assert!(std::ptr::eq(stored, &shared["value"]), "the stored value is the payload's own node, not a copy");
        let Some(Observation::Commit { value: Some(committed), .. }) = seen.first() else { panic!("{seen:?}") };
        assert!(std::ptr::eq(&**committed, &shared["value"]), "and so is the commit's");
        // A payload only lent is copied, to the same value.
        let lent = json!({"scope": "t", "key": "k2", "value": {"a": [1, 2.5]}});
        store.handle(call("state::set", &lent), &mut seen).unwrap();
        assert_eq!(store.get("t", "k2"), Some(&lent["value"]));
        assert!(!std::ptr::eq(store.get("t", "k2").unwrap(), &lent["value"]));
        // A write without a value stores null, shared or not.
        let bare = std::sync::Arc::new(json!({"scope": "t", "key": "k3", "expected_version": 0}));
        store.handle(Call::shared("state::compare-and-set", &bare, 0), &mut seen).unwrap();
        assert_eq!(store.get("t", "k3"), Some(&Value::Null));
        let kept: Vec<_> = store.kept().map(|(s, k, v)| (s, k, (**v).clone())).collect();
        assert_eq!(
            kept,
            vec![("t", "k", shared["value"].clone()), ("t", "k2", lent["value"].clone()), ("t", "k3", Value::Null)]
        );
    }

    #[test]
    fn list_is_ordered_by_key_within_a_scope() {
        let mut store = StateStore::new();
        store.seed("q", "b", json!(2));
        store.seed("q", "a", json!(1));
        store.seed("other", "a", json!(0));
        let listed = store.handle(call("state::list", &json!({"scope": "q"})), &mut Vec::new()).unwrap();
        let keys: Vec<_> = listed.as_array().unwrap().iter().map(|e| e["key"].clone()).collect();
        assert_eq!(keys, vec![json!("a"), json!("b")]);
    }

    #[test]
    fn malformed_calls_are_rejected_not_panicked_on() {
        let mut store = StateStore::new();
        let err = store.handle(call("state::get", &json!({"scope": 1})), &mut Vec::new()).unwrap_err();
        assert_eq!(err.code, "bad_request");
    }

    fn at<'a>(function: &'a str, payload: &'a Value, now_ms: u64) -> Call<'a> {
        Call::new(function, payload, now_ms)
    }

    fn acquire(store: &mut StateStore, owner: &str, ttl_ms: u64, now_ms: u64) -> Value {
        acquire_seen(store, owner, ttl_ms, now_ms, &mut Vec::new())
    }

    fn acquire_seen(
        store: &mut StateStore,
        owner: &str,
        ttl_ms: u64,
        now_ms: u64,
        seen: &mut Vec<Observation>,
    ) -> Value {
        let payload = json!({"scope": "lease", "key": "s1", "owner": owner, "ttl_ms": ttl_ms});
        store.handle(at("state::acquire-lease", &payload, now_ms), seen).unwrap()
    }

    fn lease_op(store: &mut StateStore, function: &str, payload: Value, now_ms: u64) -> Value {
        store.handle(at(function, &payload, now_ms), &mut Vec::new()).unwrap()
    }

    fn fenced_set(token: u64) -> Value {
        json!({
            "scope": "t", "key": "k", "value": token,
            "fence": {"scope": "lease", "key": "s1", "token": token},
        })
    }

    fn fenced_observations(seen: &[Observation]) -> Vec<(u64, bool)> {
        seen.iter()
            .filter_map(|o| match o {
                Observation::Fenced { scope, key, domain, token, accepted } => {
                    assert_eq!((scope.as_str(), key.as_str()), ("t", "k"));
                    assert_eq!(domain, "lease/s1");
                    Some((*token, *accepted))
                }
                _ => None,
            })
            .collect()
    }

    fn commits(seen: &[Observation]) -> usize {
        seen.iter().filter(|o| matches!(o, Observation::Commit { .. })).count()
    }

    #[test]
    fn a_held_lease_is_refused_to_another_owner_until_it_expires() {
        let mut store = StateStore::new();
        let mut seen = Vec::new();
        assert_eq!(
            acquire_seen(&mut store, "A", 100, 1000, &mut seen),
            json!({"granted": true, "token": 1, "expires_at_ms": 1100})
        );
        assert_eq!(
            acquire_seen(&mut store, "B", 100, 1099, &mut seen),
            json!({"granted": false, "owner": "A", "expires_at_ms": 1100})
        );
        assert_eq!(
            acquire_seen(&mut store, "B", 50, 1100, &mut seen),
            json!({"granted": true, "token": 2, "expires_at_ms": 1150})
        );
        assert_eq!(
            seen,
            vec![
                Observation::Lease {
                    scope: "lease".into(),
                    key: "s1".into(),
                    owner: "A".into(),
                    token: 1,
                    expires_at_ms: 1100,
                },
                Observation::Lease {
                    scope: "lease".into(),
                    key: "s1".into(),
                    owner: "B".into(),
                    token: 2,
                    expires_at_ms: 1150,
                },
            ],
            "one observation per grant, none for the refusal"
        );
        assert_eq!(
            store.lease("lease", "s1"),
            Some(LeaseView {
                scope: "lease".into(),
                key: "s1".into(),
                owner: "B".into(),
                token: 2,
                expires_at_ms: 1150,
            })
        );
    }

    #[test]
    fn the_holder_reacquiring_gets_a_new_token() {
        let mut store = StateStore::new();
        acquire(&mut store, "A", 100, 0);
        assert_eq!(acquire(&mut store, "A", 100, 10), json!({"granted": true, "token": 2, "expires_at_ms": 110}));
    }

    #[test]
    fn tokens_are_monotonic_across_release_and_reacquire() {
        let mut store = StateStore::new();
        acquire(&mut store, "A", 100, 0);
        let release = json!({"scope": "lease", "key": "s1", "owner": "A", "token": 1});
        assert_eq!(lease_op(&mut store, "state::release-lease", release.clone(), 5), json!({"released": true}));
        assert_eq!(store.lease("lease", "s1"), None);
        assert_eq!(lease_op(&mut store, "state::release-lease", release, 6), json!({"released": false}));
        assert_eq!(store.highest_token("lease", "s1"), 1);
        assert_eq!(acquire(&mut store, "B", 100, 7)["token"], json!(2));
        // A stale release does not free the current lease.
        let stale = json!({"scope": "lease", "key": "s1", "owner": "A", "token": 1});
        assert_eq!(lease_op(&mut store, "state::release-lease", stale, 8), json!({"released": false}));
        assert_eq!(store.lease("lease", "s1").unwrap().owner, "B");
        // Releasing takes the holder's token and its name both: the current token under another
        // owner, or the owner with an older token, frees nothing.
        let not_the_owner = json!({"scope": "lease", "key": "s1", "owner": "A", "token": 2});
        assert_eq!(lease_op(&mut store, "state::release-lease", not_the_owner, 8), json!({"released": false}));
        assert_eq!(store.lease("lease", "s1").unwrap().owner, "B");
        // Expiry does not reset the counter either.
        assert_eq!(acquire(&mut store, "A", 100, 500)["token"], json!(3));
    }

    #[test]
    fn renewal_needs_the_current_token() {
        let mut store = StateStore::new();
        acquire(&mut store, "A", 100, 0);
        let renew_a = json!({"scope": "lease", "key": "s1", "owner": "A", "token": 1, "ttl_ms": 100});
        let mut seen = Vec::new();
        // Expired, but nobody acquired since: the holder may still renew.
        assert_eq!(
            store.handle(at("state::renew-lease", &renew_a, 150), &mut seen).unwrap(),
            json!({"renewed": true, "expires_at_ms": 250})
        );
        assert_eq!(
            seen,
            vec![Observation::Lease {
                scope: "lease".into(),
                key: "s1".into(),
                owner: "A".into(),
                token: 1,
                expires_at_ms: 250,
            }]
        );
        assert_eq!(acquire(&mut store, "B", 100, 249), json!({"granted": false, "owner": "A", "expires_at_ms": 250}));
        assert_eq!(acquire(&mut store, "B", 100, 250)["token"], json!(2));
        let mut seen = Vec::new();
        assert_eq!(
            store.handle(at("state::renew-lease", &renew_a, 260), &mut seen).unwrap(),
            json!({"renewed": false, "token": 2})
        );
        assert!(seen.is_empty());
        assert_eq!(store.lease("lease", "s1").unwrap().expires_at_ms, 350);
        // The right token under the wrong owner is no renewal either.
        let forged = json!({"scope": "lease", "key": "s1", "owner": "A", "token": 2, "ttl_ms": 100});
        assert_eq!(lease_op(&mut store, "state::renew-lease", forged, 270), json!({"renewed": false, "token": 2}));
        // Nor is renewing a lease that never existed.
        let nothing = json!({"scope": "lease", "key": "s9", "owner": "A", "token": 1, "ttl_ms": 1});
        assert_eq!(lease_op(&mut store, "state::renew-lease", nothing, 270), json!({"renewed": false, "token": 0}));
    }

    #[test]
    fn get_lease_shows_the_holder_or_null() {
        let mut store = StateStore::new();
        let get = json!({"scope": "lease", "key": "s1"});
        assert_eq!(lease_op(&mut store, "state::get-lease", get.clone(), 0), Value::Null);
        acquire(&mut store, "A", 100, 0);
        assert_eq!(
            lease_op(&mut store, "state::get-lease", get.clone(), 50),
            json!({"owner": "A", "token": 1, "expires_at_ms": 100, "expired": false})
        );
        assert_eq!(
            lease_op(&mut store, "state::get-lease", get, 100),
            json!({"owner": "A", "token": 1, "expires_at_ms": 100, "expired": true})
        );
    }

    #[test]
    fn leases_are_listed_in_order() {
        let mut store = StateStore::new();
        for (scope, key) in [("b", "1"), ("a", "2"), ("a", "1")] {
            let payload = json!({"scope": scope, "key": key, "owner": "o", "ttl_ms": 10});
            lease_op(&mut store, "state::acquire-lease", payload, 0);
        }
        let order: Vec<_> = store.leases().into_iter().map(|l| (l.scope, l.key, l.token)).collect();
        assert_eq!(order, vec![("a".into(), "1".into(), 1), ("a".into(), "2".into(), 1), ("b".into(), "1".into(), 1)]);
    }

    #[test]
    fn a_fenced_write_with_a_stale_token_is_rejected() {
        let mut store = StateStore::new();
        acquire(&mut store, "A", 100, 0);
        acquire(&mut store, "B", 100, 100);
        let mut seen = Vec::new();
        let err = store.handle(at("state::set", &fenced_set(1), 101), &mut seen).unwrap_err();
        assert_eq!(err.code, "stale_token");
        assert_eq!(store.get("t", "k"), None, "nothing written");
        assert_eq!(fenced_observations(&seen), vec![(1, false)]);
        assert_eq!(commits(&seen), 0);
    }

    #[test]
    fn a_fenced_write_with_the_current_token_is_accepted_after_expiry() {
        let mut store = StateStore::new();
        acquire(&mut store, "A", 100, 0);
        let mut seen = Vec::new();
        let reply = store.handle(at("state::set", &fenced_set(1), 5000), &mut seen).unwrap();
        assert_eq!(reply, json!({"version": 1}));
        assert_eq!(store.get("t", "k"), Some(&json!(1)));
        assert_eq!(fenced_observations(&seen), vec![(1, true)]);
        assert_eq!(commits(&seen), 1);
        // A newer token is accepted too (it is not stale).
        acquire(&mut store, "B", 100, 5000);
        assert!(store.handle(at("state::set", &fenced_set(2), 5001), &mut seen).is_ok());
        // Once B holds token 2, A's token 1 is refused.
        let err = store.handle(at("state::set", &fenced_set(1), 5002), &mut seen).unwrap_err();
        assert_eq!(err.code, "stale_token");
        assert_eq!(store.get("t", "k"), Some(&json!(2)));
    }

    #[test]
    fn fenced_deletes_and_compare_and_sets_are_judged_too() {
        let mut store = StateStore::new();
        store.seed("t", "k", json!("v"));
        acquire(&mut store, "A", 100, 0);
        acquire(&mut store, "B", 100, 200);
        let fence = |token: u64| json!({"scope": "lease", "key": "s1", "token": token});

        let mut seen = Vec::new();
        let delete = json!({"scope": "t", "key": "k", "fence": fence(1)});
        let err = store.handle(at("state::delete", &delete, 201), &mut seen).unwrap_err();
        assert_eq!(err.code, "stale_token");
        let cas = json!({"scope": "t", "key": "k", "expected_version": 1, "value": "w", "fence": fence(1)});
        let err = store.handle(at("state::compare-and-set", &cas, 201), &mut seen).unwrap_err();
        assert_eq!(err.code, "stale_token");
        assert_eq!(store.get("t", "k"), Some(&json!("v")));
        assert_eq!(fenced_observations(&seen), vec![(1, false), (1, false)]);
        assert_eq!(commits(&seen), 0);

        // A current token past the fence, but on the wrong version: judged, nothing written.
        let mut seen = Vec::new();
        let wrong = json!({"scope": "t", "key": "k", "expected_version": 7, "value": "w", "fence": fence(2)});
        assert_eq!(
            store.handle(at("state::compare-and-set", &wrong, 202), &mut seen).unwrap(),
            json!({"swapped": false, "version": 1})
        );
        assert_eq!(fenced_observations(&seen), vec![(2, true)]);
        assert_eq!(commits(&seen), 0);

        let mut seen = Vec::new();
        let right = json!({"scope": "t", "key": "k", "expected_version": 1, "value": "w", "fence": fence(2)});
        assert_eq!(
            store.handle(at("state::compare-and-set", &right, 203), &mut seen).unwrap(),
            json!({"swapped": true, "version": 2})
        );
        let delete = json!({"scope": "t", "key": "k", "fence": fence(2)});
        assert_eq!(store.handle(at("state::delete", &delete, 204), &mut seen).unwrap(), json!({"deleted": true}));
        assert_eq!(fenced_observations(&seen), vec![(2, true), (2, true)]);
        assert_eq!(commits(&seen), 2);
    }

    #[test]
    fn a_fence_on_a_lease_never_granted_accepts_any_token() {
        let mut store = StateStore::new();
        let mut seen = Vec::new();
        store.handle(at("state::set", &fenced_set(0), 0), &mut seen).unwrap();
        assert_eq!(fenced_observations(&seen), vec![(0, true)]);
    }

    #[test]
    fn unfenced_writes_are_not_judged() {
        let mut store = StateStore::new();
        acquire(&mut store, "A", 100, 0);
        let mut seen = Vec::new();
        let set = json!({"scope": "t", "key": "k", "value": 1});
        store.handle(at("state::set", &set, 1), &mut seen).unwrap();
        assert_eq!(commits(&seen), 1);
        assert_eq!(seen.len(), 1);
    }

    #[test]
    fn malformed_lease_and_fence_payloads_are_bad_requests() {
        let mut store = StateStore::new();
        acquire(&mut store, "A", 100, 0);
        let mut seen = Vec::new();
        let malformed = [
            ("state::acquire-lease", json!({"scope": "l", "key": "k", "owner": "A"})),
            ("state::acquire-lease", json!({"scope": "l", "key": "k", "owner": "A", "ttl_ms": -5})),
            ("state::acquire-lease", json!({"scope": "l", "key": "k", "owner": 3, "ttl_ms": 5})),
            ("state::acquire-lease", json!("lease please")),
            ("state::renew-lease", json!({"scope": "lease", "key": "s1", "owner": "A", "token": "1", "ttl_ms": 5})),
            ("state::renew-lease", json!({"scope": "lease", "key": "s1", "owner": "A", "token": 1})),
            ("state::release-lease", json!({"scope": "lease", "key": "s1", "owner": "A"})),
            ("state::get-lease", json!({"scope": "lease"})),
            ("state::set", json!({"scope": "t", "key": "k", "fence": 1})),
            ("state::set", json!({"scope": "t", "key": "k", "fence": {"scope": "lease", "key": "s1"}})),
            ("state::set", json!({"scope": "t", "key": "k", "fence": {"scope": "lease", "key": "s1", "token": -1}})),
            ("state::delete", json!({"scope": "t", "key": "k", "fence": {"token": 1}})),
            ("state::compare-and-set", json!({"scope": "t", "key": "k", "expected_version": 0, "fence": "lease/s1"})),
            (
                "state::compare-and-set",
                json!({"scope": "t", "key": "k", "fence": {"scope": "lease", "key": "s1", "token": 1}}),
            ),
        ];
        for (function, payload) in malformed {
            let err = store.handle(at(function, &payload, 1), &mut seen).unwrap_err();
            assert_eq!(err.code, "bad_request", "{function} {payload}");
        }
        assert!(seen.is_empty(), "a malformed call observes nothing");
        assert_eq!(store.get("t", "k"), None);
        assert_eq!(store.lease("lease", "s1").unwrap().expires_at_ms, 100);
        assert_eq!(store.leases().len(), 1);
    }
}
