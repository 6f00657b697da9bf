//! Idle HTTP connections are closed, so a client cannot hold a slot by saying nothing. With no
//! request in flight, a connection waits at most `limits.first_request_timeout` for its first
//! request (counted from when it was handed to the HTTP server, after any TLS handshake) and
//! `limits.idle_timeout` between requests, HTTP/1 keep-alive and HTTP/2 alike. On HTTP/1 a
//! request head that has started to arrive must be complete within
//! `limits.header_read_timeout` (slow heads); hyper's own timer is off, since it also runs
//! while a keep-alive connection is merely idle.
//!
//! Requests only touch atomics: no wake-up, no timer. The watchdog looks again at least every
//! `min(header_read_timeout, idle_timeout)`, which is early enough for any deadline a request
//! can make (a head's, an idle one's), and then sleeps until the exact one: before, a
//! keep-alive request woke its connection three times and re-armed two timers, one of them
//! earlier than any other and so a write to the reactor's eventfd.

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::time::{Duration, Instant};

use crate::config::Limits;
use crate::read_side::{OnRead, ReadSide};

/// Why a connection is to be closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Expired {
    /// No request for too long: it may say goodbye (an h2 GOAWAY).
    Idle,
    /// A head that started did not finish: it is cut off at once.
    SlowHead,
}

/// What one connection is doing, as far as its timeouts care.
#[derive(Debug)]
pub(super) struct Activity {
    epoch: Instant,
    /// HTTP/1: bytes read while idle start a head, which has `header_read_timeout`.
    heads_timed: bool,
    in_flight: AtomicUsize,
    /// A request has been seen.
    served: AtomicBool,
    /// Milliseconds after `epoch` when the last request ended (or the connection began).
    idle_since: AtomicU64,
    /// Milliseconds after `epoch`, plus one, when bytes of a head began to arrive; 0: none.
    head_since: AtomicU64,
}

/// A request in flight; dropped when its response is done.
pub(super) struct InFlight(Arc<Activity>);

impl Drop for InFlight {
    fn drop(&mut self) {
        let a = &self.0;
        if a.in_flight.fetch_sub(1, Ordering::AcqRel) == 1 {
            a.idle_since.store(a.now_ms(), Ordering::Release);
            a.head_since.store(0, Ordering::Release);
        }
    }
}

impl Activity {
    pub(super) fn new(heads_timed: bool) -> Arc<Activity> {
        Arc::new(Activity {
            epoch: Instant::now(),
            heads_timed,
            in_flight: AtomicUsize::new(0),
            served: AtomicBool::new(false),
            idle_since: AtomicU64::new(0),
            head_since: AtomicU64::new(0),
        })
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// A request started; it is in flight until the returned guard drops.
    pub(super) fn start(self: &Arc<Self>) -> InFlight {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        self.served.store(true, Ordering::Relaxed);
        self.head_since.store(0, Ordering::Release);
        InFlight(self.clone())
    }

    /// Bytes arrived from the client.
    fn read(&self) {
        if self.heads_timed
            && self.head_since.load(Ordering::Acquire) == 0
            && self.in_flight.load(Ordering::Acquire) == 0
        {
            self.head_since
                .store(self.now_ms().saturating_add(1), Ordering::Release);
        }
    }

    /// When the connection must be closed if nothing changes; `None` while a request is in
    /// flight.
    fn deadline(&self, limits: &Limits) -> Option<Instant> {
        if self.in_flight.load(Ordering::Acquire) > 0 {
            return None;
        }
        let at = |ms: u64, d: Duration| self.epoch + Duration::from_millis(ms) + d;
        let head = self.head_since.load(Ordering::Acquire);
        if head > 0 {
            return Some(at(head - 1, limits.header_read_timeout));
        }
        let idle = if self.served.load(Ordering::Relaxed) {
            limits.idle_timeout
        } else {
            limits.first_request_timeout
        };
        Some(at(self.idle_since.load(Ordering::Acquire), idle))
    }

    /// How long the watchdog may sleep without looking: no deadline a request can start (a
    /// head's, an idle connection's) is nearer than this.
    fn look_every(&self, limits: &Limits) -> Duration {
        let nearest = if self.heads_timed {
            limits.header_read_timeout.min(limits.idle_timeout)
        } else {
            limits.idle_timeout
        };
        nearest.max(Duration::from_millis(1))
    }

    /// Resolves once the connection has been idle (or stuck in a head) too long, saying which.
    pub(super) async fn expired(&self, limits: &Limits) -> Expired {
        let every = self.look_every(limits);
        let sleep = tokio::time::sleep(Duration::ZERO);
        tokio::pin!(sleep);
        loop {
            let now = Instant::now();
            let wake = match self.deadline(limits) {
                Some(at) if at <= now => {
                    return if self.head_since.load(Ordering::Acquire) > 0 {
                        Expired::SlowHead
                    } else {
                        Expired::Idle
                    };
                }
                Some(at) => at.min(now + every),
                None => now + every,
            };
            sleep.as_mut().reset(wake);
            sleep.as_mut().await;
        }
    }
}

/// How long a connection closed for idleness may take to say goodbye (an h2 GOAWAY).
pub(super) const GRACE: Duration = Duration::from_secs(5);

/// Serves `conn` until it ends or `activity` expires: idle, it is shut down gracefully (with
/// [`GRACE`] to finish); a head too slow is cut off at once (a graceful close would wait for it).
pub(super) async fn serve_until_expired<C, E>(
    mut conn: Pin<&mut C>,
    activity: &Activity,
    limits: &Limits,
    graceful_shutdown: impl FnOnce(Pin<&mut C>),
) -> Result<(), E>
where
    C: std::future::Future<Output = Result<(), E>>,
{
    tokio::select! {
        r = conn.as_mut() => r,
        why = activity.expired(limits) => match why {
            Expired::Idle => {
                tracing::debug!("closing an idle connection");
                graceful_shutdown(conn.as_mut());
                tokio::time::timeout(GRACE, conn).await.unwrap_or(Ok(()))
            }
            Expired::SlowHead => {
                tracing::debug!(
                    "closing: a request head did not finish within {:?}",
                    limits.header_read_timeout
                );
                Ok(())
            }
        },
    }
}

/// The client's side of a connection, telling its [`Activity`] when bytes arrive.
pub(super) type Watched<S> = ReadSide<S, Arc<Activity>>;

/// `inner`, watched by `activity`.
pub(super) fn watched<S>(inner: S, activity: Arc<Activity>) -> Watched<S> {
    ReadSide::watched(bytes::Bytes::new(), inner, activity)
}

impl OnRead for Arc<Activity> {
    fn on_read(&self) {
        self.read();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> Limits {
        Limits {
            first_request_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(90),
            header_read_timeout: Duration::from_secs(30),
            ..Limits::default()
        }
    }

    /// The watchdog of `a`, from now: why it fired and how long after.
    fn watch(a: &Arc<Activity>) -> tokio::task::JoinHandle<(Expired, Duration)> {
        let a = a.clone();
        tokio::spawn(async move {
            let started = Instant::now();
            let why = a.expired(&limits()).await;
            (why, started.elapsed())
        })
    }

    #[tokio::test(start_paused = true)]
    async fn a_connection_that_never_asks_is_closed_after_the_first_request_timeout() {
        let a = Activity::new(true);
        let started = Instant::now();
        assert_eq!(a.expired(&limits()).await, Expired::Idle);
        assert_eq!(started.elapsed(), Duration::from_secs(10));
    }

    #[tokio::test(start_paused = true)]
    async fn in_flight_never_expires_and_idle_keep_alive_lasts_the_idle_timeout() {
        let a = Activity::new(true);
        let guard = a.start();
        let waiter = watch(&a);
        tokio::time::sleep(Duration::from_secs(300)).await;
        assert!(!waiter.is_finished(), "a request in flight is not idle");
        drop(guard);
        let (_, took) = waiter.await.expect("join");
        assert_eq!(
            took,
            Duration::from_secs(390),
            "300 s in flight, then 90 s idle"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_head_that_started_must_finish_within_the_header_read_timeout() {
        let a = Activity::new(true);
        let guard = a.start();
        drop(guard);
        tokio::time::sleep(Duration::from_secs(5)).await;
        a.read();
        let started = Instant::now();
        assert_eq!(a.expired(&limits()).await, Expired::SlowHead);
        assert_eq!(started.elapsed(), Duration::from_secs(30));
        // HTTP/2 bytes (pings, settings) are not heads.
        let h2 = Activity::new(false);
        let _ = h2.start();
        h2.read();
        let started = Instant::now();
        h2.expired(&limits()).await;
        assert_eq!(started.elapsed(), Duration::from_secs(90));
    }

    #[tokio::test(start_paused = true)]
    async fn a_head_that_starts_while_the_watchdog_sleeps_is_timed_from_its_first_byte() {
        // Nothing wakes the watchdog when a head starts; it must still cut it off 30 s later,
        // not 30 s after it next happens to look.
        let a = Activity::new(true);
        drop(a.start());
        let waiter = watch(&a);
        tokio::time::sleep(Duration::from_secs(20)).await;
        a.read();
        assert_eq!(
            waiter.await.expect("join"),
            (Expired::SlowHead, Duration::from_secs(50))
        );
        // And one that finishes in time is not cut off: idle again, 90 s from its end.
        let a = Activity::new(true);
        drop(a.start());
        let waiter = watch(&a);
        tokio::time::sleep(Duration::from_secs(20)).await;
        a.read();
        tokio::time::sleep(Duration::from_secs(25)).await;
        drop(a.start());
        assert_eq!(
            waiter.await.expect("join"),
            (Expired::Idle, Duration::from_secs(45 + 90))
        );
    }
}
