//! The checks a thread makes at about the same time go to the store together: one script
//! call (`bucket_script.rs`) for all of them instead of one per check.
//!
//! Under load many requests on a connection thread check their fleet limit within the same
//! turn of its runtime. Each check joins its thread's queue; the first one into an empty queue
//! spawns a flush on that thread, which runs once the tasks already woken have had their turn
//! (and queued their checks), takes them all and sends them as one EVALSHA per [`MAX_BATCH`]
//! on the thread's connection. Every check is still atomic and still sees the ones before it,
//! so the tokens taken are exactly those of the same checks made one call at a time; what
//! changes is the cost: one round trip, one command for Redis to parse and one script run
//! per batch, where the per-check cost was most of the store's CPU (`bench/fleet.sh`).
//!
//! The same call carries the tokens of this thread's expired leases back to their buckets
//! (`lease.rs`), and its answers become the thread's new leases: the flush records them
//! (`Leases::granted`), and starts the thread's sweep that returns leases nobody spent.
//!
//! A check waits for its answer at most `ratelimit.timeout` from when it joined the queue,
//! whatever happens to the batch; the flush itself is bounded by the same deadline. Nothing
//! here ever waits on a lock held across an await: the queue's lock is held only to push or
//! to take.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::Script;
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::lease::{Return, Terms};
use super::metrics::{FleetMetrics, LeaseTokens, StoreErrorReason};
use super::store::Store;

/// The most keys (checks and returns) in one script call (bounds the command's size and the
/// script's run).
pub(super) const MAX_BATCH: usize = 128;

/// One check waiting in a queue: it asks for `want` tokens, its own included.
pub(super) struct Check {
    pub key: String,
    pub terms: Terms,
    pub want: u32,
    /// (tokens granted, µs until one is there when none was).
    pub answer: oneshot::Sender<Result<(i64, i64), Failed>>,
}

/// Why a batch got no answer (each of its checks is told).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Failed {
    /// No connection on this thread when the batch went out.
    NotConnected,
    /// No answer within the deadline.
    Timeout,
    /// The connection broke.
    Io(String),
    /// The store answered with an error, or with something the script never returns.
    Reply(String),
}

impl Failed {
    pub(super) fn reason(&self) -> StoreErrorReason {
        match self {
            Failed::NotConnected => StoreErrorReason::Unreachable,
            Failed::Timeout => StoreErrorReason::Timeout,
            Failed::Io(_) => StoreErrorReason::Io,
            Failed::Reply(_) => StoreErrorReason::Reply,
        }
    }

    pub(super) fn detail(&self) -> &str {
        match self {
            Failed::NotConnected => "not connected",
            Failed::Timeout => "no answer in time",
            Failed::Io(d) | Failed::Reply(d) => d,
        }
    }
}

/// What one script call carries: returns first (so a batch's checks can spend them).
#[derive(Default)]
struct Batch {
    returns: Vec<Return>,
    checks: Vec<Check>,
}

impl Batch {
    fn len(&self) -> usize {
        self.returns.len() + self.checks.len()
    }
}

/// One thread's checks and returns not yet sent.
#[derive(Default)]
pub(super) struct Queue {
    pending: Mutex<Batch>,
}

impl Queue {
    fn lock(&self) -> std::sync::MutexGuard<'_, Batch> {
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Adds a check; true when the queue was empty (the caller then starts a flush).
    fn push(&self, check: Check) -> bool {
        let mut q = self.lock();
        q.checks.push(check);
        q.len() == 1
    }

    /// Adds returns; true when the queue was empty before.
    fn push_returns(&self, returns: Vec<Return>) -> bool {
        let mut q = self.lock();
        let was_empty = q.len() == 0;
        q.returns.extend(returns);
        was_empty
    }

    /// Takes everything waiting.
    fn take(&self) -> Batch {
        std::mem::take(&mut *self.lock())
    }
}

/// Sends the calling thread's checks and returns to the store, and keeps what it grants.
pub(super) struct Batcher {
    pub store: Arc<Store>,
    pub script: Script,
    pub timeout: Duration,
    pub metrics: FleetMetrics,
}

impl Batcher {
    /// Queues `check` on the calling thread; the check that finds the queue empty spawns the
    /// flush (on this thread, after the tasks already woken have queued theirs).
    pub(super) fn check(self: &Arc<Self>, check: Check) {
        if self.store.queue().push(check) {
            tokio::spawn(self.clone().flush());
        }
    }

    /// Queues leased tokens to go back to their buckets with the thread's next call.
    pub(super) fn give_back(self: &Arc<Self>, returns: Vec<Return>) {
        if returns.is_empty() {
            return;
        }
        if self.store.queue().push_returns(returns) {
            tokio::spawn(self.clone().flush());
        }
    }

    /// Returns this thread's leases as they expire, for as long as it has any.
    async fn sweep(self: Arc<Self>) {
        loop {
            let (back, next) = self.store.leases().sweep(Instant::now());
            self.give_back(back);
            match next {
                Some(at) => tokio::time::sleep_until(at).await,
                None => return,
            }
        }
    }

    /// Sends what this thread's queue holds, in batches of at most [`MAX_BATCH`] keys, all
    /// at once (the connection pipelines them).
    async fn flush(self: Arc<Self>) {
        let Batch {
            mut returns,
            mut checks,
        } = self.store.queue().take();
        let mut batches = Vec::new();
        while !returns.is_empty() || !checks.is_empty() {
            let r = returns.len().min(MAX_BATCH);
            let c = checks.len().min(MAX_BATCH - r);
            batches.push(Batch {
                returns: returns.drain(..r).collect(),
                checks: checks.drain(..c).collect(),
            });
        }
        let sent = batches.iter().map(|batch| self.send(batch));
        let answers = futures_util::future::join_all(sent).await;
        for (batch, answer) in batches.into_iter().zip(answers) {
            match answer {
                Ok(pairs) => self.answered(batch, pairs),
                Err(f) => self.failed(batch, &f),
            }
        }
    }

    /// Tells each check its answer and keeps its spare tokens as this thread's lease.
    fn answered(self: &Arc<Self>, batch: Batch, pairs: Vec<(i64, i64)>) {
        let returned: u32 = batch.returns.iter().map(|r| r.tokens).sum();
        self.metrics.lease(LeaseTokens::Returned, returned);
        let leases = self.store.leases();
        let now = Instant::now();
        for (check, (granted, wait)) in batch.checks.into_iter().zip(pairs) {
            // Never more than asked for, whatever the store says.
            let granted = u32::try_from(granted).unwrap_or(0).min(check.want);
            let mut leftover = granted.saturating_sub(1);
            let answer = (i64::from(granted), wait);
            if check.answer.send(Ok(answer)).is_err() && granted >= 1 {
                // The check gave up (its deadline): its token is unspent too.
                leftover += 1;
            }
            self.metrics.lease(LeaseTokens::Granted, leftover);
            let kept = leases.granted(&check.key, check.terms, check.want, leftover, now);
            self.give_back(kept.returning);
            if kept.start_sweep {
                tokio::spawn(self.clone().sweep());
            }
        }
    }

    fn failed(&self, batch: Batch, f: &Failed) {
        let lost: u32 = batch.returns.iter().map(|r| r.tokens).sum();
        self.metrics.lease(LeaseTokens::Lost, lost);
        let leases = self.store.leases();
        for check in batch.checks {
            leases.failed(&check.key, check.want);
            let _ = check.answer.send(Err(f.clone()));
        }
    }

    /// One script call for `batch`: an answer per check, in order.
    async fn send(&self, batch: &Batch) -> Result<Vec<(i64, i64)>, Failed> {
        let Some(mut conn) = self.store.connection() else {
            return Err(Failed::NotConnected);
        };
        let mut call = self.script.prepare_invoke();
        call.arg(batch.returns.len());
        for r in &batch.returns {
            call.key(&r.key);
            call.arg(r.terms.requests)
                .arg(r.terms.unit_us)
                .arg(r.terms.burst)
                .arg(r.tokens);
        }
        for c in &batch.checks {
            call.key(&c.key);
            call.arg(c.terms.requests)
                .arg(c.terms.unit_us)
                .arg(c.terms.burst)
                .arg(c.want);
        }
        let reply =
            tokio::time::timeout(self.timeout, call.invoke_async::<Vec<i64>>(&mut conn)).await;
        let flat = match reply {
            Ok(Ok(flat)) => flat,
            Ok(Err(e)) if e.is_io_error() || e.is_unrecoverable_error() => {
                self.store.broke();
                return Err(Failed::Io(e.to_string()));
            }
            Ok(Err(e)) => return Err(Failed::Reply(e.to_string())),
            Err(_) => return Err(Failed::Timeout),
        };
        if flat.len() != batch.checks.len() * 2 {
            return Err(Failed::Reply(format!(
                "{} numbers for {} checks",
                flat.len(),
                batch.checks.len()
            )));
        }
        Ok(flat.chunks_exact(2).map(|p| (p[0], p[1])).collect())
    }
}
