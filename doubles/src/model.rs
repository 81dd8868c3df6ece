use crate::service::{Call, Double, Observation, ServiceError};
use serde_json::{json, Value};
use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::rc::Rc;

/// Checks a generation request against what a scripted reply expects of it: the expectations
/// it fails, in words (none when it matches).
pub type RequestCheck = Rc<dyn Fn(&Value) -> Vec<String>>;

/// One scripted reply: what the model answers, what request it answers (if it says), and
/// whether the run may leave it unused.
#[derive(Clone)]
pub struct ScriptedReply {
    pub reply: Value,
    pub expect: Option<RequestCheck>,
    pub optional: bool,
}

impl ScriptedReply {
    pub fn new(reply: Value) -> Self {
        Self { reply, expect: None, optional: false }
    }
}

impl fmt::Debug for ScriptedReply {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ScriptedReply")
            .field("reply", &self.reply)
            .field("expect", &self.expect.is_some())
            .field("optional", &self.optional)
            .finish()
    }
}

/// One generation the model answered: the turn it was for and the reply it gave (a streamed
/// reply whole, as `{frames}`). What the oracles hold a harness's transcript to.
#[derive(Debug, Clone, PartialEq)]
pub struct Generation {
    pub session_id: String,
    pub turn_id: String,
    pub reply: Value,
}

/// A scripted model: answers each generation request with the next scripted reply.
///
/// Scripted rather than generated so a run's model behaviour is part of the scenario file. A
/// reply may say what request it answers: a request that does not match is answered with a
/// `contract_failure` error, the reply stays next in line, and the model notes `model_contract`
/// with what did not match. When the script runs out the model answers with a plain final text,
/// so a turn can always end; if there was a script, it notes the generation as unexpected. A
/// scripted reply never asked for is reported unused at the end of the run.
#[derive(Debug, Default, Clone)]
pub struct ScriptedModel {
    script: VecDeque<ScriptedReply>,
    /// How many generations were answered from the script.
    consumed: usize,
    scripted: bool,
    /// Whether a request asked again (the same `request_id`) gets the reply it got before.
    deterministic: bool,
    /// The replies given, by `request_id`, when deterministic.
    answered: BTreeMap<String, Value>,
    /// Every generation answered, in order.
    generations: Vec<Generation>,
}

impl ScriptedModel {
    pub const FUNCTIONS: &'static [&'static str] = &["model::generate"];

    pub fn new(script: impl IntoIterator<Item = Value>) -> Self {
        Self::scripted(script.into_iter().map(ScriptedReply::new))
    }

    pub fn scripted(script: impl IntoIterator<Item = ScriptedReply>) -> Self {
        let script: VecDeque<ScriptedReply> = script.into_iter().collect();
        Self { scripted: !script.is_empty(), script, ..Self::default() }
    }

    /// A model that answers a generation it answered before (the same `request_id`) with the
    /// same reply, taking nothing from the script: as a model pinned to one seed and one
    /// temperature would, so that asking a finished round again costs a call and changes
    /// nothing else.
    pub fn deterministic(mut self, deterministic: bool) -> Self {
        self.deterministic = deterministic;
        self
    }

    fn generate(&mut self, request: &Value, observed: &mut Vec<Observation>) -> Result<Value, ServiceError> {
        let request_id = request["request_id"].as_str().filter(|_| self.deterministic).map(str::to_string);
        let reply = match request_id.as_ref().and_then(|id| self.answered.get(id)) {
            Some(earlier) => earlier.clone(),
            None => self.next_reply(request, observed)?,
        };
        if let Some(id) = request_id {
            self.answered.insert(id, reply.clone());
        }
        let field = |name: &str| request[name].as_str().unwrap_or_default().to_string();
        self.generations.push(Generation {
            session_id: field("session_id"),
            turn_id: field("turn_id"),
            reply: reply.clone(),
        });
        Ok(reply)
    }

    fn next_reply(&mut self, request: &Value, observed: &mut Vec<Observation>) -> Result<Value, ServiceError> {
        let generation = self.consumed + 1;
        let Some(next) = self.script.front() else {
            if self.scripted {
                observed.push(Observation::Note {
                    what: "model_contract".into(),
                    detail: json!({ "generation": generation, "problem": "unexpected: the script has no reply left" }),
                });
            }
            return Ok(json!({ "text": "done" }));
        };
        let failed = next.expect.as_ref().map(|check| check(request)).unwrap_or_default();
        if !failed.is_empty() {
            observed.push(Observation::Note {
                what: "model_contract".into(),
                detail: json!({ "generation": generation, "problem": "the request does not match", "failed": failed }),
            });
            return Err(ServiceError::new(
                "contract_failure",
                format!("generation {generation}: the request does not match: {}", failed.join("; ")),
            ));
        }
        self.consumed += 1;
        Ok(self.script.pop_front().map(|next| next.reply).unwrap_or(Value::Null))
    }
}

impl Double for ScriptedModel {
    fn name(&self) -> &str {
        "model"
    }

    fn functions(&self) -> Vec<String> {
        crate::service::owned(Self::FUNCTIONS)
    }

    fn handle(&mut self, call: Call<'_>, observed: &mut Vec<Observation>) -> Result<Value, ServiceError> {
        match call.function {
            "model::generate" => self.generate(call.payload, observed),
            other => Err(ServiceError::new("function_not_found", other)),
        }
    }

    fn generations(&self) -> Vec<Generation> {
        self.generations.clone()
    }

    fn unused(&self) -> Vec<String> {
        let unused: Vec<(usize, &ScriptedReply)> =
            (self.consumed + 1..).zip(&self.script).filter(|(_, reply)| !reply.optional).collect();
        let mut lines: Vec<String> = unused
            .iter()
            .take(UNUSED_LISTED_MAX)
            .map(|(number, reply)| format!("scripted model reply #{number} ({}) was never asked for", reply.reply))
            .collect();
        if let (Some((first, _)), Some((last, _))) = (unused.get(UNUSED_LISTED_MAX), unused.last()) {
            lines.push(format!(
                "{} more scripted model replies, among #{first} to #{last}, were never asked for",
                unused.len() - UNUSED_LISTED_MAX
            ));
        }
        lines
    }
}

/// Unused replies listed one by one; the rest are counted in one line, so that a script the
/// harness stopped following early reads as that, not as thousands of lines.
const UNUSED_LISTED_MAX: usize = 3;

#[cfg(test)]
mod tests {
    use super::*;

    fn generate(model: &mut ScriptedModel, request: Value) -> (Result<Value, ServiceError>, Vec<Observation>) {
        let mut seen = Vec::new();
        let reply = model.handle(Call::new("model::generate", &request, 0), &mut seen);
        (reply, seen)
    }

    #[test]
    fn unused_replies_are_named_by_their_place_in_the_script() {
        let mut model =
            ScriptedModel::new([json!({ "text": "one" }), json!({ "text": "two" }), json!({ "text": "three" })]);
        generate(&mut model, json!({})).0.unwrap();
        assert_eq!(
            model.unused(),
            [
                r#"scripted model reply #2 ({"text":"two"}) was never asked for"#,
                r#"scripted model reply #3 ({"text":"three"}) was never asked for"#,
            ]
        );
        let reply = ScriptedReply { optional: true, ..ScriptedReply::new(json!({ "text": "spare" })) };
        let shown = format!("{reply:?}");
        assert!(shown.starts_with("ScriptedReply {") && shown.contains("spare"), "{shown}");
        assert!(shown.contains("expect: false") && shown.contains("optional: true"), "{shown}");
    }

    #[test]
    fn a_reply_answers_only_the_request_it_expects() {
        let expects_a_result: RequestCheck = Rc::new(|request: &Value| {
            if request["messages"].as_array().is_some_and(|m| m.len() == 2) {
                Vec::new()
            } else {
                vec!["messages: expected 2".to_string()]
            }
        });
        let mut model = ScriptedModel::scripted([
            ScriptedReply::new(json!({ "tool_calls": [] })),
            ScriptedReply { expect: Some(expects_a_result), ..ScriptedReply::new(json!({ "text": "second" })) },
            ScriptedReply { optional: true, ..ScriptedReply::new(json!({ "text": "spare" })) },
        ]);
        assert!(generate(&mut model, json!({ "messages": [1] })).0.is_ok());
        let (refused, seen) = generate(&mut model, json!({ "messages": [1] }));
        let refused = refused.unwrap_err();
        assert_eq!(refused.code, "contract_failure");
        assert!(refused.message.starts_with("generation 2:"), "the second generation: {}", refused.message);
        assert!(
            matches!(&seen[..], [Observation::Note { what, detail }] if what == "model_contract" && detail["generation"] == 2)
        );
        assert_eq!(model.unused().len(), 1, "the refused reply is still unused; the optional one does not count");
        assert_eq!(generate(&mut model, json!({ "messages": [1, 2] })).0.unwrap(), json!({ "text": "second" }));
        assert!(model.unused().is_empty());
        generate(&mut model, json!({})).0.unwrap();
        let (beyond, seen) = generate(&mut model, json!({}));
        assert_eq!(beyond.unwrap(), json!({ "text": "done" }));
        assert_eq!(seen.len(), 1, "a generation beyond the script is noted");
        let (unscripted, seen) = generate(&mut ScriptedModel::new([]), json!({}));
        assert_eq!((unscripted.unwrap(), seen.len()), (json!({ "text": "done" }), 0));
    }

    #[test]
    fn a_deterministic_model_answers_a_request_asked_again_as_before() {
        let script = [json!({ "text": "first" }), json!({ "text": "second" })];
        let mut model = ScriptedModel::new(script.clone()).deterministic(true);
        assert_eq!(generate(&mut model, json!({ "request_id": "t1:0" })).0.unwrap(), script[0]);
        assert_eq!(generate(&mut model, json!({ "request_id": "t1:0" })).0.unwrap(), script[0], "the same round");
        assert_eq!(generate(&mut model, json!({ "request_id": "t1:1" })).0.unwrap(), script[1]);
        assert!(model.unused().is_empty());
        let mut plain = ScriptedModel::new(script.clone());
        generate(&mut plain, json!({ "request_id": "t1:0" })).0.unwrap();
        assert_eq!(generate(&mut plain, json!({ "request_id": "t1:0" })).0.unwrap(), script[1], "by default, the next");
    }
}
