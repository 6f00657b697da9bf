//! systemd's readiness protocol (`Type=notify`), with a test-owned datagram socket as
//! `NOTIFY_SOCKET`: the daemon sends `READY=1` once its listeners serve, from its main process
//! (the unit keeps `NotifyAccess=main`, so a message from any other process would be
//! dropped); a split daemon's worker tells its root supervisor, which sends it.
#![cfg(target_os = "linux")]

use std::io::IoSliceMut;
use std::net::{SocketAddr, TcpStream};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixDatagram;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use agenshield_e2e::daemon::{binary, chown_tree, prepare, DaemonOptions};
use agenshield_e2e::netlab::{root_or_skip, AgentUser};

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

/// One notification: its text and the pid that sent it (from its credentials).
fn receive(sock: &UnixDatagram, deadline: Instant) -> Option<(String, i32)> {
    use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags, UnixAddr};
    while Instant::now() < deadline {
        let mut buf = [0u8; 4096];
        let mut cmsg = nix::cmsg_space!(nix::sys::socket::UnixCredentials);
        let (n, pid) = {
            let mut iov = [IoSliceMut::new(&mut buf)];
            let Ok(msg) = recvmsg::<UnixAddr>(
                sock.as_raw_fd(),
                &mut iov,
                Some(&mut cmsg),
                MsgFlags::empty(),
            ) else {
                continue;
            };
            let pid = msg
                .cmsgs()
                .ok()
                .into_iter()
                .flatten()
                .find_map(|c| match c {
                    ControlMessageOwned::ScmCredentials(cred) => Some(cred.pid()),
                    _ => None,
                })
                .unwrap_or(-1);
            (msg.bytes, pid)
        };
        return Some((String::from_utf8_lossy(&buf[..n]).into_owned(), pid));
    }
    None
}

struct Started {
    child: Child,
    explicit: SocketAddr,
    transparent: SocketAddr,
    _dir: tempfile::TempDir,
}

impl Drop for Started {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts the daemon for `opts` on fixed free ports with `NOTIFY_SOCKET` set to a socket of
/// ours; returns it and the first notification.
fn start(opts: &DaemonOptions, worker_uid: Option<u32>) -> (Started, Option<(String, i32)>) {
    let dir = prepare(opts);
    let (explicit, transparent) = (free_port(), free_port());
    let config = dir.path().join("proxy.toml");
    let text = std::fs::read_to_string(&config)
        .expect("config")
        .replace(
            "explicit = \"127.0.0.1:0\"",
            &format!("explicit = \"127.0.0.1:{explicit}\""),
        )
        .replace(
            "transparent = [\"127.0.0.1:0\"]",
            &format!("transparent = [\"127.0.0.1:{transparent}\"]"),
        );
    assert!(text.contains(&format!(":{explicit}\"")), "{text}");
    std::fs::write(&config, text).expect("write config");
    if let Some(uid) = worker_uid {
        chown_tree(dir.path(), uid);
    }
    let sock_path = dir.path().join("notify.sock");
    let sock = UnixDatagram::bind(&sock_path).expect("bind notify socket");
    nix::sys::socket::setsockopt(&sock, nix::sys::socket::sockopt::PassCred, &true)
        .expect("SO_PASSCRED");
    sock.set_read_timeout(Some(Duration::from_millis(200)))
        .expect("timeout");
    let log = std::fs::File::create(dir.path().join("daemon.log")).expect("log");
    let child = Command::new(binary())
        .args(["proxy", "run", "--config"])
        .arg(&config)
        .env("NOTIFY_SOCKET", &sock_path)
        .env("AGENSHIELD_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::from(log))
        .spawn()
        .expect("spawn agenshield");
    let got = receive(&sock, Instant::now() + Duration::from_secs(30));
    let started = Started {
        child,
        explicit: SocketAddr::from(([127, 0, 0, 1], explicit)),
        transparent: SocketAddr::from(([127, 0, 0, 1], transparent)),
        _dir: dir,
    };
    (started, got)
}

fn assert_ready_and_serving(s: &Started, got: Option<(String, i32)>, log: &Path) {
    let Some((text, pid)) = got else {
        panic!(
            "no notification within 30 s; the daemon's log:\n{}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
    };
    assert!(text.lines().any(|l| l == "READY=1"), "{text:?}");
    assert_eq!(
        pid,
        s.child.id() as i32,
        "READY=1 must come from the main process (NotifyAccess=main)"
    );
    // At READY=1 the listeners are there: connecting needs no wait.
    for addr in [s.explicit, s.transparent] {
        TcpStream::connect_timeout(&addr, Duration::from_secs(2))
            .unwrap_or_else(|e| panic!("{addr} not bound at READY=1: {e}"));
    }
}

fn options() -> DaemonOptions {
    DaemonOptions {
        policies: vec![("main.toml".into(), "version = 1\n".into())],
        ..Default::default()
    }
}

#[test]
fn the_daemon_tells_the_service_manager_it_is_ready_once_its_listeners_are_bound() {
    let (s, got) = start(&options(), None);
    let log = s._dir.path().join("daemon.log");
    assert_ready_and_serving(&s, got, &log);
}

#[test]
fn a_split_daemons_supervisor_says_ready_once_its_worker_serves() {
    let Some(_serial) = root_or_skip("a_split_daemons_supervisor_says_ready") else {
        return;
    };
    let tag = std::process::id() % 97 + 200;
    let worker = AgentUser::create(tag);
    let opts = DaemonOptions {
        worker_user: Some((worker.name.clone(), worker.uid)),
        ..options()
    };
    let (s, got) = start(&opts, Some(worker.uid));
    let log = s._dir.path().join("daemon.log");
    assert_ready_and_serving(&s, got, &log);
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(text.contains("worker started"), "a split start:\n{text}");
}
