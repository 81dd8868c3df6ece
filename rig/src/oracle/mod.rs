//! Oracles: what every run checks, whatever the scenario expects.
//!
//! They judge from what the services and the driver saw (the store's commits and final
//! contents, the effect ledger, the queue's dead letters, the replies the driver got), read
//! through the record layout the harness declares, never from the harness's own account of
//! what it did. A new oracle is one variant, one function and one line in [`check`].

pub use crate::layout::CONTROL_SCOPE;
use crate::layout::{ActionClass, ActionVersion, RecordLayout};
use crate::services::EffectFunctions;
use crate::trace::{EffectEvent, Event, EventKind};
use doubles::{SessionService, StateStore};
pub use outcome::{outcome_differences, Outcome, OutcomeJudged, Workload as OutcomeWorkload};
use serde::Serialize;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};

/// An always-on check.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Oracle {
    /// No logical action produced more external effects than allowed.
    Effects,
    /// No write or effect carrying a fencing token older than the latest granted for its
    /// ownership domain was accepted.
    Fencing,
    /// No worker sent an action to a service again without first asking that service, itself
    /// and since it took ownership, whether the action had happened.
    BlindReplay,
    /// Once faults are healed, every turn ends terminal, or held with a recorded reason, and no
    /// idle worker keeps a finished turn's lease.
    Liveness,
    /// A terminal turn never goes back to a non-terminal status.
    Monotonic,
    /// No work is stranded: input queued for a session is admitted as a turn, and every dead
    /// letter reaches its owner.
    Stranded,
    /// No queued input is admitted into more than one turn: a message the user sent once is
    /// answered once.
    AdmittedOnce,
    /// The durable record of an action never contradicts the ledger: an action the service
    /// accepted is recorded, and not as failed.
    Ledger,
    /// A reply about a turn never contradicts the durable state it reports on.
    TruthfulReply,
    /// A finished turn has no action whose outcome is still unsettled, and its session's
    /// transcript no function call without a result.
    CallsClosed,
    /// No worker sends an effect request for a session after a cancellation of it was recorded,
    /// no cancelled turn's account of its effects contradicts the ledger, and no turn is
    /// cancelled, paused or resumed but by a command naming it.
    Cancellation,
    /// No turn, and no tree of a turn and the turns it delegated to, consumes more than the hard
    /// limits of its budget (model rounds, tool calls, effects, child turns, wall time).
    Budget,
    /// No two workers own a turn in the same epoch, and no worker writes a turn after a newer
    /// owner of its session has.
    OneOwner,
    /// No run does more work beyond its uncut workload (model calls, effect requests, store
    /// writes) than the faults that fired allow: excessive recovery.
    RecoveryCost,
    /// Every generation of a turn runs on the one configuration version it was pinned to.
    PinnedConfig,
    /// A worker consults the safety overlay before each generation and tool call of a turn, and
    /// never offers or calls a tool the overlay took away.
    SafetyOverlay,
    /// A call a hook held with an approval that expires never runs after the expiry, unless a
    /// release was sent before it.
    ApprovalExpiry,
    /// A call the hooks changed runs with the arguments its hook chain left it.
    HookArguments,
    /// A worker asks the model with the transcript as it stands: a function result it put
    /// there itself is in every later request it makes for that session.
    ModelContext,
    /// A model reply a worker transcribes enters the transcript whole: one entry holding its
    /// text (its streamed deltas joined in sequence order), never a part of it.
    WholeReplies,
    /// Faults may delay an outcome, never change it: a run with faults comes to what the same
    /// workload came to without them (the same turns ending the same way, the same effects, the
    /// same answers), but for the differences the contract permits.
    Outcome,
}

impl Oracle {
    pub const ALL: [Oracle; 21] = [
        Oracle::Effects,
        Oracle::Fencing,
        Oracle::BlindReplay,
        Oracle::Liveness,
        Oracle::Monotonic,
        Oracle::Stranded,
        Oracle::AdmittedOnce,
        Oracle::Ledger,
        Oracle::TruthfulReply,
        Oracle::CallsClosed,
        Oracle::Cancellation,
        Oracle::Budget,
        Oracle::OneOwner,
        Oracle::RecoveryCost,
        Oracle::PinnedConfig,
        Oracle::SafetyOverlay,
        Oracle::ApprovalExpiry,
        Oracle::HookArguments,
        Oracle::ModelContext,
        Oracle::WholeReplies,
        Oracle::Outcome,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Oracle::Effects => "effects",
            Oracle::Fencing => "fencing",
            Oracle::BlindReplay => "blind-replay",
            Oracle::Liveness => "liveness",
            Oracle::Monotonic => "monotonic",
            Oracle::Stranded => "stranded",
            Oracle::AdmittedOnce => "admitted-once",
            Oracle::Ledger => "ledger",
            Oracle::TruthfulReply => "truthful-reply",
            Oracle::CallsClosed => "calls-closed",
            Oracle::Cancellation => "cancellation",
            Oracle::Budget => "budget",
            Oracle::OneOwner => "one-owner",
            Oracle::RecoveryCost => "recovery-cost",
            Oracle::PinnedConfig => "pinned-config",
            Oracle::SafetyOverlay => "safety-overlay",
            Oracle::ApprovalExpiry => "approval-expiry",
            Oracle::HookArguments => "hook-arguments",
            Oracle::ModelContext => "model-context",
            Oracle::WholeReplies => "whole-replies",
            Oracle::Outcome => "outcome",
        }
    }

    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|o| o.name() == name)
    }
}

/// An oracle that fired, with what it saw.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Violation {
    pub oracle: Oracle,
    pub detail: String,
}

/// A worker's answer to a caller other than the scenario's driver (a queue delivery, another
/// worker), as the engine received it; the driver's are its `rpc` events.
#[derive(Debug, Clone, PartialEq)]
pub struct Reply {
    /// How many trace events came before it: it is judged against the store as of then.
    pub position: usize,
    pub at_ms: u64,
    /// The worker that answered, and who the answer was for.
    pub from: String,
    pub to: String,
    pub function: String,
    pub result: Value,
}

/// What the oracles need to know about a finished run.
pub struct Evidence<'a> {
    pub events: &'a [Event],
    /// Replies to callers other than the driver, in the order the engine received them.
    pub replies: &'a [Reply],
    pub store: &'a StateStore,
    /// The session service: the transcripts, as the harness left them.
    pub sessions: &'a SessionService,
    pub layout: &'a RecordLayout,
    /// Dead letters no handler took, as `(queue, message_id, data)`.
    pub dead_letters: Vec<(&'a str, &'a str, &'a Value)>,
    /// Every message a queue gave up on (a dead letter), taken by a handler or not, as `(queue,
    /// message_id, data)`.
    pub given_up: Vec<(&'a str, &'a str, &'a Value)>,
    /// How effect requests and reconciliations look on the wire, for this world's services.
    pub effect_functions: EffectFunctions,
    /// When the final heal happened and how long turns had afterwards to settle.
    pub healed_at_ms: u64,
    pub ended_at_ms: u64,
    /// Whether the run ended because nothing could happen any more (rather than at its bound).
    pub quiescent: bool,
    pub effects_per_action_max: u64,
    /// The run's work against its uncut workload's (`None` when it was not measured: live).
    pub recovery: Option<&'a crate::recovery::Recovery>,
    /// The world's versioned configuration, if it has one.
    pub config: Option<&'a doubles::ConfigSettings>,
    /// The function each tool of the world calls, by tool name.
    pub tool_functions: BTreeMap<String, String>,
    /// The answer each plain function of the world's declared services always gives, by
    /// function id: the hooks' decisions (hold, with an expiry; deny; the changes they make).
    pub hook_replies: BTreeMap<String, Value>,
    /// The generations the model answered, in order: what a transcript's replies are held to.
    pub generations: &'a [doubles::Generation],
    /// The durable records the world was seeded with (`[[world.record]]`), as `(scope, key,
    /// value)`: what the store held before anything was written in the run.
    pub seeded: &'a [(String, String, Value)],
    /// The messages the scenario's client sent (`{host}::send` invocations it began), in order.
    pub sends: Vec<Sent>,
    /// What the same workload came to without the run's faults, to hold the run's outcome to
    /// (`None`: nothing to compare, as for a run with no faults, a live run, or a workload whose
    /// outcome depends on its faults by design).
    pub outcome: Option<OutcomeJudged<'a>>,
}

/// A message the scenario's client sent with `{host}::send`: one message, however often it was
/// sent (again under its idempotency key, or repeated by the network under its invocation).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sent {
    pub session_id: String,
    /// What tells this message from another: its idempotency key (`key:K`), or, without one,
    /// the invocation that sent it (`step:NAME`).
    pub identity: String,
}

/// Runs every oracle.
pub fn check(evidence: &Evidence<'_>) -> Vec<Violation> {
    let mut violations = Vec::new();
    let derived = Derived::default();
    effects(evidence, &mut violations);
    fencing(evidence, &mut violations);
    blind_replay(evidence, &mut violations);
    liveness(evidence, &mut violations);
    holds::held_for_nothing(evidence, &mut violations);
    holds::paused_after_resume(evidence, &mut violations);
    monotonic(evidence, &mut violations);
    stranded(evidence, &derived, &mut violations);
    input::vanished(evidence, &derived, &mut violations);
    admitted_once(evidence, &derived, &mut violations);
    input::answered_twice(evidence, &mut violations);
    ledger(evidence, &derived, &mut violations);
    truthful_reply(evidence, &mut violations);
    calls_closed(evidence, &mut violations);
    cancellation(evidence, &derived, &mut violations);
    cancellation_claims(evidence, &derived, &mut violations);
    commands::moved_without_a_command(evidence, &mut violations);
    budget(evidence, &derived, &mut violations);
    one_owner(evidence, &mut violations);
    one_writer(evidence, &mut violations);
    recovery_cost(evidence, &mut violations);
    leases::lapsed_without_a_fault(evidence, &mut violations);
    versions::pinned_config(evidence, &mut violations);
    versions::safety_overlay(evidence, &derived, &mut violations);
    hooks::approval_expiry(evidence, &mut violations);
    hooks::hook_arguments(evidence, &mut violations);
    transcript::model_context(evidence, &mut violations);
    transcript::whole_replies(evidence, &mut violations);
    outcome::same_outcome(evidence, &mut violations);
    violations
}

/// What several oracles read of the same events, worked out once per [`check`], when the first
/// of them asks: the committed versions of the action records (the ledger's, and the source of
/// the next), the turn of each action (cancellation, its claims, budgets, the safety overlay) and
/// the turns each input was admitted into (stranded, vanished, admitted-once). Every one of them
/// worked each out again from the events for itself.
#[derive(Default)]
struct Derived<'a> {
    committed: std::cell::OnceCell<Vec<(u64, ActionVersion<'a>)>>,
    turns: std::cell::OnceCell<BTreeMap<&'a str, &'a str>>,
    admissions: std::cell::OnceCell<BTreeMap<&'a str, Vec<&'a str>>>,
}

impl<'a> Derived<'a> {
    fn committed(&self, evidence: &Evidence<'a>) -> &[(u64, ActionVersion<'a>)] {
        self.committed.get_or_init(|| committed_actions(evidence))
    }

    fn action_turns(&self, evidence: &Evidence<'a>) -> &BTreeMap<&'a str, &'a str> {
        self.turns.get_or_init(|| action_turns(self.committed(evidence)))
    }

    fn admissions(&self, evidence: &Evidence<'a>) -> &BTreeMap<&'a str, Vec<&'a str>> {
        self.admissions.get_or_init(|| admissions(evidence))
    }
}

fn violation(oracle: Oracle, detail: String) -> Violation {
    Violation { oracle, detail }
}

fn effects(evidence: &Evidence<'_>, violations: &mut Vec<Violation>) {
    // The oracle judges what workers sent: a request the network delivered twice (the same
    // invocation id) is one request, and what it did twice is the wire's doing. A call its
    // service declares safe to replay (`replay = "safe"`) may be sent again unasked
    // (`blind-replay` excuses it): its repeats are the service's to absorb, not effects the
    // harness owes an account of, whether or not the service keeps idempotency keys. How
    // often such a call is repeated is `recovery-cost`'s to bound.
    let mut per_action: BTreeMap<(&str, &str), u64> = BTreeMap::new();
    let mut requests: BTreeSet<&str> = BTreeSet::new();
    for event in evidence.events {
        if let Some(EffectEvent { effect, action, idempotency_key, accepted: true, invocation_id, .. }) =
            event.kind.effect()
        {
            // (The planted bug: effects counted per idempotency key, "one key, one effect".)
            let action = match (crate::planted!("effects-counted-per-key"), idempotency_key) {
                (true, Some(key)) => key,
                _ => action,
            };
            if evidence.effect_functions.replay_safe.contains(effect) {
                continue;
            }
            if invocation_id.as_deref().is_some_and(|id| !requests.insert(id)) {
                continue;
            }
            *per_action.entry((effect.as_str(), action.as_str())).or_default() += 1;
        }
    }
    for ((kind, action), count) in per_action {
        if count > evidence.effects_per_action_max {
            violations.push(violation(
                Oracle::Effects,
                format!(
                    "action `{action}` produced {count} `{kind}` effects (at most {} allowed)",
                    evidence.effects_per_action_max
                ),
            ));
        }
    }
}

fn fencing(evidence: &Evidence<'_>, violations: &mut Vec<Violation>) {
    let mut latest: BTreeMap<&str, u64> = BTreeMap::new();
    let stale = |domain: &str, token: u64, latest: &BTreeMap<&str, u64>| latest.get(domain).is_some_and(|&l| token < l);
    for event in evidence.events {
        match &event.kind {
            EventKind::Lease { domain, token, .. } => {
                let newest = latest.entry(domain.as_str()).or_insert(*token);
                *newest = (*newest).max(*token);
            }
            EventKind::Fenced { scope, key, domain, token, accepted: true } if stale(domain, *token, &latest) => {
                violations.push(violation(
                    Oracle::Fencing,
                    format!(
                        "write to {scope}/{key} with token {token} accepted at {} ms after token {} was granted for {domain}",
                        event.at_ms,
                        latest[domain.as_str()]
                    ),
                ));
            }
            EventKind::Effect(ledgered) => {
                let EffectEvent { effect, action, token, domain, accepted, .. } = &**ledgered;
                let (true, Some(token), Some(domain)) = (*accepted, token, domain) else { continue };
                if stale(domain, *token, &latest) {
                    violations.push(violation(
                        Oracle::Fencing,
                        format!(
                            "`{effect}` for action `{action}` with token {token} accepted at {} ms after token {} was granted for {domain}",
                            event.at_ms,
                            latest[domain.as_str()]
                        ),
                    ));
                }
            }
            _ => {}
        }
    }
}

/// What the services have seen of one action: the keys and references it was sent under, the
/// last request that sent it, and who asked about it when.
#[derive(Default)]
struct ActionSeen {
    keys: BTreeSet<String>,
    references: BTreeSet<String>,
    /// The worker and invocation of the last request that took effect, and where in the events
    /// that request reached the service: a question counts from when it was sent, not from when
    /// it took effect (a request held on the way takes effect after the questions its sender
    /// rightly asked while waiting for it).
    last_send: Option<(String, String, usize)>,
    /// Where in the events each of its requests reached the service (by invocation), which is
    /// also the order they reached it in: a request held on the way (a `late` cut) takes effect
    /// after a later one, and is no new send of it.
    sent_at: BTreeMap<String, usize>,
    /// Each worker's latest question to the service about it: where in the events, and when.
    asked: BTreeMap<String, (usize, u64)>,
}

fn blind_replay(evidence: &Evidence<'_>, violations: &mut Vec<Violation>) {
    let mut actions: BTreeMap<String, ActionSeen> = BTreeMap::new();
    // When each worker last took ownership (a new token: renewals repeat the token).
    let mut owned_since: BTreeMap<&str, u64> = BTreeMap::new();
    let mut tokens_seen: BTreeSet<(&str, u64)> = BTreeSet::new();
    let text = |value: &Value, field: &str| value[field].as_str().map(str::to_string);
    let functions = &evidence.effect_functions;
    for (position, event) in evidence.events.iter().enumerate() {
        match &event.kind {
            EventKind::Lease { domain, owner, token, .. } if tokens_seen.insert((domain.as_str(), *token)) => {
                owned_since.insert(owner.as_str(), event.at_ms);
            }
            EventKind::Call { function, payload, invocation_id, .. }
                if functions.effects.contains(function.as_str()) =>
            {
                if let Some(action) = text(payload, "action_id") {
                    let seen = actions.entry(action).or_default();
                    seen.keys.extend(text(payload, "idempotency_key"));
                    seen.references.extend(text(payload, "client_reference"));
                    if let Some(request) = invocation_id {
                        seen.sent_at.entry(request.clone()).or_insert(position);
                    }
                }
            }
            // A reconciliation names the action by a key or a reference it was sent with before;
            // it counts for the worker that asked, at the moment it asked -- also while no request
            // of it has taken effect yet (one may be on its way).
            EventKind::Call { function, payload, caller: Some(caller), .. }
                if functions.reconciliations.iter().any(|(f, _)| f == function) =>
            {
                let key = text(payload, "idempotency_key");
                let reference = text(payload, "client_reference");
                for seen in actions.values_mut() {
                    let names_it = key.as_ref().is_some_and(|k| seen.keys.contains(k))
                        || reference.as_ref().is_some_and(|r| seen.references.contains(r));
                    if names_it {
                        seen.asked.insert(caller.to_string(), (position, event.at_ms));
                    }
                }
            }
            // A stale-token refusal is the fencing oracle's business, and changes nothing.
            EventKind::Effect(ledgered) if ledgered.reason == "stale token" => {}
            // A call its service declares safe to replay may be sent again unasked.
            EventKind::Effect(ledgered) if functions.replay_safe.contains(&ledgered.effect) => {}
            EventKind::Effect(ledgered) => {
                let EffectEvent { effect, action, by, invocation_id, .. } = &**ledgered;
                let sender = by.clone().unwrap_or_default();
                let request = invocation_id.clone().unwrap_or_default();
                let seen = actions.entry(action.clone()).or_default();
                match &seen.last_send {
                    // The network repeated the same request: not the worker's doing.
                    Some((_, last, _)) if !request.is_empty() && *last == request => continue,
                    // An earlier request taking effect late, after the one that sent it again:
                    // that send was judged when it took effect.
                    Some((_, last, _)) if matches!((seen.sent_at.get(&request), seen.sent_at.get(last)), (Some(this), Some(last)) if this < last) => {
                        continue
                    }
                    Some((_, _, last_sent)) => {
                        let last_sent = *last_sent;
                        let since = owned_since.get(sender.as_str()).copied().unwrap_or(0);
                        // Asked after the last request that took effect was sent (planted: one
                        // question excuses every later send).
                        let after_the_send =
                            |at: usize| crate::planted!("blind-replay-asked-survives-a-send") || at > last_sent;
                        let asked = seen.asked.get(&sender).is_some_and(|&(at, at_ms)| {
                            after_the_send(at)
                                && (crate::planted!("blind-replay-asked-before-takeover") || at_ms >= since)
                        });
                        if !asked {
                            let others: Vec<&str> = seen
                                .asked
                                .iter()
                                .filter(|(_, &(at, _))| after_the_send(at))
                                .map(|(who, _)| who.as_str())
                                .collect();
                            violations.push(violation(
                                Oracle::BlindReplay,
                                format!(
                                    "action `{action}` was sent to `{effect}` again at {} ms by `{sender}`, which had not asked the service about it since it was last sent{}",
                                    event.at_ms,
                                    if others.is_empty() { String::new() } else { format!(" (only {} did)", others.join(", ")) }
                                ),
                            ));
                        }
                    }
                    None => {}
                }
                // A request whose arrival was not seen counts as sent when it took effect.
                let sent = seen.sent_at.get(&request).copied().unwrap_or(position);
                seen.last_send = Some((sender, request, sent));
            }
            _ => {}
        }
    }
}

fn liveness(evidence: &Evidence<'_>, violations: &mut Vec<Violation>) {
    let layout = evidence.layout;
    let settled_ms = evidence.ended_at_ms.saturating_sub(evidence.healed_at_ms);
    // Said only by a violation: a run that has none makes no text of it.
    let why = std::cell::LazyCell::new(|| {
        if evidence.quiescent {
            format!("and the world went quiet {settled_ms} ms after the faults were healed, with nothing left to run")
        } else {
            format!("{settled_ms} ms after the faults were healed")
        }
    });
    for (scope, key, record) in evidence.store.records() {
        if scope != layout.turn_scope
            || layout.is_terminal(record)
            || layout.is_held_with_reason(record)
            || layout.is_parked(record)
        {
            continue;
        }
        let why = why.as_str();
        violations.push(violation(
            Oracle::Liveness,
            format!(
                "turn {key}/{} is still `{}` at step {} {why}",
                layout.turn_id(record),
                layout.status(record),
                record[&layout.step_field]
            ),
        ));
    }
    // A command accepted for a turn that is no longer running will never be applied by it: it
    // must have been settled (applied, or expired) when the turn stopped.
    for (scope, session, control) in evidence.store.records() {
        if scope != CONTROL_SCOPE {
            continue;
        }
        let turn = evidence.store.get(&layout.turn_scope, session);
        let still_running = turn.is_some_and(|t| {
            if crate::planted!("liveness-commands-judged-after-an-end-only") {
                return !layout.is_terminal(t);
            }
            !layout.is_terminal(t) && !layout.is_held_with_reason(t) && !layout.is_parked(t)
        });
        for (key, command) in control["commands"].as_object().into_iter().flatten() {
            let for_this_turn = turn.is_some_and(|t| command["turn_id"].as_str() == Some(layout.turn_id(t)));
            if command["state"] == "accepted" && !still_running && for_this_turn {
                let why = why.as_str();
                violations.push(violation(
                    Oracle::Liveness,
                    format!(
                        "command {key} ({}) of session {session} is still `accepted` while its turn is `{}` {why}",
                        command["command"].as_str().unwrap_or("?"),
                        turn.map_or("", |t| layout.status(t))
                    ),
                ));
            }
        }
    }
    // Ownership covers work: a finished or held turn's lease still renewed at the end blocks
    // every other worker for as long as its idle holder lives.
    for lease in evidence.store.leases() {
        let finished = evidence.store.get(&layout.turn_scope, &lease.key).is_some_and(|r| {
            layout.is_terminal(r)
                || (!crate::planted!("liveness-held-turn-lease-may-be-kept") && layout.is_held_with_reason(r))
        });
        // A run that went quiet renews nothing: such a lease simply runs out.
        if lease.scope == layout.owner_scope
            && finished
            && !evidence.quiescent
            && !lease.expired_at(evidence.ended_at_ms)
        {
            violations.push(violation(
                Oracle::Liveness,
                format!(
                    "`{}` still holds the lease of session {} (token {}) {settled_ms} ms after the faults were healed, though its turn is `{}`",
                    lease.owner,
                    lease.key,
                    lease.token,
                    evidence.store.get(&layout.turn_scope, &lease.key).map_or("", |r| layout.status(r))
                ),
            ));
        }
    }
}

fn monotonic(evidence: &Evidence<'_>, violations: &mut Vec<Violation>) {
    let layout = evidence.layout;
    let mut terminal_turns: BTreeMap<String, (u64, String)> = BTreeMap::new();
    for event in evidence.events {
        let EventKind::Commit { scope, value, .. } = &event.kind else { continue };
        if *scope != layout.turn_scope || value.is_null() {
            continue;
        }
        let turn = layout.turn_id(value).to_string();
        if layout.is_terminal(value) {
            terminal_turns.entry(turn).or_insert((event.at_ms, layout.status(value).to_string()));
        } else if let Some((at_ms, was)) = terminal_turns
            .get(&turn)
            .filter(|_| !crate::planted!("monotonic-judges-running-only") || layout.status(value) == "running")
        {
            violations.push(violation(
                Oracle::Monotonic,
                format!(
                    "turn {turn} went from `{was}` (at {at_ms} ms) back to `{}` at {} ms",
                    layout.status(value),
                    event.at_ms
                ),
            ));
        }
    }
}

/// Which turns (by id) each input key was admitted into, in commit order, read from every
/// committed turn record.
fn admissions<'a>(evidence: &Evidence<'a>) -> BTreeMap<&'a str, Vec<&'a str>> {
    let layout = evidence.layout;
    let mut turns_by_input: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    let Some(field) = &layout.input_keys_field else { return turns_by_input };
    // (The planted bug reads only each record as the store left it, not every commit of it.)
    let final_records = crate::planted!("admitted-once-reads-final-records");
    let last_commit: BTreeMap<&str, usize> = if final_records {
        let commits = evidence.events.iter().enumerate().filter_map(|(i, e)| match &e.kind {
            EventKind::Commit { scope, key, .. } if *scope == layout.turn_scope => Some((key.as_str(), i)),
            _ => None,
        });
        commits.collect()
    } else {
        BTreeMap::new()
    };
    for (position, event) in evidence.events.iter().enumerate() {
        let EventKind::Commit { scope, key, value, .. } = &event.kind else { continue };
        if *scope != layout.turn_scope {
            continue;
        }
        if final_records && last_commit.get(key.as_str()) != Some(&position) {
            continue;
        }
        let turn_id = layout.turn_id(value);
        for key in value[field].as_array().into_iter().flatten().filter_map(Value::as_str) {
            let turns = turns_by_input.entry(key).or_default();
            if !turns.contains(&turn_id) {
                turns.push(turn_id);
            }
        }
    }
    turns_by_input
}

fn admitted_once<'a>(evidence: &Evidence<'a>, derived: &Derived<'a>, violations: &mut Vec<Violation>) {
    let Some(input_scope) = &evidence.layout.input_scope else { return };
    for (key, turns) in derived.admissions(evidence) {
        if turns.len() > 1 {
            violations.push(violation(
                Oracle::AdmittedOnce,
                format!("input {input_scope}/{key} was admitted into {} turns: {}", turns.len(), turns.join(", ")),
            ));
        }
    }
}

fn stranded<'a>(evidence: &Evidence<'a>, derived: &Derived<'a>, violations: &mut Vec<Violation>) {
    if let Some(input_scope) = &evidence.layout.input_scope {
        // Input a turn names as its own was admitted, even if its entry was never removed; input
        // behind a turn held for a person (or paused) waits on that person, as the turn does.
        let admitted = derived.admissions(evidence);
        let layout = evidence.layout;
        let waits_on_a_person = |entry: &Value| {
            let session = entry["session_id"].as_str().unwrap_or_default();
            evidence.store.get(&layout.turn_scope, session).is_some_and(|turn| {
                layout.is_held_with_reason(turn)
                    || layout.is_parked(turn)
                    || (crate::planted!("stranded-input-behind-an-ended-turn-waits") && layout.is_terminal(turn))
            })
        };
        for (scope, key, entry) in evidence.store.records() {
            if scope == input_scope && !admitted.contains_key(key) && !waits_on_a_person(entry) {
                violations.push(violation(
                    Oracle::Stranded,
                    format!(
                        "input {scope}/{key} queued for session `{}` was never admitted as a turn",
                        entry["session_id"].as_str().unwrap_or("?")
                    ),
                ));
            }
        }
    }
    for (queue, message_id, data) in &evidence.dead_letters {
        violations.push(violation(
            Oracle::Stranded,
            format!("dead letter {message_id} of queue `{queue}` ({data}) never reached a handler that took it"),
        ));
    }
}

/// Every version of an action record the store committed, in commit order, with its time:
/// read through the layout, wherever the harness keeps its actions.
fn committed_actions<'a>(evidence: &Evidence<'a>) -> Vec<(u64, ActionVersion<'a>)> {
    let mut versions = Vec::new();
    for event in evidence.events {
        if let EventKind::Commit { scope, key, value, .. } = &event.kind {
            let committed = evidence.layout.committed_actions(scope, key, value);
            versions.extend(committed.into_iter().map(|version| (event.at_ms, version)));
        }
    }
    versions
}

/// The last status each action had in any committed record, in commit order.
fn recorded_actions<'a>(committed: &[(u64, ActionVersion<'a>)]) -> BTreeMap<&'a str, (u64, &'a Value)> {
    let mut last: BTreeMap<&str, (u64, &Value)> = BTreeMap::new();
    for &(at_ms, ref version) in committed {
        if crate::planted!("ledger-judges-first-recorded-status") {
            last.entry(version.action_id).or_insert((at_ms, version.entry));
            continue;
        }
        last.insert(version.action_id, (at_ms, version.entry));
    }
    last
}

fn ledger<'a>(evidence: &Evidence<'a>, derived: &Derived<'a>, violations: &mut Vec<Violation>) {
    let recorded = recorded_actions(derived.committed(evidence));
    let mut judged = BTreeSet::new();
    for event in evidence.events {
        let Some(EffectEvent { effect, action, accepted: true, .. }) = event.kind.effect() else { continue };
        if !judged.insert(action.as_str()) {
            continue;
        }
        match recorded.get(action.as_str()) {
            None => violations.push(violation(
                Oracle::Ledger,
                format!("`{effect}` accepted action `{action}` at {} ms, but no durable record of the action was ever committed", event.at_ms),
            )),
            Some((at_ms, entry)) if evidence.layout.is_failed(entry) => violations.push(violation(
                Oracle::Ledger,
                format!(
                    "action `{action}` is recorded `{}` (last at {at_ms} ms), but `{effect}` accepted it at {} ms",
                    evidence.layout.action_status(entry),
                    event.at_ms
                ),
            )),
            Some(_) => {}
        }
    }
    done_without_acceptance(evidence, &recorded, &judged, violations);
}

/// The other direction: an action recorded as done whose call is an external effect, and which
/// no service ever accepted (a worker that took an action it had only begun for one it had
/// sent). The effect is found by what the services saw of the action (a request to an effect
/// function naming it), by the transcript's call of that id (the action id, when the model gave
/// the call none), or by the tool its record names.
fn done_without_acceptance(
    evidence: &Evidence<'_>,
    recorded: &BTreeMap<&str, (u64, &Value)>,
    accepted: &BTreeSet<&str>,
    violations: &mut Vec<Violation>,
) {
    let effects = &evidence.effect_functions.effects;
    let layout = evidence.layout;
    let mut requested: BTreeMap<&str, &str> = BTreeMap::new();
    for event in evidence.events {
        if let EventKind::Call { function, payload, .. } = &event.kind {
            if let (true, Some(action)) = (effects.contains(function.as_str()), payload["action_id"].as_str()) {
                requested.entry(action).or_insert(function.as_str());
            }
        }
    }
    let mut transcribed: BTreeMap<&str, &str> = BTreeMap::new();
    for (_, transcript) in evidence.sessions.transcripts() {
        let calls = transcript.iter().filter_map(|entry| entry["content"].as_array()).flatten();
        for call in calls.filter(|block| block["type"] == "function_call") {
            if let (Some(id), Some(tool)) = (call["id"].as_str(), call["function_id"].as_str()) {
                transcribed.entry(id).or_insert(tool);
            }
        }
    }
    let effect_of_tool = |tool: &str| evidence.tool_functions.get(tool).filter(|f| effects.contains(f.as_str()));
    for (&action, &(at_ms, entry)) in recorded {
        let done = layout.action_done_statuses.iter().any(|s| s == layout.action_status(entry));
        if !done || accepted.contains(action) {
            continue;
        }
        let function = requested
            .get(action)
            .map(|f| f.to_string())
            .or_else(|| transcribed.get(action).and_then(|tool| effect_of_tool(tool)).cloned())
            .or_else(|| entry["tool"].as_str().and_then(effect_of_tool).cloned());
        let Some(function) = function else { continue };
        violations.push(violation(
            Oracle::Ledger,
            format!(
                "action `{action}` is recorded `{}` (last at {at_ms} ms), but no service accepted it: the ledger holds no accepted `{function}` request of it",
                layout.action_status(entry)
            ),
        ));
    }
}

/// What a reply to the driver says about a turn, when it says something.
fn claimed_status(result: &Value) -> Option<(&str, &str, &str)> {
    let session = result["session_id"].as_str()?;
    let turn = result["turn_id"].as_str()?;
    let status = result["status"].as_str()?;
    Some((session, turn, status))
}

/// A reply about a control command: its session, idempotency key and the state it claims.
fn claimed_command(result: &Value) -> Option<(&str, &str, &str)> {
    Some((result["session_id"].as_str()?, result["idempotency_key"].as_str()?, result["state"].as_str()?))
}

fn truthful_reply(evidence: &Evidence<'_>, violations: &mut Vec<Violation>) {
    let mut stores = StoresSoFar::seeded(evidence.layout, evidence.seeded);
    let mut replies = evidence.replies.iter().peekable();
    for (position, event) in evidence.events.iter().enumerate() {
        // A reply to a queue or a worker, judged against the store as the engine received it.
        while let Some(reply) = replies.next_if(|r| r.position <= position) {
            if crate::planted!("truthful-reply-judges-driver-replies-only") {
                continue;
            }
            let who = format!("the reply of `{}` to `{}`", reply.function, reply.to);
            stores.judge(evidence.layout, &who, reply.at_ms, &reply.result, violations);
        }
        match &event.kind {
            EventKind::Commit { scope, key, value, .. } => stores.commit(evidence.layout, scope, key, value),
            EventKind::Rpc { name, outcome, .. } if outcome["outcome"] == "ok" => {
                stores.judge(evidence.layout, &format!("reply `{name}`"), event.at_ms, &outcome["result"], violations);
            }
            _ => {}
        }
    }
    for reply in replies.filter(|_| !crate::planted!("truthful-reply-judges-driver-replies-only")) {
        let who = format!("the reply of `{}` to `{}`", reply.function, reply.to);
        stores.judge(evidence.layout, &who, reply.at_ms, &reply.result, violations);
    }
}

/// The turn and control records as the store holds them so far, for judging a reply at that
/// moment: from the records the world was seeded with, then every commit. A turn record is
/// marked while it is still as seeded (the run has not written it yet).
#[derive(Default)]
struct StoresSoFar<'a> {
    turns: BTreeMap<&'a str, (&'a Value, bool)>,
    controls: BTreeMap<&'a str, &'a Value>,
}

impl<'a> StoresSoFar<'a> {
    fn seeded(layout: &RecordLayout, seeded: &'a [(String, String, Value)]) -> Self {
        let mut stores = Self::default();
        for (scope, key, value) in seeded {
            stores.commit(layout, scope, key, value);
            if let Some(turn) = stores.turns.get_mut(key.as_str()).filter(|_| *scope == layout.turn_scope) {
                turn.1 = true;
            }
        }
        stores
    }

    fn commit(&mut self, layout: &RecordLayout, scope: &'a str, key: &'a str, value: &'a Value) {
        if scope == layout.turn_scope {
            self.turns.insert(key, (value, false));
        } else if scope == CONTROL_SCOPE {
            self.controls.insert(key, value);
        }
    }

    /// Judges what one reply (`who`, at `at_ms`) says against the store as it is now.
    fn judge(&self, layout: &RecordLayout, who: &str, at_ms: u64, result: &Value, violations: &mut Vec<Violation>) {
        if let Some((session, key, state)) = claimed_command(result) {
            // "Accepted" is never reported as "applied": a command is applied only once the
            // store says so.
            let stored =
                self.controls.get(session).and_then(|c| c["commands"][key]["state"].as_str()).unwrap_or("absent");
            if state != "accepted" && state != stored {
                violations.push(violation(
                    Oracle::TruthfulReply,
                    format!(
                        "{who} at {at_ms} ms says command {key} of session {session} is `{state}`, while the store held it `{stored}`"
                    ),
                ));
            }
            return;
        }
        let Some((session, turn, status)) = claimed_status(result) else { return };
        let Some(&(record, as_seeded)) = self.turns.get(session).filter(|(r, _)| layout.turn_id(r) == turn) else {
            return;
        };
        let stored = layout.status(record);
        let unconfirmed = result["finalized"] == Value::Bool(false);
        if crate::planted!("truthful-reply-skip-claims-nothing") && result["skipped"] == Value::Bool(true) {
            return;
        }
        // A recorded end a reply may claim only once the store holds it: terminal, or held for a
        // person.
        let claims_an_end = layout.terminal_statuses.iter().any(|s| s == status) || status == layout.held_status;
        let lie = if status == "running" {
            layout.is_terminal(record)
        } else {
            claims_an_end && !unconfirmed && stored != status
        };
        if lie {
            let since = if as_seeded { " since the run began (as seeded, not yet written in the run)" } else { "" };
            violations.push(violation(
                Oracle::TruthfulReply,
                format!(
                    "{who} at {at_ms} ms says turn {turn} is `{status}`, while the store held it `{stored}`{since}"
                ),
            ));
        }
    }
}

/// The function calls of a transcript that no function result answers, in order.
fn dangling_calls(transcript: &[Value]) -> Vec<&str> {
    let answered: BTreeSet<&str> = transcript
        .iter()
        .filter(|entry| entry["role"] == "function_result")
        .filter_map(|entry| entry["function_call_id"].as_str())
        .collect();
    transcript
        .iter()
        .filter_map(|entry| entry["content"].as_array())
        .flatten()
        .filter(|block| block["type"] == "function_call")
        .filter_map(|block| block["id"].as_str())
        .filter(|id| !answered.contains(id))
        .collect()
}

fn calls_closed(evidence: &Evidence<'_>, violations: &mut Vec<Violation>) {
    let layout = evidence.layout;
    for (scope, key, record) in evidence.store.records() {
        if scope != layout.turn_scope || !layout.is_terminal(record) {
            continue;
        }
        // A transcript that keeps a call open poisons every later request made from it.
        for call in dangling_calls(evidence.sessions.entries(key)) {
            violations.push(violation(
                Oracle::CallsClosed,
                format!(
                    "turn {key}/{} is `{}` while its session's transcript has function call `{call}` with no result",
                    layout.turn_id(record),
                    layout.status(record)
                ),
            ));
        }
        for (action_id, entry) in layout.turn_actions(evidence.store, key, record) {
            // (The planted bug: a held action taken as closed, "a person settles it later".)
            let open = match crate::planted!("calls-closed-held-counts-as-closed") {
                true => layout.classify(entry) == ActionClass::Unsettled,
                false => layout.classify(entry) != ActionClass::Complete,
            };
            if open {
                violations.push(violation(
                    Oracle::CallsClosed,
                    format!(
                        "turn {key}/{} is `{}` while its action `{action_id}` is still `{}`",
                        layout.turn_id(record),
                        layout.status(record),
                        layout.action_status(entry)
                    ),
                ));
            }
        }
    }
}

/// The turn each recorded action belongs to, from the committed records.
fn action_turns<'a>(committed: &[(u64, ActionVersion<'a>)]) -> BTreeMap<&'a str, &'a str> {
    committed.iter().map(|(_, version)| (version.action_id, version.turn_id)).collect()
}

fn cancellation<'a>(evidence: &Evidence<'a>, derived: &Derived<'a>, violations: &mut Vec<Violation>) {
    // Frames from one worker reach the engine in the order it sent them, so the order of their
    // arrival says whether an effect was sent after the cancellation was recorded. Made when a
    // control record is first committed after a call: most runs commit none, and need none.
    let arrival = std::cell::OnceCell::new();
    let arrival = || {
        arrival.get_or_init(|| {
            let mut arrival: BTreeMap<&str, usize> = BTreeMap::new();
            for (position, event) in evidence.events.iter().enumerate() {
                if let EventKind::Frame { direction: "in", frame: "invokefunction", invocation_id: Some(id), .. } =
                    &event.kind
                {
                    arrival.entry(id.as_str()).or_insert(position);
                }
            }
            arrival
        })
    };
    let turns = derived.action_turns(evidence);
    // When a cancel or stop of each turn was first recorded as accepted (a rejected one
    // cancels nothing), by its arrival position.
    let mut cancelled_at: BTreeMap<String, (usize, u64)> = BTreeMap::new();
    // The request behind the store's next commit of a control record: the store commits while
    // it handles a call, so a commit follows its call directly; a call that never committed (a
    // refusal, a lost request) recorded nothing.
    let mut control_request: Option<&str> = None;
    for event in evidence.events {
        match &event.kind {
            EventKind::Call { function, payload, invocation_id: Some(id), .. }
                if function.starts_with("state::") && payload["scope"] == CONTROL_SCOPE =>
            {
                control_request = Some(id.as_str());
            }
            EventKind::Commit { scope, value, .. } if *scope == CONTROL_SCOPE => {
                let Some(&at) = control_request.take().and_then(|id| arrival().get(id)) else { continue };
                let commands = value["commands"].as_object().into_iter().flatten();
                for (_, command) in commands {
                    let cancels = matches!(command["command"].as_str(), Some("cancel" | "stop"))
                        && matches!(command["state"].as_str(), Some("accepted" | "applied"));
                    if let (true, Some(turn)) = (cancels, command["turn_id"].as_str()) {
                        cancelled_at.entry(turn.to_string()).or_insert((at, event.at_ms));
                    }
                }
            }
            EventKind::Call { function, payload, invocation_id: Some(id), .. }
                if evidence.effect_functions.effects.contains(function.as_str()) =>
            {
                let action = payload["action_id"].as_str().unwrap_or("");
                let Some(&turn) = turns.get(action) else { continue };
                // Nothing cancelled yet: nothing to be sent after (and no arrival to look up).
                let Some(&(cancel, cancel_ms)) = cancelled_at.get(turn) else { continue };
                let Some(&sent) = arrival().get(id.as_str()) else { continue };
                let after = match crate::planted!("cancellation-ordered-by-the-clock") {
                    true => event.at_ms > cancel_ms,
                    false => sent > cancel,
                };
                if after {
                    violations.push(violation(
                        Oracle::Cancellation,
                        format!(
                            "`{function}` for action `{action}` of turn {turn} was sent after its cancellation was recorded (at {cancel_ms} ms), and reached the service at {} ms",
                            event.at_ms
                        ),
                    ));
                }
            }
            _ => {}
        }
    }
}

/// A cancelled turn's account of its effects, held to the ledger: it must not claim that no
/// effect happened while the ledger holds an accepted effect of the turn, nor that one completed
/// while the ledger holds none. Each turn is judged by the last record committed for it.
fn cancellation_claims<'a>(evidence: &Evidence<'a>, derived: &Derived<'a>, violations: &mut Vec<Violation>) {
    let layout = evidence.layout;
    let turns = derived.action_turns(evidence);
    let mut accepted: BTreeMap<&str, Vec<(&str, &str)>> = BTreeMap::new();
    let mut latest: BTreeMap<&str, (&str, &Value)> = BTreeMap::new();
    for event in evidence.events {
        match &event.kind {
            EventKind::Effect(ledgered) if ledgered.accepted => {
                let EffectEvent { effect, action, .. } = &**ledgered;
                if let Some(&turn) = turns.get(action.as_str()) {
                    accepted.entry(turn).or_default().push((effect.as_str(), action.as_str()));
                }
            }
            EventKind::Commit { scope, key, value, .. } if *scope == layout.turn_scope && !value.is_null() => {
                if crate::planted!("cancellation-claims-first-record") {
                    latest.entry(layout.turn_id(value)).or_insert((key.as_str(), value));
                    continue;
                }
                latest.insert(layout.turn_id(value), (key.as_str(), value));
            }
            _ => {}
        }
    }
    for (turn, (session, record)) in latest {
        let Some(claims_an_effect) = layout.cancellation_claim(record) else { continue };
        let effects = accepted.get(turn).map_or(&[][..], Vec::as_slice);
        let claim = record[&layout.cancellation_field].as_str().unwrap_or_default();
        let ended = format!("turn {session}/{turn} ended `{}` claiming `{claim}`", layout.status(record));
        if claims_an_effect && effects.is_empty() {
            violations.push(violation(
                Oracle::Cancellation,
                format!("{ended}, while the ledger holds no accepted effect of it"),
            ));
        } else if !claims_an_effect && !effects.is_empty() {
            let named: Vec<String> =
                effects.iter().map(|(effect, action)| format!("`{effect}` for action `{action}`")).collect();
            violations.push(violation(
                Oracle::Cancellation,
                format!(
                    "{ended}, while the ledger holds {} accepted effect(s) of it: {}",
                    effects.len(),
                    named.join(", ")
                ),
            ));
        }
    }
}

/// What a turn consumed, as the services saw it.
#[derive(Default, Clone, Copy)]
struct Consumed {
    model_rounds: u64,
    tool_calls: u64,
    effects: u64,
    child_turns: u64,
    wall_ms: u64,
}

impl Consumed {
    const DIMENSIONS: [&'static str; 5] = ["model_rounds", "tool_calls", "effects", "child_turns", "wall_ms"];

    fn get(&self, dimension: &str) -> u64 {
        match dimension {
            "model_rounds" => self.model_rounds,
            "tool_calls" => self.tool_calls,
            "effects" => self.effects,
            "child_turns" => self.child_turns,
            _ => self.wall_ms,
        }
    }

    fn add(&mut self, other: &Consumed) {
        self.model_rounds += other.model_rounds;
        self.tool_calls += other.tool_calls;
        self.effects += other.effects;
        self.child_turns += other.child_turns;
        self.wall_ms = self.wall_ms.max(other.wall_ms);
    }
}

fn budget<'a>(evidence: &Evidence<'a>, derived: &Derived<'a>, violations: &mut Vec<Violation>) {
    let layout = evidence.layout;
    // Every turn's latest record, when it began, and its actions; then what it consumed.
    let mut latest: BTreeMap<String, &Value> = BTreeMap::new();
    let mut began: BTreeMap<String, u64> = BTreeMap::new();
    let mut action_turn: BTreeMap<&str, String> = BTreeMap::new();
    for event in evidence.events {
        if let EventKind::Commit { scope, value, .. } = &event.kind {
            if *scope == layout.turn_scope && !value.is_null() {
                let turn = layout.turn_id(value).to_string();
                began.entry(turn.clone()).or_insert(event.at_ms);
                latest.insert(turn, value);
            }
        }
    }
    for (&action, turn) in derived.action_turns(evidence) {
        action_turn.insert(action, turn.to_string());
    }
    for (_, _, record) in evidence.store.records() {
        latest.entry(layout.turn_id(record).to_string()).or_insert(record);
    }
    if !latest.values().any(|r| !r[&layout.budget_field].is_null()) {
        return;
    }
    let mut consumed: BTreeMap<String, Consumed> = BTreeMap::new();
    let mut touch = |turn: &str, at_ms: u64, f: &dyn Fn(&mut Consumed)| {
        let entry = consumed.entry(turn.to_string()).or_default();
        f(entry);
        entry.wall_ms = entry.wall_ms.max(at_ms.saturating_sub(began.get(turn).copied().unwrap_or(at_ms)));
    };
    // A request the network repeated (the same invocation id) is one request of the worker's.
    let mut model_requests: BTreeSet<&str> = BTreeSet::new();
    for event in evidence.events {
        match &event.kind {
            EventKind::Call { function, payload, invocation_id, .. } if function == "model::generate" => {
                let repeated = invocation_id.as_deref().is_some_and(|id| !model_requests.insert(id));
                if let (Some(turn), false) = (payload["turn_id"].as_str(), repeated) {
                    touch(turn, event.at_ms, &|c| c.model_rounds += 1);
                }
            }
            EventKind::Call { function, payload, .. }
                if evidence.effect_functions.effects.contains(function.as_str()) =>
            {
                if let Some(turn) = payload["action_id"].as_str().and_then(|a| action_turn.get(a)) {
                    touch(turn, event.at_ms, &|_| {});
                }
            }
            EventKind::Effect(ledgered) if ledgered.accepted => {
                if let Some(turn) = action_turn.get(ledgered.action.as_str()) {
                    touch(turn, event.at_ms, &|c| c.effects += 1);
                }
            }
            _ => {}
        }
    }
    let mut children: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (turn, record) in &latest {
        if let Some(parent) = record[&layout.parent_field]["turn_id"].as_str() {
            children.entry(parent.to_string()).or_default().push(turn.clone());
        }
    }
    for turn in action_turn.values() {
        consumed.entry(turn.clone()).or_default().tool_calls += 1;
    }
    for (parent, kids) in &children {
        consumed.entry(parent.clone()).or_default().child_turns += kids.len() as u64;
    }
    // A tree's consumption: the turn's own and that of every turn it delegated to.
    fn tree(
        turn: &str,
        consumed: &BTreeMap<String, Consumed>,
        children: &BTreeMap<String, Vec<String>>,
        depth: u32,
    ) -> Consumed {
        let mut total = consumed.get(turn).copied().unwrap_or_default();
        if depth < 16 && !crate::planted!("budget-own-turn-only") {
            for child in children.get(turn).into_iter().flatten() {
                total.add(&tree(child, consumed, children, depth + 1));
            }
        }
        total
    }
    for (turn, record) in &latest {
        for dimension in Consumed::DIMENSIONS {
            if crate::planted!("budget-wall-time-unjudged") && dimension == "wall_ms" {
                continue;
            }
            let Some(hard) = layout.hard_limit(record, dimension) else { continue };
            let used = tree(turn, &consumed, &children, 0).get(dimension);
            if used > hard {
                let scope = if children.contains_key(turn) { " with the turns it delegated to" } else { "" };
                violations.push(violation(
                    Oracle::Budget,
                    format!("turn {turn}{scope} consumed {used} {dimension}, over its hard limit of {hard}"),
                ));
            }
        }
    }
}

fn one_owner(evidence: &Evidence<'_>, violations: &mut Vec<Violation>) {
    let layout = evidence.layout;
    let mut owners: BTreeMap<(String, u64), BTreeSet<String>> = BTreeMap::new();
    for event in evidence.events {
        let EventKind::Commit { scope, value, .. } = &event.kind else { continue };
        if *scope != layout.turn_scope {
            continue;
        }
        let (Some(epoch), Some(owner)) = (value[&layout.epoch_field].as_u64(), value[&layout.owner_field].as_str())
        else {
            continue;
        };
        owners.entry((layout.turn_id(value).to_string(), epoch)).or_default().insert(owner.to_string());
    }
    for ((turn, epoch), owners) in owners.into_iter().filter(|(_, o)| o.len() > 1) {
        let owners: Vec<String> = owners.into_iter().collect();
        violations.push(violation(
            Oracle::OneOwner,
            format!("turn {turn} had {} owners in epoch {epoch}: {}", owners.len(), owners.join(", ")),
        ));
    }
}

/// Ownership as the store saw it: every lease grant (a new token) and every commit that raises a
/// turn's epoch is a claim on the session by the worker that sent it (the caller of the store
/// call). Once a worker has written the session's turn under its claim, a commit there by a
/// worker whose own latest claim is older means two workers ran the turn, whatever the commits
/// carried. The scenario's own writes (the driver's calls, and its `put` steps, which the store
/// commits without a call) claim nothing and are not judged.
fn one_writer(evidence: &Evidence<'_>, violations: &mut Vec<Violation>) {
    let layout = evidence.layout;
    let lease_prefix = format!("{}/", layout.owner_scope);
    let mut claims = 0u64;
    // The newest claim of each worker per session, and per session the newest claim whose
    // worker has written the turn since.
    let mut latest: BTreeMap<(&str, &str), u64> = BTreeMap::new();
    let mut exercised: BTreeMap<&str, (u64, &str)> = BTreeMap::new();
    let mut tokens: BTreeSet<(&str, u64)> = BTreeSet::new();
    let mut epochs: BTreeMap<&str, u64> = BTreeMap::new();
    let mut reported: BTreeSet<(&str, &str, &str)> = BTreeSet::new();
    // The store handles one call at a time: what it commits or grants follows that call.
    let mut caller: Option<&str> = None;
    for event in evidence.events {
        match &event.kind {
            EventKind::Call { function, caller: sender, .. } if function.starts_with("state::") => {
                caller = sender.as_deref();
            }
            EventKind::Lease { domain, token, .. } => {
                let (Some(session), Some(worker)) = (domain.strip_prefix(&lease_prefix), caller) else { continue };
                if tokens.insert((domain.as_str(), *token)) || crate::planted!("one-owner-renewal-is-a-claim") {
                    claims += 1;
                    latest.insert((session, worker), claims);
                }
            }
            EventKind::Commit { scope, key, value, .. } if *scope == layout.turn_scope && !value.is_null() => {
                // A scenario's `put` commits with no store call before it: it is the driver's,
                // not that of whoever sent the store its last call.
                if event.host == crate::topology::DRIVER {
                    continue;
                }
                let Some(writer) = caller.filter(|w| *w != crate::topology::DRIVER) else { continue };
                if let Some(epoch) = value[&layout.epoch_field].as_u64() {
                    if epochs.insert(key.as_str(), epoch).is_none_or(|before| epoch > before) && epoch > 0 {
                        claims += 1;
                        latest.insert((key.as_str(), writer), claims);
                    }
                }
                let mine = latest.get(&(key.as_str(), writer)).copied();
                match exercised.get(key.as_str()).copied() {
                    Some((newest, owner)) if owner != writer && mine.is_none_or(|claim| claim < newest) => {
                        if reported.insert((key.as_str(), writer, owner)) {
                            violations.push(violation(
                                Oracle::OneOwner,
                                format!(
                                    "turn {key}/{} was written by `{writer}` at {} ms after `{owner}`, which took the session over later, had written it: two workers ran the turn",
                                    layout.turn_id(value),
                                    event.at_ms
                                ),
                            ));
                        }
                    }
                    newest => {
                        if let Some(claim) = mine.filter(|&claim| newest.is_none_or(|(n, _)| claim >= n)) {
                            exercised.insert(key.as_str(), (claim, writer));
                        }
                    }
                }
            }
            _ => {}
        }
    }
}

fn recovery_cost(evidence: &Evidence<'_>, violations: &mut Vec<Violation>) {
    let Some(recovery) = evidence.recovery else { return };
    for (dimension, repeated, bound) in recovery.excessive() {
        violations.push(violation(
            Oracle::RecoveryCost,
            format!(
                "excessive recovery: {repeated} {dimension} repeated work already done, beyond what the uncut workload repeated; the bound is {bound} for {} fault(s) that fired",
                recovery.faults
            ),
        ));
    }
}

mod commands;
mod holds;
mod hooks;
mod input;
mod leases;
mod outcome;
mod transcript;
mod versions;

#[cfg(test)]
mod tests;
