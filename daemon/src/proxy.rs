//! Everything the data path shares, built once at start-up.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use agenshield_certs::LeafCache;

use crate::admission::{Budgets, Identities};
use crate::approvals::Approvals;
use crate::audit::Audit;
use crate::config::Limits;
use crate::events::Events;
use crate::metrics::Metrics;
use crate::policy::{Policy, PolicyStore};
use crate::ratelimit::{ConcurrencyCaps, FleetLimiter, Limiter};
use crate::secrets::Vault;
use crate::server_tls::InterceptTls;
use crate::tunnels::Tunnels;
use crate::upstream::client::Forwarder;
use crate::upstream::dial::Dialer;

pub(crate) struct Proxy {
    pub policies: PolicyStore,
    pub leaves: LeafCache,
    pub tls: InterceptTls,
    pub dialer: Arc<Dialer>,
    pub forwarder: Forwarder,
    pub limits: Limits,
    pub events: Events,
    pub approvals: Approvals,
    pub limiter: Limiter,
    /// The shared store's buckets, for `scope = "fleet"` rates (`[ratelimit] store`).
    pub fleet: Option<FleetLimiter>,
    pub caps: ConcurrencyCaps,
    /// Rules' LLM token budgets: their counters (`budget/`).
    pub tokens: Arc<crate::budget::TokenBudgets>,
    pub vault: Arc<Vault>,
    /// Bytes of each request body the leak guard reads.
    pub scan_body_bytes: usize,
    pub metrics: Arc<Metrics>,
    /// `None` when `audit.enabled = false`.
    pub audit: Option<Arc<Audit>>,
    /// Record query values in the audit log as sent (else `[redacted]`).
    pub audit_query_values: bool,
    /// Connections served at once, over all listeners and the tunnels they spawn.
    pub slots: Arc<tokio::sync::Semaphore>,
    /// Connections each agent may hold at once.
    pub budgets: Arc<Budgets>,
    /// Protocols a request may switch to (`upstream.upgrades`).
    pub upgrades: Vec<String>,
    /// Live tunnels, decided again on every policy change.
    pub tunnels: Arc<Tunnels>,
    /// The agent's DNS stub: the names it gave each agent, and its bounds.
    pub dns: crate::dns_state::DnsState,
    /// Who may use which listener, and whose requests secrets serve.
    pub identities: Identities,
    /// Pinned MCP tool definitions and the older transport's SSE sessions (`mcp/`).
    pub mcp: Arc<crate::mcp::McpState>,
    next_conn: AtomicU64,
}

/// The parts `Proxy::new` assembles.
pub(crate) struct ProxyParts {
    pub vault: Arc<Vault>,
    pub metrics: Arc<Metrics>,
    pub audit: Option<Arc<Audit>>,
    pub audit_query_values: bool,
    pub scan_body_bytes: usize,
    pub policies: PolicyStore,
    pub leaves: LeafCache,
    pub dialer: Arc<Dialer>,
    pub forwarder: Forwarder,
    pub limits: Limits,
    pub approvals: Approvals,
    pub upgrades: Vec<String>,
    pub identities: Identities,
    pub mcp: Arc<crate::mcp::McpState>,
    /// `dns.denied`: what the DNS stub answers for a name no rule allows.
    pub denied_names: crate::config::DeniedAnswer,
    /// The DNS stub's series.
    pub dns_metrics: crate::dns_state::DnsMetrics,
    /// `[ratelimit] store`'s buckets, if one is set.
    pub fleet: Option<FleetLimiter>,
}

impl Proxy {
    pub(crate) fn new(p: ProxyParts) -> Proxy {
        Proxy {
            policies: p.policies,
            leaves: p.leaves,
            tls: InterceptTls::new(),
            dialer: p.dialer,
            forwarder: p.forwarder,
            limits: p.limits.clone(),
            events: Events::default(),
            approvals: p.approvals,
            limiter: Limiter::new(),
            fleet: p.fleet,
            caps: ConcurrencyCaps::new(),
            tokens: Arc::new(crate::budget::TokenBudgets::new(
                p.metrics.registry(),
                crate::metrics::NS,
            )),
            vault: p.vault,
            scan_body_bytes: p.scan_body_bytes,
            metrics: p.metrics,
            audit: p.audit,
            audit_query_values: p.audit_query_values,
            slots: Arc::new(tokio::sync::Semaphore::new(p.limits.max_connections)),
            budgets: Budgets::new(p.limits.max_connections_per_agent),
            upgrades: p.upgrades,
            tunnels: Arc::default(),
            dns: crate::dns_state::DnsState::new(p.denied_names, p.dns_metrics),
            identities: p.identities,
            mcp: p.mcp,
            next_conn: AtomicU64::new(1),
        }
    }

    /// The policy in force now. A request keeps the one it started with.
    pub(crate) fn policy(&self) -> Arc<Policy> {
        self.policies.current()
    }

    pub(crate) fn next_conn_id(&self) -> u64 {
        self.events
            .counters
            .connections
            .fetch_add(1, Ordering::Relaxed);
        self.next_conn.fetch_add(1, Ordering::Relaxed)
    }
}
