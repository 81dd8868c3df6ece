//! The rig: a deterministic fault-injection test rig for durable agent harnesses and workflow
//! runtimes.
//!
//! It runs a harness, its services and a bus on a simulated network (turmoil), scripts the cuts
//! between "the action happened" and "we recorded that it happened" from scenario files,
//! checks the durable state and counts every external effect in a ledger the system under test
//! cannot write. One seed replays one run bit for bit.

pub mod bus;
pub mod cut;
pub mod expect;
pub mod harness;
pub mod oracle;
pub mod queue;
pub mod report;
pub mod run;
pub mod scenario;
pub mod sim;
pub mod trace;

pub use harness::Policy;
pub use oracle::{Oracle, Violation};
pub use run::{run, RunOutcome};
pub use scenario::{Scenario, ScenarioError};
