//! `policy check METHOD URL`: what the policy decides for a URL, split the way the proxy
//! splits a real request (same host and path normalization, userinfo refused).

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
}

pub(crate) fn check(policy: &Policy, method: &str, url: &str) -> Result<CheckResult, String> {
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
    let method = method.to_ascii_uppercase();
    let d = policy.decide(&RequestFacts {
        host: &host,
        port,
        scheme,
        method: Some(&method),
        path: Some(&path.matching),
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
    })
}
