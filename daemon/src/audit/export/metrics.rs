//! The export's own series, labelled by sink (its name, or its index in the config).

use prometheus::{GaugeVec, IntCounterVec, IntGaugeVec, Opts, Registry};

use super::transport::Failure;

#[derive(Clone)]
pub(crate) struct ExportMetrics {
    pub shipped: IntCounterVec,
    pub pending: IntGaugeVec,
    pub failures: IntCounterVec,
    pub lag: GaugeVec,
    pub dropped: IntCounterVec,
}

impl ExportMetrics {
    pub(crate) fn register(r: &Registry, namespace: &str) -> ExportMetrics {
        let opts = |name: &str, help: &str| Opts::new(name, help).namespace(namespace);
        let m = ExportMetrics {
            shipped: IntCounterVec::new(
                opts(
                    "audit_export_shipped_total",
                    "Audit records shipped to the sink (written to its connection and flushed).",
                ),
                &["sink"],
            )
            .expect("valid metric definition"),
            pending: IntGaugeVec::new(
                opts(
                    "audit_export_pending_records",
                    "Audit records written to the log and not yet shipped to the sink.",
                ),
                &["sink"],
            )
            .expect("valid metric definition"),
            failures: IntCounterVec::new(
                opts(
                    "audit_export_failures_total",
                    "Failed connects, handshakes, writes and log reads of the sink, by reason.",
                ),
                &["sink", "reason"],
            )
            .expect("valid metric definition"),
            lag: GaugeVec::new(
                opts(
                    "audit_export_lag_seconds",
                    "Age of the oldest audit record not yet shipped to the sink (0: caught up).",
                ),
                &["sink"],
            )
            .expect("valid metric definition"),
            dropped: IntCounterVec::new(
                opts(
                    "audit_export_dropped_total",
                    "Audit records rotation deleted before the sink shipped them (after \
                     max_hold). Each is a record the receiver will never have.",
                ),
                &["sink"],
            )
            .expect("valid metric definition"),
        };
        for c in [&m.shipped, &m.failures, &m.dropped] {
            r.register(Box::new(c.clone())).expect("unique metric name");
        }
        r.register(Box::new(m.pending.clone()))
            .expect("unique metric name");
        r.register(Box::new(m.lag.clone()))
            .expect("unique metric name");
        m
    }

    /// Every series of `sink` at 0, so a dashboard sees it before anything happens.
    pub(crate) fn touch(&self, sink: &str) {
        self.shipped.with_label_values(&[sink]);
        self.pending.with_label_values(&[sink]);
        self.lag.with_label_values(&[sink]);
        self.dropped.with_label_values(&[sink]);
        for f in Failure::ALL {
            self.failures.with_label_values(&[sink, f.as_str()]);
        }
    }
}
