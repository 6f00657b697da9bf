//! What ships in `grafana/`, against the real engines: a fresh daemon scraped by a real
//! Prometheus leaves no dashboard panel without data; the alert rules pass `promtool check
//! rules` and their unit tests (`promtool test rules`), and fire in a real Prometheus on a
//! real daemon's condition (a rejected policy edit) while a healthy daemon fires none of the
//! others; the compose file binds everything to loopback and mounts files that exist.

use std::process::Command;
use std::time::{Duration, Instant};

use agenshield_e2e::daemon::{Daemon, DaemonOptions};
use agenshield_e2e::prometheus::{self, grafana_dir};

const POLICY: &str = r#"
version = 1
default = "deny"

[[rule]]
id = "api"
hosts = ["api.test"]
action = "allow"
"#;

fn daemon() -> Daemon {
    Daemon::start(DaemonOptions {
        policies: vec![("main.toml".into(), POLICY.into())],
        ..Default::default()
    })
}

/// The dashboard's expressions that return nothing, polled until `within` has passed (or
/// none is left).
async fn without_data(p: &prometheus::Prometheus, within: Duration) -> Vec<String> {
    let exprs = prometheus::dashboard_exprs();
    assert!(exprs.len() >= 20, "dashboard has {} queries", exprs.len());
    let deadline = Instant::now() + within;
    loop {
        let empty: Vec<String> = exprs.iter().filter(|e| !p.has_data(e)).cloned().collect();
        if empty.is_empty() || Instant::now() > deadline {
            return empty;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_daemon_leaves_no_dashboard_panel_without_data() {
    if let Some(why) = prometheus::missing() {
        eprintln!("{why}");
        return;
    }
    let d = daemon();
    let prom = prometheus::start(d.metrics, &[]);
    // No request at all: every panel must still show a figure (zero), not "No data".
    let empty = without_data(&prom, Duration::from_secs(40)).await;
    assert!(
        empty.is_empty(),
        "{} dashboard queries return no data on a fresh daemon:\n{}\nthe scrape:\n{}",
        empty.len(),
        empty.join("\n"),
        scrape(&d)
    );
    // The health row reads as a healthy daemon that does not keep a redirect.
    let value = |expr: &str| -> f64 {
        let v = prom.query(expr);
        v["data"]["result"][0]["value"][1]
            .as_str()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("{expr}: {v}"))
    };
    assert_eq!(
        value("min(agenshield_proxy_audit_ready) * (1 - max(agenshield_proxy_audit_retention_blocked))"),
        1.0
    );
    assert_eq!(value("min(agenshield_proxy_policy_watch_active)"), 1.0);
    assert_eq!(
        value("max(agenshield_proxy_firewall_redirect_managed) * (1 + min(agenshield_proxy_firewall_redirect_active))"),
        0.0,
        "a daemon without redirect.enabled reads 'kept elsewhere', not MISSING"
    );
}

/// Every metric selector of the dashboard is narrowed by the `instance` variable, so picking
/// hosts narrows every panel (a selector without it would silently sum the whole fleet).
#[test]
fn every_dashboard_query_follows_the_instance_variable() {
    let mut unscoped = Vec::new();
    for e in prometheus::raw_dashboard_exprs() {
        let mut rest = e.as_str();
        while let Some(i) = rest.find("agenshield_proxy_") {
            let tail = &rest[i..];
            let name_len = tail
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(tail.len());
            if !tail[name_len..].starts_with("{instance=~\"$instance\"") {
                unscoped.push(format!("{}  in  {e}", &tail[..name_len]));
            }
            rest = &tail[name_len..];
        }
    }
    assert!(
        unscoped.is_empty(),
        "selectors without instance:\n{}",
        unscoped.join("\n")
    );
    let dash: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(grafana_dir().join("dashboards/agenshield-proxy.json"))
            .expect("dashboard"),
    )
    .expect("JSON");
    let vars = dash["templating"]["list"].as_array().expect("variables");
    let inst = vars
        .iter()
        .find(|v| v["name"] == "instance")
        .expect("an instance variable");
    assert_eq!(inst["allValue"], ".*", "{inst}");
    assert_eq!(inst["multi"], true, "{inst}");
    assert_eq!(dash["panels"][0]["title"], "Fleet overview");
}

/// The shipped fleet configuration, as an operator runs it: two daemons, each with its own
/// Prometheus from `fleet-host.yml` (instance = the host's name), and a central Prometheus
/// from `fleet-central.yml` that gets their series by remote_write (push) or by federation
/// (pull). On the central one, every panel of the fleet overview row shows both hosts, and
/// selecting one instance narrows every panel of the dashboard to it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shipped_fleet_configs_bring_every_host_into_the_fleet_row() {
    if let Some(why) = prometheus::missing() {
        eprintln!("{why}");
        return;
    }
    let (a, b) = (daemon(), daemon());
    let dir = grafana_dir().join("prometheus");
    let read = |f: &str| std::fs::read_to_string(dir.join(f)).expect(f);
    let (host_yml, central_yml) = (read("fleet-host.yml"), read("fleet-central.yml"));
    let alerts = dir.join("alerts.yml").display().to_string();
    let central = |hosts: &str, args: &[&str]| {
        let text = central_yml
            .replace("@HOSTS@", hosts)
            .replace("- alerts.yml", &format!("- '{alerts}'"))
            .replace("15s", "1s");
        prometheus::start_config(&text, args)
    };
    let host = |name: &str, daemon: &Daemon, central: &str| {
        let text = host_yml
            .replace("@HOST@", name)
            .replace("@CENTRAL@", central)
            .replace("127.0.0.1:15090", &daemon.metrics.to_string())
            .replace("15s", "1s");
        prometheus::start_config(&text, &[])
    };
    // Push: both hosts remote_write to a central Prometheus that receives.
    let push = central("", &["--web.enable-remote-write-receiver"]);
    let central_url = format!("http://{}", push.addr);
    let pa = host("host-a", &a, &central_url);
    let pb = host("host-b", &b, &central_url);
    for p in [&push, &pa, &pb] {
        let (ok, out) = promtool(&[
            "check",
            "config",
            &p.dir.path().join("prometheus.yml").display().to_string(),
        ]);
        assert!(ok, "promtool check config: {out}");
    }
    fleet_row_shows(&push, &["host-a", "host-b"]).await;
    // One host selected: every query of the dashboard that answers per instance names only it.
    for e in prometheus::dashboard_exprs_for("host-a") {
        let got = instances(&push, &e);
        assert!(
            got.iter().all(|h| h == "host-a"),
            "{e} with instance=host-a answers for {got:?}"
        );
    }
    // Pull: a central Prometheus federates the two hosts' Prometheus servers.
    let pull = central(&format!("'{}', '{}'", pa.addr, pb.addr), &[]);
    fleet_row_shows(&pull, &["host-a", "host-b"]).await;
}

/// The instances a query's answer names.
fn instances(p: &prometheus::Prometheus, expr: &str) -> std::collections::BTreeSet<String> {
    p.query(expr)["data"]["result"]
        .as_array()
        .map(|r| {
            r.iter()
                .filter_map(|s| s["metric"]["instance"].as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

/// Every query of the dashboard's first row (the fleet overview) answers for exactly
/// `hosts`, within 60 s.
async fn fleet_row_shows(p: &prometheus::Prometheus, hosts: &[&str]) {
    let want: std::collections::BTreeSet<String> = hosts.iter().map(|h| h.to_string()).collect();
    let dash: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(grafana_dir().join("dashboards/agenshield-proxy.json"))
            .expect("dashboard"),
    )
    .expect("JSON");
    let panels = dash["panels"].as_array().expect("panels");
    let fleet: Vec<&serde_json::Value> = panels[1..]
        .iter()
        .take_while(|p| p["type"] != "row")
        .collect();
    assert!(fleet.len() >= 5, "fleet row has {} panels", fleet.len());
    let exprs: Vec<(String, String)> = fleet
        .iter()
        .flat_map(|p| {
            p["targets"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|t| t["expr"].as_str())
                .map(|e| {
                    (
                        p["title"].as_str().unwrap_or("").to_string(),
                        e.replace("$__rate_interval", "1m")
                            .replace("$__range", "1m")
                            .replace("$instance", ".*"),
                    )
                })
                .collect::<Vec<_>>()
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let wrong: Vec<String> = exprs
            .iter()
            .filter_map(|(title, e)| {
                let got = instances(p, e);
                (got != want).then(|| format!("{title}: {e} -> {got:?}"))
            })
            .collect();
        if wrong.is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "fleet panels without every host {want:?}:\n{}",
            wrong.join("\n")
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// The daemon's `/metrics` as text.
fn scrape(d: &Daemon) -> String {
    let out = Command::new("curl")
        .args([
            "-sS",
            "--max-time",
            "10",
            &format!("http://{}/metrics", d.metrics),
        ])
        .output()
        .expect("curl");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn promtool(args: &[&str]) -> (bool, String) {
    let out = Command::new("promtool")
        .args(args)
        .current_dir(grafana_dir().join("prometheus"))
        .output()
        .expect("promtool");
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// Alerts in state `firing` (name → labels), from Prometheus's `/api/v1/alerts`.
fn firing(p: &prometheus::Prometheus) -> Vec<(String, serde_json::Value)> {
    let v = p.api("alerts", &[]);
    v["data"]["alerts"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter(|x| x["state"] == "firing")
                .map(|x| {
                    (
                        x["labels"]["alertname"].as_str().unwrap_or("").to_string(),
                        x["labels"].clone(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_alert_rules_are_valid_tested_and_fire_on_a_real_daemons_condition() {
    if let Some(why) = prometheus::missing() {
        eprintln!("{why}");
        return;
    }
    let (ok, out) = promtool(&["check", "rules", "alerts.yml"]);
    assert!(ok && out.contains("SUCCESS: 7 rules found"), "{out}");
    let (ok, out) = promtool(&["test", "rules", "alerts.test.yml"]);
    assert!(ok, "promtool test rules: {out}");
    // The shipped scrape config (with its rule file) is a valid Prometheus config.
    let (ok, out) = promtool(&["check", "config", "scrape-agenshield.yml"]);
    assert!(ok, "promtool check config: {out}");

    // A real daemon and a real Prometheus evaluating the shipped rules.
    let d = daemon();
    let rules = grafana_dir().join("prometheus/alerts.yml");
    let prom = prometheus::start(d.metrics, &[rules]);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let v = prom.api("rules", &[]);
        let groups = v["data"]["groups"].as_array().cloned().unwrap_or_default();
        let healthy = groups
            .iter()
            .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
            .filter(|r| r["health"] == "ok")
            .count();
        if healthy == 7 {
            break;
        }
        assert!(Instant::now() < deadline, "rules never all evaluated: {v}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // Prometheus has scraped the daemon (the rules evaluate before the first scrape): the
    // rejected-reload counter is seen at 0, so its rise below is an increase.
    let deadline = Instant::now() + Duration::from_secs(30);
    while !prom.has_data("agenshield_proxy_policy_reloads_total{result=\"error\"} == 0") {
        assert!(
            Instant::now() < deadline,
            "Prometheus never scraped the daemon"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // A healthy daemon has no alert firing or even pending (a wrong expression would show
    // here at the first evaluation, whatever the rule's `for`).
    tokio::time::sleep(Duration::from_secs(3)).await;
    let v = prom.api("alerts", &[]);
    assert_eq!(
        v["data"]["alerts"],
        serde_json::json!([]),
        "a healthy daemon has no alert firing or pending"
    );

    // The operator saves a broken policy file: the reload is rejected, the old policy stays,
    // and the alert fires naming it a warning.
    let broken = d.dir.path().join("policies/broken.toml");
    std::fs::write(&broken, "version = 1\n[[rule]]\nid = \n").expect("write broken policy");
    let deadline = Instant::now() + Duration::from_secs(30);
    let fired = loop {
        let f = firing(&prom);
        if let Some((_, labels)) = f.iter().find(|(n, _)| n == "AgenShieldPolicyReloadFailed") {
            break labels.clone();
        }
        assert!(
            Instant::now() < deadline,
            "AgenShieldPolicyReloadFailed never fired; firing: {f:?}; reloads counted: {}; alerts: {}; daemon log:\n{}",
            prom.query("agenshield_proxy_policy_reloads_total"),
            prom.api("alerts", &[]),
            d.logs()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert_eq!(fired["severity"], "warning", "{fired}");
    let others: Vec<String> = firing(&prom)
        .into_iter()
        .map(|(n, _)| n)
        .filter(|n| n != "AgenShieldPolicyReloadFailed")
        .collect();
    assert!(others.is_empty(), "only the reload alert fires: {others:?}");
}

#[test]
fn the_compose_file_binds_to_loopback_and_mounts_what_ships() {
    // Parsed by PyYAML (python3-yaml, installed by .ci/run): no published port (that
    // would listen on every interface), the host's network with each server on 127.0.0.1,
    // data in named volumes, and every bind mount a file or directory of grafana/.
    let script = r#"
import sys, yaml, os
c = yaml.safe_load(open(sys.argv[1]))
base = os.path.dirname(sys.argv[1])
problems = []
for name, svc in c["services"].items():
    if "ports" in svc:
        problems.append(f"{name}: publishes ports")
    if svc.get("network_mode") != "host":
        problems.append(f"{name}: not on the host's network (cannot reach 127.0.0.1:15090)")
    for v in svc.get("volumes", []):
        src = v.split(":")[0]
        if src.startswith("."):
            if not os.path.exists(os.path.join(base, src)):
                problems.append(f"{name}: mounts {src}, which does not exist")
        elif src not in (c.get("volumes") or {}):
            problems.append(f"{name}: {src} is neither a file of grafana/ nor a named volume")
p = c["services"]["prometheus"]["command"]
if "--web.listen-address=127.0.0.1:9090" not in p:
    problems.append("prometheus: not bound to 127.0.0.1:9090")
if not any(a.startswith("--storage.tsdb.path=/") for a in p):
    problems.append("prometheus: no storage path in its volume")
if c["services"]["grafana"]["environment"].get("GF_SERVER_HTTP_ADDR") != "127.0.0.1":
    problems.append("grafana: not bound to 127.0.0.1")
print("\n".join(problems))
"#;
    let compose = grafana_dir().join("compose.yaml");
    let out = Command::new("python3")
        .arg("-c")
        .arg(script)
        .arg(&compose)
        .output()
        .expect("python3");
    assert!(
        out.status.success(),
        "python3 (needs python3-yaml): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let problems = String::from_utf8_lossy(&out.stdout);
    assert!(problems.trim().is_empty(), "{problems}");
}
