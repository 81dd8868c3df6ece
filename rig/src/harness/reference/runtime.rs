//! Seed 004's runtime questions, as the reference harness answers them (and the known-bad
//! policies that answer them wrong).
//!
//! - `redo-completed-rounds`: recovery that is correct and wasteful. A turn taken up again
//!   after an interruption is run from the step it was delivered at, so every round it had
//!   completed is asked of the model again; the actions of those rounds are recorded complete
//!   and are not sent again. Only the `recovery-cost` oracle sees it: the work beyond the
//!   uncut run.

use super::{Policy, TurnRequest, Worker};
use serde_json::{json, Value};

impl Worker {
    /// Under `redo-completed-rounds`, takes a resumed turn back to its delivered step.
    pub(super) fn redo_completed_rounds(&self, request: &TurnRequest, record: &mut Value) {
        let step = record["step"].as_u64().unwrap_or(0);
        if self.policy != Policy::RedoCompletedRounds || step <= request.step {
            return;
        }
        self.note("rounds_redone", json!({ "turn_id": request.turn_id, "from_step": request.step, "step": step }));
        record["step"] = json!(request.step);
        record["reply"] = Value::Null;
    }
}
