//! Scenarios: a world, its cuts, a script of steps, and what each policy run must show.
//!
//! A scenario is data. Loading checks it strictly, and every error names the file, line and
//! column, what was expected there and, for a misspelt name, the nearest valid one.

mod file;
mod requires;

use crate::condition::Condition;
use crate::cut::{
    Count, Interrupt, OutageOver, ProcessCut, Refusal, ServiceCut, ServiceFault, Trigger, INTERRUPT_POINTS,
    OUTAGE_CODE, OUTAGE_MESSAGE,
};
use crate::expect::{After, EventsExpectation, Expectation, AFTER_BY};
use crate::harness::{Binding, BindingPoint, HarnessConfig, Policy};
use crate::oracle::Oracle;
use crate::services::Services;
use crate::sim::{DriverCall, NetworkConfig};
use crate::suggest::did_you_mean;
use crate::topology::{self, Plan, Role, Topology};
use file::{BindingSpec, CountSpec, CutAction, CutSpec, ExpectSpec, ScenarioFile, StepSpec, WorldSpec};
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
    pub interrupts: Vec<ProcessCut>,
    /// The file's text, from which findings are written as scenario files of their own.
    pub source: String,
    /// Whether the runs are judged by the oracles alone (`oracles_only = true`, as findings
    /// are written): a finding's cuts change the story its workload was written for, so no
    /// model script is held to, and a step that cannot complete (an invocation or await with
    /// no outcome, a `wait_until` not met) ends the script without failing the run.
    pub oracles_only: bool,
    /// Why the workload's outcome depends on its faults by design (`outcome_depends_on_faults =
    /// "..."`): its runs are not held to the uncut run's outcome.
    pub outcome_depends_on_faults: Option<String>,
    /// The digest of its workload, for the key of its uncut run, when a command keeps it.
    pub(crate) workload_digest: WorkloadDigest,
}

/// The digest of a scenario's workload (everything of it that its uncut run depends on: the
/// world, the steps, the proxy's place), kept with it by a command that runs its files as it
/// loaded them (`rig run`, `rig bench`; `run/uncut.rs`): a catalogue pass asks for the key of
/// every run, and formatting the whole scenario for each was about 1 % of a run (under
/// callgrind), for the same text every time.
///
/// Only such a command keeps it, whose binding of the files is not mutable: a scenario the
/// library is handed may be changed between its runs by its owner (a test sets a restart time on
/// the file it has just run), so its digest is made at every key. A clone starts without it; a
/// debug build checks at every key that a kept digest is still the scenario's.
#[derive(Default)]
pub struct WorkloadDigest(pub(crate) std::sync::OnceLock<(u64, u64)>);

impl Clone for WorkloadDigest {
    fn clone(&self) -> Self {
        Self::default()
    }
}

impl std::fmt::Debug for WorkloadDigest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("WorkloadDigest")
    }
}

/// Where the drop-proxy sits and what it does.
#[derive(Debug, Clone)]
pub struct ProxySetup {
    /// The worker whose engine connection goes through the proxy.
    pub worker: String,
    pub rules: Vec<proxy::Rule>,
    /// Per rule: whether the run may leave it unfired.
    pub optional: Vec<bool>,
}

/// The world a scenario starts from.
#[derive(Debug, Clone)]
pub struct WorldSetup {
    pub harness: HarnessConfig,
    pub network: NetworkConfig,
    pub liveness_ms: u64,
    pub effects_per_action_max: u64,
    /// The extra work a run may spend per fault that fired, beyond its uncut workload's.
    pub recovery_per_fault_max: crate::recovery::Work,
    pub records: Vec<(String, String, Value)>,
    pub messages: Vec<(String, Value)>,
    /// The scripted model's replies, in order.
    pub model: Vec<ModelReply>,
    /// Whether the model answers a generation asked again (the same `request_id`) as before.
    pub model_deterministic: bool,
    /// Queues defined at start; when there are any, the world has a queue worker.
    pub queues: Vec<(String, crate::queue::QueueConfig)>,
    /// The optional services, with their settings.
    pub services: Services,
    /// Whether a second harness worker, `replacement`, runs beside `harness`.
    pub replacement: bool,
}

impl WorldSetup {
    /// The hosts of this world with the reference harness's functions; a run builds its own
    /// plan with its harness's functions ([`Self::plan`]).
    pub fn plan(&self, harness_functions: Vec<String>, proxy_worker: Option<String>) -> Plan {
        let services = self.services.hosts();
        let mut harness_workers = vec![topology::HARNESS.to_string()];
        if self.replacement {
            harness_workers.push(topology::REPLACEMENT.to_string());
        }
        Plan { services, queue: !self.queues.is_empty(), harness_workers, harness_functions, proxy_worker }
    }
}

/// One scripted model reply, with the conditions on the request it answers.
#[derive(Debug, Clone)]
pub struct ModelReply {
    pub reply: Value,
    pub expect: Vec<Condition>,
    /// The run may leave it unused.
    pub optional: bool,
}

/// One step of the script.
#[derive(Debug, Clone)]
pub enum Step {
    Invoke { call: DriverCall, detach: bool },
    Await { name: String, within_ms: u64 },
    WaitMs(u64),
    WaitUntil { conditions: Vec<Condition>, nth: u64, within_ms: u64 },
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
    /// The `[policy.NAME]` section: the reference harness's policy of that name, or for another
    /// harness the behaviour it claims to have (a correct harness claims `reference`).
    pub policy: String,
    pub expected_violations: BTreeSet<Oracle>,
    /// The shared `[expect]` it keeps (all of it but the kinds it `breaks`): the harness
    /// contract, which every harness claiming this policy is held to.
    pub expectations: Vec<Expectation>,
    /// The section's own `expect`: how the reference harness shows this policy (its write
    /// counts, reply fields, notes, action ids). Only a harness that claims the reference
    /// harness's particulars ([`crate::HarnessFactory::reference_particulars`]) is held to them.
    pub particulars: Vec<Expectation>,
    /// Shared expectations this known-bad policy must break, by kind: at least one of each
    /// kind must fail.
    pub broken: Vec<(String, Vec<Expectation>)>,
}

/// A scenario that could not be loaded: where, and what was expected. Line and column count
/// from 1; both are 0 when the file could not be read at all.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{path}{}: {message}", if *.line == 0 { String::new() } else { format!(":{line}:{column}") })]
pub struct ScenarioError {
    pub path: String,
    pub line: usize,
    pub column: usize,
    pub message: String,
}

/// What validation checks names against.
struct Vocabulary {
    topology: Topology,
    /// Functions a step may invoke: every function of this world.
    functions: BTreeSet<String>,
    /// Functions of this world's doubles: what cuts and `calls` count.
    service_functions: BTreeSet<String>,
    effect_kinds: BTreeSet<String>,
    /// Functions the harness's tools invoke: what a hook may be consulted for.
    tool_functions: BTreeSet<String>,
}

impl Vocabulary {
    fn new(world: &WorldSetup, proxy_worker: Option<String>) -> Self {
        let harness_functions = topology::HARNESS_FUNCTIONS.iter().map(|f| f.to_string()).collect();
        let topology = Topology::new(&world.plan(harness_functions, proxy_worker));
        let functions = topology.functions().into_iter().map(str::to_string).collect();
        let service_functions = topology
            .hosts()
            .iter()
            .filter(|h| h.role == Role::Service)
            .flat_map(|h| h.functions.iter().cloned())
            .collect();
        let tool_functions = world.harness.tools.iter().map(|t| t.function.clone()).collect();
        Self { topology, functions, service_functions, effect_kinds: world.services.effect_kinds(), tool_functions }
    }
}

impl Scenario {
    /// Reads and validates a scenario file.
    pub fn load(path: &Path) -> Result<Self, ScenarioError> {
        let bytes = std::fs::read(path).map_err(|e| ScenarioError {
            path: path.display().to_string(),
            line: 0,
            column: 0,
            message: format!("cannot read the file: {e}"),
        })?;
        let source = text(path, &bytes)?;
        Self::parse(path, source)
    }

    /// Validates a scenario from its text; `path` names it in errors and reports.
    pub fn parse(path: &Path, source: &str) -> Result<Self, ScenarioError> {
        let at = Locator { path, source };
        let mut parsed: ScenarioFile = toml::from_str(source).map_err(|e| toml_error(&at, &e))?;
        let bindings = std::mem::take(&mut parsed.world.bindings);
        let mut world = world_setup(&at, parsed.world)?;
        let proxy_worker = parsed.proxy.as_ref().map(|p| p.get_ref().worker.get_ref().clone());
        let vocabulary = Vocabulary::new(&world, proxy_worker);
        world.harness.bindings =
            bindings.into_iter().map(|b| compile_binding(&at, &vocabulary, b)).collect::<Result<_, _>>()?;
        check_queues(&at, &vocabulary, &world)?;
        let proxy = parsed.proxy.map(|spec| compile_proxy(&at, &vocabulary.topology, spec)).transpose()?;
        let cuts = parsed
            .cuts
            .into_iter()
            .map(|cut| compile_cut(&at, &vocabulary.service_functions, cut))
            .collect::<Result<_, _>>()?;
        let interrupts = parsed
            .interrupts
            .into_iter()
            .map(|i| compile_interrupt(&at, &vocabulary.topology, i))
            .collect::<Result<_, _>>()?;
        let steps: Vec<Step> =
            parsed.steps.into_iter().map(|step| compile_step(&at, &vocabulary, step)).collect::<Result<_, _>>()?;
        let rpc_names: BTreeSet<String> = steps
            .iter()
            .filter_map(|s| match s {
                Step::Invoke { call, .. } => Some(call.name.clone()),
                _ => None,
            })
            .collect();
        let context = ExpectContext { at: &at, vocabulary: &vocabulary, rpc_names: &rpc_names };
        check_awaits(&context, &steps)?;
        let mut shared = compile_expect(&context, parsed.expect)?;
        let oracles_only = parsed.oracles_only;
        if !world.model.is_empty() && !oracles_only {
            // Whoever scripts the model is held to the script: no request it did not expect, no
            // generation beyond it, no scripted reply left unused.
            shared.push((ExpectKind::Model, Expectation::ModelScript));
        }
        let runs = compile_policies(&context, parsed.policy, &shared)?;
        let expects = |r: &PolicyRun| !r.expectations.is_empty() || !r.particulars.is_empty() || !r.broken.is_empty();
        if oracles_only && runs.iter().any(expects) {
            return Err(at.error(
                at.find("oracles_only"),
                "`oracles_only = true` judges the runs by the oracles alone; drop `[expect]`, `expect` and `breaks`, \
                 or drop `oracles_only`",
            ));
        }
        let needs = parsed.needs;
        let scenario = Scenario {
            path: path.to_path_buf(),
            about: parsed.about,
            world,
            cuts,
            steps,
            runs,
            proxy,
            interrupts,
            source: source.to_string(),
            oracles_only,
            outcome_depends_on_faults: parsed.outcome_depends_on_faults,
            workload_digest: WorkloadDigest::default(),
        };
        if let Some(needs) = needs {
            check_needs(&at, &scenario, needs)?;
        }
        Ok(scenario)
    }

    /// The scenario's name: its file name without the extension.
    pub fn name(&self) -> String {
        self.path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default()
    }

    /// What a run of this scenario under `policy` needs of its harness, derived from what the
    /// file's story uses (see [`crate::Capability`] and `rig/docs/your-harness.md`);
    /// `particulars`: whether the harness is held to the policy section's own expectations
    /// ([`crate::HarnessFactory::reference_particulars`]), whose uses then count too.
    pub fn requirements(&self, policy: &str, particulars: bool) -> crate::capability::Requirements {
        let scripted = requires::Scripted { interrupts: !self.interrupts.is_empty(), proxy: self.proxy.is_some() };
        requires::derive(&self.source, policy, particulars, scripted)
    }

    /// Why `harness` cannot make a run of this scenario under `policy`, if it cannot: what the
    /// run needs that the harness does not declare. Every command, `scenario_tests!`,
    /// [`crate::run_with`] and the explorer skip by this.
    pub fn skip_for(&self, harness: &dyn crate::HarnessFactory, policy: &str) -> Option<crate::Skip> {
        let declared = harness.capabilities();
        // A harness declaring the whole contract lacks nothing, whatever the run needs: deriving
        // the needs parses the file's text again, for each policy (about 1 % of a catalogue
        // pass of the reference harness at seeds 0..4, under callgrind).
        if crate::capability::Capability::ALL.into_iter().all(|capability| declared.contains(capability)) {
            return None;
        }
        self.requirements(policy, harness.reference_particulars()).unmet(harness.name(), &declared)
    }

    /// The run of the given policy section, if the file declares it.
    pub fn run_of(&self, policy: &str) -> Option<&PolicyRun> {
        self.runs.iter().find(|r| r.policy == policy)
    }
}

/// A scenario file's bytes as text, or where the first byte is that no TOML file has.
fn text<'a>(path: &Path, bytes: &'a [u8]) -> Result<&'a str, ScenarioError> {
    let (valid, why) = match std::str::from_utf8(bytes) {
        Ok(text) => match text.find('\0') {
            None => return Ok(text),
            Some(at) => (&text[..at], "a zero byte: this is a binary file, not a TOML scenario"),
        },
        Err(error) => (
            std::str::from_utf8(&bytes[..error.valid_up_to()]).unwrap_or_default(),
            "a byte that is not UTF-8: a scenario is a UTF-8 TOML text file",
        ),
    };
    let at = Locator { path, source: valid };
    Err(at.error(valid.len()..valid.len(), &format!("found {why}")))
}

/// A TOML or shape error, said with what the parser leaves out: the nearest valid name to a
/// misspelt one, the key whose value has the wrong type, what a file without a policy lacks.
fn toml_error(at: &Locator, error: &toml::de::Error) -> ScenarioError {
    let span = error.span().unwrap_or(0..0);
    let message = error.message().trim();
    let explained = if let Some(rest) =
        message.strip_prefix("unknown field `").or_else(|| message.strip_prefix("unknown variant `"))
    {
        let mut quoted = rest.split('`').step_by(2);
        let wrong = quoted.next().unwrap_or_default();
        format!("{message}{}", did_you_mean(wrong, quoted))
    } else if message.starts_with("invalid ") {
        match key_before(at.source, span.start) {
            Some(key) => format!("`{key}`: {message}"),
            None => message.to_string(),
        }
    } else if message == "missing field `policy`" {
        let empty = at.source.lines().all(|l| l.trim().is_empty() || l.trim_start().starts_with('#'));
        let what = if empty { "the file is empty: " } else { "" };
        format!(
            "{what}expected at least one `[policy.NAME]` table (`[policy.reference]` is what a correct harness is \
             held to)"
        )
    } else {
        message.to_string()
    };
    at.error(span, &explained)
}

/// The key a value at `at` is given to (`key = value`, bare or quoted), if it has one there.
fn key_before(source: &str, at: usize) -> Option<&str> {
    let before = source.get(..at)?.trim_end();
    let before = before.strip_suffix('=')?.trim_end();
    if let Some(quoted) = before.strip_suffix('"') {
        let start = quoted.rfind('"')?;
        return Some(&quoted[start + 1..]);
    }
    let start = before.rfind(|c: char| !(c.is_ascii_alphanumeric() || "_-.".contains(c))).map_or(0, |i| i + 1);
    Some(&before[start..]).filter(|key| !key.is_empty())
}

/// Holds the rig's derivation of what the file needs of a harness (for a harness not held to
/// the reference's particulars) to the file's `needs`: a file skipped by a harness that could run
/// it is otherwise seen by nobody, since a skip is never a failure.
fn check_needs(
    at: &Locator<'_>,
    scenario: &Scenario,
    needs: toml::Spanned<Vec<toml::Spanned<String>>>,
) -> Result<(), ScenarioError> {
    use crate::capability::Capability;
    let span = needs.span();
    let mut pinned = BTreeSet::from([Capability::Turns]);
    for name in needs.into_inner() {
        let capability = Capability::from_name(name.get_ref()).ok_or_else(|| {
            at.unknown(name.span(), "capability", name.get_ref(), Capability::ALL.map(Capability::name))
        })?;
        pinned.insert(capability);
    }
    let derived = scenario.requirements("reference", false);
    let found: BTreeSet<Capability> = derived.iter().map(|(c, _)| c).chain([Capability::Turns]).collect();
    if found == pinned {
        return Ok(());
    }
    let names = |set: &BTreeSet<Capability>| set.iter().map(|c| c.name()).collect::<Vec<_>>().join(", ");
    let extra: Vec<String> =
        derived.iter().filter(|(c, _)| !pinned.contains(c)).map(|(c, why)| format!("{c} (from {why})")).collect();
    let missing: Vec<&str> = pinned.difference(&found).map(|c| c.name()).collect();
    let mut message = format!(
        "`needs` pins what this file needs of a harness as [{}], and the rig derives [{}]",
        names(&pinned),
        names(&found)
    );
    if !extra.is_empty() {
        message.push_str(&format!("; derived beyond the pin: {}", extra.join(", ")));
    }
    if !missing.is_empty() {
        message.push_str(&format!("; pinned and not derived: {}", missing.join(", ")));
    }
    message.push_str(
        ": a harness lacking one of them would skip a file it can run, or run one it cannot; \
         the derivation is wrong, or the file's story changed and its pin did not",
    );
    Err(at.error(span, &message))
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

    /// The first place `text` appears, to point at a value whose own span the parser does not
    /// keep; the start of the file if it is nowhere.
    fn find(&self, text: &str) -> Range<usize> {
        self.source.find(text).map_or(0..0, |start| start..start + text.len())
    }

    /// An error for `name`, which is not one of `choices`.
    fn unknown<'c>(
        &self,
        span: Range<usize>,
        what: &str,
        name: &str,
        choices: impl IntoIterator<Item = &'c str> + Clone,
    ) -> ScenarioError {
        let listed: Vec<&str> = choices.clone().into_iter().collect();
        let choices_text = if listed.is_empty() { "none in this world".to_string() } else { listed.join(", ") };
        self.error(
            span,
            &format!("unknown {what} `{name}`{}, expected one of {choices_text}", did_you_mean(name, choices)),
        )
    }
}

fn world_setup(at: &Locator, spec: WorldSpec) -> Result<WorldSetup, ScenarioError> {
    if spec.tick_ms == 0 {
        return Err(at.error(at.find("tick_ms"), "`tick_ms` must be at least 1 (the simulation's time step)"));
    }
    check_bring_up(at, &spec)?;
    if spec.latency_ms_min > spec.latency_ms_max {
        return Err(at.error(
            at.find("latency_ms_min"),
            &format!(
                "`latency_ms_min` ({}) is above `latency_ms_max` ({}); expected min <= max",
                spec.latency_ms_min, spec.latency_ms_max
            ),
        ));
    }
    let model = spec.model.into_iter().map(|reply| model_reply(at, reply)).collect::<Result<_, _>>()?;
    check_declared_services(at, &spec.service)?;
    let mut services = Services { tickets: spec.tickets.clone(), declared: spec.service, config: None };
    services.config = spec.config.map(|config| check_config(at, &services, config)).transpose()?;
    Ok(WorldSetup {
        harness: HarnessConfig {
            session_timeout_ms: spec.session_timeout_ms,
            model_timeout_ms: spec.model_timeout_ms,
            enqueue_attempts: spec.enqueue_attempts,
            turn_queue: HarnessConfig::default().turn_queue,
            terminalize_attempts: spec.terminalize_attempts,
            terminalize_backoff_ms: spec.terminalize_backoff_ms,
            settle_within_ms: spec.settle_within_ms,
            handover_ms: spec.handover_ms,
            lease_ttl_ms: spec.lease_ttl_ms,
            tool_timeout_ms: spec.tool_timeout_ms,
            tools: services.tools(),
            system_prompt: spec.system_prompt,
            // Bound once the world's functions are known (`compile_binding`).
            bindings: Vec::new(),
            versioned_config: services.config.is_some(),
        },
        network: NetworkConfig {
            tick_ms: spec.tick_ms,
            latency_ms_min: spec.latency_ms_min,
            latency_ms_max: spec.latency_ms_max,
            duration_ms_max: spec.duration_ms_max,
            steps_max: spec.steps_max,
            tick_idle_hosts: false,
            harness_restart_ms: spec.harness_restart_ms,
        },
        liveness_ms: spec.liveness_ms,
        effects_per_action_max: spec.effects_per_action_max,
        recovery_per_fault_max: spec.recovery_per_fault_max.resolve(),
        records: spec.records.into_iter().map(|r| (r.scope, r.key, r.value)).collect(),
        messages: spec.messages.into_iter().map(|m| (m.session_id, m.message)).collect(),
        model,
        model_deterministic: spec.model_deterministic,
        queues: spec.queue.into_iter().collect(),
        services,
        replacement: spec.replacement,
    })
}

/// One-way network trips a world takes to come up (connections opened, upgraded, functions
/// registered), each delivered on a tick: measured on the smoke scenario, whose world came up
/// with every latency fixed at 1,200 ms (4 trips, 4,800 ms) and never at 1,250 ms (5,000 ms).
const BRING_UP_TRIPS: u64 = 4;

/// The world must be able to come up at all: a tick or a latency so long that the hosts cannot
/// connect within the time the rig waits for them ([`crate::sim::READY_MS_MAX`]), or within the
/// run's own limits, would fail every run with a message about the world, not the harness.
fn check_bring_up(at: &Locator, spec: &WorldSpec) -> Result<(), ScenarioError> {
    let ready_ms = crate::sim::READY_MS_MAX;
    // The worst case: the first tick, then every trip at the longest latency, rounded up to a
    // whole tick. In u128, so that no value in the file can overflow it.
    let tick = u128::from(spec.tick_ms.max(1));
    let trip = u128::from(spec.latency_ms_max).div_ceil(tick).max(1) * tick;
    let bring_up_ms = tick + u128::from(BRING_UP_TRIPS) * trip;
    if bring_up_ms >= u128::from(ready_ms) {
        let key = if tick >= trip { "tick_ms" } else { "latency_ms_max" };
        return Err(at.error(
            at.find(key),
            &format!(
                "`tick_ms = {}` with `latency_ms_max = {}`: the world could not come up: its hosts connect in \
                 {BRING_UP_TRIPS} one-way trips after the first tick, up to {bring_up_ms} ms at these settings, and \
                 the rig waits {ready_ms} ms for them; expected `tick_ms` + {BRING_UP_TRIPS} x `latency_ms_max` \
                 (rounded up to whole ticks) under {ready_ms} ms",
                spec.tick_ms, spec.latency_ms_max
            ),
        ));
    }
    // A restarted worker must be back within the time a `restart` step waits for it.
    if u128::from(spec.harness_restart_ms) + bring_up_ms >= u128::from(ready_ms) {
        return Err(at.error(
            at.find("harness_restart_ms"),
            &format!(
                "`harness_restart_ms = {}`: a restarted harness worker would not be back within the {ready_ms} ms the \
                 rig waits for it (it also takes up to {bring_up_ms} ms to connect at these network settings); \
                 expected under {} ms",
                spec.harness_restart_ms,
                u128::from(ready_ms) - bring_up_ms
            ),
        ));
    }
    if spec.steps_max == 0 || u128::from(spec.duration_ms_max) < bring_up_ms {
        let key = if spec.steps_max == 0 { "steps_max" } else { "duration_ms_max" };
        return Err(at.error(
            at.find(key),
            &format!(
                "`steps_max = {}`, `duration_ms_max = {}`: a run this short ends before its world has come up \
                 (up to {bring_up_ms} ms at these network settings); expected at least 1 step and {bring_up_ms} ms",
                spec.steps_max, spec.duration_ms_max
            ),
        ));
    }
    Ok(())
}

/// A cut that may fire zero times never fires: the file would test nothing and say it did.
fn check_count(at: &Locator, span: Range<usize>, count: CountSpec) -> Result<(), ScenarioError> {
    if count == CountSpec::Times(0) {
        return Err(at.error(
            span,
            "`count = 0`: a cut that may fire zero times never fires; expected a count of at least 1, \"once\" or \
             \"always\" (and `optional = true` if the run may leave it unfired)",
        ));
    }
    Ok(())
}

/// A scripted reply: its text, tool calls or frames, and the conditions on what it answers.
fn model_reply(at: &Locator, spec: file::ModelReplySpec) -> Result<ModelReply, ScenarioError> {
    if spec.text.is_none() && spec.tool_calls.is_none() && spec.frames.is_none() {
        return Err(
            at.error(at.find("[[world.model]]"), "a `[[world.model]]` reply needs `text`, `tool_calls` or `frames`")
        );
    }
    let reply = serde_json::to_value(&spec).expect("model replies serialize");
    Ok(ModelReply { reply, expect: conditions(at, spec.expect)?, optional: spec.optional })
}

/// Host names a declared service may not take: the world's own.
const RESERVED_HOSTS: [&str; 10] = [
    topology::ENGINE,
    topology::PROXY,
    topology::DRIVER,
    topology::STORE,
    topology::SESSION,
    topology::MODEL,
    topology::TICKETS,
    topology::QUEUE,
    topology::HARNESS,
    topology::REPLACEMENT,
];

/// A declared service is named like a host and its functions like function names, and its
/// plain functions do not shadow its effect or reconciliation functions.
fn check_declared_services(
    at: &Locator,
    declared: &BTreeMap<String, doubles::ServiceConfig>,
) -> Result<(), ScenarioError> {
    let word = |text: &str| {
        !text.is_empty() && text.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_')
    };
    for (name, config) in declared {
        let span = at.find(&format!("service.{name}"));
        if RESERVED_HOSTS.contains(&name.as_str()) {
            return Err(at.error(span, &format!("`{name}` is a host of every world; name the service something else")));
        }
        let own = config.functions.keys().map(String::as_str).chain(config.effect.as_deref());
        if let Some(bad) = std::iter::once(name.as_str()).chain(own).find(|n| !word(n)) {
            return Err(at.error(
                span,
                &format!(
                    "`{bad}`: expected a name of lowercase letters, digits, `-` and `_` (functions are `{name}::NAME`)"
                ),
            ));
        }
        let shadows = |f: &String| ["status", "lookup"].contains(&f.as_str()) || config.effect.as_ref() == Some(f);
        if let Some(shadow) = config.functions.keys().find(|f| config.effect.is_some() && shadows(f)) {
            return Err(at.error(
                span,
                &format!("`{name}::{shadow}` is the effect or a reconciliation function of the service; name it something else"),
            ));
        }
        if config.effect.is_none() && config.functions.is_empty() {
            return Err(at.error(span, &format!("service `{name}` serves nothing: give it an `effect` or `functions`")));
        }
    }
    Ok(())
}

/// Versioned configuration: the production pointer names a version, and every version offers
/// tools this world's services document.
fn check_config(
    at: &Locator,
    services: &Services,
    config: Spanned<doubles::ConfigSettings>,
) -> Result<doubles::ConfigSettings, ScenarioError> {
    let span = config.span();
    let config = config.into_inner();
    let versions = || config.versions.keys().map(String::as_str);
    if config.versions.is_empty() {
        return Err(at.error(span, "`[world.config]` needs at least one version in `versions`"));
    }
    if !config.versions.contains_key(&config.production) {
        let place = at.find(&format!("\"{}\"", config.production));
        return Err(at.unknown(place, "production version", &config.production, versions()));
    }
    let tools: BTreeSet<String> = services.tools().into_iter().map(|t| t.name).collect();
    for (name, version) in &config.versions {
        for tool in &version.tools {
            if !tools.contains(tool) {
                let place = at.find(&format!("\"{tool}\""));
                let what = format!("tool (in version `{name}`)");
                return Err(at.unknown(place, &what, tool, tools.iter().map(String::as_str)));
            }
        }
    }
    Ok(config)
}

/// A binding of a function of this world to a hook point or lifecycle trigger of the harness;
/// a hook's `functions` are tool functions of this world.
fn compile_binding(
    at: &Locator,
    vocabulary: &Vocabulary,
    spec: Spanned<BindingSpec>,
) -> Result<Binding, ScenarioError> {
    let spec = spec.into_inner();
    let trigger = BindingPoint::ALL.into_iter().find(|t| t.name() == spec.trigger.get_ref()).ok_or_else(|| {
        at.unknown(spec.trigger.span(), "trigger", spec.trigger.get_ref(), BindingPoint::ALL.iter().map(|t| t.name()))
    })?;
    let function = known_name(at, "function", &vocabulary.functions, &spec.function)?;
    let tools: BTreeSet<String> = vocabulary.tool_functions.clone();
    let functions =
        spec.functions.iter().map(|f| known_name(at, "tool function", &tools, f)).collect::<Result<_, _>>()?;
    if trigger != BindingPoint::PreTrigger && !spec.functions.is_empty() {
        return Err(at.error(
            spec.function.span(),
            "`functions` selects the tool calls a `pre-trigger` hook is consulted for; a lifecycle binding takes none",
        ));
    }
    Ok(Binding { trigger, function, functions, priority: spec.priority })
}

/// A queue's dead-letter handler must be a function of this world.
fn check_queues(at: &Locator, vocabulary: &Vocabulary, world: &WorldSetup) -> Result<(), ScenarioError> {
    for (_, config) in &world.queues {
        if let Some(function) = &config.dead_letter_function {
            if !vocabulary.functions.contains(function) {
                let span = at.find(&format!("\"{function}\""));
                return Err(at.unknown(
                    span,
                    "dead-letter function",
                    function,
                    vocabulary.functions.iter().map(String::as_str),
                ));
            }
        }
    }
    Ok(())
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
    topology: &Topology,
    spec: Spanned<file::InterruptSpec>,
) -> Result<ProcessCut, ScenarioError> {
    let span = spec.span();
    let spec = spec.into_inner();
    check_count(at, span.clone(), spec.count)?;
    let worker = harness_worker(at, topology, &spec.worker)?;
    if !INTERRUPT_POINTS.contains(&spec.point.get_ref().as_str()) {
        return Err(at.unknown(spec.point.span(), "point", spec.point.get_ref(), INTERRUPT_POINTS));
    }
    let interrupt = match spec.action {
        file::InterruptAction::Freeze => Interrupt::Freeze,
        file::InterruptAction::Pause => Interrupt::Pause {
            ms: spec.pause_ms.ok_or_else(|| at.error(span, "a `pause` interrupt needs `pause_ms`"))?,
        },
        file::InterruptAction::Crash => Interrupt::Crash,
    };
    Ok(ProcessCut {
        worker,
        point: spec.point.into_inner(),
        interrupt,
        trigger: Trigger::new(spec.skip, spec.count.into(), spec.optional),
    })
}

fn compile_proxy(
    at: &Locator,
    topology: &Topology,
    spec: Spanned<file::ProxySpec>,
) -> Result<ProxySetup, ScenarioError> {
    let spec = spec.into_inner();
    let worker = known_host(at, topology, &spec.worker)?;
    if topology.host(&worker).is_some_and(|h| matches!(h.role, Role::Engine | Role::Proxy | Role::Driver)) {
        return Err(at.error(
            spec.worker.span(),
            "expected a worker host to place behind the proxy, not the engine, the proxy or the driver",
        ));
    }
    let mut rules = Vec::new();
    let mut optional = Vec::new();
    for table in spec.rules {
        let span = table.span();
        let mut table = table.into_inner();
        let is_optional = match table.remove("optional") {
            None => false,
            Some(toml::Value::Boolean(flag)) => flag,
            Some(_) => return Err(at.error(span, "`optional` expects true or false")),
        };
        let rule: proxy::Rule =
            toml::Value::Table(table).try_into().map_err(|e: toml::de::Error| at.error(span.clone(), e.message()))?;
        rule.validate().map_err(|e| at.error(span, &e.to_string()))?;
        rules.push(rule);
        optional.push(is_optional);
    }
    Ok(ProxySetup { worker, rules, optional })
}

fn known_name(
    at: &Locator,
    what: &str,
    choices: &BTreeSet<String>,
    name: &Spanned<String>,
) -> Result<String, ScenarioError> {
    if choices.contains(name.get_ref()) {
        return Ok(name.get_ref().clone());
    }
    Err(at.unknown(name.span(), what, name.get_ref(), choices.iter().map(String::as_str)))
}

fn known_host(at: &Locator, topology: &Topology, host: &Spanned<String>) -> Result<String, ScenarioError> {
    if topology.host(host.get_ref()).is_some() {
        return Ok(host.get_ref().clone());
    }
    Err(at.unknown(host.span(), "host", host.get_ref(), topology.names()))
}

fn harness_worker(at: &Locator, topology: &Topology, host: &Spanned<String>) -> Result<String, ScenarioError> {
    let name = known_host(at, topology, host)?;
    if topology.host(&name).is_some_and(|h| h.role == Role::Harness) {
        return Ok(name);
    }
    let workers: Vec<&str> =
        topology.hosts().iter().filter(|h| h.role == Role::Harness).map(|h| h.name.as_str()).collect();
    Err(at.error(host.span(), &format!("`{name}` is not a harness worker; expected one of {}", workers.join(", "))))
}

/// A host that can be crashed and restarted: any but the driver, which is the scenario itself.
fn restartable_host(at: &Locator, topology: &Topology, host: &Spanned<String>) -> Result<String, ScenarioError> {
    let name = known_host(at, topology, host)?;
    if name == topology::DRIVER {
        return Err(at.error(host.span(), "the driver is the scenario's own client and cannot crash; expected a host"));
    }
    Ok(name)
}

/// Two hosts joined by a network link: a partition, hold or release anywhere else would cut
/// nothing and silently test nothing.
fn known_link(
    at: &Locator,
    topology: &Topology,
    link: Spanned<[String; 2]>,
) -> Result<(String, String), ScenarioError> {
    let span = link.span();
    let [a, b] = link.into_inner();
    let a = known_host(at, topology, &Spanned::new(span.clone(), a))?;
    let b = known_host(at, topology, &Spanned::new(span.clone(), b))?;
    if a == b {
        return Err(at.error(span, &format!("a link joins two different hosts; `{a}` is named twice")));
    }
    if !topology.has_link(&a, &b) {
        let links: Vec<String> = topology.links().iter().map(|(x, y)| format!("[\"{x}\", \"{y}\"]")).collect();
        return Err(at.error(
            span,
            &format!("no network link joins `{a}` and `{b}` (workers only talk to the engine), so this would cut nothing; the links are {}", links.join(", ")),
        ));
    }
    Ok((a, b))
}

/// Conditions from a TOML table of `PATH = VALUE` or `PATH = { test = operand, ... }`.
fn conditions(at: &Locator, table: BTreeMap<String, Spanned<toml::Value>>) -> Result<Vec<Condition>, ScenarioError> {
    table
        .into_iter()
        .map(|(path, value)| {
            let span = value.span();
            Condition::from_toml(&path, value.get_ref()).map_err(|e| at.error(span, &e.to_string()))
        })
        .collect()
}

fn compile_cut(at: &Locator, functions: &BTreeSet<String>, cut: Spanned<CutSpec>) -> Result<ServiceCut, ScenarioError> {
    let span = cut.span();
    let cut = cut.into_inner();
    check_count(at, span.clone(), cut.count)?;
    let function = known_name(at, "service function", functions, &cut.function)?;
    let fault = match cut.action {
        CutAction::LostAck => ServiceFault::LostAck,
        CutAction::Timeout => ServiceFault::Timeout,
        CutAction::Reject => ServiceFault::Reject {
            code: cut.code.unwrap_or_else(|| crate::cut::REJECT_CODE.into()),
            message: cut.message.unwrap_or_else(|| crate::cut::REJECT_MESSAGE.into()),
        },
        CutAction::Delay => ServiceFault::Delay {
            ms: cut.delay_ms.ok_or_else(|| at.error(span.clone(), "a `delay` cut needs `delay_ms`"))?,
        },
        CutAction::Late => ServiceFault::Late,
        CutAction::CrashCallerBefore => ServiceFault::CrashCaller { after: false },
        CutAction::CrashCallerAfter => ServiceFault::CrashCaller { after: true },
        CutAction::CrashService => ServiceFault::CrashService,
        CutAction::CrashEngine => ServiceFault::CrashEngine,
        CutAction::PauseCaller => ServiceFault::PauseCaller {
            ms: cut.pause_ms.ok_or_else(|| at.error(span.clone(), "a `pause-caller` cut needs `pause_ms`"))?,
        },
        CutAction::IsolateCaller => ServiceFault::IsolateCaller {
            ms: cut.isolate_ms.ok_or_else(|| at.error(span.clone(), "an `isolate-caller` cut needs `isolate_ms`"))?,
        },
        CutAction::Outage => {
            let ms = match cut.for_ms {
                None => return Err(at.error(span, "an `outage` cut needs `for_ms`: how long the function is down")),
                Some(0) => {
                    return Err(at.error(span, "`for_ms = 0`: an outage of no time takes no call; expected at least 1"))
                }
                Some(ms) => ms,
            };
            let refuse = match cut.refuse.unwrap_or(file::RefuseSpec::Reject) {
                file::RefuseSpec::Reject => Refusal::Reject {
                    code: cut.code.unwrap_or_else(|| OUTAGE_CODE.into()),
                    message: cut.message.unwrap_or_else(|| OUTAGE_MESSAGE.into()),
                },
                file::RefuseSpec::Timeout => Refusal::Timeout,
            };
            let over = match cut.over.unwrap_or(file::OverSpec::Function) {
                file::OverSpec::Function => OutageOver::Function,
                file::OverSpec::Service => OutageOver::Service,
            };
            ServiceFault::Outage { ms, refuse, over }
        }
    };
    Ok(ServiceCut {
        function,
        conditions: conditions(at, cut.conditions)?,
        fault,
        trigger: Trigger::new(cut.skip, cut.count.into(), cut.optional),
    })
}

fn compile_step(at: &Locator, vocabulary: &Vocabulary, step: Spanned<StepSpec>) -> Result<Step, ScenarioError> {
    let span = step.span();
    let topology = &vocabulary.topology;
    Ok(match step.into_inner() {
        StepSpec::Invoke(invoke) => {
            let function = known_name(at, "function", &vocabulary.functions, &invoke.function)?;
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
            if *wait.nth.get_ref() == 0 {
                let nth_span = if wait.nth.span().is_empty() { span } else { wait.nth.span() };
                return Err(at.error(nth_span, "`nth` counts from 1 (the first matching event)"));
            }
            Step::WaitUntil {
                conditions: conditions(at, wait.conditions)?,
                nth: wait.nth.into_inner(),
                within_ms: wait.within_ms,
            }
        }
        StepSpec::Put(record) => Step::Put { scope: record.scope, key: record.key, value: record.value },
        StepSpec::Crash(host) => Step::Crash(restartable_host(at, topology, &host)?),
        StepSpec::Restart(host) => Step::Restart(restartable_host(at, topology, &host)?),
        StepSpec::Partition(link) => known_link(at, topology, link).map(|(a, b)| Step::Partition(a, b))?,
        StepSpec::Repair(link) => known_link(at, topology, link).map(|(a, b)| Step::Repair(a, b))?,
        StepSpec::Hold(link) => known_link(at, topology, link).map(|(a, b)| Step::Hold(a, b))?,
        StepSpec::Release(link) => known_link(at, topology, link).map(|(a, b)| Step::Release(a, b))?,
        StepSpec::Heal(true) => Step::Heal,
        StepSpec::Pause(pause) => Step::Pause { host: harness_worker(at, topology, &pause.host)?, ms: pause.ms },
        StepSpec::Heal(false) => {
            return Err(at.error(span, "`heal = false` does nothing; write `heal = true` or drop the step"))
        }
    })
}

/// What expectations are validated against.
struct ExpectContext<'a> {
    at: &'a Locator<'a>,
    vocabulary: &'a Vocabulary,
    /// The names of the script's invocations: what `rpc`, `await` and `before_rpc` may name.
    rpc_names: &'a BTreeSet<String>,
}

impl ExpectContext<'_> {
    fn rpc_name(&self, name: &Spanned<String>) -> Result<String, ScenarioError> {
        known_name(self.at, "invocation name (from an `invoke` step's `name`)", self.rpc_names, name)
    }
}

/// An `await` names an invocation the script made before it.
fn check_awaits(context: &ExpectContext, steps: &[Step]) -> Result<(), ScenarioError> {
    let mut invoked = BTreeSet::new();
    for step in steps {
        match step {
            Step::Invoke { call, .. } => {
                invoked.insert(call.name.clone());
            }
            Step::Await { name, .. } if !invoked.contains(name) => {
                let span = context.at.find(&format!("\"{name}\""));
                return Err(context.at.unknown(
                    span,
                    "invocation to await (it must come from an earlier `invoke` step)",
                    name,
                    invoked.iter().map(String::as_str),
                ));
            }
            _ => {}
        }
    }
    Ok(())
}

fn scope_key(at: &Locator, text: &str) -> Result<(String, String), ScenarioError> {
    text.split_once('/')
        .map(|(s, k)| (s.to_string(), k.to_string()))
        .ok_or_else(|| at.error(at.find(text), &format!("`{text}`: expected \"scope/key\"")))
}

fn compile_expect(context: &ExpectContext, spec: ExpectSpec) -> Result<Vec<(ExpectKind, Expectation)>, ScenarioError> {
    let at = context.at;
    let mut expectations = Vec::new();
    for (name, table) in spec.rpc {
        expectations.push((
            ExpectKind::Rpc,
            Expectation::Rpc { name: context.rpc_name(&name)?, conditions: conditions(at, table)? },
        ));
    }
    for (record, table) in spec.state {
        let (scope, key) = scope_key(at, &record)?;
        expectations.push((ExpectKind::State, Expectation::State { scope, key, conditions: conditions(at, table)? }));
    }
    for (session, table) in spec.actions {
        expectations.push((ExpectKind::Actions, Expectation::Actions { session, conditions: conditions(at, table)? }));
    }
    for record in spec.absent {
        let (scope, key) = scope_key(at, &record)?;
        expectations.push((ExpectKind::Absent, Expectation::Absent { scope, key }));
    }
    for (function, count) in spec.calls {
        let function = known_name(at, "service function", &context.vocabulary.service_functions, &function)?;
        let conditions = vec![
            Condition::equals("kind", "call").expect("valid path"),
            Condition::equals("function", function).expect("valid path"),
        ];
        let counted = EventsExpectation { conditions, count: Some(count), ..Default::default() };
        expectations.push((ExpectKind::Calls, Expectation::Events(counted)));
    }
    for events in spec.events {
        let span = events.span();
        let events = events.into_inner();
        if events.count.is_none()
            && events.count_min.is_none()
            && events.count_max.is_none()
            && events.same.is_none()
            && events.after.is_none()
        {
            return Err(at.error(
                span,
                "an `[[expect.events]]` entry needs `count`, `count_min`, `count_max`, `same` or `after`",
            ));
        }
        if events.count.is_some() && (events.count_min.is_some() || events.count_max.is_some()) {
            return Err(at.error(span, "`count` is exact; give it alone, or give `count_min` and/or `count_max`"));
        }
        let before_rpc = events.before_rpc.as_ref().map(|name| context.rpc_name(name)).transpose()?;
        let after = match events.after {
            Some(after) => {
                let span = after.by_ms.span();
                let by_ms = Condition::from_toml(AFTER_BY, after.by_ms.get_ref())
                    .map_err(|e| at.error(span, &e.to_string()))?;
                Some(After { conditions: conditions(at, after.conditions)?, by_ms })
            }
            None => None,
        };
        expectations.push((
            ExpectKind::Events,
            Expectation::Events(EventsExpectation {
                conditions: conditions(at, events.conditions)?,
                count: events.count,
                count_min: events.count_min,
                count_max: events.count_max,
                same: events.same,
                before_rpc,
                after,
            }),
        ));
    }
    if let Some(effects) = spec.effects {
        let kinds = &context.vocabulary.effect_kinds;
        let mut counts = BTreeMap::new();
        for (kind, count) in effects {
            if !kinds.contains(kind.get_ref().as_str()) {
                return Err(at.unknown(kind.span(), "effect kind", kind.get_ref(), kinds.iter().map(String::as_str)));
            }
            counts.insert(kind.into_inner(), count);
        }
        expectations.push((ExpectKind::Effects, Expectation::Effects(counts)));
    }
    for (session, entries) in spec.transcript {
        let entries = entries.into_iter().map(|table| conditions(at, table)).collect::<Result<_, _>>()?;
        expectations.push((ExpectKind::Transcript, Expectation::Transcript { session, entries }));
    }
    Ok(expectations)
}

fn compile_policies(
    context: &ExpectContext,
    policies: Spanned<BTreeMap<String, file::PolicySpec>>,
    shared: &[(ExpectKind, Expectation)],
) -> Result<Vec<PolicyRun>, ScenarioError> {
    let at = context.at;
    let policy_span = policies.span();
    let policies = policies.into_inner();
    if policies.is_empty() {
        return Err(at.error(policy_span, "expected at least one `[policy.NAME]` table"));
    }
    let mut runs = Vec::new();
    for (name, spec) in policies {
        let span = at.source.find(&format!("policy.{name}")).map_or(policy_span.clone(), |s| s..s + name.len() + 7);
        let Some(policy) = Policy::from_name(&name) else {
            return Err(at.unknown(span, "policy", &name, Policy::ALL.iter().map(|p| p.name())));
        };
        let (violations, breaks) = (listed(spec.violations), listed(spec.breaks));
        if let (true, Some((written, said))) = (policy != Policy::Reference, proves_nothing(&violations, &breaks)) {
            return Err(at.error(
                written,
                &format!(
                    "`[policy.{name}]` is a known-bad policy, and {said}: its run would pass, proving nothing; \
                     expected the oracles it must trip (`violations = [\"liveness\"]`) or the kinds of `[expect]` \
                     it breaks (`breaks = [\"state\"]`) (a section that only runs the policy where it should do \
                     no harm writes neither list)"
                ),
            ));
        }
        let expected_violations = violations
            .1
            .iter()
            .map(|v| {
                Oracle::from_name(v.get_ref())
                    .ok_or_else(|| at.unknown(v.span(), "oracle", v.get_ref(), Oracle::ALL.iter().map(|o| o.name())))
            })
            .collect::<Result<_, _>>()?;
        let breaks = breaks.1.iter().map(|kind| broken_kind(at, shared, kind)).collect::<Result<BTreeSet<_>, _>>()?;
        let (broken, kept): (Vec<_>, Vec<_>) = shared.iter().cloned().partition(|(kind, _)| breaks.contains(kind));
        let expectations: Vec<Expectation> = kept.into_iter().map(|(_, e)| e).collect();
        let particulars = compile_expect(context, spec.expect)?.into_iter().map(|(_, e)| e).collect();
        let broken = breaks
            .iter()
            .map(|kind| {
                let of_kind = broken.iter().filter(|(k, _)| k == kind).map(|(_, e)| e.clone()).collect();
                (kind.name().to_string(), of_kind)
            })
            .collect();
        runs.push(PolicyRun { policy: name, expected_violations, expectations, particulars, broken });
    }
    Ok(runs)
}

/// A policy's `violations` or `breaks`: where it was written, if it was, and what it names.
type Listed = (Option<Range<usize>>, Vec<Spanned<String>>);

fn listed(list: Option<Spanned<Vec<Spanned<String>>>>) -> Listed {
    list.map_or((None, Vec::new()), |list| (Some(list.span()), list.into_inner()))
}

/// Where a policy section declares, in so many words, that it trips no oracle and breaks no
/// expectation (`violations = []` and no `breaks`, or the other way round): for a known-bad
/// policy that proves nothing, and is a load error. Leaving both out is a different claim: the
/// policy runs where it should do no harm, judged like a correct one.
fn proves_nothing(violations: &Listed, breaks: &Listed) -> Option<(Range<usize>, &'static str)> {
    if !violations.1.is_empty() || !breaks.1.is_empty() {
        return None;
    }
    match (&violations.0, &breaks.0) {
        (Some(at), None) => Some((at.clone(), "`violations = []` with no `breaks` says it trips no oracle")),
        (None, Some(at)) => Some((at.clone(), "`breaks = []` with no `violations` says it breaks nothing")),
        (Some(at), Some(_)) => {
            Some((at.clone(), "`violations = []` and `breaks = []` say it trips and breaks nothing"))
        }
        (None, None) => None,
    }
}

/// The kinds of expectation a file's `[expect]` holds, as a policy's `breaks` names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum ExpectKind {
    Rpc,
    State,
    Actions,
    Absent,
    Calls,
    Events,
    Effects,
    Transcript,
    /// The model script was followed (implied when the world scripts model replies).
    Model,
}

impl ExpectKind {
    const ALL: [ExpectKind; 9] = [
        ExpectKind::Rpc,
        ExpectKind::State,
        ExpectKind::Actions,
        ExpectKind::Absent,
        ExpectKind::Calls,
        ExpectKind::Events,
        ExpectKind::Effects,
        ExpectKind::Transcript,
        ExpectKind::Model,
    ];

    fn name(self) -> &'static str {
        match self {
            ExpectKind::Rpc => "rpc",
            ExpectKind::State => "state",
            ExpectKind::Actions => "actions",
            ExpectKind::Absent => "absent",
            ExpectKind::Calls => "calls",
            ExpectKind::Events => "events",
            ExpectKind::Effects => "effects",
            ExpectKind::Transcript => "transcript",
            ExpectKind::Model => "model",
        }
    }
}

/// A kind a known-bad policy breaks: it must name shared expectations the file has.
fn broken_kind(
    at: &Locator,
    shared: &[(ExpectKind, Expectation)],
    name: &Spanned<String>,
) -> Result<ExpectKind, ScenarioError> {
    let kinds = ExpectKind::ALL.iter().map(|k| k.name());
    let kind = ExpectKind::ALL
        .into_iter()
        .find(|k| k.name() == name.get_ref())
        .ok_or_else(|| at.unknown(name.span(), "expectation kind", name.get_ref(), kinds))?;
    if !shared.iter().any(|(k, _)| *k == kind) {
        let what = if kind == ExpectKind::Model {
            "scripts no model replies"
        } else {
            "has no such expectation in `[expect]`"
        };
        return Err(at.error(
            name.span(),
            &format!("`breaks` names `{}`, but the file {what}: there is nothing for the policy to break", kind.name()),
        ));
    }
    Ok(kind)
}

/// Every scenario file under the given paths, sorted and each once, so runs are listed in a
/// stable order. Symbolic links are followed; a loop among them is reported once. The CLI, the
/// per-file tests and a user's own tests list scenario folders with this.
pub fn files(paths: &[PathBuf]) -> Result<Vec<PathBuf>, Vec<String>> {
    let mut files = Vec::new();
    let mut errors = std::collections::BTreeSet::new();
    for path in paths {
        if !path.exists() {
            errors.insert(format!("{}: no such file or folder", path.display()));
            continue;
        }
        for entry in walkdir::WalkDir::new(path).follow_links(true).sort_by_file_name() {
            match entry {
                Ok(entry) if entry.file_type().is_file() && is_scenario(entry.path()) => {
                    files.push(entry.path().to_path_buf())
                }
                // A FIFO, socket or device named like a scenario is a mistake to say, never
                // to pass over (nor to read: a FIFO would block the run on its writer).
                Ok(entry) if !entry.file_type().is_dir() && (is_scenario(entry.path()) || entry.depth() == 0) => {
                    let kind = special_file(&entry.file_type());
                    errors.insert(format!(
                        "{}: {kind}, not a scenario file; expected a regular .toml file or a folder",
                        entry.path().display()
                    ));
                }
                Ok(_) => {}
                Err(error) => {
                    let at = error.path().map_or_else(|| path.display().to_string(), |p| p.display().to_string());
                    let why = match error.loop_ancestor() {
                        Some(ancestor) => format!("a symbolic link loops back to {}", ancestor.display()),
                        None => error.io_error().map_or_else(|| error.to_string(), ToString::to_string),
                    };
                    errors.insert(format!("{at}: {why}"));
                }
            }
        }
    }
    if !errors.is_empty() {
        return Err(errors.into_iter().collect());
    }
    if files.is_empty() {
        return Err(vec!["no scenario files (*.toml) under the given paths".into()]);
    }
    files.sort();
    files.dedup();
    Ok(files)
}

fn is_scenario(path: &Path) -> bool {
    path.extension().is_some_and(|e| e == "toml")
}

/// What a path that is neither a regular file nor a folder is, in words.
fn special_file(file_type: &std::fs::FileType) -> &'static str {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt as _;
        if file_type.is_fifo() {
            return "a named pipe (FIFO)";
        }
        if file_type.is_socket() {
            return "a socket";
        }
        if file_type.is_char_device() || file_type.is_block_device() {
            return "a device";
        }
    }
    let _ = file_type;
    "not a regular file"
}

#[cfg(test)]
mod tests;
