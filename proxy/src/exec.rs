//! `agenshield proxy exec -- CMD`: run a command through the explicit listener, sandboxed.

use std::ffi::OsString;

use crate::config::Config;

/// Runs the command; the exit code to leave with.
pub fn command(_cfg: &Config, _command: Vec<OsString>) -> u8 {
    eprintln!("agenshield: proxy exec is being built (issue 7)");
    1
}
