//! Plain shared counters in the fleet's store, beside the token buckets: read one, or add to
//! one and give it an expiry (INCRBY + PEXPIREAT in one MULTI), each within
//! `ratelimit.timeout` on the calling thread's connection, with the same outage handling as
//! a bucket check. Used by fleet-wide token budgets (`crate::budget::fleet`).

use std::sync::Arc;
use std::time::Duration;

use super::metrics::StoreErrorReason;
use super::outage::Outage;
use super::store::Store;
use super::FleetLimiter;
use crate::config::OnStoreError;

/// A handle on the store's counters (cheap to clone, usable from any task).
#[derive(Clone)]
pub(crate) struct FleetCounter {
    store: Arc<Store>,
    outage: Arc<Outage>,
    timeout: Duration,
    prefix: String,
    pub(crate) on_error: OnStoreError,
}

impl FleetLimiter {
    /// Its store's counters.
    pub(crate) fn counter(&self) -> FleetCounter {
        FleetCounter {
            store: self.store.clone(),
            outage: self.outage.clone(),
            timeout: self.timeout,
            prefix: self.prefix.clone(),
            on_error: self.on_error,
        }
    }
}

impl FleetCounter {
    /// The key `name` under `ratelimit.key_prefix`.
    pub(crate) fn key(&self, name: &str) -> String {
        format!("{}{name}", self.prefix)
    }

    /// The counter's value (0 when it does not exist).
    pub(crate) async fn get(&self, key: &str) -> Result<u64, StoreErrorReason> {
        let Some(mut conn) = self.store.connection() else {
            return Err(self.failed(StoreErrorReason::Unreachable, "not connected"));
        };
        let mut cmd = redis::cmd("GET");
        cmd.arg(key);
        let answer =
            tokio::time::timeout(self.timeout, cmd.query_async::<Option<u64>>(&mut conn)).await;
        self.answered(answer).map(Option::unwrap_or_default)
    }

    /// Adds `n` to the counter, which expires at `expire_at_ms` (ms since the epoch); its
    /// value after.
    pub(crate) async fn add(
        &self,
        key: &str,
        n: u64,
        expire_at_ms: u64,
    ) -> Result<u64, StoreErrorReason> {
        let Some(mut conn) = self.store.connection() else {
            return Err(self.failed(StoreErrorReason::Unreachable, "not connected"));
        };
        let mut pipe = redis::pipe();
        pipe.atomic()
            .cmd("INCRBY")
            .arg(key)
            .arg(n)
            .cmd("PEXPIREAT")
            .arg(key)
            .arg(expire_at_ms)
            .ignore();
        let answer =
            tokio::time::timeout(self.timeout, pipe.query_async::<(u64,)>(&mut conn)).await;
        self.answered(answer).map(|(v,)| v)
    }

    fn answered<T>(
        &self,
        answer: Result<redis::RedisResult<T>, tokio::time::error::Elapsed>,
    ) -> Result<T, StoreErrorReason> {
        match answer {
            Ok(Ok(v)) => {
                self.outage.answered(|| self.store.all_connected());
                Ok(v)
            }
            Ok(Err(e)) if e.is_io_error() || e.is_unrecoverable_error() => {
                self.store.broke();
                Err(self.failed(StoreErrorReason::Io, &e.to_string()))
            }
            Ok(Err(e)) => Err(self.failed(StoreErrorReason::Reply, &e.to_string())),
            Err(_) => Err(self.failed(StoreErrorReason::Timeout, "no answer in time")),
        }
    }

    fn failed(&self, reason: StoreErrorReason, detail: &str) -> StoreErrorReason {
        self.outage.check_failed(reason, detail);
        reason
    }
}
