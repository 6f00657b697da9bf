//! Fleet-wide rate limits: a rule whose rate says `scope = "fleet"` spends from one token
//! bucket in the shared store (Redis), so every daemon under the same policy counts together.
//!
//! # Never a hang, never a silent pass
//! A check is atomic: the checks a thread makes at about the same time go as one script
//! call (`batch.rs`, `bucket_script.rs`: EVALSHA, EVAL on NOSCRIPT), each with a
//! deadline (`ratelimit.timeout`, a few milliseconds), on its thread's own connection. With
//! no connection (`store.rs` keeps one per thread up in the background) it fails at once. Without an answer, the rule's request is
//! decided as `ratelimit.on_store_error` says: `local`, counted in this daemon's own bucket
//! for the rule (as a `scope = "local"` rate would be); `deny`, refused with its own error
//! code. Either way the outage is a metric and one log line (`outage.rs`), and the store is
//! used again as soon as it answers. Local rules never touch any of this.
//!
//! # Leases
//! A thread that checks a key often gets a few spare tokens with its answer and spends them
//! without a call for up to `lease::LEASE_TTL`; what it does not spend goes back to the
//! bucket (`lease.rs`). Leased tokens were taken from the bucket, so the fleet never admits
//! more than its rate; it may under-admit what threads hold for a moment, or what a daemon
//! that died held. A lease taken before an outage is still spent during it.
//!
//! # Keys
//! A bucket is per rule and per agent uid or destination host (`ratelimit.fleet_key`), keyed
//! by the rule's id as written, so every host running the same policy names the same key.

mod batch;
mod bucket_script;
mod client;
mod counter;
mod lease;
mod metrics;
mod outage;
mod store;

use std::sync::Arc;
use std::time::Duration;

use prometheus::Registry;
use redis::Script;
use tokio::sync::oneshot;
use tokio::time::Instant;

pub(crate) use client::StoreSetupError;
pub(crate) use counter::FleetCounter;
pub(crate) use metrics::{FleetMetrics, StoreErrorReason};
pub(crate) use outage::StoreStatus;

use super::{AgentKey, RateLimit};
use crate::config::{FleetKey, OnStoreError, RateLimitConfig};
use batch::{Batcher, Check};
use lease::{Take, Terms};
use metrics::LeaseTokens;
use outage::Outage;
use store::Store;

/// What a fleet check decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FleetVerdict {
    /// A token was taken from the fleet's bucket (or this thread's lease of its tokens).
    Allowed,
    /// The fleet's bucket is empty; a token will be there after this long.
    Limited(Duration),
    /// The store did not answer; `on_store_error = "local"`: count in the local bucket.
    Local(StoreErrorReason),
    /// The store did not answer; `on_store_error = "deny"`: refuse.
    Refused(StoreErrorReason),
}

/// The fleet's buckets, shared by every daemon that names the same store.
pub(crate) struct FleetLimiter {
    store: Arc<Store>,
    batcher: Arc<Batcher>,
    outage: Arc<Outage>,
    timeout: Duration,
    prefix: String,
    by: FleetKey,
    on_error: OnStoreError,
}

impl FleetLimiter {
    /// The limiter for `cfg.store`, or `None` without one. `password`: the vault's
    /// (`password_secret`), looked up by the caller. Its series go into `registry`, named
    /// under `namespace`. Nothing connects until [`FleetLimiter::start`].
    pub(crate) fn new(
        cfg: &RateLimitConfig,
        password: Option<String>,
        registry: &Registry,
        namespace: &str,
    ) -> Result<Option<FleetLimiter>, StoreSetupError> {
        let Some(client) = client::client(cfg, password)? else {
            return Ok(None);
        };
        let shown = cfg
            .store
            .as_ref()
            .map(ToString::to_string)
            .unwrap_or_default();
        let metrics = FleetMetrics::register(registry, namespace);
        let outage = Arc::new(Outage::new(shown, cfg.on_store_error, metrics.clone()));
        let store = Arc::new(Store::new(client, outage.clone()));
        let batcher = Arc::new(Batcher {
            store: store.clone(),
            script: Script::new(bucket_script::TOKEN_BUCKET),
            timeout: cfg.timeout,
            metrics,
        });
        Ok(Some(FleetLimiter {
            store,
            batcher,
            outage,
            timeout: cfg.timeout,
            prefix: cfg.key_prefix.clone(),
            by: cfg.fleet_key,
            on_error: cfg.on_store_error,
        }))
    }

    /// Starts keeping a connection up on every connection thread and on the current runtime
    /// (call it on the main one).
    pub(crate) fn start(&self) {
        self.store.start();
    }

    /// Takes one token from the fleet's bucket for `rule` (and the agent or `host`), or from
    /// this thread's lease of its tokens, or says why not, within `ratelimit.timeout`.
    pub(crate) async fn check(
        &self,
        rule: &str,
        agent: AgentKey,
        host: &str,
        rate: RateLimit,
    ) -> FleetVerdict {
        let key = bucket_script::key(&self.prefix, rule, self.by, agent, host);
        let terms = Terms {
            requests: u64::from(rate.requests),
            unit_us: bucket_script::unit_us(&rate),
            burst: u64::from(rate.burst),
        };
        let leases = self.store.leases();
        let (want, returning) = match leases.take(&key, terms, Instant::now()) {
            Take::Leased => {
                self.batcher.metrics.lease(LeaseTokens::Used, 1);
                return FleetVerdict::Allowed;
            }
            Take::Ask { want, returning } => (want, returning),
        };
        self.batcher.give_back(returning.into_iter().collect());
        if self.store.connection().is_none() {
            leases.failed(&key, want);
            return self.failed(StoreErrorReason::Unreachable, "not connected");
        }
        let (answer, answered) = oneshot::channel();
        self.batcher.check(Check {
            key,
            terms,
            want,
            answer,
        });
        match tokio::time::timeout(self.timeout, answered).await {
            Ok(Ok(Ok(reply))) => {
                self.outage.answered(|| self.store.all_connected());
                match bucket_script::parse_reply(reply) {
                    None => FleetVerdict::Allowed,
                    Some(wait) => FleetVerdict::Limited(wait),
                }
            }
            Ok(Ok(Err(f))) => self.failed(f.reason(), f.detail()),
            // The flush went away without an answer (its runtime is stopping).
            Ok(Err(_)) => self.failed(StoreErrorReason::Unreachable, "no answer"),
            Err(_) => self.failed(StoreErrorReason::Timeout, "no answer in time"),
        }
    }

    /// The store's state, as `ctl status` shows it.
    pub(crate) fn status(&self) -> StoreStatus {
        let (connected, threads) = self.store.connected();
        self.outage.status(connected, threads)
    }

    fn failed(&self, reason: StoreErrorReason, detail: &str) -> FleetVerdict {
        self.outage.check_failed(reason, detail);
        match self.on_error {
            OnStoreError::Local => FleetVerdict::Local(reason),
            OnStoreError::Deny => FleetVerdict::Refused(reason),
        }
    }
}

#[cfg(test)]
#[path = "outage_lease_tests.rs"]
mod outage_lease_tests;
