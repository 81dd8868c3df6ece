//! Test doubles for the rig: the services a harness depends on.
//!
//! Each double is a plain state machine behind the [`Double`] trait: it takes one call and
//! returns a reply plus what it observed (commits, effects, lease grants, fenced writes). It
//! owns no clock, socket or task, so the rig can host it on a simulated network and apply cuts
//! around it, and a live mode can host the same logic on real sockets.

mod config;
mod effect;
mod model;
mod service;
mod session;
mod store;
mod ticket;

pub use config::{ConfigService, ConfigSettings, ConfigVersion};
pub use effect::{reconcile_functions, Effect, EffectService, Guarantees, Replay, ServiceConfig};
pub use model::{Generation, RequestCheck, ScriptedModel, ScriptedReply};
pub use service::{Call, Double, EffectRecord, Kept, Observation, ServiceError};
pub use session::SessionService;
pub use store::{LeaseView, StateStore};
pub use ticket::{Ticket, TicketConfig, TicketService};
