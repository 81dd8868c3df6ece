//! The cut space of a run: every place a fault can go, read off one uncut run, with the cut
//! kinds that apply there, each with a stable id a person can read.
//!
//! - every call a double received from a harness worker, by function, what it was about (scope,
//!   key, status, session, action) and which of its like it was;
//! - every frame between the engine and a harness worker, by kind, function, direction and
//!   which of its like it was;
//! - every named interruption point each worker reached, and which time.
//!
//! A placement is a site and a kind; applied to a scenario it becomes one more `[[cut]]`,
//! `[[interrupt]]` or proxy rule, which fires exactly there (the run is the same up to that
//! point, since the seed is the same).

use crate::condition::Condition;
use crate::cut::{Count, Interrupt, OutageOver, ProcessCut, Refusal, ServiceCut, ServiceFault, Trigger};
use crate::run::RunOutcome;
use crate::scenario::{ProxySetup, Scenario};
use crate::topology::{HARNESS, REPLACEMENT};
use crate::trace::EventKind;
use proxy::{ActionKind, Directions, MatchValue};
use serde_json::Value;
use std::collections::BTreeMap;
use std::fmt;

/// The payload fields that say what a call is about, in the order they are named.
const IDENTITY_FIELDS: [&str; 6] = ["scope", "key", "value.status", "session_id", "action_id", "owner"];

/// Calls that change something: every kind of cut applies; the rest are reads.
const WRITES: [&str; 9] = [
    "state::set",
    "state::delete",
    "state::compare-and-set",
    "state::acquire-lease",
    "state::renew-lease",
    "state::release-lease",
    "session::append",
    "session::set-status",
    "ticket::create",
];

/// A place in a run where a fault can go.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Site {
    /// The `nth` call (from 1) of `function` with these identity fields.
    Call { function: String, about: Vec<(String, String)>, nth: u64 },
    /// The `nth` frame of this kind for `function` between the engine and `worker`; `up` is
    /// from the worker.
    Frame { worker: String, up: bool, frame: String, function: String, nth: u64 },
    /// The `nth` time `worker` reached the named `point`.
    Point { worker: String, point: String, nth: u64 },
}

/// What a placement does at its site.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    LostAck,
    Timeout,
    Reject,
    /// A reply later than the caller's deadline.
    Delay,
    /// A request held on the way, unanswered, until its caller sends it again: it takes effect
    /// right after that retry, after the question the caller asked in between.
    Late,
    CrashCallerBefore,
    CrashCallerAfter,
    CrashService,
    /// The engine dies as the call's reply would pass through it (and restarts).
    CrashEngine,
    /// The caller's link to the engine is cut as the call's reply would come back, for a while.
    IsolateCaller,
    /// Pause the worker holding a lease past its expiry.
    PauseCaller,
    Drop,
    Duplicate,
    /// A fire-and-forget frame to a worker (a streamed reply's frame) held back until the next
    /// frame of its kind has passed: the two cross on the way.
    Reorder,
    Crash,
    Pause,
    /// The call's whole service down for a while from this call on, every link up: each call
    /// it gets meanwhile is refused with an error.
    Outage,
    /// The same, each call left unanswered until its caller's deadline.
    OutageTimeout,
}

impl Kind {
    /// The kinds a swarm draws a coin for, each its own; `Reorder` comes with `Delay`'s (a frame
    /// made late past its partner), so that adding it changed no seed's draw; the two outages
    /// come from a stream of their own for the same reason (see `swarm::draw`).
    pub const ALL: [Kind; 14] = [
        Kind::LostAck,
        Kind::Timeout,
        Kind::Reject,
        Kind::Delay,
        Kind::CrashCallerBefore,
        Kind::CrashCallerAfter,
        Kind::CrashService,
        Kind::PauseCaller,
        Kind::Drop,
        Kind::Duplicate,
        Kind::Crash,
        Kind::Pause,
        Kind::CrashEngine,
        Kind::IsolateCaller,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Kind::LostAck => "lost-ack",
            Kind::Timeout => "timeout",
            Kind::Reject => "reject",
            Kind::Delay => "delay",
            Kind::Late => "late",
            Kind::CrashCallerBefore => "crash-caller-before",
            Kind::CrashCallerAfter => "crash-caller-after",
            Kind::CrashService => "crash-service",
            Kind::CrashEngine => "crash-engine",
            Kind::IsolateCaller => "isolate-caller",
            Kind::PauseCaller => "pause-caller",
            Kind::Drop => "drop",
            Kind::Duplicate => "duplicate",
            Kind::Reorder => "reorder",
            Kind::Crash => "crash",
            Kind::Pause => "pause",
            Kind::Outage => "outage",
            Kind::OutageTimeout => "outage-timeout",
        }
    }

    /// A service down for a while, however it refuses.
    pub fn is_outage(self) -> bool {
        matches!(self, Kind::Outage | Kind::OutageTimeout)
    }
}

/// A site and what to do there.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Placement {
    pub site: Site,
    pub kind: Kind,
    /// The delay or pause it applies, where it has one.
    pub ms: Option<u64>,
}

fn about_text(about: &[(String, String)]) -> String {
    about.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(" ")
}

/// An identity value as a finding's signature shows it: every id in it that the harness minted
/// at random (a UUID, or a run of 16 or more hex digits with a digit among them, each a word of
/// its own) as `<id>`: `act-<id>`, `turn-<id>/1.0`. Such an id changes from seed to seed and
/// with any change in the order of the harness's draws, so a signature holding it would name a
/// known bug anew in every exploration and every night.
pub fn unminted(value: &str) -> String {
    let bytes = value.as_bytes();
    let mut shown = String::with_capacity(value.len());
    let mut at = 0;
    while at < bytes.len() {
        let starts_word = at == 0 || !bytes[at - 1].is_ascii_alphanumeric();
        if let Some(len) = minted_id_len(&bytes[at..]).filter(|_| starts_word) {
            shown.push_str("<id>");
            at += len;
            continue;
        }
        let c = value[at..].chars().next().unwrap_or_default();
        shown.push(c);
        at += c.len_utf8().max(1);
    }
    shown
}

/// The length of the minted id (see [`unminted`]) `text` starts with, when it starts with one.
fn minted_id_len(text: &[u8]) -> Option<usize> {
    let hex_from =
        |from: usize| text.get(from..).map_or(0, |rest| rest.iter().take_while(|b| b.is_ascii_hexdigit()).count());
    let ends_word = |at: usize| text.get(at).is_none_or(|b| !b.is_ascii_alphanumeric());
    let mut at = 0;
    let mut uuid = true;
    for (group, len) in [8, 4, 4, 4, 12].into_iter().enumerate() {
        if group > 0 {
            if text.get(at) != Some(&b'-') {
                uuid = false;
                break;
            }
            at += 1;
        }
        if hex_from(at) != len {
            uuid = false;
            break;
        }
        at += len;
    }
    if uuid && ends_word(at) {
        return Some(at);
    }
    let run = hex_from(0);
    (run >= 16 && ends_word(run) && text[..run].iter().any(u8::is_ascii_digit)).then_some(run)
}

impl Site {
    /// The site without its ordinal: what makes two findings the same finding.
    pub fn class(&self) -> String {
        match self {
            Site::Call { function, about, .. } => format!("call {function}[{}]", about_text(about)),
            Site::Frame { worker, up, frame, function, .. } => {
                format!("frame {frame} {function} {} {worker}", if *up { "from" } else { "to" })
            }
            Site::Point { worker, point, .. } => format!("point {worker}@{point}"),
        }
    }

    /// The class as a finding's signature holds it: identity values with the ids the harness
    /// minted at random shown as `<id>` ([`unminted`]).
    pub fn signature_class(&self) -> String {
        match self {
            Site::Call { function, about, .. } => {
                let about: Vec<(String, String)> = about.iter().map(|(k, v)| (k.clone(), unminted(v))).collect();
                format!("call {function}[{}]", about_text(&about))
            }
            other => other.class(),
        }
    }

    /// What the site's call is about, when it is one action or one record: `action t1:1:0`,
    /// `record harness_turn/s1`. Two faults on one subject are what a retry, a readback or a
    /// reconciliation of it meets.
    pub fn subject(&self) -> Option<String> {
        let Site::Call { about, .. } = self else { return None };
        let field = |name: &str| about.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str());
        match (field("action_id"), field("scope"), field("key")) {
            (Some(action), _, _) => Some(format!("action {action}")),
            (None, Some(scope), Some(key)) => Some(format!("record {scope}/{key}")),
            _ => None,
        }
    }

    /// Which of its like the site is, from 1.
    pub fn nth(&self) -> u64 {
        match self {
            Site::Call { nth, .. } | Site::Frame { nth, .. } | Site::Point { nth, .. } => *nth,
        }
    }

    /// How near the site is to where an action happens without being recorded: effects first,
    /// then commits and acknowledgements, then everything else. Pairs are tried in this order.
    pub fn promise(&self) -> u8 {
        match self {
            Site::Call { function, .. } if function == "ticket::create" => 3,
            Site::Frame { frame, .. } if frame == "invocationresult" => 2,
            Site::Call { function, .. } if WRITES.contains(&function.as_str()) => 2,
            Site::Point { .. } => 2,
            _ => 1,
        }
    }
}

impl fmt::Display for Site {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}#{}", self.class(), self.nth())
    }
}

impl Placement {
    /// A stable id a person can read: `timeout @ call state::set[scope=harness_turn ...]#2`; an
    /// outage says how long, since the space offers a few at each site (`outage for 15000 ms @
    /// ...`).
    pub fn id(&self) -> String {
        match self.ms.filter(|_| self.kind.is_outage()) {
            Some(ms) => format!("{} for {ms} ms @ {}", self.kind.name(), self.site),
            None => format!("{} @ {}", self.kind.name(), self.site),
        }
    }

    /// The id without the ordinal.
    pub fn class(&self) -> String {
        format!("{} @ {}", self.kind.name(), self.site.class())
    }

    /// The class as a finding's signature holds it ([`Site::signature_class`]).
    pub fn signature_class(&self) -> String {
        format!("{} @ {}", self.kind.name(), self.site.signature_class())
    }

    /// Adds the cut to `scenario`; it may go unfired (the sweep tells an unreached site from a
    /// clean one by the trace).
    pub fn apply(&self, scenario: &mut Scenario) {
        let trigger = |nth: u64| Trigger::new(nth - 1, Count::Times(1), true);
        match &self.site {
            Site::Call { function, about, nth } => {
                let fault = match self.kind {
                    Kind::LostAck => ServiceFault::LostAck,
                    Kind::Timeout => ServiceFault::Timeout,
                    Kind::Reject => ServiceFault::Reject {
                        code: crate::cut::REJECT_CODE.into(),
                        message: crate::cut::REJECT_MESSAGE.into(),
                    },
                    Kind::Delay => ServiceFault::Delay { ms: self.ms.unwrap_or(0) },
                    Kind::Late => ServiceFault::Late,
                    Kind::CrashCallerBefore => ServiceFault::CrashCaller { after: false },
                    Kind::CrashCallerAfter => ServiceFault::CrashCaller { after: true },
                    Kind::CrashService => ServiceFault::CrashService,
                    Kind::CrashEngine => ServiceFault::CrashEngine,
                    Kind::IsolateCaller => ServiceFault::IsolateCaller { ms: self.ms.unwrap_or(0) },
                    Kind::Outage | Kind::OutageTimeout => ServiceFault::Outage {
                        ms: self.ms.unwrap_or(0),
                        refuse: if self.kind == Kind::Outage { Refusal::unavailable() } else { Refusal::Timeout },
                        over: OutageOver::Service,
                    },
                    _ => ServiceFault::PauseCaller { ms: self.ms.unwrap_or(0) },
                };
                let conditions = about
                    .iter()
                    .map(|(path, text)| Condition::equals(path, text.clone()).expect("valid paths"))
                    .collect();
                scenario.cuts.push(ServiceCut {
                    function: function.clone(),
                    conditions,
                    fault,
                    trigger: trigger(*nth),
                });
            }
            Site::Point { worker, point, nth } => {
                let interrupt = match self.kind {
                    Kind::Crash => Interrupt::Crash,
                    _ => Interrupt::Pause { ms: self.ms.unwrap_or(0) },
                };
                scenario.interrupts.push(ProcessCut {
                    worker: worker.clone(),
                    point: point.clone(),
                    interrupt,
                    trigger: trigger(*nth),
                });
            }
            Site::Frame { worker, up, frame, function, nth } => {
                let action = match self.kind {
                    Kind::Drop => ActionKind::Drop,
                    Kind::Reorder => ActionKind::Reorder,
                    _ => ActionKind::Duplicate,
                };
                let mut rule = proxy::Rule::new(action);
                rule.direction = if *up { Directions::Up } else { Directions::Down };
                rule.skip = nth - 1;
                rule.matches.insert("type".into(), MatchValue::Text(frame.clone()));
                rule.matches.insert("function_id".into(), MatchValue::Text(function.clone()));
                let setup = scenario.proxy.get_or_insert_with(|| ProxySetup {
                    worker: worker.clone(),
                    rules: Vec::new(),
                    optional: Vec::new(),
                });
                setup.rules.push(rule);
                setup.optional.push(true);
            }
        }
    }

    /// Whether the cut this placement added (the `index`-th of its sort) fired in `outcome`.
    pub fn fired(&self, outcome: &RunOutcome, index: usize) -> bool {
        self.fired_at(outcome, index).is_some()
    }

    /// The trace event where the cut this placement added (the `index`-th of its sort) first
    /// fired in `outcome`, if it did.
    pub fn fired_at(&self, outcome: &RunOutcome, index: usize) -> Option<usize> {
        outcome.trace.events().iter().position(|e| match (&self.site, &e.kind) {
            (Site::Call { .. }, EventKind::Cut { cut, .. }) => *cut == index,
            (Site::Point { .. }, EventKind::Interrupt { interrupt, .. }) => *interrupt == index,
            (Site::Frame { .. }, EventKind::ProxyRule { rule, .. }) => *rule == index,
            _ => false,
        })
    }
}

/// The order in which [`apply_all`] adds placements (and a finding's file lists their cuts):
/// latest ordinal first, the mix's own order otherwise.
pub fn application_order(placements: &[Placement]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..placements.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(placements[i].site.nth()));
    order
}

/// Applies several placements and returns, for each, the index of the cut it added among its sort.
///
/// The first cut that fires on a call decides it, and the cuts after it never count that call;
/// a cut that lets a call through still counts it. So the placements are added latest ordinal
/// first: a placement at the second call of a class, added before one at the first, counts the
/// first call too and fires at the second, as its id says, where added after it would fire at
/// the third. (Placements of one mix keep their order otherwise.)
pub fn apply_all(placements: &[Placement], scenario: &mut Scenario) -> Vec<usize> {
    let mut indices = vec![0; placements.len()];
    for i in application_order(placements) {
        let placement = &placements[i];
        indices[i] = match placement.site {
            Site::Call { .. } => scenario.cuts.len(),
            Site::Point { .. } => scenario.interrupts.len(),
            Site::Frame { .. } => scenario.proxy.as_ref().map_or(0, |p| p.rules.len()),
        };
        placement.apply(scenario);
    }
    indices
}

/// The identity fields of a call's payload.
fn about(payload: &Value) -> Vec<(String, String)> {
    IDENTITY_FIELDS
        .iter()
        .filter_map(|path| {
            let segments: Vec<String> = path.split('.').map(str::to_string).collect();
            proxy::lookup(payload, &segments).filter(|v| !v.is_null()).map(|v| (path.to_string(), proxy::value_text(v)))
        })
        .collect()
}

/// Knobs of the cut space.
#[derive(Debug, Clone)]
pub struct SpaceOptions {
    /// The most like sites tried per class (the 1st, 2nd, ... up to this).
    pub nth_max: u64,
}

impl Default for SpaceOptions {
    fn default() -> Self {
        Self { nth_max: 4 }
    }
}

/// How long the cut space keeps a service down, for a call whose caller waits `deadline_ms` for
/// it: three of its deadlines (a few tries refused), a quarter of the liveness window (past the
/// retries a harness makes in the background), and the whole window; none longer than the
/// window or than `longest_ms` (the workload's [`outage_bound_ms`]), each once, shortest first.
pub fn outage_durations(deadline_ms: u64, liveness_ms: u64, longest_ms: u64) -> Vec<u64> {
    let longest = liveness_ms.min(longest_ms).max(1);
    let mut durations: Vec<u64> = [deadline_ms.saturating_mul(3), liveness_ms / 4, liveness_ms]
        .iter()
        .map(|ms| (*ms).clamp(1, longest))
        .collect();
    durations.sort_unstable();
    durations.dedup();
    durations
}

/// The longest outage sweep and explore put in `workload`: the longest a correct harness can be
/// held to ride out with the outcome of the run without it (rig/docs/contract.md, "Outages").
/// It is the liveness window, or less where the world gives up first:
/// - the harness's own `settle_within_ms`, how long it goes on settling in the background;
/// - half the redelivery span of a queue that has no dead-letter function: `max_retries`
///   deliveries `backoff_ms` apart, the least it gives a harness that answers each delivery with
///   the store's error at once (the other half is left to the deliveries the mix's other cuts
///   cost). Past that span the queue gives the message up and nobody holds its turn, whatever
///   the harness does: the world lost it, no harness can save it. A queue with a dead-letter
///   function bounds nothing: its letter reaches a harness, which must hold or fail the turn
///   with a reason, so a longer outage there still judges the harness.
pub fn outage_bound_ms(workload: &Scenario) -> u64 {
    let world = &workload.world;
    let redelivery = world
        .queues
        .iter()
        .filter(|(_, queue)| queue.dead_letter_function.is_none())
        .map(|(_, queue)| u64::from(queue.max_retries).saturating_mul(queue.backoff_ms) / 2);
    redelivery.chain([world.liveness_ms, world.harness.settle_within_ms]).min().unwrap_or(u64::MAX).max(1)
}

/// Whether a late request to `function` is a fault a correct harness can answer for
/// (rig/docs/contract.md, late requests): the effect function of a tool whose service remembers
/// idempotency keys, where the copy sent again under the same key keeps it one effect. Not at a
/// service without keys (no question tells a request still on its way from one never sent, so
/// no harness can keep a late copy from being a second effect), a read, or a replay-safe call.
pub fn late_applies(workload: &Scenario, function: &str) -> bool {
    workload.world.harness.tools.iter().any(|t| t.function == function && t.idempotency && !t.replay_safe)
}

/// Every placement the uncut `baseline` run of `scenario` offers, in a fixed order.
pub fn cut_space(scenario: &Scenario, baseline: &RunOutcome, options: &SpaceOptions) -> Vec<Placement> {
    cut_space_at(scenario, baseline, options, false).into_iter().map(|(_, placement)| placement).collect()
}

/// The placements at call sites of `run` that come after its trace event `after` (where a
/// cut fired) and are about the same action or record as `subject`: where a second fault on the
/// same thing can go, the calls the first one caused (a retry, a readback, a reconciliation)
/// among them.
pub fn follow_ups(
    scenario: &Scenario,
    run: &RunOutcome,
    options: &SpaceOptions,
    after: usize,
    subject: &str,
) -> Vec<Placement> {
    cut_space_at(scenario, run, options, true)
        .into_iter()
        .filter(|(at, placement)| *at > after && placement.site.subject().as_deref() == Some(subject))
        .map(|(_, placement)| placement)
        .collect()
}

/// [`cut_space`], each placement with the index of the trace event its site is (`usize::MAX` for
/// a point, which the trace does not place). With `uncut_calls_only`, a call a cut of the run
/// took is no site: a cut added at it would meet the cut that took it first (an outage under
/// way takes every call it covers).
pub(crate) fn cut_space_at(
    scenario: &Scenario,
    baseline: &RunOutcome,
    options: &SpaceOptions,
    uncut_calls_only: bool,
) -> Vec<(usize, Placement)> {
    let config = &scenario.world.harness;
    let deadline_of = |function: &str| match function.split("::").next() {
        Some("model") => config.model_timeout_ms,
        Some("ticket") => config.tool_timeout_ms,
        _ => config.session_timeout_ms,
    };
    let pause_ms = (config.lease_ttl_ms * 3).max(5_000);
    let liveness_ms = scenario.world.liveness_ms;
    let outage_longest_ms = outage_bound_ms(scenario);
    let is_worker = |name: &str| name == HARNESS || name == REPLACEMENT;
    let proxied_elsewhere = |worker: &str| scenario.proxy.as_ref().is_some_and(|p| p.worker != worker);
    let mut seen: BTreeMap<String, u64> = BTreeMap::new();
    let mut placements = Vec::new();
    let mut count = |class: String| {
        let n = seen.entry(class).or_default();
        *n += 1;
        *n
    };
    let events = baseline.trace.events();
    let taken = |at: usize| {
        uncut_calls_only && events.get(at + 1).is_some_and(|next| matches!(next.kind, EventKind::Cut { .. }))
    };
    for (at, event) in events.iter().enumerate() {
        match &event.kind {
            EventKind::Call { function, payload, caller: Some(caller), .. } if is_worker(caller) => {
                let about = about(payload);
                let nth = count(format!("call {function} {}", about_text(&about)));
                if nth > options.nth_max || taken(at) {
                    continue;
                }
                let site = Site::Call { function: function.to_string(), about, nth };
                let mut kinds = vec![Kind::Timeout, Kind::Reject, Kind::Delay];
                if WRITES.contains(&function.as_str()) {
                    kinds.extend([
                        Kind::LostAck,
                        Kind::CrashCallerBefore,
                        Kind::CrashCallerAfter,
                        Kind::CrashService,
                        Kind::CrashEngine,
                        Kind::IsolateCaller,
                    ]);
                }
                if function == "state::acquire-lease" {
                    kinds.push(Kind::PauseCaller);
                }
                for kind in kinds {
                    let ms = match kind {
                        Kind::Delay => Some(deadline_of(function) + 500),
                        Kind::PauseCaller | Kind::IsolateCaller => Some(pause_ms),
                        _ => None,
                    };
                    placements.push((at, Placement { site: site.clone(), kind, ms }));
                }
                // A request of an effect arriving after its caller gave up on it, asked about it
                // and sent it again.
                if late_applies(scenario, function) {
                    placements.push((at, Placement { site: site.clone(), kind: Kind::Late, ms: None }));
                }
                // A service down for a while, from the first call of each class on: a few
                // refused calls, then past a harness's own retries, then up to the liveness
                // window (healing ends an outage still under way) or what the world lets a
                // harness survive, if that is less.
                if nth == 1 {
                    for kind in [Kind::Outage, Kind::OutageTimeout] {
                        for ms in outage_durations(deadline_of(function), liveness_ms, outage_longest_ms) {
                            placements.push((at, Placement { site: site.clone(), kind, ms: Some(ms) }));
                        }
                    }
                }
            }
            EventKind::Frame { direction, peer, frame, function_id: Some(function), invocation_id }
                if is_worker(peer)
                    && !proxied_elsewhere(peer)
                    && matches!(*frame, "invokefunction" | "invocationresult") =>
            {
                let up = *direction == "in";
                let nth = count(format!("frame {peer} {up} {frame} {function}"));
                if nth > options.nth_max {
                    continue;
                }
                let site = Site::Frame {
                    worker: peer.to_string(),
                    up,
                    frame: frame.to_string(),
                    function: function.to_string(),
                    nth,
                };
                for kind in [Kind::Drop, Kind::Duplicate] {
                    placements.push((at, Placement { site: site.clone(), kind, ms: None }));
                }
                // Only a frame nobody answers has nothing but its order to go by: an answered
                // call made late is a delay, which the call's own site has.
                if !up && *frame == "invokefunction" && invocation_id.is_none() {
                    placements.push((at, Placement { site, kind: Kind::Reorder, ms: None }));
                }
            }
            _ => {}
        }
    }
    for ((worker, point), arrivals) in &baseline.interrupt_points {
        for nth in 1..=(*arrivals).min(options.nth_max) {
            let site = Site::Point { worker: worker.clone(), point: point.clone(), nth };
            placements.push((usize::MAX, Placement { site: site.clone(), kind: Kind::Crash, ms: None }));
            placements.push((usize::MAX, Placement { site, kind: Kind::Pause, ms: Some(pause_ms) }));
        }
    }
    placements
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;
    use std::path::Path;

    fn empty() -> Scenario {
        let source = "about = \"nothing cut\"\n[[step]]\nwait_ms = 1\n\n[policy.reference]\n";
        Scenario::parse(Path::new("empty.toml"), source).unwrap()
    }

    fn call(function: &str, nth: u64) -> Site {
        Site::Call { function: function.into(), about: Vec::new(), nth }
    }

    fn frame(frame: &str, nth: u64) -> Site {
        Site::Frame { worker: "harness".into(), up: true, frame: frame.into(), function: "harness::turn".into(), nth }
    }

    fn point(nth: u64) -> Site {
        Site::Point { worker: "harness".into(), point: "after_completion".into(), nth }
    }

    fn applied(site: Site, kind: Kind) -> Scenario {
        let mut scenario = empty();
        Placement { site, kind, ms: Some(40) }.apply(&mut scenario);
        scenario
    }

    #[test]
    fn each_call_kind_becomes_its_own_service_fault_at_the_nth_call() {
        let expected = [
            (Kind::LostAck, ServiceFault::LostAck),
            (Kind::Timeout, ServiceFault::Timeout),
            (Kind::Delay, ServiceFault::Delay { ms: 40 }),
            (Kind::Late, ServiceFault::Late),
            (Kind::CrashCallerBefore, ServiceFault::CrashCaller { after: false }),
            (Kind::CrashCallerAfter, ServiceFault::CrashCaller { after: true }),
            (Kind::CrashService, ServiceFault::CrashService),
            (Kind::CrashEngine, ServiceFault::CrashEngine),
            (Kind::IsolateCaller, ServiceFault::IsolateCaller { ms: 40 }),
            (Kind::PauseCaller, ServiceFault::PauseCaller { ms: 40 }),
        ];
        for (kind, fault) in expected {
            let scenario = applied(call("state::set", 3), kind);
            let cut = &scenario.cuts[0];
            assert_eq!((&cut.function, &cut.fault), (&"state::set".to_string(), &fault), "{kind:?}");
            assert_eq!((cut.trigger.skip, cut.trigger.count, cut.trigger.optional), (2, Count::Times(1), true));
        }
        let rejected = applied(call("state::set", 1), Kind::Reject);
        assert!(matches!(rejected.cuts[0].fault, ServiceFault::Reject { .. }), "{:?}", rejected.cuts[0].fault);
    }

    #[test]
    fn a_point_kind_becomes_a_process_cut_and_a_frame_kind_a_proxy_rule() {
        let crash = applied(point(2), Kind::Crash);
        assert_eq!((crash.interrupts[0].interrupt, crash.interrupts[0].trigger.skip), (Interrupt::Crash, 1));
        let pause = applied(point(1), Kind::Pause);
        assert_eq!(pause.interrupts[0].interrupt, Interrupt::Pause { ms: 40 });
        let frame_kinds = [
            (Kind::Drop, ActionKind::Drop),
            (Kind::Duplicate, ActionKind::Duplicate),
            (Kind::Reorder, ActionKind::Reorder),
        ];
        for (kind, action) in frame_kinds {
            let scenario = applied(frame("invocationresult", 4), kind);
            let setup = scenario.proxy.expect("a proxy rule");
            assert_eq!((setup.rules[0].action, setup.rules[0].skip, &setup.optional), (action, 3, &vec![true]));
        }
    }

    #[test]
    fn a_site_is_shown_with_its_ordinal_and_classed_without_it() {
        assert_eq!(call("state::get", 3).to_string(), "call state::get[]#3");
        assert_eq!(point(2).to_string(), "point harness@after_completion#2");
        assert_eq!(frame("invoke", 5).to_string(), "frame invoke harness::turn from harness#5");
        assert_eq!(call("state::get", 3).class(), call("state::get", 1).class());
    }

    #[test]
    fn a_minted_id_is_left_out_of_a_signature_and_nothing_else_is() {
        let uuid = "3f2a9c1e-07b4-4d2e-9a51-c0ffee123456";
        assert_eq!(unminted(&format!("act-{uuid}")), "act-<id>");
        assert_eq!(unminted(&format!("turn-{uuid}/1.0")), "turn-<id>/1.0");
        assert_eq!(unminted(&format!("t-{uuid}:2:0")), "t-<id>:2:0");
        assert_eq!(unminted(&format!("s1:{uuid}")), "s1:<id>");
        assert_eq!(unminted("3f2a9c1e07b44d2e9a51c0ffee123456"), "<id>", "a UUID without its dashes");
        assert_eq!(unminted("a1b2c3d4e5f60718"), "<id>", "16 hex digits");
        for kept in [
            "t1:1:0",
            "s1",
            "harness_turn",
            "completed",
            "deadbeefdeadbeef",
            "a1b2c3d4e5f6071",
            "x3f2a9c1e07b44d2e9a51",
            "0a1b2c3d:1",
        ] {
            assert_eq!(unminted(kept), kept, "not minted at random: a word, too short, or part of a longer word");
        }
        let at = |action: &str| Site::Call {
            function: "ticket::create".into(),
            about: vec![("action_id".into(), action.into())],
            nth: 1,
        };
        let (one, other) = (at(&format!("act-{uuid}")), at("act-0b9e77aa-1c2d-4e3f-8a9b-0123456789ab"));
        assert_ne!(one.class(), other.class(), "a cut still names the very call");
        assert_eq!(one.signature_class(), other.signature_class());
        assert_eq!(one.signature_class(), "call ticket::create[action_id=act-<id>]");
        assert_eq!(at("t1:1:0").signature_class(), at("t1:1:0").class());
    }

    #[test]
    fn an_outage_takes_its_whole_service_down_and_its_id_says_for_how_long() {
        for (kind, refuse) in [(Kind::Outage, Refusal::unavailable()), (Kind::OutageTimeout, Refusal::Timeout)] {
            let scenario = applied(call("state::set", 1), kind);
            let expected = ServiceFault::Outage { ms: 40, refuse, over: OutageOver::Service };
            assert_eq!(scenario.cuts[0].fault, expected, "{kind:?}");
        }
        let outage = Placement { site: call("state::set", 2), kind: Kind::OutageTimeout, ms: Some(1_500) };
        assert_eq!(outage.id(), "outage-timeout for 1500 ms @ call state::set[]#2");
        assert_eq!(outage.class(), "outage-timeout @ call state::set[]", "a finding is the same at any length");
        let delay = Placement { site: call("state::set", 2), kind: Kind::Delay, ms: Some(1_500) };
        assert_eq!(delay.id(), "delay @ call state::set[]#2", "one delay per site: no length in its id");
    }

    #[test]
    fn outages_last_a_few_deadlines_past_background_retries_and_up_to_the_liveness_window() {
        assert_eq!(outage_durations(500, 60_000, u64::MAX), [1_500, 15_000, 60_000]);
        assert_eq!(outage_durations(60_000, 60_000, u64::MAX), [15_000, 60_000], "never past the window, each once");
        assert_eq!(outage_durations(0, 0, 0), [1], "at least a millisecond");
        assert_eq!(
            outage_durations(500, 60_000, 15_000),
            [1_500, 15_000],
            "never past what the world lets a harness survive"
        );
    }

    /// A queue with nobody to take its dead letters gives a turn up after its last delivery,
    /// whatever the harness does: the outages drawn stay within half its redelivery span. A
    /// dead-letter function, the liveness window and the harness's own settling bound the rest.
    #[test]
    fn outages_stay_within_what_the_world_lets_a_harness_survive() {
        let bound = |world: &str| {
            let source = format!("about = \"q\"\n{world}\n[[step]]\nwait_ms = 1\n\n[policy.reference]\n");
            outage_bound_ms(&Scenario::parse(Path::new("q.toml"), &source).unwrap())
        };
        assert_eq!(bound(""), 60_000, "no queue: the liveness window");
        assert_eq!(bound("[world]\nsettle_within_ms = 20000"), 20_000, "the harness's own settling");
        let queue = "[world.queue.turns]\nbackoff_ms = 1000\nmax_retries = 30";
        assert_eq!(bound(queue), 15_000, "30 deliveries a second apart, half of them");
        let handled = format!("{queue}\ndead_letter_function = \"harness::dead-letter\"");
        assert_eq!(bound(&handled), 60_000, "a dead letter reaches the harness");
        assert_eq!(bound(&format!("{handled}\n[world.queue.other]\nbackoff_ms = 200")), 300, "the least of them");
    }

    /// A late request goes only where a correct harness can keep it one effect: the effect of a
    /// service that keeps keys.
    #[test]
    fn a_late_request_is_placed_only_at_a_keyed_effect() {
        let world = |tickets: &str| {
            let source =
                format!("about = \"l\"\n[world.tickets]\n{tickets}\n[[step]]\nwait_ms = 1\n\n[policy.reference]\n");
            Scenario::parse(Path::new("l.toml"), &source).unwrap()
        };
        let keyed = world("idempotency = true");
        assert!(late_applies(&keyed, "ticket::create"));
        assert!(!late_applies(&keyed, "ticket::lookup"), "a read, safe to replay");
        assert!(!late_applies(&keyed, "state::set"), "no tool's effect");
        assert!(!late_applies(&world("idempotency = false\nlookup = true"), "ticket::create"), "no keys");
    }

    /// The bound follows the queue as the harness runs it: a harness that serves no dead letters
    /// runs the same workload with its queue's letters unwired (given up on, as if no handler
    /// were named), so the queue's redelivery span bounds its outages as it bounds any
    /// unhandled queue's; the file's wiring bounds them only for a harness that takes the letter.
    #[test]
    fn the_outage_bound_follows_the_dead_letter_wiring_the_harness_runs() {
        use crate::capability::{Capabilities, Capability};
        let source = "about = \"q\"\n[world.queue.turns]\nbackoff_ms = 1000\nmax_retries = 30\n\
                      dead_letter_function = \"harness::dead-letter\"\n[[step]]\nwait_ms = 1\n\n[policy.reference]\n";
        let workload = Scenario::parse(Path::new("q.toml"), source).unwrap();
        assert_eq!(outage_bound_ms(&workload.wired_for(&Capabilities::all())), 60_000, "its letter is taken");
        let turns_only = Capabilities::parse("turns").unwrap();
        assert!(!turns_only.contains(Capability::DeadLetters));
        assert_eq!(outage_bound_ms(&workload.wired_for(&turns_only)), 15_000, "nobody takes its letter");
    }

    /// The first cut that fires decides a call, and the cuts after it do not count it: a cut at
    /// the second call added after one at the first would fire at the third.
    #[test]
    fn two_placements_on_one_class_fire_at_their_own_ordinals_in_any_order() {
        let at = |nth: u64, kind: Kind| Placement { site: call("state::set", nth), kind, ms: None };
        for mix in [vec![at(1, Kind::LostAck), at(2, Kind::Timeout)], vec![at(2, Kind::Timeout), at(1, Kind::LostAck)]]
        {
            let mut scenario = empty();
            let indices = apply_all(&mix, &mut scenario);
            let mut table = crate::cut::CutTable::new(scenario.cuts.clone());
            let payload = serde_json::json!({});
            let fired: Vec<Option<usize>> =
                (0..3).map(|at_ms| table.decide("state::set", &payload, at_ms).map(|(index, _)| index)).collect();
            let by_call: Vec<Option<&Placement>> = fired
                .iter()
                .map(|index| index.and_then(|i| mix.iter().zip(&indices).find(|(_, j)| **j == i)).map(|(p, _)| p))
                .collect();
            assert_eq!(by_call, [Some(&at(1, Kind::LostAck)), Some(&at(2, Kind::Timeout)), None], "{mix:?}");
        }
        assert_eq!(application_order(&[at(1, Kind::LostAck), at(3, Kind::Timeout), at(2, Kind::Reject)]), [1, 2, 0]);
    }

    /// Effects first, then what commits or acknowledges, then reads and the other frames.
    #[test]
    fn the_sites_nearest_an_unrecorded_action_come_first() {
        let promise = |site: Site| site.promise();
        assert_eq!(promise(call("ticket::create", 1)), 3);
        assert_eq!(promise(frame("invocationresult", 1)), 2);
        assert_eq!(promise(call("state::set", 1)), 2);
        assert_eq!(promise(point(1)), 2);
        assert_eq!(promise(call("state::get", 1)), 1);
        assert_eq!(promise(frame("invoke", 1)), 1);
    }

    /// A call is about one action when it names one (whatever record it also names), else about
    /// one record when it names a scope and a key, else about nothing a second fault could meet
    /// again.
    #[test]
    fn a_call_is_about_its_action_else_its_record() {
        let about = |fields: &[(&str, &str)]| Site::Call {
            function: "state::set".into(),
            about: fields.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            nth: 1,
        };
        assert_eq!(about(&[("action_id", "t1:1:0")]).subject().as_deref(), Some("action t1:1:0"));
        let record = about(&[("scope", "harness_turn"), ("key", "s1")]);
        assert_eq!(record.subject().as_deref(), Some("record harness_turn/s1"));
        let both = about(&[("scope", "harness_action"), ("key", "t1:1:0"), ("action_id", "t1:1:0")]);
        assert_eq!(both.subject().as_deref(), Some("action t1:1:0"));
        assert_eq!(about(&[("scope", "harness_turn")]).subject(), None, "a scope without a key");
        assert_eq!(about(&[("session_id", "s1")]).subject(), None);
        assert_eq!(point(1).subject(), None);
    }

    /// The uncut run of a workload of `scenarios/workloads/` under the reference harness.
    fn uncut(file: &str) -> (Scenario, RunOutcome) {
        use crate::explore::Runs;
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scenarios/workloads").join(file);
        let scenario = crate::explore::workload(&Scenario::load(&path).unwrap(), false);
        let outcome = Runs::run(&crate::reference(), &scenario, &crate::explore::bare_run("reference"), 0);
        (scenario, outcome)
    }

    /// Each class of call is a site up to `nth_max` times, the first call and the `nth_max`-th
    /// among them; a service goes down only from the first call of its class.
    #[test]
    fn a_class_of_calls_is_a_site_up_to_nth_max_times_and_an_outage_starts_at_its_first() {
        let (scenario, baseline) = uncut("multi-round.toml");
        let space = cut_space(&scenario, &baseline, &SpaceOptions { nth_max: 2 });
        let calls: Vec<&Placement> = space.iter().filter(|p| matches!(p.site, Site::Call { .. })).collect();
        let nths: BTreeMap<u64, usize> = calls.iter().fold(BTreeMap::new(), |mut nths, p| {
            *nths.entry(p.site.nth()).or_default() += 1;
            nths
        });
        assert_eq!(nths.keys().copied().collect::<Vec<_>>(), [1, 2], "{nths:?}");
        let whole = cut_space(&scenario, &baseline, &SpaceOptions::default());
        assert!(whole.iter().any(|p| matches!(p.site, Site::Call { nth: 3, .. })), "a class called three times");
        let outages: Vec<&Placement> = whole.iter().filter(|p| p.kind.is_outage()).collect();
        assert!(!outages.is_empty());
        assert!(outages.iter().all(|p| matches!(p.site, Site::Call { nth: 1, .. })), "{:?}", outages[0]);
    }

    /// A reorder goes only on a frame the engine sends a worker that nobody answers (a streamed
    /// reply's frame): never on a frame from a worker, nor on a result.
    #[test]
    fn a_reorder_goes_only_on_an_unanswered_frame_to_a_worker() {
        let (scenario, baseline) = uncut("streamed-replies.toml");
        let space = cut_space(&scenario, &baseline, &SpaceOptions::default());
        let reorders: Vec<&Site> = space.iter().filter(|p| p.kind == Kind::Reorder).map(|p| &p.site).collect();
        assert!(!reorders.is_empty(), "the streamed reply's frames");
        for site in &reorders {
            assert!(matches!(site, Site::Frame { up: false, frame, .. } if frame == "invokefunction"), "{site}");
        }
        let frames: BTreeSet<&Site> =
            space.iter().filter(|p| matches!(p.site, Site::Frame { .. })).map(|p| &p.site).collect();
        assert!(frames.len() > reorders.len(), "frames that are answered or go up: dropped or duplicated only");
    }

    /// In a run with cuts, a call a cut took is no site: a second cut there would meet the first.
    /// The calls of its class after it still are, at their own ordinals.
    #[test]
    fn a_call_a_cut_took_is_no_site_of_that_run() {
        use crate::explore::Runs;
        let (scenario, baseline) = uncut("multi-round.toml");
        let options = SpaceOptions::default();
        let whole = cut_space_at(&scenario, &baseline, &options, true);
        let write = whole
            .iter()
            .map(|(_, p)| p)
            .find(|p| {
                p.kind == Kind::Timeout && matches!(&p.site, Site::Call { function, .. } if function == "state::set")
            })
            .expect("a write of the store")
            .clone();
        let mut variant = scenario.clone();
        let indices = apply_all(std::slice::from_ref(&write), &mut variant);
        let run = Runs::run(&crate::reference(), &variant, &crate::explore::bare_run("reference"), 0);
        let cut_at = write.fired_at(&run, indices[0]).expect("the timeout fired");
        let site_at = |uncut_calls_only: bool| -> Vec<usize> {
            cut_space_at(&scenario, &run, &options, uncut_calls_only)
                .into_iter()
                .filter(|(_, p)| p.site == write.site)
                .map(|(at, _)| at)
                .collect()
        };
        assert!(site_at(false).iter().all(|at| *at == cut_at - 1), "the call the cut took: {:?}", site_at(false));
        assert!(!site_at(false).is_empty());
        assert!(site_at(true).is_empty(), "{:?}", site_at(true));
        let Site::Call { function, about, .. } = &write.site else { unreachable!() };
        let next = Site::Call { function: function.clone(), about: about.clone(), nth: 2 };
        let later = cut_space_at(&scenario, &run, &options, true);
        assert!(later.iter().any(|(at, p)| p.site == next && *at > cut_at), "the write again, after the timeout");
    }

    /// What follows a trace event on one subject: the sites after it about that subject, not the
    /// event's own site nor any before it.
    #[test]
    fn follow_ups_are_the_later_sites_about_the_same_subject() {
        let (scenario, baseline) = uncut("multi-round.toml");
        let options = SpaceOptions::default();
        let whole = cut_space_at(&scenario, &baseline, &options, true);
        let subject_of = |p: &Placement| p.site.subject();
        let (first_at, first) = whole
            .iter()
            .find(|(at, p)| {
                subject_of(p).is_some() && whole.iter().any(|(later, q)| later > at && subject_of(q) == subject_of(p))
            })
            .expect("a subject called more than once");
        let subject = subject_of(first).unwrap();
        let after = follow_ups(&scenario, &baseline, &options, *first_at, &subject);
        assert!(!after.is_empty());
        let expected: Vec<Placement> = whole
            .iter()
            .filter(|(at, p)| at > first_at && subject_of(p).as_deref() == Some(subject.as_str()))
            .map(|(_, p)| p.clone())
            .collect();
        assert_eq!(after, expected);
        assert!(after.iter().all(|p| p.site != first.site), "not the event's own site");
    }

    /// The frames of a trace between the engine and the harness worker, each site offered a
    /// drop and a duplicate, and a reorder only where the frame goes to the worker as a call
    /// nobody answers (no invocation id): not a frame from the worker, a result, nor an answered
    /// call.
    #[test]
    fn only_an_unanswered_call_to_a_worker_is_offered_a_reorder() {
        use crate::explore::Runs;
        use crate::trace::{Event, Trace};
        let scenario = empty();
        let mut run = Runs::run(&crate::reference(), &scenario, &crate::explore::bare_run("reference"), 0);
        run.interrupt_points.clear();
        run.trace = Trace::default();
        let frames = [
            ("out", "invokefunction", None, "stream::out"),
            ("out", "invokefunction", Some("i1"), "harness::turn"),
            ("in", "invokefunction", None, "stream::in"),
            ("out", "invocationresult", None, "result::out"),
            ("in", "invocationresult", Some("i2"), "result::in"),
        ];
        for (direction, frame, id, function) in frames {
            let kind = EventKind::Frame {
                direction,
                peer: HARNESS.into(),
                frame,
                function_id: Some(function.into()),
                invocation_id: id.map(Into::into),
            };
            run.trace.push(Event { at_ms: 0, host: "engine".into(), kind });
        }
        let space = cut_space(&scenario, &run, &SpaceOptions::default());
        let offered = |function: &str| -> Vec<Kind> {
            space
                .iter()
                .filter(|p| matches!(&p.site, Site::Frame { function: f, .. } if f == function))
                .map(|p| p.kind)
                .collect()
        };
        assert_eq!(offered("stream::out"), [Kind::Drop, Kind::Duplicate, Kind::Reorder]);
        for answered_or_up in ["harness::turn", "stream::in", "result::out", "result::in"] {
            assert_eq!(offered(answered_or_up), [Kind::Drop, Kind::Duplicate], "{answered_or_up}");
        }
    }
}
