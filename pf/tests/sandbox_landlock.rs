//! Landlock for `agenshield proxy exec`, against the running kernel: a restricted thread or
//! child may connect to the proxy's port and to no other, may not bind a TCP socket, and
//! passes the restriction on to what it starts. Only loopback sockets the test binds itself.
//! Without Landlock ABI 4 the tests print why they skip; under CI=true that is a failure.
#![cfg(target_os = "linux")]

use std::io::ErrorKind;
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::process::Command;
use std::time::Duration;

use agenshield_pf::sandbox::landlock::{kernel_abi, LandlockError, ProxyOnly, NET_ABI};

fn landlock_or_skip(test: &str) -> bool {
    match kernel_abi() {
        Ok(abi) if abi >= NET_ABI => {
            eprintln!("{test}: kernel Landlock ABI {abi}");
            true
        }
        other => {
            let reason = format!("no Landlock ABI {NET_ABI} on this kernel ({other:?})");
            if std::env::var("CI").is_ok_and(|v| v == "true") {
                panic!("{test}: {reason}; under CI=true a skip is a failure");
            }
            eprintln!("{test}: SKIPPED: {reason}");
            false
        }
    }
}

fn listener() -> (TcpListener, SocketAddr) {
    let l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind 127.0.0.1:0");
    let a = l.local_addr().expect("local_addr");
    (l, a)
}

fn connect(addr: SocketAddr) -> std::io::Result<TcpStream> {
    TcpStream::connect_timeout(&addr, Duration::from_secs(5))
}

#[test]
fn a_restricted_thread_reaches_the_proxy_port_only_and_binds_nothing() {
    if !landlock_or_skip("a_restricted_thread_reaches_the_proxy_port_only") {
        return;
    }
    let (_proxy, proxy_addr) = listener();
    let (_other, other_addr) = listener();
    // The same port on another loopback address: Landlock rules are by port, any address.
    let proxy_alias = SocketAddr::from(([127, 0, 0, 2], proxy_addr.port()));
    // Landlock restricts the calling thread: do it on a thread of its own so the rest of the
    // test process stays free.
    let results = std::thread::spawn(move || {
        let sandbox = ProxyOnly::new(proxy_addr.port()).expect("build the ruleset");
        assert_eq!(sandbox.port(), proxy_addr.port());
        sandbox.restrict_current_thread().expect("restrict");
        (
            connect(proxy_addr).map(|_| ()),
            connect(other_addr).map(|_| ()),
            TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).map(|_| ()),
            connect(proxy_alias).map(|_| ()),
        )
    })
    .join()
    .expect("thread");
    let (to_proxy, to_other, bind, to_alias) = results;
    to_proxy.expect("the proxy's port is allowed");
    assert_eq!(
        to_other.expect_err("another port is refused").kind(),
        ErrorKind::PermissionDenied
    );
    assert_eq!(
        bind.expect_err("binding is refused").kind(),
        ErrorKind::PermissionDenied
    );
    // Not refused by Landlock: nothing listens on 127.0.0.2 (ECONNREFUSED), or something does.
    if let Err(e) = to_alias {
        assert_ne!(e.kind(), ErrorKind::PermissionDenied, "{e}");
    }
    // This thread was never restricted: the same connection goes through here.
    connect(other_addr).expect("unrestricted thread connects");
}

#[test]
fn tcp_fast_open_does_not_get_around_the_connect_rule() {
    use nix::sys::socket::{
        sendto, socket, AddressFamily, MsgFlags, SockFlag, SockType, SockaddrIn,
    };
    use std::os::fd::AsRawFd;
    if !landlock_or_skip("tcp_fast_open_does_not_get_around_the_connect_rule") {
        return;
    }
    let (_proxy, proxy_addr) = listener();
    let (other, other_addr) = listener();
    other.set_nonblocking(true).expect("nonblocking");
    let result = std::thread::spawn(move || {
        ProxyOnly::new(proxy_addr.port())
            .expect("ruleset")
            .restrict_current_thread()
            .expect("restrict");
        let fd = socket(
            AddressFamily::Inet,
            SockType::Stream,
            SockFlag::empty(),
            None,
        )
        .expect("socket");
        let SocketAddr::V4(v4) = other_addr else {
            unreachable!("bound on 127.0.0.1")
        };
        // sendto(MSG_FASTOPEN) connects and sends in one call, without connect(2).
        sendto(
            fd.as_raw_fd(),
            b"GET / HTTP/1.0\r\n\r\n",
            &SockaddrIn::from(v4),
            MsgFlags::from_bits_retain(libc::MSG_FASTOPEN),
        )
    })
    .join()
    .expect("thread");
    // Without the seccomp filter this send went through (Linux 6.18, Landlock ABI 7): the
    // listener accepted the connection and read the request.
    let err = result.expect_err("a fast-open send to another port is refused");
    assert_eq!(err, nix::errno::Errno::EACCES, "{err}");
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        other.accept().is_err(),
        "nothing reached the other listener"
    );
}

#[test]
fn fast_open_connect_udp_raw_and_io_uring_are_refused_tcp_and_unix_sockets_work() {
    use nix::sys::socket::{
        connect, setsockopt, socket, sockopt, AddressFamily, SockFlag, SockProtocol, SockType,
        SockaddrIn,
    };
    use std::os::fd::AsRawFd;
    if !landlock_or_skip("fast_open_connect_udp_raw_and_io_uring_are_refused") {
        return;
    }
    let (_proxy, proxy_addr) = listener();
    let (_other, other_addr) = listener();
    let SocketAddr::V4(other_v4) = other_addr else {
        unreachable!("bound on 127.0.0.1")
    };
    std::thread::spawn(move || {
        // Control, before the restriction: each of these works.
        let udp = || {
            socket(
                AddressFamily::Inet,
                SockType::Datagram,
                SockFlag::empty(),
                None,
            )
        };
        udp().expect("UDP socket before the sandbox");
        ProxyOnly::new(proxy_addr.port())
            .expect("ruleset")
            .restrict_current_thread()
            .expect("restrict");
        // TCP_FASTOPEN_CONNECT defers the SYN, but connect(2) is still checked.
        let fd = socket(
            AddressFamily::Inet,
            SockType::Stream,
            SockFlag::empty(),
            None,
        )
        .expect("TCP sockets are allowed");
        setsockopt(&fd, sockopt::TcpFastOpenConnect, &true).expect("sockopt");
        assert_eq!(
            connect(fd.as_raw_fd(), &SockaddrIn::from(other_v4)),
            Err(nix::errno::Errno::EACCES)
        );
        assert_eq!(udp().map(|_| ()), Err(nix::errno::Errno::EACCES), "UDP");
        assert_eq!(
            socket(
                AddressFamily::Inet6,
                SockType::Datagram,
                SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
                None
            )
            .map(|_| ()),
            Err(nix::errno::Errno::EACCES),
            "UDP over IPv6, with flags in the type"
        );
        assert_eq!(
            socket(
                AddressFamily::Inet,
                SockType::Stream,
                SockFlag::empty(),
                SockProtocol::Sctp
            )
            .map(|_| ()),
            Err(nix::errno::Errno::EACCES),
            "SCTP"
        );
        assert_eq!(
            socket(
                AddressFamily::Inet,
                SockType::Raw,
                SockFlag::empty(),
                SockProtocol::Icmp
            )
            .map(|_| ()),
            Err(nix::errno::Errno::EACCES),
            "raw"
        );
        socket(
            AddressFamily::Inet6,
            SockType::Stream,
            SockFlag::SOCK_CLOEXEC,
            SockProtocol::Tcp,
        )
        .expect("TCP over IPv6 with protocol IPPROTO_TCP");
        socket(
            AddressFamily::Unix,
            SockType::Datagram,
            SockFlag::empty(),
            None,
        )
        .expect("Unix sockets are untouched");
        // Other families are refused whole (vsock reaches a VM's host, SMC falls back to a
        // TCP socket Landlock never checks).
        assert_eq!(
            socket(
                AddressFamily::Vsock,
                SockType::Stream,
                SockFlag::empty(),
                None
            )
            .map(|_| ()),
            Err(nix::errno::Errno::EACCES),
            "vsock"
        );
        assert_eq!(
            nix::sys::socket::socketpair(
                AddressFamily::Vsock,
                SockType::Stream,
                None,
                SockFlag::empty()
            )
            .map(|_| ()),
            Err(nix::errno::Errno::EACCES),
            "socketpair outside AF_UNIX"
        );
        nix::sys::socket::socketpair(
            AddressFamily::Unix,
            SockType::Stream,
            None,
            SockFlag::empty(),
        )
        .expect("Unix socket pairs are untouched");
        // listen() without bind() would autobind to 0.0.0.0:<ephemeral>: refused.
        let lfd = socket(
            AddressFamily::Inet,
            SockType::Stream,
            SockFlag::empty(),
            None,
        )
        .expect("TCP socket");
        assert_eq!(
            nix::sys::socket::listen(&lfd, nix::sys::socket::Backlog::new(1).expect("backlog")),
            Err(nix::errno::Errno::EACCES),
            "listen without bind"
        );
        // io_uring_setup(1, NULL) fails with EFAULT when it reaches the kernel; the filter
        // answers EPERM first.
        assert_eq!(io_uring_setup_null(), nix::errno::Errno::EPERM, "io_uring");
    })
    .join()
    .expect("thread");
    // Control: outside the sandbox the call reaches the kernel, which rejects the null
    // pointer with EFAULT (EPERM only where io_uring is disabled system-wide, and then the
    // check above proves nothing new).
    let outside = io_uring_setup_null();
    if outside == nix::errno::Errno::EPERM {
        eprintln!("io_uring is disabled on this machine: the EPERM above is not the filter's");
    } else {
        assert_eq!(outside, nix::errno::Errno::EFAULT);
    }
}

/// `io_uring_setup(1, NULL)`: the errno it fails with.
fn io_uring_setup_null() -> nix::errno::Errno {
    #[allow(unsafe_code)]
    // SAFETY: a null params pointer is rejected by the kernel (EFAULT) before anything is
    // created; no memory of ours is read or written.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_io_uring_setup,
            1 as libc::c_uint,
            std::ptr::null_mut::<libc::c_void>(),
        )
    };
    assert_eq!(rc, -1, "io_uring_setup(1, NULL) cannot succeed");
    nix::errno::Errno::last()
}

#[test]
fn a_spawned_child_and_its_children_are_confined() {
    if !landlock_or_skip("a_spawned_child_and_its_children_are_confined") {
        return;
    }
    let (_proxy, proxy_addr) = listener();
    let (_other, other_addr) = listener();
    // bash's /dev/tcp opens a TCP connection: exit 0 when connect() succeeds.
    let dial = |addr: SocketAddr| format!("exec 3<>/dev/tcp/127.0.0.1/{}", addr.port());
    let run = |script: String, sandboxed: bool| -> (bool, String) {
        let mut cmd = Command::new("bash");
        cmd.args(["-c", &script]);
        if sandboxed {
            ProxyOnly::new(proxy_addr.port())
                .expect("ruleset")
                .apply_to(&mut cmd);
        }
        let out = cmd.output().expect("run bash");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    // The control: unconfined, both ports answer (so a refusal below is the sandbox's).
    assert!(run(dial(other_addr), false).0, "unsandboxed dial works");
    assert!(run(dial(proxy_addr), true).0, "the proxy's port is allowed");
    let (ok, err) = run(dial(other_addr), true);
    assert!(!ok, "another port is refused");
    assert!(err.contains("Permission denied"), "{err}");
    // A grandchild inherits the restriction.
    let (ok, err) = run(format!("bash -c '{}'", dial(other_addr)), true);
    assert!(!ok && err.contains("Permission denied"), "{err}");
    // no_new_privs is set: visible in /proc/self/status of the confined child.
    let (ok, _) = run(
        "grep -q '^NoNewPrivs:[[:space:]]*1' /proc/self/status".into(),
        true,
    );
    assert!(ok, "no_new_privs is set in the child");
}

#[test]
fn on_abi_6_the_sandbox_cannot_signal_processes_outside_it() {
    if !landlock_or_skip("on_abi_6_the_sandbox_cannot_signal_processes_outside_it") {
        return;
    }
    let (_proxy, proxy_addr) = listener();
    let sandbox = ProxyOnly::new(proxy_addr.port()).expect("ruleset");
    if !sandbox.scoped() {
        eprintln!("kernel below Landlock ABI 6: no signal scoping to check");
        return;
    }
    // Our own test process is outside the sandbox: `kill -0` it from inside and from outside.
    let me = std::process::id().to_string();
    let probe = |sandboxed: Option<ProxyOnly>| {
        let mut cmd = Command::new("bash");
        cmd.args(["-c", &format!("kill -0 {me}")]);
        if let Some(s) = sandboxed {
            s.apply_to(&mut cmd);
        }
        cmd.output().expect("run bash")
    };
    assert!(probe(None).status.success(), "unsandboxed kill -0 works");
    let out = probe(Some(sandbox));
    assert!(!out.status.success(), "sandboxed kill -0 is refused");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("Operation not permitted"), "{err}");
}

#[test]
fn the_error_for_a_missing_abi_names_what_is_needed() {
    let e = LandlockError::Unsupported {
        found: "this one has ABI 3".into(),
    };
    let msg = e.to_string();
    assert!(
        msg.contains("Landlock ABI 4") && msg.contains("Linux 6.7"),
        "{msg}"
    );
    assert!(msg.contains("ABI 3"), "{msg}");
}
