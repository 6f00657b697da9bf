//! Egress policy: which host/port/method/path an agent may reach.
//!
//! Policy files (`*.toml`, plus AgenShield `*.json` and `custom/*.json`, in one directory) are
//! compiled once into an immutable [`Policy`]; the proxy shares it via `Arc` and calls
//! [`Policy::decide`] per request or raw TCP connection. See `policies/default.toml` for the
//! TOML format and `json.rs` for the AgenShield mapping.
//!
//! Path rules match [`NormalizedPath::matching`], in which `%2F` counts as `/` (so `/a%2Fb` is
//! matched as `/a/b` and cannot dodge a deny on `/a/**`); upstream gets [`NormalizedPath::forward`].

mod agents;
mod budget;
mod compile;
mod constraints;
mod dlp;
mod error;
mod eval;
mod glob;
mod host;
mod index;
mod inject;
mod json;
mod layers;
mod load;
mod matcher;
mod mcp;
mod model;
mod name;
mod passthrough;
mod path;
mod pattern;
mod rate;
mod rule;
mod secret_name;
mod sigv4_scope;
mod source_status;
mod store;
mod tcp;
pub use sigv4_scope::{NameGlobs, OutOfScope, ScopeError, Sigv4Scope, ISSUES_CREDENTIALS};
pub(crate) use source_status::{BundleLayer, SyncFailure};
pub(crate) use store::{Layering, PolicyInfo, PolicyStore, SecretCheck};
pub(crate) use watch_status::WatchHealth;

/// Name patterns for a `sigv4` scope built in code.
#[cfg(test)]
pub(crate) fn sigv4_scope_globs(p: &[&str]) -> Result<NameGlobs, ScopeError> {
    NameGlobs::from_patterns(p)
}
mod toml_file;
mod watch_status;

use std::fmt;
use std::sync::Arc;

use serde::Deserialize;

/// How the policy's `default` is named wherever a rule id would be shown (records, metrics,
/// logs, tail); no rule may take the name.
pub const DEFAULT_RULE: &str = "default";

/// The name a decision carries when the policy's default decided: [`DEFAULT_RULE`], shared.
pub(crate) fn default_rule_id() -> Arc<str> {
    static ID: std::sync::LazyLock<Arc<str>> = std::sync::LazyLock::new(|| DEFAULT_RULE.into());
    Arc::clone(&ID)
}

pub use agents::{agent_uid, AgentError};
pub use budget::{format_per as format_budget_per, BudgetScope, TokenBudget};
pub use constraints::{ALLOWED_HOSTS_PRIORITY, CONSTRAINT_PRIORITY};
pub use dlp::{DlpMode, DlpRule};
pub use error::{Conflict, Location, PolicyError};
pub use host::{normalize_host, HostError};
/// For `dlp/`: its home hosts are written and matched as rule hosts are.
pub(crate) use host::{parse_host_pattern, HostPattern};
pub use inject::{
    InjectTarget, Injection, SecretBindings, SecretRate, SecretRef, Sigv4Keys, SwapPlaces,
    TemplatePart,
};
pub use layers::{Composed, LocalMode};
pub use load::{list_dir, load_files};
pub use mcp::{McpRefusal, McpRule};
pub use path::{normalize_path, NormalizedPath, PathError, MAX_PATH_LEN};
pub use rate::{
    Obligations, RateLimit, RateScope, MAX_CONCURRENT, MAX_RATE_PER, MAX_RATE_REQUESTS,
};
pub(crate) use secret_name::is_name_byte;
pub use secret_name::SecretName;
pub use toml_file::MAX_ID_LEN as MAX_RULE_ID_LEN;

/// One policy source: a file's text and the name errors show (its path for files on disk).
/// A name ending in `.json` is read as AgenShield JSON, any other as TOML.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicySource {
    pub name: String,
    pub text: String,
}

/// One compiled rule as `ctl policy show` lists it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct RuleSummary {
    pub id: String,
    pub action: &'static str,
    pub priority: i32,
    pub summary: String,
    pub obligations: Obligations,
}

/// A compiled, immutable policy. `Send + Sync`; share it behind an `Arc`.
#[derive(Debug)]
pub struct Policy {
    /// In evaluation order: priority desc, deny, ask, allow, then file and rule order.
    rules: Vec<matcher::CompiledRule>,
    index: index::HostIndex,
    default: Action,
    mode: Mode,
    hash: Arc<str>,
    rule_count: usize,
    ignored: usize,
    secret_refs: Vec<SecretRef>,
    secret_rates: Vec<SecretRate>,
    /// Rules whose rate says `scope = "fleet"`, and where.
    fleet_rules: Vec<compile::FleetRule>,
    /// Some rule says `tls = "passthrough"`.
    passthrough: bool,
    /// No policy yet (`[policy.source] require_first_sync` before the first bundle): every
    /// decision refuses, as `policy_unavailable`.
    unavailable: bool,
}

/// What the proxy knows about one request or connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestFacts<'a> {
    /// As received (SNI, Host header, CONNECT target or IP), port stripped; `decide` normalizes.
    pub host: &'a str,
    pub port: u16,
    pub scheme: Scheme,
    /// `None` for raw TCP (no HTTP seen).
    pub method: Option<&'a str>,
    /// `NormalizedPath::matching` (no query); `None` for raw TCP. Un-normalized input is
    /// normalized again by `decide`, at a cost, so prefer passing the `matching` form.
    pub path: Option<&'a str>,
    /// The agent's uid, where known: rules with `agents` apply only to theirs.
    pub agent: Option<u32>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Scheme {
    Http,
    Https,
    Tcp,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    Allow,
    Deny,
    /// Hold the request until an operator approves (then the rule's obligations apply).
    Ask,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Denies are enforced.
    Enforce,
    /// Denies and asks are logged (`Decision::reported_deny`) but let through at once.
    Report,
}

/// The verdict for one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// The effective verdict after the mode: in report mode a would-be deny or ask is `Allow`.
    pub action: Action,
    /// True when a deny or ask was turned into `Allow` by report mode.
    pub reported_deny: bool,
    /// The deciding rule: a rule's id, [`DEFAULT_RULE`] when the policy's default decided, and
    /// `None` only when the request was refused as invalid before any rule was consulted.
    pub rule_id: Option<Arc<str>>,
    /// One line for logs and error pages.
    pub explanation: String,
    /// The deciding rule's rate limit and concurrency cap when that rule allows or asks (in
    /// report mode too); empty for denies and defaults.
    pub obligations: Obligations,
    /// The secrets the deciding rule binds, when it allows or asks.
    pub secrets: Option<Arc<SecretBindings>>,
    /// The deciding rule's `dlp` and `dlp_allow` when it allows or asks; `None`: the
    /// defaults (`block`, the AWS example keys only).
    pub dlp: Option<Arc<DlpRule>>,
    /// The deciding rule lists its users in `agents` (and matched one of them): its secrets
    /// serve exactly those, whoever they are; a rule without `agents` serves agent users only.
    pub names_agents: bool,
    /// Refused because there is no policy yet (see [`Policy::unavailable`]).
    pub unavailable: bool,
    /// The deciding rule's `mcp` section, when it allows or asks.
    pub mcp: Option<Arc<McpRule>>,
}

impl Decision {
    /// Only `Allow` lets a request through now; `Ask` must wait for approval first.
    pub fn is_allowed(&self) -> bool {
        self.action == Action::Allow
    }

    pub fn needs_approval(&self) -> bool {
        self.action == Action::Ask
    }
}

impl Policy {
    /// Compiles sources given in evaluation order (their order breaks priority ties).
    pub fn from_sources(sources: &[PolicySource]) -> Result<Policy, PolicyError> {
        if sources.is_empty() {
            return Err(PolicyError::NoFiles {
                dir: "(no sources given)".into(),
            });
        }
        Self::compiled(sources, compile::compile(sources, None)?)
    }

    fn compiled(
        sources: &[PolicySource],
        compiled: compile::Compiled,
    ) -> Result<Policy, PolicyError> {
        let passthrough = compiled.rules.iter().any(|r| r.passthrough);
        let policy = Policy {
            passthrough,
            rules: compiled.rules,
            index: compiled.index,
            default: compiled.default,
            mode: compiled.mode,
            hash: load::hash_sources(sources).into(),
            rule_count: compiled.rule_count,
            ignored: compiled.ignored,
            secret_refs: compiled.secret_refs,
            secret_rates: compiled.secret_rates,
            unavailable: false,
            fleet_rules: compiled.fleet_rules,
        };
        tracing::debug!(
            hash = %policy.hash,
            rules = policy.rule_count,
            matchers = policy.rules.len(),
            ignored_agenshield_rules = policy.ignored,
            files = sources.len(),
            "policy compiled"
        );
        Ok(policy)
    }

    /// `host` itself if a rule names it exactly, else `other`: a metric label whose values
    /// the policy bounds.
    pub fn host_label<'a>(&self, host: &'a str) -> &'a str {
        if self.index.names(host) {
            host
        } else {
            "other"
        }
    }

    /// `sha256:` + 16 hex digits over every source's file name (`custom/` kept) and text:
    /// identifies the loaded policy in logs and audit records.
    pub fn hash(&self) -> &str {
        &self.hash
    }

    /// The hash, shared: every record names the policy it was decided under.
    pub(crate) fn hash_shared(&self) -> Arc<str> {
        self.hash.clone()
    }

    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// The verdict when no rule matches.
    pub fn default_action(&self) -> Action {
        self.default
    }

    /// Rules as written, generated AgenShield constraint rules included (an AgenShield rule
    /// with several patterns counts once).
    pub fn rule_count(&self) -> usize {
        self.rule_count
    }

    /// AgenShield rules present but not applying here (disabled, not `http_request`, or
    /// without patterns).
    /// The rules in evaluation order, one line each.
    pub fn rules(&self) -> Vec<RuleSummary> {
        self.rules
            .iter()
            .map(|r| RuleSummary {
                id: r.id.to_string(),
                action: r.action.as_str(),
                priority: r.priority,
                summary: r.summary.to_string(),
                obligations: r.obligations,
            })
            .collect()
    }

    pub fn ignored_rule_count(&self) -> usize {
        self.ignored
    }

    /// Every place a rule names a secret.
    pub fn secret_refs(&self) -> &[SecretRef] {
        &self.secret_refs
    }

    /// The ids of the rules that bind `secret`, sorted.
    pub fn secret_binders(&self, secret: &str) -> Vec<String> {
        let mut ids: Vec<String> = self
            .secret_refs
            .iter()
            .filter(|r| &*r.secret == secret)
            .map(|r| r.rule.to_string())
            .collect();
        ids.sort();
        ids.dedup();
        ids
    }

    /// `[secrets.NAME] rate`, if set.
    pub fn secret_rate(&self, secret: &str) -> Option<RateLimit> {
        self.secret_rates
            .iter()
            .find(|r| &*r.secret == secret)
            .map(|r| r.rate)
    }

    /// A rule whose rate says `scope = "fleet"` needs a shared store (`[ratelimit] store`):
    /// without one it is an error naming the first such rule.
    pub fn check_fleet(&self, store_configured: bool) -> Result<(), PolicyError> {
        match self.fleet_rules.first() {
            Some(r) if !store_configured => Err(PolicyError::Rule {
                at: r.at.clone(),
                rule: r.rule.to_string(),
                message: format!(
                    "`{}.scope = \"fleet\"` needs a shared store: set `[ratelimit] store \
                     = \"redis://…\"` in proxy.toml, or write `scope = \"{}\"`",
                    r.key,
                    if r.key == "budget" { "agent" } else { "local" }
                ),
            }),
            _ => Ok(()),
        }
    }

    /// Whether some rule's rate is fleet-wide.
    pub fn has_fleet_rules(&self) -> bool {
        !self.fleet_rules.is_empty()
    }

    /// Checks every secret the policy names against the store: a rule that binds a missing
    /// secret, or a `[secrets.NAME]` for a secret that is missing or bound by no rule, is an
    /// error (the first one, in file order).
    pub fn check_secrets(&self, exists: &dyn Fn(&str) -> bool) -> Result<(), PolicyError> {
        for r in &self.secret_refs {
            if !exists(&r.secret) {
                return Err(PolicyError::MissingSecret {
                    at: r.at.clone(),
                    rule: r.rule.to_string(),
                    secret: r.secret.to_string(),
                });
            }
        }
        for r in &self.secret_rates {
            let message = if !exists(&r.secret) {
                format!(
                    "[secrets.{0}]: no secret {0:?} in the store (agenshield proxy ctl secrets set {0})",
                    r.secret
                )
            } else if !self.secret_refs.iter().any(|u| u.secret == r.secret) {
                format!(
                    "[secrets.{}]: no rule binds this secret, so its rate would never apply",
                    r.secret
                )
            } else {
                continue;
            };
            return Err(PolicyError::Invalid {
                at: r.at.clone(),
                message,
            });
        }
        Ok(())
    }
}

impl Action {
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Allow => "allow",
            Action::Deny => "deny",
            Action::Ask => "ask",
        }
    }
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Enforce => "enforce",
            Mode::Report => "report",
        }
    }
}

impl Scheme {
    pub fn as_str(self) -> &'static str {
        match self {
            Scheme::Http => "http",
            Scheme::Https => "https",
            Scheme::Tcp => "tcp",
        }
    }
}

macro_rules! display_as_str {
    ($($t:ty),*) => {$(
        impl fmt::Display for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }
    )*};
}
display_as_str!(Action, Mode, Scheme);

#[cfg(test)]
#[path = "dlp_tests.rs"]
mod dlp_tests;

#[cfg(test)]
#[path = "policy_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "examples_tests.rs"]
mod examples_tests;
