//! `decide`: host index lookup, then the first matching candidate in evaluation order
//! (priority desc; deny, then ask, then allow; then file and rule order).

use std::borrow::Cow;
use std::fmt::Write as _;
use std::sync::Arc;

use super::host::normalize_host_cow;
use super::matcher::CompiledRule;
use super::path::{is_matching_form, normalize_path};
use super::rate::Obligations;
use super::{Action, Decision, Mode, Policy, RequestFacts, Scheme};

impl Policy {
    /// The verdict for one request or connection. Never fails: a host or path that cannot be
    /// normalized is denied (in report mode too — nothing could route it safely).
    pub fn decide(&self, req: &RequestFacts<'_>) -> Decision {
        let host = match normalize_host_cow(req.host) {
            Ok(h) => h,
            Err(e) => return invalid(format!("invalid host {:?}: {e}; denied", req.host)),
        };
        let path: Option<Cow<'_, str>> = match req.path {
            None => None,
            Some(p) if is_matching_form(p) => Some(Cow::Borrowed(p)),
            Some(p) => match normalize_path(p) {
                Ok(n) => Some(Cow::Owned(n.matching)),
                Err(e) => return invalid(format!("invalid path {p:?}: {e}; denied")),
            },
        };
        let path = path.as_deref();

        // TRACE and TRACK send the request back as the body: with it, whatever credentials
        // the proxy added on the way (an injected key, a corporate proxy's
        // `Proxy-Authorization`). Only a rule that names the method allows or asks for one.
        let echoes = req.method.is_some_and(is_echo_method);
        let found = self.first(&host, |rule| {
            rule.matches(&host, req.scheme, req.port, req.method, path, req.agent)
                && !(echoes && rule.action != Action::Deny && rule.methods.is_none())
        });
        match found {
            Some(rule) => self.verdict(rule.action, Some(rule), req, &host, path),
            None if echoes && self.default != Action::Deny => invalid(format!(
                "{} echoes the request back, credentials added on the way included: refused \
                 unless a rule names it in `methods`",
                req.method.unwrap_or("TRACE").to_ascii_uppercase()
            )),
            None => self.verdict(self.default, None, req, &host, path),
        }
    }

    /// Whether a rule for canonical-or-not `host` constrains methods or paths: then headers
    /// that make an upstream take another method or path than the one decided
    /// (`X-HTTP-Method-Override`, `X-Original-URL`, …) must not reach it.
    pub fn constrains_request(&self, host: &str) -> bool {
        let Ok(host) = normalize_host_cow(host) else {
            return true;
        };
        self.first(&host, |r| r.methods.is_some() || r.paths.is_some())
            .is_some()
    }

    /// Whether some rule for HTTP or HTTPS (allow, ask or deny), or the default, could apply to
    /// a request on a connection to `name:port` (or, when `name` is `None`, to an address,
    /// whose requests name their host in SNI or Host, so that any rule for the port could).
    /// When none could, what the connection speaks does not change its decision: it is
    /// decided as raw TCP at once, without waiting to see (a server that speaks first is not
    /// kept waiting). Over-approximates, never under.
    pub fn http_rule_may_match(&self, name: Option<&str>, port: u16) -> bool {
        if self.mode == Mode::Report || self.default != Action::Deny {
            return true;
        }
        let for_http = |r: &CompiledRule| {
            (r.schemes.contains(Scheme::Http) || r.schemes.contains(Scheme::Https))
                && r.ports.matches(port)
        };
        let Some(name) = name else {
            return self.rules.iter().any(for_http);
        };
        let Ok(host) = normalize_host_cow(name) else {
            return false;
        };
        self.first(&host, |rule| for_http(rule) && !rule.is_excepted(&host))
            .is_some()
    }

    /// The first rule, in evaluation order, whose host patterns match canonical `host` and
    /// for which `pick` holds.
    pub(super) fn first<'a>(
        &'a self,
        host: &str,
        mut pick: impl FnMut(&'a CompiledRule) -> bool,
    ) -> Option<&'a CompiledRule> {
        let mut found = None;
        self.scan(host, |rule| {
            let hit = pick(rule);
            if hit {
                found = Some(rule);
            }
            hit
        });
        found
    }

    /// Visits the rules whose host patterns match canonical `host`, in evaluation order,
    /// until `visit` returns true.
    pub(super) fn scan<'a>(&'a self, host: &str, mut visit: impl FnMut(&'a CompiledRule) -> bool) {
        // Candidate lists on the stack; a host matching more than 8 patterns spills to the heap.
        let mut buf: [&[usize]; 8] = [&[]; 8];
        let mut n = 0;
        let mut spill: Vec<&[usize]> = Vec::new();
        self.index.candidates(host, |list| match buf.get_mut(n) {
            Some(slot) => {
                *slot = list;
                n += 1;
            }
            None => spill.push(list),
        });
        let lists: &mut [&[usize]] = if spill.is_empty() {
            &mut buf[..n]
        } else {
            spill.extend_from_slice(&buf[..n]);
            &mut spill
        };
        let mut last = None;
        // k-way merge of the sorted lists: visits candidates in evaluation order.
        loop {
            let mut best: Option<(usize, usize)> = None;
            for (li, list) in lists.iter().enumerate() {
                if let Some(&pos) = list.first() {
                    if best.is_none_or(|(_, b)| pos < b) {
                        best = Some((li, pos));
                    }
                }
            }
            let Some((li, pos)) = best else { break };
            lists[li] = &lists[li][1..];
            if last == Some(pos) {
                continue;
            }
            last = Some(pos);
            if visit(&self.rules[pos]) {
                return;
            }
        }
    }

    pub(super) fn verdict(
        &self,
        action: Action,
        rule: Option<&CompiledRule>,
        req: &RequestFacts<'_>,
        host: &str,
        path: Option<&str>,
    ) -> Decision {
        let reported_deny = action != Action::Allow && self.mode == Mode::Report;
        // The rule's obligations hold for what it allows, and for an ask once approved.
        let (obligations, secrets, dlp) = match rule {
            Some(r) if r.action != Action::Deny => {
                (r.obligations, r.secrets.clone(), r.dlp.clone())
            }
            _ => (Obligations::default(), None, None),
        };
        let mut text = String::with_capacity(128);
        // Writing to a String cannot fail.
        let _ = match rule {
            Some(r) => write!(
                text,
                "rule {} (priority {}) {} ",
                r.id,
                r.priority,
                match (action, reported_deny) {
                    (Action::Allow, _) => "allows",
                    (Action::Deny, false) => "denies",
                    (Action::Deny, true) => "would deny",
                    (Action::Ask, false) => "asks approval for",
                    (Action::Ask, true) => "would ask approval for",
                }
            ),
            None => write!(text, "no rule matched "),
        };
        text.push_str(req.method.unwrap_or(req.scheme.as_str()));
        let _ = if host.contains(':') {
            write!(text, " [{host}]:{}", req.port)
        } else {
            write!(text, " {host}:{}", req.port)
        };
        text.push_str(path.unwrap_or(""));
        if rule.is_none() {
            text.push_str("; default ");
            text.push_str(action.as_str());
        }
        if let Some(rate) = &obligations.rate {
            let _ = write!(text, "; rate {rate}");
        }
        if let Some(n) = obligations.max_concurrent {
            let _ = write!(text, "; at most {n} concurrent per host");
        }
        if reported_deny {
            text.push_str("; allowed in report mode");
        }
        if self.unavailable {
            text = UNAVAILABLE.to_string();
        }
        Decision {
            action: if reported_deny { Action::Allow } else { action },
            reported_deny,
            rule_id: Some(rule.map_or_else(super::default_rule_id, |r| Arc::clone(&r.id))),
            explanation: text,
            obligations,
            secrets,
            dlp,
            names_agents: rule.is_some_and(|r| r.agents.is_some()),
            unavailable: self.unavailable,
            mcp: rule
                .filter(|r| r.action != Action::Deny)
                .and_then(|r| r.mcp.clone()),
        }
    }
}

/// TRACE and TRACK (IIS's), which echo the request.
fn is_echo_method(m: &str) -> bool {
    m.eq_ignore_ascii_case("TRACE") || m.eq_ignore_ascii_case("TRACK")
}

pub(super) fn invalid(explanation: String) -> Decision {
    Decision {
        action: Action::Deny,
        reported_deny: false,
        rule_id: None,
        explanation,
        obligations: Obligations::default(),
        secrets: None,
        dlp: None,
        names_agents: false,
        unavailable: false,
        mcp: None,
    }
}

/// Why everything is refused under [`Policy::unavailable`].
pub(super) const UNAVAILABLE: &str =
    "no policy yet: the first verified policy bundle has not arrived (policy.source.require_first_sync)";

#[cfg(test)]
#[path = "eval_tests.rs"]
pub(crate) mod tests;
