//! Root tests of the admin socket's peer-credential check: an agent uid is refused even when
//! the socket's mode lets it connect; root is served.
#![cfg(target_os = "linux")]

use std::os::unix::fs::PermissionsExt;

use agenshield_e2e::daemon::{Daemon, DaemonOptions};
use agenshield_e2e::netlab::{root_or_skip, AgentUser};

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
