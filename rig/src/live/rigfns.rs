//! The rig's own functions on a live bus, for the external harness processes of a run.
//!
//! In the simulation the rig hands a harness worker its settings ([`HarnessConfig`]) when it
//! starts it. An external process is started by someone else, before the rig knows which
//! scenario it will serve, so it asks: `rig::config` answers the current run's harness
//! settings (the scenario's `[world]`, already time-scaled). A harness that reports its
//! decisions as the reference harness does sends them to `rig::note`; they go into the trace
//! as the in-process harness's notes do, and expectations on those notes then apply to it.

use super::net::Net;
use crate::bus::{Answer, Bus, ErrorBody, Invocation, Provider};
use crate::harness::HarnessConfig;
use crate::sim::world::World;
use crate::topology::HARNESS;
use serde_json::{json, Value};
use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;

/// The host the rig's functions are served from.
pub const RIG: &str = "rig";
/// Answers the run's harness settings: `{host?, notes?, quiet_after_ms?}` →
/// `{scenario, policy, time_scale, incarnation, config}`. A worker that passes
/// `quiet_after_ms` promises that, with nothing reaching it for that long, it does nothing more
/// by itself (every timer of its own is shorter), which lets a run whose turn never ends be
/// judged as soon as it is quiet that long instead of at the end of its liveness bound.
pub const RIG_CONFIG: &str = "rig::config";
/// Records a harness's account of a decision: `{host, what, detail}`, best sent fire-and-forget.
pub const RIG_NOTE: &str = "rig::note";
/// What a harness passes as `notes` to `rig::config` when it reports as the reference harness.
pub const REFERENCE_NOTES: &str = "reference";

/// The run an external harness serves, as `rig::config` describes it.
pub struct RunInfo {
    /// Unique to the run within the `rig live` process.
    pub run_id: String,
    pub scenario: String,
    pub policy: String,
    pub time_scale: f64,
    pub config: HarnessConfig,
    /// The harness hosts external processes serve.
    pub hosts: BTreeSet<String>,
}

/// The provider of the rig's functions.
pub struct RigFunctions {
    pub world: Rc<World>,
    pub net: Rc<Net>,
    pub run: RunInfo,
    /// Set when a harness said it is the reference harness (it reports its decisions as the
    /// reference harness does), so its particulars apply.
    pub reference_particulars: Rc<Cell<bool>>,
    /// Each host's latest `quiet_after_ms`.
    pub declared_quiet: Rc<RefCell<BTreeMap<String, u64>>>,
}

impl RigFunctions {
    fn config(&self, data: &Value) -> Result<Value, ErrorBody> {
        if data["notes"] == json!(REFERENCE_NOTES) {
            self.reference_particulars.set(true);
        }
        // One life of the host: this run, and no crash of the host since. A worker that keeps
        // state across reconnections should start afresh when it changes.
        let host = data["host"].as_str().unwrap_or(HARNESS);
        if let Some(quiet_after_ms) = data["quiet_after_ms"].as_u64() {
            self.declared_quiet.borrow_mut().insert(host.to_string(), quiet_after_ms);
        }
        let incarnation = format!("{}/{host}/{}", self.run.run_id, self.net.crashes(host));
        Ok(json!({
            "incarnation": incarnation,
            "scenario": self.run.scenario,
            "policy": self.run.policy,
            "time_scale": self.run.time_scale,
            "config": config_json(&self.run.config),
        }))
    }

    fn note(&self, data: &Value) -> Result<Value, ErrorBody> {
        let (Some(host), Some(what)) = (data["host"].as_str(), data["what"].as_str()) else {
            return Err(ErrorBody::new("bad_request", "rig::note takes {host, what, detail}"));
        };
        if !self.run.hosts.contains(host) {
            return Err(ErrorBody::new("bad_request", format!("`{host}` is not a harness host of this run")));
        }
        self.world.note_event(host, what, data["detail"].clone());
        Ok(json!({}))
    }
}

impl Provider for RigFunctions {
    fn invoke(self: Rc<Self>, call: Invocation, _bus: Bus) -> Pin<Box<dyn Future<Output = Answer>>> {
        let answer = match call.function_id.as_str() {
            RIG_CONFIG => self.config(&call.data),
            RIG_NOTE => self.note(&call.data),
            _ => Err(ErrorBody::new("function_not_found", call.function_id)),
        };
        Box::pin(std::future::ready(Some(answer)))
    }
}

/// A harness's settings as `rig::config` sends them.
pub fn config_json(config: &HarnessConfig) -> Value {
    json!({
        "session_timeout_ms": config.session_timeout_ms,
        "model_timeout_ms": config.model_timeout_ms,
        "enqueue_attempts": config.enqueue_attempts,
        "turn_queue": config.turn_queue,
        "terminalize_attempts": config.terminalize_attempts,
        "terminalize_backoff_ms": config.terminalize_backoff_ms,
        "settle_within_ms": config.settle_within_ms,
        "handover_ms": config.handover_ms,
        "lease_ttl_ms": config.lease_ttl_ms,
        "tool_timeout_ms": config.tool_timeout_ms,
        "tools": config.tools,
        "system_prompt": config.system_prompt,
        "bindings": config.bindings,
        "versioned_config": config.versioned_config,
    })
}

/// A harness's settings read back from what `rig::config` sent.
pub fn config_from_json(value: &Value) -> Result<HarnessConfig, String> {
    let number = |field: &str| value[field].as_u64().ok_or_else(|| format!("`{field}`: expected a number"));
    let count = |field: &str| number(field).and_then(|n| u32::try_from(n).map_err(|e| format!("`{field}`: {e}")));
    Ok(HarnessConfig {
        session_timeout_ms: number("session_timeout_ms")?,
        model_timeout_ms: number("model_timeout_ms")?,
        enqueue_attempts: count("enqueue_attempts")?,
        turn_queue: value["turn_queue"].as_str().ok_or("`turn_queue`: expected a string")?.to_string(),
        terminalize_attempts: count("terminalize_attempts")?,
        terminalize_backoff_ms: number("terminalize_backoff_ms")?,
        // Absent from a rig that predates them: the defaults.
        settle_within_ms: value["settle_within_ms"].as_u64().unwrap_or(HarnessConfig::default().settle_within_ms),
        handover_ms: value["handover_ms"].as_u64().unwrap_or(HarnessConfig::default().handover_ms),
        lease_ttl_ms: number("lease_ttl_ms")?,
        tool_timeout_ms: number("tool_timeout_ms")?,
        tools: serde_json::from_value(value["tools"].clone()).map_err(|e| format!("`tools`: {e}"))?,
        system_prompt: value["system_prompt"].as_str().ok_or("`system_prompt`: expected a string")?.to_string(),
        bindings: serde_json::from_value(value["bindings"].clone()).map_err(|e| format!("`bindings`: {e}"))?,
        // Absent from a rig that predates it: no versioned configuration.
        versioned_config: value["versioned_config"].as_bool().unwrap_or(false),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_survive_the_round_trip() {
        let config = HarnessConfig { session_timeout_ms: 75, terminalize_attempts: 3, ..HarnessConfig::default() };
        assert_eq!(config_from_json(&config_json(&config)), Ok(config));
        assert!(config_from_json(&json!({})).is_err());
    }
}
