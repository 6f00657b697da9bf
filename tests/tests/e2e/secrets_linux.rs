//! Root end-to-end test of secrets as the agent sees them: a real agent uid whose traffic
//! the daemon's nftables redirect sends through the proxy, an upstream in a network
//! namespace, and a vault the daemon created. Without root it prints why it skips; with
//! CI=true a skip is a failure.
#![cfg(target_os = "linux")]

use std::net::SocketAddr;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::process::Command;

use agenshield_e2e::daemon::{Daemon, DaemonOptions};
use agenshield_e2e::netlab::{root_or_skip, AgentUser, FirewallCleanup, Internet};
use agenshield_e2e::pki::TestCa;
use agenshield_e2e::upstream::UpstreamOptions;

const KEY: &str = "sk-live-AGENTNEVERSEESTHIS-0123456789";

const START_POLICY: &str = r#"
version = 1
default = "deny"

[[rule]]
id = "other"
hosts = ["other.test"]
action = "allow"
"#;

const API_RULE: &str = r#"
version = 1

[[rule]]
id = "openai"
hosts = ["api.test"]
action = "allow"
secrets = ["openai"]
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_holds_a_placeholder_the_api_gets_the_key_and_the_vault_is_closed_to_the_agent() {
    let Some(_serial) = root_or_skip("the_agent_holds_a_placeholder") else {
        return;
    };
    // Dropped last: after the daemon is gone, its table goes too, even if an assert fails.
    let _table = FirewallCleanup;
    let user = AgentUser::create(std::process::id() % 97 + 301);
    let net = Internet::create();
    let ca = TestCa::new("secrets root upstream CA");
    let a4 = net.a4;
    let up = net.serve(
        SocketAddr::new(a4, 443),
        UpstreamOptions {
            tls: Some(ca.leaf(&["api.test", "other.test"])),
            name: "api".into(),
            ..Default::default()
        },
    );
    let share = tempfile::tempdir().expect("tempdir");
    std::fs::set_permissions(share.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let upstream_ca = share.path().join("upstream-ca.pem");
    ca.write_pem(&upstream_ca).expect("write CA");
    let daemon = Daemon::start(DaemonOptions {
        policies: vec![("main.toml".into(), START_POLICY.into())],
        extra_ca: vec![upstream_ca],
        hosts: vec![("api.test".into(), a4), ("other.test".into(), a4)],
        allow_private: vec![net.net4.clone()],
        redirect_uid: Some(user.uid),
        ..Default::default()
    });
    // Only the vault's own modes may keep the agent out: open the directories around it.
    std::fs::set_permissions(daemon.dir.path(), std::fs::Permissions::from_mode(0o755))
        .expect("chmod");
    let our_ca = share.path().join("agenshield-ca.pem");
    std::fs::copy(&daemon.ca_path, &our_ca).expect("copy CA");
    std::fs::set_permissions(&our_ca, std::fs::Permissions::from_mode(0o644)).expect("chmod");

    // The operator stores the key (stdin) and binds it; the daemon wrote the vault.
    let (code, out, err) = daemon.ctl_stdin(&["secrets", "set", "openai"], KEY.as_bytes());
    assert_eq!(code, 0, "{out}{err}");
    std::fs::write(daemon.dir.path().join("policies/api.toml"), API_RULE).expect("policy");
    let (code, out, err) = daemon.ctl(&[], &["reload"]);
    assert_eq!(code, 0, "{out}{err}");
    let vault = daemon.vault();
    let file = vault.join("openai.secret");
    for (path, mode) in [(&vault, 0o700), (&file, 0o600)] {
        let meta = std::fs::metadata(path).expect("vault entry");
        assert_eq!(meta.mode() & 0o777, mode, "{}", path.display());
        assert_eq!(
            meta.uid(),
            0,
            "{} owned by the daemon (root)",
            path.display()
        );
    }

    // The agent: its environment holds the placeholder; its tools need no flags for the
    // redirect (no proxy variables), only our CA.
    net.assert_route(a4);
    let ca_path = our_ca.display();
    let script = format!(
        r#"export OPENAI_API_KEY=agenshield:secret:openai
env
for path in echo split; do
  curl -sS --max-time 20 --cacert {ca_path} --resolve api.test:443:{a4} --trace-ascii /dev/stderr \
    -H "Authorization: Bearer $OPENAI_API_KEY" https://api.test/$path
  echo
done
curl -sS --max-time 20 --cacert {ca_path} --resolve other.test:443:{a4} \
  -H "Authorization: Bearer $OPENAI_API_KEY" https://other.test/echo
echo
cat {file} ; ls {vault}
cat {config} >/dev/null && echo CONFIG-READABLE
"#,
        file = file.display(),
        vault = vault.display(),
        config = daemon.config_path().display(),
    );
    let prefix = user.as_agent();
    let out = Command::new(&prefix[0])
        .args(&prefix[1..])
        .args(["bash", "-c", &script])
        .output()
        .expect("agent shell");
    let seen = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );

    // The upstream got the real key, twice.
    let auth: Vec<String> = up
        .requests()
        .iter()
        .filter_map(|r| {
            r.headers
                .iter()
                .find(|(k, _)| k == "authorization")
                .map(|(_, v)| v.clone())
        })
        .collect();
    assert_eq!(auth, vec![format!("Bearer {KEY}"); 2], "{seen}");
    // The agent's own view: its environment, its request as sent, the echoes, the refusal
    // and its attempts at the vault. The placeholder everywhere, the key nowhere.
    assert!(!seen.contains(KEY), "the agent saw the key:\n{seen}");
    assert!(
        seen.contains("OPENAI_API_KEY=agenshield:secret:openai"),
        "{seen}"
    );
    assert!(
        seen.contains("\"authorization\":\"Bearer agenshield:secret:openai\""),
        "echo: {seen}"
    );
    assert!(
        seen.contains("you sent: Bearer agenshield:secret:openai"),
        "split echo: {seen}"
    );
    assert!(
        seen.contains("\"error_code\":\"secret_scope\""),
        "other host: {seen}"
    );
    // The vault is closed to the agent although every directory above it is open (the
    // config file beside it is readable, so the test could see a loosened vault).
    assert!(seen.contains("CONFIG-READABLE"), "{seen}");
    assert!(
        seen.contains(&format!("cat: {}: Permission denied", file.display())),
        "{seen}"
    );
    assert!(
        seen.contains(&format!(
            "cannot open directory '{}': Permission denied",
            vault.display()
        )),
        "{seen}"
    );
    assert!(!daemon.logs().contains(KEY), "the daemon logged the key");
}
