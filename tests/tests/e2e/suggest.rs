//! Learn mode, end to end: a day in `mode = "report"` (here: a few requests), then `ctl
//! policy suggest --write`, then the draft moved into the policy directory with the policy
//! enforcing: exactly the traffic that was seen is allowed, and what was not seen is refused.
//! The real daemon, curl through its explicit listener, a loopback TLS upstream.

use agenshield_e2e::upstream::UpstreamOptions;
use agenshield_e2e::world::World;

const HOSTS: [&str; 3] = ["api.test", "files.test", "other.test"];

fn policy(mode: &str) -> String {
    format!(
        r#"version = 1
default = "deny"
mode = "{mode}"

[[rule]]
id = "other"
hosts = ["other.test"]
action = "allow"
"#
    )
}

/// `method url-path` on `host`: the status the agent got.
async fn status(w: &World, method: &str, host: &str, path: &str) -> u16 {
    let url = w.url("https", host, path);
    w.curl(w.via_explicit(), &["-X", method], &url, true)
        .await
        .status
}

/// What the agent does all "day".
const SEEN: [(&str, &str, &str); 5] = [
    ("GET", "api.test", "/repos/agenshield/proxy"),
    ("GET", "api.test", "/repos/other/thing/issues"),
    ("POST", "api.test", "/issues/1/comments"),
    ("GET", "files.test", "/"),
    ("GET", "other.test", "/"),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn report_mode_then_suggest_then_enforce_allows_exactly_what_was_seen() {
    let w = World::start(
        "suggest upstream CA",
        &HOSTS,
        UpstreamOptions::default(),
        &policy("report"),
    )
    .await;

    // 1. Report mode: everything goes through; what enforcing would refuse is marked.
    for (method, host, path) in SEEN {
        assert_eq!(
            status(&w, method, host, path).await,
            200,
            "{method} {host}{path}"
        );
    }
    let audit = std::fs::read_to_string(w.daemon.audit_path()).expect("audit");
    assert_eq!(audit.matches("\"would_deny\":true").count(), 4, "{audit}");

    // 2. Suggest: never into the policy directory; a new file elsewhere.
    let policies = w.daemon.dir.path().join("policies");
    let inside = policies.join("suggested.toml").display().to_string();
    let (code, _, err) = w
        .daemon
        .ctl(&[], &["policy", "suggest", "--write", &inside]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("would be loaded at once"), "{err}");
    let scratch = tempfile::tempdir().expect("tempdir");
    let draft = scratch.path().join("suggested.toml");
    let draft_arg = draft.display().to_string();
    let (code, out, err) = w.daemon.ctl(
        &[],
        &["policy", "suggest", "--since", "1h", "--write", &draft_arg],
    );
    assert_eq!(code, 0, "{out}{err}");
    assert!(err.contains("wrote 2 rule(s)"), "{err}");
    let text = std::fs::read_to_string(&draft).expect("draft");
    let port = w.up.addr.port();
    for want in [
        "hosts = [\"api.test\"]".to_string(),
        format!("ports = [{port}]"),
        "methods = [\"GET\", \"POST\"]   # GET 2, POST 1".into(),
        "paths = [\"/issues/**\", \"/repos/**\"]".into(),
        "hosts = [\"files.test\"]".into(),
        "paths = [\"/\"]".into(),
    ] {
        assert!(text.contains(&want), "{want} not in:\n{text}");
    }
    assert!(
        !text.contains("other.test"),
        "allowed traffic is not suggested:\n{text}"
    );
    let (code, _, err) = w.daemon.ctl(&[], &["policy", "lint", &draft_arg]);
    assert_eq!(code, 0, "the draft lints clean: {err}");
    let (code, _, _) = w
        .daemon
        .ctl(&[], &["policy", "suggest", "--write", &draft_arg]);
    assert_eq!(code, 2, "an existing file is never overwritten");

    // 3. Enforce with the draft moved in: exactly what was seen passes.
    std::fs::write(policies.join("main.toml"), policy("enforce")).expect("policy");
    std::fs::rename(&draft, policies.join("suggested.toml")).expect("move the draft in");
    let (code, out, err) = w.daemon.ctl(&[], &["reload"]);
    assert_eq!(code, 0, "{out}{err}");
    for (method, host, path) in SEEN {
        assert_eq!(
            status(&w, method, host, path).await,
            200,
            "{method} {host}{path}"
        );
    }
    for (method, host, path) in [
        ("GET", "api.test", "/admin"),
        ("DELETE", "api.test", "/repos/agenshield/proxy"),
        ("PUT", "files.test", "/"),
        ("GET", "files.test", "/private"),
    ] {
        assert_eq!(
            status(&w, method, host, path).await,
            403,
            "{method} {host}{path}"
        );
    }
}
