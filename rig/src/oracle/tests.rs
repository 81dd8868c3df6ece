//! Each oracle on synthetic traces: quiet on what a correct harness leaves behind, firing on the
//! known-bad shape it exists to catch.

use super::*;
use doubles::Generation;
use serde_json::json;

fn event(at_ms: u64, kind: EventKind) -> Event {
    Event { at_ms, host: "test".into(), kind }
}

fn call_from(at_ms: u64, caller: &str, function: &str, payload: Value) -> Event {
    event(
        at_ms,
        EventKind::Call {
            service: "tickets".into(),
            function: function.into(),
            payload: payload.into(),
            caller: Some(caller.into()),
            invocation_id: Some(format!("i{at_ms}")),
        },
    )
}

fn effect_from(at_ms: u64, by: &str, invocation: &str, token: Option<u64>, accepted: bool, reason: &str) -> Event {
    event(
        at_ms,
        EventKind::Effect(Box::new(crate::trace::EffectEvent {
            effect: "ticket.create".into(),
            action: "a1".into(),
            idempotency_key: Some("k1".into()),
            token,
            domain: token.map(|_| "harness_owner/s1".to_string()),
            accepted,
            reason: reason.into(),
            by: Some(by.into()),
            invocation_id: Some(invocation.into()),
        })),
    )
}

/// A create request by `by` at `at_ms`, and the ledger line it produced.
fn send(at_ms: u64, by: &str, accepted: bool, reason: &str) -> [Event; 2] {
    let payload = json!({"action_id": "a1", "idempotency_key": "k1", "client_reference": "a1"});
    [
        call_from(at_ms, by, "ticket::create", payload),
        effect_from(at_ms, by, &format!("i{at_ms}"), None, accepted, reason),
    ]
}

fn ask(at_ms: u64, by: &str, function: &str) -> Event {
    let payload = match function {
        "ticket::status" => json!({"idempotency_key": "k1"}),
        _ => json!({"client_reference": "a1"}),
    };
    call_from(at_ms, by, function, payload)
}

fn lease(at_ms: u64, owner: &str, token: u64) -> Event {
    // A grant for ten seconds: a newer grant within them takes the lease over before it lapses.
    let expires_at_ms = at_ms + 10_000;
    event(at_ms, EventKind::Lease { domain: "harness_owner/s1".into(), owner: owner.into(), token, expires_at_ms })
}

fn commit(at_ms: u64, value: Value) -> Event {
    event(
        at_ms,
        EventKind::Commit { scope: "harness_turn".into(), key: "s1".into(), value: value.into(), version: at_ms },
    )
}

fn rpc(at_ms: u64, result: Value) -> Event {
    event(
        at_ms,
        EventKind::Rpc {
            name: "turn".into(),
            function: "harness::turn".into(),
            outcome: json!({"outcome": "ok", "result": result}),
        },
    )
}

fn tickets() -> crate::services::EffectFunctions {
    crate::services::Services { tickets: Some(Default::default()), ..Default::default() }.effect_functions()
}

fn judge(events: &[Event], store: &StateStore) -> Vec<Oracle> {
    judge_with_sessions(events, store, &doubles::SessionService::new())
}

fn judge_with_sessions(events: &[Event], store: &StateStore, sessions: &doubles::SessionService) -> Vec<Oracle> {
    judge_with_layout(events, store, sessions, &RecordLayout::default())
}

fn judge_with_layout(
    events: &[Event],
    store: &StateStore,
    sessions: &doubles::SessionService,
    layout: &RecordLayout,
) -> Vec<Oracle> {
    judge_everything(events, &[], store, sessions, layout)
}

/// The evidence of a run over `events` that leaves `store` and `sessions`: healed at 0, ended at
/// `ended_at_ms` with nothing left to run, nothing replied to others, no dead letter, the ticket
/// service's functions, and no configuration, tool table, hooks or generations. Each test
/// changes what it judges.
pub(super) fn evidence<'a>(
    events: &'a [Event],
    store: &'a StateStore,
    sessions: &'a doubles::SessionService,
    layout: &'a RecordLayout,
    ended_at_ms: u64,
) -> Evidence<'a> {
    Evidence {
        events,
        replies: &[],
        store,
        sessions,
        layout,
        dead_letters: Vec::new(),
        given_up: Vec::new(),
        effect_functions: tickets(),
        healed_at_ms: 0,
        ended_at_ms,
        quiescent: true,
        effects_per_action_max: 1,
        recovery: None,
        config: None,
        tool_functions: BTreeMap::new(),
        hook_replies: BTreeMap::new(),
        generations: &[],
        seeded: &[],
        sends: Vec::new(),
        outcome: None,
    }
}

fn judge_everything(
    events: &[Event],
    replies: &[Reply],
    store: &StateStore,
    sessions: &doubles::SessionService,
    layout: &RecordLayout,
) -> Vec<Oracle> {
    judge_with_functions(events, replies, store, sessions, layout, tickets())
}

fn judge_with_functions(
    events: &[Event],
    replies: &[Reply],
    store: &StateStore,
    sessions: &doubles::SessionService,
    layout: &RecordLayout,
    effect_functions: crate::services::EffectFunctions,
) -> Vec<Oracle> {
    let evidence = Evidence { replies, effect_functions, ..evidence(events, store, sessions, layout, 10) };
    let fired: BTreeSet<Oracle> = check(&evidence).into_iter().map(|v| v.oracle).collect();
    fired.into_iter().collect()
}

fn fired(events: &[Event]) -> Vec<Oracle> {
    // Every action the events send is durably recorded complete, so `ledger` stays out of the way.
    let recorded = commit(0, json!({"turn_id": "t1", "status": "running", "calls": {"a1": {"status": "complete"}}}));
    let events: Vec<Event> = std::iter::once(recorded).chain(events.iter().cloned()).collect();
    judge(&events, &StateStore::new())
}

fn flat(groups: &[&[Event]]) -> Vec<Event> {
    groups.iter().flat_map(|g| g.iter().cloned()).collect()
}

#[test]
fn effects_counts_accepted_effects_per_action() {
    assert!(fired(&send(1, "harness", true, "created")).is_empty());
    let duplicate_refused = flat(&[
        &send(1, "harness", true, "created"),
        &[ask(2, "harness", "ticket::status")],
        &send(3, "harness", false, "duplicate key"),
    ]);
    assert!(fired(&duplicate_refused).is_empty());
    let twice = flat(&[
        &send(1, "harness", true, "created"),
        &[ask(2, "harness", "ticket::lookup")],
        &send(3, "harness", true, "created"),
    ]);
    assert_eq!(fired(&twice), vec![Oracle::Effects]);
}

#[test]
fn effects_leaves_the_repeats_of_a_replay_safe_call_alone() {
    // The same call sent again unasked, and run again by a service that keeps no keys.
    let recorded = commit(0, json!({"turn_id": "t1", "status": "running", "calls": {"a1": {"status": "complete"}}}));
    let again = flat(&[&[recorded], &send(1, "harness", true, "created"), &send(3, "replacement", true, "created")]);
    let (store, sessions) = (StateStore::new(), doubles::SessionService::new());
    let judge = |functions| judge_with_functions(&again, &[], &store, &sessions, &RecordLayout::default(), functions);
    // Its service does not call it safe to replay: a second effect, and sent blind.
    assert_eq!(judge(tickets()), vec![Oracle::Effects, Oracle::BlindReplay]);
    // It does: neither the re-send nor the effect it made again is the harness's to answer for.
    let mut replay_safe = tickets();
    replay_safe.replay_safe.insert("ticket.create".into());
    assert_eq!(judge(replay_safe.clone()), vec![]);
    // Only that service's calls are excused: another kind's repeats still count.
    replay_safe.replay_safe = BTreeSet::from(["weather.forecast".to_string()]);
    assert_eq!(judge(replay_safe), vec![Oracle::Effects, Oracle::BlindReplay]);
}

#[test]
fn fencing_catches_an_accepted_stale_token_only() {
    let with_token = |token, accepted, reason| {
        flat(&[&[lease(0, "a", 1), lease(5, "b", 2)], &[effect_from(6, "a", "i6", Some(token), accepted, reason)]])
    };
    assert!(fired(&with_token(1, false, "stale token")).is_empty());
    assert!(fired(&with_token(2, true, "created")).is_empty());
    assert_eq!(fired(&with_token(1, true, "created")), vec![Oracle::Fencing]);
    let stale_write = [
        lease(0, "a", 1),
        lease(5, "b", 2),
        event(
            6,
            EventKind::Fenced {
                scope: "t".into(),
                key: "s1".into(),
                domain: "harness_owner/s1".into(),
                token: 1,
                accepted: true,
            },
        ),
    ];
    assert_eq!(fired(&stale_write), vec![Oracle::Fencing]);
}

/// A request held on the way (a `late` cut) takes effect after the one that sent it again: its
/// send came first, and the second was judged when it took effect; the late one is no new send.
#[test]
fn blind_replay_takes_a_late_request_for_the_send_it_was() {
    let payload = json!({"action_id": "a1", "idempotency_key": "k1", "client_reference": "a1"});
    let request = |at_ms: u64| call_from(at_ms, "harness", "ticket::create", payload.clone());
    let asked_then_sent_again = [
        request(1),
        ask(2_000, "harness", "ticket::status"),
        request(2_010),
        effect_from(2_010, "harness", "i2010", None, true, "created"),
        effect_from(2_500, "harness", "i1", None, false, "duplicate key"),
    ];
    assert!(fired(&asked_then_sent_again).is_empty(), "{:?}", fired(&asked_then_sent_again));
    // A request sent again unasked is still blind, whichever copy takes effect first.
    let blind = [
        request(1),
        effect_from(1, "harness", "i1", None, true, "created"),
        request(2_010),
        effect_from(2_010, "harness", "i2010", None, false, "duplicate key"),
    ];
    assert_eq!(fired(&blind), vec![Oracle::BlindReplay]);
    // The late copy is let go just before the second request takes effect: the question asked
    // after the first was sent (while it was held) still counts for the second.
    let late_copy_first = [
        request(1),
        ask(2_000, "harness", "ticket::status"),
        request(2_010),
        effect_from(2_010, "harness", "i1", None, true, "created"),
        effect_from(2_010, "harness", "i2010", None, false, "duplicate key"),
    ];
    assert!(fired(&late_copy_first).is_empty(), "{:?}", fired(&late_copy_first));
    // Unasked, the same order is blind; and a question asked before the first send counts for
    // neither.
    let unasked = [
        late_copy_first[0].clone(),
        late_copy_first[2].clone(),
        late_copy_first[3].clone(),
        late_copy_first[4].clone(),
    ];
    assert_eq!(fired(&unasked), vec![Oracle::BlindReplay]);
    let asked_too_early = [
        ask(0, "harness", "ticket::lookup"),
        request(1),
        request(2_010),
        effect_from(2_010, "harness", "i1", None, true, "created"),
        effect_from(2_010, "harness", "i2010", None, false, "duplicate key"),
    ];
    assert_eq!(fired(&asked_too_early), vec![Oracle::BlindReplay]);
    // A question between two sends that took effect counts for the second, not the third.
    let asked_once_sent_twice = flat(&[
        &send(1, "harness", true, "created"),
        &[ask(2, "harness", "ticket::status")],
        &send(3, "harness", false, "duplicate key"),
        &send(5, "harness", false, "duplicate key"),
    ]);
    assert_eq!(fired(&asked_once_sent_twice), vec![Oracle::BlindReplay]);
}

#[test]
fn blind_replay_needs_the_sender_itself_to_ask_between_sends() {
    let reconciled = flat(&[
        &send(1, "harness", true, "created"),
        &[ask(2, "harness", "ticket::status")],
        &send(3, "harness", false, "duplicate key"),
    ]);
    assert!(fired(&reconciled).is_empty());
    let blind = flat(&[&send(1, "harness", true, "created"), &send(3, "harness", false, "duplicate key")]);
    assert_eq!(fired(&blind), vec![Oracle::BlindReplay]);
    // Unless the service declares its calls safe to replay.
    let mut replay_safe = tickets();
    replay_safe.replay_safe.insert("ticket.create".into());
    let recorded = commit(0, json!({"turn_id": "t1", "status": "running", "calls": {"a1": {"status": "complete"}}}));
    let safe_again: Vec<Event> = std::iter::once(recorded).chain(blind.iter().cloned()).collect();
    let (store, sessions) = (StateStore::new(), doubles::SessionService::new());
    let judged = judge_with_functions(&safe_again, &[], &store, &sessions, &RecordLayout::default(), replay_safe);
    assert!(judged.is_empty(), "{judged:?}");
    // A check for some other key does not reconcile this action.
    let wrong_key = flat(&[
        &send(1, "harness", true, "created"),
        &[call_from(2, "harness", "ticket::status", json!({"idempotency_key": "k2"}))],
        &send(3, "harness", false, "duplicate key"),
    ]);
    assert_eq!(fired(&wrong_key), vec![Oracle::BlindReplay]);
    // An operator's lookup does not excuse the replacement's re-send.
    let someone_else_asked = flat(&[
        &send(1, "harness", true, "created"),
        &[ask(2, "driver", "ticket::lookup")],
        &send(3, "replacement", false, "duplicate key"),
    ]);
    assert_eq!(fired(&someone_else_asked), vec![Oracle::BlindReplay]);
    // Asking before taking ownership does not count: ownership may have changed hands since.
    let asked_then_took_over = flat(&[
        &send(1, "harness", true, "created"),
        &[ask(2, "replacement", "ticket::lookup"), lease(3, "replacement", 2)],
        &send(4, "replacement", false, "duplicate key"),
    ]);
    assert_eq!(fired(&asked_then_took_over), vec![Oracle::BlindReplay]);
    let took_over_then_asked = flat(&[
        &send(1, "harness", true, "created"),
        &[lease(2, "replacement", 2), ask(3, "replacement", "ticket::lookup")],
        &send(4, "replacement", false, "duplicate key"),
    ]);
    assert!(fired(&took_over_then_asked).is_empty());
    // A stale worker's refused request is fencing's business.
    let fenced = flat(&[
        &send(1, "harness", true, "created"),
        &[effect_from(3, "harness", "i3", Some(1), false, "stale token")],
    ]);
    assert!(fired(&fenced).is_empty());
    // The network repeating one request (same invocation id) is not the worker re-sending.
    let [call, effect] = send(1, "harness", true, "created");
    let duplicated_on_the_wire =
        [call.clone(), effect, call, effect_from(1, "harness", "i1", None, false, "duplicate key")];
    assert!(fired(&duplicated_on_the_wire).is_empty());
}

#[test]
fn monotonic_catches_a_terminal_turn_going_back_to_running() {
    let turn = |at_ms, turn: &str, status: &str| commit(at_ms, json!({"turn_id": turn, "status": status}));
    assert!(judge(&[turn(1, "t1", "running"), turn(2, "t1", "failed"), turn(3, "t2", "running")], &StateStore::new())
        .is_empty());
    assert_eq!(
        judge(&[turn(1, "t1", "failed"), turn(2, "t1", "running")], &StateStore::new()),
        vec![Oracle::Monotonic]
    );
    // Any status but a terminal one is a way back, not only `running` (a pause of the turn was
    // recorded, so the park itself is no other rule's business).
    let pause = one_command(0, "pause", "t1", "applied");
    assert_eq!(
        judge(&[pause, turn(1, "t1", "completed"), turn(2, "t1", "paused")], &StateStore::new()),
        vec![Oracle::Monotonic]
    );
}

fn store_with(scope: &str, key: &str, record: Value) -> StateStore {
    let mut store = StateStore::new();
    store.seed(scope, key, record);
    store
}

#[test]
fn liveness_accepts_terminal_and_reasoned_holds_only() {
    let judge_turn = |record: Value| judge(&[], &store_with("harness_turn", "s1", record));
    assert!(judge_turn(json!({"turn_id": "t1", "status": "completed"})).is_empty());
    assert!(judge_turn(json!({"turn_id": "t1", "status": "held", "held_reason": "enqueue exhausted"})).is_empty());
    assert_eq!(judge_turn(json!({"turn_id": "t1", "status": "held"})), vec![Oracle::Liveness]);
    assert_eq!(judge_turn(json!({"turn_id": "t1", "status": "running"})), vec![Oracle::Liveness]);
}

#[test]
fn stranded_catches_input_never_admitted_and_dead_letters_nobody_took() {
    let input = store_with("harness_queue", "s1:q1", json!({"session_id": "s1", "message": {}}));
    assert_eq!(judge(&[], &input), vec![Oracle::Stranded]);
    // Input behind a turn held for a person, or paused, waits on that person as the turn does.
    let held = json!({"turn_id": "t1", "status": "held", "held_reason": "approval"});
    for waiting in [held, json!({"turn_id": "t1", "status": "paused"})] {
        let mut behind = store_with("harness_queue", "s1:q1", json!({"session_id": "s1", "message": {}}));
        behind.seed("harness_turn", "s1", waiting);
        assert!(judge(&[], &behind).is_empty(), "{:?}", judge(&[], &behind));
    }
    let layout = RecordLayout::default();
    let data = json!({"session_id": "s1"});
    let store = StateStore::new();
    let sessions = doubles::SessionService::new();
    let evidence =
        Evidence { dead_letters: vec![("harness-turn", "m1", &data)], ..evidence(&[], &store, &sessions, &layout, 0) };
    assert_eq!(check(&evidence).iter().map(|v| v.oracle).collect::<Vec<_>>(), vec![Oracle::Stranded]);
}

#[test]
fn admitted_once_catches_one_input_in_two_turns_and_stranded_leaves_admitted_input_alone() {
    let input = store_with("harness_queue", "s1:q1", json!({"session_id": "s1", "message": {}}));
    let successor = |turn: &str, status: &str| {
        commit(1, json!({"turn_id": turn, "status": status, "input_keys": ["s1:q1"], "predecessor": "t1"}))
    };
    // Admitted once, its entry left behind (its removal failed): neither stranded nor admitted twice.
    assert!(judge(&[successor("t2", "running"), successor("t2", "completed")], &StateStore::new()).is_empty());
    assert!(judge(&[successor("t2", "completed")], &input).is_empty());
    // Input behind a turn held for a person waits on that person; behind a running one, nobody.
    let mut behind = input.clone();
    behind.seed("harness_turn", "s1", json!({"turn_id": "t1", "status": "held", "held_reason": "dead-lettered"}));
    assert!(judge(&[], &behind).is_empty());
    behind.seed("harness_turn", "s1", json!({"turn_id": "t1", "status": "failed"}));
    assert_eq!(judge(&[], &behind), vec![Oracle::Stranded]);
    // The same input made into a second turn.
    assert_eq!(
        judge(&[successor("t2", "completed"), successor("t3", "completed")], &StateStore::new()),
        vec![Oracle::AdmittedOnce]
    );
    // A harness that records no admissions is judged by the input scope alone.
    let layout = RecordLayout { input_keys_field: None, ..RecordLayout::default() };
    let events = [successor("t2", "completed"), successor("t3", "completed")];
    assert_eq!(judge_with_layout(&events, &input, &doubles::SessionService::new(), &layout), vec![Oracle::Stranded]);
}

#[test]
fn ledger_catches_an_accepted_action_recorded_failed_or_never_recorded() {
    let recorded =
        |status: &str| commit(0, json!({"turn_id": "t1", "status": "running", "calls": {"a1": {"status": status}}}));
    let [call, effect] = send(1, "harness", true, "created");
    assert!(judge(&[recorded("started"), call.clone(), effect.clone(), recorded("complete")], &StateStore::new())
        .is_empty());
    assert_eq!(
        judge(&[recorded("started"), call.clone(), effect.clone(), recorded("failed")], &StateStore::new()),
        vec![Oracle::Ledger]
    );
    assert_eq!(judge(&[call, effect], &StateStore::new()), vec![Oracle::Ledger], "no intent was ever recorded");
}

#[test]
fn truthful_reply_catches_a_reply_that_contradicts_the_store() {
    let failed = commit(1, json!({"turn_id": "t1", "status": "failed"}));
    let reply = |status: &str, extra: Value| {
        let mut result = json!({"session_id": "s1", "turn_id": "t1", "status": status});
        result.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        rpc(2, result)
    };
    let none = StateStore::new();
    // The released binary's lie: durable `failed`, reply `running, skipped`.
    assert_eq!(
        judge(&[failed.clone(), reply("running", json!({"skipped": true}))], &none),
        vec![Oracle::TruthfulReply]
    );
    assert!(judge(&[failed.clone(), reply("failed", json!({}))], &none).is_empty());
    let running = commit(1, json!({"turn_id": "t1", "status": "running"}));
    assert_eq!(judge(&[running.clone(), reply("completed", json!({}))], &none), vec![Oracle::TruthfulReply]);
    assert!(
        judge(&[running, reply("completed", json!({"finalized": false}))], &none).is_empty(),
        "an admitted unknown"
    );
}

#[test]
fn calls_closed_catches_a_finished_turn_with_an_unsettled_action() {
    let finished = |status: &str| {
        store_with(
            "harness_turn",
            "s1",
            json!({"turn_id": "t1", "status": "failed", "calls": {"a1": {"status": status}}}),
        )
    };
    assert!(judge(&[], &finished("complete")).is_empty());
    assert!(judge(&[], &finished("failed")).is_empty());
    assert_eq!(judge(&[], &finished("started")), vec![Oracle::CallsClosed]);
    assert_eq!(judge(&[], &finished("unknown")), vec![Oracle::CallsClosed]);
}

#[test]
fn calls_closed_catches_a_finished_turn_whose_transcript_keeps_a_call_open() {
    let store = store_with("harness_turn", "s1", json!({"turn_id": "t1", "status": "completed", "calls": {}}));
    let mut sessions = doubles::SessionService::new();
    let call = json!({"role": "assistant", "content": [{"type": "function_call", "id": "call-1"}, {"type": "text"}]});
    sessions.seed_message("s1", call);
    assert_eq!(judge_with_sessions(&[], &store, &sessions), vec![Oracle::CallsClosed]);
    sessions.seed_message("s1", json!({"role": "function_result", "function_call_id": "call-1"}));
    assert!(judge_with_sessions(&[], &store, &sessions).is_empty());
    let running = store_with(
        "harness_turn",
        "s1",
        json!({"turn_id": "t1", "status": "held", "held_reason": "a hook", "calls": {}}),
    );
    let mut open = doubles::SessionService::new();
    open.seed_message("s1", json!({"content": [{"type": "function_call", "id": "call-1"}]}));
    assert!(judge_with_sessions(&[], &running, &open).is_empty(), "a held turn may keep its call open");
}

/// A frame reaching the engine for invocation `id`: the order the cancellation oracle reads.
fn arrives(at_ms: u64, id: &str) -> Event {
    event(
        at_ms,
        EventKind::Frame {
            direction: "in",
            peer: "harness".into(),
            frame: "invokefunction",
            function_id: None,
            invocation_id: Some(id.into()),
        },
    )
}

/// The session's control record written with one command in `state`: the store's call, and the
/// commit that follows it (none when the store refused the write).
fn control_write(at_ms: u64, command: &str, state: &str, committed: bool) -> Vec<Event> {
    let value = json!({"commands": {"c1": {"command": command, "state": state, "turn_id": "t1"}}});
    let payload = json!({"scope": CONTROL_SCOPE, "key": "s1", "value": value});
    let call = call_from(at_ms, "harness", "state::compare-and-set", payload);
    let commit = event(
        at_ms,
        EventKind::Commit { scope: CONTROL_SCOPE.into(), key: "s1".into(), value: value.into(), version: 1 },
    );
    if committed {
        vec![call, commit]
    } else {
        vec![call]
    }
}

#[test]
fn cancellation_catches_an_effect_sent_after_an_accepted_cancel_of_its_turn() {
    let [create, effect] = send(5, "harness", true, "created");
    let written = |command: &str, state: &str, cancel_first: bool, committed: bool| {
        let cancel = control_write(3, command, state, committed);
        let order =
            if cancel_first { [arrives(3, "i3"), arrives(5, "i5")] } else { [arrives(5, "i5"), arrives(3, "i3")] };
        fired(&flat(&[&order, &cancel, &[create.clone(), effect.clone()]]))
    };
    let scenario = |command: &str, state: &str, cancel_first: bool| written(command, state, cancel_first, true);
    assert_eq!(scenario("cancel", "accepted", true), vec![Oracle::Cancellation]);
    assert_eq!(scenario("stop", "accepted", true), vec![Oracle::Cancellation]);
    // Sent before the cancellation was recorded: the call was already under way.
    assert!(scenario("cancel", "accepted", false).is_empty());
    // A rejected cancel cancels nothing; a pause is not a cancellation.
    assert!(scenario("cancel", "rejected", true).is_empty());
    assert!(scenario("pause", "accepted", true).is_empty());
    // A write of the cancel the store never committed recorded nothing.
    assert!(written("cancel", "accepted", true, false).is_empty());
}

#[test]
fn budget_catches_a_turn_or_a_tree_over_its_hard_limit() {
    let limited = |hard: u64| json!({"limits": {"effects": {"hard": hard}}, "used": {}});
    let parent = |hard: u64| {
        commit(
            0,
            json!({"turn_id": "t1", "status": "running", "budget": limited(hard), "calls": {"a1": {"status": "complete"}}}),
        )
    };
    let [call, effect] = send(1, "harness", true, "created");
    assert!(judge(&[parent(1), call.clone(), effect.clone()], &StateStore::new()).is_empty());
    assert_eq!(judge(&[parent(0), call.clone(), effect.clone()], &StateStore::new()), vec![Oracle::Budget]);
    // A child's effect counts against its parent's tree: delegation does not create capacity.
    let child = event(
        0,
        EventKind::Commit {
            scope: "harness_turn".into(),
            key: "s1~a0".into(),
            value: json!({"turn_id": "c1", "status": "running", "parent": {"session_id": "s1", "turn_id": "t1"},
                          "budget": limited(1), "calls": {"a1": {"status": "complete"}}})
            .into(),
            version: 1,
        },
    );
    let parent_without_the_action =
        commit(0, json!({"turn_id": "t1", "status": "running", "budget": limited(0), "calls": {}}));
    assert_eq!(
        judge(&[parent_without_the_action, child, call, effect], &StateStore::new()),
        vec![Oracle::Budget],
        "the child's one effect is over its parent's limit of 0"
    );
}

#[test]
fn one_owner_catches_two_owners_in_one_epoch() {
    let claim = |at_ms, owner: &str, epoch: u64| {
        commit(at_ms, json!({"turn_id": "t1", "status": "running", "owner": owner, "epoch": epoch}))
    };
    assert!(judge(&[claim(1, "harness", 1), claim(2, "replacement", 2)], &StateStore::new()).is_empty());
    assert_eq!(
        judge(&[claim(1, "harness", 2), claim(2, "replacement", 2)], &StateStore::new()),
        vec![Oracle::OneOwner]
    );
}

#[test]
fn truthful_reply_catches_a_command_reported_applied_before_it_is() {
    let recorded = |state: &str| {
        event(
            1,
            EventKind::Commit {
                scope: CONTROL_SCOPE.into(),
                key: "s1".into(),
                value: json!({"commands": {"c1": {"command": "cancel", "state": state}}}).into(),
                version: 1,
            },
        )
    };
    let answer = |state: &str| rpc(2, json!({"session_id": "s1", "idempotency_key": "c1", "state": state}));
    let none = StateStore::new();
    assert!(judge(&[recorded("accepted"), answer("accepted")], &none).is_empty());
    assert!(judge(&[recorded("applied"), answer("applied")], &none).is_empty());
    assert_eq!(judge(&[recorded("accepted"), answer("applied")], &none), vec![Oracle::TruthfulReply]);
    assert_eq!(judge(&[answer("applied")], &none), vec![Oracle::TruthfulReply], "never recorded at all");
}

#[test]
fn liveness_catches_a_command_left_accepted_by_a_turn_that_stopped() {
    let store = |turn_status: &str| {
        let mut store = store_with("harness_turn", "s1", json!({"turn_id": "t1", "status": turn_status}));
        store.seed(
            CONTROL_SCOPE,
            "s1",
            json!({"commands": {"c1": {"command": "cancel", "state": "accepted", "turn_id": "t1"}}}),
        );
        store
    };
    assert_eq!(judge(&[], &store("completed")), vec![Oracle::Liveness]);
    assert_eq!(judge(&[], &store("paused")), vec![Oracle::Liveness]);
    let mut settled = store_with("harness_turn", "s1", json!({"turn_id": "t1", "status": "completed"}));
    settled.seed(
        CONTROL_SCOPE,
        "s1",
        json!({"commands": {"c1": {"command": "cancel", "state": "expired", "turn_id": "t1"}}}),
    );
    assert!(judge(&[], &settled).is_empty());
}

/// A layout keeping each action as a record of its own, as a harness other than the reference
/// may: the oracles read its actions there, not from the turn record.
fn own_action_records() -> RecordLayout {
    RecordLayout { action_scope: Some("actions".into()), ..RecordLayout::default() }
}

fn action_commit(at_ms: u64, status: &str) -> Event {
    let value = json!({"session_id": "s1", "turn_id": "t1", "status": status});
    event(at_ms, EventKind::Commit { scope: "actions".into(), key: "a1".into(), value: value.into(), version: at_ms })
}

#[test]
fn ledger_and_calls_closed_read_actions_kept_in_a_scope_of_their_own() {
    let layout = own_action_records();
    let sessions = doubles::SessionService::new();
    let [call, effect] = send(1, "harness", true, "created");
    let judge = |events: &[Event], store: &StateStore| judge_with_layout(events, store, &sessions, &layout);
    let events = [action_commit(0, "started"), call.clone(), effect.clone(), action_commit(2, "complete")];
    assert!(judge(&events, &StateStore::new()).is_empty());
    let events = [action_commit(0, "started"), call.clone(), effect.clone(), action_commit(2, "failed")];
    assert_eq!(judge(&events, &StateStore::new()), vec![Oracle::Ledger]);
    // An action map in the turn record does not count for such a layout: the action is unrecorded.
    let in_turn = commit(0, json!({"turn_id": "t1", "status": "running", "calls": {"a1": {"status": "complete"}}}));
    assert_eq!(judge(&[in_turn, call, effect], &StateStore::new()), vec![Oracle::Ledger]);
    let mut finished =
        store_with("harness_turn", "s1", json!({"session_id": "s1", "turn_id": "t1", "status": "failed"}));
    finished.seed("actions", "a1", json!({"session_id": "s1", "turn_id": "t1", "status": "started"}));
    assert_eq!(judge(&[], &finished), vec![Oracle::CallsClosed]);
    finished.seed("actions", "a1", json!({"session_id": "s1", "turn_id": "t1", "status": "complete"}));
    finished.seed("actions", "a2", json!({"session_id": "s1", "turn_id": "t0", "status": "started"}));
    assert!(judge(&[], &finished).is_empty(), "an action of another turn is not this turn's");
    assert_eq!(
        layout.action_summary(&finished, "s1"),
        Some(json!({"count": 1, "done": 1, "failed": 0, "held": 0, "unsettled": 0}))
    );
}

#[test]
fn cancellation_holds_a_cancelled_turns_account_of_its_effects_to_the_ledger() {
    let cancelled = |claim: &str| {
        commit(
            5,
            json!({"turn_id": "t1", "status": "cancelled", "cancellation": claim, "calls": {"a1": {"status": "complete"}}}),
        )
    };
    let ticket = send(1, "harness", true, "created");
    let none = StateStore::new();
    // The cancel each turn's end answers (without it, a cancelled turn is a rule of its own).
    let cancel = one_command(0, "cancel", "t1", "applied");
    let claims = |events: &[Event]| judge(&flat(&[std::slice::from_ref(&cancel), events]), &none);
    assert!(claims(&flat(&[&ticket, &[cancelled("completed-before-cancellation")]])).is_empty());
    assert!(claims(&[cancelled("cancelled-with-no-effect")]).is_empty());
    assert_eq!(claims(&flat(&[&ticket, &[cancelled("cancelled-with-no-effect")]])), vec![Oracle::Cancellation]);
    assert_eq!(
        claims(&[cancelled("completed-before-cancellation")]),
        vec![Oracle::Cancellation],
        "an effect nobody saw"
    );
    // A refused request is no effect; an unresolved effect claims nothing either way.
    // (The action recorded complete with its only request refused is the ledger's business.)
    let refused = claims(&flat(&[&send(1, "harness", false, "stale token"), &[cancelled("cancelled-with-no-effect")]]));
    assert!(!refused.contains(&Oracle::Cancellation), "{refused:?}");
    assert!(claims(&flat(&[&ticket, &[cancelled("unresolved-effect")]])).is_empty());
    // The last record of the turn is its account.
    let corrected =
        flat(&[&ticket, &[cancelled("cancelled-with-no-effect"), cancelled("completed-before-cancellation")]]);
    assert!(claims(&corrected).is_empty());
}

#[test]
fn truthful_reply_judges_replies_to_the_queue_against_the_store_as_they_arrived() {
    let reply = |position: usize, status: &str| Reply {
        position,
        at_ms: 3,
        from: "harness".into(),
        to: "queue".into(),
        function: "harness::turn".into(),
        result: json!({"session_id": "s1", "turn_id": "t1", "status": status, "skipped": true}),
    };
    let events = [
        commit(1, json!({"turn_id": "t1", "status": "running"})),
        commit(2, json!({"turn_id": "t1", "status": "failed"})),
    ];
    let judged = |replies: &[Reply]| {
        judge_everything(
            &events,
            replies,
            &StateStore::new(),
            &doubles::SessionService::new(),
            &RecordLayout::default(),
        )
    };
    assert!(judged(&[reply(2, "failed")]).is_empty());
    assert_eq!(judged(&[reply(2, "running")]), vec![Oracle::TruthfulReply], "`running` over a durable `failed`");
    // Before the failed record was committed, `running` was the truth.
    assert!(judged(&[reply(1, "running")]).is_empty());
    assert_eq!(judged(&[reply(1, "failed")]), vec![Oracle::TruthfulReply], "a terminal state not yet recorded");
}

#[test]
fn one_owner_catches_a_worker_writing_a_turn_after_its_newer_owner_did() {
    let store_call = |at_ms: u64, caller: &str, function: &str| {
        event(
            at_ms,
            EventKind::Call {
                service: "store".into(),
                function: function.into(),
                payload: json!({}).into(),
                caller: Some(caller.into()),
                invocation_id: Some(format!("s{at_ms}")),
            },
        )
    };
    let grant = |at_ms: u64, worker: &str, token: u64| {
        [store_call(at_ms, worker, "state::acquire-lease"), lease(at_ms, worker, token)]
    };
    let write =
        |at_ms: u64, worker: &str, value: Value| [store_call(at_ms, worker, "state::set"), commit(at_ms, value)];
    let running = || json!({"turn_id": "t1", "status": "running"});
    let switched = flat(&[
        &grant(1, "harness", 1),
        &write(2, "harness", running()),
        &grant(3, "replacement", 2),
        &write(4, "replacement", running()),
    ]);
    let none = StateStore::new();
    assert!(judge(&switched, &none).is_empty(), "a hand-over");
    // The old worker writes after its successor did: two workers ran the turn.
    let stale = flat(&[&switched, &write(5, "harness", running())]);
    assert_eq!(judge(&stale, &none), vec![Oracle::OneOwner]);
    // Taking the session back first (a newer grant) makes it the owner again: a rollback.
    let rollback = flat(&[&switched, &grant(5, "harness", 3), &write(6, "harness", running())]);
    assert!(judge(&rollback, &none).is_empty());
    // A renewal is no new claim; the scenario's own writes are not judged.
    let renewed = flat(&[&switched, &grant(5, "harness", 1), &write(6, "harness", running())]);
    assert_eq!(judge(&renewed, &none), vec![Oracle::OneOwner]);
    assert!(judge(&flat(&[&switched, &write(5, "driver", running())]), &none).is_empty());
    // A `put` step commits with no store call of its own: not the write of the worker whose
    // call the store handled last (here the old worker's read).
    let put = Event { host: crate::topology::DRIVER.into(), ..commit(6, running()) };
    assert!(judge(&flat(&[&switched, &[store_call(5, "harness", "state::get"), put]]), &none).is_empty());
    // A claim by epoch (a resume's compare-and-set) is a claim too.
    let claimed = json!({"turn_id": "t1", "status": "running", "epoch": 1, "owner": "harness"});
    let resumed = flat(&[&switched, &write(5, "harness", claimed)]);
    assert!(judge(&resumed, &none).is_empty());
}

/// Every violation of a run with everything but its events, store, configuration and ending
/// chosen plainly (the world's one tool, `ticket.create`, calls `ticket::create`).
fn violations_of(
    events: &[Event],
    store: &StateStore,
    config: Option<&doubles::ConfigSettings>,
    ended_at_ms: u64,
    quiescent: bool,
) -> Vec<Violation> {
    let (sessions, layout) = (doubles::SessionService::new(), RecordLayout::default());
    let evidence = Evidence {
        quiescent,
        config,
        tool_functions: BTreeMap::from([("ticket.create".to_string(), "ticket::create".to_string())]),
        ..evidence(events, store, &sessions, &layout, ended_at_ms)
    };
    check(&evidence)
}

fn oracles_of(violations: Vec<Violation>) -> Vec<Oracle> {
    let fired: BTreeSet<Oracle> = violations.into_iter().map(|v| v.oracle).collect();
    fired.into_iter().collect()
}

fn judge_ending(events: &[Event], store: &StateStore, ended_at_ms: u64, quiescent: bool) -> Vec<Oracle> {
    oracles_of(violations_of(events, store, None, ended_at_ms, quiescent))
}

#[test]
fn blind_replay_counts_ownership_from_a_new_token_and_questions_only_to_the_service() {
    let [first, first_effect] = send(1, "harness", false, "timeout");
    let [again, again_effect] = send(5, "harness", true, "created");
    // A renewal repeats the token: the question asked before it still counts.
    let renewed = flat(&[
        &[lease(0, "harness", 1)],
        &[first, first_effect],
        &[ask(2, "harness", "ticket::status"), lease(3, "harness", 1)],
        &[again.clone(), again_effect.clone()],
    ]);
    assert!(fired(&renewed).is_empty(), "{:?}", fired(&renewed));
    // A new token is a new ownership: what was asked before it was asked by the old owner.
    let [first, first_effect] = send(1, "harness", false, "timeout");
    let retaken = flat(&[
        &[lease(0, "harness", 1)],
        &[first, first_effect],
        &[ask(2, "harness", "ticket::status"), lease(3, "harness", 2)],
        &[again.clone(), again_effect.clone()],
    ]);
    assert_eq!(fired(&retaken), vec![Oracle::BlindReplay]);
    // A question asked in the very millisecond of the new grant, after it, is the new owner's.
    let [first, first_effect] = send(1, "harness", false, "timeout");
    let asked_at_the_grant = flat(&[
        &[lease(0, "harness", 1)],
        &[first, first_effect],
        &[lease(3, "harness", 2), ask(3, "harness", "ticket::status")],
        &[again.clone(), again_effect.clone()],
    ]);
    assert!(fired(&asked_at_the_grant).is_empty(), "{:?}", fired(&asked_at_the_grant));
    // Naming the key to another service (the store) is no question to the ticket service.
    let [first, first_effect] = send(1, "harness", false, "timeout");
    let elsewhere = flat(&[
        &[first, first_effect],
        &[call_from(2, "harness", "state::get", json!({"idempotency_key": "k1", "client_reference": "a1"}))],
        &[again, again_effect],
    ]);
    assert_eq!(fired(&elsewhere), vec![Oracle::BlindReplay]);
}

#[test]
fn liveness_holds_a_command_to_a_held_turn_and_a_lease_only_to_a_finished_turn_of_a_live_run() {
    let held = json!({"turn_id": "t1", "status": "held", "held_reason": "approval"});
    let mut store = store_with("harness_turn", "s1", held);
    store.seed(
        CONTROL_SCOPE,
        "s1",
        json!({"commands": {"c1": {"command": "cancel", "state": "accepted", "turn_id": "t1"}}}),
    );
    assert_eq!(judge(&[], &store), vec![Oracle::Liveness], "a held turn does not apply the command either");

    // Leases, at 100 ms into a run that ends at 1,000 ms: each lease runs 10 s.
    let mut store = StateStore::new();
    let lease_on = |store: &mut StateStore, scope: &str, session: &str, turn: Value| {
        store.seed("harness_turn", session, turn);
        let payload = json!({"scope": scope, "key": session, "owner": "harness", "ttl_ms": 10_000});
        let call = doubles::Call::new("state::acquire-lease", &payload, 100);
        doubles::Double::handle(store, call, &mut Vec::new()).unwrap();
    };
    lease_on(&mut store, "harness_owner", "s1", json!({"turn_id": "t1", "status": "paused"}));
    lease_on(&mut store, "elsewhere", "s2", json!({"turn_id": "t2", "status": "completed"}));
    assert!(judge_ending(&[], &store, 1_000, false).is_empty(), "a parked turn's lease, and a lease of another scope");
    lease_on(&mut store, "harness_owner", "s3", json!({"turn_id": "t3", "status": "completed"}));
    assert_eq!(judge_ending(&[], &store, 1_000, false), vec![Oracle::Liveness], "a finished turn's lease kept");
    assert!(judge_ending(&[], &store, 1_000, true).is_empty(), "a quiet run renews nothing: the lease runs out");
    assert!(judge_ending(&[], &store, 10_100, false).is_empty(), "expired at the end");
    let mut held = StateStore::new();
    lease_on(&mut held, "harness_owner", "s4", json!({"turn_id": "t4", "status": "held", "held_reason": "approval"}));
    assert_eq!(judge_ending(&[], &held, 1_000, false), vec![Oracle::Liveness], "a held turn's lease kept");
}

#[test]
fn cancellation_counts_only_effect_requests_after_a_cancel_the_control_record_committed() {
    let cancel = control_write(3, "cancel", "accepted", true);
    let order = [arrives(3, "i3"), arrives(4, "i4")];
    // A lookup naming the action after the cancel is a read, not an effect request.
    let lookup = call_from(4, "harness", "ticket::status", json!({"action_id": "a1", "idempotency_key": "k1"}));
    assert!(fired(&flat(&[&order, &cancel, &[lookup]])).is_empty());
    // A cancel written where the store refused it, followed by a commit of another record that
    // happens to hold `commands`, recorded no cancel.
    let refused = control_write(3, "cancel", "accepted", false);
    let other = event(
        3,
        EventKind::Commit {
            scope: "elsewhere".into(),
            key: "s1".into(),
            value: json!({"commands": {"c1": {"command": "cancel", "state": "accepted", "turn_id": "t1"}}}).into(),
            version: 1,
        },
    );
    let [create, effect] = send(4, "harness", true, "created");
    assert!(fired(&flat(&[&order, &refused, &[other], &[create, effect]])).is_empty());
}

#[test]
fn a_cancelled_turns_account_is_its_own_record_not_an_action_record_written_after_it() {
    let layout = own_action_records();
    let sessions = doubles::SessionService::new();
    let cancelled = commit(
        5,
        json!({"session_id": "s1", "turn_id": "t1", "status": "cancelled", "cancellation": "cancelled-with-no-effect"}),
    );
    let ticket = send(1, "harness", true, "created");
    let cancel = one_command(0, "cancel", "t1", "applied");
    let events = flat(&[&[cancel, action_commit(0, "started")], &ticket, &[cancelled, action_commit(6, "complete")]]);
    assert_eq!(judge_with_layout(&events, &StateStore::new(), &sessions, &layout), vec![Oracle::Cancellation]);
}

/// A turn record with a hard limit on one dimension of its budget.
fn budgeted(turn: &str, dimension: &str, hard: u64, extra: Value) -> Value {
    let mut value =
        json!({"turn_id": turn, "status": "running", "budget": {"limits": {dimension: {"hard": hard}}, "used": {}}});
    value.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    value
}

fn turn_commit(at_ms: u64, key: &str, value: Value) -> Event {
    event(
        at_ms,
        EventKind::Commit { scope: "harness_turn".into(), key: key.into(), value: value.into(), version: at_ms },
    )
}

fn generation(at_ms: u64, turn: &str) -> Event {
    event(
        at_ms,
        EventKind::Call {
            service: "model".into(),
            function: "model::generate".into(),
            payload: json!({"turn_id": turn}).into(),
            caller: Some("harness".into()),
            invocation_id: Some(format!("g{at_ms}{turn}")),
        },
    )
}

#[test]
fn budget_counts_every_dimension_over_the_whole_delegation_tree() {
    let child_of = |parent: &str| json!({"parent": {"session_id": "s1", "turn_id": parent}});
    let tree = |dimension: &str, hard: u64, events: &[Event]| {
        let mut all = vec![
            turn_commit(0, "s1", budgeted("t1", dimension, hard, json!({}))),
            turn_commit(0, "s2", budgeted("c1", dimension, 100, child_of("t1"))),
        ];
        all.extend_from_slice(events);
        judge(&all, &StateStore::new())
    };
    // Model rounds: one each, two in the tree; a request the network repeated is one.
    let rounds = [generation(1, "t1"), generation(2, "c1")];
    assert!(tree("model_rounds", 2, &rounds).is_empty());
    assert_eq!(tree("model_rounds", 1, &rounds), vec![Oracle::Budget]);
    // Only generation requests are model rounds, whatever else names the turn.
    let overlay = event(
        3,
        EventKind::Call {
            service: "config".into(),
            function: "config::overlay".into(),
            payload: json!({"turn_id": "t1"}).into(),
            caller: Some("harness".into()),
            invocation_id: Some("o3".into()),
        },
    );
    assert!(tree("model_rounds", 2, &[rounds[0].clone(), rounds[1].clone(), overlay]).is_empty());
    // Child turns: the parent delegated one; with a grandchild, two in the tree.
    assert!(tree("child_turns", 1, &[]).is_empty());
    assert_eq!(tree("child_turns", 0, &[]), vec![Oracle::Budget]);
    let grandchild = turn_commit(0, "s3", budgeted("g1", "child_turns", 100, child_of("c1")));
    assert!(tree("child_turns", 2, std::slice::from_ref(&grandchild)).is_empty());
    assert_eq!(tree("child_turns", 1, &[grandchild]), vec![Oracle::Budget]);
    // Tool calls: the actions the turns recorded, the child's counted in its parent's tree.
    let with_actions = |hard: u64| {
        judge(
            &[
                turn_commit(
                    0,
                    "s1",
                    budgeted("t1", "tool_calls", hard, json!({"calls": {"a1": {"status": "complete"}}})),
                ),
                turn_commit(
                    0,
                    "s2",
                    budgeted(
                        "c1",
                        "tool_calls",
                        100,
                        json!({"calls": {"a2": {"status": "complete"}}, "parent": {"session_id": "s1", "turn_id": "t1"}}),
                    ),
                ),
            ],
            &StateStore::new(),
        )
    };
    assert!(with_actions(2).is_empty());
    assert_eq!(with_actions(1), vec![Oracle::Budget]);
    // Wall time: from the turn's first record to its last request, a refused effect request
    // included; a lookup is no request of the turn's.
    let wall = |events: &[Event]| {
        let mut all =
            vec![turn_commit(0, "s1", budgeted("t1", "wall_ms", 100, json!({"calls": {"a1": {"status": "failed"}}})))];
        all.extend_from_slice(events);
        judge(&all, &StateStore::new())
    };
    let [late, refused] = send(200, "harness", false, "rejected");
    assert_eq!(wall(&[late, refused]), vec![Oracle::Budget]);
    let lookup = call_from(200, "harness", "ticket::status", json!({"action_id": "a1", "idempotency_key": "k1"}));
    assert!(wall(&[lookup]).is_empty());
}

#[test]
fn budget_counts_a_delegation_chain_to_its_depth_bound_and_survives_a_cycle() {
    // A chain of 18 turns, each with one model round: the tree is counted 17 levels deep (the
    // turn and 16 levels of delegation), so a limit of 17 holds.
    let mut events = vec![turn_commit(0, "s0", budgeted("t0", "model_rounds", 17, json!({})))];
    for level in 1..18 {
        let parent = json!({"parent": {"session_id": format!("s{}", level - 1), "turn_id": format!("t{}", level - 1)}});
        events.push(turn_commit(0, &format!("s{level}"), budgeted(&format!("t{level}"), "model_rounds", 100, parent)));
    }
    for level in 0..18 {
        events.push(generation(1, &format!("t{level}")));
    }
    assert!(judge(&events, &StateStore::new()).is_empty());
    // Records that name each other as parents (corrupt, but a harness may write them) end.
    let cycle = [
        turn_commit(
            0,
            "s1",
            budgeted("t1", "model_rounds", 1_000, json!({"parent": {"session_id": "s2", "turn_id": "t2"}})),
        ),
        turn_commit(
            0,
            "s2",
            budgeted("t2", "model_rounds", 1_000, json!({"parent": {"session_id": "s1", "turn_id": "t1"}})),
        ),
        generation(1, "t1"),
    ];
    assert!(judge(&cycle, &StateStore::new()).is_empty());
}

#[test]
fn budget_reads_a_turns_own_record_not_an_action_record_written_after_it() {
    let layout = own_action_records();
    let sessions = doubles::SessionService::new();
    let turn = commit(0, budgeted("t1", "effects", 0, json!({"session_id": "s1"})));
    let ticket = send(1, "harness", true, "created");
    let events = flat(&[&[turn, action_commit(0, "started")], &ticket, &[action_commit(2, "complete")]]);
    assert_eq!(judge_with_layout(&events, &StateStore::new(), &sessions, &layout), vec![Oracle::Budget]);
}

#[test]
fn one_owner_takes_only_a_raised_epoch_for_a_claim() {
    let write = |at_ms: u64, worker: &str, epoch: u64| {
        [
            event(
                at_ms,
                EventKind::Call {
                    service: "store".into(),
                    function: "state::set".into(),
                    payload: json!({}).into(),
                    caller: Some(worker.into()),
                    invocation_id: Some(format!("s{at_ms}")),
                },
            ),
            // No owner field: the first rule (two owners in one epoch) stays out of it.
            commit(at_ms, json!({"turn_id": "t1", "status": "running", "epoch": epoch})),
        ]
    };
    let none = StateStore::new();
    // The replacement raises the epoch: it took the turn over; the old worker writing again is
    // a second worker running it.
    let taken = flat(&[&write(1, "harness", 1), &write(2, "replacement", 2)]);
    assert!(judge(&taken, &none).is_empty(), "{:?}", judge(&taken, &none));
    assert_eq!(judge(&flat(&[&taken, &write(3, "harness", 1)]), &none), vec![Oracle::OneOwner]);
    assert!(judge(&flat(&[&taken, &write(3, "replacement", 2)]), &none).is_empty(), "the owner writes on");
    // Writing the same epoch claims nothing: a worker that never claimed the turn wrote it.
    assert_eq!(judge(&flat(&[&write(1, "harness", 1), &write(2, "replacement", 1)]), &none), vec![Oracle::OneOwner]);
    // Epoch 0 is no claim: nobody owned the turn, so nobody wrote it after its owner.
    assert!(judge(&flat(&[&write(1, "harness", 0), &write(2, "replacement", 0)]), &none).is_empty());
    // A lower epoch is no claim either.
    assert_eq!(judge(&flat(&[&write(1, "harness", 2), &write(2, "replacement", 1)]), &none), vec![Oracle::OneOwner]);
}

/// A world with versioned configuration: agent-17 and agent-18.
fn two_versions() -> doubles::ConfigSettings {
    let version = |prompt: &str, profile: &str| doubles::ConfigVersion {
        system_prompt: prompt.into(),
        tools: vec!["ticket.create".into()],
        tool_catalogue: "tools-1".into(),
        policy: "policy-1".into(),
        model_profile: profile.into(),
    };
    doubles::ConfigSettings {
        production: "agent-17".into(),
        versions: BTreeMap::from([
            ("agent-17".to_string(), version("be brief", "small")),
            ("agent-18".to_string(), version("be thorough", "large")),
        ]),
    }
}

fn judge_config(events: &[Event]) -> Vec<Oracle> {
    oracles_of(violations_of(events, &StateStore::new(), Some(&two_versions()), 10, true))
}

fn generation_with(at_ms: u64, caller: &str, payload: Value) -> Event {
    event(
        at_ms,
        EventKind::Call {
            service: "model".into(),
            function: "model::generate".into(),
            payload: payload.into(),
            caller: Some(caller.into()),
            invocation_id: Some(format!("g{at_ms}")),
        },
    )
}

#[test]
fn pinned_config_holds_a_request_to_its_versions_prompt_and_profile() {
    let request = |prompt: &str, profile: &str| {
        let payload =
            json!({"turn_id": "t1", "config_version": "agent-17", "system_prompt": prompt, "model_profile": profile});
        // Read the overlay first, so that only the pin is judged.
        vec![
            call_from(0, "harness", "config::overlay", json!({"turn_id": "t1"})),
            generation_with(1, "harness", payload),
        ]
    };
    assert!(judge_config(&request("be brief", "small")).is_empty());
    assert_eq!(judge_config(&request("be thorough", "small")), vec![Oracle::PinnedConfig], "agent-18's prompt");
    assert_eq!(judge_config(&request("be brief", "large")), vec![Oracle::PinnedConfig], "agent-18's profile");
}

#[test]
fn safety_overlay_reads_the_overlay_from_the_config_services_own_changes_and_judges_workers_only() {
    let note = |at_ms: u64, host: &str, what: &str, excluded: &[&str]| Event {
        at_ms,
        host: host.into(),
        kind: EventKind::Note { what: what.into(), detail: json!({"excluded": excluded}) },
    };
    let read = |at_ms: u64, caller: &str| call_from(at_ms, caller, "config::overlay", json!({"turn_id": "t1"}));
    let recorded = commit(0, json!({"turn_id": "t1", "status": "running", "calls": {"a1": {"status": "complete"}}}));
    let [create, effect] = send(5, "harness", true, "created");
    let revoked = note(1, "config", "overlay_changed", &["ticket.create"]);
    let after = |between: Event| {
        flat(&[&[recorded.clone(), revoked.clone(), between, read(3, "harness")], &[create.clone(), effect.clone()]])
    };
    // Revoked, then another note (the harness's own, or the service's note of a promotion): the
    // revocation stands, and the worker called the tool it took away.
    assert_eq!(judge_config(&after(note(2, "harness", "approval_expired", &[]))), vec![Oracle::SafetyOverlay]);
    assert_eq!(judge_config(&after(note(2, "config", "config_promoted", &[]))), vec![Oracle::SafetyOverlay]);
    assert_eq!(judge_config(&after(note(2, "harness", "overlay_changed", &[]))), vec![Oracle::SafetyOverlay]);
    // Reinstated by the service itself: the call is fine.
    assert!(judge_config(&after(note(2, "config", "overlay_changed", &[]))).is_empty());
    // What was sent is named: a generation request, or a call.
    let generate = generation_with(4, "harness", json!({"turn_id": "t1", "tools": [{"name": "ticket.create"}]}));
    let details = |events: &[Event]| {
        let violations = violations_of(events, &StateStore::new(), Some(&two_versions()), 10, true);
        violations.into_iter().filter(|v| v.oracle == Oracle::SafetyOverlay).map(|v| v.detail).collect::<Vec<_>>()
    };
    let offered = details(&[revoked.clone(), read(3, "harness"), generate]);
    assert!(offered.len() == 1 && offered[0].contains("sent a generation request (`model::generate`)"), "{offered:?}");
    let called = details(&after(note(2, "harness", "approval_expired", &[])));
    assert!(called.len() == 1 && called[0].contains("sent a call (`ticket::create`)"), "{called:?}");
    // The scenario's own client is no worker: its calls need no look at the overlay.
    let [driver_create, driver_effect] = send(5, "driver", true, "created");
    assert!(judge_config(&[recorded.clone(), revoked.clone(), driver_create, driver_effect]).is_empty());
}

/// The trace of a hold: the hook `approvals::approve` asked about call `call_id` at `at_ms`, its
/// answer back at the worker a millisecond later.
fn hold_at(at_ms: u64, call_id: &str, arguments: Value) -> Vec<Event> {
    hook_asked(at_ms, "approvals::approve", call_id, arguments)
}

/// The hook `hook` asked about call `call_id` of `ticket::create` at `at_ms`, and its answer back
/// at the worker a millisecond later.
fn hook_asked(at_ms: u64, hook: &str, call_id: &str, arguments: Value) -> Vec<Event> {
    let payload = json!({"point": "pre_trigger", "session_id": "s1",
        "call": {"id": call_id, "function_id": "ticket::create", "arguments": arguments}});
    let mut asked = call_from(at_ms, "harness", hook, payload);
    if let EventKind::Call { invocation_id, .. } = &mut asked.kind {
        *invocation_id = Some(format!("hook-{call_id}-{at_ms}"));
    }
    let answered =
        frame(at_ms + 1, "out", "invocationresult", "approvals::approve", &format!("hook-{call_id}-{at_ms}"));
    vec![asked, answered]
}

fn frame(at_ms: u64, direction: &'static str, frame: &'static str, function: &str, invocation: &str) -> Event {
    let kind = EventKind::Frame {
        direction,
        peer: "harness".into(),
        frame,
        function_id: Some(function.into()),
        invocation_id: Some(invocation.into()),
    };
    event(at_ms, kind)
}

fn judge_hooks(events: &[Event]) -> Vec<Oracle> {
    let (store, sessions, layout) = (StateStore::new(), doubles::SessionService::new(), RecordLayout::default());
    let evidence = Evidence {
        hook_replies: BTreeMap::from([
            (
                "approvals::approve".to_string(),
                json!({"decision": "hold", "expires_in_ms": 2_000, "mutations": {"arguments": {"title": "refund (approved)"}}}),
            ),
            (
                "approvals::check".to_string(),
                json!({"decision": "continue", "mutations": {"arguments": {"scope": "eu"}}}),
            ),
            ("approvals::refuse".to_string(), json!({"decision": "deny"})),
        ]),
        ..evidence(events, &store, &sessions, &layout, 100_000)
    };
    oracles_of(check(&evidence))
}

#[test]
fn approval_expiry_catches_a_held_call_run_after_its_expiry_with_no_release_before_it() {
    let refund = json!({"title": "refund"});
    // The hold's own change of the title makes a request with the model's arguments a
    // `hook-arguments` violation too: only `approval-expiry` is looked at here.
    let expired = |events: &[Event]| judge_hooks(events).contains(&Oracle::ApprovalExpiry);
    let request = |at_ms: u64, args: Value| call_from(at_ms, "harness", "ticket::create", json!({"args": args}));
    let release = |at_ms: u64| frame(at_ms, "in", "invokefunction", "harness::resolve", &format!("r{at_ms}"));
    // Held at 10 ms, its answer at the worker at 11 ms: the approval expires at 2,011 ms.
    let held = hold_at(10, "c1", refund.clone());
    let late = flat(&[&held, &[release(3_000), request(3_005, refund.clone())]]);
    assert!(expired(&late), "a release after the expiry runs nothing");
    let mutated = flat(&[&held, &[request(3_005, json!({"title": "refund (approved)"}))]]);
    assert!(expired(&mutated), "with the holder's changes, it is the call");
    // Released at the last moment (the worker's clock starts a hop after the engine's answer):
    // its request may come after the expiry.
    let in_time = flat(&[&held, &[release(2_111), request(2_115, refund.clone())]]);
    assert!(!expired(&in_time));
    let too_late = flat(&[&held, &[release(2_112), request(2_115, refund.clone())]]);
    assert!(expired(&too_late));
    // Run before its expiry (no release needed to show it was not past it).
    assert!(!expired(&flat(&[&held, &[request(2_011, refund.clone())]])));
    // Another call's request, or another function's, is not this call's.
    let other = flat(&[&held, &[request(3_005, json!({"title": "other"}))]]);
    assert!(!expired(&other));
    let elsewhere = flat(&[&held, &[call_from(3_005, "harness", "recorder::record", json!({"args": refund}))]]);
    assert!(!expired(&elsewhere));
    // A later hook asked about the call (the chain went on after a release, or a new call with
    // the same arguments was held again) decides it from then on.
    let asked_again =
        flat(&[&held, &hold_at(500, "c2", refund.clone()), &[release(2_400), request(2_405, refund.clone())]]);
    assert!(!expired(&asked_again));
    // Another call, of the same function or not, asked about later decides nothing for this one.
    let another = flat(&[
        &held,
        &hook_asked(500, "approvals::check", "c2", json!({"title": "other"})),
        &[request(3_005, refund.clone())],
    ]);
    assert!(expired(&another));
    // A release before the hook's answer reached the worker (no expiry yet) counts too.
    let early = flat(&[&held[..1], &[release(10)], &held[1..], &[request(3_005, refund.clone())]]);
    assert!(!expired(&early));
    // The expiry starts with the holding hook's own answer, not with another call's answer that
    // happened to go out first (a slow hook: asked at 10 ms, answering at 500 ms).
    let slow = flat(&[
        &held[..1],
        &[frame(11, "out", "invocationresult", "state::get", "unrelated")],
        &[frame(500, "out", "invocationresult", "approvals::approve", "hook-c1-10")],
        &[release(2_200), request(2_205, refund.clone())],
    ]);
    assert!(!expired(&slow), "released at 2,200 ms, before the expiry at 2,500 ms");
    // An answer that never reached the worker started no expiry it knew of.
    let unanswered = flat(&[
        &held[..1],
        &[frame(11, "out", "invocationresult", "state::get", "unrelated")],
        &[request(3_005, refund)],
    ]);
    assert!(!expired(&unanswered));
}

#[test]
fn hook_arguments_catches_a_call_run_with_arguments_its_chain_had_changed() {
    let model = json!({"title": "refund"});
    let checked = json!({"title": "refund", "scope": "eu"});
    let approved = json!({"title": "refund (approved)", "scope": "eu"});
    let request = |at_ms: u64, args: &Value| call_from(at_ms, "harness", "ticket::create", json!({"args": args}));
    // `check` adds a scope; `approve` holds and changes the title: the call runs with both.
    let chain = flat(&[
        &hook_asked(10, "approvals::check", "c1", model.clone()),
        &hook_asked(20, "approvals::approve", "c1", checked.clone()),
    ]);
    assert!(judge_hooks(&flat(&[&chain, &[request(500, &approved)]])).is_empty());
    // The holder's own change lost, or the model's arguments run after a release.
    let dropped = flat(&[&chain, &[request(500, &checked)]]);
    assert_eq!(judge_hooks(&dropped), vec![Oracle::HookArguments], "the holding hook's changes are the chain's too");
    let original = flat(&[&chain, &[request(500, &model)]]);
    assert_eq!(judge_hooks(&original), vec![Oracle::HookArguments], "a released call runs as the chain left it");
    // Arguments no hook saw are another call's; arguments another chain passed on are its own.
    assert!(judge_hooks(&flat(&[&chain, &[request(500, &json!({"title": "other"}))]])).is_empty());
    let other_chain = hook_asked(30, "approvals::check", "c2", json!({"title": "refund", "scope": "eu"}));
    let reused = flat(&[&chain, &other_chain, &[request(500, &json!({"title": "refund", "scope": "eu"}))]]);
    assert!(judge_hooks(&reused).is_empty(), "another chain passed these on: the request may be its call's");
    // A denied call, and a chain through a hook whose answer the world does not configure, are
    // not judged: there is no passed-on arguments to hold a request to.
    let denied = flat(&[&hook_asked(10, "approvals::refuse", "c1", model.clone()), &[request(500, &model)]]);
    assert!(judge_hooks(&denied).is_empty());
    let unknown = flat(&[&hook_asked(10, "elsewhere::hook", "c1", model.clone()), &[request(500, &model)]]);
    assert!(judge_hooks(&unknown).is_empty());
    // A call id names a call in its session: another session's `c1`, held and changed after
    // this one's chain passed its arguments on, is another chain.
    let mut other_session = hook_asked(30, "approvals::approve", "c1", checked.clone());
    if let EventKind::Call { payload, .. } = &mut other_session[0].kind {
        std::sync::Arc::make_mut(payload)["session_id"] = json!("s2");
    }
    let checked_only = hook_asked(10, "approvals::check", "c1", model.clone());
    let two_sessions = flat(&[&checked_only, &other_session, &[request(500, &checked)]]);
    assert!(judge_hooks(&two_sessions).is_empty(), "s1's call ran as its chain left it");
    // Another function's request is not the call's.
    let elsewhere = flat(&[&chain, &[call_from(500, "harness", "recorder::record", json!({"args": checked}))]]);
    assert!(judge_hooks(&elsewhere).is_empty());
}

/// The transcript oracles over `events`, with `sessions` as the run left them and the model's
/// `generations`: the violations' details.
fn judge_transcript(events: &[Event], sessions: &doubles::SessionService, generations: &[Generation]) -> Vec<String> {
    let (store, layout) = (StateStore::new(), RecordLayout::default());
    let evidence = Evidence { generations, ..evidence(events, &store, sessions, &layout, 100_000) };
    check(&evidence).into_iter().map(|v| format!("{}: {}", v.oracle.name(), v.detail)).collect()
}

fn result_entry(call_id: &str) -> Value {
    json!({"role": "function_result", "function_call_id": call_id, "function_id": "ticket.create", "content": "ok"})
}

fn generate_from(at_ms: u64, worker: &str, messages: Value) -> Event {
    call_from(at_ms, worker, "model::generate", json!({"session_id": "s1", "turn_id": "t1", "messages": messages}))
}

fn append_from(at_ms: u64, worker: &str, entry: Value) -> Event {
    call_from(at_ms, worker, "session::append", json!({"session_id": "s1", "entry": entry}))
}

fn cut_event(at_ms: u64, action: &str) -> Event {
    event(at_ms, EventKind::Cut { cut: 0, action: action.into(), function: "session::append".into() })
}

#[test]
fn model_context_catches_a_worker_asking_without_a_result_it_put_into_the_transcript() {
    let mut sessions = doubles::SessionService::new();
    sessions.seed_message("s1", json!({"role": "user", "text": "hello"}));
    sessions.seed_message("s1", result_entry("c1"));
    let user = json!({"role": "user", "text": "hello"});
    let fresh = json!([user, result_entry("c1")]);
    let stale = json!([user]);
    let asked_fresh = [append_from(10, "harness", result_entry("c1")), generate_from(20, "harness", fresh.clone())];
    assert!(judge_transcript(&asked_fresh, &sessions, &[]).is_empty(), "the result read back and sent");
    let asked_stale = [append_from(10, "harness", result_entry("c1")), generate_from(20, "harness", stale.clone())];
    let found = judge_transcript(&asked_stale, &sessions, &[]);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        found[0].starts_with("model-context: `harness` asked the model for turn s1/t1 at 20 ms without the result of call `c1`, which it had put into the session's transcript at 10 ms"),
        "{found:?}"
    );
    // Asked before the result was put there, by another worker, or after an append a cut kept
    // from the service: nothing the asker knew was there.
    let before = [generate_from(5, "harness", stale.clone()), append_from(10, "harness", result_entry("c1"))];
    assert!(judge_transcript(&before, &sessions, &[]).is_empty());
    let other = [append_from(10, "harness", result_entry("c1")), generate_from(20, "replacement", stale.clone())];
    assert!(judge_transcript(&other, &sessions, &[]).is_empty(), "another worker's append may still be on its way");
    for refused in ["timeout", "reject", "crash-caller-before"] {
        let cut = [
            append_from(10, "harness", result_entry("c1")),
            cut_event(10, refused),
            generate_from(20, "harness", stale.clone()),
        ];
        assert!(judge_transcript(&cut, &sessions, &[]).is_empty(), "{refused}");
    }
    // A cut that lets the append land (its answer lost) leaves the result there.
    let lost = [
        append_from(10, "harness", result_entry("c1")),
        cut_event(10, "lost-ack"),
        generate_from(20, "harness", stale.clone()),
    ];
    assert_eq!(judge_transcript(&lost, &sessions, &[]).len(), 1);
    // The service refused what it could not take: no such result in the transcript.
    let elsewhere = [append_from(10, "harness", result_entry("c9")), generate_from(20, "harness", stale.clone())];
    assert!(judge_transcript(&elsewhere, &sessions, &[]).is_empty());
    // The driver's own calls are the script's; another session's request is not this session's.
    let driver = [
        append_from(10, crate::topology::DRIVER, result_entry("c1")),
        generate_from(20, crate::topology::DRIVER, stale.clone()),
    ];
    assert!(judge_transcript(&driver, &sessions, &[]).is_empty());
    let mut other_session = generate_from(20, "harness", stale.clone());
    if let EventKind::Call { payload, .. } = &mut other_session.kind {
        std::sync::Arc::make_mut(payload)["session_id"] = json!("s2");
    }
    assert!(
        judge_transcript(&[append_from(10, "harness", result_entry("c1")), other_session], &sessions, &[]).is_empty()
    );
    // Two results missing: one violation naming the first and counting the rest.
    sessions.seed_message("s1", result_entry("c2"));
    let two = [
        append_from(10, "harness", result_entry("c1")),
        append_from(11, "harness", result_entry("c2")),
        generate_from(20, "harness", stale),
    ];
    let found = judge_transcript(&two, &sessions, &[]);
    assert!(found.len() == 1 && found[0].contains("call `c1` (and 1 more)"), "{found:?}");
}

#[test]
fn whole_replies_catches_a_part_of_a_streamed_reply_and_its_pieces_out_of_order() {
    let frames = json!({"frames": [
        {"type": "start"},
        {"type": "text_delta", "delta": "one "},
        {"type": "text_delta", "delta": "two "},
        {"type": "text_delta", "delta": "three"},
        {"type": "stop"},
    ]});
    let generation = |session: &str, reply: &Value| Generation {
        session_id: session.into(),
        turn_id: "t1".into(),
        reply: reply.clone(),
    };
    let streamed = [generation("s1", &frames)];
    let sessions = doubles::SessionService::new();
    let says = |text: &str| {
        judge_transcript(
            &[append_from(10, "harness", json!({"role": "assistant", "text": text}))],
            &sessions,
            &streamed,
        )
    };
    assert!(says("one two three").is_empty(), "the reply whole");
    assert!(says("the turn failed").is_empty(), "the harness's own words");
    let part = says("two three");
    assert_eq!(
        part,
        ["whole-replies: `harness` put the assistant entry \"two three\" into session s1's transcript at 10 ms: only deltas 2 to 3 (of 3) of the model's streamed reply \"one two three\""]
    );
    assert!(says("one ")[0].contains(": only delta 1 (of 3) of the model's"), "a single delta is a part");
    let shuffled = says("two one three");
    assert!(
        shuffled.len() == 1 && shuffled[0].contains("the pieces, out of sequence order, of the model's streamed reply"),
        "{shuffled:?}"
    );
    assert_eq!(says("threeone ").len(), 1, "some pieces, out of order");
    assert!(says("one one ").is_empty(), "a delta is used once");
    // Only an assistant's text, by a worker, that reached the service, in the reply's session.
    let user = [append_from(10, "harness", json!({"role": "user", "text": "two three"}))];
    assert!(judge_transcript(&user, &sessions, &streamed).is_empty());
    let driver = [append_from(10, crate::topology::DRIVER, json!({"role": "assistant", "text": "two three"}))];
    assert!(judge_transcript(&driver, &sessions, &streamed).is_empty());
    let refused =
        [append_from(10, "harness", json!({"role": "assistant", "text": "two three"})), cut_event(10, "reject")];
    assert!(judge_transcript(&refused, &sessions, &streamed).is_empty());
    assert!(judge_transcript(
        &[append_from(10, "harness", json!({"role": "assistant", "text": "two three"}))],
        &sessions,
        &[generation("s2", &frames)]
    )
    .is_empty());
    // A reply of one delta, or given whole, has no parts to split.
    let single = [generation("s1", &json!({"frames": [{"type": "text_delta", "delta": "one two three"}]}))];
    assert!(judge_transcript(
        &[append_from(10, "harness", json!({"role": "assistant", "text": "one two three"}))],
        &sessions,
        &single
    )
    .is_empty());
    let whole = [generation("s1", &json!({"text": "one two three"}))];
    assert!(judge_transcript(
        &[append_from(10, "harness", json!({"role": "assistant", "text": "two three"}))],
        &sessions,
        &whole
    )
    .is_empty());
}

/// A commit to any scope, by the store (a worker's write) unless `host` says the driver.
fn commit_in(at_ms: u64, scope: &str, key: &str, value: Value) -> Event {
    event(at_ms, EventKind::Commit { scope: scope.into(), key: key.into(), value: value.into(), version: at_ms })
}

/// The violations of every oracle over `evidence`'s events, one line each: `oracle: detail`.
fn details(evidence: &Evidence<'_>) -> Vec<String> {
    check(evidence).into_iter().map(|v| format!("{}: {}", v.oracle.name(), v.detail)).collect()
}

#[test]
fn ledger_holds_an_action_recorded_done_to_an_accepted_effect_when_its_call_is_an_effect() {
    let (store, sessions, layout) = (StateStore::new(), doubles::SessionService::new(), RecordLayout::default());
    let done = |calls: Value| commit(9, json!({"turn_id": "t1", "status": "running", "calls": calls}));
    let tools = BTreeMap::from([
        ("ticket.create".to_string(), "ticket::create".to_string()),
        ("ticket.lookup".to_string(), "ticket::lookup".to_string()),
    ]);
    let judged = |events: &[Event], sessions: &doubles::SessionService| {
        details(&Evidence { tool_functions: tools.clone(), ..evidence(events, &store, sessions, &layout, 10) })
    };
    // Sent and accepted: done is true.
    let accepted = flat(&[&send(1, "harness", true, "created"), &[done(json!({"a1": {"status": "complete"}}))]]);
    assert!(judged(&accepted, &sessions).is_empty());
    // Sent and refused, yet recorded done: no service accepted it.
    let refused = flat(&[&send(1, "harness", false, "rejected"), &[done(json!({"a1": {"status": "complete"}}))]]);
    let found = judged(&refused, &sessions);
    assert!(found.len() == 1 && found[0].contains("but no service accepted it"), "{found:?}");
    // Never sent: the action's tool, from its record, says it was an effect.
    let never_sent = [done(json!({"a1": {"status": "complete", "tool": "ticket.create"}}))];
    assert_eq!(judged(&never_sent, &sessions).len(), 1);
    // Or the transcript's call of its id does.
    let mut transcribed = doubles::SessionService::new();
    transcribed.seed_message(
        "s1",
        json!({"role": "assistant", "content": [{"type": "function_call", "id": "a1", "function_id": "ticket.create"}]}),
    );
    assert_eq!(judged(&[done(json!({"a1": {"status": "complete"}}))], &transcribed).len(), 1);
    // A read is no effect; an action recorded failed, or still unsettled, claims nothing.
    assert!(judged(&[done(json!({"a1": {"status": "complete", "tool": "ticket.lookup"}}))], &sessions).is_empty());
    assert!(judged(&[done(json!({"a1": {"status": "failed", "tool": "ticket.create"}}))], &sessions).is_empty());
    assert!(judged(&[done(json!({"a1": {"status": "started", "tool": "ticket.create"}}))], &sessions).is_empty());
    // With nothing to say what its call was, it is not judged.
    assert!(judged(&[done(json!({"a1": {"status": "complete"}}))], &sessions).is_empty());
}

#[test]
fn stranded_catches_queued_input_removed_and_never_admitted() {
    let layout = RecordLayout::default();
    let queued =
        commit_in(1, "harness_queue", "s1:q1", json!({"session_id": "s1", "message": {"role": "user", "text": "hi"}}));
    let removed = commit_in(3, "harness_queue", "s1:q1", Value::Null);
    let (store, sessions) = (StateStore::new(), doubles::SessionService::new());
    let judged = |events: &[Event], sessions: &doubles::SessionService| {
        details(&evidence(events, &store, sessions, &layout, 10))
    };
    let vanished = judged(&[queued.clone(), removed.clone()], &sessions);
    assert!(vanished.len() == 1 && vanished[0].contains("the message vanished"), "{vanished:?}");
    // A turn that names it was admitted from it, whenever the entry left.
    let named = commit(2, json!({"turn_id": "t2", "status": "completed", "step": 0, "input_keys": ["s1:q1"]}));
    assert!(judged(&[queued.clone(), named, removed.clone()], &sessions).is_empty());
    // A harness that names no input: its message in the transcript says it was admitted.
    let mut admitted = doubles::SessionService::new();
    admitted.seed_message("s1", json!({"role": "user", "text": "hi", "entry_id": "e1"}));
    assert!(judged(&[queued.clone(), removed.clone()], &admitted).is_empty());
    let mut other = doubles::SessionService::new();
    other.seed_message("s1", json!({"role": "user", "text": "something else"}));
    assert_eq!(judged(&[queued.clone(), removed.clone()], &other).len(), 1);
    // A turn record that carries the message (in a field of the harness's own) was made of it.
    let carried = commit(
        2,
        json!({"turn_id": "t2", "status": "held", "held_reason": "x", "input": [{"role": "user", "text": "hi"}]}),
    );
    assert!(judged(&[queued.clone(), carried, removed.clone()], &sessions).is_empty());
    // Input put back after its removal is queued again, not gone.
    let back = commit_in(4, "harness_queue", "s1:q1", json!({"session_id": "s1", "message": {}}));
    let store_back = store_with("harness_queue", "s1:q1", json!({"session_id": "s1", "message": {}}));
    let requeued = [queued, removed, back];
    let evidence_back = evidence(&requeued, &store_back, &sessions, &layout, 10);
    assert!(details(&evidence_back).iter().all(|d| !d.contains("vanished")));
    // Seeded input removed without a turn vanished too.
    let seeded = [("harness_queue".to_string(), "s1:q9".to_string(), json!({"session_id": "s1", "message": {}}))];
    let gone = [commit_in(2, "harness_queue", "s1:q9", Value::Null)];
    let evidence_seeded = Evidence { seeded: &seeded, ..evidence(&gone, &store, &sessions, &layout, 10) };
    assert_eq!(details(&evidence_seeded).len(), 1);
}

/// What `stranded` takes as a turn made of a removed message, exactly: a turn record of its
/// session (seeded or committed, not a record of another scope) naming its key or carrying it
/// within three levels, or the message itself in the transcript (plain text by its `text`).
#[test]
fn stranded_takes_only_a_turn_record_of_the_session_or_the_transcript_as_the_message_admitted() {
    let layout = RecordLayout::default();
    let message = json!({"role": "user", "text": "hi"});
    let queued = commit_in(1, "harness_queue", "s1:q1", json!({"session_id": "s1", "message": message}));
    let removed = commit_in(9, "harness_queue", "s1:q1", Value::Null);
    let (store, sessions) = (StateStore::new(), doubles::SessionService::new());
    let vanished = |events: &[Event], seeded: &[(String, String, Value)], sessions: &doubles::SessionService| {
        let evidence = Evidence { seeded, ..evidence(events, &store, sessions, &layout, 10) };
        details(&evidence).iter().filter(|d| d.contains("the message vanished")).count()
    };
    let with = |record: Value| [queued.clone(), commit(2, record), removed.clone()];
    // A turn record of the session that carries something else, or the message nested deeper
    // than three levels (the search's bound), does not say the message was admitted.
    let other = json!({"turn_id": "t1", "status": "completed", "input": [{"role": "user", "text": "bye"}]});
    assert_eq!(vanished(&with(other), &[], &sessions), 1);
    let deep = json!({"turn_id": "t1", "status": "completed", "a": {"b": {"c": {"d": message}}}});
    assert_eq!(vanished(&with(deep), &[], &sessions), 1);
    let deep_in_lists = json!({"turn_id": "t1", "status": "completed", "a": [[[message]]]});
    assert_eq!(vanished(&with(deep_in_lists), &[], &sessions), 1);
    let in_lists_at_the_bound = json!({"turn_id": "t1", "status": "completed", "a": [[message]]});
    assert_eq!(vanished(&with(in_lists_at_the_bound), &[], &sessions), 0);
    let at_the_bound = json!({"turn_id": "t1", "status": "completed", "a": {"b": {"c": message}}});
    assert_eq!(vanished(&with(at_the_bound), &[], &sessions), 0);
    // A record of another scope under the session's key is no turn made of it.
    let noted = commit_in(2, "harness_notes", "s1", json!({"last_input": message}));
    assert_eq!(vanished(&[queued.clone(), noted, removed.clone()], &[], &sessions), 1);
    // Seeded turn records count as committed ones do: by the keys they name, or the message.
    let seeded = |record: Value| vec![("harness_turn".to_string(), "s1".to_string(), record)];
    let events = [queued.clone(), removed.clone()];
    let named = seeded(json!({"turn_id": "t0", "status": "completed", "input_keys": ["s1:q1"]}));
    assert_eq!(vanished(&events, &named, &sessions), 0);
    let carried = seeded(json!({"turn_id": "t0", "status": "completed", "input": [message]}));
    assert_eq!(vanished(&events, &carried, &sessions), 0);
    // A message that is plain text reached the transcript as an entry with that text.
    let plain = commit_in(1, "harness_queue", "s1:q1", json!({"session_id": "s1", "message": "hi"}));
    let mut said = doubles::SessionService::new();
    said.seed_message("s1", json!({"role": "user", "text": "hi"}));
    assert_eq!(vanished(&[plain.clone(), removed.clone()], &[], &said), 0);
    let mut other_text = doubles::SessionService::new();
    other_text.seed_message("s1", json!({"role": "user", "text": "bye"}));
    assert_eq!(vanished(&[plain, removed], &[], &other_text), 1);
}

#[test]
fn admitted_once_counts_new_turns_against_the_messages_sent_by_key_or_invocation() {
    let (store, sessions, layout) = (StateStore::new(), doubles::SessionService::new(), RecordLayout::default());
    let sent = |identity: &str| Sent { session_id: "s1".into(), identity: identity.into() };
    let new_turn = |at_ms: u64, turn: &str| commit(at_ms, json!({"turn_id": turn, "status": "running", "step": 0}));
    let judged = |events: &[Event], sends: Vec<Sent>| {
        details(&Evidence { sends, ..evidence(events, &store, &sessions, &layout, 10) })
    };
    let two_turns = [new_turn(1, "ta"), new_turn(5, "tb")];
    // One message sent twice under its key: one turn at most.
    let twice = judged(&two_turns, vec![sent("key:m1"), sent("key:m1")]);
    assert!(twice.len() == 1 && twice[0].contains("a message was answered twice"), "{twice:?}");
    assert!(judged(&two_turns, vec![sent("key:m1"), sent("key:m2")]).is_empty());
    assert!(judged(&[new_turn(1, "ta")], vec![sent("key:m1"), sent("key:m1")]).is_empty());
    // Input the scenario put in the queue is a message of its own.
    let put = event(
        1,
        EventKind::Commit {
            scope: "harness_queue".into(),
            key: "s1:q1".into(),
            value: json!({"session_id": "s1"}).into(),
            version: 1,
        },
    );
    let put = Event { host: crate::topology::DRIVER.into(), ..put };
    assert!(judged(&flat(&[&[put], &two_turns]), vec![sent("key:m1")]).is_empty());
    // A turn record written again (later steps, another status) is the same turn; a delegated
    // child answers its parent; a record the scenario wrote is not the harness's.
    let again = [new_turn(1, "ta"), commit(3, json!({"turn_id": "ta", "status": "completed", "step": 0}))];
    assert!(judged(&again, vec![sent("key:m1")]).is_empty());
    let child = commit(4, json!({"turn_id": "tc", "status": "running", "step": 0, "parent": {"turn_id": "ta"}}));
    assert!(judged(&[new_turn(1, "ta"), child], vec![sent("key:m1")]).is_empty());
    // A session the client never sent to is not judged.
    assert!(judged(&two_turns, Vec::new()).is_empty());
}

#[test]
fn truthful_reply_judges_from_the_seeded_records_and_holds_a_held_claim_to_the_store() {
    let (store, sessions, layout) = (StateStore::new(), doubles::SessionService::new(), RecordLayout::default());
    let seeded = [("harness_turn".to_string(), "s1".to_string(), json!({"turn_id": "t1", "status": "completed"}))];
    let said = |status: &str| rpc(2, json!({"session_id": "s1", "turn_id": "t1", "status": status}));
    let judged =
        |events: &[Event]| details(&Evidence { seeded: &seeded, ..evidence(events, &store, &sessions, &layout, 10) });
    let running = judged(&[said("running")]);
    assert!(running.len() == 1 && running[0].contains("since the run began"), "{running:?}");
    assert!(judged(&[said("completed")]).is_empty());
    // A status that is no end (`paused`) claims no recorded end: the reply is not held to it.
    assert!(judged(&[said("paused")]).is_empty());
    // Once the run writes the turn, the seeded record is no longer what the reply is held to.
    let written = commit(1, json!({"turn_id": "t1", "status": "held", "held_reason": "a person"}));
    assert!(judged(&[written.clone(), said("held")]).is_empty());
    let held = judged(&[said("held")]);
    assert!(held.len() == 1 && held[0].contains("is `held`, while the store held it `completed`"), "{held:?}");
    // `finalized: false` claims nothing.
    let unconfirmed = rpc(2, json!({"session_id": "s1", "turn_id": "t1", "status": "held", "finalized": false}));
    assert!(judged(&[unconfirmed]).is_empty());
}

#[test]
fn liveness_catches_a_turn_held_for_a_hook_hold_no_action_records() {
    let layout = RecordLayout::default();
    let sessions = doubles::SessionService::new();
    let hook = |at_ms: u64| {
        call_from(
            at_ms,
            "harness",
            "hooks::hold",
            json!({"point": "pre_trigger", "session_id": "s1", "call": {"id": "c1"}}),
        )
    };
    let held_turn =
        |calls: Value| json!({"turn_id": "t1", "status": "held", "held_reason": "a hook holds c1", "calls": calls});
    let judged = |events: &[Event], store: &StateStore| {
        let replies = BTreeMap::from([("hooks::hold".to_string(), json!({"decision": "hold"}))]);
        details(&Evidence { hook_replies: replies, ..evidence(events, store, &sessions, &layout, 10) })
    };
    let not_recorded = store_with("harness_turn", "s1", held_turn(json!({"a1": {"tool": "x"}})));
    let events = [hook(1), commit(2, json!({"turn_id": "t1", "status": "running"})), commit(3, held_turn(json!({})))];
    let found = judged(&events, &not_recorded);
    assert!(found.len() == 1 && found[0].contains("nothing can release it"), "{found:?}");
    // The held call recorded held: a release can find it.
    let recorded = store_with("harness_turn", "s1", held_turn(json!({"a1": {"status": "held"}})));
    assert!(judged(&events, &recorded).is_empty());
    // The turn ran again after the hold (released, say), and is held now for another reason.
    let ran = [
        hook(1),
        commit(3, held_turn(json!({}))),
        commit(4, json!({"turn_id": "t1", "status": "running"})),
        commit(5, held_turn(json!({}))),
    ];
    assert!(judged(&ran, &not_recorded).is_empty());
    // No hook held anything.
    let no_hold = [commit(3, held_turn(json!({})))];
    assert!(judged(&no_hold, &not_recorded).is_empty());
    // Only a hook's answer before the call (`pre_trigger`) holds it.
    let after_the_call = call_from(
        1,
        "harness",
        "hooks::hold",
        json!({"point": "post_trigger", "session_id": "s1", "call": {"id": "c1"}}),
    );
    assert!(judged(&[after_the_call, events[1].clone(), events[2].clone()], &not_recorded).is_empty());
    // A record running after the hold under the session's key in another scope, or another
    // session's turn running, is not this turn running again.
    let running = json!({"turn_id": "t1", "status": "running"});
    for elsewhere in [commit_in(4, "harness_notes", "s1", running.clone()), commit_in(4, "harness_turn", "s2", running)]
    {
        let found = judged(&[hook(1), commit(3, held_turn(json!({}))), elsewhere], &not_recorded);
        assert!(found.len() == 1 && found[0].contains("nothing can release it"), "{found:?}");
    }
}

#[test]
fn liveness_leaves_a_hook_held_turn_alone_once_a_dead_letter_holds_it() {
    let (layout, sessions) = (RecordLayout::default(), doubles::SessionService::new());
    let hook = call_from(
        1,
        "harness",
        "hooks::hold",
        json!({"point": "pre_trigger", "session_id": "s1", "call": {"id": "c1"}}),
    );
    let given_up = event(
        3,
        EventKind::Note {
            what: "queue_dead_letter".into(),
            detail: json!({"queue": "harness-turn", "message_id": "m1", "attempt": 4}),
        },
    );
    let for_the_letter = "dead-lettered: queue harness-turn gave up on message m1";
    let held = |at_ms: u64| commit(at_ms, json!({"turn_id": "t1", "status": "held", "held_reason": for_the_letter}));
    let (this_turn, another_turn) =
        (json!({"session_id": "s1", "turn_id": "t1"}), json!({"session_id": "s1", "turn_id": "t0"}));
    // `reason`: why the turn is held at the end.
    let judged_held_for = |reason: &str, events: &[Event], letter: &Value| {
        let store = store_with("harness_turn", "s1", json!({"turn_id": "t1", "status": "held", "held_reason": reason}));
        let replies = BTreeMap::from([("hooks::hold".to_string(), json!({"decision": "hold"}))]);
        let given_up = vec![("harness-turn", "m1", letter)];
        details(&Evidence { hook_replies: replies, given_up, ..evidence(events, &store, &sessions, &layout, 10) })
    };
    let judged = |events: &[Event], letter: &Value| judged_held_for(for_the_letter, events, letter);
    // The hook held the call, the hold was never recorded, the queue gave the turn up, and the
    // dead letter's handler held it: the turn waits on the dead letter, not on a release.
    let dead_lettered = [hook.clone(), given_up.clone(), held(4)];
    assert!(judged(&dead_lettered, &this_turn).is_empty());
    let whole_session = json!({"session_id": "s1"});
    assert!(judged(&dead_lettered, &whole_session).is_empty(), "a letter naming only the session carried its turn");
    // Held for the hook before the queue gave up: a dead letter after it excuses nothing.
    let held_first = [hook.clone(), held(2), given_up.clone(), held(4)];
    let found = judged(&held_first, &this_turn);
    assert!(found.len() == 1 && found[0].contains("nothing can release it"), "{found:?}");
    // A dead letter of another turn of the session, or of another session, holds nothing here.
    let found = judged(&dead_lettered, &another_turn);
    assert!(found.len() == 1 && found[0].contains("nothing can release it"), "{found:?}");
    let found = judged(&dead_lettered, &json!({"session_id": "s2", "turn_id": "t1"}));
    assert!(found.len() == 1 && found[0].contains("nothing can release it"), "{found:?}");
    // Only the note of that very message given up counts: another note naming it, or the dead
    // letter of another message of the queue, gave up nothing of this turn.
    let note = |what: &str, message_id: &str| {
        let detail = json!({"queue": "harness-turn", "message_id": message_id, "attempt": 4});
        event(3, EventKind::Note { what: what.into(), detail })
    };
    for not_this in [note("queue_redelivered", "m1"), note("queue_dead_letter", "m9")] {
        let found = judged(&[hook.clone(), not_this, held(4)], &this_turn);
        assert!(found.len() == 1 && found[0].contains("nothing can release it"), "{found:?}");
    }
    // Held after the queue gave up, but for the hook: a hold that does not name the dead letter
    // is no dead letter's (a hook-only hold written once the last delivery's deadline passed).
    for not_naming_it in ["held by hook hooks::hold", "dead-lettered: message m10"] {
        let found = judged_held_for(not_naming_it, &dead_lettered, &this_turn);
        assert!(found.len() == 1 && found[0].contains("nothing can release it"), "{not_naming_it}: {found:?}");
    }
}

#[test]
fn liveness_catches_a_turn_paused_again_after_its_last_resume_was_applied() {
    let (sessions, layout) = (doubles::SessionService::new(), RecordLayout::default());
    let command = |kind: &str, state: &str| json!({"command": kind, "turn_id": "t1", "state": state});
    let control = |commands: Value| json!({"session_id": "s1", "commands": commands});
    let judged = |events: &[Event], turn: &str, last: Value| {
        let mut store = store_with("harness_turn", "s1", json!({"turn_id": "t1", "status": turn}));
        store.seed(CONTROL_SCOPE, "s1", last);
        details(&evidence(events, &store, &sessions, &layout, 10))
    };
    let pause_then_resume = [
        commit_in(1, CONTROL_SCOPE, "s1", control(json!({"p1": command("pause", "accepted")}))),
        commit_in(
            2,
            CONTROL_SCOPE,
            "s1",
            control(json!({"p1": command("pause", "applied"), "r1": command("resume", "accepted")})),
        ),
    ];
    let both = control(json!({"p1": command("pause", "applied"), "r1": command("resume", "applied")}));
    let found = judged(&pause_then_resume, "paused", both.clone());
    assert!(found.len() == 1 && found[0].contains("an older pause parked it again"), "{found:?}");
    // It names the turn's applied pauses, and nothing else.
    assert!(found[0].contains("applied after the pause p1 had been recorded"), "{found:?}");
    assert!(judged(&pause_then_resume, "completed", both.clone()).is_empty());
    // A pause recorded after the resume explains the park.
    let resume_then_pause = [
        commit_in(1, CONTROL_SCOPE, "s1", control(json!({"r1": command("resume", "applied")}))),
        commit_in(
            2,
            CONTROL_SCOPE,
            "s1",
            control(json!({"r1": command("resume", "applied"), "p2": command("pause", "accepted")})),
        ),
    ];
    let later = control(json!({"r1": command("resume", "applied"), "p2": command("pause", "applied")}));
    assert!(judged(&resume_then_pause, "paused", later).is_empty());
    // A resume that was not applied parks nothing.
    let rejected = control(json!({"p1": command("pause", "applied"), "r1": command("resume", "rejected")}));
    assert!(judged(&pause_then_resume, "paused", rejected).is_empty());
    // When a command was recorded counts from the seeded control record, and from the control
    // scope's commits only: a seeded resume precedes a pause the run added, even one whose key
    // sorts first; commands another scope's record names under the session's key are not recorded.
    let seeded = [(CONTROL_SCOPE.to_string(), "s1".to_string(), control(json!({"r1": command("resume", "applied")})))];
    let added = control(json!({"a2": command("pause", "applied"), "r1": command("resume", "applied")}));
    let mut store = store_with("harness_turn", "s1", json!({"turn_id": "t1", "status": "paused"}));
    store.seed(CONTROL_SCOPE, "s1", added.clone());
    let events = [commit_in(1, CONTROL_SCOPE, "s1", added)];
    assert!(details(&Evidence { seeded: &seeded, ..evidence(&events, &store, &sessions, &layout, 10) }).is_empty());
    let elsewhere = commit_in(0, "harness_notes", "s1", control(json!({"r1": command("resume", "accepted")})));
    let found = judged(&flat(&[&[elsewhere], &pause_then_resume]), "paused", both);
    assert!(found.len() == 1 && found[0].contains("an older pause parked it again"), "{found:?}");
}

/// How `recovery-cost` follows a lease and its turn: a seeded turn is running from the start, only
/// the turn scope's records say whether the turn ran, a release is the holder's own
/// `release-lease` with its token before the lease ran out, a renewal keeps the grant's time, a
/// takeover at the very millisecond of the expiry is no lapse, and a fault counts from the grant.
#[test]
fn recovery_cost_follows_the_turn_the_grant_and_the_release_of_a_lapsed_lease_exactly() {
    let (store, sessions, layout) = (StateStore::new(), doubles::SessionService::new(), RecordLayout::default());
    let grant = |at_ms: u64, owner: &str, token: u64, expires_at_ms: u64| {
        event(at_ms, EventKind::Lease { domain: "harness_owner/s1".into(), owner: owner.into(), token, expires_at_ms })
    };
    let lease_call = |at_ms: u64, by: &str, function: &str, token: u64| {
        call_from(at_ms, by, function, json!({"scope": "harness_owner", "key": "s1", "token": token}))
    };
    let running = commit(0, json!({"turn_id": "t1", "status": "running", "step": 1}));
    let charged = |events: &[Event], seeded: &[(String, String, Value)]| {
        let evidence = Evidence { seeded, ..evidence(events, &store, &sessions, &layout, 10_000) };
        details(&evidence).into_iter().filter(|d| d.contains("with no fault to cause it")).count()
    };
    // The lease granted at 1 until 1500, `between` happening meanwhile, taken over at `taken_at`.
    let lapse = |first: Event, between: Vec<Event>, taken_at: u64| {
        let mut events = vec![first, grant(1, "harness", 1, 1500), generate_from(2, "harness", json!([]))];
        events.extend(between);
        events.push(grant(taken_at, "replacement", 2, taken_at + 1500));
        events.push(generate_from(taken_at + 1, "replacement", json!([])));
        events
    };
    assert_eq!(charged(&lapse(running.clone(), vec![], 2000), &[]), 1);
    // A turn seeded running and never written in the run was running all the same.
    let seeded = [("harness_turn".to_string(), "s1".to_string(), json!({"turn_id": "t1", "status": "running"}))];
    let note = commit_in(0, "harness_notes", "n1", json!({}));
    assert_eq!(charged(&lapse(note.clone(), vec![], 2000), &seeded), 1);
    // A record of another scope under the session's key says nothing of its turn.
    let other_scope = commit_in(3, "harness_session", "s1", json!({"status": "completed"}));
    assert_eq!(charged(&lapse(running.clone(), vec![other_scope], 2000), &[]), 1);
    // Only the holder's own release with its token, before the lease ran out, hands it back.
    let renewal_call = lease_call(3, "harness", "state::renew-lease", 1);
    assert_eq!(charged(&lapse(running.clone(), vec![renewal_call], 2000), &[]), 1);
    let by_another = lease_call(3, "replacement", "state::release-lease", 1);
    assert_eq!(charged(&lapse(running.clone(), vec![by_another], 2000), &[]), 1);
    let too_late = lease_call(1600, "harness", "state::release-lease", 1);
    assert_eq!(charged(&lapse(running.clone(), vec![too_late], 2000), &[]), 1);
    let handed_back = lease_call(3, "harness", "state::release-lease", 1);
    assert_eq!(charged(&lapse(running.clone(), vec![handed_back], 2000), &[]), 0);
    // A renewal keeps the grant's time: a fault before it still counts as the lapse's cause.
    let crash_then_renewal = vec![cut_event(500, "crash-caller-after"), grant(1000, "harness", 1, 2500)];
    assert_eq!(charged(&lapse(running.clone(), crash_then_renewal, 2600), &[]), 0);
    // Taken over at the millisecond the lease ran out: it had not lapsed.
    assert_eq!(charged(&lapse(running.clone(), vec![], 1500), &[]), 0);
    // A fault before the grant is no cause of its lapse; one at the grant's millisecond may be.
    let early = vec![cut_event(0, "crash-caller-after"), running.clone()];
    let mut before_grant = early.clone();
    before_grant.extend(lapse(note.clone(), vec![], 2000));
    assert_eq!(charged(&before_grant, &[]), 1);
    // A request the network delivered twice (one invocation) is one request repeated, not two.
    let mut delivered_twice = lapse(running.clone(), vec![], 2000);
    delivered_twice.push(generate_from(2001, "replacement", json!([])));
    let once = details(&evidence(&delivered_twice, &store, &sessions, &layout, 10_000));
    assert!(once.iter().any(|d| d.contains("1 model_calls repeated")), "{once:?}");
    // An action sent again after the takeover is repeated work too; one sent once is not.
    let create = |at_ms: u64, by: &str, action: &str| {
        call_from(at_ms, by, "ticket::create", json!({"action_id": action, "idempotency_key": action}))
    };
    let sent_again = [
        running.clone(),
        grant(1, "harness", 1, 1500),
        create(2, "harness", "a1"),
        grant(2000, "replacement", 2, 3500),
        create(2001, "replacement", "a1"),
        create(2002, "replacement", "a2"),
    ];
    let again = details(&evidence(&sent_again, &store, &sessions, &layout, 10_000));
    assert!(again.iter().any(|d| d.contains("excessive recovery: 1 effect_requests repeated")), "{again:?}");
    let only_again = details(&evidence(&sent_again[..5], &store, &sessions, &layout, 10_000));
    assert!(only_again.iter().any(|d| d.contains("excessive recovery: 1 effect_requests repeated")), "{only_again:?}");
    // Work repeated after the next fault is that fault's to answer for.
    let mut after_a_fault = lapse(running.clone(), vec![], 2000);
    after_a_fault.insert(after_a_fault.len() - 1, cut_event(2000, "crash-caller-after"));
    assert_eq!(charged(&after_a_fault, &[]), 0);
    let mut at_grant = vec![running.clone(), cut_event(1, "crash-caller-after")];
    at_grant.extend(lapse(note, vec![], 2000));
    assert_eq!(charged(&at_grant, &[]), 0);
}

/// Which faults excuse a lease that lapsed: a process cut, a proxy rule, and anything the script
/// did to hosts and links but healing them.
#[test]
fn recovery_cost_takes_a_process_cut_a_proxy_rule_or_a_world_change_but_a_heal_as_a_lapse_s_cause() {
    let (store, sessions, layout) = (StateStore::new(), doubles::SessionService::new(), RecordLayout::default());
    let grant = |at_ms: u64, owner: &str, token: u64, expires_at_ms: u64| {
        event(at_ms, EventKind::Lease { domain: "harness_owner/s1".into(), owner: owner.into(), token, expires_at_ms })
    };
    let lapsed_around = |fault: EventKind| {
        let events = [
            commit(0, json!({"turn_id": "t1", "status": "running", "step": 1})),
            grant(1, "harness", 1, 1500),
            generate_from(2, "harness", json!([])),
            event(500, fault),
            grant(2000, "replacement", 2, 3500),
            generate_from(2001, "replacement", json!([])),
        ];
        details(&evidence(&events, &store, &sessions, &layout, 10_000))
            .into_iter()
            .filter(|d| d.contains("with no fault to cause it"))
            .count()
    };
    let frozen = EventKind::Interrupt {
        interrupt: 0,
        worker: "harness".into(),
        point: "before-generate".into(),
        action: "freeze".into(),
    };
    assert_eq!(lapsed_around(frozen), 0);
    let dropped =
        EventKind::ProxyRule { rule: 0, action: "drop".into(), direction: "to-worker".into(), frame: json!({}) };
    assert_eq!(lapsed_around(dropped), 0);
    let crashed = EventKind::Control { action: "crash".into(), target: "harness".into() };
    assert_eq!(lapsed_around(crashed), 0);
    let healed = EventKind::Control { action: "heal".into(), target: "network".into() };
    assert_eq!(lapsed_around(healed), 1);
}

/// `admitted-once` counts the input seeded in the queue and the scenario's own puts there as
/// messages (not a record of another scope), and takes as started only new turns of the turn
/// scope that the run wrote first (not a seeded turn written again, not a record of another
/// scope that names a step).
#[test]
fn admitted_once_counts_seeded_input_and_only_turns_the_run_started() {
    let (store, sessions, layout) = (StateStore::new(), doubles::SessionService::new(), RecordLayout::default());
    let sends = || vec![Sent { session_id: "s1".into(), identity: "key:m1".into() }];
    let answered_twice = |events: &[Event], seeded: &[(String, String, Value)]| {
        let evidence = Evidence { sends: sends(), seeded, ..evidence(events, &store, &sessions, &layout, 10) };
        details(&evidence).iter().filter(|d| d.contains("a message was answered twice")).count()
    };
    let new_turn = |at_ms: u64, turn: &str| commit(at_ms, json!({"turn_id": turn, "status": "running", "step": 0}));
    let two_turns = [new_turn(1, "ta"), new_turn(5, "tb")];
    assert_eq!(answered_twice(&two_turns, &[]), 1);
    // Input seeded in the queue is a message of its own; a seeded record of another scope is not.
    let queued = [("harness_queue".to_string(), "s1:q1".to_string(), json!({"session_id": "s1", "message": {}}))];
    assert_eq!(answered_twice(&two_turns, &queued), 0);
    let noted = [("harness_notes".to_string(), "s1".to_string(), json!({"session_id": "s1"}))];
    assert_eq!(answered_twice(&two_turns, &noted), 1);
    // The scenario's own write to another scope puts no message in.
    let put = Event {
        host: crate::topology::DRIVER.into(),
        ..commit_in(1, "harness_notes", "s1", json!({"session_id": "s1"}))
    };
    assert_eq!(answered_twice(&flat(&[&[put], &two_turns]), &[]), 1);
    // A seeded turn written again by the worker was not started by the run.
    let seeded_turn =
        [("harness_turn".to_string(), "s1".to_string(), json!({"turn_id": "t0", "status": "running", "step": 0}))];
    let finished = commit(2, json!({"turn_id": "t0", "status": "completed", "step": 0}));
    assert_eq!(answered_twice(&[finished, new_turn(3, "ta")], &seeded_turn), 0);
    // A record of another scope under the session's key, naming a turn at step 0, is no turn.
    let current = commit_in(2, "harness_session", "s1", json!({"turn_id": "tx", "step": 0}));
    assert_eq!(answered_twice(&[new_turn(1, "ta"), current], &[]), 0);
}

#[test]
fn recovery_cost_charges_work_repeated_after_a_lease_lapsed_with_no_fault_to_no_fault() {
    let (store, sessions, layout) = (StateStore::new(), doubles::SessionService::new(), RecordLayout::default());
    let grant = |at_ms: u64, owner: &str, token: u64, expires_at_ms: u64| {
        event(at_ms, EventKind::Lease { domain: "harness_owner/s1".into(), owner: owner.into(), token, expires_at_ms })
    };
    let ask = |at_ms: u64, by: &str| generate_from(at_ms, by, json!([]));
    let running = commit(0, json!({"turn_id": "t1", "status": "running", "step": 1}));
    let judged = |events: &[Event]| details(&evidence(events, &store, &sessions, &layout, 10_000));
    // `generate_from` asks for the same round of turn t1 each time, under a new invocation.
    let lapsed = [
        running.clone(),
        grant(1, "harness", 1, 1500),
        ask(2, "harness"),
        grant(2000, "replacement", 2, 3500),
        ask(2001, "replacement"),
    ];
    let found = judged(&lapsed);
    assert!(found.len() == 1 && found[0].contains("with no fault to cause it"), "{found:?}");
    // Renewed in time: taken over only once it was handed back or ran out for a reason.
    let renewed = [
        running.clone(),
        grant(1, "harness", 1, 1500),
        ask(2, "harness"),
        grant(1000, "harness", 1, 2500),
        grant(2600, "replacement", 2, 4000),
        ask(2601, "replacement"),
    ];
    assert_eq!(judged(&renewed).len(), 1, "it lapsed at 2500 all the same");
    let released = [
        running.clone(),
        grant(1, "harness", 1, 1500),
        ask(2, "harness"),
        call_from(3, "harness", "state::release-lease", json!({"scope": "harness_owner", "key": "s1", "token": 1})),
        grant(2000, "replacement", 2, 3500),
        ask(2001, "replacement"),
    ];
    assert!(judged(&released).is_empty(), "handed back");
    // A fault that can stop a worker renewing excuses the lapse; one that cannot does not.
    let crashed = [
        running.clone(),
        grant(1, "harness", 1, 1500),
        ask(2, "harness"),
        cut_event(500, "crash-caller-after"),
        grant(2000, "replacement", 2, 3500),
        ask(2001, "replacement"),
    ];
    assert!(judged(&crashed).is_empty());
    let delayed = [
        running.clone(),
        grant(1, "harness", 1, 1500),
        ask(2, "harness"),
        cut_event(500, "delay"),
        grant(2000, "replacement", 2, 3500),
        ask(2001, "replacement"),
    ];
    assert_eq!(judged(&delayed).len(), 1);
    // Nothing repeated after the takeover: nothing charged.
    let nothing_again =
        [running.clone(), grant(1, "harness", 1, 1500), ask(2, "harness"), grant(2000, "replacement", 2, 3500)];
    assert!(judged(&nothing_again).is_empty());
    // A turn at rest when the lease ran out: no turn was cut short.
    let at_rest = commit(0, json!({"turn_id": "t1", "status": "held", "held_reason": "a person", "step": 1}));
    let idle = [
        at_rest,
        grant(1, "harness", 1, 1500),
        ask(2, "harness"),
        grant(2000, "replacement", 2, 3500),
        ask(2001, "replacement"),
    ];
    assert!(judged(&idle).is_empty());
}

/// The session's control record as committed, holding `commands`.
fn commands_commit(at_ms: u64, commands: Value) -> Event {
    let value = json!({ "session_id": "s1", "commands": commands });
    event(
        at_ms,
        EventKind::Commit { scope: CONTROL_SCOPE.into(), key: "s1".into(), value: value.into(), version: at_ms },
    )
}

fn one_command(at_ms: u64, kind: &str, turn: &str, state: &str) -> Event {
    commands_commit(at_ms, json!({ "c1": { "command": kind, "turn_id": turn, "state": state } }))
}

#[test]
fn cancellation_catches_a_turn_moved_with_no_command_naming_it() {
    let none = StateStore::new();
    let turn = |at_ms: u64, status: &str| commit(at_ms, json!({"session_id": "s1", "turn_id": "t2", "status": status}));
    let cancelled = turn(5, "cancelled");
    let moved = |events: &[Event]| judge(events, &none);
    // Nobody asked (a timeout taken for a cancellation), or the command named the session's
    // earlier turn: fires.
    assert_eq!(moved(std::slice::from_ref(&cancelled)), vec![Oracle::Cancellation]);
    assert_eq!(moved(&[one_command(1, "cancel", "t1", "accepted"), cancelled.clone()]), vec![Oracle::Cancellation]);
    // A cancel or stop of the turn, in any state it reached but `rejected`; one recorded with no
    // turn names whichever the session holds.
    for (kind, state) in [("cancel", "accepted"), ("stop", "accepted"), ("cancel", "applied"), ("stop", "expired")] {
        assert!(moved(&[one_command(1, kind, "t2", state), cancelled.clone()]).is_empty(), "{kind} {state}");
    }
    let no_turn = commands_commit(1, json!({"c1": {"command": "cancel", "state": "accepted"}}));
    assert!(moved(&[no_turn, cancelled.clone()]).is_empty());
    assert_eq!(moved(&[one_command(1, "cancel", "t2", "rejected"), cancelled.clone()]), vec![Oracle::Cancellation]);
    let accepted_then_refused =
        [one_command(1, "cancel", "t2", "accepted"), one_command(2, "cancel", "t2", "rejected"), cancelled.clone()];
    assert!(moved(&accepted_then_refused).is_empty());
    // A pause or a resume cancels nothing.
    assert_eq!(moved(&[one_command(1, "pause", "t2", "applied"), cancelled.clone()]), vec![Oracle::Cancellation]);
    // The script's own writes (a `put`, or the driver's store call) are a person's: not judged.
    let put = Event { host: crate::topology::DRIVER.into(), ..cancelled.clone() };
    assert!(moved(&[put]).is_empty());
    let by_driver = call_from(4, crate::topology::DRIVER, "state::set", json!({"scope": "harness_turn"}));
    assert!(moved(&[by_driver, cancelled.clone()]).is_empty());
    // A turn already cancelled before the write (the seeded record, or an earlier commit) is
    // not moved by it: only the commit that cancelled it is judged, once.
    let seeded = [("harness_turn".to_string(), "s1".to_string(), json!({"turn_id": "t2", "status": "cancelled"}))];
    let layout = RecordLayout::default();
    let sessions = doubles::SessionService::new();
    let events = [cancelled.clone()];
    let evidence = Evidence { seeded: &seeded, ..evidence(&events, &none, &sessions, &layout, 10) };
    assert!(check(&evidence).is_empty());
    let twice: Vec<Violation> = violations_of(&[cancelled.clone(), turn(6, "cancelled")], &none, None, 10, true);
    assert_eq!(twice.len(), 1, "{twice:?}");
    assert_eq!(
        twice[0].detail,
        "turn s1/t2 ended `cancelled` at 5 ms with no cancel or stop naming it recorded: the commands of session s1 were none"
    );

    // Parked with no pause of the turn; taken from the park back to `running` with no resume.
    let (paused, running) = (turn(5, "paused"), turn(7, "running"));
    assert_eq!(moved(&[turn(3, "running"), paused.clone()]), vec![Oracle::Cancellation]);
    let pause = commands_commit(1, json!({"p": {"command": "pause", "turn_id": "t2", "state": "applied"}}));
    assert!(moved(&[turn(3, "running"), pause.clone(), paused.clone()]).is_empty());
    let stale_resume = commands_commit(
        6,
        json!({"p": {"command": "pause", "turn_id": "t2", "state": "applied"}, "r": {"command": "resume", "turn_id": "t1", "state": "applied"}}),
    );
    let resumed = violations_of(&[pause.clone(), paused.clone(), stale_resume, running.clone()], &none, None, 10, true);
    assert_eq!(
        resumed.iter().map(|v| v.detail.as_str()).collect::<Vec<_>>(),
        vec!["turn s1/t2 was taken from `paused` back to `running` at 7 ms with no resume naming it recorded: the commands of session s1 were p (pause of t2, applied), r (resume of t1, applied)"]
    );
    let resume = commands_commit(
        6,
        json!({"p": {"command": "pause", "turn_id": "t2", "state": "applied"}, "r": {"command": "resume", "turn_id": "t2", "state": "applied"}}),
    );
    assert!(moved(&[pause, paused, resume, running]).is_empty());
}
