//! A hostile or broken agent, against the real daemon: protocol upgrades other than WebSocket,
//! path tricks with segment parameters, escapes that are data, a crafted audit log. Each
//! refusal is a JSON body and a record; nothing refused reaches the upstream.

use agenshield_e2e::audit;
#[cfg(target_os = "linux")]
use agenshield_e2e::curl::curl;
use agenshield_e2e::curl::CurlOut;
use agenshield_e2e::daemon::{Daemon, DaemonOptions};
use agenshield_e2e::upstream::{echo_server, UpstreamOptions};
use agenshield_e2e::world::{ApiUpstream, World};
use serde_json::Value;

const POLICY: &str = r#"
version = 1
default = "deny"

[[rule]]
id = "api"
hosts = ["api.test"]
action = "allow"

[[rule]]
id = "no-private"
hosts = ["api.test"]
paths = ["/private", "/private/**"]
action = "deny"
priority = 10
"#;

/// The hardening suite's upstream: plain, named `up`.
fn up_options() -> UpstreamOptions {
    UpstreamOptions {
        name: "up".into(),
        ..Default::default()
    }
}

/// The suite's world, with `[limits]` lines of its own.
async fn world(limits: &[&str]) -> World {
    let api = ApiUpstream::start(
        "hardening upstream CA",
        &["api.test", "127.0.0.1"],
        up_options(),
    )
    .await;
    let mut options = api.daemon_options(POLICY);
    options.limits.extend(limits.iter().map(|l| l.to_string()));
    api.world(options)
}

/// curl to `https://api.test:PORT{path}` through the transparent listener, the path as
/// given (no dot-segment clean-up by curl).
async fn get(w: &World, path: &str, extra: &[&str]) -> CurlOut {
    let extra = [&["--path-as-is"][..], extra].concat();
    w.transparent("https", "api.test", path, &extra).await
}

fn seen(w: &World, path: &str) -> bool {
    w.requests().iter().any(|r| r.path_and_query == path)
}

fn records(w: &World) -> Vec<Value> {
    audit::lines(&w.daemon.audit_path())
        .into_iter()
        .filter(|v| v["kind"] == "request")
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_websocket_may_be_switched_to() {
    let w = world(&[]).await;
    let h2c = [
        "--http1.1",
        "-H",
        "Connection: Upgrade, HTTP2-Settings",
        "-H",
        "Upgrade: h2c",
        "-H",
        "HTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA",
    ];
    let out = get(&w, "/echo/h2c", &h2c).await;
    assert_eq!(out.status, 403, "{out:?}");
    assert_eq!(out.json()["error_code"], "upgrade_refused");
    // A list with one protocol not allowed is refused whole: the upstream picks.
    let mixed = [
        "--http1.1",
        "-H",
        "Connection: Upgrade",
        "-H",
        "Upgrade: websocket, h2c",
    ];
    let out = get(&w, "/echo/mixed", &mixed).await;
    assert_eq!(out.status, 403, "{out:?}");
    assert!(
        !seen(&w, "/echo/h2c") && !seen(&w, "/echo/mixed"),
        "nothing reached the upstream"
    );
    let refused: Vec<Value> = records(&w)
        .into_iter()
        .filter(|v| v["error_code"] == "upgrade_refused")
        .collect();
    assert_eq!(refused.len(), 2, "{refused:#?}");
    assert_eq!(refused[0]["decision"], "deny");
    assert_eq!(refused[0]["upgrade"], "h2c");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn segment_parameters_cannot_reach_a_denied_path() {
    let w = world(&[]).await;
    for path in [
        "/private/x",
        "/private;jsessionid=1/x",
        "/private;/x",
        "/private%3Bx/y",
        "/PRIVATE/../private;/x",
    ] {
        let out = get(&w, path, &[]).await;
        assert_eq!(out.status, 403, "{path}: {out:?}");
        assert_eq!(out.json()["rule_id"], "no-private", "{path}");
    }
    // `..;` is `..` to some servers and a name to others: refused whatever it hides.
    for path in ["/public/..;/private/x", "/x/..%3B/private"] {
        let out = get(&w, path, &[]).await;
        assert_eq!(out.status, 400, "{path}: {out:?}");
        assert_eq!(out.json()["error_code"], "bad_request", "{path}");
    }
    assert!(
        w.up.requests()
            .iter()
            .all(|r| !r.path_and_query.contains("private")),
        "no private path reached the upstream: {:?}",
        w.up.requests()
    );
    // A parameter on an allowed path is not a refusal.
    let out = get(&w, "/echo;v=1", &[]).await;
    assert_eq!(out.status, 200, "{out:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_escaped_question_mark_is_data_not_a_refusal() {
    let w = world(&[]).await;
    let out = get(&w, "/echo/a%3Fb", &[]).await;
    assert_eq!(out.status, 200, "{out:?}");
    assert_eq!(out.json()["path"], "/echo/a%3Fb", "forwarded as sent");
    let out = get(&w, "/echo/c%23d", &[]).await;
    assert_eq!(out.status, 200, "{out:?}");
}

/// A line sealed as `docs/audit.md` says: SHA-256 (hex) of the bytes up to `,"hash":`.
fn sealed(body: &str, prev: &str) -> (String, String) {
    use sha2::Digest;
    let open = format!("{body},\"prev\":\"{prev}\"");
    let hash: String = sha2::Sha256::digest(open.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    (format!("{open},\"hash\":\"{hash}\"}}\n"), hash)
}

#[test]
fn a_crafted_sequence_number_is_reported_as_a_break() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("crafted.jsonl");
    let entry = r#""kind":"stop","version":"0.1.0","pid":1,"policy":"sha256:0""#;
    let genesis = "0".repeat(64);
    // Sealed and chained correctly; only the numbers are impossible: u64::MAX, then 0.
    let (l1, h1) = sealed(
        &format!(
            "{{\"v\":2,\"seq\":{},\"time\":\"2026-11-23T10:00:00.000Z\",{entry}",
            u64::MAX
        ),
        &genesis,
    );
    let (l2, _) = sealed(
        &format!("{{\"v\":2,\"seq\":0,\"time\":\"2026-11-23T10:00:00.001Z\",{entry}"),
        &h1,
    );
    std::fs::write(&path, l1 + &l2).expect("write");
    let out = std::process::Command::new(agenshield_e2e::daemon::binary())
        .args(["proxy", "ctl", "audit", "verify"])
        .arg(&path)
        .output()
        .expect("run ctl");
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "reported, not a panic: {text}");
    assert!(text.contains("crafted.jsonl:2:"), "the second line: {text}");
    assert!(text.contains("jumps"), "{text}");
}

/// Unmounts when dropped, pass or fail.
#[cfg(target_os = "linux")]
struct Mounted(std::path::PathBuf);

#[cfg(target_os = "linux")]
impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .status();
    }
}

#[cfg(target_os = "linux")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
// The guard serialises the root tests for the whole test; no task of this test takes it.
#[allow(clippy::await_holding_lock)]
async fn with_the_audit_logs_disk_full_a_post_never_reaches_the_upstream() {
    use agenshield_e2e::netlab::{root_or_skip, sh};
    let Some(_serial) = root_or_skip("audit_disk_full") else {
        return;
    };
    let mnt = tempfile::tempdir().expect("tempdir");
    let dir = mnt.path().to_path_buf();
    sh(&[
        "mount",
        "-t",
        "tmpfs",
        "-o",
        "size=1m,mode=0755",
        "agenshield-audit-test",
        dir.to_str().expect("utf-8"),
    ]);
    let _mounted = Mounted(dir.clone());
    let api = ApiUpstream::start("disk-full upstream CA", &["api.test"], up_options()).await;
    let options = DaemonOptions {
        audit_path: Some(dir.join("audit.jsonl")),
        ..api.daemon_options(POLICY)
    };
    let w = api.world(options);
    let body = state_body();
    let post = |path: &'static str| {
        let w = &w;
        let body = body.clone();
        async move {
            let data = format!("@{}", body.display());
            get(
                w,
                path,
                &[
                    "--data-binary",
                    &data,
                    "-H",
                    "Content-Type: application/octet-stream",
                ],
            )
            .await
        }
    };
    let out = post("/echo/before").await;
    assert_eq!(out.status, 200, "{out:?}");

    // Fill the (1 MiB) file system to 8 KiB free: under the eighth the log must keep free.
    let st = nix::sys::statvfs::statvfs(&dir).expect("statvfs");
    let free = st.blocks_available() * st.fragment_size();
    let filler = dir.join("filler");
    std::fs::write(&filler, vec![0u8; (free - 8 * 1024) as usize]).expect("fill");
    tokio::time::sleep(std::time::Duration::from_millis(400)).await;
    let out = post("/echo/while-full").await;
    assert_eq!(out.status, 503, "{out:?}");
    assert_eq!(out.json()["error_code"], "audit_unavailable");
    assert!(
        !seen(&w, "/echo/while-full"),
        "the POST never reached the upstream"
    );
    let (code, status, _) = w.daemon.ctl(&[], &["status", "--json"]);
    assert_eq!(code, 0);
    let status: Value = serde_json::from_str(&status).expect("json");
    assert_eq!(status["audit"]["ready"], false, "{status}");
    let metrics = curl(&[&format!("http://{}/metrics", w.daemon.metrics)], false)
        .await
        .text();
    assert!(
        metrics.contains("agenshield_proxy_audit_ready 0"),
        "{metrics}"
    );

    // Room again: requests go through again, and every one of them is in the log.
    std::fs::remove_file(&filler).expect("free");
    tokio::time::sleep(std::time::Duration::from_millis(400)).await;
    let out = post("/echo/after").await;
    assert_eq!(out.status, 200, "{out:?}");
    let lines = audit::lines(&w.daemon.audit_path());
    for path in ["/echo/before", "/echo/while-full", "/echo/after"] {
        assert!(
            lines.iter().any(|l| l["path"] == path),
            "{path} is recorded: {lines:#?}"
        );
    }
}

/// A 1 MiB request body, in a file curl can read.
#[cfg(target_os = "linux")]
fn state_body() -> std::path::PathBuf {
    let path = std::env::temp_dir().join(format!("agenshield-post-{}", std::process::id()));
    if !path.exists() {
        std::fs::write(&path, vec![b'p'; 1 << 20]).expect("body");
    }
    path
}

/// The rule `ctl policy check` says decides `GET https://api.test/`.
fn deciding_rule(d: &Daemon) -> String {
    let (code, out, err) = d.ctl(
        &[],
        &["policy", "check", "GET", "https://api.test/", "--json"],
    );
    assert_eq!(code, 0, "{err}");
    let v: Value = serde_json::from_str(&out).expect("json");
    v["rule_id"]
        .as_str()
        .expect("a decision names its rule")
        .to_string()
}

/// Waits (bounded) for `want` to decide; how long it took.
fn until_rule(d: &Daemon, want: &str, within: std::time::Duration) -> std::time::Duration {
    let started = std::time::Instant::now();
    loop {
        if deciding_rule(d) == want {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < within,
            "rule {want} not in force within {within:?} (got {})",
            deciding_rule(d)
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

fn policy_named(id: &str) -> String {
    format!("version = 1\ndefault = \"deny\"\n[[rule]]\nid = \"{id}\"\nhosts = [\"api.test\"]\naction = \"allow\"\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_policy_watcher_follows_a_directory_that_is_replaced() {
    let w = world(&[]).await;
    let d = &w.daemon;
    let policies = d.dir.path().join("policies");
    let second = std::time::Duration::from_secs(5);
    assert_eq!(deciding_rule(d), "api");

    // Rename-swapped, as a deploy does: the new directory is in force…
    let new = d.dir.path().join("policies.new");
    std::fs::create_dir(&new).expect("mkdir");
    std::fs::write(new.join("main.toml"), policy_named("swapped")).expect("write");
    let old = d.dir.path().join("policies.old");
    std::fs::rename(&policies, &old).expect("mv policies policies.old");
    std::fs::rename(&new, &policies).expect("mv policies.new policies");
    until_rule(d, "swapped", second);
    // …and an edit inside it takes effect within 200 ms.
    std::fs::write(policies.join("main.toml"), policy_named("edited")).expect("edit");
    let took = until_rule(d, "edited", second);
    assert!(
        took < std::time::Duration::from_millis(200),
        "took {took:?}"
    );
    // Edits to the old directory are not the policy any more.
    std::fs::write(old.join("main.toml"), policy_named("stale")).expect("edit old");

    // Deleted and recreated.
    std::fs::remove_dir_all(&policies).expect("rm -rf");
    std::thread::sleep(std::time::Duration::from_millis(100));
    std::fs::create_dir(&policies).expect("mkdir");
    std::fs::write(policies.join("main.toml"), policy_named("recreated")).expect("write");
    until_rule(d, "recreated", second);
    std::fs::write(policies.join("main.toml"), policy_named("again")).expect("edit");
    let took = until_rule(d, "again", second);
    assert!(
        took < std::time::Duration::from_millis(200),
        "took {took:?}"
    );

    let (code, out, _) = d.ctl(&[], &["status", "--json"]);
    assert_eq!(code, 0);
    let v: Value = serde_json::from_str(&out).expect("json");
    assert_eq!(v["policy"]["watch"]["active"], true, "{v}");
    assert!(v["policy"]["watch"]["rearmed"].as_u64() >= Some(2), "{v}");
    let (_, human, _) = d.ctl(&[], &["status"]);
    assert!(human.contains("hot reload    watching"), "{human}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_that_denies_a_host_closes_its_open_tunnels() {
    use futures_util::{SinkExt, StreamExt};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio_tungstenite::tungstenite::Message;
    let echo = echo_server().await;
    let w = world(&[]).await;
    let d = &w.daemon;
    let both = format!(
        "{POLICY}\n[[rule]]\nid = \"raw\"\nhosts = [\"127.0.0.1\"]\nports = [{}]\nschemes = [\"tcp\"]\naction = \"allow\"\n",
        echo.port()
    );
    std::fs::write(d.dir.path().join("policies/main.toml"), &both).expect("policy");
    let (code, _, err) = d.ctl(&[], &["reload"]);
    assert_eq!(code, 0, "{err}");

    // A WebSocket to api.test through the transparent listener…
    let tls = tokio_rustls::TlsConnector::from(agenshield_e2e::pki::client_config(
        &[&d.ca_pem],
        &[b"http/1.1"],
    ));
    let tcp = tokio::net::TcpStream::connect(d.transparent)
        .await
        .expect("connect");
    let stream = tls
        .connect(
            rustls_pki_types::ServerName::try_from("api.test").expect("name"),
            tcp,
        )
        .await
        .expect("TLS");
    let url = format!("wss://api.test:{}/ws", w.up.addr.port());
    let (mut ws, _) = tokio_tungstenite::client_async(url.as_str(), stream)
        .await
        .expect("websocket");
    ws.send(Message::text("ping")).await.expect("send");
    assert!(ws.next().await.is_some(), "echo");
    // …and raw TCP to the echo server through a CONNECT tunnel.
    let mut raw = tokio::net::TcpStream::connect(d.explicit)
        .await
        .expect("connect");
    let connect = format!("CONNECT {echo} HTTP/1.1\r\nHost: {echo}\r\n\r\n");
    raw.write_all(connect.as_bytes()).await.expect("write");
    // The response head, byte by byte: nothing of the tunnel may be read ahead.
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let mut b = [0u8; 1];
        raw.read_exact(&mut b).await.expect("read");
        head.push(b[0]);
    }
    assert!(
        head.starts_with(b"HTTP/1.1 200"),
        "{:?}",
        String::from_utf8_lossy(&head)
    );
    raw.write_all(b"\x01raw").await.expect("write");
    let mut got = [0u8; 4];
    raw.read_exact(&mut got).await.expect("echo");
    let (_, status, _) = d.ctl(&[], &["status", "--json"]);
    let status: Value = serde_json::from_str(&status).expect("json");
    assert_eq!(status["tunnels"], 2, "{status}");

    // The policy no longer allows either: both are closed, and their ends recorded.
    let none = "version = 1\ndefault = \"deny\"\n[[rule]]\nid = \"other\"\nhosts = [\"other.test\"]\naction = \"allow\"\n";
    std::fs::write(d.dir.path().join("policies/main.toml"), none).expect("policy");
    let within = std::time::Duration::from_secs(5);
    let ws_end =
        tokio::time::timeout(within, async { while let Some(Ok(_)) = ws.next().await {} }).await;
    assert!(ws_end.is_ok(), "the WebSocket was closed");
    let mut rest = Vec::new();
    let raw_end = tokio::time::timeout(within, raw.read_to_end(&mut rest)).await;
    assert!(raw_end.is_ok(), "the raw TCP relay was closed");
    let deadline = std::time::Instant::now() + within;
    let revoked = loop {
        let revoked: Vec<Value> = audit::lines(&d.audit_path())
            .into_iter()
            .filter(|v| v["end"] == "revoked")
            .collect();
        if revoked.len() == 2 || std::time::Instant::now() > deadline {
            break revoked;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    assert_eq!(revoked.len(), 2, "{revoked:#?}");
    assert!(revoked.iter().any(|v| v["protocol"] == "tcp"));
    assert!(revoked.iter().any(|v| v["upgrade"] == "websocket"));
    audit::assert_matches_schema(&audit::lines(&d.audit_path()));
}

/// Opens `n` TLS connections to `addr` (SNI api.test, trusting `ca`), at most 200 at a time,
/// holds those that opened for `hold` seconds, and prints how many opened.
#[cfg(target_os = "linux")]
const HOLDER: &str = r#"
import asyncio, ssl, sys
host, port, n, ca, hold = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], float(sys.argv[5])
ctx = ssl.create_default_context(cafile=ca)
held, gate = [], asyncio.Semaphore(200)
async def one():
    async with gate:
        try:
            _, w = await asyncio.wait_for(
                asyncio.open_connection(host, port, ssl=ctx, server_hostname="api.test"), 10)
            held.append(w)
        except Exception:
            pass
async def main():
    await asyncio.gather(*[one() for _ in range(n)])
    print(len(held), flush=True)
    await asyncio.sleep(hold)
asyncio.run(main())
"#;

#[cfg(target_os = "linux")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
// The guard serialises the root tests for the whole test; no task of this test takes it.
#[allow(clippy::await_holding_lock)]
async fn one_agent_holding_thousands_of_idle_connections_cannot_lock_out_another() {
    use agenshield_e2e::netlab::{root_or_skip, AgentUser};
    use std::io::BufRead;
    let Some(_serial) = root_or_skip("connection_budget") else {
        return;
    };
    let hog = AgentUser::create(91);
    // The held connections never send a request: they must not be cut (and their seats given
    // to more of the hog's) by the first-request timeout while the hog is still opening.
    let w = world(&["first_request_timeout = \"120s\""]).await;
    let d = &w.daemon;
    // The agent may read our CA (a copy in a directory it can enter).
    let share = tempfile::tempdir().expect("tempdir");
    let ca = share.path().join("ca.pem");
    std::fs::copy(&d.ca_path, &ca).expect("copy CA");
    let open = |p: &std::path::Path, mode: u32| {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).expect("chmod");
    };
    open(share.path(), 0o755);
    open(&ca, 0o644);
    let mut cmd = std::process::Command::new(&hog.as_agent()[0]);
    cmd.args(&hog.as_agent()[1..])
        // The system Python (Debian's python3): the agent cannot run a per-user install.
        .args(["/usr/bin/python3", "-c", HOLDER, "127.0.0.1"])
        .arg(d.transparent.port().to_string())
        .args(["5000", ca.to_str().expect("utf-8"), "20"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null());
    let mut holder = cmd.spawn().expect("python3 as the agent");
    let stdout = holder.stdout.take().expect("stdout");
    let opened: usize = tokio::task::spawn_blocking(move || {
        let mut line = String::new();
        std::io::BufReader::new(stdout)
            .read_line(&mut line)
            .expect("read");
        line.trim().parse().unwrap_or(0)
    })
    .await
    .expect("join");
    // Its budget (max_connections_per_agent, 1024) held; the rest were closed at once.
    assert!((900..=1024).contains(&opened), "the agent held {opened}");

    // Another uid (this test's) is served at once.
    let started = std::time::Instant::now();
    let out = get(&w, "/echo/other-uid", &["--max-time", "5"]).await;
    let took = started.elapsed();
    let _ = holder.kill();
    let _ = holder.wait();
    assert_eq!(out.status, 200, "{out:?}");
    assert!(
        took < std::time::Duration::from_secs(1),
        "served after {took:?}"
    );

    let refused: Vec<Value> = audit::lines(&d.audit_path())
        .into_iter()
        .filter(|v| v["error_code"] == "connection_budget")
        .collect();
    assert!(
        refused.len() >= 5000 - 1024,
        "{} refusals recorded",
        refused.len()
    );
    assert!(refused
        .iter()
        .all(|v| v["agent_uid"] == hog.uid && v["decision"] == "limited"));
    let metrics = curl(&[&format!("http://{}/metrics", d.metrics)], false)
        .await
        .text();
    assert!(
        metrics
            .contains("agenshield_proxy_connections_refused_total{reason=\"connection_budget\"}"),
        "{metrics}"
    );
}

/// A TLS session to the transparent listener for api.test, offering `alpn`.
async fn tls_session(
    d: &Daemon,
    alpn: &[u8],
) -> tokio_rustls::client::TlsStream<tokio::net::TcpStream> {
    let tls =
        tokio_rustls::TlsConnector::from(agenshield_e2e::pki::client_config(&[&d.ca_pem], &[alpn]));
    let tcp = tokio::net::TcpStream::connect(d.transparent)
        .await
        .expect("connect");
    tls.connect(
        rustls_pki_types::ServerName::try_from("api.test").expect("name"),
        tcp,
    )
    .await
    .expect("TLS")
}

/// Reads until the server closes; how long that took (bounded by `within`).
async fn closed_after<S: tokio::io::AsyncRead + Unpin>(
    s: &mut S,
    within: std::time::Duration,
) -> std::time::Duration {
    use tokio::io::AsyncReadExt;
    let started = std::time::Instant::now();
    let mut sink = [0u8; 4096];
    loop {
        match tokio::time::timeout_at(tokio::time::Instant::now() + within, s.read(&mut sink)).await
        {
            Ok(Ok(0)) | Ok(Err(_)) => return started.elapsed(),
            Ok(Ok(_)) => {}
            Err(_) => panic!("still open after {within:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_are_closed_and_keep_alive_outlives_the_head_timeout() {
    use std::time::Duration;
    use tokio::io::AsyncWriteExt;
    let api = ApiUpstream::start("timeouts upstream CA", &["api.test"], up_options()).await;
    let d = Daemon::start(DaemonOptions {
        limits: vec![
            "first_request_timeout = \"1s\"".into(),
            "header_read_timeout = \"1s\"".into(),
            "idle_timeout = \"3s\"".into(),
        ],
        ..api.daemon_options(POLICY)
    });
    let bound = Duration::from_secs(10);

    // A TLS session that never asks anything (HTTP/1.1, and HTTP/2 with no stream).
    let mut s = tls_session(&d, b"http/1.1").await;
    let took = closed_after(&mut s, bound).await;
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(3),
        "h1: {took:?}"
    );
    let mut s = tls_session(&d, b"h2").await;
    s.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")
        .await
        .expect("preface");
    // The server says GOAWAY and waits for the client to acknowledge its PING; this bare
    // client never does, so the close comes when the grace period (5 s) ends.
    let took = closed_after(&mut s, bound).await;
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(7),
        "h2: {took:?}"
    );

    // A head that starts and never ends.
    let mut s = tls_session(&d, b"http/1.1").await;
    s.write_all(b"GET /echo HTTP/1.1\r\nHost: api.test\r\n")
        .await
        .expect("write");
    let took = closed_after(&mut s, bound).await;
    assert!(took < Duration::from_secs(3), "slow head: {took:?}");

    // Keep-alive: idle past the head timeout is fine; past the idle timeout it is closed.
    let mut s = tls_session(&d, b"http/1.1").await;
    let ask = b"GET /echo HTTP/1.1\r\nHost: api.test\r\n\r\n";
    s.write_all(ask).await.expect("write");
    assert!(answer(&mut s, bound).await.starts_with("HTTP/1.1 200"));
    tokio::time::sleep(Duration::from_secs(2)).await;
    s.write_all(ask).await.expect("write after 2 s idle");
    assert!(
        answer(&mut s, bound).await.starts_with("HTTP/1.1 200"),
        "kept alive past 1 s"
    );
    let took = closed_after(&mut s, bound).await;
    assert!(
        took >= Duration::from_millis(2900) && took < Duration::from_secs(5),
        "idle: {took:?}"
    );
}

/// What the server sends next (one read).
async fn answer<S: tokio::io::AsyncRead + Unpin>(s: &mut S, within: std::time::Duration) -> String {
    use tokio::io::AsyncReadExt;
    let mut buf = vec![0u8; 65536];
    let n = tokio::time::timeout(within, s.read(&mut buf))
        .await
        .expect("answer in time")
        .expect("read");
    String::from_utf8_lossy(&buf[..n]).to_string()
}

/// A burst of connections larger than tokio's default listen backlog (1024) is queued by the
/// kernel, not dropped: every listener is made with a backlog of 4096 (capped by somaxconn).
#[cfg(target_os = "linux")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listeners_queue_a_burst_of_connections() {
    let w = world(&[]).await;
    let somaxconn: u32 = std::fs::read_to_string("/proc/sys/net/core/somaxconn")
        .expect("somaxconn")
        .trim()
        .parse()
        .expect("number");
    for addr in [w.daemon.transparent, w.daemon.explicit] {
        let filter = format!("sport = :{}", addr.port());
        let out = std::process::Command::new("ss")
            .args(["-Hltn", &filter])
            .output()
            .expect("ss (iproute2)");
        let text = String::from_utf8_lossy(&out.stdout);
        // For a listening socket, Send-Q is its backlog.
        let backlog: u32 = text
            .split_whitespace()
            .nth(2)
            .and_then(|q| q.parse().ok())
            .unwrap_or_else(|| panic!("no listener in ss output: {text:?}"));
        assert_eq!(backlog, somaxconn.min(4096), "{addr}: {text}");
    }
}
