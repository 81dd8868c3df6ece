//! The state store as this harness uses it: reads tried a few times, whole-record writes
//! guarded and fenced and confirmed by reading back when their outcome is unknown, and the
//! session's ownership lease.

use crate::Worker;
use rig::{Bus, InvokeError};
use serde_json::{json, Value};
use std::rc::Rc;
use tokio::task::JoinHandle;

pub(crate) const TURN_SCOPE: &str = "harness_turn";
pub(crate) const OWNER_SCOPE: &str = "harness_owner";
/// The statuses after which a turn never runs again.
pub(crate) const ENDED: [&str; 3] = ["completed", "failed", "cancelled"];
/// How often a read, or an ordinary write, is tried before the work gives up on it.
pub(crate) const TRIES: u32 = 3;

/// A lease this worker holds on a session; dropping it stops its renewal.
pub(crate) struct Lease {
    pub(crate) token: u64,
    renewal: JoinHandle<()>,
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.renewal.abort();
    }
}

/// Why a write did not land.
#[derive(Debug)]
pub(crate) enum Unwritten {
    /// A newer owner holds the session: this worker writes nothing more for it.
    Fenced,
    /// The turn had already ended.
    Ended,
    /// Not taken, or not known to be, after every try.
    Failed(String),
}

impl Unwritten {
    pub(crate) fn why(&self) -> String {
        match self {
            Unwritten::Fenced => "a newer owner holds the session".into(),
            Unwritten::Ended => "the turn had already ended".into(),
            Unwritten::Failed(why) => why.clone(),
        }
    }
}

/// Whether a turn record has ended.
pub(crate) fn ended(record: &Value) -> bool {
    record["status"].as_str().is_some_and(|status| ENDED.contains(&status))
}

impl Worker {
    pub(crate) async fn call(&self, bus: &Bus, function: &str, data: Value) -> Result<Value, InvokeError> {
        bus.invoke(function, data, self.env.config.session_timeout_ms).await
    }

    /// Waits until this worker is connected to the engine, looking every 100 ms, for at most
    /// ten minutes.
    pub(crate) async fn connected(&self, bus: &Bus) {
        for _ in 0..6_000 {
            if bus.is_connected() {
                return;
            }
            self.env.clock.sleep(100).await;
        }
    }

    /// Sleeps the settings' backoff for the `attempt`th retry, doubling, at most 5 s.
    pub(crate) async fn back_off(&self, attempt: u32) {
        let ms = self.env.config.terminalize_backoff_ms.max(1).saturating_mul(1 << attempt.min(16)).min(5_000);
        self.env.clock.sleep(ms).await;
    }

    /// The value at `scope/key` (null for none), tried a few times.
    pub(crate) async fn read(&self, bus: &Bus, scope: &str, key: &str) -> Result<Value, String> {
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

    /// The session's turn record.
    pub(crate) async fn read_turn(&self, bus: &Bus, session: &str) -> Result<Value, String> {
        self.read(bus, TURN_SCOPE, session).await
    }

    /// The fence of `session`'s writes: none without ownership in this world; `Fenced` when
    /// the world has it and this worker does not hold the session.
    pub(crate) fn fence(&self, session: &str) -> Result<Option<u64>, Unwritten> {
        if self.env.config.lease_ttl_ms == 0 {
            return Ok(None);
        }
        match self.leases.borrow().get(session) {
            Some(lease) => Ok(Some(lease.token)),
            // (The planted bug: a worker that lost its lease writes unfenced, "nothing to fence with".)
            None if rig::planted!("small-unfenced-without-a-lease") => Ok(None),
            None => Err(Unwritten::Fenced),
        }
    }

    /// Writes the turn record whole, `tries` times at most: guarded (it never reopens an
    /// ended turn), fenced by the session's lease, an unknown outcome read back.
    pub(crate) async fn write_turn(&self, bus: &Bus, record: &Value, tries: u32) -> Result<(), Unwritten> {
        let session = record["session_id"].as_str().unwrap_or_default().to_string();
        let mut last = String::new();
        for attempt in 0..tries.max(1) {
            let mut request = json!({
                "scope": TURN_SCOPE, "key": session, "value": record,
                "guard": { "key": "turn_id", "status": "status", "final": ENDED },
            });
            if let Some(token) = self.fence(&session)? {
                request["fence"] = json!({ "scope": OWNER_SCOPE, "key": session, "token": token });
            }
            match self.call(bus, "state::set", request).await {
                Ok(_) => return Ok(()),
                Err(InvokeError::Rejected(body)) if body.code == "stale_token" => {
                    self.lose(&session);
                    return Err(Unwritten::Fenced);
                }
                Err(InvokeError::Rejected(body)) if body.code == "final_state" => return Err(Unwritten::Ended),
                Err(error) => {
                    last = format!("state::set {TURN_SCOPE}/{session}: {error}");
                    let same = |stored: &Value| match rig::planted!("small-readback-compares-the-status") {
                        true => stored["turn_id"] == record["turn_id"] && stored["status"] == record["status"],
                        false => stored == record,
                    };
                    if error.outcome_unknown() {
                        match self.read_turn(bus, &session).await {
                            Ok(stored) if same(&stored) => return Ok(()),
                            // (The planted bug: a write of unknown outcome whose read-back failed too taken as landed.)
                            Err(_) if rig::planted!("small-unread-write-taken-as-landed") => return Ok(()),
                            _ => {}
                        }
                    }
                }
            }
            if attempt + 1 < tries {
                self.back_off(attempt).await;
            }
        }
        Err(Unwritten::Failed(last))
    }

    /// Takes the session's lease when the world has ownership, and renews it in the
    /// background. `Err` with why when another worker holds it.
    pub(crate) async fn own(self: &Rc<Self>, bus: &Bus, session: &str) -> Result<(), String> {
        let ttl_ms = self.env.config.lease_ttl_ms;
        if ttl_ms == 0 || self.leases.borrow().contains_key(session) {
            return Ok(());
        }
        let request = json!({ "scope": OWNER_SCOPE, "key": session, "owner": self.env.host, "ttl_ms": ttl_ms });
        for attempt in 0..TRIES {
            let asked_at = self.env.clock.now_ms();
            let reply = match self.call(bus, "state::acquire-lease", request.clone()).await {
                Ok(reply) => reply,
                Err(error) => {
                    // A grant whose answer was lost is this host's: the next try is refused by
                    // it, and waits it out below.
                    self.back_off(attempt).await;
                    if attempt + 1 == TRIES {
                        return Err(format!("state::acquire-lease: {error}"));
                    }
                    continue;
                }
            };
            if let Some(token) = reply["token"].as_u64().filter(|_| reply["granted"] == true) {
                let renewal =
                    tokio::task::spawn_local(Rc::clone(self).renew(bus.clone(), session.to_string(), token, asked_at));
                self.leases.borrow_mut().insert(session.to_string(), Lease { token, renewal });
                return Ok(());
            }
            // Held by this host's earlier incarnation (or a grant whose answer was lost): it
            // is nobody's work now, so wait for it to run out. Held by another: theirs.
            if reply["owner"] != self.env.host.as_str() {
                return Err(format!("session {session} is owned by {}", reply["owner"]));
            }
            let until = reply["expires_at_ms"].as_u64().unwrap_or(0);
            self.env.clock.sleep_until(until.saturating_add(1)).await;
        }
        Err(format!("the lease of session {session} was not granted"))
    }

    /// Renews the lease of `token`, granted for a request sent at `asked_at`, every third of its
    /// time to live, until a renewal is refused.
    async fn renew(self: Rc<Self>, bus: Bus, session: String, mut token: u64, asked_at: u64) {
        let ttl_ms = self.env.config.lease_ttl_ms;
        let mut live_until = asked_at.saturating_add(ttl_ms);
        loop {
            // (The planted bug: renewed when the time to live is up, "no sooner than needed".)
            let every = if rig::planted!("small-lease-renewed-as-it-runs-out") { ttl_ms } else { ttl_ms / 3 };
            self.env.clock.sleep(every.max(1)).await;
            if !rig::planted!("small-lease-renewed-while-paused") {
                self.env.wait_while_paused().await;
            }
            let request = json!({ "scope": OWNER_SCOPE, "key": session, "owner": self.env.host, "token": token, "ttl_ms": ttl_ms });
            let asked_at = self.env.clock.now_ms();
            if let Ok(reply) = self.call(&bus, "state::renew-lease", request).await {
                if reply["renewed"] == true {
                    live_until = asked_at.saturating_add(ttl_ms);
                    continue;
                }
                // Refused while the grant this worker heard of still lives: nobody else can
                // have been granted the lease since, so a newer grant is this host's own (its
                // request delivered twice, both granted, the older answer heard): carry on with
                // it rather than let the lease lapse mid-turn with no fault to cause it.
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

    /// After a refused renewal of `token`: the newer token of a live grant to this host, made
    /// the token its writes carry. None when the lease is another's, expired, or no longer the
    /// grant of `token` here.
    async fn granted_again(&self, bus: &Bus, session: &str, token: u64) -> Option<u64> {
        let lease = self.call(bus, "state::get-lease", json!({ "scope": OWNER_SCOPE, "key": session })).await.ok()?;
        let newer = lease["token"].as_u64().filter(|newer| *newer > token)?;
        if lease["owner"] != self.env.host.as_str() || lease["expired"] != false {
            return None;
        }
        let mut leases = self.leases.borrow_mut();
        let held = leases.get_mut(session).filter(|held| held.token == token)?;
        held.token = newer;
        Some(newer)
    }

    /// Who holds the session's lease now, if anyone does and it has not run out.
    pub(crate) async fn lease_holder(&self, bus: &Bus, session: &str) -> Option<String> {
        let lease = self.call(bus, "state::get-lease", json!({ "scope": OWNER_SCOPE, "key": session })).await.ok()?;
        (lease["expired"] == false).then(|| lease["owner"].as_str().map(str::to_string)).flatten()
    }

    /// Forgets a lease a newer owner took.
    pub(crate) fn lose(&self, session: &str) {
        if let Some(lease) = self.leases.borrow_mut().remove(session) {
            // This may be the renewal task itself: let it end by itself rather than abort it.
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

    /// Hands the session's lease back: its turn needs no more work from this worker.
    pub(crate) async fn release(&self, bus: &Bus, session: &str) {
        let Some(lease) = self.leases.borrow_mut().remove(session) else { return };
        let request = json!({ "scope": OWNER_SCOPE, "key": session, "owner": self.env.host, "token": lease.token });
        drop(lease);
        for attempt in 0..TRIES {
            if self.call(bus, "state::release-lease", request.clone()).await.is_ok() {
                return;
            }
            self.back_off(attempt).await;
        }
    }

    /// An entry owed to the session's transcript (a call's result the service would not take):
    /// appended in the background, tries further apart, for `settle_within_ms`, so the call it
    /// answers is not left open once the service is back.
    pub(crate) async fn append_owed(self: Rc<Self>, bus: Bus, session: String, entry: Value) {
        let give_up_at = self.env.clock.now_ms().saturating_add(self.env.config.settle_within_ms);
        let request = json!({ "session_id": session, "entry": entry });
        let mut attempt = TRIES;
        while self.env.clock.now_ms() < give_up_at {
            self.back_off(attempt).await;
            attempt += 1;
            self.connected(&bus).await;
            if self.call(&bus, "session::append", request.clone()).await.is_ok() {
                return;
            }
        }
    }

    /// Appends an entry to the session's transcript, tried a few times; its `entry_key` makes a
    /// repeat harmless.
    pub(crate) async fn append(&self, bus: &Bus, session: &str, entry: Value) -> bool {
        let request = json!({ "session_id": session, "entry": entry });
        for attempt in 0..TRIES {
            if self.call(bus, "session::append", request.clone()).await.is_ok() {
                return true;
            }
            self.back_off(attempt).await;
        }
        false
    }
}
