//! AgenShield `PolicyConfig` JSON read into the common model, so an AgenShield policy works
//! unchanged next to TOML files. Fields AgenShield has and the proxy does not use are
//! accepted and ignored; any other key, and a field of the wrong type, is an error with
//! line:column (a misspelt `"priorty"` would otherwise change the decision order unseen).
//!
//! Mapping (ids are `agenshield:<stem>:<rule id>`, stem `custom/x` for `custom/x.json`):
//! - a rule applies when `enabled` and its `operations` (default: inferred from `target` as
//!   AgenShield does) include `http_request` or `*`; others are ignored and counted.
//! - `type` allowlist → allow, denylist → deny; or `action` allow, deny, approval → ask
//!   (AgenShield itself still denies on approval). Order as for TOML: priority, then deny
//!   before ask before allow (AgenShield takes the first in file order: never looser here).
//! - each pattern is one alternative of the rule (`pattern.rs`).
//! - `networkConstraints` become generated rules (`constraints.rs`).

use std::ops::Range;

use serde::de::IgnoredAny;
use serde::Deserialize;
use toml::Spanned;

use super::constraints::{self, NetworkConstraints};
use super::error::{Location, PolicyError};
use super::load::short_name;
use super::model::{DefaultAction, ParsedSource, RuleDef};
use super::pattern;
use super::toml_file::{is_valid_id, MAX_ID_LEN};
use super::PolicySource;

/// Unknown keys are refused, as in TOML: a misspelt key (`"priorty"`) must not silently
/// change a decision. Keys AgenShield has that the proxy does not use are accepted and
/// ignored (`IgnoredAny`).
#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct PolicyConfig {
    default_action: Option<DefaultAction>,
    rules: Option<Vec<JsonRule>>,
    network_constraints: Option<NetworkConstraints>,
    #[serde(default, rename = "version")]
    _version: Option<IgnoredAny>,
    #[serde(default, rename = "fsConstraints")]
    _fs_constraints: Option<IgnoredAny>,
    #[serde(default, rename = "envInjection")]
    _env_injection: Option<IgnoredAny>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonRule {
    id: String,
    #[serde(default, rename = "name")]
    _name: Option<IgnoredAny>,
    #[serde(default, rename = "scope")]
    _scope: Option<IgnoredAny>,
    #[serde(rename = "type")]
    kind: Option<RuleType>,
    action: Option<RuleAction>,
    target: Option<String>,
    operations: Option<Vec<String>>,
    patterns: Option<Vec<String>>,
    /// Required: AgenShield skips a rule without it, so guessing either way would surprise.
    enabled: bool,
    priority: Option<i32>,
}

#[derive(Deserialize, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
enum RuleType {
    Allowlist,
    Denylist,
}

#[derive(Deserialize, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
enum RuleAction {
    Allow,
    Deny,
    Approval,
}

/// Parses one AgenShield JSON source.
pub(crate) fn parse(src: &PolicySource) -> Result<ParsedSource, PolicyError> {
    // The shape check first: serde would also read a struct from an array, positionally.
    let value: serde_json::Value =
        serde_json::from_str(&src.text).map_err(|e| parse_error(src, &e))?;
    check_objects(&value).map_err(|e| PolicyError::Invalid {
        at: Location::file(&src.name),
        message: e.to_string(),
    })?;
    let cfg: PolicyConfig = serde_json::from_str(&src.text).map_err(|e| parse_error(src, &e))?;
    let stem = id_stem(&src.name);
    let find = Finder(&src.text);
    let mut out = ParsedSource {
        secret_settings: Vec::new(),
        default: cfg
            .default_action
            .map(|d| Spanned::new(find.key("defaultAction"), d)),
        mode: None,
        rules: Vec::new(),
        ignored: 0,
    };
    let mut cursor = 0;
    for r in cfg.rules.unwrap_or_default() {
        let id_span = find.string(&r.id, cursor);
        cursor = id_span.end;
        let ops = r.operations.filter(|o| !o.is_empty()).unwrap_or_else(|| {
            let inferred: &[&str] = match r.target.as_deref() {
                Some("url") => &["http_request", "open_url"],
                Some("command") => &["exec"],
                Some("skill") => &["skill_install", "skill_uninstall"],
                _ => &["*"],
            };
            inferred.iter().map(|s| (*s).to_owned()).collect()
        });
        let patterns = r.patterns.unwrap_or_default();
        let skip = if !r.enabled {
            Some("disabled")
        } else if !ops.iter().any(|o| o == "http_request" || o == "*") {
            Some("not an http_request rule")
        } else if patterns.is_empty() {
            Some("no patterns")
        } else {
            None
        };
        if let Some(why) = skip {
            tracing::debug!(file = %src.name, rule = %r.id, "AgenShield rule ignored: {why}");
            out.ignored += 1;
            continue;
        }
        let id = format!("agenshield:{stem}:{}", r.id);
        let err = |span, message| PolicyError::Rule {
            at: Location::at(&src.name, &src.text, span),
            rule: id.clone(),
            message,
        };
        if !is_valid_id(&r.id, MAX_ID_LEN) {
            let msg = format!("invalid id (use 1..={MAX_ID_LEN} of A-Z a-z 0-9 . _ : -)");
            return Err(err(id_span, msg));
        }
        let action = match (r.kind, r.action) {
            (Some(RuleType::Allowlist), None | Some(RuleAction::Allow)) => "allow",
            (None, Some(RuleAction::Allow)) => "allow",
            (Some(RuleType::Denylist), None | Some(RuleAction::Deny)) => "deny",
            (None, Some(RuleAction::Deny)) => "deny",
            (None, Some(RuleAction::Approval)) => "ask",
            (None, None) => {
                let msg = "needs `type` (\"allowlist\" | \"denylist\") or `action` \
                           (\"allow\" | \"deny\" | \"approval\")";
                return Err(err(id_span, msg.into()));
            }
            (Some(_), Some(_)) => {
                return Err(err(id_span, "`type` and `action` disagree".into()));
            }
        };
        let mut matchers = Vec::with_capacity(patterns.len());
        for p in &patterns {
            let span = find.string(p, id_span.start);
            matchers.push(pattern::matcher(p, &span).map_err(|m| err(span, m.to_string()))?);
        }
        out.rules.push(RuleDef {
            secrets: None,
            swap: None,
            inject: None,
            sigv4: None,
            agents: None,
            tls: None,
            dlp: Default::default(),
            mcp: None,
            id: Spanned::new(id_span.clone(), id),
            action: Spanned::new(id_span, action.to_owned()),
            priority: r.priority.unwrap_or(0),
            rate: None,
            max_concurrent: None,
            budget: None,
            matchers,
        });
    }
    if let Some(nc) = cfg.network_constraints {
        constraints::rules(nc, &stem, &find, &mut out.rules);
    }
    Ok(out)
}

/// A JSON source whose shape is not AgenShield's `PolicyConfig`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
enum ShapeError {
    #[error("expected a JSON object (AgenShield PolicyConfig) at the top level")]
    TopLevel,
    #[error("`rules[{0}]` must be a JSON object")]
    Rule(usize),
    #[error("`networkConstraints` must be a JSON object")]
    NetworkConstraints,
}

/// The top level, each rule and `networkConstraints` must be JSON objects.
fn check_objects(v: &serde_json::Value) -> Result<(), ShapeError> {
    let Some(top) = v.as_object() else {
        return Err(ShapeError::TopLevel);
    };
    if let Some(rules) = top.get("rules").and_then(|r| r.as_array()) {
        if let Some(i) = rules.iter().position(|r| !r.is_object()) {
            return Err(ShapeError::Rule(i));
        }
    }
    match top.get("networkConstraints") {
        Some(nc) if !nc.is_object() && !nc.is_null() => Err(ShapeError::NetworkConstraints),
        _ => Ok(()),
    }
}

fn parse_error(src: &PolicySource, e: &serde_json::Error) -> PolicyError {
    let text = e.to_string();
    // serde_json appends " at line L column C"; the location says it already.
    let message = text
        .rsplit_once(" at line ")
        .map_or(text.as_str(), |(m, _)| m)
        .to_owned();
    let position = (e.line() > 0).then(|| (e.line(), e.column().max(1)));
    PolicyError::Parse {
        at: Location {
            file: src.name.clone(),
            position,
        },
        message,
    }
}

/// The id stem of a source: its file stem with characters outside the id alphabet replaced
/// by `_`, under `custom/` for files in a `custom` directory.
fn id_stem(name: &str) -> String {
    let short = short_name(name);
    let stem = short.strip_suffix(".json").unwrap_or(&short);
    stem.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "._-/".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// Best-effort spans for values serde_json does not locate: the first occurrence of the
/// value's JSON spelling at or after `from` (else anywhere; else the file start).
pub(crate) struct Finder<'a>(&'a str);

impl Finder<'_> {
    pub(crate) fn string(&self, s: &str, from: usize) -> Range<usize> {
        let lit = serde_json::to_string(s).unwrap_or_default();
        let hit = self
            .0
            .get(from..)
            .and_then(|t| t.find(&lit))
            .map(|i| i + from);
        match hit.or_else(|| self.0.find(&lit)) {
            Some(i) => i..i + lit.len(),
            None => 0..0,
        }
    }

    pub(crate) fn key(&self, key: &str) -> Range<usize> {
        self.string(key, 0)
    }
}

#[cfg(test)]
#[path = "json_tests.rs"]
mod tests;
