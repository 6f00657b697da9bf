//! The DNS stub's own series, registered into the registry it is handed (the daemon's), so
//! the stub owns its counters: every query it answered, by decision and response code
//! (recorded or not: the audit log takes an allowed name once per TTL), and the queries it
//! dropped unanswered.

use hickory_resolver::proto::op::ResponseCode;
use prometheus::{IntCounter, IntCounterVec, Opts, Registry};

use crate::record::rcode_str as rcode_name;
use crate::record::Verdict;

#[derive(Clone)]
pub(crate) struct DnsMetrics {
    queries: IntCounterVec,
    /// Queries dropped unanswered: the asking agent (or the stub) had its most in hand already.
    pub dropped: IntCounter,
}

impl DnsMetrics {
    /// Registers the stub's series in `r`, each name under `namespace`.
    pub(crate) fn register(r: &Registry, namespace: &str) -> DnsMetrics {
        let opts = |name: &str, help: &str| Opts::new(name, help).namespace(namespace);
        let queries = IntCounterVec::new(
            opts(
                "dns_queries_total",
                "DNS queries the agent's DNS stub answered, by decision and response \
                 code (NOERROR, NXDOMAIN, REFUSED, SERVFAIL, FORMERR, NOTIMP).",
            ),
            &["decision", "rcode"],
        )
        .expect("valid metric definition");
        r.register(Box::new(queries.clone()))
            .expect("unique metric name");
        let dropped = IntCounter::with_opts(opts(
            "dns_dropped_total",
            "DNS queries dropped unanswered because the asking agent (or the stub) \
             was at its bound of queries in hand (the client retries).",
        ))
        .expect("valid metric definition");
        r.register(Box::new(dropped.clone()))
            .expect("unique metric name");
        // Series that exist from the start, so dashboards show zeros rather than gaps.
        for (decision, rcode) in [
            (Verdict::Allow, ResponseCode::NoError),
            (Verdict::Allow, ResponseCode::NXDomain),
            (Verdict::Deny, ResponseCode::NoError),
            (Verdict::Deny, ResponseCode::NXDomain),
            (Verdict::Deny, ResponseCode::Refused),
            (Verdict::Error, ResponseCode::ServFail),
        ] {
            queries.with_label_values(&[decision.as_str(), rcode_name(rcode)]);
        }
        DnsMetrics { queries, dropped }
    }

    /// Counts a query answered with `rcode` after `decision`.
    pub(crate) fn answered(&self, decision: Verdict, rcode: ResponseCode) {
        self.queries
            .with_label_values(&[decision.as_str(), rcode_name(rcode)])
            .inc();
    }

    /// Series registered nowhere, for a stub whose counts nobody reads (tests).
    pub(crate) fn unregistered() -> DnsMetrics {
        DnsMetrics::register(&Registry::new(), "agenshield_proxy")
    }
}
