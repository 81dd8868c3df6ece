//! The one home of host and function names: which hosts a world has, which functions each
//! serves, and which network links join them. Scenario validation, the wiring of a run and the
//! readiness check all read it from here.
//!
//! Every worker dials the engine, or the drop-proxy when the scenario puts it in front of that
//! worker; the proxy dials the engine. Those are the only links: two workers never talk to each
//! other directly, so a partition between them would cut nothing.

use crate::bus::{QUEUE_ENQUEUE, WORKERS_REGISTER};
use std::collections::BTreeSet;

pub const ENGINE: &str = "engine";
pub const PROXY: &str = "proxy";
pub const DRIVER: &str = "driver";
pub const STORE: &str = "store";
pub const SESSION: &str = "session";
pub const MODEL: &str = "model";
pub const TICKETS: &str = "tickets";
pub const QUEUE: &str = "queue";
/// The configuration service, when the scenario declares versioned configuration.
pub const CONFIG: &str = "config";
/// The harness workers a scenario can have: `harness` always, `replacement` for switches.
pub const HARNESS: &str = "harness";
pub const REPLACEMENT: &str = "replacement";

/// The functions every harness worker may serve, by their name after `{host}::`. They are the
/// scenario files' vocabulary: a harness serves the ones it implements, and a scenario that
/// invokes one it lacks gets `function_not_found`, as from a real engine.
pub const HARNESS_FUNCTIONS: [&str; 12] = [
    "turn",
    "export",
    "import",
    "dead-letter",
    "status",
    "send",
    "resolve",
    "stream",
    "stop",
    "cancel",
    "pause",
    "resume",
];

/// The control commands among [`HARNESS_FUNCTIONS`]: a harness with a control plane serves them.
pub const CONTROL_FUNCTIONS: [&str; 4] = ["stop", "cancel", "pause", "resume"];

/// The functions the queue worker serves.
pub const QUEUE_FUNCTIONS: [&str; 4] = [QUEUE_ENQUEUE, "queue::define", "queue::inspect", "engine::queue::topic_stats"];

/// What a host is there for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Engine,
    Proxy,
    /// A double: a service the harness depends on.
    Service,
    Queue,
    Harness,
    /// The scenario's own client; it cannot crash.
    Driver,
}

/// One host of a world.
#[derive(Debug, Clone)]
pub struct Host {
    pub name: String,
    pub role: Role,
    /// The functions it registers with the engine.
    pub functions: BTreeSet<String>,
    /// The host its connection goes to (the engine, or the proxy in front of it).
    pub dials: Option<String>,
}

/// Everything a world is made of, before anything runs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    /// The services by host, with their functions.
    pub services: Vec<(String, Vec<String>)>,
    pub queue: bool,
    /// The harness workers.
    pub harness_workers: Vec<String>,
    /// The harness functions, by name after `{host}::` (see [`HARNESS_FUNCTIONS`]).
    pub harness_functions: Vec<String>,
    /// The worker whose engine connection goes through the drop-proxy.
    pub proxy_worker: Option<String>,
}

/// The hosts of one world and the links between them.
#[derive(Debug, Clone)]
pub struct Topology {
    hosts: Vec<Host>,
    /// [`Topology::registered_at_start`], once asked: a topology is shared by many runs.
    at_start: std::cell::OnceCell<BTreeSet<String>>,
}

impl Topology {
    pub fn new(plan: &Plan) -> Self {
        let dial = |worker: &str| match &plan.proxy_worker {
            Some(behind) if behind == worker => PROXY.to_string(),
            _ => ENGINE.to_string(),
        };
        let mut hosts = vec![Host {
            name: ENGINE.into(),
            role: Role::Engine,
            functions: [WORKERS_REGISTER.to_string()].into(),
            dials: None,
        }];
        if plan.proxy_worker.is_some() {
            hosts.push(Host {
                name: PROXY.into(),
                role: Role::Proxy,
                functions: BTreeSet::new(),
                dials: Some(ENGINE.into()),
            });
        }
        for (service, functions) in &plan.services {
            hosts.push(Host {
                name: service.clone(),
                role: Role::Service,
                functions: functions.iter().cloned().collect(),
                dials: Some(dial(service)),
            });
        }
        if plan.queue {
            hosts.push(Host {
                name: QUEUE.into(),
                role: Role::Queue,
                functions: QUEUE_FUNCTIONS.iter().map(|f| f.to_string()).collect(),
                dials: Some(dial(QUEUE)),
            });
        }
        for worker in &plan.harness_workers {
            hosts.push(Host {
                name: worker.clone(),
                role: Role::Harness,
                functions: plan.harness_functions.iter().map(|f| format!("{worker}::{f}")).collect(),
                dials: Some(dial(worker)),
            });
        }
        hosts.push(Host {
            name: DRIVER.into(),
            role: Role::Driver,
            functions: BTreeSet::new(),
            dials: Some(ENGINE.into()),
        });
        Self { hosts, at_start: std::cell::OnceCell::new() }
    }

    pub fn hosts(&self) -> &[Host] {
        &self.hosts
    }

    pub fn host(&self, name: &str) -> Option<&Host> {
        self.hosts.iter().find(|h| h.name == name)
    }

    pub fn names(&self) -> Vec<&str> {
        self.hosts.iter().map(|h| h.name.as_str()).collect()
    }

    /// Every function some host of this world serves.
    pub fn functions(&self) -> BTreeSet<&str> {
        self.hosts.iter().flat_map(|h| h.functions.iter().map(String::as_str)).collect()
    }

    /// Whether a network link joins `a` and `b` (in either direction).
    pub fn has_link(&self, a: &str, b: &str) -> bool {
        self.hosts.iter().any(|h| {
            let dials = h.dials.as_deref();
            (h.name == a && dials == Some(b)) || (h.name == b && dials == Some(a))
        })
    }

    /// Every link, as `(dialling host, dialled host)`.
    pub fn links(&self) -> Vec<(&str, &str)> {
        self.hosts.iter().filter_map(|h| h.dials.as_deref().map(|target| (h.name.as_str(), target))).collect()
    }

    /// The functions to wait for before a world's script starts: every host's (as after a
    /// restart of the engine with every host up).
    pub fn registered_at_start(&self) -> &BTreeSet<String> {
        self.at_start.get_or_init(|| self.registered_after_restart(ENGINE, &BTreeSet::new()))
    }

    /// The functions to wait for after `host` (re)starts: its own, or, for the engine, those of
    /// every host whose software is running (the ones in `down` are not coming back on their own).
    pub fn registered_after_restart(&self, host: &str, down: &BTreeSet<String>) -> BTreeSet<String> {
        match self.host(host) {
            Some(h) if h.role == Role::Engine => self
                .hosts
                .iter()
                .filter(|h| !down.contains(&h.name))
                .flat_map(|h| h.functions.iter().filter(|f| *f != WORKERS_REGISTER).cloned())
                .collect(),
            Some(h) => h.functions.clone(),
            None => BTreeSet::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(proxy: Option<&str>) -> Plan {
        Plan {
            services: vec![(STORE.into(), vec!["state::get".into()])],
            queue: true,
            harness_workers: vec![HARNESS.into()],
            harness_functions: vec!["turn".into()],
            proxy_worker: proxy.map(str::to_string),
        }
    }

    #[test]
    fn workers_dial_the_engine_or_the_proxy_in_front_of_them() {
        let direct = Topology::new(&plan(None));
        assert!(direct.has_link(HARNESS, ENGINE));
        assert!(direct.has_link(ENGINE, STORE));
        assert!(!direct.has_link(HARNESS, STORE), "workers only talk to the engine");
        assert!(direct.host(HARNESS).is_some_and(|h| h.functions.contains("harness::turn")));
        let proxied = Topology::new(&plan(Some(HARNESS)));
        assert!(proxied.has_link(HARNESS, PROXY) && proxied.has_link(PROXY, ENGINE));
        assert!(!proxied.has_link(HARNESS, ENGINE));
    }

    #[test]
    fn a_world_starts_once_every_host_registered() {
        let topology = Topology::new(&plan(Some(HARNESS)));
        let everything = topology.registered_after_restart(ENGINE, &BTreeSet::new());
        assert_eq!(topology.registered_at_start(), &everything);
        assert!(everything.contains("harness::turn") && everything.contains("state::get"));
    }

    #[test]
    fn an_engine_restart_waits_only_for_hosts_that_are_up() {
        let topology = Topology::new(&plan(None));
        let down: BTreeSet<String> = [HARNESS.to_string()].into();
        let expected = topology.registered_after_restart(ENGINE, &down);
        assert!(expected.contains("state::get") && expected.contains(QUEUE_ENQUEUE));
        assert!(!expected.contains("harness::turn"));
    }
}
