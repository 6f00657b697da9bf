//! `agenshield proxy completions SHELL` and `agenshield proxy man`: generated from the same
//! clap definitions as the commands themselves, so they cannot drift from them.

use std::io::Write as _;
use std::path::Path;

use clap::CommandFactory;

use crate::cli::Cli;

/// Completions for `shell` on stdout.
pub fn completions(shell: clap_complete::Shell) -> u8 {
    let mut cmd = Cli::command();
    let mut out = Vec::new();
    clap_complete::generate(shell, &mut cmd, "agenshield", &mut out);
    write_out(&out)
}

/// The top page on stdout, or every page into `dir`.
pub fn man(dir: Option<&Path>) -> u8 {
    let cmd = Cli::command();
    match dir {
        Some(d) => match clap_mangen::generate_to(cmd, d) {
            Ok(()) => {
                eprintln!("agenshield: manual pages written to {}", d.display());
                0
            }
            Err(e) => {
                eprintln!("agenshield: writing manual pages to {}: {e}", d.display());
                1
            }
        },
        None => {
            let mut out = Vec::new();
            if let Err(e) = clap_mangen::Man::new(cmd).render(&mut out) {
                eprintln!("agenshield: rendering the manual page: {e}");
                return 1;
            }
            write_out(&out)
        }
    }
}

/// Writes to stdout; a reader that went away is not an error.
fn write_out(bytes: &[u8]) -> u8 {
    let mut o = std::io::stdout().lock();
    let _ = o.write_all(bytes).and_then(|()| o.flush());
    0
}
