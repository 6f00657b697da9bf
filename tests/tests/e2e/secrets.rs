//! Secrets end to end: the real daemon and curl on loopback, upstreams with a test CA. The
//! agent holds placeholders; the upstream gets the key; nothing the agent sees, and nothing
//! the daemon writes (logs, ctl output, refusals), ever holds a secret value.

use agenshield_e2e::curl::{curl, CurlOut};
use agenshield_e2e::daemon::DaemonOptions;
use agenshield_e2e::upstream::UpstreamOptions;
use agenshield_e2e::world::{ApiUpstream, World};

const OPENAI: &str = "sk-test-OPENAI-0123456789abcdef";
const GITHUB: &str = "ghp_GITHUBtoken0123456789abcdef";
const MAPS: &str = "AIzaMAPSkey0123456789abcdef";
/// Set later with `ctl secrets set`.
const LATE: &str = "late-secret-value-0123456789";

const POLICY: &str = r#"
version = 1
default = "deny"

[[rule]]
id = "openai"
hosts = ["api.test"]
action = "allow"
secrets = ["openai"]

[[rule]]
id = "github"
hosts = ["gh.test"]
action = "allow"
inject = [{ header = "Authorization", value = "token ${secret:github}" }]

[[rule]]
id = "maps"
hosts = ["maps.test"]
action = "allow"
inject = [{ query = "key", value = "${secret:maps}" }]

[[rule]]
id = "other"
hosts = ["other.test"]
action = "allow"

[secrets.github]
rate = { requests = 3, per = "1h" }
"#;

const HOSTS: [&str; 5] = [
    "api.test",
    "gh.test",
    "maps.test",
    "other.test",
    "late.test",
];

async fn world() -> World {
    let up = UpstreamOptions {
        name: "up".into(),
        ..Default::default()
    };
    let api = ApiUpstream::start("secrets upstream CA", &HOSTS, up).await;
    let opts = DaemonOptions {
        secrets: vec![
            ("openai".into(), OPENAI.into()),
            ("github".into(), GITHUB.into()),
            ("maps".into(), MAPS.into()),
        ],
        scan_body_bytes: Some(256 * 1024),
        ..api.daemon_options(POLICY)
    };
    api.world(opts)
}

/// What curl sent, on its stderr.
const TRACE: [&str; 2] = ["--trace-ascii", "/dev/stderr"];

/// curl through the explicit listener, with a trace of what it sent on stderr.
async fn explicit(w: &World, host: &str, path: &str, extra: &[&str]) -> CurlOut {
    let extra = [&TRACE[..], extra].concat();
    w.explicit("https", host, path, &extra).await
}

/// curl through the transparent listener (the original destination is fixed), with a trace.
async fn transparent(w: &World, host: &str, path: &str, extra: &[&str]) -> CurlOut {
    let extra = [&TRACE[..], extra].concat();
    w.transparent("https", host, path, &extra).await
}

/// The header `name` of the last request the upstream received.
fn last_header(w: &World, name: &str) -> Option<String> {
    let reqs = w.requests();
    let last = reqs.last()?;
    last.headers
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.clone())
}

/// Everything the agent saw: its request as sent (curl's trace), the response, curl's errors.
fn agent_view(out: &CurlOut) -> String {
    format!("{}\n{}", out.text(), out.stderr)
}

/// Every third byte as lower-case `%xx`: no encoder writes it, so no fixed form matches it.
fn own_encoding(v: &str) -> String {
    v.bytes()
        .enumerate()
        .map(|(i, b)| match i % 3 {
            0 => format!("%{b:02x}"),
            _ => (b as char).to_string(),
        })
        .collect()
}

fn assert_no_secret(what: &str, text: &str) {
    for (name, v) in [
        ("openai", OPENAI),
        ("github", GITHUB),
        ("maps", MAPS),
        ("late", LATE),
    ] {
        assert!(
            !text.contains(v),
            "{what} contains the value of secret {name}:\n{text}"
        );
        let encoded: String = v.bytes().map(|b| format!("%{b:02X}")).collect();
        assert!(
            !text.contains(&encoded),
            "{what} contains secret {name} percent-encoded"
        );
        assert!(
            !text.contains(&own_encoding(v)),
            "{what} contains secret {name} in the agent's own percent-encoding"
        );
    }
}

fn assert_refused(out: &CurlOut, status: u16, code: &str, rule: Option<&str>) {
    assert_eq!(out.exit, 0, "curl failed: {out:?}");
    assert_eq!(out.status, status, "body: {}", out.text());
    let v = out.json();
    assert_eq!(v["error_code"], code, "{v}");
    assert_eq!(v["rule_id"].as_str(), rule, "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_uses_placeholders_secrets_never_leak_and_nothing_the_daemon_wrote_holds_a_value() {
    let w = world().await;
    let mut agent_saw = String::new();
    let bearer = "Authorization: Bearer agenshield:secret:openai";

    // 1. A placeholder to the host its rule binds: the upstream gets the key, on both
    //    listeners; the echo of it comes back to the agent as the placeholder.
    for out in [
        explicit(&w, "api.test", "/echo", &["-H", bearer]).await,
        transparent(&w, "api.test", "/echo", &["-H", bearer]).await,
    ] {
        assert_eq!(out.status, 200, "{}", agent_view(&out));
        assert_eq!(
            last_header(&w, "authorization").as_deref(),
            Some(format!("Bearer {OPENAI}").as_str())
        );
        let echoed = out.json();
        assert_eq!(
            echoed["headers"]["authorization"], "Bearer agenshield:secret:openai",
            "the echo must come back redacted: {echoed}"
        );
        assert!(
            out.stderr.contains("agenshield:secret:openai"),
            "trace shows the placeholder sent"
        );
        agent_saw.push_str(&agent_view(&out));
    }

    // 2. Injection by the rule: a header the agent never sent, and a query parameter.
    let out = explicit(&w, "gh.test", "/echo", &[]).await;
    assert_eq!(out.status, 200, "{}", out.text());
    assert_eq!(
        last_header(&w, "authorization").as_deref(),
        Some(format!("token {GITHUB}").as_str())
    );
    assert_eq!(
        out.json()["headers"]["authorization"],
        "token agenshield:secret:github"
    );
    agent_saw.push_str(&agent_view(&out));
    let out = transparent(&w, "maps.test", "/echo?q=1", &[]).await;
    assert_eq!(out.status, 200, "{}", out.text());
    let seen = w.up.requests().last().map(|r| r.path_and_query.clone());
    assert_eq!(
        seen.as_deref(),
        Some(format!("/echo?q=1&key={MAPS}").as_str())
    );
    assert_eq!(out.json()["path"], "/echo?q=1&key=agenshield:secret:maps");
    agent_saw.push_str(&agent_view(&out));

    // 3. An upstream that echoes the key in a header and in a body split into 3-byte chunks.
    let out = explicit(
        &w,
        "api.test",
        "/split",
        &["-H", bearer, "-D", "/dev/stderr"],
    )
    .await;
    assert_eq!(out.status, 200, "{}", out.text());
    assert_eq!(
        out.text(),
        "you sent: Bearer agenshield:secret:openai\nend\n"
    );
    assert!(
        out.stderr
            .to_ascii_lowercase()
            .contains("x-seen-authorization: bearer agenshield:secret:openai"),
        "{}",
        out.stderr
    );
    agent_saw.push_str(&agent_view(&out));

    // 4. Out of scope: the placeholder to another host; the real value in a header, the URL
    //    or the body to another host. None of them reaches the upstream.
    let before = w.up.requests().len();
    let out = explicit(&w, "other.test", "/echo", &["-H", bearer]).await;
    assert_refused(&out, 403, "secret_scope", Some("other"));
    agent_saw.push_str(&out.text());
    let leaks: [(&str, Vec<String>); 4] = [
        ("/echo", vec!["-H".into(), format!("X-Api-Key: {OPENAI}")]),
        (&format!("/echo?token={GITHUB}"), vec![]),
        (
            "/echo",
            vec!["--data-binary".into(), format!("{{\"key\":\"{MAPS}\"}}")],
        ),
        ("/echo", vec!["-u".into(), format!("me:{GITHUB}")]),
    ];
    for (path, extra) in &leaks {
        let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
        let out = explicit(&w, "other.test", path, &extra).await;
        assert_refused(&out, 403, "secret_leak", Some("other"));
        agent_saw.push_str(&out.text());
    }
    // The value deep in a large streamed body (past the first chunks): refused mid-stream,
    // before the secret's bytes are sent; the upstream never sees a complete request.
    let big = format!("{}{GITHUB}{}", "a".repeat(150_000), "b".repeat(1000));
    let body_file = w.scratch().join("big.txt");
    std::fs::write(&body_file, &big).expect("write body");
    let at = format!("@{}", body_file.display());
    let out = explicit(&w, "other.test", "/echo", &["--data-binary", &at]).await;
    assert_refused(&out, 403, "secret_leak", Some("other"));
    // A placeholder in a body to an unbound host.
    let out = explicit(
        &w,
        "other.test",
        "/echo",
        &["--data-binary", "k=agenshield:secret:maps"],
    )
    .await;
    assert_refused(&out, 403, "secret_scope", Some("other"));
    // Small bodies are checked before anything is sent; the large one was cut off before
    // the secret: the upstream saw at most its head and the bytes before the value (whether
    // the head got there before the refusal is a matter of timing: under load it may not).
    let reached: Vec<_> = w.up.requests()[before..].to_vec();
    let lens: Vec<_> = reached
        .iter()
        .map(|r| {
            (
                r.path_and_query.clone(),
                r.headers
                    .iter()
                    .find(|h| h.0 == "content-length")
                    .map(|h| h.1.clone()),
            )
        })
        .collect();
    let logs = || {
        w.daemon
            .logs()
            .lines()
            .filter(|l| l.contains("refused") || l.contains("request "))
            .collect::<Vec<_>>()
            .join("\n")
    };
    assert!(
        reached.len() <= 1,
        "at most the large upload reached the upstream: {lens:?}\n{}",
        logs()
    );
    if let Some(large) = reached.first() {
        let big_len = big.len().to_string();
        assert_eq!(
            lens[0].1.as_deref(),
            Some(big_len.as_str()),
            "only the large upload may have reached the upstream: {lens:?}\n{}",
            logs()
        );
        let got = large.body.lock().expect("body").clone();
        assert!(
            // How much of the prefix arrives before the reset is a matter of timing.
            got.len() <= 150_000 && got.iter().all(|b| *b == b'a'),
            "{} bytes, not only the prefix",
            got.len()
        );
    }

    // 4b. Other disguises and channels: the value as the method, in the agent's own
    //     percent-encoding, after the placeholder prefix; a bound secret over plain HTTP.
    let before = w.up.requests().len();
    let own_encoding = own_encoding(GITHUB);
    let disguised = format!("X-K: agenshield:secret:{GITHUB}");
    for (path, extra, code) in [
        ("/echo", vec!["-X", GITHUB], "secret_leak"),
        (&format!("/echo/{own_encoding}")[..], vec![], "secret_leak"),
        ("/echo", vec!["-H", &disguised], "secret_scope"),
    ] {
        let out = explicit(&w, "other.test", path, &extra).await;
        assert_refused(&out, 403, code, Some("other"));
        assert!(!out.text().contains(GITHUB), "{}", out.text());
        agent_saw.push_str(&out.text());
    }
    let plain = format!("http://api.test:{}/echo", w.up.addr.port());
    let proxy = format!("http://{}", w.daemon.explicit);
    let out = curl(&["--proxy", &proxy, "-H", bearer, &plain], false).await;
    assert_refused(&out, 403, "secret_scope", Some("openai"));
    assert!(out.json()["message"]
        .as_str()
        .unwrap_or("")
        .contains("plain HTTP"));
    assert_eq!(
        w.up.requests().len(),
        before,
        "none of them reached the upstream"
    );
    //     A WebSocket under a rule that binds secrets goes on (its messages are guarded one
    //     by one: secret_positions.rs), without the compression it offered, which would hide
    //     them.
    let out = explicit(
        &w,
        "api.test",
        "/echo",
        &[
            "--http1.1",
            "-H",
            "Connection: Upgrade",
            "-H",
            "Upgrade: websocket",
            "-H",
            "Sec-WebSocket-Extensions: permessage-deflate",
        ],
    )
    .await;
    assert_eq!(out.status, 200, "{}", out.text());
    let seen =
        w.up.requests()
            .last()
            .cloned()
            .expect("it reached the upstream");
    assert!(
        !seen
            .headers
            .iter()
            .any(|(k, _)| k == "sec-websocket-extensions"),
        "{:?}",
        seen.headers
    );
    agent_saw.push_str(&out.text());

    // 5. The per-secret rate limit (3 per hour; 1 used above): the 2nd and 3rd pass, the 4th is 429.
    for _ in 0..2 {
        assert_eq!(explicit(&w, "gh.test", "/", &[]).await.status, 200);
    }
    let out = explicit(&w, "gh.test", "/", &[]).await;
    assert_eq!(out.status, 429, "{}", out.text());
    assert_eq!(out.json()["error_code"], "rate_limited");
    assert!(out.json()["message"]
        .as_str()
        .unwrap_or("")
        .contains("secret:github"));

    // 6. ctl: a secret set over stdin becomes usable once a rule binds it.
    let (code, stdout, stderr) = w
        .daemon
        .ctl_stdin(&["secrets", "set", "late"], format!("{LATE}\n").as_bytes());
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert!(stdout.contains("agenshield:secret:late"), "{stdout}");
    let late_rule = "version = 1\n[[rule]]\nid = \"late\"\nhosts = [\"late.test\"]\naction = \"allow\"\ninject = [{ header = \"X-Key\", value = \"${secret:late}\" }]\n";
    std::fs::write(w.daemon.dir.path().join("policies/late.toml"), late_rule)
        .expect("write policy");
    let (code, out, err) = w.daemon.ctl(&[], &["reload"]);
    assert_eq!(code, 0, "{out}{err}");
    let out = explicit(&w, "late.test", "/echo", &[]).await;
    assert_eq!(out.status, 200, "{}", out.text());
    assert_eq!(last_header(&w, "x-key").as_deref(), Some(LATE));
    assert_eq!(out.json()["headers"]["x-key"], "agenshield:secret:late");
    agent_saw.push_str(&agent_view(&out));

    // What the agent saw, all of it, never holds a value.
    assert_no_secret("the agent's view", &agent_saw);

    // 7. ctl output: list shows names, bindings and use, never values.
    let mut ctl_out = String::new();
    let (code, list, err) = w.daemon.ctl(&[], &["secrets", "list"]);
    assert_eq!(code, 0, "{err}");
    assert!(list.contains("github") && list.contains("late"), "{list}");
    let (_, json, _) = w.daemon.ctl(&[], &["secrets", "list", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&json).expect("json");
    let github = v["secrets"]
        .as_array()
        .and_then(|a| a.iter().find(|s| s["name"] == "github"))
        .cloned()
        .expect("github listed");
    assert_eq!(github["rules"], serde_json::json!(["github"]));
    assert_eq!(github["uses"], 3);
    assert!(github["last_used"].is_string());
    assert_eq!(github["rate"], "3 per 1h, burst 3");
    // The store is structured (issue 34), not one "file vault <path>" string.
    assert_eq!(v["store"]["kind"], "file", "{v}");
    assert_eq!(
        v["store"]["path"].as_str(),
        Some(w.daemon.vault().display().to_string().as_str()),
        "{v}"
    );
    assert!(
        list.contains(&format!("store: file vault {}", w.daemon.vault().display())),
        "{list}"
    );
    ctl_out.push_str(&list);
    ctl_out.push_str(&json);
    for args in [
        &["status"][..],
        &["stats"],
        &["tail"],
        &["tail", "--json"],
        &["policy", "show"],
        &["policy", "show", "--json"],
        &["secrets", "rm", "github"],
    ] {
        let (_, out, err) = w.daemon.ctl(&[], args);
        ctl_out.push_str(&out);
        ctl_out.push_str(&err);
    }
    assert!(
        ctl_out.contains("bound by rule(s) github"),
        "rm of a bound secret is refused: {ctl_out}"
    );
    assert!(
        ctl_out.contains("secret_leak") && ctl_out.contains("secret_scope"),
        "tail shows the refusals"
    );
    assert_no_secret("ctl output", &ctl_out);

    // 8. Every byte the daemon logged (at debug level), after all of the above.
    let logs = w.daemon.logs();
    assert!(logs.contains("secret_leak"), "refusals are logged");
    assert_no_secret("the daemon's log", &logs);
}
