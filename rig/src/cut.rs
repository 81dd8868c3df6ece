//! Cuts: the faults a scenario scripts, and the one rule for when each fires.
//!
//! A cut fires on an event, never on wall-clock time: a service cut on a call to a double that
//! matches its function and conditions, a process cut on a worker reaching a named point. Both
//! let `skip` matching arrivals through first and then fire `count` times ([`Trigger`]). A cut
//! that never fired in a run is vacuous: the run did not test what the file says, so it fails
//! unless the cut is marked `optional`.

use crate::condition::{all_hold, Condition};
use serde_json::Value;

/// How many matching arrivals a cut hits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Count {
    Times(u64),
    Always,
}

/// When a cut fires: after `skip` matching arrivals, for `count` of them. Shared by every kind
/// of cut so they all count the same way.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Trigger {
    pub skip: u64,
    pub count: Count,
    /// A cut the run may leave unfired without failing.
    pub optional: bool,
    matched: u64,
    fired: u64,
    disarmed: bool,
}

impl Trigger {
    pub fn new(skip: u64, count: Count, optional: bool) -> Self {
        Self { skip, count, optional, matched: 0, fired: 0, disarmed: false }
    }

    /// One matching arrival: whether the cut fires on it.
    pub fn arrive(&mut self) -> bool {
        if self.disarmed {
            return false;
        }
        self.matched += 1;
        let allowed = match self.count {
            Count::Times(n) => self.fired < n,
            Count::Always => true,
        };
        if self.matched <= self.skip || !allowed {
            return false;
        }
        self.fired += 1;
        true
    }

    /// Disarms the cut: the fault is healed.
    pub fn disarm(&mut self) {
        self.disarmed = true;
    }

    pub fn fired(&self) -> u64 {
        self.fired
    }

    /// How many arrivals met the cut's conditions (fired or let through).
    pub fn matched(&self) -> u64 {
        self.matched
    }

    /// A cut that should have fired and never did.
    pub fn is_vacuous(&self) -> bool {
        self.fired == 0 && !self.optional
    }
}

/// What a service cut does to a call it takes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServiceFault {
    /// The call takes effect, then its reply never arrives: the caller's deadline expires.
    LostAck,
    /// The call neither takes effect nor gets a reply.
    Timeout,
    /// A definite error reply; nothing takes effect.
    Reject { code: String, message: String },
    /// The call takes effect now and its reply leaves after `ms` milliseconds.
    Delay { ms: u64 },
    /// The request is held on the way, unanswered: the caller's deadline passes, it asks about
    /// it (`not known`: it has not arrived) and sends it again; the held copy takes effect
    /// right after that next request of the function about the same action reaches the
    /// service. A caller that never sends it again never sees it take effect.
    Late,
    /// The calling worker's host crashes (and is restarted at once, as a supervisor would),
    /// before the call takes effect or (`after`) once it has.
    CrashCaller { after: bool },
    /// The service's own host crashes right after the call takes effect, before it replies.
    CrashService,
    /// The engine crashes right after the call takes effect, before the reply passes through it,
    /// and is restarted at once: every connection to it drops, every worker's calls in flight
    /// with it, and the workers connect and register again.
    CrashEngine,
    /// The call takes effect and is answered; then the calling worker is paused for `ms`.
    PauseCaller { ms: u64 },
    /// The call takes effect, and the calling worker's link to the engine is cut before the
    /// answer arrives, for `ms`: its process goes on, but every call it makes fails at once and
    /// it cannot connect again until the link is repaired.
    IsolateCaller { ms: u64 },
    /// The function (or its whole service) is down for `ms` from the call that starts it: that
    /// call and every later one it covers fail as `refuse` says, however many there are, while
    /// every network link stays up. Nothing they ask takes effect.
    Outage { ms: u64, refuse: Refusal, over: OutageOver },
}

/// How each call an outage covers fails.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// A definite error reply (the service answers, saying it cannot serve).
    Reject { code: String, message: String },
    /// No reply at all: the caller's deadline passes.
    Timeout,
}

/// The error a `reject` cut answers with unless its file names another: a sweep's or an
/// exploration's reject cut answers the same, so the finding's file (which names none) replays
/// the very run that found it.
pub const REJECT_CODE: &str = "rejected";
pub const REJECT_MESSAGE: &str = "rejected by a cut";

/// The error an outage answers each call with, unless its file names another.
pub const OUTAGE_CODE: &str = "unavailable";
pub const OUTAGE_MESSAGE: &str = "the service is down (an outage cut)";

impl Refusal {
    /// The error an outage answers with unless the file names another.
    pub fn unavailable() -> Self {
        Refusal::Reject { code: OUTAGE_CODE.into(), message: OUTAGE_MESSAGE.into() }
    }

    pub fn name(&self) -> &'static str {
        match self {
            Refusal::Reject { .. } => "reject",
            Refusal::Timeout => "timeout",
        }
    }
}

/// What an outage takes down.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutageOver {
    /// Every call of the cut's function, whatever it is about.
    Function,
    /// Every call of every function of the service the cut's function belongs to.
    Service,
}

impl OutageOver {
    pub fn name(self) -> &'static str {
        match self {
            OutageOver::Function => "function",
            OutageOver::Service => "service",
        }
    }
}

impl ServiceFault {
    pub fn name(&self) -> &'static str {
        match self {
            ServiceFault::LostAck => "lost-ack",
            ServiceFault::Timeout => "timeout",
            ServiceFault::Reject { .. } => "reject",
            ServiceFault::Delay { .. } => "delay",
            ServiceFault::Late => "late",
            ServiceFault::CrashCaller { after: false } => "crash-caller-before",
            ServiceFault::CrashCaller { after: true } => "crash-caller-after",
            ServiceFault::CrashService => "crash-service",
            ServiceFault::CrashEngine => "crash-engine",
            ServiceFault::PauseCaller { .. } => "pause-caller",
            ServiceFault::IsolateCaller { .. } => "isolate-caller",
            ServiceFault::Outage { .. } => "outage",
        }
    }
}

/// A fault on calls to a double, as a scenario declares it.
#[derive(Debug, Clone)]
pub struct ServiceCut {
    pub function: String,
    pub conditions: Vec<Condition>,
    pub fault: ServiceFault,
    pub trigger: Trigger,
}

/// The armed service cuts of a run with what each has done so far.
#[derive(Debug, Default)]
pub struct CutTable {
    cuts: Vec<ServiceCut>,
    /// Until when each cut's outage lasts, once one has started (by cut index).
    outages: Vec<Option<u64>>,
}

/// The service a function belongs to: `state` for `state::set`.
pub fn service_of(function: &str) -> &str {
    function.split_once("::").map_or(function, |(service, _)| service)
}

impl CutTable {
    pub fn new(cuts: impl IntoIterator<Item = ServiceCut>) -> Self {
        let cuts: Vec<ServiceCut> = cuts.into_iter().collect();
        Self { outages: vec![None; cuts.len()], cuts }
    }

    /// Which cut (by index) takes this call, arriving at `now_ms`, and with what fault. The
    /// first that fires decides; an outage under way takes every call it covers until it ends,
    /// and a call that starts one is the first it takes.
    pub fn decide(&mut self, function: &str, payload: &Value, now_ms: u64) -> Option<(usize, ServiceFault)> {
        let outages = &mut self.outages;
        self.cuts.iter_mut().enumerate().find_map(|(index, cut)| {
            if let ServiceFault::Outage { over, .. } = &cut.fault {
                let covered = match over {
                    OutageOver::Function => cut.function == function,
                    OutageOver::Service => service_of(&cut.function) == service_of(function),
                };
                if covered && outages[index].is_some_and(|until| now_ms < until) {
                    return Some((index, cut.fault.clone()));
                }
            }
            let applies = cut.function == function && all_hold(&cut.conditions, payload);
            if !(applies && cut.trigger.arrive()) {
                return None;
            }
            if let ServiceFault::Outage { ms, .. } = cut.fault {
                outages[index] = Some(now_ms.saturating_add(ms));
            }
            Some((index, cut.fault.clone()))
        })
    }

    /// Disarms every cut: the faults are healed, and an outage under way ends.
    pub fn heal(&mut self) {
        self.cuts.iter_mut().for_each(|cut| cut.trigger.disarm());
        self.outages.iter_mut().for_each(|until| *until = None);
    }

    pub fn cuts(&self) -> &[ServiceCut] {
        &self.cuts
    }
}

/// What a process cut does to a worker that reaches its point.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Interrupt {
    /// Stop right there and never go on (the scenario then crashes or abandons the worker).
    Freeze,
    /// Stop the whole worker for `ms` milliseconds (its lease renewals too), then go on.
    Pause { ms: u64 },
    /// Crash the worker's host right there (it is restarted at once, as a supervisor would).
    Crash,
}

impl Interrupt {
    pub fn name(self) -> &'static str {
        match self {
            Interrupt::Freeze => "freeze",
            Interrupt::Pause { .. } => "pause",
            Interrupt::Crash => "crash",
        }
    }
}

/// The named points a harness worker passes while running an action, where process cuts fire:
/// intent recorded but the request not sent; the service answered but the outcome not recorded;
/// the outcome recorded.
pub const INTERRUPT_POINTS: [&str; 3] = ["before_submission", "after_acceptance", "after_completion"];

/// A fault on a worker's process at a named point, as a scenario declares it.
#[derive(Debug, Clone)]
pub struct ProcessCut {
    pub worker: String,
    pub point: String,
    pub interrupt: Interrupt,
    pub trigger: Trigger,
}

/// The armed process cuts of a run.
#[derive(Debug, Default)]
pub struct ProcessCutTable {
    cuts: Vec<ProcessCut>,
}

impl ProcessCutTable {
    pub fn new(cuts: impl IntoIterator<Item = ProcessCut>) -> Self {
        Self { cuts: cuts.into_iter().collect() }
    }

    /// Which cut (by index) takes `worker` at `point` this time, and how.
    pub fn decide(&mut self, worker: &str, point: &str) -> Option<(usize, Interrupt)> {
        self.cuts.iter_mut().enumerate().find_map(|(index, cut)| {
            let applies = cut.worker == worker && cut.point == point;
            (applies && cut.trigger.arrive()).then_some((index, cut.interrupt))
        })
    }

    pub fn heal(&mut self) {
        self.cuts.iter_mut().for_each(|cut| cut.trigger.disarm());
    }

    pub fn cuts(&self) -> &[ProcessCut] {
        &self.cuts
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn cut(skip: u64, count: Count) -> ServiceCut {
        ServiceCut {
            function: "state::set".into(),
            conditions: vec![Condition::equals("value.status", "failed").unwrap()],
            fault: ServiceFault::Timeout,
            trigger: Trigger::new(skip, count, false),
        }
    }

    #[test]
    fn fires_on_matching_calls_within_its_count_after_skipping() {
        let mut table = CutTable::new([cut(1, Count::Times(2))]);
        let failed = json!({"value": {"status": "failed"}});
        assert_eq!(table.decide("state::set", &json!({"value": {"status": "running"}}), 0), None);
        assert_eq!(table.decide("state::get", &failed, 0), None);
        assert_eq!(table.decide("state::set", &failed, 0), None, "the first match is skipped");
        assert!(table.decide("state::set", &failed, 0).is_some());
        assert!(table.decide("state::set", &failed, 0).is_some());
        assert_eq!(table.decide("state::set", &failed, 0), None, "count used up");
        assert_eq!(table.cuts()[0].trigger.fired(), 2);
    }

    #[test]
    fn healing_disarms_always_cuts_and_unfired_cuts_are_vacuous() {
        let mut table = CutTable::new([cut(0, Count::Always), cut(0, Count::Always)]);
        let failed = json!({"value": {"status": "failed"}});
        assert!(table.decide("state::set", &failed, 0).is_some());
        table.heal();
        assert_eq!(table.decide("state::set", &failed, 0), None);
        assert!(!table.cuts()[0].trigger.is_vacuous());
        assert!(table.cuts()[1].trigger.is_vacuous(), "shadowed by the first cut, it never fired");
    }

    fn outage(function: &str, over: OutageOver, skip: u64) -> ServiceCut {
        ServiceCut {
            function: function.into(),
            conditions: vec![Condition::equals("key", "s1").unwrap()],
            fault: ServiceFault::Outage { ms: 1_000, refuse: Refusal::Timeout, over },
            trigger: Trigger::new(skip, Count::Times(1), false),
        }
    }

    /// From the call that starts it, an outage takes every call it covers, whatever it is
    /// about and however many, until its time is up; then calls go through again.
    #[test]
    fn an_outage_takes_every_call_it_covers_for_its_duration() {
        let mut table = CutTable::new([outage("state::set", OutageOver::Function, 1)]);
        let (s1, s2) = (json!({"key": "s1"}), json!({"key": "s2"}));
        assert_eq!(table.decide("state::set", &s2, 0), None, "not the call that starts it");
        assert_eq!(table.decide("state::set", &s1, 10), None, "skipped");
        assert!(table.decide("state::set", &s1, 20).is_some(), "the outage starts");
        assert!(table.decide("state::set", &s2, 500).is_some(), "any call of the function while it lasts");
        assert_eq!(table.decide("state::get", &s1, 500), None, "another function of the service is up");
        assert!(table.decide("state::set", &s1, 1_019).is_some(), "the last millisecond");
        assert_eq!(table.decide("state::set", &s1, 1_020), None, "over, and it starts once");
        assert_eq!(table.cuts()[0].trigger.fired(), 1, "one outage");
    }

    #[test]
    fn a_service_outage_takes_every_function_of_the_service_and_healing_ends_it() {
        let mut table = CutTable::new([outage("state::set", OutageOver::Service, 0)]);
        let s1 = json!({"key": "s1"});
        assert!(table.decide("state::set", &s1, 0).is_some());
        assert!(table.decide("state::get", &json!({}), 10).is_some(), "a read of the same service");
        assert_eq!(table.decide("session::append", &json!({}), 10), None, "another service");
        table.heal();
        assert_eq!(table.decide("state::get", &json!({}), 20), None, "healed");
        assert_eq!(service_of("state::compare-and-set"), "state");
        assert_eq!(service_of("lonely"), "lonely");
    }

    #[test]
    fn process_cuts_count_like_service_cuts() {
        let mut table = ProcessCutTable::new([ProcessCut {
            worker: "harness".into(),
            point: "after_acceptance".into(),
            interrupt: Interrupt::Freeze,
            trigger: Trigger::new(1, Count::Times(1), false),
        }]);
        assert_eq!(table.decide("harness", "after_acceptance"), None, "skipped");
        assert_eq!(table.decide("replacement", "after_acceptance"), None, "another worker");
        assert_eq!(table.decide("harness", "after_acceptance"), Some((0, Interrupt::Freeze)));
        assert_eq!(table.decide("harness", "after_acceptance"), None);
    }

    #[test]
    fn healing_disarms_process_cuts_and_the_table_reports_what_fired() {
        let interrupt = |point: &str, interrupt| ProcessCut {
            worker: "harness".into(),
            point: point.into(),
            interrupt,
            trigger: Trigger::new(0, Count::Always, false),
        };
        let mut table = ProcessCutTable::new([
            interrupt("before_submission", Interrupt::Crash),
            interrupt("after_completion", Interrupt::Pause { ms: 10 }),
        ]);
        assert_eq!(table.decide("harness", "before_submission"), Some((0, Interrupt::Crash)));
        assert_eq!(table.decide("harness", "before_submission"), Some((0, Interrupt::Crash)), "always");
        table.heal();
        assert_eq!(table.decide("harness", "before_submission"), None, "healed");
        let cuts = table.cuts();
        assert_eq!(cuts.len(), 2);
        assert_eq!((cuts[0].trigger.fired(), cuts[0].trigger.is_vacuous()), (2, false));
        assert!(cuts[1].trigger.is_vacuous(), "the second interrupt's point was never reached");
        assert_eq!(cuts[1].interrupt.name(), "pause");
    }
}
