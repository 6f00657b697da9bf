//! Root tests of the admin socket: its peer-credential check (an agent uid is refused even
//! when the socket's mode lets it connect; root is served) and the group a daemon run by a
//! user gives it (agenshield-admin when it may, else the user's own, said with the fix).
#![cfg(target_os = "linux")]

use std::os::unix::fs::{MetadataExt, PermissionsExt};

use agenshield_e2e::daemon::{Daemon, DaemonOptions, RunAs};
use agenshield_e2e::netlab::{root_or_skip, sh, AgentUser};

const POLICY: &str = "version = 1\ndefault = \"deny\"\n";

#[test]
fn agent_uid_is_refused_by_the_admin_socket_even_when_its_mode_is_loosened() {
    let Some(_serial) = root_or_skip("agent_uid_is_refused_by_the_admin_socket") else {
        return;
    };
    let user = AgentUser::create(std::process::id() % 97 + 201);
    let daemon = Daemon::start(DaemonOptions {
        policies: vec![("main.toml".into(), POLICY.into())],
        agent_uids: vec![user.uid],
        ..Default::default()
    });

    // Root is served.
    let (code, out, err) = daemon.ctl(&[], &["status", "--json"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("\"pid\""), "{out}");

    // As shipped (0660 in a private directory) the agent cannot even reach the socket.
    let (code, _, err) = daemon.ctl(&user.as_agent(), &["status"]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("permission denied"), "{err}");

    // Loosened to 0666 in a world-readable directory: the daemon still refuses the agent by
    // its peer credentials.
    std::fs::set_permissions(daemon.dir.path(), std::fs::Permissions::from_mode(0o755))
        .expect("chmod dir");
    std::fs::set_permissions(daemon.socket(), std::fs::Permissions::from_mode(0o666))
        .expect("chmod socket");
    let (code, out, err) = daemon.ctl(&user.as_agent(), &["status"]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(
        err.contains(&format!("uid {} is an agent user", user.uid)),
        "{err}"
    );
    for args in [&["reload"][..], &["pending", "list"], &["policy", "show"]] {
        let (code, _, err) = daemon.ctl(&user.as_agent(), args);
        assert_eq!(code, 1, "{args:?}: {err}");
    }
    assert!(daemon.logs().contains("admin socket: refused"));
}

/// `agenshield-admin` for one test: created when this machine lacks it and removed again;
/// left alone (only our test users join it) when it was already there.
struct AdminGroup {
    gid: u32,
    created: bool,
}

impl AdminGroup {
    fn ensure() -> AdminGroup {
        let find = || nix::unistd::Group::from_name("agenshield-admin").expect("group database");
        let created = match find() {
            Some(_) => false,
            None => {
                sh(&["groupadd", "--system", "agenshield-admin"]);
                true
            }
        };
        let gid = find().expect("agenshield-admin exists").gid.as_raw();
        AdminGroup { gid, created }
    }
}

impl Drop for AdminGroup {
    fn drop(&mut self) {
        if self.created {
            let _ = std::process::Command::new("groupdel")
                .arg("agenshield-admin")
                .output();
        }
    }
}

/// `setpriv` as `user` with the supplementary groups the group database gives it.
fn with_groups(user: &AgentUser) -> Vec<String> {
    vec![
        "setpriv".into(),
        format!("--reuid={}", user.uid),
        format!("--regid={}", user.uid),
        "--init-groups".into(),
        "--".into(),
    ]
}

#[test]
fn a_user_daemon_outside_agenshield_admin_keeps_its_own_group_and_says_how_to_share() {
    let Some(_serial) = root_or_skip("a_user_daemon_outside_agenshield_admin") else {
        return;
    };
    let group = AdminGroup::ensure();
    let tag = std::process::id() % 97;
    let owner = AgentUser::create(tag + 301);
    let member = AgentUser::create(tag + 311);
    sh(&["usermod", "-aG", "agenshield-admin", &member.name]);
    let start = |prefix: Vec<String>| {
        let d = Daemon::start(DaemonOptions {
            policies: vec![("main.toml".into(), POLICY.into())],
            run_as: Some(RunAs {
                uid: owner.uid,
                prefix,
            }),
            ..Default::default()
        });
        // Only the socket's own mode and group stand between other users and it.
        std::fs::set_permissions(d.dir.path(), std::fs::Permissions::from_mode(0o755))
            .expect("chmod dir");
        d
    };
    let socket_group = |d: &Daemon| {
        let m = std::fs::metadata(d.socket()).expect("socket");
        assert_eq!(m.permissions().mode() & 0o777, 0o660, "socket mode");
        m.gid()
    };
    let warning = "stays with this user's group";

    // The owner is not in agenshield-admin: it may not give the socket to the group, so the
    // daemon keeps the owner's group, starts anyway, and says why and how to share it.
    let mut d = start(owner.as_agent());
    assert_eq!(socket_group(&d), owner.uid);
    let logs = d.logs();
    assert!(logs.contains(warning), "{logs}");
    assert!(
        logs.contains("sudo usermod -aG agenshield-admin $USER"),
        "{logs}"
    );
    for (who, prefix) in [("root", vec![]), ("the owner", owner.as_agent())] {
        let (code, out, err) = d.ctl(&prefix, &["status", "--json"]);
        assert_eq!(code, 0, "{who}: {out}{err}");
    }
    let (code, _, err) = d.ctl(&with_groups(&member), &["status"]);
    assert_eq!(code, 1, "a member cannot reach this socket: {err}");
    assert!(
        err.contains("run as root or as a member of agenshield-admin"),
        "{err}"
    );
    d.stop();
    drop(d);

    // Once the owner joins the group, the socket is the group's and its members are served.
    sh(&["usermod", "-aG", "agenshield-admin", &owner.name]);
    let d = start(with_groups(&owner));
    assert_eq!(socket_group(&d), group.gid);
    assert!(!d.logs().contains(warning), "{}", d.logs());
    let (code, out, err) = d.ctl(&with_groups(&member), &["status", "--json"]);
    assert_eq!(code, 0, "a member of agenshield-admin: {out}{err}");
    // Outside the group and not the owner: refused by the socket's mode.
    let outsider = AgentUser::create(tag + 321);
    let (code, _, err) = d.ctl(&outsider.as_agent(), &["status"]);
    assert_eq!(code, 1, "{err}");
}
