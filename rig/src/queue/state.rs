//! The queue's durable state and its rules, with no clock or socket of its own.
//!
//! The rules, chosen so that incident 001's observations come out of them:
//!
//! - Messages wait in FIFO order. A message's group is the value of the queue's
//!   `message_group_field` in its data (no field: every message is its own group).
//! - A poll pass *claims* available messages into flight, oldest first, up to `concurrency` in
//!   flight per queue, whatever their group.
//! - Only a group's head (its oldest message not yet acknowledged) is *dispatched*; a claimed
//!   message behind it waits in flight without a deadline. So a group whose head's result was
//!   lost holds everything behind it until the head's deadline.
//! - A dispatched delivery has a visibility deadline of `timeout_ms` from dispatch. A result
//!   acknowledges it; an error result or the deadline makes it available again after
//!   `backoff_ms`, at the head of its group, until it has been delivered `1 + max_retries`
//!   times; then it moves to the dead-letter queue.
//! - Topic depth counts only messages waiting to be claimed, which is why it reads 0 while
//!   deliveries are stuck in flight.

use serde::Deserialize;
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};

/// A queue's configuration, as `queue::define` and `[[world.queue]]` give it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct QueueConfig {
    /// Only `fifo` exists; kept so the real engine's define payloads read unchanged.
    #[serde(rename = "type")]
    pub kind: String,
    pub message_group_field: Option<String>,
    pub concurrency: usize,
    pub max_retries: u32,
    pub backoff_ms: u64,
    pub poll_interval_ms: u64,
    /// The visibility deadline of a dispatched delivery.
    pub timeout_ms: u64,
    /// Whether deliveries in flight when the engine connection drops are redelivered at once
    /// (otherwise they wait for their deadline).
    pub redeliver_on_engine_restart: bool,
    /// The queue owner's handler for dead letters: invoked with each message the queue gives up
    /// on, until it answers. Without one, a dead letter waits for a person.
    pub dead_letter_function: Option<String>,
}

impl Default for QueueConfig {
    fn default() -> Self {
        Self {
            kind: "fifo".into(),
            message_group_field: None,
            concurrency: 10,
            max_retries: 3,
            backoff_ms: 1_000,
            poll_interval_ms: 100,
            timeout_ms: 1_800_000,
            redeliver_on_engine_restart: true,
            dead_letter_function: None,
        }
    }
}

/// The most messages one queue holds (waiting, in flight and dead-lettered); an enqueue past it
/// is refused, never buffered without bound.
pub const MESSAGES_MAX: usize = 10_000;

#[derive(Debug, Clone, PartialEq)]
enum Stage {
    Waiting { available_at_ms: u64 },
    Claimed,
    Dispatched { attempt: u32, deadline_ms: u64 },
}

#[derive(Debug, Clone)]
struct Message {
    id: String,
    function_id: String,
    data: Value,
    group: String,
    deliveries: u32,
    stage: Stage,
}

/// A message the queue gave up on, and whether its owner has been told.
#[derive(Debug, Clone)]
struct DeadLetter {
    message: Message,
    reason: String,
    handoff: Handoff,
}

/// A dead letter of `queue` as the oracles read it: `(queue, message_id, data)`.
fn letter<'a>((queue, dead): (&'a str, &'a DeadLetter)) -> (&'a str, &'a str, &'a Value) {
    (queue, dead.message.id.as_str(), &dead.message.data)
}

/// Where handing a dead letter to the owner's handler stands.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Handoff {
    /// No handler is configured: it waits for a person.
    Unhandled,
    /// To hand over at this time (attempts made so far).
    Due { at_ms: u64, attempts: u32 },
    /// Being handed over now.
    InFlight { attempts: u32 },
    /// The handler answered.
    Handled,
    /// Every attempt failed.
    GaveUp { attempts: u32 },
}

#[derive(Debug, Default)]
struct Queue {
    config: QueueConfig,
    messages: Vec<Message>,
    dead: Vec<DeadLetter>,
}

/// How many times a dead letter is offered to its handler before the queue gives up; backoff
/// doubles from the queue's `backoff_ms` up to [`DEAD_LETTER_BACKOFF_MS_MAX`].
pub const DEAD_LETTER_ATTEMPTS_MAX: u32 = 20;
pub const DEAD_LETTER_BACKOFF_MS_MAX: u64 = 60_000;

/// A dead letter to hand to the queue owner's handler now.
#[derive(Debug, Clone, PartialEq)]
pub struct DeadLetterNotice {
    pub queue: String,
    pub message_id: String,
    pub handler: String,
    /// What the handler is invoked with: the message, where it was and why it died.
    pub payload: Value,
    pub attempt: u32,
}

/// A delivery to make now: invoke `function_id` with `data`, wait at most `timeout_ms`.
#[derive(Debug, Clone, PartialEq)]
pub struct Dispatch {
    pub queue: String,
    pub message_id: String,
    pub group: String,
    pub function_id: String,
    pub data: Value,
    pub attempt: u32,
    pub deadline_ms: u64,
    pub timeout_ms: u64,
}

/// What became of a delivery that did not produce a result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Retry {
    /// Available again at this time, at the head of its group.
    Redeliver {
        at_ms: u64,
    },
    DeadLettered,
    /// The delivery was already settled (a late outcome of an earlier attempt).
    Stale,
}

/// Every queue of the world. Lives outside the queue's host, so it survives a crash: the seed's
/// queue was file-backed.
#[derive(Debug, Default)]
pub struct Queues {
    queues: BTreeMap<String, Queue>,
    next_message: u64,
}

impl Queues {
    pub fn define(&mut self, name: &str, config: QueueConfig) {
        self.queues.entry(name.to_string()).or_default().config = config;
    }

    /// Adds a message; returns its id.
    pub fn enqueue(&mut self, name: &str, function_id: &str, data: Value, now_ms: u64) -> Result<String, String> {
        let queue = self.queues.get_mut(name).ok_or_else(|| format!("queue `{name}` is not defined"))?;
        if queue.messages.len() + queue.dead.len() >= MESSAGES_MAX {
            return Err(format!("queue `{name}` is full ({MESSAGES_MAX} messages)"));
        }
        self.next_message += 1;
        let id = format!("m{}", self.next_message);
        let group = match &queue.config.message_group_field {
            Some(field) => data.get(field).map(proxy::value_text).unwrap_or_default(),
            None => id.clone(),
        };
        let stage = Stage::Waiting { available_at_ms: now_ms };
        queue.messages.push(Message {
            id: id.clone(),
            function_id: function_id.into(),
            data,
            group,
            deliveries: 0,
            stage,
        });
        Ok(id)
    }

    /// One poll pass: claims what may be claimed and returns the deliveries to make now.
    pub fn poll(&mut self, now_ms: u64) -> Vec<Dispatch> {
        let mut dispatches = Vec::new();
        for (name, queue) in &mut self.queues {
            let mut in_flight = queue.messages.iter().filter(|m| !matches!(m.stage, Stage::Waiting { .. })).count();
            for message in &mut queue.messages {
                if in_flight >= queue.config.concurrency {
                    break;
                }
                if matches!(message.stage, Stage::Waiting { available_at_ms } if available_at_ms <= now_ms) {
                    message.stage = Stage::Claimed;
                    in_flight += 1;
                }
            }
            let mut heads_seen = BTreeSet::new();
            for message in &mut queue.messages {
                // Only the oldest message of a group may be delivered.
                // (The planted bug: the two tests the other way round, so a head that waits out
                // its backoff is never seen, and the message behind it is delivered first.)
                let blocked = match crate::planted!("queue-group-head-waiting-not-seen") {
                    true => message.stage != Stage::Claimed || !heads_seen.insert(message.group.clone()),
                    false => !heads_seen.insert(message.group.clone()) || message.stage != Stage::Claimed,
                };
                if blocked {
                    continue;
                }
                message.deliveries += 1;
                let deadline_ms = now_ms.saturating_add(queue.config.timeout_ms);
                message.stage = Stage::Dispatched { attempt: message.deliveries, deadline_ms };
                dispatches.push(Dispatch {
                    queue: name.clone(),
                    message_id: message.id.clone(),
                    group: message.group.clone(),
                    function_id: message.function_id.clone(),
                    data: message.data.clone(),
                    attempt: message.deliveries,
                    deadline_ms,
                    timeout_ms: queue.config.timeout_ms,
                });
            }
        }
        dispatches
    }

    fn dispatched_mut(&mut self, queue: &str, message_id: &str, attempt: u32) -> Option<(&mut Queue, usize)> {
        let queue = self.queues.get_mut(queue)?;
        let index = queue.messages.iter().position(|m| {
            m.id == message_id && matches!(m.stage, Stage::Dispatched { attempt: a, .. } if a == attempt)
        })?;
        Some((queue, index))
    }

    /// A delivery produced a result: the message is done. False if it was already settled.
    pub fn acknowledge(&mut self, queue: &str, message_id: &str, attempt: u32) -> bool {
        if crate::planted!("queue-acknowledges-any-attempt") {
            // (The planted bug: a late result of an earlier delivery settles the message.)
            let Some(queue) = self.queues.get_mut(queue) else { return false };
            let before = queue.messages.len();
            queue.messages.retain(|m| m.id != message_id || !matches!(m.stage, Stage::Dispatched { .. }));
            return queue.messages.len() < before;
        }
        match self.dispatched_mut(queue, message_id, attempt) {
            Some((queue, index)) => {
                queue.messages.remove(index);
                true
            }
            None => false,
        }
    }

    /// A delivery failed (`reason`) or passed its deadline.
    pub fn retry(&mut self, queue: &str, message_id: &str, attempt: u32, now_ms: u64, reason: &str) -> Retry {
        let Some((queue, index)) = self.dispatched_mut(queue, message_id, attempt) else { return Retry::Stale };
        // (The planted bug: the first delivery counted among the retries.)
        let gives_up = match crate::planted!("queue-gives-up-one-delivery-early") {
            true => queue.messages[index].deliveries >= queue.config.max_retries,
            false => queue.messages[index].deliveries > queue.config.max_retries,
        };
        if gives_up {
            let mut message = queue.messages.remove(index);
            message.stage = Stage::Waiting { available_at_ms: now_ms };
            let handoff = match queue.config.dead_letter_function {
                Some(_) => Handoff::Due { at_ms: now_ms, attempts: 0 },
                None => Handoff::Unhandled,
            };
            queue.dead.push(DeadLetter { message, reason: reason.to_string(), handoff });
            return Retry::DeadLettered;
        }
        let at_ms = now_ms.saturating_add(queue.config.backoff_ms);
        queue.messages[index].stage = Stage::Waiting { available_at_ms: at_ms };
        Retry::Redeliver { at_ms }
    }

    /// After the queue's host restarts, deliveries it was waiting on are gone: make them
    /// available again at once, and offer again the dead letters it was handing over.
    pub fn recover_after_restart(&mut self, now_ms: u64) -> usize {
        let mut recovered = 0;
        for queue in self.queues.values_mut() {
            for message in &mut queue.messages {
                if matches!(message.stage, Stage::Dispatched { .. }) {
                    message.stage = Stage::Waiting { available_at_ms: now_ms };
                    recovered += 1;
                }
            }
            for dead in &mut queue.dead {
                if let Handoff::InFlight { attempts } = dead.handoff {
                    dead.handoff = Handoff::Due { at_ms: now_ms, attempts };
                    recovered += 1;
                }
            }
        }
        recovered
    }

    /// The dead letters due to be handed to their handler now; they are in flight until
    /// [`Self::dead_letter_handled`] or [`Self::dead_letter_refused`].
    pub fn due_dead_letters(&mut self, now_ms: u64) -> Vec<DeadLetterNotice> {
        let mut notices = Vec::new();
        for (name, queue) in &mut self.queues {
            let Some(handler) = queue.config.dead_letter_function.clone() else { continue };
            for dead in &mut queue.dead {
                let Handoff::Due { at_ms, attempts } = dead.handoff else { continue };
                if at_ms > now_ms {
                    continue;
                }
                dead.handoff = Handoff::InFlight { attempts: attempts + 1 };
                let message = &dead.message;
                notices.push(DeadLetterNotice {
                    queue: name.clone(),
                    message_id: message.id.clone(),
                    handler: handler.clone(),
                    payload: json!({
                        "queue": name, "message_id": message.id, "function_id": message.function_id,
                        "data": message.data, "deliveries": message.deliveries, "reason": dead.reason,
                    }),
                    attempt: attempts + 1,
                });
            }
        }
        notices
    }

    fn dead_mut(&mut self, queue: &str, message_id: &str) -> Option<&mut DeadLetter> {
        self.queues.get_mut(queue)?.dead.iter_mut().find(|d| d.message.id == message_id)
    }

    /// The handler took the dead letter.
    pub fn dead_letter_handled(&mut self, queue: &str, message_id: &str) {
        if let Some(dead) = self.dead_mut(queue, message_id) {
            dead.handoff = Handoff::Handled;
        }
    }

    /// The handler could not be reached or refused: try again later, or give up after
    /// [`DEAD_LETTER_ATTEMPTS_MAX`] attempts. Returns when it is offered next, if ever.
    pub fn dead_letter_refused(&mut self, queue: &str, message_id: &str, now_ms: u64) -> Option<u64> {
        let backoff_ms = self.config(queue).map_or(QueueConfig::default().backoff_ms, |c| c.backoff_ms).max(1);
        let dead = self.dead_mut(queue, message_id)?;
        let Handoff::InFlight { attempts } = dead.handoff else { return None };
        if attempts >= DEAD_LETTER_ATTEMPTS_MAX {
            dead.handoff = Handoff::GaveUp { attempts };
            return None;
        }
        let at_ms = now_ms
            .saturating_add(backoff_ms.saturating_mul(1 << (attempts - 1).min(16)).min(DEAD_LETTER_BACKOFF_MS_MAX));
        dead.handoff = Handoff::Due { at_ms, attempts };
        Some(at_ms)
    }

    /// Every dead letter no handler has taken, as `(queue, message_id, data)`: work that
    /// waits for a person.
    pub fn unresolved_dead_letters(&self) -> Vec<(&str, &str, &Value)> {
        self.dead_letters().filter(|(_, d)| d.handoff != Handoff::Handled).map(letter).collect()
    }

    /// Every message a queue gave up on, taken by a handler or not, as `(queue, message_id,
    /// data)`: what a turn held for a dead letter was held for.
    pub fn given_up(&self) -> Vec<(&str, &str, &Value)> {
        self.dead_letters().map(letter).collect()
    }

    /// Every dead letter of every queue, with its queue's name.
    fn dead_letters(&self) -> impl Iterator<Item = (&str, &DeadLetter)> {
        self.queues.iter().flat_map(|(name, q)| q.dead.iter().map(move |d| (name.as_str(), d)))
    }

    /// The earliest time, after `now_ms`, that a waiting message becomes available or a dead
    /// letter is due to be offered again.
    pub fn next_available_after(&self, now_ms: u64) -> Option<u64> {
        let messages = self.queues.values().flat_map(|q| q.messages.iter()).filter_map(|m| match m.stage {
            Stage::Waiting { available_at_ms } if available_at_ms > now_ms => Some(available_at_ms),
            _ => None,
        });
        let dead = self.queues.values().flat_map(|q| q.dead.iter()).filter_map(|d| match d.handoff {
            Handoff::Due { at_ms, .. } if at_ms > now_ms => Some(at_ms),
            _ => None,
        });
        messages.chain(dead).min()
    }

    /// Groups with work waiting that cannot be claimed because other groups' entries fill the
    /// queue's whole `concurrency`: `(queue, starved group, groups holding the allowance)`.
    pub fn starved(&self, now_ms: u64) -> Vec<(String, String, Vec<String>)> {
        let mut starved = Vec::new();
        for (name, queue) in &self.queues {
            let holders: BTreeSet<&str> = queue
                .messages
                .iter()
                .filter(|m| !matches!(m.stage, Stage::Waiting { .. }))
                .map(|m| m.group.as_str())
                .collect();
            let in_flight = queue.messages.iter().filter(|m| !matches!(m.stage, Stage::Waiting { .. })).count();
            if in_flight < queue.config.concurrency {
                continue;
            }
            let waiting: BTreeSet<&str> = queue
                .messages
                .iter()
                .filter(|m| matches!(m.stage, Stage::Waiting { available_at_ms } if available_at_ms <= now_ms))
                .map(|m| m.group.as_str())
                .filter(|group| !holders.contains(group))
                .collect();
            for group in waiting {
                starved.push((name.clone(), group.to_string(), holders.iter().map(|h| h.to_string()).collect()));
            }
        }
        starved
    }

    /// The shortest poll interval of any queue (how soon after a change the next pass runs).
    pub fn poll_interval_ms(&self) -> u64 {
        self.queues.values().map(|q| q.config.poll_interval_ms).min().unwrap_or(QueueConfig::default().poll_interval_ms)
    }

    pub fn config(&self, queue: &str) -> Option<&QueueConfig> {
        self.queues.get(queue).map(|q| &q.config)
    }

    /// Everything in one queue, per group, with why each in-flight entry waits.
    pub fn inspect(&self, name: &str) -> Option<Value> {
        let queue = self.queues.get(name)?;
        let mut groups: BTreeMap<&str, (Vec<Value>, Vec<Value>)> = BTreeMap::new();
        let mut heads: BTreeMap<&str, &str> = BTreeMap::new();
        for message in &queue.messages {
            let head = *heads.entry(&message.group).or_insert(&message.id);
            let entry = |stage: &str, deadline: Value, waiting: String| {
                json!({
                    "message_id": message.id, "function_id": message.function_id, "data": message.data,
                    "deliveries": message.deliveries, "stage": stage, "deadline_ms": deadline, "waiting": waiting,
                })
            };
            let (in_flight, waiting) = groups.entry(&message.group).or_default();
            match &message.stage {
                Stage::Dispatched { attempt, deadline_ms } => in_flight.push(entry(
                    "dispatched",
                    json!(deadline_ms),
                    format!("delivery {attempt} awaits its result until the deadline at {deadline_ms} ms"),
                )),
                Stage::Claimed => in_flight.push(entry("claimed", Value::Null, format!("behind group head {head}"))),
                Stage::Waiting { available_at_ms } => {
                    waiting.push(entry("waiting", Value::Null, format!("available at {available_at_ms} ms")))
                }
            }
        }
        let groups: serde_json::Map<String, Value> = groups
            .into_iter()
            .map(|(group, (in_flight, waiting))| {
                let summary = json!({ "in_flight_count": in_flight.len(), "in_flight": in_flight, "waiting_count": waiting.len(), "waiting": waiting });
                (group.to_string(), summary)
            })
            .collect();
        let in_flight = queue.messages.iter().filter(|m| !matches!(m.stage, Stage::Waiting { .. })).count();
        let dead: Vec<Value> = queue
            .dead
            .iter()
            .map(|d| {
                let m = &d.message;
                json!({ "message_id": m.id, "function_id": m.function_id, "data": m.data, "deliveries": m.deliveries,
                        "reason": d.reason, "handoff": format!("{:?}", d.handoff) })
            })
            .collect();
        // Claimed entries count against `concurrency` whatever their group, so a stuck group can
        // hold the whole allowance: name every group that waits because of it.
        let starved: Vec<Value> = self
            .starved(u64::MAX)
            .into_iter()
            .filter(|(queue, ..)| queue == name)
            .map(|(_, group, held_by)| {
                json!({ "group": group, "held_by": held_by,
                        "why": format!("all {} in-flight slots are held by other groups", queue.config.concurrency) })
            })
            .collect();
        Some(json!({
            "queue": name, "depth": self.depth(queue), "in_flight_count": in_flight, "concurrency": queue.config.concurrency,
            "dlq_count": dead.len(), "dlq": dead, "groups": groups, "starved": starved,
        }))
    }

    fn depth(&self, queue: &Queue) -> usize {
        queue.messages.iter().filter(|m| matches!(m.stage, Stage::Waiting { .. })).count()
    }

    /// Bare topic statistics, shaped like the engine's: `depth` counts only waiting messages and
    /// `consumer_count` only pub/sub subscribers (deliveries by invocation are not consumers),
    /// so both read 0 while a group is stuck in flight, as the incident's operators saw.
    pub fn topic_stats(&self, name: &str) -> Option<Value> {
        let queue = self.queues.get(name)?;
        Some(json!({ "topic": name, "depth": self.depth(queue), "consumer_count": 0 }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grouped(timeout_ms: u64, max_retries: u32) -> Queues {
        let mut queues = Queues::default();
        let config = QueueConfig {
            message_group_field: Some("session_id".into()),
            timeout_ms,
            max_retries,
            backoff_ms: 100,
            ..QueueConfig::default()
        };
        queues.define("q", config);
        queues
    }

    #[test]
    fn a_group_waits_behind_its_head_while_both_are_in_flight() {
        let mut queues = grouped(2_500, 1);
        let old = queues.enqueue("q", "f", json!({"session_id": "s1", "step": 1}), 0).unwrap();
        let first = queues.poll(0);
        assert_eq!(first.len(), 1);
        queues.enqueue("q", "f", json!({"session_id": "s1", "step": 0}), 10).unwrap();
        queues.enqueue("q", "f", json!({"session_id": "s2"}), 10).unwrap();
        let second = queues.poll(10);
        assert_eq!(second.len(), 1, "s2 is dispatched, s1's second message only claimed");
        assert_eq!(second[0].group, "s2");
        let view = queues.inspect("q").unwrap();
        assert_eq!(view["groups"]["s1"]["in_flight_count"], 2);
        assert_eq!(view["groups"]["s1"]["in_flight"][1]["waiting"], format!("behind group head {old}"));
        assert_eq!(view["depth"], 0);
        assert_eq!(queues.topic_stats("q").unwrap()["depth"], 0);
    }

    #[test]
    fn a_lost_result_holds_the_group_until_the_deadline_then_redelivers_the_head_first() {
        let mut queues = grouped(2_500, 1);
        let old = queues.enqueue("q", "f", json!({"session_id": "s1"}), 0).unwrap();
        let delivery = queues.poll(0).remove(0);
        queues.enqueue("q", "f", json!({"session_id": "s1"}), 5).unwrap();
        assert!(queues.poll(5).is_empty());
        assert_eq!(queues.retry("q", &old, delivery.attempt, 2_500, "deadline"), Retry::Redeliver { at_ms: 2_600 });
        assert!(queues.poll(2_550).is_empty(), "backoff");
        let again = queues.poll(2_600);
        assert_eq!((again.len(), again[0].message_id.as_str(), again[0].attempt), (1, old.as_str(), 2));
        assert!(!queues.acknowledge("q", &old, 1), "the first attempt's late result settles nothing");
        assert!(queues.acknowledge("q", &old, 2));
        let next = queues.poll(2_610);
        assert_eq!(next.len(), 1, "the successor runs once the head is acknowledged");
    }

    #[test]
    fn deliveries_past_max_retries_are_dead_lettered() {
        let mut queues = grouped(100, 1);
        let id = queues.enqueue("q", "f", json!({"session_id": "s1"}), 0).unwrap();
        let first = queues.poll(0).remove(0);
        assert!(matches!(queues.retry("q", &id, first.attempt, 100, "deadline"), Retry::Redeliver { .. }));
        let second = queues.poll(200).remove(0);
        assert_eq!(queues.retry("q", &id, second.attempt, 300, "deadline"), Retry::DeadLettered);
        let view = queues.inspect("q").unwrap();
        assert_eq!((view["dlq_count"].as_u64(), view["in_flight_count"].as_u64()), (Some(1), Some(0)));
    }

    #[test]
    fn concurrency_bounds_what_is_claimed_and_undefined_queues_refuse() {
        let mut queues = Queues::default();
        queues.define("q", QueueConfig { concurrency: 2, ..QueueConfig::default() });
        for _ in 0..3 {
            queues.enqueue("q", "f", json!({}), 0).unwrap();
        }
        assert_eq!(queues.poll(0).len(), 2);
        assert_eq!(queues.inspect("q").unwrap()["depth"], 1);
        assert!(queues.enqueue("missing", "f", json!({}), 0).is_err());
    }

    #[test]
    fn a_stuck_group_filling_concurrency_is_named_as_starving_the_others() {
        let mut queues = Queues::default();
        let config = QueueConfig { message_group_field: Some("s".into()), concurrency: 2, ..QueueConfig::default() };
        queues.define("q", config);
        queues.enqueue("q", "f", json!({"s": "s1"}), 0).unwrap();
        queues.enqueue("q", "f", json!({"s": "s1"}), 0).unwrap();
        queues.enqueue("q", "f", json!({"s": "s2"}), 0).unwrap();
        assert_eq!(queues.poll(0).len(), 1, "s1's head only; its second message is claimed behind it");
        assert_eq!(queues.starved(0), vec![("q".to_string(), "s2".to_string(), vec!["s1".to_string()])]);
        let view = queues.inspect("q").unwrap();
        assert_eq!(view["starved"][0]["group"], "s2");
        assert_eq!(view["starved"][0]["held_by"][0], "s1");
    }

    #[test]
    fn a_restart_makes_every_delivery_and_dead_letter_in_flight_available_at_once() {
        let mut queues = Queues::default();
        let config = QueueConfig { max_retries: 0, dead_letter_function: Some("h".into()), ..QueueConfig::default() };
        queues.define("q", config);
        let dead = queues.enqueue("q", "f", json!({}), 0).unwrap();
        let delivery = queues.poll(0).remove(0);
        assert_eq!(queues.retry("q", &dead, delivery.attempt, 10, "error result"), Retry::DeadLettered);
        assert_eq!(queues.due_dead_letters(10).len(), 1, "the dead letter is now in flight to its handler");
        let waiting = queues.enqueue("q", "f", json!({}), 20).unwrap();
        assert_eq!(queues.poll(20).len(), 1, "the second message is in flight");
        assert_eq!(queues.recover_after_restart(500), 2, "one delivery and one dead letter were in flight");
        assert_eq!(queues.next_available_after(499), Some(500));
        let again = queues.poll(500);
        assert_eq!((again.len(), again[0].message_id.as_str(), again[0].attempt), (1, waiting.as_str(), 2));
        let offered = queues.due_dead_letters(500);
        assert_eq!((offered.len(), offered[0].attempt), (1, 2), "offered again at once");
        assert_eq!(queues.recover_after_restart(600), 2, "both in flight again");
        assert_eq!(queues.recover_after_restart(600), 0, "nothing was in flight");
    }

    #[test]
    fn the_next_wake_up_is_strictly_after_now() {
        let mut queues = grouped(1_000, 0);
        assert_eq!(queues.next_available_after(0), None, "an empty queue never wakes the pump");
        queues.enqueue("q", "f", json!({"session_id": "s1"}), 0).unwrap();
        assert_eq!(queues.next_available_after(0), None, "available now is not a later wake-up");
        queues.enqueue("q", "f", json!({"session_id": "s2"}), 50).unwrap();
        assert_eq!(queues.next_available_after(10), Some(50));
        assert_eq!(queues.next_available_after(50), None);
        // A dead letter its handler refused is offered again after the backoff: a wake-up then,
        // and none once that time has come.
        let mut dead = Queues::default();
        let config = QueueConfig { max_retries: 0, dead_letter_function: Some("h".into()), ..QueueConfig::default() };
        dead.define("q", config);
        let id = dead.enqueue("q", "f", json!({}), 0).unwrap();
        let delivery = dead.poll(0).remove(0);
        assert_eq!(dead.retry("q", &id, delivery.attempt, 10, "error result"), Retry::DeadLettered);
        assert_eq!(dead.due_dead_letters(10).len(), 1);
        let again_at = dead.dead_letter_refused("q", &id, 20).unwrap();
        assert_eq!(dead.next_available_after(20), Some(again_at));
        assert_eq!(dead.next_available_after(again_at), None);
    }

    #[test]
    fn a_group_is_starved_only_while_every_slot_is_taken() {
        let mut queues = Queues::default();
        let config = QueueConfig { message_group_field: Some("s".into()), concurrency: 2, ..QueueConfig::default() };
        queues.define("q", config);
        queues.enqueue("q", "f", json!({"s": "s1"}), 0).unwrap();
        assert_eq!(queues.poll(0).len(), 1);
        queues.enqueue("q", "f", json!({"s": "s2"}), 5).unwrap();
        assert!(queues.starved(5).is_empty(), "one slot is free: s2 is claimed at the next pass");
    }

    #[test]
    fn the_pump_polls_at_the_shortest_interval_of_its_queues() {
        let mut queues = Queues::default();
        assert_eq!(queues.poll_interval_ms(), 100, "the default, with no queue defined");
        queues.define("slow", QueueConfig { poll_interval_ms: 300, ..QueueConfig::default() });
        assert_eq!(queues.poll_interval_ms(), 300);
        queues.define("fast", QueueConfig { poll_interval_ms: 40, ..QueueConfig::default() });
        assert_eq!(queues.poll_interval_ms(), 40);
    }

    #[test]
    fn a_queue_holds_at_most_its_limit_dead_letters_included() {
        let mut queues = Queues::default();
        queues.define("q", QueueConfig { max_retries: 0, ..QueueConfig::default() });
        let id = queues.enqueue("q", "f", json!({}), 0).unwrap();
        let delivery = queues.poll(0).remove(0);
        assert_eq!(queues.retry("q", &id, delivery.attempt, 10, "error result"), Retry::DeadLettered);
        for _ in 1..MESSAGES_MAX {
            queues.enqueue("q", "f", json!({}), 20).unwrap();
        }
        let full = queues.enqueue("q", "f", json!({}), 30).unwrap_err();
        assert_eq!(full, format!("queue `q` is full ({MESSAGES_MAX} messages)"), "the dead letter counts");
    }

    #[test]
    fn dead_letters_are_offered_to_the_handler_until_it_answers() {
        let mut queues = Queues::default();
        let config = QueueConfig {
            max_retries: 0,
            backoff_ms: 100,
            dead_letter_function: Some("h".into()),
            ..QueueConfig::default()
        };
        queues.define("q", config);
        let id = queues.enqueue("q", "f", json!({"s": "s1"}), 0).unwrap();
        let delivery = queues.poll(0).remove(0);
        assert_eq!(queues.retry("q", &id, delivery.attempt, 10, "error result"), Retry::DeadLettered);
        let notice = queues.due_dead_letters(10).remove(0);
        assert_eq!((notice.handler.as_str(), notice.attempt), ("h", 1));
        assert_eq!(notice.payload["reason"], "error result");
        assert!(queues.due_dead_letters(10).is_empty(), "in flight, not offered twice");
        assert_eq!(queues.dead_letter_refused("q", &id, 20), Some(120));
        assert!(queues.due_dead_letters(119).is_empty());
        assert_eq!(queues.due_dead_letters(120)[0].attempt, 2);
        assert_eq!(queues.unresolved_dead_letters().len(), 1);
        queues.dead_letter_handled("q", &id);
        assert!(queues.unresolved_dead_letters().is_empty());
        assert_eq!(queues.given_up(), [("q", id.as_str(), &json!({"s": "s1"}))], "taken, and still given up on");
    }
}
