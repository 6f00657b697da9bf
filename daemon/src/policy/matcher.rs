//! A compiled rule alternative and how it matches a request. Everything but the host, which
//! the host index (`index.rs`) has already matched when these checks run.

use std::sync::Arc;

use globset::GlobSet;

use super::host::HostPattern;
use super::inject::SecretBindings;
use super::rate::Obligations;
use super::{Action, Scheme};

/// One matcher of one rule, validated. Several may share an id (AgenShield patterns).
#[derive(Debug)]
pub(crate) struct CompiledRule {
    /// What it matches, as written, for `ctl policy show`.
    pub summary: Arc<str>,
    pub id: Arc<str>,
    pub action: Action,
    pub priority: i32,
    pub schemes: SchemeSet,
    pub ports: PortMatch,
    /// Upper-case, sorted; `None` = any method.
    pub methods: Option<Box<[Box<str>]>>,
    /// `None` = any path.
    pub paths: Option<GlobSet>,
    /// Hosts this rule does not apply to, although its host patterns match them.
    pub except_hosts: Box<[HostPattern]>,
    /// The rule's, carried into decisions it makes when it allows or asks.
    pub obligations: Obligations,
    /// Secrets the rule binds (shared by all its matchers).
    pub secrets: Option<Arc<SecretBindings>>,
    /// `tls = "passthrough"`: the TLS connections it allows are spliced, not intercepted.
    pub passthrough: bool,
    /// The agent uids it applies to, sorted; `None`: every agent. A deny with `agents` also
    /// applies where the agent is unknown.
    pub agents: Option<Box<[u32]>>,
    /// `dlp` and `dlp_allow` (shared by all its matchers); `None`: the defaults.
    pub dlp: Option<Arc<super::DlpRule>>,
    /// The rule's `mcp` section (shared by all its matchers).
    pub mcp: Option<Arc<super::mcp::McpRule>>,
}

/// A set of schemes as a bit mask.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SchemeSet(u8);

impl SchemeSet {
    pub(crate) const ANY: SchemeSet = SchemeSet(0b111);
    pub(crate) const EMPTY: SchemeSet = SchemeSet(0);

    fn bit(s: Scheme) -> u8 {
        match s {
            Scheme::Http => 1,
            Scheme::Https => 2,
            Scheme::Tcp => 4,
        }
    }

    pub(crate) fn with(self, s: Scheme) -> SchemeSet {
        SchemeSet(self.0 | Self::bit(s))
    }

    pub(crate) fn contains(self, s: Scheme) -> bool {
        self.0 & Self::bit(s) != 0
    }
}

/// Which ports a rule covers. Lists are sorted and deduplicated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum PortMatch {
    Any,
    In(Box<[u16]>),
    /// Every port but these (AgenShield `allowedPorts` turned into a deny).
    NotIn(Box<[u16]>),
}

impl PortMatch {
    pub(crate) fn matches(&self, port: u16) -> bool {
        match self {
            PortMatch::Any => true,
            PortMatch::In(list) => list.binary_search(&port).is_ok(),
            PortMatch::NotIn(list) => list.binary_search(&port).is_err(),
        }
    }
}

impl CompiledRule {
    /// Everything but the host patterns. A rule constraining methods or paths never matches
    /// a request where they are unknown (raw TCP). Raw TCP is allowed only by rules that
    /// name the `tcp` scheme (see `rule::schemes`), so this cannot over-allow.
    pub(crate) fn matches(
        &self,
        host: &str,
        scheme: Scheme,
        port: u16,
        method: Option<&str>,
        path: Option<&str>,
        agent: Option<u32>,
    ) -> bool {
        if !self.schemes.contains(scheme) || !self.ports.matches(port) {
            return false;
        }
        if let Some(agents) = &self.agents {
            let applies = match agent {
                Some(a) => agents.binary_search(&a).is_ok(),
                // An unknown agent may be any of them: a deny applies to it (fail closed);
                // nothing else does.
                None => self.action == Action::Deny,
            };
            if !applies {
                return false;
            }
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
        !self.is_excepted(host)
    }

    pub(crate) fn is_excepted(&self, host: &str) -> bool {
        self.except_hosts.iter().any(|p| p.matches(host))
    }
}

#[cfg(test)]
#[path = "matcher_tests.rs"]
mod tests;
