//! A seccomp filter that closes what Landlock's TCP rules leave open, for `agenshield proxy
//! exec` on Linux:
//!
//! - **TCP Fast Open.** `sendto`/`sendmsg`/`sendmmsg` with `MSG_FASTOPEN` connect and send in
//!   one call without going through `connect(2)`, and on Linux 6.18 (Landlock ABI 7) that
//!   connection is not checked against the Landlock `ConnectTcp` rule: the test
//!   `tcp_fast_open_…` in `pf/tests/sandbox_landlock.rs` showed the data arriving at a port
//!   the ruleset refuses. (`curl --tcp-fastopen` does exactly this.) Every send carrying
//!   `MSG_FASTOPEN` is refused with `EACCES`. (`TCP_FASTOPEN_CONNECT` is fine: it still calls
//!   `connect(2)`, which Landlock checks.)
//! - **io_uring**, whose operations seccomp cannot see (a fast-open send could ride on it):
//!   `io_uring_setup` fails with `EPERM`, and programs fall back to plain syscalls.
//! - **Everything but TCP.** Landlock governs TCP only, so UDP (QUIC, DNS), SCTP, MPTCP and
//!   raw sockets, and other families (packet, vsock, SMC, RDS, TIPC), would pass it.
//!   `socket(2)`/`socketpair(2)` are allowed for `AF_UNIX` and `AF_NETLINK`, and for
//!   `AF_INET`/`AF_INET6` only as `SOCK_STREAM` with protocol 0 or `IPPROTO_TCP`; every other
//!   family is refused (`EACCES`). The command gets no DNS, which it does not need: it hands
//!   host names to the proxy.
//! - **Listening.** `listen(2)` on a socket that was never bound autobinds it to an ephemeral
//!   port on every address, which Landlock's `BindTcp` does not see; the command would be
//!   reachable from outside. `listen` is refused (`EACCES`), for Unix sockets too (seccomp
//!   cannot tell the family of an fd).
//! - Syscalls of another ABI (`x32` on x86_64, or a foreign architecture) would dodge the
//!   syscall numbers below: the x32 range is refused and a foreign architecture kills the
//!   process.
//!
//! Classic BPF as the kernel documents it (Documentation/userspace-api/seccomp_filter.rst:
//! `struct seccomp_data` is `nr` at 0, `arch` at 4, `instruction_pointer` at 8, `args[6]` at
//! 16, 8 bytes each; the low 32 bits of an argument are at its offset on little-endian
//! machines, which x86_64 and aarch64 are). No crate for it is in the workspace; the program
//! is small, assembled with labels below, and tested against the running kernel.

use std::io;

use libc::sock_filter;

// Values from linux/audit.h: EM_X86_64 / EM_AARCH64 | __AUDIT_ARCH_64BIT | __AUDIT_ARCH_LE.
#[cfg(target_arch = "x86_64")]
const AUDIT_ARCH: u32 = 0xC000_003E;
#[cfg(target_arch = "aarch64")]
const AUDIT_ARCH: u32 = 0xC000_00B7;

/// x32 syscalls on x86_64 are numbered from here (`__X32_SYSCALL_BIT`).
#[cfg(target_arch = "x86_64")]
const X32_SYSCALL_BIT: u32 = 0x4000_0000;

const OFF_NR: u32 = 0;
const OFF_ARCH: u32 = 4;
const fn off_arg(i: u32) -> u32 {
    16 + 8 * i
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum L {
    Next,
    Allow,
    Eacces,
    Eperm,
    Kill,
    FlagsArg2,
    FlagsArg3,
    Socket,
    Inet,
}

enum Op {
    Stmt(u32, u32),
    Jump(u32, u32, L, L),
    Label(L),
}

/// The filter program, ready for `seccomp(SECCOMP_SET_MODE_FILTER)`.
#[derive(Debug, Clone)]
pub struct Filter(Vec<sock_filter>);

impl Filter {
    pub fn proxy_only() -> Filter {
        use libc::{
            BPF_ABS, BPF_ALU, BPF_AND, BPF_JEQ, BPF_JMP, BPF_JSET, BPF_K, BPF_LD, BPF_RET, BPF_W,
        };
        let ld = |off| Op::Stmt(BPF_LD | BPF_W | BPF_ABS, off);
        let jeq = |k, t, f| Op::Jump(BPF_JMP | BPF_JEQ | BPF_K, k, t, f);
        let jset = |k, t, f| Op::Jump(BPF_JMP | BPF_JSET | BPF_K, k, t, f);
        let ret = |k| Op::Stmt(BPF_RET | BPF_K, k);
        let nr = |n: libc::c_long| n as u32;
        let fastopen = libc::MSG_FASTOPEN as u32;

        let mut ops = vec![ld(OFF_ARCH), jeq(AUDIT_ARCH, L::Next, L::Kill), ld(OFF_NR)];
        #[cfg(target_arch = "x86_64")]
        ops.push(Op::Jump(
            BPF_JMP | libc::BPF_JGE | BPF_K,
            X32_SYSCALL_BIT,
            L::Eacces,
            L::Next,
        ));
        ops.extend([
            jeq(nr(libc::SYS_sendto), L::FlagsArg3, L::Next),
            jeq(nr(libc::SYS_sendmmsg), L::FlagsArg3, L::Next),
            jeq(nr(libc::SYS_sendmsg), L::FlagsArg2, L::Next),
            jeq(nr(libc::SYS_io_uring_setup), L::Eperm, L::Next),
            // listen(2) on a socket never bound autobinds it to 0.0.0.0:<ephemeral>, which
            // Landlock's BindTcp does not see: the command could be reached from outside.
            jeq(nr(libc::SYS_listen), L::Eacces, L::Next),
            jeq(nr(libc::SYS_socketpair), L::Socket, L::Next),
            jeq(nr(libc::SYS_socket), L::Socket, L::Allow),
            // sendto(fd, buf, len, flags, …), sendmmsg(fd, vec, n, flags)
            Op::Label(L::FlagsArg3),
            ld(off_arg(3)),
            jset(fastopen, L::Eacces, L::Allow),
            // sendmsg(fd, msg, flags)
            Op::Label(L::FlagsArg2),
            ld(off_arg(2)),
            jset(fastopen, L::Eacces, L::Allow),
            // socket(domain, type, protocol), socketpair(domain, type, protocol, sv): only
            // the families a proxied command needs. Anything else (vsock, SMC, RDS, TIPC,
            // packet, ...) could reach the network where Landlock's TCP rules do not look.
            Op::Label(L::Socket),
            ld(off_arg(0)),
            jeq(libc::AF_UNIX as u32, L::Allow, L::Next),
            jeq(libc::AF_NETLINK as u32, L::Allow, L::Next),
            jeq(libc::AF_INET as u32, L::Inet, L::Next),
            jeq(libc::AF_INET6 as u32, L::Inet, L::Eacces),
            Op::Label(L::Inet),
            ld(off_arg(1)),
            // The low bits are the type; SOCK_NONBLOCK and SOCK_CLOEXEC sit above them.
            Op::Stmt(BPF_ALU | BPF_AND | BPF_K, 0xf),
            jeq(libc::SOCK_STREAM as u32, L::Next, L::Eacces),
            ld(off_arg(2)),
            jeq(0, L::Allow, L::Next),
            jeq(libc::IPPROTO_TCP as u32, L::Allow, L::Eacces),
            Op::Label(L::Allow),
            ret(libc::SECCOMP_RET_ALLOW),
            Op::Label(L::Eacces),
            ret(libc::SECCOMP_RET_ERRNO | libc::EACCES as u32),
            Op::Label(L::Eperm),
            ret(libc::SECCOMP_RET_ERRNO | libc::EPERM as u32),
            Op::Label(L::Kill),
            ret(libc::SECCOMP_RET_KILL_PROCESS),
        ]);
        Filter(assemble(&ops))
    }

    /// Number of instructions.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Installs the filter on the calling thread, for good (inherited across fork and exec).
    /// Needs `no_new_privs` (Landlock's `restrict_self` sets it) or CAP_SYS_ADMIN. Makes one
    /// syscall and allocates nothing, so it may run between fork and exec.
    pub fn install(&self) -> io::Result<()> {
        let prog = libc::sock_fprog {
            len: self.0.len() as libc::c_ushort,
            filter: self.0.as_ptr().cast_mut(),
        };
        #[allow(unsafe_code)]
        // SAFETY: `prog` points at `self.0`, which outlives the call; the kernel copies the
        // program during the syscall and keeps no pointer to our memory.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_seccomp,
                libc::SECCOMP_SET_MODE_FILTER,
                0 as libc::c_uint,
                &prog as *const libc::sock_fprog,
            )
        };
        if rc == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }
}

/// Resolves labels into relative jump offsets (labels take no space).
fn assemble(ops: &[Op]) -> Vec<sock_filter> {
    let mut at = Vec::new();
    let mut n = 0usize;
    for op in ops {
        match op {
            Op::Label(l) => at.push((*l, n)),
            _ => n += 1,
        }
    }
    let target = |l: L, from: usize| -> u8 {
        if l == L::Next {
            return 0;
        }
        let (_, to) = at
            .iter()
            .find(|(x, _)| *x == l)
            .unwrap_or_else(|| unreachable!("label {l:?} is placed"));
        u8::try_from(to - (from + 1)).unwrap_or_else(|_| unreachable!("short program"))
    };
    let mut out = Vec::with_capacity(n);
    for op in ops {
        match *op {
            Op::Label(_) => {}
            Op::Stmt(code, k) => out.push(sock_filter {
                code: code as u16,
                jt: 0,
                jf: 0,
                k,
            }),
            Op::Jump(code, k, t, f) => {
                let i = out.len();
                out.push(sock_filter {
                    code: code as u16,
                    jt: target(t, i),
                    jf: target(f, i),
                    k,
                });
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jumps_go_forward_to_their_labels() {
        let f = Filter::proxy_only();
        assert!(f.len() < 64);
        // The last four instructions are the returns: allow, EACCES, EPERM, kill.
        let rets: Vec<u32> = f.0[f.len() - 4..].iter().map(|i| i.k).collect();
        assert_eq!(
            rets,
            vec![
                libc::SECCOMP_RET_ALLOW,
                libc::SECCOMP_RET_ERRNO | libc::EACCES as u32,
                libc::SECCOMP_RET_ERRNO | libc::EPERM as u32,
                libc::SECCOMP_RET_KILL_PROCESS
            ]
        );
        // Every jump lands inside the program.
        for (i, ins) in f.0.iter().enumerate() {
            if u32::from(ins.code) & 0x07 == libc::BPF_JMP {
                assert!(i + 1 + usize::from(ins.jt.max(ins.jf)) < f.len());
            }
        }
        // The first instruction loads the architecture, the second checks it.
        assert_eq!(f.0[0].k, OFF_ARCH);
        assert_eq!(f.0[1].k, AUDIT_ARCH);
    }
}
