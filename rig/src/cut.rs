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
}

impl ServiceFault {
    pub fn name(&self) -> &'static str {
        match self {
            ServiceFault::LostAck => "lost-ack",
            ServiceFault::Timeout => "timeout",
            ServiceFault::Reject { .. } => "reject",
            ServiceFault::Delay { .. } => "delay",
            ServiceFault::CrashCaller { after: false } => "crash-caller-before",
            ServiceFault::CrashCaller { after: true } => "crash-caller-after",
            ServiceFault::CrashService => "crash-service",
            ServiceFault::CrashEngine => "crash-engine",
            ServiceFault::PauseCaller { .. } => "pause-caller",
            ServiceFault::IsolateCaller { .. } => "isolate-caller",
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
}

impl CutTable {
    pub fn new(cuts: impl IntoIterator<Item = ServiceCut>) -> Self {
        Self { cuts: cuts.into_iter().collect() }
    }

    /// Which cut (by index) takes this call, and with what fault. The first that fires decides.
    pub fn decide(&mut self, function: &str, payload: &Value) -> Option<(usize, ServiceFault)> {
        self.cuts.iter_mut().enumerate().find_map(|(index, cut)| {
            let applies = cut.function == function && all_hold(&cut.conditions, payload);
            (applies && cut.trigger.arrive()).then(|| (index, cut.fault.clone()))
        })
    }

    /// Disarms every cut: the faults are healed.
    pub fn heal(&mut self) {
        self.cuts.iter_mut().for_each(|cut| cut.trigger.disarm());
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
        assert_eq!(table.decide("state::set", &json!({"value": {"status": "running"}})), None);
        assert_eq!(table.decide("state::get", &failed), None);
        assert_eq!(table.decide("state::set", &failed), None, "the first match is skipped");
        assert!(table.decide("state::set", &failed).is_some());
        assert!(table.decide("state::set", &failed).is_some());
        assert_eq!(table.decide("state::set", &failed), None, "count used up");
        assert_eq!(table.cuts()[0].trigger.fired(), 2);
    }

    #[test]
    fn healing_disarms_always_cuts_and_unfired_cuts_are_vacuous() {
        let mut table = CutTable::new([cut(0, Count::Always), cut(0, Count::Always)]);
        let failed = json!({"value": {"status": "failed"}});
        assert!(table.decide("state::set", &failed).is_some());
        table.heal();
        assert_eq!(table.decide("state::set", &failed), None);
        assert!(!table.cuts()[0].trigger.is_vacuous());
        assert!(table.cuts()[1].trigger.is_vacuous(), "shadowed by the first cut, it never fired");
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
