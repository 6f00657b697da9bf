//! Whether the shared store is reachable, told once per change: one warning when an outage
//! starts (by a failed check or a failed connect), one line when the store answers again
//! (with how long it was away and how many checks fell back), never one per request.
//!
//! A store that misses a deadline now and then under load (a blip: one check late, the next
//! answered) would write a pair of lines per blip. So within [`QUIET`] of the last warning an
//! outage starts silently, and is told only once it has lasted [`BLIP`] (at its next
//! failure; the connect task fails every few seconds while the store is gone), with how many
//! silent ones came before it. The metrics and `ctl status` see every outage.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

use tokio::time::Instant;

use super::metrics::{FleetMetrics, StoreErrorReason};
use crate::config::OnStoreError;

/// After a warning, how long further outages start without one.
const QUIET: std::time::Duration = std::time::Duration::from_secs(10);
/// How long a silent outage lasts before it is told anyway.
const BLIP: std::time::Duration = std::time::Duration::from_secs(1);

pub(super) struct Outage {
    down: AtomicBool,
    since: Mutex<Option<Instant>>,
    /// When the outage began and the last failure, as `ctl status` shows them.
    shown_state: Mutex<Shown>,
    /// Checks decided without the store in this outage.
    fallbacks: AtomicU64,
    mode: OnStoreError,
    /// The store as the log shows it (password hidden).
    shown: String,
    metrics: FleetMetrics,
    /// When the last warning was written; whether the current outage's was; outages not
    /// told since.
    warned_at: Mutex<Option<Instant>>,
    told: AtomicBool,
    untold: AtomicU64,
}

impl Outage {
    pub(super) fn new(shown: String, mode: OnStoreError, metrics: FleetMetrics) -> Outage {
        metrics.up.set(0);
        Outage {
            down: AtomicBool::new(false),
            since: Mutex::new(None),
            shown_state: Mutex::new(Shown::default()),
            fallbacks: AtomicU64::new(0),
            mode,
            shown,
            metrics,
            warned_at: Mutex::new(None),
            told: AtomicBool::new(false),
            untold: AtomicU64::new(0),
        }
    }

    /// A check got no answer: counted, and the outage announced if it starts now.
    pub(super) fn check_failed(&self, reason: StoreErrorReason, detail: &str) {
        self.metrics.failed(reason, self.mode);
        self.fallbacks.fetch_add(1, Ordering::Relaxed);
        self.begin(reason.as_str(), detail);
    }

    /// The connect task could not connect.
    pub(super) fn connect_failed(&self, detail: &str) {
        self.begin("unreachable", detail);
    }

    fn begin(&self, reason: &str, detail: &str) {
        let now = crate::clock::now_rfc3339();
        if let Ok(mut st) = self.shown_state.lock() {
            st.last_error = Some(LastError {
                reason: reason.to_string(),
                message: detail.to_string(),
                at: now.clone(),
            });
            if !self.down.load(Ordering::Acquire) {
                st.down_since = Some(now);
            }
        }
        if self.down.swap(true, Ordering::AcqRel) {
            // Already down: a silent outage that has lasted is told now.
            let lasted = self
                .since
                .lock()
                .ok()
                .and_then(|s| *s)
                .is_some_and(|t| t.elapsed() >= BLIP);
            if lasted && !self.told.load(Ordering::Acquire) {
                self.warn(reason, detail);
            }
            return;
        }
        self.metrics.up.set(0);
        if let Ok(mut since) = self.since.lock() {
            *since = Some(Instant::now());
        }
        let recent = self
            .warned_at
            .lock()
            .ok()
            .and_then(|w| *w)
            .is_some_and(|t| t.elapsed() < QUIET);
        if recent {
            self.told.store(false, Ordering::Release);
            self.untold.fetch_add(1, Ordering::Relaxed);
            return;
        }
        self.warn(reason, detail);
    }

    /// The warning that an outage started (or lasted), once per outage.
    fn warn(&self, reason: &str, detail: &str) {
        if self.told.swap(true, Ordering::AcqRel) {
            return;
        }
        if let Ok(mut w) = self.warned_at.lock() {
            *w = Some(Instant::now());
        }
        let untold = self.untold.swap(0, Ordering::Relaxed);
        let then = match self.mode {
            OnStoreError::Local => "fleet rate limits count in this daemon's own buckets",
            OnStoreError::Deny => "requests under fleet rate limits are refused",
        };
        tracing::warn!(
            store = %self.shown,
            reason,
            detail,
            on_store_error = self.mode.as_str(),
            short_outages_not_logged = untold,
            "fleet rate-limit store unreachable; until it is back, {then}"
        );
    }

    /// The connections were dropped (one broke): not up until every one is back.
    pub(super) fn disconnected(&self) {
        self.metrics.up.set(0);
    }

    /// A check was answered: ends an outage, if there was one and every thread has its
    /// connection (`all_connected`, asked only then; one atomic load otherwise).
    pub(super) fn answered(&self, all_connected: impl FnOnce() -> bool) {
        if self.down.load(Ordering::Acquire) && all_connected() {
            self.back();
        }
    }

    /// The store is connected (again).
    pub(super) fn back(&self) {
        self.metrics.up.set(1);
        if !self.down.swap(false, Ordering::AcqRel) {
            return;
        }
        let away = self
            .since
            .lock()
            .ok()
            .and_then(|mut s| s.take())
            .map(|t| t.elapsed());
        let fell_back = self.fallbacks.swap(0, Ordering::Relaxed);
        if let Ok(mut st) = self.shown_state.lock() {
            st.down_since = None;
        }
        if !self.told.swap(false, Ordering::AcqRel) {
            return; // a short outage not told: nor is its end
        }
        tracing::info!(
            store = %self.shown,
            away_ms = away.map(|d| d.as_millis()).unwrap_or(0),
            checks_without_store = fell_back,
            "fleet rate-limit store reachable again; fleet rate limits count in it again"
        );
    }
}

/// What `ctl status` shows of the store (`/v1/status` `ratelimit_store`).
#[derive(Debug, Clone, serde::Serialize)]
pub(crate) struct StoreStatus {
    /// The store's URL, password hidden.
    pub store: String,
    pub on_store_error: &'static str,
    /// Every connection thread has its connection and the last check was answered.
    pub up: bool,
    /// Threads with a connection now, of all.
    pub connected: usize,
    pub threads: usize,
    /// When the current outage began (`None` while up).
    pub down_since: Option<String>,
    /// The last failure (a check or a connect), kept after the store is back.
    pub last_error: Option<LastError>,
}

#[derive(Debug, Clone, Default, serde::Serialize)]
pub(crate) struct LastError {
    pub reason: String,
    pub message: String,
    pub at: String,
}

#[derive(Default)]
struct Shown {
    down_since: Option<String>,
    last_error: Option<LastError>,
}

impl Outage {
    /// The store's state; `connected`, `threads`: from the connections.
    pub(super) fn status(&self, connected: usize, threads: usize) -> StoreStatus {
        let (down_since, last_error) = self
            .shown_state
            .lock()
            .map(|st| (st.down_since.clone(), st.last_error.clone()))
            .unwrap_or_default();
        StoreStatus {
            store: self.shown.clone(),
            on_store_error: self.mode.as_str(),
            up: !self.down.load(Ordering::Acquire) && connected == threads,
            connected,
            threads,
            down_since,
            last_error,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;
    use std::time::Duration;

    use super::{Outage, BLIP, QUIET};
    use crate::config::OnStoreError;
    use crate::ratelimit::fleet::metrics::{FleetMetrics, StoreErrorReason};

    fn outage() -> Outage {
        let metrics = FleetMetrics::register(&prometheus::Registry::new(), "t");
        Outage::new("redis://127.0.0.1:1/0".into(), OnStoreError::Local, metrics)
    }

    #[tokio::test(start_paused = true)]
    async fn blips_after_a_warning_are_counted_not_logged_and_a_lasting_one_is_told() {
        let o = outage();
        // The first outage is told, and so is its end.
        o.check_failed(StoreErrorReason::Timeout, "no answer in time");
        assert!(o.told.load(Ordering::Acquire));
        o.back();
        assert!(!o.told.load(Ordering::Acquire));
        // Blips within QUIET of that warning: silent, counted.
        for _ in 0..3 {
            o.check_failed(StoreErrorReason::Timeout, "no answer in time");
            assert!(!o.told.load(Ordering::Acquire));
            assert_eq!(o.metrics.up.get(), 0, "the metric sees every outage");
            o.back();
        }
        assert_eq!(o.untold.load(Ordering::Relaxed), 3);
        // One that lasts is told at its next failure, with the blips before it.
        o.check_failed(StoreErrorReason::Timeout, "no answer in time");
        assert!(!o.told.load(Ordering::Acquire));
        tokio::time::advance(BLIP).await;
        o.connect_failed("connection refused");
        assert!(o.told.load(Ordering::Acquire));
        assert_eq!(o.untold.load(Ordering::Relaxed), 0);
        o.back();
        // After QUIET without a warning, an outage is told at once.
        tokio::time::advance(QUIET + Duration::from_millis(1)).await;
        o.check_failed(StoreErrorReason::Reply, "ERR");
        assert!(o.told.load(Ordering::Acquire));
    }
}
