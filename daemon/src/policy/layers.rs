//! A policy made of two layers: a signed bundle's files and the local directory's, composed
//! as the bundle's manifest says (`local`): `merge` (the local files add rules of every
//! kind), `deny-only` (the local files may only add deny rules; their allow and ask rules,
//! `default` and `mode` are left out and reported) or `ignore` (the local files are not
//! read). The bundle's files come first, so they also win priority ties.
//!
//! And the policy there is before any: [`Policy::unavailable`], which refuses everything as
//! `policy_unavailable` (a fleet that requires its first sync fails closed, not open).

use std::path::Path;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::compile::{self, Compiled};
use super::{Action, Mode, Policy, PolicyError, PolicySource};

/// What the local policy directory may do under a bundle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LocalMode {
    Merge,
    DenyOnly,
    Ignore,
}

impl LocalMode {
    pub fn as_str(self) -> &'static str {
        match self {
            LocalMode::Merge => "merge",
            LocalMode::DenyOnly => "deny-only",
            LocalMode::Ignore => "ignore",
        }
    }

    pub fn parse(text: &str) -> Option<LocalMode> {
        match text {
            "merge" => Some(LocalMode::Merge),
            "deny-only" => Some(LocalMode::DenyOnly),
            "ignore" => Some(LocalMode::Ignore),
            _ => None,
        }
    }
}

impl std::fmt::Display for LocalMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A composed policy and what of the local layer was left out.
#[derive(Debug)]
pub struct Composed {
    pub policy: Policy,
    /// One line per local rule or setting a `deny-only` bundle left out.
    pub dropped: Vec<String>,
}

impl Policy {
    /// The bundle's sources, then the local directory's (as `mode` lets them in). No sources
    /// at all (an empty bundle and no local files) is an error, as for a directory.
    pub fn compose(
        bundle: &[PolicySource],
        local_dir: &Path,
        mode: LocalMode,
    ) -> Result<Composed, PolicyError> {
        let local = match mode {
            LocalMode::Ignore => Vec::new(),
            LocalMode::Merge | LocalMode::DenyOnly if !local_dir.is_dir() => Vec::new(),
            LocalMode::Merge | LocalMode::DenyOnly => {
                super::load::read_sources(&super::load::list_dir(local_dir)?)?
            }
        };
        let mut sources = bundle.to_vec();
        let first_local = sources.len();
        sources.extend(local);
        Self::compose_sources(&sources, first_local, mode)
    }

    /// `sources[first_local..]` are the local layer's.
    pub(crate) fn compose_sources(
        sources: &[PolicySource],
        first_local: usize,
        mode: LocalMode,
    ) -> Result<Composed, PolicyError> {
        if sources.is_empty() {
            return Err(PolicyError::NoFiles {
                dir: "(the bundle and the local directory hold no policy files)".into(),
            });
        }
        let deny_only = (mode == LocalMode::DenyOnly).then_some(first_local);
        let mut compiled: Compiled = compile::compile(sources, deny_only)?;
        let dropped = std::mem::take(&mut compiled.dropped);
        for line in &dropped {
            tracing::warn!("policy bundle says local = \"deny-only\": left out {line}");
        }
        Ok(Composed {
            policy: Policy::compiled(sources, compiled)?,
            dropped,
        })
    }

    /// The policy before the first bundle when `[policy.source] require_first_sync` is set:
    /// no rule, and every decision a refusal marked [`super::Decision::unavailable`].
    pub fn unavailable() -> Policy {
        Policy {
            rules: Vec::new(),
            index: super::index::HostIndex::default(),
            default: Action::Deny,
            mode: Mode::Enforce,
            hash: Arc::from("none"),
            rule_count: 0,
            ignored: 0,
            secret_refs: Vec::new(),
            secret_rates: Vec::new(),
            passthrough: false,
            unavailable: true,
            fleet_rules: Vec::new(),
        }
    }

    /// Whether this is [`Policy::unavailable`].
    pub fn is_unavailable(&self) -> bool {
        self.unavailable
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::{RequestFacts, Scheme};

    fn src(name: &str, text: &str) -> PolicySource {
        PolicySource {
            name: name.into(),
            text: text.into(),
        }
    }

    fn get(p: &Policy, host: &str) -> Action {
        p.decide(&RequestFacts {
            host,
            port: 443,
            scheme: Scheme::Https,
            method: Some("GET"),
            path: Some("/"),
            agent: None,
        })
        .action
    }

    const BUNDLE: &str = "version = 1\ndefault = \"deny\"\n[[rule]]\nid = \"central\"\naction = \"allow\"\nhosts = [\"a.test\", \"b.test\"]\n";
    const LOCAL: &str = "version = 1\ndefault = \"allow\"\n[[rule]]\nid = \"local-allow\"\naction = \"allow\"\nhosts = [\"c.test\"]\n[[rule]]\nid = \"local-deny\"\naction = \"deny\"\nhosts = [\"b.test\"]\npriority = 10\n";

    #[test]
    fn deny_only_keeps_local_denies_and_drops_the_rest() {
        let sources = [
            src("bundle:r1/main.toml", BUNDLE),
            src("/p/local.toml", LOCAL),
        ];
        let c = Policy::compose_sources(&sources, 1, LocalMode::DenyOnly).expect("composes");
        assert_eq!(get(&c.policy, "a.test"), Action::Allow);
        assert_eq!(get(&c.policy, "b.test"), Action::Deny, "local deny applies");
        assert_eq!(
            get(&c.policy, "c.test"),
            Action::Deny,
            "local allow left out"
        );
        assert_eq!(
            get(&c.policy, "d.test"),
            Action::Deny,
            "local default left out"
        );
        assert_eq!(c.dropped.len(), 2, "{:?}", c.dropped);
        assert!(c.dropped.iter().any(|d| d.contains("local-allow")));
    }

    #[test]
    fn merge_takes_local_allows_and_conflicts_are_errors() {
        let local = LOCAL.replace("default = \"allow\"\n", "");
        let sources = [
            src("bundle:r1/main.toml", BUNDLE),
            src("/p/local.toml", &local),
        ];
        let c = Policy::compose_sources(&sources, 1, LocalMode::Merge).expect("composes");
        assert_eq!(get(&c.policy, "c.test"), Action::Allow);
        assert!(c.dropped.is_empty());
        let sources = [
            src("bundle:r1/main.toml", BUNDLE),
            src("/p/local.toml", LOCAL),
        ];
        assert!(Policy::compose_sources(&sources, 1, LocalMode::Merge).is_err());
    }

    #[test]
    fn unavailable_refuses_everything_as_unavailable() {
        let p = Policy::unavailable();
        let d = p.decide(&RequestFacts {
            host: "a.test",
            port: 443,
            scheme: Scheme::Https,
            method: Some("GET"),
            path: Some("/"),
            agent: None,
        });
        assert_eq!(d.action, Action::Deny);
        assert!(d.unavailable);
        assert!(p.decide_name("a.test", None).unavailable);
    }
}
