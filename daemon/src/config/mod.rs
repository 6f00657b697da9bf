//! Daemon configuration (`proxy.toml`): every key optional, unknown keys rejected.
//!
//! A run without a config file uses built-in defaults with all state relocated under a
//! directory the caller can write, so `agenshield proxy run` works out of the box.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

mod approvals;
mod audit_export;
mod check;
mod dns;
mod forms;
mod policy_source;
mod ratelimit;
mod removed;
mod schema;
mod upstream_proxy;
pub use approvals::{
    AdminHttpsConfig, Approvals, ApprovalsError, WebhookConfig, MAX_WEBHOOK_RETRIES,
    MAX_WEBHOOK_TIMEOUT,
};
pub use audit_export::{
    valid_host_id, AuditExport, AuditExportError, ExportFormat, ExportKind, SyslogUrl, Transport,
};
pub use check::CheckError;
pub use dns::{DeniedAnswer, DnsConfig};
pub use forms::{parse_nameserver, FormError};
pub use policy_source::{
    BundleUrl, PolicySourceConfig, PolicySourceError, MAX_BUNDLE_SIZE, MIN_BUNDLE_SIZE,
};
pub use ratelimit::{
    FleetKey, OnStoreError, RateLimitConfig, StoreConfigError, StoreUrl, MAX_STORE_TIMEOUT,
    MIN_STORE_TIMEOUT,
};
pub use removed::RemovedKey;
use schema::FileConfig;
pub use schema::{
    AgentUser, AuditConfig, Limits, NameOrId, QueryValues, Redirect, ResolverConfig,
    SecretStoreKind, SecretsConfig, Testing, TlsConfig, Upstream, MAX_SCAN_BODY_BYTES,
};
pub use upstream_proxy::{authority, ProxyUrlError, UpstreamProxy};

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
/// The installed daemon's cache of the last verified policy bundle.
pub const DEFAULT_POLICY_CACHE: &str = "/var/lib/agenshield/policy-cache";
/// The audit checkpoint key's file name in the CA directory (its default place).
pub const AUDIT_KEY_FILE: &str = "audit-key.pem";

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
    #[error("{path}: {error}")]
    Invalid { path: PathBuf, error: InvalidReason },
    #[error(
        "no config file given and no writable state directory: set AGENSHIELD_STATE_DIR or HOME"
    )]
    NoHome,
    #[error("no config file given and no writable state directory: {dir}: {error}")]
    StateDir { dir: PathBuf, error: std::io::Error },
}

/// Why a file that parsed is refused. Not a `source()` of [`ConfigError::Invalid`]: its text
/// is in that message already, and `{:#}` would print it twice.
#[derive(Debug, thiserror::Error)]
pub enum InvalidReason {
    #[error(transparent)]
    Check(#[from] CheckError),
    #[error(transparent)]
    Removed(#[from] RemovedKey),
    #[error(transparent)]
    PolicySource(#[from] PolicySourceError),
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
    /// `listen.admin_https`: the admin API over HTTPS with client certificates.
    pub admin_https: Option<AdminHttpsConfig>,
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
    /// The daemon's pinned MCP tool definitions (`paths.mcp_pins`).
    pub mcp_pins: PathBuf,
    pub secrets: SecretsConfig,
    /// The metrics listener (`/metrics`); `None`: off.
    pub metrics: Option<SocketAddr>,
    /// The audit log's path; `None` when `audit.enabled = false`.
    pub audit_path: Option<PathBuf>,
    pub audit: AuditConfig,
    /// The key that signs the audit log's checkpoints (`paths.audit_key`).
    pub audit_key: PathBuf,
    /// `[ratelimit]`: the shared store of `scope = "fleet"` rates (paths made absolute).
    pub ratelimit: RateLimitConfig,
    pub testing: Testing,
    /// `daemon.worker_user`: the unprivileged user a root start serves as (see `privsep`).
    pub worker_user: Option<AgentUser>,
    /// `[policy.source]`: a signed policy bundle pulled from a server or a mounted volume.
    pub policy_source: Option<PolicySourceConfig>,
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
        let invalid = |error: InvalidReason| ConfigError::Invalid {
            path: source.clone().unwrap_or_default(),
            error,
        };
        // One section at a time, in the order a file is read: the first mistake is the one
        // reported.
        check::redirect(&f.redirect).map_err(|e| invalid(e.into()))?;
        let not_yet = removed::redirect_dns(&f.redirect).map_err(|e| invalid(e.into()))?;
        let checked = check::resolver(&f.resolver)
            .and_then(|()| check::limits(&f.limits))
            .and_then(|()| check::upstream(&f.upstream))
            .and_then(|()| check::secrets(&f.secrets))
            .and_then(|()| check::approvals(&f.approvals))
            .and_then(|()| check::tls(&f.tls));
        checked.map_err(|e| invalid(e.into()))?;
        let metrics = match f.listen.metrics.as_deref() {
            None => Some(default_metrics()),
            Some(text) => check::metrics(text).map_err(|e| invalid(e.into()))?,
        };
        check::audit(&f.audit).map_err(|e| invalid(e.into()))?;
        ratelimit::check(&f.ratelimit).map_err(|e| invalid(CheckError::from(e).into()))?;
        let ratelimit = RateLimitConfig {
            password_file: f.ratelimit.password_file.as_deref().map(relative),
            ca: f.ratelimit.ca.as_deref().map(relative),
            ..f.ratelimit
        };
        let dns_is_default = f.listen.dns.is_none();
        let dns = f.listen.dns.unwrap_or_else(default_dns);
        let transparent_is_default = f.listen.transparent.is_none();
        let transparent = f.listen.transparent.unwrap_or_else(default_transparent);
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
        let admin_https = approvals::AdminHttpsKeys {
            addr: f.listen.admin_https,
            client_ca: f.listen.client_ca,
            cert: f.listen.admin_https_cert,
            key: f.listen.admin_https_key,
        }
        .check(relative)
        .map_err(|e| invalid(CheckError::from(e).into()))?;
        let admin = match f.listen.admin {
            Some(p) => relative(&p),
            None if state_dir.is_some() => default_path("proxy.sock"),
            None => PathBuf::from(DEFAULT_ADMIN_SOCKET),
        };
        let audit_path = match (f.audit.enabled, f.paths.audit) {
            (false, _) => None,
            (true, Some(p)) => Some(relative(&p)),
            (true, None) if state_dir.is_some() => Some(default_path("proxy-audit.jsonl")),
            (true, None) => Some(PathBuf::from(DEFAULT_AUDIT_LOG)),
        };
        let mut audit = f.audit;
        audit.export = std::mem::take(&mut audit.export)
            .into_iter()
            .map(|e| e.resolved(relative))
            .collect();
        let default_cache = if state_dir.is_some() {
            default_path("policy-cache")
        } else {
            PathBuf::from(DEFAULT_POLICY_CACHE)
        };
        let policy_source = match f.policy.source {
            Some(s) => Some(
                s.check(relative, default_cache)
                    .map_err(|e| invalid(e.into()))?,
            ),
            None => None,
        };
        let certs = path_or(f.paths.certs, "certs");
        let audit_key = match f.paths.audit_key {
            Some(p) => relative(&p),
            None => certs.join(AUDIT_KEY_FILE),
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
            admin_https,
            policies: path_or(f.paths.policies, "policies"),
            certs,
            upstream,
            resolver: f.resolver,
            dns_answers: f.dns,
            limits: f.limits,
            tls: f.tls,
            redirect: f.redirect,
            approvals: f.approvals.resolved(relative),
            mcp_pins: match f.paths.mcp_pins {
                Some(p) => relative(&p),
                // A directory of its own beside the vault: the serving uid writes it (the
                // vault's parent is root's in an installation), and install creates it so.
                None => path_or(f.paths.vault.clone(), "vault")
                    .with_file_name("mcp")
                    .join("mcp-pins.json"),
            },
            vault: path_or(f.paths.vault, "vault"),
            secrets: f.secrets,
            metrics,
            audit_path,
            audit,
            audit_key,
            ratelimit,
            testing: f.testing,
            worker_user: f.daemon.worker_user,
            policy_source,
            not_yet_effective: not_yet,
        })
    }
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
            None => return Err(ConfigError::NoHome),
        }
    };
    std::path::absolute(&dir).map_err(|error| ConfigError::StateDir { dir, error })
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
mod tests;
