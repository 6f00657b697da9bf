//! Whether the shared store is reachable, told once per change: one warning when an outage
//! starts (by a failed check or a failed connect), one line when the store answers again
//! (with how long it was away and how many checks fell back), never one per request.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

use tokio::time::Instant;

use super::metrics::{FleetMetrics, StoreErrorReason};
use crate::config::OnStoreError;

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
            return;
        }
        self.metrics.up.set(0);
        if let Ok(mut since) = self.since.lock() {
            *since = Some(Instant::now());
        }
        let then = match self.mode {
            OnStoreError::Local => "fleet rate limits count in this daemon's own buckets",
            OnStoreError::Deny => "requests under fleet rate limits are refused",
        };
        tracing::warn!(
            store = %self.shown,
            reason,
            detail,
            on_store_error = self.mode.as_str(),
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
