//! Upstreams: how long a connect takes, requests that failed upstream by kind, and requests
//! sent again because the upstream provably did not process them. The dialer and the pool
//! are handed their series (`connect`, `retries`) and count them themselves.

use prometheus::{Histogram, IntCounterVec, Registry};

use super::{latency, opts, register};
use crate::upstream::pool::Retry;

/// How a request failed upstream: `upstream_errors_total{kind}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum UpstreamFailure {
    /// Resolving or connecting.
    Connect,
    /// The TLS handshake with the upstream.
    Tls,
    /// The upstream's HTTP.
    Protocol,
}

impl UpstreamFailure {
    const ALL: [UpstreamFailure; 3] = [
        UpstreamFailure::Connect,
        UpstreamFailure::Tls,
        UpstreamFailure::Protocol,
    ];

    fn label(self) -> &'static str {
        match self {
            UpstreamFailure::Connect => "connect",
            UpstreamFailure::Tls => "tls",
            UpstreamFailure::Protocol => "protocol",
        }
    }
}

pub(crate) struct UpstreamMetrics {
    /// Handed to the dialer.
    pub connect: Histogram,
    /// Handed to the pool, by [`Retry`] reason.
    pub retries: IntCounterVec,
    errors: IntCounterVec,
}

impl UpstreamMetrics {
    pub(super) fn register(r: &Registry) -> UpstreamMetrics {
        let m = UpstreamMetrics {
            connect: register(
                r,
                Histogram::with_opts(latency(
                    "upstream_connect_duration_seconds",
                    "Time to open a TCP connection to an upstream (resolution included).",
                )),
            ),
            retries: register(
                r,
                IntCounterVec::new(
                    opts(
                        "upstream_retries_total",
                        "Requests sent again because the upstream provably did not process \
                         them: not_sent (a pooled connection closed or went away before taking \
                         it), refused (REFUSED_STREAM), goaway (above the last stream id of the \
                         upstream's GOAWAY).",
                    ),
                    &["reason"],
                ),
            ),
            errors: register(
                r,
                IntCounterVec::new(
                    opts(
                        "upstream_errors_total",
                        "Requests that failed upstream, by kind.",
                    ),
                    &["kind"],
                ),
            ),
        };
        for kind in UpstreamFailure::ALL {
            m.errors.with_label_values(&[kind.label()]);
        }
        for reason in Retry::ALL {
            m.retries.with_label_values(&[reason.as_str()]);
        }
        m
    }

    pub(super) fn failed(&self, kind: UpstreamFailure) {
        self.errors.with_label_values(&[kind.label()]).inc();
    }
}
