//! The policy watcher's health, kept beside the policy store so `ctl status` shows it with
//! the policy in force: whether edits to the directory are seen, whether a probe proved it,
//! and why not. The watcher (`control::policy_watch`) writes it.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use prometheus::IntGauge;
use serde::Serialize;

/// What `ctl status` shows of the watcher.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct WatchStatus {
    /// Edits to the policy directory are seen as they happen: the last probe was heard (or,
    /// where the OS reports no reads to a watch, the watch is set).
    pub active: bool,
    /// Whether `active` was proven by a probe (false where the OS cannot be probed).
    pub verified: bool,
    /// Times the watch was moved to a new directory at the same path.
    pub rearmed: u64,
    /// Why it is not active, or the last problem it reported.
    pub error: Option<String>,
    /// The directory is also compared this often, which catches what events miss.
    pub poll_every_secs: u64,
}

/// The watcher's health, shared with the admin API.
#[derive(Debug, Default)]
pub(crate) struct WatchHealth {
    error: Mutex<Option<String>>,
    active: AtomicBool,
    verified: AtomicBool,
    pub(crate) rearmed: AtomicU64,
    poll_every_secs: AtomicU64,
}

impl WatchHealth {
    pub(crate) fn status(&self) -> WatchStatus {
        WatchStatus {
            active: self.active.load(Ordering::Relaxed),
            verified: self.verified.load(Ordering::Relaxed),
            rearmed: self.rearmed.load(Ordering::Relaxed),
            error: self.error.lock().ok().and_then(|e| e.clone()),
            poll_every_secs: self.poll_every_secs.load(Ordering::Relaxed),
        }
    }

    pub(crate) fn set_poll(&self, every: Duration) {
        self.poll_every_secs
            .store(every.as_secs().max(1), Ordering::Relaxed);
    }

    /// Records the watcher's state, and mirrors `active` into `gauge`
    /// (`agenshield_proxy_policy_watch_active`).
    pub(crate) fn set(
        &self,
        gauge: &IntGauge,
        active: bool,
        verified: bool,
        error: Option<String>,
    ) {
        self.active.store(active, Ordering::Relaxed);
        self.verified.store(verified, Ordering::Relaxed);
        if let Ok(mut e) = self.error.lock() {
            *e = error;
        }
        gauge.set(i64::from(active));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn health_mirrors_active_into_the_metric_and_keeps_the_reason() {
        let gauge = IntGauge::new("policy_watch_active", "test").expect("gauge");
        let h = WatchHealth::default();
        h.set_poll(Duration::from_secs(2));
        h.set(&gauge, true, true, None);
        assert_eq!(gauge.get(), 1);
        h.set(&gauge, false, false, Some("no event".into()));
        assert_eq!(gauge.get(), 0);
        let st = h.status();
        assert!(!st.active && !st.verified);
        assert_eq!(st.error.as_deref(), Some("no event"));
        assert_eq!(st.poll_every_secs, 2);
    }
}
