//! The record layout: where a harness keeps its durable state, as the oracles and reports read it.
//!
//! The oracles judge a run from what the services saw, never from harness code; to read a
//! harness's turns and actions out of the store they need to know where it puts them. Each
//! harness declares that here ([`crate::HarnessFactory::layout`]); the reference harness's
//! layout is the default.

use doubles::StateStore;
use serde_json::{json, Value};

/// The scope where a harness keeps control commands, by session (the oracles read it).
pub const CONTROL_SCOPE: &str = "harness_control";

/// Where a harness keeps turns, actions, queued input and ownership in the state store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordLayout {
    /// The scope of turn records; the key is the session id.
    pub turn_scope: String,
    pub turn_id_field: String,
    pub status_field: String,
    pub step_field: String,
    /// Statuses after which a turn never runs again.
    pub terminal_statuses: Vec<String>,
    /// The status of a turn held for a person, and the field that says why.
    pub held_status: String,
    pub held_reason_field: String,
    /// Statuses of a turn parked on purpose (paused by a control command): neither running nor
    /// ended, waiting for a resume.
    pub parked_statuses: Vec<String>,
    /// The fields naming the worker that owns the turn and the epoch of its ownership (bumped by
    /// every claim, such as a resume).
    pub owner_field: String,
    pub epoch_field: String,
    /// The field of an ended turn saying how a cancellation ended it, and the two claims it can
    /// make about effects: none happened (`cancelled-with-no-effect`), or one completed before
    /// the cancellation took hold (`completed-before-cancellation`).
    pub cancellation_field: String,
    pub cancelled_without_effect: String,
    pub cancelled_after_effect: String,
    /// The field holding the turn's budget: `limits.DIMENSION.hard` (and `soft`) per dimension.
    pub budget_field: String,
    /// The field naming the turn a child turn was delegated by: `{ session_id, turn_id }`.
    pub parent_field: String,
    /// The field of a turn record holding its actions: an object keyed by action id (unless
    /// `action_scope` is set).
    pub actions_field: String,
    /// The scope of action records, when a harness keeps each action as a record of its own
    /// (keyed by action id) rather than inside its turn record; each names its session and its
    /// turn in `action_session_field` and `action_turn_field`.
    pub action_scope: Option<String>,
    pub action_session_field: String,
    pub action_turn_field: String,
    pub action_status_field: String,
    /// Action statuses that are confirmed outcomes: it happened, or it definitely did not.
    pub action_done_statuses: Vec<String>,
    pub action_failed_statuses: Vec<String>,
    /// The status of an action held for a person.
    pub action_held_status: String,
    /// The field of an action naming why it is held.
    pub action_held_reason_field: String,
    /// The scope of input waiting to be admitted as a turn (its values carry `session_id`), if
    /// the harness queues input durably.
    pub input_scope: Option<String>,
    /// The field of a turn record listing the keys (in `input_scope`) of the input it was
    /// admitted from, if the harness records them.
    pub input_keys_field: Option<String>,
    /// The scope of ownership leases; the key is the session id.
    pub owner_scope: String,
}

impl Default for RecordLayout {
    /// The reference harness's layout.
    fn default() -> Self {
        let texts = |items: &[&str]| items.iter().map(|s| s.to_string()).collect();
        Self {
            turn_scope: "harness_turn".into(),
            turn_id_field: "turn_id".into(),
            status_field: "status".into(),
            step_field: "step".into(),
            terminal_statuses: texts(&["completed", "failed", "cancelled"]),
            held_status: "held".into(),
            held_reason_field: "held_reason".into(),
            parked_statuses: texts(&["paused"]),
            owner_field: "owner".into(),
            epoch_field: "epoch".into(),
            cancellation_field: "cancellation".into(),
            cancelled_without_effect: "cancelled-with-no-effect".into(),
            cancelled_after_effect: "completed-before-cancellation".into(),
            budget_field: "budget".into(),
            parent_field: "parent".into(),
            actions_field: "calls".into(),
            action_scope: None,
            action_session_field: "session_id".into(),
            action_turn_field: "turn_id".into(),
            action_status_field: "status".into(),
            action_done_statuses: texts(&["complete"]),
            action_failed_statuses: texts(&["failed"]),
            action_held_status: "held".into(),
            action_held_reason_field: "held_reason".into(),
            input_scope: Some("harness_queue".into()),
            input_keys_field: Some("input_keys".into()),
            owner_scope: "harness_owner".into(),
        }
    }
}

/// One version of an action's durable record, as a commit carried it.
#[derive(Debug, Clone, Copy)]
pub struct ActionVersion<'a> {
    pub action_id: &'a str,
    /// The turn it belongs to.
    pub turn_id: &'a str,
    pub entry: &'a Value,
}

/// Where an action stands, read from its durable record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum ActionClass {
    /// Confirmed: it happened, or it definitely did not.
    Complete,
    /// Held for a person.
    Held,
    /// Not confirmed either way: it may have happened.
    Unsettled,
}

impl ActionClass {
    pub fn name(self) -> &'static str {
        match self {
            ActionClass::Complete => "complete",
            ActionClass::Held => "held",
            ActionClass::Unsettled => "unsettled",
        }
    }
}

impl RecordLayout {
    fn text<'a>(record: &'a Value, field: &str) -> &'a str {
        record[field].as_str().unwrap_or("")
    }

    pub fn status<'a>(&self, record: &'a Value) -> &'a str {
        Self::text(record, &self.status_field)
    }

    pub fn turn_id<'a>(&self, record: &'a Value) -> &'a str {
        Self::text(record, &self.turn_id_field)
    }

    pub fn is_terminal(&self, record: &Value) -> bool {
        // The status read once, not once per terminal status (each read is a search of the record).
        let status = self.status(record);
        self.terminal_statuses.iter().any(|s| s == status)
    }

    /// Held for a person with a reason a person can read.
    pub fn is_held_with_reason(&self, record: &Value) -> bool {
        self.status(record) == self.held_status && !Self::text(record, &self.held_reason_field).is_empty()
    }

    /// Parked on purpose, waiting for a resume.
    pub fn is_parked(&self, record: &Value) -> bool {
        let status = self.status(record);
        self.parked_statuses.iter().any(|s| s == status)
    }

    /// What an ended turn claims its cancellation left behind: `Some(false)` no effect,
    /// `Some(true)` an effect completed first, `None` no claim (not cancelled, or unresolved).
    pub fn cancellation_claim(&self, record: &Value) -> Option<bool> {
        if !self.is_terminal(record) {
            return None;
        }
        let claim = Self::text(record, &self.cancellation_field);
        match claim {
            _ if claim == self.cancelled_without_effect => Some(false),
            _ if claim == self.cancelled_after_effect => Some(true),
            _ => None,
        }
    }

    /// The hard limit of a budget dimension, when the turn has one.
    pub fn hard_limit(&self, record: &Value, dimension: &str) -> Option<u64> {
        record[&self.budget_field]["limits"][dimension]["hard"].as_u64()
    }

    /// The actions kept inside a turn record, in action-id order (none when the harness keeps
    /// its actions in a scope of their own).
    pub fn actions<'a>(&self, record: &'a Value) -> Vec<(&'a str, &'a Value)> {
        if self.action_scope.is_some() {
            return Vec::new();
        }
        record[&self.actions_field]
            .as_object()
            .map(|actions| actions.iter().map(|(id, entry)| (id.as_str(), entry)).collect())
            .unwrap_or_default()
    }

    /// The actions one committed record holds, wherever the harness keeps them: those of a turn
    /// record, or the action record itself. `key` is the record's key in `scope`.
    pub fn committed_actions<'a>(&self, scope: &str, key: &'a str, value: &'a Value) -> Vec<ActionVersion<'a>> {
        if value.is_null() {
            return Vec::new();
        }
        if self.action_scope.as_deref() == Some(scope) {
            let turn_id = Self::text(value, &self.action_turn_field);
            return vec![ActionVersion { action_id: key, turn_id, entry: value }];
        }
        if scope != self.turn_scope {
            return Vec::new();
        }
        let turn_id = self.turn_id(value);
        self.actions(value).into_iter().map(|(action_id, entry)| ActionVersion { action_id, turn_id, entry }).collect()
    }

    /// The actions of the turn `record` of `session_id` as the store holds them now, in
    /// action-id order.
    pub fn turn_actions<'a>(
        &self,
        store: &'a StateStore,
        session_id: &str,
        record: &'a Value,
    ) -> Vec<(&'a str, &'a Value)> {
        let Some(scope) = &self.action_scope else { return self.actions(record) };
        let turn_id = self.turn_id(record);
        store
            .records()
            .filter(|(s, _, action)| {
                s == scope
                    && Self::text(action, &self.action_session_field) == session_id
                    && Self::text(action, &self.action_turn_field) == turn_id
            })
            .map(|(_, action_id, action)| (action_id, action))
            .collect()
    }

    pub fn action_status<'a>(&self, action: &'a Value) -> &'a str {
        Self::text(action, &self.action_status_field)
    }

    pub fn classify(&self, action: &Value) -> ActionClass {
        let status = self.action_status(action);
        if self.action_done_statuses.iter().chain(&self.action_failed_statuses).any(|s| s == status) {
            ActionClass::Complete
        } else if status == self.action_held_status {
            ActionClass::Held
        } else {
            ActionClass::Unsettled
        }
    }

    /// How the actions of a session's current turn stand, as the document an `actions`
    /// expectation reads: `{count, done, failed, held, unsettled}` (none without a turn record).
    pub fn action_summary(&self, store: &StateStore, session_id: &str) -> Option<Value> {
        let record = store.get(&self.turn_scope, session_id)?;
        let actions = self.turn_actions(store, session_id, record);
        let count = |keep: &dyn Fn(&Value) -> bool| actions.iter().filter(|(_, action)| keep(action)).count();
        let done = count(&|a| self.action_done_statuses.iter().any(|s| s == self.action_status(a)));
        Some(json!({
            "count": actions.len(),
            "done": done,
            "failed": count(&|a| self.is_failed(a)),
            "held": count(&|a| self.classify(a) == ActionClass::Held),
            "unsettled": count(&|a| self.classify(a) == ActionClass::Unsettled),
        }))
    }

    /// Whether the action's record says it definitely did not take effect.
    pub fn is_failed(&self, action: &Value) -> bool {
        self.action_failed_statuses.iter().any(|s| s == self.action_status(action))
    }

    pub fn held_reason<'a>(&self, action: &'a Value) -> Option<&'a str> {
        action[&self.action_held_reason_field].as_str()
    }
}
