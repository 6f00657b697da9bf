//! TLS interception: handshakes with agents by result, and the leaf certificate cache's
//! lookups (hit or miss), brought up to date from the cache's own counters at each scrape.

use prometheus::{IntCounter, IntCounterVec, Registry};

use super::{opts, register};
use crate::record::ErrorCode;

/// How a TLS handshake with an agent can fail: `tls_handshakes_total{result}` beside `ok`.
pub(super) const FAILURES: [ErrorCode; 3] = [
    ErrorCode::ClientRejectedCa,
    ErrorCode::TlsHandshakeFailed,
    ErrorCode::BadClientHello,
];

/// A leaf certificate lookup: `cert_cache_lookups_total{result}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CertLookup {
    /// Cached, or coalesced with a minting under way.
    Hit,
    /// Minted.
    Miss,
}

impl CertLookup {
    fn label(self) -> &'static str {
        match self {
            CertLookup::Hit => "hit",
            CertLookup::Miss => "miss",
        }
    }
}

pub(crate) struct TlsMetrics {
    ok: IntCounter,
    handshakes: IntCounterVec,
    cert_hits: IntCounter,
    cert_misses: IntCounter,
}

impl TlsMetrics {
    pub(super) fn register(r: &Registry) -> TlsMetrics {
        let handshakes = register(
            r,
            IntCounterVec::new(
                opts(
                    "tls_handshakes_total",
                    "TLS handshakes with agents (interception), by result: ok, or the error code \
                     of the failure (client_rejected_ca, tls_handshake_failed, bad_client_hello).",
                ),
                &["result"],
            ),
        );
        let cert = register(
            r,
            IntCounterVec::new(
                opts(
                    "cert_cache_lookups_total",
                    "Leaf certificate lookups: hit (cached or coalesced) or miss (minted).",
                ),
                &["result"],
            ),
        );
        for code in FAILURES {
            handshakes.with_label_values(&[code.as_str()]);
        }
        TlsMetrics {
            ok: handshakes.with_label_values(&["ok"]),
            handshakes,
            cert_hits: cert.with_label_values(&[CertLookup::Hit.label()]),
            cert_misses: cert.with_label_values(&[CertLookup::Miss.label()]),
        }
    }

    /// A handshake with an agent completed.
    pub(crate) fn handshake_ok(&self) {
        self.ok.inc();
    }

    /// A handshake failed with `code`, one of [`FAILURES`].
    pub(super) fn failed(&self, code: ErrorCode) {
        self.handshakes.with_label_values(&[code.as_str()]).inc();
    }

    /// Brings the cache's counters (kept by the cache itself) up to date; called before each
    /// scrape, the only writer of these series.
    pub(crate) fn sync_cert_cache(&self, hits: u64, misses: u64) {
        for (c, now) in [(&self.cert_hits, hits), (&self.cert_misses, misses)] {
            let seen = c.get();
            if now > seen {
                c.inc_by(now - seen);
            }
        }
    }
}
