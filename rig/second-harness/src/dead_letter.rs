//! Dead letters: a turn delivery the queue gave up on. The contract's "Queue deliveries and dead
//! letters": answering the offer means the harness has durably dealt with it; this harness holds
//! the turn it carried for a person, naming the dead letter, and answers only once the hold is
//! in the store (an error has the queue offer it again).

use crate::turn::{is_current, Ended, TURN_SCOPE};
use crate::{text, Worker};
use rig::{Bus, ErrorBody};
use serde_json::{json, Value};
use std::rc::Rc;

impl Worker {
    /// `{host}::dead-letter {queue, message_id, function_id, data, deliveries, reason}`.
    pub(crate) async fn dead_letter(self: &Rc<Self>, bus: &Bus, offer: &Value) -> Result<Value, ErrorBody> {
        let delivery = &offer["data"];
        let session = text(delivery, "session_id")?;
        let lock = self.session_lock(&session);
        let _working = lock.lock().await;
        let unavailable = |e: String| ErrorBody::new("unavailable", e);
        let record = self.get(bus, TURN_SCOPE, &session).await.map_err(unavailable)?;
        // A call that names only its session (an import) carried the session's turn.
        let turn_id = delivery["turn_id"]
            .as_str()
            .map_or_else(|| record["turn_id"].as_str().unwrap_or_default().to_string(), str::to_string);
        // A turn that has moved on (ended, held, or followed by another) owes the letter nothing
        // of itself. But the worker that ran it may have been cut off before it finished what
        // comes after an end (input admitted as a new turn, that turn put on the queue), and the
        // deliveries that would have found it so went to nobody: this offer is the last one.
        if !is_current(&record, &turn_id, 0) {
            self.finish_after_a_crash(bus, &session, &record).await;
            return Ok(json!({ "session_id": session, "turn_id": turn_id, "held": false }));
        }
        // The queue offers its letters to this worker's handler whoever ran the turn: a session
        // it handed over is taken back (the importer may be gone, and nobody else will deal
        // with the letter), unless the importer still holds the lease.
        let handed_over = self.exported.borrow().contains(&session);
        if let Err(refused) = self.own(bus, &session, true).await {
            if handed_over {
                self.exported.borrow_mut().insert(session.clone());
            }
            return Err(refused);
        }
        let record = self.read_owned(bus, &session).await?;
        if !is_current(&record, &turn_id, 0) {
            self.release(bus, &session).await;
            return Ok(json!({ "session_id": session, "turn_id": turn_id, "held": false }));
        }
        if handed_over {
            // A switch left half done, as a take-back finds it: the turn is driven on here, and
            // the letter answered once its end is in the store.
            let reply = self.continue_turn(bus, record).await?;
            if reply["finalized"] == false {
                return Err(unavailable("the end of the taken-back turn is not in the store yet".into()));
            }
            return Ok(json!({ "session_id": session, "turn_id": turn_id, "held": false, "driven_on": reply }));
        }
        let why = format!(
            "dead letter {} of queue {}: {} deliveries of {} failed ({}); a person decides what the turn does next",
            offer["message_id"].as_str().unwrap_or("?"),
            offer["queue"].as_str().unwrap_or("?"),
            offer["deliveries"],
            offer["function_id"].as_str().unwrap_or("?"),
            offer["reason"].as_str().unwrap_or("no reason given"),
        );
        match self.end(bus, record, "held", Some(why)).await {
            Ended::Recorded { durable: true, .. } => {
                self.release(bus, &session).await;
                Ok(json!({ "session_id": session, "turn_id": turn_id, "held": true }))
            }
            // The hold is still owed (written in the background): not dealt with yet.
            Ended::Recorded { durable: false, .. } => {
                Err(ErrorBody::new("unavailable", "the hold of the dead-lettered turn is not in the store yet"))
            }
            Ended::Superseded(_) => Err(ErrorBody::new("not_owner", format!("session {session} has a newer owner"))),
            Ended::Unfinished(why) => {
                self.release(bus, &session).await;
                Err(ErrorBody::new("unavailable", why))
            }
        }
    }
}
