//! `agenshield proxy run --check`: `run`'s verdict on a configuration, part by part, without
//! starting. Each part calls the function `run` calls for it, in its mode that creates
//! nothing: each listener is bound and released at once, the redirect is computed and the
//! firewall asked (not changed), and what a start creates (the vault, the CA, the audit log, a
//! fresh machine's policy directory with the shipped policy) is read if it is there, else
//! said to be created. A split daemon's worker parts are checked as the worker user, as the
//! worker reads them. One line per part (or one JSON object); exit 0 when `run` would start,
//! 2 when any part fails.

mod supervisor;
mod worker;

use std::path::Path;

use serde::Serialize;

use agenshield_proxy::config::Config;

/// One part's verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    Ok,
    /// Passes, with something to know (created at start, off, held by the running daemon).
    Note,
    Failed,
}

#[derive(Debug, Serialize)]
pub struct Part {
    pub part: &'static str,
    pub verdict: Verdict,
    pub detail: String,
}

fn part(part: &'static str, verdict: Verdict, detail: impl Into<String>) -> Part {
    Part {
        part,
        verdict,
        detail: detail.into(),
    }
}

/// The whole verdict, as `--json` prints it.
#[derive(Debug, Serialize)]
pub struct Report {
    /// `run` would start (no part failed).
    pub ok: bool,
    /// The config file read; `None`: built-in defaults.
    pub config: Option<String>,
    pub parts: Vec<Part>,
}

pub fn command(cfg: &Config, json: bool) -> u8 {
    print(&check(cfg), json)
}

fn print(report: &Report, json: bool) -> u8 {
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(report).unwrap_or_default()
        );
    } else {
        for p in &report.parts {
            let tag = match p.verdict {
                Verdict::Ok => "ok",
                Verdict::Note => "note",
                Verdict::Failed => "FAILED",
            };
            println!("{:<8} {tag:<6} {}", p.part, p.detail);
        }
        if report.ok {
            println!(
                "agenshield: the configuration is ready to run (each listener was bound and \
                 released; nothing was created or changed)"
            );
        } else {
            eprintln!("agenshield: the configuration would not start; fix the FAILED parts");
        }
    }
    if report.ok {
        0
    } else {
        2
    }
}

/// The verdict when the configuration itself does not load (`run` stops there too).
pub fn config_failed(config: Option<&Path>, message: &str, json: bool) -> u8 {
    let report = Report {
        ok: false,
        config: config
            .map(|p| std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf()))
            .map(|p| p.display().to_string()),
        parts: vec![part("config", Verdict::Failed, message)],
    };
    print(&report, json)
}

/// Every part, in the order `run` meets them.
pub fn check(cfg: &Config) -> Report {
    let mut parts = vec![part(
        "config",
        Verdict::Ok,
        match (&cfg.source, &cfg.state_dir) {
            (Some(file), _) => file.display().to_string(),
            (None, Some(dir)) => format!(
                "no config file: built-in defaults, state in {}{}",
                dir.display(),
                if dir.exists() {
                    ""
                } else {
                    " (created at start)"
                }
            ),
            (None, None) => "built-in defaults".into(),
        },
    )];
    let worker = agenshield_proxy::daemon::privsep::worker_user(cfg);
    parts.push(match &worker {
        Ok(Some(who)) => part(
            "worker",
            Verdict::Ok,
            format!("serves as {} (uid {})", who.name, who.uid),
        ),
        Ok(None) => part(
            "worker",
            Verdict::Note,
            "no privilege split (daemon.worker_user unset)",
        ),
        Err(e) => part("worker", Verdict::Failed, e.to_string()),
    });
    // What the one who starts does (a split daemon's supervisor): seed, bind, redirect.
    let seeds = agenshield_proxy::daemon::seeds_default_policy(cfg);
    let runtime = match check_runtime() {
        Ok(rt) => rt,
        Err(failed) => {
            parts.push(failed);
            return finish(cfg, parts);
        }
    };
    let running = runtime.block_on(supervisor::running_daemon(&cfg.admin));
    let (listen, bound) = runtime.block_on(supervisor::listen(cfg, running.as_ref()));
    parts.push(listen);
    parts.push(supervisor::admin(cfg, running.as_ref()));
    parts.push(supervisor::redirect(cfg, &bound));
    drop(runtime);
    // The rest as the worker of a split daemon reads it.
    if let Ok(Some(who)) = &worker {
        if let Err(e) = agenshield_pf::privsep::drop_to(who) {
            parts.push(part(
                "worker",
                Verdict::Failed,
                format!("dropping to user {}: {e}", who.name),
            ));
            return finish(cfg, parts);
        }
    }
    let runtime = match check_runtime() {
        Ok(rt) => rt,
        Err(failed) => {
            parts.push(failed);
            return finish(cfg, parts);
        }
    };
    parts.push(worker::audit(cfg));
    let vault = runtime.block_on(worker::vault(cfg));
    let policy = worker::policy(cfg, seeds);
    parts.push(match &policy {
        Ok((p, text)) => part("policy", Verdict::Ok, text.clone()).noted(p.1),
        Err(e) => part("policy", Verdict::Failed, e.clone()),
    });
    parts.push(worker::secrets(
        cfg,
        &vault,
        policy.as_ref().ok().map(|(p, _)| &p.0),
    ));
    parts.push(worker::ca(&cfg.certs));
    parts.push(runtime.block_on(worker::upstream(cfg, &bound)));
    parts.extend(worker::approvals(cfg, &vault));
    parts.push(match agenshield_proxy::daemon::build::identities(cfg) {
        Ok(ids) => part(
            "access",
            Verdict::Ok,
            format!(
                "agent uids {}; the explicit listener also admits {} user(s), {} group(s)",
                if ids.every_uid_is_agent {
                    "all (testing.every_uid_is_agent)".to_string()
                } else {
                    format!("{:?}", ids.agents)
                },
                ids.explicit_uids.len(),
                ids.explicit_gids.len()
            ),
        ),
        Err(e) => part("access", Verdict::Failed, e.to_string()),
    });
    finish(cfg, parts)
}

fn finish(cfg: &Config, parts: Vec<Part>) -> Report {
    Report {
        ok: parts.iter().all(|p| p.verdict != Verdict::Failed),
        config: cfg.source.as_ref().map(|p| p.display().to_string()),
        parts,
    }
}

impl Part {
    /// A passing part with something to know becomes a note.
    fn noted(mut self, note: bool) -> Part {
        if note && self.verdict == Verdict::Ok {
            self.verdict = Verdict::Note;
        }
        self
    }
}

/// Whether `path` exists or this user could create it: the nearest directory above it that
/// exists must let this user add entries.
fn creatable(path: &Path) -> Result<(), String> {
    let mut at = Some(path);
    while let Some(p) = at.filter(|p| !p.exists()) {
        at = p.parent();
    }
    let Some(existing) = at else { return Ok(()) };
    if existing == path {
        return Ok(());
    }
    nix::unistd::access(
        existing,
        nix::unistd::AccessFlags::W_OK | nix::unistd::AccessFlags::X_OK,
    )
    .map_err(|e| format!("cannot be created in {}: {e}", existing.display()))
}

/// A current-thread runtime for the checks that do I/O (one before the privilege drop, one
/// after it: no runtime thread may outlive the drop), or the part that says why not.
fn check_runtime() -> Result<tokio::runtime::Runtime, Part> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| part("runtime", Verdict::Failed, e.to_string()))
}
