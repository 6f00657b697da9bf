//! The edges of issue 32 ("Hard at the edges") that cross users: who may make the daemon run
//! code (a fetched secret's command), what one agent's failing secret or flood of refusals
//! does to another agent, and what a flood does to the audit history. Real daemon, real
//! admin socket and peer credentials, real agent uids (and the nftables redirect where the
//! agents make HTTPS requests), upstreams in a network namespace or on loopback. The root
//! tests print why they skip without root; with CI=true a skip is a failure.
#![cfg(target_os = "linux")]
// The guard serialises the root tests for the whole test; no task of a test takes it.
#![allow(clippy::await_holding_lock)]

use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use agenshield_e2e::audit;
use agenshield_e2e::curl::curl;
use agenshield_e2e::daemon::{binary, Daemon, DaemonOptions};
use agenshield_e2e::netlab::{root_or_skip, sh, AgentUser, FirewallCleanup, Internet};
use agenshield_e2e::pki::TestCa;
use agenshield_e2e::upstream::UpstreamOptions;
use agenshield_e2e::world::ApiUpstream;
use serde_json::Value;

const DENY_ALL: &str = "version = 1\ndefault = \"deny\"\n";

/// `agenshield-admin` for one test: created when this machine lacks it and removed again;
/// left alone (only our test users join it) when it was already there.
struct AdminGroup {
    created: bool,
}

impl AdminGroup {
    fn ensure() -> AdminGroup {
        let exists = nix::unistd::Group::from_name("agenshield-admin")
            .expect("group database")
            .is_some();
        if !exists {
            sh(&["groupadd", "--system", "agenshield-admin"]);
        }
        AdminGroup { created: !exists }
    }
}

impl Drop for AdminGroup {
    fn drop(&mut self) {
        if self.created {
            let _ = Command::new("groupdel").arg("agenshield-admin").output();
        }
    }
}

/// `setpriv` as `user` with the supplementary groups the group database gives it.
fn with_groups(user: &AgentUser) -> Vec<String> {
    vec![
        "setpriv".into(),
        format!("--reuid={}", user.uid),
        format!("--regid={}", user.uid),
        "--init-groups".into(),
        "--".into(),
    ]
}

/// `ctl ARGS` under `prefix` with `input` on its stdin: (exit code, stdout, stderr).
fn ctl_as_stdin(
    d: &Daemon,
    prefix: &[String],
    args: &[&str],
    input: &[u8],
) -> (i32, String, String) {
    use std::io::Write as _;
    let mut child = Command::new(&prefix[0])
        .args(&prefix[1..])
        .arg(binary())
        .args(["proxy", "ctl"])
        .args(args)
        .arg("--socket")
        .arg(d.socket())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run ctl");
    let mut stdin = child.stdin.take().expect("stdin");
    stdin.write_all(input).expect("write stdin");
    drop(stdin);
    let out = child.wait_with_output().expect("ctl output");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Every process's arguments now: (pid, parent pid, arguments joined by spaces).
fn processes() -> Vec<(u32, u32, String)> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let cmdline = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
        // The parent pid is the 2nd field after the parenthesised name.
        let stat = std::fs::read_to_string(e.path().join("stat")).unwrap_or_default();
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse().ok())
            .unwrap_or(0);
        out.push((
            pid,
            ppid,
            String::from_utf8_lossy(&cmdline).replace('\0', " "),
        ));
    }
    out
}

fn secrets_list(d: &Daemon) -> Value {
    let (code, out, err) = d.ctl(&[], &["secrets", "list", "--json"]);
    assert_eq!(code, 0, "{err}");
    serde_json::from_str(&out).expect("JSON")
}

fn listed(list: &Value, name: &str) -> Option<Value> {
    list["secrets"]
        .as_array()
        .and_then(|a| a.iter().find(|s| s["name"] == name).cloned())
}

/// Item 9: a member of the admin group reaches the real admin socket (peer credentials
/// checked) and may store values, but not define a command or an OAuth2 source, which the
/// daemon would run as itself next to the vault and the CA key. Root may, and the command it
/// gives is in no process's arguments while it runs (where the agent could read it).
#[test]
fn only_root_defines_a_fetched_secret_and_its_command_is_in_no_processs_arguments() {
    let Some(_serial) = root_or_skip("only_root_defines_a_fetched_secret") else {
        return;
    };
    let _group = AdminGroup::ensure();
    let tag = std::process::id() % 97;
    let member = AgentUser::create(tag + 331);
    sh(&["usermod", "-aG", "agenshield-admin", &member.name]);
    let daemon = Daemon::start(DaemonOptions {
        policies: vec![("main.toml".into(), DENY_ALL.into())],
        ..Default::default()
    });
    // Only the socket's mode and group (and the peer check) stand between users and it.
    std::fs::set_permissions(daemon.dir.path(), std::fs::Permissions::from_mode(0o755))
        .expect("chmod dir");
    let as_member = with_groups(&member);
    let (code, out, err) = daemon.ctl(&as_member, &["status", "--json"]);
    assert_eq!(code, 0, "a member is served: {out}{err}");

    // A command: refused before anything runs, exit 1, saying why and what to do.
    let marker_file = daemon.dir.path().join("member-command-ran");
    let command = format!(
        "touch {}; printf tok_member_value_0001",
        marker_file.display()
    );
    let (code, out, err) = daemon.ctl(
        &as_member,
        &["secrets", "set", "x", "--from-command", &command],
    );
    assert_eq!(code, 1, "{out}{err}");
    assert!(
        err.contains("only root may define a fetched secret"),
        "{err}"
    );
    assert!(!marker_file.exists(), "the member's command ran");
    // An OAuth2 source: the same.
    let (code, out, err) = ctl_as_stdin(
        &daemon,
        &as_member,
        &[
            "secrets",
            "set",
            "y",
            "--oauth2-token-url",
            "https://auth.test/token",
            "--client-id",
            "c",
        ],
        b"client-secret-value-1",
    );
    assert_eq!(code, 1, "{out}{err}");
    assert!(
        err.contains("only root may define a fetched secret"),
        "{err}"
    );
    // A value the member types is still theirs to store.
    let (code, out, err) = ctl_as_stdin(
        &daemon,
        &as_member,
        &["secrets", "set", "z"],
        b"member-stored-value-1",
    );
    assert_eq!(code, 0, "{out}{err}");
    let list = secrets_list(&daemon);
    assert!(
        listed(&list, "x").is_none() && listed(&list, "y").is_none(),
        "{list}"
    );
    assert_eq!(listed(&list, "z").expect("z")["kind"], "static");
    assert!(daemon
        .logs()
        .contains("a fetched secret's definition refused: not root"));

    // Root defines one, the command on ctl's stdin (`--from-command -`). While its first
    // fetch runs (2 s), no process shows the command: not the daemon's shell, not ctl.
    let marker = format!("argv_marker_{}", std::process::id());
    let command = format!(": {marker}; sleep 2; printf tok_root_value_0001");
    let mut ctl = Command::new(binary())
        .args([
            "proxy",
            "ctl",
            "secrets",
            "set",
            "gh",
            "--from-command",
            "-",
        ])
        .arg("--socket")
        .arg(daemon.socket())
        .arg("--config")
        .arg(daemon.config_path())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run ctl");
    {
        use std::io::Write as _;
        let mut stdin = ctl.stdin.take().expect("stdin");
        stdin
            .write_all(command.as_bytes())
            .expect("write the command");
    }
    let daemon_pid = daemon.pid();
    let mut shown = Vec::new();
    let mut shell_seen = false;
    let until = Instant::now() + Duration::from_millis(1500);
    while Instant::now() < until {
        for (_pid, ppid, args) in processes() {
            if ppid == daemon_pid && args.starts_with("/bin/sh") {
                shell_seen = true;
            }
            if args.contains(&marker) {
                shown.push(args);
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = ctl.wait_with_output().expect("ctl");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(shell_seen, "the daemon's shell ran while we looked");
    assert!(
        shown.is_empty(),
        "the command is visible in /proc: {shown:?}"
    );
    let gh = listed(&secrets_list(&daemon), "gh").expect("gh");
    assert_eq!(gh["kind"], "command", "{gh}");
}

/// The world of the secret-fetch test: two agents redirected into one daemon, `s.test` and
/// `t.test` upstream in a namespace, their rules binding a command secret `s` and a stored
/// secret `t`.
struct Agents {
    daemon: Daemon,
    a: AgentUser,
    b: AgentUser,
    a4: std::net::IpAddr,
    ca: PathBuf,
    /// `s`'s script and its switches (`hang`, `fail`) and run log.
    scratch: tempfile::TempDir,
}

impl Agents {
    /// `curl` as `user` to `https://HOST/echo`, `n` at once: each (status, seconds).
    async fn get(&self, user: &AgentUser, host: &str, n: usize) -> Vec<(u16, f64)> {
        let one = format!(
            "curl -s -o /dev/null -w '%{{http_code}} %{{time_total}}\\n' --max-time 40 --cacert {ca} --resolve {host}:443:{a4} https://{host}/echo",
            ca = self.ca.display(),
            a4 = self.a4,
        );
        let script = format!("for i in $(seq {n}); do {one} & done; wait");
        let prefix = user.as_agent();
        let out = tokio::process::Command::new(&prefix[0])
            .args(&prefix[1..])
            .args(["bash", "-c", &script])
            .output()
            .await
            .expect("agent shell");
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| {
                let (code, secs) = l.split_once(' ')?;
                Some((code.parse().ok()?, secs.parse().ok()?))
            })
            .collect()
    }

    fn runs(&self) -> usize {
        std::fs::read_to_string(self.scratch.path().join("runs"))
            .unwrap_or_default()
            .lines()
            .count()
    }

    fn switch(&self, name: &str, on: bool) {
        let p = self.scratch.path().join(name);
        if on {
            std::fs::write(p, "").expect("switch on");
        } else {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// Items 9 and 10: agent A's requests need secret `s`, whose command first hangs, then
/// fails; agent B's need `t`, and some `s`. B's requests for `t` are served at once
/// throughout; B's for `s` get the backoff's answer (503 `secret_unavailable`) after at most
/// the one fetch under way, not behind every request A queued; and while A keeps asking,
/// the command runs again only as its backoff allows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_agents_failing_secret_fetch_leaves_the_other_served_and_backs_off() {
    let Some(_serial) = root_or_skip("one_agents_failing_secret_fetch") else {
        return;
    };
    let _table = FirewallCleanup;
    let tag = std::process::id() % 97;
    let a = AgentUser::create(tag + 341);
    let b = AgentUser::create(tag + 351);
    let net = Internet::create();
    let upstream_ca = TestCa::new("edges upstream CA");
    let a4 = net.a4;
    let _up = net.serve(
        SocketAddr::new(a4, 443),
        UpstreamOptions {
            tls: Some(upstream_ca.leaf(&["s.test", "t.test"])),
            name: "edges".into(),
            ..Default::default()
        },
    );
    let share = tempfile::tempdir().expect("tempdir");
    std::fs::set_permissions(share.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let upstream_ca_file = share.path().join("upstream-ca.pem");
    upstream_ca.write_pem(&upstream_ca_file).expect("write CA");
    let daemon = Daemon::start(DaemonOptions {
        policies: vec![("main.toml".into(), DENY_ALL.into())],
        extra_ca: vec![upstream_ca_file],
        hosts: vec![("s.test".into(), a4), ("t.test".into(), a4)],
        allow_private: vec![net.net4.clone()],
        redirect_uid: Some(a.uid),
        agent_uids: vec![b.uid],
        ..Default::default()
    });
    let ca = share.path().join("agenshield-ca.pem");
    std::fs::copy(&daemon.ca_path, &ca).expect("copy CA");
    std::fs::set_permissions(&ca, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let scratch = tempfile::tempdir().expect("tempdir");
    let d = scratch.path().display().to_string();
    let script = scratch.path().join("s.sh");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\necho run >> {d}/runs\nif [ -e {d}/hang ]; then sleep 30; fi\n\
             if [ -e {d}/fail ]; then echo 'token expired' >&2; exit 1; fi\n\
             printf 'tok_s_value_0001\\n'\n"
        ),
    )
    .expect("script");
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let script = script.display().to_string();
    let w = Agents {
        daemon,
        a,
        b,
        a4,
        ca,
        scratch,
    };
    let (code, out, err) = w.daemon.ctl(
        &[],
        &[
            "secrets",
            "set",
            "s",
            "--from-command",
            &script,
            "--ttl",
            "1s",
            "--timeout",
            "2s",
        ],
    );
    assert_eq!(code, 0, "{out}{err}");
    let (code, out, err) = w
        .daemon
        .ctl_stdin(&["secrets", "set", "t"], b"tok_t_static_value_1");
    assert_eq!(code, 0, "{out}{err}");
    std::fs::write(
        w.daemon.dir.path().join("policies/bound.toml"),
        r#"
version = 1

[[rule]]
id = "s-api"
hosts = ["s.test"]
action = "allow"
inject = [{ header = "Authorization", value = "Bearer ${secret:s}" }]

[[rule]]
id = "t-api"
hosts = ["t.test"]
action = "allow"
inject = [{ header = "Authorization", value = "Bearer ${secret:t}" }]
"#,
    )
    .expect("policy");
    w.daemon.wait_for_policy(&["s-api", "t-api"]);
    net.assert_route(a4);
    assert_eq!(w.get(&w.b, "t.test", 1).await[0].0, 200);
    assert_eq!(w.get(&w.a, "s.test", 1).await[0].0, 200);
    assert_eq!(w.runs(), 1, "fetched once when set");

    // 1. `s`'s command hangs (killed at its 2 s timeout). A sends 12 requests at once.
    w.switch("hang", true);
    tokio::time::sleep(Duration::from_millis(1200)).await; // the 1 s TTL passes
    let flood = w.get(&w.a, "s.test", 12);
    let other = async {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let t = w.get(&w.b, "t.test", 1).await[0];
        let s = w.get(&w.b, "s.test", 1).await[0];
        (t, s)
    };
    let (a_got, ((t_code, t_secs), (s_code, s_secs))) = tokio::join!(flood, other);
    assert_eq!(t_code, 200, "B is served its own secret");
    assert!(
        t_secs < 1.0,
        "B's request waited {t_secs}s behind A's secret"
    );
    assert_eq!(s_code, 503, "B's request for the failing secret is refused");
    assert!(
        s_secs < 4.0,
        "B's request for `s` waited {s_secs}s: more than the one fetch under way"
    );
    assert_eq!(a_got.len(), 12, "{a_got:?}");
    for (code, secs) in &a_got {
        assert_eq!(*code, 503, "{a_got:?}");
        assert!(*secs < 5.0, "A's requests were serialised: {a_got:?}");
    }
    assert_eq!(w.runs(), 2, "one run for all of them");

    // 2. It fails fast now. A keeps asking, 40 times over ~4 s: each refused at once, and
    //    the command runs again only as the backoff allows (2 s, then 4 s).
    w.switch("hang", false);
    w.switch("fail", true);
    let before = w.runs();
    let mut refused = 0;
    for _ in 0..40 {
        let (code, secs) = w.get(&w.a, "s.test", 1).await[0];
        assert_eq!(code, 503);
        assert!(secs < 1.0, "{secs}");
        refused += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let ran = w.runs() - before;
    assert!((1..=3).contains(&ran), "{ran} runs for {refused} requests");
    assert_eq!(w.get(&w.b, "t.test", 1).await[0].0, 200);
    let s = listed(&secrets_list(&w.daemon), "s").expect("s");
    assert!(s["retry_at"].is_string(), "{s}");
    let error = s["error"].as_str().unwrap_or("");
    assert!(
        error.contains("token expired") && error.contains("not fetched again before"),
        "{s}"
    );
    let (_, table, _) = w.daemon.ctl(&[], &["secrets", "list"]);
    assert!(table.contains("not fetched again before"), "{table}");

    // 3. The source recovers: once the backoff has passed, the next request fetches it.
    w.switch("fail", false);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if w.get(&w.a, "s.test", 1).await[0].0 == 200 {
            break;
        }
        assert!(Instant::now() < deadline, "never fetched again");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Sends `n` DNS questions (A, for `PREFIX<i>.flood.test`) one after another to the stub at
/// `port`, as `user`: how many were answered, and the response codes.
fn dns_flood(user: &AgentUser, port: u16, prefix: &str, n: usize) -> (usize, String) {
    const PY: &str = r#"
import socket, struct, sys
port, n, prefix = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.connect(("127.0.0.1", port))
s.settimeout(2)
answered, rcodes = 0, {}
for i in range(n):
    qid = i & 0xffff
    name = "%s%d.flood.test" % (prefix, i)
    q = struct.pack(">HHHHHH", qid, 0x0100, 1, 0, 0, 0)
    q += b"".join(bytes([len(l)]) + l.encode() for l in name.split(".")) + b"\0"
    q += struct.pack(">HH", 1, 1)
    s.send(q)
    try:
        while True:
            r = s.recv(4096)
            if struct.unpack(">H", r[:2])[0] == qid:
                break
        answered += 1
        rcodes[r[3] & 15] = rcodes.get(r[3] & 15, 0) + 1
    except socket.timeout:
        pass
print(answered, sorted(rcodes.items()))
"#;
    let prefix_cmd = user.as_agent();
    let out = Command::new(&prefix_cmd[0])
        .args(&prefix_cmd[1..])
        .args([
            // The system interpreter: a shim under root's home is not the agent's to run.
            "/usr/bin/python3",
            "-c",
            PY,
            &port.to_string(),
            &n.to_string(),
            prefix,
        ])
        .output()
        .expect("python3");
    let text = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (count, rcodes) = text.split_once(' ').expect("a summary");
    (count.parse().expect("a count"), rcodes.to_string())
}

/// The log and its rotated files, oldest first.
fn all_lines(path: &Path, keep: u32) -> Vec<Value> {
    let mut out = Vec::new();
    for n in (1..=keep).rev() {
        out.extend(audit::lines(Path::new(&format!("{}.{n}", path.display()))));
    }
    out.extend(audit::lines(path));
    out
}

/// Item 11: agent A asks the DNS stub for 5,000 distinct names no rule allows. Its refusals
/// are recorded as a few full records and `repeated` records whose counts add up to every
/// one of them, so agent B's earlier record is still in the (small, rotated) log, and B is
/// answered as before.
#[test]
fn a_refusal_flood_from_one_agent_is_counted_and_keeps_the_others_history() {
    let Some(_serial) = root_or_skip("a_refusal_flood_from_one_agent") else {
        return;
    };
    let tag = std::process::id() % 97;
    let a = AgentUser::create(tag + 361);
    let b = AgentUser::create(tag + 371);
    let daemon = Daemon::start(DaemonOptions {
        policies: vec![("main.toml".into(), DENY_ALL.into())],
        audit: vec![
            "max_bytes = 65536".into(),
            "keep = 2".into(),
            "refusal_window = \"1s\"".into(),
        ],
        ..Default::default()
    });
    let port = daemon.dns[0].port();
    assert_eq!(dns_flood(&b, port, "b-early", 1).0, 1);

    const N: usize = 5000;
    let (answered, rcodes) = dns_flood(&a, port, "a", N);
    assert_eq!(answered, N, "{rcodes}");
    let t = Instant::now();
    assert_eq!(dns_flood(&b, port, "b-late", 1).0, 1);
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    std::thread::sleep(Duration::from_millis(1500)); // the last window closes

    let lines = all_lines(&daemon.audit_path(), 2);
    audit::assert_matches_schema(&lines);
    let (code, out, err) = daemon.ctl(&[], &["audit", "verify"]);
    assert_eq!(code, 0, "{out}{err}");
    let of = |uid: u32, kind: &str| -> Vec<&Value> {
        lines
            .iter()
            .filter(|l| l["agent_uid"] == uid && l["kind"] == kind)
            .collect()
    };
    assert!(
        of(b.uid, "query")
            .iter()
            .any(|l| l["host"] == "b-early0.flood.test"),
        "B's earlier record was rotated away"
    );
    let full = of(a.uid, "query");
    let repeated = of(a.uid, "repeated");
    let counted: u64 = repeated.iter().filter_map(|l| l["count"].as_u64()).sum();
    assert_eq!(
        full.len() as u64 + counted,
        N as u64,
        "every refusal is in the log, in full or counted"
    );
    assert!(
        full.len() <= 30,
        "{} full records for one flood: not counted",
        full.len()
    );
    for r in &repeated {
        assert_eq!(r["protocol"], "dns", "{r}");
        assert_eq!(r["error_code"], "policy_denied", "{r}");
        let of_id = r["of"].as_str().expect("of");
        assert!(
            full.iter().any(|f| f["request_id"] == of_id),
            "{r}: its first refusal is recorded in full"
        );
    }
    assert!(repeated
        .iter()
        .any(|r| r["hosts"].as_array().is_some_and(|h| h.len() == 8)));
}

/// Item 11: once the oldest kept audit file holds records younger than `audit.retention`
/// (24 h by default), rotation stops instead of deleting it: new requests are refused with
/// `audit_unavailable`, the alarm metric says why, and the first request's record is still
/// there. Archiving that file away lets the log rotate and requests go again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rotation_refuses_requests_rather_than_delete_records_younger_than_the_retention() {
    let api = ApiUpstream::start(
        "retention upstream CA",
        &["api.test"],
        UpstreamOptions::default(),
    )
    .await;
    let policy = "version = 1\ndefault = \"deny\"\n\n[[rule]]\nid = \"api\"\nhosts = [\"api.test\"]\naction = \"allow\"\n";
    let daemon = Daemon::start(DaemonOptions {
        audit: vec!["max_bytes = 65536".into(), "keep = 1".into()],
        ..api.daemon_options(policy)
    });
    let get = |path: String| {
        let proxy = format!("http://{}", daemon.explicit);
        let ca = daemon.ca_path.display().to_string();
        let url = format!("https://api.test:{}{path}", api.up.addr.port());
        async move { curl(&["--cacert", &ca, "--proxy", &proxy, &url], false).await }
    };
    assert_eq!(get("/echo/first".into()).await.status, 200);
    // Records of ~3.5 KiB: 64 KiB fill in ~18. The second rotation would delete the first
    // file; it is refused instead.
    let long = "x".repeat(3000);
    let mut refused = None;
    for i in 0..200 {
        let path = format!("/echo/fill-{i}-{long}");
        let out = get(path.clone()).await;
        if out.status != 200 {
            refused = Some((path, out));
            break;
        }
    }
    let (path, out) = refused.expect("never refused: the first file was rotated away");
    assert_eq!(out.status, 503, "{}", out.text());
    let v = out.json();
    assert_eq!(v["error_code"], "audit_unavailable", "{v}");
    assert!(
        v["message"]
            .as_str()
            .unwrap_or("")
            .contains("audit.retention"),
        "{v}"
    );
    assert!(
        !api.up.requests().iter().any(|r| r.path_and_query == path),
        "the refused request never reached the upstream"
    );
    let metrics = curl(&[&format!("http://{}/metrics", daemon.metrics)], false)
        .await
        .text();
    assert!(
        metrics.contains("agenshield_proxy_audit_retention_blocked 1")
            && metrics.contains("agenshield_proxy_audit_ready 0"),
        "{metrics}"
    );
    let (code, status, _) = daemon.ctl(&[], &["status", "--json"]);
    assert_eq!(code, 0);
    let status: Value = serde_json::from_str(&status).expect("JSON");
    assert_eq!(status["audit"]["ready"], false, "{status}");
    let log = daemon.audit_path();
    let first = PathBuf::from(format!("{}.1", log.display()));
    assert!(
        std::fs::read_to_string(&first)
            .expect("the oldest file is kept")
            .contains("\"path\":\"/echo/first\""),
        "the first record is still there"
    );
    assert!(!Path::new(&format!("{}.2", log.display())).exists());

    // The operator archives the oldest file: the log rotates and requests go again.
    let archived = daemon.dir.path().join("archived-audit.jsonl");
    std::fs::rename(&first, &archived).expect("archive");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let out = get("/echo/after".into()).await;
    assert_eq!(out.status, 200, "{}", out.text());
    let metrics = curl(&[&format!("http://{}/metrics", daemon.metrics)], false)
        .await
        .text();
    assert!(
        metrics.contains("agenshield_proxy_audit_retention_blocked 0"),
        "{metrics}"
    );
    let files = [
        archived.display().to_string(),
        first.display().to_string(),
        log.display().to_string(),
    ];
    let mut args = vec!["audit", "verify"];
    args.extend(files.iter().map(String::as_str));
    let (code, out, err) = daemon.ctl(&[], &args);
    assert_eq!(code, 0, "{out}{err}");
}
