//! Where a placeholder becomes a value by default, and what a response may carry back, end to
//! end with the shipped GitHub example (the real daemon, real TLS, real curl):
//!
//! * without `swap`, only the credential positions swap (`Authorization`, and what `inject`
//!   sets): a placeholder the agent writes into a path (a content API's file name), a query
//!   or another header is refused, so the token cannot become content;
//! * a stored value in a response under any rule, not only the binding one, never reaches
//!   the agent: the response is cut short and the record says why.

use agenshield_e2e::curl::CurlOut;
use agenshield_e2e::daemon::DaemonOptions;
use agenshield_e2e::upstream::UpstreamOptions;
use agenshield_e2e::world::{ApiUpstream, World};
use bytes::Bytes;

const TOKEN: &str = "ghp_SHIPPEDexample0123456789abcdef";
const EXAMPLE: &str = include_str!("../../../policies/examples/github.toml");
const HOSTS: [&str; 3] = ["api.github.com", "github.com", "codeload.github.com"];

async fn world() -> World {
    // A zipball as a content API serves it back: a file named after the token, stored
    // (not deflated) as zip writers do for small files.
    let mut zip = b"PK\x03\x04\x14\x00\x00\x00\x00\x00".to_vec();
    zip.extend_from_slice(format!("me-pub-1234567/{TOKEN}").as_bytes());
    zip.extend_from_slice(b"\x00\x00file content\n");
    let up = UpstreamOptions {
        name: "github".into(),
        content: Some(Bytes::from(zip)),
        ..Default::default()
    };
    let api = ApiUpstream::start("github example upstream CA", &HOSTS, up).await;
    // The example as shipped, on the test upstream's port.
    let policy = EXAMPLE.replace(
        "ports = [443]",
        &format!("ports = [{}]", api.up.addr.port()),
    );
    let opts = DaemonOptions {
        policies: vec![("github.toml".into(), policy)],
        secrets: vec![("github".into(), TOKEN.into())],
        ..api.daemon_options("")
    };
    api.world(opts)
}

fn refused(out: &CurlOut, status: u16, code: &str) -> serde_json::Value {
    assert_eq!(out.status, status, "{}", out.text());
    let v = out.json();
    assert_eq!(v["error_code"], code, "{v}");
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_token_goes_only_where_credentials_go() {
    let w = world().await;

    // The credential position: the token is set in Authorization, whatever the agent sent
    // (its SDK holds the placeholder).
    let out = w
        .explicit(
            "https",
            "api.github.com",
            "/repos/me/pub",
            &["-H", "Authorization: Bearer agenshield:secret:github"],
        )
        .await;
    assert_eq!(out.status, 200, "{}", out.text());
    let last = w.up.requests().pop().expect("seen");
    let auth = last.headers.iter().find(|(k, _)| k == "authorization");
    assert_eq!(
        auth.map(|(_, v)| v.as_str()),
        Some(&*format!("Bearer {TOKEN}"))
    );

    // The attack: the placeholder as a file name in a content API's path. Refused, never
    // swapped: the upstream never sees the token in a path.
    for path in [
        "/repos/me/pub/contents/agenshield:secret:github",
        "/repos/me/pub/contents/agenshield%3Asecret%3Agithub",
    ] {
        let out = w.explicit("https", "api.github.com", path, &[]).await;
        let v = refused(&out, 403, "secret_scope");
        assert_eq!(v["rule_id"], "github-api", "{v}");
        assert!(v["message"].as_str().unwrap_or("").contains("path"), "{v}");
    }
    // …in a query parameter, or a header that is no credential position.
    let out = w
        .explicit(
            "https",
            "api.github.com",
            "/search/code?q=agenshield:secret:github",
            &[],
        )
        .await;
    refused(&out, 403, "secret_scope");
    let out = w
        .explicit(
            "https",
            "api.github.com",
            "/repos/me/pub/issues",
            &["-H", "X-Note: agenshield:secret:github"],
        )
        .await;
    refused(&out, 403, "secret_scope");
    // PUT (file contents) is not in the example's methods at all.
    let out = w
        .explicit(
            "https",
            "api.github.com",
            "/repos/me/pub/contents/notes.txt",
            &["-X", "PUT", "--data", "{}"],
        )
        .await;
    refused(&out, 403, "policy_denied");
    // Only Authorization ever carried the token upstream.
    for r in w.up.requests() {
        assert!(
            !r.path_and_query.contains("SHIPPED"),
            "{}",
            r.path_and_query
        );
        for (k, v) in r.headers.iter().filter(|(k, _)| k != "authorization") {
            assert!(!v.contains("SHIPPED"), "{k}: {v}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_value_in_a_response_of_a_rule_that_binds_nothing_never_reaches_the_agent() {
    let w = world().await;
    // codeload.github.com is `github-content`, which binds no secret.
    let out = w
        .explicit("https", "codeload.github.com", "/content", &[])
        .await;
    assert_ne!(out.exit, 0, "the response is cut short: {}", out.text());
    assert!(!out.text().contains(TOKEN), "{}", out.text());
    assert!(!out.text().contains("SHIPPED"), "{}", out.text());
    // The record says why (and the log line, in words).
    let mut found = None;
    for _ in 0..100 {
        let lines = agenshield_e2e::audit::lines(&w.daemon.audit_path());
        found = lines
            .into_iter()
            .find(|l| l["path"] == "/content" && l["error_code"] == "secret_leak");
        if found.is_some() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let rec = found.expect("a secret_leak record for the cut response");
    agenshield_e2e::audit::assert_matches_schema(&agenshield_e2e::audit::lines(
        &w.daemon.audit_path(),
    ));
    assert_eq!(rec["rule"], "github-content", "{rec}");
    assert_eq!(rec["incomplete"], true, "{rec}");
    let everything = w.daemon.everything_written().await;
    assert!(
        !everything.contains("SHIPPED"),
        "nothing written holds the value"
    );
    assert!(
        everything.contains("response cut short"),
        "the daemon says why it cut the response"
    );
    // A clean response under the same rule goes on byte for byte, its length kept.
    let out = w
        .explicit("https", "codeload.github.com", "/bytes/70000", &[])
        .await;
    assert_eq!((out.exit, out.status, out.size_download), (0, 200, 70000));
}
