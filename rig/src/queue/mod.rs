//! The queue worker of the simulated world: named FIFO queues with message groups, delivery by
//! invoking the target function through the engine, acknowledgement on its result, visibility
//! deadlines, redelivery with backoff, a dead-letter queue whose letters are handed to the
//! queue owner's handler. The rules are in [`state`].

mod state;

pub use state::{DeadLetterNotice, Dispatch, QueueConfig, Queues, Retry};

use crate::bus::{Answer, Bus, ErrorBody, Invocation, InvokeError, Provider, QUEUE_ENQUEUE};
use crate::clock::Clock;
use crate::trace::NoteSink;
use serde_json::{json, Value};
use std::cell::RefCell;
use std::collections::BTreeSet;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use tokio::sync::Notify;

/// How often a disconnected queue looks again for its engine connection before polling.
const RECONNECT_CHECK_MS: u64 = 50;

/// What the queue worker needs from its world: the clock, the durable queues, and where to
/// report its decisions.
#[derive(Clone)]
pub struct QueueEnv {
    pub clock: Rc<Clock>,
    /// Durable: they outlive every restart of the queue's host.
    pub queues: Rc<RefCell<Queues>>,
    pub note: NoteSink,
}

/// The queue worker, started afresh on every (re)start of its host; its queues are durable.
pub struct QueueWorker {
    env: QueueEnv,
    bus: Bus,
    wake: Notify,
    /// Groups already reported as starved, so each starvation is noted once.
    starved: RefCell<BTreeSet<(String, String)>>,
}

impl QueueWorker {
    /// Starts the worker: deliveries it was waiting on before a crash are made available again,
    /// and the delivery pump starts.
    pub fn start(env: QueueEnv, bus: Bus) -> Rc<Self> {
        let recovered = env.queues.borrow_mut().recover_after_restart(env.clock.now_ms());
        if recovered > 0 {
            (env.note)("queue_recovered", json!({ "deliveries": recovered }));
        }
        let worker = Rc::new(Self { env, bus, wake: Notify::new(), starved: RefCell::default() });
        tokio::task::spawn_local(Rc::clone(&worker).pump());
        worker
    }

    fn note(&self, what: &str, detail: Value) {
        (self.env.note)(what, detail);
    }

    fn queues(&self) -> std::cell::RefMut<'_, Queues> {
        self.env.queues.borrow_mut()
    }

    /// Claims and dispatches whatever the rules allow, hands over due dead letters, then sleeps
    /// until something changes: an enqueue, a settled delivery, a backoff ending. No periodic
    /// polling, so an idle queue leaves the world quiescent.
    async fn pump(self: Rc<Self>) {
        loop {
            if !self.bus.is_connected() {
                self.env.clock.sleep(RECONNECT_CHECK_MS).await;
                continue;
            }
            let now = self.env.clock.now_ms();
            let dispatches = self.queues().poll(now);
            for dispatch in dispatches {
                self.note(
                    "queue_dispatch",
                    json!({ "queue": dispatch.queue, "message_id": dispatch.message_id, "group": dispatch.group,
                            "function_id": dispatch.function_id, "attempt": dispatch.attempt, "deadline_ms": dispatch.deadline_ms }),
                );
                tokio::task::spawn_local(Rc::clone(&self).deliver(dispatch));
            }
            let notices = self.queues().due_dead_letters(now);
            for notice in notices {
                tokio::task::spawn_local(Rc::clone(&self).hand_over(notice));
            }
            self.note_starvation(now);
            let next = self.env.queues.borrow().next_available_after(now);
            match next {
                Some(at_ms) => {
                    tokio::select! {
                        biased;
                        () = self.wake.notified() => {}
                        () = self.env.clock.sleep_until(at_ms) => {}
                    }
                }
                None => self.wake.notified().await,
            }
            let interval = self.env.queues.borrow().poll_interval_ms();
            self.env.clock.sleep(interval).await;
        }
    }

    /// Notes each group that starts waiting because other groups hold every in-flight slot.
    fn note_starvation(&self, now: u64) {
        let starved = self.env.queues.borrow().starved(now);
        let begun = begun_starving(&mut self.starved.borrow_mut(), starved);
        for (queue, group, held_by) in begun {
            self.note("queue_starved", json!({ "queue": queue, "group": group, "held_by": held_by }));
        }
    }

    async fn deliver(self: Rc<Self>, dispatch: Dispatch) {
        let outcome = self.bus.invoke(&dispatch.function_id, dispatch.data.clone(), dispatch.timeout_ms).await;
        let (queue, id, attempt) = (&dispatch.queue, &dispatch.message_id, dispatch.attempt);
        let reason = match outcome {
            Ok(_) => {
                if self.queues().acknowledge(queue, id, attempt) {
                    self.note("queue_ack", json!({ "queue": queue, "message_id": id, "attempt": attempt }));
                }
                self.wake.notify_one();
                return;
            }
            Err(InvokeError::Timeout { .. }) => "visibility deadline passed".to_string(),
            Err(InvokeError::Rejected(error)) => format!("error result: {}", error.code),
            Err(InvokeError::Disconnected | InvokeError::Lost) => {
                let redeliver_now =
                    self.env.queues.borrow().config(queue).is_some_and(|c| c.redeliver_on_engine_restart);
                if !redeliver_now {
                    self.env.clock.sleep_until(dispatch.deadline_ms).await;
                }
                "engine connection lost".to_string()
            }
        };
        let retry = self.queues().retry(queue, id, attempt, self.env.clock.now_ms(), &reason);
        let detail = json!({ "queue": queue, "message_id": id, "attempt": attempt, "reason": reason });
        match retry {
            Retry::Redeliver { at_ms } => self.note("queue_redeliver", merge(detail, json!({ "at_ms": at_ms }))),
            Retry::DeadLettered => self.note("queue_dead_letter", detail),
            Retry::Stale => {}
        }
        self.wake.notify_one();
    }

    /// Offers one dead letter to the queue owner's handler.
    async fn hand_over(self: Rc<Self>, notice: DeadLetterNotice) {
        let timeout_ms = self.env.queues.borrow().config(&notice.queue).map_or(30_000, |c| c.timeout_ms);
        let outcome = self.bus.invoke(&notice.handler, notice.payload.clone(), timeout_ms).await;
        let detail = json!({ "queue": notice.queue, "message_id": notice.message_id, "handler": notice.handler, "attempt": notice.attempt });
        match outcome {
            Ok(_) => {
                self.queues().dead_letter_handled(&notice.queue, &notice.message_id);
                self.note("queue_dead_letter_handled", detail);
            }
            Err(error) => {
                let next =
                    self.queues().dead_letter_refused(&notice.queue, &notice.message_id, self.env.clock.now_ms());
                let detail = merge(detail, json!({ "error": error.to_string(), "next_at_ms": next }));
                match next {
                    Some(_) => self.note("queue_dead_letter_refused", detail),
                    None => self.note("queue_dead_letter_unhandled", detail),
                }
            }
        }
        self.wake.notify_one();
    }

    fn serve(&self, call: &Invocation) -> Result<Value, ErrorBody> {
        let data = &call.data;
        let text = |field: &str| data.get(field).and_then(Value::as_str).map(str::to_string);
        let missing = |field: &str| ErrorBody::new("bad_request", format!("missing string field `{field}`"));
        match call.function_id.as_str() {
            QUEUE_ENQUEUE => {
                let queue = text("queue").ok_or_else(|| missing("queue"))?;
                let function_id = text("function_id").ok_or_else(|| missing("function_id"))?;
                let payload = data.get("data").cloned().unwrap_or(Value::Null);
                let now = self.env.clock.now_ms();
                let id = self
                    .queues()
                    .enqueue(&queue, &function_id, payload, now)
                    .map_err(|e| ErrorBody::new("queue_error", e))?;
                self.note("queue_enqueued", json!({ "queue": queue, "message_id": id, "function_id": function_id }));
                self.wake.notify_one();
                Ok(json!({ "queue": queue, "message_id": id }))
            }
            "queue::define" => {
                let queue = text("queue").ok_or_else(|| missing("queue"))?;
                let config: QueueConfig = serde_json::from_value(data.get("config").cloned().unwrap_or(json!({})))
                    .map_err(|e| ErrorBody::new("bad_request", format!("queue config: {e}")))?;
                self.queues().define(&queue, config);
                self.wake.notify_one();
                Ok(json!({ "defined": true }))
            }
            "queue::inspect" => {
                let queue = text("queue").ok_or_else(|| missing("queue"))?;
                self.env.queues.borrow().inspect(&queue).ok_or_else(|| ErrorBody::new("queue_not_found", queue))
            }
            "engine::queue::topic_stats" => {
                let topic = text("topic").ok_or_else(|| missing("topic"))?;
                self.env.queues.borrow().topic_stats(&topic).ok_or_else(|| ErrorBody::new("queue_not_found", topic))
            }
            other => Err(ErrorBody::new("function_not_found", other)),
        }
    }
}

fn merge(mut base: Value, extra: Value) -> Value {
    if let (Value::Object(base), Value::Object(extra)) = (&mut base, extra) {
        base.extend(extra);
    }
    base
}

impl Provider for QueueWorker {
    fn invoke(self: Rc<Self>, call: Invocation, _bus: Bus) -> Pin<Box<dyn Future<Output = Answer>>> {
        Box::pin(async move { Some(self.serve(&call)) })
    }
}

/// The starvations of `starved` (`(queue, group, held_by)`, as [`state::Queues::starved`] finds
/// them this pass) that were not going on at the last pass, whose groups `noted` remembers: each
/// starvation is noted once, when it begins, however many passes it lasts. `noted` becomes this
/// pass's groups, so a group starved again later is noted again.
fn begun_starving(
    noted: &mut BTreeSet<(String, String)>,
    starved: Vec<(String, String, Vec<String>)>,
) -> Vec<(String, String, Vec<String>)> {
    let current: BTreeSet<(String, String)> = starved.iter().map(|(q, g, _)| (q.clone(), g.clone())).collect();
    let begun = starved.into_iter().filter(|(q, g, _)| !noted.contains(&(q.clone(), g.clone()))).collect();
    *noted = current;
    begun
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_starvation_is_noted_when_it_begins_and_again_only_after_it_ended() {
        let starving = |group: &str| ("q".to_string(), group.to_string(), vec!["s1".to_string()]);
        let mut noted = BTreeSet::new();
        assert_eq!(begun_starving(&mut noted, vec![starving("s2")]), vec![starving("s2")]);
        assert!(begun_starving(&mut noted, vec![starving("s2")]).is_empty(), "still the same starvation");
        assert_eq!(begun_starving(&mut noted, vec![starving("s2"), starving("s3")]), vec![starving("s3")]);
        assert!(begun_starving(&mut noted, Vec::new()).is_empty());
        assert_eq!(begun_starving(&mut noted, vec![starving("s2")]), vec![starving("s2")], "a new starvation");
    }
}
