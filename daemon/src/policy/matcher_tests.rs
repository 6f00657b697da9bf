//! Rule features beyond hosts: ask ordering, obligations, schemes (and `http_rule_may_match` with them).

use super::super::eval::tests::{http, policy, tcp};
use super::super::{Action, Obligations, RequestFacts, Scheme};

#[test]
fn ask_sorts_between_deny_and_allow() {
    let rule = |id: &str, action: &str| {
        format!("[[rule]]\nid = \"{id}\"\nhosts = [\"x.example\"]\naction = \"{action}\"\n")
    };
    // File order allow, ask, deny: at equal priority the deny still wins, then the ask.
    let all = format!(
        "version = 1\n{}{}{}",
        rule("a", "allow"),
        rule("q", "ask"),
        rule("d", "deny")
    );
    let no_deny = format!("version = 1\n{}{}", rule("a", "allow"), rule("q", "ask"));
    let req = tcp("x.example", 1);
    assert_eq!(policy(&all).decide(&req).rule_id.as_deref(), Some("d"));
    let d = policy(&no_deny).decide(&req);
    assert_eq!((d.action, d.rule_id.as_deref()), (Action::Ask, Some("q")));
    assert_eq!(
        d.explanation,
        "rule q (priority 0) asks approval for tcp x.example:1"
    );
    // A higher-priority allow beats an ask.
    let hi = format!(
        "version = 1\n{}priority = 1\n{}",
        rule("a", "allow"),
        rule("q", "ask")
    );
    let https = RequestFacts {
        scheme: Scheme::Https,
        method: Some("GET"),
        path: Some("/"),
        ..req
    };
    assert_eq!(policy(&hi).decide(&https).action, Action::Allow);
    // Without `schemes = ["tcp"]` an allow rule does not cover opaque TCP: the ask stands.
    assert_eq!(policy(&hi).decide(&req).action, Action::Ask);
}

#[test]
fn obligations_ride_on_allow_and_ask_only() {
    let p = policy(
        r#"
version = 1
default = "allow"
[[rule]]
id = "limited"
hosts = ["api.example"]
action = "allow"
rate = { requests = 10, per = "second" }
max_concurrent = 3
[[rule]]
id = "held"
hosts = ["hold.example"]
action = "ask"
rate = { requests = 1, per = "1h", burst = 5 }
[[rule]]
id = "blocked"
hosts = ["api.example"]
paths = ["/secret/**"]
action = "deny"
"#,
    );
    let d = p.decide(&http("GET", "api.example", 443, "/x"));
    let rate = d.obligations.rate.expect("rate");
    assert_eq!(
        (rate.requests, rate.per, rate.burst),
        (10, std::time::Duration::from_secs(1), 10)
    );
    assert_eq!(d.obligations.max_concurrent, Some(3));
    assert!(
        d.explanation
            .ends_with("; rate 10 per 1s, burst 10; at most 3 concurrent per host"),
        "{}",
        d.explanation
    );
    let d = p.decide(&http("GET", "hold.example", 443, "/"));
    assert_eq!(d.action, Action::Ask);
    assert_eq!(
        d.obligations.rate.map(|r| (r.requests, r.burst)),
        Some((1, 5))
    );
    let d = p.decide(&http("GET", "api.example", 443, "/secret/k"));
    assert_eq!(
        (d.action, d.obligations),
        (Action::Deny, Obligations::default())
    );
    let d = p.decide(&http("GET", "other.example", 443, "/"));
    assert_eq!(
        (d.action, d.rule_id.as_deref(), d.obligations),
        (Action::Allow, Some("default"), Obligations::default())
    );
}

#[test]
fn schemes_restrict_and_http_rule_may_match_respects_them() {
    let p = policy(
        r#"
version = 1
[[rule]]
id = "web"
hosts = ["*.example"]
schemes = ["https", "http"]
action = "allow"
[[rule]]
id = "no-plain"
hosts = ["*.example"]
schemes = ["http"]
action = "deny"
priority = 5
[[rule]]
id = "held"
hosts = ["held.test"]
action = "ask"
"#,
    );
    let mut req = http("GET", "a.example", 443, "/");
    assert_eq!(p.decide(&req).rule_id.as_deref(), Some("web"));
    req.scheme = Scheme::Http;
    assert_eq!(p.decide(&req).rule_id.as_deref(), Some("no-plain"));
    assert_eq!(
        p.decide(&tcp("a.example", 443)).rule_id.as_deref(),
        Some("default")
    );
    // Rules for HTTP may match these hosts (an ask and a scheme-specific deny included).
    assert!(p.http_rule_may_match(Some("a.example"), 443));
    assert!(p.http_rule_may_match(Some("held.test"), 443));
    assert!(!p.http_rule_may_match(Some("other.test"), 443));
}
