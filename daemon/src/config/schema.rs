//! The on-disk schema of `proxy.toml`: one serde struct per section, every key optional
//! (its default here), unknown keys rejected. What a value must satisfy beyond its type is
//! [`super::check`]'s; keys that were removed are [`super::removed`]'s.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use ipnet::IpNet;
use serde::Deserialize;

use super::forms;
use super::DnsConfig;
use super::UpstreamProxy;

/// The parsed file, as the operator wrote it.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct FileConfig {
    #[serde(default)]
    pub(super) listen: FileListen,
    #[serde(default)]
    pub(super) paths: FilePaths,
    #[serde(default)]
    pub(super) redirect: Redirect,
    #[serde(default)]
    pub(super) upstream: Upstream,
    #[serde(default)]
    pub(super) resolver: ResolverConfig,
    #[serde(default)]
    pub(super) dns: DnsConfig,
    #[serde(default)]
    pub(super) limits: Limits,
    #[serde(default)]
    pub(super) tls: TlsConfig,
    #[serde(default)]
    pub(super) approvals: super::Approvals,
    #[serde(default)]
    pub(super) secrets: SecretsConfig,
    #[serde(default)]
    pub(super) audit: AuditConfig,
    #[serde(default)]
    pub(super) ratelimit: super::RateLimitConfig,
    #[serde(default)]
    pub(super) daemon: DaemonSection,
    #[serde(default)]
    pub(super) testing: Testing,
    #[serde(default)]
    pub(super) policy: super::policy_source::PolicySection,
}

/// How the daemon runs.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(super) struct DaemonSection {
    /// Started as root, bind and redirect as root, then serve as this user (name or uid).
    pub(super) worker_user: Option<AgentUser>,
}

/// The audit log (its path is `paths.audit`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuditConfig {
    /// `false` writes no audit log at all (benchmarks; not for production).
    pub enabled: bool,
    /// The live file is rotated once it would grow past this many bytes.
    pub max_bytes: u64,
    /// Rotated files kept (`.1` newest … `.N` oldest); older ones are deleted.
    pub keep: u32,
    /// `redact` (default): query parameter values are recorded as `[redacted]`, names kept;
    /// `keep`: the query as sent (secret values are redacted regardless).
    pub query_values: QueryValues,
    /// Rotation never deletes a file holding a record younger than this; past it, new
    /// requests are refused (`audit_unavailable`) instead. 0 turns the guard off.
    #[serde(deserialize_with = "forms::duration")]
    pub retention: Duration,
    /// The same refusal repeated by one agent within this window is one `repeated` record
    /// with a count (the first is still recorded in full, at once). 0: every one in full.
    #[serde(deserialize_with = "forms::duration")]
    pub refusal_window: Duration,
    /// `[[audit.export]]`: sinks the log is shipped to (`audit/export/`).
    pub export: Vec<super::AuditExport>,
    /// A signed checkpoint of the chain after this many records (0: not by count)…
    pub checkpoint_every: u64,
    /// …or this long after the last one if a record came since (0: not by time); both 0:
    /// no checkpoints. The key is `paths.audit_key`.
    #[serde(deserialize_with = "forms::duration")]
    pub checkpoint_interval: Duration,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum QueryValues {
    Redact,
    Keep,
}

impl Default for AuditConfig {
    fn default() -> Self {
        AuditConfig {
            enabled: true,
            max_bytes: 100 * 1024 * 1024,
            keep: 10,
            query_values: QueryValues::Redact,
            retention: Duration::from_secs(24 * 60 * 60),
            refusal_window: Duration::from_secs(10),
            export: Vec::new(),
            checkpoint_every: 1000,
            checkpoint_interval: Duration::from_secs(60),
        }
    }
}

/// Where secret values live, and how much of a request body the leak guard reads.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SecretsConfig {
    /// `file` (the vault directory, `paths.vault`) or `keychain` (macOS System keychain).
    pub store: SecretStoreKind,
    /// Generic-password service name of keychain items.
    pub keychain_service: String,
    /// Bytes at the start of each request body checked for secrets; 0 checks no body.
    pub scan_body_bytes: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SecretStoreKind {
    File,
    Keychain,
}

/// Largest `secrets.scan_body_bytes`.
pub const MAX_SCAN_BODY_BYTES: usize = 64 * 1024 * 1024;

impl Default for SecretsConfig {
    fn default() -> Self {
        SecretsConfig {
            store: SecretStoreKind::File,
            keychain_service: "com.agenshield.proxy".into(),
            scan_body_bytes: 1024 * 1024,
        }
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct FileListen {
    #[serde(default, deserialize_with = "forms::socket_addrs")]
    pub(super) transparent: Option<Vec<SocketAddr>>,
    #[serde(default, deserialize_with = "forms::opt_socket_addr")]
    pub(super) explicit: Option<SocketAddr>,
    /// One address or a list; `[]` turns the DNS stub off.
    #[serde(default, deserialize_with = "forms::one_or_many_addrs")]
    pub(super) dns: Option<Vec<SocketAddr>>,
    /// `IP:port`, or `"off"`.
    pub(super) metrics: Option<String>,
    pub(super) admin: Option<PathBuf>,
    /// Who may use the explicit listener besides agent users, root and admins.
    #[serde(default)]
    pub(super) explicit_users: Vec<NameOrId>,
    #[serde(default)]
    pub(super) explicit_groups: Vec<NameOrId>,
    /// The admin API over HTTPS with client certificates (`config/approvals.rs`).
    #[serde(default, deserialize_with = "forms::opt_socket_addr")]
    pub(super) admin_https: Option<SocketAddr>,
    pub(super) client_ca: Option<PathBuf>,
    pub(super) admin_https_cert: Option<PathBuf>,
    pub(super) admin_https_key: Option<PathBuf>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct FilePaths {
    pub(super) policies: Option<PathBuf>,
    pub(super) certs: Option<PathBuf>,
    pub(super) vault: Option<PathBuf>,
    pub(super) audit: Option<PathBuf>,
    /// The audit checkpoint key (default: `audit-key.pem` in the CA directory).
    pub(super) audit_key: Option<PathBuf>,
    /// The pinned MCP tool definitions (default: `mcp/mcp-pins.json` beside the vault).
    pub(super) mcp_pins: Option<PathBuf>,
}

/// Firewall redirection of the agent users' traffic into the transparent listener.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Redirect {
    /// `run` installs the rules at start and keeps them in place.
    pub enabled: bool,
    /// User names or uids whose traffic is redirected.
    pub agent_users: Vec<AgentUser>,
    /// The opt-out from the DNS stub: agent DNS to these resolvers passes unchanged, around
    /// policy (a channel out of the machine: warned about at start). Empty by default.
    pub dns_passthrough: Vec<IpAddr>,
    /// Removed (the agent's DNS goes to the stub now); kept only to explain that.
    #[serde(default)]
    pub(super) allow_dns: Option<bool>,
    /// Removed, see `allow_dns`.
    #[serde(default)]
    pub(super) dns_servers: Option<Vec<IpAddr>>,
    /// Destinations the agent reaches directly, without the proxy.
    #[serde(deserialize_with = "forms::ip_nets")]
    pub exempt: Vec<IpNet>,
    /// How often `run` checks that the rules are still in place (and restores them).
    #[serde(deserialize_with = "forms::duration")]
    pub reconcile_interval: Duration,
}

impl Default for Redirect {
    fn default() -> Self {
        Redirect {
            enabled: false,
            agent_users: vec![AgentUser::Name("ash_default_agent".into())],
            dns_passthrough: Vec::new(),
            allow_dns: None,
            dns_servers: None,
            exempt: Vec::new(),
            reconcile_interval: Duration::from_secs(5),
        }
    }
}

/// An agent user, by name or uid.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
pub enum AgentUser {
    Uid(u32),
    Name(String),
}

/// A user or group, by name or numeric id.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
pub enum NameOrId {
    Id(u32),
    Name(String),
}

impl std::fmt::Display for NameOrId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NameOrId::Id(n) => write!(f, "{n}"),
            NameOrId::Name(n) => f.write_str(n),
        }
    }
}

impl std::fmt::Display for AgentUser {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AgentUser::Uid(u) => write!(f, "{u}"),
            AgentUser::Name(n) => f.write_str(n),
        }
    }
}

/// Upstream (proxy → internet) settings.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Upstream {
    /// PEM files trusted in addition to the system roots.
    #[serde(default)]
    pub extra_ca: Vec<PathBuf>,
    /// Ranges the private-address guard lets through.
    #[serde(default, deserialize_with = "forms::ip_nets")]
    pub allow_private: Vec<IpNet>,
    /// Protocols a request may switch to (`Upgrade`), compared without regard to case.
    /// Anything else is refused (`upgrade_refused`): after a switch, bytes flow with no path
    /// rule and no secret check.
    #[serde(default = "default_upgrades")]
    pub upgrades: Vec<String>,
    /// The operator's own HTTP proxy every upstream connection goes through, if any.
    #[serde(default)]
    pub proxy: Option<UpstreamProxy>,
}

impl Default for Upstream {
    fn default() -> Self {
        Upstream {
            extra_ca: Vec::new(),
            allow_private: Vec::new(),
            upgrades: default_upgrades(),
            proxy: None,
        }
    }
}

fn default_upgrades() -> Vec<String> {
    vec!["websocket".into()]
}

/// The proxy's own resolver.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResolverConfig {
    /// `IP` or `IP:port`; empty means the system's configuration.
    #[serde(default)]
    pub nameservers: Vec<String>,
    /// Static name → addresses, consulted before DNS.
    #[serde(default, deserialize_with = "forms::hosts")]
    pub hosts: BTreeMap<String, Vec<IpAddr>>,
}

/// Bounds on what a client may cost us.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    /// Connections served at once, over all listeners; more are closed at once, recorded.
    pub max_connections: usize,
    /// Connections one agent (a local uid; where the OS cannot tell, a client address) may
    /// hold at once; more are closed at once, recorded.
    pub max_connections_per_agent: usize,
    /// How long a new connection may take to send enough bytes to be classified, when raw
    /// TCP to its destination is refused.
    #[serde(deserialize_with = "forms::duration")]
    pub first_bytes_timeout: Duration,
    /// How long a silent client is given when raw TCP to its destination is allowed and an
    /// HTTP request could be too: then it is taken for a protocol whose server speaks first
    /// (SMTP, MySQL…) and relayed. (Allowed as raw TCP and never as HTTP: relayed at once.)
    #[serde(deserialize_with = "forms::duration")]
    pub server_first_wait: Duration,
    #[serde(deserialize_with = "forms::duration")]
    pub tls_handshake_timeout: Duration,
    /// How long a client may take to send a request's headers once they start (HTTP/1).
    #[serde(deserialize_with = "forms::duration")]
    pub header_read_timeout: Duration,
    /// How long an HTTP connection may wait for its first request (after the TLS handshake).
    #[serde(deserialize_with = "forms::duration")]
    pub first_request_timeout: Duration,
    /// How long an HTTP connection may sit with no request in flight (keep-alive, HTTP/2).
    #[serde(deserialize_with = "forms::duration")]
    pub idle_timeout: Duration,
    /// Largest request head accepted (HTTP/1 request line and headers; HTTP/2 fields as h2
    /// counts them): above it, a JSON 431. The HTTP server's own caps are twice this.
    pub max_header_bytes: usize,
    #[serde(deserialize_with = "forms::duration")]
    pub upstream_connect_timeout: Duration,
    /// Idle pooled upstream connections are closed after this long.
    #[serde(deserialize_with = "forms::duration")]
    pub upstream_idle_timeout: Duration,
    /// An opaque (non-HTTP) tunnel with no traffic either way for this long is closed.
    #[serde(deserialize_with = "forms::duration")]
    pub tunnel_idle_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_connections: 4096,
            max_connections_per_agent: 1024,
            first_bytes_timeout: Duration::from_secs(5),
            server_first_wait: Duration::from_millis(250),
            tls_handshake_timeout: Duration::from_secs(10),
            header_read_timeout: Duration::from_secs(30),
            first_request_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(90),
            max_header_bytes: 64 * 1024,
            upstream_connect_timeout: Duration::from_secs(10),
            upstream_idle_timeout: Duration::from_secs(90),
            tunnel_idle_timeout: Duration::from_secs(600),
        }
    }
}

/// Leaf certificates minted for intercepted connections.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TlsConfig {
    #[serde(deserialize_with = "forms::duration")]
    pub leaf_validity: Duration,
    pub leaf_cache_capacity: u64,
    #[serde(deserialize_with = "forms::duration")]
    pub leaf_cache_ttl: Duration,
}

impl Default for TlsConfig {
    fn default() -> Self {
        TlsConfig {
            leaf_validity: Duration::from_secs(24 * 3600),
            leaf_cache_capacity: 10_000,
            leaf_cache_ttl: Duration::from_secs(12 * 3600),
        }
    }
}

/// Knobs that exist only so the test-suite can run the proxy without a firewall.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Testing {
    /// Pretend every transparent connection was headed here.
    pub orig_dst_override: Option<SocketAddr>,
    /// A split daemon's worker asks the supervisor for original destinations even where it
    /// could look them up itself (always so on macOS): exercises that path on Linux.
    pub broker_orig_dst: bool,
    /// Every local uid counts as an agent user's: the transparent listener admits it and
    /// secret-binding rules serve it (the test-suite connects as whoever runs it).
    pub every_uid_is_agent: bool,
}
