//! The audit log's own series, registered into the registry it is handed (the daemon's, in
//! `metrics`), so the audit log owns its counters and no constructor elsewhere has
//! to know them.

use prometheus::{IntCounter, IntGauge, Opts, Registry};

/// What the audit log counts: records written and dropped, failed writes, and whether it can
/// take records now.
#[derive(Clone)]
pub(crate) struct AuditMetrics {
    pub records: IntCounter,
    pub dropped: IntCounter,
    pub write_errors: IntCounter,
    pub ready: IntGauge,
    /// 1 while rotation would delete records younger than `audit.retention`.
    pub retention_blocked: IntGauge,
    /// Checkpoints (signed chain heads) written.
    pub checkpoints: IntCounter,
}

impl AuditMetrics {
    /// Registers the audit log's series in `r`, each name under `namespace`.
    pub(crate) fn register(r: &Registry, namespace: &str) -> AuditMetrics {
        let opts = |name: &str, help: &str| Opts::new(name, help).namespace(namespace);
        let counter = |name: &str, help: &str| {
            let m = IntCounter::with_opts(opts(name, help)).expect("valid metric definition");
            r.register(Box::new(m.clone())).expect("unique metric name");
            m
        };
        let gauge = |name: &str, help: &str| {
            let m = IntGauge::with_opts(opts(name, help)).expect("valid metric definition");
            r.register(Box::new(m.clone())).expect("unique metric name");
            m
        };
        AuditMetrics {
            records: counter("audit_records_total", "Audit records written to the log."),
            dropped: counter(
                "audit_dropped_total",
                "Audit records of allowed requests not written because the queue was full \
                 (denials are never dropped: they wait).",
            ),
            write_errors: counter(
                "audit_write_errors_total",
                "Failed writes to the audit log.",
            ),
            ready: gauge(
                "audit_ready",
                "1 while the audit log can take records; 0 after a failed write or with \
                 under 1 MiB free (requests are then refused, 503 audit_unavailable).",
            ),
            retention_blocked: gauge(
                "audit_retention_blocked",
                "1 while the audit log is full and rotating it would delete records younger \
                 than audit.retention: requests are refused (503 audit_unavailable) until \
                 the oldest file ages or is archived away. An alarm.",
            ),
            checkpoints: counter(
                "audit_checkpoints_total",
                "Signed checkpoints of the audit log's hash chain written into it \
                 (audit.checkpoint_every / audit.checkpoint_interval, and at a clean stop).",
            ),
        }
    }

    /// Series registered nowhere, for tests that read them directly.
    #[cfg(test)]
    pub(crate) fn unregistered() -> AuditMetrics {
        AuditMetrics::register(&Registry::new(), "agenshield_proxy")
    }
}
