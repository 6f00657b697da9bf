//! The operator's side: hot reload under load, rate limits, `ask` approvals, and `ctl`
//! against the real daemon over its admin socket.

use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

use agenshield_e2e::daemon::{Daemon, DaemonOptions};
use agenshield_e2e::upstream::{Upstream, UpstreamOptions};
use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

const LOCAL: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

fn policy(x_action: &str, extra: &str) -> String {
    format!(
        r#"version = 1
default = "deny"

[[rule]]
id = "x"
hosts = ["x.test"]
action = "{x_action}"

[[rule]]
id = "y"
hosts = ["y.test"]
action = "allow"
{extra}"#
    )
}

async fn world(policy_text: &str, approvals_timeout: Option<&str>) -> (Upstream, Daemon) {
    let up = Upstream::start(UpstreamOptions {
        tls: None,
        name: "plain".into(),
        ..Default::default()
    })
    .await;
    let daemon = Daemon::start(DaemonOptions {
        policies: vec![("main.toml".into(), policy_text.into())],
        hosts: ["x.test", "y.test", "z.test"]
            .iter()
            .map(|h| (h.to_string(), LOCAL))
            .collect(),
        approvals_timeout: approvals_timeout.map(str::to_string),
        ..Default::default()
    });
    (up, daemon)
}

/// A keep-alive HTTP/1.1 client speaking to the explicit listener with absolute URIs.
struct ProxyClient {
    sender: hyper::client::conn::http1::SendRequest<Empty<Bytes>>,
}

struct Reply {
    status: u16,
    retry_after: Option<String>,
    body: String,
}

impl ProxyClient {
    async fn connect(daemon: &Daemon) -> ProxyClient {
        let tcp = TcpStream::connect(daemon.explicit).await.expect("connect");
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
            .await
            .expect("handshake");
        tokio::spawn(conn);
        ProxyClient { sender }
    }

    async fn get(&mut self, url: &str) -> Result<Reply, String> {
        self.sender.ready().await.map_err(|e| e.to_string())?;
        let req = http::Request::get(url)
            .body(Empty::new())
            .map_err(|e| e.to_string())?;
        let resp = self
            .sender
            .send_request(req)
            .await
            .map_err(|e| e.to_string())?;
        let status = resp.status().as_u16();
        let retry_after = resp
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let body = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?
            .to_bytes();
        Ok(Reply {
            status,
            retry_after,
            body: String::from_utf8_lossy(&body).into_owned(),
        })
    }
}

fn error_code(body: &str) -> String {
    serde_json::from_str::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v["error_code"].as_str().map(str::to_string))
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hot_reload_under_load_takes_effect_within_200ms_and_fails_nothing_else() {
    let (up, daemon) = world(&policy("allow", ""), None).await;
    let port = up.addr.port();
    let (x_url, y_url) = (
        format!("http://x.test:{port}/"),
        format!("http://y.test:{port}/"),
    );
    let mut client = ProxyClient::connect(&daemon).await;
    // Warm up: both allowed.
    for url in [&x_url, &y_url] {
        assert_eq!(client.get(url).await.expect("warm-up").status, 200);
    }

    let file = daemon.dir.path().join("policies/main.toml");
    let started = Instant::now();
    let mut written_at = None;
    let mut first_403 = None;
    let mut n = 0u32;
    // Bounded: at most 20,000 requests or 10 s.
    while n < 20_000 && started.elapsed() < Duration::from_secs(10) {
        n += 1;
        if written_at.is_none() && started.elapsed() > Duration::from_millis(300) {
            // truncate-then-write, as many editors save
            std::fs::write(&file, policy("deny", "")).expect("rewrite policy");
            written_at = Some(Instant::now());
        }
        for (url, is_x) in [(&x_url, true), (&y_url, false)] {
            let r = client
                .get(url)
                .await
                .unwrap_or_else(|e| panic!("request {n} failed: {e}"));
            match (is_x, r.status) {
                (_, 200) => {}
                (true, 403) if error_code(&r.body) == "policy_denied" => {
                    if first_403.is_none() {
                        first_403 = Some(Instant::now());
                    }
                }
                _ => panic!("unexpected reply to {url}: {} {}", r.status, r.body),
            }
        }
        if first_403.is_some_and(|t| t.elapsed() > Duration::from_millis(300)) {
            break;
        }
    }
    let (written, denied) = (
        written_at.expect("policy rewritten"),
        first_403.expect("x.test denied"),
    );
    let took = denied.saturating_duration_since(written);
    eprintln!("reload took effect {took:?} after the write ({n} request pairs)");
    assert!(took <= Duration::from_millis(200), "took {took:?}");
    // Once denied, it stays denied.
    assert_eq!(client.get(&x_url).await.expect("x").status, 403);

    // An invalid file: enforcement unchanged, and ctl status names the error.
    std::fs::write(&file, "version = 1\n[[rule]]\nid = \"x\"\nhosts = 5\n").expect("write");
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(client.get(&x_url).await.expect("x").status, 403);
    assert_eq!(client.get(&y_url).await.expect("y").status, 200);
    let (code, out, err) = daemon.ctl(&[], &["status", "--json"]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("json");
    let msg = v["policy"]["last_error"]["message"]
        .as_str()
        .unwrap_or_default();
    assert!(
        msg.contains("main.toml:4:"),
        "status must show the reload error: {v}"
    );
    let (code, human, _) = daemon.ctl(&[], &["status"]);
    assert_eq!(code, 0);
    assert!(human.contains("last reload   FAILED"), "{human}");

    // Save by rename (write a temp file, rename it over): picked up too, error cleared.
    let tmp = daemon.dir.path().join("policies/.main.toml.swp");
    std::fs::write(&tmp, policy("allow", "")).expect("write temp");
    std::fs::rename(&tmp, &file).expect("rename over");
    let deadline = Instant::now() + Duration::from_secs(2);
    while client.get(&x_url).await.expect("x").status != 200 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        client.get(&x_url).await.expect("x").status,
        200,
        "rename-save reloaded"
    );
    let (_, out, _) = daemon.ctl(&[], &["status", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&out).expect("json");
    assert!(
        v["policy"]["last_error"].is_null(),
        "a good reload clears the error: {v}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rate_limited_rule_answers_429_with_retry_after() {
    let extra = "\n[[rule]]\nid = \"z-limited\"\nhosts = [\"z.test\"]\naction = \"allow\"\nrate = { requests = 3, per = \"1m\", burst = 3 }\n";
    let (up, daemon) = world(&policy("allow", extra), None).await;
    let url = format!("http://z.test:{}/", up.addr.port());
    let mut client = ProxyClient::connect(&daemon).await;
    for _ in 0..3 {
        assert_eq!(client.get(&url).await.expect("ok").status, 200);
    }
    let r = client.get(&url).await.expect("limited");
    assert_eq!(r.status, 429, "{}", r.body);
    assert_eq!(error_code(&r.body), "rate_limited");
    let secs: u64 = r
        .retry_after
        .expect("Retry-After")
        .parse()
        .expect("seconds");
    assert!((1..=20).contains(&secs), "Retry-After {secs}");
    assert_eq!(
        up.requests().len(),
        3,
        "the limited request never reached the upstream"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ask_holds_the_request_until_approved_and_times_out_to_a_denial() {
    let (up, daemon) = world(&policy("ask", ""), Some("2s")).await;
    let url = format!("http://x.test:{}/approve-me", up.addr.port());

    let held = tokio::spawn({
        let mut client = ProxyClient::connect(&daemon).await;
        let url = url.clone();
        async move { client.get(&url).await }
    });
    let id = wait_pending(&daemon).await;
    assert!(!held.is_finished(), "the request must be held");
    // Who asks, and until when the operator may answer.
    let (code, out, _) = daemon.ctl(&[], &["pending", "list", "--json"]);
    assert_eq!(code, 0);
    let listed: serde_json::Value = serde_json::from_str(&out).expect("json");
    let expires = listed[0]["expires"].as_str().unwrap_or("").to_string();
    assert!(
        expires.as_str() > listed[0]["since"].as_str().unwrap_or(""),
        "{listed}"
    );
    let (_, human, _) = daemon.ctl(&[], &["pending", "list"]);
    let head: Vec<&str> = human
        .lines()
        .next()
        .unwrap_or("")
        .split_whitespace()
        .collect();
    assert_eq!(
        head,
        [
            "ID",
            "SINCE",
            "EXPIRES",
            "AGENT",
            "METHOD",
            "DESTINATION",
            "RULE"
        ]
    );
    assert!(human.contains(&expires[..19]), "{human}");
    let (code, out, err) = daemon.ctl(&[], &["pending", "approve", &id]);
    assert_eq!(code, 0, "{out}{err}");
    let r = held.await.expect("join").expect("reply");
    assert_eq!((r.status, r.body.as_str()), (200, "hello from plain\n"));

    // Nobody answers: denied after the timeout, with a readable reason.
    let started = Instant::now();
    let mut client = ProxyClient::connect(&daemon).await;
    let r = client.get(&url).await.expect("reply");
    assert_eq!(r.status, 403, "{}", r.body);
    assert!(r.body.contains("needs approval"), "{}", r.body);
    assert!(started.elapsed() >= Duration::from_millis(1900));

    // An explicit denial.
    let held = tokio::spawn({
        let mut client = ProxyClient::connect(&daemon).await;
        let url = url.clone();
        async move { client.get(&url).await }
    });
    let id = wait_pending(&daemon).await;
    let (code, _, err) = daemon.ctl(&[], &["pending", "deny", &id]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(held.await.expect("join").expect("reply").status, 403);
    assert_eq!(
        up.requests().len(),
        1,
        "only the approved request reached the upstream"
    );
}

async fn wait_pending(daemon: &Daemon) -> String {
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        let (code, out, _) = daemon.ctl(&[], &["pending", "list", "--json"]);
        if code == 0 {
            if let Some(id) = serde_json::from_str::<serde_json::Value>(&out)
                .ok()
                .and_then(|v| v[0]["id"].as_str().map(str::to_string))
            {
                return id;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("no pending request appeared");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctl_reports_policy_checks_lints_and_a_stopped_daemon_in_one_line() {
    let (up, mut daemon) = world(&policy("deny", ""), None).await;
    let (code, out, err) = daemon.ctl(&[], &["policy", "check", "GET", "http://x.test/a"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("DENY") && out.contains("rule          x"),
        "{out}"
    );
    let dir = daemon.dir.path().join("policies");
    let dir_arg = dir.display().to_string();
    let (code, out, _) = daemon.ctl(
        &[],
        &[
            "policy",
            "check",
            "GET",
            "https://y.test/",
            "--policy",
            &dir_arg,
            "--json",
        ],
    );
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&out).expect("json");
    assert_eq!(
        (v["decision"].as_str(), v["rule_id"].as_str()),
        (Some("allow"), Some("y"))
    );
    let (code, _, err) = daemon.ctl(&[], &["policy", "check", "GET", "https://user@y.test/"]);
    assert_eq!(code, 2, "userinfo is bad input: {err}");
    // A host no rule names: why, and what to do about it.
    let (code, out, err) = daemon.ctl(&[], &["policy", "check", "GET", "https://unknown.test/"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("hint          no rule covers unknown.test")
            && out.contains("ctl policy suggest"),
        "{out}"
    );
    let (_, out, _) = daemon.ctl(&[], &["policy", "check", "GET", "https://api.y.test/"]);
    assert!(
        out.contains("rule y covers y.test"),
        "the nearest rule: {out}"
    );

    let bad = daemon.dir.path().join("bad.toml");
    std::fs::write(
        &bad,
        "version = 1\n[[rule]]\nid = \"a\"\nhosts = [\"*x.test\"]\naction = \"allow\"\n",
    )
    .expect("write");
    let (code, _, err) = daemon.ctl(&[], &["policy", "lint", bad.to_str().expect("utf-8")]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("bad.toml:"), "{err}");
    let (code, out, err) = daemon.ctl(&[], &["policy", "lint"]);
    assert_eq!(code, 0, "{out}{err}");

    let mut c = ProxyClient::connect(&daemon).await;
    let _ = c.get(&format!("http://y.test:{}/", up.addr.port())).await;
    let (code, out, _) = daemon.ctl(&[], &["tail", "--json"]);
    assert_eq!(code, 0);
    assert!(
        out.lines().any(|l| l.contains("\"host\":\"y.test\"")),
        "{out}"
    );
    let (code, out, _) = daemon.ctl(&[], &["stats"]);
    assert_eq!(code, 0);
    assert!(out.contains("allowed"), "{out}");
    let (code, out, err) = daemon.ctl(&[], &["reload"]);
    assert_eq!(code, 0, "{out}{err}");
    let (code, out, _) = daemon.ctl(&[], &["policy", "show"]);
    assert_eq!(code, 0);
    assert!(
        out.lines()
            .any(|l| l.starts_with('x') && l.contains("deny") && l.contains("x.test")),
        "{out}"
    );

    daemon.stop();
    let (code, out, err) = daemon.ctl(&[], &["status"]);
    assert_eq!(code, 1);
    assert!(out.is_empty());
    assert_eq!(err.lines().count(), 1, "one clear line: {err}");
    assert!(err.contains("not running"), "{err}");
}

/// `ctl tail -f ARGS` on `daemon`, and its stdout's lines as they come.
fn follow(
    daemon: &agenshield_e2e::daemon::Daemon,
    args: &[&str],
    stderr: std::process::Stdio,
) -> (std::process::Child, std::sync::mpsc::Receiver<String>) {
    let mut tail = std::process::Command::new(agenshield_e2e::daemon::binary())
        .args(["proxy", "ctl", "tail", "-f"])
        .args(args)
        .arg("--socket")
        .arg(daemon.socket())
        .arg("--config")
        .arg(daemon.config_path())
        .stdout(std::process::Stdio::piped())
        .stderr(stderr)
        .spawn()
        .expect("spawn tail -f");
    let stdout = tail.stdout.take().expect("stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::BufRead as _;
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            let _ = tx.send(line);
        }
    });
    (tail, rx)
}

/// `ctl tail -f` streams decisions as they happen, filtered by decision and host: a denial
/// for x.test shows; an allowed y.test and a denied z.test (default deny) do not.
#[tokio::test]
async fn tail_follow_streams_live_decisions_filtered_by_decision_and_host() {
    let (up, daemon) = world(&policy("deny", ""), None).await;
    let (mut tail, rx) = follow(
        &daemon,
        &["--json", "--decision", "deny", "--host", "x.test"],
        std::process::Stdio::null(),
    );
    // Give the follower time to subscribe, then make one request of each kind, twice over
    // (a request made before the subscription would simply not be streamed).
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let port = up.addr.port();
    let mut c = ProxyClient::connect(&daemon).await;
    for _ in 0..2 {
        assert_eq!(
            c.get(&format!("http://y.test:{port}/"))
                .await
                .expect("reply")
                .status,
            200
        );
        assert_eq!(
            c.get(&format!("http://z.test:{port}/"))
                .await
                .expect("reply")
                .status,
            403
        );
        assert_eq!(
            c.get(&format!("http://x.test:{port}/a"))
                .await
                .expect("reply")
                .status,
            403
        );
    }
    let mut seen = Vec::new();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while seen.len() < 2 {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) => seen.push(line),
            Err(_) => break,
        }
    }
    // Anything else that was going to arrive has had the time to.
    std::thread::sleep(std::time::Duration::from_millis(300));
    seen.extend(rx.try_iter());
    let _ = tail.kill();
    let _ = tail.wait();
    assert_eq!(
        seen.len(),
        2,
        "two x.test denials and nothing else: {seen:?}"
    );
    for line in &seen {
        let v: serde_json::Value = serde_json::from_str(line).expect("json line");
        assert_eq!(v["decision"], "deny", "{line}");
        assert_eq!(v["host"], "x.test", "{line}");
    }
    // The operator's log line for each: display forms, no Rust `Debug` (`kind=Request`), no
    // empty field (`secrets=`) (issue 34).
    let logs = daemon.logs();
    let line = logs
        .lines()
        .find(|l| l.contains("host=\"x.test\"") && l.contains("decision=\"deny\""))
        .unwrap_or_else(|| panic!("no denial logged:\n{logs}"));
    assert!(line.contains("kind=\"request\""), "{line}");
    assert!(line.contains("secrets=-"), "{line}");
    assert!(
        !line.contains("Some(") && !line.contains("kind=Request"),
        "{line}"
    );
}

/// `ctl tail -f` names the agent on DNS lines too, and when the daemon stops it says so and
/// exits 1 (a script or an operator watching must not take the silence for a quiet agent).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tail_follow_names_dns_agents_and_fails_when_the_daemon_stops() {
    let (_up, mut daemon) = world(&policy("deny", ""), None).await;
    let (mut tail, rx) = follow(&daemon, &[], std::process::Stdio::piped());
    tokio::time::sleep(Duration::from_millis(300)).await;
    let stub = daemon.dns[0];
    let dig = std::process::Command::new("dig")
        .args(["+time=2", "+tries=1", "-p", &stub.port().to_string()])
        .arg(format!("@{}", stub.ip()))
        .args(["nobody.test", "A"])
        .output()
        .expect("dig (apt-get install bind9-dnsutils)");
    assert!(dig.status.success(), "{dig:?}");
    let line = rx
        .recv_timeout(Duration::from_secs(5))
        .expect("the DNS decision is streamed");
    assert!(
        line.contains("dns://nobody.test") && line.contains("agent=0"),
        "{line}"
    );

    daemon.stop();
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(s) = tail.try_wait().expect("wait") {
            break s;
        }
        assert!(Instant::now() < deadline, "tail -f outlived the daemon");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let mut err = String::new();
    std::io::Read::read_to_string(&mut tail.stderr.take().expect("stderr"), &mut err)
        .expect("stderr");
    assert_eq!(status.code(), Some(1), "{err}");
    assert!(err.contains("the live feed ended"), "{err}");
}

/// The value of one unlabelled metric in a scrape of the daemon.
async fn metric(daemon: &Daemon, name: &str) -> Option<f64> {
    let scrape =
        agenshield_e2e::curl::curl(&[&format!("http://{}/metrics", daemon.metrics)], false)
            .await
            .text();
    scrape
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

/// Polls `ctl status --json` (bounded) until `want` holds of it; returns it.
fn status_until(
    daemon: &Daemon,
    within: Duration,
    what: &str,
    want: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let started = Instant::now();
    loop {
        let (code, out, err) = daemon.ctl(&[], &["status", "--json"]);
        assert_eq!(code, 0, "{err}");
        let v: serde_json::Value = serde_json::from_str(&out).expect("status json");
        if want(&v) {
            return v;
        }
        assert!(
            started.elapsed() < within,
            "{what} not within {within:?}: {v}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Issue 34: `cd lab; agenshield proxy run --config proxy.toml` with `policies = "policies"`
/// reloaded nothing (the watcher compared absolute event paths with a relative directory)
/// while status said "watching". Every path is absolute now, edits, renames and a broken file
/// are seen, and "watching" is proven by a probe, not assumed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relative_config_reloads_its_relative_policy_directory() {
    let daemon = Daemon::start(DaemonOptions {
        policies: vec![("main.toml".into(), policy("deny", ""))],
        hosts: vec![("x.test".into(), LOCAL)],
        relative_config: true,
        ..Default::default()
    });
    let policies = daemon.dir.path().join("policies");
    let rule = |d: &Daemon| {
        let (code, out, err) = d.ctl(
            &[],
            &["policy", "check", "GET", "https://x.test/", "--json"],
        );
        assert_eq!(code, 0, "{err}");
        let v: serde_json::Value = serde_json::from_str(&out).expect("json");
        (
            v["decision"].as_str().unwrap_or("").to_string(),
            v["rule_id"].as_str().unwrap_or("").to_string(),
        )
    };
    let until = |d: &Daemon, want: (&str, &str)| {
        let started = Instant::now();
        while rule(d) != (want.0.to_string(), want.1.to_string()) {
            assert!(
                started.elapsed() < Duration::from_secs(5),
                "{want:?} never in force: {:?}",
                rule(d)
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    // The paths the daemon reports are absolute, under the config's directory.
    let v = status_until(&daemon, Duration::from_secs(5), "a proven watch", |v| {
        v["policy"]["watch"]["active"] == true
    });
    let dir = daemon.dir.path().canonicalize().expect("canonical");
    let shown = std::path::PathBuf::from(v["policy"]["dir"].as_str().expect("dir"));
    assert!(shown.is_absolute(), "{v}");
    assert_eq!(
        shown.canonicalize().expect("exists"),
        dir.join("policies"),
        "{v}"
    );
    assert!(
        v["listeners"]["admin"]
            .as_str()
            .is_some_and(|a| a.starts_with('/')),
        "{v}"
    );
    assert_eq!(v["policy"]["watch"]["verified"], true, "{v}");
    // Every listener is in the status, the DNS stub and metrics included (issue 34).
    assert_eq!(v["listeners"]["metrics"], daemon.metrics.to_string(), "{v}");
    assert_eq!(v["listeners"]["dns"][0], daemon.dns[0].to_string(), "{v}");
    let (_, human, _) = daemon.ctl(&[], &["status"]);
    assert!(
        human.contains(&format!("DNS stub      {}", daemon.dns[0])),
        "{human}"
    );
    assert!(
        human.contains(&format!("metrics       http://{}/metrics", daemon.metrics)),
        "{human}"
    );
    assert_eq!(
        metric(&daemon, "agenshield_proxy_policy_watch_active").await,
        Some(1.0)
    );
    assert_eq!(rule(&daemon), ("deny".into(), "x".into()));

    // An edit in place.
    std::fs::write(policies.join("main.toml"), policy("allow", "")).expect("edit");
    until(&daemon, ("allow", "x"));
    // A save by rename (write a temporary file, rename it over the old one).
    std::fs::write(policies.join(".main.toml.tmp"), policy("deny", "")).expect("tmp");
    std::fs::rename(policies.join(".main.toml.tmp"), policies.join("main.toml")).expect("mv");
    until(&daemon, ("deny", "x"));
    // A broken file: reported, the last good policy stays.
    std::fs::write(
        policies.join("zz-broken.toml"),
        "version = 1\n[[rule]]\nid = \n",
    )
    .expect("broken");
    let v = status_until(
        &daemon,
        Duration::from_secs(5),
        "the broken file reported",
        |v| {
            v["policy"]["last_error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("zz-broken.toml"))
        },
    );
    assert_eq!(v["policy"]["watch"]["active"], true, "{v}");
    assert_eq!(rule(&daemon), ("deny".into(), "x".into()));
    let (_, human, _) = daemon.ctl(&[], &["status"]);
    assert!(human.contains("hot reload    watching /"), "{human}");
    assert!(human.contains("last reload   FAILED"), "{human}");
    std::fs::remove_file(policies.join("zz-broken.toml")).expect("rm");
    status_until(&daemon, Duration::from_secs(5), "recovered", |v| {
        v["policy"]["last_error"].is_null()
    });
    assert_eq!(
        metric(&daemon, "agenshield_proxy_policy_watch_active").await,
        Some(1.0)
    );
}
