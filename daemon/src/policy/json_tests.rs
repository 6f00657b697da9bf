//! AgenShield `PolicyConfig` JSON: the shipped example decided over a URL table, the
//! mapping details, and errors with positions.

use std::path::{Path, PathBuf};

use super::super::{Action, Policy, PolicySource, RequestFacts, Scheme};

/// `policies/examples/agenshield-policy.json`, from the proxy crate or the scratch crate.
fn example_path() -> PathBuf {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    ["../policies", "../../main/policies"]
        .iter()
        .map(|rel| here.join(rel).join("examples/agenshield-policy.json"))
        .find(|p| p.is_file())
        .expect("policies/examples/agenshield-policy.json not found")
}

fn src(name: &str, text: &str) -> PolicySource {
    PolicySource {
        name: name.into(),
        text: text.into(),
    }
}

fn compile(sources: &[PolicySource]) -> Policy {
    Policy::from_sources(sources).unwrap_or_else(|e| panic!("{e}"))
}

fn err(text: &str) -> String {
    match Policy::from_sources(&[src("/p/a.json", text)]) {
        Ok(_) => panic!("expected an error for {text}"),
        Err(e) => e.to_string(),
    }
}

/// Decides `method scheme://host:port/path` (the URL already split).
fn decide(
    p: &Policy,
    method: &str,
    scheme: Scheme,
    host: &str,
    port: u16,
    path: &str,
) -> (Action, Option<String>) {
    let tcp = scheme == Scheme::Tcp;
    let d = p.decide(&RequestFacts {
        host,
        port,
        scheme,
        method: (!tcp).then_some(method),
        path: (!tcp).then_some(path),
        agent: None,
    });
    (d.action, d.rule_id.map(|r| r.to_string()))
}

#[test]
fn shipped_example_decides_as_documented() {
    use Action::{Allow, Ask, Deny};
    use Scheme::{Http, Https, Tcp};
    let p = super::super::load_files(&[example_path()]).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        (p.default_action(), p.rule_count(), p.ignored_rule_count()),
        (Deny, 10, 2)
    );
    let id = |s: &str| Some(format!("agenshield:agenshield-policy:{s}"));
    #[rustfmt::skip]
    let cases = [
        ("GET", Https, "api.github.com", 443, "/repos/o/r", Allow, id("github")),
        ("GET", Https, "api.github.com", 443, "/repos/o/r/hooks/1", Deny, id("github-admin")),
        ("GET", Https, "API.github.com", 443, "/REPOS/o/r/HOOKS/1", Deny, id("github-admin")),
        ("GET", Https, "raw.githubusercontent.com", 443, "/o/r/main/x", Allow, id("github")),
        ("POST", Https, "github.com", 443, "/o/r.git/git-upload-pack", Allow, id("github")),
        ("GET", Https, "github.com", 443, "/", Allow, id("github")),
        ("GET", Http, "github.com", 80, "/", Deny, Some("default".to_string())),
        ("GET", Https, "github.com", 8443, "/", Deny, id("allowedPorts")),
        ("POST", Https, "uploads.github.com", 443, "/repos/o/r/releases/1/assets", Ask, id("github-uploads")),
        ("PUT", Https, "registry.npmjs.org", 443, "/left-pad", Allow, id("npm")),
        ("GET", Https, "www.npmjs.org", 443, "/", Allow, id("allowedHosts")),
        ("GET", Https, "pypi.org", 443, "/simple/requests/", Allow, id("pypi")),
        ("GET", Https, "pypi.org", 443, "/account/login/", Allow, id("allowedHosts")),
        ("GET", Http, "pypi.org", 80, "/simple/", Allow, id("allowedHosts")),
        ("GET", Https, "files.pythonhosted.org", 443, "/packages/x.whl", Allow, id("pypi")),
        ("GET", Https, "pastebin.com", 443, "/raw/abc", Deny, id("paste-sites")),
        ("POST", Http, "www.pastebin.com", 80, "/", Deny, id("paste-sites")),
        ("PUT", Https, "0x0.st", 443, "/upload", Deny, id("paste-sites")),
        ("GET", Http, "169.254.169.254", 80, "/latest/meta-data/", Deny, id("deniedHosts")),
        ("GET", Https, "abc.ngrok.io", 443, "/", Deny, id("deniedHosts")),
        ("GET", Http, "localhost", 3000, "/api", Allow, id("builtin-allow-localhost")),
        ("GET", Https, "127.0.0.1", 3000, "/", Allow, id("builtin-allow-localhost")),
        ("GET", Http, "localhost", 8080, "/", Deny, id("allowedPorts")),
        ("GET", Https, "mirror.corp.example", 443, "/x", Deny, Some("default".to_string())),
        ("GET", Https, "example.com", 443, "/", Deny, Some("default".to_string())),
        ("-", Tcp, "github.com", 22, "", Deny, id("allowedPorts")),
        // Opaque TCP would bypass interception: allowedHosts grants HTTP(S) only.
        ("-", Tcp, "pypi.org", 443, "", Deny, Some("default".to_string())),
    ];
    for (method, scheme, host, port, path, action, rule) in cases {
        assert_eq!(
            decide(&p, method, scheme, host, port, path),
            (action, rule),
            "{method} {scheme}://{host}:{port}{path}"
        );
    }
}

#[test]
fn mapping_details() {
    let json = r#"{
      "defaultAction": "allow",
      "version": "1.0",
      "fsConstraints": {"allowedPaths": ["/tmp"], "deniedPatterns": []},
      "rules": [
        {"id": "any-op", "type": "denylist", "operations": ["*"], "patterns": ["https://x.example/private/*"], "enabled": true},
        {"id": "inferred", "type": "denylist", "patterns": ["y.example:8080"], "enabled": true, "scope": "agent"},
        {"id": "exec-only", "type": "denylist", "target": "command", "patterns": ["rm -rf /"], "enabled": true},
        {"id": "no-patterns", "type": "denylist", "operations": ["http_request"], "enabled": true},
        {"id": "wild", "action": "deny", "patterns": ["*://z.example/a/**", "https://[::1]:9/"], "enabled": true, "priority": -5}
      ]
    }"#;
    let net = r#"{"networkConstraints": {"deniedHosts": ["*"], "allowedHosts": ["ok.example", "*.ok.example"]}}"#;
    let toml = "version = 1\ndefault = \"allow\"\n";
    let p = compile(&[src("/etc/a.toml", toml), src("/etc/custom/more.json", json)]);
    assert_eq!((p.rule_count(), p.ignored_rule_count()), (3, 2));
    let id = |s: &str| Some(format!("agenshield:custom/more:{s}"));
    use Action::{Allow, Deny};
    use Scheme::{Http, Https, Tcp};
    #[rustfmt::skip]
    let cases = [
        ("GET", Https, "x.example", 443, "/private/k", Deny, id("any-op")),
        ("GET", Https, "x.example", 443, "/private/a/b", Allow, Some("default".to_string())),
        ("GET", Http, "y.example", 8080, "/", Deny, id("inferred")),
        ("-", Tcp, "y.example", 8080, "", Deny, id("inferred")),
        ("GET", Http, "z.example", 80, "/A/b/c", Deny, id("wild")),
        ("GET", Https, "z.example", 80, "/b", Allow, Some("default".to_string())),
        ("GET", Https, "::1", 9, "/", Deny, id("wild")),
    ];
    for (method, scheme, host, port, path, action, rule) in cases {
        assert_eq!(
            decide(&p, method, scheme, host, port, path),
            (action, rule),
            "{method} {scheme}://{host}:{port}{path}"
        );
    }
    // `deniedHosts: ["*"]` denies all but `allowedHosts`, which then allow (below other rules).
    let p = compile(&[src("/etc/net.json", net)]);
    let id = |s: &str| Some(format!("agenshield:net:{s}"));
    for (host, action, rule) in [
        ("ok.example", Allow, id("allowedHosts")),
        ("a.b.ok.example", Allow, id("allowedHosts")),
        ("nope.example", Deny, id("deniedHosts")),
        ("okxok.example", Deny, id("deniedHosts")),
    ] {
        assert_eq!(
            decide(&p, "GET", Https, host, 443, "/"),
            (action, rule),
            "{host}"
        );
    }
    assert!(p.http_rule_may_match(Some("ok.example"), 443));
}

#[test]
fn json_errors_have_positions() {
    #[rustfmt::skip]
    let cases = [
        ("{\"defaultAction\": \"maybe\"}", "/p/a.json:1:25: unknown variant `maybe`, expected `allow` or `deny`"),
        ("{\n  \"rules\": [{\"id\": 5}]\n}", "/p/a.json:2:20: invalid type: integer `5`, expected a string"),
        ("{\"rules\": [{\"id\": \"r\", \"type\": \"allowlist\", \"patterns\": []}]}", "/p/a.json:1:59: missing field `enabled`"),
        ("{\"rules\": [{\"id\": \"r\", \"type\": \"list\", \"enabled\": true}]}", "/p/a.json:1:37: unknown variant `list`"),
        ("{\"rules\": [{\"id\": \"r\", \"priority\": 1.5, \"enabled\": true}]}", "/p/a.json:1:38: invalid type: floating point `1.5`, expected i32"),
        ("{\"networkConstraints\": {\"allowedPorts\": [70000]}}", "/p/a.json:1:46: invalid value: integer `70000`, expected u16"),
        ("{\"networkConstraints\": {\"allowedPorts\": [0]}}", "/p/a.json:1:25: rule `agenshield:a:allowedPorts`: port 0 out of range 1..=65535"),
        ("[]", "/p/a.json: expected a JSON object (AgenShield PolicyConfig) at the top level"),
        ("", "/p/a.json:1:1: EOF while parsing a value"),
        ("{\"rules\": [[\"r\", \"allowlist\"]]}", "/p/a.json: `rules[0]` must be a JSON object"),
        ("{\"rules\": {}}", "/p/a.json:1:10: invalid type: map, expected a sequence"),
        ("{\"networkConstraints\": [[], [\"x\"]]}", "/p/a.json: `networkConstraints` must be a JSON object"),
        ("{\"rules\": [\n {\"id\": \"r\", \"type\": \"allowlist\", \"enabled\": true,\n  \"patterns\": [\"https://ok.example/\", \"ftp://x/\"]}]}", "/p/a.json:3:39: rule `agenshield:a:r`: invalid pattern \"ftp://x/\": unsupported scheme \"ftp\""),
        ("{\"rules\": [{\"id\": \"r\", \"type\": \"allowlist\", \"enabled\": true, \"patterns\": [\"https://a*b.example/\"]}]}", "/p/a.json:1:75: rule `agenshield:a:r`: invalid host pattern \"a*b.example\""),
        ("{\"rules\": [{\"id\": \"r\", \"type\": \"allowlist\", \"enabled\": true, \"patterns\": [\"https://x/a/../b\"]}]}", "/p/a.json:1:75: rule `agenshield:a:r`: path pattern \"/a/../b\" contains a \".\" or \"..\" segment"),
        ("{\"rules\": [{\"id\": \"r\", \"type\": \"allowlist\", \"action\": \"deny\", \"enabled\": true, \"patterns\": [\"x\"]}]}", "/p/a.json:1:19: rule `agenshield:a:r`: `type` and `action` disagree"),
        ("{\"rules\": [{\"id\": \"r\", \"enabled\": true, \"patterns\": [\"x\"]}]}", "rule `agenshield:a:r`: needs `type`"),
        ("{\"rules\": [{\"id\": \"a b\", \"type\": \"denylist\", \"enabled\": true, \"patterns\": [\"x\"]}]}", "/p/a.json:1:19: rule `agenshield:a:a b`: invalid id"),
        ("{\"rules\": [{\"id\": \"r\", \"type\": \"denylist\", \"enabled\": true, \"patterns\": [\"x\"]}, {\"id\": \"r\", \"type\": \"denylist\", \"enabled\": true, \"patterns\": [\"y\"]}]}", "/p/a.json:1:88: duplicate rule id `agenshield:a:r` (first defined at /p/a.json:1:19)"),
        ("{\"networkConstraints\": {\"deniedHosts\": [\"bad host\"]}}", "/p/a.json:1:41: rule `agenshield:a:deniedHosts`: invalid host \"bad host\""),
    ];
    for (text, want) in cases {
        let e = err(text);
        assert!(e.contains(want), "{text}\n got: {e}\nwant: {want}");
        assert!(!e.contains(" at line "), "{e}");
    }
}

#[test]
fn default_action_merges_with_toml() {
    let toml = src("/p/a.toml", "version = 1\ndefault = \"deny\"\n");
    let json = src("/p/b.json", "{\n  \"defaultAction\": \"allow\"\n}");
    let e = Policy::from_sources(&[toml.clone(), json])
        .err()
        .map(|e| e.to_string());
    assert_eq!(
        e.as_deref(),
        Some(
            "conflicting `default`: /p/a.toml:2:11 sets \"deny\" but /p/b.json:2:3 sets \"allow\""
        )
    );
    let agree = src("/p/b.json", "{\"defaultAction\": \"deny\", \"rules\": []}");
    assert_eq!(compile(&[toml, agree]).default_action(), Action::Deny);
}

/// A misspelt key must not silently change a decision: refused where it is, as in TOML.
#[test]
fn unknown_keys_are_refused_with_their_position() {
    let cases = [
        (
            r#"{"rules": [{"id": "a", "action": "deny", "patterns": ["x.test"], "enabled": true, "priorty": 9}]}"#,
            "unknown field `priorty`",
        ),
        (
            r#"{"defaultAction": "deny", "defualt": 1}"#,
            "unknown field `defualt`",
        ),
        (
            r#"{"networkConstraints": {"allowedHost": ["x.test"]}}"#,
            "unknown field `allowedHost`",
        ),
    ];
    for (json, says) in cases {
        let e = Policy::from_sources(&[PolicySource {
            name: "/etc/p.json".into(),
            text: json.into(),
        }])
        .expect_err(json)
        .to_string();
        assert!(
            e.starts_with("/etc/p.json:1:") && e.contains(says),
            "{json}: {e}"
        );
    }
}
