//! Agent connections: open now and served, by protocol, and those closed at accept, by
//! reason (the daemon's connection limit, an agent's connection budget).

use prometheus::{IntCounterVec, IntGauge, IntGaugeVec, Registry};

use super::{opts, register};
use crate::record::{ErrorCode, Protocol};

/// What an open agent connection speaks, as the connection gauges label it.
const PROTOCOLS: [Protocol; 5] = [
    Protocol::H1,
    Protocol::H2,
    Protocol::Ws,
    Protocol::Tcp,
    Protocol::TlsPassthrough,
];

pub(crate) struct Connections {
    active: IntGaugeVec,
    total: IntCounterVec,
    refused: IntCounterVec,
}

impl Connections {
    pub(super) fn register(r: &Registry) -> Connections {
        let c = Connections {
            active: register(
                r,
                IntGaugeVec::new(
                    opts(
                        "connections_active",
                        "Agent connections open now, by protocol.",
                    ),
                    &["protocol"],
                ),
            ),
            total: register(
                r,
                IntCounterVec::new(
                    opts(
                        "connections_total",
                        "Agent connections served, by protocol.",
                    ),
                    &["protocol"],
                ),
            ),
            refused: register(
                r,
                IntCounterVec::new(
                    opts(
                        "connections_refused_total",
                        "Connections closed at accept, by reason: busy (limits.max_connections) \
                         or connection_budget (limits.max_connections_per_agent).",
                    ),
                    &["reason"],
                ),
            ),
        };
        // Series that exist from the start, so dashboards show zeros rather than gaps.
        for p in PROTOCOLS {
            c.active.with_label_values(&[p.as_str()]);
            c.total.with_label_values(&[p.as_str()]);
        }
        for code in [ErrorCode::Busy, ErrorCode::ConnectionBudget] {
            c.refused.with_label_values(&[code.as_str()]);
        }
        c
    }

    /// Counts a connection speaking `p`, open until the guard drops.
    pub(crate) fn open(&self, p: Protocol) -> ConnectionGuard {
        self.total.with_label_values(&[p.as_str()]).inc();
        let active = self.active.with_label_values(&[p.as_str()]);
        active.inc();
        ConnectionGuard { active }
    }

    /// A connection closed at accept: `code` is busy or connection_budget.
    pub(super) fn refused(&self, code: ErrorCode) {
        self.refused.with_label_values(&[code.as_str()]).inc();
    }
}

pub(crate) struct ConnectionGuard {
    active: IntGauge,
}

impl Drop for ConnectionGuard {
    fn drop(&mut self) {
        self.active.dec();
    }
}
