//! `policy check METHOD URL`: what the policy decides for a URL, split the way the proxy
//! splits a real request (same host and path normalization, userinfo refused). `policy check
//! DNS NAME`: whether the DNS stub answers a query for the name (`Policy::decide_name`).

use serde::Serialize;

use crate::policy::{normalize_host, normalize_path, Action, Policy, RequestFacts, Scheme};

#[derive(Debug, Clone, Serialize)]
pub(crate) struct CheckResult {
    pub method: String,
    pub scheme: &'static str,
    pub host: String,
    pub port: u16,
    pub path: String,
    pub decision: &'static str,
    pub reported_deny: bool,
    pub rule_id: Option<String>,
    pub explanation: String,
    pub obligations: serde_json::Value,
    pub policy_hash: String,
    /// The agent uid decided for (`--agent`); `None`: no agent, so no rule with `agents`
    /// applies.
    pub agent: Option<u32>,
}

pub(crate) fn check(
    policy: &Policy,
    method: &str,
    url: &str,
    agent: Option<u32>,
) -> Result<CheckResult, String> {
    if method.eq_ignore_ascii_case("DNS") {
        return Ok(check_name(policy, url));
    }
    let uri: http::Uri = url
        .parse()
        .map_err(|e| format!("invalid URL {url:?}: {e}"))?;
    let scheme = match uri.scheme_str() {
        Some("https") => Scheme::Https,
        Some("http") => Scheme::Http,
        Some(other) => return Err(format!("unsupported scheme {other:?} (http or https)")),
        None => return Err(format!("{url:?} is not an absolute URL")),
    };
    let auth = uri
        .authority()
        .ok_or_else(|| format!("{url:?} has no host"))?;
    if auth.as_str().contains('@') {
        return Err("userinfo in the URL is refused, as the proxy refuses it".into());
    }
    let host = normalize_host(auth.host()).map_err(|e| format!("host: {e}"))?;
    let port = auth.port_u16().unwrap_or(match scheme {
        Scheme::Https => 443,
        _ => 80,
    });
    let path = normalize_path(uri.path()).map_err(|e| format!("path: {e}"))?;
    // A method is one token (RFC 9110): "G E T" is none, and no request could carry it.
    if http::Method::from_bytes(method.as_bytes()).is_err() {
        return Err(format!(
            "invalid HTTP method {method:?}: a method is one token, e.g. GET, POST, DELETE"
        ));
    }
    let method = method.to_ascii_uppercase();
    let d = policy.decide(&RequestFacts {
        host: &host,
        port,
        scheme,
        method: Some(&method),
        path: Some(&path.matching),
        agent,
    });
    Ok(CheckResult {
        decision: match d.action {
            Action::Allow => "allow",
            Action::Deny => "deny",
            Action::Ask => "ask",
        },
        reported_deny: d.reported_deny,
        rule_id: d.rule_id.as_deref().map(str::to_string),
        explanation: d.explanation.clone(),
        obligations: serde_json::to_value(d.obligations).unwrap_or_default(),
        policy_hash: policy.hash().to_string(),
        method,
        scheme: match scheme {
            Scheme::Https => "https",
            _ => "http",
        },
        host,
        port,
        path: path.forward,
        agent,
    })
}

/// A DNS question for `name`: `allow` when the stub would answer it (with what our resolver
/// says), `ask` when it answers with a synthetic address without asking anyone (the
/// connection waits for an operator), `deny` when it answers NXDOMAIN without asking anyone.
fn check_name(policy: &Policy, name: &str) -> CheckResult {
    let d = policy.decide_name(name, None);
    CheckResult {
        method: "DNS".into(),
        scheme: "dns",
        host: normalize_host(name).unwrap_or_else(|_| name.to_string()),
        port: 53,
        path: String::new(),
        decision: match d.action {
            Action::Deny => "deny",
            Action::Ask => "ask",
            Action::Allow => "allow",
        },
        reported_deny: d.reported_deny,
        rule_id: d.rule_id.as_deref().map(str::to_string),
        explanation: d.explanation,
        obligations: serde_json::Value::Null,
        policy_hash: policy.hash().to_string(),
        agent: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::PolicySource;

    #[test]
    fn a_dns_question_is_checked_as_the_stub_decides_it() {
        let p = Policy::from_sources(&[PolicySource {
            name: "t.toml".into(),
            text: "version = 1\ndefault = \"deny\"\n[[rule]]\nid = \"ssh\"\nhosts = [\"github.com\"]\nports = [22]\nschemes = [\"tcp\"]\naction = \"allow\"\n".into(),
        }])
        .expect("policy");
        let r = check(&p, "dns", "GitHub.com.", None).expect("check");
        assert_eq!(
            (r.decision, r.host.as_str(), r.scheme),
            ("allow", "github.com", "dns")
        );
        assert_eq!(r.rule_id.as_deref(), Some("ssh"));
        let r = check(&p, "DNS", "exfil.evil.test", None).expect("check");
        assert_eq!(r.decision, "deny");
    }

    /// Issue 34: `policy check "G E T" …` was answered as if a request could carry it.
    #[test]
    fn a_method_must_be_one_token() {
        let p = Policy::from_sources(&[PolicySource {
            name: "t.toml".into(),
            text: "version = 1\ndefault = \"allow\"\n".into(),
        }])
        .expect("policy");
        for bad in ["G E T", "", "GET\r\n", "GE\"T"] {
            let e = check(&p, bad, "https://x.test/", None).expect_err(bad);
            assert!(e.contains("a method is one token, e.g. GET"), "{e}");
        }
        let r = check(&p, "get", "https://x.test/", None).expect("a token");
        assert_eq!(r.method, "GET");
        assert!(check(&p, "PROPFIND", "https://x.test/", None).is_ok());
    }
}
