//! The queue worker of the simulated world: named FIFO queues with message groups, delivery by
//! invoking the target function through the engine, acknowledgement on its result, visibility
//! deadlines, redelivery with backoff and a dead-letter queue. The rules are in [`state`].

mod state;

pub use state::{Dispatch, QueueConfig, Queues, Retry, MESSAGES_MAX};

use crate::bus::{Answer, Bus, ErrorBody, Invocation, InvokeError, Provider, QUEUE_ENQUEUE};
use crate::sim::world::World;
use serde_json::{json, Value};
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use tokio::sync::Notify;

/// The functions the queue worker serves.
pub const FUNCTIONS: [&str; 4] = [QUEUE_ENQUEUE, "queue::define", "queue::inspect", "engine::queue::topic_stats"];
/// The queue's host name.
pub const HOST: &str = "queue";
/// How often a disconnected queue looks again for its engine connection before polling.
const RECONNECT_CHECK_MS: u64 = 50;

/// The queue worker, started afresh on every (re)start of its host; its queues are durable.
pub struct QueueWorker {
    world: Rc<World>,
    bus: Bus,
    wake: Notify,
}

impl QueueWorker {
    /// Starts the worker: deliveries it was waiting on before a crash are made available again,
    /// and the delivery pump starts.
    pub fn start(world: Rc<World>, bus: Bus) -> Rc<Self> {
        let recovered = world.queues.borrow_mut().recover_after_restart(world.clock.now_ms());
        if recovered > 0 {
            world.note_event(HOST, "queue_recovered", json!({ "deliveries": recovered }));
        }
        let worker = Rc::new(Self { world, bus, wake: Notify::new() });
        tokio::task::spawn_local(Rc::clone(&worker).pump());
        worker
    }

    fn note(&self, what: &str, detail: Value) {
        self.world.note_event(HOST, what, detail);
    }

    fn poll_interval_ms(&self) -> u64 {
        self.world.queues.borrow().poll_interval_ms()
    }

    /// Claims and dispatches whatever the rules allow, then sleeps until something changes:
    /// an enqueue, a settled delivery, or a backoff ending. No periodic polling, so an idle
    /// queue leaves the world quiescent.
    async fn pump(self: Rc<Self>) {
        loop {
            if !self.bus.is_connected() {
                self.world.clock.sleep(RECONNECT_CHECK_MS).await;
                continue;
            }
            let now = self.world.clock.now_ms();
            let dispatches = self.world.queues.borrow_mut().poll(now);
            for dispatch in dispatches {
                self.note(
                    "queue_dispatch",
                    json!({ "queue": dispatch.queue, "message_id": dispatch.message_id, "group": dispatch.group,
                            "function_id": dispatch.function_id, "attempt": dispatch.attempt, "deadline_ms": dispatch.deadline_ms }),
                );
                tokio::task::spawn_local(Rc::clone(&self).deliver(dispatch));
            }
            let next = self.world.queues.borrow().next_available_after(now);
            match next {
                Some(at_ms) => {
                    tokio::select! {
                        biased;
                        () = self.wake.notified() => {}
                        () = self.world.clock.sleep_until(at_ms) => {}
                    }
                }
                None => self.wake.notified().await,
            }
            self.world.clock.sleep(self.poll_interval_ms()).await;
        }
    }

    async fn deliver(self: Rc<Self>, dispatch: Dispatch) {
        let outcome = self.bus.invoke(&dispatch.function_id, dispatch.data.clone(), dispatch.timeout_ms).await;
        let (queue, id, attempt) = (&dispatch.queue, &dispatch.message_id, dispatch.attempt);
        let reason = match outcome {
            Ok(_) => {
                if self.world.queues.borrow_mut().acknowledge(queue, id, attempt) {
                    self.note("queue_ack", json!({ "queue": queue, "message_id": id, "attempt": attempt }));
                }
                self.wake.notify_one();
                return;
            }
            Err(InvokeError::Timeout { .. }) => "visibility deadline passed",
            Err(InvokeError::Rejected(_)) => "error result",
            Err(InvokeError::Disconnected) => {
                let redeliver_now =
                    self.world.queues.borrow().config(queue).is_some_and(|c| c.redeliver_on_engine_restart);
                if !redeliver_now {
                    self.world.clock.sleep_until(dispatch.deadline_ms).await;
                }
                "engine connection lost"
            }
        };
        let retry = self.world.queues.borrow_mut().retry(queue, id, attempt, self.world.clock.now_ms());
        let detail = json!({ "queue": queue, "message_id": id, "attempt": attempt, "reason": reason });
        match retry {
            Retry::Redeliver { at_ms } => self.note("queue_redeliver", merge(detail, json!({ "at_ms": at_ms }))),
            Retry::DeadLettered => self.note("queue_dead_letter", detail),
            Retry::Stale => {}
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
                let now = self.world.clock.now_ms();
                let id = self
                    .world
                    .queues
                    .borrow_mut()
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
                self.world.queues.borrow_mut().define(&queue, config);
                self.wake.notify_one();
                Ok(json!({ "defined": true }))
            }
            "queue::inspect" => {
                let queue = text("queue").ok_or_else(|| missing("queue"))?;
                self.world.queues.borrow().inspect(&queue).ok_or_else(|| ErrorBody::new("queue_not_found", queue))
            }
            "engine::queue::topic_stats" => {
                let topic = text("topic").ok_or_else(|| missing("topic"))?;
                self.world.queues.borrow().topic_stats(&topic).ok_or_else(|| ErrorBody::new("queue_not_found", topic))
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
