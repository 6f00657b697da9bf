//! `decide`: host index lookup, then the first matching candidate in evaluation order. The
//! index keeps a decision O(labels in host) rather than O(rules).

use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt::Write as _;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Arc;

use globset::GlobSet;

use super::host::{normalize_host_cow, parent_suffixes, HostPattern};
use super::path::{is_matching_form, normalize_path};
use super::{Action, Decision, Mode, Policy, RequestFacts};

/// One rule, validated. Everything but the host, which lives in [`HostIndex`].
#[derive(Debug)]
pub(crate) struct CompiledRule {
    pub id: Arc<str>,
    pub action: Action,
    pub priority: i32,
    /// Sorted; `None` = any port.
    pub ports: Option<Box<[u16]>>,
    /// Upper-case; `None` = any method.
    pub methods: Option<Box<[Box<str>]>>,
    /// `None` = any path.
    pub paths: Option<GlobSet>,
}

impl CompiledRule {
    /// Everything but the host. A rule constraining methods or paths never matches a request
    /// where they are unknown (raw TCP): allowing would over-allow, denying would over-deny.
    fn matches(&self, port: u16, method: Option<&str>, path: Option<&str>) -> bool {
        if !self.matches_port(port) {
            return false;
        }
        if let Some(methods) = &self.methods {
            match method {
                Some(m) if methods.iter().any(|x| x.eq_ignore_ascii_case(m)) => {}
                _ => return false,
            }
        }
        if let Some(globs) = &self.paths {
            match path {
                Some(p) if globs.is_match(p) => {}
                _ => return false,
            }
        }
        true
    }

    fn matches_port(&self, port: u16) -> bool {
        self.ports
            .as_ref()
            .is_none_or(|ports| ports.binary_search(&port).is_ok())
    }
}

/// Rule positions (in evaluation order, ascending) by host pattern.
#[derive(Debug, Default)]
pub(crate) struct HostIndex {
    exact: HashMap<Box<str>, Vec<usize>, FastHash>,
    /// Keyed by the suffix after `*.`.
    suffix: HashMap<Box<str>, Vec<usize>, FastHash>,
    any: Vec<usize>,
}

/// FxHash-style hasher: several times faster than SipHash on short host names. Flooding is
/// not a concern: the keys come from the policy; requests only look up.
type FastHash = BuildHasherDefault<FxHasher>;

#[derive(Default)]
struct FxHasher(u64);

impl Hasher for FxHasher {
    fn write(&mut self, bytes: &[u8]) {
        const K: u64 = 0x51_7c_c1_b7_27_22_0a_95;
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            let mut w = [0u8; 8];
            w.copy_from_slice(c);
            self.0 = (self.0.rotate_left(5) ^ u64::from_le_bytes(w)).wrapping_mul(K);
        }
        for &b in chunks.remainder() {
            self.0 = (self.0.rotate_left(5) ^ u64::from(b)).wrapping_mul(K);
        }
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

impl HostIndex {
    /// Positions must be inserted in ascending order.
    pub(crate) fn insert(&mut self, pattern: HostPattern, pos: usize) {
        let list = match pattern {
            HostPattern::Any => &mut self.any,
            HostPattern::Exact(h) => self.exact.entry(h.into()).or_default(),
            HostPattern::Suffix(s) => self.suffix.entry(s.into()).or_default(),
        };
        if list.last() != Some(&pos) {
            list.push(pos);
        }
    }

    /// Calls `f` with each candidate list for a canonical host (each sorted ascending).
    fn candidates<'a>(&'a self, host: &str, mut f: impl FnMut(&'a [usize])) {
        if let Some(v) = self.exact.get(host) {
            f(v);
        }
        if !self.suffix.is_empty() {
            for s in parent_suffixes(host) {
                if let Some(v) = self.suffix.get(s) {
                    f(v);
                }
            }
        }
        if !self.any.is_empty() {
            f(&self.any);
        }
    }
}

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

        let mut found = None;
        self.scan(&host, |rule| {
            let hit = rule.matches(req.port, req.method, path);
            if hit {
                found = Some(rule);
            }
            hit
        });
        match found {
            Some(rule) => self.verdict(rule.action, Some(rule), req, &host, path),
            None => self.verdict(self.default, None, req, &host, path),
        }
    }

    /// Whether some request to `host:port` could be allowed (report mode: always). For an
    /// early check before TLS interception, where method and path are not known yet: `decide`
    /// with `method: None` would treat every method/path-constrained allow rule as not matching.
    pub fn may_allow(&self, host: &str, port: u16) -> bool {
        let Ok(host) = normalize_host_cow(host) else {
            return false;
        };
        if self.mode == Mode::Report {
            return true;
        }
        let mut verdict = None;
        self.scan(&host, |rule| {
            if !rule.matches_port(port) {
                return false;
            }
            let unconditional = rule.methods.is_none() && rule.paths.is_none();
            if unconditional || rule.action == Action::Allow {
                verdict = Some(rule.action == Action::Allow);
                return true;
            }
            false // A method/path-specific deny leaves other requests open.
        });
        verdict.unwrap_or(self.default == Action::Allow)
    }

    /// Visits the rules whose host patterns match canonical `host`, in evaluation order,
    /// until `visit` returns true.
    fn scan<'a>(&'a self, host: &str, mut visit: impl FnMut(&'a CompiledRule) -> bool) {
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

    fn verdict(
        &self,
        action: Action,
        rule: Option<&CompiledRule>,
        req: &RequestFacts<'_>,
        host: &str,
        path: Option<&str>,
    ) -> Decision {
        let reported_deny = action == Action::Deny && self.mode == Mode::Report;
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
        if reported_deny {
            text.push_str("; allowed in report mode");
        }
        Decision {
            action: if reported_deny { Action::Allow } else { action },
            reported_deny,
            rule_id: rule.map(|r| Arc::clone(&r.id)),
            explanation: text,
        }
    }
}

fn invalid(explanation: String) -> Decision {
    Decision {
        action: Action::Deny,
        reported_deny: false,
        rule_id: None,
        explanation,
    }
}

#[cfg(test)]
#[path = "eval_tests.rs"]
mod tests;
