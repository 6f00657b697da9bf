//! The `exec` sandbox on Linux: Landlock (TCP connect to the proxy's port only, no bind) and
//! the seccomp filter, applied to this thread before the exec.

use std::ffi::{OsStr, OsString};
use std::net::SocketAddr;
use std::os::unix::process::CommandExt as _;
use std::path::Path;
use std::process::Command;

use super::ExecError;
use agenshield_proxy::config::Config;

pub(super) struct Sandbox(agenshield_pf::sandbox::landlock::ProxyOnly);

impl Sandbox {
    pub(super) fn prepare(_cfg: &Config, proxy: SocketAddr) -> Result<Sandbox, ExecError> {
        use agenshield_pf::sandbox::landlock::ProxyOnly;
        ProxyOnly::new(proxy.port())
            .map(Sandbox)
            .map_err(|e| ExecError::Setup(format!("{e}; not running the command unsandboxed")))
    }

    pub(super) fn command(&self, resolved: &Path, program: &OsStr, args: &[OsString]) -> Command {
        let mut cmd = Command::new(resolved);
        cmd.arg0(program).args(args);
        cmd
    }

    /// Restricts this thread; the exec that follows keeps the restriction.
    pub(super) fn enter(self) -> Result<(), ExecError> {
        self.0
            .restrict_current_thread()
            .map_err(|e| ExecError::Setup(format!("{e}; not running the command unsandboxed")))
    }
}
