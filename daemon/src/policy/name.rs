//! `decide_name`: may the agent learn a name's addresses? Only if some rule could allow a
//! connection to it, on some port and scheme, for that agent. A name no rule allows is never
//! sent to a resolver: its lookup is a channel out of the machine (the name itself carries
//! data to whoever answers for its domain). A name only an `ask` rule covers is `Ask`: the
//! stub answers it without asking anyone (a synthetic address), and the connection that
//! follows waits for the operator.

use super::eval::invalid;
use super::host::normalize_host_cow;
use super::matcher::{CompiledRule, PortMatch, SchemeSet};
use super::rate::Obligations;
use super::{Action, Decision, Mode, Policy};

impl Policy {
    /// The verdict for a DNS query for `name` (as asked: any case, a trailing dot, IDN in
    /// Unicode or punycode; normalized as hosts are) from `agent` (its uid; `None` when it
    /// cannot be told). Rules are visited in evaluation order, those naming other agents
    /// skipped (a deny rule naming agents also applies to an unknown one): the first allow
    /// rule matching the name decides `Allow` and the first ask rule `Ask` (the connection
    /// itself is decided later, with its port, scheme, method and path); a deny rule that
    /// covers every connection to the name (no port, scheme, method or path constraint)
    /// decides `Deny` before any rule after it; otherwise the default decides. Report mode
    /// lets a would-be denial (or an ask) through as `Allow`, marked. Never fails: a name
    /// that cannot be normalized is denied.
    pub fn decide_name(&self, name: &str, agent: Option<u32>) -> Decision {
        let host = match normalize_host_cow(name) {
            Ok(h) => h,
            Err(e) => return invalid(format!("invalid name {name:?}: {e}; denied")),
        };
        let found = self.first(&host, |rule| {
            !rule.is_excepted(&host)
                && applies_to(rule, agent)
                && match rule.action {
                    Action::Allow | Action::Ask => true,
                    Action::Deny => covers_everything(rule),
                }
        });
        let (action, rule) = match found {
            Some(r) => (r.action, Some(r)),
            None => (self.default, None),
        };
        let reported_deny = action != Action::Allow && self.mode == Mode::Report;
        let verb = match (action, reported_deny) {
            (Action::Deny, false) => "denies",
            (Action::Deny, true) => "would deny",
            (Action::Ask, false) => "asks an operator for connections to",
            (Action::Ask, true) => "would ask for connections to",
            (Action::Allow, _) => "may allow connections to",
        };
        let mut explanation = match rule {
            Some(r) => format!("rule {} (priority {}) {verb} {host}", r.id, r.priority),
            None if action == Action::Deny => {
                format!("no rule could allow a connection to {host}; default deny")
            }
            None => format!("no rule matched {host}; default {}", action.as_str()),
        };
        if reported_deny {
            explanation.push_str("; answered in report mode");
        }
        if self.unavailable {
            explanation = super::eval::UNAVAILABLE.to_string();
        }
        Decision {
            action: if reported_deny { Action::Allow } else { action },
            reported_deny,
            rule_id: Some(rule.map_or_else(super::default_rule_id, |r| r.id.clone())),
            explanation,
            obligations: Obligations::default(),
            secrets: None,
            // The name's first rule that may allow it says whether its names are scanned.
            dlp: rule
                .filter(|r| r.action != Action::Deny)
                .and_then(|r| r.dlp.clone()),
            names_agents: false,
            unavailable: self.unavailable,
            mcp: None,
        }
    }
}

/// Whether `rule` is one for `agent`: it names no agents, or names this one. A deny rule
/// naming agents applies to an agent that cannot be told too (fail closed); allow and ask
/// rules do not.
fn applies_to(rule: &CompiledRule, agent: Option<u32>) -> bool {
    match (&rule.agents, agent) {
        (None, _) => true,
        (Some(list), Some(uid)) => list.binary_search(&uid).is_ok(),
        (Some(_), None) => rule.action == Action::Deny,
    }
}

/// A deny rule that refuses every connection to the hosts it names: nothing after it in
/// evaluation order can allow one.
fn covers_everything(rule: &CompiledRule) -> bool {
    rule.schemes == SchemeSet::ANY
        && rule.ports == PortMatch::Any
        && rule.methods.is_none()
        && rule.paths.is_none()
}

#[cfg(test)]
mod tests {
    use crate::policy::{Action, Policy, PolicySource};

    fn policy(toml: &str) -> Policy {
        Policy::from_sources(&[PolicySource {
            name: "t.toml".into(),
            text: toml.into(),
        }])
        .expect("policy")
    }

    const RULES: &str = r#"
version = 1
default = "deny"

[[rule]]
id = "api"
hosts = ["api.example.com"]
methods = ["GET"]
paths = ["/v1/**"]
action = "allow"

[[rule]]
id = "wild"
hosts = ["*.cdn.example"]
action = "allow"

[[rule]]
id = "ssh"
hosts = ["git.example.org"]
ports = [22]
schemes = ["tcp"]
action = "allow"

[[rule]]
id = "held"
hosts = ["ask.example"]
action = "ask"

[[rule]]
id = "idn"
hosts = ["bücher.example"]
action = "allow"

[[rule]]
id = "blocked"
hosts = ["evil.cdn.example"]
action = "deny"

[[rule]]
id = "admin-off"
hosts = ["admin.cdn.example"]
paths = ["/admin/**"]
action = "deny"
"#;

    fn allowed(p: &Policy, name: &str) -> bool {
        p.decide_name(name, None).action == Action::Allow
    }

    #[test]
    fn names_some_rule_could_allow_resolve_and_others_do_not() {
        let p = policy(RULES);
        // Exact, any method/path constraint (the connection decides those later).
        assert!(allowed(&p, "api.example.com"));
        // Case and a trailing dot, as a DNS query carries them.
        assert!(allowed(&p, "API.Example.COM."));
        // Wildcards: strictly below, any depth.
        assert!(allowed(&p, "a.b.cdn.example"));
        assert!(!allowed(&p, "cdn.example"));
        // A tcp-only rule makes its host resolvable (ssh, databases).
        assert!(allowed(&p, "git.example.org"));
        // An ask rule: the connection may be approved, the name is not resolved.
        assert_eq!(p.decide_name("ask.example", None).action, Action::Ask);
        // IDN: punycode as resolvers send it, and Unicode.
        assert!(allowed(&p, "xn--bcher-kva.example"));
        assert!(allowed(&p, "bücher.example"));
        // Unlisted.
        assert!(!allowed(&p, "example.com"));
        assert!(!allowed(&p, "exfil.evil.test"));
        assert_eq!(
            p.decide_name("example.com", None).rule_id.as_deref(),
            Some("default")
        );
    }

    #[test]
    fn a_deny_covering_the_whole_host_shadows_a_wildcard_and_a_partial_one_does_not() {
        let p = policy(RULES);
        let d = p.decide_name("evil.cdn.example", None);
        assert_eq!(d.action, Action::Deny);
        assert_eq!(d.rule_id.as_deref(), Some("blocked"));
        // Only /admin/** is denied there: other paths may be allowed by the wildcard.
        let d = p.decide_name("admin.cdn.example", None);
        assert_eq!(
            (d.action, d.rule_id.as_deref()),
            (Action::Allow, Some("wild"))
        );
    }

    #[test]
    fn invalid_names_are_denied() {
        let p = policy(RULES);
        for bad in [
            "a..cdn.example",
            "a b.cdn.example",
            "x\\000.cdn.example",
            "",
        ] {
            assert_eq!(p.decide_name(bad, None).action, Action::Deny, "{bad:?}");
        }
    }

    #[test]
    fn default_allow_and_report_mode_answer_everything() {
        let p = policy("version = 1\ndefault = \"allow\"\n");
        assert!(allowed(&p, "anything.test"));
        let p = policy("version = 1\ndefault = \"deny\"\nmode = \"report\"\n");
        let d = p.decide_name("anything.test", None);
        assert_eq!(d.action, Action::Allow);
        assert!(d.reported_deny);
    }

    /// Names are decided for the asking agent: another agent's rule resolves nothing for it.
    #[test]
    fn names_are_decided_for_the_asking_agent() {
        let p = policy(
            r#"
version = 1
default = "deny"

[[rule]]
id = "a-only"
hosts = ["a.example"]
agents = [5201]
action = "allow"

[[rule]]
id = "not-b"
hosts = ["shared.example"]
agents = [5202]
action = "deny"

[[rule]]
id = "shared"
hosts = ["shared.example"]
action = "allow"

[[rule]]
id = "catch-all"
hosts = ["*"]
action = "ask"
priority = -10
"#,
        );
        assert_eq!(p.decide_name("a.example", Some(5201)).action, Action::Allow);
        // Agent 5202 only gets the catch-all ask for it: never resolved.
        assert_eq!(p.decide_name("a.example", Some(5202)).action, Action::Ask);
        assert_eq!(p.decide_name("a.example", None).action, Action::Ask);
        assert_eq!(
            p.decide_name("shared.example", Some(5201)).action,
            Action::Allow
        );
        let d = p.decide_name("shared.example", Some(5202));
        assert_eq!(
            (d.action, d.rule_id.as_deref()),
            (Action::Deny, Some("not-b"))
        );
        // Unknown: the deny rule naming agents applies (fail closed).
        assert_eq!(p.decide_name("shared.example", None).action, Action::Deny);
        assert_eq!(
            p.decide_name("data.attacker.test", Some(5201)).action,
            Action::Ask
        );
    }
}
