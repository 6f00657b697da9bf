//! Audit log and metrics, against the real daemon, curl, WebSocket, and a real Prometheus
//! server (Debian's `prometheus`): every PromQL expression in the shipped Grafana dashboard
//! must return data after traffic of every kind; the audit log holds one record per request,
//! verifies, and `ctl audit verify` names a line the test edits; after kill -9, every request
//! that completed is in the log.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use agenshield_e2e::curl::{curl, CurlOut};
use agenshield_e2e::daemon::{Daemon, DaemonOptions};
use agenshield_e2e::pki::client_config;
use agenshield_e2e::prometheus;
use agenshield_e2e::upstream::UpstreamOptions;
use agenshield_e2e::world::{ApiUpstream, World};
use futures_util::{SinkExt, StreamExt};
use rustls_pki_types::ServerName;
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;

const KEY: &str = "sk-observability-0123456789";

const POLICY: &str = r#"
version = 1
default = "deny"

[[rule]]
id = "api"
hosts = ["api.test", "dead.test"]
action = "allow"

[[rule]]
id = "keyed"
hosts = ["keyed.test"]
action = "allow"
inject = [{ header = "Authorization", value = "Bearer ${secret:key}" }]

[[rule]]
id = "limited"
hosts = ["limited.test"]
action = "allow"
rate = { requests = 1, per = "1h", burst = 1 }

[[rule]]
id = "blocked"
hosts = ["blocked.test"]
action = "deny"
"#;

const HOSTS: [&str; 6] = [
    "api.test",
    "dead.test",
    "keyed.test",
    "limited.test",
    "blocked.test",
    "other.test",
];

async fn world() -> World {
    let mut names: Vec<&str> = HOSTS.to_vec();
    names.push("127.0.0.1");
    let up = UpstreamOptions {
        name: "up".into(),
        ..Default::default()
    };
    let api = ApiUpstream::start("observability upstream CA", &names, up).await;
    let opts = DaemonOptions {
        secrets: vec![("key".into(), KEY.into())],
        ..api.daemon_options(POLICY)
    };
    api.world(opts)
}

/// curl to `host` through the transparent listener.
async fn get(w: &World, host: &str, path: &str, extra: &[&str]) -> CurlOut {
    let url = w.url("https", host, path);
    w.curl(w.via_transparent(host), extra, &url, true).await
}

fn audit_requests(path: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["kind"] == "request")
        .collect()
}

/// Drives one request of every kind; returns how many HTTP requests the agent made.
async fn traffic(w: &World) -> usize {
    let mut n = 0;
    for extra in [&["--http1.1"][..], &["--http2"]] {
        let out = get(w, "api.test", "/echo?token=abc", extra).await;
        assert_eq!(out.status, 200, "{out:?}");
        n += 1;
    }
    let out = get(w, "blocked.test", "/", &[]).await;
    assert_eq!(out.status, 403);
    n += 1;
    let out = get(w, "other.test", "/", &[]).await;
    assert_eq!(out.status, 403, "default deny");
    n += 1;
    for want in [200, 429] {
        let out = get(w, "limited.test", "/", &[]).await;
        assert_eq!(out.status, want);
        n += 1;
    }
    let out = get(w, "keyed.test", "/echo", &[]).await;
    assert_eq!(out.status, 200);
    n += 1;
    let leak = format!("X-Key: {KEY}");
    let out = get(w, "api.test", "/echo", &["-H", &leak]).await;
    assert_eq!(out.status, 403, "leak refused");
    n += 1;
    // An allowed host whose upstream refuses connections (the discard port is closed).
    let proxy = format!("http://{}", w.daemon.explicit);
    let ca = w.daemon.ca_path.display().to_string();
    let out = curl(
        &["--cacert", &ca, "--proxy", &proxy, "https://dead.test:9/"],
        true,
    )
    .await;
    assert_eq!(out.status, 502, "{out:?}");
    n += 1;
    // A client that does not trust our CA: a failed handshake, no request.
    let connect_to = format!(
        "api.test:{}:127.0.0.1:{}",
        w.up.addr.port(),
        w.daemon.transparent.port()
    );
    let url = format!("https://api.test:{}/", w.up.addr.port());
    let out = curl(&["--connect-to", &connect_to, &url], true).await;
    assert_ne!(out.exit, 0, "untrusted CA must fail");
    // WebSocket through the transparent listener.
    let tls = tokio_rustls::TlsConnector::from(client_config(&[&w.daemon.ca_pem], &[b"http/1.1"]));
    let tcp = TcpStream::connect(w.daemon.transparent)
        .await
        .expect("connect");
    let stream = tls
        .connect(ServerName::try_from("api.test").expect("name"), tcp)
        .await
        .expect("TLS");
    let url = format!("wss://api.test:{}/ws", w.up.addr.port());
    let (mut ws, _) = tokio_tungstenite::client_async(url.as_str(), stream)
        .await
        .expect("websocket handshake");
    ws.send(Message::text("ping")).await.expect("send");
    let echo = tokio::time::timeout(Duration::from_secs(10), ws.next())
        .await
        .expect("echo in time");
    assert!(echo.is_some());
    n += 1;
    // Held open while Prometheus scrapes, so the ws gauge is seen at 1.
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(6)).await;
        let _ = ws.close(None).await;
    });
    n
}

fn ctl(d: &Daemon, args: &[&str]) -> (i32, String, String) {
    d.ctl(&[], args)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_dashboard_query_returns_data_and_the_audit_log_verifies() {
    if let Some(why) = prometheus::missing() {
        eprintln!("{why}");
        return;
    }
    let w = world().await;
    let prom = prometheus::start(w.daemon.metrics, &[]);
    let n = traffic(&w).await;

    // A scrape passes promtool's checks.
    let scrape = Command::new("curl")
        .args(["-sS", &format!("http://{}/metrics", w.daemon.metrics)])
        .output()
        .expect("scrape");
    let text = String::from_utf8_lossy(&scrape.stdout).to_string();
    assert!(!text.contains(KEY), "no secret value in metrics");
    // Which build runs, the process's own figures, and latency buckets past an approval
    // wait (2 min by default).
    let version = env!("CARGO_PKG_VERSION");
    for want in [
        format!(
            "agenshield_proxy_build_info{{arch=\"{}\",os=\"linux\",version=\"{version}\"}} 1",
            std::env::consts::ARCH
        ),
        "process_resident_memory_bytes ".into(),
        "process_open_fds ".into(),
        "agenshield_proxy_request_duration_seconds_bucket{".into(),
    ] {
        assert!(text.contains(&want), "{want} not in the scrape");
    }
    assert!(
        text.contains("le=\"120\"") && text.contains("le=\"300\""),
        "buckets to 5 min"
    );
    let mut check = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool");
    std::io::Write::write_all(check.stdin.as_mut().expect("stdin"), text.as_bytes())
        .expect("feed promtool");
    let checked = check.wait_with_output().expect("promtool");
    assert!(
        checked.status.success(),
        "promtool check metrics: {}{}",
        String::from_utf8_lossy(&checked.stdout),
        String::from_utf8_lossy(&checked.stderr)
    );
    for series in [
        "agenshield_proxy_connections_total{protocol=\"h2\"}",
        "agenshield_proxy_connections_total{protocol=\"ws\"}",
        "agenshield_proxy_secret_injections_total{secret=\"key\"}",
        "agenshield_proxy_rate_limited_total{rule=\"limited\"}",
        "agenshield_proxy_upstream_errors_total{kind=\"connect\"}",
        "agenshield_proxy_tls_handshakes_total{result=\"client_rejected_ca\"} 1",
    ] {
        assert!(text.contains(series), "scrape lacks {series}:\n{text}");
    }

    // other.test is no rule's host: its request is counted under host "other" (bounded
    // labels), with a count, not only the zero series a fresh daemon shows.
    let other: f64 = text
        .lines()
        .filter(|l| {
            l.starts_with("agenshield_proxy_requests_total{") && l.contains("host=\"other\"")
        })
        .filter_map(|l| l.rsplit_once(' ').and_then(|(_, v)| v.parse::<f64>().ok()))
        .sum();
    assert!(
        other >= 1.0,
        "no request counted under host=\"other\":\n{text}"
    );

    // Every dashboard expression returns data once Prometheus has scraped a few times.
    let exprs = prometheus::dashboard_exprs();
    assert!(exprs.len() >= 20, "dashboard has {} queries", exprs.len());
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut empty: Vec<String>;
    loop {
        empty = exprs
            .iter()
            .filter(|e| !prom.has_data(e))
            .cloned()
            .collect();
        if empty.is_empty() || Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    assert!(
        empty.is_empty(),
        "{} of {} dashboard queries returned no data:\n{}",
        empty.len(),
        exprs.len(),
        empty.join("\n")
    );

    // The audit log: one record per request, each with what a reviewer needs.
    let audit = w.daemon.audit_path();
    let records = audit_requests(&audit);
    assert_eq!(records.len(), n, "one record per request");
    let denied = records
        .iter()
        .find(|r| r["host"] == "blocked.test")
        .expect("denial recorded");
    assert_eq!(denied["decision"], "deny");
    assert_eq!(denied["rule"], "blocked");
    assert_eq!(denied["status"], 403);
    let allowed = records
        .iter()
        .find(|r| r["path"] == "/echo?token=[redacted]")
        .expect("query values redacted");
    assert!(allowed["bytes_down"].as_u64().unwrap_or(0) > 0, "{allowed}");
    assert_eq!(allowed["agent_uid"], nix::unistd::geteuid().as_raw());
    assert_eq!(allowed["sni"], "api.test");
    let keyed = records
        .iter()
        .find(|r| r["host"] == "keyed.test")
        .expect("keyed");
    assert_eq!(keyed["secrets"], serde_json::json!(["key"]));
    let text = std::fs::read_to_string(&audit).expect("audit");
    assert!(!text.contains(KEY), "no secret value in the audit log");
    assert!(
        text.lines().any(|l| l.contains("\"kind\":\"reload\"")),
        "start-up load recorded"
    );
    // Every line, whatever it recorded, is as the published schema says.
    agenshield_e2e::audit::assert_matches_schema(&agenshield_e2e::audit::lines(&audit));

    let (code, out, err) = ctl(&w.daemon, &["audit", "verify"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.starts_with("ok:"), "{out}");
    // `ctl status` shows where the chain stands: the file's last record.
    let (code, status, err) = ctl(&w.daemon, &["status", "--json"]);
    assert_eq!(code, 0, "{err}");
    let status: serde_json::Value = serde_json::from_str(&status).expect("status json");
    let last: serde_json::Value =
        serde_json::from_str(text.lines().last().expect("a record")).expect("json line");
    assert_eq!(status["audit"]["seq"], last["seq"], "{status}");
    assert_eq!(status["audit"]["hash"], last["hash"], "{status}");
    // Edit one line: verify names it.
    let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
    let target = lines
        .iter()
        .position(|l| l.contains("\"host\":\"blocked.test\""))
        .expect("denial line");
    lines[target] = lines[target].replace("\"decision\":\"deny\"", "\"decision\":\"allow\"");
    let copy = w.daemon.dir.path().join("edited.jsonl");
    std::fs::write(&copy, lines.join("\n") + "\n").expect("write copy");
    let copy_arg = copy.display().to_string();
    let (code, out, _) = ctl(&w.daemon, &["audit", "verify", &copy_arg]);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains(&format!("edited.jsonl:{}:", target + 1)) && out.contains("edited"),
        "{out}"
    );
    drop(prom);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_kill_9_every_completed_request_is_in_the_audit_log() {
    let mut w = world().await;
    let connect_to = format!(
        "api.test:{}:127.0.0.1:{}",
        w.up.addr.port(),
        w.daemon.transparent.port()
    );
    let ca = w.daemon.ca_path.display().to_string();
    let urls: Vec<String> = (0..200)
        .map(|i| format!("https://api.test:{}/echo?i={i}", w.up.addr.port()))
        .collect();
    let mut args: Vec<&str> = vec![
        "-sS",
        "--max-time",
        "60",
        "--cacert",
        &ca,
        "--connect-to",
        &connect_to,
        "-Z",
        "--parallel-max",
        "16",
        "-o",
        "/dev/null",
        "-w",
        "%{http_code}\n",
    ];
    for u in &urls {
        args.push("-o");
        args.push("/dev/null");
        args.push(u);
    }
    let out = tokio::process::Command::new("curl")
        .args(&args)
        .output()
        .await
        .expect("curl");
    let completed = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| *l == "200")
        .count();
    assert_eq!(completed, 200, "{}", String::from_utf8_lossy(&out.stderr));
    // At once: no grace period for a flush.
    w.daemon.kill9();
    let records = audit_requests(&w.daemon.audit_path());
    let seen: std::collections::HashSet<String> = records
        .iter()
        .filter_map(|r| r["path"].as_str().map(str::to_string))
        .collect();
    assert_eq!(records.len(), 200, "every completed request is in the log");
    assert!(seen.contains("/echo?i=[redacted]"));
    let files: Vec<PathBuf> = vec![w.daemon.audit_path()];
    let path = files[0].display().to_string();
    let (code, out, err) = w.daemon.ctl(&[], &["audit", "verify", &path]);
    assert_eq!(code, 0, "{out}{err}");
}
