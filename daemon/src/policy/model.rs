//! The policy as read, whatever the file format: the TOML and AgenShield JSON front-ends both
//! produce these, so validation and compilation (`rule.rs`, `compile.rs`) exist once.
//!
//! Values keep `Spanned` byte ranges into their source text, for file:line:col in errors.

use serde::Deserialize;
use toml::Spanned;

use super::inject::{InjectFile, SecretSettingsFile, Sigv4File};
use super::rate::RateFile;
use super::Mode;

/// A list whose entries (and the list itself) know where they were written.
pub(crate) type List<T> = Spanned<Vec<Spanned<T>>>;

/// One source file, parsed and checked for shape.
pub(crate) struct ParsedSource {
    pub default: Option<Spanned<DefaultAction>>,
    pub mode: Option<Spanned<Mode>>,
    pub rules: Vec<RuleDef>,
    /// Rules present but not applying to network traffic (AgenShield: disabled, or not
    /// `http_request`): counted for `Policy::ignored_rule_count`.
    pub ignored: usize,
    /// `[secrets.NAME]` tables (TOML only).
    pub secret_settings: Vec<(String, SecretSettingsFile)>,
}

/// `default = "allow" | "deny"` (TOML) or `"defaultAction"` (AgenShield JSON).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum DefaultAction {
    Allow,
    Deny,
}

/// One rule. Its id was validated by the front-end; everything else is validated by
/// `rule::compile_rule`.
pub(crate) struct RuleDef {
    pub id: Spanned<String>,
    /// `"allow" | "deny" | "ask"`; a string so an unknown action gets its own message.
    pub action: Spanned<String>,
    pub priority: i32,
    pub rate: Option<Spanned<RateFile>>,
    pub max_concurrent: Option<Spanned<i64>>,
    /// `budget = { tokens, per, scope }`: LLM tokens per window (TOML only).
    pub budget: Option<Spanned<super::budget::BudgetFile>>,
    /// Secrets the rule's requests may carry (placeholders swapped, values let through).
    pub secrets: Option<List<String>>,
    /// Where placeholders are swapped (`swap = ["headers", "url", "body"]`; TOML only).
    pub swap: Option<List<String>>,
    /// Headers or query parameters set on the requests it allows.
    pub inject: Option<Spanned<Vec<InjectFile>>>,
    /// AWS credentials its requests are signed again with (TOML only).
    pub sigv4: Option<Spanned<Sigv4File>>,
    /// The agents it applies to (TOML only); `None`: every agent.
    pub agents: Option<List<super::agents::AgentFile>>,
    /// `tls = "passthrough"`: TLS it allows is spliced, not intercepted.
    pub tls: Option<Spanned<String>>,
    /// `dlp` and `dlp_allow` (TOML only).
    pub dlp: super::dlp::DlpDef,
    /// `mcp = { … }`: what MCP clients may ask of the servers it allows (TOML only).
    pub mcp: Option<Spanned<super::mcp::McpFile>>,
    /// The rule matches when any of these does (TOML: one; AgenShield: one per pattern).
    pub matchers: Vec<MatchDef>,
}

/// What one alternative of a rule matches. `None` means "any".
pub(crate) struct MatchDef {
    pub hosts: List<String>,
    pub schemes: Option<List<String>>,
    pub ports: Option<List<i64>>,
    /// `ports` lists the ports this does NOT match (AgenShield `allowedPorts`).
    pub ports_excluded: bool,
    pub methods: Option<List<String>>,
    pub paths: Option<List<String>>,
    /// AgenShield matches URL globs case-insensitively; TOML paths are case-sensitive.
    pub paths_case_insensitive: bool,
    /// Hosts exempted from this matcher (AgenShield `allowedHosts` beat `deniedHosts`).
    pub except_hosts: Vec<Spanned<String>>,
}

impl MatchDef {
    /// Matches `hosts` with no other condition.
    pub(crate) fn hosts(hosts: List<String>) -> MatchDef {
        MatchDef {
            hosts,
            schemes: None,
            ports: None,
            ports_excluded: false,
            methods: None,
            paths: None,
            paths_case_insensitive: false,
            except_hosts: Vec::new(),
        }
    }
}
