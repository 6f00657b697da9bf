//! LLM token budgets end to end: a fake OpenAI- and Anthropic-compatible API
//! (`agenshield_e2e::llm`, a hyper server on loopback) behind the real daemon. The daemon
//! counts each response's `usage` (JSON and event streams, without holding the stream back),
//! refuses the next request once the budget is spent (429 `token_budget_exhausted` with the
//! budget, the spend and the reset time, and `Retry-After`), records every decision with its
//! `budget`, counts it in metrics and `ctl status`, and starts afresh when the window ends.
//! The root test shows the budget is per agent: two real agent users behind the nftables
//! redirect, each with a budget of its own.
//!
//! Budget windows are aligned to the Unix epoch; each test waits for a fresh window before a
//! sequence that must fit in one, so a window never ends in the middle of it.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use agenshield_e2e::audit;
use agenshield_e2e::daemon::{Daemon, DaemonOptions};
use agenshield_e2e::llm::LlmUpstream;
use agenshield_e2e::pki::TestCa;
use agenshield_e2e::world::LOCAL;
use serde_json::Value;

const POLICY: &str = r#"
version = 1
default = "deny"

[[rule]]
id = "openai"
hosts = ["api.openai.test"]
action = "allow"
budget = { tokens = 100, per = "8s" }

[[rule]]
id = "anthropic"
hosts = ["api.anthropic.test"]
action = "allow"
budget = { tokens = 100, per = "1h", scope = "host" }

[[rule]]
id = "other"
hosts = ["api.other.test"]
action = "allow"
budget = { tokens = 100000, per = "1h" }
"#;

const HOSTS: [&str; 3] = ["api.openai.test", "api.anthropic.test", "api.other.test"];

/// What curl saw of one request.
#[derive(Debug)]
struct Reply {
    status: u16,
    /// The response head, lower-cased names.
    head: String,
    body: String,
    /// Seconds to the first byte of the response, and to its end.
    first_byte: f64,
    total: f64,
}

impl Reply {
    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }

    fn header(&self, name: &str) -> Option<String> {
        self.head.lines().find_map(|l| {
            let (n, v) = l.split_once(':')?;
            n.trim()
                .eq_ignore_ascii_case(name)
                .then(|| v.trim().to_string())
        })
    }
}

/// POSTs a small prompt to `url` with curl under `prefix` (empty: as this process), through
/// `via` (curl options that lead to the daemon).
async fn post(prefix: &[String], via: &[String], url: &str) -> Reply {
    const MARK: &str = "\n@@budget@@ ";
    let (program, pre) = match prefix.split_first() {
        Some((p, rest)) => (p.as_str(), rest.to_vec()),
        None => ("curl", Vec::new()),
    };
    let mut cmd = tokio::process::Command::new(program);
    cmd.args(&pre);
    if !prefix.is_empty() {
        cmd.arg("curl");
    }
    cmd.args(["-sS", "-i", "--max-time", "30", "-X", "POST"])
        .args(["-H", "content-type: application/json"])
        .args([
            "-d",
            r#"{"model":"fake","messages":[{"role":"user","content":"hi"}]}"#,
        ])
        .args([
            "-w",
            &format!("{MARK}%{{http_code}} %{{time_starttransfer}} %{{time_total}}"),
        ])
        .args(via)
        .arg(url)
        .env_remove("http_proxy")
        .env_remove("https_proxy")
        .env_remove("HTTPS_PROXY")
        .env_remove("ALL_PROXY")
        .env_remove("all_proxy");
    let out = tokio::time::timeout(Duration::from_secs(60), cmd.output())
        .await
        .expect("curl in time")
        .expect("curl runs");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (resp, w) = text.rsplit_once(MARK).unwrap_or_else(|| {
        panic!(
            "no curl summary: {text} {}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    let mut w = w.split_whitespace();
    let status = w.next().and_then(|s| s.parse().ok()).unwrap_or(0);
    let first_byte = w.next().and_then(|s| s.parse().ok()).unwrap_or(-1.0);
    let total = w.next().and_then(|s| s.parse().ok()).unwrap_or(-1.0);
    let (head, body) = resp
        .split_once("\r\n\r\n")
        .map_or((resp, ""), |(h, b)| (h, b));
    Reply {
        status,
        head: head.to_string(),
        body: body.to_string(),
        first_byte,
        total,
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Sleeps until a window of `per` has just begun (150 ms into it).
async fn fresh_window(per: Duration) {
    let per = per.as_millis() as u64;
    let into = now_ms() % per;
    tokio::time::sleep(Duration::from_millis(per - into + 150)).await;
}

/// The request records about `host`, in the order written.
fn records(daemon: &Daemon, host: &str) -> Vec<Value> {
    audit::lines(&daemon.audit_path())
        .into_iter()
        .filter(|r| r["kind"] == "request" && r["host"] == host)
        .collect()
}

/// The value of the metric line that starts with `series` (name and labels), if any.
async fn metric(daemon: &Daemon, series: &str) -> Option<f64> {
    let out = tokio::process::Command::new("curl")
        .args(["-s", "--max-time", "5"])
        .arg(format!("http://{}/metrics", daemon.metrics))
        .output()
        .await
        .expect("curl metrics");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
}

/// The fake API on loopback and a daemon under `POLICY` in front of it (every transparent
/// connection taken as headed to it).
struct Loopback {
    daemon: Daemon,
    llm: LlmUpstream,
    _ca_dir: tempfile::TempDir,
}

impl Loopback {
    async fn start() -> Loopback {
        Self::with(POLICY, Vec::new()).await
    }

    /// Under `policy`, with `[ratelimit]` lines `ratelimit`.
    async fn with(policy: &str, ratelimit: Vec<String>) -> Loopback {
        let ca = TestCa::new("budget upstream CA");
        let llm = LlmUpstream::start(&ca.leaf(&HOSTS)).await;
        let dir = tempfile::tempdir().expect("tempdir");
        let ca_file = dir.path().join("upstream-ca.pem");
        ca.write_pem(&ca_file).expect("write CA");
        let daemon = Daemon::start(DaemonOptions {
            policies: vec![("main.toml".into(), policy.into())],
            extra_ca: vec![ca_file],
            hosts: HOSTS.iter().map(|h| (h.to_string(), LOCAL)).collect(),
            orig_dst: Some(llm.addr),
            ratelimit,
            ..Default::default()
        });
        Loopback {
            daemon,
            llm,
            _ca_dir: dir,
        }
    }

    fn via(&self, host: &str) -> Vec<String> {
        vec![
            "--cacert".into(),
            self.daemon.ca_path.display().to_string(),
            "--connect-to".into(),
            format!(
                "{host}:{}:127.0.0.1:{}",
                self.llm.addr.port(),
                self.daemon.transparent.port()
            ),
        ]
    }

    async fn post(&self, host: &str, path_and_query: &str) -> Reply {
        let url = format!("https://{host}:{}{path_and_query}", self.llm.addr.port());
        post(&[], &self.via(host), &url).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_usage_in_json_and_sse_spends_the_budget_which_refuses_exactly_when_spent_and_resets(
) {
    let lab = Loopback::start().await;
    let per = Duration::from_secs(8);
    let host = "api.openai.test";
    fresh_window(per).await;
    let json = |n: u32| format!("/v1/chat/completions?tokens={n}");
    assert_eq!(lab.post(host, &json(40)).await.status, 200);
    // A stream whose usage comes in its last chunk, 1.5 s after its first: the first event
    // reaches the agent at once (the meter holds nothing back), and the usage is counted.
    let sse = lab
        .post(
            host,
            "/v1/chat/completions?tokens=30&stream=1&pause_ms=1500",
        )
        .await;
    assert_eq!(sse.status, 200, "{sse:?}");
    assert!(sse.body.contains("\"total_tokens\":30"), "{}", sse.body);
    assert!(
        sse.first_byte < 1.2 && sse.total >= 1.5,
        "the stream was held back: first byte after {} s, end after {} s",
        sse.first_byte,
        sse.total
    );
    // 99 of 100 spent: the next request still goes (and overshoots, as one in flight may).
    assert_eq!(lab.post(host, &json(29)).await.status, 200);
    assert_eq!(lab.post(host, &json(5)).await.status, 200);
    // Spent: refused, with the budget in the JSON and Retry-After until the window ends.
    let refused = lab.post(host, &json(1)).await;
    assert_eq!(refused.status, 429, "{refused:?}");
    let body = refused.json();
    assert_eq!(body["error_code"], "token_budget_exhausted", "{body}");
    assert_eq!(body["rule_id"], "openai");
    assert_eq!(body["retryable"], true);
    assert_eq!(body["budget"]["limit"], 100, "{body}");
    assert_eq!(body["budget"]["spent"], 104, "{body}");
    let resets = body["budget"]["resets"]
        .as_str()
        .expect("resets")
        .to_string();
    assert!(resets.ends_with('Z') && resets.contains('T'), "{resets}");
    let retry: u64 = refused
        .header("retry-after")
        .and_then(|v| v.parse().ok())
        .expect("Retry-After");
    assert!((1..=8).contains(&retry), "Retry-After {retry}");
    assert!(
        body["message"]
            .as_str()
            .is_some_and(|m| m.contains("rule:openai") && m.contains(&resets)),
        "{body}"
    );
    assert_eq!(lab.llm.served.load(std::sync::atomic::Ordering::Relaxed), 4);

    // Every decision is recorded with the budget's standing.
    let recs = records(&lab.daemon, host);
    let got: Vec<(u64, bool, u64, u64)> = recs
        .iter()
        .map(|r| {
            let b = &r["budget"];
            (
                b["tokens"].as_u64().expect("tokens"),
                b["estimated"].as_bool().expect("estimated"),
                b["spent"].as_u64().expect("spent"),
                b["limit"].as_u64().expect("limit"),
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            (40, false, 40, 100),
            (30, false, 70, 100),
            (29, false, 99, 100),
            (5, false, 104, 100),
            (0, false, 104, 100)
        ],
        "{recs:#?}"
    );
    let last = recs.last().expect("the refusal's record");
    assert_eq!(last["decision"], "limited");
    assert_eq!(last["error_code"], "token_budget_exhausted");
    assert_eq!(last["status"], 429);
    assert_eq!(last["budget"]["resets"], resets.as_str());
    let uid = last["agent_uid"].as_u64().expect("agent uid");
    // The records are as `docs/audit.schema.json` says, and the schema checks the field.
    audit::assert_matches_schema(&audit::lines(&lab.daemon.audit_path()));
    let mut odd = last.clone();
    odd["budget"]["surprise"] = Value::from(1);
    let mut missing = last.clone();
    missing["budget"]
        .as_object_mut()
        .expect("budget")
        .remove("resets");
    for bad in [odd, missing] {
        let refused =
            std::panic::catch_unwind(|| audit::assert_matches_schema(std::slice::from_ref(&bad)));
        assert!(refused.is_err(), "the schema let through {bad}");
    }

    // Metrics by rule and agent; `ctl status` shows the spend, as text and JSON.
    let labels = format!("{{agent=\"{uid}\",rule=\"openai\"}}");
    assert_eq!(
        metric(
            &lab.daemon,
            &format!("agenshield_proxy_budget_tokens_total{labels}")
        )
        .await,
        Some(104.0)
    );
    assert_eq!(
        metric(
            &lab.daemon,
            &format!("agenshield_proxy_budget_remaining_tokens{labels}")
        )
        .await,
        Some(0.0)
    );
    assert_eq!(
        metric(
            &lab.daemon,
            &format!("agenshield_proxy_budget_exhausted_total{labels}")
        )
        .await,
        Some(1.0)
    );
    let (code, out, err) = lab.daemon.ctl(&[], &["status", "--json"]);
    assert_eq!(code, 0, "{err}");
    let status: Value = serde_json::from_str(&out).expect("status JSON");
    let spend = status["budgets"]
        .as_array()
        .and_then(|l| l.iter().find(|b| b["rule"] == "openai"))
        .unwrap_or_else(|| panic!("no openai budget in {status}"));
    assert_eq!(spend["spent"], 104);
    assert_eq!(spend["limit"], 100);
    assert_eq!(spend["scope"], "agent");
    assert_eq!(spend["who"], format!("uid {uid}"));
    assert_eq!(spend["resets"], resets.as_str());
    let (code, text, err) = lab.daemon.ctl(&[], &["status"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        text.contains(&format!(
            "rule:openai uid {uid} (agent)  104 of 100 tokens per 8s"
        )),
        "{text}"
    );

    // The window ends: the budget is whole again.
    fresh_window(per).await;
    assert_eq!(lab.post(host, &json(10)).await.status, 200);
    let recs = records(&lab.daemon, host);
    let after = &recs.last().expect("record")["budget"];
    assert_eq!(
        (after["tokens"].as_u64(), after["spent"].as_u64()),
        (Some(10), Some(10))
    );
    assert_ne!(after["resets"], resets.as_str());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anthropic_usage_in_json_and_sse_is_counted_and_unreadable_usage_is_estimated() {
    let lab = Loopback::start().await;
    let host = "api.anthropic.test";
    // input_tokens + output_tokens: 20 + 20 in JSON…
    assert_eq!(lab.post(host, "/v1/messages?tokens=40").await.status, 200);
    // …and 25 in message_start + 25 in message_delta in a stream.
    let sse = lab.post(host, "/v1/messages?tokens=50&stream=1").await;
    assert_eq!(sse.status, 200);
    assert!(sse.body.contains("message_delta"), "{}", sse.body);
    assert_eq!(lab.post(host, "/v1/messages?tokens=10").await.status, 200);
    let refused = lab.post(host, "/v1/messages?tokens=10").await;
    assert_eq!(refused.status, 429);
    assert_eq!(refused.json()["budget"]["spent"], 100);
    let spent: Vec<(u64, u64)> = records(&lab.daemon, host)
        .iter()
        .map(|r| {
            (
                r["budget"]["tokens"].as_u64().expect("tokens"),
                r["budget"]["spent"].as_u64().expect("spent"),
            )
        })
        .collect();
    assert_eq!(spent, [(40, 40), (50, 90), (10, 100), (0, 100)]);
    // scope = "host": `ctl status` names the host.
    let (_, out, _) = lab.daemon.ctl(&[], &["status", "--json"]);
    let status: Value = serde_json::from_str(&out).expect("status JSON");
    assert!(
        status["budgets"]
            .as_array()
            .is_some_and(|l| l.iter().any(|b| b["rule"] == "anthropic"
                && b["who"] == host
                && b["scope"] == "host"
                && b["spent"] == 100)),
        "{status}"
    );

    // No usage in the response: (request + response body bytes) / 4, marked as estimated.
    let other = "api.other.test";
    let r = lab.post(other, "/v1/nousage?bytes=4000").await;
    assert_eq!(r.status, 200);
    let rec = records(&lab.daemon, other).pop().expect("record");
    let b = &rec["budget"];
    let (up, down) = (
        rec["bytes_up"].as_u64().expect("up"),
        rec["bytes_down"].as_u64().expect("down"),
    );
    assert!(down > 4000, "{rec}");
    assert_eq!(b["estimated"], true, "{rec}");
    audit::assert_matches_schema(&audit::lines(&lab.daemon.audit_path()));
    assert_eq!(b["tokens"].as_u64(), Some((up + down).div_ceil(4)), "{rec}");
    assert_eq!(
        metric(
            &lab.daemon,
            "agenshield_proxy_budget_estimated_responses_total{rule=\"other\"}"
        )
        .await,
        Some(1.0)
    );
    // A gzip-compressed answer is decoded on its way: its usage counts, no estimate.
    let r = lab
        .post(other, "/v1/chat/completions?tokens=7&gzip=1")
        .await;
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-encoding").as_deref(), Some("gzip"));
    let rec = records(&lab.daemon, other).pop().expect("record");
    assert_eq!(
        (
            rec["budget"]["tokens"].as_u64(),
            rec["budget"]["estimated"].as_bool()
        ),
        (Some(7), Some(false)),
        "{rec}"
    );
}

/// `ctl policy lint` validates budgets: a bad one names the key, and a fleet-wide one
/// without `[ratelimit] store` is a clear error naming the rule (as the daemon's own load).
#[test]
fn policy_lint_validates_budgets_and_a_fleet_budget_needs_a_store() {
    let lint = |policy: &str, files: &[&str]| {
        let dir = agenshield_e2e::daemon::prepare(&DaemonOptions {
            policies: vec![("llm.toml".into(), policy.into())],
            ..Default::default()
        });
        let mut cmd = std::process::Command::new(agenshield_e2e::daemon::binary());
        cmd.args(["proxy", "ctl", "policy", "lint"])
            .args(files.iter().map(|f| dir.path().join("policies").join(f)))
            .arg("--config")
            .arg(dir.path().join("proxy.toml"));
        let out = cmd.output().expect("run ctl");
        (
            out.status.code().unwrap_or(-1),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        )
    };
    let fleet = "version = 1\n[[rule]]\nid = \"shared-llm\"\nhosts = [\"api.openai.test\"]\n\
                 action = \"allow\"\nbudget = { tokens = 5, per = \"1d\", scope = \"fleet\" }\n";
    let (code, out) = lint(fleet, &[]);
    assert_ne!(code, 0, "{out}");
    assert!(
        out.contains("shared-llm")
            && out.contains("budget.scope")
            && out.contains("[ratelimit] store"),
        "{out}"
    );
    let typo = "version = 1\n[[rule]]\nid = \"typo\"\nhosts = [\"api.openai.test\"]\n\
                action = \"allow\"\nbudget = { tokens = 5, per = \"1w\" }\n";
    let (code, out) = lint(typo, &["llm.toml"]);
    assert_ne!(code, 0, "{out}");
    assert!(
        out.contains("budget.per") && out.contains("llm.toml:6"),
        "{out}"
    );
    let good = "version = 1\n[[rule]]\nid = \"ok\"\nhosts = [\"api.openai.test\"]\n\
                action = \"allow\"\nbudget = { tokens = 2_000_000, per = \"1d\", scope = \"host\" }\n";
    let (code, out) = lint(good, &[]);
    assert_eq!(code, 0, "{out}");
}

/// Two daemons sharing one real `redis-server` spend one fleet-wide budget together; with
/// the store gone and `on_store_error = "deny"`, a request under it is refused at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_daemons_spend_one_fleet_budget_in_the_shared_store() {
    use agenshield_e2e::redis::{self, RedisServer};
    if let Some(why) = redis::missing() {
        eprintln!("{why}");
        return;
    }
    let mut store = RedisServer::start();
    let policy = r#"
version = 1
default = "deny"

[[rule]]
id = "fleet-llm"
hosts = ["api.openai.test"]
action = "allow"
budget = { tokens = 100, per = "1h", scope = "fleet" }
"#;
    let lines = || {
        vec![
            format!("store = {:?}", store.url()),
            "key_prefix = \"budget-e2e:\"".to_string(),
            "on_store_error = \"deny\"".to_string(),
            "timeout = \"1s\"".to_string(),
        ]
    };
    let a = Loopback::with(policy, lines()).await;
    let b = Loopback::with(policy, lines()).await;
    // Not within 30 s of the hour's end: the whole sequence is in one window.
    let hour = 3_600_000;
    if hour - now_ms() % hour < 30_000 {
        fresh_window(Duration::from_millis(hour)).await;
    }
    // The store's counter, as redis-cli reads it (it is added to just after each response).
    let counter = || {
        let out = std::process::Command::new("redis-cli")
            .args([
                "-u",
                &store.url(),
                "--scan",
                "--pattern",
                "budget-e2e:budget:*",
            ])
            .output()
            .expect("redis-cli");
        let key = String::from_utf8_lossy(&out.stdout).trim().to_string();
        let out = std::process::Command::new("redis-cli")
            .args(["-u", &store.url(), "GET", &key])
            .output()
            .expect("redis-cli");
        String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse::<u64>()
            .unwrap_or(0)
    };
    let wait_counter = |want: u64| {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while counter() != want {
            assert!(
                std::time::Instant::now() < deadline,
                "the store never said {want}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    // Wait for both daemons' store connections (the first check must not find none).
    for d in [&a, &b] {
        let deadline = std::time::Instant::now() + Duration::from_secs(15);
        while metric(&d.daemon, "agenshield_proxy_ratelimit_store_up").await != Some(1.0) {
            assert!(std::time::Instant::now() < deadline, "{}", d.daemon.logs());
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    let host = "api.openai.test";
    assert_eq!(
        a.post(host, "/v1/chat/completions?tokens=60").await.status,
        200
    );
    wait_counter(60);
    assert_eq!(
        b.post(host, "/v1/chat/completions?tokens=50&stream=1")
            .await
            .status,
        200
    );
    wait_counter(110);
    for d in [&a, &b] {
        let refused = d.post(host, "/v1/chat/completions?tokens=1").await;
        assert_eq!(refused.status, 429, "{refused:?}");
        let body = refused.json();
        assert_eq!(body["error_code"], "token_budget_exhausted");
        assert_eq!(body["budget"]["spent"], 110, "{body}");
        assert!(
            body["message"]
                .as_str()
                .is_some_and(|m| m.contains("fleet")),
            "{body}"
        );
    }
    let b_recs = records(&b.daemon, host);
    assert_eq!(b_recs[0]["budget"]["spent"], 110, "{b_recs:?}");
    assert_eq!(b_recs[0]["budget"]["tokens"], 50);
    // The store goes away: with `on_store_error = "deny"` the request is refused at once.
    store.kill();
    let started = std::time::Instant::now();
    let out = a.post(host, "/v1/chat/completions?tokens=1").await;
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(out.status, 429, "{out:?}");
    assert_eq!(out.json()["error_code"], "rate_limit_store_unavailable");
}

#[cfg(target_os = "linux")]
mod per_agent {
    use std::os::unix::fs::PermissionsExt;

    use super::*;
    use agenshield_e2e::netlab::{root_or_skip, AgentUser, FirewallCleanup, Internet};

    const POLICY: &str = r#"
version = 1
default = "deny"

[[rule]]
id = "llm"
hosts = ["api.llm.test"]
action = "allow"
budget = { tokens = 100, per = "8s" }
"#;

    /// Two real agent users, both redirected into one daemon by its nftables rules; the fake
    /// API inside the test's namespace.
    // The guard serialises root tests for the whole test (one nftables table, throwaway users).
    #[allow(clippy::await_holding_lock)]
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn each_agent_has_a_budget_of_its_own_and_it_resets() {
        let Some(_serial) = root_or_skip("token_budget_per_agent") else {
            return;
        };
        let _table = FirewallCleanup;
        let a = AgentUser::create(341);
        let b = AgentUser::create(342);
        let net = Internet::create();
        net.assert_route(net.a4);
        let ca = TestCa::new("budget agents CA");
        let listener = net
            .bind_tcp(&[std::net::SocketAddr::new(net.a4, 443)])
            .pop()
            .expect("listener");
        let _llm = LlmUpstream::serve_std(listener, &ca.leaf(&["api.llm.test"]));
        let share = tempfile::tempdir().expect("tempdir");
        std::fs::set_permissions(share.path(), std::fs::Permissions::from_mode(0o755))
            .expect("chmod");
        let upstream_ca = share.path().join("upstream-ca.pem");
        ca.write_pem(&upstream_ca).expect("write CA");
        let daemon = Daemon::start(DaemonOptions {
            policies: vec![("main.toml".into(), POLICY.into())],
            extra_ca: vec![upstream_ca],
            hosts: vec![("api.llm.test".into(), net.a4)],
            allow_private: vec![net.net4.clone()],
            redirect_uid: Some(a.uid),
            agent_uids: vec![b.uid],
            ..Default::default()
        });
        let our_ca = share.path().join("agenshield-ca.pem");
        std::fs::copy(&daemon.ca_path, &our_ca).expect("copy CA");
        std::fs::set_permissions(&our_ca, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        let via = vec![
            "--cacert".to_string(),
            our_ca.display().to_string(),
            "--resolve".into(),
            format!("api.llm.test:443:{}", net.a4),
        ];
        let url = |n: u32, stream: bool| {
            format!(
                "https://api.llm.test/v1/chat/completions?tokens={n}{}",
                if stream { "&stream=1" } else { "" }
            )
        };
        let as_a = a.as_agent();
        let as_b = b.as_agent();
        let per = Duration::from_secs(8);
        fresh_window(per).await;
        // A spends its 100 (JSON, then a stream), and is refused…
        assert_eq!(
            post(&as_a, &via, &url(60, false)).await.status,
            200,
            "{}",
            daemon.logs()
        );
        assert_eq!(post(&as_a, &via, &url(40, true)).await.status, 200);
        let refused = post(&as_a, &via, &url(1, false)).await;
        assert_eq!(refused.status, 429, "{refused:?}");
        assert_eq!(refused.json()["budget"]["spent"], 100);
        // …while B has its own budget, whole: 99 of it and then 2 more (in flight), refused.
        assert_eq!(post(&as_b, &via, &url(99, true)).await.status, 200);
        assert_eq!(post(&as_b, &via, &url(2, false)).await.status, 200);
        let b_refused = post(&as_b, &via, &url(1, false)).await;
        assert_eq!(b_refused.status, 429);
        assert_eq!(b_refused.json()["budget"]["spent"], 101);
        net.assert_route(net.a4);
        let recs: Vec<(u64, u16, u64)> = audit::lines(&daemon.audit_path())
            .into_iter()
            .filter(|r| r["kind"] == "request" && r["host"] == "api.llm.test")
            .map(|r| {
                (
                    r["agent_uid"].as_u64().expect("uid"),
                    r["status"].as_u64().expect("status") as u16,
                    r["budget"]["spent"].as_u64().expect("spent"),
                )
            })
            .collect();
        let (ua, ub) = (u64::from(a.uid), u64::from(b.uid));
        assert_eq!(
            recs,
            [
                (ua, 200, 60),
                (ua, 200, 100),
                (ua, 429, 100),
                (ub, 200, 99),
                (ub, 200, 101),
                (ub, 429, 101)
            ]
        );
        let (_, out, _) = daemon.ctl(&[], &["status", "--json"]);
        let status: Value = serde_json::from_str(&out).expect("status JSON");
        let whos: Vec<(String, u64)> = status["budgets"]
            .as_array()
            .expect("budgets")
            .iter()
            .map(|b| {
                (
                    b["who"].as_str().unwrap_or("").to_string(),
                    b["spent"].as_u64().unwrap_or(0),
                )
            })
            .collect();
        assert!(whos.contains(&(format!("uid {}", a.uid), 100)), "{whos:?}");
        assert!(whos.contains(&(format!("uid {}", b.uid), 101)), "{whos:?}");
        // The window ends: both are served again.
        fresh_window(per).await;
        assert_eq!(post(&as_a, &via, &url(5, false)).await.status, 200);
        assert_eq!(post(&as_b, &via, &url(5, false)).await.status, 200);
    }
}
