//! Runs the real `agenshield` binary for a test: a private state directory, a config that
//! binds ephemeral loopback ports, and a resolver that can only answer from its static table
//! (its nameserver is a dead loopback port), so nothing a test does can leave the machine.

use std::fmt::Write as _;
use std::io::{BufRead, BufReader};
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// What a test wants from the daemon.
#[derive(Debug, Clone, Default)]
pub struct DaemonOptions {
    /// Policy files: (file name, TOML text).
    pub policies: Vec<(String, String)>,
    /// Upstream CA files the daemon trusts in addition to the system roots.
    pub extra_ca: Vec<PathBuf>,
    /// Static resolver entries.
    pub hosts: Vec<(String, IpAddr)>,
    /// Where every transparent connection claims to be headed (tests have no firewall).
    pub orig_dst: Option<SocketAddr>,
    /// Extra `[limits]` lines, e.g. `first_bytes_timeout = "500ms"`.
    pub limits: Vec<String>,
    /// `[dns]` lines, e.g. `denied = "nxdomain"`.
    pub dns: Vec<String>,
    /// `[ratelimit]` lines, e.g. `store = "redis://127.0.0.1:6379/0"`.
    pub ratelimit: Vec<String>,
    /// Ranges the private-address guard lets through, besides 127.0.0.0/8.
    pub allow_private: Vec<String>,
    /// Also listen on [::1] (transparent).
    pub ipv6: bool,
    /// Install the firewall redirect for this uid (root tests).
    pub redirect_uid: Option<u32>,
    /// Agent uids the admin socket must refuse; with `redirect_uid`, redirected too.
    pub agent_uids: Vec<u32>,
    /// `[approvals] timeout`, e.g. "1s".
    pub approvals_timeout: Option<String>,
    /// Secrets written into the vault before the daemon starts: (name, value).
    pub secrets: Vec<(String, String)>,
    /// `[secrets] scan_body_bytes`.
    pub scan_body_bytes: Option<usize>,
    /// `[daemon] worker_user` (root tests): the daemon splits into a root supervisor and a
    /// worker running as this (name, uid); the state directory is given to that uid.
    pub worker_user: Option<(String, u32)>,
    /// `[testing] broker_orig_dst`: the worker asks the supervisor for original destinations
    /// (the macOS path, taken on Linux).
    pub broker_orig_dst: bool,
    /// Where the audit log goes (default: `audit.jsonl` in the state directory).
    pub audit_path: Option<PathBuf>,
    /// `[upstream] proxy`, e.g. `http://user:pw@127.0.0.1:3128`.
    pub upstream_proxy: Option<String>,
    /// `[resolver] nameservers` (default: a dead loopback port, so nothing leaves).
    pub nameservers: Vec<String>,
    /// Runs the whole daemon as another user (root tests): its state directory is given to
    /// `uid` and `prefix` (a `setpriv …` command) starts it.
    pub run_as: Option<RunAs>,
    /// `[audit]` lines, e.g. `max_bytes = 65536`. Without a `refusal_window` line, `"0s"`:
    /// every refusal is recorded in full.
    pub audit: Vec<String>,
    /// `false` (the default): `[testing] every_uid_is_agent`, so the test runner's own
    /// connections count as an agent's. `true`: only `redirect.agent_users` are agents, as
    /// installed (identity tests).
    pub strict_agents: bool,
    /// `[listen] explicit_users` / `explicit_groups`, by name.
    pub explicit_users: Vec<String>,
    pub explicit_groups: Vec<String>,
    /// The daemon's log filter (`AGENSHIELD_LOG`); default: `$AGENSHIELD_TEST_LOG`, or `debug`.
    pub log: Option<String>,
    /// Lines appended to the config as they are (a section of the test's own, e.g.
    /// `[policy.source]`).
    pub extra_config: Vec<String>,
    /// Lines added to `[listen]` (e.g. `admin_https = "127.0.0.1:0"`).
    pub listen_extra: Vec<String>,
    /// The config names its paths relative to itself (`policies = "policies"`, …), and the
    /// daemon is started from its directory with `--config proxy.toml`, relative too.
    pub relative_config: bool,
}

/// Who an unprivileged daemon runs as: the owner of its state and the command that becomes it.
#[derive(Debug, Clone)]
pub struct RunAs {
    pub uid: u32,
    pub prefix: Vec<String>,
}

pub struct Daemon {
    child: Child,
    pub dir: tempfile::TempDir,
    pub transparent: SocketAddr,
    pub explicit: SocketAddr,
    /// The metrics listener (`/metrics`).
    pub metrics: SocketAddr,
    /// The DNS stub (UDP and TCP on each).
    pub dns: Vec<SocketAddr>,
    /// PEM of the daemon's CA, for clients acting as the agent.
    pub ca_pem: String,
    pub ca_path: PathBuf,
    log_path: PathBuf,
    audit_path: PathBuf,
    /// The command prefix the daemon runs under (empty: as this process).
    prefix: Vec<String>,
    log: Option<String>,
    /// Started from `dir` with a relative `--config` (see `DaemonOptions::relative_config`).
    relative: bool,
}

/// The binary cargo built beside this test executable (target/<profile>/agenshield).
pub fn binary() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("test binary lives in target/<profile>/deps");
    let bin = profile_dir.join("agenshield");
    assert!(
        bin.exists(),
        "{} is missing: run the tests with `cargo test --workspace`, which builds it",
        bin.display()
    );
    bin
}

/// A state directory (policies, vault, `proxy.toml`) for `opts`, without starting anything:
/// for tests that run the binary themselves (a start that must fail, say).
pub fn prepare(opts: &DaemonOptions) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    let policies = dir.path().join("policies");
    std::fs::create_dir_all(&policies).expect("policy dir");
    for (name, text) in &opts.policies {
        std::fs::write(policies.join(name), text).expect("write policy");
    }
    write_vault(&dir.path().join("vault"), &opts.secrets);
    let config = dir.path().join("proxy.toml");
    std::fs::write(&config, render_config(opts, dir.path())).expect("write config");
    dir
}

impl Daemon {
    pub fn start(opts: DaemonOptions) -> Daemon {
        let dir = prepare(&opts);
        if let Some((_, uid)) = &opts.worker_user {
            chown_tree(dir.path(), *uid);
        }
        let prefix = match &opts.run_as {
            Some(run_as) => {
                chown_tree(dir.path(), run_as.uid);
                run_as.prefix.clone()
            }
            None => Vec::new(),
        };
        let relative = opts.relative_config;
        let (child, transparent, explicit, metrics, dns) =
            spawn(dir.path(), &prefix, opts.log.as_deref(), relative);
        let ca_path = dir.path().join("certs/ca.pem");
        let ca_pem = std::fs::read_to_string(&ca_path).expect("daemon CA");
        Daemon {
            child,
            audit_path: opts
                .audit_path
                .clone()
                .unwrap_or_else(|| dir.path().join("audit.jsonl")),
            log_path: dir.path().join("daemon.log"),
            dir,
            transparent,
            explicit,
            metrics,
            dns,
            ca_pem,
            ca_path,
            prefix,
            log: opts.log,
            relative,
        }
    }

    /// Starts the daemon again on the same state (CA, policy, config) after it stopped.
    pub fn restart(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let (child, transparent, explicit, metrics, dns) = spawn(
            self.dir.path(),
            &self.prefix,
            self.log.as_deref(),
            self.relative,
        );
        self.child = child;
        self.transparent = transparent;
        self.explicit = explicit;
        self.metrics = metrics;
        self.dns = dns;
    }

    /// SIGKILL, as a crash would.
    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM, and wait for the exit.
    pub fn stop(&mut self) {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let _ = self.child.wait();
    }

    /// The audit log.
    pub fn audit_path(&self) -> PathBuf {
        self.audit_path.clone()
    }

    /// The admin socket.
    pub fn socket(&self) -> PathBuf {
        self.dir.path().join("proxy.sock")
    }

    /// Runs `agenshield proxy ctl ARGS --socket … --config …` (optionally under a prefix such
    /// as `setpriv`): (exit code, stdout, stderr).
    pub fn ctl(&self, prefix: &[String], args: &[&str]) -> (i32, String, String) {
        let mut cmd = match prefix.split_first() {
            Some((p, rest)) => {
                let mut c = Command::new(p);
                c.args(rest).arg(binary());
                c
            }
            None => Command::new(binary()),
        };
        cmd.args(["proxy", "ctl"])
            .args(args)
            .arg("--socket")
            .arg(self.socket());
        // Another uid cannot read our private config; the socket is all ctl needs then.
        if prefix.is_empty() {
            cmd.arg("--config").arg(self.config_path());
        }
        let out = cmd.output().expect("run ctl");
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// `ctl ARGS` with `input` on its stdin: (exit code, stdout, stderr).
    pub fn ctl_stdin(&self, args: &[&str], input: &[u8]) -> (i32, String, String) {
        use std::io::Write as _;
        let mut child = Command::new(binary())
            .args(["proxy", "ctl"])
            .args(args)
            .arg("--socket")
            .arg(self.socket())
            .arg("--config")
            .arg(self.config_path())
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

    /// The file vault.
    pub fn vault(&self) -> PathBuf {
        self.dir.path().join("vault")
    }

    /// The config file the daemon runs with.
    pub fn config_path(&self) -> PathBuf {
        self.dir.path().join("proxy.toml")
    }
}

fn spawn(
    dir: &Path,
    prefix: &[String],
    filter: Option<&str>,
    relative: bool,
) -> (Child, SocketAddr, SocketAddr, SocketAddr, Vec<SocketAddr>) {
    let config = if relative {
        PathBuf::from("proxy.toml")
    } else {
        dir.join("proxy.toml")
    };
    let log_path = dir.join("daemon.log");
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)
        .expect("log file");
    let mut command = match prefix.split_first() {
        Some((program, args)) => {
            let mut c = Command::new(program);
            c.args(args).arg(binary());
            c
        }
        None => Command::new(binary()),
    };
    if relative {
        command.current_dir(dir);
    }
    let mut child = command
        .args(["proxy", "run", "--config"])
        .arg(&config)
        .env(
            "AGENSHIELD_LOG",
            filter.map(str::to_string).unwrap_or_else(|| {
                std::env::var("AGENSHIELD_TEST_LOG").unwrap_or_else(|_| "debug".into())
            }),
        )
        .stdout(Stdio::piped())
        .stderr(Stdio::from(log))
        .spawn()
        .expect("spawn agenshield");
    let stdout = child.stdout.take().expect("stdout");
    let (tx, rx) = mpsc::channel();
    // Keep draining stdout for the daemon's whole life so it never blocks on a full pipe.
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if line.starts_with("agenshield: ready ") {
                let _ = tx.send(line);
            }
        }
    });
    let ready = match rx.recv_timeout(Duration::from_secs(30)) {
        Ok(line) => line,
        Err(_) => {
            let _ = child.kill();
            let logs = std::fs::read_to_string(&log_path).unwrap_or_default();
            panic!("daemon did not become ready within 30 s; its log:\n{logs}");
        }
    };
    let field = |key: &str| -> String {
        ready
            .split_whitespace()
            .find_map(|w| w.strip_prefix(key))
            .unwrap_or_else(|| panic!("ready line lacks {key}: {ready}"))
            .to_string()
    };
    let transparent = field("transparent=")
        .split(',')
        .next()
        .and_then(|a| a.parse().ok())
        .expect("transparent address");
    let explicit = field("explicit=").parse().expect("explicit address");
    let metrics = field("metrics=").parse().expect("metrics address");
    let dns = field("dns=")
        .split(',')
        .filter_map(|a| a.parse().ok())
        .collect();
    (child, transparent, explicit, metrics, dns)
}

impl Daemon {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Still running?
    pub fn is_alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Peak resident set size (VmHWM) in KiB.
    pub fn peak_rss_kib(&self) -> u64 {
        let status =
            std::fs::read_to_string(format!("/proc/{}/status", self.pid())).expect("proc status");
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .expect("VmHWM")
    }

    /// Resident set size now (VmRSS) in KiB.
    pub fn rss_kib(&self) -> u64 {
        let status =
            std::fs::read_to_string(format!("/proc/{}/status", self.pid())).expect("proc status");
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .expect("VmRSS")
    }

    /// Everything the daemon logged so far.
    pub fn logs(&self) -> String {
        std::fs::read_to_string(&self.log_path).unwrap_or_default()
    }

    /// Every byte the daemon wrote where an operator could read it: its log, the audit log,
    /// a metrics scrape, and what `ctl status`, `tail --json`, `secrets list --json` and
    /// `policy show` print. For tests that grep it for a secret.
    pub async fn everything_written(&self) -> String {
        let mut wrote = self.logs();
        wrote.push_str(&std::fs::read_to_string(self.audit_path()).expect("audit log"));
        let metrics =
            crate::curl::curl(&[&format!("http://{}/metrics", self.metrics)], false).await;
        assert_eq!(metrics.status, 200, "metrics scrape");
        wrote.push_str(&metrics.text());
        for args in [
            &["status"][..],
            &["tail", "--json"],
            &["secrets", "list", "--json"],
            &["policy", "show"],
        ] {
            let (_, out, err) = self.ctl(&[], args);
            wrote.push_str(&out);
            wrote.push_str(&err);
        }
        wrote
    }

    /// Waits (up to 10 s) until `ctl policy show` mentions every one of `names`: a policy
    /// file just written has been loaded.
    pub fn wait_for_policy(&self, names: &[&str]) {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let (_, out, _) = self.ctl(&[], &["policy", "show"]);
            if names.iter().all(|n| out.contains(n)) {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the policy never loaded {names:?}: {out}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The vault as the daemon keeps it: a 0700 directory of 0600 `NAME.secret` files.
fn write_vault(vault: &Path, secrets: &[(String, String)]) {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    if secrets.is_empty() {
        return;
    }
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(vault)
        .expect("vault dir");
    for (name, value) in secrets {
        let file = vault.join(format!("{name}.secret"));
        std::fs::write(&file, value).expect("write secret");
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    }
}

/// `chown -R uid:uid`, as an installer gives the worker its state.
pub fn chown_tree(path: &Path, uid: u32) {
    std::os::unix::fs::chown(path, Some(uid), Some(uid)).expect("chown");
    if path.is_dir() {
        for entry in std::fs::read_dir(path).expect("read_dir") {
            chown_tree(&entry.expect("entry").path(), uid);
        }
    }
}

fn render_config(opts: &DaemonOptions, dir: &Path) -> String {
    let mut c = String::new();
    if let Some((name, _)) = &opts.worker_user {
        let _ = writeln!(c, "[daemon]\nworker_user = {name:?}\n");
    }
    let v6 = if opts.ipv6 { ", \"[::1]:0\"" } else { "" };
    // Relative paths name the same files: they are taken relative to the config's directory.
    let at = |name: &str| {
        if opts.relative_config {
            PathBuf::from(name)
        } else {
            dir.join(name)
        }
    };
    let _ = writeln!(
        c,
        "[listen]\ntransparent = [\"127.0.0.1:0\"{v6}]\ndns = [\"127.0.0.1:0\"{v6}]\nexplicit = \"127.0.0.1:0\"\nmetrics = \"127.0.0.1:0\"\nadmin = {:?}",
        at("proxy.sock")
    );
    let names = |list: &[String]| {
        list.iter()
            .map(|n| format!("{n:?}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let _ = writeln!(
        c,
        "explicit_users = [{}]\nexplicit_groups = [{}]",
        names(&opts.explicit_users),
        names(&opts.explicit_groups)
    );
    for line in &opts.listen_extra {
        let _ = writeln!(c, "{line}");
    }
    let _ = writeln!(c);
    let _ = writeln!(
        c,
        "[paths]\npolicies = {:?}\ncerts = {:?}\nvault = {:?}\naudit = {:?}\n",
        at("policies"),
        at("certs"),
        at("vault"),
        opts.audit_path.clone().unwrap_or_else(|| at("audit.jsonl"))
    );
    if let Some(n) = opts.scan_body_bytes {
        let _ = writeln!(c, "[secrets]\nscan_body_bytes = {n}\n");
    }
    let cas: Vec<String> = opts.extra_ca.iter().map(|p| format!("{p:?}")).collect();
    let mut private = vec!["\"127.0.0.0/8\"".to_string()];
    private.extend(opts.allow_private.iter().map(|r| format!("{r:?}")));
    let _ = writeln!(
        c,
        "[upstream]\nextra_ca = [{}]\nallow_private = [{}]",
        cas.join(", "),
        private.join(", ")
    );
    if let Some(proxy) = &opts.upstream_proxy {
        let _ = writeln!(c, "proxy = {proxy:?}");
    }
    let _ = writeln!(c);
    if let Some(uid) = opts.redirect_uid {
        // `agent_uids` join the redirected user.
        let mut uids = vec![uid.to_string()];
        uids.extend(opts.agent_uids.iter().map(u32::to_string));
        let _ = writeln!(
            c,
            "[redirect]\nenabled = true\nagent_users = [{}]\nreconcile_interval = \"200ms\"\n",
            uids.join(", ")
        );
    } else if !opts.agent_uids.is_empty() {
        let uids: Vec<String> = opts.agent_uids.iter().map(u32::to_string).collect();
        let _ = writeln!(c, "[redirect]\nagent_users = [{}]\n", uids.join(", "));
    }
    if let Some(t) = &opts.approvals_timeout {
        let _ = writeln!(c, "[approvals]\ntimeout = {t:?}\n");
    }
    if !opts.ratelimit.is_empty() {
        let _ = writeln!(c, "[ratelimit]\n{}\n", opts.ratelimit.join("\n"));
    }
    // By default the discard port on loopback: a name missing from the table fails fast
    // and locally.
    let nameservers: Vec<String> = if opts.nameservers.is_empty() {
        vec!["\"127.0.0.1:9\"".into()]
    } else {
        opts.nameservers.iter().map(|n| format!("{n:?}")).collect()
    };
    let _ = writeln!(
        c,
        "[resolver]\nnameservers = [{}]\n[resolver.hosts]",
        nameservers.join(", ")
    );
    let mut names: Vec<&String> = opts.hosts.iter().map(|(n, _)| n).collect();
    names.dedup();
    for name in names {
        let addrs: Vec<String> = opts
            .hosts
            .iter()
            .filter(|(n, _)| n == name)
            .map(|(_, a)| format!("\"{a}\""))
            .collect();
        let _ = writeln!(c, "{name:?} = [{}]", addrs.join(", "));
    }
    // Every refusal in full unless a test asks for the window: most tests pin one record per
    // refusal; `edges_linux` tests the counting (the shipped default is 10 s).
    let mut audit = opts.audit.clone();
    if !audit
        .iter()
        .any(|l| l.trim_start().starts_with("refusal_window"))
    {
        audit.push("refusal_window = \"0s\"".into());
    }
    let _ = writeln!(c, "[audit]\n{}\n", audit.join("\n"));
    let _ = writeln!(c, "\n[limits]");
    for l in &opts.limits {
        let _ = writeln!(c, "{l}");
    }
    if !opts.dns.is_empty() {
        let _ = writeln!(c, "\n[dns]\n{}", opts.dns.join("\n"));
    }
    let _ = writeln!(c, "\n[testing]");
    if !opts.strict_agents {
        let _ = writeln!(c, "every_uid_is_agent = true");
    }
    if opts.broker_orig_dst {
        let _ = writeln!(c, "broker_orig_dst = true");
    }
    if let Some(dst) = opts.orig_dst {
        let _ = writeln!(c, "orig_dst_override = \"{dst}\"");
    }
    for line in &opts.extra_config {
        let _ = writeln!(c, "{line}");
    }
    c
}
