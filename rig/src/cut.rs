//! Service-level cuts: faults applied to calls of any double, chosen by a predicate.
//!
//! A cut fires on a call, never on wall-clock time: the function, conditions on the payload
//! (`scope`, `key`, `value.status`, ...), how many matching calls to let through first (`skip`)
//! and how many to hit (`count`). The first cut that takes a call decides its fate.

use proxy::{all_match, FieldMatch};
use serde_json::Value;

/// What a cut does to a call it takes.
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
}

impl ServiceFault {
    pub fn name(&self) -> &'static str {
        match self {
            ServiceFault::LostAck => "lost-ack",
            ServiceFault::Timeout => "timeout",
            ServiceFault::Reject { .. } => "reject",
            ServiceFault::Delay { .. } => "delay",
        }
    }
}

/// How many matching calls a cut hits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Count {
    Times(u64),
    Always,
}

impl Count {
    fn allows(self, fired: u64) -> bool {
        match self {
            Count::Times(n) => fired < n,
            Count::Always => true,
        }
    }
}

/// One cut, as a scenario declares it.
#[derive(Debug, Clone)]
pub struct ServiceCut {
    pub function: String,
    pub conditions: Vec<FieldMatch>,
    pub fault: ServiceFault,
    pub skip: u64,
    pub count: Count,
}

/// The armed cuts of a run with what each has done so far.
#[derive(Debug, Default)]
pub struct CutTable {
    cuts: Vec<Armed>,
}

#[derive(Debug)]
struct Armed {
    cut: ServiceCut,
    matched: u64,
    fired: u64,
    healed: bool,
}

impl CutTable {
    pub fn new(cuts: impl IntoIterator<Item = ServiceCut>) -> Self {
        Self { cuts: cuts.into_iter().map(|cut| Armed { cut, matched: 0, fired: 0, healed: false }).collect() }
    }

    /// Which cut (by index) takes this call, and with what fault.
    pub fn decide(&mut self, function: &str, payload: &Value) -> Option<(usize, ServiceFault)> {
        for (index, armed) in self.cuts.iter_mut().enumerate() {
            if armed.healed || armed.cut.function != function || !all_match(&armed.cut.conditions, payload) {
                continue;
            }
            armed.matched += 1;
            if armed.matched <= armed.cut.skip || !armed.cut.count.allows(armed.fired) {
                continue;
            }
            armed.fired += 1;
            return Some((index, armed.cut.fault.clone()));
        }
        None
    }

    /// Disarms every cut: the faults are healed.
    pub fn heal(&mut self) {
        self.cuts.iter_mut().for_each(|armed| armed.healed = true);
    }

    /// How often each cut fired, in declaration order.
    pub fn fired(&self) -> Vec<u64> {
        self.cuts.iter().map(|armed| armed.fired).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn cut(skip: u64, count: Count) -> ServiceCut {
        ServiceCut {
            function: "state::set".into(),
            conditions: vec![FieldMatch::parse("value.status=failed").unwrap()],
            fault: ServiceFault::Timeout,
            skip,
            count,
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
        assert_eq!(table.fired(), vec![2]);
    }

    #[test]
    fn healing_disarms_always_cuts() {
        let mut table = CutTable::new([cut(0, Count::Always)]);
        let failed = json!({"value": {"status": "failed"}});
        assert!(table.decide("state::set", &failed).is_some());
        table.heal();
        assert_eq!(table.decide("state::set", &failed), None);
    }
}
