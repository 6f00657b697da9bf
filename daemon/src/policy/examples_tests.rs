//! The example policies in `policies/examples/*.toml`, one per service agents use: each
//! loads on its own and with the others, and decides its service's typical requests as its
//! comments say (downloads allowed, uploads and other hosts not).

use std::path::{Path, PathBuf};

use super::{Action, Policy, PolicySource, RequestFacts, Scheme};

fn examples() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../policies/examples");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("policies/examples")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "toml"))
        .collect();
    files.sort();
    files
}

fn source(path: &Path) -> PolicySource {
    PolicySource {
        name: path.display().to_string(),
        text: std::fs::read_to_string(path).expect("read example"),
    }
}

fn decide(p: &Policy, method: &str, host: &str, path: &str) -> (Action, Option<String>) {
    let d = p.decide(&RequestFacts {
        host,
        port: 443,
        scheme: Scheme::Https,
        method: Some(method),
        path: Some(path),
        agent: None,
    });
    (d.action, d.rule_id.map(|r| r.to_string()))
}

#[test]
fn every_example_loads_alone_and_together_and_decides_its_service() {
    let files = examples();
    let names: Vec<String> = files
        .iter()
        .map(|f| f.file_stem().expect("stem").to_string_lossy().into_owned())
        .collect();
    for want in [
        "openai",
        "anthropic",
        "github",
        "huggingface",
        "docker-hub",
        "go-modules",
        "crates-io",
        "rubygems",
        "maven-central",
    ] {
        assert!(
            names.iter().any(|n| n == want),
            "policies/examples/{want}.toml"
        );
    }
    for f in &files {
        if let Err(e) = Policy::from_sources(&[source(f)]) {
            panic!("{}: {e}", f.display());
        }
    }
    let mut all: Vec<PolicySource> = files.iter().map(|f| source(f)).collect();
    all.insert(
        0,
        PolicySource {
            name: "base.toml".into(),
            text: "version = 1\ndefault = \"deny\"\n".into(),
        },
    );
    let p = Policy::from_sources(&all).expect("the examples together");
    let allow = |m: &str, h: &str, path: &str, rule: &str| {
        assert_eq!(
            decide(&p, m, h, path),
            (Action::Allow, Some(rule.to_string())),
            "{m} {h}{path}"
        );
    };
    allow("POST", "api.openai.com", "/v1/chat/completions", "openai");
    allow("POST", "api.anthropic.com", "/v1/messages", "anthropic");
    allow("GET", "api.github.com", "/repos/a/b", "github-api");
    allow(
        "POST",
        "github.com",
        "/a/b.git/git-upload-pack",
        "github-git",
    );
    allow("GET", "github.com", "/a/b/info/refs", "github-git");
    allow("GET", "huggingface.co", "/api/models/x", "huggingface");
    allow(
        "GET",
        "registry-1.docker.io",
        "/v2/library/alpine/manifests/latest",
        "docker-hub",
    );
    allow(
        "GET",
        "proxy.golang.org",
        "/golang.org/x/net/@v/list",
        "go-proxy",
    );
    allow("GET", "index.crates.io", "/se/rd/serde", "crates-io");
    allow("GET", "rubygems.org", "/api/v1/gems/rails.json", "rubygems");
    allow(
        "GET",
        "repo.maven.apache.org",
        "/maven2/junit/junit/4.13/junit-4.13.pom",
        "maven-central",
    );
    let deny = |m: &str, h: &str, path: &str| {
        assert_eq!(decide(&p, m, h, path).0, Action::Deny, "{m} {h}{path}");
    };
    deny("PUT", "registry-1.docker.io", "/v2/x/blobs/uploads/");
    deny("PUT", "crates.io", "/api/v1/crates/new");
    deny("GET", "api.openai.com", "/dashboard");
    deny("GET", "github.com", "/settings/tokens");
    deny("GET", "example.com", "/");
    // The secrets each binds, for the README's list of what to store.
    let bound: Vec<String> = p
        .secret_refs()
        .iter()
        .map(|r| r.secret.to_string())
        .collect();
    for s in ["openai", "anthropic", "github", "hf"] {
        assert!(bound.iter().any(|b| b == s), "{s} bound: {bound:?}");
    }
}
