//! Prometheus metrics: one registry owned by the daemon (no globals), served on the metrics
//! listener. Label values are bounded: decisions, protocols and results are fixed sets; rules
//! and secrets come from the operator's policy and vault; a host is named only if the policy
//! names it, every other host is `other`.

use prometheus::{
    Encoder, Gauge, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry, TextEncoder,
};

use crate::audit::AuditMetrics;
use crate::record::{ErrorCode, Record, RecordKind};

const NS: &str = "agenshield_proxy";

/// How a TLS handshake with an agent can fail: `tls_handshakes_total{result}` beside `ok`.
const TLS_FAILURES: [ErrorCode; 3] = [
    ErrorCode::ClientRejectedCa,
    ErrorCode::TlsHandshakeFailed,
    ErrorCode::BadClientHello,
];

/// Latency buckets, seconds: 0.5 ms to 5 min, so a request held for an operator's approval
/// (up to `approvals.timeout`, 2 min by default) lands in a bucket of its own, not in +Inf.
const LATENCY: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0, 120.0, 300.0,
];

/// What an open agent connection speaks, as the connection gauges label it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ConnProtocol {
    H1,
    H2,
    Ws,
    Tcp,
    /// TLS spliced unopened (`tls = "passthrough"`).
    TlsPassthrough,
}

impl ConnProtocol {
    pub(crate) fn label(self) -> &'static str {
        match self {
            ConnProtocol::H1 => "h1",
            ConnProtocol::H2 => "h2",
            ConnProtocol::Ws => "ws",
            ConnProtocol::Tcp => "tcp",
            ConnProtocol::TlsPassthrough => "tls-passthrough",
        }
    }
}

pub struct Metrics {
    registry: Registry,
    pub requests: IntCounterVec,
    pub request_duration: HistogramVec,
    pub upstream_connect: Histogram,
    pub upstream_errors: IntCounterVec,
    pub upstream_retries: IntCounterVec,
    pub bytes_up: IntCounter,
    pub bytes_down: IntCounter,
    connections_active: IntGaugeVec,
    connections_total: IntCounterVec,
    pub tls_ok: IntCounter,
    tls_handshakes: IntCounterVec,
    cert_hits: IntCounter,
    cert_misses: IntCounter,
    pub rate_limited: IntCounterVec,
    pub secret_injections: IntCounterVec,
    pub secret_refusals: IntCounterVec,
    pub reloads: IntCounterVec,
    policy_info: IntGaugeVec,
    pub last_reload: Gauge,
    /// The audit log's series (registered by `audit`).
    pub(crate) audit: AuditMetrics,
    connections_refused: IntCounterVec,
    pub policy_watch_active: IntGauge,
    pub policy_watch_rearms: IntCounter,
    pub firewall_active: IntGauge,
    /// 1 where this daemon keeps the redirect (`redirect.enabled`): only there does a 0 in
    /// `firewall_active` mean the agents' redirect is gone (the alert rules read both).
    pub firewall_managed: IntGauge,
    /// Every DNS query the stub answered, by decision and response code (recorded or not:
    /// the audit log takes an allowed name once per TTL).
    pub dns_queries: IntCounterVec,
    /// Queries dropped unanswered: the asking agent (or the stub) had its most in hand already.
    pub dns_dropped: IntCounter,
}

fn opts(name: &str, help: &str) -> Opts {
    Opts::new(name, help).namespace(NS)
}

/// Builds and registers a metric; the names are constants, so a failure is a bug.
macro_rules! reg {
    ($r:expr, $m:expr) => {{
        let m = $m.expect("valid metric definition");
        $r.register(Box::new(m.clone()))
            .expect("unique metric name");
        m
    }};
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let r = Registry::new();
        let bytes = reg!(
            r,
            IntCounterVec::new(
                opts(
                    "bytes_total",
                    "Body bytes relayed, by direction (up: to upstreams)."
                ),
                &["direction"],
            )
        );
        let tls = reg!(
            r,
            IntCounterVec::new(
                opts(
                    "tls_handshakes_total",
                    "TLS handshakes with agents (interception), by result: ok, or the error code \
                     of the failure (client_rejected_ca, tls_handshake_failed, bad_client_hello)."
                ),
                &["result"],
            )
        );
        let cert = reg!(
            r,
            IntCounterVec::new(
                opts(
                    "cert_cache_lookups_total",
                    "Leaf certificate lookups: hit (cached or coalesced) or miss (minted)."
                ),
                &["result"],
            )
        );
        let build = reg!(
            r,
            IntGaugeVec::new(
                opts(
                    "build_info",
                    "Always 1; the labels say which build runs (version, OS, architecture)."
                ),
                &["version", "os", "arch"],
            )
        );
        build
            .with_label_values(&[
                env!("CARGO_PKG_VERSION"),
                std::env::consts::OS,
                std::env::consts::ARCH,
            ])
            .set(1);
        // The daemon's own CPU, memory, open files and threads (process_*), where the OS
        // lets them be read this way.
        #[cfg(target_os = "linux")]
        r.register(Box::new(
            prometheus::process_collector::ProcessCollector::for_self(),
        ))
        .expect("unique metric names");
        let m = Metrics {
            requests: reg!(
                r,
                IntCounterVec::new(
                    opts(
                        "requests_total",
                        "Decisions (HTTP requests and connections decided as a whole), by \
                         decision, rule, host and protocol."
                    ),
                    &["decision", "rule", "host", "protocol"],
                )
            ),
            request_duration: reg!(
                r,
                HistogramVec::new(
                    HistogramOpts::new(
                        "request_duration_seconds",
                        "Time from a request's head to the end of its response."
                    )
                    .namespace(NS)
                    .buckets(LATENCY.to_vec()),
                    &["decision"],
                )
            ),
            upstream_connect: reg!(
                r,
                Histogram::with_opts(
                    HistogramOpts::new(
                        "upstream_connect_duration_seconds",
                        "Time to open a TCP connection to an upstream (resolution included)."
                    )
                    .namespace(NS)
                    .buckets(LATENCY.to_vec())
                )
            ),
            upstream_retries: reg!(
                r,
                IntCounterVec::new(
                    opts(
                        "upstream_retries_total",
                        "Requests sent again because the upstream provably did not process \
                         them: not_sent (a pooled connection closed or went away before taking \
                         it), refused (REFUSED_STREAM), goaway (above the last stream id of the \
                         upstream's GOAWAY)."
                    ),
                    &["reason"],
                )
            ),
            upstream_errors: reg!(
                r,
                IntCounterVec::new(
                    opts(
                        "upstream_errors_total",
                        "Requests that failed upstream, by kind."
                    ),
                    &["kind"],
                )
            ),
            bytes_up: bytes.with_label_values(&["up"]),
            bytes_down: bytes.with_label_values(&["down"]),
            connections_active: reg!(
                r,
                IntGaugeVec::new(
                    opts("connections_active", "Agent connections open now, by protocol."),
                    &["protocol"],
                )
            ),
            connections_total: reg!(
                r,
                IntCounterVec::new(
                    opts("connections_total", "Agent connections served, by protocol."),
                    &["protocol"],
                )
            ),
            tls_ok: tls.with_label_values(&["ok"]),
            tls_handshakes: tls,
            cert_hits: cert.with_label_values(&["hit"]),
            cert_misses: cert.with_label_values(&["miss"]),
            rate_limited: reg!(
                r,
                IntCounterVec::new(
                    opts("rate_limited_total", "Requests refused by a rate or concurrency limit, by rule."),
                    &["rule"],
                )
            ),
            secret_injections: reg!(
                r,
                IntCounterVec::new(
                    opts(
                        "secret_injections_total",
                        "Requests that carried a secret upstream (injected or swapped), by secret name."
                    ),
                    &["secret"],
                )
            ),
            secret_refusals: reg!(
                r,
                IntCounterVec::new(
                    opts(
                        "secret_refusals_total",
                        "Requests refused by the secret guard: leak, scope or unavailable."
                    ),
                    &["kind"],
                )
            ),
            reloads: reg!(
                r,
                IntCounterVec::new(
                    opts("policy_reloads_total", "Policy loads and reloads, by result."),
                    &["result"],
                )
            ),
            policy_info: reg!(
                r,
                IntGaugeVec::new(
                    opts("policy_info", "The policy in force (value 1), by hash."),
                    &["hash"],
                )
            ),
            last_reload: reg!(
                r,
                Gauge::with_opts(opts(
                    "policy_last_reload_timestamp_seconds",
                    "When the policy in force was loaded (Unix time)."
                ))
            ),
            audit: AuditMetrics::register(&r, NS),
            connections_refused: reg!(
                r,
                IntCounterVec::new(
                    opts(
                        "connections_refused_total",
                        "Connections closed at accept, by reason: busy (limits.max_connections) \
                         or connection_budget (limits.max_connections_per_agent)."
                    ),
                    &["reason"],
                )
            ),
            policy_watch_active: reg!(
                r,
                IntGauge::with_opts(opts(
                    "policy_watch_active",
                    "1 while edits to the policy directory are seen (hot reload), else 0."
                ))
            ),
            policy_watch_rearms: reg!(
                r,
                IntCounter::with_opts(opts(
                    "policy_watch_rearms_total",
                    "Times the policy directory was replaced (moved, recreated) and the watch \
                     moved to the new one."
                ))
            ),
            firewall_active: reg!(
                r,
                IntGauge::with_opts(opts(
                    "firewall_redirect_active",
                    "1 while the redirect rules are verified in place, else 0."
                ))
            ),
            firewall_managed: reg!(
                r,
                IntGauge::with_opts(opts(
                    "firewall_redirect_managed",
                    "1 where this daemon installs and keeps the agents' redirect rules \
                     (redirect.enabled), else 0 (the redirect, if any, is kept elsewhere)."
                ))
            ),
            dns_queries: reg!(
                r,
                IntCounterVec::new(
                    opts(
                        "dns_queries_total",
                        "DNS queries the agent's DNS stub answered, by decision and response \
                         code (NOERROR, NXDOMAIN, REFUSED, SERVFAIL, FORMERR, NOTIMP)."
                    ),
                    &["decision", "rcode"],
                )
            ),
            dns_dropped: reg!(
                r,
                IntCounter::with_opts(opts(
                    "dns_dropped_total",
                    "DNS queries dropped unanswered because the asking agent (or the stub) \
                     was at its bound of queries in hand (the client retries)."
                ))
            ),
            registry: r,
        };
        // Series that exist from the start, so dashboards show zeros rather than gaps.
        for p in [
            ConnProtocol::H1,
            ConnProtocol::H2,
            ConnProtocol::Ws,
            ConnProtocol::Tcp,
            ConnProtocol::TlsPassthrough,
        ] {
            m.connections_active.with_label_values(&[p.label()]);
            m.connections_total.with_label_values(&[p.label()]);
        }
        for kind in ["leak", "scope", "unavailable"] {
            m.secret_refusals.with_label_values(&[kind]);
        }
        // A fresh daemon has decided nothing yet: one zero series per family (the default
        // deny of a host no rule names, over HTTP/1.1) keeps every request panel at 0.
        m.requests
            .with_label_values(&["deny", crate::record::NO_RULE, "other", "h1"]);
        for decision in ["allow", "deny"] {
            m.request_duration.with_label_values(&[decision]);
        }
        for kind in ["connect", "tls", "protocol"] {
            m.upstream_errors.with_label_values(&[kind]);
        }
        for code in TLS_FAILURES {
            m.tls_handshakes.with_label_values(&[code.as_str()]);
        }
        for code in [ErrorCode::Busy, ErrorCode::ConnectionBudget] {
            m.connections_refused.with_label_values(&[code.as_str()]);
        }
        for result in ["ok", "error"] {
            m.reloads.with_label_values(&[result]);
        }
        for reason in crate::upstream::pool::Retry::ALL {
            m.upstream_retries.with_label_values(&[reason.as_str()]);
        }
        for (decision, rcode) in [
            ("allow", "NOERROR"),
            ("allow", "NXDOMAIN"),
            ("deny", "NOERROR"),
            ("deny", "NXDOMAIN"),
            ("deny", "REFUSED"),
            ("error", "SERVFAIL"),
        ] {
            m.dns_queries.with_label_values(&[decision, rcode]);
        }
        m
    }

    /// Counts a connection of `p` open until the guard drops.
    pub(crate) fn connection(&self, p: ConnProtocol) -> ConnectionGuard {
        self.connections_total.with_label_values(&[p.label()]).inc();
        let active = self.connections_active.with_label_values(&[p.label()]);
        active.inc();
        ConnectionGuard { active }
    }

    /// Counts a completed record: its decision, bytes, and the refusal or failure it names.
    /// `host` is the record's host as a label (named in policy, or `other`).
    pub(crate) fn observe(&self, r: &Record, host: &str) {
        self.bytes_up.inc_by(r.bytes_up);
        self.bytes_down.inc_by(r.bytes_down);
        // A close record only adds its tunnel's bytes: the decision was counted.
        if r.kind == RecordKind::Close {
            return;
        }
        let decision = r.decision.as_str();
        let rule = r.rule.as_deref().unwrap_or(crate::record::NO_RULE);
        self.requests
            .with_label_values(&[decision, rule, host, r.protocol.as_str()])
            .inc();
        if r.kind == RecordKind::Request {
            self.request_duration
                .with_label_values(&[decision])
                .observe(r.ms / 1000.0);
        }
        let Some(code) = r.error_code else {
            for s in &r.secrets {
                self.secret_injections.with_label_values(&[s]).inc();
            }
            return;
        };
        let (family, label) = match code {
            ErrorCode::RateLimited => (&self.rate_limited, rule),
            ErrorCode::SecretLeak => (&self.secret_refusals, "leak"),
            ErrorCode::SecretScope => (&self.secret_refusals, "scope"),
            ErrorCode::SecretUnavailable => (&self.secret_refusals, "unavailable"),
            ErrorCode::UpstreamDns | ErrorCode::UpstreamConnect => {
                (&self.upstream_errors, "connect")
            }
            ErrorCode::UpstreamTls => (&self.upstream_errors, "tls"),
            ErrorCode::UpstreamError => (&self.upstream_errors, "protocol"),
            c if TLS_FAILURES.contains(&c) => (&self.tls_handshakes, c.as_str()),
            ErrorCode::Busy | ErrorCode::ConnectionBudget if r.kind == RecordKind::Connection => {
                (&self.connections_refused, code.as_str())
            }
            _ => return,
        };
        family.with_label_values(&[label]).inc();
    }

    /// Marks `hash` as the policy in force.
    pub fn set_policy(&self, hash: &str) {
        self.policy_info.reset();
        self.policy_info.with_label_values(&[hash]).set(1);
        self.last_reload.set(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64()),
        );
    }

    /// Brings counters kept elsewhere (the certificate cache's) up to date; called before
    /// each scrape, the only writer of these series.
    pub fn sync_cert_cache(&self, hits: u64, misses: u64) {
        for (c, now) in [(&self.cert_hits, hits), (&self.cert_misses, misses)] {
            let seen = c.get();
            if now > seen {
                c.inc_by(now - seen);
            }
        }
    }

    /// The text exposition format.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(16 * 1024);
        // Encoding into a Vec cannot fail on I/O; a malformed family would be our bug, and
        // then the scrape shows what was encoded before it.
        if let Err(e) = TextEncoder::new().encode(&self.registry.gather(), &mut out) {
            tracing::error!("encoding metrics: {e}");
        }
        out
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_carry_the_prefix_and_connection_gauges_return_to_zero() {
        let m = Metrics::new();
        {
            let _a = m.connection(ConnProtocol::H2);
            let text = String::from_utf8(m.encode()).expect("utf8");
            assert!(text.contains("agenshield_proxy_connections_active{protocol=\"h2\"} 1"));
        }
        m.set_policy("abc");
        m.set_policy("def");
        m.sync_cert_cache(5, 2);
        m.sync_cert_cache(7, 2);
        let text = String::from_utf8(m.encode()).expect("utf8");
        assert!(text.contains("agenshield_proxy_connections_active{protocol=\"h2\"} 0"));
        assert!(text.contains("agenshield_proxy_connections_total{protocol=\"h2\"} 1"));
        assert!(text.contains("agenshield_proxy_policy_info{hash=\"def\"} 1"));
        assert!(!text.contains("hash=\"abc\""), "only the policy in force");
        assert!(text.contains("agenshield_proxy_cert_cache_lookups_total{result=\"hit\"} 7"));
        for line in text
            .lines()
            .filter(|l| !l.starts_with('#') && !l.is_empty())
        {
            // Ours carry the prefix; the process's own figures keep their standard names.
            assert!(
                line.starts_with("agenshield_proxy_") || line.starts_with("process_"),
                "{line}"
            );
        }
    }
}
