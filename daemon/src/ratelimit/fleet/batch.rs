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
//! A check waits for its answer at most `ratelimit.timeout` from when it joined the queue,
//! whatever happens to the batch; the flush itself is bounded by the same deadline. Nothing
//! here ever waits on a lock held across an await: the queue's lock is held only to push or
//! to take.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::Script;
use tokio::sync::oneshot;

use super::metrics::StoreErrorReason;
use super::store::Store;

/// The most checks in one script call (bounds the command's size and the script's run).
pub(super) const MAX_BATCH: usize = 128;

/// One check waiting in a queue.
pub(super) struct Check {
    pub key: String,
    pub requests: u64,
    pub unit_us: u64,
    pub burst: u64,
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

/// One thread's queue of checks not yet sent.
#[derive(Default)]
pub(super) struct Queue {
    checks: Mutex<Vec<Check>>,
}

impl Queue {
    /// Adds a check; true when the queue was empty (the caller then starts a flush).
    pub(super) fn push(&self, check: Check) -> bool {
        let mut q = self.checks.lock().unwrap_or_else(|p| p.into_inner());
        q.push(check);
        q.len() == 1
    }

    /// Takes every check waiting.
    fn take(&self) -> Vec<Check> {
        std::mem::take(&mut *self.checks.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

/// Sends what `queue` holds, in batches, on the calling thread's connection; spawned (on
/// that thread) by the check that found the queue empty.
pub(super) async fn flush(store: Arc<Store>, script: Arc<Script>, timeout: Duration) {
    let mut checks = store.queue().take();
    if checks.is_empty() {
        return;
    }
    // Batches of at most MAX_BATCH, all sent at once (the connection pipelines them).
    let mut batches = Vec::new();
    while checks.len() > MAX_BATCH {
        let rest = checks.split_off(MAX_BATCH);
        batches.push(std::mem::replace(&mut checks, rest));
    }
    batches.push(checks);
    let sent = batches
        .iter()
        .map(|batch| send(&store, &script, timeout, batch));
    let answers = futures_util::future::join_all(sent).await;
    for (batch, answer) in batches.into_iter().zip(answers) {
        match answer {
            Ok(pairs) => {
                for (check, pair) in batch.into_iter().zip(pairs) {
                    let _ = check.answer.send(Ok(pair));
                }
            }
            Err(f) => {
                for check in batch {
                    let _ = check.answer.send(Err(f.clone()));
                }
            }
        }
    }
}

/// One script call for `batch`: an answer per check, in order.
async fn send(
    store: &Store,
    script: &Script,
    timeout: Duration,
    batch: &[Check],
) -> Result<Vec<(i64, i64)>, Failed> {
    let Some(mut conn) = store.connection() else {
        return Err(Failed::NotConnected);
    };
    let mut call = script.prepare_invoke();
    for c in batch {
        call.key(&c.key);
    }
    for c in batch {
        call.arg(c.requests).arg(c.unit_us).arg(c.burst);
    }
    let reply = tokio::time::timeout(timeout, call.invoke_async::<Vec<i64>>(&mut conn)).await;
    let flat = match reply {
        Ok(Ok(flat)) => flat,
        Ok(Err(e)) if e.is_io_error() || e.is_unrecoverable_error() => {
            store.broke();
            return Err(Failed::Io(e.to_string()));
        }
        Ok(Err(e)) => return Err(Failed::Reply(e.to_string())),
        Err(_) => return Err(Failed::Timeout),
    };
    if flat.len() != batch.len() * 2 {
        return Err(Failed::Reply(format!(
            "{} numbers for {} checks",
            flat.len(),
            batch.len()
        )));
    }
    Ok(flat.chunks_exact(2).map(|p| (p[0], p[1])).collect())
}
