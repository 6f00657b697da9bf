//! The policy file as written (serde). Kept separate from the compiled form so the on-disk
//! schema can grow (AgenShield JSON, `ask`, rate limits) without touching evaluation.
//!
//! Fields carry `Spanned` wherever a later semantic check needs to point at a line:column.

use serde::Deserialize;
use toml::Spanned;

use super::Mode;

/// The only file format version understood.
pub(crate) const VERSION: i64 = 1;

/// One `*.toml` policy file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct PolicyFile {
    /// Must be present and equal to [`VERSION`]; optional here only to give a clear message.
    pub version: Option<Spanned<i64>>,
    pub default: Option<Spanned<DefaultAction>>,
    pub mode: Option<Spanned<Mode>>,
    #[serde(default, rename = "rule")]
    pub rules: Vec<RuleFile>,
}

/// `default = "allow" | "deny"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum DefaultAction {
    Allow,
    Deny,
}

/// One `[[rule]]` table.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RuleFile {
    pub id: Spanned<String>,
    pub hosts: Spanned<Vec<Spanned<String>>>,
    pub ports: Option<Spanned<Vec<Spanned<i64>>>>,
    pub methods: Option<Spanned<Vec<Spanned<String>>>>,
    pub paths: Option<Spanned<Vec<Spanned<String>>>>,
    /// A string, not an enum: `"ask"` is reserved and gets its own message.
    pub action: Spanned<String>,
    pub priority: Option<i32>,
    #[allow(dead_code)] // Kept for `agenshield policy show` and audit logs later.
    pub description: Option<String>,
    /// Reserved for the rate-limit issue; rejected by the compiler for now.
    pub rate: Option<Spanned<toml::Value>>,
    /// Reserved for the injection issue; rejected by the compiler for now.
    pub inject: Option<Spanned<toml::Value>>,
}

/// Parses one source; the error keeps toml's byte span for line:column.
pub(crate) fn parse(text: &str) -> Result<PolicyFile, toml::de::Error> {
    toml::from_str(text)
}
