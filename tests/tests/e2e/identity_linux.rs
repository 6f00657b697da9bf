//! Root end-to-end tests of who may use the proxy, decided on the real peer uid of real local
//! users (`conn::identity`):
//!
//! - the explicit listener serves agent users, root and listed users, and refuses any other
//!   local account with a JSON error and a record, so it cannot spend the secrets; a rule
//!   binding a secret serves agent users only, unless it names the user in `agents`;
//! - the transparent listener serves agent users only: a non-agent that some other redirect
//!   sends there is refused and recorded;
//! - an agent's write-and-close raw TCP connection, whose socket no process holds by the time
//!   the proxy asks the kernel, is recorded as an unknown user and refused, never as uid 0.
//!
//! Without root they print why they skip; with CI=true a skip is a failure.
#![cfg(target_os = "linux")]

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use agenshield_e2e::audit;
use agenshield_e2e::curl::{curl_as, CurlOut};
use agenshield_e2e::daemon::{Daemon, DaemonOptions};
use agenshield_e2e::netlab::{root_or_skip, AgentUser, FirewallCleanup, Internet};
use agenshield_e2e::pki::TestCa;
use agenshield_e2e::upstream::{Upstream, UpstreamOptions};
use serde_json::Value;

const KEY: &str = "sk-identity-0123456789abcdefXYZ";
const PLACEHOLDER: &str = "Authorization: Bearer agenshield:secret:openai";

/// A world-readable copy of `from` (the daemon's state directory is private), for curl run
/// as another user.
fn shared_copy(share: &tempfile::TempDir, from: &std::path::Path, name: &str) -> PathBuf {
    let to = share.path().join(name);
    std::fs::copy(from, &to).expect("copy");
    std::fs::set_permissions(&to, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    to
}

fn share_dir() -> tempfile::TempDir {
    let share = tempfile::tempdir().expect("tempdir");
    std::fs::set_permissions(share.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    share
}

/// The audit records whose `agent_uid` is `uid` (`None`: unknown) and whose host is `host`.
fn records_of(daemon: &Daemon, uid: Option<u32>, host: &str) -> Vec<Value> {
    let want = uid.map_or(Value::Null, Value::from);
    audit::lines(&daemon.audit_path())
        .into_iter()
        .filter(|r| r["agent_uid"] == want && r["host"] == host)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
// The guard serialises the root tests for the whole test; no task of this test takes it.
#[allow(clippy::await_holding_lock)]
async fn explicit_listener_refuses_other_local_users_and_secrets_serve_agents_unless_named() {
    let Some(_serial) = root_or_skip("explicit_listener_refuses_other_local_users") else {
        return;
    };
    let tag = std::process::id() % 97;
    let agent = AgentUser::create(tag + 11);
    // Any other local account: a web server's user, a second login.
    let stranger = AgentUser::create(tag + 131);
    // An operator's account the config admits by name.
    let listed = AgentUser::create(tag + 251);

    let ca = TestCa::new("identity upstream CA");
    let hosts = ["api.test", "ops.test", "open.test"];
    let up = Upstream::start(UpstreamOptions {
        tls: Some(ca.leaf(&hosts)),
        name: "up".into(),
        ..Default::default()
    })
    .await;
    let share = share_dir();
    let upstream_ca = share.path().join("upstream-ca.pem");
    ca.write_pem(&upstream_ca).expect("write CA");
    let policy = format!(
        r#"version = 1
default = "deny"

[[rule]]
id = "openai"
hosts = ["api.test"]
action = "allow"
secrets = ["openai"]

[[rule]]
id = "ops-openai"
hosts = ["ops.test"]
agents = [{agent}, 0]
action = "allow"
secrets = ["openai"]

[[rule]]
id = "open"
hosts = ["open.test"]
action = "allow"
"#,
        agent = agent.uid
    );
    let daemon = Daemon::start(DaemonOptions {
        policies: vec![("main.toml".into(), policy)],
        extra_ca: vec![upstream_ca],
        hosts: hosts
            .iter()
            .map(|h| (h.to_string(), IpAddr::V4(Ipv4Addr::LOCALHOST)))
            .collect(),
        secrets: vec![("openai".into(), KEY.into())],
        agent_uids: vec![agent.uid],
        explicit_users: vec![listed.name.clone()],
        strict_agents: true,
        ..Default::default()
    });
    let our_ca = shared_copy(&share, &daemon.ca_path, "agenshield-ca.pem");
    let ca_arg = our_ca.display().to_string();
    let proxy = format!("http://{}", daemon.explicit);
    let port = up.addr.port();
    // `https`: a CONNECT tunnel; `http`: an absolute URI, whose refusal curl shows whole.
    let ask_by = |scheme: &'static str, who: Vec<String>, host: &'static str| {
        let (ca_arg, proxy) = (ca_arg.clone(), proxy.clone());
        async move {
            let url = format!("{scheme}://{host}:{port}/echo");
            let mut args = vec!["--cacert", &ca_arg, "--proxy", &proxy];
            // The placeholder only where a rule binds its secret (elsewhere: secret_scope).
            if host != "open.test" {
                args.extend(["-H", PLACEHOLDER]);
            }
            args.push(&url);
            curl_as(&who, &args, false).await
        }
    };
    let ask = |who: Vec<String>, host: &'static str| ask_by("https", who, host);
    let root = Vec::<String>::new();
    let sent = || up.requests().len();
    let refused = |out: &CurlOut, code: &str| {
        assert_eq!(out.status, 403, "{} {}", out.text(), out.stderr);
        let body = out.json();
        assert_eq!(body["error_code"], code, "{body}");
        assert!(!out.text().contains(KEY), "{}", out.text());
        body
    };
    let injected = || {
        let reqs = up.requests();
        let last = reqs.last().expect("a request upstream");
        last.headers
            .iter()
            .find(|(k, _)| k == "authorization")
            .map(|(_, v)| v.clone())
    };

    // Another local account: refused with the JSON error, whatever it asks; nothing leaves.
    let before = sent();
    for host in ["api.test", "open.test"] {
        let out = ask_by("http", stranger.as_agent(), host).await;
        let body = refused(&out, "user_not_admitted");
        let message = body["message"].as_str().unwrap_or_default();
        assert!(
            message.contains(&format!("uid {}", stranger.uid)),
            "{message}"
        );
    }
    // Its CONNECT gets the same refusal (curl shows only the status of a refused tunnel).
    let out = ask(stranger.as_agent(), "api.test").await;
    assert!(
        out.exit == 56 && out.stderr.contains("403"),
        "CONNECT refused: {} {}",
        out.exit,
        out.stderr
    );
    assert_eq!(
        sent(),
        before,
        "nothing reached the upstream for the stranger"
    );
    let recs = records_of(&daemon, Some(stranger.uid), "api.test");
    assert_eq!(recs.len(), 2, "one record per refused connection: {recs:?}");
    for r in &recs {
        assert_eq!(
            (
                r["error_code"].as_str(),
                r["decision"].as_str(),
                r["listener"].as_str()
            ),
            (Some("user_not_admitted"), Some("deny"), Some("explicit")),
            "{r}"
        );
    }

    // The agent user: served, and the upstream gets the key.
    let out = ask(agent.as_agent(), "api.test").await;
    assert_eq!(out.status, 200, "{} {}", out.text(), out.stderr);
    assert_eq!(injected(), Some(format!("Bearer {KEY}")));

    // Root (an operator, `proxy exec`) is served, but a rule binding a secret does not serve
    // it unless the rule names it.
    let out = ask(root.clone(), "open.test").await;
    assert_eq!(out.status, 200, "{} {}", out.text(), out.stderr);
    let before = sent();
    let body = refused(&ask(root.clone(), "api.test").await, "secret_not_for_user");
    assert_eq!(body["rule_id"], "openai", "{body}");
    assert_eq!(
        sent(),
        before,
        "nothing went out, with or without the secret"
    );
    let recs = records_of(&daemon, Some(0), "api.test");
    assert_eq!(recs.len(), 1, "{recs:?}");
    assert_eq!(recs[0]["error_code"], "secret_not_for_user");
    let out = ask(root.clone(), "ops.test").await;
    assert_eq!(out.status, 200, "{} {}", out.text(), out.stderr);
    assert_eq!(injected(), Some(format!("Bearer {KEY}")), "named in agents");

    // A user the config lists may use the listener; the unnamed secret is still not its.
    let out = ask(listed.as_agent(), "open.test").await;
    assert_eq!(out.status, 200, "{} {}", out.text(), out.stderr);
    refused(
        &ask(listed.as_agent(), "api.test").await,
        "secret_not_for_user",
    );
    // And a rule naming only the agent and root does not serve it either.
    refused(&ask(listed.as_agent(), "ops.test").await, "policy_denied");

    let all = audit::lines(&daemon.audit_path());
    audit::assert_matches_schema(&all);
    let text = std::fs::read_to_string(daemon.audit_path()).expect("audit log");
    assert!(!text.contains(KEY), "the audit log holds no secret");
}

/// `table inet <name>`, removed on drop: a redirect this daemon did not ask for.
struct ExtraTable(&'static str);

impl ExtraTable {
    fn load(name: &'static str, rules: &str) -> ExtraTable {
        let _ = Command::new("nft")
            .args(["delete", "table", "inet", name])
            .output();
        let table = ExtraTable(name);
        let mut nft = Command::new("nft")
            .args(["-f", "-"])
            .stdin(Stdio::piped())
            .spawn()
            .expect("nft");
        use std::io::Write;
        nft.stdin
            .take()
            .expect("stdin")
            .write_all(format!("table inet {name} {{\n{rules}\n}}\n").as_bytes())
            .expect("write rules");
        assert!(nft.wait().expect("nft").success(), "nft -f failed");
        table
    }
}

impl Drop for ExtraTable {
    fn drop(&mut self) {
        let _ = Command::new("nft")
            .args(["delete", "table", "inet", self.0])
            .output();
    }
}

/// A daemon redirecting one agent user's traffic, and an upstream for it in a namespace.
struct Lab {
    daemon: Daemon,
    net: Internet,
    agent: AgentUser,
    _up: Upstream,
    our_ca: PathBuf,
    _share: tempfile::TempDir,
}

impl Lab {
    fn start(tag: u32) -> Lab {
        let agent = AgentUser::create(tag);
        let net = Internet::create();
        let ca = TestCa::new("identity root upstream CA");
        let up = net.serve(
            SocketAddr::new(net.a4, 443),
            UpstreamOptions {
                tls: Some(ca.leaf(&["api.test"])),
                name: "api".into(),
                ..Default::default()
            },
        );
        let share = share_dir();
        let upstream_ca = share.path().join("upstream-ca.pem");
        ca.write_pem(&upstream_ca).expect("write CA");
        let daemon = Daemon::start(DaemonOptions {
            policies: vec![(
                "main.toml".into(),
                "version = 1\ndefault = \"deny\"\n\n[[rule]]\nid = \"api\"\nhosts = [\"api.test\"]\naction = \"allow\"\n".into(),
            )],
            extra_ca: vec![upstream_ca],
            hosts: vec![("api.test".into(), net.a4)],
            allow_private: vec![net.net4.clone()],
            redirect_uid: Some(agent.uid),
            strict_agents: true,
            ..Default::default()
        });
        let our_ca = shared_copy(&share, &daemon.ca_path, "agenshield-ca.pem");
        Lab {
            daemon,
            net,
            agent,
            _up: up,
            our_ca,
            _share: share,
        }
    }

    /// `https://api.test/` as `user`, with no proxy settings: a redirect takes it, or not.
    async fn api_as(&self, user: &AgentUser) -> CurlOut {
        self.net.assert_route(self.net.a4);
        let resolve = format!("api.test:443:{}", self.net.a4);
        let ca = self.our_ca.display().to_string();
        curl_as(
            &user.as_agent(),
            &[
                "--cacert",
                &ca,
                "--resolve",
                &resolve,
                "--max-time",
                "20",
                "https://api.test/",
            ],
            false,
        )
        .await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
// The guard serialises the root tests for the whole test; no task of this test takes it.
#[allow(clippy::await_holding_lock)]
async fn transparent_listener_refuses_a_non_agent_another_redirect_sends_it() {
    let Some(_serial) = root_or_skip("transparent_listener_refuses_a_non_agent") else {
        return;
    };
    let _table = FirewallCleanup;
    let tag = std::process::id() % 97;
    let lab = Lab::start(tag + 12);
    let other = AgentUser::create(tag + 132);
    // Some other redirect (a stale `firewall up`, an operator's own rule) sends a non-agent
    // user's connection to the transparent listener.
    let _extra = ExtraTable::load(
        "ashtest_identity",
        &format!(
            "chain nat_output {{\n type nat hook output priority -110; policy accept;\n \
             meta skuid {} ip daddr {} tcp dport 443 redirect to :{}\n}}",
            other.uid,
            lab.net.a4,
            lab.daemon.transparent.port()
        ),
    );

    let out = lab.api_as(&lab.agent).await;
    assert_eq!(out.status, 200, "the agent is served: {}", out.stderr);

    let out = lab.api_as(&other).await;
    assert_eq!(out.status, 0, "no response for a non-agent: {}", out.text());
    let recs = records_of(&lab.daemon, Some(other.uid), &lab.net.a4.to_string());
    assert_eq!(recs.len(), 1, "one record: {recs:?}\n{}", lab.daemon.logs());
    assert_eq!(
        (
            recs[0]["error_code"].as_str(),
            recs[0]["decision"].as_str(),
            recs[0]["listener"].as_str()
        ),
        (Some("user_not_admitted"), Some("deny"), Some("transparent"))
    );
    audit::assert_matches_schema(&audit::lines(&lab.daemon.audit_path()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
// The guard serialises the root tests for the whole test; no task of this test takes it.
#[allow(clippy::await_holding_lock)]
async fn a_write_and_close_is_recorded_as_its_agent_or_refused_unknown_never_root() {
    let Some(_serial) = root_or_skip("a_write_and_close_is_an_unknown_user") else {
        return;
    };
    let _table = FirewallCleanup;
    let tag = std::process::id() % 97;
    let lab = Lab::start(tag + 13);
    lab.net.assert_route(lab.net.a4);
    // Raw TCP, written and closed at once: by the time the proxy asks the kernel who owns
    // the client's socket, no process holds it (the kernel says uid 0 for such a socket).
    const TRIES: usize = 20;
    let script = format!(
        "for i in $(seq {TRIES}); do exec 3<>/dev/tcp/{}/9 && printf 'hello\\n' >&3; exec 3>&-; done",
        lab.net.a4
    );
    let prefix = lab.agent.as_agent();
    let out = Command::new(&prefix[0])
        .args(&prefix[1..])
        .args(["bash", "-c", &script])
        .output()
        .expect("agent shell");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let host = lab.net.a4.to_string();
    // Every connection is recorded: as the agent (the kernel still named the orphaned
    // socket's creator) or as unknown and refused (it no longer did) — never as root.
    let deadline = Instant::now() + Duration::from_secs(10);
    let all = loop {
        let all = audit::lines(&lab.daemon.audit_path());
        let n = all
            .iter()
            .filter(|r| r["host"] == host.as_str() && r["kind"] == "connection")
            .count();
        if n >= TRIES || Instant::now() > deadline {
            break all;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let unknown = records_of(&lab.daemon, None, &host);
    eprintln!(
        "{} of {TRIES} write-and-close connections were caught with no owner",
        unknown.len()
    );
    let as_root: Vec<&Value> = all.iter().filter(|r| r["agent_uid"] == 0).collect();
    assert!(as_root.is_empty(), "recorded as root: {as_root:?}");
    let conns: Vec<&Value> = all
        .iter()
        .filter(|r| r["host"] == host.as_str() && r["kind"] == "connection")
        .collect();
    assert_eq!(conns.len(), TRIES, "every connection recorded: {all:?}");
    for r in &conns {
        let known = r["agent_uid"] == lab.agent.uid;
        let refused_unknown = r["agent_uid"].is_null()
            && r["error_code"] == "unknown_user"
            && r["decision"] == "deny"
            && r["listener"] == "transparent";
        assert!(known || refused_unknown, "{r}");
    }
    audit::assert_matches_schema(&all);
}
