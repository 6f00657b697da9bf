//! A real nginx that ends its HTTP/2 connections with `GOAWAY(NO_ERROR)` every hundred
//! requests (`keepalive_requests 100`), under a hundred POSTs at a time from curl through both
//! listeners, over HTTP/2 and HTTP/1.1 from the agent: every request is answered 200 and
//! processed by the upstream exactly once. The streams the proxy opened on a connection whose
//! GOAWAY was already on its way are above the frame's last stream id, so nginx provably did not
//! process them: they are sent again (and counted), never failed, and nothing nginx may have
//! processed is ever sent twice.

use std::collections::HashMap;
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use agenshield_e2e::daemon::{Daemon, DaemonOptions};
use agenshield_e2e::pki::TestCa;
use agenshield_e2e::world::LOCAL;

const POLICY: &str =
    "version = 1\ndefault = \"deny\"\n[[rule]]\nid = \"api\"\nhosts = [\"api.test\"]\naction = \"allow\"\n";

/// Runs of 4,000 requests each (1,000 per listener and agent protocol), in one daemon: about
/// 5 s a run on an idle 2-core machine with a debug build. Before the fix every run lost 2-36
/// requests to a 502.
const RUNS: usize = 10;
const PER_WAY: usize = 1000;
const PARALLEL: &str = "100";

/// nginx on a loopback port of its own, in one process (`master_process off`) so that the
/// test's kill ends it, logging every request's `id` query argument.
struct Nginx {
    child: Child,
    addr: SocketAddr,
    access_log: PathBuf,
}

impl Nginx {
    fn start(dir: &Path, ca: &TestCa) -> Nginx {
        let (pem, key) = (dir.join("up.pem"), dir.join("up.key"));
        ca.leaf(&["api.test"])
            .write_pems(&pem, &key)
            .expect("write leaf");
        for t in ["body", "proxy", "fastcgi", "uwsgi", "scgi"] {
            std::fs::create_dir_all(dir.join(t)).expect("temp dir");
        }
        let access_log = dir.join("access.log");
        let error_log = dir.join("error.log");
        // A free port, given to nginx (which cannot report one it chose); tried again if another
        // process takes it in between.
        for _ in 0..5 {
            let port = TcpListener::bind((LOCAL, 0))
                .and_then(|l| l.local_addr())
                .expect("free port")
                .port();
            let addr = SocketAddr::new(LOCAL, port);
            let conf = dir.join("nginx.conf");
            std::fs::write(
                &conf,
                config(dir, addr, &pem, &key, &access_log, &error_log),
            )
            .expect("write nginx.conf");
            let mut child = Command::new("nginx")
                .arg("-p")
                .arg(dir)
                .arg("-e")
                .arg(&error_log)
                .arg("-c")
                .arg(&conf)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("nginx runs (is nginx-light installed?)");
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                if let Ok(Some(status)) = child.try_wait() {
                    eprintln!(
                        "nginx exited ({status}): {}",
                        std::fs::read_to_string(&error_log).unwrap_or_default()
                    );
                    break;
                }
                if std::net::TcpStream::connect(addr).is_ok() {
                    return Nginx {
                        child,
                        addr,
                        access_log,
                    };
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        panic!("nginx did not start");
    }

    /// How many times nginx processed each id, from its access log.
    fn processed(&self) -> HashMap<String, usize> {
        let log = std::fs::read_to_string(&self.access_log).expect("access log");
        let mut seen = HashMap::new();
        for line in log.lines() {
            if let Some(id) = line.split_whitespace().next() {
                *seen.entry(id.to_string()).or_insert(0) += 1;
            }
        }
        seen
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// HTTP/2 over TLS, a GOAWAY(NO_ERROR) after every hundredth request on a connection, and an
/// access log line per processed request: `id method status protocol connection n`.
fn config(
    dir: &Path,
    addr: SocketAddr,
    pem: &Path,
    key: &Path,
    access_log: &Path,
    error_log: &Path,
) -> String {
    let d = dir.display();
    format!(
        "daemon off;
master_process off;
worker_processes 1;
pid {d}/nginx.pid;
error_log {error_log} warn;
events {{ worker_connections 4096; }}
http {{
  log_format ids '$arg_id $request_method $status $server_protocol $connection $connection_requests';
  access_log {access_log} ids;
  client_body_temp_path {d}/body;
  proxy_temp_path {d}/proxy;
  fastcgi_temp_path {d}/fastcgi;
  uwsgi_temp_path {d}/uwsgi;
  scgi_temp_path {d}/scgi;
  keepalive_requests 100;
  keepalive_timeout 60s;
  server {{
    listen {addr} ssl http2;
    ssl_certificate {pem};
    ssl_certificate_key {key};
    location / {{ return 200 \"ok\\n\"; }}
  }}
}}
",
        error_log = error_log.display(),
        access_log = access_log.display(),
        pem = pem.display(),
        key = key.display(),
    )
}

/// The ways into the proxy: listener × the agent's HTTP version.
#[derive(Clone, Copy, Debug)]
enum Way {
    ExplicitH2,
    ExplicitH1,
    TransparentH2,
    TransparentH1,
}

impl Way {
    const ALL: [Way; 4] = [
        Way::ExplicitH2,
        Way::ExplicitH1,
        Way::TransparentH2,
        Way::TransparentH1,
    ];

    fn name(self) -> &'static str {
        match self {
            Way::ExplicitH2 => "explicit-h2",
            Way::ExplicitH1 => "explicit-h1",
            Way::TransparentH2 => "transparent-h2",
            Way::TransparentH1 => "transparent-h1",
        }
    }
}

/// `PER_WAY` POSTs with ids `r{run}-{way}-{n}`, a hundred at a time, through `way`: each
/// request's (status, id), and what curl said on stderr.
async fn post_all(
    d: &Daemon,
    up: SocketAddr,
    run: usize,
    way: Way,
) -> (Vec<(u16, String)>, String) {
    let ca = d.ca_path.display().to_string();
    let proxy = format!("http://{}", d.explicit);
    let connect_to = format!("api.test:{}:127.0.0.1:{}", up.port(), d.transparent.port());
    let url = format!(
        "https://api.test:{}/post?id=r{run}-{}-[1-{PER_WAY}]",
        up.port(),
        way.name()
    );
    let mut cmd = tokio::process::Command::new("curl");
    cmd.args(["-sS", "--max-time", "60", "--cacert", &ca])
        .args(["-Z", "--parallel-max", PARALLEL])
        .args(["-X", "POST", "--data-binary", "a request with a body"])
        .args(["-o", "/dev/null", "-w", "%{http_code} %{url_effective}\n"]);
    match way {
        Way::ExplicitH2 | Way::ExplicitH1 => cmd.args(["--proxy", &proxy]),
        Way::TransparentH2 | Way::TransparentH1 => cmd.args(["--connect-to", &connect_to]),
    };
    match way {
        Way::ExplicitH2 | Way::TransparentH2 => cmd.arg("--http2"),
        Way::ExplicitH1 | Way::TransparentH1 => cmd.arg("--http1.1"),
    };
    let out = tokio::time::timeout(
        Duration::from_secs(120),
        cmd.arg(&url)
            .env_remove("http_proxy")
            .env_remove("https_proxy")
            .env_remove("HTTPS_PROXY")
            .env_remove("ALL_PROXY")
            .env_remove("all_proxy")
            .output(),
    )
    .await
    .expect("curl finished in time")
    .expect("curl runs");
    let got: Vec<(u16, String)> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let (code, url) = l.split_once(' ')?;
            let id = url.rsplit_once("id=")?.1;
            Some((code.parse().unwrap_or(0), id.to_string()))
        })
        .collect();
    assert_eq!(
        got.len(),
        PER_WAY,
        "curl reported every request: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    (got, String::from_utf8_lossy(&out.stderr).into_owned())
}

/// The sum of `agenshield_proxy_upstream_retries_total` over its reasons.
async fn retries_metric(d: &Daemon) -> u64 {
    let url = format!("http://{}/metrics", d.metrics);
    let text = agenshield_e2e::curl::curl(&[&url], false).await.text();
    text.lines()
        .filter(|l| l.starts_with("agenshield_proxy_upstream_retries_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nginx_goaway_every_hundred_requests_costs_no_request_and_none_runs_twice() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ca = TestCa::new("goaway upstream CA");
    let ca_file = dir.path().join("upstream-ca.pem");
    ca.write_pem(&ca_file).expect("write CA");
    let nginx = Nginx::start(dir.path(), &ca);
    let daemon = Daemon::start(DaemonOptions {
        policies: vec![("main.toml".into(), POLICY.into())],
        extra_ca: vec![ca_file],
        hosts: vec![("api.test".into(), LOCAL)],
        orig_dst: Some(nginx.addr),
        // The pool's retries (debug) and every request's line; not every h2 frame (at debug,
        // a run takes twice as long).
        log: Some("info,agenshield_proxy::upstream::pool=debug".into()),
        ..Default::default()
    });

    let started = Instant::now();
    let mut failed_runs = Vec::new();
    let mut sent = Vec::new();
    for run in 0..RUNS {
        let run_started = Instant::now();
        let mut failures = Vec::new();
        for way in Way::ALL {
            let (got, stderr) = post_all(&daemon, nginx.addr, run, way).await;
            let mut statuses: Vec<u16> = Vec::new();
            for (status, id) in got {
                if status != 200 {
                    statuses.push(status);
                    failures.push(format!("{status} {id}"));
                }
                sent.push(id);
            }
            if !statuses.is_empty() {
                statuses.sort_unstable();
                statuses.dedup();
                let said: Vec<&str> = stderr.lines().take(3).collect();
                eprintln!(
                    "run {run} {}: statuses {statuses:?}; curl: {said:?}",
                    way.name()
                );
            }
        }
        eprintln!(
            "run {run}: {} of {} not 200 in {:?}",
            failures.len(),
            Way::ALL.len() * PER_WAY,
            run_started.elapsed()
        );
        if !failures.is_empty() {
            failed_runs.push((run, failures));
        }
    }
    eprintln!(
        "{} requests in {:?}",
        RUNS * Way::ALL.len() * PER_WAY,
        started.elapsed()
    );

    // Every request processed by nginx exactly once: the 502s above (if any) never reached
    // it, and no retry ran one twice.
    let processed = nginx.processed();
    let twice: Vec<(&String, &usize)> = processed.iter().filter(|(_, n)| **n > 1).collect();
    let missing: Vec<&String> = sent
        .iter()
        .filter(|id| !processed.contains_key(*id))
        .collect();

    // Every retry the daemon logged is counted, and the race happened.
    let logs = daemon.logs();
    let logged = logs
        .lines()
        .filter(|l| l.contains("sending it again"))
        .count() as u64;
    let counted = retries_metric(&daemon).await;
    eprintln!("retries: {counted} counted, {logged} logged");
    let failed_logs: Vec<&str> = logs
        .lines()
        .filter(|l| l.contains("status=502") || l.contains(" WARN ") || l.contains(" ERROR "))
        .take(5)
        .collect();

    let failures: usize = failed_runs.iter().map(|(_, f)| f.len()).sum();
    assert!(
        failed_runs.is_empty(),
        "{failures} requests not 200 in {} of {RUNS} runs: {:?}; the daemon logged {failed_logs:#?}",
        failed_runs.len(),
        failed_runs
            .iter()
            .map(|(run, f)| (run, f.len(), f.first()))
            .collect::<Vec<_>>()
    );
    assert!(
        twice.is_empty(),
        "processed more than once: {:?}",
        &twice[..twice.len().min(10)]
    );
    assert!(
        missing.is_empty(),
        "{} never processed, e.g. {:?}",
        missing.len(),
        missing.first()
    );
    assert_eq!(
        processed.len(),
        sent.len(),
        "nginx processed only what we sent"
    );
    assert!(
        counted > 0,
        "the upstream's GOAWAY raced new streams: retries were counted"
    );
    assert_eq!(counted, logged, "every retry the daemon logged is counted");
}
