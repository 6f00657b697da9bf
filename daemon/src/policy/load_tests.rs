//! Tests for loading from disk, file order, the hash, and the shipped default policy.

use std::path::Path;
use std::sync::Arc;

use super::super::eval::tests::http;
use super::super::{Action, Mode, Policy, PolicyError, PolicySource, RequestFacts, Scheme};
use super::load_files;

/// `policies/default.toml` at the workspace root, seen from the proxy crate (or from the
/// scratch crate this module was developed in).
fn default_policy_path() -> std::path::PathBuf {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    [
        "../policies/default.toml",
        "../../main/policies/default.toml",
    ]
    .iter()
    .map(|rel| here.join(rel))
    .find(|p| p.is_file())
    .expect("policies/default.toml not found")
}

fn write(dir: &Path, name: &str, text: &str) {
    std::fs::write(dir.join(name), text).unwrap_or_else(|e| panic!("{name}: {e}"));
}

fn load(dir: &Path) -> Result<Policy, String> {
    Policy::load_dir(dir).map_err(|e| e.to_string())
}

const ALLOW_ALL: &str =
    "version = 1\n[[rule]]\nid = \"all\"\nhosts = [\"*\"]\naction = \"allow\"\n";

#[test]
fn load_dir_picks_toml_files_in_name_order() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    assert_eq!(
        load(d).err(),
        Some(format!("no policy files in {}", d.display()))
    );
    write(d, "README.md", "not a policy");
    write(d, "a.toml~", "garbage");
    write(d, ".#b.toml", "garbage");
    write(d, ".hidden.toml", "garbage");
    std::fs::create_dir(d.join("sub.toml")).expect("mkdir");
    assert_eq!(
        load(d).err(),
        Some(format!("no policy files in {}", d.display()))
    );

    // b sorts after a: at equal priority a's allow comes first.
    let rule = |id: &str| {
        format!("[[rule]]\nid = \"{id}\"\nhosts = [\"x.example\"]\naction = \"allow\"\n")
    };
    write(d, "b.toml", &format!("version = 1\n{}", rule("from-b")));
    write(d, "a.toml", &format!("version = 1\n{}", rule("from-a")));
    let p = load(d).expect("loads");
    assert_eq!(p.rule_count(), 2);
    let req = http("GET", "x.example", 443, "/");
    assert_eq!(p.decide(&req).rule_id.as_deref(), Some("from-a"));

    write(d, "c.toml", "version = 1\nhots = 1\n");
    let e = load(d).expect_err("bad file");
    assert_eq!(
        e,
        format!(
            "{}:2:1: unknown field `hots`, expected one of `version`, `default`, `mode`, `rule`, `secrets`",
            d.join("c.toml").display()
        )
    );
    assert!(load(&d.join("missing"))
        .expect_err("missing")
        .starts_with("cannot read "));
}

#[test]
fn hash_is_stable_and_tracks_content() {
    let src = |name: &str, text: &str| PolicySource {
        name: name.into(),
        text: text.into(),
    };
    let h = |s: &[PolicySource]| Policy::from_sources(s).expect("compiles").hash().to_owned();
    let one = h(&[src("a.toml", ALLOW_ALL)]);
    assert!(
        one.starts_with("sha256:") && one.len() == "sha256:".len() + 16,
        "{one}"
    );
    assert!(one["sha256:".len()..]
        .bytes()
        .all(|b| b.is_ascii_hexdigit()));
    assert_eq!(one, h(&[src("a.toml", ALLOW_ALL)]));
    assert_ne!(one, h(&[src("a.toml", &format!("{ALLOW_ALL}# comment\n"))]));
    assert_ne!(one, h(&[src("b.toml", ALLOW_ALL)]));
    let empty = "version = 1\n";
    assert_ne!(
        h(&[src("a.toml", ALLOW_ALL), src("b.toml", empty)]),
        h(&[src("b.toml", empty), src("a.toml", ALLOW_ALL)])
    );

    let dir = tempfile::tempdir().expect("tempdir");
    write(dir.path(), "a.toml", ALLOW_ALL);
    let first = load(dir.path()).expect("loads").hash().to_owned();
    assert_eq!(first, load(dir.path()).expect("loads").hash());
    write(
        dir.path(),
        "a.toml",
        &ALLOW_ALL.replace("allow\"", "deny\""),
    );
    assert_ne!(first, load(dir.path()).expect("loads").hash());
}

#[test]
fn policy_is_send_sync() {
    fn check<T: Send + Sync + 'static>() {}
    check::<Policy>();
    check::<Arc<Policy>>();
    check::<PolicyError>();
}

#[test]
fn shipped_default_policy() {
    let text = std::fs::read_to_string(default_policy_path()).expect("read default.toml");
    let p = Policy::from_sources(&[PolicySource {
        name: "default.toml".into(),
        text,
    }])
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        (p.default_action(), p.mode(), p.rule_count()),
        (Action::Deny, Mode::Enforce, 5)
    );
    #[rustfmt::skip]
    let cases = [
        ("GET", "pypi.org", 443, "/simple/requests/", Some("pypi")),
        ("HEAD", "files.pythonhosted.org", 443, "/packages/x.whl", Some("pypi")),
        ("GET", "registry.npmjs.org", 443, "/left-pad", Some("npm")),
        ("GET", "static.crates.io", 443, "/crates/serde/serde-1.0.0.crate", Some("crates")),
        ("GET", "github.com", 443, "/o/r.git/info/refs", Some("github")),
        ("POST", "github.com", 443, "/o/r.git/git-upload-pack", Some("github-fetch")),
        ("GET", "raw.githubusercontent.com", 443, "/o/r/main/README.md", Some("github")),
        ("GET", "api.github.com", 443, "/repos/o/r", Some("github")),
    ];
    for (method, host, port, path, rule) in cases {
        let d = p.decide(&RequestFacts {
            host,
            port,
            scheme: Scheme::Https,
            method: Some(method),
            path: Some(path),
            agent: None,
        });
        assert_eq!(
            (d.action, d.rule_id.as_deref()),
            (Action::Allow, rule),
            "{}",
            d.explanation
        );
    }
    #[rustfmt::skip]
    let denied = [
        ("POST", "registry.npmjs.org", 443, "/-/npm/v1/security/audits"),
        ("GET", "pypi.org", 80, "/simple/"),
        ("GET", "example.com", 443, "/"),
        ("GET", "githubusercontent.com", 443, "/"),
        ("GET", "gist.github.com", 443, "/"),
        // Read-only GitHub: no push, no API write, no GraphQL, no upload.
        ("POST", "github.com", 443, "/o/r.git/git-receive-pack"),
        ("DELETE", "api.github.com", 443, "/repos/o/r"),
        ("POST", "api.github.com", 443, "/repos/o/r/issues"),
        ("POST", "api.github.com", 443, "/graphql"),
        ("PUT", "api.github.com", 443, "/repos/o/r/contents/f"),
        ("POST", "github.com", 443, "/o/r/git-upload-pack/x"),
    ];
    for (method, host, port, path) in denied {
        let d = p.decide(&RequestFacts {
            host,
            port,
            scheme: Scheme::Https,
            method: Some(method),
            path: Some(path),
            agent: None,
        });
        assert_eq!(
            (d.action, d.rule_id.as_deref()),
            (Action::Deny, Some("default")),
            "{}",
            d.explanation
        );
    }
    let ssh = RequestFacts {
        host: "github.com",
        port: 22,
        scheme: Scheme::Tcp,
        method: None,
        path: None,
        agent: None,
    };
    assert_eq!(p.decide(&ssh).action, Action::Deny);
    // Opaque TCP to an HTTPS-only host is not a way around interception.
    let raw_443 = RequestFacts { port: 443, ..ssh };
    assert_eq!(p.decide(&raw_443).action, Action::Deny);
    let https = RequestFacts {
        scheme: Scheme::Https,
        method: Some("GET"),
        path: Some("/"),
        ..raw_443
    };
    assert_eq!(p.decide(&https).rule_id.as_deref(), Some("github"));
}

#[test]
fn load_dir_reads_toml_then_json_then_custom_json() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    std::fs::create_dir(d.join("custom")).expect("mkdir");
    // Same host and priority everywhere: the first file in load order wins the tie.
    let json = |id: &str| {
        format!(
            r#"{{"rules": [{{"id": "{id}", "type": "allowlist", "patterns": ["x.example"], "enabled": true}}]}}"#
        )
    };
    write(&d.join("custom"), "a.json", &json("c"));
    write(&d.join("custom"), "z.toml", "not loaded");
    assert_eq!(load(d).expect("custom only").rule_count(), 1);
    write(d, "b.json", &json("j"));
    write(d, ".hidden.json", "garbage");
    write(
        d,
        "z.toml",
        "version = 1\n[[rule]]\nid = \"t\"\nhosts = [\"x.example\"]\naction = \"allow\"\n",
    );
    let p = load(d).expect("loads");
    assert_eq!(p.rule_count(), 3);
    let req = http("GET", "x.example", 443, "/");
    assert_eq!(p.decide(&req).rule_id.as_deref(), Some("t"));
    std::fs::remove_file(d.join("z.toml")).expect("rm");
    let p = load(d).expect("loads");
    assert_eq!(p.decide(&req).rule_id.as_deref(), Some("agenshield:b:j"));
    std::fs::remove_file(d.join("b.json")).expect("rm");
    let p = load(d).expect("loads");
    assert_eq!(
        p.decide(&req).rule_id.as_deref(),
        Some("agenshield:custom/a:c")
    );

    // Same stem and rule id at the top level and in custom/: distinct ids.
    write(d, "a.json", &json("c"));
    assert_eq!(load(d).expect("loads").rule_count(), 2);
    // A JSON error names the file and position.
    write(d, "bad.json", "{\n  \"rules\": 3\n}");
    let e = load(d).expect_err("bad json");
    assert_eq!(
        e,
        format!(
            "{}:2:12: invalid type: integer `3`, expected a sequence",
            d.join("bad.json").display()
        )
    );
}

#[test]
fn load_files_keeps_the_given_order() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let rule = |id: &str| {
        format!(
            "version = 1\n[[rule]]\nid = \"{id}\"\nhosts = [\"x.example\"]\naction = \"allow\"\n"
        )
    };
    write(d, "a.toml", &rule("a"));
    write(d, "b.toml", &rule("b"));
    let p = load_files(&[d.join("b.toml"), d.join("a.toml")]).expect("loads");
    let req = http("GET", "x.example", 1, "/");
    assert_eq!(p.decide(&req).rule_id.as_deref(), Some("b"));
    let e = load_files(&[d.join("missing.toml")]).expect_err("missing");
    assert!(matches!(e, PolicyError::Read { .. }), "{e}");
    assert!(matches!(
        load_files::<&Path>(&[]),
        Err(PolicyError::NoFiles { .. })
    ));
}

#[test]
fn hash_keeps_the_custom_prefix() {
    let text = r#"{"rules": []}"#;
    let h = |name: &str| {
        Policy::from_sources(&[PolicySource {
            name: name.into(),
            text: text.into(),
        }])
        .expect("compiles")
        .hash()
        .to_owned()
    };
    assert_eq!(h("/etc/p/custom/a.json"), h("/other/custom/a.json"));
    assert_ne!(h("/etc/p/custom/a.json"), h("/etc/p/a.json"));
    assert_eq!(h("/etc/p/a.json"), h("a.json"));
}
