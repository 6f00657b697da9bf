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
    // An example line wider than an 80-column terminal is wrapped by clap mid-command, and
    // copying it then fails: longer commands continue on the next line after a `\`.
    for line in cmd
        .get_after_help()
        .map(|h| h.to_string())
        .unwrap_or_default()
        .lines()
    {
        if line.chars().count() > 78 {
            out.push(format!("{name}: example line over 78 columns: {line}"));
        }
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

#[test]
fn since_takes_a_duration_and_says_which_forms_when_given_another() {
    let parse = |since: &str| {
        Cli::try_parse_from([
            "agenshield",
            "proxy",
            "ctl",
            "policy",
            "suggest",
            "--since",
            since,
        ])
    };
    assert!(parse("1d12h").is_ok());
    let err = parse("yesterday").expect_err("not a duration").to_string();
    assert!(
        err.contains("\"yesterday\" is not a duration back from now")
            && err.contains("--since 1d")
            && err.contains("--since 30m"),
        "{err}"
    );
}

#[test]
fn pending_examples_use_ids_as_the_daemon_gives_them() {
    let cmd = Cli::command();
    let pending = cmd
        .find_subcommand("proxy")
        .and_then(|c| c.find_subcommand("ctl"))
        .and_then(|c| c.find_subcommand("pending"))
        .expect("ctl pending");
    for sub in pending.get_subcommands().chain([pending]) {
        let help = sub
            .get_after_help()
            .map(|h| h.to_string())
            .unwrap_or_default();
        for id in help
            .split_whitespace()
            .skip_while(|w| *w != "approve" && *w != "deny")
            .skip(1)
            .take(1)
        {
            assert!(
                id.starts_with('p') && id[1..].chars().all(|c| c.is_ascii_digit()),
                "{}: {help}",
                sub.get_name()
            );
        }
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

/// `ctl --remote URL --cert --key [--ca] SUBCOMMAND`: the flags go before the subcommand (the
/// `audit verify --key` of a subcommand stays its own), and need `--remote`.
#[test]
fn ctl_remote_takes_a_client_certificate_before_the_subcommand() {
    let ok = Cli::try_parse_from([
        "agenshield",
        "proxy",
        "ctl",
        "--remote",
        "https://proxy-host:15443",
        "--cert",
        "alice.pem",
        "--key",
        "alice-key.pem",
        "--ca",
        "admin-ca.pem",
        "pending",
        "approve",
        "p3",
    ]);
    assert!(ok.is_ok(), "{:?}", ok.err());
    let audit = Cli::try_parse_from([
        "agenshield",
        "proxy",
        "ctl",
        "audit",
        "verify",
        "--checkpoints",
        "--key",
        "host.pub",
    ]);
    assert!(audit.is_ok(), "{:?}", audit.err());
    for argv in [
        &["agenshield", "proxy", "ctl", "--cert", "a.pem", "status"][..],
        &[
            "agenshield",
            "proxy",
            "ctl",
            "--remote",
            "https://h:1",
            "--socket",
            "/s",
            "status",
        ],
    ] {
        assert!(Cli::try_parse_from(argv).is_err(), "{argv:?}");
    }
}
