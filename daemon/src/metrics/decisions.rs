//! The data path's decisions: each decided request or connection by decision, rule, host and
//! protocol, a request's latency, the bytes relayed, and the refusals a decision names (rate
//! limits, the secret guard) or the secrets it carried.

use prometheus::{HistogramVec, IntCounter, IntCounterVec, Registry};

use super::{latency, opts, register};
use crate::record::{Protocol, Verdict, NO_RULE};

/// Why the secret guard refused a request: `secret_refusals_total{kind}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SecretRefusal {
    /// A secret's value where it is not bound.
    Leak,
    /// A placeholder where it is not bound.
    Scope,
    /// A secret the request needs could not be had.
    Unavailable,
}

impl SecretRefusal {
    const ALL: [SecretRefusal; 3] = [
        SecretRefusal::Leak,
        SecretRefusal::Scope,
        SecretRefusal::Unavailable,
    ];

    fn label(self) -> &'static str {
        match self {
            SecretRefusal::Leak => "leak",
            SecretRefusal::Scope => "scope",
            SecretRefusal::Unavailable => "unavailable",
        }
    }
}

pub(crate) struct Decisions {
    requests: IntCounterVec,
    duration: HistogramVec,
    bytes_up: IntCounter,
    bytes_down: IntCounter,
    rate_limited: IntCounterVec,
    secret_injections: IntCounterVec,
    secret_refusals: IntCounterVec,
}

impl Decisions {
    pub(super) fn register(r: &Registry) -> Decisions {
        let bytes = register(
            r,
            IntCounterVec::new(
                opts(
                    "bytes_total",
                    "Body bytes relayed, by direction (up: to upstreams).",
                ),
                &["direction"],
            ),
        );
        let d = Decisions {
            requests: register(
                r,
                IntCounterVec::new(
                    opts(
                        "requests_total",
                        "Decisions (HTTP requests and connections decided as a whole), by \
                         decision, rule, host and protocol.",
                    ),
                    &["decision", "rule", "host", "protocol"],
                ),
            ),
            duration: register(
                r,
                HistogramVec::new(
                    latency(
                        "request_duration_seconds",
                        "Time from a request's head to the end of its response.",
                    ),
                    &["decision"],
                ),
            ),
            bytes_up: bytes.with_label_values(&["up"]),
            bytes_down: bytes.with_label_values(&["down"]),
            rate_limited: register(
                r,
                IntCounterVec::new(
                    opts(
                        "rate_limited_total",
                        "Requests refused by a rate or concurrency limit, by rule.",
                    ),
                    &["rule"],
                ),
            ),
            secret_injections: register(
                r,
                IntCounterVec::new(
                    opts(
                        "secret_injections_total",
                        "Requests that carried a secret upstream (injected or swapped), by \
                         secret name.",
                    ),
                    &["secret"],
                ),
            ),
            secret_refusals: register(
                r,
                IntCounterVec::new(
                    opts(
                        "secret_refusals_total",
                        "Requests refused by the secret guard: leak, scope or unavailable.",
                    ),
                    &["kind"],
                ),
            ),
        };
        // Series that exist from the start, so dashboards show zeros rather than gaps. A
        // fresh daemon has decided nothing yet: one zero series per family (the default deny
        // of a host no rule names, over HTTP/1.1) keeps every request panel at 0.
        d.requests.with_label_values(&[
            Verdict::Deny.as_str(),
            NO_RULE,
            "other",
            Protocol::H1.as_str(),
        ]);
        for decision in [Verdict::Allow, Verdict::Deny] {
            d.duration.with_label_values(&[decision.as_str()]);
        }
        for kind in SecretRefusal::ALL {
            d.secret_refusals.with_label_values(&[kind.label()]);
        }
        d
    }

    /// Body bytes relayed up (to upstreams) and down (to the agent).
    pub(super) fn relayed(&self, up: u64, down: u64) {
        self.bytes_up.inc_by(up);
        self.bytes_down.inc_by(down);
    }

    pub(super) fn decided(&self, decision: Verdict, rule: &str, host: &str, p: Protocol) {
        self.requests
            .with_label_values(&[decision.as_str(), rule, host, p.as_str()])
            .inc();
    }

    /// A request's time from head to the end of its response.
    pub(super) fn took(&self, decision: Verdict, seconds: f64) {
        self.duration
            .with_label_values(&[decision.as_str()])
            .observe(seconds);
    }

    pub(super) fn rate_limited(&self, rule: &str) {
        self.rate_limited.with_label_values(&[rule]).inc();
    }

    /// A request carried the secret named `secret` upstream.
    pub(super) fn injected(&self, secret: &str) {
        self.secret_injections.with_label_values(&[secret]).inc();
    }

    pub(super) fn secret_refused(&self, kind: SecretRefusal) {
        self.secret_refusals
            .with_label_values(&[kind.label()])
            .inc();
    }
}
