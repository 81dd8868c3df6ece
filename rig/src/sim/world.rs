//! The state a run shares across its hosts and its runner: the clock, the trace, the cuts, the
//! doubles (durable, so they outlive any host crash), the network links and the seeded streams.

use crate::bus::{BusObserver, Frame, FrameDirection};
use crate::clock::Clock;
use crate::cut::{CutTable, Interrupt, ProcessCutTable};
use crate::harness::ProcessControl;
use crate::oracle::Reply;
use crate::queue::Queues;
use crate::services::SharedDouble;
use crate::streams::component_stream;
use crate::trace::{EffectEvent, Event, EventKind, Label, Trace};
use doubles::{Observation, SessionService, StateStore};
use proxy::SharedRules;
use rand_chacha::ChaCha8Rng;
use serde_json::Value;
use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::rc::{Rc, Weak};
use tokio::sync::Notify;

/// How many invocation ids the world remembers the caller of; older ones are forgotten first.
const CALLERS_MAX: usize = 65_536;
/// How many replies of harness workers to callers other than the driver the world keeps for the
/// oracles; later ones are counted, not kept.
const REPLIES_MAX: usize = 65_536;

/// Everything one run shares.
pub struct World {
    pub seed: u64,
    pub clock: Rc<Clock>,
    trace: RefCell<Trace>,
    activity: Cell<u64>,
    /// Told of every event, for a runner that waits on the world in real time (live mode).
    watcher: RefCell<Option<Rc<Notify>>>,
    pub cuts: RefCell<CutTable>,
    pub process_cuts: RefCell<ProcessCutTable>,
    paused: RefCell<BTreeMap<String, u64>>,
    pub store: Rc<RefCell<StateStore>>,
    /// The session service, whose transcripts oracles and expectations read.
    pub session: Rc<RefCell<SessionService>>,
    /// Every double by the host that serves it, the store included.
    services: Vec<(String, SharedDouble)>,
    streams: RefCell<BTreeMap<String, Rc<RefCell<ChaCha8Rng>>>>,
    /// Outcomes of the driver's invocations, by the name the scenario gave them.
    pub rpc: RefCell<BTreeMap<String, Value>>,
    /// The queues' durable state (empty when the world has no queue worker).
    pub queues: Rc<RefCell<Queues>>,
    /// The drop-proxy's rules, shared by all its connections and kept across its restarts.
    pub proxy_rules: RefCell<Option<SharedRules>>,
    links: RefCell<Links>,
    callers: RefCell<Callers>,
    /// Hosts a cut asked to crash and restart; the runner does it after the current step.
    bounces: RefCell<Vec<String>>,
    /// Workers a cut asked to cut off from the engine, with when their link is repaired; the
    /// runner does it after the current step.
    isolations: RefCell<Vec<(String, u64)>>,
    /// How often each worker reached each named interruption point: where process cuts can go.
    arrivals: RefCell<BTreeMap<(String, String), u64>>,
    /// What workers other than the doubles answered to callers other than the driver (a queue,
    /// another worker), as the engine received it: `truthful-reply` judges every reply about a
    /// turn, whoever gets it. The driver's own are in the trace already.
    replies: RefCell<Vec<Reply>>,
    replies_dropped: Cell<u64>,
    /// The engine's name, which every frame event carries: made once a run, not once a frame.
    engine: Label,
    /// The function the last frame event named. A call and its result each go in and then out
    /// of the engine under one function id: the event going out shares the label of the one
    /// that came in rather than copying the name again.
    last_function: RefCell<Option<Label>>,
    /// The invocation id the last frame event with one named, shared the same way: a call and
    /// its result go in and out under one id (about two frames in three repeat the one before),
    /// and the engine's note of the call's sender shares it too.
    last_invocation: RefCell<Option<Label>>,
}

/// The live connections between hosts, and which links are cut.
#[derive(Default)]
struct Links {
    cut: BTreeSet<(String, String)>,
    open: Vec<((String, String), Weak<Notify>)>,
}

/// Who sent each invocation, as the engine saw it arrive.
#[derive(Default)]
struct Callers {
    /// The id is shared with `order` and with the trace's frame events (one copy of it).
    by_invocation: BTreeMap<Label, Label>,
    order: VecDeque<Label>,
}

/// A link's two ends in a fixed order, so `(a, b)` and `(b, a)` are one link.
fn pair(a: &str, b: &str) -> (String, String) {
    // (The planted bug: a link is the pair as named, so a cut named one way round is not seen
    // the other way.)
    if a <= b || crate::planted!("link-cut-seen-one-way-round") {
        (a.to_string(), b.to_string())
    } else {
        (b.to_string(), a.to_string())
    }
}

impl World {
    pub fn new(
        seed: u64,
        store: Rc<RefCell<StateStore>>,
        session: Rc<RefCell<SessionService>>,
        services: Vec<(String, SharedDouble)>,
        cuts: CutTable,
        process_cuts: ProcessCutTable,
    ) -> Rc<Self> {
        Rc::new(Self {
            seed,
            clock: Clock::new(),
            trace: RefCell::default(),
            activity: Cell::new(0),
            watcher: RefCell::default(),
            cuts: RefCell::new(cuts),
            process_cuts: RefCell::new(process_cuts),
            paused: RefCell::default(),
            store,
            session,
            services,
            streams: RefCell::default(),
            rpc: RefCell::default(),
            queues: Rc::default(),
            proxy_rules: RefCell::default(),
            links: RefCell::default(),
            callers: RefCell::default(),
            bounces: RefCell::default(),
            isolations: RefCell::default(),
            arrivals: RefCell::default(),
            replies: RefCell::default(),
            replies_dropped: Cell::new(0),
            engine: Label::from(crate::topology::ENGINE),
            last_function: RefCell::default(),
            last_invocation: RefCell::default(),
        })
    }

    /// The doubles by the host that serves them.
    pub fn services(&self) -> &[(String, SharedDouble)] {
        &self.services
    }

    /// What the doubles' scripts left unused at this point, one line each.
    pub fn unused_script(&self) -> Vec<String> {
        self.services.iter().flat_map(|(_, double)| double.borrow().unused()).collect()
    }

    /// The generations the model answered so far, in order.
    pub fn generations(&self) -> Vec<doubles::Generation> {
        self.services.iter().flat_map(|(_, double)| double.borrow().generations()).collect()
    }

    /// The hosts paused past `now_ms`, with when each pause ends.
    pub fn pauses_after(&self, now_ms: u64) -> Vec<(String, u64)> {
        self.paused.borrow().iter().filter(|(_, until)| **until > now_ms).map(|(h, u)| (h.clone(), *u)).collect()
    }

    /// Whether any host has a pause on record (over or not).
    pub fn has_pauses(&self) -> bool {
        !self.paused.borrow().is_empty()
    }

    /// Ends `host`'s pause: its process died or was restarted, and a new one is not paused.
    pub fn end_pause(&self, host: &str) {
        self.paused.borrow_mut().remove(host);
    }

    /// Heals what the world itself holds: disarms the service and process cuts, ends every
    /// pause, resets the proxy's rules, and repairs every link.
    pub fn heal_faults(&self) {
        self.cuts.borrow_mut().heal();
        self.process_cuts.borrow_mut().heal();
        self.paused.borrow_mut().clear();
        if let Some(rules) = self.proxy_rules.borrow().as_ref() {
            rules.borrow_mut().reset();
        }
        self.mend_all();
    }

    /// Records that the runner changed the world (`crash`, `partition` ...) of `target`.
    pub fn record_control(&self, action: &str, target: &str) {
        self.record("rig", EventKind::Control { action: action.into(), target: target.into() });
    }

    /// Appends an event stamped with the current simulated time.
    pub fn record(&self, host: &str, kind: EventKind) {
        self.record_on(Label::from(host), kind);
    }

    /// [`Self::record`], for a host whose name the caller holds as a label already.
    pub fn record_on(&self, host: Label, kind: EventKind) {
        let event = Event { at_ms: self.clock.now_ms(), host, kind };
        // Live output for whoever runs with RUST_LOG=rig::trace=debug; the trace is the record.
        if tracing::enabled!(target: "rig::trace", tracing::Level::DEBUG) {
            tracing::debug!(target: "rig::trace", "{}", event.render());
        }
        self.trace.borrow_mut().push(event);
        self.activity.set(self.activity.get() + 1);
        if let Some(watcher) = self.watcher.borrow().as_ref() {
            watcher.notify_one();
        }
    }

    /// What is notified of every event from now on: a runner in real time looks at the world
    /// as soon as something happened, not a moment later (a crash after an event, say, lands
    /// before the harness process can do more).
    pub fn watch(&self) -> Rc<Notify> {
        Rc::clone(self.watcher.borrow_mut().get_or_insert_with(Rc::default))
    }

    pub fn note_event(&self, host: &str, what: &str, detail: Value) {
        self.record(host, EventKind::Note { what: what.to_string(), detail });
    }

    /// Records what a double observed while handling a call from `caller`.
    pub fn record_observations(
        &self,
        host: &Label,
        caller: Option<&str>,
        invocation_id: &str,
        observed: Vec<Observation>,
    ) {
        for observation in observed {
            match observation {
                Observation::Commit { scope, key, value, version } => {
                    let value = value.unwrap_or_else(|| Value::Null.into());
                    self.record_on(host.clone(), EventKind::Commit { scope, key, value, version });
                }
                Observation::Lease { scope, key, owner, token, expires_at_ms } => {
                    let domain = format!("{scope}/{key}");
                    // Effect services consult the ownership record: a new grant raises their bar.
                    for (_, double) in &self.services {
                        if let Ok(mut double) = double.try_borrow_mut() {
                            double.observe_grant(&domain, token);
                        }
                    }
                    self.record_on(host.clone(), EventKind::Lease { domain, owner, token, expires_at_ms })
                }
                Observation::Fenced { scope, key, domain, token, accepted } => {
                    self.record_on(host.clone(), EventKind::Fenced { scope, key, domain, token, accepted })
                }
                Observation::Note { what, detail } => self.record_on(host.clone(), EventKind::Note { what, detail }),
                Observation::Effect(effect) => self.record_on(
                    host.clone(),
                    EventKind::Effect(Box::new(EffectEvent {
                        effect: effect.kind,
                        action: effect.action_id,
                        idempotency_key: effect.idempotency_key,
                        token: effect.fencing_token,
                        domain: effect.fencing_domain,
                        accepted: effect.accepted,
                        reason: effect.reason,
                        by: caller.map(str::to_string),
                        invocation_id: Some(invocation_id.to_string()).filter(|id| !id.is_empty()),
                    })),
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
        let mut streams = self.streams.borrow_mut();
        // Looked up before a key is made: most asks find the stream made already.
        if let Some(stream) = streams.get(component) {
            return Rc::clone(stream);
        }
        let stream = Rc::new(RefCell::new(component_stream(self.seed, component)));
        streams.insert(component.to_string(), Rc::clone(&stream));
        stream
    }

    /// Keeps no trace digest from now on: a run whose hash nothing reads (an uncut run) saves
    /// writing every event out for it. Before the first event, or the hash is of none of them.
    pub fn trace_unhashed(&self) {
        let mut trace = self.trace.borrow_mut();
        debug_assert!(trace.events().is_empty(), "a trace unhashed after its first event");
        *trace = Trace::unhashed();
    }

    pub fn trace(&self) -> std::cell::Ref<'_, Trace> {
        self.trace.borrow()
    }

    pub fn take_trace(&self) -> Trace {
        std::mem::take(&mut *self.trace.borrow_mut())
    }

    /// A connection between `a` and `b` opened: the returned signal fires when the link between
    /// them is cut, at once if it already is. Both ends of every connection watch it, so a cut
    /// drops the connection on both sides, as a real partition eventually does, instead of
    /// leaving it half alive.
    pub fn open_link(&self, a: &str, b: &str) -> Rc<Notify> {
        let severed = Rc::new(Notify::new());
        let mut links = self.links.borrow_mut();
        links.open.retain(|(_, signal)| signal.strong_count() > 0);
        // No link cut (most of a run): no pair made to look for one.
        if !links.cut.is_empty() && links.cut.contains(&pair(a, b)) {
            severed.notify_one();
        }
        links.open.push((pair(a, b), Rc::downgrade(&severed)));
        severed
    }

    /// Cuts the link between `a` and `b`: every open connection across it drops.
    pub fn sever(&self, a: &str, b: &str) {
        let link = pair(a, b);
        let mut links = self.links.borrow_mut();
        for signal in links.open.iter().filter(|(l, _)| *l == link).filter_map(|(_, s)| s.upgrade()) {
            signal.notify_one();
        }
        links.cut.insert(link);
    }

    /// Repairs the link between `a` and `b`: new connections may cross it again.
    pub fn mend(&self, a: &str, b: &str) {
        self.links.borrow_mut().cut.remove(&pair(a, b));
    }

    pub fn mend_all(&self) {
        self.links.borrow_mut().cut.clear();
    }

    pub fn is_cut(&self, a: &str, b: &str) -> bool {
        let links = self.links.borrow();
        !links.cut.is_empty() && links.cut.contains(&pair(a, b))
    }

    /// Asks the runner to crash `host` and restart it at once, after the current step.
    pub fn request_bounce(&self, host: &str) {
        self.bounces.borrow_mut().push(host.to_string());
    }

    /// Asks the runner to cut `host`'s link to the engine (or to the proxy it dials) after the
    /// current step, and to repair it at `until_ms`.
    pub fn request_isolation(&self, host: &str, until_ms: u64) {
        self.isolations.borrow_mut().push((host.to_string(), until_ms));
    }

    pub fn take_isolations(&self) -> Vec<(String, u64)> {
        std::mem::take(&mut *self.isolations.borrow_mut())
    }

    /// Whether a cut has asked for a host to be crashed and restarted since the last take.
    pub fn has_bounces(&self) -> bool {
        !self.bounces.borrow().is_empty()
    }

    pub fn take_bounces(&self) -> Vec<String> {
        std::mem::take(&mut *self.bounces.borrow_mut())
    }

    /// How often each worker reached each named point, as `((worker, point), count)`.
    pub fn arrivals(&self) -> BTreeMap<(String, String), u64> {
        self.arrivals.borrow().clone()
    }

    /// The replies kept for the oracles ([`World::keep_reply`]), and how many were not kept.
    pub fn replies(&self) -> (std::cell::Ref<'_, Vec<Reply>>, u64) {
        (self.replies.borrow(), self.replies_dropped.get())
    }

    /// Keeps a worker's result that says something about a session (it names one), when neither
    /// a double gave it nor the driver receives it.
    fn keep_reply(&self, peer: &str, frame: &Frame) {
        let Frame::InvocationResult { invocation_id, function_id, result: Some(result), .. } = frame else { return };
        if result["session_id"].as_str().is_none() || self.services.iter().any(|(host, _)| host == peer) {
            return;
        }
        let Some(to) = self.caller_of(invocation_id).filter(|to| to != crate::topology::DRIVER) else { return };
        let mut replies = self.replies.borrow_mut();
        if replies.len() >= REPLIES_MAX {
            self.replies_dropped.set(self.replies_dropped.get() + 1);
            return;
        }
        replies.push(Reply {
            position: self.trace.borrow().events().len(),
            at_ms: self.clock.now_ms(),
            from: peer.to_string(),
            to: to.to_string(),
            function: function_id.clone(),
            result: result.clone(),
        });
    }

    /// A label for a frame's function id: the last frame's when it names the same function.
    fn function_label(&self, id: &str) -> Label {
        same_or_new(&self.last_function, id)
    }

    /// A label for a frame's invocation id: the last one's when it is the same id.
    fn invocation_label(&self, id: &str) -> Label {
        same_or_new(&self.last_invocation, id)
    }

    /// The worker an invocation came from, as the engine saw it arrive.
    pub fn caller_of(&self, invocation_id: &str) -> Option<Label> {
        self.callers.borrow().by_invocation.get(invocation_id).cloned()
    }

    fn note_caller(&self, invocation_id: &Label, caller: &Label) {
        let mut callers = self.callers.borrow_mut();
        if callers.by_invocation.insert(invocation_id.clone(), caller.clone()).is_none() {
            callers.order.push_back(invocation_id.clone());
        }
        while callers.order.len() > CALLERS_MAX {
            if let Some(oldest) = callers.order.pop_front() {
                callers.by_invocation.remove(&oldest);
            }
        }
    }
}

/// `last` when it holds `text`, else a new label for `text`, kept in `last` for the next ask.
fn same_or_new(last: &RefCell<Option<Label>>, text: &str) -> Label {
    let mut last = last.borrow_mut();
    match &*last {
        Some(label) if label.as_str() == text => label.clone(),
        _ => last.insert(Label::from(text)).clone(),
    }
}

impl BusObserver for World {
    fn frame(&self, direction: FrameDirection, peer: &Label, frame: &Frame) {
        let invocation_id = frame.invocation_id().map(|id| self.invocation_label(id));
        match (direction, frame, &invocation_id) {
            (FrameDirection::In, Frame::InvokeFunction { .. }, Some(id)) => self.note_caller(id, peer),
            (FrameDirection::In, Frame::InvocationResult { .. }, _) => self.keep_reply(peer, frame),
            _ => {}
        }
        let direction = match direction {
            FrameDirection::In => "in",
            FrameDirection::Out => "out",
        };
        self.record_on(
            self.engine.clone(),
            EventKind::Frame {
                direction,
                peer: peer.clone(),
                frame: frame.kind(),
                function_id: frame.function_id().map(|id| self.function_label(id)),
                invocation_id,
            },
        );
    }

    fn note(&self, host: &str, what: &str, detail: Value) {
        self.note_event(host, what, detail);
    }
}

impl ProcessControl for World {
    fn interrupt(&self, worker: &str, point: &str) -> Option<Interrupt> {
        *self.arrivals.borrow_mut().entry((worker.to_string(), point.to_string())).or_default() += 1;
        let decided = self.process_cuts.borrow_mut().decide(worker, point);
        let (index, interrupt) = decided?;
        if interrupt == Interrupt::Crash {
            self.request_bounce(worker);
        }
        self.record(
            "rig",
            EventKind::Interrupt {
                interrupt: index,
                worker: worker.to_string(),
                point: point.to_string(),
                action: interrupt.name().to_string(),
            },
        );
        Some(interrupt)
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
