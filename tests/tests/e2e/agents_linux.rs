//! Root end-to-end test of per-agent rules: two real agent users on one machine, both
//! redirected into one daemon by its nftables rules, get different decisions for the same
//! hosts: rules with `agents = [...]` (one by name, for the user `ash_<name>_agent`, one by
//! uid) apply only to their agent's connections. The audit log records which agent each
//! decision was for, and `ctl policy check --agent` answers as the proxy does. Without root it
//! prints why it skips; with CI=true a skip is a failure.
#![cfg(target_os = "linux")]

use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::process::Command;

use agenshield_e2e::audit;
use agenshield_e2e::daemon::{Daemon, DaemonOptions};
use agenshield_e2e::netlab::{root_or_skip, AgentUser, FirewallCleanup, Internet};
use agenshield_e2e::pki::TestCa;
use agenshield_e2e::upstream::UpstreamOptions;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_agents_on_one_machine_get_their_own_rules() {
    let Some(_serial) = root_or_skip("two_agents_on_one_machine_get_their_own_rules") else {
        return;
    };
    let _table = FirewallCleanup;
    let tag = std::process::id() % 97;
    // One named as AgenShield names agents (ash_<name>_agent), one referred to by uid.
    let coder_name = format!("coder{tag}");
    let coder = AgentUser::create_named(&format!("ash_{coder_name}_agent"), tag + 101);
    let triage = AgentUser::create(tag + 201);
    let net = Internet::create();
    let ca = TestCa::new("agents root upstream CA");
    let a4 = net.a4;
    let _up = net.serve(
        SocketAddr::new(a4, 443),
        UpstreamOptions {
            tls: Some(ca.leaf(&["code.test", "tickets.test", "shared.test"])),
            name: "agents".into(),
            ..Default::default()
        },
    );
    let share = tempfile::tempdir().expect("tempdir");
    std::fs::set_permissions(share.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let upstream_ca = share.path().join("upstream-ca.pem");
    ca.write_pem(&upstream_ca).expect("write CA");
    let policy = format!(
        r#"version = 1
default = "deny"

[[rule]]
id = "coder-code"
hosts = ["code.test"]
agents = ["{coder_name}"]
action = "allow"

[[rule]]
id = "triage-tickets"
hosts = ["tickets.test"]
agents = [{triage_uid}]
action = "allow"

[[rule]]
id = "everyone-shared"
hosts = ["shared.test"]
action = "allow"
"#,
        triage_uid = triage.uid
    );
    let hosts = ["code.test", "tickets.test", "shared.test"];
    let daemon = Daemon::start(DaemonOptions {
        policies: vec![("main.toml".into(), policy)],
        extra_ca: vec![upstream_ca],
        hosts: hosts.iter().map(|h| (h.to_string(), a4)).collect(),
        allow_private: vec![net.net4.clone()],
        redirect_uid: Some(coder.uid),
        agent_uids: vec![triage.uid],
        ..Default::default()
    });
    let our_ca = share.path().join("agenshield-ca.pem");
    std::fs::copy(&daemon.ca_path, &our_ca).expect("copy CA");
    std::fs::set_permissions(&our_ca, std::fs::Permissions::from_mode(0o644)).expect("chmod");

    net.assert_route(a4);
    // Each agent asks for every host, with no proxy settings: the redirect takes it.
    let statuses = |user: &AgentUser| -> Vec<String> {
        let script = hosts
            .iter()
            .map(|h| {
                format!(
                    "curl -s -o /dev/null -w '{h} %{{http_code}}\\n' --max-time 20 --cacert {ca} --resolve {h}:443:{a4} https://{h}/",
                    ca = our_ca.display()
                )
            })
            .collect::<Vec<_>>()
            .join("\n");
        let prefix = user.as_agent();
        let out = Command::new(&prefix[0])
            .args(&prefix[1..])
            .args(["bash", "-c", &script])
            .output()
            .expect("agent shell");
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::to_string)
            .collect()
    };
    assert_eq!(
        statuses(&coder),
        ["code.test 200", "tickets.test 403", "shared.test 200"],
        "{}",
        daemon.logs()
    );
    assert_eq!(
        statuses(&triage),
        ["code.test 403", "tickets.test 200", "shared.test 200"],
        "{}",
        daemon.logs()
    );

    // The audit log says whose each decision was, and by which rule.
    let recs = audit::lines(&daemon.audit_path());
    let find = |uid: u32, host: &str| {
        recs.iter()
            .find(|r| r["agent_uid"] == uid && r["host"] == host)
            .unwrap_or_else(|| panic!("no record for {uid} {host}: {recs:?}"))
            .clone()
    };
    let r = find(coder.uid, "code.test");
    assert_eq!(
        (r["decision"].as_str(), r["rule"].as_str()),
        (Some("allow"), Some("coder-code"))
    );
    // The policy's default decided: named `default`, as in ctl, logs and metrics.
    let r = find(triage.uid, "code.test");
    assert_eq!(
        (r["decision"].as_str(), r["rule"].as_str()),
        (Some("deny"), Some("default"))
    );
    let r = find(triage.uid, "tickets.test");
    assert_eq!(r["rule"], "triage-tickets");
    let r = find(coder.uid, "shared.test");
    assert_eq!(r["rule"], "everyone-shared");

    // policy check --agent answers the same, by name or uid; without an agent, neither
    // agent's rule applies.
    let check = |agent: Option<&str>, host: &str| {
        let url = format!("https://{host}/");
        let mut args = vec!["policy", "check", "GET", &url, "--json"];
        if let Some(a) = agent {
            args.extend(["--agent", a]);
        }
        let (code, out, err) = daemon.ctl(&[], &args);
        assert_eq!(code, 0, "{err}");
        let v: serde_json::Value = serde_json::from_str(&out).expect("JSON");
        v["decision"].as_str().unwrap_or("").to_string()
    };
    let triage_uid = triage.uid.to_string();
    assert_eq!(check(Some(&coder_name), "code.test"), "allow");
    assert_eq!(check(Some(&coder.uid.to_string()), "code.test"), "allow");
    assert_eq!(check(Some(&triage_uid), "code.test"), "deny");
    assert_eq!(check(Some(&triage_uid), "tickets.test"), "allow");
    assert_eq!(check(None, "code.test"), "deny");
    let (code, _, err) = daemon.ctl(
        &[],
        &[
            "policy",
            "check",
            "GET",
            "https://code.test/",
            "--agent",
            "nobody-here",
        ],
    );
    assert_eq!(code, 2, "an unknown agent is bad input: {err}");
    assert!(err.contains("ash_nobody-here_agent"), "{err}");
}
