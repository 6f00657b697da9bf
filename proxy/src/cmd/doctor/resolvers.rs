//! Linux: the local resolvers that answer around the DNS stub (systemd-resolved's varlink
//! socket, nscd's; [`crate::cmd::install::resolvers`]): can the agent connect to each, tried
//! as the agent; and is the D-Bus policy that keeps it from `org.freedesktop.resolve1` there.

use std::path::{Path, PathBuf};

use super::agent::Agent;
use super::agent_access::Access;
use super::finding::{Area, Finding};
use crate::cmd::install::resolvers::{dbus_policy, DBUS_POLICY_DIR, DBUS_POLICY_PATH, SOCKETS};

const FIX: &str = "`sudo agenshield proxy firewall resolvers` (install's drop-ins do it each time \
                   the service starts; `sudo agenshield proxy install` puts them back)";

/// One finding per socket that exists in `sockets`, and one for the D-Bus policy.
pub fn findings(access: &Access, agent: &Agent, sockets: &[PathBuf]) -> Vec<Finding> {
    let mut out = Vec::new();
    for path in sockets {
        let what = SOCKETS
            .iter()
            .find(|s| Path::new(s.path) == path)
            .map_or("local resolver", |s| s.what);
        let subject = format!("{what} {}", path.display());
        if std::fs::symlink_metadata(path).is_err() {
            out.push(Finding::ok(Area::Firewall, subject, "not running here"));
            continue;
        }
        out.push(match access.can_connect(path) {
            Ok(()) => Finding::fail(
                Area::Firewall,
                subject,
                format!(
                    "{} can connect: names it asks for here are resolved around the DNS stub \
                     (and may carry data out)",
                    agent.name
                ),
                FIX,
            ),
            Err(e) if e.raw_os_error() == Some(nix::libc::EACCES) => Finding::ok(
                Area::Firewall,
                subject,
                format!("closed to {} (its lookups go to the DNS stub)", agent.name),
            ),
            Err(e) => Finding::ok(
                Area::Firewall,
                subject,
                format!("nothing answers there ({e})"),
            ),
        });
    }
    if Path::new(DBUS_POLICY_DIR).is_dir() {
        let want = dbus_policy(&[agent.name.as_str()]);
        let subject = DBUS_POLICY_PATH;
        out.push(match std::fs::read_to_string(DBUS_POLICY_PATH) {
            Ok(t) if t == want => Finding::ok(
                Area::Firewall,
                subject,
                format!(
                    "D-Bus refuses {} every message to org.freedesktop.resolve1",
                    agent.name
                ),
            ),
            Ok(_) => Finding::fail(
                Area::Firewall,
                subject,
                "differs from what install writes",
                "`sudo agenshield proxy install` rewrites it",
            ),
            Err(e) => Finding::fail(
                Area::Firewall,
                subject,
                format!(
                    "{e}: {} may ask systemd-resolved over D-Bus (`resolvectl query`) to \
                     resolve names around the DNS stub",
                    agent.name
                ),
                "`sudo agenshield proxy install` writes it",
            ),
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cmd::doctor::finding::Status;

    /// As root, with the real `nobody`: open, then closed by the ACL install applies.
    #[test]
    fn a_socket_the_agent_reaches_fails_and_once_closed_passes() {
        use std::os::unix::fs::PermissionsExt;
        if !nix::unistd::geteuid().is_root() {
            return;
        }
        let Some(agent) = Agent::lookup("nobody") else {
            return;
        };
        let access = Access::for_agent(&agent).expect("as nobody");
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))
            .expect("chmod");
        let sock = dir.path().join("resolve");
        let _l = std::os::unix::net::UnixListener::bind(&sock).expect("bind");
        std::fs::set_permissions(&sock, std::fs::Permissions::from_mode(0o666)).expect("chmod");
        let check = || findings(&access, &agent, std::slice::from_ref(&sock)).remove(0);
        let f = check();
        assert_eq!(f.status, Status::Fail, "{f:?}");
        assert!(f.detail.contains("nobody can connect"), "{}", f.detail);
        agenshield_pf::socket_acl::deny(&sock, &[agent.uid]).expect("deny");
        let f = check();
        assert_eq!(f.status, Status::Ok, "{f:?}");
        assert!(f.detail.starts_with("closed to nobody"), "{}", f.detail);
        let gone = findings(&access, &agent, &[dir.path().join("none")]).remove(0);
        assert_eq!(gone.detail, "not running here");
    }
}
