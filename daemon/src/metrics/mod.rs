//! Prometheus metrics: one registry owned by the daemon (no globals), served on the metrics
//! listener. Each area registers its own families into the registry it is handed (as linkerd's
//! `MetricsFamilies::register`): the audit log (`audit::AuditMetrics`) and the DNS stub
//! (`dns::DnsMetrics`) theirs, and the data path, upstream, policy and firewall theirs here,
//! one file each; `Metrics` only composes them.
//!
//! Label values are bounded: decisions, protocols and results are enums; rules and secrets
//! come from the operator's policy and vault; a host is named only if the policy names it,
//! every other host is `other`.

mod connections;
mod decisions;
mod firewall;
mod policy;
mod tls;
mod upstream;

use prometheus::core::Collector;
use prometheus::{Encoder, HistogramOpts, IntGaugeVec, Opts, Registry, TextEncoder};

pub(crate) use connections::Connections;
pub(crate) use decisions::{Decisions, SecretRefusal};
pub(crate) use firewall::FirewallMetrics;
pub(crate) use policy::PolicyMetrics;
pub(crate) use tls::TlsMetrics;
pub(crate) use upstream::{UpstreamFailure, UpstreamMetrics};

use crate::audit::AuditMetrics;
use crate::record::{ErrorCode, Record, RecordKind};

/// Every family's name starts with this (`agenshield_proxy_…`).
pub(crate) const NS: &str = "agenshield_proxy";

/// Latency buckets, seconds: 0.5 ms to 5 min, so a request held for an operator's approval
/// (up to `approvals.timeout`, 2 min by default) lands in a bucket of its own, not in +Inf.
const LATENCY: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0, 120.0, 300.0,
];

fn opts(name: &str, help: &str) -> Opts {
    Opts::new(name, help).namespace(NS)
}

fn latency(name: &str, help: &str) -> HistogramOpts {
    HistogramOpts::new(name, help)
        .namespace(NS)
        .buckets(LATENCY.to_vec())
}

/// Registers a family built from constant definitions: a failure is a bug, not input.
fn register<M: Collector + Clone + 'static>(r: &Registry, m: prometheus::Result<M>) -> M {
    let m = m.expect("valid metric definition");
    r.register(Box::new(m.clone())).expect("unique metric name");
    m
}

/// The daemon's families, each registered by its area.
pub struct Metrics {
    registry: Registry,
    /// Decisions: requests, their latency, bytes, and the refusals they name.
    pub(crate) decisions: Decisions,
    /// Agent connections open and served, and those refused at accept.
    pub(crate) connections: Connections,
    /// TLS interception: handshakes and the leaf certificate cache.
    pub(crate) tls: TlsMetrics,
    /// Upstream connects, failures and retries.
    pub(crate) upstream: UpstreamMetrics,
    /// The policy in force, its reloads and its watcher.
    pub(crate) policy: PolicyMetrics,
    /// Whether the agents' redirect is in place.
    pub(crate) firewall: FirewallMetrics,
    /// The audit log's series (registered by `audit`).
    pub(crate) audit: AuditMetrics,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let r = Registry::new();
        register_build_info(&r);
        Metrics {
            decisions: Decisions::register(&r),
            connections: Connections::register(&r),
            tls: TlsMetrics::register(&r),
            upstream: UpstreamMetrics::register(&r),
            policy: PolicyMetrics::register(&r),
            firewall: FirewallMetrics::register(&r),
            audit: AuditMetrics::register(&r, NS),
            registry: r,
        }
    }

    /// The registry, for an area whose state lives above this module (the DNS stub) to
    /// register its own families in.
    pub(crate) fn registry(&self) -> &Registry {
        &self.registry
    }

    /// Counts a completed record: its decision, bytes, and the refusal or failure it names.
    /// `host` is the record's host as a label (named in policy, or `other`).
    pub(crate) fn observe(&self, r: &Record, host: &str) {
        self.decisions.relayed(r.bytes_up, r.bytes_down);
        // A close record only adds its tunnel's bytes: the decision was counted.
        if r.kind == RecordKind::Close {
            return;
        }
        let rule = r.rule.as_deref().unwrap_or(crate::record::NO_RULE);
        self.decisions.decided(r.decision, rule, host, r.protocol);
        if r.kind == RecordKind::Request {
            self.decisions.took(r.decision, r.ms / 1000.0);
        }
        let Some(code) = r.error_code else {
            for s in &r.secrets {
                self.decisions.injected(s);
            }
            return;
        };
        match code {
            ErrorCode::RateLimited => self.decisions.rate_limited(rule),
            ErrorCode::SecretLeak => self.decisions.secret_refused(SecretRefusal::Leak),
            ErrorCode::SecretScope => self.decisions.secret_refused(SecretRefusal::Scope),
            ErrorCode::SecretUnavailable => {
                self.decisions.secret_refused(SecretRefusal::Unavailable)
            }
            ErrorCode::UpstreamDns | ErrorCode::UpstreamConnect => {
                self.upstream.failed(UpstreamFailure::Connect)
            }
            ErrorCode::UpstreamTls => self.upstream.failed(UpstreamFailure::Tls),
            ErrorCode::UpstreamError => self.upstream.failed(UpstreamFailure::Protocol),
            c if tls::FAILURES.contains(&c) => self.tls.failed(c),
            ErrorCode::Busy | ErrorCode::ConnectionBudget if r.kind == RecordKind::Connection => {
                self.connections.refused(code)
            }
            _ => {}
        }
    }

    /// The text exposition format.
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(16 * 1024);
        // Encoding into a Vec cannot fail on I/O; a malformed family would be our bug, and
        // then the scrape shows what was encoded before it.
        if let Err(e) = TextEncoder::new().encode(&self.registry.gather(), &mut out) {
            tracing::error!("encoding metrics: {e}");
        }
        out
    }
}

/// Which build runs, and the daemon's own CPU, memory, open files and threads (`process_*`,
/// where the OS lets them be read this way).
fn register_build_info(r: &Registry) {
    let build = register(
        r,
        IntGaugeVec::new(
            opts(
                "build_info",
                "Always 1; the labels say which build runs (version, OS, architecture).",
            ),
            &["version", "os", "arch"],
        ),
    );
    build
        .with_label_values(&[
            env!("CARGO_PKG_VERSION"),
            std::env::consts::OS,
            std::env::consts::ARCH,
        ])
        .set(1);
    #[cfg(target_os = "linux")]
    r.register(Box::new(
        prometheus::process_collector::ProcessCollector::for_self(),
    ))
    .expect("unique metric names");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::Protocol;

    #[test]
    fn names_carry_the_prefix_and_connection_gauges_return_to_zero() {
        let m = Metrics::new();
        {
            let _a = m.connections.open(Protocol::H2);
            let text = String::from_utf8(m.encode()).expect("utf8");
            assert!(text.contains("agenshield_proxy_connections_active{protocol=\"h2\"} 1"));
        }
        m.policy.set_policy("abc");
        m.policy.set_policy("def");
        m.tls.sync_cert_cache(5, 2);
        m.tls.sync_cert_cache(7, 2);
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
