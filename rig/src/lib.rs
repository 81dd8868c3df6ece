//! The rig: a deterministic fault-injection test rig for durable agent harnesses and workflow
//! runtimes.
//!
//! It runs a harness, its services and a bus on a simulated network (turmoil), scripts the cuts
//! between "the action happened" and "we recorded that it happened" from scenario files,
//! checks the durable state and counts every external effect in a ledger the system under test
//! cannot write. One seed replays one run bit for bit.
//!
//! The public surface is listed here. To test a harness of your own, implement
//! [`HarnessFactory`] (its workers are [`Provider`]s on the [`Bus`]) and hand it to
//! [`run_with`], or to [`scenario_tests!`] from your crate's `tests/`. A harness process in any
//! language is run live instead ([`prepare_live`], [`run_live`]: `rig live`).

pub mod baseline;
mod bus;
mod capability;
pub mod cli;
mod clock;
mod condition;
mod cut;
mod expect;
pub mod explore;
mod harness;
mod interrupt;
mod json_text;
mod layout;
mod live;
mod oracle;
mod panics;
pub mod planted;
mod queue;
pub mod recovery;
pub mod report;
mod run;
mod scenario;
mod script;
mod services;
mod sim;
mod streams;
mod suggest;
pub mod testing;
pub mod timeline;
mod topology;
mod trace;

pub use bus::{Action, Answer, Bus, ErrorBody, Invocation, InvokeError, Provider};
pub use capability::{Capabilities, Capability, Requirements, Skip, DELEGATE_TOOL};
pub use clock::{within, Clock, Elapsed};
pub use condition::{Condition, Test};
pub use cut::{Interrupt, INTERRUPT_POINTS};
pub use expect::is_rig_note;
pub use harness::{
    Binding, BindingPoint, HarnessConfig, HarnessEnv, HarnessFactory, Policy, ProcessControl, ReferenceHarness, Tool,
};
pub use layout::{ActionClass, ActionVersion, RecordLayout, CONTROL_SCOPE};
pub use live::{
    config_json, late_ms_max, prepare_live, run_live, serve_harness, slower, HarnessProcess, LiveListener, LiveOptions,
    LiveRuns, LiveScenario, LiveSweepOptions, Processes, SpawnOptions, HOST_VARIABLE, RETRY_SLOWER, RIG_CONFIG,
    RIG_NOTE, URL_VARIABLE, VOID_RETRIES,
};
pub use oracle::{Oracle, Outcome, Violation};
pub use run::{reference, run, run_unchecked, run_with, ActionStatus, Rerun, RunOutcome, UncutRun};
pub use scenario::{files as scenario_files, PolicyRun, Scenario, ScenarioError};
pub use topology::HARNESS_FUNCTIONS;
pub use trace::{Event, EventKind, Label, NoteSink, Trace};
