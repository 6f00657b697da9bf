//! Landlock (Linux) for `agenshield proxy exec`: the command may open TCP connections to the
//! proxy's port and nowhere else, and may not bind TCP sockets.
//!
//! Built on the `landlock` crate: a ruleset that handles `AccessNet::ConnectTcp` and
//! `AccessNet::BindTcp` (Landlock ABI 4, Linux 6.7) with one `NetPort` rule allowing connect
//! to the proxy's port; binding gets no rule, so every TCP `bind()` is refused. On ABI 6
//! (Linux 6.12) and later the ruleset is also scoped: no signals to processes outside the
//! sandbox (the daemon, the operator's shell) and no connecting to abstract Unix sockets
//! created outside it.
//!
//! What Landlock cannot do, and what holds instead:
//! - Network rules are by port only, for every address: the command can reach the proxy's
//!   port on any host, not only the proxy.
//! - It governs TCP `connect()` and `bind()` only (ABI 4 to 7), and a TCP Fast Open send
//!   connects without `connect()`, unchecked. A seccomp filter installed with the ruleset
//!   ([`super::seccomp`]) refuses fast-open sends, io_uring, and every `AF_INET`/`AF_INET6`
//!   socket that is not TCP (UDP with QUIC and DNS, SCTP, MPTCP, raw) as well as packet
//!   sockets. Pathname Unix sockets stay open (neither mechanism can name them by path):
//!   the admin socket refuses agent uids by peer credentials.
//! - It only ever allows: a ruleset lists what may be accessed beneath a path, and cannot say
//!   "everything but the CA key". So the file backstop on Linux is Unix permissions: the CA
//!   key, the vault and the config belong to root or the proxy user with modes 0600/0700, and
//!   the agent user cannot read them. Run `exec` as the agent user for that to hold; a
//!   command run by the operator can read whatever the operator can.
//!
//! Fail closed: on a kernel without ABI 4 (or an architecture the seccomp filter is not
//! written for), [`ProxyOnly::new`] is an error, never a weaker sandbox. `restrict_self` also sets `no_new_privs`, so set-uid programs do not gain
//! privileges inside the sandbox.
//!
//! Landlock and seccomp restrict the calling thread and what it starts afterwards. Two ways
//! to apply them:
//! [`ProxyOnly::restrict_current_thread`] right before `exec` (what `agenshield proxy exec`
//! does: the exec'd program keeps the restriction), or [`ProxyOnly::apply_to`] for a
//! `Command` spawned by a multithreaded parent (the ruleset and the filter are built before
//! the fork; the child only makes the syscalls that apply them).

use std::io;
use std::os::unix::process::CommandExt as _;
use std::process::Command;

#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
use super::seccomp::Filter;
use landlock::{
    AccessNet, CompatLevel, Compatible, NetPort, RestrictionStatus, Ruleset, RulesetAttr,
    RulesetCreated, RulesetCreatedAttr, RulesetStatus, Scope,
};

/// The Landlock ABI network rules need (Linux 6.7).
pub const NET_ABI: i32 = 4;
/// The ABI that added scopes (signals, abstract Unix sockets; Linux 6.12).
pub const SCOPE_ABI: i32 = 6;

/// Why the sandbox could not be set up. Every variant means: do not run the command.
#[derive(Debug, thiserror::Error)]
pub enum LandlockError {
    #[error(
        "this kernel has no Landlock network rules (Landlock ABI {NET_ABI}, Linux 6.7 or \
         later, is needed; {found}), so the command cannot be confined to the proxy"
    )]
    Unsupported { found: String },
    #[error("setting up the Landlock sandbox failed: {0}")]
    Ruleset(#[from] landlock::RulesetError),
    #[error("the Landlock sandbox was not fully enforced ({0:?})")]
    NotEnforced(RestrictionStatus),
    #[error("installing the seccomp filter failed: {0}")]
    Seccomp(io::Error),
    #[error("the sandbox's seccomp filter is written for x86_64 and aarch64 only")]
    UnsupportedArch,
}

/// What the running kernel offers: `Ok(abi)` (1, 2, …) or why there is no Landlock.
pub fn kernel_abi() -> Result<i32, String> {
    // landlock_create_ruleset(NULL, 0, LANDLOCK_CREATE_RULESET_VERSION) returns the highest
    // ABI the kernel supports (Documentation/userspace-api/landlock.rst, "Landlock ABI
    // versions"); the crate keeps its own probe private.
    const LANDLOCK_CREATE_RULESET_VERSION: libc::c_uint = 1;
    #[allow(unsafe_code)]
    // SAFETY: with a null attribute pointer and size 0 the kernel reads no memory; the call
    // only returns a number (or -1 with errno).
    let v = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    if v >= 0 {
        return i32::try_from(v).map_err(|_| format!("the kernel reported Landlock ABI {v}"));
    }
    match io::Error::last_os_error().raw_os_error() {
        Some(libc::EOPNOTSUPP) => Err(
            "Landlock is built into this kernel but not enabled (add it to the lsm= boot \
             parameter)"
                .into(),
        ),
        Some(libc::ENOSYS) => Err("this kernel has no Landlock".into()),
        _ => Err(format!(
            "probing Landlock failed: {}",
            io::Error::last_os_error()
        )),
    }
}

/// A prepared sandbox: TCP connect to `port` only, no TCP bind. Built (the ruleset file
/// descriptor created and filled) before anything is restricted.
#[derive(Debug)]
pub struct ProxyOnly {
    ruleset: RulesetCreated,
    filter: Filter,
    port: u16,
    scoped: bool,
}

impl ProxyOnly {
    /// Builds the ruleset; an error when the kernel lacks Landlock ABI 4.
    pub fn new(port: u16) -> Result<ProxyOnly, LandlockError> {
        let abi = kernel_abi().map_err(|found| LandlockError::Unsupported { found })?;
        if abi < NET_ABI {
            return Err(LandlockError::Unsupported {
                found: format!("this one has ABI {abi}"),
            });
        }
        let scoped = abi >= SCOPE_ABI;
        // HardRequirement: a feature the kernel lacks is an error, never silently dropped.
        let mut ruleset = Ruleset::default()
            .set_compatibility(CompatLevel::HardRequirement)
            .handle_access(AccessNet::ConnectTcp | AccessNet::BindTcp)?;
        if scoped {
            ruleset = ruleset.scope(Scope::AbstractUnixSocket | Scope::Signal)?;
        }
        let ruleset = ruleset
            .create()?
            .add_rule(NetPort::new(port, AccessNet::ConnectTcp))?;
        Ok(ProxyOnly {
            ruleset,
            filter: filter()?,
            port,
            scoped,
        })
    }

    /// The port the command may connect to.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Whether signals and abstract Unix sockets are scoped too (ABI 6 and later).
    pub fn scoped(&self) -> bool {
        self.scoped
    }

    /// Restricts the calling thread, for good, and everything it starts or `exec`s from now
    /// on. Other threads of the process are not restricted (they end at `exec`).
    pub fn restrict_current_thread(self) -> Result<(), LandlockError> {
        let status = self.ruleset.restrict_self()?;
        if status.ruleset != RulesetStatus::FullyEnforced || !status.no_new_privs {
            return Err(LandlockError::NotEnforced(status));
        }
        self.filter.install().map_err(LandlockError::Seccomp)
    }

    /// Makes `cmd` restrict itself in the child, after the fork and before the program is
    /// executed. When that fails the spawn (or `exec`) fails with the error, and the program
    /// never runs.
    pub fn apply_to(self, cmd: &mut Command) {
        let mut ruleset = Some(self.ruleset);
        let filter = self.filter;
        let hook = move || -> io::Result<()> {
            // Only syscalls and no allocation on the success path: this runs between fork and
            // exec, where another thread of the parent may have held the allocator's lock.
            let Some(ruleset) = ruleset.take() else {
                return Err(io::Error::from_raw_os_error(libc::EINVAL));
            };
            match ruleset.restrict_self() {
                Ok(s) if s.ruleset == RulesetStatus::FullyEnforced && s.no_new_privs => {
                    filter.install()
                }
                Ok(_) => Err(io::Error::from_raw_os_error(libc::EPERM)),
                Err(_) => Err(io::Error::last_os_error()),
            }
        };
        #[allow(unsafe_code)]
        // SAFETY: the hook runs in the forked child before exec. It makes three syscalls
        // (prctl(PR_SET_NO_NEW_PRIVS), landlock_restrict_self, seccomp) and closes the ruleset's
        // descriptor; it takes no lock and allocates nothing unless restrict_self fails, and
        // then only the error path of a child that is about to report failure and exit.
        unsafe {
            cmd.pre_exec(hook);
        }
    }
}

#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
fn filter() -> Result<Filter, LandlockError> {
    Ok(Filter::proxy_only())
}

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
fn filter() -> Result<Filter, LandlockError> {
    Err(LandlockError::UnsupportedArch)
}

/// Stands in on architectures the filter is not written for; never built.
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
#[derive(Debug)]
struct Filter;

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
impl Filter {
    fn install(&self) -> io::Result<()> {
        Err(io::Error::from_raw_os_error(libc::ENOSYS))
    }
}
