//! Load-time errors: positions, rule validation, cross-file conflicts.

use super::super::{Policy, PolicySource};
use super::*;

fn src(name: &str, text: &str) -> PolicySource {
    PolicySource {
        name: name.into(),
        text: text.into(),
    }
}

fn err(sources: &[PolicySource]) -> String {
    match Policy::from_sources(sources) {
        Ok(_) => panic!("expected an error"),
        Err(e) => e.to_string(),
    }
}

fn err1(text: &str) -> String {
    err(&[src("/p/a.toml", text)])
}

const RULE: &str = "[[rule]]\nid = \"r\"\nhosts = [\"a.example\"]\naction = \"allow\"\n";

#[test]
fn syntax_and_schema_errors_have_positions() {
    let e = err1("version = 1\n\n[[rule]]\nid = \"r\"\nhosts = [\"a\"\naction = \"allow\"\n");
    assert!(e.starts_with("/p/a.toml:6:1: "), "{e}");
    assert!(!e.contains('\n'), "{e}");
    let e = err1("version = 1\n[[rule]]\nid = \"r\"\nhots = [\"a\"]\naction = \"allow\"\n");
    assert!(
        e.starts_with("/p/a.toml:4:1: unknown field `hots`, expected one of"),
        "{e}"
    );
    let e = err1("version = 1\nfoo = 2\n");
    assert!(e.starts_with("/p/a.toml:2:1: unknown field `foo`"), "{e}");
    let e = err1("version = 1\n[[rule]]\nid = \"r\"\naction = \"allow\"\n");
    assert!(e.contains("/p/a.toml:2:1: missing field `hosts`"), "{e}");
    let e = err1("version = 1\nmode = \"loud\"\n");
    assert!(
        e.starts_with("/p/a.toml:2:8: unknown variant `loud`"),
        "{e}"
    );
    let e = err1(&format!("version = 1\n{RULE}priority = 3000000000\n"));
    assert!(e.starts_with("/p/a.toml:6:12: "), "{e}");
}

#[test]
fn version() {
    assert_eq!(
        err1(RULE),
        "/p/a.toml: missing `version` (expected `version = 1`)"
    );
    assert_eq!(
        err1("version = 2\n"),
        "/p/a.toml:1:11: unsupported version 2 (expected 1)"
    );
}

#[test]
fn rule_errors() {
    let cases = [
        ("hosts = [\"a*.b\"]", "6:10: rule `x`: invalid host pattern \"a*.b\": wildcards are only allowed"),
        ("hosts = [\"a.*.c\"]", "6:10: rule `x`: invalid host pattern \"a.*.c\""),
        ("hosts = []", "6:9: rule `x`: `hosts` must not be empty"),
        ("hosts = [\"a b\"]", "6:10: rule `x`: invalid host \"a b\": invalid character ' ' in host"),
        ("action = \"Allow\"", "6:10: rule `x`: unknown action \"Allow\", expected \"allow\", \"deny\" or \"ask\""),
        ("rate = { per_minute = 10 }", "6:10: unknown field `per_minute`, expected one of `requests`, `per`, `burst`"),
        ("rate = 5", "6:8: invalid type: integer `5`, expected struct RateFile"),
        ("rate = { requests = 0, per = \"1m\" }", "6:21: rule `x`: `rate.requests` must be between 1 and 1000000, not 0"),
        ("rate = { requests = 2000000, per = \"1m\" }", "6:21: rule `x`: `rate.requests` must be between 1"),
        ("rate = { requests = 5, per = \"1.5m\" }", "6:30: rule `x`: invalid `rate.per` \"1.5m\": use a whole number with a unit"),
        ("rate = { requests = 5, per = \"0s\" }", "6:30: rule `x`: `rate.per` \"0s\" must be between 1s and 24h"),
        ("rate = { requests = 5, per = \"2d\" }", "6:30: rule `x`: invalid `rate.per` \"2d\""),
        ("rate = { requests = 5, per = \"1m\", burst = 0 }", "6:44: rule `x`: `rate.burst` = 0 would refuse every request"),
        ("rate = { requests = 5, per = \"1m\", burst = -1 }", "6:44: rule `x`: `rate.burst` must be between 1"),
        ("rate = { requests = 5, per = \"1m\" }\naction = \"deny\"", "6:8: rule `x`: `rate` applies only to \"allow\" and \"ask\" rules"),
        ("max_concurrent = 0", "6:18: rule `x`: `max_concurrent` must be between 1 and 100000, not 0"),
        ("max_concurrent = 4\naction = \"deny\"", "6:18: rule `x`: `max_concurrent` applies only to \"allow\" and \"ask\" rules"),
        ("schemes = [\"ftp\"]", "6:12: rule `x`: unknown scheme \"ftp\", expected \"http\", \"https\" or \"tcp\""),
        ("schemes = []", "6:11: rule `x`: `schemes` must not be empty (omit the key to match any)"),
        ("schemes = [\"tcp\"]\nmethods = [\"GET\"]", "6:11: rule `x`: schemes = [\"tcp\"] with `methods` or `paths` can never match"),
        ("hosts = [\"xn--zz.example\"]", "6:10: rule `x`: invalid host \"xn--zz.example\": invalid internationalized domain name"),
        ("hosts = [\"*.bücher..example\"]", "6:10: rule `x`: invalid host pattern \"*.bücher..example\": empty label in host"),
        ("ports = [0]", "6:10: rule `x`: port 0 out of range 1..=65535"),
        ("ports = [443, 70000]", "6:15: rule `x`: port 70000 out of range"),
        ("ports = []", "6:9: rule `x`: `ports` must not be empty (omit the key to match any)"),
        ("methods = [\"GE T\"]", "6:12: rule `x`: invalid HTTP method \"GE T\""),
        ("paths = [\"admin/**\"]", "6:10: rule `x`: path pattern \"admin/**\" must start with \"/\""),
        ("paths = [\"/a/[b\"]", "6:10: rule `x`: invalid path glob \"/a/[b\": unclosed character class"),
        ("paths = [\"/a//b\"]", "6:10: rule `x`: path pattern \"/a//b\" contains \"//\""),
        ("paths = [\"/a/../b\"]", "6:10: rule `x`: path pattern \"/a/../b\" contains a \".\" or \"..\" segment"),
        ("paths = [\"/%61\"]", "6:10: rule `x`: path pattern \"/%61\" contains %61; request paths are matched decoded, write 'a' instead"),
        ("paths = [\"/%c3%a9\"]", "6:10: rule `x`: path pattern \"/%c3%a9\": write percent-escapes with uppercase hex"),
        ("paths = [\"/%zz\"]", "6:10: rule `x`: path pattern \"/%zz\" has an invalid percent-escape"),
        ("paths = [\"/%+1\"]", "6:10: rule `x`: path pattern \"/%+1\" has an invalid percent-escape"),
    ];
    for (line, want) in cases {
        let keys: Vec<&str> = line.lines().filter_map(|l| l.split(' ').next()).collect();
        // Replace the same keys if the base rule has them, else append.
        let base = [
            "id = \"x\"",
            "hosts = [\"a.example\"]",
            "action = \"allow\"",
        ];
        let mut lines = vec!["version = 1", "", "[[rule]]"];
        lines.extend(
            base.iter()
                .filter(|l| !keys.iter().any(|k| l.starts_with(&format!("{k} ")))),
        );
        lines.insert(5, line);
        let text = lines.join("\n") + "\n";
        let e = err1(&text);
        assert!(
            e.starts_with(&format!("/p/a.toml:{want}")),
            "{line}\n got: {e}\n{text}"
        );
    }
    let e = err1("version = 1\n[[rule]]\nid = \"a/b\"\nhosts = [\"*\"]\naction = \"allow\"\n");
    assert!(
        e.starts_with("/p/a.toml:3:6: rule `a/b`: invalid id"),
        "{e}"
    );
    let long = "x".repeat(65);
    let e = err1(&format!(
        "version = 1\n[[rule]]\nid = \"{long}\"\nhosts = [\"*\"]\naction = \"allow\"\n"
    ));
    assert!(e.contains("invalid id"), "{e}");
}

#[test]
fn cross_file_errors() {
    let a = src(
        "/p/a.toml",
        &format!("version = 1\ndefault = \"deny\"\n{RULE}"),
    );
    let b = src("/p/b.toml", &format!("version = 1\n\n{RULE}"));
    assert_eq!(
        err(&[a.clone(), b]),
        "/p/b.toml:4:6: duplicate rule id `r` (first defined at /p/a.toml:4:6)"
    );
    let c = src("/p/c.toml", "version = 1\ndefault = \"allow\"\n");
    assert_eq!(
        err(&[a.clone(), c]),
        "conflicting `default`: /p/a.toml:2:11 sets \"deny\" but /p/c.toml:2:11 sets \"allow\""
    );
    let d = src("/p/d.toml", "version = 1\nmode = \"enforce\"\n");
    let e = src("/p/e.toml", "version = 1\nmode = \"report\"\n");
    let msg = err(&[d, a.clone(), e]);
    assert!(
        msg.starts_with("conflicting `mode`: /p/d.toml:2:8"),
        "{msg}"
    );
    // Agreeing or omitted settings merge fine.
    let f = src("/p/f.toml", "version = 1\ndefault = \"deny\"\n");
    let p = Policy::from_sources(&[a, f]).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        (p.default_action(), p.mode()),
        (Action::Deny, Mode::Enforce)
    );
    assert_eq!(err(&[]), "no policy files in (no sources given)");
}
