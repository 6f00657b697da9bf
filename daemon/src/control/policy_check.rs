//! `policy check METHOD URL`: what the policy decides for a URL, split the way the proxy
//! splits a real request (same host and path normalization, userinfo refused). `policy check
//! DNS NAME`: whether the DNS stub answers a query for the name (`Policy::decide_name`).
//! A refusal by the policy's default comes with a hint: the rule that covers the host but not
//! this request, or the rule for a domain above it, or how to add one.

use serde::Serialize;

use crate::config::DeniedAnswer;
use crate::policy::{
    normalize_host, normalize_path, Action, Decision, HostError, PathError, Policy, RequestFacts,
    Scheme,
};

/// Why `method url` cannot be checked: it is no request the proxy could be sent.
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    #[error("invalid URL {url:?}: {source}")]
    Url {
        url: String,
        #[source]
        source: http::uri::InvalidUri,
    },
    #[error("unsupported scheme {0:?} (http or https)")]
    Scheme(String),
    #[error("{0:?} is not an absolute URL")]
    NotAbsolute(String),
    #[error("{0:?} has no host")]
    NoHost(String),
    #[error("userinfo in the URL is refused, as the proxy refuses it")]
    Userinfo,
    #[error("host: {0}")]
    Host(#[source] HostError),
    #[error("path: {0}")]
    Path(#[source] PathError),
    #[error("invalid HTTP method {0:?}: a method is one token, e.g. GET, POST, DELETE")]
    Method(String),
}

#[derive(Debug, Clone, Serialize)]
pub struct CheckResult {
    pub method: String,
    pub scheme: &'static str,
    pub host: String,
    pub port: u16,
    pub path: String,
    pub decision: &'static str,
    pub reported_deny: bool,
    pub rule_id: Option<String>,
    pub explanation: String,
    /// Refused by the policy's default: the nearest rule, or how to add one.
    pub hint: Option<String>,
    /// DNS: how the stub answers (`resolver`: from the proxy's resolver; `synthetic`: an
    /// address standing for the name, answered locally; `nxdomain`: NXDOMAIN, answered
    /// locally). `None` for requests.
    pub answer: Option<&'static str>,
    pub obligations: serde_json::Value,
    pub policy_hash: String,
    /// The agent uid decided for (`--agent`); `None`: no agent, so no rule with `agents`
    /// applies.
    pub agent: Option<u32>,
    /// The MCP call checked (`--mcp-method`, `--mcp-tool`), when one was given.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mcp: Option<McpCall>,
}

/// An MCP call to check against the deciding rule's `mcp` (`tool` alone means `tools/call`).
/// Pins are the daemon's state and not consulted: a pinned tool that changed is refused by
/// the daemon even where this says allow.
#[derive(Debug, Clone, Default, Serialize, serde::Deserialize)]
pub struct McpCall {
    pub method: Option<String>,
    pub tool: Option<String>,
}

/// `check`, then the MCP call against the deciding rule's `mcp`: a call its lists refuse
/// turns an `allow` (or `ask`) into `deny`, and the explanation says which list.
pub fn check_mcp(
    policy: &Policy,
    method: &str,
    url: &str,
    agent: Option<u32>,
    denied: DeniedAnswer,
    call: &McpCall,
) -> Result<CheckResult, CheckError> {
    let mut r = check(policy, method, url, agent, denied)?;
    let scheme = if r.scheme == "https" {
        Scheme::Https
    } else {
        Scheme::Http
    };
    let path = normalize_path(&r.path).map_err(CheckError::Path)?;
    let d = policy.decide(&RequestFacts {
        host: &r.host,
        port: r.port,
        scheme,
        method: Some(&r.method),
        path: Some(&path.matching),
        agent,
    });
    let rpc = call
        .method
        .clone()
        .or_else(|| call.tool.as_ref().map(|_| "tools/call".to_string()))
        .unwrap_or_default();
    let shown = match &call.tool {
        Some(t) => format!("{rpc} {t:?}"),
        None => rpc.clone(),
    };
    let rule = r.rule_id.clone().unwrap_or_default();
    match (&d.mcp, r.decision) {
        (_, "deny") => {}
        (None, _) => r.explanation.push_str(&format!(
            "; rule {rule} has no `mcp`: MCP calls under it are not inspected"
        )),
        (Some(m), _) => {
            let refused = m
                .method(&rpc)
                .and_then(|()| call.tool.as_deref().map_or(Ok(()), |t| m.tool(t)));
            match refused {
                Ok(()) => r.explanation.push_str(&format!(
                    "; MCP {shown} is allowed by {} (pins aside)",
                    m.summary()
                )),
                Err(why) => {
                    r.decision = "deny";
                    r.explanation = format!(
                        "{shown} is not allowed by rule {rule} ({}): {}",
                        why.key(),
                        m.summary()
                    );
                }
            }
        }
    }
    r.mcp = Some(McpCall {
        method: Some(rpc),
        tool: call.tool.clone(),
    });
    Ok(r)
}

/// Decides `method url` (or `DNS name`) under `policy`; `denied` is how the stub answers a
/// name no rule allows (`dns.denied`).
pub fn check(
    policy: &Policy,
    method: &str,
    url: &str,
    agent: Option<u32>,
    denied: DeniedAnswer,
) -> Result<CheckResult, CheckError> {
    if method.eq_ignore_ascii_case("DNS") {
        return Ok(check_name(policy, url, agent, denied));
    }
    let uri: http::Uri = url.parse().map_err(|source| CheckError::Url {
        url: url.to_string(),
        source,
    })?;
    let scheme = match uri.scheme_str() {
        Some("https") => Scheme::Https,
        Some("http") => Scheme::Http,
        Some(other) => return Err(CheckError::Scheme(other.to_string())),
        None => return Err(CheckError::NotAbsolute(url.to_string())),
    };
    let auth = uri
        .authority()
        .ok_or_else(|| CheckError::NoHost(url.to_string()))?;
    if auth.as_str().contains('@') {
        return Err(CheckError::Userinfo);
    }
    let host = normalize_host(auth.host()).map_err(CheckError::Host)?;
    let port = auth.port_u16().unwrap_or(match scheme {
        Scheme::Https => 443,
        _ => 80,
    });
    let path = normalize_path(uri.path()).map_err(CheckError::Path)?;
    // A method is one token (RFC 9110): "G E T" is none, and no request could carry it.
    if http::Method::from_bytes(method.as_bytes()).is_err() {
        return Err(CheckError::Method(method.to_string()));
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
        decision: verdict(&d),
        reported_deny: d.reported_deny,
        rule_id: d.rule_id.as_deref().map(str::to_string),
        explanation: d.explanation.clone(),
        hint: hint(policy, &d, &host, agent, true),
        answer: None,
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
        mcp: None,
    })
}

fn verdict(d: &Decision) -> &'static str {
    match d.action {
        Action::Allow => "allow",
        Action::Deny => "deny",
        Action::Ask => "ask",
    }
}

/// A DNS question for `name`: `allow` when the stub would answer it (with what our resolver
/// says), `ask` when it answers with a synthetic address without asking anyone (the
/// connection waits for an operator), `deny` when it refuses it without asking anyone (a
/// synthetic address whose connections are refused, or NXDOMAIN: `denied`).
fn check_name(
    policy: &Policy,
    name: &str,
    agent: Option<u32>,
    denied: DeniedAnswer,
) -> CheckResult {
    let d = policy.decide_name(name, agent);
    let host = normalize_host(name).unwrap_or_else(|_| name.to_string());
    let answer = match (d.action, denied) {
        (Action::Allow, _) => "resolver",
        (Action::Ask, _) | (Action::Deny, DeniedAnswer::Synthetic) => "synthetic",
        (Action::Deny, DeniedAnswer::Nxdomain) => "nxdomain",
    };
    CheckResult {
        method: "DNS".into(),
        scheme: "dns",
        hint: hint(policy, &d, &host, agent, false),
        host,
        port: 53,
        path: String::new(),
        decision: verdict(&d),
        reported_deny: d.reported_deny,
        rule_id: d.rule_id.as_deref().map(str::to_string),
        explanation: d.explanation,
        answer: Some(answer),
        obligations: serde_json::Value::Null,
        policy_hash: policy.hash().to_string(),
        agent,
        mcp: None,
    }
}

/// For a refusal by the policy's default: the rule that covers `host` but not this request
/// (`request`: a URL was checked, not a name), else a rule for a domain above it, else how to
/// add one. `None` when a rule decided, or it was allowed.
fn hint(
    policy: &Policy,
    d: &Decision,
    host: &str,
    agent: Option<u32>,
    request: bool,
) -> Option<String> {
    let refused = d.action == Action::Deny || d.reported_deny;
    if !refused || d.rule_id.as_deref() != Some(crate::policy::DEFAULT_RULE) {
        return None;
    }
    let allowed_by = |name: &str| {
        let n = policy.decide_name(name, agent);
        (n.action != Action::Deny && !n.reported_deny)
            .then(|| n.rule_id.as_deref().map(str::to_string))
            .flatten()
            .filter(|r| r != crate::policy::DEFAULT_RULE)
    };
    if request {
        if let Some(rule) = allowed_by(host) {
            return Some(format!(
                "rule {rule} covers {host}, but not this request (its scheme, port, method or                  path differ): see `agenshield proxy ctl policy show`"
            ));
        }
    }
    let labels: Vec<&str> = host.split('.').collect();
    for start in 1..labels.len().saturating_sub(1) {
        let domain = labels[start..].join(".");
        if let Some(rule) = allowed_by(&domain) {
            return Some(format!(
                "no rule covers {host}; rule {rule} covers {domain} (add \"{host}\" or \
                 \"*.{domain}\" to its hosts to cover it)"
            ));
        }
    }
    Some(format!(
        "no rule covers {host} or a domain above it. To allow it, add a rule; `agenshield proxy \
         ctl policy suggest` drafts rules from the refusals in the audit log"
    ))
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
        let r = check(&p, "dns", "GitHub.com.", None, DeniedAnswer::Synthetic).expect("check");
        assert_eq!(
            (r.decision, r.host.as_str(), r.scheme),
            ("allow", "github.com", "dns")
        );
        assert_eq!(r.rule_id.as_deref(), Some("ssh"));
        assert_eq!(r.answer, Some("resolver"));
        let r = check(&p, "DNS", "exfil.evil.test", None, DeniedAnswer::Synthetic).expect("check");
        assert_eq!((r.decision, r.answer), ("deny", Some("synthetic")));
        let r = check(&p, "DNS", "exfil.evil.test", None, DeniedAnswer::Nxdomain).expect("check");
        assert_eq!(r.answer, Some("nxdomain"));
    }

    #[test]
    fn a_refusal_by_the_default_hints_at_the_nearest_rule_or_at_suggest() {
        let p = Policy::from_sources(&[PolicySource {
            name: "t.toml".into(),
            text: "version = 1\ndefault = \"deny\"\n[[rule]]\nid = \"gh\"\nhosts = [\"github.com\"]\nmethods = [\"GET\"]\naction = \"allow\"\n[[rule]]\nid = \"no-x\"\nhosts = [\"x.test\"]\naction = \"deny\"\n".into(),
        }])
        .expect("policy");
        let ask = |m: &str, url: &str| {
            check(&p, m, url, None, DeniedAnswer::Synthetic)
                .expect("check")
                .hint
                .unwrap_or_default()
        };
        let h = ask("POST", "https://github.com/x");
        assert!(
            h.contains("rule gh covers github.com, but not this request"),
            "{h}"
        );
        let h = ask("GET", "https://api.github.com/");
        assert!(
            h.contains("rule gh covers github.com") && h.contains("*.github.com"),
            "{h}"
        );
        let h = ask("GET", "https://unknown.test/");
        assert!(
            h.contains("no rule covers unknown.test") && h.contains("policy suggest"),
            "{h}"
        );
        assert!(ask("DNS", "api.github.com").contains("rule gh"));
        // A rule decided, or it was allowed: nothing to hint.
        assert_eq!(ask("GET", "https://x.test/"), "");
        assert_eq!(ask("GET", "https://github.com/"), "");
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
            let e =
                check(&p, bad, "https://x.test/", None, DeniedAnswer::Synthetic).expect_err(bad);
            assert!(
                e.to_string().contains("a method is one token, e.g. GET"),
                "{e}"
            );
        }
        let r =
            check(&p, "get", "https://x.test/", None, DeniedAnswer::Synthetic).expect("a token");
        assert_eq!(r.method, "GET");
        assert!(check(
            &p,
            "PROPFIND",
            "https://x.test/",
            None,
            DeniedAnswer::Synthetic
        )
        .is_ok());
    }
}
