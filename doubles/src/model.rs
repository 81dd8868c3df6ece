use crate::service::{Call, Double, Observation, ServiceError};
use serde_json::{json, Value};
use std::collections::VecDeque;

/// A scripted model: answers each generation request with the next scripted reply.
///
/// Scripted rather than generated so a run's model behaviour is part of the scenario file;
/// when the script runs out it answers with a plain final text, so a turn can always end.
#[derive(Debug, Default, Clone)]
pub struct ScriptedModel {
    script: VecDeque<Value>,
}

impl ScriptedModel {
    pub const FUNCTIONS: &'static [&'static str] = &["model::generate"];

    pub fn new(script: impl IntoIterator<Item = Value>) -> Self {
        Self { script: script.into_iter().collect() }
    }
}

impl Double for ScriptedModel {
    fn name(&self) -> &'static str {
        "model"
    }

    fn functions(&self) -> &'static [&'static str] {
        Self::FUNCTIONS
    }

    fn handle(&mut self, call: Call<'_>, _observed: &mut Vec<Observation>) -> Result<Value, ServiceError> {
        match call.function {
            "model::generate" => Ok(self.script.pop_front().unwrap_or_else(|| json!({ "text": "done" }))),
            other => Err(ServiceError::new("function_not_found", other)),
        }
    }
}
