//! Where a session stands (`{host}::status`), and telling the functions bound to
//! `turn-completed` once a turn's end is durable: both read only the store, so any worker
//! answers the same, whoever ran the turn and whatever it remembers.

use crate::actions::{DONE, HELD, NOT_DONE};
use crate::input::INPUT_SCOPE;
use crate::store::FINAL;
use crate::turn::TURN_SCOPE;
use crate::{text, Worker, ACTION_SCOPE};
use rig::{BindingPoint, Bus, ErrorBody};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::rc::Rc;

impl Worker {
    /// `{host}::status {session_id}`: the contract's `{session_id, turn_id, status, step,
    /// pending_calls, queued, children}`, read from the store at the moment of asking. The turn
    /// record is read last, after the listings of the queued input and of the session's actions:
    /// reading those takes a while (longer when the store is slow, or a listing is refused and
    /// tried again), and a reply built from a turn record read before them could say `running`
    /// of a turn that ended meanwhile.
    pub(crate) async fn status(self: &Rc<Self>, bus: &Bus, data: &Value) -> Result<Value, ErrorBody> {
        let session = text(data, "session_id")?;
        let of_session = |entry: &Value| entry["value"]["session_id"] == session.as_str();
        let queued: Vec<Value> = self
            .list(bus, INPUT_SCOPE)
            .await?
            .iter()
            .filter(|e| of_session(e))
            .map(|e| e["value"]["message"].clone())
            .collect();
        let actions: BTreeMap<String, Value> = self
            .list(bus, ACTION_SCOPE)
            .await?
            .into_iter()
            .filter(of_session)
            .filter_map(|e| Some((e["key"].as_str()?.to_string(), e["value"].clone())))
            .collect();
        let record = self.get(bus, TURN_SCOPE, &session).await.map_err(|e| ErrorBody::new("unavailable", e))?;
        let mut pending = Vec::new();
        for call in record["plan"]["calls"].as_array().into_iter().flatten() {
            let id = call["action_id"].as_str().unwrap_or_default();
            let action = actions.get(id).unwrap_or(&Value::Null);
            match action["status"].as_str() {
                Some(DONE | NOT_DONE) => {}
                Some(HELD) => pending.push(json!({ "id": id, "status": HELD, "reason": action["held_reason"] })),
                // Planned and not yet sent (or not when the actions were listed), or sent with no
                // outcome recorded.
                other => pending.push(json!({ "id": id, "status": other.unwrap_or("planned") })),
            }
        }
        Ok(json!({
            "session_id": session, "turn_id": record["turn_id"], "status": record["status"], "step": record["step"],
            "pending_calls": pending, "queued": queued, "children": [],
        }))
    }

    async fn list(&self, bus: &Bus, scope: &str) -> Result<Vec<Value>, ErrorBody> {
        let listed = self.call(bus, "state::list", json!({ "scope": scope })).await;
        match listed.map_err(|e| ErrorBody::new("unavailable", format!("state::list {scope}: {e}")))? {
            Value::Array(entries) => Ok(entries),
            _ => Ok(Vec::new()),
        }
    }

    /// Tells every function bound to `turn-completed` that the turn ended, if its end in the
    /// store is terminal: at least once (a worker that finds an ended turn tells again, in case
    /// the one that ended it died first), always with the same payload.
    pub(crate) async fn tell_completed(&self, bus: &Bus, record: &Value) {
        let Some(status) = record["status"].as_str().filter(|s| FINAL.contains(s)) else { return };
        let payload = json!({ "session_id": record["session_id"], "turn_id": record["turn_id"], "status": status });
        let bound = self.env.config.bindings.iter().filter(|b| b.trigger == BindingPoint::TurnCompleted);
        for binding in bound {
            for attempt in 0..3 {
                if self.call(bus, &binding.function, payload.clone()).await.is_ok() {
                    break;
                }
                self.back_off(attempt).await;
            }
        }
    }
}
