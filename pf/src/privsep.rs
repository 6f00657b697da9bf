//! The operating-system half of the daemon's privilege separation: handing sockets to the
//! worker over a Unix socket (`SCM_RIGHTS`) and dropping the worker to its own user for good.
//! The proxy crate decides what to hand over and when; this module only touches the OS.

use std::io::{self, IoSlice, IoSliceMut};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

use nix::sys::socket::{recvmsg, sendmsg, ControlMessage, ControlMessageOwned, MsgFlags};
use nix::unistd::{Gid, Uid};

/// File descriptors one hand-off carries at most.
pub const MAX_FDS: usize = 16;
/// Bytes of header one hand-off carries at most.
pub const MAX_HEADER: usize = 16 * 1024;

/// Sends `header` and `fds` in one message. The receiver gets its own copies of the fds.
pub fn send_fds(sock: &impl AsFd, header: &[u8], fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    if fds.len() > MAX_FDS || header.len() > MAX_HEADER || header.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "hand-off of {} fds and {} header bytes is out of bounds",
                fds.len(),
                header.len()
            ),
        ));
    }
    let raw: Vec<RawFd> = fds.iter().map(AsRawFd::as_raw_fd).collect();
    let cmsg = [ControlMessage::ScmRights(&raw)];
    let iov = [IoSlice::new(header)];
    let sent = sendmsg::<()>(
        sock.as_fd().as_raw_fd(),
        &iov,
        &cmsg,
        MsgFlags::empty(),
        None,
    )
    .map_err(io::Error::from)?;
    if sent != header.len() {
        return Err(io::Error::new(
            io::ErrorKind::WriteZero,
            "hand-off header sent in part",
        ));
    }
    Ok(())
}

/// Receives one hand-off: its header and the fds that came with it (owned from here on,
/// close-on-exec).
pub fn recv_fds(sock: &impl AsFd) -> io::Result<(Vec<u8>, Vec<OwnedFd>)> {
    let mut buf = vec![0u8; MAX_HEADER];
    let mut cmsg_buf = nix::cmsg_space!([RawFd; MAX_FDS]);
    let mut iov = [IoSliceMut::new(&mut buf)];
    let msg = recvmsg::<()>(
        sock.as_fd().as_raw_fd(),
        &mut iov,
        Some(&mut cmsg_buf),
        recv_flags(),
    )
    .map_err(io::Error::from)?;
    let len = msg.bytes;
    let truncated = msg.flags.contains(MsgFlags::MSG_CTRUNC);
    let mut fds = Vec::new();
    for c in msg.cmsgs().map_err(io::Error::from)? {
        if let ControlMessageOwned::ScmRights(raw) = c {
            for fd in raw {
                // SAFETY: the kernel just installed `fd` in our table for this message
                // (SCM_RIGHTS); nothing else refers to it, so taking ownership is sound.
                #[allow(unsafe_code)]
                let owned = unsafe { OwnedFd::from_raw_fd(fd) };
                // Linux sets close-on-exec as it receives (MSG_CMSG_CLOEXEC); elsewhere now.
                #[cfg(not(target_os = "linux"))]
                {
                    use nix::fcntl::{fcntl, FcntlArg, FdFlag};
                    fcntl(&owned, FcntlArg::F_SETFD(FdFlag::FD_CLOEXEC))
                        .map_err(io::Error::from)?;
                }
                fds.push(owned);
            }
        }
    }
    if truncated {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "hand-off carried more fds than expected",
        ));
    }
    if len == 0 {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "the supervisor closed the hand-off socket",
        ));
    }
    buf.truncate(len);
    Ok((buf, fds))
}

#[cfg(target_os = "linux")]
fn recv_flags() -> MsgFlags {
    MsgFlags::MSG_CMSG_CLOEXEC
}

#[cfg(not(target_os = "linux"))]
fn recv_flags() -> MsgFlags {
    MsgFlags::empty()
}

/// Who the worker becomes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
}

impl Identity {
    /// Looks a user up by name or by uid (as text).
    pub fn lookup(user: &str) -> io::Result<Identity> {
        let found = match user.parse::<u32>() {
            Ok(uid) => nix::unistd::User::from_uid(Uid::from_raw(uid)),
            Err(_) => nix::unistd::User::from_name(user),
        }
        .map_err(io::Error::from)?;
        let u = found.ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotFound,
                format!("no user {user:?} on this system"),
            )
        })?;
        if u.uid.is_root() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("the worker user {user:?} is root; name an unprivileged user"),
            ));
        }
        Ok(Identity {
            name: u.name,
            uid: u.uid.as_raw(),
            gid: u.gid.as_raw(),
        })
    }
}

/// Becomes `who` for good: its supplementary groups, its group, its user (real, effective
/// and saved ids, so root cannot be regained), and on Linux no new privileges through exec.
/// Checks the result: a drop that left any way back to root is an error.
pub fn drop_to(who: &Identity) -> io::Result<()> {
    let gid = Gid::from_raw(who.gid);
    let name = std::ffi::CString::new(who.name.as_str())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "user name has a NUL byte"))?;
    init_groups(&name, gid)?;
    nix::unistd::setgid(gid).map_err(io::Error::from)?;
    // As root, setuid sets the real, effective and saved uid alike (POSIX; both Linux and
    // macOS), and on Linux clears every capability.
    nix::unistd::setuid(Uid::from_raw(who.uid)).map_err(io::Error::from)?;
    #[cfg(target_os = "linux")]
    nix::sys::prctl::set_no_new_privs().map_err(io::Error::from)?;
    if nix::unistd::geteuid().is_root()
        || nix::unistd::getuid().is_root()
        || nix::unistd::setuid(Uid::from_raw(0)).is_ok()
    {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            "dropping privileges left a way back to root",
        ));
    }
    Ok(())
}

#[cfg(not(any(target_os = "macos", target_os = "ios")))]
fn init_groups(name: &std::ffi::CStr, gid: Gid) -> io::Result<()> {
    nix::unistd::initgroups(name, gid).map_err(io::Error::from)
}

#[cfg(any(target_os = "macos", target_os = "ios"))]
fn init_groups(name: &std::ffi::CStr, gid: Gid) -> io::Result<()> {
    // nix leaves initgroups out on Apple platforms (its group type differs); libc has it.
    // SAFETY: `name` is a valid NUL-terminated string that outlives the call; initgroups
    // reads it and the group database only.
    #[allow(unsafe_code)]
    let rc = unsafe { libc::initgroups(name.as_ptr(), gid.as_raw() as libc::c_int) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// A connected pair of Unix datagram sockets (message boundaries kept, fds can travel; both
/// Linux and macOS have them, unlike Unix `SOCK_SEQPACKET`), close-on-exec.
pub fn datagram_pair() -> io::Result<(OwnedFd, OwnedFd)> {
    use nix::sys::socket::{socketpair, AddressFamily, SockFlag, SockType};
    #[cfg(target_os = "linux")]
    let flags = SockFlag::SOCK_CLOEXEC;
    #[cfg(not(target_os = "linux"))]
    let flags = SockFlag::empty();
    let (a, b) = socketpair(AddressFamily::Unix, SockType::Datagram, None, flags)
        .map_err(io::Error::from)?;
    #[cfg(not(target_os = "linux"))]
    for fd in [&a, &b] {
        use nix::fcntl::{fcntl, FcntlArg, FdFlag};
        fcntl(fd, FcntlArg::F_SETFD(FdFlag::FD_CLOEXEC)).map_err(io::Error::from)?;
    }
    Ok((a, b))
}

/// The local and peer addresses of a connected TCP socket, as the kernel has them.
pub fn socket_addrs(
    fd: BorrowedFd<'_>,
) -> io::Result<(std::net::SocketAddr, std::net::SocketAddr)> {
    use nix::sys::socket::{getpeername, getsockname, SockaddrStorage};
    let to_std = |s: SockaddrStorage| -> io::Result<std::net::SocketAddr> {
        if let Some(v4) = s.as_sockaddr_in() {
            return Ok(std::net::SocketAddr::V4((*v4).into()));
        }
        if let Some(v6) = s.as_sockaddr_in6() {
            return Ok(std::net::SocketAddr::V6((*v6).into()));
        }
        Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "not an IP socket",
        ))
    };
    let local = to_std(getsockname::<SockaddrStorage>(fd.as_raw_fd()).map_err(io::Error::from)?)?;
    let peer = to_std(getpeername::<SockaddrStorage>(fd.as_raw_fd()).map_err(io::Error::from)?)?;
    Ok((local, peer))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixStream;

    #[test]
    fn a_listener_handed_over_is_the_same_socket() {
        let (a, b) = UnixStream::pair().expect("pair");
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        send_fds(&a, b"{\"n\":1}", &[listener.as_fd()]).expect("send");
        drop(listener);
        let (header, mut fds) = recv_fds(&b).expect("recv");
        assert_eq!(header, b"{\"n\":1}");
        assert_eq!(fds.len(), 1);
        let got = std::net::TcpListener::from(fds.remove(0));
        assert_eq!(got.local_addr().expect("addr"), addr);
        // It still accepts: a connection to the old address lands on the received socket.
        let _c = std::net::TcpStream::connect(addr).expect("connect");
        got.accept().expect("accept");
    }

    #[test]
    fn bounds_are_checked_and_eof_is_an_error() {
        let (a, b) = UnixStream::pair().expect("pair");
        assert!(send_fds(&a, b"", &[]).is_err());
        assert!(send_fds(&a, &vec![b'x'; MAX_HEADER + 1], &[]).is_err());
        drop(a);
        assert_eq!(
            recv_fds(&b).expect_err("eof").kind(),
            io::ErrorKind::UnexpectedEof
        );
    }

    #[test]
    fn root_is_not_a_worker() {
        assert!(Identity::lookup("root").is_err());
        assert!(Identity::lookup("0").is_err());
        assert!(Identity::lookup("no-such-user-agenshield").is_err());
    }
}
