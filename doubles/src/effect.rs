//! Effect services: external services whose requests have effects a harness must not duplicate.
//!
//! Every effect service shares one core ([`EffectCore`]): it deduplicates by idempotency key for
//! a window, refuses requests carrying a fencing token older than the newest it knows for their
//! ownership domain, and writes one ledger line per effect request, accepted or not. The ticket
//! service is one such service with a fixed shape; [`EffectService`] is any other, declared by a
//! scenario (`[world.service.NAME]`): its name, its effect function, what it guarantees and what
//! it answers, plus plain functions with fixed answers (hooks, lifecycle observers).

use crate::service::{
    optional_object_field, optional_text_field, text_field, u64_field, Call, Double, EffectRecord, Observation,
    ServiceError,
};
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;

/// What an effect service guarantees against duplicate and stale requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Guarantees {
    /// A request repeating a remembered idempotency key returns the earlier effect.
    pub idempotency: bool,
    /// How long a key is remembered, from the first request with it.
    pub idempotency_window_ms: u64,
    /// Whether it offers lookup by client reference.
    pub lookup: bool,
    /// Whether it enforces fencing tokens.
    pub fencing: bool,
}

/// One effect request as it arrived: the fields every effect service reads.
#[derive(Debug, Clone, Copy)]
pub(crate) struct EffectRequest<'a> {
    pub action_id: &'a str,
    pub key: Option<&'a str>,
    pub reference: Option<&'a str>,
    /// The ownership domain and token it carries, if any.
    pub fencing: Option<(&'a str, u64)>,
}

impl<'a> EffectRequest<'a> {
    pub fn read(payload: &'a Value) -> Result<Self, ServiceError> {
        let action_id = text_field(payload, "action_id")?;
        let key = optional_text_field(payload, "idempotency_key")?;
        let reference = optional_text_field(payload, "client_reference")?;
        let fencing = match optional_object_field(payload, "fencing")? {
            None => None,
            Some(fencing) => {
                let field = |e: ServiceError| ServiceError::bad_request(format!("fencing: {}", e.message));
                Some((text_field(fencing, "domain").map_err(field)?, u64_field(fencing, "token").map_err(field)?))
            }
        };
        Ok(Self { action_id, key, reference, fencing })
    }
}

/// How the core judged an effect request that was not refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Admission {
    /// It makes a new effect, the service's `index`-th.
    New(usize),
    /// Its key is remembered: it repeats the `index`-th effect.
    Duplicate(usize),
}

/// An idempotency key the service remembers.
#[derive(Debug, Clone)]
struct KeyMemory {
    first_seen_ms: u64,
    /// Index of the effect it made.
    effect: usize,
}

/// What every effect service shares: the key memory, the fencing bar per ownership domain, and
/// the ledger line for each request.
#[derive(Debug, Default, Clone)]
pub(crate) struct EffectCore {
    keys: BTreeMap<String, KeyMemory>,
    /// The newest token known per ownership domain.
    tokens: BTreeMap<String, u64>,
}

impl EffectCore {
    /// Raises the fencing bar of `domain` to `token`; never lowers it.
    pub fn observe_token(&mut self, domain: &str, token: u64) {
        let latest = self.tokens.entry(domain.to_string()).or_insert(token);
        *latest = (*latest).max(token);
    }

    pub fn latest_token(&self, domain: &str) -> Option<u64> {
        self.tokens.get(domain).copied()
    }

    /// The effect a key maps to, if the key is remembered at `now_ms`.
    pub fn remembered(&self, key: &str, now_ms: u64, guarantees: &Guarantees) -> Option<usize> {
        if !guarantees.idempotency {
            return None;
        }
        self.keys
            .get(key)
            .filter(|m| now_ms.saturating_sub(m.first_seen_ms) < guarantees.idempotency_window_ms)
            .map(|m| m.effect)
    }

    /// Judges one effect request of kind `kind`, whose effect would be the service's `next`-th:
    /// a stale token is refused, a remembered key repeats the effect it made, anything else
    /// makes a new one (and its key is remembered). One ledger line either way.
    pub fn admit(
        &mut self,
        kind: &str,
        request: &EffectRequest<'_>,
        next: usize,
        now_ms: u64,
        guarantees: &Guarantees,
        observed: &mut Vec<Observation>,
    ) -> Result<Admission, ServiceError> {
        let mut ledger = |accepted: bool, reason: &str| {
            observed.push(Observation::Effect(EffectRecord {
                kind: kind.into(),
                action_id: request.action_id.into(),
                idempotency_key: request.key.map(Into::into),
                fencing_token: request.fencing.map(|(_, token)| token),
                fencing_domain: request.fencing.map(|(domain, _)| domain.to_string()),
                accepted,
                reason: reason.into(),
            }))
        };
        if let Some((domain, token)) = request.fencing {
            match self.latest_token(domain) {
                Some(latest) if guarantees.fencing && token < latest => {
                    ledger(false, "stale token");
                    return Err(ServiceError::new(
                        "stale_token",
                        format!("token {token} is older than token {latest} of {domain}"),
                    ));
                }
                _ => self.observe_token(domain, token),
            }
        }
        if let Some(existing) = request.key.and_then(|key| self.remembered(key, now_ms, guarantees)) {
            ledger(false, "duplicate key");
            return Ok(Admission::Duplicate(existing));
        }
        if let (true, Some(key)) = (guarantees.idempotency, request.key) {
            self.keys.insert(key.into(), KeyMemory { first_seen_ms: now_ms, effect: next });
        }
        ledger(true, "created");
        Ok(Admission::New(next))
    }
}

/// Whether a harness may run a tool again after an interruption (`replay: 'safe'` in the
/// durable-harness model) or must reconcile first.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Replay {
    Safe,
    #[default]
    Unsafe,
}

/// A service a scenario declares (`[world.service.NAME]`): an effect function with its
/// guarantees and answer, and plain functions with fixed answers. Every field is optional.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServiceConfig {
    /// The effect function's name after `NAME::`: its requests are effects, one ledger line
    /// each, of kind `NAME.EFFECT`; the harness offers it to the model as the tool `NAME.EFFECT`.
    pub effect: Option<String>,
    /// What the model is told the tool does.
    pub description: String,
    /// The JSON schema of the tool's arguments, as offered to the model.
    pub parameters: Value,
    /// What an effect request answers (an object gets `effect_id` and `duplicate` added).
    pub response: Value,
    pub idempotency: bool,
    pub idempotency_window_ms: u64,
    /// Offer `NAME::lookup` by client reference.
    pub lookup: bool,
    pub fencing: bool,
    pub replay: Replay,
    /// Plain functions by their name after `NAME::`, each with the answer it always gives.
    pub functions: BTreeMap<String, Value>,
}

impl Default for ServiceConfig {
    fn default() -> Self {
        Self {
            effect: None,
            description: String::new(),
            parameters: json!({ "type": "object" }),
            response: json!({}),
            idempotency: true,
            idempotency_window_ms: 86_400_000,
            lookup: true,
            fencing: true,
            replay: Replay::Unsafe,
            functions: BTreeMap::new(),
        }
    }
}

/// The reconciliation functions of an effect service named `name`: by idempotency key, and by
/// client reference, with the payload field naming the action.
pub fn reconcile_functions(name: &str) -> [(String, &'static str); 2] {
    [(format!("{name}::status"), "idempotency_key"), (format!("{name}::lookup"), "client_reference")]
}

impl ServiceConfig {
    pub fn guarantees(&self) -> Guarantees {
        Guarantees {
            idempotency: self.idempotency,
            idempotency_window_ms: self.idempotency_window_ms,
            lookup: self.lookup,
            fencing: self.fencing,
        }
    }

    /// The effect function of the service `name` (`recorder::record`), if it has one.
    pub fn effect_function(&self, name: &str) -> Option<String> {
        self.effect.as_ref().map(|effect| format!("{name}::{effect}"))
    }

    /// The kind of effect it produces, as the ledger names it (`recorder.record`), and the name of
    /// the tool the harness offers for it.
    pub fn effect_kind(&self, name: &str) -> Option<String> {
        self.effect.as_ref().map(|effect| format!("{name}.{effect}"))
    }

    /// Every function the service `name` serves: the effect function with its reconciliation
    /// functions, then the plain functions.
    pub fn functions(&self, name: &str) -> Vec<String> {
        let mut functions = Vec::new();
        if let Some(effect) = self.effect_function(name) {
            functions.push(effect);
            functions.extend(reconcile_functions(name).map(|(function, _)| function));
        }
        functions.extend(self.functions.keys().map(|f| format!("{name}::{f}")));
        functions
    }
}

/// An effect the service made, in the order it made them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Effect {
    /// `NAME-1`, `NAME-2`, ... in order.
    pub effect_id: String,
    pub action_id: String,
    pub client_reference: Option<String>,
    /// The arguments the request carried.
    pub args: Value,
    pub at_ms: u64,
}

/// A service a scenario declared: see [`ServiceConfig`].
#[derive(Debug, Clone)]
pub struct EffectService {
    name: String,
    config: ServiceConfig,
    effects: Vec<Effect>,
    core: EffectCore,
}

impl EffectService {
    pub fn new(name: &str, config: ServiceConfig) -> Self {
        Self { name: name.to_string(), config, effects: Vec::new(), core: EffectCore::default() }
    }

    /// Every effect made, oldest first.
    pub fn effects(&self) -> &[Effect] {
        &self.effects
    }

    /// The declared answer with what the service adds to it.
    fn answer(&self, effect: &Effect, extra: Value) -> Value {
        let mut fields = match &self.config.response {
            Value::Object(fields) => fields.clone(),
            Value::Null => Map::new(),
            other => Map::from_iter([("value".to_string(), other.clone())]),
        };
        fields.insert("effect_id".into(), json!(effect.effect_id));
        if let Value::Object(extra) = extra {
            fields.extend(extra);
        }
        Value::Object(fields)
    }

    fn request(&mut self, call: Call<'_>, observed: &mut Vec<Observation>) -> Result<Value, ServiceError> {
        let request = EffectRequest::read(call.payload)?;
        let kind = self.config.effect_kind(&self.name).unwrap_or_default();
        let guarantees = self.config.guarantees();
        match self.core.admit(&kind, &request, self.effects.len(), call.now_ms, &guarantees, observed)? {
            Admission::Duplicate(index) => Ok(self.answer(&self.effects[index], json!({ "duplicate": true }))),
            Admission::New(index) => {
                self.effects.push(Effect {
                    effect_id: format!("{}-{}", self.name, index + 1),
                    action_id: request.action_id.into(),
                    client_reference: request.reference.map(Into::into),
                    args: call.payload.get("args").cloned().unwrap_or(Value::Null),
                    at_ms: call.now_ms,
                });
                Ok(self.answer(&self.effects[index], json!({ "duplicate": false })))
            }
        }
    }

    fn status(&self, call: Call<'_>) -> Result<Value, ServiceError> {
        if !self.config.idempotency {
            return Err(ServiceError::new("not_supported", "this service does not honour idempotency keys"));
        }
        let key = text_field(call.payload, "idempotency_key")?;
        Ok(match self.core.remembered(key, call.now_ms, &self.config.guarantees()) {
            Some(index) => self.answer(&self.effects[index], json!({ "known": true })),
            None => json!({ "known": false }),
        })
    }

    fn lookup(&self, call: Call<'_>) -> Result<Value, ServiceError> {
        if !self.config.lookup {
            return Err(ServiceError::new("not_supported", "this service offers no lookup by client reference"));
        }
        let reference = text_field(call.payload, "client_reference")?;
        Ok(match self.effects.iter().find(|e| e.client_reference.as_deref() == Some(reference)) {
            Some(effect) => self.answer(effect, json!({ "found": true })),
            None => json!({ "found": false }),
        })
    }
}

impl Double for EffectService {
    fn name(&self) -> &str {
        &self.name
    }

    fn functions(&self) -> Vec<String> {
        self.config.functions(&self.name)
    }

    fn observe_grant(&mut self, domain: &str, token: u64) {
        self.core.observe_token(domain, token);
    }

    fn handle(&mut self, call: Call<'_>, observed: &mut Vec<Observation>) -> Result<Value, ServiceError> {
        let name = call.function.strip_prefix(&format!("{}::", self.name)).unwrap_or_default();
        if self.config.effect.as_deref() == Some(name) {
            return self.request(call, observed);
        }
        match (name, self.config.effect.is_some()) {
            ("status", true) => self.status(call),
            ("lookup", true) => self.lookup(call),
            _ => match self.config.functions.get(name) {
                Some(answer) => Ok(answer.clone()),
                None => Err(ServiceError::new("function_not_found", call.function)),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn recorder() -> EffectService {
        let config = ServiceConfig {
            effect: Some("record".into()),
            response: json!({ "content": [{ "type": "text", "text": "recorded" }], "is_error": false }),
            functions: [("gate".to_string(), json!({ "decision": "hold" }))].into(),
            ..ServiceConfig::default()
        };
        EffectService::new("recorder", config)
    }

    fn at(
        service: &mut EffectService,
        now_ms: u64,
        function: &str,
        payload: Value,
    ) -> (Result<Value, ServiceError>, Vec<Observation>) {
        let mut seen = Vec::new();
        let reply = service.handle(Call::new(function, &payload, now_ms), &mut seen);
        (reply, seen)
    }

    #[test]
    fn a_declared_service_serves_its_effect_reconciliation_and_plain_functions() {
        let mut service = recorder();
        assert_eq!(
            service.functions(),
            vec!["recorder::record", "recorder::status", "recorder::lookup", "recorder::gate"]
        );
        let request = json!({ "action_id": "a1", "idempotency_key": "k1", "client_reference": "a1", "args": { "value": "expected" } });
        let (first, seen) = at(&mut service, 0, "recorder::record", request.clone());
        let first = first.unwrap();
        assert_eq!((first["effect_id"].clone(), first["duplicate"].clone()), (json!("recorder-1"), json!(false)));
        assert_eq!(first["content"][0]["text"], json!("recorded"));
        assert!(matches!(&seen[..], [Observation::Effect(e)] if e.kind == "recorder.record" && e.accepted));
        let (again, seen) = at(&mut service, 5, "recorder::record", request);
        assert_eq!(again.unwrap()["duplicate"], json!(true));
        assert!(matches!(&seen[..], [Observation::Effect(e)] if !e.accepted && e.reason == "duplicate key"));
        assert_eq!(service.effects().len(), 1);
        assert_eq!(service.effects()[0].args, json!({ "value": "expected" }));
        let (known, _) = at(&mut service, 6, "recorder::status", json!({ "idempotency_key": "k1" }));
        assert_eq!(known.unwrap()["known"], json!(true));
        let (found, _) = at(&mut service, 6, "recorder::lookup", json!({ "client_reference": "a1" }));
        let found = found.unwrap();
        assert_eq!((found["found"].clone(), found["is_error"].clone()), (json!(true), json!(false)));
        let (gate, seen) = at(&mut service, 7, "recorder::gate", json!({ "call": {} }));
        assert_eq!((gate.unwrap(), seen.len()), (json!({ "decision": "hold" }), 0), "plain functions are no effects");
        let (missing, _) = at(&mut service, 7, "recorder::other", json!({}));
        assert_eq!(missing.unwrap_err().code, "function_not_found");
    }

    #[test]
    fn a_grant_the_store_made_raises_the_bar_before_any_request_carries_it() {
        let mut service = recorder();
        assert_eq!(service.name(), "recorder");
        let request = |token: u64| json!({ "action_id": "a1", "idempotency_key": format!("k{token}"), "fencing": { "domain": "lease/s1", "token": token } });
        assert!(at(&mut service, 0, "recorder::record", request(1)).0.is_ok());
        // The replacement's lease (token 2) is granted; the stale worker's next request, with
        // token 1, comes before any request carrying token 2.
        service.observe_grant("lease/s1", 2);
        let (stale, seen) = at(&mut service, 1, "recorder::record", request(1));
        assert_eq!(stale.unwrap_err().code, "stale_token");
        assert!(matches!(&seen[..], [Observation::Effect(e)] if !e.accepted && e.reason == "stale token"));
        assert!(at(&mut service, 2, "recorder::record", request(2)).0.is_ok());
    }

    #[test]
    fn declared_settings_read_from_partial_tables() {
        let config: ServiceConfig =
            serde_json::from_value(json!({ "effect": "record", "lookup": false, "replay": "safe" })).unwrap();
        assert_eq!(config.replay, Replay::Safe);
        assert!(config.idempotency && !config.lookup);
        assert!(serde_json::from_value::<ServiceConfig>(json!({ "efect": "record" })).is_err());
        let plain = ServiceConfig { functions: [("ping".to_string(), json!(1))].into(), ..ServiceConfig::default() };
        assert_eq!(plain.functions("observer"), vec!["observer::ping"], "no effect, no reconciliation functions");
    }
}
