//! Secrets the daemon fetches: a command's output (`ctl secrets set --from-command … --ttl`)
//! and an OAuth2 access token (client credentials). The real daemon, curl and a loopback TLS
//! upstream that is also the token endpoint: each value is fetched once per expiry however
//! many requests need it at once, a failing source gives the bound requests a clear 503
//! (`secret_unavailable`) and a record, `ctl secrets list` shows kind, source and expiry, and
//! no value reaches the agent or anything the daemon wrote.

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agenshield_e2e::audit;
use agenshield_e2e::curl::{curl, CurlOut};
use agenshield_e2e::daemon::Daemon;
use agenshield_e2e::upstream::{OauthClient, UpstreamOptions};
use agenshield_e2e::world::{ApiUpstream, World};

const BASE: &str = r#"
version = 1
default = "deny"

[[rule]]
id = "other"
hosts = ["other.test"]
action = "allow"
"#;

/// Written once the secrets exist (a policy binding a missing secret does not load).
const BINDINGS: &str = r#"
version = 1

[[rule]]
id = "gh"
hosts = ["gh.test"]
action = "allow"
inject = [{ header = "Authorization", value = "token ${secret:gh}" }]

[[rule]]
id = "api"
hosts = ["api.test"]
action = "allow"
inject = [{ header = "Authorization", value = "Bearer ${secret:api}" }]
"#;

const HOSTS: [&str; 4] = ["gh.test", "api.test", "auth.test", "other.test"];
const CLIENT_SECRET: &str = "cs-good-client-secret-1";

/// The shared world with an OAuth token endpoint on the upstream; its client (the test
/// rotates its secret and counts the tokens it issued).
async fn world() -> (World, OauthClient) {
    let oauth = OauthClient {
        id: "client-1".into(),
        secret: Arc::new(Mutex::new(CLIENT_SECRET.into())),
        // Used for half of that (the margin is a minute, more than the whole).
        expires_in: 4,
        issued: Arc::new(AtomicUsize::new(0)),
    };
    let api = ApiUpstream::start(
        "providers upstream CA",
        &HOSTS,
        UpstreamOptions {
            name: "up".into(),
            oauth: Some(oauth.clone()),
            ..Default::default()
        },
    )
    .await;
    let opts = api.daemon_options(BASE);
    (api.world(opts), oauth)
}

fn script(w: &World) -> String {
    let dir = w.scratch();
    let script = dir.join("token.sh");
    // Each run is counted; the value names the run, so a new fetch is a new value.
    let text = format!(
        "#!/bin/sh\nid -u >> {d}/runs\n\
         if [ -e {d}/fail ]; then echo 'token expired: run gh auth login' >&2; exit 1; fi\n\
         printf 'tok_cmd_%04d\\n' \"$(wc -l < {d}/runs)\"\n",
        d = dir.display()
    );
    std::fs::write(&script, text).expect("script");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    script.display().to_string()
}

fn runs(w: &World) -> Vec<String> {
    std::fs::read_to_string(w.scratch().join("runs"))
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

async fn get(w: &World, host: &str) -> CurlOut {
    let url = format!("https://{host}:{}/echo", w.up.addr.port());
    let proxy = format!("http://{}", w.daemon.explicit);
    let ca = w.daemon.ca_path.display().to_string();
    curl(&["--cacert", &ca, "--proxy", &proxy, &url], false).await
}

/// `n` requests to `host` at once; their outputs.
async fn burst(w: &World, host: &str, n: usize) -> Vec<CurlOut> {
    let all = (0..n).map(|_| get(w, host));
    futures_util::future::join_all(all).await
}

/// The Authorization header the upstream saw on its last `/echo` request for `host`.
fn last_auth(w: &World, host: &str) -> Option<String> {
    w.up.requests()
        .iter()
        .rev()
        .find(|r| r.path_and_query == "/echo" && r.sni.as_deref() == Some(host))
        .and_then(|r| {
            r.headers
                .iter()
                .find(|(k, _)| k == "authorization")
                .map(|(_, v)| v.clone())
        })
}

fn bindings_in_force(w: &World) {
    std::fs::write(w.daemon.dir.path().join("policies/bindings.toml"), BINDINGS)
        .expect("write policy");
    w.daemon.wait_for_policy(&["gh.test", "api.test"]);
}

fn list(daemon: &Daemon) -> serde_json::Value {
    let (code, out, err) = daemon.ctl(&[], &["secrets", "list", "--json"]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    v
}

fn entry(list: &serde_json::Value, name: &str) -> serde_json::Value {
    list["secrets"]
        .as_array()
        .and_then(|a| a.iter().find(|s| s["name"] == name).cloned())
        .unwrap_or_else(|| panic!("no {name} in {list}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fetched_secrets_are_fetched_once_per_expiry_and_a_failing_source_refuses_clearly() {
    let (w, oauth) = world().await;
    let mut agent_saw = String::new();

    // 1. A command secret: fetched once when set (its output checked), stored as how to
    //    fetch it, never its value.
    let script = script(&w);
    let (code, out, err) = w.daemon.ctl(
        &[],
        &[
            "secrets",
            "set",
            "gh",
            "--from-command",
            &script,
            "--ttl",
            "3s",
        ],
    );
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains("command") && out.contains("fetched, good until"),
        "{out}"
    );
    assert_eq!(runs(&w).len(), 1);
    // A command that fails is refused, with why, and not stored.
    let (code, _, err) = w.daemon.ctl(
        &[],
        &[
            "secrets",
            "set",
            "broken",
            "--from-command",
            "echo nope >&2; exit 7",
        ],
    );
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("exit status: 7") && err.contains("nope"),
        "{err}"
    );
    // A stored value may not pass for a definition.
    let fake = br#"agenshield-provider:v1:{"kind":"command"}"#;
    let (code, _, err) = w.daemon.ctl_stdin(&["secrets", "set", "x"], fake);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("marker"), "{err}");
    // --ttl means nothing for a stored value.
    let (code, _, err) = w
        .daemon
        .ctl_stdin(&["secrets", "set", "x", "--ttl", "1m"], b"12345678");
    assert_eq!(code, 2, "{err}");
    // A value too long is refused at its real size (issue 34: "8195 bytes" for 9000), and a
    // command printing too much says how much it printed.
    let (code, _, err) = w.daemon.ctl_stdin(&["secrets", "set", "x"], &[b'x'; 9000]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("the value is 9000 bytes; at most 8192 fit in a request header"),
        "{err}"
    );
    let (code, _, err) = w.daemon.ctl(
        &[],
        &[
            "secrets",
            "set",
            "x",
            "--from-command",
            "head -c 9000 /dev/zero | tr '\\0' x",
        ],
    );
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("the command printed 9000 bytes; at most 8192"),
        "{err}"
    );

    // 2. An OAuth2 client: the client secret from stdin; a token fetched at once.
    let token_url = format!("https://auth.test:{}/oauth/token", w.up.addr.port());
    let (code, out, err) = w.daemon.ctl_stdin(
        &[
            "secrets",
            "set",
            "api",
            "--oauth2-token-url",
            &token_url,
            "--client-id",
            "client-1",
        ],
        CLIENT_SECRET.as_bytes(),
    );
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("oauth2"), "{out}");
    assert_eq!(oauth.issued.load(Ordering::SeqCst), 1);
    bindings_in_force(&w);

    // 3. Under load, within the time to live: every request carries the value fetched, and
    //    nothing is fetched again.
    let runs_before = runs(&w).len();
    for out in burst(&w, "gh.test", 16).await {
        assert_eq!(out.status, 200, "{}", out.text());
        agent_saw.push_str(&out.text());
    }
    assert_eq!(
        last_auth(&w, "gh.test").as_deref(),
        Some("token tok_cmd_0001")
    );
    for out in burst(&w, "api.test", 16).await {
        assert_eq!(out.status, 200, "{}", out.text());
        agent_saw.push_str(&out.text());
    }
    let want = "Bearer access-token-0001";
    assert_eq!(last_auth(&w, "api.test").as_deref(), Some(want));
    assert_eq!(oauth.issued.load(Ordering::SeqCst), 1, "one token");
    assert_eq!(runs(&w).len(), runs_before, "no command run within the TTL");

    // 4. Past the TTL, 16 requests at once: one run of the command, all get the new value.
    tokio::time::sleep(Duration::from_millis(3200)).await;
    for out in burst(&w, "gh.test", 16).await {
        assert_eq!(out.status, 200, "{}", out.text());
        agent_saw.push_str(&out.text());
    }
    assert_eq!(runs(&w).len(), runs_before + 1, "fetched once per expiry");
    assert_eq!(
        last_auth(&w, "gh.test").as_deref(),
        Some("token tok_cmd_0002")
    );
    for out in burst(&w, "api.test", 16).await {
        assert_eq!(out.status, 200, "{}", out.text());
        agent_saw.push_str(&out.text());
    }
    assert_eq!(
        oauth.issued.load(Ordering::SeqCst),
        2,
        "one token per expiry"
    );
    let want = "Bearer access-token-0002";
    assert_eq!(last_auth(&w, "api.test").as_deref(), Some(want));
    // The command ran as the daemon's own user.
    let daemon_uid = std::fs::read_to_string(format!("/proc/{}/status", w.daemon.pid()))
        .expect("status")
        .lines()
        .find_map(|l| {
            l.strip_prefix("Uid:")
                .map(|u| u.split_whitespace().next().unwrap_or("").to_string())
        })
        .expect("uid");
    assert!(runs(&w).iter().all(|u| *u == daemon_uid), "{:?}", runs(&w));

    // 5. The source fails: the bound request gets a 503 naming the secret and which source,
    //    the record says so, and ctl secrets list says why.
    std::fs::write(w.scratch().join("fail"), "").expect("fail switch");
    tokio::time::sleep(Duration::from_millis(3200)).await;
    let out = get(&w, "gh.test").await;
    assert_eq!(out.status, 503, "{}", out.text());
    let v = out.json();
    assert_eq!(v["error_code"], "secret_unavailable", "{v}");
    assert_eq!(v["rule_id"], "gh", "{v}");
    let msg = v["message"].as_str().unwrap_or("");
    assert!(
        msg.contains("\"gh\"") && msg.contains("its command failed"),
        "{msg}"
    );
    assert!(
        !msg.contains("gh auth login"),
        "the agent is not told the operator's details"
    );
    agent_saw.push_str(&out.text());
    let refused = audit::lines(&w.daemon.audit_path())
        .into_iter()
        .rev()
        .find(|r| r["host"] == "gh.test")
        .expect("a record");
    assert_eq!(refused["error_code"], "secret_unavailable", "{refused}");
    assert_eq!(refused["status"], 503, "{refused}");

    // 6. The provider revokes the client secret: once the token expires, the next fetch is
    //    refused by the endpoint and the bound requests get a clear refusal; setting a
    //    secret with it is refused, with the endpoint's answer.
    *oauth.secret.lock().expect("lock") = "rotated-by-the-provider".into();
    tokio::time::sleep(Duration::from_millis(2200)).await;
    let out = get(&w, "api.test").await;
    assert_eq!(out.status, 503, "{}", out.text());
    let msg = out.json()["message"].as_str().unwrap_or("").to_string();
    assert!(
        msg.contains("its token endpoint did not give a token"),
        "{msg}"
    );
    agent_saw.push_str(&out.text());
    let (code, _, err) = w.daemon.ctl_stdin(
        &[
            "secrets",
            "set",
            "api2",
            "--oauth2-token-url",
            &token_url,
            "--client-id",
            "client-1",
        ],
        CLIENT_SECRET.as_bytes(),
    );
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("401") && err.contains("invalid_client"),
        "{err}"
    );

    let listed = list(&w.daemon);
    let gh = entry(&listed, "gh");
    assert_eq!(gh["kind"], "command", "{gh}");
    assert_eq!(gh["source"], script.as_str(), "{gh}");
    assert!(gh["expires"].is_string(), "{gh}");
    assert!(
        gh["error"].as_str().unwrap_or("").contains("gh auth login"),
        "{gh}"
    );
    assert_eq!(gh["rules"], serde_json::json!(["gh"]), "{gh}");
    let api = entry(&listed, "api");
    assert_eq!(api["kind"], "oauth2", "{api}");
    assert!(
        api["source"].as_str().unwrap_or("").contains("client-1"),
        "{api}"
    );
    assert!(api["last_used"].is_string(), "{api}");
    assert!(
        api["error"]
            .as_str()
            .unwrap_or("")
            .contains("invalid_client"),
        "{api}"
    );
    let (_, table, _) = w.daemon.ctl(&[], &["secrets", "list"]);
    assert!(
        table.contains("KIND") && table.contains("EXPIRES") && table.contains("oauth2"),
        "{table}"
    );

    // 7. No value anywhere: the agent's view, the daemon's log, audit log, metrics, ctl.
    let mut wrote = w.daemon.logs();
    wrote.push_str(&std::fs::read_to_string(w.daemon.audit_path()).unwrap_or_default());
    wrote.push_str(&listed.to_string());
    wrote.push_str(&table);
    let metrics = curl(&[&format!("http://{}/metrics", w.daemon.metrics)], false).await;
    wrote.push_str(&metrics.text());
    for (what, text) in [
        ("the agent's view", &agent_saw),
        ("what the daemon wrote", &wrote),
    ] {
        for value in ["tok_cmd_", "access-token-", CLIENT_SECRET] {
            assert!(!text.contains(value), "{what} holds {value}:\n{text}");
        }
    }
    // The definitions are stored as such; the vault never holds a fetched value.
    assert_no_value_in(&w.daemon.vault());
}

fn assert_no_value_in(vault: &Path) {
    for e in std::fs::read_dir(vault).expect("vault").flatten() {
        let text = std::fs::read_to_string(e.path()).unwrap_or_default();
        assert!(
            !text.contains("tok_cmd_") && !text.contains("access-token-"),
            "{}",
            e.path().display()
        );
    }
}
