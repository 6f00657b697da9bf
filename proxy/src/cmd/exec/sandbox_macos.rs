//! The `exec` sandbox on macOS: `sandbox-exec -p PROFILE` with the Seatbelt exec profile.

use std::ffi::{OsStr, OsString};
use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;

use super::{protected_paths, ExecError};
use agenshield_proxy::config::Config;

pub(super) struct Sandbox(String);

impl Sandbox {
    const SANDBOX_EXEC: &'static str = "/usr/bin/sandbox-exec";

    pub(super) fn prepare(cfg: &Config, proxy: SocketAddr) -> Result<Sandbox, ExecError> {
        if !Path::new(Self::SANDBOX_EXEC).exists() {
            return Err(ExecError::Setup(format!(
                "{} is missing; not running the command unsandboxed",
                Self::SANDBOX_EXEC
            )));
        }
        agenshield_pf::sandbox::seatbelt::exec_profile(&protected_paths(cfg), proxy)
            .map(Sandbox)
            .map_err(|e| ExecError::Setup(format!("building the Seatbelt profile: {e}")))
    }

    /// `sandbox-exec -p PROFILE /abs/program ARGS…`: sandbox-exec applies the profile to
    /// itself, then executes the program.
    pub(super) fn command(&self, resolved: &Path, _program: &OsStr, args: &[OsString]) -> Command {
        let mut cmd = Command::new(Self::SANDBOX_EXEC);
        cmd.arg("-p").arg(&self.0).arg(resolved).args(args);
        cmd
    }

    pub(super) fn enter(self) -> Result<(), ExecError> {
        Ok(())
    }
}
