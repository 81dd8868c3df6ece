//! The scenario file as written: strict TOML, every table closed to unknown keys.

use serde::de::{self, Deserializer, Visitor};
use serde::Deserialize;
use serde_json::Value;
use std::collections::BTreeMap;
use toml::Spanned;

/// A whole scenario file. Its name is its file name; it is never written inside.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScenarioFile {
    /// What the scenario reproduces, in a sentence or two (shown in reports).
    #[serde(default)]
    pub about: Option<String>,
    /// What the file's story needs of a harness, as the rig derives it: pinned, so that a
    /// derivation that goes wrong (a harness silently skipping a file it could run, or running
    /// one it cannot) is an error every run of the file shows, whatever the harness.
    #[serde(default)]
    pub needs: Option<Spanned<Vec<Spanned<String>>>>,
    #[serde(default)]
    pub world: WorldSpec,
    #[serde(default, rename = "cut")]
    pub cuts: Vec<Spanned<CutSpec>>,
    #[serde(default, rename = "step")]
    pub steps: Vec<Spanned<StepSpec>>,
    /// Expectations every policy run must meet.
    #[serde(default)]
    pub expect: ExpectSpec,
    /// The harness policies to run, each with its own expectations.
    pub policy: Spanned<BTreeMap<String, PolicySpec>>,
    /// A drop-proxy between one worker and the engine.
    #[serde(default)]
    pub proxy: Option<Spanned<ProxySpec>>,
    /// Process cuts: what happens to a harness worker at a named point.
    #[serde(default, rename = "interrupt")]
    pub interrupts: Vec<Spanned<InterruptSpec>>,
    /// The runs are judged by the oracles alone (findings): no expectations, no model script
    /// held to, and a step that cannot complete ends the script without failing the run.
    #[serde(default)]
    pub oracles_only: bool,
    /// Why the workload's outcome depends on its faults by design (a dead letter, say): the
    /// `outcome` oracle does not hold a run of it to its uncut run.
    #[serde(default)]
    pub outcome_depends_on_faults: Option<String>,
}

/// A process cut at a named point of a harness worker's work.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InterruptSpec {
    pub worker: Spanned<String>,
    pub point: Spanned<String>,
    pub action: InterruptAction,
    #[serde(default)]
    pub pause_ms: Option<u64>,
    #[serde(default)]
    pub count: CountSpec,
    /// Matching arrivals to let through first.
    #[serde(default)]
    pub skip: u64,
    /// The run may leave this cut unfired (otherwise a cut that never fired fails the run).
    #[serde(default)]
    pub optional: bool,
}

#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum InterruptAction {
    Freeze,
    Pause,
    Crash,
}

/// The drop-proxy: which worker's engine connection goes through it, and its rules (the
/// proxy crate's own rule shape, so a rules file and a scenario read the same).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProxySpec {
    pub worker: Spanned<String>,
    /// In the proxy crate's own rule shape, plus `optional` (read off before the proxy sees it).
    #[serde(default, rename = "rule")]
    pub rules: Vec<Spanned<toml::Table>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WorldSpec {
    pub session_timeout_ms: u64,
    pub model_timeout_ms: u64,
    pub enqueue_attempts: u32,
    pub terminalize_attempts: u32,
    pub terminalize_backoff_ms: u64,
    pub settle_within_ms: u64,
    pub handover_ms: u64,
    pub tick_ms: u64,
    pub latency_ms_min: u64,
    pub latency_ms_max: u64,
    /// How long a restarted harness worker takes to start again (0: at once).
    pub harness_restart_ms: u64,
    pub duration_ms_max: u64,
    pub steps_max: u64,
    /// How long after the final heal every turn must be terminal or held.
    pub liveness_ms: u64,
    /// How many external effects one action may produce.
    pub effects_per_action_max: u64,
    /// The extra work (beyond the uncut workload's) a run may spend per fault that fired.
    pub recovery_per_fault_max: RecoveryBoundSpec,
    #[serde(rename = "record")]
    pub records: Vec<RecordSpec>,
    #[serde(rename = "message")]
    pub messages: Vec<MessageSpec>,
    /// The scripted model's replies, in order.
    pub model: Vec<ModelReplySpec>,
    /// Whether the model answers a generation asked again (the same `request_id`) as before.
    pub model_deterministic: bool,
    /// Queues defined when the world starts, by name; their presence adds the queue worker.
    pub queue: BTreeMap<String, crate::queue::QueueConfig>,
    /// The ticket service (an external effect service); its presence adds the `tickets` host.
    pub tickets: Option<doubles::TicketConfig>,
    /// Time to live of a session's ownership lease; 0 runs the harness without ownership.
    pub lease_ttl_ms: u64,
    pub tool_timeout_ms: u64,
    /// A second harness worker, `replacement`, for harness switches (`replacement::import` ...).
    pub replacement: bool,
    /// The system prompt every generation request carries.
    pub system_prompt: String,
    /// Services the scenario declares, by name; each adds a host of that name.
    pub service: BTreeMap<String, doubles::ServiceConfig>,
    /// Functions bound to the harness's hook points and lifecycle triggers.
    #[serde(rename = "binding")]
    pub bindings: Vec<Spanned<BindingSpec>>,
    /// Versioned configuration, its production pointer and safety overlay (the `config` host).
    pub config: Option<Spanned<doubles::ConfigSettings>>,
}

/// `[world] recovery_per_fault_max`: per dimension, the extra work a fault may cost; a
/// dimension left out keeps its default.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RecoveryBoundSpec {
    pub model_calls: Option<u64>,
    pub effect_requests: Option<u64>,
    pub store_writes: Option<u64>,
}

impl RecoveryBoundSpec {
    pub fn resolve(&self) -> crate::recovery::Work {
        let default = crate::recovery::PER_FAULT_MAX_DEFAULT;
        crate::recovery::Work {
            model_calls: self.model_calls.unwrap_or(default.model_calls),
            effect_requests: self.effect_requests.unwrap_or(default.effect_requests),
            store_writes: self.store_writes.unwrap_or(default.store_writes),
        }
    }
}

/// A function bound to a hook point (`pre-trigger`) or a lifecycle trigger (`turn-completed`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BindingSpec {
    pub trigger: Spanned<String>,
    pub function: Spanned<String>,
    /// For hooks: the tool functions it is consulted for (none: every tool).
    #[serde(default)]
    pub functions: Vec<Spanned<String>>,
    /// For hooks: lower runs first.
    #[serde(default)]
    pub priority: i64,
}

impl Default for WorldSpec {
    fn default() -> Self {
        let harness = crate::harness::HarnessConfig::default();
        let network = crate::sim::NetworkConfig::default();
        Self {
            session_timeout_ms: harness.session_timeout_ms,
            model_timeout_ms: harness.model_timeout_ms,
            enqueue_attempts: harness.enqueue_attempts,
            terminalize_attempts: harness.terminalize_attempts,
            terminalize_backoff_ms: harness.terminalize_backoff_ms,
            settle_within_ms: harness.settle_within_ms,
            handover_ms: harness.handover_ms,
            tick_ms: network.tick_ms,
            latency_ms_min: network.latency_ms_min,
            latency_ms_max: network.latency_ms_max,
            harness_restart_ms: network.harness_restart_ms,
            duration_ms_max: network.duration_ms_max,
            steps_max: network.steps_max,
            liveness_ms: 60_000,
            effects_per_action_max: 1,
            recovery_per_fault_max: RecoveryBoundSpec::default(),
            records: Vec::new(),
            messages: Vec::new(),
            model: Vec::new(),
            model_deterministic: false,
            queue: BTreeMap::new(),
            tickets: None,
            lease_ttl_ms: harness.lease_ttl_ms,
            tool_timeout_ms: harness.tool_timeout_ms,
            replacement: false,
            system_prompt: harness.system_prompt,
            service: BTreeMap::new(),
            bindings: Vec::new(),
            config: None,
        }
    }
}

/// One scripted model reply: a final text, tool calls to make, or frames streamed to the
/// caller; with what request it answers, and whether the run may leave it unused.
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct ModelReplySpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCallSpec>>,
    /// The reply as a stream of frames (`text_delta` with `delta`, `tool_call` with `tool` and
    /// `args`, ...), each sent to the caller before the reply itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub frames: Option<Vec<Value>>,
    /// Conditions on the generation request this reply answers.
    #[serde(default, skip_serializing)]
    pub expect: BTreeMap<String, Spanned<toml::Value>>,
    /// The run may leave this reply unused (otherwise a reply never asked for fails the run).
    #[serde(default, skip_serializing)]
    pub optional: bool,
}

/// A tool call in a scripted model reply.
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct ToolCallSpec {
    /// The call's id, as a model names its function calls (`call-1`); the harness's action id
    /// stands in when it has none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    pub tool: String,
    #[serde(default)]
    pub args: Value,
}

/// A durable record present before the run starts.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RecordSpec {
    pub scope: String,
    pub key: String,
    pub value: Value,
}

/// A message in a session's log before the run starts.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MessageSpec {
    pub session_id: String,
    pub message: Value,
}

/// A service cut.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CutSpec {
    pub function: Spanned<String>,
    #[serde(default, rename = "match")]
    pub conditions: BTreeMap<String, Spanned<toml::Value>>,
    pub action: CutAction,
    #[serde(default)]
    pub delay_ms: Option<u64>,
    /// How long a `pause-caller` cut pauses the calling worker.
    #[serde(default)]
    pub pause_ms: Option<u64>,
    /// How long an `isolate-caller` cut keeps the calling worker's link to the engine cut.
    #[serde(default)]
    pub isolate_ms: Option<u64>,
    /// How long an `outage` keeps its function (or service) down, from the call that starts it.
    #[serde(default)]
    pub for_ms: Option<u64>,
    /// How each call an `outage` takes fails: `reject` (an error reply, `code`/`message`) or
    /// `timeout` (no reply).
    #[serde(default)]
    pub refuse: Option<RefuseSpec>,
    /// What an `outage` takes down: the cut's `function` (every call of it) or its whole `service`.
    #[serde(default)]
    pub over: Option<OverSpec>,
    #[serde(default)]
    pub code: Option<String>,
    #[serde(default)]
    pub message: Option<String>,
    /// Matching calls to let through before the cut starts firing.
    #[serde(default)]
    pub skip: u64,
    #[serde(default)]
    pub count: CountSpec,
    /// The run may leave this cut unfired (otherwise a cut that never fired fails the run).
    #[serde(default)]
    pub optional: bool,
}

#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum CutAction {
    LostAck,
    Timeout,
    Reject,
    Delay,
    Late,
    CrashCallerBefore,
    CrashCallerAfter,
    CrashService,
    CrashEngine,
    PauseCaller,
    IsolateCaller,
    Outage,
}

/// How an outage refuses each call it takes.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum RefuseSpec {
    Reject,
    Timeout,
}

/// What an outage takes down.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum OverSpec {
    Function,
    Service,
}

/// `"once"`, `"always"` or a number of times.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CountSpec {
    #[default]
    Once,
    Always,
    Times(u64),
}

impl<'de> Deserialize<'de> for CountSpec {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct CountVisitor;
        impl Visitor<'_> for CountVisitor {
            type Value = CountSpec;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str(r#""once", "always" or a whole number of times"#)
            }
            fn visit_i64<E: de::Error>(self, n: i64) -> Result<CountSpec, E> {
                u64::try_from(n).map(CountSpec::Times).map_err(|_| E::invalid_value(de::Unexpected::Signed(n), &self))
            }
            fn visit_u64<E: de::Error>(self, n: u64) -> Result<CountSpec, E> {
                Ok(CountSpec::Times(n))
            }
            fn visit_str<E: de::Error>(self, word: &str) -> Result<CountSpec, E> {
                match word {
                    "once" => Ok(CountSpec::Once),
                    "always" => Ok(CountSpec::Always),
                    other => Err(E::invalid_value(de::Unexpected::Str(other), &self)),
                }
            }
        }
        deserializer.deserialize_any(CountVisitor)
    }
}

/// One step of the script; each `[[step]]` table has exactly one of these keys.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum StepSpec {
    /// Invoke a function through the driver.
    Invoke(InvokeSpec),
    /// Wait for a detached invocation's outcome.
    Await(AwaitSpec),
    /// Let simulated time pass.
    WaitMs(u64),
    /// Wait until the trace holds a matching event.
    WaitUntil(WaitUntilSpec),
    /// Write a durable record directly, as an outside actor would.
    Put(RecordSpec),
    Crash(Spanned<String>),
    Restart(Spanned<String>),
    Partition(Spanned<[String; 2]>),
    Repair(Spanned<[String; 2]>),
    Hold(Spanned<[String; 2]>),
    Release(Spanned<[String; 2]>),
    /// Heal every fault: disarm cuts, repair links, restart crashed hosts.
    Heal(bool),
    /// Pause a harness worker (its work and its lease renewals) for a while.
    Pause(PauseSpec),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PauseSpec {
    pub host: Spanned<String>,
    pub ms: u64,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InvokeSpec {
    pub function: Spanned<String>,
    #[serde(default)]
    pub payload: Value,
    /// The name its outcome is known by in `[expect.rpc]` and `await`.
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default = "default_invoke_timeout_ms")]
    pub timeout_ms: u64,
    /// Go on with the next step without waiting for the outcome.
    #[serde(default)]
    pub detach: bool,
    /// Send it through this queue (an `enqueue` action) instead of directly.
    #[serde(default)]
    pub queue: Option<String>,
}

fn default_invoke_timeout_ms() -> u64 {
    10_000
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AwaitSpec {
    pub name: Spanned<String>,
    #[serde(default = "default_invoke_timeout_ms")]
    pub within_ms: u64,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WaitUntilSpec {
    #[serde(rename = "match")]
    pub conditions: BTreeMap<String, Spanned<toml::Value>>,
    /// Wait for the n-th matching event (from the start of the run), counting from 1.
    #[serde(default = "one")]
    pub nth: Spanned<u64>,
    pub within_ms: u64,
}

fn one() -> Spanned<u64> {
    Spanned::new(0..0, 1)
}

/// Expectations: what the run must show afterwards.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ExpectSpec {
    /// Driver outcomes by name: `{ outcome = "ok", "result.status" = "failed" }`.
    pub rpc: BTreeMap<Spanned<String>, BTreeMap<String, Spanned<toml::Value>>>,
    /// Durable records by `"scope/key"`: field conditions on the value.
    pub state: BTreeMap<String, BTreeMap<String, Spanned<toml::Value>>>,
    /// The actions of a session's current turn, by session id, read through the harness's record
    /// layout: conditions on `{count, done, failed, held, unsettled}`.
    pub actions: BTreeMap<String, BTreeMap<String, Spanned<toml::Value>>>,
    /// Durable records (`"scope/key"`) that must not exist.
    pub absent: Vec<String>,
    /// Calls arriving at the doubles, by function: exact counts.
    pub calls: BTreeMap<Spanned<String>, u64>,
    /// Trace events matching conditions: counts and identical payloads.
    pub events: Vec<Spanned<EventExpectSpec>>,
    /// External effects by kind, counted from the ledger: exact counts, absent kinds zero.
    pub effects: Option<BTreeMap<Spanned<String>, u64>>,
    /// Sessions' transcripts at the end of the run, by session id: every entry, in order, each
    /// with the conditions it must meet.
    pub transcript: BTreeMap<String, Vec<BTreeMap<String, Spanned<toml::Value>>>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EventExpectSpec {
    #[serde(rename = "match")]
    pub conditions: BTreeMap<String, Spanned<toml::Value>>,
    #[serde(default)]
    pub count: Option<u64>,
    #[serde(default)]
    pub count_min: Option<u64>,
    #[serde(default)]
    pub count_max: Option<u64>,
    /// A dotted path whose value must be byte-identical across every matching event.
    #[serde(default)]
    pub same: Option<String>,
    /// Count only events before the outcome of this driver invocation arrived, to check what
    /// had (not) happened at the moment of a mid-run snapshot.
    #[serde(default)]
    pub before_rpc: Option<Spanned<String>>,
    /// When each matching event happened, measured from the latest event before it that meets
    /// other conditions: a redelivery at its visibility deadline, a retry after its backoff.
    #[serde(default)]
    pub after: Option<AfterSpec>,
}

/// `after = { match = { ... }, by_ms = ... }` of an `[[expect.events]]` entry.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AfterSpec {
    #[serde(rename = "match")]
    pub conditions: BTreeMap<String, Spanned<toml::Value>>,
    /// How long after it: a number of milliseconds, or comparisons (`{ ge = 100, lt = 110 }`).
    pub by_ms: Spanned<toml::Value>,
}

/// One policy to run the scenario under.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicySpec {
    /// The oracles this (known-bad) policy must trip; any other violation fails the run. Kept
    /// with its own place, so a list written empty can be pointed at.
    #[serde(default)]
    pub violations: Option<Spanned<Vec<Spanned<String>>>>,
    /// The kinds of the shared `[expect]` this (known-bad) policy must break: at least one
    /// expectation of each fails, every other shared expectation holds.
    #[serde(default)]
    pub breaks: Option<Spanned<Vec<Spanned<String>>>>,
    #[serde(default)]
    pub expect: ExpectSpec,
}
