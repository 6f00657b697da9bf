//! The fleet store's own series, registered into the registry it is handed (the daemon's):
//! whether it is reachable, its errors by reason, the checks that fell back, and where
//! leased tokens went (`lease.rs`).

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

/// What became of leased tokens (`lease.rs`): granted = used + returned + lost + held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LeaseTokens {
    /// Granted by the store beyond a check's own token, kept as a thread's lease.
    Granted,
    /// Spent by a check from its thread's lease, with no store call.
    Used,
    /// Sent back to the bucket unspent.
    Returned,
    /// Unspent but not sent back (the return's call failed): the fleet under-admits them.
    Lost,
}

impl LeaseTokens {
    const ALL: [LeaseTokens; 4] = [
        LeaseTokens::Granted,
        LeaseTokens::Used,
        LeaseTokens::Returned,
        LeaseTokens::Lost,
    ];

    fn as_str(self) -> &'static str {
        match self {
            LeaseTokens::Granted => "granted",
            LeaseTokens::Used => "used",
            LeaseTokens::Returned => "returned",
            LeaseTokens::Lost => "lost",
        }
    }
}

#[derive(Clone)]
pub(crate) struct FleetMetrics {
    errors: IntCounterVec,
    fallbacks: IntCounterVec,
    lease_tokens: IntCounterVec,
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
        let lease_tokens = IntCounterVec::new(
            opts(
                "ratelimit_store_lease_tokens_total",
                "Fleet rate-limit tokens leased to a connection thread, by what became of them \
                 (granted, used, returned, lost).",
            ),
            &["result"],
        )
        .expect("valid metric definition");
        let up = IntGauge::with_opts(opts(
            "ratelimit_store_up",
            "1 while the fleet rate-limit store answers, 0 during an outage.",
        ))
        .expect("valid metric definition");
        for m in [&errors, &fallbacks, &lease_tokens] {
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
        for result in LeaseTokens::ALL {
            lease_tokens.with_label_values(&[result.as_str()]);
        }
        FleetMetrics {
            errors,
            fallbacks,
            lease_tokens,
            up,
        }
    }

    pub(crate) fn lease(&self, result: LeaseTokens, tokens: u32) {
        if tokens > 0 {
            self.lease_tokens
                .with_label_values(&[result.as_str()])
                .inc_by(u64::from(tokens));
        }
    }

    pub(crate) fn failed(&self, reason: StoreErrorReason, mode: OnStoreError) {
        self.errors.with_label_values(&[reason.as_str()]).inc();
        self.fallbacks.with_label_values(&[mode.as_str()]).inc();
    }
}
