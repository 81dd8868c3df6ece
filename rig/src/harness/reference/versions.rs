//! Versioned configuration, in a world that has it (`HarnessConfig::versioned_config`).
//!
//! A turn is pinned to the production version when it is created (`config::resolve`): the
//! version goes into the turn record, so every worker that takes the turn up later (after a
//! crash, a redelivery, a release, an import) runs it on the same version, whatever production
//! points at by then. A version is immutable, so its manifest (`config::get`) is remembered.
//!
//! The safety overlay is read at each safe point of the turn, pinned or not: before every
//! generation (the model is offered the version's tools less those the overlay took away, under
//! a catalogue version that names the overlay's) and at the last moment before every tool call.
//! A call of a tool the overlay took away is never sent: it is settled `failed` with a
//! structured `tool_unavailable` error, which the transcript gives the model; no other tool
//! stands in for it.
//!
//! Known-bad: `latest-on-resume` re-resolves production whenever it takes a turn up;
//! `overlay-pinned` reads the overlay once per turn and keeps it, as if it were part of the
//! pin; `call-unavailable` reads the overlay and offers and calls the tools anyway;
//! `drop-unavailable` skips a call of a tool the overlay took away, with no result at all.

use super::{Policy, StepFailure, Stop, Worker};
use crate::bus::{Bus, InvokeError};
use crate::harness::Tool;
use serde_json::{json, Map, Value};

/// What a generation of a turn is sent besides its messages.
pub(super) struct Offer {
    pub system_prompt: String,
    pub tools: Vec<Value>,
    /// The versions it was assembled from (`config_version`, `model_profile`, `policy`,
    /// `catalogue_version`); empty in a world without versioned configuration.
    pub versions: Map<String, Value>,
}

/// Why a tool the overlay lists is not available, as the transcript tells the model.
fn unavailable(overlay: &Value, tool: &str, catalogue_version: &str) -> Option<Value> {
    if !overlay["excluded"].as_array().is_some_and(|tools| tools.iter().any(|t| t == tool)) {
        return None;
    }
    let revoked = overlay["revoked"].as_array().into_iter().flatten().find(|r| r["tool"] == tool);
    let withdrawn = overlay["withdrawn"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|w| w["tools"].as_array().is_some_and(|t| t.iter().any(|t| t == tool)));
    let (why, reason) = match (revoked, withdrawn) {
        (Some(revoked), _) => ("revoked", revoked["reason"].clone()),
        (None, Some(withdrawn)) => (
            "withdrawn",
            json!(format!(
                "service `{}` withdrawn: {}",
                withdrawn["service"].as_str().unwrap_or("?"),
                withdrawn["reason"].as_str().unwrap_or("")
            )),
        ),
        (None, None) => ("withdrawn", json!("taken away by the safety overlay")),
    };
    Some(
        json!({ "code": "tool_unavailable", "tool": tool, "why": why, "reason": reason, "catalogue_version": catalogue_version }),
    )
}

fn catalogue_version(manifest: &Value, overlay: &Value) -> String {
    format!("{}+overlay-{}", manifest["tool_catalogue"].as_str().unwrap_or("tools"), overlay["version"])
}

fn failure(during: &str, error: InvokeError) -> StepFailure {
    StepFailure { during: during.to_string(), error }
}

impl Worker {
    /// Pins a new turn to the production version (a no-op without versioned configuration).
    pub(super) async fn pin_new_turn(&self, bus: &Bus, record: &mut Value) -> Result<(), StepFailure> {
        if self.env.config.versioned_config {
            record["config_version"] = json!(self.production(bus).await?);
        }
        Ok(())
    }

    /// Makes sure the turn is pinned before it is driven: a turn that has no version yet (one
    /// the world seeded, or created by a path that could not pin it) gets production's now,
    /// written before anything is asked of the model. Under `latest-on-resume` the pin is
    /// replaced by production's version whenever the turn is taken up.
    pub(super) async fn ensure_pin(&self, bus: &Bus, record: &mut Value) -> Result<(), Stop> {
        if !self.env.config.versioned_config {
            return Ok(());
        }
        let pinned = record["config_version"].as_str().map(str::to_string);
        if pinned.is_some() && self.policy != Policy::LatestOnResume {
            return Ok(());
        }
        let production = self.production(bus).await.map_err(Stop::Failed)?;
        if pinned.as_deref() == Some(production.as_str()) {
            return Ok(());
        }
        self.note("config_pinned", json!({ "turn_id": record["turn_id"], "version": production, "was": pinned }));
        record["config_version"] = json!(production);
        self.write(bus, record).await
    }

    async fn production(&self, bus: &Bus) -> Result<String, StepFailure> {
        let timeout = self.env.config.session_timeout_ms;
        let resolved =
            bus.invoke("config::resolve", json!({}), timeout).await.map_err(|e| failure("config::resolve", e))?;
        let version = resolved["version"].as_str().unwrap_or_default().to_string();
        self.manifests.borrow_mut().entry(version.clone()).or_insert_with(|| resolved["manifest"].clone());
        Ok(version)
    }

    /// The manifest of a version; versions never change, so each is asked for once.
    async fn manifest(&self, bus: &Bus, version: &str) -> Result<Value, StepFailure> {
        if let Some(manifest) = self.manifests.borrow().get(version) {
            return Ok(manifest.clone());
        }
        let timeout = self.env.config.session_timeout_ms;
        let manifest = bus
            .invoke("config::get", json!({ "version": version }), timeout)
            .await
            .map_err(|e| failure("config::get", e))?;
        self.manifests.borrow_mut().insert(version.to_string(), manifest.clone());
        Ok(manifest)
    }

    /// The safety overlay at this safe point of the turn (under `overlay-pinned`, the one read
    /// when the turn first asked, kept in its record).
    async fn overlay(&self, bus: &Bus, record: &mut Value) -> Result<Value, StepFailure> {
        if self.policy == Policy::OverlayPinned && !record["overlay"].is_null() {
            return Ok(record["overlay"].clone());
        }
        let timeout = self.env.config.session_timeout_ms;
        let mut turn_id = record["turn_id"].clone();
        if self.policy == Policy::OverlayOfTheFirstTurn {
            // The known-bad: the turn id kept from the session's first look names every later one.
            let session = record["session_id"].as_str().unwrap_or_default().to_string();
            turn_id = self.overlay_turns.borrow_mut().entry(session).or_insert(turn_id).clone();
        }
        let turn = json!({ "session_id": record["session_id"], "turn_id": turn_id });
        let overlay = bus.invoke("config::overlay", turn, timeout).await.map_err(|e| failure("config::overlay", e))?;
        if self.policy == Policy::OverlayPinned {
            record["overlay"] = overlay.clone();
        }
        Ok(overlay)
    }

    /// What a generation of the turn is offered: the world's prompt and tools, or, with
    /// versioned configuration, the pinned version's less what the overlay took away.
    pub(super) async fn offer(&self, bus: &Bus, record: &mut Value) -> Result<Offer, StepFailure> {
        let listed = |tools: &mut dyn Iterator<Item = &Tool>| -> Vec<Value> {
            // Copies made directly: `json!` would write each tool's schema out through its serializer.
            let tool = |t: &Tool| {
                let mut fields = Map::new();
                fields.insert("name".into(), t.name.as_str().into());
                fields.insert("description".into(), t.description.as_str().into());
                fields.insert("parameters".into(), t.parameters.clone());
                Value::Object(fields)
            };
            tools.map(tool).collect()
        };
        if !self.env.config.versioned_config {
            let tools = listed(&mut self.env.config.tools.iter());
            return Ok(Offer { system_prompt: self.env.config.system_prompt.clone(), tools, versions: Map::new() });
        }
        let version = record["config_version"].as_str().unwrap_or_default().to_string();
        let manifest = self.manifest(bus, &version).await?;
        let overlay = self.overlay(bus, record).await?;
        let catalogue = catalogue_version(&manifest, &overlay);
        let offered = |tool: &&Tool| {
            let in_version =
                manifest["tools"].as_array().is_some_and(|names| names.iter().any(|n| n == tool.name.as_str()));
            in_version
                && (self.policy == Policy::CallUnavailable || unavailable(&overlay, &tool.name, &catalogue).is_none())
        };
        let tools = listed(&mut self.env.config.tools.iter().filter(offered));
        let mut versions = Map::new();
        if self.policy != Policy::UnversionedRequests {
            versions.insert("config_version".into(), json!(version));
        }
        versions.insert("model_profile".into(), manifest["model_profile"].clone());
        versions.insert("policy".into(), manifest["policy"].clone());
        versions.insert("catalogue_version".into(), json!(catalogue));
        let system_prompt = manifest["system_prompt"].as_str().unwrap_or_default().to_string();
        Ok(Offer { system_prompt, tools, versions })
    }

    /// At the last moment before a tool call: why the overlay no longer lets it run, if it
    /// does not (always `None` without versioned configuration, and under `call-unavailable`).
    pub(super) async fn taken_away(&self, bus: &Bus, record: &mut Value, tool: &Tool) -> Result<Option<Value>, Stop> {
        if !self.env.config.versioned_config {
            return Ok(None);
        }
        let version = record["config_version"].as_str().unwrap_or_default().to_string();
        let manifest = self.manifest(bus, &version).await.map_err(Stop::Failed)?;
        let overlay = self.overlay(bus, record).await.map_err(Stop::Failed)?;
        if self.policy == Policy::CallUnavailable {
            return Ok(None);
        }
        let in_version =
            manifest["tools"].as_array().is_some_and(|names| names.iter().any(|n| n == tool.name.as_str()));
        let catalogue = catalogue_version(&manifest, &overlay);
        if !in_version {
            let reason = format!("not in the tool catalogue of version {version}");
            return Ok(Some(
                json!({ "code": "tool_unavailable", "tool": tool.name, "why": "not offered", "reason": reason, "catalogue_version": catalogue }),
            ));
        }
        Ok(unavailable(&overlay, &tool.name, &catalogue))
    }

    /// Settles a call the overlay took away: never sent, `failed` with the structured reason
    /// (under `drop-unavailable`, dropped without a trace).
    pub(super) async fn settle_unavailable(
        &self,
        bus: &Bus,
        record: &mut Value,
        action_id: &str,
        why: Value,
    ) -> Result<(), Stop> {
        self.note("tool_unavailable", json!({ "action_id": action_id, "why": why }));
        if self.policy == Policy::DropUnavailable {
            if let Some(calls) = record["calls"].as_object_mut() {
                calls.remove(action_id);
            }
            return self.write(bus, record).await;
        }
        let entry = &mut record["calls"][action_id];
        entry["status"] = json!("failed");
        entry["error"] = json!(format!(
            "tool unavailable: {} ({})",
            why["tool"].as_str().unwrap_or("?"),
            why["reason"].as_str().unwrap_or("")
        ));
        entry["unavailable"] = why;
        self.write(bus, record).await
    }
}
