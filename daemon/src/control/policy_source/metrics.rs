//! The policy source's series, registered into the daemon's registry: the bundle in force
//! (by revision and hash), when the source was last reached, and failed syncs by reason.

use prometheus::{Gauge, IntCounterVec, IntGaugeVec, Opts, Registry};

/// Why a sync failed, as the `reason` label says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SyncFailureReason {
    /// The source could not be reached or did not serve the bundle.
    Fetch,
    /// A bundle was refused (`policy` record's reason).
    Refused(crate::audit::BundleRefusal),
}

impl SyncFailureReason {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            SyncFailureReason::Fetch => "fetch",
            SyncFailureReason::Refused(r) => r.as_str(),
        }
    }
}

pub(crate) struct SourceMetrics {
    info: IntGaugeVec,
    last_sync: Gauge,
    failures: IntCounterVec,
}

impl SourceMetrics {
    pub(crate) fn register(r: &Registry, namespace: &str) -> SourceMetrics {
        let opts = |name: &str, help: &str| Opts::new(name, help).namespace(namespace);
        let info = IntGaugeVec::new(
            opts(
                "policy_source_info",
                "The policy bundle in force (value 1), by revision and SHA-256.",
            ),
            &["revision", "hash"],
        )
        .expect("valid metric definition");
        let last_sync = Gauge::with_opts(opts(
            "policy_source_last_sync_timestamp_seconds",
            "When the policy source was last reached (a new bundle, or the same one; Unix time).",
        ))
        .expect("valid metric definition");
        let failures = IntCounterVec::new(
            opts(
                "policy_source_sync_failures_total",
                "Policy source syncs that failed, by reason (fetch, signature, too_large, \
                 malformed, rollback, invalid_policy).",
            ),
            &["reason"],
        )
        .expect("valid metric definition");
        for m in [
            Box::new(info.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(last_sync.clone()),
            Box::new(failures.clone()),
        ] {
            r.register(m).expect("unique metric name");
        }
        SourceMetrics {
            info,
            last_sync,
            failures,
        }
    }

    pub(crate) fn in_force(&self, revision: u64, sha256: &str) {
        self.info.reset();
        self.info
            .with_label_values(&[revision.to_string().as_str(), sha256])
            .set(1);
    }

    pub(crate) fn synced(&self) {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        self.last_sync.set(now);
    }

    pub(crate) fn failed(&self, reason: SyncFailureReason) {
        self.failures.with_label_values(&[reason.as_str()]).inc();
    }
}
