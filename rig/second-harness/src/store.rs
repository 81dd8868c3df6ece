//! The state store as this harness uses it: reads, whole-record writes confirmed by reading back,
//! and the session's ownership lease, whose token fences every write and every effect.

use crate::Worker;
use rig::{Bus, ErrorBody, InvokeError};
use serde_json::{json, Value};
use std::rc::Rc;
use tokio::task::JoinHandle;

/// Where ownership leases are kept, keyed by session (the contract's).
pub(crate) const OWNER_SCOPE: &str = "harness_owner";
/// The statuses after which a turn never runs again (the contract's).
pub(crate) const FINAL: [&str; 3] = ["completed", "failed", "cancelled"];
/// How often an ordinary write or read is tried before the turn gives up on it.
const TRIES: u32 = 3;

/// A lease this worker holds on a session.
pub(crate) struct Lease {
    pub(crate) token: u64,
    renewal: JoinHandle<()>,
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.renewal.abort();
    }
}

/// Where a piece of background work is on its schedule ([`Worker::settling`]).
pub(crate) struct Settling {
    round: u32,
    give_up_at: u64,
}

/// Why a write did not land.
#[derive(Debug)]
pub(crate) enum WriteError {
    /// A newer owner exists: this worker stops writing for the session.
    Fenced,
    /// The record's unit of work had already ended: the stored record.
    Ended(Value),
    /// Not taken, or not known to be, after every try.
    Failed(String),
}

impl WriteError {
    pub(crate) fn describe(&self) -> String {
        match self {
            WriteError::Fenced => "a newer owner holds the session".into(),
            WriteError::Ended(_) => "the turn had already ended".into(),
            WriteError::Failed(why) => why.clone(),
        }
    }
}

impl Worker {
    pub(crate) async fn call(&self, bus: &Bus, function: &str, data: Value) -> Result<Value, InvokeError> {
        bus.invoke(function, data, self.env.config.session_timeout_ms).await
    }

    /// The value at `scope/key` (null when there is none), trying a few times.
    pub(crate) async fn get(&self, bus: &Bus, scope: &str, key: &str) -> Result<Value, String> {
        let mut last = String::new();
        for attempt in 0..TRIES {
            match self.call(bus, "state::get", json!({ "scope": scope, "key": key })).await {
                Ok(value) => return Ok(value),
                Err(error) => last = format!("state::get {scope}/{key}: {error}"),
            }
            self.back_off(attempt).await;
        }
        Err(last)
    }

    /// Writes `value` whole at `scope/key` for `session`, as [`Worker::put`] does, where the
    /// write was decided on the record read as `decided_on` (an ended turn, to be followed by a
    /// new one): a write of unknown outcome is read back, and tried again only while the store
    /// still holds that record. `Ok(false)` when it moved meanwhile (another admission, or a
    /// `send`, started a turn there): this write is then not made again over it. Fenced when
    /// this worker owns the session (or the world has no ownership), unfenced when nobody does.
    pub(crate) async fn put_over(
        &self,
        bus: &Bus,
        (scope, key): (&str, &str),
        value: &Value,
        session: &str,
        decided_on: &Value,
    ) -> Result<bool, WriteError> {
        let fenced = self.env.config.lease_ttl_ms == 0 || self.leases.borrow().contains_key(session);
        let mut last = String::new();
        for attempt in 0..TRIES {
            let mut request = json!({ "scope": scope, "key": key, "value": value });
            if let Some(token) = if fenced { self.fence(session)? } else { None } {
                request["fence"] = json!({ "scope": OWNER_SCOPE, "key": session, "token": token });
            }
            match self.call(bus, "state::set", request).await {
                Ok(_) => return Ok(true),
                Err(InvokeError::Rejected(body)) if body.code == "stale_token" => {
                    self.lose(session);
                    return Err(WriteError::Fenced);
                }
                Err(error) => {
                    last = format!("state::set {scope}/{key}: {error}");
                    if error.outcome_unknown() {
                        match self.get(bus, scope, key).await {
                            Ok(stored) if &stored == value => return Ok(true),
                            Ok(stored) if &stored != decided_on => return Ok(false),
                            _ => {}
                        }
                    }
                }
            }
            if attempt + 1 < TRIES {
                self.back_off(attempt).await;
            }
        }
        Err(WriteError::Failed(last))
    }

    /// Waits until this worker is connected to the engine again, checking every 100 ms, for at
    /// most a minute.
    pub(crate) async fn connected(&self, bus: &Bus) {
        for _ in 0..600 {
            if bus.is_connected() {
                return;
            }
            self.env.clock.sleep(100).await;
        }
    }

    /// The schedule of work this worker settles in the background (an end the store has not
    /// taken, queued input to admit, a new turn to enqueue, what a start finds left over):
    /// tries further apart from the `first` step of the settings' backoff on, each once the
    /// worker is connected to the engine, until `settle_within_ms` has passed (rig::config).
    /// However many tries a long outage refuses, the work is done once the service is back.
    pub(crate) fn settling(&self, first: u32) -> Settling {
        Settling { round: first, give_up_at: self.env.clock.now_ms().saturating_add(self.env.config.settle_within_ms) }
    }

    /// Waits for the next try of `settling`: false once its time is over.
    pub(crate) async fn next_try(&self, bus: &Bus, settling: &mut Settling) -> bool {
        if self.env.clock.now_ms() >= settling.give_up_at {
            return false;
        }
        self.back_off(settling.round).await;
        settling.round = settling.round.saturating_add(1);
        self.connected(bus).await;
        true
    }

    pub(crate) async fn back_off(&self, attempt: u32) {
        let ms = self.env.config.terminalize_backoff_ms.max(1).saturating_mul(1 << attempt.min(6));
        self.env.clock.sleep(ms).await;
    }

    /// The fence every write of `session`'s records carries, when the world has ownership;
    /// `Fenced` when this worker does not hold the session.
    pub(crate) fn fence(&self, session: &str) -> Result<Option<u64>, WriteError> {
        if self.env.config.lease_ttl_ms == 0 {
            return Ok(None);
        }
        if self.exported.borrow().contains(session) {
            return Err(WriteError::Fenced);
        }
        self.leases.borrow().get(session).map(|lease| Some(lease.token)).ok_or(WriteError::Fenced)
    }

    /// Writes `value` whole at `scope/key` for `session`: retried `tries` times, backing off, a
    /// write of unknown outcome confirmed by reading it back. `guard` keeps it from reopening a
    /// turn that ended (a turn record's write).
    pub(crate) async fn put(
        &self,
        bus: &Bus,
        (scope, key): (&str, &str),
        value: &Value,
        session: &str,
        (guard, tries): (bool, u32),
    ) -> Result<(), WriteError> {
        self.put_attempts(bus, (scope, key), value, session, (guard, 0..tries.max(1))).await
    }

    /// [`Worker::put`], making the `attempts` of its schedule (from 0, backing off after each
    /// but the last of `attempts`): a write tried in pieces keeps the schedule of one.
    pub(crate) async fn put_attempts(
        &self,
        bus: &Bus,
        (scope, key): (&str, &str),
        value: &Value,
        session: &str,
        (guard, attempts): (bool, std::ops::Range<u32>),
    ) -> Result<(), WriteError> {
        let mut last = String::new();
        let tries = attempts.end;
        for attempt in attempts {
            let mut request = json!({ "scope": scope, "key": key, "value": value });
            if let Some(token) = self.fence(session)? {
                request["fence"] = json!({ "scope": OWNER_SCOPE, "key": session, "token": token });
            }
            if guard {
                request["guard"] = json!({ "key": "turn_id", "status": "status", "final": FINAL });
            }
            match self.call(bus, "state::set", request).await {
                Ok(_) => return Ok(()),
                Err(InvokeError::Rejected(body)) if body.code == "stale_token" => {
                    self.lose(session);
                    return Err(WriteError::Fenced);
                }
                Err(InvokeError::Rejected(body)) if body.code == "final_state" => {
                    return Err(WriteError::Ended(self.get(bus, scope, key).await.unwrap_or(Value::Null)));
                }
                Err(error) => {
                    last = format!("state::set {scope}/{key}: {error}");
                    if error.outcome_unknown() && self.get(bus, scope, key).await.is_ok_and(|stored| &stored == value) {
                        return Ok(());
                    }
                }
            }
            if attempt + 1 < tries {
                self.back_off(attempt).await;
            }
        }
        Err(WriteError::Failed(last))
    }

    /// Takes the session's lease (when the world has ownership) and renews it in the background.
    /// A worker that exported the session takes no more work for it, until it imports it back
    /// (`claim`).
    pub(crate) async fn own(self: &Rc<Self>, bus: &Bus, session: &str, claim: bool) -> Result<(), ErrorBody> {
        if claim {
            self.exported.borrow_mut().remove(session);
        }
        self.not_exported(session)?;
        let ttl_ms = self.env.config.lease_ttl_ms;
        if ttl_ms == 0 || self.leases.borrow().contains_key(session) {
            return Ok(());
        }
        let request = json!({ "scope": OWNER_SCOPE, "key": session, "owner": self.env.host, "ttl_ms": ttl_ms });
        let asked_at = self.env.clock.now_ms();
        let reply = self.call(bus, "state::acquire-lease", request).await;
        let reply = reply.map_err(|e| ErrorBody::new("unavailable", format!("state::acquire-lease: {e}")))?;
        let Some(token) = reply["token"].as_u64().filter(|_| reply["granted"] == true) else {
            return Err(ErrorBody::new("owned_elsewhere", format!("session {session} is owned by {}", reply["owner"])));
        };
        let renewal =
            tokio::task::spawn_local(Rc::clone(self).renew(bus.clone(), session.to_string(), token, asked_at));
        self.leases.borrow_mut().insert(session.to_string(), Lease { token, renewal });
        Ok(())
    }

    /// `not_owner` for a session this worker handed over.
    pub(crate) fn not_exported(&self, session: &str) -> Result<(), ErrorBody> {
        if self.exported.borrow().contains(session) {
            return Err(ErrorBody::new("not_owner", format!("session {session} was handed over to another worker")));
        }
        Ok(())
    }

    /// Renews the lease of `token`, granted for a request sent at `asked_at`, every third of its
    /// time to live, until a renewal is refused.
    async fn renew(self: Rc<Self>, bus: Bus, session: String, mut token: u64, asked_at: u64) {
        let ttl_ms = self.env.config.lease_ttl_ms;
        let mut live_until = asked_at.saturating_add(ttl_ms);
        loop {
            self.env.clock.sleep((ttl_ms / 3).max(1)).await;
            self.env.wait_while_paused().await;
            let request = json!({ "scope": OWNER_SCOPE, "key": session, "owner": self.env.host, "token": token, "ttl_ms": ttl_ms });
            let asked_at = self.env.clock.now_ms();
            if let Ok(reply) = self.call(&bus, "state::renew-lease", request).await {
                if reply["renewed"] == true {
                    live_until = asked_at.saturating_add(ttl_ms);
                    continue;
                }
                // Refused while the grant this worker heard of still lives: nobody else can
                // have been granted the lease since, so a newer grant is this worker's own (its
                // request delivered twice, both granted, the older answer heard). It carries on
                // with that token rather than let its lease lapse mid-turn with no fault to
                // cause it.
                if asked_at < live_until {
                    if let Some(newer) = self.granted_again(&bus, &session, token).await {
                        token = newer;
                        continue;
                    }
                }
                // Only this grant's lease: a newer one this worker took meanwhile (its own
                // request delivered twice, then asked again) is not lost with it.
                self.lose_grant(&session, token);
                return;
            }
        }
    }

    /// After a refused renewal of `token`: the newer token of a live grant to this worker's
    /// host (one host is one live process), made the token its writes carry. None when the
    /// lease is another's, expired, or no longer the grant of `token` here.
    async fn granted_again(&self, bus: &Bus, session: &str, token: u64) -> Option<u64> {
        let reply = self.call(bus, "state::get-lease", json!({ "scope": OWNER_SCOPE, "key": session })).await.ok()?;
        let newer = reply["token"].as_u64().filter(|newer| *newer > token)?;
        if reply["owner"] != self.env.host.as_str() || reply["expired"] != false {
            return None;
        }
        let mut leases = self.leases.borrow_mut();
        let lease = leases.get_mut(session).filter(|lease| lease.token == token)?;
        lease.token = newer;
        Some(newer)
    }

    /// Forgets a lease that a newer owner took.
    pub(crate) fn lose(&self, session: &str) {
        let lease = self.leases.borrow_mut().remove(session);
        if let Some(lease) = lease {
            // The renewal may be this very task: detach rather than abort it mid-poll.
            std::mem::forget(lease);
        }
    }

    /// Forgets the session's lease only if it is still the grant of `token`.
    fn lose_grant(&self, session: &str, token: u64) {
        let held = self.leases.borrow().get(session).map(|lease| lease.token);
        if held == Some(token) {
            self.lose(session);
        }
    }

    /// Hands the session's lease back, once its turn needs no more work.
    /// A lease an owed end still needs is kept: that end hands it back once it lands (unless the
    /// session is handed over: the end is then the importer's to settle, and the lease its).
    pub(crate) async fn release(&self, bus: &Bus, session: &str) {
        if self.owing.borrow().contains_key(session) && !self.exported.borrow().contains(session) {
            return;
        }
        let lease = self.leases.borrow_mut().remove(session);
        let Some(lease) = lease else { return };
        let request = json!({ "scope": OWNER_SCOPE, "key": session, "owner": self.env.host, "token": lease.token });
        drop(lease);
        let _ = self.call(bus, "state::release-lease", request).await;
    }
}
