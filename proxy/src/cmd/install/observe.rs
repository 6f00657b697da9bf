//! What exists already: the facts the plan is computed from. `observe` reads the machine;
//! tests build an [`Observed`] by hand (`Observed::clean`) and render plans from it.

use std::collections::BTreeMap;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::layout::{Layout, Platform, ADMIN_GID, ADMIN_GROUP, BIN_PATH, SYSTEMD_RUNNING_MARKER};
use super::manifest::Manifest;
use agenshield_proxy::config::Config;

/// A file or directory as found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathState {
    pub dir: bool,
    /// Permission bits (0o7777).
    pub mode: u32,
    /// Owner and group by name (the number when it has no name).
    pub owner: String,
    pub group: String,
    /// Of regular files up to 1 MiB.
    pub sha256: Option<String>,
}

/// The firewall redirect as found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FirewallSeen {
    #[default]
    Absent,
    /// In place and what the config renders.
    Matches,
    /// In place but different (or could not be compared).
    Present,
}

/// The service as its manager sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ServiceSeen {
    /// systemd is PID 1 (Linux); always true on macOS.
    pub manager_running: bool,
    pub enabled: bool,
    pub active: bool,
}

/// What is at [`super::layout::PATH_LINK`].
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum PathLink {
    /// Nothing; its directory exists.
    #[default]
    Missing,
    /// Nothing, and no directory to put it in.
    NoDir,
    /// Our link, to the installed binary.
    Ours,
    /// Someone else's: what it is ("a file", "a link to /x").
    Foreign(String),
}

/// Files under a directory and their total size (what uninstall keeps or deletes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TreeSize {
    pub files: u64,
    pub bytes: u64,
}

impl std::fmt::Display for TreeSize {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let b = self.bytes as f64;
        let size = if self.bytes < 1024 {
            format!("{} bytes", self.bytes)
        } else if b < 1024.0 * 1024.0 {
            format!("{:.1} KiB", b / 1024.0)
        } else if b < 1024.0 * 1024.0 * 1024.0 {
            format!("{:.1} MiB", b / (1024.0 * 1024.0))
        } else {
            format!("{:.1} GiB", b / (1024.0 * 1024.0 * 1024.0))
        };
        let s = if self.files == 1 { "" } else { "s" };
        write!(f, "{} file{s}, {size}", self.files)
    }
}

/// Counts the regular files under `dir` and their bytes, without following links; at most
/// `MAX_COUNTED` entries are looked at (then the count says "at least").
pub fn tree_size(dir: &Path) -> TreeSize {
    const MAX_COUNTED: usize = 200_000;
    let mut size = TreeSize::default();
    let mut stack = vec![dir.to_path_buf()];
    let mut seen = 0;
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            seen += 1;
            if seen > MAX_COUNTED {
                return size;
            }
            let Ok(m) = std::fs::symlink_metadata(e.path()) else {
                continue;
            };
            if m.is_dir() {
                stack.push(e.path());
            } else if m.is_file() {
                size.files += 1;
                size.bytes += m.len();
            }
        }
    }
    size
}

#[derive(Debug, Clone, Default)]
pub struct Observed {
    /// Existing users and groups among the names install manages: name → id.
    pub users: BTreeMap<String, u32>,
    pub groups: BTreeMap<String, u32>,
    /// Who holds the ids install wants: id → name.
    pub uid_names: BTreeMap<u32, String>,
    pub gid_names: BTreeMap<u32, String>,
    pub paths: BTreeMap<PathBuf, PathState>,
    /// Contents of the agent's start-up files that exist.
    pub texts: BTreeMap<PathBuf, String>,
    /// The binary being run (copied to /opt/agenshield/bin).
    pub exe: PathBuf,
    /// The installed binary is byte-identical to `exe`.
    pub binary_current: bool,
    /// SHA-256 the agent bundle would have now; `None` while there is no CA.
    pub bundle_sha256: Option<String>,
    /// The installed JVM trust store holds exactly the certificates of that bundle.
    pub truststore_current: bool,
    /// CA bundles the machine's tools are configured with (kept in the agent's bundle).
    pub configured_bundles: Vec<crate::cmd::trust::bundle::Configured>,
    /// Linux: Debian's `pam-auth-update` is there, and our profile is in the session stack.
    pub pam_auth_update: bool,
    /// Linux: dbus-daemon's local policy directory exists (`resolvers::DBUS_POLICY_DIR`).
    pub dbus_policy_dir: bool,
    pub pam_enabled: bool,
    /// The machine's trust store (Linux: by its directories; macOS: the System keychain).
    pub system_store: Option<crate::cmd::trust::system_store::SystemStore>,
    pub firewall: FirewallSeen,
    pub service: ServiceSeen,
    /// macOS: our CA is in the agent's keychain.
    pub keychain_has_ca: bool,
    /// macOS: the installed CA's common name (for deleting it from a keychain).
    pub ca_common_name: Option<String>,
    pub manifest: Option<Manifest>,
    /// A daemon answers on the configured admin socket.
    pub daemon_alive: bool,
    /// What is at `/usr/local/bin/agenshield`.
    pub path_link: PathLink,
    /// The sizes of the directories uninstall keeps unless `--purge` (the agent's home, the
    /// log directories) that exist.
    pub sizes: BTreeMap<PathBuf, TreeSize>,
    /// Now, for names uninstall gives what it keeps (`20250102T030405Z`).
    pub stamp: String,
}

impl Observed {
    /// A machine with none of it: no users, no files, no firewall, systemd running.
    pub fn clean(exe: &Path) -> Observed {
        Observed {
            exe: exe.to_path_buf(),
            service: ServiceSeen {
                manager_running: true,
                ..ServiceSeen::default()
            },
            ..Observed::default()
        }
    }

    pub fn path(&self, p: &Path) -> Option<&PathState> {
        self.paths.get(p)
    }
}

pub fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn user_name(uid: u32) -> String {
    match nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid)) {
        Ok(Some(u)) => u.name,
        _ => uid.to_string(),
    }
}

fn group_name(gid: u32) -> String {
    match nix::unistd::Group::from_gid(nix::unistd::Gid::from_raw(gid)) {
        Ok(Some(g)) => g.name,
        _ => gid.to_string(),
    }
}

pub fn path_state(p: &Path) -> Option<PathState> {
    let meta = std::fs::symlink_metadata(p).ok()?;
    let sha256 = (meta.is_file() && meta.len() <= MAX_HASHED)
        .then(|| regular_file_bytes(p).map(|b| sha256_hex(&b)))
        .flatten();
    Some(PathState {
        dir: meta.is_dir(),
        mode: meta.permissions().mode() & 0o7777,
        owner: user_name(meta.uid()),
        group: group_name(meta.gid()),
        sha256,
    })
}

/// Files larger than this are not hashed (install writes none so large but the binary).
const MAX_HASHED: u64 = 1 << 20;

/// The bytes of `p` if it still is a regular file, not a link (some paths are in the agent's
/// home, where it may swap one in after the look): opened without following a final link or
/// waiting on a FIFO, checked again, read up to the limit.
fn regular_file_bytes(p: &Path) -> Option<Vec<u8>> {
    use std::io::Read as _;
    use std::os::unix::fs::OpenOptionsExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(
            (nix::fcntl::OFlag::O_NOFOLLOW
                | nix::fcntl::OFlag::O_NONBLOCK
                | nix::fcntl::OFlag::O_NOCTTY)
                .bits(),
        )
        .open(p)
        .ok()?;
    if !f.metadata().ok()?.is_file() {
        return None;
    }
    let mut b = Vec::new();
    f.take(MAX_HASHED + 1).read_to_end(&mut b).ok()?;
    (b.len() as u64 <= MAX_HASHED).then_some(b)
}

/// Exit status of a quiet command: `None` when it cannot run at all.
fn succeeds(cmd: &[&str]) -> Option<bool> {
    Command::new(cmd[0])
        .args(&cmd[1..])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .ok()
        .map(|s| s.success())
}

fn same_bytes(a: &Path, b: &Path) -> bool {
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(ma), Ok(mb)) if ma.len() == mb.len() => {
            matches!((std::fs::read(a), std::fs::read(b)), (Ok(x), Ok(y)) if x == y)
        }
        _ => false,
    }
}

/// Reads the machine. `cfg` is the config being installed (for the firewall comparison).
pub fn observe(layout: &Layout, cfg: &Config, manifest_path: &Path) -> Observed {
    let mut o = Observed {
        exe: std::env::current_exe().unwrap_or_else(|_| PathBuf::from("agenshield")),
        ..Observed::default()
    };
    for a in [&layout.agent, &layout.broker] {
        if let Ok(Some(u)) = nix::unistd::User::from_name(&a.name) {
            o.users.insert(a.name.clone(), u.uid.as_raw());
        }
        if let Ok(Some(u)) = nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(a.uid)) {
            o.uid_names.insert(a.uid, u.name);
        }
    }
    for (name, gid) in [
        (ADMIN_GROUP, ADMIN_GID),
        (layout.agent.name.as_str(), layout.agent.uid),
        (layout.broker.name.as_str(), layout.broker.uid),
    ] {
        if let Ok(Some(g)) = nix::unistd::Group::from_name(name) {
            o.groups.insert(name.to_string(), g.gid.as_raw());
        }
        if let Ok(Some(g)) = nix::unistd::Group::from_gid(nix::unistd::Gid::from_raw(gid)) {
            o.gid_names.insert(gid, g.name);
        }
    }
    for p in layout.paths() {
        if let Some(st) = path_state(&p) {
            o.paths.insert(p, st);
        }
    }
    for f in layout.blocks.iter().map(|b| &b.path) {
        // The agent's files: read without following what the agent may have planted.
        if let Ok(Some(super::userfile::Found { text: t, .. })) = super::userfile::read(f) {
            o.texts.insert(f.clone(), t);
        }
    }
    o.binary_current = same_bytes(&o.exe, Path::new(BIN_PATH));
    o.configured_bundles = crate::cmd::trust::bundle::configured_bundles(Path::new("/etc"));
    if let Ok(ca) = std::fs::read_to_string(layout.certs.join("ca.pem")) {
        let bundle = crate::cmd::trust::bundle::bundle_pem(&ca, &o.configured_bundles).ok();
        o.bundle_sha256 = bundle.as_ref().map(|b| sha256_hex(b.as_bytes()));
        o.truststore_current = match (bundle, std::fs::read(&layout.truststore)) {
            (Some(b), Ok(p12)) => {
                use crate::cmd::trust::truststore;
                truststore::certs_in(&p12) == Some(truststore::certs_of_bundle(&b))
            }
            _ => false,
        };
        o.ca_common_name = ca_common_name(&ca);
    }
    use crate::cmd::trust::system_store::SystemStore;
    match layout.platform {
        Platform::Linux => {
            o.pam_auth_update = Path::new(crate::cmd::trust::files::PAM_AUTH_UPDATE).exists();
            o.dbus_policy_dir = Path::new(super::resolvers::DBUS_POLICY_DIR).is_dir();
            o.pam_enabled = crate::cmd::trust::files::pam_applies(&layout.env_file);
            o.system_store = SystemStore::linux(Path::exists);
        }
        Platform::MacOs => o.system_store = Some(SystemStore::MacOs),
    }
    o.firewall = firewall_seen(cfg, o.users.contains_key(&layout.agent.name));
    o.service = service_seen(layout.platform);
    if layout.platform == Platform::MacOs && o.users.contains_key(&layout.agent.name) {
        if let Some(cn) = &o.ca_common_name {
            let kc = layout.agent_keychain().to_string_lossy().into_owned();
            let cmd = [
                "sudo",
                "-u",
                &layout.agent.name,
                "-H",
                "security",
                "find-certificate",
                "-c",
                cn,
                &kc,
            ];
            o.keychain_has_ca = succeeds(&cmd) == Some(true);
        }
    }
    o.path_link = path_link(Path::new(super::layout::PATH_LINK));
    for d in layout.evidence_dirs() {
        if Path::new(&d).is_dir() {
            o.sizes.insert(d.clone(), tree_size(&d));
        }
    }
    let t = time::OffsetDateTime::now_utc();
    o.stamp = format!(
        "{:04}{:02}{:02}T{:02}{:02}{:02}Z",
        t.year(),
        u8::from(t.month()),
        t.day(),
        t.hour(),
        t.minute(),
        t.second()
    );
    o.manifest = Manifest::load(manifest_path).ok().flatten();
    o.daemon_alive = std::os::unix::net::UnixStream::connect(&cfg.admin).is_ok();
    o
}

fn path_link(p: &Path) -> PathLink {
    match std::fs::symlink_metadata(p) {
        Err(_) if p.parent().is_some_and(Path::is_dir) => PathLink::Missing,
        Err(_) => PathLink::NoDir,
        Ok(m) if m.file_type().is_symlink() => match std::fs::read_link(p) {
            Ok(t) if t == Path::new(BIN_PATH) => PathLink::Ours,
            Ok(t) => PathLink::Foreign(format!("a link to {}", t.display())),
            Err(e) => PathLink::Foreign(format!("a link ({e})")),
        },
        Ok(m) if m.is_dir() => PathLink::Foreign("a directory".into()),
        Ok(_) => PathLink::Foreign("a file".into()),
    }
}

fn firewall_seen(cfg: &Config, agent_exists: bool) -> FirewallSeen {
    let backend = agenshield_pf::platform_redirector();
    let probe = agenshield_proxy::daemon::firewall::presence_probe();
    let spec = if agent_exists {
        agenshield_proxy::daemon::firewall::spec(cfg, &cfg.transparent, &cfg.dns).ok()
    } else {
        None
    };
    match backend.status(spec.as_ref().unwrap_or(&probe)) {
        Ok(st) => match st.state {
            agenshield_pf::FirewallState::Absent => FirewallSeen::Absent,
            agenshield_pf::FirewallState::Matches if spec.is_some() => FirewallSeen::Matches,
            _ => FirewallSeen::Present,
        },
        Err(_) => FirewallSeen::Absent,
    }
}

fn service_seen(platform: Platform) -> ServiceSeen {
    match platform {
        Platform::Linux => {
            if !Path::new(SYSTEMD_RUNNING_MARKER).exists() {
                return ServiceSeen::default();
            }
            let unit = super::layout::SYSTEMD_UNIT_NAME;
            ServiceSeen {
                manager_running: true,
                enabled: succeeds(&["systemctl", "is-enabled", "--quiet", unit]) == Some(true),
                active: succeeds(&["systemctl", "is-active", "--quiet", unit]) == Some(true),
            }
        }
        Platform::MacOs => {
            let loaded =
                succeeds(&["launchctl", "print", &super::macos::service_target()]) == Some(true);
            ServiceSeen {
                manager_running: true,
                enabled: loaded,
                active: loaded,
            }
        }
    }
}

/// The CA's subject summary (its common name), as the keychain tools match it.
#[cfg(target_os = "macos")]
fn ca_common_name(pem: &str) -> Option<String> {
    use rustls_pki_types::pem::PemObject;
    let der = rustls_pki_types::CertificateDer::from_pem_slice(pem.as_bytes()).ok()?;
    security_framework::certificate::SecCertificate::from_der(&der)
        .ok()
        .map(|c| c.subject_summary())
}

#[cfg(not(target_os = "macos"))]
fn ca_common_name(_pem: &str) -> Option<String> {
    None
}
