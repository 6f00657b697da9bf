//! `agenshield proxy firewall up|down|status`: the redirect rules by hand, outside the daemon;
//! `firewall resolvers`: the local resolvers' sockets closed to the agent users
//! ([`crate::cmd::install::resolvers`]).

use crate::cli::FirewallAction;
use crate::cmd::ctl::output::{self, ErrorCode};
use agenshield_proxy::config::Config;
use agenshield_proxy::daemon::firewall::{report, spec};

/// The config did not load: said on stderr and, with `--json`, as JSON on stdout (exit 2).
pub fn config_error(message: &str, json: bool) -> u8 {
    output::set_json(json);
    output::error(ErrorCode::BadInput, message)
}

/// `agenshield proxy firewall ACTION`: prints the outcome, returns the exit code. Failures go
/// to stderr and, with `--json`, to stdout as `{"ok": false, "error": {"code", "message"}}`.
pub fn command(cfg: &Config, action: crate::cli::FirewallAction, json: bool) -> u8 {
    output::set_json(json);
    let backend = agenshield_pf::platform_redirector();
    let spec = || {
        spec(cfg, &cfg.transparent, &cfg.dns)
            .map_err(|e| output::error(ErrorCode::BadInput, &format!("firewall: {e}")))
    };
    let outcome = match action {
        // Removing needs no spec: whatever we own goes.
        FirewallAction::Down => backend.remove().map(|removed| {
            let verb = if removed {
                "removed"
            } else {
                "was not in place"
            };
            format!("firewall: {} {verb}", backend.describe())
        }),
        FirewallAction::Up => {
            let spec = match spec() {
                Ok(s) => s,
                Err(code) => return code,
            };
            backend.apply(&spec).map(|()| {
                format!(
                    "firewall: {} installed for uids {:?}",
                    backend.describe(),
                    spec.agent_uids
                )
            })
        }
        FirewallAction::Resolvers { open, sockets } => return resolvers(cfg, open, sockets, json),
        FirewallAction::Status => {
            if let Some(why) = not_installed(cfg, backend.as_ref()) {
                let next = format!(
                    "`sudo {} proxy install` sets it up",
                    crate::cmd::invocation::for_root()
                );
                if json {
                    println!(
                        "{}",
                        serde_json::json!({ "installed": false, "in_place": false,
                            "message": why, "next": next })
                    );
                } else {
                    println!("firewall: AgenShield is not installed here: {why}; {next}");
                }
                return NOT_INSTALLED;
            }
            let spec = match spec() {
                Ok(s) => s,
                Err(code) => return code,
            };
            match backend.status(&spec) {
                Ok(st) => {
                    let r = report(backend.as_ref(), &spec, &st);
                    if json {
                        println!("{}", serde_json::to_string_pretty(&r).unwrap_or_default());
                    } else {
                        println!("{r}");
                    }
                    return if r.matches_config { 0 } else { 1 };
                }
                Err(e) => Err(e),
            }
        }
    };
    finish(outcome, json)
}

/// `firewall status`'s exit code when AgenShield is not installed (documented in `--help`).
pub const NOT_INSTALLED: u8 = 3;

/// Why this machine has no redirect to report on, if it has none: the agent user the config
/// names does not exist and none of our rules are in place.
fn not_installed(cfg: &Config, backend: &dyn agenshield_pf::Redirector) -> Option<String> {
    let missing = match agenshield_proxy::daemon::firewall::resolve_uids(&cfg.redirect.agent_users)
    {
        Err(agenshield_proxy::daemon::firewall::FirewallError::NoSuchUser(name)) => name,
        _ => return None,
    };
    let probe = agenshield_proxy::daemon::firewall::presence_probe();
    match backend.status(&probe) {
        Ok(st) if st.state == agenshield_pf::FirewallState::Absent => Some(format!(
            "no agent user {missing} and no {} in place",
            backend.describe()
        )),
        _ => None,
    }
}

fn finish(outcome: Result<String, agenshield_pf::RedirectError>, json: bool) -> u8 {
    match outcome {
        Ok(msg) if json => {
            println!("{}", serde_json::json!({ "ok": true, "message": msg }));
            0
        }
        Ok(msg) => {
            println!("{msg}");
            0
        }
        Err(e) => output::error(ErrorCode::Failed, &format!("firewall: {e}")),
    }
}

/// `firewall resolvers [--open] [--socket PATH]…`: one line per socket; exit 1 if any could not
/// be set.
fn resolvers(cfg: &Config, open: bool, sockets: Vec<std::path::PathBuf>, json: bool) -> u8 {
    use crate::cmd::install::resolvers::{apply, socket_paths, Outcome};
    let uids = match agenshield_proxy::daemon::firewall::resolve_uids(&cfg.redirect.agent_users) {
        Ok(u) => u,
        Err(e) => return output::error(ErrorCode::BadInput, &format!("firewall resolvers: {e}")),
    };
    let paths = if sockets.is_empty() {
        socket_paths()
    } else {
        sockets
    };
    let verb = if open { "reopened" } else { "closed" };
    let mut failed = false;
    let mut rows = Vec::new();
    for (path, outcome) in apply(&paths, &uids, open) {
        let said = match &outcome {
            Outcome::Absent => "not there (its service is not running)".to_string(),
            Outcome::Changed => format!("{verb} to uids {uids:?}"),
            Outcome::Already => format!("already {verb} to uids {uids:?}"),
            Outcome::Failed(e) => {
                failed = true;
                format!("FAILED: {e}")
            }
        };
        rows.push(serde_json::json!({ "socket": path, "result": said }));
        if !json {
            println!("{}: {said}", path.display());
        }
    }
    if json {
        println!("{}", serde_json::json!({ "ok": !failed, "sockets": rows }));
    }
    u8::from(failed)
}
