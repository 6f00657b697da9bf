//! Root end-to-end tests of shared budgets: two real agent users, both redirected into one
//! daemon by its nftables rules. Agent A exhausts one budget (a rule's rate bucket, a rule's
//! concurrency cap, the approval queue, the DNS stub's questions in hand) and agent B is
//! still served, because every such budget is per agent uid. `--remember` covers only the
//! approving agent's method and path, and `ctl pending list` says whose request waits.
//! Without root they print why they skip; with CI=true a skip is a failure.
//!
//! Network safety: the agents' traffic goes to addresses inside the test's namespace (the
//! redirect takes it to the daemon); the daemon's upstream and its resolver are there too
//! (the resolver a socket that never answers), and every agent command is bounded in time.
#![cfg(target_os = "linux")]

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use agenshield_e2e::audit;
use agenshield_e2e::daemon::{Daemon, DaemonOptions};
use agenshield_e2e::netlab::{root_or_skip, AgentUser, FirewallCleanup, Internet};
use agenshield_e2e::pki::TestCa;
use agenshield_e2e::upstream::{Upstream, UpstreamOptions};
use serde_json::Value;

const POLICY: &str = r#"
version = 1
default = "deny"

[[rule]]
id = "metered"
hosts = ["metered.test"]
action = "allow"
rate = { requests = 1, per = "1h", burst = 2 }

[[rule]]
id = "capped"
hosts = ["capped.test"]
action = "allow"
max_concurrent = 2

[[rule]]
id = "asked"
hosts = ["asked.test"]
action = "ask"

[[rule]]
id = "names"
hosts = ["*.slow.test", "fast.test"]
action = "allow"
"#;

const HOSTS: [&str; 4] = ["metered.test", "capped.test", "asked.test", "fast.test"];

struct Lab {
    /// Agent processes still running; killed before the users go.
    running: Vec<Child>,
    daemon: Daemon,
    up: Upstream,
    net: Internet,
    a: AgentUser,
    b: AgentUser,
    /// Our CA, where the agents can read it.
    ca: PathBuf,
    _share: tempfile::TempDir,
    /// The daemon's nameserver: bound in the namespace, never answering.
    _resolver: (std::net::UdpSocket, Vec<std::net::TcpListener>),
    /// Last: the table goes once the daemon is gone.
    _table: FirewallCleanup,
}

impl Lab {
    fn new(tag: u32) -> Lab {
        let table = FirewallCleanup;
        let a = AgentUser::create(tag);
        let b = AgentUser::create(tag + 1);
        let net = Internet::create();
        let (a4, b4) = (net.a4, net.b4);
        for ip in [a4, b4] {
            net.assert_route(ip);
        }
        let upstream_ca = TestCa::new("budgets upstream CA");
        let up = net.serve(
            SocketAddr::new(a4, 443),
            UpstreamOptions {
                tls: Some(upstream_ca.leaf(&HOSTS)),
                name: "budgets".into(),
                ..Default::default()
            },
        );
        // A resolver that takes every question and answers none: a name under slow.test
        // keeps the stub's question in hand for the resolver's whole timeout.
        let resolver = (
            net.bind_udp(SocketAddr::new(b4, 53)),
            net.bind_tcp(&[SocketAddr::new(b4, 53)]),
        );
        let share = tempfile::tempdir().expect("tempdir");
        std::fs::set_permissions(share.path(), std::fs::Permissions::from_mode(0o755))
            .expect("chmod");
        let upstream_ca_path = share.path().join("upstream-ca.pem");
        upstream_ca.write_pem(&upstream_ca_path).expect("write CA");
        let daemon = Daemon::start(DaemonOptions {
            policies: vec![("main.toml".into(), POLICY.into())],
            extra_ca: vec![upstream_ca_path],
            hosts: HOSTS.iter().map(|h| (h.to_string(), a4)).collect(),
            nameservers: vec![format!("{b4}:53")],
            allow_private: vec![net.net4.clone()],
            redirect_uid: Some(a.uid),
            agent_uids: vec![b.uid],
            approvals_timeout: Some("60s".into()),
            ..Default::default()
        });
        let ca = share.path().join("agenshield-ca.pem");
        std::fs::copy(&daemon.ca_path, &ca).expect("copy CA");
        std::fs::set_permissions(&ca, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        Lab {
            running: Vec::new(),
            daemon,
            up,
            net,
            a,
            b,
            ca,
            _share: share,
            _resolver: resolver,
            _table: table,
        }
    }

    /// curl as `user` to `https://host/path` (the redirect takes it to the daemon); prints
    /// the status code.
    fn curl(&self, user: &AgentUser, host: &str, path: &str, extra: &[&str]) -> Command {
        self.net.assert_route(self.net.a4);
        let prefix = user.as_agent();
        let mut c = Command::new(&prefix[0]);
        c.args(&prefix[1..])
            .args(["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}"])
            .args(["--max-time", "20", "--cacert"])
            .arg(&self.ca)
            .arg("--resolve")
            .arg(format!("{host}:443:{}", self.net.a4))
            .args(extra)
            .arg(format!("https://{host}{path}"));
        c
    }

    /// The status `user` gets for GET `https://host/path`.
    fn status(&self, user: &AgentUser, host: &str, path: &str, extra: &[&str]) -> String {
        let out = self
            .curl(user, host, path, extra)
            .output()
            .expect("curl as the agent");
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    /// Starts `cmd` in the background, its output to read with `finish`; it is killed when
    /// the lab ends.
    fn start(&mut self, cmd: Command) -> usize {
        self.start_with(cmd, Stdio::piped())
    }

    fn start_with(&mut self, mut cmd: Command, stdout: Stdio) -> usize {
        let child = cmd
            .stdout(stdout)
            .stderr(Stdio::null())
            .spawn()
            .expect("agent command");
        self.running.push(child);
        self.running.len() - 1
    }

    /// What a background command printed, once it ended (within `limit`).
    fn finish(&mut self, i: usize, limit: Duration) -> String {
        let deadline = Instant::now() + limit;
        let child = &mut self.running[i];
        while child.try_wait().expect("wait").is_none() {
            assert!(Instant::now() < deadline, "the agent command did not end");
            std::thread::sleep(Duration::from_millis(50));
        }
        let mut out = String::new();
        if let Some(s) = child.stdout.take() {
            let _ = BufReader::new(s).read_line(&mut out);
        }
        out.trim().to_string()
    }

    fn pending(&self) -> Vec<Value> {
        let (code, out, err) = self.daemon.ctl(&[], &["pending", "list", "--json"]);
        assert_eq!(code, 0, "{err}");
        serde_json::from_str::<Value>(&out)
            .expect("pending JSON")
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    /// Waits (up to 30 s) until the pending list satisfies `done`; returns it.
    fn wait_pending(&self, what: &str, done: impl Fn(&[Value]) -> bool) -> Vec<Value> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let p = self.pending();
            if done(&p) {
                return p;
            }
            assert!(
                Instant::now() < deadline,
                "{what}: pending is {p:?}\n{}",
                self.daemon.logs()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The pending request of the background command `i` (`method path`, by `uid`), once it
    /// waits; fails if the command ends first (its request was not held). Whose request it
    /// says it is, the caller checks.
    fn held(&mut self, i: usize, uid: u32, method: &str, path: &str) -> Value {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let list = self.pending();
            if let Some(p) = list
                .into_iter()
                .find(|p| p["method"] == method && p["path"] == path)
            {
                return p;
            }
            if self.running[i].try_wait().expect("wait").is_some() {
                let got = self.finish(i, Duration::ZERO);
                panic!("{uid} {method} {path} was not held for approval: it got {got} at once");
            }
            assert!(
                Instant::now() < deadline,
                "{uid} {method} {path} never waited\n{}",
                self.daemon.logs()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn answer(&self, id: &str, verb: &str, remember: bool) -> String {
        let mut args = vec!["pending", verb, id];
        if remember {
            args.push("--remember");
        }
        let (code, out, err) = self.daemon.ctl(&[], &args);
        assert_eq!(code, 0, "{out}{err}");
        out
    }

    fn records(&self) -> Vec<Value> {
        audit::lines(&self.daemon.audit_path())
    }

    fn metric(&self, name: &str) -> f64 {
        let out = Command::new("curl")
            .args(["-s", "--max-time", "5"])
            .arg(format!("http://{}/metrics", self.daemon.metrics))
            .output()
            .expect("curl metrics");
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
            .unwrap_or(0.0)
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        for c in &mut self.running {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_that_drains_a_rule_rate_leaves_another_served() {
    let Some(_serial) = root_or_skip("rate_bucket_per_agent") else {
        return;
    };
    let lab = Lab::new(331);
    let (a, b) = (&lab.a, &lab.b);
    // burst 2, then one an hour: A's third request is limited…
    let got: Vec<String> = (0..3)
        .map(|i| lab.status(a, "metered.test", &format!("/a{i}"), &[]))
        .collect();
    assert_eq!(got, ["200", "200", "429"], "{}", lab.daemon.logs());
    // …and B still has its own bucket, full.
    assert_eq!(lab.status(b, "metered.test", "/b0", &[]), "200");
    assert_eq!(lab.status(b, "metered.test", "/b1", &[]), "200");
    assert_eq!(lab.status(b, "metered.test", "/b2", &[]), "429");
    let limited: Vec<Value> = lab
        .records()
        .into_iter()
        .filter(|r| r["decision"] == "limited" && r["host"] == "metered.test")
        .collect();
    assert_eq!(
        limited
            .iter()
            .map(|r| r["agent_uid"].clone())
            .collect::<Vec<_>>(),
        [a.uid, b.uid],
        "{limited:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_that_fills_a_rule_concurrency_cap_leaves_another_served() {
    let Some(_serial) = root_or_skip("concurrency_cap_per_agent") else {
        return;
    };
    let mut lab = Lab::new(333);
    // A holds both of its slots with slow requests…
    for i in 0..2 {
        let cmd = lab.curl(&lab.a, "capped.test", &format!("/slow/15000?{i}"), &[]);
        lab.start(cmd);
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    while lab.up.requests().len() < 2 {
        assert!(Instant::now() < deadline, "{}", lab.daemon.logs());
        std::thread::sleep(Duration::from_millis(50));
    }
    // …so its third is refused, while B is served at once.
    assert_eq!(lab.status(&lab.a, "capped.test", "/a", &[]), "429");
    let started = Instant::now();
    assert_eq!(
        lab.status(&lab.b, "capped.test", "/b", &[]),
        "200",
        "{}",
        lab.daemon.logs()
    );
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(lab.up.requests().len(), 3, "A's third never went upstream");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_that_fills_the_approval_queue_leaves_another_room_to_ask() {
    let Some(_serial) = root_or_skip("approval_queue_per_agent") else {
        return;
    };
    let mut lab = Lab::new(335);
    let a_uid = lab.a.uid;
    // A parks 300 requests: 256 (its quota) wait, the rest are refused at once.
    let flood = lab.curl(
        &lab.a,
        "asked.test",
        "/a/[1-300]",
        &[
            "--parallel",
            "--parallel-max",
            "300",
            "--http1.1",
            "--max-time",
            "90",
        ],
    );
    lab.start_with(flood, Stdio::null());
    let a_waiting = |l: &[Value]| {
        l.iter()
            .filter(|p| p["path"].as_str().is_some_and(|p| p.starts_with("/a/")))
            .count()
    };
    lab.wait_pending("A at its quota", |l| a_waiting(l) >= 256);
    let deadline = Instant::now() + Duration::from_secs(30);
    let refused_a = || {
        lab.records()
            .iter()
            .filter(|r| r["agent_uid"] == a_uid && r["decision"] == "ask_denied")
            .count()
    };
    while refused_a() < 44 {
        assert!(Instant::now() < deadline, "A's excess was not refused");
        std::thread::sleep(Duration::from_millis(100));
    }
    let waiting = lab.pending();
    assert_eq!(a_waiting(&waiting), 256);

    // B can still ask, and an operator can let it through.
    let b_ask = lab.curl(&lab.b, "asked.test", "/b/one", &[]);
    let i = lab.start(b_ask);
    let b_uid = lab.b.uid;
    let p = lab.held(i, b_uid, "GET", "/b/one");
    let (code, out, err) = lab.daemon.ctl(&[], &["pending", "list"]);
    assert_eq!(code, 0, "{err}");
    lab.answer(p["id"].as_str().expect("id"), "approve", false);
    assert_eq!(lab.finish(i, Duration::from_secs(20)), "200");

    // The list said whose each request was, with its method and path.
    assert!(
        waiting.iter().all(|p| p["agent_uid"] == a_uid),
        "{waiting:?}"
    );
    assert_eq!(p["agent_uid"], b_uid, "{p}");
    let row = out
        .lines()
        .find(|l| l.starts_with(p["id"].as_str().expect("id")))
        .unwrap_or_else(|| panic!("no row for {p}: {out}"));
    // ID SINCE EXPIRES AGENT(uid (name)) METHOD DESTINATION RULE
    let cols: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(
        (cols[3], cols[5], cols[6]),
        (b_uid.to_string().as_str(), "GET", "asked.test:443/b/one"),
        "{out}"
    );
    assert!(cols[4].starts_with('(') && cols[4].ends_with(')'), "{out}");
    assert!(out.lines().next().unwrap_or("").contains("AGENT"), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remember_covers_the_approving_agent_method_and_path_only() {
    let Some(_serial) = root_or_skip("remember_scope") else {
        return;
    };
    let mut lab = Lab::new(337);
    let b_uid = lab.b.uid;
    let first = lab.curl(&lab.b, "asked.test", "/repos/x", &[]);
    let i = lab.start(first);
    let p = lab.held(i, b_uid, "GET", "/repos/x");
    let said = lab.answer(p["id"].as_str().expect("id"), "approve", true);
    assert_eq!(lab.finish(i, Duration::from_secs(20)), "200");
    let mut listed = vec![(p, b_uid)];
    // The same agent, method and path again: through at once.
    assert_eq!(lab.status(&lab.b, "asked.test", "/repos/x", &[]), "200");
    // Anything else is asked again: another method, another path, another agent.
    for (by_b, method, path) in [
        (true, "DELETE", "/repos/x"),
        (true, "GET", "/repos/y"),
        (false, "GET", "/repos/x"),
    ] {
        let user = if by_b { &lab.b } else { &lab.a };
        let uid = user.uid;
        let ask = lab.curl(user, "asked.test", path, &["-X", method]);
        let i = lab.start(ask);
        let p = lab.held(i, uid, method, path);
        lab.answer(p["id"].as_str().expect("id"), "deny", false);
        assert_eq!(
            lab.finish(i, Duration::from_secs(20)),
            "403",
            "{uid} {method} {path}"
        );
        listed.push((p, uid));
    }
    assert!(lab.pending().is_empty());
    // Each waiting request was listed as its agent's; the operator was told whose it was.
    for (p, uid) in listed {
        assert_eq!(p["agent_uid"], uid, "{p}");
    }
    assert!(said.contains(&format!("agent {b_uid}")), "{said}");
}

/// Sends A questions for distinct names under slow.test to 53/udp at `server` (the redirect
/// takes them to the stub), 300 a second for `n`, then keeps its socket open.
const FLOOD: &str = r#"
import socket, struct, sys, time
server, n = sys.argv[1], int(sys.argv[2])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.connect((server, 53))
print("started", flush=True)
for i in range(n):
    name = b"".join(bytes([len(l)]) + l for l in (b"q%d" % i, b"slow", b"test")) + b"\0"
    s.send(struct.pack(">6H", i & 0xffff, 0x0100, 1, 0, 0, 0) + name + struct.pack(">2H", 1, 1))
    if i % 3 == 2:
        time.sleep(0.01)
time.sleep(30)
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_that_floods_the_dns_stub_leaves_another_answered() {
    let Some(_serial) = root_or_skip("dns_questions_per_agent") else {
        return;
    };
    let mut lab = Lab::new(339);
    let b4 = lab.net.b4;
    lab.net.assert_route(b4);
    // A asks 300 questions a second for 10 s that the resolver never answers: each stays in
    // hand for the resolver's timeout (6 s), so A keeps well over 1,024 in hand (any bound
    // the stub has) and the stub drops what it cannot take.
    let prefix = lab.a.as_agent();
    let mut flood = Command::new(&prefix[0]);
    flood
        .args(&prefix[1..])
        .args(["/usr/bin/python3", "-c", FLOOD])
        .arg(b4.to_string())
        .arg("3000");
    let i = lab.start(flood);
    let mut line = String::new();
    let stdout = lab.running[i].stdout.take().expect("stdout");
    BufReader::new(stdout).read_line(&mut line).expect("read");
    assert_eq!(line.trim(), "started");
    // Once the stub drops A's questions, A is at its bound (and goes on asking).
    let deadline = Instant::now() + Duration::from_secs(8);
    while lab.metric("agenshield_proxy_dns_dropped_total") < 50.0 {
        assert!(
            Instant::now() < deadline,
            "A's flood never filled the stub: {} dropped",
            lab.metric("agenshield_proxy_dns_dropped_total"),
        );
        std::thread::sleep(Duration::from_millis(50));
    }

    // B's question for a name the proxy knows is answered at once.
    let prefix = lab.b.as_agent();
    let started = Instant::now();
    let out = Command::new(&prefix[0])
        .args(&prefix[1..])
        .args(["dig", "+time=2", "+tries=2", "+notcp"])
        .arg(format!("@{b4}"))
        .args(["fast.test", "A"])
        .output()
        .expect("dig as B");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("status: NOERROR") && text.contains(&lab.net.a4.to_string()),
        "B was not answered after {:?}: {text}",
        started.elapsed()
    );
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
}
