//! The doubles a world is made of: the one place that knows each service's host, its functions,
//! the effects it produces, how an action is reconciled with it, and the tools it offers a
//! harness. Validation, the wiring of a run, the harness's tool table and the oracles all read
//! it from here.
//!
//! Adding a double takes its state machine in `doubles/` (and its export there), and an entry
//! here; a double with settings of its own also gets a key in the scenario file's `[world]`. An
//! effect service needs no code at all: a scenario declares it (`[world.service.NAME]`).

use crate::harness::Tool;
use crate::topology::{CONFIG, MODEL, SESSION, STORE, TICKETS};
use doubles::{
    reconcile_functions, ConfigService, ConfigSettings, Double, EffectService, Replay, ScriptedModel, ServiceConfig,
    SessionService, StateStore, TicketConfig, TicketService,
};
use serde_json::{json, Value};
use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::rc::Rc;

/// A double as a world holds it: shared, because it outlives every host that serves it.
pub type SharedDouble = Rc<RefCell<dyn Double>>;

/// The optional services of a world, with their settings. The store, the session service and
/// the model are always there.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Services {
    /// The ticket service, an external effect service with a ledger.
    pub tickets: Option<TicketConfig>,
    /// The services the scenario declared, by name (each its own host).
    pub declared: BTreeMap<String, ServiceConfig>,
    /// Versioned configuration and its safety overlay (the `config` host).
    pub config: Option<ConfigSettings>,
}

/// How the oracles recognise effects and reconciliations on the wire.
#[derive(Debug, Clone, Default)]
pub struct EffectFunctions {
    /// Functions whose calls request an external effect (one ledger line each).
    pub effects: BTreeSet<String>,
    /// Functions that ask a service whether an action happened, with the payload field naming
    /// the action (its idempotency key or client reference).
    pub reconciliations: Vec<(String, &'static str)>,
    /// The effect kinds whose service declares its calls safe to replay (`replay = "safe"`):
    /// sending one again needs no question first.
    pub replay_safe: BTreeSet<String>,
}

fn names(functions: &[&str]) -> Vec<String> {
    functions.iter().map(|f| f.to_string()).collect()
}

/// The ticket service's namespace (`ticket::create`, `ticket::status`, ...).
const TICKET_SERVICE: &str = "ticket";

impl Services {
    /// Every service host of the world with the functions it serves.
    pub fn hosts(&self) -> Vec<(String, Vec<String>)> {
        let mut hosts = vec![
            (STORE.to_string(), names(StateStore::FUNCTIONS)),
            (SESSION.to_string(), names(SessionService::FUNCTIONS)),
            (MODEL.to_string(), names(ScriptedModel::FUNCTIONS)),
        ];
        if self.tickets.is_some() {
            hosts.push((TICKETS.to_string(), names(TicketService::FUNCTIONS)));
        }
        hosts.extend(self.declared.iter().map(|(name, config)| (name.clone(), config.functions(name))));
        if self.config.is_some() {
            hosts.push((CONFIG.to_string(), names(ConfigService::FUNCTIONS)));
        }
        hosts
    }

    /// The host serving each tool of this world, by tool name: what a withdrawal takes away.
    pub fn tool_hosts(&self) -> BTreeMap<String, String> {
        let mut hosts = BTreeMap::new();
        if self.tickets.is_some() {
            for tool in ["ticket.create", "ticket.lookup"] {
                hosts.insert(tool.to_string(), TICKETS.to_string());
            }
        }
        for (name, config) in &self.declared {
            if let Some(tool) = config.effect_kind(name) {
                hosts.insert(tool, name.clone());
            }
        }
        hosts
    }

    /// The kinds of external effect this world's services can produce.
    pub fn effect_kinds(&self) -> BTreeSet<String> {
        let tickets = self.tickets.iter().map(|_| TicketService::EFFECT_KIND.to_string());
        tickets.chain(self.declared.iter().filter_map(|(name, config)| config.effect_kind(name))).collect()
    }

    /// The answer each plain function of the declared services always gives, by function id.
    pub fn plain_replies(&self) -> BTreeMap<String, Value> {
        let declared = self.declared.iter();
        declared
            .flat_map(|(name, config)| {
                config.functions.iter().map(move |(f, reply)| (format!("{name}::{f}"), reply.clone()))
            })
            .collect()
    }

    /// The effect and reconciliation functions of this world's services.
    pub fn effect_functions(&self) -> EffectFunctions {
        let mut functions = EffectFunctions::default();
        if self.tickets.is_some() {
            functions.effects.insert(TicketService::EFFECT_FUNCTION.to_string());
            functions
                .reconciliations
                .extend(TicketService::RECONCILE_FUNCTIONS.map(|(f, field)| (f.to_string(), field)));
        }
        for (name, config) in &self.declared {
            if let Some(effect) = config.effect_function(name) {
                functions.effects.insert(effect);
                functions.reconciliations.extend(reconcile_functions(name));
                if config.replay == Replay::Safe {
                    functions.replay_safe.extend(config.effect_kind(name));
                }
            }
        }
        functions
    }

    /// The tools a harness in this world may dispatch: what each service documents.
    pub fn tools(&self) -> Vec<Tool> {
        let mut tools = Vec::new();
        if let Some(tickets) = &self.tickets {
            let ticket_tool = |name: &str, description: &str, replay_safe| Tool {
                name: name.replace("::", "."),
                function: name.to_string(),
                description: description.to_string(),
                parameters: json!({ "type": "object", "properties": { "title": { "type": "string" } } }),
                replay_safe,
                service: TICKET_SERVICE.to_string(),
                idempotency: tickets.idempotency,
                idempotency_window_ms: tickets.idempotency_window_ms,
                lookup: tickets.lookup,
            };
            tools.push(ticket_tool(TicketService::EFFECT_FUNCTION, "Open a ticket.", false));
            tools.push(ticket_tool("ticket::lookup", "Look up the ticket opened for this call.", true));
        }
        for (name, config) in &self.declared {
            let (Some(tool), Some(function)) = (config.effect_kind(name), config.effect_function(name)) else {
                continue;
            };
            tools.push(Tool {
                name: tool,
                function,
                description: config.description.clone(),
                parameters: config.parameters.clone(),
                replay_safe: config.replay == Replay::Safe,
                service: name.clone(),
                idempotency: config.idempotency,
                idempotency_window_ms: config.idempotency_window_ms,
                lookup: config.lookup,
            });
        }
        tools
    }

    /// Builds the doubles, by host: the store, session and model given, the rest from settings.
    pub fn build(
        &self,
        store: Rc<RefCell<StateStore>>,
        session: Rc<RefCell<SessionService>>,
        model: ScriptedModel,
    ) -> Vec<(String, SharedDouble)> {
        let mut doubles: Vec<(String, SharedDouble)> = vec![
            (STORE.into(), store as SharedDouble),
            (SESSION.into(), session as SharedDouble),
            (MODEL.into(), Rc::new(RefCell::new(model))),
        ];
        if let Some(tickets) = &self.tickets {
            doubles.push((TICKETS.into(), Rc::new(RefCell::new(TicketService::new(tickets.clone())))));
        }
        for (name, config) in &self.declared {
            doubles.push((name.clone(), Rc::new(RefCell::new(EffectService::new(name, config.clone())))));
        }
        if let Some(settings) = &self.config {
            let config = ConfigService::new(settings.clone(), self.tool_hosts());
            doubles.push((CONFIG.into(), Rc::new(RefCell::new(config))));
        }
        doubles
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The doubles a world is built of answer, through their trait, to the hosts and functions
    /// the world wires them to: what validation and the trace name is what serves the calls.
    #[test]
    fn each_double_built_names_its_host_and_serves_its_functions() {
        let declared = ServiceConfig { effect: Some("record".into()), ..ServiceConfig::default() };
        let services = Services {
            tickets: Some(TicketConfig::default()),
            declared: [("recorder".to_string(), declared)].into(),
            config: Some(doubles::ConfigSettings { production: "v1".into(), versions: Default::default() }),
        };
        let built = services.build(Rc::default(), Rc::default(), ScriptedModel::new([]));
        let answered: Vec<(String, Vec<String>)> = built
            .iter()
            .map(|(host, double)| {
                let double = double.borrow();
                assert_eq!(double.name(), host, "the double built for host `{host}`");
                (host.clone(), double.functions())
            })
            .collect();
        assert_eq!(answered, services.hosts());
    }
}
