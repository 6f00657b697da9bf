//! A real installation for root end-to-end tests (`install_linux`, `compat_linux`): refusing
//! to touch a machine where AgenShield is installed, and undoing everything on drop.
//!
//! A machine already has (part of) an installation when the agent or broker user, the admin
//! group, the manifest, /opt/agenshield/{bin,config,certs,policies} or the unit exist. Empty
//! leftovers of other tests' daemons (an empty /opt/agenshield/vault, /var/log/agenshield) are
//! not an installation: install adopts them and uninstall leaves them as they were.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use crate::daemon::binary;

pub const AGENT: &str = "ash_default_agent";
pub const BROKER: &str = "ash_default_broker";
pub const ADMIN: &str = "agenshield-admin";
pub const ROOT: &str = "/opt/agenshield";
pub const MANIFEST: &str = "/opt/agenshield/.install-manifest.json";
pub const UNIT: &str = "/etc/systemd/system/agenshield-proxy.service";
pub const HOME: &str = "/home/ash_default_agent";
/// The link install puts on PATH.
pub const PATH_LINK: &str = "/usr/local/bin/agenshield";
pub const LOG_DIR: &str = "/var/log/agenshield";
/// The test's admin socket directory: its own, so a daemon another test left on the default
/// socket cannot collide with ours.
pub const RUN_DIR: &str = "/var/run/agenshield-install-e2e";

/// Everything install may create; what existed before the test is never removed by it.
pub fn candidates() -> Vec<PathBuf> {
    [
        ROOT,
        "/opt/agenshield/bin",
        "/opt/agenshield/config",
        "/opt/agenshield/certs",
        "/opt/agenshield/policies",
        "/opt/agenshield/vault",
        MANIFEST,
        "/var/log/agenshield",
        RUN_DIR,
        HOME,
        UNIT,
        PAM_PROFILE,
        PATH_LINK,
    ]
    .iter()
    .map(PathBuf::from)
    .collect()
}

/// The PAM profile install registers with pam-auth-update.
pub const PAM_PROFILE: &str = "/usr/share/pam-configs/agenshield";
/// The session stacks pam-auth-update writes (their text is part of the snapshot).
pub const PAM_STACKS: [&str; 2] = [
    "/etc/pam.d/common-session",
    "/etc/pam.d/common-session-noninteractive",
];

pub fn user_exists(name: &str) -> bool {
    matches!(nix::unistd::User::from_name(name), Ok(Some(_)))
}

pub fn group_exists(name: &str) -> bool {
    matches!(nix::unistd::Group::from_name(name), Ok(Some(_)))
}

/// Why this machine already has (part of) an installation, if it does.
pub fn installed_already() -> Option<String> {
    for u in [AGENT, BROKER] {
        if user_exists(u) {
            return Some(format!("user {u} exists"));
        }
    }
    if group_exists(ADMIN) {
        return Some(format!("group {ADMIN} exists"));
    }
    [
        MANIFEST,
        "/opt/agenshield/bin",
        "/opt/agenshield/config",
        "/opt/agenshield/certs",
        "/opt/agenshield/policies",
        UNIT,
        HOME,
        RUN_DIR,
    ]
    .iter()
    .find(|p| Path::new(p).exists())
    .or(std::fs::symlink_metadata(PATH_LINK)
        .is_ok()
        .then_some(&PATH_LINK))
    .map(|p| format!("{p} exists"))
}

/// Undoes everything on drop, also when the test fails: the daemon, `uninstall`, then any
/// leftover this test can prove is its own (absent before it started).
pub struct Cleanup {
    pub daemon: Option<Child>,
    pub existed: Vec<PathBuf>,
    pub extra_files: Vec<PathBuf>,
}

impl Cleanup {
    pub fn stop_daemon(&mut self) {
        if let Some(mut child) = self.daemon.take() {
            let pid = nix::unistd::Pid::from_raw(child.id() as i32);
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
            for _ in 0..100 {
                if matches!(child.try_wait(), Ok(Some(_))) {
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        self.stop_daemon();
        let _ = Command::new(binary()).args(["proxy", "uninstall"]).output();
        for f in &self.extra_files {
            let _ = std::fs::remove_file(f);
        }
        let mut left: Vec<PathBuf> = candidates()
            .into_iter()
            .filter(|p| !self.existed.contains(p))
            .collect();
        left.reverse();
        for p in left {
            let _ = std::fs::remove_file(&p);
            let _ = std::fs::remove_dir_all(&p);
        }
        for u in [AGENT, BROKER] {
            let _ = Command::new("userdel").arg(u).output();
        }
        for g in [AGENT, BROKER, ADMIN] {
            let _ = Command::new("groupdel").arg(g).output();
        }
        let _ = Command::new("nft")
            .args(["delete", "table", "inet", "agenshield"])
            .output();
    }
}

pub fn run(args: &[&str]) -> (i32, String) {
    let out = Command::new(binary())
        .args(args)
        .output()
        .expect("run agenshield");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code().unwrap_or(-1), text)
}

/// A login shell of the agent user: its environment is what its start-up files make it.
pub fn as_agent(script: &str) -> Output {
    Command::new("su")
        .args(["-l", AGENT, "-c", script])
        .stdin(Stdio::null())
        .output()
        .expect("su")
}

/// The agent user outside a login shell (`su` without `-l`, a non-interactive shell that
/// reads no start-up file), from an environment with none of the CA variables: only what
/// PAM gives the agent's sessions.
pub fn as_agent_plain(script: &str) -> Output {
    Command::new("su")
        .args([AGENT, "-s", "/bin/sh", "-c", script])
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .current_dir("/")
        .stdin(Stdio::null())
        .output()
        .expect("su")
}

pub fn meta(p: &str) -> (u32, String, String) {
    let m = std::fs::metadata(p).unwrap_or_else(|e| panic!("{p}: {e}"));
    let user = nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(m.uid()))
        .ok()
        .flatten()
        .map_or(m.uid().to_string(), |u| u.name);
    let group = nix::unistd::Group::from_gid(nix::unistd::Gid::from_raw(m.gid()))
        .ok()
        .flatten()
        .map_or(m.gid().to_string(), |g| g.name);
    (m.permissions().mode() & 0o7777, user, group)
}

pub fn assert_meta(p: &str, mode: u32, owner: &str, group: &str) {
    assert_eq!(
        meta(p),
        (mode, owner.to_string(), group.to_string()),
        "mode and owner of {p}"
    );
}

/// Every path under the candidates with mode, owner, size and mtime, plus the accounts and
/// the firewall table: what a no-op must leave exactly as it was.
pub fn snapshot() -> BTreeMap<String, String> {
    fn walk(p: &Path, out: &mut BTreeMap<String, String>) {
        let Ok(m) = std::fs::symlink_metadata(p) else {
            return;
        };
        out.insert(
            p.display().to_string(),
            format!(
                "{:o} {}:{} {} {}.{}",
                m.mode(),
                m.uid(),
                m.gid(),
                m.len(),
                m.mtime(),
                m.mtime_nsec()
            ),
        );
        if m.is_dir() {
            if let Ok(rd) = std::fs::read_dir(p) {
                for e in rd.flatten() {
                    walk(&e.path(), out);
                }
            }
        }
    }
    let mut out = BTreeMap::new();
    for p in candidates() {
        walk(&p, &mut out);
    }
    let getent = Command::new("getent")
        .args(["passwd", AGENT, BROKER])
        .output()
        .expect("getent");
    out.insert(
        "passwd".into(),
        String::from_utf8_lossy(&getent.stdout).into(),
    );
    let getent = Command::new("getent")
        .args(["group", AGENT, BROKER, ADMIN])
        .output()
        .expect("getent");
    out.insert(
        "group".into(),
        String::from_utf8_lossy(&getent.stdout).into(),
    );
    for f in PAM_STACKS {
        out.insert(f.into(), std::fs::read_to_string(f).unwrap_or_default());
    }
    let nft = Command::new("nft")
        .args(["list", "table", "inet", "agenshield"])
        .output()
        .expect("nft");
    out.insert("nft".into(), String::from_utf8_lossy(&nft.stdout).into());
    out
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

/// A port free on 127.0.0.1 for UDP and TCP both (the DNS stub takes both).
pub fn free_dns_port() -> u16 {
    for _ in 0..20 {
        let udp = std::net::UdpSocket::bind("127.0.0.1:0").expect("udp");
        let port = udp.local_addr().expect("addr").port();
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no port free for both UDP and TCP");
}

/// Starts the installed daemon as the unit would (root, the installed config) and waits for
/// its ready line.
pub fn start_daemon(log: &Path) -> Child {
    let log_file = std::fs::File::create(log).expect("log");
    let mut child = Command::new("/opt/agenshield/bin/agenshield")
        .args([
            "proxy",
            "run",
            "--config",
            "/opt/agenshield/config/proxy.toml",
        ])
        .env("AGENSHIELD_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(Stdio::from(log_file))
        .spawn()
        .expect("start the installed daemon");
    let stdout = child.stdout.take().expect("stdout");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if line.starts_with("agenshield: ready ") {
                let _ = tx.send(());
            }
        }
    });
    if rx.recv_timeout(Duration::from_secs(30)).is_err() {
        let _ = child.kill();
        panic!(
            "the installed daemon did not become ready; its log:\n{}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
    }
    child
}
