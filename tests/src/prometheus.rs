//! A real Prometheus server (Debian's `prometheus`) scraping a test daemon, and the shipped
//! Grafana dashboard's queries, for the observability and dashboard tests.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// A running `prometheus`, killed on drop; its data lives in a temporary directory.
pub struct Prometheus {
    child: Child,
    pub addr: SocketAddr,
    pub dir: tempfile::TempDir,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Whether `tool` is on PATH.
pub fn have(tool: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Without Debian's `prometheus` package: the reason to skip, or a failure under CI (which
/// installs it).
pub fn missing() -> Option<&'static str> {
    if have("prometheus") && have("promtool") {
        return None;
    }
    let why = "skipped: needs Debian's prometheus package (prometheus, promtool)";
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "{why} (CI installs it)"
    );
    Some(why)
}

/// The repository's `grafana/` directory.
pub fn grafana_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../grafana")
}

/// Prometheus on a free loopback port, scraping `target` every second and evaluating
/// `rule_files` (paths) every second.
pub fn start(target: SocketAddr, rule_files: &[PathBuf]) -> Prometheus {
    start_fleet(&[target], rule_files)
}

/// Prometheus scraping several daemons as one job (a fleet: each target is an `instance`).
pub fn start_fleet(targets: &[SocketAddr], rule_files: &[PathBuf]) -> Prometheus {
    let targets: Vec<String> = targets.iter().map(|t| format!("'{t}'")).collect();
    let targets = targets.join(", ");
    let rules = if rule_files.is_empty() {
        String::new()
    } else {
        let list: Vec<String> = rule_files
            .iter()
            .map(|p| format!("  - '{}'\n", p.display()))
            .collect();
        format!("rule_files:\n{}", list.concat())
    };
    start_config(
        &format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n{rules}scrape_configs:\n  - job_name: agenshield-proxy\n    metrics_path: /metrics\n    static_configs:\n      - targets: [{targets}]\n"
        ),
        &[],
    )
}

/// A free loopback port (for a Prometheus whose address another one's config must name
/// before it starts).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port()
}

/// Prometheus on a free loopback port with `config` as its prometheus.yml and `args` added
/// to its command line.
pub fn start_config(config: &str, args: &[&str]) -> Prometheus {
    start_config_on(free_port(), config, args)
}

/// [`start_config`] on a given loopback port.
pub fn start_config_on(port: u16, config: &str, args: &[&str]) -> Prometheus {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("prometheus.yml");
    std::fs::write(&file, config).expect("config");
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().expect("addr");
    let log = std::fs::File::create(dir.path().join("prometheus.log")).expect("log");
    let child = Command::new("prometheus")
        .arg(format!("--config.file={}", file.display()))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.path().join("data").display()
        ))
        .arg(format!("--web.listen-address={addr}"))
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::from(log))
        .spawn()
        .expect("spawn prometheus");
    Prometheus { child, addr, dir }
}

impl Prometheus {
    /// `GET /api/v1/{what}` (e.g. `query?query=…` via `params`); the JSON answer, or Null.
    pub fn api(&self, what: &str, params: &[(&str, &str)]) -> serde_json::Value {
        let mut cmd = Command::new("curl");
        cmd.args(["-sS", "--max-time", "10", "-G"])
            .arg(format!("http://{}/api/v1/{what}", self.addr));
        for (k, v) in params {
            cmd.arg("--data-urlencode").arg(format!("{k}={v}"));
        }
        let out = cmd.output().expect("curl");
        serde_json::from_slice(&out.stdout).unwrap_or(serde_json::Value::Null)
    }

    /// An instant query's JSON answer.
    pub fn query(&self, expr: &str) -> serde_json::Value {
        self.api("query", &[("query", expr)])
    }

    /// Whether `expr` answers successfully with at least one series.
    pub fn has_data(&self, expr: &str) -> bool {
        let v = self.query(expr);
        v["status"] == "success"
            && v["data"]["result"]
                .as_array()
                .is_some_and(|r| !r.is_empty())
    }
}

/// Every PromQL expression of the shipped dashboard, Grafana's interval variables replaced
/// by one minute and `$instance` by its "All" value.
pub fn dashboard_exprs() -> Vec<String> {
    dashboard_exprs_for(".*")
}

/// The dashboard's expressions as Grafana sends them with `instance` (a regex) selected.
pub fn dashboard_exprs_for(instance: &str) -> Vec<String> {
    raw_dashboard_exprs()
        .into_iter()
        .map(|e| {
            e.replace("$__rate_interval", "1m")
                .replace("$__interval", "1m")
                .replace("$__range", "1m")
                .replace("$instance", instance)
        })
        .collect()
}

/// Every PromQL expression of the shipped dashboard as written, variables and all.
pub fn raw_dashboard_exprs() -> Vec<String> {
    let path = grafana_dir().join("dashboards/agenshield-proxy.json");
    let text = std::fs::read_to_string(&path).expect("dashboard JSON");
    let v: serde_json::Value = serde_json::from_str(&text).expect("valid JSON");
    let mut out = Vec::new();
    fn walk(v: &serde_json::Value, out: &mut Vec<String>) {
        match v {
            serde_json::Value::Object(m) => {
                for (k, x) in m {
                    match (k.as_str(), x) {
                        ("expr", serde_json::Value::String(e)) => out.push(e.clone()),
                        _ => walk(x, out),
                    }
                }
            }
            serde_json::Value::Array(a) => a.iter().for_each(|x| walk(x, out)),
            _ => {}
        }
    }
    walk(&v, &mut out);
    out
}
