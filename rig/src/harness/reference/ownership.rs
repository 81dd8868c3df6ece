//! Ownership of a session: a lease with an expiry and a fencing token, held while healthy.
//!
//! The harness acquires the session's lease before it works on a turn, renews it while it is
//! healthy, and attaches the token to every protected write and effect request. Safety does not
//! rest on the harness checking its lease: the store and the effect services reject requests
//! carrying a token older than the latest issued, so a worker that wakes after a pause cannot
//! commit once its replacement holds a newer token.

use super::{Policy, Worker};
use crate::bus::{Bus, ErrorBody};
use serde_json::{json, Value};
use std::rc::Rc;
use tokio::task::JoinHandle;

/// The scope of ownership records in the store; the key is the session id.
pub const OWNER_SCOPE: &str = "harness_owner";

/// Why this worker may not work on a session.
pub(super) enum NotOwner {
    /// Another worker holds the session's lease: who, and until when.
    Refused(String),
    /// The store did not say (the grant timed out, was refused with an error, or was granted
    /// with its answer lost, so this worker may even hold it).
    Unknown(String),
}

impl NotOwner {
    pub(super) fn reason(&self) -> &str {
        match self {
            NotOwner::Refused(reason) | NotOwner::Unknown(reason) => reason,
        }
    }

    /// The answer to a call asking for work on the session: while another worker holds it, a
    /// skip (the owner does the work); while ownership is unknown, an error, so whoever asked (a
    /// queue, a person) asks again: nobody else may be doing it.
    pub(super) fn answer(self, session_id: &str) -> Result<Value, ErrorBody> {
        match self {
            NotOwner::Refused(reason) => Ok(
                json!({ "session_id": session_id, "status": "held", "skipped": true, "next_step": null, "reason": reason }),
            ),
            NotOwner::Unknown(reason) => Err(ErrorBody::new("unavailable", reason)),
        }
    }
}

/// A lease this worker holds on one session, renewed in the background.
pub(super) struct HeldLease {
    renewal: JoinHandle<()>,
}

impl Drop for HeldLease {
    fn drop(&mut self) {
        self.renewal.abort();
    }
}

impl Worker {
    fn ownership_enabled(&self) -> bool {
        self.env.config.lease_ttl_ms > 0
    }

    /// Makes sure this worker owns the session; otherwise answers why it may not work on it.
    pub(super) async fn ensure_ownership(self: &Rc<Self>, bus: &Bus, session_id: &str) -> Result<(), NotOwner> {
        if !self.ownership_enabled() || self.leases.borrow().contains_key(session_id) {
            return Ok(());
        }
        let request = json!({ "scope": OWNER_SCOPE, "key": session_id, "owner": self.env.host, "ttl_ms": self.env.config.lease_ttl_ms });
        let asked_at = self.now();
        match bus.invoke("state::acquire-lease", request, self.env.config.session_timeout_ms).await {
            Ok(grant) if grant["granted"] == json!(true) => {
                let token = grant["token"].as_u64().unwrap_or(0);
                self.note("lease_acquired", json!({ "session_id": session_id, "token": token }));
                let renewal = match self.policy {
                    // The known-bad lease: taken, and left to run out.
                    Policy::NoRenewal => tokio::task::spawn_local(async {}),
                    _ => tokio::task::spawn_local(Rc::clone(self).renew(
                        bus.clone(),
                        session_id.to_string(),
                        token,
                        asked_at,
                    )),
                };
                self.leases.borrow_mut().insert(session_id.to_string(), HeldLease { renewal });
                self.tokens.borrow_mut().insert(session_id.to_string(), token);
                Ok(())
            }
            Ok(refusal) => {
                Err(NotOwner::Refused(format!("owned by {} until {} ms", refusal["owner"], refusal["expires_at_ms"])))
            }
            Err(error) => Err(NotOwner::Unknown(format!("ownership unknown: {error}"))),
        }
    }

    /// Renews the lease every third of its time to live while the worker is healthy (a paused
    /// worker renews nothing); stops when a renewal is refused.
    /// (`asked_at`: when the grant was asked for; the lease lives at least `ttl_ms` from then.)
    async fn renew(self: Rc<Self>, bus: Bus, session_id: String, token: u64, asked_at: u64) {
        let ttl_ms = self.env.config.lease_ttl_ms;
        let (mut token, mut live_until) = (token, asked_at.saturating_add(ttl_ms));
        loop {
            // (The planted bug: renewed once per time to live, as the lease runs out.)
            let every = if crate::planted!("ref-lease-renewed-every-ttl") { ttl_ms } else { ttl_ms / 3 };
            self.env.clock.sleep(every.max(1)).await;
            if !crate::planted!("ref-lease-renewed-while-paused") {
                self.env.wait_while_paused().await;
            }
            let request = json!({ "scope": OWNER_SCOPE, "key": session_id, "owner": self.env.host, "token": token, "ttl_ms": ttl_ms });
            let asked_at = self.now();
            match bus.invoke("state::renew-lease", request, self.env.config.session_timeout_ms).await {
                Ok(reply) if reply["renewed"] == json!(true) => live_until = asked_at.saturating_add(ttl_ms),
                Ok(reply) if reply["renewed"] == json!(false) => {
                    // Refused while the lease this worker was granted still lives: no other
                    // worker can have been granted it since, so a newer grant is its own.
                    // (A refusal after that, the worker held up past it, is a lease lost.)
                    if asked_at < live_until {
                        if let Some(granted) = self.granted_again(&bus, &session_id, token).await {
                            token = granted;
                            continue;
                        }
                    }
                    self.note(
                        "lease_lost",
                        json!({ "session_id": session_id, "token": token, "current": reply["token"] }),
                    );
                    self.forget_lease(&session_id);
                    return;
                }
                // (The planted bug: a renewal that got no answer taken as a lost lease: renewing stops.)
                Err(_) if crate::planted!("ref-renewal-error-taken-as-lost") => {
                    self.forget_lease(&session_id);
                    return;
                }
                _ => {}
            }
        }
    }

    /// After a refused renewal: the newer token the store granted this worker itself, while its
    /// lease is live. A grant request the network delivered twice is granted twice (the answer
    /// that arrives carries the older token), and the lease is still this worker's: it carries
    /// on with the newer token (its writes and renewals carry it from now on) rather than give
    /// the lease up and let it lapse with no fault to cause it. A worker's host names one live
    /// process, so a grant to this host is this worker's.
    async fn granted_again(&self, bus: &Bus, session_id: &str, token: u64) -> Option<u64> {
        let request = json!({ "scope": OWNER_SCOPE, "key": session_id });
        let lease = bus.invoke("state::get-lease", request, self.env.config.session_timeout_ms).await.ok()?;
        let newer = lease["token"].as_u64().filter(|newer| *newer > token)?;
        if lease["owner"] != json!(self.env.host) || lease["expired"] != json!(false) {
            return None;
        }
        self.note("lease_granted_again", json!({ "session_id": session_id, "token": token, "newer": newer }));
        self.tokens.borrow_mut().insert(session_id.to_string(), newer);
        Some(newer)
    }

    /// Stops renewing a lease this worker no longer holds (refused renewal, a stale-token
    /// rejection). Its token stays what this worker's writes carry: work already under way
    /// still presents it, and only the store and the services may refuse it.
    pub(super) fn forget_lease(&self, session_id: &str) {
        self.leases.borrow_mut().remove(session_id);
    }

    /// Hands ownership over: releases the lease, so a replacement can take it at once.
    pub(super) async fn release_lease(&self, bus: &Bus, session_id: &str) {
        if !self.leases.borrow().contains_key(session_id) {
            return;
        }
        let Some(token) = self.lease_token(session_id) else { return };
        let request = json!({ "scope": OWNER_SCOPE, "key": session_id, "owner": self.env.host, "token": token });
        let _ = bus.invoke("state::release-lease", request, self.env.config.session_timeout_ms).await;
        self.forget_lease(session_id);
        self.note("lease_released", json!({ "session_id": session_id, "token": token }));
    }

    /// The token this worker was last granted for the session, held or not.
    pub(super) fn lease_token(&self, session_id: &str) -> Option<u64> {
        self.tokens.borrow().get(session_id).copied()
    }

    /// The fence a protected store write carries (none under `no-fencing` and
    /// `fence-effects-only`).
    pub(super) fn store_fence(&self, session_id: &str) -> Option<Value> {
        let unfenced = matches!(self.policy, Policy::NoFencing | Policy::FenceEffectsOnly);
        let token = self.lease_token(session_id).filter(|_| !unfenced)?;
        Some(json!({ "scope": OWNER_SCOPE, "key": session_id, "token": token }))
    }

    /// The fencing an effect request carries (none under `no-fencing`).
    pub(super) fn effect_fence(&self, session_id: &str) -> Option<Value> {
        let token = self.lease_token(session_id).filter(|_| self.policy != Policy::NoFencing)?;
        Some(json!({ "domain": format!("{OWNER_SCOPE}/{session_id}"), "token": token }))
    }
}
