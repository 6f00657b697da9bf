//! No sandbox on other systems: `exec` refuses to run the command (fail closed).

use std::ffi::{OsStr, OsString};
use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;

use super::ExecError;
use agenshield_proxy::config::Config;

pub(super) struct Sandbox;

impl Sandbox {
    pub(super) fn prepare(_cfg: &Config, _proxy: SocketAddr) -> Result<Sandbox, ExecError> {
        Err(ExecError::Setup(
            "no sandbox for this operating system; not running the command unsandboxed".into(),
        ))
    }

    pub(super) fn command(&self, resolved: &Path, _program: &OsStr, args: &[OsString]) -> Command {
        let mut cmd = Command::new(resolved);
        cmd.args(args);
        cmd
    }

    pub(super) fn enter(self) -> Result<(), ExecError> {
        Ok(())
    }
}
