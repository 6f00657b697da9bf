//! `agenshield proxy firewall up|down|status`: the redirect rules by hand, outside the daemon.

use crate::cli::FirewallAction;
use crate::config::Config;
use crate::daemon::firewall::{report, spec};

/// `agenshield proxy firewall ACTION`: prints the outcome, returns the exit code.
pub fn command(cfg: &Config, action: crate::cli::FirewallAction, json: bool) -> u8 {
    let backend = agenshield_pf::platform_redirector();
    let spec = || {
        spec(cfg, &cfg.transparent, &cfg.dns).map_err(|e| {
            eprintln!("agenshield: firewall: {e}");
        })
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
            let Ok(spec) = spec() else { return 2 };
            backend.apply(&spec).map(|()| {
                format!(
                    "firewall: {} installed for uids {:?}",
                    backend.describe(),
                    spec.agent_uids
                )
            })
        }
        FirewallAction::Status => {
            let Ok(spec) = spec() else { return 2 };
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
        Err(e) => {
            eprintln!("agenshield: firewall: {e}");
            1
        }
    }
}
