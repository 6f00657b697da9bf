//! One rule's validation: a [`RuleDef`] (from any format) becomes compiled matchers, or an
//! error naming the rule and the exact value at fault.

use std::ops::Range;
use std::sync::Arc;

use toml::Spanned;

use super::error::{Location, PolicyError};
use super::glob::GlobCache;
use super::host::{parse_host_pattern, HostPattern};
use super::inject::{compile_bindings, SecretUse};
use super::matcher::{CompiledRule, PortMatch, SchemeSet};
use super::model::{List, MatchDef, RuleDef};
use super::rate::{compile_rate, Obligations, MAX_CONCURRENT};
use super::{Action, Scheme};

type ErrFn<'a> = dyn Fn(Range<usize>, String) -> PolicyError + 'a;

/// Compiles every matcher of `def`; each comes with the host patterns to index it under.
pub(crate) fn compile_rule(
    def: &RuleDef,
    at: &dyn Fn(Range<usize>) -> Location,
    globs: &mut GlobCache,
    uses: &mut Vec<SecretUse>,
) -> Result<Vec<(CompiledRule, Vec<HostPattern>)>, PolicyError> {
    let err = |span: Range<usize>, message: String| PolicyError::Rule {
        at: at(span),
        rule: def.id.get_ref().clone(),
        message,
    };
    let action = match def.action.get_ref().as_str() {
        "allow" => Action::Allow,
        "deny" => Action::Deny,
        "ask" => Action::Ask,
        other => {
            return Err(err(
                def.action.span(),
                format!("unknown action {other:?}, expected \"allow\", \"deny\" or \"ask\""),
            ))
        }
    };
    let obligations = obligations(def, action, &err)?;
    let secrets = compile_bindings(
        def.secrets.as_ref(),
        def.inject.as_ref(),
        def.swap.as_ref(),
        def.sigv4.as_ref(),
        &err,
        uses,
    )?;
    if secrets.is_some() && action == Action::Deny {
        let span = match (&def.inject, &def.secrets) {
            (Some(i), _) => i.span(),
            (None, Some(s)) => s.span(),
            (None, None) => def.action.span(),
        };
        return Err(err(
            span,
            "`secrets`, `inject` and `sigv4` apply only to \"allow\" and \"ask\" rules".into(),
        ));
    }
    let passthrough = passthrough(def, action, &err)?;
    let dlp = super::dlp::compile_dlp(&def.dlp, action, &err)?;
    let mcp = super::mcp::compile_mcp(def.mcp.as_ref(), action, &err)?;
    let agents = super::agents::compile_agents(def.agents.as_ref(), &err)?;
    let id: Arc<str> = Arc::from(def.id.get_ref().as_str());
    let mut out = Vec::with_capacity(def.matchers.len());
    for m in &def.matchers {
        let hosts = non_empty(&m.hosts, "hosts", &err)?
            .iter()
            .map(|h| parse_host_pattern(h.get_ref()).map_err(|e| err(h.span(), e.to_string())))
            .collect::<Result<Vec<_>, _>>()?;
        let except_hosts = m
            .except_hosts
            .iter()
            .map(|h| parse_host_pattern(h.get_ref()).map_err(|e| err(h.span(), e.to_string())))
            .collect::<Result<Vec<_>, _>>()?;
        let schemes = if passthrough {
            passthrough_schemes(m, &err)?
        } else {
            schemes(m, action, &err)?
        };
        let ports = match &m.ports {
            None => PortMatch::Any,
            Some(list) if m.ports_excluded => PortMatch::NotIn(ports(list, &err)?),
            Some(list) => PortMatch::In(ports(list, &err)?),
        };
        let methods = m.methods.as_ref().map(|l| methods(l, &err)).transpose()?;
        let paths = match &m.paths {
            None => None,
            Some(list) => {
                non_empty(list, "paths", &err)?;
                let set = globs
                    .get(list, m.paths_case_insensitive)
                    .map_err(|(span, e)| err(span, e.to_string()))?;
                Some(set)
            }
        };
        let mut shown = summary(m);
        if let Some(section) = &mcp {
            shown.push(' ');
            shown.push_str(&section.summary());
        }
        if let Some(uids) = &agents {
            let uids: Vec<String> = uids.iter().map(u32::to_string).collect();
            shown.push_str(&format!(" agents={}", uids.join(",")));
        }
        let rule = CompiledRule {
            summary: shown.into(),
            id: Arc::clone(&id),
            action,
            priority: def.priority,
            schemes,
            ports,
            methods,
            paths,
            except_hosts: except_hosts.into_boxed_slice(),
            obligations,
            secrets: secrets.clone(),
            passthrough,
            agents: agents.clone(),
            dlp: dlp.clone(),
            mcp: mcp.clone(),
        };
        out.push((rule, hosts));
    }
    Ok(out)
}

fn obligations(def: &RuleDef, action: Action, err: &ErrFn<'_>) -> Result<Obligations, PolicyError> {
    let only_allow = |key: &str, span| {
        err(
            span,
            format!("`{key}` applies only to \"allow\" and \"ask\" rules"),
        )
    };
    let rate = match &def.rate {
        None => None,
        Some(r) if action == Action::Deny => return Err(only_allow("rate", r.span())),
        Some(r) => Some(compile_rate(r.get_ref()).map_err(|(span, e)| err(span, e.to_string()))?),
    };
    let max_concurrent = match &def.max_concurrent {
        None => None,
        Some(n) if action == Action::Deny => return Err(only_allow("max_concurrent", n.span())),
        Some(n) => Some(
            u32::try_from(*n.get_ref())
                .ok()
                .filter(|v| (1..=MAX_CONCURRENT).contains(v))
                .ok_or_else(|| {
                    let msg = format!(
                        "`max_concurrent` must be between 1 and {MAX_CONCURRENT}, not {}",
                        n.get_ref()
                    );
                    err(n.span(), msg)
                })?,
        ),
    };
    let budget = match &def.budget {
        None => None,
        Some(b) if action == Action::Deny => return Err(only_allow("budget", b.span())),
        Some(b) => Some(
            super::budget::compile_budget(b.get_ref())
                .map_err(|(span, e)| err(span, e.to_string()))?,
        ),
    };
    Ok(Obligations {
        rate,
        max_concurrent,
        budget,
    })
}

/// `tls`: `"intercept"` (the default) or `"passthrough"`, which only an allow rule may say
/// and which rules out everything that needs to see inside the TLS: methods, paths, secrets,
/// injection.
fn passthrough(def: &RuleDef, action: Action, err: &ErrFn<'_>) -> Result<bool, PolicyError> {
    let Some(tls) = &def.tls else {
        return Ok(false);
    };
    match tls.get_ref().as_str() {
        "intercept" => return Ok(false),
        "passthrough" => {}
        other => {
            return Err(err(
                tls.span(),
                format!("unknown tls {other:?}, expected \"intercept\" or \"passthrough\""),
            ))
        }
    }
    if action != Action::Allow {
        return Err(err(
            tls.span(),
            "tls = \"passthrough\" applies only to \"allow\" rules".into(),
        ));
    }
    let blind = "tls = \"passthrough\" splices the TLS unopened, so the proxy never sees";
    if let Some(i) = &def.inject {
        return Err(err(i.span(), format!("{blind} a request to inject into")));
    }
    if let Some(s) = def.secrets.as_ref().or(def.swap.as_ref()) {
        return Err(err(
            s.span(),
            format!("{blind} a request to put a secret in"),
        ));
    }
    for m in &def.matchers {
        if let Some(l) = &m.methods {
            return Err(err(l.span(), format!("{blind} a method")));
        }
        if let Some(l) = &m.paths {
            return Err(err(l.span(), format!("{blind} a path")));
        }
    }
    Ok(true)
}

/// A passthrough rule matches TLS only: `schemes`, if given, must be `["https"]`.
fn passthrough_schemes(m: &MatchDef, err: &ErrFn<'_>) -> Result<SchemeSet, PolicyError> {
    if let Some(list) = &m.schemes {
        for s in list.get_ref() {
            if !s.get_ref().eq_ignore_ascii_case("https") {
                return Err(err(
                    s.span(),
                    format!(
                        "tls = \"passthrough\" passes TLS through: schemes may only be \
                         [\"https\"], not {:?}",
                        s.get_ref()
                    ),
                ));
            }
        }
    }
    Ok(SchemeSet::EMPTY.with(Scheme::Https))
}

fn schemes(m: &MatchDef, action: Action, err: &ErrFn<'_>) -> Result<SchemeSet, PolicyError> {
    let Some(list) = &m.schemes else {
        // Opaque TCP bypasses interception entirely, so only a rule that names "tcp" may
        // allow it; deny and ask rules without `schemes` cover it too.
        return Ok(match action {
            Action::Allow => SchemeSet::EMPTY.with(Scheme::Http).with(Scheme::Https),
            _ => SchemeSet::ANY,
        });
    };
    let mut set = SchemeSet::EMPTY;
    for s in non_empty(list, "schemes", err)? {
        let scheme = match s.get_ref().to_ascii_lowercase().as_str() {
            "http" => Scheme::Http,
            "https" => Scheme::Https,
            "tcp" => Scheme::Tcp,
            other => {
                return Err(err(
                    s.span(),
                    format!("unknown scheme {other:?}, expected \"http\", \"https\" or \"tcp\""),
                ))
            }
        };
        set = set.with(scheme);
    }
    if set == SchemeSet::EMPTY.with(Scheme::Tcp) && (m.methods.is_some() || m.paths.is_some()) {
        return Err(err(
            list.span(),
            "schemes = [\"tcp\"] with `methods` or `paths` can never match: raw TCP has neither"
                .into(),
        ));
    }
    Ok(set)
}

fn ports(list: &List<i64>, err: &ErrFn<'_>) -> Result<Box<[u16]>, PolicyError> {
    let mut ports = non_empty(list, "ports", err)?
        .iter()
        .map(|p| {
            u16::try_from(*p.get_ref())
                .ok()
                .filter(|&n| n != 0)
                .ok_or_else(|| {
                    err(
                        p.span(),
                        format!("port {} out of range 1..=65535", p.get_ref()),
                    )
                })
        })
        .collect::<Result<Vec<_>, _>>()?;
    ports.sort_unstable();
    ports.dedup();
    Ok(ports.into_boxed_slice())
}

fn methods(list: &List<String>, err: &ErrFn<'_>) -> Result<Box<[Box<str>]>, PolicyError> {
    let mut methods = Vec::new();
    for m in non_empty(list, "methods", err)? {
        let s = m.get_ref();
        if s.is_empty() || !s.bytes().all(is_tchar) {
            return Err(err(m.span(), format!("invalid HTTP method {s:?}")));
        }
        methods.push(Box::<str>::from(s.to_ascii_uppercase()));
    }
    methods.sort_unstable();
    methods.dedup();
    Ok(methods.into_boxed_slice())
}

fn non_empty<'a, T>(
    list: &'a Spanned<Vec<T>>,
    key: &str,
    err: &ErrFn<'_>,
) -> Result<&'a [T], PolicyError> {
    if list.get_ref().is_empty() {
        let hint = if key == "hosts" {
            ""
        } else {
            " (omit the key to match any)"
        };
        return Err(err(list.span(), format!("`{key}` must not be empty{hint}")));
    }
    Ok(list.get_ref())
}

/// RFC 9110 `tchar`.
fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// One line saying what a matcher covers, for `ctl policy show`.
fn summary(m: &MatchDef) -> String {
    let list = |l: &List<String>| {
        l.get_ref()
            .iter()
            .map(|x| x.get_ref().as_str())
            .collect::<Vec<_>>()
            .join(",")
    };
    let mut parts = vec![list(&m.hosts)];
    if let Some(s) = &m.schemes {
        parts.push(format!("schemes={}", list(s)));
    }
    if let Some(p) = &m.ports {
        let ports: Vec<String> = p
            .get_ref()
            .iter()
            .map(|x| x.get_ref().to_string())
            .collect();
        let op = if m.ports_excluded {
            "ports!="
        } else {
            "ports="
        };
        parts.push(format!("{op}{}", ports.join(",")));
    }
    if let Some(ms) = &m.methods {
        parts.push(format!("methods={}", list(ms)));
    }
    if let Some(ps) = &m.paths {
        parts.push(format!("paths={}", list(ps)));
    }
    parts.join(" ")
}
