//! Tests for `decide` and `http_rule_may_match`: order, report mode, path tricks. Ask, obligations and
//! schemes: `matcher_tests.rs`; the (method, URL) table: `policy_tests.rs`; speed:
//! `benches/decide.rs`.

use super::super::{PathError, PolicySource, Scheme};
use super::*;

pub(crate) fn policy(text: &str) -> Policy {
    let src = PolicySource {
        name: "test.toml".into(),
        text: text.into(),
    };
    Policy::from_sources(&[src]).unwrap_or_else(|e| panic!("{e}"))
}

pub(crate) fn http<'a>(
    method: &'a str,
    host: &'a str,
    port: u16,
    path: &'a str,
) -> RequestFacts<'a> {
    RequestFacts {
        host,
        port,
        scheme: if port == 80 {
            Scheme::Http
        } else {
            Scheme::Https
        },
        method: Some(method),
        path: Some(path),
        agent: None,
    }
}

pub(crate) fn tcp(host: &str, port: u16) -> RequestFacts<'_> {
    RequestFacts {
        host,
        port,
        scheme: Scheme::Tcp,
        method: None,
        path: None,
        agent: None,
    }
}

const TABLE_POLICY: &str = include_str!("testdata/eval.toml");

#[test]
fn decision_table() {
    use Action::{Allow, Deny};
    let p = policy(TABLE_POLICY);
    assert_eq!(p.rule_count(), 13);
    #[rustfmt::skip]
    let cases: Vec<(RequestFacts<'_>, Action, Option<&str>)> = vec![
        (http("GET", "api.github.com", 443, "/repos/a/b"), Allow, Some("github-api")),
        (http("POST", "API.GitHub.com.", 443, "/repos/a/b/pulls"), Allow, Some("github-api")),
        (http("get", "api.github.com", 443, "/user"), Allow, Some("github-api")),
        (http("PUT", "api.github.com", 443, "/repos/a/b"), Deny, Some("default")),
        (http("GET", "api.github.com", 80, "/repos/a/b"), Deny, Some("default")),
        (http("GET", "api.github.com", 443, "/users/x"), Deny, Some("default")),
        (http("GET", "api.github.com", 443, "/repos"), Deny, Some("default")),
        // Equal priority: the deny wins although listed after the allow.
        (http("GET", "api.github.com", 443, "/repos/x/admin"), Deny, Some("gh-admin")),
        (http("GET", "api.github.com", 443, "/repos/x/admin/keys/1"), Deny, Some("gh-admin")),
        (http("GET", "api.github.com", 443, "/repos/x/y/admin"), Allow, Some("github-api")),
        // Leading wildcard: any depth, not the bare suffix.
        (http("GET", "raw.githubusercontent.com", 443, "/a"), Allow, Some("ghuc")),
        (http("GET", "a.b.githubusercontent.com", 443, "/a"), Allow, Some("ghuc")),
        (http("GET", "githubusercontent.com", 443, "/a"), Deny, Some("default")),
        (http("GET", "evilgithubusercontent.com", 443, "/a"), Deny, Some("default")),
        (http("GET", "raw.githubusercontent.com", 8443, "/a"), Deny, Some("default")),
        // Priorities: a specific allow above a wildcard deny.
        (http("GET", "ci.internal.example", 443, "/"), Allow, Some("ci-box")),
        (http("GET", "db.internal.example", 443, "/"), Deny, Some("internal-deny")),
        (tcp("db.internal.example", 5432), Deny, Some("internal-deny")),
        (http("GET", "tie.example", 443, "/"), Deny, Some("tie-deny")),
        // Same priority and action: file/rule order.
        (http("GET", "order.example", 443, "/"), Allow, Some("order-a")),
        (http("GET", "x.order.example", 443, "/"), Allow, Some("order-b")),
        // Raw TCP: host+port rules match, method/path rules cannot.
        (tcp("github.com", 22), Allow, Some("ssh-git")),
        // Rules without `schemes = ["tcp"]` never allow opaque TCP.
        (tcp("127.0.0.2", 8080), Deny, Some("default")),
        (tcp("github.com", 23), Deny, Some("default")),
        (tcp("api.github.com", 443), Deny, Some("default")),
        (tcp("docs.example.com", 443), Deny, Some("default")),
        (http("GET", "sub.tie.example", 443, "/"), Allow, Some("order-b")),
        (http("GET", "127.0.0.2", 8080, "/"), Allow, Some("loopback")),
        (http("GET", "[::1]", 8080, "/"), Allow, Some("loopback")),
        (http("GET", "::ffff:127.0.0.2", 8080, "/"), Allow, Some("loopback")),
        (tcp("127.0.0.1", 8080), Deny, Some("default")),
        (tcp("127.2", 8080), Deny, None),
        // Method deny at top priority; raw TCP is not over-denied by it.
        (http("DELETE", "api.github.com", 443, "/repos/a/b"), Deny, Some("no-delete")),
        (http("delete", "order.example", 443, "/"), Deny, Some("no-delete")),
        // Path globs: `*` stays within a segment.
        (http("GET", "docs.example.com", 443, "/index.html"), Allow, Some("docs-get")),
        (http("HEAD", "docs.example.com", 443, "/guide/intro"), Allow, Some("docs-get")),
        (http("GET", "docs.example.com", 443, "/a/index.html"), Deny, Some("default")),
        (http("GET", "nothing.test", 443, "/"), Deny, Some("default")),
        (http("GET", "bad host", 443, "/"), Deny, None),
        (http("GET", "api.github.com", 443, "/repos/%zz"), Deny, None),
    ];
    for (req, action, rule) in cases {
        let d = p.decide(&req);
        assert_eq!(
            (d.action, d.rule_id.as_deref()),
            (action, rule),
            "{req:?}: {}",
            d.explanation
        );
        assert!(!d.reported_deny);
    }
}

#[test]
fn explanations() {
    let p = policy(TABLE_POLICY);
    let d = p.decide(&http("GET", "API.github.com", 443, "/repos/x"));
    assert_eq!(
        d.explanation,
        "rule github-api (priority 100) allows GET api.github.com:443/repos/x"
    );
    let d = p.decide(&tcp("api.x.com", 443));
    assert_eq!(
        d.explanation,
        "no rule matched tcp api.x.com:443; default deny"
    );
    let d = p.decide(&tcp("::2", 22));
    assert_eq!(d.explanation, "no rule matched tcp [::2]:22; default deny");
    let d = p.decide(&http("DELETE", "a.b", 443, "/x"));
    assert_eq!(
        d.explanation,
        "rule no-delete (priority 1000) denies DELETE a.b:443/x"
    );
}

#[test]
fn default_allow_and_report_mode() {
    let allow = policy(
        "version = 1\ndefault = \"allow\"\n[[rule]]\nid = \"x\"\nhosts = [\"bad.example\"]\naction = \"deny\"\n",
    );
    assert_eq!(allow.default_action(), Action::Allow);
    let d = allow.decide(&http("GET", "good.example", 443, "/"));
    assert_eq!(
        (d.action, d.rule_id.as_deref()),
        (Action::Allow, Some("default"))
    );
    assert_eq!(
        d.explanation,
        "no rule matched GET good.example:443/; default allow"
    );
    let d = allow.decide(&tcp("bad.example", 1));
    assert_eq!((d.action, d.rule_id.as_deref()), (Action::Deny, Some("x")));

    let report = policy(&TABLE_POLICY.replace("mode = \"enforce\"", "mode = \"report\""));
    assert_eq!(report.mode(), Mode::Report);
    let d = report.decide(&http("GET", "tie.example", 443, "/"));
    assert_eq!(
        (d.action, d.reported_deny, d.rule_id.as_deref()),
        (Action::Allow, true, Some("tie-deny"))
    );
    assert!(
        d.explanation.ends_with("; allowed in report mode"),
        "{}",
        d.explanation
    );
    let d = report.decide(&http("GET", "nothing.test", 443, "/"));
    assert_eq!(
        (d.action, d.reported_deny, d.rule_id.as_deref()),
        (Action::Allow, true, Some("default"))
    );
    let d = report.decide(&http("GET", "order.example", 443, "/"));
    assert_eq!((d.action, d.reported_deny), (Action::Allow, false));
    // Unroutable input is denied even in report mode.
    let d = report.decide(&http("GET", "a..b", 443, "/"));
    assert_eq!((d.action, d.reported_deny), (Action::Deny, false));
}

#[test]
fn path_tricks_cannot_reach_denied_paths() {
    let p = policy(
        r#"
version = 1
[[rule]]
id = "all"
hosts = ["*"]
action = "allow"
[[rule]]
id = "admin"
hosts = ["*"]
paths = ["/admin", "/admin/**"]
action = "deny"
"#,
    );
    let tricks = [
        "/admin",
        "/admin/",
        "/admin/a",
        "/x/../admin/a",
        "/%61dmin/a",
        "/%61%64%6D%69%6E/a",
        "//admin//a",
        "/admin%2Fa",
        "/admin%2fa",
        "/admin%5Ca",
        "/admin\\a",
        "/./admin/a",
        "/%2e/admin/a",
        "/x/%2E%2E/admin/a",
        "/x/..%2Fadmin/a",
        "/x%2F..%2Fadmin",
        "/../../admin/a",
        "/admin/.",
        "/admin/a/..",
        "/x/y/../../admin/z",
    ];
    for raw in tricks {
        // Both as the proxy passes it (pre-normalized) and raw (caller forgot).
        let norm = match normalize_path(raw) {
            Ok(n) => n,
            // Refused outright (400 in the proxy): never reaches any rule.
            Err(PathError::EncodedDotSegment) => continue,
            Err(e) => panic!("{raw}: {e}"),
        };
        for path in [norm.matching.as_str(), raw] {
            let d = p.decide(&http("GET", "h.example", 443, path));
            assert_eq!(d.action, Action::Deny, "{raw} as {path}: {}", d.explanation);
            assert_eq!(d.rule_id.as_deref(), Some("admin"), "{raw}");
        }
    }
    for ok in ["/administrator", "/x/admin", "/admin.html", "/"] {
        let d = p.decide(&http("GET", "h.example", 443, ok));
        assert_eq!(d.action, Action::Allow, "{ok}");
    }
}

#[test]
fn many_matching_wildcards_keep_evaluation_order() {
    // 11 suffix patterns + exact + `*` all match: exercises the heap spill of the merge.
    let labels = ["a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k"];
    let host = format!("{}.example", labels.join("."));
    let mut text = String::from("version = 1\n");
    for (i, _) in labels.iter().enumerate().skip(1) {
        let suffix = format!("{}.example", labels[i..].join("."));
        text.push_str(&format!(
            "[[rule]]\nid = \"w{i}\"\nhosts = [\"*.{suffix}\"]\nports = [{i}]\naction = \"allow\"\npriority = {i}\n"
        ));
    }
    text.push_str("[[rule]]\nid = \"top\"\nhosts = [\"*.example\"]\nports = [99]\naction = \"deny\"\npriority = 99\n");
    text.push_str(&format!(
        "[[rule]]\nid = \"exact\"\nhosts = [\"{host}\"]\naction = \"allow\"\npriority = -1\n"
    ));
    text.push_str(
        "[[rule]]\nid = \"any\"\nhosts = [\"*\"]\nports = [7]\naction = \"deny\"\npriority = 7\n",
    );
    let p = policy(&text);
    for (port, want) in [
        (3, "w3"),
        (10, "w10"),
        (99, "top"),
        (7, "any"),
        (1234, "exact"),
    ] {
        // HTTPS: rules without `schemes` do not allow opaque TCP.
        let d = p.decide(&RequestFacts {
            scheme: Scheme::Https,
            method: Some("GET"),
            path: Some("/"),
            ..tcp(&host, port)
        });
        assert_eq!(
            d.rule_id.as_deref(),
            Some(want),
            "port {port}: {}",
            d.explanation
        );
    }
}

#[test]
fn http_rules_that_may_match_a_connection_are_found_before_it_speaks() {
    let p = policy(
        "version = 1\ndefault = \"deny\"\n\
         [[rule]]\nid = \"web\"\nhosts = [\"a.example\"]\nports = [443]\nmethods = [\"GET\"]\naction = \"allow\"\n\
         [[rule]]\nid = \"smtp\"\nhosts = [\"10.0.0.5\", \"mail.example\"]\nports = [25]\nschemes = [\"tcp\"]\naction = \"allow\"\n\
         [[rule]]\nid = \"no-admin\"\nhosts = [\"10.0.0.6\"]\nports = [80]\npaths = [\"/admin/**\"]\naction = \"deny\"\n\
         [[rule]]\nid = \"raw-80\"\nhosts = [\"10.0.0.6\"]\nports = [80]\nschemes = [\"tcp\"]\naction = \"allow\"\n",
    );
    // By name (CONNECT): the rules for that host.
    assert!(p.http_rule_may_match(Some("A.example."), 443));
    assert!(!p.http_rule_may_match(Some("a.example"), 8443));
    assert!(
        !p.http_rule_may_match(Some("mail.example"), 25),
        "only a tcp rule"
    );
    assert!(!p.http_rule_may_match(Some("nothing.test"), 443));
    assert!(!p.http_rule_may_match(Some("bad host"), 443));
    // By address (transparent): any rule for the port, its requests naming any host.
    assert!(p.http_rule_may_match(None, 443));
    assert!(
        !p.http_rule_may_match(None, 25),
        "only a tcp rule covers port 25"
    );
    // A deny for HTTP counts too: raw TCP allowed to 10.0.0.6:80 must not carry HTTP past it.
    assert!(p.http_rule_may_match(None, 80));
    // A default other than deny, or report mode, may always apply.
    let open = policy("version = 1\ndefault = \"allow\"\n");
    assert!(open.http_rule_may_match(None, 25));
    let report = policy(&TABLE_POLICY.replace("\"enforce\"", "\"report\""));
    assert!(report.http_rule_may_match(Some("nothing.test"), 443));
}

/// TRACE and TRACK echo the request back with whatever was added on the way (an injected key,
/// a corporate proxy's credentials): only a rule that names the method allows one, whatever
/// other rules and the default say.
#[test]
fn trace_is_refused_unless_a_rule_names_it() {
    let p = policy(
        r#"
version = 1
default = "allow"

[[rule]]
id = "any"
hosts = ["api.test"]
action = "allow"

[[rule]]
id = "diag"
hosts = ["diag.test"]
methods = ["GET", "TRACE"]
action = "allow"
"#,
    );
    for m in ["TRACE", "trace", "TRACK"] {
        let d = p.decide(&http(m, "api.test", 443, "/"));
        assert_eq!(d.action, Action::Deny, "{m} under an any-method rule");
        assert!(
            d.explanation.contains("echoes the request"),
            "{}",
            d.explanation
        );
        let d = p.decide(&http(m, "elsewhere.test", 443, "/"));
        assert_eq!(d.action, Action::Deny, "{m} under default allow");
    }
    assert_eq!(
        p.decide(&http("GET", "api.test", 443, "/")).action,
        Action::Allow
    );
    let d = p.decide(&http("TRACE", "diag.test", 443, "/"));
    assert_eq!(
        (d.action, d.rule_id.as_deref()),
        (Action::Allow, Some("diag"))
    );
    assert_eq!(
        p.decide(&http("TRACK", "diag.test", 443, "/")).action,
        Action::Deny
    );
}

#[test]
fn a_rule_with_methods_or_paths_constrains_its_hosts() {
    let p = policy(
        r#"
version = 1
default = "deny"

[[rule]]
id = "open"
hosts = ["open.test"]
action = "allow"

[[rule]]
id = "ro"
hosts = ["*.ro.test"]
methods = ["GET"]
action = "allow"

[[rule]]
id = "no-admin"
hosts = ["mixed.test"]
paths = ["/admin/**"]
action = "deny"

[[rule]]
id = "mixed"
hosts = ["mixed.test"]
action = "allow"
"#,
    );
    assert!(!p.constrains_request("open.test"));
    assert!(p.constrains_request("api.ro.test"));
    assert!(p.constrains_request("MIXED.test."));
    assert!(!p.constrains_request("unknown.test"));
}
