use crate::effect::{Admission, EffectCore, EffectRequest, Guarantees};
use crate::service::{optional_text_field, text_field, Call, Double, Observation, ServiceError};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

/// How a ticket service protects (or fails to protect) against duplicate and stale requests.
/// Read from a scenario's `[world.tickets]` table; every field is optional.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TicketConfig {
    /// Honour idempotency keys: a create repeating a remembered key returns the existing
    /// ticket instead of creating another.
    pub idempotency: bool,
    /// How long a key is remembered, measured from the first request with that key.
    pub idempotency_window_ms: u64,
    /// Offer `ticket::lookup` by client reference.
    pub lookup: bool,
    /// Enforce fencing tokens; `false` models a service that ignores them.
    pub fencing: bool,
}

impl Default for TicketConfig {
    fn default() -> Self {
        Self { idempotency: true, idempotency_window_ms: 86_400_000, lookup: true, fencing: true }
    }
}

impl TicketConfig {
    pub fn guarantees(&self) -> Guarantees {
        Guarantees {
            idempotency: self.idempotency,
            idempotency_window_ms: self.idempotency_window_ms,
            lookup: self.lookup,
            fencing: self.fencing,
        }
    }
}

/// A ticket the service created, in creation order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ticket {
    /// `T-1`, `T-2`, ... in creation order.
    pub ticket_id: String,
    pub action_id: String,
    pub idempotency_key: Option<String>,
    pub client_reference: Option<String>,
    /// The ownership domain and token the creating request carried, if any.
    pub fencing: Option<(String, u64)>,
    pub title: Option<String>,
    pub created_at_ms: u64,
}

/// An external ticketing service: the kind of effect a harness must not duplicate.
///
/// Depending on its [`TicketConfig`] it deduplicates by idempotency key (for a window),
/// offers lookup by client reference, and rejects requests whose fencing token is older than
/// the newest it has accepted or been told about for that ownership domain (the effect
/// services' shared core). Every create request lands in the effect ledger as one
/// [`Observation::Effect`], rejected ones included.
#[derive(Debug, Default, Clone)]
pub struct TicketService {
    config: TicketConfig,
    tickets: Vec<Ticket>,
    core: EffectCore,
}

impl TicketService {
    pub const FUNCTIONS: &'static [&'static str] = &["ticket::create", "ticket::lookup", "ticket::status"];
    /// The request that produces an external effect (one ledger line each).
    pub const EFFECT_FUNCTION: &'static str = "ticket::create";
    /// The kind of effect it produces, as the ledger names it.
    pub const EFFECT_KIND: &'static str = "ticket.create";
    /// Reconciliation requests, with the field that names the action they ask about.
    pub const RECONCILE_FUNCTIONS: [(&'static str, &'static str); 2] =
        [("ticket::status", "idempotency_key"), ("ticket::lookup", "client_reference")];

    pub fn new(config: TicketConfig) -> Self {
        Self { config, ..Self::default() }
    }

    pub fn config(&self) -> &TicketConfig {
        &self.config
    }

    /// Every ticket created, oldest first.
    pub fn tickets(&self) -> &[Ticket] {
        &self.tickets
    }

    /// Tells the service that `token` exists for `domain` (e.g. a lease was granted in the
    /// store), raising the bar a fenced create must reach. Never lowers it.
    pub fn observe_token(&mut self, domain: &str, token: u64) {
        self.core.observe_token(domain, token);
    }

    /// The newest token the service knows for `domain`, accepted or observed.
    pub fn latest_token(&self, domain: &str) -> Option<u64> {
        self.core.latest_token(domain)
    }

    /// The ticket a key maps to, if the key is remembered at `now_ms`.
    fn remembered(&self, key: &str, now_ms: u64) -> Option<&Ticket> {
        self.core.remembered(key, now_ms, &self.config.guarantees()).map(|index| &self.tickets[index])
    }

    fn create(&mut self, payload: &Value, now_ms: u64, observed: &mut Vec<Observation>) -> Result<Value, ServiceError> {
        let request = EffectRequest::read(payload)?;
        // The title, where a harness sends it: at the top, or among the tool's arguments.
        let title = match optional_text_field(payload, "title")? {
            Some(title) => Some(title),
            None => payload.get("args").map(|args| optional_text_field(args, "title")).transpose()?.flatten(),
        };
        let guarantees = self.config.guarantees();
        match self.core.admit(Self::EFFECT_KIND, &request, self.tickets.len(), now_ms, &guarantees, observed)? {
            Admission::Duplicate(index) => Ok(json!({ "ticket_id": self.tickets[index].ticket_id, "duplicate": true })),
            Admission::New(index) => {
                let ticket_id = format!("T-{}", index + 1);
                self.tickets.push(Ticket {
                    ticket_id: ticket_id.clone(),
                    action_id: request.action_id.into(),
                    idempotency_key: request.key.map(Into::into),
                    client_reference: request.reference.map(Into::into),
                    fencing: request.fencing.map(|(domain, token)| (domain.into(), token)),
                    title: title.map(Into::into),
                    created_at_ms: now_ms,
                });
                Ok(json!({ "ticket_id": ticket_id, "duplicate": false }))
            }
        }
    }

    fn lookup(&self, payload: &Value) -> Result<Value, ServiceError> {
        if !self.config.lookup {
            return Err(ServiceError::new("not_supported", "this service offers no lookup by client reference"));
        }
        let reference = text_field(payload, "client_reference")?;
        Ok(match self.tickets.iter().find(|t| t.client_reference.as_deref() == Some(reference)) {
            Some(ticket) => json!({ "found": true, "ticket_id": ticket.ticket_id }),
            None => json!({ "found": false }),
        })
    }

    fn status(&self, payload: &Value, now_ms: u64) -> Result<Value, ServiceError> {
        if !self.config.idempotency {
            return Err(ServiceError::new("not_supported", "this service does not honour idempotency keys"));
        }
        let key = text_field(payload, "idempotency_key")?;
        Ok(match self.remembered(key, now_ms) {
            Some(ticket) => json!({ "known": true, "ticket_id": ticket.ticket_id }),
            None => json!({ "known": false }),
        })
    }
}

impl Double for TicketService {
    fn name(&self) -> &str {
        "tickets"
    }

    fn functions(&self) -> Vec<String> {
        crate::service::owned(Self::FUNCTIONS)
    }

    fn observe_grant(&mut self, domain: &str, token: u64) {
        self.observe_token(domain, token);
    }

    fn handle(&mut self, call: Call<'_>, observed: &mut Vec<Observation>) -> Result<Value, ServiceError> {
        match call.function {
            "ticket::create" => self.create(call.payload, call.now_ms, observed),
            "ticket::lookup" => self.lookup(call.payload),
            "ticket::status" => self.status(call.payload, call.now_ms),
            other => Err(ServiceError::new("function_not_found", other)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::service::EffectRecord;

    const HOUR: u64 = 3_600_000;

    fn at(
        service: &mut TicketService,
        now_ms: u64,
        function: &str,
        payload: Value,
        seen: &mut Vec<Observation>,
    ) -> Result<Value, ServiceError> {
        service.handle(Call::new(function, &payload, now_ms), seen)
    }

    fn effects(seen: &[Observation]) -> Vec<&EffectRecord> {
        seen.iter()
            .map(|o| match o {
                Observation::Effect(e) => e,
                other => panic!("a ticket service observed {other:?}"),
            })
            .collect()
    }

    fn create(action: &str, key: &str) -> Value {
        json!({"action_id": action, "idempotency_key": key, "client_reference": action})
    }

    fn fenced(action: &str, key: &str, domain: &str, token: u64) -> Value {
        json!({
            "action_id": action,
            "idempotency_key": key,
            "fencing": {"domain": domain, "token": token},
        })
    }

    #[test]
    fn default_config_is_the_protective_one() {
        assert_eq!(
            TicketConfig::default(),
            TicketConfig { idempotency: true, idempotency_window_ms: 86_400_000, lookup: true, fencing: true }
        );
        let service = TicketService::default();
        assert_eq!(service.config(), &TicketConfig::default());
        assert_eq!(service.name(), "tickets");
        assert_eq!(service.functions(), vec!["ticket::create", "ticket::lookup", "ticket::status"]);
    }

    #[test]
    fn config_reads_partial_tables_and_refuses_unknown_fields() {
        let partial: TicketConfig =
            serde_json::from_value(json!({"idempotency_window_ms": 1000, "lookup": false})).unwrap();
        assert_eq!(
            partial,
            TicketConfig { idempotency: true, idempotency_window_ms: 1000, lookup: false, fencing: true }
        );
        let empty: TicketConfig = serde_json::from_value(json!({})).unwrap();
        assert_eq!(empty, TicketConfig::default());
        assert!(serde_json::from_value::<TicketConfig>(json!({"idempotent": true})).is_err());
    }

    #[test]
    fn a_retry_within_the_window_returns_the_first_ticket() {
        let mut service = TicketService::default();
        let mut seen = Vec::new();
        let first = at(&mut service, 0, "ticket::create", create("a1", "k1"), &mut seen);
        assert_eq!(first.unwrap(), json!({"ticket_id": "T-1", "duplicate": false}));
        let retry = at(&mut service, HOUR, "ticket::create", create("a1", "k1"), &mut seen);
        assert_eq!(retry.unwrap(), json!({"ticket_id": "T-1", "duplicate": true}));
        assert_eq!(service.tickets().len(), 1);

        let ledger = effects(&seen);
        assert_eq!(ledger.len(), 2, "one ledger line per create request");
        assert_eq!(
            *ledger[0],
            EffectRecord {
                kind: "ticket.create".into(),
                action_id: "a1".into(),
                idempotency_key: Some("k1".into()),
                fencing_token: None,
                fencing_domain: None,
                accepted: true,
                reason: "created".into(),
            }
        );
        assert!(!ledger[1].accepted);
        assert_eq!(ledger[1].reason, "duplicate key");
        assert_eq!(ledger[1].idempotency_key.as_deref(), Some("k1"));
    }

    #[test]
    fn a_retry_after_the_window_creates_a_second_ticket() {
        let window = 100;
        let mut service = TicketService::new(TicketConfig { idempotency_window_ms: window, ..TicketConfig::default() });
        let mut seen = Vec::new();
        at(&mut service, 1000, "ticket::create", create("a1", "k1"), &mut seen).unwrap();
        // A duplicate inside the window does not extend it: the window runs from the first.
        let dup = at(&mut service, 1099, "ticket::create", create("a1", "k1"), &mut seen);
        assert_eq!(dup.unwrap()["duplicate"], json!(true));
        let late = at(&mut service, 1100, "ticket::create", create("a1", "k1"), &mut seen);
        assert_eq!(late.unwrap(), json!({"ticket_id": "T-2", "duplicate": false}));
        assert_eq!(service.tickets().len(), 2);
        let ledger = effects(&seen);
        assert_eq!(ledger.iter().map(|e| e.accepted).collect::<Vec<_>>(), vec![true, false, true]);
        // The key is remembered again, from the second ticket's creation.
        let again = at(&mut service, 1150, "ticket::create", create("a1", "k1"), &mut seen);
        assert_eq!(again.unwrap(), json!({"ticket_id": "T-2", "duplicate": true}));
    }

    #[test]
    fn status_reports_keys_only_while_remembered() {
        let mut service = TicketService::new(TicketConfig { idempotency_window_ms: 100, ..TicketConfig::default() });
        let mut seen = Vec::new();
        let status = json!({"idempotency_key": "k1"});
        let before = at(&mut service, 0, "ticket::status", status.clone(), &mut seen);
        assert_eq!(before.unwrap(), json!({"known": false}));
        at(&mut service, 10, "ticket::create", create("a1", "k1"), &mut seen).unwrap();
        let within = at(&mut service, 109, "ticket::status", status.clone(), &mut seen);
        assert_eq!(within.unwrap(), json!({"known": true, "ticket_id": "T-1"}));
        let after = at(&mut service, 110, "ticket::status", status, &mut seen);
        assert_eq!(after.unwrap(), json!({"known": false}));
        assert_eq!(seen.len(), 1, "status and lookup are not effects");
    }

    #[test]
    fn without_idempotency_a_retry_duplicates_and_status_is_unsupported() {
        let mut service = TicketService::new(TicketConfig { idempotency: false, ..TicketConfig::default() });
        let mut seen = Vec::new();
        let first = at(&mut service, 0, "ticket::create", create("a1", "k1"), &mut seen);
        let retry = at(&mut service, 1, "ticket::create", create("a1", "k1"), &mut seen);
        assert_eq!(first.unwrap(), json!({"ticket_id": "T-1", "duplicate": false}));
        assert_eq!(retry.unwrap(), json!({"ticket_id": "T-2", "duplicate": false}));
        assert_eq!(service.tickets().len(), 2);
        assert!(effects(&seen).iter().all(|e| e.accepted && e.reason == "created"));
        let status = at(&mut service, 2, "ticket::status", json!({"idempotency_key": "k1"}), &mut seen);
        assert_eq!(status.unwrap_err().code, "not_supported");
        // Lookup still finds the first ticket made for the reference.
        let found = at(&mut service, 3, "ticket::lookup", json!({"client_reference": "a1"}), &mut seen);
        assert_eq!(found.unwrap(), json!({"found": true, "ticket_id": "T-1"}));
    }

    #[test]
    fn lookup_by_client_reference_when_offered() {
        let mut service = TicketService::default();
        let mut seen = Vec::new();
        at(&mut service, 0, "ticket::create", create("a1", "k1"), &mut seen).unwrap();
        at(&mut service, 0, "ticket::create", create("a2", "k2"), &mut seen).unwrap();
        let found = at(&mut service, 5, "ticket::lookup", json!({"client_reference": "a2"}), &mut seen);
        assert_eq!(found.unwrap(), json!({"found": true, "ticket_id": "T-2"}));
        let missing = at(&mut service, 5, "ticket::lookup", json!({"client_reference": "a3"}), &mut seen);
        assert_eq!(missing.unwrap(), json!({"found": false}));

        let mut blind = TicketService::new(TicketConfig { lookup: false, ..TicketConfig::default() });
        at(&mut blind, 0, "ticket::create", create("a1", "k1"), &mut seen).unwrap();
        let refused = at(&mut blind, 5, "ticket::lookup", json!({"client_reference": "a1"}), &mut seen);
        assert_eq!(refused.unwrap_err().code, "not_supported");
    }

    #[test]
    fn a_stale_token_is_rejected_and_ledgered() {
        let mut service = TicketService::default();
        let mut seen = Vec::new();
        at(&mut service, 0, "ticket::create", fenced("a1", "k1", "s/1", 18), &mut seen).unwrap();
        let stale = at(&mut service, 1, "ticket::create", fenced("a2", "k2", "s/1", 17), &mut seen);
        assert_eq!(stale.unwrap_err().code, "stale_token");
        assert_eq!(service.tickets().len(), 1, "no ticket for a stale token");
        let ledger = effects(&seen);
        assert_eq!(
            *ledger[1],
            EffectRecord {
                kind: "ticket.create".into(),
                action_id: "a2".into(),
                idempotency_key: Some("k2".into()),
                fencing_token: Some(17),
                fencing_domain: Some("s/1".into()),
                accepted: false,
                reason: "stale token".into(),
            }
        );
        // The rejected key was not remembered: a current request with it creates.
        let current = at(&mut service, 2, "ticket::create", fenced("a2", "k2", "s/1", 18), &mut seen);
        assert_eq!(current.unwrap(), json!({"ticket_id": "T-2", "duplicate": false}));
        // Other domains have their own bar.
        let other = at(&mut service, 3, "ticket::create", fenced("a3", "k3", "s/2", 1), &mut seen);
        assert_eq!(other.unwrap()["duplicate"], json!(false));
        // A newer token raises the bar.
        at(&mut service, 4, "ticket::create", fenced("a4", "k4", "s/1", 19), &mut seen).unwrap();
        assert_eq!(service.latest_token("s/1"), Some(19));
        let was_current = at(&mut service, 5, "ticket::create", fenced("a5", "k5", "s/1", 18), &mut seen);
        assert_eq!(was_current.unwrap_err().code, "stale_token");
    }

    #[test]
    fn a_stale_token_is_rejected_before_the_duplicate_check() {
        let mut service = TicketService::default();
        let mut seen = Vec::new();
        at(&mut service, 0, "ticket::create", fenced("a1", "k1", "s/1", 5), &mut seen).unwrap();
        let stale = at(&mut service, 1, "ticket::create", fenced("a1", "k1", "s/1", 4), &mut seen);
        assert_eq!(stale.unwrap_err().code, "stale_token");
        assert_eq!(effects(&seen)[1].reason, "stale token");
    }

    #[test]
    fn an_observed_token_raises_the_bar_without_a_create() {
        let mut service = TicketService::default();
        let mut seen = Vec::new();
        service.observe_token("s/1", 18);
        service.observe_token("s/1", 3);
        assert_eq!(service.latest_token("s/1"), Some(18), "never lowered");
        let stale = at(&mut service, 0, "ticket::create", fenced("a1", "k1", "s/1", 17), &mut seen);
        assert_eq!(stale.unwrap_err().code, "stale_token");
        let current = at(&mut service, 0, "ticket::create", fenced("a1", "k1", "s/1", 18), &mut seen);
        assert_eq!(current.unwrap()["ticket_id"], json!("T-1"));
        assert_eq!(service.tickets().len(), 1);
        // A lease grant the rig tells the service of (as a double) raises the bar the same way.
        Double::observe_grant(&mut service, "s/1", 19);
        let stale = at(&mut service, 0, "ticket::create", fenced("a2", "k2", "s/1", 18), &mut seen);
        assert_eq!(stale.unwrap_err().code, "stale_token");
    }

    #[test]
    fn a_service_answers_with_the_config_it_was_built_with() {
        let config = TicketConfig { idempotency: false, idempotency_window_ms: 5, lookup: false, fencing: false };
        assert_eq!(TicketService::new(config.clone()).config(), &config);
    }

    #[test]
    fn without_fencing_a_stale_token_is_accepted_and_ledgered_as_accepted() {
        let mut service = TicketService::new(TicketConfig { fencing: false, ..TicketConfig::default() });
        let mut seen = Vec::new();
        service.observe_token("s/1", 18);
        let stale = at(&mut service, 0, "ticket::create", fenced("a1", "k1", "s/1", 17), &mut seen);
        assert_eq!(stale.unwrap(), json!({"ticket_id": "T-1", "duplicate": false}));
        let ledger = effects(&seen);
        assert_eq!(ledger.len(), 1);
        assert!(ledger[0].accepted);
        assert_eq!(ledger[0].fencing_token, Some(17));
        assert_eq!(ledger[0].reason, "created");
    }

    #[test]
    fn tickets_are_listed_in_creation_order_with_their_request() {
        let mut service = TicketService::default();
        let mut seen = Vec::new();
        at(
            &mut service,
            7,
            "ticket::create",
            json!({
                "action_id": "a1",
                "idempotency_key": "k1",
                "client_reference": "ref-1",
                "fencing": {"domain": "s/1", "token": 2},
                "title": "disk full",
            }),
            &mut seen,
        )
        .unwrap();
        at(&mut service, 9, "ticket::create", json!({"action_id": "a2"}), &mut seen).unwrap();
        assert_eq!(
            service.tickets(),
            &[
                Ticket {
                    ticket_id: "T-1".into(),
                    action_id: "a1".into(),
                    idempotency_key: Some("k1".into()),
                    client_reference: Some("ref-1".into()),
                    fencing: Some(("s/1".into(), 2)),
                    title: Some("disk full".into()),
                    created_at_ms: 7,
                },
                Ticket {
                    ticket_id: "T-2".into(),
                    action_id: "a2".into(),
                    idempotency_key: None,
                    client_reference: None,
                    fencing: None,
                    title: None,
                    created_at_ms: 9,
                },
            ]
        );
        // Without a key there is nothing to deduplicate by.
        let again = at(&mut service, 10, "ticket::create", json!({"action_id": "a2"}), &mut seen);
        assert_eq!(again.unwrap()["ticket_id"], json!("T-3"));
    }

    #[test]
    fn malformed_requests_are_bad_requests_and_not_ledgered() {
        let mut service = TicketService::default();
        let mut seen = Vec::new();
        let malformed = [
            ("ticket::create", json!({})),
            ("ticket::create", json!(null)),
            ("ticket::create", json!([1, 2])),
            ("ticket::create", json!({"action_id": 7})),
            ("ticket::create", json!({"action_id": "a", "idempotency_key": 7})),
            ("ticket::create", json!({"action_id": "a", "client_reference": []})),
            ("ticket::create", json!({"action_id": "a", "title": {}})),
            ("ticket::create", json!({"action_id": "a", "fencing": 3})),
            ("ticket::create", json!({"action_id": "a", "fencing": {"token": 3}})),
            ("ticket::create", json!({"action_id": "a", "fencing": {"domain": "d"}})),
            ("ticket::create", json!({"action_id": "a", "fencing": {"domain": "d", "token": -1}})),
            ("ticket::create", json!({"action_id": "a", "fencing": {"domain": "d", "token": "18"}})),
            ("ticket::create", json!({"action_id": "a", "fencing": {"domain": "d", "token": 1.5}})),
            ("ticket::lookup", json!({})),
            ("ticket::lookup", json!({"client_reference": 1})),
            ("ticket::status", json!({})),
            ("ticket::status", json!({"idempotency_key": false})),
        ];
        for (function, payload) in malformed {
            let err = at(&mut service, 0, function, payload.clone(), &mut seen).unwrap_err();
            assert_eq!(err.code, "bad_request", "{function} {payload}");
        }
        assert!(seen.is_empty());
        assert!(service.tickets().is_empty());
        assert_eq!(service.latest_token("d"), None);
        let unknown = at(&mut service, 0, "ticket::delete", json!({}), &mut seen);
        assert_eq!(unknown.unwrap_err().code, "function_not_found");
        // Null optional fields are absent fields.
        let nulls = json!({
            "action_id": "a",
            "idempotency_key": null,
            "client_reference": null,
            "fencing": null,
            "title": null,
        });
        assert_eq!(
            at(&mut service, 0, "ticket::create", nulls, &mut seen).unwrap(),
            json!({"ticket_id": "T-1", "duplicate": false})
        );
    }
}
