//! The abstract state of a run: what durable execution cares about, read from what the services
//! saw (commits through the harness's record layout, requests and answers at the doubles, the
//! ledger, the queue's deliveries), never from the harness's own account, so it means the same
//! for every harness.
//!
//! - per action: its intent recorded, how often it was requested (and under how many fencing
//!   tokens), how often the service accepted it, whether it was asked about since it was last
//!   requested, the outcome recorded for it (unsettled, done, not done, held), and whether its
//!   result reached the transcript;
//! - per turn: its status, its owner, its step, and whether writes of its record were refused
//!   since its last commit;
//! - per queued message: how often it was delivered, whether it was acknowledged,
//!   dead-lettered, and taken by a dead-letter handler;
//! - per queued input: whether it is still queued;
//! - per lease: who holds it and how many times it was granted.
//!
//! Counts are capped (three requests are as many as ten), and each thing is known by the order
//! in which the run first saw it, not by its id, so two runs that did the same are in the same
//! states whatever ids their harness drew. A run is a trajectory through such states; a sweep or
//! an exploration counts the distinct states and transitions all its runs reached
//! ([`Coverage`]), and the guided explorer keeps the mixes that reached new ones.

use crate::layout::RecordLayout;
use crate::scenario::Scenario;
use crate::topology::DRIVER;
use crate::trace::{Event, EventKind};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::hash::{DefaultHasher, Hash, Hasher};

/// Where one action stands.
#[derive(Debug, Clone, Copy, Default, Hash, PartialEq, Eq)]
struct Action {
    /// A durable record of it exists.
    intent: bool,
    /// Requests that reached its service (a request the network repeated counts once), capped.
    requested: u8,
    /// Distinct fencing tokens its requests carried, capped.
    tokens: u8,
    /// Effects the service accepted for it, capped.
    accepted: u8,
    /// Asked about (by key or by reference) since it was last requested.
    asked: bool,
    /// The outcome its record holds.
    outcome: Outcome,
    /// A function result of it reached the transcript.
    result: bool,
}

#[derive(Debug, Clone, Copy, Default, Hash, PartialEq, Eq)]
enum Outcome {
    #[default]
    None,
    Unsettled,
    Done,
    NotDone,
    Held,
}

/// Where one turn stands.
#[derive(Debug, Clone, Default, Hash, PartialEq, Eq)]
struct Turn {
    status: String,
    /// The worker that owns it, by the order the run first saw it (0: none).
    owner: usize,
    /// Its step, capped.
    step: u8,
    /// Writes of its record refused (or left unanswered) by a cut since its last commit, capped.
    refused: u8,
}

/// Where one queued message stands.
#[derive(Debug, Clone, Copy, Default, Hash, PartialEq, Eq)]
struct Message {
    delivered: u8,
    acked: bool,
    /// 0: no dead letter; 1: dead-lettered; 2: a handler took it.
    dead: u8,
}

/// A lease: its holder (a worker, by the order the run first saw it) and its grants, capped.
#[derive(Debug, Clone, Default, Hash, PartialEq, Eq)]
struct Lease {
    holder: usize,
    grants: u8,
}

const REQUESTS_CAP: u8 = 3;
const ACCEPTED_CAP: u8 = 2;
const TOKENS_CAP: u8 = 2;
const STEP_CAP: u8 = 6;
const REFUSED_CAP: u8 = 2;
const DELIVERIES_CAP: u8 = 3;
const GRANTS_CAP: u8 = 3;

fn bump(count: &mut u8, cap: u8) {
    *count = (*count + 1).min(cap);
}

/// Things by the order a run first saw them.
#[derive(Debug, Default)]
struct Ordered<T> {
    index: BTreeMap<String, usize>,
    items: Vec<T>,
}

impl<T: Default> Ordered<T> {
    fn get(&mut self, id: &str) -> &mut T {
        let next = self.items.len();
        let at = *self.index.entry(id.to_string()).or_insert(next);
        if at == next {
            self.items.push(T::default());
        }
        &mut self.items[at]
    }

    fn find(&mut self, id: &str) -> Option<&mut T> {
        self.index.get(id).map(|&at| &mut self.items[at])
    }
}

/// The whole abstract state of a run so far.
#[derive(Default)]
struct State {
    actions: Ordered<Action>,
    turns: Ordered<Turn>,
    messages: Ordered<Message>,
    inputs: Ordered<bool>,
    leases: Ordered<Lease>,
    /// The action an idempotency key or a client reference names.
    by_key: BTreeMap<String, String>,
    /// The turn each session's record holds now.
    turn_of_session: BTreeMap<String, String>,
    /// Invocations already counted as a request.
    requests: BTreeSet<String>,
    /// The fencing tokens each action's requests carried.
    tokens: BTreeMap<String, BTreeSet<u64>>,
    /// The turn record a write just called for was refused, if a cut takes that call.
    pending_write: Option<String>,
    /// Each worker's id (as a harness names it in a record or a lease), numbered from 1 in the
    /// order the run first saw it: harnesses draw their ids differently.
    workers: BTreeMap<String, usize>,
    /// The token each lease was last granted under, to tell a grant from a renewal.
    lease_tokens: BTreeMap<String, u64>,
}

impl State {
    fn worker(&mut self, id: &str) -> usize {
        if id.is_empty() {
            return 0;
        }
        let next = self.workers.len() + 1;
        *self.workers.entry(id.to_string()).or_insert(next)
    }

    fn digest(&self) -> u64 {
        let mut hasher = DefaultHasher::new();
        self.actions.items.hash(&mut hasher);
        self.turns.items.hash(&mut hasher);
        self.messages.items.hash(&mut hasher);
        self.inputs.items.hash(&mut hasher);
        self.leases.items.hash(&mut hasher);
        hasher.finish()
    }
}

/// What a run's abstract state is read from: the harness's record layout and the workload's
/// effect functions (a tool's function, and the service asked about it).
#[derive(Debug, Clone)]
pub struct Abstraction {
    layout: RecordLayout,
    /// Each effect function, and the functions that ask its service about an action.
    effects: BTreeSet<String>,
    questions: BTreeSet<String>,
}

/// The abstract states a run went through, in order, each once where it repeats at once.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Trajectory {
    pub states: Vec<u64>,
}

impl Trajectory {
    /// Each step from one state to the next.
    pub fn transitions(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.states.windows(2).map(|pair| (pair[0], pair[1]))
    }
}

impl Abstraction {
    pub fn new(workload: &Scenario, layout: RecordLayout) -> Self {
        let tools = &workload.world.harness.tools;
        let effects = tools.iter().map(|tool| tool.function.clone()).collect();
        let questions = tools
            .iter()
            .flat_map(|tool| [format!("{}::status", tool.service), format!("{}::lookup", tool.service)])
            .collect();
        Self { layout, effects, questions }
    }

    /// The trajectory of a run through its abstract states.
    pub fn trajectory(&self, events: &[Event]) -> Trajectory {
        let mut state = State::default();
        let mut states = vec![state.digest()];
        for event in events {
            if self.apply(&mut state, &event.kind) {
                let digest = state.digest();
                if states.last() != Some(&digest) {
                    states.push(digest);
                }
            }
        }
        Trajectory { states }
    }

    /// The abstract state a run ends in, in words (`action 1: intent, requested 1, accepted 1,
    /// done, result; turn 1: completed by worker 1 at step 2; ...`): what two harnesses that did
    /// the same have in common, whatever they named things.
    pub fn last_state(&self, events: &[Event]) -> String {
        let mut state = State::default();
        for event in events {
            self.apply(&mut state, &event.kind);
        }
        let mut parts = Vec::new();
        for (n, action) in state.actions.items.iter().enumerate() {
            let mut words = Vec::new();
            if action.intent {
                words.push("intent".to_string());
            }
            words.push(format!("requested {}", action.requested));
            if action.tokens > 0 {
                words.push(format!("tokens {}", action.tokens));
            }
            words.push(format!("accepted {}", action.accepted));
            if action.asked {
                words.push("asked".to_string());
            }
            words.push(format!("{:?}", action.outcome).to_lowercase());
            if action.result {
                words.push("result".to_string());
            }
            parts.push(format!("action {}: {}", n + 1, words.join(", ")));
        }
        for (n, turn) in state.turns.items.iter().enumerate() {
            let refused = if turn.refused > 0 { format!(", {} writes refused", turn.refused) } else { String::new() };
            parts.push(format!(
                "turn {}: {} by worker {} at step {}{refused}",
                n + 1,
                turn.status,
                turn.owner,
                turn.step
            ));
        }
        for (n, message) in state.messages.items.iter().enumerate() {
            let ack = if message.acked { ", acked" } else { "" };
            let dead = ["", ", dead-lettered", ", dead letter handled"][usize::from(message.dead.min(2))];
            parts.push(format!("message {}: delivered {}{ack}{dead}", n + 1, message.delivered));
        }
        for (n, queued) in state.inputs.items.iter().enumerate() {
            parts.push(format!("input {}: {}", n + 1, if *queued { "queued" } else { "taken" }));
        }
        for (n, lease) in state.leases.items.iter().enumerate() {
            parts.push(format!("lease {}: worker {}, granted {}", n + 1, lease.holder, lease.grants));
        }
        parts.join("; ")
    }

    /// Folds one event into the state; whether it may have changed it.
    fn apply(&self, state: &mut State, event: &EventKind) -> bool {
        match event {
            EventKind::Call { function, payload, caller, invocation_id, .. } => {
                state.pending_write = None;
                if caller.as_deref() == Some(DRIVER) {
                    return false;
                }
                self.call(state, function, payload, invocation_id.as_deref())
            }
            EventKind::Cut { .. } => match state.pending_write.take() {
                Some(session) => {
                    let turn = state.turn_of_session.get(&session).cloned().unwrap_or(session);
                    bump(&mut state.turns.get(&turn).refused, REFUSED_CAP);
                    true
                }
                None => false,
            },
            EventKind::Commit { scope, key, value, .. } => self.commit(state, scope, key, value),
            EventKind::Effect(ledgered) => {
                if ledgered.accepted {
                    bump(&mut state.actions.get(&ledgered.action).accepted, ACCEPTED_CAP);
                }
                ledgered.accepted
            }
            EventKind::Note { what, detail } => {
                let id = detail["message_id"].as_str().unwrap_or_default();
                let message = match what.as_str() {
                    "queue_dispatch" | "queue_ack" | "queue_dead_letter" | "queue_dead_letter_handled" => {
                        state.messages.get(id)
                    }
                    _ => return false,
                };
                match what.as_str() {
                    "queue_dispatch" => bump(&mut message.delivered, DELIVERIES_CAP),
                    "queue_ack" => message.acked = true,
                    "queue_dead_letter" => message.dead = message.dead.max(1),
                    _ => message.dead = 2,
                }
                true
            }
            EventKind::Lease { domain, owner, token, .. } => {
                let holder = state.worker(owner);
                let renewal = state.lease_tokens.insert(domain.clone(), *token) == Some(*token);
                let lease = state.leases.get(domain);
                if renewal && lease.holder == holder {
                    return false;
                }
                lease.holder = holder;
                bump(&mut lease.grants, GRANTS_CAP);
                true
            }
            _ => false,
        }
    }

    fn call(&self, state: &mut State, function: &str, payload: &Value, invocation: Option<&str>) -> bool {
        let text = |field: &str| payload[field].as_str().map(str::to_string);
        if self.effects.contains(function) {
            let Some(id) = text("action_id") else { return false };
            if invocation.is_some_and(|invocation| !state.requests.insert(invocation.to_string())) {
                return false;
            }
            for field in ["idempotency_key", "client_reference"] {
                if let Some(key) = text(field) {
                    state.by_key.insert(key, id.clone());
                }
            }
            let tokens = state.tokens.entry(id.clone()).or_default();
            if let Some(token) = payload["fencing"]["token"].as_u64() {
                tokens.insert(token);
            }
            let tokens = u8::try_from(tokens.len()).unwrap_or(u8::MAX).min(TOKENS_CAP);
            let action = state.actions.get(&id);
            bump(&mut action.requested, REQUESTS_CAP);
            action.tokens = tokens;
            action.asked = false;
            return true;
        }
        if self.questions.contains(function) {
            let key = text("idempotency_key").or_else(|| text("client_reference"));
            let Some(id) = key.and_then(|key| state.by_key.get(&key).cloned()) else { return false };
            let Some(action) = state.actions.find(&id) else { return false };
            action.asked = true;
            return true;
        }
        if function == "session::append" {
            let entry = &payload["entry"];
            if entry["role"] != "function_result" {
                return false;
            }
            let Some(action) = entry["function_call_id"].as_str().and_then(|id| state.actions.find(id)) else {
                return false;
            };
            action.result = true;
            return true;
        }
        let writes_turn = matches!(function, "state::set" | "state::compare-and-set" | "state::delete")
            && payload["scope"] == self.layout.turn_scope.as_str();
        if writes_turn {
            state.pending_write = text("key");
        }
        false
    }

    fn commit(&self, state: &mut State, scope: &str, key: &str, value: &Value) -> bool {
        let layout = &self.layout;
        let mut changed = false;
        if scope == layout.turn_scope && !value.is_null() {
            let turn_id = layout.turn_id(value).to_string();
            state.turn_of_session.insert(key.to_string(), turn_id.clone());
            let owner = state.worker(value[&layout.owner_field].as_str().unwrap_or_default());
            let turn = state.turns.get(&turn_id);
            turn.status = layout.status(value).to_string();
            turn.owner = owner;
            turn.step = value[&layout.step_field].as_u64().map_or(0, |step| step.min(u64::from(STEP_CAP)) as u8);
            turn.refused = 0;
            changed = true;
        }
        if layout.input_scope.as_deref() == Some(scope) {
            *state.inputs.get(key) = !value.is_null();
            changed = true;
        }
        for version in layout.committed_actions(scope, key, value) {
            let status = version.entry[&layout.action_status_field].as_str().unwrap_or_default();
            let outcome = if layout.action_done_statuses.iter().any(|s| s == status) {
                Outcome::Done
            } else if layout.action_failed_statuses.iter().any(|s| s == status) {
                Outcome::NotDone
            } else if status == layout.action_held_status {
                Outcome::Held
            } else {
                Outcome::Unsettled
            };
            let action = state.actions.get(version.action_id);
            action.intent = true;
            action.outcome = outcome;
            changed = true;
        }
        changed
    }
}

/// The distinct abstract states and transitions many runs reached, and how many new states each
/// stretch of runs found: a curve that flattens says the runs stopped finding anything new (stop,
/// or write a richer workload).
#[derive(Debug, Clone, Default)]
pub struct Coverage {
    states: BTreeSet<u64>,
    transitions: BTreeSet<(u64, u64)>,
    /// New states each run found, in the order the runs were added.
    new_by_run: Vec<u32>,
}

/// What one run added to a [`Coverage`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Novelty {
    pub states: usize,
    pub transitions: usize,
}

impl Novelty {
    pub fn is_new(self) -> bool {
        self.states > 0 || self.transitions > 0
    }
}

/// How many runs a point of the curve stands for.
pub const CURVE_STRETCH: usize = 1_000;

impl Coverage {
    /// Adds a run's trajectory: the states and transitions it reached first.
    pub fn add(&mut self, trajectory: &Trajectory) -> Novelty {
        self.add_all(&[trajectory])
    }

    /// Adds what one run (or one seed of an exploration: its uncut run and its mix's) reached.
    pub fn add_all(&mut self, trajectories: &[&Trajectory]) -> Novelty {
        let mut novelty = Novelty::default();
        for trajectory in trajectories {
            novelty.states += trajectory.states.iter().filter(|s| self.states.insert(**s)).count();
            novelty.transitions += trajectory.transitions().filter(|t| self.transitions.insert(*t)).count();
        }
        self.new_by_run.push(u32::try_from(novelty.states).unwrap_or(u32::MAX));
        novelty
    }

    pub fn states(&self) -> usize {
        self.states.len()
    }

    pub fn transitions(&self) -> usize {
        self.transitions.len()
    }

    pub fn runs(&self) -> usize {
        self.new_by_run.len()
    }

    /// New states found by each stretch of [`CURVE_STRETCH`] runs, the last one partial.
    pub fn curve(&self) -> Vec<u64> {
        self.new_by_run.chunks(CURVE_STRETCH).map(|stretch| stretch.iter().map(|n| u64::from(*n)).sum()).collect()
    }

    /// `412 abstract states, 655 transitions; new states per 1,000 runs: 380, 25, 7 (the last
    /// stretch 351 runs)`.
    pub fn summary(&self) -> String {
        let curve: Vec<String> = self.curve().iter().map(u64::to_string).collect();
        let last = self.runs() % CURVE_STRETCH;
        let partial = if last == 0 { String::new() } else { format!(" (the last stretch {last} runs)") };
        format!(
            "{} abstract states, {} transitions; new states per {} runs: {}{partial}",
            self.states(),
            self.transitions(),
            "1,000",
            if curve.is_empty() { "none".to_string() } else { curve.join(", ") }
        )
    }

    /// The coverage as JSON: `states`, `transitions`, `runs`, `new_states_per_1000_runs`.
    pub fn json(&self) -> Value {
        serde_json::json!({
            "states": self.states(),
            "transitions": self.transitions(),
            "runs": self.runs(),
            "new_states_per_1000_runs": self.curve(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::Event;
    use serde_json::json;
    use std::path::Path;

    fn abstraction() -> Abstraction {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scenarios/workloads/multi-round.toml");
        Abstraction::new(&Scenario::load(&path).unwrap(), RecordLayout::default())
    }

    fn event(kind: EventKind) -> Event {
        Event { at_ms: 0, host: "h".into(), kind }
    }

    fn call(function: &str, payload: Value, invocation: &str) -> Event {
        event(EventKind::Call {
            service: function.split("::").next().unwrap().into(),
            function: function.into(),
            payload: payload.into(),
            caller: Some("harness".into()),
            invocation_id: Some(invocation.into()),
        })
    }

    fn commit(scope: &str, key: &str, value: Value) -> Event {
        event(EventKind::Commit { scope: scope.into(), key: key.into(), value: value.into(), version: 1 })
    }

    fn ticket(action: &str, key: &str, invocation: &str) -> Event {
        call("ticket::create", json!({ "action_id": action, "idempotency_key": key }), invocation)
    }

    fn turn(status: &str, calls: Value) -> Event {
        commit("harness_turn", "s1", json!({ "turn_id": "t1", "status": status, "step": 1, "calls": calls }))
    }

    /// The same story, whatever ids the harness drew, is the same trajectory; each thing that
    /// durable execution cares about moves it.
    #[test]
    fn a_run_is_its_trajectory_through_what_the_services_saw() {
        let story = |action: &str, key: &str| {
            vec![
                turn("running", json!({ action: { "status": "requested" } })),
                ticket(action, key, "i1"),
                ticket(action, key, "i1"),
                event(EventKind::Effect(Box::new(crate::trace::EffectEvent {
                    effect: "ticket.create".into(),
                    action: action.into(),
                    idempotency_key: Some(key.into()),
                    token: None,
                    domain: None,
                    accepted: true,
                    reason: String::new(),
                    by: None,
                    invocation_id: None,
                }))),
                call("ticket::status", json!({ "idempotency_key": key }), "i2"),
                turn("completed", json!({ action: { "status": "complete" } })),
            ]
        };
        let abstraction = abstraction();
        let one = abstraction.trajectory(&story("a1", "k1"));
        assert_eq!(one, abstraction.trajectory(&story("act-9", "key-9")), "ids do not matter");
        // Nothing, the intent, the request (its network copy changes nothing), accepted, asked,
        // completed.
        assert_eq!(one.states.len(), 6, "{one:?}");
        let distinct: BTreeSet<&u64> = one.states.iter().collect();
        assert_eq!(distinct.len(), 6);
        let mut again = story("a1", "k1");
        again.insert(4, ticket("a1", "k1", "i3"));
        assert_ne!(abstraction.trajectory(&again), one, "a second request is another state");
    }

    #[test]
    fn a_refused_write_of_the_turn_record_is_a_state_until_the_record_is_written() {
        let abstraction = abstraction();
        let write = call("state::set", json!({ "scope": "harness_turn", "key": "s1" }), "w");
        let cut = event(EventKind::Cut { cut: 0, action: "timeout".into(), function: "state::set".into() });
        let plain = abstraction.trajectory(&[turn("running", json!({})), write.clone()]);
        assert_eq!(plain.states.len(), 2, "a write on its way is nothing yet");
        let refused = abstraction.trajectory(&[turn("running", json!({})), write.clone(), cut.clone()]);
        assert_eq!(refused.states.len(), 3);
        let twice = abstraction.trajectory(&[turn("running", json!({})), write.clone(), cut.clone(), write, cut]);
        assert_eq!(twice.states.len(), 4, "refused twice");
        let read = call("state::get", json!({ "scope": "harness_turn", "key": "s1" }), "r");
        let cut_read = event(EventKind::Cut { cut: 0, action: "timeout".into(), function: "state::get".into() });
        assert_eq!(abstraction.trajectory(&[turn("running", json!({})), read, cut_read]).states.len(), 2, "a read");
    }

    #[test]
    fn queue_deliveries_and_leases_are_states_and_the_driver_is_not_the_harness() {
        let abstraction = abstraction();
        let note = |what: &str| event(EventKind::Note { what: what.into(), detail: json!({ "message_id": "m1" }) });
        let delivered = abstraction.trajectory(&[note("queue_dispatch"), note("queue_dispatch"), note("queue_ack")]);
        assert_eq!(delivered.states.len(), 4);
        let lease = |owner: &str, token: u64| {
            event(EventKind::Lease { domain: "harness_owner/s1".into(), owner: owner.into(), token, expires_at_ms: 0 })
        };
        let renewed = abstraction.trajectory(&[lease("harness", 1), lease("harness", 1)]);
        assert_eq!(renewed.states.len(), 2, "a renewal is the same grant");
        assert_eq!(abstraction.trajectory(&[lease("harness", 1), lease("replacement", 2)]).states.len(), 3);
        let mut by_driver = ticket("a1", "k1", "i1");
        if let EventKind::Call { caller, .. } = &mut by_driver.kind {
            *caller = Some(DRIVER.into());
        }
        assert_eq!(abstraction.trajectory(&[by_driver]).states.len(), 1, "the script's own calls");
    }

    #[test]
    fn coverage_counts_what_runs_reached_first_and_draws_the_curve() {
        let mut coverage = Coverage::default();
        let run = |states: &[u64]| Trajectory { states: states.to_vec() };
        assert_eq!(coverage.add(&run(&[1, 2, 3])), Novelty { states: 3, transitions: 2 });
        assert_eq!(coverage.add(&run(&[1, 3])), Novelty { states: 0, transitions: 1 });
        assert!(!coverage.add(&run(&[1, 2])).is_new());
        assert!(Novelty { states: 1, transitions: 0 }.is_new() && Novelty { states: 0, transitions: 1 }.is_new());
        for _ in 0..1_000 {
            coverage.add(&run(&[1]));
        }
        coverage.add(&run(&[4]));
        assert_eq!((coverage.states(), coverage.transitions(), coverage.runs()), (4, 3, 1_004));
        assert_eq!(coverage.curve(), [3, 1]);
        assert_eq!(
            coverage.summary(),
            "4 abstract states, 3 transitions; new states per 1,000 runs: 3, 1 (the last stretch 4 runs)"
        );
        let json = json!({ "states": 4, "transitions": 3, "runs": 1_004, "new_states_per_1000_runs": [3, 1] });
        assert_eq!(coverage.json(), json);
    }

    /// The last state in words names each thing by the order the run first saw it, with every
    /// part of where it stands: an action's record, requests, tokens, effects, question and
    /// result, each outcome its record can hold; a turn's status, owner, step and refused writes;
    /// a message's deliveries, acknowledgement and dead letter; a queued input; a lease's holder
    /// and grants (a renewal is no grant, a new token is, by the same worker too).
    #[test]
    fn the_last_state_says_where_each_thing_stands() {
        let fenced = |invocation: &str, token: u64| {
            let payload = json!({ "action_id": "a1", "idempotency_key": "k1", "fencing": { "token": token } });
            call("ticket::create", payload, invocation)
        };
        let calls = json!({
            "a1": { "status": "requested" },
            "a2": { "status": "failed" },
            "a3": { "status": "held" },
            "a4": { "status": "complete" },
        });
        let running = json!({ "turn_id": "t1", "status": "running", "step": 1, "owner": "w-a", "calls": calls });
        let completed = json!({ "turn_id": "t2", "status": "completed", "step": 9, "owner": "w-b", "calls": {} });
        let note = |what: &str, message: &str| {
            event(EventKind::Note { what: what.into(), detail: json!({ "message_id": message }) })
        };
        let lease = |owner: &str, token: u64| {
            event(EventKind::Lease { domain: "harness_owner/s1".into(), owner: owner.into(), token, expires_at_ms: 0 })
        };
        let result = json!({ "entry": { "role": "function_result", "function_call_id": "a1" } });
        let events = [
            commit("harness_turn", "s1", running),
            commit("harness_turn", "s2", completed),
            fenced("i1", 1),
            fenced("i2", 2),
            event(EventKind::Effect(Box::new(crate::trace::EffectEvent {
                effect: "ticket.create".into(),
                action: "a1".into(),
                idempotency_key: Some("k1".into()),
                token: None,
                domain: None,
                accepted: true,
                reason: String::new(),
                by: None,
                invocation_id: None,
            }))),
            call("ticket::status", json!({ "idempotency_key": "k1" }), "i3"),
            call("session::append", result, "i4"),
            call("state::set", json!({ "scope": "harness_turn", "key": "s1" }), "i5"),
            event(EventKind::Cut { cut: 0, action: "timeout".into(), function: "state::set".into() }),
            note("queue_dispatch", "m1"),
            note("queue_dispatch", "m1"),
            note("queue_ack", "m1"),
            note("queue_dispatch", "m2"),
            note("queue_dead_letter", "m2"),
            note("queue_dead_letter_handled", "m3"),
            commit("harness_queue", "q1", json!({ "session_id": "s1" })),
            commit("harness_queue", "q2", json!({ "session_id": "s1" })),
            commit("harness_queue", "q2", Value::Null),
            lease("w-a", 1),
            lease("w-a", 1),
            lease("w-b", 2),
            lease("w-b", 3),
        ];
        let expected = [
            "action 1: intent, requested 2, tokens 2, accepted 1, asked, unsettled, result",
            "action 2: intent, requested 0, accepted 0, notdone",
            "action 3: intent, requested 0, accepted 0, held",
            "action 4: intent, requested 0, accepted 0, done",
            "turn 1: running by worker 1 at step 1, 1 writes refused",
            "turn 2: completed by worker 2 at step 6",
            "message 1: delivered 2, acked",
            "message 2: delivered 1, dead-lettered",
            "message 3: delivered 0, dead letter handled",
            "input 1: queued",
            "input 2: taken",
            "lease 1: worker 2, granted 3",
        ];
        assert_eq!(abstraction().last_state(&events), expected.join("; "));
    }
}
