//! Memory back to the OS after a burst of connections.
//!
//! What a burst used stays with the allocator after its connections close (pf::allocator):
//! 10,000 TLS sessions left the daemon at 200+ MB long after the last one closed. So the
//! daemon watches how many connections it holds, and once that count has fallen to at most
//! half its peak since the last release (by at least [`MIN_DROP`]) and stopped falling, it
//! asks every runtime thread to give back what its heap holds free. A thread does so the next
//! time it parks (goes idle: the runtimes' park hook, [`on_park`]); the watcher wakes the
//! connection threads and the main runtime's workers for it.
//!
//! Nothing here runs per request: opening and closing a connection is two atomic operations
//! (and a wake-up of the watcher when a burst has ended); with no burst the watcher sleeps
//! and the park hook is one atomic load.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::Notify;

/// A release is worth it once at least this many connections have closed since the peak
/// (at ~40 KiB each, a few MB).
const MIN_DROP: usize = 64;

/// The count must hold still this long before the release (the tail of a closing burst
/// frees its memory first)...
const SETTLE: Duration = Duration::from_millis(200);

/// ...but a release comes at most this long after the burst ended, even under churn.
const SETTLE_AT_MOST: Duration = Duration::from_secs(2);

/// Connections open now, and their peak since the last release.
static OPEN: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

/// Woken when a burst has ended.
static BURST_ENDED: Notify = Notify::const_new();

/// Releases asked for so far; each thread gives back once per release.
static RELEASES: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// The last release this thread took part in.
    static RELEASED: Cell<u64> = const { Cell::new(0) };
}

/// One open connection, counted while it lives.
#[derive(Debug)]
pub(crate) struct Open(());

impl Open {
    pub(crate) fn new() -> Open {
        let n = OPEN.fetch_add(1, Ordering::Relaxed) + 1;
        PEAK.fetch_max(n, Ordering::Relaxed);
        Open(())
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        let n = OPEN.fetch_sub(1, Ordering::Relaxed) - 1;
        let peak = PEAK.load(Ordering::Relaxed);
        if burst_ended(peak, n)
            && PEAK
                .compare_exchange(peak, n, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            BURST_ENDED.notify_one();
        }
    }
}

/// Whether going down from `peak` to `now` connections ends a burst.
fn burst_ended(peak: usize, now: usize) -> bool {
    peak >= now + MIN_DROP && now <= peak / 2
}

/// The runtimes' park hook (`on_thread_park`): a thread going idle after a release was asked
/// for gives back what its heap holds free, once per release.
pub fn on_park() {
    let asked = RELEASES.load(Ordering::Relaxed);
    RELEASED.with(|done| {
        if done.get() != asked {
            done.set(asked);
            agenshield_pf::allocator::release_free_memory();
        }
    });
}

/// Waits for bursts to end and asks for a release after each, for the life of the daemon.
pub(crate) async fn watch() {
    loop {
        BURST_ENDED.notified().await;
        settle().await;
        RELEASES.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(
            open = OPEN.load(Ordering::Relaxed),
            "connections closed after a burst: giving free memory back"
        );
        // The connection threads and the main runtime's other workers are woken to park
        // again (and so release); this one does when this task yields.
        super::shards::wake_all();
        for _ in 0..tokio::runtime::Handle::current().metrics().num_workers() {
            tokio::spawn(async {});
        }
    }
}

/// Until the count of open connections holds still for [`SETTLE`] (or [`SETTLE_AT_MOST`]).
async fn settle() {
    let started = tokio::time::Instant::now();
    let mut last = OPEN.load(Ordering::Relaxed);
    while started.elapsed() < SETTLE_AT_MOST {
        tokio::time::sleep(SETTLE).await;
        let now = OPEN.load(Ordering::Relaxed);
        if now == last {
            break;
        }
        last = now;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_ends_when_half_its_connections_and_enough_of_them_closed() {
        assert!(!burst_ended(10, 0), "too few to be worth it");
        assert!(burst_ended(MIN_DROP, 0));
        assert!(burst_ended(10_000, 5_000));
        assert!(!burst_ended(10_000, 5_001), "not yet half");
        assert!(!burst_ended(200, 150));
    }
}
