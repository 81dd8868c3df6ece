//! Capabilities: the parts of the harness contract a harness serves, and what a scenario needs.
//!
//! A harness declares its capabilities ([`crate::HarnessFactory::capabilities`]); what a
//! scenario run needs is derived from its file ([`crate::Scenario::requirements`]). A run that
//! needs a capability its harness lacks is not made: it is reported skipped, with the reason,
//! never passed and never failed. Every harness serves `turns`; the rest are each one promise a
//! harness can keep or not, cut so that a harness serving some of them is judged on every file
//! it can serve and on no other.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

/// One part of the harness contract.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Capability {
    /// `turn`: runs a turn from its durable record (reads it and the session, calls the model,
    /// dispatches tool calls as effects with idempotency keys, finalises, admits queued input,
    /// honours leases when the world grants them). Every harness serves it.
    Turns,
    /// Calls `env.checkpoint` at the named interruption points around each effect
    /// (`before_submission`, `after_acceptance`, `after_completion`), where `[[interrupt]]`
    /// cuts go.
    Checkpoints,
    /// `export` and `import`: hands a session over to another worker (a harness switch).
    Switch,
    /// `send`: takes input for a session whether or not a turn is running.
    Send,
    /// `status`: answers where a session's turn stands.
    Status,
    /// `stop`: a durable stop command.
    Stop,
    /// `cancel`: durable cancellation of a turn and its unresolved effects.
    Cancel,
    /// `pause` and `resume`: parks a turn and claims it back.
    PauseResume,
    /// Consults `pre-trigger` hooks before a tool call (continue, change, hold, deny), and
    /// `resolve` releases a held call.
    Hooks,
    /// Tells the functions bound to `turn-completed` once a turn's terminal state is durable.
    Lifecycle,
    /// `stream`: takes a model reply streamed in frames, and never takes part of it for the
    /// whole.
    Streaming,
    /// `dead-letter`: the handler a queue hands each message it gave up on.
    DeadLetters,
    /// Offers the model the `agent.delegate` tool and runs the child turns it asks for.
    Delegation,
    /// Keeps a turn's budget (`limits`, `used`) with the turn, across retries, crashes,
    /// imports and child turns, and stops at its limits.
    Budgets,
    /// Reads its configuration from the world's configuration service: pins a turn to the
    /// production version when it is created and keeps it across crashes, redeliveries and
    /// imports; consults the safety overlay at each safe point (before every generation and
    /// every tool call), offers the model only what the overlay leaves, and answers a call of a
    /// tool the overlay took away with a structured `tool_unavailable` result.
    Versions,
}

/// The tool a harness with [`Capability::Delegation`] offers the model.
pub const DELEGATE_TOOL: &str = "agent.delegate";

impl Capability {
    pub const ALL: [Capability; 15] = [
        Capability::Turns,
        Capability::Checkpoints,
        Capability::Switch,
        Capability::Send,
        Capability::Status,
        Capability::Stop,
        Capability::Cancel,
        Capability::PauseResume,
        Capability::Hooks,
        Capability::Lifecycle,
        Capability::Streaming,
        Capability::DeadLetters,
        Capability::Delegation,
        Capability::Budgets,
        Capability::Versions,
    ];

    /// The name scenario files, reports and `--capabilities` use.
    pub fn name(self) -> &'static str {
        match self {
            Capability::Turns => "turns",
            Capability::Checkpoints => "checkpoints",
            Capability::Switch => "switch",
            Capability::Send => "send",
            Capability::Status => "status",
            Capability::Stop => "stop",
            Capability::Cancel => "cancel",
            Capability::PauseResume => "pause-resume",
            Capability::Hooks => "hooks",
            Capability::Lifecycle => "lifecycle",
            Capability::Streaming => "streaming",
            Capability::DeadLetters => "dead-letters",
            Capability::Delegation => "delegation",
            Capability::Budgets => "budgets",
            Capability::Versions => "versions",
        }
    }

    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|c| c.name() == name)
    }

    /// The harness functions, by name after `{host}::`, a worker with this capability serves.
    pub fn functions(self) -> &'static [&'static str] {
        match self {
            Capability::Turns => &["turn"],
            Capability::Switch => &["export", "import"],
            Capability::Send => &["send"],
            Capability::Status => &["status"],
            Capability::Stop => &["stop"],
            Capability::Cancel => &["cancel"],
            Capability::PauseResume => &["pause", "resume"],
            Capability::Hooks => &["resolve"],
            Capability::Streaming => &["stream"],
            Capability::DeadLetters => &["dead-letter"],
            Capability::Checkpoints
            | Capability::Lifecycle
            | Capability::Delegation
            | Capability::Budgets
            | Capability::Versions => &[],
        }
    }

    /// The capability a harness function (by name after `{host}::`) belongs to.
    pub fn of_function(function: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|c| c.functions().contains(&function))
    }
}

impl fmt::Display for Capability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The capabilities a harness declares. `turns` is always among them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Capabilities(BTreeSet<Capability>);

impl Default for Capabilities {
    /// `turns` alone.
    fn default() -> Self {
        Self([Capability::Turns].into())
    }
}

impl FromIterator<Capability> for Capabilities {
    fn from_iter<I: IntoIterator<Item = Capability>>(items: I) -> Self {
        let mut set: BTreeSet<Capability> = items.into_iter().collect();
        set.insert(Capability::Turns);
        Self(set)
    }
}

impl Capabilities {
    /// The whole contract.
    pub fn all() -> Self {
        Capability::ALL.into_iter().collect()
    }

    pub fn contains(&self, capability: Capability) -> bool {
        self.0.contains(&capability)
    }

    pub fn iter(&self) -> impl Iterator<Item = Capability> + '_ {
        self.0.iter().copied()
    }

    /// The harness functions these capabilities serve, by name after `{host}::`.
    pub fn functions(&self) -> Vec<String> {
        self.iter().flat_map(|c| c.functions().iter().map(|f| f.to_string())).collect()
    }

    /// A comma-separated list of names (`switch,send`); `turns` is implied. Unknown names are
    /// an error naming the known ones.
    pub fn parse(list: &str) -> Result<Self, String> {
        list.split(',')
            .map(str::trim)
            .filter(|name| !name.is_empty())
            .map(|name| {
                Capability::from_name(name).ok_or_else(|| {
                    let known: Vec<&str> = Capability::ALL.iter().map(|c| c.name()).collect();
                    format!("unknown capability `{name}`, expected one of {}", known.join(", "))
                })
            })
            .collect()
    }

    /// The names, comma-separated.
    pub fn names(&self) -> String {
        self.iter().map(Capability::name).collect::<Vec<_>>().join(",")
    }
}

/// What one scenario run needs of its harness, each capability with the first place in the
/// file that asks for it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Requirements(BTreeMap<Capability, String>);

impl Requirements {
    /// Records that `capability` is needed, because of `why` (kept only the first time).
    pub fn need(&mut self, capability: Capability, why: impl FnOnce() -> String) {
        self.0.entry(capability).or_insert_with(why);
    }

    /// Each capability needed, with why.
    pub fn iter(&self) -> impl Iterator<Item = (Capability, &str)> {
        self.0.iter().map(|(c, why)| (*c, why.as_str()))
    }

    /// What `harness` (declaring `declared`) lacks of these; `None` when it has everything.
    pub fn unmet(&self, harness: &str, declared: &Capabilities) -> Option<Skip> {
        let missing: Vec<(Capability, String)> =
            self.iter().filter(|(c, _)| !declared.contains(*c)).map(|(c, why)| (c, why.to_string())).collect();
        (!missing.is_empty()).then(|| Skip { harness: harness.to_string(), missing, cannot: Vec::new() })
    }
}

/// A run not made: its scenario needs capabilities its harness does not declare, or something
/// the way it would be run cannot do (live mode cannot stop a process at a point in its code).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skip {
    pub harness: String,
    /// Each capability lacking, with the place in the file that asks for it.
    pub missing: Vec<(Capability, String)>,
    /// What the mode of the run (`live`) cannot do of the file, each in a sentence.
    pub cannot: Vec<String>,
}

impl Skip {
    /// A run `harness` is not given because live mode cannot do what the file asks: `reasons`.
    pub fn not_live(harness: &str, reasons: Vec<String>) -> Self {
        Self { harness: harness.to_string(), missing: Vec::new(), cannot: reasons }
    }

    /// What is lacking, without naming the harness (`needs switch (...)`), for a list of one
    /// harness's skips.
    pub fn without_harness(&self) -> String {
        let text = self.to_string();
        let named = format!(", and harness `{}` does not declare ", self.harness);
        match text.split_once(&named) {
            // After the name comes `it` or `them`, then maybe what live mode cannot do.
            Some((needs, rest)) => match rest.split_once(';') {
                Some((_, live)) => format!("{needs};{live}"),
                None => needs.to_string(),
            },
            None => text,
        }
    }

    /// The names of the capabilities lacking.
    pub fn capabilities(&self) -> Vec<&'static str> {
        self.missing.iter().map(|(c, _)| c.name()).collect()
    }
}

impl fmt::Display for Skip {
    /// `needs switch (step #3: invoke.function = "replacement::import"), which harness `naive`
    /// does not declare`; `cannot run live: ...`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if !self.missing.is_empty() {
            let needs: Vec<String> = self.missing.iter().map(|(c, why)| format!("{c} ({why})")).collect();
            let it = if self.missing.len() == 1 { "it" } else { "them" };
            write!(f, "needs {}, and harness `{}` does not declare {it}", needs.join(", "), self.harness)?;
        }
        if !self.cannot.is_empty() {
            let and = if self.missing.is_empty() { "" } else { "; and " };
            write!(f, "{and}cannot run live: {}", self.cannot.join("; "))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_harness_function_belongs_to_exactly_one_capability() {
        for function in crate::topology::HARNESS_FUNCTIONS {
            let owners: Vec<_> = Capability::ALL.into_iter().filter(|c| c.functions().contains(&function)).collect();
            assert_eq!(owners.len(), 1, "`{function}` belongs to {owners:?}");
        }
        let served: usize = Capability::ALL.iter().map(|c| c.functions().len()).sum();
        assert_eq!(
            served,
            crate::topology::HARNESS_FUNCTIONS.len(),
            "no capability serves a function outside the vocabulary"
        );
    }

    #[test]
    fn names_round_trip_and_turns_is_always_declared() {
        for capability in Capability::ALL {
            assert_eq!(Capability::from_name(capability.name()), Some(capability));
        }
        let parsed = Capabilities::parse("switch, send").unwrap();
        assert_eq!(parsed.names(), "turns,switch,send");
        assert!(Capabilities::parse("switch,teleport").unwrap_err().contains("unknown capability `teleport`"));
        assert!(Capabilities::default().contains(Capability::Turns));
    }

    #[test]
    fn a_requirement_the_harness_lacks_is_a_skip_naming_it_and_why() {
        let mut needs = Requirements::default();
        needs.need(Capability::Switch, || "step #2: invoke.function = \"replacement::import\"".into());
        needs.need(Capability::Switch, || "a later place is not kept".into());
        needs.need(Capability::Turns, || "step #1".into());
        assert_eq!(needs.unmet("reference", &Capabilities::all()), None);
        let skip = needs.unmet("naive", &Capabilities::default()).expect("switch is lacking");
        assert_eq!(skip.capabilities(), vec!["switch"]);
        assert_eq!(
            skip.to_string(),
            "needs switch (step #2: invoke.function = \"replacement::import\"), and harness `naive` does not declare it"
        );
    }
}
