//! The fleet store's own series, registered into the registry it is handed (the daemon's):
//! whether it is reachable, its errors by reason, and the checks that fell back.

use prometheus::{IntCounterVec, IntGauge, Opts, Registry};

use crate::config::OnStoreError;

/// Why a fleet check got no answer from the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StoreErrorReason {
    /// No connection to the store (down, refused, or being re-established).
    Unreachable,
    /// No answer within `ratelimit.timeout`.
    Timeout,
    /// The connection broke during the check.
    Io,
    /// The store answered with an error or something the script never returns.
    Reply,
}

impl StoreErrorReason {
    pub(crate) const ALL: [StoreErrorReason; 4] = [
        StoreErrorReason::Unreachable,
        StoreErrorReason::Timeout,
        StoreErrorReason::Io,
        StoreErrorReason::Reply,
    ];

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            StoreErrorReason::Unreachable => "unreachable",
            StoreErrorReason::Timeout => "timeout",
            StoreErrorReason::Io => "io",
            StoreErrorReason::Reply => "reply",
        }
    }
}

#[derive(Clone)]
pub(crate) struct FleetMetrics {
    errors: IntCounterVec,
    fallbacks: IntCounterVec,
    pub up: IntGauge,
}

impl FleetMetrics {
    /// Registers the store's series in `r`, each name under `namespace`.
    pub(crate) fn register(r: &Registry, namespace: &str) -> FleetMetrics {
        let opts = |name: &str, help: &str| Opts::new(name, help).namespace(namespace);
        let errors = IntCounterVec::new(
            opts(
                "ratelimit_store_errors_total",
                "Fleet rate-limit checks the shared store (Redis) did not answer, by reason \
                 (unreachable, timeout, io, reply).",
            ),
            &["reason"],
        )
        .expect("valid metric definition");
        let fallbacks = IntCounterVec::new(
            opts(
                "ratelimit_store_fallbacks_total",
                "Fleet rate-limit checks decided without the store, by ratelimit.on_store_error \
                 (local: this daemon's bucket; deny: refused).",
            ),
            &["mode"],
        )
        .expect("valid metric definition");
        let up = IntGauge::with_opts(opts(
            "ratelimit_store_up",
            "1 while the fleet rate-limit store answers, 0 during an outage.",
        ))
        .expect("valid metric definition");
        for m in [&errors, &fallbacks] {
            r.register(Box::new(m.clone())).expect("unique metric name");
        }
        r.register(Box::new(up.clone()))
            .expect("unique metric name");
        // Series that exist from the start, so dashboards show zeros rather than gaps.
        for reason in StoreErrorReason::ALL {
            errors.with_label_values(&[reason.as_str()]);
        }
        for mode in [OnStoreError::Local, OnStoreError::Deny] {
            fallbacks.with_label_values(&[mode.as_str()]);
        }
        FleetMetrics {
            errors,
            fallbacks,
            up,
        }
    }

    pub(crate) fn failed(&self, reason: StoreErrorReason, mode: OnStoreError) {
        self.errors.with_label_values(&[reason.as_str()]).inc();
        self.fallbacks.with_label_values(&[mode.as_str()]).inc();
    }
}
