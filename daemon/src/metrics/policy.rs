//! The policy: which one is in force and since when, its loads and reloads by result, and
//! whether the hot-reload watcher sees edits.

use prometheus::{Gauge, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Registry};

use super::{opts, register};
use crate::audit::ReloadResult;

pub(crate) struct PolicyMetrics {
    reloads: IntCounterVec,
    info: IntGaugeVec,
    last_reload: Gauge,
    /// 1 while edits to the policy directory are seen.
    pub watch_active: IntGauge,
    /// Times the watch moved to a replaced directory.
    pub watch_rearms: IntCounter,
}

impl PolicyMetrics {
    pub(super) fn register(r: &Registry) -> PolicyMetrics {
        let m = PolicyMetrics {
            reloads: register(
                r,
                IntCounterVec::new(
                    opts(
                        "policy_reloads_total",
                        "Policy loads and reloads, by result.",
                    ),
                    &["result"],
                ),
            ),
            info: register(
                r,
                IntGaugeVec::new(
                    opts("policy_info", "The policy in force (value 1), by hash."),
                    &["hash"],
                ),
            ),
            last_reload: register(
                r,
                Gauge::with_opts(opts(
                    "policy_last_reload_timestamp_seconds",
                    "When the policy in force was loaded (Unix time).",
                )),
            ),
            watch_active: register(
                r,
                IntGauge::with_opts(opts(
                    "policy_watch_active",
                    "1 while edits to the policy directory are seen (hot reload), else 0.",
                )),
            ),
            watch_rearms: register(
                r,
                IntCounter::with_opts(opts(
                    "policy_watch_rearms_total",
                    "Times the policy directory was replaced (moved, recreated) and the watch \
                     moved to the new one.",
                )),
            ),
        };
        for result in [ReloadResult::Ok, ReloadResult::Error] {
            m.reloads.with_label_values(&[result.as_str()]);
        }
        m
    }

    /// Counts a load or reload.
    pub(crate) fn reloaded(&self, result: ReloadResult) {
        self.reloads.with_label_values(&[result.as_str()]).inc();
    }

    /// Marks `hash` as the policy in force.
    pub(crate) fn set_policy(&self, hash: &str) {
        self.info.reset();
        self.info.with_label_values(&[hash]).set(1);
        self.last_reload.set(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64()),
        );
    }
}
