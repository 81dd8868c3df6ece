//! Scenarios: a world, its cuts, a script of steps, and what each policy run must show.
//!
//! A scenario is data. Loading checks it strictly, and every error names the file, line and
//! column and what was expected there.

mod file;

use crate::cut::{Count, ServiceCut, ServiceFault};
use crate::harness::{HarnessConfig, Policy};
use crate::oracle::Oracle;
use crate::sim::hosts::DriverCall;
use crate::sim::NetworkConfig;
use file::{CountSpec, CutAction, CutSpec, ExpectSpec, ScenarioFile, StepSpec, WorldSpec};
use proxy::FieldMatch;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;
use std::path::{Path, PathBuf};
use toml::Spanned;

/// A loaded, validated scenario.
#[derive(Debug, Clone)]
pub struct Scenario {
    pub path: PathBuf,
    pub about: Option<String>,
    pub world: WorldSetup,
    pub cuts: Vec<ServiceCut>,
    pub steps: Vec<Step>,
    pub runs: Vec<PolicyRun>,
    /// A drop-proxy in front of the engine for one worker.
    pub proxy: Option<ProxySetup>,
    /// Process cuts at named points of harness workers.
    pub interrupts: Vec<InterruptRule>,
}

/// A process cut: what happens to `worker` when it reaches `point`.
#[derive(Debug, Clone)]
pub struct InterruptRule {
    pub worker: String,
    pub point: String,
    pub interrupt: crate::harness::Interrupt,
    pub skip: u64,
    pub count: Count,
}

/// The named points a harness worker passes while running an action.
pub const INTERRUPT_POINTS: [&str; 3] = ["before_submission", "after_acceptance", "after_completion"];
/// The harness workers a scenario can have.
pub const HARNESS_WORKERS: [&str; 2] = ["harness", "replacement"];

/// Where the drop-proxy sits and what it does.
#[derive(Debug, Clone)]
pub struct ProxySetup {
    /// The worker whose engine connection goes through the proxy.
    pub worker: String,
    pub rules: Vec<proxy::Rule>,
}

/// The world a scenario starts from.
#[derive(Debug, Clone)]
pub struct WorldSetup {
    pub harness: HarnessConfig,
    pub network: NetworkConfig,
    pub liveness_ms: u64,
    pub effects_per_action_max: u64,
    pub records: Vec<(String, String, Value)>,
    pub messages: Vec<(String, Value)>,
    pub model: Vec<Value>,
    /// Queues defined at start; when there are any, the world has a queue worker.
    pub queues: Vec<(String, crate::queue::QueueConfig)>,
    /// The ticket service, when the world has one.
    pub tickets: Option<doubles::TicketConfig>,
    /// Whether a second harness worker, `replacement`, runs beside `harness`.
    pub replacement: bool,
}

/// One step of the script.
#[derive(Debug, Clone)]
pub enum Step {
    Invoke { call: DriverCall, detach: bool },
    Await { name: String, within_ms: u64 },
    WaitMs(u64),
    WaitUntil { conditions: Vec<FieldMatch>, nth: u64, within_ms: u64 },
    Put { scope: String, key: String, value: Value },
    Crash(String),
    Restart(String),
    Partition(String, String),
    Repair(String, String),
    Hold(String, String),
    Release(String, String),
    Heal,
    Pause { host: String, ms: u64 },
}

/// One policy to run the scenario under, with everything it must show.
#[derive(Debug, Clone)]
pub struct PolicyRun {
    pub policy: Policy,
    pub expected_violations: BTreeSet<Oracle>,
    pub expectations: Vec<Expectation>,
}

/// Something a run must show afterwards.
#[derive(Debug, Clone)]
pub enum Expectation {
    Rpc {
        name: String,
        conditions: Vec<FieldMatch>,
    },
    State {
        scope: String,
        key: String,
        conditions: Vec<FieldMatch>,
    },
    Absent {
        scope: String,
        key: String,
    },
    Events {
        conditions: Vec<FieldMatch>,
        count: Option<u64>,
        count_min: Option<u64>,
        same: Option<String>,
        before_rpc: Option<String>,
    },
    Effects(BTreeMap<String, u64>),
}

/// A scenario that could not be loaded: where, and what was expected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{path}:{line}:{column}: {message}")]
pub struct ScenarioError {
    pub path: String,
    pub line: usize,
    pub column: usize,
    pub message: String,
}

/// The hosts every simulated world has, by the names scenario files use.
pub const HOSTS: [&str; 6] = ["engine", "store", "session", "model", "harness", "driver"];

/// The functions of the doubles: what a service cut can select.
pub fn double_functions() -> BTreeSet<&'static str> {
    let mut functions: BTreeSet<&'static str> = BTreeSet::new();
    functions.extend(doubles::StateStore::FUNCTIONS);
    functions.extend(doubles::SessionService::FUNCTIONS);
    functions.extend(doubles::ScriptedModel::FUNCTIONS);
    functions
}

/// The functions of the doubles: what a service cut can select.
fn all_double_functions() -> BTreeSet<&'static str> {
    let mut functions = double_functions();
    functions.extend(doubles::TicketService::FUNCTIONS);
    functions
}

/// Every function a scenario may invoke.
pub fn known_functions() -> BTreeSet<String> {
    let mut functions: BTreeSet<String> = all_double_functions().into_iter().map(String::from).collect();
    for worker in HARNESS_WORKERS {
        functions.extend(["turn", "export", "import"].map(|name| format!("{worker}::{name}")));
    }
    functions.insert(crate::bus::WORKERS_REGISTER.to_string());
    functions.extend(crate::queue::FUNCTIONS.map(String::from));
    functions
}

fn hosts_of(world: &WorldSetup, proxy: bool) -> Vec<&'static str> {
    let mut hosts = HOSTS.to_vec();
    if !world.queues.is_empty() {
        hosts.push(crate::queue::HOST);
    }
    if proxy {
        hosts.push(crate::sim::hosts::PROXY_HOST);
    }
    if world.tickets.is_some() {
        hosts.push("tickets");
    }
    if world.replacement {
        hosts.push("replacement");
    }
    hosts
}

impl Scenario {
    /// Reads and validates a scenario file.
    pub fn load(path: &Path) -> Result<Self, ScenarioError> {
        let source = std::fs::read_to_string(path).map_err(|e| ScenarioError {
            path: path.display().to_string(),
            line: 0,
            column: 0,
            message: format!("cannot read the file: {e}"),
        })?;
        Self::parse(path, &source)
    }

    /// Validates a scenario from its text; `path` names it in errors and reports.
    pub fn parse(path: &Path, source: &str) -> Result<Self, ScenarioError> {
        let at = Locator { path, source };
        let parsed: ScenarioFile =
            toml::from_str(source).map_err(|e| at.error(e.span().unwrap_or(0..0), e.message()))?;
        let functions = known_functions();
        let world = world_setup(parsed.world);
        let hosts = hosts_of(&world, parsed.proxy.is_some());
        let proxy = parsed.proxy.map(|spec| compile_proxy(&at, &hosts, spec)).transpose()?;
        let cuttable: BTreeSet<String> = all_double_functions().into_iter().map(String::from).collect();
        let cuts = parsed.cuts.into_iter().map(|cut| compile_cut(&at, &cuttable, cut)).collect::<Result<_, _>>()?;
        let interrupts =
            parsed.interrupts.into_iter().map(|i| compile_interrupt(&at, &hosts, i)).collect::<Result<_, _>>()?;
        let steps = parsed
            .steps
            .into_iter()
            .map(|step| compile_step(&at, &functions, &hosts, step))
            .collect::<Result<_, _>>()?;
        let shared = compile_expect(&at, parsed.expect)?;
        let policy_span = parsed.policy.span();
        let policies = parsed.policy.into_inner();
        if policies.is_empty() {
            return Err(at.error(policy_span, "expected at least one `[policy.NAME]` table"));
        }
        let mut runs = Vec::new();
        for (name, spec) in policies {
            let span = at.find(&format!("policy.{name}")).unwrap_or(policy_span.clone());
            let policy = Policy::from_name(&name).ok_or_else(|| {
                let known: Vec<_> = Policy::ALL.iter().map(|p| p.name()).collect();
                at.error(span.clone(), &format!("unknown policy `{name}`, expected one of {}", known.join(", ")))
            })?;
            let expected_violations = spec
                .violations
                .iter()
                .map(|v| {
                    Oracle::from_name(v).ok_or_else(|| {
                        let known: Vec<_> = Oracle::ALL.iter().map(|o| o.name()).collect();
                        at.error(
                            span.clone(),
                            &format!("unknown oracle `{v}` in `violations`, expected one of {}", known.join(", ")),
                        )
                    })
                })
                .collect::<Result<_, _>>()?;
            let mut expectations = shared.clone();
            expectations.extend(compile_expect(&at, spec.expect)?);
            runs.push(PolicyRun { policy, expected_violations, expectations });
        }
        Ok(Scenario { path: path.to_path_buf(), about: parsed.about, world, cuts, steps, runs, proxy, interrupts })
    }

    /// The scenario's name: its file name without the extension.
    pub fn name(&self) -> String {
        self.path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default()
    }
}

/// Turns byte spans into file, line and column.
struct Locator<'a> {
    path: &'a Path,
    source: &'a str,
}

impl Locator<'_> {
    fn error(&self, span: Range<usize>, message: &str) -> ScenarioError {
        let before = &self.source[..span.start.min(self.source.len())];
        let line = before.matches('\n').count() + 1;
        let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
        ScenarioError { path: self.path.display().to_string(), line, column, message: message.trim().to_string() }
    }

    fn find(&self, text: &str) -> Option<Range<usize>> {
        self.source.find(text).map(|start| start..start + text.len())
    }
}

fn world_setup(spec: WorldSpec) -> WorldSetup {
    WorldSetup {
        harness: HarnessConfig {
            session_timeout_ms: spec.session_timeout_ms,
            model_timeout_ms: spec.model_timeout_ms,
            enqueue_attempts: spec.enqueue_attempts,
            turn_queue: HarnessConfig::default().turn_queue,
            terminalize_attempts: spec.terminalize_attempts,
            terminalize_backoff_ms: spec.terminalize_backoff_ms,
            lease_ttl_ms: spec.lease_ttl_ms,
            tool_timeout_ms: spec.tool_timeout_ms,
            tickets: spec.tickets.clone().unwrap_or_default(),
        },
        network: NetworkConfig {
            tick_ms: spec.tick_ms.max(1),
            latency_ms_min: spec.latency_ms_min,
            latency_ms_max: spec.latency_ms_max.max(spec.latency_ms_min),
            duration_ms_max: spec.duration_ms_max,
            steps_max: spec.steps_max,
        },
        liveness_ms: spec.liveness_ms,
        effects_per_action_max: spec.effects_per_action_max,
        records: spec.records.into_iter().map(|r| (r.scope, r.key, r.value)).collect(),
        messages: spec.messages.into_iter().map(|m| (m.session_id, m.message)).collect(),
        model: spec.model,
        queues: spec.queue.into_iter().collect(),
        tickets: spec.tickets,
        replacement: spec.replacement,
    }
}

impl From<CountSpec> for Count {
    fn from(spec: CountSpec) -> Self {
        match spec {
            CountSpec::Once => Count::Times(1),
            CountSpec::Always => Count::Always,
            CountSpec::Times(n) => Count::Times(n),
        }
    }
}

fn compile_interrupt(
    at: &Locator,
    hosts: &[&str],
    spec: Spanned<file::InterruptSpec>,
) -> Result<InterruptRule, ScenarioError> {
    let span = spec.span();
    let spec = spec.into_inner();
    let worker = known_host(at, hosts, &spec.worker)?;
    if !HARNESS_WORKERS.contains(&worker.as_str()) {
        return Err(
            at.error(spec.worker.span(), &format!("expected a harness worker ({})", HARNESS_WORKERS.join(", ")))
        );
    }
    if !INTERRUPT_POINTS.contains(&spec.point.get_ref().as_str()) {
        let message =
            format!("unknown point `{}`, expected one of {}", spec.point.get_ref(), INTERRUPT_POINTS.join(", "));
        return Err(at.error(spec.point.span(), &message));
    }
    let interrupt = match spec.action {
        file::InterruptAction::Freeze => crate::harness::Interrupt::Freeze,
        file::InterruptAction::Pause => crate::harness::Interrupt::Pause {
            ms: spec.pause_ms.ok_or_else(|| at.error(span, "a `pause` interrupt needs `pause_ms`"))?,
        },
    };
    let count = Count::from(spec.count);
    Ok(InterruptRule { worker, point: spec.point.into_inner(), interrupt, skip: spec.skip, count })
}

fn compile_proxy(at: &Locator, hosts: &[&str], spec: file::ProxySpec) -> Result<ProxySetup, ScenarioError> {
    let worker = known_host(at, hosts, &spec.worker)?;
    if ["engine", crate::sim::hosts::PROXY_HOST].contains(&worker.as_str()) {
        return Err(at.error(
            spec.worker.span(),
            "expected a worker host to place behind the proxy, not the engine or the proxy",
        ));
    }
    let rules = spec
        .rules
        .into_iter()
        .map(|rule| {
            let span = rule.span();
            let rule = rule.into_inner();
            rule.validate().map_err(|e| at.error(span, &e.to_string()))?;
            Ok(rule)
        })
        .collect::<Result<_, ScenarioError>>()?;
    Ok(ProxySetup { worker, rules })
}

fn known_function(
    at: &Locator,
    functions: &BTreeSet<String>,
    function: &Spanned<String>,
) -> Result<String, ScenarioError> {
    if functions.contains(function.get_ref()) {
        return Ok(function.get_ref().clone());
    }
    let known: Vec<&str> = functions.iter().map(String::as_str).collect();
    Err(at.error(
        function.span(),
        &format!("unknown function `{}`, expected one of {}", function.get_ref(), known.join(", ")),
    ))
}

fn known_host(at: &Locator, hosts: &[&str], host: &Spanned<String>) -> Result<String, ScenarioError> {
    if hosts.contains(&host.get_ref().as_str()) {
        return Ok(host.get_ref().clone());
    }
    Err(at.error(host.span(), &format!("unknown host `{}`, expected one of {}", host.get_ref(), hosts.join(", "))))
}

/// A host that can be crashed and restarted: any but the driver, which is the scenario itself.
fn restartable_host(at: &Locator, hosts: &[&str], host: &Spanned<String>) -> Result<String, ScenarioError> {
    let name = known_host(at, hosts, host)?;
    if name == "driver" {
        return Err(at.error(host.span(), "the driver is the scenario's own client and cannot crash; expected a host"));
    }
    Ok(name)
}

fn known_link(at: &Locator, hosts: &[&str], link: Spanned<[String; 2]>) -> Result<(String, String), ScenarioError> {
    let span = link.span();
    let [a, b] = link.into_inner();
    let a = known_host(at, hosts, &Spanned::new(span.clone(), a))?;
    let b = known_host(at, hosts, &Spanned::new(span.clone(), b))?;
    if a == b {
        return Err(at.error(span, &format!("a link joins two different hosts; `{a}` is named twice")));
    }
    Ok((a, b))
}

/// `PATH = VALUE` conditions from a TOML table; values must be scalars.
fn conditions(at: &Locator, table: BTreeMap<String, Spanned<toml::Value>>) -> Result<Vec<FieldMatch>, ScenarioError> {
    table
        .into_iter()
        .map(|(path, value)| {
            let span = value.span();
            let text = match value.into_inner() {
                toml::Value::String(s) => s,
                toml::Value::Integer(i) => i.to_string(),
                toml::Value::Float(f) => f.to_string(),
                toml::Value::Boolean(b) => b.to_string(),
                _ => {
                    return Err(
                        at.error(span, &format!("`{path}`: expected a string, number or boolean to compare with"))
                    )
                }
            };
            FieldMatch::new(&path, text).map_err(|e| at.error(span, &e.to_string()))
        })
        .collect()
}

fn compile_cut(at: &Locator, functions: &BTreeSet<String>, cut: Spanned<CutSpec>) -> Result<ServiceCut, ScenarioError> {
    let span = cut.span();
    let cut = cut.into_inner();
    let function = known_function(at, functions, &cut.function)?;
    let fault = match cut.action {
        CutAction::LostAck => ServiceFault::LostAck,
        CutAction::Timeout => ServiceFault::Timeout,
        CutAction::Reject => ServiceFault::Reject {
            code: cut.code.unwrap_or_else(|| "rejected".into()),
            message: cut.message.unwrap_or_else(|| "rejected by a cut".into()),
        },
        CutAction::Delay => ServiceFault::Delay {
            ms: cut.delay_ms.ok_or_else(|| at.error(span.clone(), "a `delay` cut needs `delay_ms`"))?,
        },
    };
    let count = Count::from(cut.count);
    Ok(ServiceCut { function, conditions: conditions(at, cut.conditions)?, fault, skip: cut.skip, count })
}

fn compile_step(
    at: &Locator,
    functions: &BTreeSet<String>,
    hosts: &[&str],
    step: Spanned<StepSpec>,
) -> Result<Step, ScenarioError> {
    let span = step.span();
    Ok(match step.into_inner() {
        StepSpec::Invoke(invoke) => {
            let function = known_function(at, functions, &invoke.function)?;
            let name = invoke.name.unwrap_or_else(|| function.clone());
            let action = invoke.queue.map(|queue| crate::bus::Action::Enqueue { queue });
            let payload = if invoke.payload.is_null() { Value::Object(Default::default()) } else { invoke.payload };
            Step::Invoke {
                call: DriverCall { name, function, payload, action, timeout_ms: invoke.timeout_ms },
                detach: invoke.detach,
            }
        }
        StepSpec::Await(wait) => Step::Await { name: wait.name.into_inner(), within_ms: wait.within_ms },
        StepSpec::WaitMs(ms) => Step::WaitMs(ms),
        StepSpec::WaitUntil(wait) => {
            if wait.conditions.is_empty() {
                return Err(at.error(span, "`wait_until` needs at least one condition in `match`"));
            }
            Step::WaitUntil {
                conditions: conditions(at, wait.conditions)?,
                nth: wait.nth.max(1),
                within_ms: wait.within_ms,
            }
        }
        StepSpec::Put(record) => Step::Put { scope: record.scope, key: record.key, value: record.value },
        StepSpec::Crash(host) => Step::Crash(restartable_host(at, hosts, &host)?),
        StepSpec::Restart(host) => Step::Restart(restartable_host(at, hosts, &host)?),
        StepSpec::Partition(link) => known_link(at, hosts, link).map(|(a, b)| Step::Partition(a, b))?,
        StepSpec::Repair(link) => known_link(at, hosts, link).map(|(a, b)| Step::Repair(a, b))?,
        StepSpec::Hold(link) => known_link(at, hosts, link).map(|(a, b)| Step::Hold(a, b))?,
        StepSpec::Release(link) => known_link(at, hosts, link).map(|(a, b)| Step::Release(a, b))?,
        StepSpec::Heal(true) => Step::Heal,
        StepSpec::Pause(pause) => {
            let host = known_host(at, hosts, &pause.host)?;
            if !HARNESS_WORKERS.contains(&host.as_str()) {
                return Err(
                    at.error(pause.host.span(), &format!("expected a harness worker ({})", HARNESS_WORKERS.join(", ")))
                );
            }
            Step::Pause { host, ms: pause.ms }
        }
        StepSpec::Heal(false) => {
            return Err(at.error(span, "`heal = false` does nothing; write `heal = true` or drop the step"))
        }
    })
}

fn scope_key(at: &Locator, text: &str) -> Result<(String, String), ScenarioError> {
    text.split_once('/')
        .map(|(s, k)| (s.to_string(), k.to_string()))
        .ok_or_else(|| at.error(at.find(text).unwrap_or(0..0), &format!("`{text}`: expected \"scope/key\"")))
}

fn compile_expect(at: &Locator, spec: ExpectSpec) -> Result<Vec<Expectation>, ScenarioError> {
    let mut expectations = Vec::new();
    for (name, table) in spec.rpc {
        expectations.push(Expectation::Rpc { name, conditions: conditions(at, table)? });
    }
    for (record, table) in spec.state {
        let (scope, key) = scope_key(at, &record)?;
        expectations.push(Expectation::State { scope, key, conditions: conditions(at, table)? });
    }
    for record in spec.absent {
        let (scope, key) = scope_key(at, &record)?;
        expectations.push(Expectation::Absent { scope, key });
    }
    for (function, count) in spec.calls {
        let conditions = vec![
            FieldMatch::new("kind", "call").expect("valid path"),
            FieldMatch::new("function", function).expect("valid path"),
        ];
        expectations.push(Expectation::Events {
            conditions,
            count: Some(count),
            count_min: None,
            same: None,
            before_rpc: None,
        });
    }
    for events in spec.events {
        let span = events.span();
        let events = events.into_inner();
        if events.count.is_none() && events.count_min.is_none() && events.same.is_none() {
            return Err(at.error(span, "an `[[expect.events]]` entry needs `count`, `count_min` or `same`"));
        }
        expectations.push(Expectation::Events {
            conditions: conditions(at, events.conditions)?,
            count: events.count,
            count_min: events.count_min,
            same: events.same,
            before_rpc: events.before_rpc,
        });
    }
    if let Some(effects) = spec.effects {
        expectations.push(Expectation::Effects(effects));
    }
    Ok(expectations)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(source: &str) -> Result<Scenario, ScenarioError> {
        Scenario::parse(Path::new("bad.toml"), source)
    }

    #[test]
    fn unknown_keys_name_line_and_column() {
        let error = parse("[world]\nsession_timeout_ms = 300\nbogus = 1\n[policy.reference]\n").unwrap_err();
        assert_eq!((error.line, error.column), (3, 1), "{error}");
        assert!(error.message.contains("bogus"), "{error}");
    }

    #[test]
    fn wrong_types_are_errors() {
        let error = parse("[world]\nsession_timeout_ms = \"soon\"\n[policy.reference]\n").unwrap_err();
        assert_eq!(error.line, 2, "{error}");
    }

    #[test]
    fn unknown_functions_hosts_policies_and_oracles_are_errors() {
        let cut = "[[cut]]\nfunction = \"state::sett\"\naction = \"timeout\"\n[policy.reference]\n";
        let error = parse(cut).unwrap_err();
        assert_eq!((error.line, error.column), (2, 12), "{error}");
        assert!(error.message.contains("state::set"), "lists the known functions: {error}");
        let crash = "[[step]]\ncrash = \"stor\"\n[policy.reference]\n";
        assert_eq!(parse(crash).unwrap_err().line, 2);
        let policy = "[policy.sloppy]\n";
        assert!(parse(policy).unwrap_err().message.contains("unknown policy `sloppy`"));
        let oracle = "[policy.swallow]\nviolations = [\"liveliness\"]\n";
        assert!(parse(oracle).unwrap_err().message.contains("unknown oracle"));
    }

    #[test]
    fn a_scenario_needs_a_policy() {
        assert!(parse("[world]\n").unwrap_err().message.contains("policy"));
    }

    #[test]
    fn a_valid_scenario_compiles_shared_and_policy_expectations() {
        let source = r#"
            [[cut]]
            function = "state::set"
            match = { scope = "harness_turn", "value.status" = "failed" }
            action = "lost-ack"
            count = 2
            [[step]]
            invoke = { function = "harness::turn", payload = { session_id = "s1" }, name = "turn" }
            [expect]
            calls = { "session::messages" = 1 }
            [policy.swallow]
            violations = ["liveness"]
            expect.rpc.turn = { "result.skipped" = true }
        "#;
        let scenario = parse(source).unwrap();
        assert_eq!(scenario.cuts[0].count, Count::Times(2));
        assert_eq!(scenario.runs[0].expectations.len(), 2);
        assert!(scenario.runs[0].expected_violations.contains(&Oracle::Liveness));
    }
}
