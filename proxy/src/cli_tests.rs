//! Every command's `--help` as a newcomer meets it: each command has examples, each argument
//! says what it is, test-only flags are hidden, and `--version` works everywhere.

use clap::{CommandFactory, Parser};

use super::Cli;

fn walk(cmd: &clap::Command, path: &str, out: &mut Vec<String>) {
    let name = format!("{path} {}", cmd.get_name()).trim().to_string();
    if cmd
        .get_after_help()
        .is_none_or(|h| !h.to_string().contains("Example"))
    {
        out.push(format!("{name}: no examples"));
    }
    if cmd.get_about().is_none() && path.contains(' ') {
        out.push(format!("{name}: no description"));
    }
    for arg in cmd.get_arguments() {
        let id = arg.get_id().as_str();
        if arg.is_hide_set() || ["help", "version"].contains(&id) {
            continue;
        }
        if arg.get_help().is_none() && arg.get_long_help().is_none() {
            out.push(format!("{name}: argument {id} has no description"));
        }
    }
    for sub in cmd.get_subcommands() {
        if sub.get_name() == "help" {
            continue;
        }
        walk(sub, &name, out);
    }
}

#[test]
fn every_command_has_examples_and_every_argument_a_description() {
    let cmd = Cli::command();
    cmd.clone().debug_assert();
    let mut missing = Vec::new();
    walk(&cmd, "", &mut missing);
    assert!(missing.is_empty(), "{}", missing.join("\n"));
}

#[test]
fn test_only_flags_are_hidden_and_version_is_everywhere() {
    let cmd = Cli::command();
    let run = cmd
        .find_subcommand("proxy")
        .and_then(|p| p.find_subcommand("run"))
        .expect("proxy run");
    for id in ["orig_dst_override", "worker"] {
        let arg = run
            .get_arguments()
            .find(|a| a.get_id() == id)
            .unwrap_or_else(|| panic!("{id}"));
        assert!(
            arg.is_hide_set(),
            "{id} is for tests and the supervisor only"
        );
    }
    for argv in [
        &["agenshield", "--version"][..],
        &["agenshield", "proxy", "--version"],
        &["agenshield", "proxy", "ctl", "--version"],
    ] {
        let e = Cli::try_parse_from(argv).expect_err("prints the version");
        assert_eq!(e.kind(), clap::error::ErrorKind::DisplayVersion, "{argv:?}");
    }
}

/// Issue 34: `run --help` named the transparent and explicit listeners only.
#[test]
fn run_help_names_every_listener() {
    let cmd = Cli::command();
    let run = cmd
        .find_subcommand("proxy")
        .and_then(|p| p.find_subcommand("run"))
        .expect("proxy run");
    let help = run
        .get_long_about()
        .map(ToString::to_string)
        .unwrap_or_default();
    for listener in ["15001", "15080", "15053", "15090", "admin socket"] {
        assert!(help.contains(listener), "{listener} missing from:\n{help}");
    }
}
