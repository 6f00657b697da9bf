//! Compilation across files: each source parsed by its front-end (TOML or AgenShield JSON),
//! policy-wide settings merged, rule ids checked unique, rules put in evaluation order and
//! indexed by host. Every mistake is reported at load time; `decide` does no parsing.

use std::collections::HashMap;
use std::ops::Range;

use super::error::{Conflict, Location, PolicyError};
use super::glob::GlobCache;
use super::index::HostIndex;
use super::inject::{SecretRate, SecretRef};
use super::matcher::CompiledRule;
use super::model::{DefaultAction, ParsedSource};
use super::rate::{compile_rate, RateScope};
use super::rule::compile_rule;
use super::{json, toml_file, Action, Mode, PolicySource};

/// Everything `Policy` needs besides its hash.
pub(crate) struct Compiled {
    /// In evaluation order.
    pub rules: Vec<CompiledRule>,
    pub index: HostIndex,
    pub default: Action,
    pub mode: Mode,
    /// Rules as written (an AgenShield rule with several patterns counts once).
    pub rule_count: usize,
    pub ignored: usize,
    pub secret_refs: Vec<SecretRef>,
    pub secret_rates: Vec<SecretRate>,
    /// What deny-only sources said and was left out (`layers.rs`), one line each.
    pub dropped: Vec<String>,
    pub fleet_rules: Vec<FleetRule>,
}

/// A rule whose rate is kept in the fleet's shared store, and where its `scope` is written.
#[derive(Debug, Clone)]
pub(crate) struct FleetRule {
    pub rule: std::sync::Arc<str>,
    pub at: Location,
    /// Which key says it: `rate` or `budget`.
    pub key: &'static str,
}

/// A policy-wide key (`default`, `mode`) and the file that set it first.
struct Setting<T> {
    value: T,
    at: Location,
}

/// Sources named `*.json` are AgenShield `PolicyConfig`; all others are TOML.
pub(crate) fn is_json(name: &str) -> bool {
    name.len() > ".json".len() && name.to_ascii_lowercase().ends_with(".json")
}

/// Where an action sorts among rules of equal priority: deny, then ask, then allow.
fn rank(a: Action) -> u8 {
    match a {
        Action::Deny => 0,
        Action::Ask => 1,
        Action::Allow => 2,
    }
}

/// `deny_only_from`: sources from this index on may only add deny rules (a local directory
/// under a bundle's `local = "deny-only"`): their allow and ask rules, `default` and `mode`
/// are left out and listed in `Compiled::dropped`.
pub(crate) fn compile(
    sources: &[PolicySource],
    deny_only_from: Option<usize>,
) -> Result<Compiled, PolicyError> {
    let mut dropped = Vec::new();
    let mut default: Option<Setting<Action>> = None;
    let mut mode: Option<Setting<Mode>> = None;
    // Rule id → (file index, span); positions are computed only for an error (O(file) each).
    let mut ids: HashMap<String, (usize, Range<usize>)> = HashMap::new();
    // (sort key, rule, host patterns); key = priority desc, action rank, file, rule, matcher.
    let mut pending = Vec::new();
    let mut globs = GlobCache::default();
    let (mut rule_count, mut ignored) = (0, 0);
    let mut secret_refs = Vec::new();
    let mut secret_rates: Vec<SecretRate> = Vec::new();
    let mut fleet_rules = Vec::new();
    // Rule errors are collected, so one run of lint shows every rule that needs fixing.
    let mut errors: Vec<PolicyError> = Vec::new();

    for (file_idx, src) in sources.iter().enumerate() {
        let at = |span: Range<usize>| Location::at(&src.name, &src.text, span);
        let mut parsed: ParsedSource = if is_json(&src.name) {
            json::parse(src)?
        } else {
            toml_file::parse(src)?
        };
        if deny_only_from.is_some_and(|from| file_idx >= from) {
            keep_denies_only(&mut parsed, &src.name, &mut dropped);
        }
        if let Some(d) = &parsed.default {
            let value = match d.get_ref() {
                DefaultAction::Allow => Action::Allow,
                DefaultAction::Deny => Action::Deny,
            };
            merge_setting(&mut default, "default", value, at(d.span()), Action::as_str)?;
        }
        if let Some(m) = &parsed.mode {
            merge_setting(&mut mode, "mode", *m.get_ref(), at(m.span()), Mode::as_str)?;
        }
        ignored += parsed.ignored;
        for (name, settings) in &parsed.secret_settings {
            let here = at(settings.rate.span());
            let invalid = |message: String| PolicyError::Invalid {
                at: here.clone(),
                message,
            };
            super::SecretName::new(name).map_err(|e| invalid(format!("[secrets.{name}]: {e}")))?;
            if let Some(first) = secret_rates.iter().find(|r| &*r.secret == name.as_str()) {
                return Err(invalid(format!(
                    "[secrets.{name}] is also set at {}",
                    first.at
                )));
            }
            let rate = compile_rate(settings.rate.get_ref()).map_err(|(span, e)| {
                PolicyError::Invalid {
                    at: at(span),
                    message: e.to_string(),
                }
            })?;
            if let (RateScope::Fleet, Some(scope)) = (rate.scope, &settings.rate.get_ref().scope) {
                return Err(PolicyError::Invalid {
                    at: at(scope.span()),
                    message: format!(
                        "[secrets.{name}]: `scope = \"fleet\"` applies to a rule's rate only; \
                         a secret's rate is kept per agent"
                    ),
                });
            }
            secret_rates.push(SecretRate {
                secret: name.as_str().into(),
                rate,
                at: here,
            });
        }
        for (rule_idx, def) in parsed.rules.iter().enumerate() {
            if let Some((first_file, first_span)) = ids.get(def.id.get_ref()) {
                let first = &sources[*first_file];
                errors.push(PolicyError::DuplicateId {
                    at: at(def.id.span()),
                    first: Location::at(&first.name, &first.text, first_span.clone()),
                    id: def.id.get_ref().clone(),
                });
                continue;
            }
            let mut uses = Vec::new();
            let parts = match compile_rule(def, &at, &mut globs, &mut uses) {
                Ok(parts) => parts,
                Err(e) => {
                    errors.push(e);
                    continue;
                }
            };
            let rule_id: std::sync::Arc<str> = def.id.get_ref().as_str().into();
            secret_refs.extend(uses.into_iter().map(|u| SecretRef {
                secret: u.secret,
                rule: rule_id.clone(),
                at: at(u.span),
            }));
            if let Some(scope) = fleet_scope(def) {
                fleet_rules.push(FleetRule {
                    rule: rule_id.clone(),
                    at: at(scope),
                    key: "rate",
                });
            }
            if let Some(scope) = super::budget::fleet_scope(def) {
                fleet_rules.push(FleetRule {
                    rule: rule_id.clone(),
                    at: at(scope),
                    key: "budget",
                });
            }
            ids.insert(def.id.get_ref().clone(), (file_idx, def.id.span()));
            rule_count += 1;
            for (part_idx, (rule, hosts)) in parts.into_iter().enumerate() {
                let key = (
                    -i64::from(rule.priority),
                    rank(rule.action),
                    file_idx,
                    rule_idx,
                    part_idx,
                );
                pending.push((key, rule, hosts));
            }
        }
    }

    if let Some(e) = PolicyError::all(errors) {
        return Err(e);
    }
    pending.sort_by_key(|(key, _, _)| *key);
    let mut index = HostIndex::default();
    let mut rules = Vec::with_capacity(pending.len());
    for (pos, (_, rule, hosts)) in pending.into_iter().enumerate() {
        for h in hosts {
            index.insert(h, pos);
        }
        rules.push(rule);
    }
    Ok(Compiled {
        rules,
        index,
        default: default.map_or(Action::Deny, |s| s.value),
        mode: mode.map_or(Mode::Enforce, |s| s.value),
        rule_count,
        ignored,
        secret_refs,
        secret_rates,
        dropped,
        fleet_rules,
    })
}

/// Leaves only deny rules in `parsed`, and no policy-wide setting: a deny-only layer can
/// refuse more, never let more through.
fn keep_denies_only(parsed: &mut ParsedSource, name: &str, dropped: &mut Vec<String>) {
    let file = super::load::short_name(name);
    if parsed.default.take().is_some() {
        dropped.push(format!(
            "{file}: `default` (local files may only add deny rules)"
        ));
    }
    if parsed.mode.take().is_some() {
        dropped.push(format!(
            "{file}: `mode` (local files may only add deny rules)"
        ));
    }
    parsed.rules.retain(|def| {
        let action = def.action.get_ref();
        let keep = action.eq_ignore_ascii_case("deny");
        if !keep {
            dropped.push(format!(
                "{file}: rule {} ({action}): local files may only add deny rules",
                def.id.get_ref()
            ));
        }
        keep
    });
}

/// The span of `scope = "fleet"` in a rule's rate (the rule compiled, so it is valid).
fn fleet_scope(def: &super::model::RuleDef) -> Option<Range<usize>> {
    let scope = def.rate.as_ref()?.get_ref().scope.as_ref()?;
    (scope.get_ref() == RateScope::Fleet.as_str()).then(|| scope.span())
}

fn merge_setting<T: Copy + PartialEq>(
    slot: &mut Option<Setting<T>>,
    key: &'static str,
    value: T,
    at: Location,
    name: fn(T) -> &'static str,
) -> Result<(), PolicyError> {
    match slot {
        None => *slot = Some(Setting { value, at }),
        Some(first) if first.value != value => {
            return Err(PolicyError::Conflict(Box::new(Conflict {
                key,
                first: first.at.clone(),
                first_value: name(first.value),
                second: at,
                second_value: name(value),
            })))
        }
        Some(_) => {}
    }
    Ok(())
}

#[cfg(test)]
#[path = "compile_tests.rs"]
mod tests;
