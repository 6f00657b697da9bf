//! Approvals that reach a person (issue 37 item 4): a held request is POSTed, signed, to a
//! webhook receiver (HTTPS on loopback, its own CA); an operator elsewhere answers it over
//! the admin HTTPS listener with a client certificate (`ctl --remote`), which releases the
//! request; a client without a certificate the daemon's `client_ca` issued is refused in the
//! handshake, and (root) an agent user is refused even with a valid one.

use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

use agenshield_e2e::approvals::{ctl_remote, signature_valid, AdminPki, WebhookReceiver};
use agenshield_e2e::daemon::{Daemon, DaemonOptions};
use agenshield_e2e::upstream::{Upstream, UpstreamOptions};
use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

const LOCAL: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);
const HOOK_KEY: &str = "whsec-test-0123456789abcdef";

const POLICY: &str = r#"version = 1
default = "deny"

[[rule]]
id = "ask-x"
hosts = ["x.test"]
action = "ask"
"#;

/// A daemon with an `ask` rule, a webhook to `hook` and the HTTPS admin listener.
fn daemon(hook: &WebhookReceiver, pki: &AdminPki, retries: u32) -> Daemon {
    Daemon::start(DaemonOptions {
        policies: vec![("main.toml".into(), POLICY.into())],
        hosts: vec![("x.test".into(), LOCAL)],
        secrets: vec![("approvals-webhook".into(), HOOK_KEY.into())],
        listen_extra: pki.listen_lines("127.0.0.1:0"),
        extra_config: vec![format!(
            "[approvals]\ntimeout = \"20s\"\nwebhook = \"https://127.0.0.1:{}/services/T0/B0/hook?channel=ops\"\n\
             hmac_secret = \"approvals-webhook\"\nca = {:?}\nwebhook_timeout = \"2s\"\nwebhook_retries = {retries}",
            hook.addr.port(),
            hook.ca_file
        )],
        ..Default::default()
    })
}

/// The HTTPS admin listener's address, from `ctl status` over the socket.
fn admin_url(daemon: &Daemon) -> String {
    let (code, out, err) = daemon.ctl(&[], &["status", "--json"]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("status json");
    let addr = v["listeners"]["admin_https"]
        .as_str()
        .unwrap_or_else(|| panic!("no admin_https in the status: {v}"));
    format!("https://{addr}")
}

/// GET through the explicit listener, as the agent would; resolves when answered.
async fn agent_get(explicit: std::net::SocketAddr, url: String) -> (u16, String) {
    let tcp = TcpStream::connect(explicit).await.expect("connect");
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .expect("handshake");
    tokio::spawn(conn);
    let resp = sender
        .send_request(
            http::Request::get(url)
                .body(Empty::<Bytes>::new())
                .expect("req"),
        )
        .await
        .expect("answer");
    let status = resp.status().as_u16();
    let body = resp.into_body().collect().await.expect("body").to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

async fn metric(daemon: &Daemon, series: &str) -> Option<f64> {
    let scrape =
        agenshield_e2e::curl::curl(&[&format!("http://{}/metrics", daemon.metrics)], false)
            .await
            .text();
    scrape.lines().find_map(|l| {
        l.strip_prefix(series)?
            .strip_prefix(' ')?
            .trim()
            .parse()
            .ok()
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signed_webhook_reaches_a_person_and_an_mtls_approval_releases_the_request() {
    // The receiver's HMAC, checked against RFC 4231 test case 2 before it judges the daemon.
    assert_eq!(
        agenshield_e2e::approvals::hmac_sha256_hex(b"Jefe", b"what do ya want for nothing?"),
        "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
    );
    let hook = WebhookReceiver::start(200).await;
    let scratch = tempfile::tempdir().expect("tempdir");
    let pki = AdminPki::write(scratch.path());
    let up = Upstream::start(UpstreamOptions {
        tls: None,
        name: "plain".into(),
        ..Default::default()
    })
    .await;
    let daemon = daemon(&hook, &pki, 2);
    let remote = admin_url(&daemon);

    // The agent asks; the request is held.
    let url = format!(
        "http://x.test:{}/deploy/prod?token=s3cr3t-value&dry=1",
        up.addr.port()
    );
    let held = tokio::spawn(agent_get(daemon.explicit, url));

    // The receiver gets one signed POST describing it, with no secret in it.
    let got = hook.wait_for(1, Duration::from_secs(10)).await;
    assert_eq!(got.len(), 1, "webhook POSTs: {got:?}\n{}", daemon.logs());
    let post = &got[0];
    assert_eq!(post.path, "/services/T0/B0/hook?channel=ops");
    signature_valid(post, HOOK_KEY.as_bytes()).expect("the signature verifies");
    let mut forged = post.clone();
    forged.body = Bytes::from(String::from_utf8_lossy(&post.body).replace("GET", "PUT"));
    assert!(
        signature_valid(&forged, HOOK_KEY.as_bytes()).is_err(),
        "a changed body must not verify"
    );
    assert!(
        signature_valid(post, b"another key").is_err(),
        "another key must not verify"
    );
    let v: serde_json::Value = serde_json::from_slice(&post.body).expect("json body");
    let id = v["id"].as_str().expect("id").to_string();
    assert_eq!(v["method"], "GET", "{v}");
    assert_eq!(v["host"], "x.test", "{v}");
    assert_eq!(v["rule"], "ask-x", "{v}");
    assert_eq!(
        v["url"],
        format!(
            "http://x.test:{}/deploy/prod?token=[redacted]&dry=[redacted]",
            up.addr.port()
        ),
        "{v}"
    );
    assert_eq!(
        v["agent"]["uid"].as_u64(),
        Some(u64::from(nix::unistd::geteuid().as_raw())),
        "{v}"
    );
    for key in ["created", "expires", "text"] {
        assert!(v[key].is_string(), "{key}: {v}");
    }
    let text = v["text"].as_str().unwrap_or("");
    assert!(
        text.contains(&format!("ctl pending approve {id}")) && text.contains("ask-x"),
        "{text}"
    );
    assert!(
        !String::from_utf8_lossy(&post.body).contains("s3cr3t"),
        "a query value reached the webhook: {v}"
    );
    assert!(!held.is_finished(), "the request must still be held");

    // No client certificate: refused in the handshake (whatever the request would be).
    let anonymous = agenshield_e2e::pki::client_config(
        &[&std::fs::read_to_string(pki.file("server_ca.pem")).expect("ca")],
        &[b"http/1.1"],
    );
    let addr: std::net::SocketAddr = remote.trim_start_matches("https://").parse().expect("addr");
    let answered = async {
        let tcp = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
        let tls = tokio_rustls::TlsConnector::from(anonymous)
            .connect(
                rustls_pki_types::ServerName::try_from("127.0.0.1").expect("name"),
                tcp,
            )
            .await
            .map_err(|e| e.to_string())?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
            .await
            .map_err(|e| e.to_string())?;
        tokio::spawn(conn);
        let req = http::Request::get("/v1/pending")
            .header("host", "127.0.0.1")
            .body(Empty::<Bytes>::new())
            .expect("req");
        sender
            .send_request(req)
            .await
            .map(|r| r.status().as_u16())
            .map_err(|e| e.to_string())
    };
    let anonymous_answer = tokio::time::timeout(Duration::from_secs(10), answered)
        .await
        .expect("bounded");
    assert!(
        anonymous_answer.is_err(),
        "a client without a certificate was answered: {anonymous_answer:?}"
    );

    // A certificate from a CA the daemon does not trust: refused, and nothing is decided.
    let (code, out, err) = ctl_remote(
        &[],
        &remote,
        &pki.file("mallory.pem"),
        &pki.file("mallory-key.pem"),
        &pki.file("server_ca.pem"),
        &["pending", "approve", &id],
    );
    assert_ne!(code, 0, "mallory was served: {out}{err}");
    assert!(
        !held.is_finished(),
        "mallory's approval must not release it"
    );

    // The operator's certificate: the pending list, then the approval, over HTTPS.
    let (code, out, err) = ctl_remote(
        &[],
        &remote,
        &pki.file("alice.pem"),
        &pki.file("alice-key.pem"),
        &pki.file("server_ca.pem"),
        &["pending", "list", "--json"],
    );
    assert_eq!(code, 0, "{out}{err}");
    let listed: serde_json::Value = serde_json::from_str(&out).expect("json");
    assert_eq!(listed[0]["id"], id.as_str(), "{listed}");
    assert_eq!(listed[0]["method"], "GET", "{listed}");
    let (code, out, err) = ctl_remote(
        &[],
        &remote,
        &pki.file("alice.pem"),
        &pki.file("alice-key.pem"),
        &pki.file("server_ca.pem"),
        &["pending", "approve", &id],
    );
    assert_eq!(code, 0, "{out}{err}");
    let (status, body) = tokio::time::timeout(Duration::from_secs(10), held)
        .await
        .expect("released in time")
        .expect("join");
    assert_eq!((status, body.as_str()), (200, "hello from plain\n"));
    assert_eq!(up.requests().len(), 1, "the approved request went upstream");

    // `status` works the same way; the decision names the certificate that made it.
    let (code, out, err) = ctl_remote(
        &[],
        &remote,
        &pki.file("alice.pem"),
        &pki.file("alice-key.pem"),
        &pki.file("server_ca.pem"),
        &["status", "--json"],
    );
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("\"admin_https\""), "{out}");
    let logs = daemon.logs();
    assert!(
        logs.lines()
            .any(|l| l.contains("approval answered") && l.contains("CN=alice")),
        "the decision is logged with who made it:\n{logs}"
    );
    assert!(
        logs.contains("handshake refused"),
        "refused handshakes are logged:\n{logs}"
    );
    assert_eq!(
        metric(
            &daemon,
            "agenshield_proxy_approval_webhook_total{result=\"sent\"}"
        )
        .await,
        Some(1.0)
    );
}

/// A receiver that fails: the failure is logged once and counted, and the request still
/// waits for (and is released by) an operator.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_webhook_never_loses_the_pending_request() {
    let hook = WebhookReceiver::start(503).await;
    let scratch = tempfile::tempdir().expect("tempdir");
    let pki = AdminPki::write(scratch.path());
    let up = Upstream::start(UpstreamOptions {
        tls: None,
        name: "plain".into(),
        ..Default::default()
    })
    .await;
    let daemon = daemon(&hook, &pki, 1);
    // `run --check` reads the listener's files and finds the webhook's key, as a start does.
    let check = std::process::Command::new(agenshield_e2e::daemon::binary())
        .args(["proxy", "run", "--check", "--json", "--config"])
        .arg(daemon.config_path())
        .output()
        .expect("run --check");
    let report: serde_json::Value = serde_json::from_slice(&check.stdout).expect("json");
    let part = report["parts"]
        .as_array()
        .and_then(|ps| ps.iter().find(|p| p["part"] == "approval"))
        .unwrap_or_else(|| panic!("no approval part: {report}"));
    assert_eq!(part["verdict"], "ok", "{part}");
    let url = format!("http://x.test:{}/x", up.addr.port());
    let held = tokio::spawn(agent_get(daemon.explicit, url));
    // The first attempt and one retry a second later.
    let got = hook.wait_for(2, Duration::from_secs(10)).await;
    assert_eq!(got.len(), 2, "{}", daemon.logs());
    let deadline = Instant::now() + Duration::from_secs(10);
    let failed = "agenshield_proxy_approval_webhook_total{result=\"failed\"}";
    while metric(&daemon, failed).await != Some(1.0) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(metric(&daemon, failed).await, Some(1.0));
    let logs = daemon.logs();
    assert_eq!(
        logs.matches("approval webhook: not delivered").count(),
        1,
        "logged once:\n{logs}"
    );
    assert!(logs.contains("HTTP 503"), "{logs}");
    assert!(
        !logs.contains("/services/T0/B0/hook"),
        "the webhook URL (a credential) is never logged"
    );
    assert!(!held.is_finished());
    let (code, out, _) = daemon.ctl(&[], &["pending", "list", "--json"]);
    assert_eq!(code, 0);
    let listed: serde_json::Value = serde_json::from_str(&out).expect("json");
    let id = listed[0]["id"].as_str().expect("still pending").to_string();
    let (code, _, err) = daemon.ctl(&[], &["pending", "approve", &id]);
    assert_eq!(code, 0, "{err}");
    let (status, _) = tokio::time::timeout(Duration::from_secs(10), held)
        .await
        .expect("released")
        .expect("join");
    assert_eq!(status, 200);
}

/// Root: an agent user holding a valid client certificate is still refused, before the
/// handshake, by the owner of its socket; root on the same machine is served. Then a
/// `--remember` approval (over HTTPS) of the agent's GET covers that agent's GET of that
/// path again, and neither another uid's GET (root's) nor the agent's POST of it.
#[cfg(target_os = "linux")]
// The root guard is held for the whole test, as every root test does (one at a time).
#[allow(clippy::await_holding_lock)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_uid_is_refused_by_the_https_admin_listener_even_with_a_certificate() {
    use std::os::unix::fs::PermissionsExt;

    use agenshield_e2e::netlab::{root_or_skip, AgentUser};

    let Some(_serial) = root_or_skip("the_agent_uid_is_refused_by_the_https_admin_listener") else {
        return;
    };
    let user = AgentUser::create(std::process::id() % 89 + 211);
    let hook = WebhookReceiver::start(200).await;
    let scratch = tempfile::tempdir().expect("tempdir");
    let pki = AdminPki::write(scratch.path());
    // The agent can read the operator's certificate and key: the worst case.
    std::fs::set_permissions(scratch.path(), std::fs::Permissions::from_mode(0o755))
        .expect("chmod");
    for f in ["alice.pem", "alice-key.pem", "server_ca.pem"] {
        std::fs::set_permissions(pki.file(f), std::fs::Permissions::from_mode(0o644))
            .expect("chmod");
    }
    let daemon = Daemon::start(DaemonOptions {
        policies: vec![("main.toml".into(), POLICY.into())],
        hosts: vec![("x.test".into(), LOCAL)],
        agent_uids: vec![user.uid],
        secrets: vec![("approvals-webhook".into(), HOOK_KEY.into())],
        listen_extra: pki.listen_lines("127.0.0.1:0"),
        extra_config: vec![format!(
            "[approvals]\nwebhook = \"https://127.0.0.1:{}/h\"\nhmac_secret = \"approvals-webhook\"\nca = {:?}",
            hook.addr.port(),
            hook.ca_file
        )],
        ..Default::default()
    });
    let remote = admin_url(&daemon);
    let alice = |prefix: &[String], args: &[&str]| {
        ctl_remote(
            prefix,
            &remote,
            &pki.file("alice.pem"),
            &pki.file("alice-key.pem"),
            &pki.file("server_ca.pem"),
            args,
        )
    };
    let (code, out, err) = alice(&[], &["status", "--json"]);
    assert_eq!(code, 0, "root with the certificate is served: {out}{err}");
    let (code, out, err) = alice(&user.as_agent(), &["status", "--json"]);
    assert_ne!(code, 0, "the agent was served: {out}{err}");
    assert!(!out.contains("\"pid\""), "{out}");
    let logs = daemon.logs();
    assert!(
        logs.contains(&format!("belongs to agent uid {}", user.uid)),
        "the refusal names the agent uid:\n{logs}"
    );

    // `--remember` keeps the agent uid, the method and the path.
    let up = Upstream::start(UpstreamOptions {
        tls: None,
        name: "plain".into(),
        ..Default::default()
    })
    .await;
    let url = format!("http://x.test:{}/repo", up.addr.port());
    let proxy = format!("http://{}", daemon.explicit);
    let agent_curl = |method: &str| {
        let mut c = tokio::process::Command::new(&user.as_agent()[0]);
        c.args(&user.as_agent()[1..])
            .args(["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "-X"])
            .arg(method)
            .args(["--max-time", "20", "-x", &proxy, &url]);
        c.output()
    };
    let pending_of = |uid: u32, method: &str| -> Option<String> {
        let (_, out, _) = alice(&[], &["pending", "list", "--json"]);
        let v: serde_json::Value = serde_json::from_str(&out).ok()?;
        v.as_array()?
            .iter()
            .find(|p| p["agent_uid"].as_u64() == Some(u64::from(uid)) && p["method"] == method)
            .and_then(|p| p["id"].as_str().map(str::to_string))
    };
    let wait_pending = |uid: u32, method: &'static str| async move {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(id) = pending_of(uid, method) {
                return id;
            }
            assert!(
                Instant::now() < deadline,
                "no pending {method} of uid {uid}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    let first = tokio::spawn(agent_curl("GET"));
    let id = wait_pending(user.uid, "GET").await;
    let (code, out, err) = alice(&[], &["pending", "approve", &id, "--remember"]);
    assert_eq!(code, 0, "{out}{err}");
    let out = first.await.expect("join").expect("curl");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "200");
    // The same agent, method and path: through at once.
    let again = tokio::time::timeout(Duration::from_secs(10), agent_curl("GET"))
        .await
        .expect("remembered: not held")
        .expect("curl");
    assert_eq!(String::from_utf8_lossy(&again.stdout), "200");
    // Another uid (root, this test), same method and path: asked again.
    let root_get = tokio::spawn(agent_get(daemon.explicit, url.clone()));
    let id = wait_pending(0, "GET").await;
    let (code, _, err) = alice(&[], &["pending", "deny", &id]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(root_get.await.expect("join").0, 403);
    // The agent, same path, another method: asked again.
    let post = tokio::spawn(agent_curl("POST"));
    let id = wait_pending(user.uid, "POST").await;
    let (code, _, err) = alice(&[], &["pending", "deny", &id]);
    assert_eq!(code, 0, "{err}");
    let out = post.await.expect("join").expect("curl");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "403");
    assert_eq!(
        up.requests().len(),
        2,
        "only the approved GETs went upstream"
    );
}
