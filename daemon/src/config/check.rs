//! A check per section of the file: what a value must satisfy beyond its type (a list that
//! may not be empty, bounds, names). `Config` runs them in the order of the sections, so the
//! first mistake is the one reported.

use std::net::SocketAddr;
use std::time::Duration;

use super::forms::{self, FormError};
use super::schema::{
    AuditConfig, Limits, Redirect, ResolverConfig, SecretStoreKind, SecretsConfig, TlsConfig,
    Upstream, MAX_SCAN_BODY_BYTES,
};

/// A value its section does not take. (Inner errors are not `source()`s: their text is
/// already in the message.)
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    #[error("redirect.agent_users must name at least one user")]
    NoAgentUser,
    #[error("redirect.reconcile_interval must be at least 100ms")]
    ReconcileTooOften,
    #[error("resolver.nameservers: {0}")]
    Nameserver(FormError),
    #[error(
        "resolver.hosts: {0:?} is not a host name; write the name alone (no scheme, port or \
         path), e.g. \"api.example.com\" = [\"10.0.0.5\"]"
    )]
    HostName(String),
    #[error("limits.max_connections_per_agent must be at least 1")]
    NoConnectionPerAgent,
    #[error("limits.max_connections must be at least 1")]
    NoConnection,
    #[error("limits.max_header_bytes must be at least 8192")]
    HeaderBytesTooFew,
    #[error("upstream.upgrades: {0:?} is not a protocol name (like \"websocket\")")]
    UpgradeName(String),
    #[error("secrets.scan_body_bytes must be at most {max}", max = MAX_SCAN_BODY_BYTES)]
    ScanTooMuch,
    #[error("secrets.store = \"keychain\" is available on macOS only; use \"file\"")]
    KeychainOffMacos,
    #[error("tls.leaf_cache_ttl must be shorter than tls.leaf_validity")]
    CacheOutlivesLeaf,
    #[error("listen.metrics: {0}; or \"off\" for no metrics listener")]
    Metrics(FormError),
    #[error("audit.max_bytes must be at least 65536")]
    AuditFileTooSmall,
    #[error("audit.refusal_window must be at most 1h (a count is written when it closes)")]
    RefusalWindowTooLong,
    #[error(transparent)]
    AuditExport(#[from] super::audit_export::AuditExportError),
    #[error("audit.checkpoint_interval must be 0 (off) or between 1s and 24h")]
    CheckpointInterval,
    #[error(transparent)]
    RateLimit(#[from] super::ratelimit::StoreConfigError),
    #[error(transparent)]
    Approvals(#[from] super::approvals::ApprovalsError),
}

pub(super) fn redirect(r: &Redirect) -> Result<(), CheckError> {
    if r.agent_users.is_empty() {
        return Err(CheckError::NoAgentUser);
    }
    if r.reconcile_interval < Duration::from_millis(100) {
        return Err(CheckError::ReconcileTooOften);
    }
    Ok(())
}

pub(super) fn resolver(r: &ResolverConfig) -> Result<(), CheckError> {
    for ns in &r.nameservers {
        forms::parse_nameserver(ns).map_err(CheckError::Nameserver)?;
    }
    match r
        .hosts
        .keys()
        .find(|name| name.is_empty() || name.contains(['/', ' ', ':']))
    {
        Some(name) => Err(CheckError::HostName(name.clone())),
        None => Ok(()),
    }
}

pub(super) fn limits(l: &Limits) -> Result<(), CheckError> {
    if l.max_connections_per_agent == 0 {
        return Err(CheckError::NoConnectionPerAgent);
    }
    if l.max_connections == 0 {
        return Err(CheckError::NoConnection);
    }
    if l.max_header_bytes < 8192 {
        return Err(CheckError::HeaderBytesTooFew);
    }
    Ok(())
}

pub(super) fn upstream(u: &Upstream) -> Result<(), CheckError> {
    let token = |b: u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~/".contains(&b);
    match u
        .upgrades
        .iter()
        .find(|p| p.is_empty() || !p.bytes().all(token))
    {
        Some(p) => Err(CheckError::UpgradeName(p.clone())),
        None => Ok(()),
    }
}

pub(super) fn secrets(s: &SecretsConfig) -> Result<(), CheckError> {
    if s.scan_body_bytes > MAX_SCAN_BODY_BYTES {
        return Err(CheckError::ScanTooMuch);
    }
    if s.store == SecretStoreKind::Keychain && !cfg!(target_os = "macos") {
        return Err(CheckError::KeychainOffMacos);
    }
    Ok(())
}

pub(super) fn approvals(a: &super::Approvals) -> Result<(), CheckError> {
    Ok(a.check()?)
}

pub(super) fn tls(t: &TlsConfig) -> Result<(), CheckError> {
    if t.leaf_cache_ttl >= t.leaf_validity {
        return Err(CheckError::CacheOutlivesLeaf);
    }
    Ok(())
}

/// `listen.metrics` as written: `IP:port`, or `"off"` (`None`).
pub(super) fn metrics(text: &str) -> Result<Option<SocketAddr>, CheckError> {
    match text {
        "off" => Ok(None),
        _ => forms::socket_addr_text(text)
            .map(Some)
            .map_err(CheckError::Metrics),
    }
}

pub(super) fn audit(a: &AuditConfig) -> Result<(), CheckError> {
    if a.max_bytes < 64 * 1024 {
        return Err(CheckError::AuditFileTooSmall);
    }
    if a.refusal_window > Duration::from_secs(3600) {
        return Err(CheckError::RefusalWindowTooLong);
    }
    super::audit_export::check(&a.export, a.enabled)?;
    let i = a.checkpoint_interval;
    if !i.is_zero() && (i < Duration::from_secs(1) || i > Duration::from_secs(24 * 3600)) {
        return Err(CheckError::CheckpointInterval);
    }
    Ok(())
}
