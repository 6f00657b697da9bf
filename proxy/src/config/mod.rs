//! Daemon configuration (`proxy.toml`): every key optional, unknown keys rejected.
//!
//! A run without a config file uses built-in defaults with all state relocated under a
//! directory the caller can write, so `agenshield proxy run` works out of the box.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use ipnet::IpNet;
use serde::Deserialize;

mod dns;
mod forms;
mod upstream_proxy;
pub use dns::{DeniedAnswer, DnsConfig};
pub use upstream_proxy::{authority, UpstreamProxy};

/// Where the installed product keeps its configuration.
pub const DEFAULT_CONFIG_PATH: &str = "/opt/agenshield/config/proxy.toml";

/// The installed config is there but this user may not read it (the agent, by design).
pub fn installed_config_unreadable() -> bool {
    matches!(
        std::fs::File::open(DEFAULT_CONFIG_PATH),
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied
    )
}
/// The installed daemon's admin socket.
pub const DEFAULT_ADMIN_SOCKET: &str = "/var/run/agenshield/proxy.sock";
pub const DEFAULT_AUDIT_LOG: &str = "/var/log/agenshield/proxy-audit.jsonl";

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}:{line}:{column}: {message}")]
    Parse {
        path: PathBuf,
        line: usize,
        column: usize,
        message: String,
    },
    #[error("{path}: {message}")]
    Invalid { path: PathBuf, message: String },
    #[error("no config file given and no writable state directory: {0}")]
    NoStateDir(String),
}

/// The parsed file, as the operator wrote it.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    #[serde(default)]
    listen: FileListen,
    #[serde(default)]
    paths: FilePaths,
    #[serde(default)]
    redirect: Redirect,
    #[serde(default)]
    upstream: Upstream,
    #[serde(default)]
    resolver: ResolverConfig,
    #[serde(default)]
    dns: DnsConfig,
    #[serde(default)]
    limits: Limits,
    #[serde(default)]
    tls: TlsConfig,
    #[serde(default)]
    approvals: Approvals,
    #[serde(default)]
    secrets: SecretsConfig,
    #[serde(default)]
    audit: AuditConfig,
    #[serde(default)]
    daemon: DaemonSection,
    #[serde(default)]
    testing: Testing,
}

/// How the daemon runs.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct DaemonSection {
    /// Started as root, bind and redirect as root, then serve as this user (name or uid).
    worker_user: Option<AgentUser>,
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

/// Requests held by `ask` rules.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Approvals {
    /// How long a held request waits for an operator; then it is denied.
    #[serde(deserialize_with = "forms::duration")]
    pub timeout: Duration,
}

impl Default for Approvals {
    fn default() -> Self {
        Approvals {
            timeout: Duration::from_secs(60),
        }
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileListen {
    #[serde(default, deserialize_with = "forms::socket_addrs")]
    transparent: Option<Vec<SocketAddr>>,
    #[serde(default, deserialize_with = "forms::opt_socket_addr")]
    explicit: Option<SocketAddr>,
    /// One address or a list; `[]` turns the DNS stub off.
    #[serde(default, deserialize_with = "forms::one_or_many_addrs")]
    dns: Option<Vec<SocketAddr>>,
    /// `IP:port`, or `"off"`.
    metrics: Option<String>,
    admin: Option<PathBuf>,
    /// Who may use the explicit listener besides agent users, root and admins.
    #[serde(default)]
    explicit_users: Vec<NameOrId>,
    #[serde(default)]
    explicit_groups: Vec<NameOrId>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FilePaths {
    policies: Option<PathBuf>,
    certs: Option<PathBuf>,
    vault: Option<PathBuf>,
    audit: Option<PathBuf>,
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
    allow_dns: Option<bool>,
    /// Removed, see `allow_dns`.
    #[serde(default)]
    dns_servers: Option<Vec<IpAddr>>,
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

/// The effective configuration the daemon runs with.
#[derive(Debug, Clone)]
pub struct Config {
    /// The file it came from; `None` for built-in defaults.
    pub source: Option<PathBuf>,
    /// Set when running on built-in defaults: where state was put.
    pub state_dir: Option<PathBuf>,
    pub transparent: Vec<SocketAddr>,
    /// Whether `transparent` came from the defaults (a missing IPv6 loopback is then tolerated).
    pub transparent_is_default: bool,
    /// The DNS stub's addresses (UDP and TCP each); empty: no stub.
    pub dns: Vec<SocketAddr>,
    /// Whether `dns` came from the defaults (a missing IPv6 loopback is then tolerated).
    pub dns_is_default: bool,
    pub explicit: SocketAddr,
    /// `listen.explicit_users` / `listen.explicit_groups`: admitted to the explicit listener
    /// besides agent users, root, the daemon's own user and `agenshield-admin` members.
    pub explicit_users: Vec<NameOrId>,
    pub explicit_groups: Vec<NameOrId>,
    /// The admin API's Unix socket.
    pub admin: PathBuf,
    pub policies: PathBuf,
    pub certs: PathBuf,
    pub upstream: Upstream,
    pub resolver: ResolverConfig,
    /// `[dns]`: how the DNS stub answers.
    pub dns_answers: DnsConfig,
    pub limits: Limits,
    pub tls: TlsConfig,
    pub redirect: Redirect,
    pub approvals: Approvals,
    /// The file vault (used when `secrets.store = "file"`).
    pub vault: PathBuf,
    pub secrets: SecretsConfig,
    /// The metrics listener (`/metrics`); `None`: off.
    pub metrics: Option<SocketAddr>,
    /// The audit log's path; `None` when `audit.enabled = false`.
    pub audit_path: Option<PathBuf>,
    pub audit: AuditConfig,
    pub testing: Testing,
    /// `daemon.worker_user`: the unprivileged user a root start serves as (see `privsep`).
    pub worker_user: Option<AgentUser>,
    /// Keys the operator set that have no effect in this build (warned about at start).
    pub not_yet_effective: Vec<&'static str>,
}

fn default_transparent() -> Vec<SocketAddr> {
    vec![
        SocketAddr::from(([127, 0, 0, 1], 15001)),
        SocketAddr::from((std::net::Ipv6Addr::LOCALHOST, 15001)),
    ]
}

fn default_dns() -> Vec<SocketAddr> {
    vec![
        SocketAddr::from(([127, 0, 0, 1], 15053)),
        SocketAddr::from((std::net::Ipv6Addr::LOCALHOST, 15053)),
    ]
}

fn default_metrics() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 15090))
}

fn default_explicit() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 15080))
}

impl Config {
    /// Loads `path`. Relative paths inside it are taken relative to the file's directory
    /// (never the working directory), and every path of the result is absolute: the config
    /// file's own too, when it was given relative to the working directory.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Self::parse(&text, path)
    }

    fn parse(text: &str, path: &Path) -> Result<Config, ConfigError> {
        // Absolute first: a relative path compared with what the OS reports (the policy
        // watcher's events, say) never matches, and the worker of a split daemon may start
        // elsewhere.
        let path = &std::path::absolute(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let file: FileConfig = toml::from_str(text).map_err(|e| {
            let (line, column) = e.span().map(|s| line_col(text, s.start)).unwrap_or((1, 1));
            ConfigError::Parse {
                path: path.to_path_buf(),
                line,
                column,
                message: crate::toml_errors::explain(e.message()),
            }
        })?;
        let base = path.parent().unwrap_or(Path::new("."));
        let installed = Path::new("/opt/agenshield");
        Self::from_file(
            file,
            Some(path.to_path_buf()),
            None,
            &|p: &Path| base.join(p),
            &|rel: &str| installed.join(rel),
        )
    }

    /// The installed defaults (paths under /opt/agenshield, as if the installed config
    /// file were empty), for a user who may not read that file.
    pub fn installed_defaults() -> Config {
        let installed = Path::new("/opt/agenshield");
        Self::from_file(
            FileConfig::default(),
            None,
            None,
            &|p: &Path| p.to_path_buf(),
            &|rel: &str| installed.join(rel),
        )
        .unwrap_or_else(|_| unreachable!("built-in defaults are valid"))
    }

    /// Built-in defaults, with state under `state_dir`.
    pub fn defaults_in(state_dir: &Path) -> Config {
        let mut cfg = Self::from_file(
            FileConfig::default(),
            None,
            Some(state_dir.to_path_buf()),
            &|p: &Path| p.to_path_buf(),
            &|rel: &str| state_dir.join(rel),
        )
        .unwrap_or_else(|_| unreachable!("built-in defaults are valid"));
        cfg.state_dir = Some(state_dir.to_path_buf());
        cfg
    }

    fn from_file(
        f: FileConfig,
        source: Option<PathBuf>,
        state_dir: Option<PathBuf>,
        relative: &dyn Fn(&Path) -> PathBuf,
        default_path: &dyn Fn(&str) -> PathBuf,
    ) -> Result<Config, ConfigError> {
        let invalid = |message: String| ConfigError::Invalid {
            path: source.clone().unwrap_or_default(),
            message,
        };
        if f.redirect.agent_users.is_empty() {
            return Err(invalid(
                "redirect.agent_users must name at least one user".into(),
            ));
        }
        if f.redirect.reconcile_interval < Duration::from_millis(100) {
            return Err(invalid(
                "redirect.reconcile_interval must be at least 100ms".into(),
            ));
        }
        // The pass-through's shipped defaults (`allow_dns = true`, `dns_servers = []`) are in
        // every config installed before the stub: the stub is stricter, so they only warn.
        // Anything that asked for more (named resolvers) or less (no DNS) is refused, never
        // given a different meaning.
        let mut not_yet = Vec::new();
        let removed = "redirect.allow_dns and redirect.dns_servers were removed: the agent's DNS \
             now goes to the proxy's DNS stub (listen.dns), which answers only names some rule \
             could allow";
        match (f.redirect.allow_dns, f.redirect.dns_servers.as_deref()) {
            (None | Some(true), None | Some([])) => {
                if f.redirect.allow_dns.is_some() || f.redirect.dns_servers.is_some() {
                    not_yet
                        .push("redirect.allow_dns / redirect.dns_servers (removed: delete them)");
                }
            }
            (Some(false), _) => {
                return Err(invalid(format!(
                    "{removed}. redirect.allow_dns = false (no DNS for the agent) is now \
                     listen.dns = []: set that and delete redirect.allow_dns"
                )))
            }
            (_, Some(_)) => {
                return Err(invalid(format!(
                    "{removed}. Delete redirect.dns_servers; to let the agent's DNS reach those \
                     resolvers unchanged (around policy: a channel out of the machine) set \
                     redirect.dns_passthrough = [\"IP\", …] instead"
                )))
            }
        }
        let dns_is_default = f.listen.dns.is_none();
        let dns = f.listen.dns.unwrap_or_else(default_dns);
        let transparent_is_default = f.listen.transparent.is_none();
        let transparent = f.listen.transparent.unwrap_or_else(default_transparent);
        for ns in &f.resolver.nameservers {
            parse_nameserver(ns).map_err(|m| invalid(format!("resolver.nameservers: {m}")))?;
        }
        for name in f.resolver.hosts.keys() {
            if name.is_empty() || name.contains(['/', ' ', ':']) {
                return Err(invalid(format!(
                    "resolver.hosts: {name:?} is not a host name; write the name alone (no \
                     scheme, port or path), e.g. \"api.example.com\" = [\"10.0.0.5\"]"
                )));
            }
        }
        if f.limits.max_connections_per_agent == 0 {
            return Err(invalid(
                "limits.max_connections_per_agent must be at least 1".into(),
            ));
        }
        if f.limits.max_connections == 0 {
            return Err(invalid("limits.max_connections must be at least 1".into()));
        }
        if f.limits.max_header_bytes < 8192 {
            return Err(invalid(
                "limits.max_header_bytes must be at least 8192".into(),
            ));
        }
        for p in &f.upstream.upgrades {
            let token = |b: u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~/".contains(&b);
            if p.is_empty() || !p.bytes().all(token) {
                return Err(invalid(format!(
                    "upstream.upgrades: {p:?} is not a protocol name (like \"websocket\")"
                )));
            }
        }
        if f.secrets.scan_body_bytes > MAX_SCAN_BODY_BYTES {
            return Err(invalid(format!(
                "secrets.scan_body_bytes must be at most {MAX_SCAN_BODY_BYTES}"
            )));
        }
        if f.secrets.store == SecretStoreKind::Keychain && !cfg!(target_os = "macos") {
            return Err(invalid(
                "secrets.store = \"keychain\" is available on macOS only; use \"file\"".into(),
            ));
        }
        if f.approvals.timeout.is_zero() {
            return Err(invalid("approvals.timeout must be more than 0s".into()));
        }
        if f.tls.leaf_cache_ttl >= f.tls.leaf_validity {
            return Err(invalid(
                "tls.leaf_cache_ttl must be shorter than tls.leaf_validity".into(),
            ));
        }
        let path_or = |p: Option<PathBuf>, rel: &str| match p {
            Some(p) => relative(&p),
            None => default_path(rel),
        };
        let upstream = Upstream {
            extra_ca: f.upstream.extra_ca.iter().map(|p| relative(p)).collect(),
            allow_private: f.upstream.allow_private,
            upgrades: f.upstream.upgrades,
            proxy: f.upstream.proxy,
        };
        let admin = match f.listen.admin {
            Some(p) => relative(&p),
            None if state_dir.is_some() => default_path("proxy.sock"),
            None => PathBuf::from(DEFAULT_ADMIN_SOCKET),
        };
        let metrics = match f.listen.metrics.as_deref() {
            None => Some(default_metrics()),
            Some("off") => None,
            Some(text) => Some(forms::socket_addr_text(text).map_err(|e| {
                invalid(format!(
                    "listen.metrics: {e}; or \"off\" for no metrics listener"
                ))
            })?),
        };
        if f.audit.max_bytes < 64 * 1024 {
            return Err(invalid("audit.max_bytes must be at least 65536".into()));
        }
        if f.audit.refusal_window > Duration::from_secs(3600) {
            return Err(invalid(
                "audit.refusal_window must be at most 1h (a count is written when it closes)"
                    .into(),
            ));
        }
        let audit_path = match (f.audit.enabled, f.paths.audit) {
            (false, _) => None,
            (true, Some(p)) => Some(relative(&p)),
            (true, None) if state_dir.is_some() => Some(default_path("proxy-audit.jsonl")),
            (true, None) => Some(PathBuf::from(DEFAULT_AUDIT_LOG)),
        };
        Ok(Config {
            source,
            state_dir,
            transparent,
            transparent_is_default,
            dns,
            dns_is_default,
            explicit: f.listen.explicit.unwrap_or_else(default_explicit),
            explicit_users: f.listen.explicit_users,
            explicit_groups: f.listen.explicit_groups,
            admin,
            policies: path_or(f.paths.policies, "policies"),
            certs: path_or(f.paths.certs, "certs"),
            upstream,
            resolver: f.resolver,
            dns_answers: f.dns,
            limits: f.limits,
            tls: f.tls,
            redirect: f.redirect,
            approvals: f.approvals,
            vault: path_or(f.paths.vault, "vault"),
            secrets: f.secrets,
            metrics,
            audit_path,
            audit: f.audit,
            testing: f.testing,
            worker_user: f.daemon.worker_user,
            not_yet_effective: not_yet,
        })
    }
}

/// `IP` (port 53) or `IP:port`.
pub fn parse_nameserver(s: &str) -> Result<SocketAddr, String> {
    if let Ok(sa) = s.parse::<SocketAddr>() {
        return Ok(sa);
    }
    s.parse::<IpAddr>()
        .map(|ip| SocketAddr::new(ip, 53))
        .map_err(|_| {
            format!(
                "{s:?} is not an IP address or IP:port, e.g. \"10.0.0.53\" or \
                 \"10.0.0.53:5353\" (a name is not looked up)"
            )
        })
}

/// Chooses the state directory for a run on built-in defaults.
/// Always absolute: a relative `AGENSHIELD_STATE_DIR` or `HOME` is taken from the working
/// directory; a relative `XDG_STATE_HOME` is ignored, as the XDG specification says.
pub fn default_state_dir() -> Result<PathBuf, ConfigError> {
    let dir = if let Some(dir) = std::env::var_os("AGENSHIELD_STATE_DIR") {
        PathBuf::from(dir)
    } else if nix::unistd::geteuid().is_root() {
        PathBuf::from("/var/lib/agenshield")
    } else if let Some(dir) = std::env::var_os("XDG_STATE_HOME")
        .map(PathBuf::from)
        .filter(|d| d.is_absolute())
    {
        dir.join("agenshield")
    } else {
        match std::env::var_os("HOME").filter(|h| !h.is_empty()) {
            Some(home) => PathBuf::from(home).join(".local/state/agenshield"),
            None => {
                return Err(ConfigError::NoStateDir(
                    "set AGENSHIELD_STATE_DIR or HOME".into(),
                ))
            }
        }
    };
    std::path::absolute(&dir)
        .map_err(|e| ConfigError::NoStateDir(format!("{}: {e}", dir.display())))
}

/// 1-based line and column of byte offset `at` in `text`.
pub fn line_col(text: &str, at: usize) -> (usize, usize) {
    let at = at.min(text.len());
    let before = &text[..at];
    let line = before.matches('\n').count() + 1;
    let column = before.rfind('\n').map_or(at, |nl| at - nl - 1) + 1;
    (line, column)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_testing_section_may_set_one_knob() {
        let cfg = Config::parse(
            "[testing]\norig_dst_override = \"127.0.0.1:9\"\n",
            Path::new("/x/proxy.toml"),
        )
        .expect("one knob is enough");
        assert!(!cfg.testing.broker_orig_dst);
        let cfg = Config::parse(
            "[testing]\nbroker_orig_dst = true\n",
            Path::new("/x/p.toml"),
        )
        .expect("the other alone too");
        assert_eq!(cfg.testing.orig_dst_override, None);
    }

    #[test]
    fn installed_defaults_point_at_the_installed_layout() {
        let cfg = Config::installed_defaults();
        assert_eq!(cfg.explicit, "127.0.0.1:15080".parse().expect("addr"));
        assert_eq!(cfg.certs, Path::new("/opt/agenshield/certs"));
        assert_eq!(cfg.source, None);
        assert_eq!(cfg.state_dir, None);
    }

    #[test]
    fn unknown_key_is_an_error_with_position() {
        let err = Config::parse("[listen]\ntransparant = []\n", Path::new("/x/proxy.toml"))
            .expect_err("unknown key must fail");
        let msg = err.to_string();
        assert!(msg.starts_with("/x/proxy.toml:2:1:"), "{msg}");
        assert!(msg.contains("transparant"), "{msg}");
    }

    #[test]
    fn empty_file_gives_design_defaults() {
        let cfg = Config::parse("", Path::new("/etc/a/proxy.toml")).expect("valid");
        assert_eq!(cfg.transparent, default_transparent());
        assert_eq!(cfg.explicit, default_explicit());
        assert_eq!(cfg.policies, Path::new("/opt/agenshield/policies"));
        assert_eq!(cfg.certs, Path::new("/opt/agenshield/certs"));
        assert_eq!(cfg.vault, Path::new("/opt/agenshield/vault"));
        assert_eq!(cfg.secrets.store, SecretStoreKind::File);
        assert_eq!(cfg.dns, default_dns());
        assert!(cfg.dns_is_default);
        assert!(cfg.redirect.dns_passthrough.is_empty());
        assert!(cfg.not_yet_effective.is_empty());
    }

    #[test]
    fn the_dns_stub_takes_one_address_a_list_or_none() {
        let parse = |t: &str| Config::parse(t, Path::new("/etc/a/proxy.toml"));
        let one = parse("[listen]\ndns = \"127.0.0.1:5353\"\n").expect("one");
        assert_eq!(one.dns, vec![SocketAddr::from(([127, 0, 0, 1], 5353))]);
        assert!(!one.dns_is_default);
        let none = parse("[listen]\ndns = []\n").expect("none");
        assert!(none.dns.is_empty());
        let two = parse("[listen]\ndns = [\"127.0.0.1:1\", \"[::1]:1\"]\n").expect("two");
        assert_eq!(two.dns.len(), 2);
    }

    /// A config written for the pass-through is refused with what to do instead, never
    /// silently given a different meaning.
    #[test]
    fn the_removed_dns_pass_through_keys_explain_themselves() {
        for (text, fix) in [
            ("[redirect]\nallow_dns = false\n", "listen.dns = []"),
            (
                "[redirect]\ndns_servers = [\"10.0.0.53\"]\n",
                "redirect.dns_passthrough",
            ),
        ] {
            let err = Config::parse(text, Path::new("/etc/a/proxy.toml"))
                .expect_err("removed key")
                .to_string();
            assert!(err.contains(fix), "{err}");
            assert!(err.contains("listen.dns"), "{err}");
        }
        // The old shipped defaults, in every config installed before the stub: a warning.
        let old = Config::parse(
            "[redirect]\nallow_dns = true\ndns_servers = []\n",
            Path::new("/etc/a/proxy.toml"),
        )
        .expect("old defaults still start");
        assert_eq!(old.not_yet_effective.len(), 1);
        assert!(old.redirect.dns_passthrough.is_empty());
        let cfg = Config::parse(
            "[redirect]\ndns_passthrough = [\"10.0.0.53\"]\n",
            Path::new("/etc/a/proxy.toml"),
        )
        .expect("opt-out");
        assert_eq!(cfg.redirect.dns_passthrough.len(), 1);
    }

    #[test]
    fn relative_paths_follow_the_config_file() {
        let cfg = Config::parse(
            "[paths]\npolicies = \"pol\"\n[upstream]\nextra_ca = [\"ca.pem\"]\nallow_private = [\"127.0.0.0/8\"]\n",
            Path::new("/etc/a/proxy.toml"),
        )
        .expect("valid");
        assert_eq!(cfg.policies, Path::new("/etc/a/pol"));
        assert_eq!(cfg.upstream.extra_ca, vec![PathBuf::from("/etc/a/ca.pem")]);
        assert_eq!(cfg.upstream.allow_private.len(), 1);
    }

    /// Issue 34: `cd lab; proxy run --config proxy.toml` kept every path relative, and the
    /// policy watcher never matched one. Every path of a loaded config is absolute, relative
    /// ones taken from the config file's directory.
    #[test]
    fn every_path_is_absolute_from_a_relative_config_path() {
        let lab = std::env::current_dir().expect("cwd").join("lab");
        let cfg = Config::parse(
            "[listen]\nadmin = \"run/a.sock\"\n[paths]\npolicies = \"pol\"\ncerts = \"c\"\nvault = \"v\"\naudit = \"log/a.jsonl\"\n[upstream]\nextra_ca = [\"ca.pem\"]\n",
            Path::new("lab/proxy.toml"),
        )
        .expect("valid");
        assert_eq!(
            cfg.source.as_deref(),
            Some(lab.join("proxy.toml").as_path())
        );
        assert_eq!(cfg.policies, lab.join("pol"));
        assert_eq!(cfg.certs, lab.join("c"));
        assert_eq!(cfg.vault, lab.join("v"));
        assert_eq!(cfg.admin, lab.join("run/a.sock"));
        assert_eq!(
            cfg.audit_path.as_deref(),
            Some(lab.join("log/a.jsonl").as_path())
        );
        assert_eq!(cfg.upstream.extra_ca, vec![lab.join("ca.pem")]);
        let bare = Config::parse("", Path::new("proxy.toml")).expect("valid");
        for p in [&bare.policies, &bare.certs, &bare.vault, &bare.admin] {
            assert!(p.is_absolute(), "{}", p.display());
        }
        assert!(bare.source.as_deref().is_some_and(Path::is_absolute));
    }

    /// Issue 34: each mistake is answered with the form wanted and an example, at its place.
    #[test]
    fn mistakes_are_answered_with_the_right_form_and_an_example() {
        for (text, said) in [
            (
                "[listen]\nexplicit = \"localhost:27080\"\n",
                "e.g. \"127.0.0.1:27080\"",
            ),
            (
                "[listen]\ntransparent = \"127.0.0.1:1\"\n",
                "e.g. [\"127.0.0.1:15001\"",
            ),
            (
                "[listen]\ndns = \"localhost:53\"\n",
                "e.g. \"127.0.0.1:53\"",
            ),
            (
                "[listen]\nmetrics = \"localhost:9090\"\n",
                "e.g. \"127.0.0.1:9090\"",
            ),
            (
                "[upstream]\nallow_private = [\"10.0.0.0/33\"]\n",
                "e.g. \"10.99.0.0/24\"",
            ),
            ("[redirect]\nexempt = [\"10.0.0.1\"]\n", "\"10.0.0.1/32\""),
            ("[redirect]\nreconcile_interval = \"90\"\n", "e.g. \"90s\""),
            ("[approvals]\ntimeout = 90\n", "in quotes, e.g. \"90s\""),
            ("[resolver]\nhosts = \"x\"\n", "[resolver.hosts]"),
            (
                "[resolver.hosts]\n\"https://x.test/\" = [\"127.0.0.1\"]\n",
                "write the name alone",
            ),
            (
                "[resolver]\nnameservers = [\"localhost:53\"]\n",
                "e.g. \"10.0.0.53\"",
            ),
            (
                "[redirect]\nagent_users = \"x\"\n",
                "write a list in brackets, e.g. [\"x\"]",
            ),
        ] {
            let err = Config::parse(text, Path::new("/etc/a/proxy.toml"))
                .expect_err(text)
                .to_string();
            assert!(err.contains(said), "{text}: {err}");
            assert!(err.starts_with("/etc/a/proxy.toml:"), "{err}");
        }
        let at = Config::parse(
            "[listen]\nexplicit = \"localhost:1\"\n",
            Path::new("/p.toml"),
        )
        .expect_err("bad")
        .to_string();
        assert!(at.starts_with("/p.toml:2:12:"), "the value's place: {at}");
    }

    #[test]
    fn agent_users_take_names_and_uids() {
        let cfg = Config::parse(
            "[redirect]\nenabled = true\nagent_users = [\"ash_default_agent\", 5201]\nexempt = [\"10.9.0.0/16\"]\n",
            Path::new("p.toml"),
        )
        .expect("valid");
        assert!(cfg.redirect.enabled);
        assert_eq!(
            cfg.redirect.agent_users,
            vec![
                AgentUser::Name("ash_default_agent".into()),
                AgentUser::Uid(5201)
            ]
        );
        assert!(Config::parse("[redirect]\nagent_users = []\n", Path::new("p.toml")).is_err());
    }

    #[test]
    fn explicit_listener_users_and_groups_take_names_and_ids() {
        let cfg = Config::parse(
            "[listen]\nexplicit_users = [\"alice\", 1001]\nexplicit_groups = [\"developers\", 2000]\n[testing]\nevery_uid_is_agent = true\n",
            Path::new("p.toml"),
        )
        .expect("valid");
        assert_eq!(
            cfg.explicit_users,
            vec![NameOrId::Name("alice".into()), NameOrId::Id(1001)]
        );
        assert_eq!(
            cfg.explicit_groups,
            vec![NameOrId::Name("developers".into()), NameOrId::Id(2000)]
        );
        assert!(cfg.testing.every_uid_is_agent);
        let none = Config::parse("", Path::new("p.toml")).expect("valid");
        assert!(none.explicit_users.is_empty() && none.explicit_groups.is_empty());
        assert!(!none.testing.every_uid_is_agent);
        assert!(Config::parse("[listen]\nexplicit_users = [-1]\n", Path::new("p.toml")).is_err());
    }

    #[test]
    fn durations_and_limits_parse() {
        let cfg = Config::parse(
            "[limits]\nfirst_bytes_timeout = \"250ms\"\nmax_connections = 10\n",
            Path::new("p.toml"),
        )
        .expect("valid");
        assert_eq!(cfg.limits.first_bytes_timeout, Duration::from_millis(250));
        assert_eq!(cfg.limits.max_connections, 10);
        assert!(Config::parse("[limits]\nmax_connections = 0\n", Path::new("p.toml")).is_err());
    }

    #[test]
    fn defaults_relocate_under_state_dir() {
        let cfg = Config::defaults_in(Path::new("/tmp/st"));
        assert_eq!(cfg.policies, Path::new("/tmp/st/policies"));
        assert_eq!(cfg.certs, Path::new("/tmp/st/certs"));
        assert_eq!(cfg.vault, Path::new("/tmp/st/vault"));
        assert_eq!(cfg.admin, Path::new("/tmp/st/proxy.sock"));
        assert_eq!(cfg.state_dir.as_deref(), Some(Path::new("/tmp/st")));
    }

    #[test]
    fn secrets_section() {
        let cfg = Config::parse(
            "[paths]\nvault = \"v\"\n[secrets]\nscan_body_bytes = 0\n",
            Path::new("/etc/a/proxy.toml"),
        )
        .expect("valid");
        assert_eq!(cfg.vault, Path::new("/etc/a/v"));
        assert_eq!(cfg.secrets.scan_body_bytes, 0);
        assert!(cfg.not_yet_effective.is_empty());
        let too_big = format!("[secrets]\nscan_body_bytes = {}\n", MAX_SCAN_BODY_BYTES + 1);
        assert!(Config::parse(&too_big, Path::new("p.toml")).is_err());
        assert!(Config::parse("[secrets]\nstore = \"vault\"\n", Path::new("p.toml")).is_err());
        #[cfg(not(target_os = "macos"))]
        {
            let err = Config::parse("[secrets]\nstore = \"keychain\"\n", Path::new("p.toml"))
                .expect_err("keychain off macOS");
            assert!(err.to_string().contains("macOS only"), "{err}");
        }
    }

    #[test]
    fn nameserver_forms() {
        assert_eq!(
            parse_nameserver("127.0.0.1").ok(),
            "127.0.0.1:53".parse().ok()
        );
        assert_eq!(
            parse_nameserver("[::1]:5353").ok(),
            "[::1]:5353".parse().ok()
        );
        assert!(parse_nameserver("dns.google").is_err());
    }
}
