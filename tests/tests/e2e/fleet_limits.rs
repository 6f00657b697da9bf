//! Fleet-wide rate limits against a real `redis-server` on loopback (Debian's package): two
//! daemons sharing it enforce one `scope = "fleet"` limit together; a store that hangs or
//! dies is ridden out as `ratelimit.on_store_error` says, every request answered within a
//! bound, and the store is used again once it is back; `rediss://` to a TLS-only server; a
//! fleet rule without a store is refused at start, naming the rule.

use std::time::{Duration, Instant};

use agenshield_e2e::curl::CurlOut;
use agenshield_e2e::daemon::{binary, prepare, DaemonOptions};
use agenshield_e2e::pki::TestCa;
use agenshield_e2e::redis::{self, RedisServer};
use agenshield_e2e::upstream::UpstreamOptions;
use agenshield_e2e::world::{ApiUpstream, World};

/// The most one request may take, store outage or not (debug build, a busy machine, curl's
/// own TLS handshake included): far below any hang, far above a check's deadline.
const ANSWERED_WITHIN: Duration = Duration::from_secs(3);

fn policy(requests: u32) -> String {
    format!(
        r#"
version = 1
default = "deny"

[[rule]]
id = "fleet-api"
hosts = ["fleet.test"]
action = "allow"
rate = {{ requests = {requests}, per = "1h", scope = "fleet" }}

[[rule]]
id = "plain"
hosts = ["plain.test"]
action = "allow"
"#
    )
}

/// A daemon under `policy(requests)` whose `[ratelimit]` is `lines`.
async fn world(name: &str, requests: u32, lines: Vec<String>) -> World {
    let up = UpstreamOptions {
        name: name.into(),
        ..Default::default()
    };
    let api = ApiUpstream::start(
        &format!("{name} upstream CA"),
        &["fleet.test", "plain.test"],
        up,
    )
    .await;
    let opts = DaemonOptions {
        ratelimit: lines,
        ..api.daemon_options(&policy(requests))
    };
    api.world(opts)
}

fn store_lines(url: &str, prefix: &str, extra: &[&str]) -> Vec<String> {
    let mut lines = vec![
        format!("store = {url:?}"),
        format!("key_prefix = {prefix:?}"),
    ];
    lines.extend(extra.iter().map(|s| s.to_string()));
    lines
}

/// One request to `host` through the transparent listener, and how long it took.
async fn get(w: &World, host: &str) -> (CurlOut, Duration) {
    let started = Instant::now();
    let out = w.transparent("https", host, "/echo", &[]).await;
    let took = started.elapsed();
    assert!(
        took < ANSWERED_WITHIN,
        "a request took {took:?} (bound {ANSWERED_WITHIN:?}): {out:?}"
    );
    (out, took)
}

fn error_code(out: &CurlOut) -> String {
    out.json()["error_code"].as_str().unwrap_or("").to_string()
}

fn message(out: &CurlOut) -> String {
    out.json()["message"].as_str().unwrap_or("").to_string()
}

/// `agenshield_proxy_NAME` as the daemon's `/metrics` shows it (0 when absent).
async fn metric(w: &World, series: &str) -> f64 {
    let out =
        agenshield_e2e::curl::curl(&[&format!("http://{}/metrics", w.daemon.metrics)], false).await;
    out.text()
        .lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or(0.0)
}

/// Waits (bounded) until the daemon says its store is up.
async fn wait_store_up(w: &World) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while Instant::now() < deadline {
        if metric(w, "agenshield_proxy_ratelimit_store_up").await == 1.0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!(
        "the store did not come back within 15 s; daemon log:\n{}",
        w.daemon.logs()
    );
}

fn count(text: &str, needle: &str) -> usize {
    text.matches(needle).count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_daemons_sharing_one_redis_allow_n_requests_in_all() {
    if let Some(why) = redis::missing() {
        eprintln!("{why}");
        return;
    }
    let store = RedisServer::start();
    // `deny` and the longest deadline: a slow answer refuses rather than passes, so the count
    // of allowed requests is exactly the limit.
    let lines = || {
        store_lines(
            &store.url(),
            "shared:",
            &["on_store_error = \"deny\"", "timeout = \"1s\""],
        )
    };
    let a = world("fleet-a", 5, lines()).await;
    let b = world("fleet-b", 5, lines()).await;
    wait_store_up(&a).await;
    wait_store_up(&b).await;

    let mut allowed = [0, 0];
    for i in 0..14 {
        let (w, n) = if i % 2 == 0 { (&a, 0) } else { (&b, 1) };
        let (out, _) = get(w, "fleet.test").await;
        match out.status {
            200 => allowed[n] += 1,
            429 => {
                assert_eq!(error_code(&out), "rate_limited", "{out:?}");
                let m = message(&out);
                assert!(m.contains("fleet rate limit of rule:fleet-api"), "{m}");
            }
            other => panic!("unexpected {other}: {out:?}"),
        }
    }
    assert_eq!(
        allowed[0] + allowed[1],
        5,
        "allowed per daemon: {allowed:?}"
    );
    assert!(
        allowed[0] > 0 && allowed[1] > 0,
        "both daemons served: {allowed:?}"
    );
    assert_eq!(a.requests().len() + b.requests().len(), 5);
    // A rule without a fleet rate is untouched by the shared count.
    for w in [&a, &b] {
        assert_eq!(get(w, "plain.test").await.0.status, 200);
    }
    // The refusals are recorded with the scope in their reason (a's 7 requests, of which at
    // least 2 were refused; the log is written before or soon after each response).
    let mut refused: Vec<serde_json::Value> = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        let audit = std::fs::read_to_string(a.daemon.audit_path()).unwrap_or_default();
        refused = audit
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|v| v["error_code"] == "rate_limited")
            .collect();
        if refused.len() >= 7 - allowed[0] {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(refused.len(), 7 - allowed[0], "{refused:?}");
    for r in &refused {
        assert_eq!(r["rule"], "fleet-api", "{r}");
        assert_eq!(r["limit_scope"], "fleet", "{r}");
    }
    assert_eq!(
        metric(
            &a,
            "agenshield_proxy_ratelimit_store_fallbacks_total{mode=\"deny\"}"
        )
        .await,
        0.0
    );
}

/// Many requests at once on both daemons: the checks a connection thread makes together go
/// to the store as one script call (`ratelimit/fleet/batch.rs`), and the count stays exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_requests_on_two_daemons_take_exactly_the_fleet_limit() {
    if let Some(why) = redis::missing() {
        eprintln!("{why}");
        return;
    }
    let store = RedisServer::start();
    let lines = || {
        store_lines(
            &store.url(),
            "burst:",
            &["on_store_error = \"deny\"", "timeout = \"1s\""],
        )
    };
    let a = world("fleet-burst-a", 8, lines()).await;
    let b = world("fleet-burst-b", 8, lines()).await;
    wait_store_up(&a).await;
    wait_store_up(&b).await;
    let (a, b) = (&a, &b);
    let (from_a, from_b) = tokio::join!(
        futures_util::future::join_all((0..10).map(|_| a.transparent(
            "https",
            "fleet.test",
            "/echo",
            &[]
        ))),
        futures_util::future::join_all((0..10).map(|_| b.transparent(
            "https",
            "fleet.test",
            "/echo",
            &[]
        )))
    );
    let mut allowed = 0;
    for out in from_a.iter().chain(&from_b) {
        match out.status {
            200 => allowed += 1,
            429 => assert_eq!(error_code(out), "rate_limited", "{out:?}"),
            other => panic!("unexpected {other}: {out:?}"),
        }
    }
    assert_eq!(allowed, 8, "20 requests at once against a fleet limit of 8");
    assert_eq!(a.requests().len() + b.requests().len(), 8);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_outage_follows_on_store_error_without_a_request_hanging() {
    if let Some(why) = redis::missing() {
        eprintln!("{why}");
        return;
    }
    let mut store = RedisServer::start();
    let deadline = ["timeout = \"50ms\""];
    let local = world(
        "outage-local",
        3,
        store_lines(
            &store.url(),
            "outage:",
            &[deadline[0], "on_store_error = \"local\""],
        ),
    )
    .await;
    let deny = world(
        "outage-deny",
        3,
        store_lines(
            &store.url(),
            "outage:",
            &[deadline[0], "on_store_error = \"deny\""],
        ),
    )
    .await;
    wait_store_up(&local).await;
    wait_store_up(&deny).await;
    assert_eq!(get(&local, "fleet.test").await.0.status, 200);

    // A store that hangs (SIGSTOP: its connections stay open, nothing answers): every check
    // gives up at its deadline. `local` counts in its own bucket (3, untouched so far);
    // `deny` refuses with its own code.
    store.pause(true);
    let mut statuses = Vec::new();
    for _ in 0..4 {
        let (out, _) = get(&local, "fleet.test").await;
        if out.status == 429 {
            assert_eq!(error_code(&out), "rate_limited", "{out:?}");
            assert!(
                message(&out).contains("local fallback of a fleet rate"),
                "{out:?}"
            );
        }
        statuses.push(out.status);
    }
    assert_eq!(statuses, [200, 200, 200, 429], "local fallback bucket of 3");
    let audit = std::fs::read_to_string(local.daemon.audit_path()).unwrap_or_default();
    assert!(
        audit.contains("\"limit_scope\":\"local_fallback\""),
        "{audit}"
    );
    let (out, _) = get(&deny, "fleet.test").await;
    assert_eq!(out.status, 429, "{out:?}");
    assert_eq!(error_code(&out), "rate_limit_store_unavailable", "{out:?}");
    assert_eq!(out.json()["rule_id"], "fleet-api", "{out:?}");
    assert!(
        metric(
            &local,
            "agenshield_proxy_ratelimit_store_errors_total{reason=\"timeout\"}"
        )
        .await
            >= 4.0
    );
    assert!(
        metric(
            &deny,
            "agenshield_proxy_ratelimit_store_fallbacks_total{mode=\"deny\"}"
        )
        .await
            >= 1.0
    );
    store.pause(false);

    // A store that dies: the connection breaks, checks fail at once (no deadline to wait).
    store.kill();
    for _ in 0..3 {
        let (out, took) = get(&deny, "fleet.test").await;
        assert_eq!(error_code(&out), "rate_limit_store_unavailable", "{out:?}");
        assert!(took < ANSWERED_WITHIN);
    }
    let (out, _) = get(&local, "fleet.test").await;
    assert_eq!(out.status, 429, "the local bucket is still spent: {out:?}");
    // `ctl status` shows the outage and what the daemon does meanwhile.
    let (_, text, err) = deny.daemon.ctl(&[], &["status"]);
    assert!(
        text.contains("DOWN since") && text.contains("fleet-limited requests are refused"),
        "{text}{err}"
    );
    assert_eq!(
        metric(&local, "agenshield_proxy_ratelimit_store_up").await,
        0.0
    );

    // Back (empty: no persistence): the store is used again, so the fleet bucket, not the
    // spent local one, decides; and `deny` lets requests through again.
    store.restart();
    wait_store_up(&local).await;
    wait_store_up(&deny).await;
    let (out, _) = get(&local, "fleet.test").await;
    assert_eq!(out.status, 200, "the store decides again: {out:?}");
    let (out, _) = get(&deny, "fleet.test").await;
    assert_eq!(out.status, 200, "{out:?}");
    let (_, json, _) = deny.daemon.ctl(&[], &["status", "--json"]);
    let st: serde_json::Value = serde_json::from_str(&json).expect("status json");
    assert_eq!(st["ratelimit_store"]["up"], true, "{json}");
    assert!(st["ratelimit_store"]["down_since"].is_null(), "{json}");
    assert!(
        st["ratelimit_store"]["last_error"]["reason"].is_string(),
        "{json}"
    );

    // One warning per outage and one line when the store is back, not one per request.
    for w in [&local, &deny] {
        let logs = w.daemon.logs();
        let down = count(&logs, "fleet rate-limit store unreachable");
        let back = count(&logs, "fleet rate-limit store reachable again");
        // The hang and the death may read as one outage or two (the store answered the
        // queued checks between them), never as one per request.
        assert!((1..=2).contains(&down), "{down} outage lines:\n{logs}");
        assert!((1..=2).contains(&back), "{back} recovery lines:\n{logs}");
        assert!(
            !logs.contains("redis://") || !logs.contains('@'),
            "no credentials logged"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_limit_over_rediss_with_the_stores_own_ca() {
    if let Some(why) = redis::missing() {
        eprintln!("{why}");
        return;
    }
    const PASSWORD: &str = "redis-pw-4f1c9e27d0";
    let ca = TestCa::new("redis test CA");
    let store = RedisServer::start_tls(&ca.leaf(&["127.0.0.1"]), Some(PASSWORD));
    let dir = tempfile::tempdir().expect("tempdir");
    let ca_file = dir.path().join("redis-ca.pem");
    ca.write_pem(&ca_file).expect("CA");
    let pw_file = dir.path().join("redis.password");
    std::fs::write(&pw_file, format!("{PASSWORD}\n")).expect("password file");
    let w = world(
        "fleet-tls",
        2,
        store_lines(
            &store.url(),
            "tls:",
            &[
                &format!("ca = {:?}", ca_file.display().to_string()),
                &format!("password_file = {:?}", pw_file.display().to_string()),
                "on_store_error = \"deny\"",
                "timeout = \"1s\"",
            ],
        ),
    )
    .await;
    wait_store_up(&w).await;
    let statuses = [
        get(&w, "fleet.test").await.0,
        get(&w, "fleet.test").await.0,
        get(&w, "fleet.test").await.0,
    ];
    assert_eq!(statuses.each_ref().map(|o| o.status), [200, 200, 429]);
    assert!(
        message(&statuses[2]).contains("fleet rate limit"),
        "{:?}",
        statuses[2]
    );
    // The store's password is nowhere the daemon writes.
    let written = w.daemon.everything_written().await;
    assert!(
        !written.contains(PASSWORD),
        "the store's password was written somewhere"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_store_password_is_an_outage_not_a_pass() {
    if let Some(why) = redis::missing() {
        eprintln!("{why}");
        return;
    }
    let ca = TestCa::new("redis auth CA");
    let store = RedisServer::start_tls(&ca.leaf(&["127.0.0.1"]), Some("the-right-one-8d2e"));
    let dir = tempfile::tempdir().expect("tempdir");
    let ca_file = dir.path().join("redis-ca.pem");
    ca.write_pem(&ca_file).expect("CA");
    let url = store
        .url()
        .replace("rediss://", "rediss://:wrong-pw-77aa31@");
    let w = world(
        "fleet-auth",
        2,
        store_lines(
            &url,
            "auth:",
            &[
                &format!("ca = {:?}", ca_file.display().to_string()),
                "on_store_error = \"deny\"",
            ],
        ),
    )
    .await;
    let (out, _) = get(&w, "fleet.test").await;
    assert_eq!(error_code(&out), "rate_limit_store_unavailable", "{out:?}");
    let written = w.daemon.everything_written().await;
    assert!(
        !written.contains("wrong-pw-77aa31"),
        "the URL's password was written somewhere"
    );
    assert!(
        written.contains("fleet rate-limit store unreachable"),
        "{written}"
    );
}

#[tokio::test]
async fn a_fleet_rule_without_a_store_is_refused_at_start_naming_the_rule() {
    let opts = DaemonOptions {
        policies: vec![("main.toml".into(), policy(5))],
        ..Default::default()
    };
    let dir = prepare(&opts);
    let out = tokio::process::Command::new(binary())
        .args(["proxy", "run", "--config"])
        .arg(dir.path().join("proxy.toml"))
        .output();
    let out = tokio::time::timeout(Duration::from_secs(30), out)
        .await
        .expect("exits in time")
        .expect("run");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("fleet-api"), "{stderr}");
    assert!(stderr.contains("[ratelimit] store"), "{stderr}");
}
