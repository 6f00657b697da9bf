//! `tls = "passthrough"`: which TLS connections are spliced without interception. Decided
//! on the ClientHello's server name and the port alone, as a connection to `https://NAME:PORT`
//! with no method or path: when the rule that decides it is a passthrough rule, the bytes
//! pass through unopened. No name, or a name that is an address, is never passed through.

use std::net::IpAddr;

use super::host::normalize_host_cow;
use super::{Decision, Policy, RequestFacts, Scheme};

impl Policy {
    /// Some rule says `tls = "passthrough"` (otherwise no ClientHello needs a look first).
    pub fn has_passthrough(&self) -> bool {
        self.passthrough
    }

    /// The decision for a TLS connection with server name `sni` to `port`, when a
    /// passthrough rule makes it (it is then an allow); `None` when the connection is to be
    /// intercepted and decided request by request as usual.
    pub fn decide_passthrough(&self, sni: &str, port: u16, agent: Option<u32>) -> Option<Decision> {
        if !self.passthrough {
            return None;
        }
        let host = normalize_host_cow(sni).ok()?;
        if host.parse::<IpAddr>().is_ok() {
            return None;
        }
        let rule = self
            .first(&host, |rule| {
                rule.matches(&host, Scheme::Https, port, None, None, agent)
            })
            .filter(|r| r.passthrough)?;
        let req = RequestFacts {
            host: sni,
            port,
            scheme: Scheme::Https,
            method: None,
            path: None,
            agent,
        };
        Some(self.verdict(rule.action, Some(rule), &req, &host, None))
    }
}

#[cfg(test)]
mod tests {
    use crate::policy::{Policy, PolicyError, PolicySource};

    fn policy(text: &str) -> Result<Policy, PolicyError> {
        Policy::from_sources(&[PolicySource {
            name: "t.toml".into(),
            text: format!("version = 1\n{text}"),
        }])
    }

    const PINNED: &str = r#"
[[rule]]
id = "pinned"
hosts = ["*.pinned.test"]
ports = [443]
action = "allow"
tls = "passthrough"

[[rule]]
id = "pinned-admin"
hosts = ["admin.pinned.test"]
action = "deny"
priority = 10

[[rule]]
id = "api"
hosts = ["api.test"]
action = "allow"
"#;

    #[test]
    fn a_passthrough_rule_decides_by_name_and_port_only() {
        let p = policy(PINNED).expect("policy");
        assert!(p.has_passthrough());
        let d = p
            .decide_passthrough("App.Pinned.test.", 443, None)
            .expect("passes");
        assert_eq!(d.rule_id.as_deref(), Some("pinned"));
        assert!(d.is_allowed());
        assert!(
            p.decide_passthrough("app.pinned.test", 8443, None)
                .is_none(),
            "port"
        );
        assert!(
            p.decide_passthrough("api.test", 443, None).is_none(),
            "intercepted"
        );
        assert!(
            p.decide_passthrough("admin.pinned.test", 443, None)
                .is_none(),
            "a deny before it decides"
        );
        assert!(
            p.decide_passthrough("10.0.0.1", 443, None).is_none(),
            "an address"
        );
        assert!(
            p.decide_passthrough("::1", 443, None).is_none(),
            "an address"
        );
        let plain = policy("[[rule]]\nid = \"a\"\nhosts = [\"a.test\"]\naction = \"allow\"\n")
            .expect("policy");
        assert!(!plain.has_passthrough());
    }

    #[test]
    fn what_passthrough_cannot_see_is_a_lint_error() {
        let rule = |extra: &str| {
            policy(&format!(
                "[[rule]]\nid = \"p\"\nhosts = [\"p.test\"]\naction = \"allow\"\ntls = \"passthrough\"\n{extra}"
            ))
        };
        assert!(rule("").is_ok());
        assert!(rule("schemes = [\"https\"]").is_ok());
        for (extra, want) in [
            ("methods = [\"GET\"]", "never sees a method"),
            ("paths = [\"/x\"]", "never sees a path"),
            ("secrets = [\"TOKEN\"]", "a request to put a secret in"),
            (
                "inject = [{ header = \"x-k\", value = \"Bearer ${secret:TOKEN}\" }]",
                "a request to inject into",
            ),
            (
                "schemes = [\"https\", \"tcp\"]",
                "schemes may only be [\"https\"]",
            ),
        ] {
            let e = rule(extra).expect_err(extra).to_string();
            assert!(e.contains(want), "{extra}: {e}");
        }
        let e = policy("[[rule]]\nid = \"d\"\nhosts = [\"d.test\"]\naction = \"deny\"\ntls = \"passthrough\"\n")
            .expect_err("deny")
            .to_string();
        assert!(e.contains("only to \"allow\" rules"), "{e}");
        let e = rule("").and_then(|_| {
            policy("[[rule]]\nid = \"x\"\nhosts = [\"x.test\"]\naction = \"allow\"\ntls = \"splice\"\n")
        });
        assert!(e
            .expect_err("unknown")
            .to_string()
            .contains("unknown tls \"splice\""));
    }
}
