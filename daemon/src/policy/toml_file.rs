//! The `version = 1` TOML policy format (see `policies/default.toml`): serde schema and
//! conversion into the format-independent [`ParsedSource`].

use serde::Deserialize;
use toml::Spanned;

use super::error::{Location, PolicyError};
use super::inject::{InjectFile, SecretSettingsFile, Sigv4File};
use super::model::{DefaultAction, List, MatchDef, ParsedSource, RuleDef};
use super::rate::RateFile;
use super::{Mode, PolicySource};

/// The only file format version understood.
pub(crate) const VERSION: i64 = 1;

/// Longest rule id, and its alphabet, for ids written by hand.
pub const MAX_ID_LEN: usize = 64;

/// One `*.toml` policy file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PolicyFile {
    /// Must be present and equal to [`VERSION`]; optional here only to give a clear message.
    version: Option<Spanned<i64>>,
    default: Option<Spanned<DefaultAction>>,
    mode: Option<Spanned<Mode>>,
    #[serde(default, rename = "rule")]
    rules: Vec<RuleFile>,
    /// `[secrets.NAME]`: per-secret settings.
    #[serde(default)]
    secrets: std::collections::BTreeMap<String, SecretSettingsFile>,
}

/// One `[[rule]]` table.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RuleFile {
    id: Spanned<String>,
    hosts: List<String>,
    schemes: Option<List<String>>,
    ports: Option<List<i64>>,
    methods: Option<List<String>>,
    paths: Option<List<String>>,
    action: Spanned<String>,
    priority: Option<i32>,
    #[allow(dead_code)] // Kept for `agenshield policy show` and audit logs later.
    description: Option<String>,
    rate: Option<Spanned<RateFile>>,
    max_concurrent: Option<Spanned<i64>>,
    budget: Option<Spanned<super::budget::BudgetFile>>,
    secrets: Option<List<String>>,
    swap: Option<List<String>>,
    inject: Option<Spanned<Vec<InjectFile>>>,
    sigv4: Option<Spanned<Sigv4File>>,
    agents: Option<List<super::agents::AgentFile>>,
    tls: Option<Spanned<String>>,
    dlp: Option<Spanned<String>>,
    dlp_allow: Option<List<String>>,
    mcp: Option<Spanned<super::mcp::McpFile>>,
}

/// Parses and shape-checks one TOML source.
pub(crate) fn parse(src: &PolicySource) -> Result<ParsedSource, PolicyError> {
    let at = |span| Location::at(&src.name, &src.text, span);
    let file: PolicyFile = toml::from_str(&src.text).map_err(|e| PolicyError::Parse {
        at: e.span().map_or_else(|| Location::file(&src.name), at),
        message: crate::toml_errors::explain(e.message().trim_end()).replace('\n', ", "),
    })?;
    match &file.version {
        None => {
            return Err(PolicyError::Invalid {
                at: Location::file(&src.name),
                message: format!("missing `version` (expected `version = {VERSION}`)"),
            })
        }
        Some(v) if *v.get_ref() != VERSION => {
            return Err(PolicyError::Invalid {
                at: at(v.span()),
                message: format!("unsupported version {} (expected {VERSION})", v.get_ref()),
            })
        }
        Some(_) => {}
    }
    let mut rules = Vec::with_capacity(file.rules.len());
    let mut errors = Vec::new();
    for r in file.rules {
        let rule_err = |span, message: String| PolicyError::Rule {
            at: at(span),
            rule: r.id.get_ref().clone(),
            message,
        };
        if !is_valid_id(r.id.get_ref(), MAX_ID_LEN) {
            errors.push(rule_err(
                r.id.span(),
                format!("invalid id (use 1..={MAX_ID_LEN} of A-Z a-z 0-9 . _ : -)"),
            ));
            continue;
        }
        if r.id.get_ref() == super::DEFAULT_RULE {
            errors.push(rule_err(
                r.id.span(),
                "the id \"default\" names the policy's `default` in records, metrics and tail; choose another".into(),
            ));
            continue;
        }
        let matcher = MatchDef {
            schemes: r.schemes,
            ports: r.ports,
            methods: r.methods,
            paths: r.paths,
            ..MatchDef::hosts(r.hosts)
        };
        rules.push(RuleDef {
            id: r.id,
            action: r.action,
            priority: r.priority.unwrap_or(0),
            rate: r.rate,
            max_concurrent: r.max_concurrent,
            budget: r.budget,
            secrets: r.secrets,
            swap: r.swap,
            inject: r.inject,
            sigv4: r.sigv4,
            agents: r.agents,
            tls: r.tls,
            dlp: super::dlp::DlpDef {
                mode: r.dlp,
                allow: r.dlp_allow,
            },
            mcp: r.mcp,
            matchers: vec![matcher],
        });
    }
    if let Some(e) = PolicyError::all(errors) {
        return Err(e);
    }
    Ok(ParsedSource {
        default: file.default,
        mode: file.mode,
        rules,
        ignored: 0,
        secret_settings: file.secrets.into_iter().collect(),
    })
}

/// Rule ids appear in logs, error pages and audit records: keep them to a plain alphabet.
pub(crate) fn is_valid_id(id: &str, max_len: usize) -> bool {
    !id.is_empty()
        && id.len() <= max_len
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b".-_:".contains(&b))
}
