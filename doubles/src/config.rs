//! The configuration service: versioned agent configurations, the production pointer, and the
//! safety overlay.
//!
//! Each version is immutable: a system prompt, a tool catalogue (the tools it offers the
//! model, under a catalogue version), a policy and a model profile. The production pointer
//! names the version a new run pins; moving it (`config::promote`) changes nothing for a run
//! already pinned. The safety overlay is apart from every version and binds every run at its
//! next safe point, pinned or not: a revoked tool, and the tools of a withdrawn service, may no
//! longer be offered or called. Every change of the overlay raises its version.
//!
//! Harness-facing: `config::resolve` (the production pointer and its version), `config::get
//! {version}`, `config::overlay {session_id?, turn_id?}`. Operator-facing, as a release tool
//! or an incident responder would call them: `config::promote {version, expected?}`,
//! `config::revoke {tool, reason}`, `config::withdraw {service, reason}`. Each change is noted
//! (`config_promoted`, `overlay_changed` with the whole overlay), so the rig knows what every
//! later read was answered.

use crate::service::{optional_text_field, text_field, Call, Double, Observation, ServiceError};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::collections::BTreeMap;

/// One immutable configuration version.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigVersion {
    pub system_prompt: String,
    /// The tools it offers the model, by name (`ticket.create`).
    pub tools: Vec<String>,
    /// The version of that tool catalogue.
    #[serde(default = "default_catalogue")]
    pub tool_catalogue: String,
    #[serde(default = "default_policy")]
    pub policy: String,
    #[serde(default = "default_model_profile")]
    pub model_profile: String,
}

fn default_catalogue() -> String {
    "tools-1".into()
}

fn default_policy() -> String {
    "policy-1".into()
}

fn default_model_profile() -> String {
    "default".into()
}

/// `[world.config]`: the versions and where the production pointer starts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigSettings {
    /// The version production points at when the run starts.
    pub production: String,
    pub versions: BTreeMap<String, ConfigVersion>,
}

/// The configuration service's state.
#[derive(Debug, Clone)]
pub struct ConfigService {
    settings: ConfigSettings,
    production: String,
    /// How often the pointer moved: a promotion may name the move it expects to follow.
    promotions: u64,
    overlay_version: u64,
    /// Revoked tools, with why.
    revoked: BTreeMap<String, String>,
    /// Withdrawn services, with why.
    withdrawn: BTreeMap<String, String>,
    /// Which service offers each tool of the world.
    services_of_tools: BTreeMap<String, String>,
}

impl ConfigService {
    pub const FUNCTIONS: &'static [&'static str] =
        &["config::resolve", "config::get", "config::overlay", "config::promote", "config::revoke", "config::withdraw"];

    /// The service, knowing which service of the world offers each tool (a withdrawal takes
    /// all of a service's tools away).
    pub fn new(settings: ConfigSettings, services_of_tools: BTreeMap<String, String>) -> Self {
        Self {
            production: settings.production.clone(),
            settings,
            promotions: 0,
            overlay_version: 0,
            revoked: BTreeMap::new(),
            withdrawn: BTreeMap::new(),
            services_of_tools,
        }
    }

    /// A version as the harness reads it.
    fn manifest(&self, version: &str) -> Result<Value, ServiceError> {
        let config = self
            .settings
            .versions
            .get(version)
            .ok_or_else(|| ServiceError::new("not_found", format!("no configuration version `{version}`")))?;
        Ok(json!({
            "version": version, "system_prompt": config.system_prompt, "tools": config.tools,
            "tool_catalogue": config.tool_catalogue, "policy": config.policy, "model_profile": config.model_profile,
        }))
    }

    /// The overlay as the harness reads it: its version, the revoked tools, the withdrawn
    /// services with their tools, and every tool it takes away.
    pub fn overlay(&self) -> Value {
        let revoked: Vec<Value> =
            self.revoked.iter().map(|(tool, reason)| json!({ "tool": tool, "reason": reason })).collect();
        let withdrawn: Vec<Value> = self
            .withdrawn
            .iter()
            .map(|(service, reason)| json!({ "service": service, "tools": self.tools_of(service), "reason": reason }))
            .collect();
        let mut excluded: Vec<&str> = self.revoked.keys().map(String::as_str).collect();
        excluded.extend(self.withdrawn.keys().flat_map(|service| self.tools_of(service)));
        excluded.sort_unstable();
        excluded.dedup();
        json!({ "version": self.overlay_version, "revoked": revoked, "withdrawn": withdrawn, "excluded": excluded })
    }

    fn tools_of(&self, service: &str) -> Vec<&str> {
        self.services_of_tools.iter().filter(|(_, s)| *s == service).map(|(tool, _)| tool.as_str()).collect()
    }

    fn promote(&mut self, payload: &Value, observed: &mut Vec<Observation>) -> Result<Value, ServiceError> {
        let version = text_field(payload, "version")?;
        self.manifest(version)?;
        // A promotion may say which pointer move it follows (optimistic concurrency): two
        // release tools racing do not both win.
        if let Some(expected) = payload.get("expected_promotions").and_then(Value::as_u64) {
            if expected != self.promotions {
                return Err(ServiceError::new(
                    "conflict",
                    format!("the pointer moved {} time(s), not {expected}", self.promotions),
                ));
            }
        }
        let previous = std::mem::replace(&mut self.production, version.to_string());
        self.promotions += 1;
        let detail = json!({ "version": version, "previous": previous, "promotions": self.promotions });
        observed.push(Observation::Note { what: "config_promoted".into(), detail: detail.clone() });
        Ok(detail)
    }

    fn change_overlay(&mut self, observed: &mut Vec<Observation>) -> Value {
        self.overlay_version += 1;
        let overlay = self.overlay();
        observed.push(Observation::Note { what: "overlay_changed".into(), detail: overlay.clone() });
        overlay
    }

    fn revoke(&mut self, payload: &Value, observed: &mut Vec<Observation>) -> Result<Value, ServiceError> {
        let tool = text_field(payload, "tool")?;
        if !self.services_of_tools.contains_key(tool) {
            return Err(ServiceError::new("not_found", format!("no tool `{tool}` in this world")));
        }
        let reason = optional_text_field(payload, "reason")?.unwrap_or("revoked").to_string();
        self.revoked.insert(tool.to_string(), reason);
        Ok(self.change_overlay(observed))
    }

    fn withdraw(&mut self, payload: &Value, observed: &mut Vec<Observation>) -> Result<Value, ServiceError> {
        let service = text_field(payload, "service")?;
        if self.tools_of(service).is_empty() {
            return Err(ServiceError::new("not_found", format!("no service `{service}` offers a tool in this world")));
        }
        let reason = optional_text_field(payload, "reason")?.unwrap_or("withdrawn").to_string();
        self.withdrawn.insert(service.to_string(), reason);
        Ok(self.change_overlay(observed))
    }
}

impl Double for ConfigService {
    fn name(&self) -> &str {
        "config"
    }

    fn functions(&self) -> Vec<String> {
        crate::service::owned(Self::FUNCTIONS)
    }

    fn handle(&mut self, call: Call<'_>, observed: &mut Vec<Observation>) -> Result<Value, ServiceError> {
        match call.function {
            "config::resolve" => {
                let manifest = self.manifest(&self.production)?;
                Ok(json!({ "version": self.production, "manifest": manifest, "promotions": self.promotions }))
            }
            "config::get" => self.manifest(text_field(call.payload, "version")?),
            "config::overlay" => Ok(self.overlay()),
            "config::promote" => self.promote(call.payload, observed),
            "config::revoke" => self.revoke(call.payload, observed),
            "config::withdraw" => self.withdraw(call.payload, observed),
            other => Err(ServiceError::new("function_not_found", other)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn service() -> ConfigService {
        let version = |prompt: &str| ConfigVersion {
            system_prompt: prompt.into(),
            tools: vec!["ticket.create".into(), "recorder.record".into()],
            tool_catalogue: "tools-4".into(),
            policy: "policy-12".into(),
            model_profile: "safe-default".into(),
        };
        let settings = ConfigSettings {
            production: "agent-17".into(),
            versions: [("agent-17".to_string(), version("seventeen")), ("agent-18".to_string(), version("eighteen"))]
                .into(),
        };
        let tools = [("ticket.create", "tickets"), ("ticket.lookup", "tickets"), ("recorder.record", "recorder")];
        ConfigService::new(settings, tools.iter().map(|(t, s)| (t.to_string(), s.to_string())).collect())
    }

    fn call(
        config: &mut ConfigService,
        function: &str,
        payload: Value,
    ) -> (Result<Value, ServiceError>, Vec<Observation>) {
        let mut observed = Vec::new();
        let reply = config.handle(Call::new(function, &payload, 0), &mut observed);
        (reply, observed)
    }

    #[test]
    fn a_version_written_without_catalogue_policy_or_profile_gets_the_defaults() {
        let version: ConfigVersion = serde_json::from_value(json!({ "system_prompt": "p", "tools": [] })).unwrap();
        assert_eq!(
            (version.tool_catalogue.as_str(), version.policy.as_str(), version.model_profile.as_str()),
            ("tools-1", "policy-1", "default")
        );
    }

    #[test]
    fn promotion_moves_the_pointer_and_versions_stay_as_they_were() {
        let mut config = service();
        let resolved = call(&mut config, "config::resolve", json!({})).0.unwrap();
        assert_eq!(
            (resolved["version"].as_str(), resolved["manifest"]["system_prompt"].as_str()),
            (Some("agent-17"), Some("seventeen"))
        );
        let (promoted, noted) = call(&mut config, "config::promote", json!({ "version": "agent-18" }));
        assert_eq!(promoted.unwrap()["previous"], "agent-17");
        assert!(matches!(&noted[..], [Observation::Note { what, .. }] if what == "config_promoted"));
        assert_eq!(call(&mut config, "config::resolve", json!({})).0.unwrap()["version"], "agent-18");
        assert_eq!(
            call(&mut config, "config::get", json!({ "version": "agent-17" })).0.unwrap()["system_prompt"],
            "seventeen"
        );
        let stale = call(&mut config, "config::promote", json!({ "version": "agent-17", "expected_promotions": 0 }));
        assert_eq!(stale.0.unwrap_err().code, "conflict", "a promotion that expected no earlier move loses");
        assert_eq!(
            call(&mut config, "config::promote", json!({ "version": "agent-99" })).0.unwrap_err().code,
            "not_found"
        );
    }

    #[test]
    fn every_overlay_change_raises_its_version_and_names_what_it_takes_away() {
        let mut config = service();
        assert_eq!(config.overlay()["version"], 0);
        let revoked =
            call(&mut config, "config::revoke", json!({ "tool": "ticket.create", "reason": "compromised" })).0.unwrap();
        assert_eq!((revoked["version"].clone(), revoked["excluded"].clone()), (json!(1), json!(["ticket.create"])));
        let (withdrawn, noted) = call(&mut config, "config::withdraw", json!({ "service": "tickets" }));
        let withdrawn = withdrawn.unwrap();
        assert_eq!(withdrawn["version"], 2);
        assert_eq!(withdrawn["excluded"], json!(["ticket.create", "ticket.lookup"]));
        assert_eq!(withdrawn["withdrawn"][0]["tools"], json!(["ticket.create", "ticket.lookup"]));
        assert!(
            matches!(&noted[..], [Observation::Note { what, detail }] if what == "overlay_changed" && detail["version"] == 2)
        );
        assert_eq!(call(&mut config, "config::revoke", json!({ "tool": "nope" })).0.unwrap_err().code, "not_found");
        assert_eq!(call(&mut config, "config::overlay", json!({ "session_id": "s1" })).0.unwrap(), config.overlay());
    }
}
