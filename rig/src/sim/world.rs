//! The state a run shares across its hosts and its runner: the clock, the trace, the cuts, the
//! doubles (durable, so they outlive any host crash) and the seeded streams.

use super::clock::Clock;
use super::streams::component_stream;
use crate::bus::{BusObserver, Frame, FrameDirection};
use crate::cut::{Count, CutTable};
use crate::harness::{Interrupt, ProcessControl};
use crate::queue::Queues;
use crate::scenario::InterruptRule;
use crate::trace::{Event, EventKind, Trace};
use doubles::{Double, Observation, ScriptedModel, SessionService, StateStore, TicketService};
use proxy::SharedRules;
use rand_chacha::ChaCha8Rng;
use serde_json::Value;
use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::rc::Rc;

/// A double as the world holds it: shared, because it outlives every host that serves it.
pub type SharedDouble = Rc<RefCell<dyn Double>>;

/// Everything one run shares.
pub struct World {
    pub seed: u64,
    pub clock: Rc<Clock>,
    trace: RefCell<Trace>,
    activity: Cell<u64>,
    pub cuts: RefCell<CutTable>,
    pub store: Rc<RefCell<StateStore>>,
    pub session: Rc<RefCell<SessionService>>,
    pub model: Rc<RefCell<ScriptedModel>>,
    streams: RefCell<BTreeMap<String, Rc<RefCell<ChaCha8Rng>>>>,
    /// Outcomes of the driver's invocations, by the name the scenario gave them.
    pub rpc: RefCell<BTreeMap<String, Value>>,
    /// The queues' durable state (empty when the world has no queue worker).
    pub queues: RefCell<Queues>,
    /// The drop-proxy's rules, shared by all its connections and kept across its restarts.
    pub proxy_rules: RefCell<Option<SharedRules>>,
    /// The ticket service, when the world has one.
    pub tickets: Option<Rc<RefCell<TicketService>>>,
    interrupts: RefCell<Vec<ArmedInterrupt>>,
    paused: RefCell<BTreeMap<String, u64>>,
}

struct ArmedInterrupt {
    rule: InterruptRule,
    arrivals: u64,
    fired: u64,
}

impl World {
    pub fn new(
        seed: u64,
        cuts: CutTable,
        doubles: (StateStore, SessionService, ScriptedModel, Option<TicketService>),
        interrupts: Vec<InterruptRule>,
    ) -> Rc<Self> {
        let (store, session, model, tickets) = doubles;
        Rc::new(Self {
            seed,
            clock: Clock::new(),
            trace: RefCell::default(),
            activity: Cell::new(0),
            cuts: RefCell::new(cuts),
            store: Rc::new(RefCell::new(store)),
            session: Rc::new(RefCell::new(session)),
            model: Rc::new(RefCell::new(model)),
            streams: RefCell::default(),
            rpc: RefCell::default(),
            queues: RefCell::default(),
            proxy_rules: RefCell::default(),
            tickets: tickets.map(|t| Rc::new(RefCell::new(t))),
            interrupts: RefCell::new(
                interrupts.into_iter().map(|rule| ArmedInterrupt { rule, arrivals: 0, fired: 0 }).collect(),
            ),
            paused: RefCell::default(),
        })
    }

    /// The doubles by the host that serves them.
    pub fn services(&self) -> Vec<(&'static str, SharedDouble)> {
        let mut services = vec![
            ("store", self.store.clone() as SharedDouble),
            ("session", self.session.clone() as SharedDouble),
            ("model", self.model.clone() as SharedDouble),
        ];
        if let Some(tickets) = &self.tickets {
            services.push(("tickets", tickets.clone() as SharedDouble));
        }
        services
    }

    /// Disarms every interrupt and ends every pause: part of healing the world.
    pub fn heal_processes(&self) {
        self.interrupts.borrow_mut().iter_mut().for_each(|armed| armed.rule.count = Count::Times(0));
        self.paused.borrow_mut().clear();
    }

    /// Appends an event stamped with the current simulated time.
    pub fn record(&self, host: &str, kind: EventKind) {
        let event = Event { at_ms: self.clock.now_ms(), host: host.to_string(), kind };
        // Live output for whoever runs with RUST_LOG=rig::trace=debug; the trace is the record.
        if tracing::enabled!(target: "rig::trace", tracing::Level::DEBUG) {
            tracing::debug!(target: "rig::trace", seed = self.seed, "{}", crate::report::render_event(&event));
        }
        self.trace.borrow_mut().push(event);
        self.activity.set(self.activity.get() + 1);
    }

    pub fn note_event(&self, host: &str, what: &str, detail: Value) {
        self.record(host, EventKind::Note { what: what.to_string(), detail });
    }

    /// Records what a double observed while handling a call.
    pub fn record_observations(&self, host: &str, observed: Vec<Observation>) {
        for observation in observed {
            match observation {
                Observation::Commit { scope, key, value, version } => {
                    self.record(host, EventKind::Commit { scope, key, value: value.unwrap_or(Value::Null), version });
                }
                Observation::Lease { scope, key, owner, token, expires_at_ms } => {
                    let domain = format!("{scope}/{key}");
                    // Effect services consult the ownership record: a new grant raises their bar.
                    if let Some(tickets) = &self.tickets {
                        tickets.borrow_mut().observe_token(&domain, token);
                    }
                    self.record(host, EventKind::Lease { domain, owner, token, expires_at_ms })
                }
                Observation::Fenced { scope, key, domain, token, accepted } => {
                    self.record(host, EventKind::Fenced { scope, key, domain, token, accepted })
                }
                Observation::Effect(effect) => self.record(
                    host,
                    EventKind::Effect {
                        effect: effect.kind,
                        action: effect.action_id,
                        idempotency_key: effect.idempotency_key,
                        token: effect.fencing_token,
                        domain: effect.fencing_domain,
                        accepted: effect.accepted,
                        reason: effect.reason,
                    },
                ),
            }
        }
    }

    /// A counter that moves whenever anything observable happens; the runner uses it to tell
    /// a quiescent world from a busy one.
    pub fn activity(&self) -> u64 {
        self.activity.get()
    }

    /// The seeded stream of a component; it persists across the component's restarts so that
    /// ids drawn before and after a crash never collide.
    pub fn stream(&self, component: &str) -> Rc<RefCell<ChaCha8Rng>> {
        let seed = self.seed;
        Rc::clone(
            self.streams
                .borrow_mut()
                .entry(component.to_string())
                .or_insert_with(|| Rc::new(RefCell::new(component_stream(seed, component)))),
        )
    }

    pub fn trace(&self) -> std::cell::Ref<'_, Trace> {
        self.trace.borrow()
    }

    pub fn take_trace(&self) -> Trace {
        std::mem::take(&mut *self.trace.borrow_mut())
    }
}

impl BusObserver for World {
    fn frame(&self, direction: FrameDirection, peer: &str, frame: &Frame) {
        let direction = match direction {
            FrameDirection::In => "in",
            FrameDirection::Out => "out",
        };
        self.record(
            "engine",
            EventKind::Frame {
                direction,
                peer: peer.to_string(),
                frame: frame.kind(),
                function_id: frame.function_id().map(str::to_string),
                invocation_id: frame.invocation_id().map(str::to_string),
            },
        );
    }

    fn note(&self, host: &str, what: &str, detail: Value) {
        self.note_event(host, what, detail);
    }
}

impl ProcessControl for World {
    fn interrupt(&self, worker: &str, point: &str) -> Option<Interrupt> {
        let mut interrupts = self.interrupts.borrow_mut();
        for armed in interrupts.iter_mut().filter(|a| a.rule.worker == worker && a.rule.point == point) {
            armed.arrivals += 1;
            let allowed = match armed.rule.count {
                Count::Times(n) => armed.fired < n,
                Count::Always => true,
            };
            if armed.arrivals > armed.rule.skip && allowed {
                armed.fired += 1;
                return Some(armed.rule.interrupt);
            }
        }
        None
    }

    fn paused_until(&self, worker: &str) -> Option<u64> {
        self.paused.borrow().get(worker).copied()
    }

    fn pause(&self, worker: &str, until_ms: u64) {
        self.record(
            "rig",
            EventKind::Control { action: "pause".into(), target: format!("{worker} until {until_ms} ms") },
        );
        let mut paused = self.paused.borrow_mut();
        let until = paused.entry(worker.to_string()).or_insert(until_ms);
        *until = (*until).max(until_ms);
    }
}
