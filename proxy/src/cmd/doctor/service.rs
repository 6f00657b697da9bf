//! The firewall redirect and the daemon: whether the agent's traffic reaches the proxy, and
//! whether the proxy is there to take it.

use std::time::Duration;

use super::finding::{Area, Finding};
use crate::cmd::ctl::client::{Client, CtlError};
use crate::cmd::install::layout::{
    Platform, LAUNCHD_LABEL, SYSTEMD_RUNNING_MARKER, SYSTEMD_UNIT_NAME,
};
use agenshield_proxy::config::Config;
use agenshield_proxy::daemon::firewall::{report, spec};

/// The daemon's `/v1/status`, or why there is none.
pub type DaemonStatus = Result<serde_json::Value, CtlError>;

/// Asks the daemon for its status (bounded: a wedged daemon must not hang doctor).
pub fn daemon_status(cfg: &Config) -> DaemonStatus {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| CtlError::Protocol(e.to_string()))?;
    let client = Client::new(&cfg.admin);
    rt.block_on(async {
        match tokio::time::timeout(
            Duration::from_secs(10),
            client.json(http::Method::GET, "/v1/status", None),
        )
        .await
        {
            Ok(r) => r,
            Err(_) => Err(CtlError::Protocol(format!(
                "{} did not answer within 10s",
                cfg.admin.display()
            ))),
        }
    })
}

fn start_fix() -> String {
    match Platform::current() {
        Platform::MacOs => format!("`sudo launchctl kickstart -k system/{LAUNCHD_LABEL}`"),
        Platform::Linux if std::path::Path::new(SYSTEMD_RUNNING_MARKER).exists() => format!(
            "`sudo systemctl start {SYSTEMD_UNIT_NAME}` (`journalctl -u {SYSTEMD_UNIT_NAME}` \
             says why it stopped)"
        ),
        Platform::Linux => "start it: `sudo agenshield proxy run` (with --config for an \
                            installed daemon: /opt/agenshield/config/proxy.toml)"
            .into(),
    }
}

/// The daemon: running, its audit log taking records, its policy loaded.
pub fn daemon(cfg: &Config, status: &DaemonStatus) -> Finding {
    let subject = cfg.admin.display().to_string();
    let v = match status {
        Ok(v) => v,
        Err(CtlError::NotRunning(_)) => {
            return Finding::fail(
                Area::Daemon,
                subject,
                "not running: with the redirect in place the agent's connections are refused \
                 (fail closed)",
                start_fix(),
            )
        }
        Err(CtlError::NoAccess(_)) => {
            return Finding::skipped(
                Area::Daemon,
                subject,
                "the admin socket is for root and agenshield-admin only",
            )
        }
        Err(e) => {
            return Finding::fail(Area::Daemon, subject, e.to_string(), start_fix());
        }
    };
    let s = |v: &serde_json::Value| v.as_str().unwrap_or("-").to_string();
    let summary = format!(
        "agenshield {} pid {}, up {}s, policy {}",
        s(&v["version"]),
        v["pid"],
        v["uptime_secs"],
        s(&v["policy"]["hash"])
    );
    if v["audit"]["ready"] == false {
        return Finding::fail(
            Area::Daemon,
            subject,
            format!(
                "{summary}; the audit log cannot take records, so requests are refused: {}",
                s(&v["audit"]["problem"])
            ),
            "free space or fix the permissions of the audit log's directory (the daemon \
             retries by itself)",
        );
    }
    if let Some(e) = v["policy"]["last_error"].as_object() {
        return Finding::warn(
            Area::Daemon,
            subject,
            format!(
                "{summary}; the last policy reload FAILED (the previous policy is in force): {}",
                e.get("message").map(s).unwrap_or_default()
            ),
            Some("`agenshield proxy ctl policy lint` names the error; fix it and save".into()),
        );
    }
    Finding::ok(Area::Daemon, subject, summary)
}

/// The redirect: in place and matching the config (asked of the firewall as root, else of
/// the daemon).
pub fn firewall(cfg: &Config, status: &DaemonStatus) -> Finding {
    let subject = "redirect";
    if !cfg.redirect.enabled {
        return Finding::warn(
            Area::Firewall,
            subject,
            format!(
                "redirect.enabled = false in {}: the agent's traffic is not redirected (only \
                 `agenshield proxy exec` goes through the proxy)",
                cfg.source
                    .as_deref()
                    .map_or("the built-in defaults".into(), |p| p.display().to_string())
            ),
            Some("set [redirect] enabled = true and restart the daemon".into()),
        );
    }
    let fix = "`sudo agenshield proxy firewall up` (the daemon also puts it back when it \
               starts and every reconcile_interval)";
    if nix::unistd::geteuid().is_root() {
        let backend = agenshield_pf::platform_redirector();
        let spec = match spec(cfg, &cfg.transparent, &cfg.dns) {
            Ok(s) => s,
            Err(e) => {
                return Finding::fail(Area::Firewall, subject, e.to_string(), "fix the config")
            }
        };
        return match backend.status(&spec) {
            Ok(st) => {
                let r = report(backend.as_ref(), &spec, &st);
                if r.matches_config {
                    Finding::ok(
                        Area::Firewall,
                        subject,
                        format!("{} in place for uids {:?}", r.backend, r.agent_uids),
                    )
                } else if r.in_place {
                    Finding::fail(
                        Area::Firewall,
                        subject,
                        format!(
                            "{} is in place but differs from the config (uids {:?}, configured {:?})",
                            r.backend, r.agent_uids, r.configured_uids
                        ),
                        fix,
                    )
                } else {
                    Finding::fail(
                        Area::Firewall,
                        subject,
                        format!(
                            "{} is not in place: the agent's traffic goes out directly, unchecked",
                            r.backend
                        ),
                        fix,
                    )
                }
            }
            Err(e) => Finding::fail(Area::Firewall, subject, e.to_string(), fix),
        };
    }
    match status {
        Ok(v) => {
            let fw = &v["firewall"];
            let state = fw["state"].as_str().unwrap_or("unknown");
            if matches!(state, "matches" | "restored") {
                Finding::ok(
                    Area::Firewall,
                    subject,
                    format!(
                        "in place for uids {} (as the daemon reports)",
                        fw["agent_uids"]
                    ),
                )
            } else {
                Finding::fail(
                    Area::Firewall,
                    subject,
                    format!("{state} (as the daemon reports)"),
                    fix,
                )
            }
        }
        Err(_) => Finding::skipped(
            Area::Firewall,
            subject,
            "reading the rules needs root, and the daemon did not answer",
        ),
    }
}
