//! The decision table: (method, URL) → (action, rule) over one TOML policy, with URLs split
//! the way the proxy splits a request, and the URL/path tricks that must not get past it.

use super::{normalize_host, normalize_path, Action, Decision, Mode, Policy};
use super::{PolicySource, RequestFacts, Scheme};

/// Every rule feature, deny/ask/allow ties, IDN; `testdata/table.toml`.
const POLICY: &str = include_str!("testdata/table.toml");

fn policy(text: &str) -> Policy {
    let src = PolicySource {
        name: "table.toml".into(),
        text: text.into(),
    };
    Policy::from_sources(&[src]).unwrap_or_else(|e| panic!("{e}"))
}

/// `scheme://authority/path?query#fragment` split as the proxy does: userinfo refused, host
/// through `normalize_host`, default port by scheme, path through `normalize_path`
/// (`matching` form). `tcp://host:port` stands for a raw TCP connection.
fn split(url: &str) -> Result<(Scheme, String, u16, Option<String>), String> {
    let (scheme, rest) = url.split_once("://").ok_or("not an absolute URL")?;
    let scheme = match scheme.to_ascii_lowercase().as_str() {
        "https" => Scheme::Https,
        "http" => Scheme::Http,
        "tcp" => Scheme::Tcp,
        other => return Err(format!("unsupported scheme {other}")),
    };
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    if authority.contains('@') {
        return Err("userinfo refused".into());
    }
    let (host, port) = match authority.rfind(':') {
        Some(i) if !authority[i..].contains(']') && authority.matches(':').count() == 1 => {
            (&authority[..i], Some(&authority[i + 1..]))
        }
        Some(i) if authority.starts_with('[') && authority[..i].ends_with(']') => {
            (&authority[..i], Some(&authority[i + 1..]))
        }
        _ => (authority, None),
    };
    let host = normalize_host(host).map_err(|e| e.to_string())?;
    let port = match (port, scheme) {
        (Some(p), _) => p.parse::<u16>().map_err(|e| e.to_string())?,
        (None, Scheme::Https) => 443,
        (None, Scheme::Http) => 80,
        (None, Scheme::Tcp) => return Err("tcp needs a port".into()),
    };
    if scheme == Scheme::Tcp {
        return Ok((scheme, host, port, None));
    }
    let path = tail.split(['?', '#']).next().unwrap_or_default();
    let path = if path.is_empty() { "/" } else { path };
    let path = normalize_path(path).map_err(|e| e.to_string())?;
    Ok((scheme, host, port, Some(path.matching)))
}

fn decide_url(p: &Policy, method: &str, url: &str) -> Result<Decision, String> {
    let (scheme, host, port, path) = split(url)?;
    Ok(p.decide(&RequestFacts {
        host: &host,
        port,
        scheme,
        method: (scheme != Scheme::Tcp).then_some(method),
        path: path.as_deref(),
        agent: None,
    }))
}

#[test]
fn decision_table() {
    use Action::{Allow, Ask, Deny};
    let p = policy(POLICY);
    assert_eq!(p.rule_count(), 21);
    #[rustfmt::skip]
    let cases: &[(&str, &str, Action, Option<&str>)] = &[
        ("GET", "https://api.github.com/repos/a/b", Allow, Some("gh-api")),
        ("POST", "https://API.GitHub.com./repos/a/b/pulls", Allow, Some("gh-api")),
        ("get", "https://api.github.com/user", Allow, Some("gh-api")),
        ("GET", "https://api.github.com:443/repos/a/b", Allow, Some("gh-api")),
        ("GET", "http://api.github.com/repos/a/b", Deny, Some("default")),
        ("GET", "https://api.github.com:8443/repos/a/b", Deny, Some("default")),
        ("GET", "https://api.github.com/users/x", Ask, Some("open-ask")),
        ("GET", "https://api.github.com/repos", Ask, Some("open-ask")),
        // Equal priority: deny before ask before allow, whatever the file order.
        ("GET", "https://api.github.com/repos/x/admin", Deny, Some("gh-admin")),
        ("GET", "https://api.github.com/repos/x/admin/keys/1", Deny, Some("gh-admin")),
        ("PATCH", "https://api.github.com/repos/x/admin", Deny, Some("gh-admin")),
        ("GET", "https://api.github.com/repos/x/y/admin", Allow, Some("gh-api")),
        ("PUT", "https://api.github.com/repos/a/b", Ask, Some("gh-write-ask")),
        ("DELETE", "https://api.github.com/repos/a/b", Deny, Some("no-delete")),
        ("POST", "https://tie.example/x", Deny, Some("tie-deny")),
        ("GET", "https://tie.example/", Ask, Some("tie-ask")),
        // Leading wildcards: any depth, never the bare suffix.
        ("GET", "https://raw.githubusercontent.com/o/r/main/x", Allow, Some("ghuc")),
        ("GET", "https://a.b.githubusercontent.com/x", Allow, Some("ghuc")),
        ("GET", "https://githubusercontent.com/x", Ask, Some("open-ask")),
        ("GET", "http://raw.githubusercontent.com/x", Deny, Some("default")),
        ("GET", "https://evilgithubusercontent.com/", Ask, Some("open-ask")),
        ("GET", "https://ci.internal.example/", Allow, Some("ci-box")),
        ("GET", "https://db.internal.example/", Deny, Some("internal-deny")),
        // Schemes and ports.
        ("GET", "http://legacy.example/", Allow, Some("plain-http")),
        ("GET", "http://legacy.example:8080/x", Allow, Some("plain-http")),
        ("GET", "https://legacy.example/", Ask, Some("open-ask")),
        ("GET", "http://legacy.example:8443/", Deny, Some("default")),
        ("GET", "https://github.com/o/r", Allow, Some("github-web")),
        ("POST", "https://github.com/o/r.git/git-receive-pack", Allow, Some("github-web")),
        ("GET", "http://github.com/", Deny, Some("default")),
        ("GET", "https://github.com:22/", Allow, Some("github-web")),
        ("-", "tcp://github.com:22", Allow, Some("ssh-git")),
        ("-", "tcp://github.com:443", Deny, Some("default")),
        ("-", "tcp://db.internal.example:5432", Deny, Some("internal-deny")),
        ("-", "tcp://evil.example:443", Deny, Some("evil")),
        // IDN: a rule written in Unicode or punycode matches either spelling.
        ("GET", "https://bücher.example/", Allow, Some("idn-unicode")),
        ("GET", "https://xn--bcher-kva.example/", Allow, Some("idn-unicode")),
        ("GET", "https://BÜCHER.example./", Allow, Some("idn-unicode")),
        ("GET", "https://www.café.example/menu", Allow, Some("idn-puny")),
        ("GET", "https://www.xn--caf-dma.example/", Allow, Some("idn-puny")),
        ("GET", "https://café.example/", Ask, Some("open-ask")),
        ("GET", "https://bucher.example/", Ask, Some("open-ask")),
        ("GET", "https://\u{ff45}\u{ff56}\u{ff49}\u{ff4c}.example/", Deny, Some("evil")),
        ("GET", "https://evil\u{3002}example/", Deny, Some("evil")),
        // IP literals.
        ("GET", "http://127.0.0.2:8080/", Allow, Some("loopback")),
        ("GET", "http://[::1]:3000/x", Allow, Some("loopback")),
        ("GET", "http://[::ffff:127.0.0.2]/", Allow, Some("loopback")),
        ("GET", "http://127.0.0.1/", Deny, Some("default")),
        // Methods and path globs.
        ("GET", "https://docs.example.com/index.html", Allow, Some("docs")),
        ("HEAD", "https://docs.example.com/guide/intro", Allow, Some("docs")),
        ("GET", "https://docs.example.com/a/index.html", Ask, Some("open-ask")),
        ("POST", "https://docs.example.com/index.html", Deny, Some("default")),
        ("GET", "https://docs.example.com/admin/x", Deny, Some("admin-everywhere")),
        ("GET", "https://api.github.com/admin", Deny, Some("admin-everywhere")),
        ("GET", "https://evil.example/", Deny, Some("evil")),
        ("GET", "https://x.y.evil.example/", Deny, Some("evil")),
        ("GET", "https://pkg.example/a?q=1#f", Allow, Some("pkg")),
        ("GET", "https://PKG.Example.:443/a", Allow, Some("pkg")),
        ("GET", "https://pkg.example:444/a", Deny, Some("default")),
        ("DELETE", "https://pkg.example/a", Deny, Some("no-delete")),
        ("GET", "https://unknown.test/", Ask, Some("open-ask")),
        ("POST", "https://unknown.test/", Deny, Some("default")),
    ];
    assert!(cases.len() >= 50);
    for &(method, url, action, rule) in cases {
        let d = decide_url(&p, method, url).unwrap_or_else(|e| panic!("{url}: {e}"));
        assert_eq!(
            (d.action, d.rule_id.as_deref()),
            (action, rule),
            "{method} {url}: {}",
            d.explanation
        );
        assert!(!d.reported_deny);
        // Obligations only ride on allow and ask decisions.
        if action == Deny {
            assert!(d.obligations.is_empty(), "{url}");
        }
    }
    let d = decide_url(&p, "PUT", "https://api.github.com/repos/a/b").expect("valid");
    assert_eq!(
        (d.obligations.max_concurrent, d.obligations.rate),
        (Some(2), None)
    );
    assert!(d.needs_approval() && !d.is_allowed());
    let d = decide_url(&p, "GET", "https://raw.githubusercontent.com/x").expect("valid");
    let rate = d.obligations.rate.expect("rate");
    assert_eq!(
        (rate.requests, rate.per.as_secs(), rate.burst),
        (60, 60, 10)
    );
    assert_eq!(
        d.explanation,
        "rule ghuc (priority 0) allows GET raw.githubusercontent.com:443/x; rate 60 per 1m, burst 10"
    );
}

#[test]
fn report_mode_lets_denies_and_asks_through() {
    let p = policy(&POLICY.replace("mode = \"enforce\"", "mode = \"report\""));
    assert_eq!(p.mode(), Mode::Report);
    let cases = [
        ("GET", "https://evil.example/", Some("evil"), true),
        (
            "PUT",
            "https://api.github.com/repos/a/b",
            Some("gh-write-ask"),
            true,
        ),
        ("GET", "https://tie.example/", Some("tie-ask"), true),
        ("POST", "https://unknown.test/", Some("default"), true),
        ("GET", "https://pkg.example/", Some("pkg"), false),
    ];
    for (method, url, rule, reported) in cases {
        let d = decide_url(&p, method, url).expect("valid");
        assert_eq!(
            (d.action, d.rule_id.as_deref(), d.reported_deny),
            (Action::Allow, rule, reported),
            "{url}"
        );
        assert_eq!(
            d.explanation.ends_with("; allowed in report mode"),
            reported
        );
    }
    let d = decide_url(&p, "PUT", "https://api.github.com/repos/a/b").expect("valid");
    assert!(
        d.explanation.contains("would ask approval for PUT"),
        "{}",
        d.explanation
    );
    assert_eq!(d.obligations.max_concurrent, Some(2));
    // Unroutable input is denied even in report mode.
    let d = p.decide(&RequestFacts {
        host: "a..b",
        port: 443,
        scheme: Scheme::Https,
        method: Some("GET"),
        path: Some("/"),
        agent: None,
    });
    assert_eq!((d.action, d.reported_deny), (Action::Deny, false));
}

#[test]
fn url_tricks_cannot_reach_what_a_rule_denies() {
    let p = policy(POLICY);
    // pkg.example allows everything on 443 but `/admin` (admin-everywhere, priority 500).
    let paths = [
        "/admin",
        "/admin/",
        "/a/../admin",
        "/a/b/../../admin/x",
        "//admin",
        "//admin//x",
        "/%2e%2e/admin",
        "/x/%2E%2E/admin/y",
        "/x/..%2Fadmin",
        "/x%2F..%2Fadmin",
        "/admin%2Fsecret",
        "/admin%2fsecret",
        "/%61dmin",
        "/%61%64%6D%69%6E/x",
        "/admin%5Cx",
        "/./admin",
        "/%2e/admin",
        "/admin/.",
        "/admin/x/..",
        "/../../admin",
        // Segment parameters, as Tomcat, Jetty and Spring drop them.
        "/admin;jsessionid=1/x",
        "/admin;/x",
        "/admin;",
        "/admin%3Bx/y",
        "/public/..;/admin/x",
        "/x/..%3B/admin",
    ];
    for path in paths {
        for host in ["pkg.example", "PKG.example.", "pkg.example:443"] {
            let url = format!("https://{host}{path}");
            let d = match decide_url(&p, "GET", &url) {
                Ok(d) => d,
                // Refused outright (400 in the proxy): never reaches any rule.
                Err(e) if e.contains("encoded separator") => continue,
                Err(e) => panic!("{url}: {e}"),
            };
            assert_eq!(
                (d.action, d.rule_id.as_deref()),
                (Action::Deny, Some("admin-everywhere")),
                "{url}: {}",
                d.explanation
            );
        }
    }
    for ok in [
        "/administrator",
        "/x/admin",
        "/admin.html",
        "/",
        "/x%3Fadmin",
        "/x;admin",
    ] {
        let d = decide_url(&p, "GET", &format!("https://pkg.example{ok}")).expect("valid");
        assert_eq!(d.action, Action::Allow, "{ok}");
    }
    // Host spellings of a denied host, and URLs that hide it.
    for url in [
        "https://EVIL.example./",
        "https://evil.example:443/",
        "https://evil.example#@pkg.example/",
        "https://evil.example?@pkg.example/",
        "https://www.EVIL.example./x",
    ] {
        let d = decide_url(&p, "GET", url).expect("valid");
        assert_eq!(d.rule_id.as_deref(), Some("evil"), "{url}");
        assert_eq!(d.action, Action::Deny, "{url}");
    }
    for refused in [
        "https://pkg.example@evil.example/",
        "https://user:pw@evil.example/",
        "https://pkg.example%2F@evil.example/",
        "https://pkg.example%2eevil.example/",
        "https://evil.example:99999/",
        "https://pkg.example/%zz",
    ] {
        assert!(decide_url(&p, "GET", refused).is_err(), "{refused}");
    }
}

/// One run of lint shows every rule that needs fixing, each where it is, in file order.
#[test]
fn every_bad_rule_of_a_file_is_reported() {
    let text = "version = 1\n\
                [[rule]]\nid = \"bad id!\"\nhosts = [\"a.test\"]\naction = \"allow\"\n\
                [[rule]]\nid = \"ok\"\nhosts = [\"b.test\"]\naction = \"allow\"\n\
                [[rule]]\nid = \"two\"\nhosts = [\"*x.test\"]\naction = \"allow\"\n\
                [[rule]]\nid = \"three\"\nhosts = [\"c.test\"]\naction = \"maybe\"\n\
                [[rule]]\nid = \"ok\"\nhosts = [\"d.test\"]\naction = \"allow\"\n";
    let e = Policy::from_sources(&[PolicySource {
        name: "/p/many.toml".into(),
        text: text.into(),
    }])
    .expect_err("four bad rules")
    .to_string();
    let lines: Vec<&str> = e.lines().collect();
    assert_eq!(
        lines.len(),
        1,
        "the id error (the file's shape, checked first): {e}"
    );
    // Ids first (the file's shape), then, once they are fixed, the rules' contents.
    assert!(
        lines[0].starts_with("/p/many.toml:3:") && lines[0].contains("invalid id"),
        "{e}"
    );
    let fixed = text.replace("bad id!", "one");
    let e = Policy::from_sources(&[PolicySource {
        name: "/p/many.toml".into(),
        text: fixed,
    }])
    .expect_err("three bad rules")
    .to_string();
    let lines: Vec<&str> = e.lines().collect();
    assert_eq!(lines.len(), 3, "{e}");
    assert!(
        lines[0].starts_with("/p/many.toml:12:") && lines[0].contains("rule `two`"),
        "{e}"
    );
    assert!(
        lines[1].starts_with("/p/many.toml:17:") && lines[1].contains("unknown action"),
        "{e}"
    );
    assert!(lines[2].contains("duplicate rule id `ok`"), "{e}");
}

#[test]
fn a_fleet_rate_needs_a_store_and_the_error_names_the_rule() {
    let text = "version = 1\n\n[[rule]]\nid = \"shared-api\"\nhosts = [\"api.example.com\"]\n\
                action = \"allow\"\nrate = { requests = 5, per = \"1m\", scope = \"fleet\" }\n\n\
                [[rule]]\nid = \"local-api\"\nhosts = [\"b.example.com\"]\naction = \"allow\"\n\
                rate = { requests = 5, per = \"1m\" }\n";
    let p = policy(text);
    assert!(p.has_fleet_rules());
    p.check_fleet(true).expect("with a store");
    let e = p.check_fleet(false).expect_err("no store").to_string();
    assert!(e.starts_with("table.toml:7:"), "{e}");
    assert!(
        e.contains("shared-api") && e.contains("[ratelimit] store"),
        "{e}"
    );
    let d = decide_url(&p, "GET", "https://api.example.com/").expect("valid");
    assert_eq!(
        d.obligations.rate.map(|r| r.scope),
        Some(super::RateScope::Fleet)
    );
    let d = decide_url(&p, "GET", "https://b.example.com/").expect("valid");
    assert_eq!(
        d.obligations.rate.map(|r| r.scope),
        Some(super::RateScope::Local)
    );
    let local_only =
        policy("version = 1\n[[rule]]\nid = \"x\"\nhosts = [\"x.test\"]\naction = \"allow\"\n");
    assert!(!local_only.has_fleet_rules());
    local_only.check_fleet(false).expect("nothing fleet-wide");
}

#[test]
fn a_secret_rate_cannot_be_fleet_wide() {
    let text = "version = 1\n[[rule]]\nid = \"k\"\nhosts = [\"k.test\"]\naction = \"allow\"\n\
                inject = [{ header = \"Authorization\", value = \"Bearer ${secret:key}\" }]\n\
                [secrets.key]\nrate = { requests = 5, per = \"1m\", scope = \"fleet\" }\n";
    let src = PolicySource {
        name: "table.toml".into(),
        text: text.into(),
    };
    let e = Policy::from_sources(&[src])
        .expect_err("refused")
        .to_string();
    assert!(
        e.contains("[secrets.key]") && e.contains("rule's rate only"),
        "{e}"
    );
}
