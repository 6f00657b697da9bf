//! `agenshield proxy install` / `uninstall`: the plan of steps for this platform, printed
//! with `--dry-run`, carried out otherwise.

use crate::cli::InstallArgs;

/// Installs or uninstalls; the exit code to leave with.
pub fn command(_args: &InstallArgs, _uninstall: bool) -> u8 {
    eprintln!("agenshield: proxy install is being built (issue 7)");
    1
}
