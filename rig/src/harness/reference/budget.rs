//! Budgets: what a turn may consume, kept with the turn so that a retry, a redelivery, a crash
//! or an import continues the same count.
//!
//! A turn record may carry `budget = { limits = { DIMENSION = { soft, hard } }, used = {...} }`
//! over `model_rounds`, `tool_calls`, `effects`, `retries`, `child_turns` and `wall_ms`. Before a
//! model call, a tool's intent, an effect's dispatch and a resumption, the harness checks the hard
//! limit (reached: the turn stops there, its progress kept, held with the reason) and counts what
//! it is about to spend, durably; passing a soft limit is noted once. A child turn delegated by
//! `agent.delegate` gets its budget from what the parent has left, which the allocation reserves:
//! delegation never creates capacity.

use super::{Policy, Stop, Worker};
use crate::bus::Bus;
use serde_json::{json, Value};

/// What a safe point is about to spend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Spend {
    ModelRound,
    ToolCall,
    /// An effect about to be begun: counted with its intent, once per action, whatever its
    /// outcome turns out to be (a resend of the same action is not a new effect).
    EffectDispatch,
    /// The turn is taken up again after an interruption (a redelivery, an import).
    Resumption,
    ChildTurn,
}

impl Spend {
    fn dimension(self) -> &'static str {
        match self {
            Spend::ModelRound => "model_rounds",
            Spend::ToolCall => "tool_calls",
            Spend::EffectDispatch => "effects",
            Spend::Resumption => "retries",
            Spend::ChildTurn => "child_turns",
        }
    }
}

/// The dimensions a child's allocation is carved from.
const CARVED: [&str; 3] = ["model_rounds", "tool_calls", "effects"];

fn has_budget(record: &Value) -> bool {
    record["budget"]["limits"].is_object()
}

fn used(record: &Value, dimension: &str) -> u64 {
    record["budget"]["used"][dimension].as_u64().unwrap_or(0)
}

fn limit(record: &Value, dimension: &str, which: &str) -> Option<u64> {
    record["budget"]["limits"][dimension][which].as_u64()
}

impl Worker {
    /// Checks the turn's budget at a safe point and counts what it is about to spend: a hard limit
    /// reached stops the turn (held, with the reason); model rounds and resumptions are written at
    /// once, a tool call and an effect with the intent.
    pub(super) async fn spend(&self, bus: &Bus, record: &mut Value, spend: Spend) -> Result<(), Stop> {
        if !has_budget(record) {
            return Ok(());
        }
        self.check_wall_time(record)?;
        let dimension = spend.dimension();
        let spent = used(record, dimension);
        if let Some(hard) = limit(record, dimension, "hard") {
            if spent >= hard {
                self.note(
                    "budget_exhausted",
                    json!({ "turn_id": record["turn_id"], "dimension": dimension, "used": spent, "hard": hard }),
                );
                return Err(Stop::Held { reason: format!("budget exhausted: {dimension} {spent} of {hard}") });
            }
        }
        self.count(record, dimension, 1);
        if matches!(spend, Spend::ModelRound | Spend::Resumption) {
            self.write(bus, record).await?;
            // The write may have taken long (an acknowledgement lost, then a retry): the time
            // is checked again right before what it was counted for.
            self.check_wall_time(record)?;
        }
        Ok(())
    }

    /// Whether the turn is still within its wall-time limit (simulated ms since its first
    /// spend, which this starts the clock on). Checked at every safe point and again right
    /// before a send, as close to the act as the worker can be.
    pub(super) fn check_wall_time(&self, record: &mut Value) -> Result<(), Stop> {
        if !has_budget(record) {
            return Ok(());
        }
        let now = self.now();
        let started = *record["budget"].get("started_at_ms").and_then(Value::as_u64).get_or_insert(now);
        record["budget"]["started_at_ms"] = json!(started);
        match limit(record, "wall_ms", "hard") {
            Some(hard) if now.saturating_sub(started) >= hard => {
                Err(Stop::Held { reason: format!("budget exhausted: wall_ms {} of {hard}", now - started) })
            }
            _ => Ok(()),
        }
    }

    /// Adds `n` to what the turn used of `dimension`, noting the first time a soft limit is passed.
    pub(super) fn count(&self, record: &mut Value, dimension: &str, n: u64) {
        if !has_budget(record) {
            return;
        }
        let now_used = used(record, dimension) + n;
        record["budget"]["used"][dimension] = json!(now_used);
        if limit(record, dimension, "soft").is_some_and(|soft| now_used > soft)
            && record["budget"]["soft_passed"][dimension].is_null()
        {
            record["budget"]["soft_passed"][dimension] = json!(now_used);
            self.note(
                "budget_soft_limit",
                json!({ "turn_id": record["turn_id"], "dimension": dimension, "used": now_used }),
            );
        }
    }

    /// A delivery takes up a turn that had started before: under `reset-on-retry` its counts
    /// start over (the known-bad behaviour); otherwise the resumption itself is counted.
    pub(super) async fn resume_budget(&self, bus: &Bus, record: &mut Value) -> Result<(), Stop> {
        if !has_budget(record) || record["budget"]["started_at_ms"].is_null() {
            return Ok(());
        }
        if self.policy == Policy::ResetOnRetry {
            // Counts and clock alike: the time spent before the retry is forgotten too.
            record["budget"]["used"] = json!({});
            if let Some(budget) = record["budget"].as_object_mut() {
                budget.remove("started_at_ms");
            }
            return Ok(());
        }
        self.spend(bus, record, Spend::Resumption).await
    }

    /// `agent.delegate`: a child turn for another session, with a budget carved from what this
    /// turn has left (reserved here, so the two together never exceed the parent's limits), run
    /// through the turn queue. Done once per action: a replay finds the child already there.
    pub(super) async fn delegate(
        &self,
        bus: &Bus,
        record: &mut Value,
        action_id: &str,
        call: &Value,
    ) -> Result<(), Stop> {
        if record["calls"][action_id]["status"] == json!("complete") {
            return Ok(());
        }
        self.spend(bus, record, Spend::ChildTurn).await?;
        let child_session = call["args"]["session_id"]
            .as_str()
            .map_or_else(|| format!("{}~{action_id}", record["session_id"].as_str().unwrap_or("")), str::to_string);
        let mut limits = json!({});
        for dimension in CARVED {
            let asked = call["args"]["budget"][dimension].as_u64();
            let left = limit(record, dimension, "hard").map(|hard| hard.saturating_sub(used(record, dimension)));
            let allocated = match (self.policy, asked, left) {
                // The known-bad allocation: whatever the child asks for, or a parent's full budget.
                (Policy::MintChildBudget, Some(asked), _) => Some(asked),
                (Policy::MintChildBudget, None, _) => limit(record, dimension, "hard"),
                (_, Some(asked), Some(left)) => Some(asked.min(left)),
                (_, asked, left) => asked.or(left),
            };
            if let Some(allocated) = allocated {
                limits[dimension] = json!({ "hard": allocated });
                if self.policy != Policy::MintChildBudget {
                    self.count(record, dimension, allocated);
                }
            }
        }
        let child_turn = format!("{action_id}-child");
        let child = json!({
            "session_id": child_session, "turn_id": child_turn, "status": "running", "step": 1, "turn_count": 0,
            "calls": {}, "input": call["args"]["task"], "created_at": self.now(), "updated_at": self.now(),
            "parent": { "session_id": record["session_id"], "turn_id": record["turn_id"] },
            "budget": { "limits": limits, "used": {} },
        });
        let found = match self.get_turn(bus, &child_session).await {
            Ok(found) => found.filter(|found| found["turn_id"] == json!(child_turn)),
            Err(error) => return Err(self.stop_for(record["session_id"].as_str().unwrap_or(""), "get_turn", error)),
        };
        let child = match found {
            Some(found) => found,
            None => {
                if let Err(error) = self.create_turn_record(bus, &child).await {
                    return Err(self.stop_for(record["session_id"].as_str().unwrap_or(""), "state::set", error));
                }
                child
            }
        };
        // A child still to run goes to the turn queue, on a replay too: a child recorded by a
        // worker that died before enqueueing it would otherwise never run (two deliveries of one
        // turn are harmless: the second finds it ended, or resumes it).
        if child["status"] == json!("running") {
            let request = json!({ "session_id": child_session, "turn_id": child_turn, "step": 1, "depth": 1 });
            if let Err(error) = self.enqueue_turn(bus, request).await {
                let mut held = child.clone();
                held["status"] = json!("held");
                held["held_reason"] = json!(format!("delegated, but could not be enqueued: {error}"));
                let _ = self.put_turn(bus, &held).await;
                self.note("delegation_enqueue_exhausted", json!({ "child_session": child_session, "error": error }));
            }
        }
        self.note(
            "turn_delegated",
            json!({ "parent": record["turn_id"], "child_session": child_session, "limits": limits }),
        );
        record["calls"][action_id] = json!({
            "tool": "agent.delegate", "status": "complete", "replay": "safe",
            "result": { "child_session": child_session, "turn_id": child_turn, "allocated": limits },
        });
        self.write(bus, record).await
    }
}
