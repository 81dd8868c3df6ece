//! The doubles a world is made of: the one place that knows each service's host, its functions,
//! the effects it produces and how an action is reconciled with it. Validation, the wiring of a
//! run and the oracles all read it from here.
//!
//! Adding a double takes its state machine in `doubles/` (and its export there), and an entry
//! here; a double with settings of its own also gets a key in the scenario file's `[world]`.

use crate::topology::{MODEL, SESSION, STORE, TICKETS};
use doubles::{Double, ScriptedModel, SessionService, StateStore, TicketConfig, TicketService};
use std::cell::RefCell;
use std::collections::BTreeSet;
use std::rc::Rc;

/// A double as a world holds it: shared, because it outlives every host that serves it.
pub type SharedDouble = Rc<RefCell<dyn Double>>;

/// The optional services of a world, with their settings. The store, the session service and
/// the model are always there.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Services {
    /// The ticket service, an external effect service with a ledger.
    pub tickets: Option<TicketConfig>,
}

/// How the oracles recognise effects and reconciliations on the wire.
#[derive(Debug, Clone, Default)]
pub struct EffectFunctions {
    /// Functions whose calls request an external effect (one ledger line each).
    pub effects: BTreeSet<&'static str>,
    /// Functions that ask a service whether an action happened, with the payload field naming
    /// the action (its idempotency key or client reference).
    pub reconciliations: Vec<(&'static str, &'static str)>,
}

fn names(functions: &[&str]) -> Vec<String> {
    functions.iter().map(|f| f.to_string()).collect()
}

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
        hosts
    }

    /// The kinds of external effect this world's services can produce.
    pub fn effect_kinds(&self) -> BTreeSet<&'static str> {
        self.tickets.iter().map(|_| TicketService::EFFECT_KIND).collect()
    }

    /// The effect and reconciliation functions of this world's services.
    pub fn effect_functions(&self) -> EffectFunctions {
        let mut functions = EffectFunctions::default();
        if self.tickets.is_some() {
            functions.effects.insert(TicketService::EFFECT_FUNCTION);
            functions.reconciliations.extend(TicketService::RECONCILE_FUNCTIONS);
        }
        functions
    }

    /// Builds the doubles, by host: the store, session and model given, the rest from settings.
    pub fn build(
        &self,
        store: Rc<RefCell<StateStore>>,
        session: SessionService,
        model: ScriptedModel,
    ) -> Vec<(String, SharedDouble)> {
        let mut doubles: Vec<(String, SharedDouble)> = vec![
            (STORE.into(), store as SharedDouble),
            (SESSION.into(), Rc::new(RefCell::new(session))),
            (MODEL.into(), Rc::new(RefCell::new(model))),
        ];
        if let Some(tickets) = &self.tickets {
            doubles.push((TICKETS.into(), Rc::new(RefCell::new(TicketService::new(tickets.clone())))));
        }
        doubles
    }
}
