//! `agenshield proxy exec -- CMD` end to end on Linux: the real daemon, a real TLS upstream on
//! loopback, real curl under the real sandbox (Landlock + seccomp; no root needed). What goes
//! through the proxy is policy-checked and audited; what tries to go around it (curl told to
//! ignore the proxy, with and without TCP Fast Open, and UDP) fails to connect, while the same
//! commands outside the sandbox reach the upstream, so the refusals are the sandbox's.
//! Without Landlock ABI 4 the test prints why it skips; under CI=true that is a failure.
#![cfg(target_os = "linux")]

use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use agenshield_e2e::daemon::{binary, Daemon, DaemonOptions};
use agenshield_e2e::pki::TestCa;
use agenshield_e2e::upstream::{Upstream, UpstreamOptions};

const LOCAL: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

const POLICY: &str = r#"
version = 1
default = "deny"

[[rule]]
id = "exec-upstream"
hosts = ["allowed.test"]
action = "allow"

[[rule]]
id = "no-admin"
hosts = ["allowed.test"]
paths = ["/admin/**"]
action = "deny"
priority = 10
"#;

struct Out {
    code: i32,
    stdout: String,
    stderr: String,
}

/// Runs `agenshield proxy exec --config CFG -- ARGS…` with a private cache directory and a
/// `NO_PROXY` that would exempt the upstream if exec let it through.
async fn exec(cfg: &Path, cache: &Path, args: &[&str]) -> Out {
    let mut cmd = tokio::process::Command::new(binary());
    cmd.args(["proxy", "exec", "--config"])
        .arg(cfg)
        .arg("--")
        .args(args)
        .env("XDG_CACHE_HOME", cache)
        .env("NO_PROXY", "allowed.test,127.0.0.1")
        .env("no_proxy", "allowed.test,127.0.0.1")
        .env_remove("HTTPS_PROXY")
        .env_remove("https_proxy")
        .env_remove("ALL_PROXY")
        .env_remove("all_proxy");
    let out = tokio::time::timeout(Duration::from_secs(60), cmd.output())
        .await
        .expect("exec finished in time")
        .expect("run agenshield");
    Out {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// curl with the status on the last line; no CA flag: trust comes from exec's bundle.
fn curl_args<'a>(url: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut a = vec!["curl", "-sS", "--max-time", "20", "-w", "\n%{http_code}"];
    a.extend_from_slice(extra);
    a.push(url);
    a
}

fn status_and_body(o: &Out) -> (String, String) {
    let (body, status) = o.stdout.rsplit_once('\n').unwrap_or(("", &o.stdout));
    (status.to_string(), body.to_string())
}

/// The daemon's config with the port its explicit listener really got (the test config asks
/// for port 0, which exec cannot use).
fn exec_config(daemon: &Daemon, dir: &Path) -> PathBuf {
    let d = daemon.dir.path();
    let text = format!(
        "[listen]\nexplicit = \"{}\"\nadmin = {:?}\n\n[paths]\npolicies = {:?}\ncerts = {:?}\nvault = {:?}\naudit = {:?}\n",
        daemon.explicit,
        daemon.socket(),
        d.join("policies"),
        d.join("certs"),
        d.join("vault"),
        daemon.audit_path()
    );
    let path = dir.join("exec.toml");
    std::fs::write(&path, text).expect("write exec config");
    path
}

fn audit_requests(path: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["kind"] == "request")
        .collect()
}

/// The audit record of the request for `path`, waiting up to 10 s for it to be written.
async fn audited(daemon: &Daemon, path: &str) -> serde_json::Value {
    for _ in 0..100 {
        if let Some(r) = audit_requests(&daemon.audit_path())
            .into_iter()
            .find(|r| r["path"] == path)
        {
            return r;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!(
        "no audit record for {path}; the log:\n{}",
        std::fs::read_to_string(daemon.audit_path()).unwrap_or_default()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_goes_through_the_proxy_and_cannot_go_around_it() {
    let upstream_ca = TestCa::new("exec upstream CA");
    let up = Upstream::start(UpstreamOptions {
        tls: Some(upstream_ca.leaf(&["allowed.test"])),
        name: "exec".into(),
        ..Default::default()
    })
    .await;
    let dir = tempfile::tempdir().expect("tempdir");
    let ca_file = dir.path().join("upstream-ca.pem");
    upstream_ca.write_pem(&ca_file).expect("write CA");
    let daemon = Daemon::start(DaemonOptions {
        policies: vec![("main.toml".into(), POLICY.into())],
        extra_ca: vec![ca_file.clone()],
        hosts: vec![("allowed.test".into(), LOCAL)],
        ..Default::default()
    });
    let cfg = exec_config(&daemon, dir.path());
    let cache = dir.path().join("cache");
    let port = up.addr.port();
    let url = |path: &str| format!("https://allowed.test:{port}{path}");
    let ca = ca_file.display().to_string();
    // For the commands that go around the proxy: the name as the upstream's address, and
    // trust in its CA, so only the network stands between them and the upstream.
    let resolve = format!("allowed.test:{port}:127.0.0.1");
    let direct = ["--noproxy", "*", "--resolve", &resolve, "--cacert", &ca];

    // Can this kernel confine at all? If not, exec must refuse (and we skip).
    let probe = exec(&cfg, &cache, &["true"]).await;
    if probe.code != 0 {
        assert_eq!(probe.code, 1, "{}", probe.stderr);
        assert!(
            probe.stderr.contains("not running the command unsandboxed"),
            "{}",
            probe.stderr
        );
        let reason = format!("exec cannot sandbox here: {}", probe.stderr.trim());
        if std::env::var("CI").is_ok_and(|v| v == "true") {
            panic!("{reason}; under CI=true a skip is a failure");
        }
        eprintln!("exec_goes_through_the_proxy_and_cannot_go_around_it: SKIPPED: {reason}");
        return;
    }

    // 1. Through the proxy: allowed, forwarded, audited.
    let u = url("/hello");
    let ok = exec(&cfg, &cache, &curl_args(&u, &[])).await;
    let (status, body) = status_and_body(&ok);
    assert_eq!(ok.code, 0, "{}", ok.stderr);
    assert_eq!(status, "200", "{}", ok.stdout);
    assert_eq!(body, "hello from exec\n");
    let seen = up.requests();
    assert!(
        seen.iter()
            .any(|r| r.path_and_query == "/hello" && r.sni.as_deref() == Some("allowed.test")),
        "the upstream got the request: {seen:?}"
    );
    let rec = audited(&daemon, "/hello").await;
    assert_eq!(rec["decision"], "allow", "{rec}");
    assert_eq!(rec["rule"], "exec-upstream", "{rec}");
    assert_eq!(rec["host"], "allowed.test", "{rec}");

    // 2. Through the proxy, denied by policy: the readable 403, and nothing upstream.
    let u = url("/admin/users");
    let denied = exec(&cfg, &cache, &curl_args(&u, &[])).await;
    let (status, body) = status_and_body(&denied);
    assert_eq!(denied.code, 0, "{}", denied.stderr);
    assert_eq!(status, "403", "{}", denied.stdout);
    let json: serde_json::Value = serde_json::from_str(&body).expect("deny body is JSON");
    assert_eq!(json["error_code"], "policy_denied", "{json}");
    assert_eq!(json["rule_id"], "no-admin", "{json}");
    assert_eq!(audited(&daemon, "/admin/users").await["decision"], "deny");
    assert!(!up
        .requests()
        .iter()
        .any(|r| r.path_and_query.starts_with("/admin")));

    // 3. Around the proxy. The control first: unsandboxed, the same curl reaches the upstream.
    let u = url("/direct-control");
    let mut control = tokio::process::Command::new("curl");
    control
        .args(curl_args(&u, &direct)[1..].iter())
        .env_remove("HTTPS_PROXY")
        .env_remove("https_proxy");
    let c = control.output().await.expect("run curl");
    assert!(c.status.success(), "{}", String::from_utf8_lossy(&c.stderr));
    assert!(up
        .requests()
        .iter()
        .any(|r| r.path_and_query == "/direct-control"));
    // Sandboxed it cannot connect: curl exit 7.
    let u = url("/direct");
    let around = exec(&cfg, &cache, &curl_args(&u, &direct)).await;
    assert_eq!(around.code, 7, "curl: couldn't connect: {}", around.stderr);
    // TCP Fast Open (curl's --tcp-fastopen) takes no other way out.
    let u = url("/direct-fastopen");
    let mut tfo = direct.to_vec();
    tfo.push("--tcp-fastopen");
    let around_tfo = exec(&cfg, &cache, &curl_args(&u, &tfo)).await;
    assert_eq!(around_tfo.code, 7, "{}", around_tfo.stderr);
    let seen: Vec<String> = up
        .requests()
        .into_iter()
        .map(|r| r.path_and_query)
        .collect();
    assert!(
        !seen
            .iter()
            .any(|p| p == "/direct" || p == "/direct-fastopen"),
        "nothing went around the proxy: {seen:?}"
    );
    // No UDP (so no DNS, no QUIC): bash's /dev/udp opens a UDP socket.
    let udp = exec(
        &cfg,
        &cache,
        &["bash", "-c", "echo x > /dev/udp/127.0.0.1/53"],
    )
    .await;
    assert_ne!(udp.code, 0, "UDP is refused");
    assert!(udp.stderr.contains("Permission denied"), "{}", udp.stderr);
    let udp_control = std::process::Command::new("bash")
        .args(["-c", "echo x > /dev/udp/127.0.0.1/9"])
        .status()
        .expect("bash");
    assert!(udp_control.success(), "UDP works outside the sandbox");

    // 4. The environment the command sees: the proxy, the bundle, no NO_PROXY.
    let env = exec(
        &cfg,
        &cache,
        &[
            "sh",
            "-c",
            "printf '%s|%s|%s|%s' \"$HTTPS_PROXY\" \"${NO_PROXY-unset}\" \"${no_proxy-unset}\" \"$CURL_CA_BUNDLE\"",
        ],
    )
    .await;
    assert_eq!(env.code, 0, "{}", env.stderr);
    let parts: Vec<&str> = env.stdout.split('|').collect();
    assert_eq!(parts[0], format!("http://{}", daemon.explicit));
    assert_eq!(parts[1..3], ["unset", "unset"]);
    let bundle = Path::new(parts[3]);
    assert!(bundle.starts_with(cache.join("agenshield")), "{}", parts[3]);
    let bundle_text = std::fs::read_to_string(bundle).expect("bundle");
    assert!(bundle_text.trim_end().ends_with(daemon.ca_pem.trim_end()));

    // 5. Exit codes pass through; a missing command is 127.
    let code = exec(&cfg, &cache, &["sh", "-c", "exit 42"]).await;
    assert_eq!(code.code, 42, "{}", code.stderr);
    let missing = exec(&cfg, &cache, &["agenshield-no-such-command"]).await;
    assert_eq!(missing.code, 127);
    assert!(
        missing
            .stderr
            .contains("agenshield-no-such-command: command not found"),
        "{}",
        missing.stderr
    );

    // The daemon stopped: exec says so, and the command never runs.
    let mut daemon = daemon;
    daemon.stop();
    let marker = dir.path().join("ran");
    let script = format!("touch {}", marker.display());
    let down = exec(&cfg, &cache, &["sh", "-c", &script]).await;
    assert_eq!(down.code, 1, "{}", down.stderr);
    assert!(
        down.stderr.contains("no proxy answers on")
            && down.stderr.contains("is the daemon running?"),
        "{}",
        down.stderr
    );
    assert!(!marker.exists(), "the command ran with no proxy");
}

#[tokio::test]
async fn exec_needs_the_ca_and_a_real_port() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cache = dir.path().join("cache");
    let write = |name: &str, explicit: &str| {
        let p = dir.path().join(name);
        std::fs::write(
            &p,
            format!(
                "[listen]\nexplicit = \"{explicit}\"\n[paths]\ncerts = {:?}\n",
                dir.path().join("certs")
            ),
        )
        .expect("write config");
        p
    };
    let port0 = exec(&write("port0.toml", "127.0.0.1:0"), &cache, &["true"]).await;
    assert_eq!(port0.code, 2, "{}", port0.stderr);
    assert!(port0.stderr.contains("listen.explicit"), "{}", port0.stderr);
    let no_ca = exec(&write("noca.toml", "127.0.0.1:15080"), &cache, &["true"]).await;
    // Without a sandbox the message is about that (and the CA is never reached).
    assert_eq!(no_ca.code, 1, "{}", no_ca.stderr);
    assert!(
        no_ca.stderr.contains("no CA certificate at")
            || no_ca.stderr.contains("not running the command unsandboxed"),
        "{}",
        no_ca.stderr
    );
}
