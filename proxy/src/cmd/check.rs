//! `agenshield proxy run --check`: `run`'s verdict on a configuration, part by part, without
//! starting. Each part calls the function `run` calls for it, in its mode that creates
//! nothing: each listener is bound and released at once, the redirect is computed and the
//! firewall asked (not changed), and what a start creates (the vault, the CA, the audit log, a
//! fresh machine's policy directory with the shipped policy) is read if it is there, else
//! said to be created. A split daemon's worker parts are checked as the worker user, as the
//! worker reads them. One line per part (or one JSON object); exit 0 when `run` would start,
//! 2 when any part fails.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use serde::Serialize;

use crate::config::Config;
use crate::daemon::build;
use crate::daemon::listeners::{self, Role};
use crate::policy::Policy;

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
    let worker = crate::daemon::privsep::worker_user(cfg);
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
    let seeds = crate::daemon::seeds_default_policy(cfg);
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            parts.push(part("runtime", Verdict::Failed, e.to_string()));
            return finish(cfg, parts);
        }
    };
    let running = runtime.block_on(running_daemon(&cfg.admin));
    let (listen, bound) = runtime.block_on(listen(cfg, running.as_ref()));
    parts.push(listen);
    parts.push(admin(cfg, running.as_ref()));
    parts.push(redirect(cfg, &bound));
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
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            parts.push(part("runtime", Verdict::Failed, e.to_string()));
            return finish(cfg, parts);
        }
    };
    parts.push(audit(cfg));
    let vault = runtime.block_on(vault(cfg));
    let policy = policy(cfg, seeds);
    parts.push(match &policy {
        Ok((p, text)) => part("policy", Verdict::Ok, text.clone()).noted(p.1),
        Err(e) => part("policy", Verdict::Failed, e.clone()),
    });
    parts.push(secrets(
        cfg,
        &vault,
        policy.as_ref().ok().map(|(p, _)| &p.0),
    ));
    parts.push(ca(&cfg.certs));
    parts.push(runtime.block_on(upstream(cfg, &bound)));
    parts.push(match build::identities(cfg) {
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

/// The daemon serving the admin socket now, and the addresses it listens on.
struct Running {
    pid: u64,
    addrs: Vec<SocketAddr>,
}

async fn running_daemon(socket: &Path) -> Option<Running> {
    if !crate::control::admin::served(socket).await {
        return None;
    }
    let client = crate::cmd::ctl::client::Client::new(socket);
    let v = client
        .json(http::Method::GET, "/v1/status", None)
        .await
        .ok()?;
    let l = &v["listeners"];
    let mut addrs: Vec<SocketAddr> = Vec::new();
    for list in [&l["transparent"], &l["dns"]] {
        addrs.extend(
            list.as_array()
                .into_iter()
                .flatten()
                .filter_map(|a| a.as_str()?.parse::<SocketAddr>().ok()),
        );
    }
    for one in [&l["explicit"], &l["metrics"]] {
        addrs.extend(one.as_str().and_then(|a| a.parse::<SocketAddr>().ok()));
    }
    Some(Running {
        pid: v["pid"].as_u64().unwrap_or(0),
        addrs,
    })
}

/// The addresses `run` would get, by role (configured ones where they are held by the running
/// daemon, so the redirect can still be computed).
type BoundAddrs = Vec<(Role, SocketAddr)>;

async fn listen(cfg: &Config, running: Option<&Running>) -> (Part, BoundAddrs) {
    let mut bound = Vec::new();
    let (mut failed, mut held, mut shown) = (Vec::new(), Vec::new(), Vec::new());
    for (role, addr, got) in listeners::probe(cfg).await {
        match got {
            Ok(Some(a)) => {
                shown.push(format!("{role} {addr}"));
                bound.push((role, a));
            }
            Ok(None) => shown.push(format!("{role} {addr} (unavailable here; skipped)")),
            Err(e) if e.in_use() && running.is_some_and(|r| r.addrs.contains(&addr)) => {
                held.push(format!("{role} {addr}"));
                bound.push((role, addr));
            }
            Err(e) => failed.push(e.to_string()),
        }
    }
    let p = if !failed.is_empty() {
        part("listen", Verdict::Failed, failed.join("; "))
    } else if let (false, Some(r)) = (held.is_empty(), running) {
        part(
            "listen",
            Verdict::Note,
            format!(
                "{} held by the daemon running now (pid {}), which a restart frees; {}",
                held.join(", "),
                r.pid,
                if shown.is_empty() {
                    "nothing else".to_string()
                } else {
                    format!("free: {}", shown.join(", "))
                }
            ),
        )
    } else {
        part("listen", Verdict::Ok, shown.join(", "))
    };
    (p, bound)
}

fn admin(cfg: &Config, running: Option<&Running>) -> Part {
    match running {
        Some(r) => part(
            "admin",
            Verdict::Note,
            format!(
                "{} is served by the daemon running now (pid {}): `run` starts once it stops",
                cfg.admin.display(),
                r.pid
            ),
        ),
        None => match cfg.admin.parent().map(creatable) {
            Some(Err(e)) => part(
                "admin",
                Verdict::Failed,
                format!("{}: {e}", cfg.admin.display()),
            ),
            _ => part(
                "admin",
                Verdict::Ok,
                format!("{} (bound at start)", cfg.admin.display()),
            ),
        },
    }
}

fn redirect(cfg: &Config, bound: &BoundAddrs) -> Part {
    if !cfg.redirect.enabled {
        return part(
            "redirect",
            Verdict::Note,
            "off (redirect.enabled = false): agent users' traffic is not redirected",
        );
    }
    let of = |want: Role| -> Vec<SocketAddr> {
        bound
            .iter()
            .filter(|(r, _)| *r == want)
            .map(|(_, a)| *a)
            .collect()
    };
    let spec = match crate::daemon::firewall::spec(cfg, &of(Role::Transparent), &of(Role::Dns)) {
        Ok(s) => s,
        Err(e) => return part("redirect", Verdict::Failed, format!("firewall: {e}")),
    };
    let backend = agenshield_pf::platform_redirector();
    match backend.status(&spec) {
        Ok(st) => part(
            "redirect",
            Verdict::Ok,
            format!(
                "{} for agent uids {:?} (in place now: {})",
                backend.describe(),
                spec.agent_uids,
                match st.state {
                    agenshield_pf::FirewallState::Absent => "no",
                    agenshield_pf::FirewallState::Matches => "yes, as configured",
                    agenshield_pf::FirewallState::Differs => "yes, but it differs",
                }
            ),
        ),
        Err(e) => part(
            "redirect",
            Verdict::Failed,
            format!("installing {}: {e}", backend.describe()),
        ),
    }
}

fn audit(cfg: &Config) -> Part {
    let Some(path) = &cfg.audit_path else {
        return part(
            "audit",
            Verdict::Note,
            "off (audit.enabled = false): no decision is recorded",
        );
    };
    let failed = |e: &dyn std::fmt::Display| {
        part(
            "audit",
            Verdict::Failed,
            format!("opening the audit log {}: {e}", path.display()),
        )
    };
    match crate::audit::preflight(path) {
        Ok(Some(bytes)) => part(
            "audit",
            Verdict::Ok,
            format!("{} ({bytes} bytes)", path.display()),
        ),
        Ok(None) => match path.parent().map(creatable) {
            Some(Err(e)) => failed(&e),
            _ => part(
                "audit",
                Verdict::Ok,
                format!("{} (created at start)", path.display()),
            ),
        },
        Err(e) => failed(&e),
    }
}

/// The secrets the store holds: `Ok(None)` when a file vault does not exist yet (created,
/// empty, at start).
type VaultState = Result<Option<Arc<crate::secrets::Vault>>, String>;

async fn vault(cfg: &Config) -> VaultState {
    let store = crate::secrets::open_store(cfg, false).map_err(|e| format!("secrets: {e}"))?;
    let Some(store) = store else {
        return match creatable(&cfg.vault) {
            Ok(()) => Ok(None),
            Err(e) => Err(format!("secrets: {}: {e}", cfg.vault.display())),
        };
    };
    crate::secrets::Vault::open_with(store, build::reserved_values(cfg))
        .await
        .map(|v| Some(Arc::new(v)))
        .map_err(|e| format!("secrets: {e}"))
}

/// The policy `run` loads, whether it is the shipped one `run` would write first, and the
/// line that says so.
type Loaded = ((Policy, bool), String);

fn policy(cfg: &Config, seeds: bool) -> Result<Loaded, String> {
    if !seeds {
        let p = Policy::load_dir(&cfg.policies).map_err(|e| e.to_string())?;
        let line = format!(
            "{}: {} rules, {}",
            cfg.policies.display(),
            p.rule_count(),
            p.hash()
        );
        return Ok(((p, false), line));
    }
    // What `run` writes there first, loaded as `run` loads it.
    let scratch = tempfile::tempdir().map_err(|e| format!("a scratch directory: {e}"))?;
    let dir = scratch.path().join("policies");
    crate::daemon::seed_default_policy(&dir).map_err(|e| format!("{e:#}"))?;
    let p = Policy::load_dir(&dir).map_err(|e| e.to_string())?;
    creatable(&cfg.policies).map_err(|e| format!("{}: {e}", cfg.policies.display()))?;
    let line = format!(
        "{} does not exist yet: `run` writes the shipped default policy there ({} rules, {})",
        cfg.policies.display(),
        p.rule_count(),
        p.hash()
    );
    Ok(((p, true), line))
}

fn secrets(cfg: &Config, vault: &VaultState, policy: Option<&Policy>) -> Part {
    let vault = match vault {
        Ok(v) => v,
        Err(e) => return part("secrets", Verdict::Failed, e.clone()),
    };
    let held = vault.as_ref().map_or(0, |v| v.current().len());
    let Some(p) = policy else {
        return part(
            "secrets",
            Verdict::Note,
            format!("{held} in the store; not matched (the policy did not load)"),
        );
    };
    match p.check_secrets(&|n| vault.as_ref().is_some_and(|v| v.contains(n))) {
        Ok(()) if vault.is_none() => part(
            "secrets",
            Verdict::Ok,
            format!(
                "the vault {} is created (empty) at start; the policy binds none",
                cfg.vault.display()
            ),
        ),
        Ok(()) => part(
            "secrets",
            Verdict::Ok,
            format!("{held} in the store, every secret the policy binds among them"),
        ),
        Err(e) => part("secrets", Verdict::Failed, format!("policy: {e}")),
    }
}

fn ca(dir: &Path) -> Part {
    match agenshield_certs::Ca::load_existing(dir) {
        Ok(Some(ca)) => {
            let cert = dir.join("ca.pem");
            let until = super::ca_file::read(&cert).ok().map(|(_, f)| {
                let expired =
                    f.expiry(time::OffsetDateTime::now_utc()) == agenshield_certs::Expiry::Expired;
                (f.not_after.date(), expired)
            });
            match until {
                Some((date, true)) => part(
                    "CA",
                    Verdict::Note,
                    format!(
                        "{} EXPIRED on {date}: clients refuse every certificate it signs",
                        cert.display()
                    ),
                ),
                Some((date, false)) => part(
                    "CA",
                    Verdict::Ok,
                    format!(
                        "{} (SHA-256 {}, valid until {date})",
                        cert.display(),
                        ca.fingerprint_sha256()
                    ),
                ),
                None => part(
                    "CA",
                    Verdict::Ok,
                    format!("{} (SHA-256 {})", cert.display(), ca.fingerprint_sha256()),
                ),
            }
        }
        Ok(None) => match creatable(dir) {
            Ok(()) => part(
                "CA",
                Verdict::Note,
                format!(
                    "none yet in {}; the daemon creates one when it first starts",
                    dir.display()
                ),
            ),
            Err(e) => part("CA", Verdict::Failed, format!("{}: {e}", dir.display())),
        },
        Err(e) => part(
            "CA",
            Verdict::Failed,
            format!("CA: {}", crate::error_chain::chain(&e)),
        ),
    }
}

async fn upstream(cfg: &Config, bound: &BoundAddrs) -> Part {
    let trust = match crate::upstream::trust::UpstreamTrust::load(&cfg.upstream.extra_ca) {
        Ok(t) => t,
        Err(e) => return part("upstream", Verdict::Failed, e.to_string()),
    };
    if let Err(e) = trust.client_config() {
        return part("upstream", Verdict::Failed, format!("{e:#}"));
    }
    if let Err(e) = crate::upstream::resolve::Resolver::new(&cfg.resolver) {
        return part("upstream", Verdict::Failed, format!("resolver: {e:#}"));
    }
    if let Some(proxy) = &cfg.upstream.proxy {
        let own = bound.iter().map(|(_, a)| *a).collect();
        let guard =
            crate::upstream::guard::AddressGuard::new(cfg.upstream.allow_private.clone(), own);
        if let Err(e) = build::check_proxy(proxy, &guard) {
            return part("upstream", Verdict::Failed, e.to_string());
        }
    }
    part(
        "upstream",
        Verdict::Ok,
        format!(
            "{} system and {} extra trust roots{}",
            trust.system_roots,
            trust.extra_roots,
            match &cfg.upstream.proxy {
                Some(p) => format!("; through the proxy {p}"),
                None => String::new(),
            }
        ),
    )
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
