//! `agenshield proxy doctor`: is this machine's installation sound, end to end, for the
//! agent? The firewall redirect and the daemon; the CA files; the agent's environment in a
//! login shell and outside one; for every runtime found, whether it will trust our CA, by
//! what it reads; and the hosts where clients recently refused our leaf. Each failure comes
//! with its fix. Exit 0 when nothing failed, 1 otherwise.
//!
//! Run as root, doctor never executes or opens, with root's rights, anything the agent can
//! place or name: its programs run, and its files are read, as the agent
//! ([`agent_access`]); root's own helpers come from fixed root-owned paths ([`system_tool`]).

pub mod agent;
pub mod agent_access;
pub mod bounded;
pub mod ca_files;
pub mod contexts;
pub mod environment;
pub mod finding;
pub mod holds;
pub mod installed;
pub mod rejected;
#[cfg(target_os = "linux")]
pub mod resolvers;
pub mod runtimes;
pub mod service;
pub mod sources;
pub mod system_tool;

use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use crate::cli::DoctorArgs;
use crate::cmd::install::layout::{AGENT_ENV_FILE, BUNDLE_FILE, TRUSTSTORE_FILE};
use agenshield_proxy::config::{AgentUser, Config, DEFAULT_CONFIG_PATH};
use agent::Agent;
use agent_access::Access;
use contexts::{Context, ContextKind};
use finding::{Area, Finding, Report};
use installed::Installed;

/// Doctor's exit code when AgenShield is not installed (documented in `--help`).
pub const NOT_INSTALLED: u8 = 3;

/// Runs every check; prints the report; the exit code.
pub fn command(cfg: &Config, args: &DoctorArgs) -> u8 {
    if let Some(why) = not_installed(cfg) {
        let next = format!(
            "`sudo {0} proxy install --dry-run` shows what install sets up, `sudo {0} proxy \
             install` does it",
            crate::cmd::invocation::for_root()
        );
        if args.json {
            println!(
                "{}",
                serde_json::json!({ "installed": false, "ok": false, "message": why, "next": next })
            );
        } else {
            println!("AgenShield is not installed here: {why}.\n{next}.");
        }
        return NOT_INSTALLED;
    }
    let report = diagnose(cfg, args.since.into());
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report).unwrap_or_default()
        );
    } else {
        print!("{}", report.text());
        if report.skipped > 0 && !nix::unistd::geteuid().is_root() {
            println!(
                "(run it as root, `sudo {} proxy doctor`, for the checks skipped here)",
                crate::cmd::invocation::for_root()
            );
        }
    }
    u8::from(!report.ok)
}

/// Why there is nothing to check, if so: no install manifest, and no agent user (the first
/// the config names). A machine set up by hand (the agent user made, `firewall up`) is
/// checked.
fn not_installed(cfg: &Config) -> Option<String> {
    use crate::cmd::install::layout::MANIFEST_PATH;
    if std::path::Path::new(MANIFEST_PATH).exists() {
        return None;
    }
    let name = cfg.redirect.agent_users.iter().find_map(|u| match u {
        AgentUser::Name(n) => Some(n.clone()),
        AgentUser::Uid(_) => None,
    })?;
    if Agent::lookup(&name).is_some() {
        return None;
    }
    Some(format!(
        "no install manifest ({MANIFEST_PATH}) and no agent user {name}"
    ))
}

fn diagnose(cfg: &Config, since: Duration) -> Report {
    // The agent may not read the installed config: it runs on the installed defaults, which
    // say nothing of the redirect.
    let unreadable =
        cfg.source.is_none() && agenshield_proxy::config::installed_config_unreadable();
    let mut out = vec![Finding::ok(
        Area::Config,
        "config",
        match &cfg.source {
            Some(p) => p.display().to_string(),
            None if unreadable => format!(
                "the installed defaults ({DEFAULT_CONFIG_PATH} is not readable by this user)"
            ),
            None => "the built-in defaults".to_string(),
        },
    )];
    let status = service::daemon_status(cfg);
    out.push(if unreadable {
        Finding::skipped(
            Area::Firewall,
            "redirect",
            "this user cannot read the config that says which redirect to expect",
        )
    } else {
        service::firewall(cfg, &status)
    });
    out.push(service::daemon(cfg, &status));

    let agent = the_agent(cfg, &mut out);
    let env_file = cfg.certs.join(AGENT_ENV_FILE);
    let inst = Installed {
        ca: cfg.certs.join("ca.pem"),
        bundle: cfg.certs.join(BUNDLE_FILE),
        truststore: cfg.certs.join(TRUSTSTORE_FILE),
        pam_enabled: cfg!(target_os = "linux")
            .then(|| crate::cmd::trust::files::pam_applies(&env_file)),
        env_file,
    };
    // Without the account, judge readability as any other user would.
    let reader = agent.clone().unwrap_or(Agent {
        name: "other users".into(),
        uid: u32::MAX,
        gids: Vec::new(),
        home: PathBuf::from("/nonexistent"),
    });
    let (ca, found) = ca_files::check(&inst, &reader);
    out.extend(found);

    // How the agent's programs and files are reached: as the agent (or, if that cannot be,
    // not at all).
    let access = agent.as_ref().map(Access::for_agent);
    #[cfg(target_os = "linux")]
    if let (Some(a), Some(Ok(access))) = (&agent, &access) {
        out.extend(resolvers::findings(
            access,
            a,
            &crate::cmd::install::resolvers::socket_paths(),
        ));
    }
    let contexts = match (&agent, &access) {
        (Some(a), Some(Ok(access))) => agent_contexts(a, &inst, access, &mut out),
        (Some(a), Some(Err(why))) if nix::unistd::geteuid().is_root() => {
            out.push(Finding::fail(
                Area::Environment,
                &a.name,
                format!("doctor cannot act as the agent: {why}"),
                "check the agent's account (`id` and `getent passwd` for it)",
            ));
            Vec::new()
        }
        (Some(a), _) => agent_contexts(a, &inst, &Access::ours(), &mut out),
        (None, _) => Vec::new(),
    };
    match (&ca, &agent, &access, contexts.is_empty()) {
        (Some(ca), Some(agent), Some(Ok(access)), false) => {
            out.extend(runtime_findings(&contexts, agent, ca, &inst, access));
        }
        _ => out.push(Finding::skipped(
            Area::Runtime,
            "runtimes",
            "needs the CA and at least one of the agent's environments (see above)",
        )),
    }

    let scan = match &cfg.audit_path {
        Some(live) => rejected::scan(
            &agenshield_proxy::audit::verify::rotation_set(live, cfg.audit.keep),
            since,
            SystemTime::now(),
        ),
        None => Err(std::io::Error::other(
            "the audit log is off (audit.enabled = false)",
        )),
    };
    out.extend(rejected::findings(scan, since));
    Report::new(out)
}

/// The agent install set up: the first user named in `redirect.agent_users`.
fn the_agent(cfg: &Config, out: &mut Vec<Finding>) -> Option<Agent> {
    let named = cfg.redirect.agent_users.iter().find_map(|u| match u {
        AgentUser::Name(n) => Some(n.clone()),
        AgentUser::Uid(_) => None,
    });
    let Some(name) = named else {
        out.push(Finding::skipped(
            Area::Config,
            "agent",
            "redirect.agent_users names no user (only uids): the agent's environment is not \
             checked",
        ));
        return None;
    };
    match Agent::lookup(&name) {
        Some(a) => {
            out.push(Finding::ok(
                Area::Config,
                "agent",
                format!("{} (uid {}, home {})", a.name, a.uid, a.home.display()),
            ));
            Some(a)
        }
        None => {
            out.push(Finding::fail(
                Area::Config,
                "agent",
                format!("the agent user {name} does not exist"),
                "`sudo agenshield proxy install` creates it",
            ));
            None
        }
    }
}

/// The agent's environments this user may look at, and a finding for each (root: a login
/// shell and, on Linux, a session outside one; the agent itself: this process).
fn agent_contexts(
    agent: &Agent,
    inst: &Installed,
    access: &Access,
    out: &mut Vec<Finding>,
) -> Vec<Context> {
    let me = nix::unistd::geteuid();
    let captured: Vec<(ContextKind, Result<Context, String>)> = if me.is_root() {
        let mut v = vec![(ContextKind::Login, contexts::login(&agent.name))];
        if cfg!(target_os = "linux") {
            v.push((ContextKind::NonLogin, contexts::non_login(&agent.name)));
        }
        v
    } else if me.as_raw() == agent.uid {
        vec![(ContextKind::ThisProcess, Ok(Context::this_process()))]
    } else {
        out.push(Finding::skipped(
            Area::Environment,
            &agent.name,
            "seeing the agent's environment needs root (su), or run doctor as the agent",
        ));
        return Vec::new();
    };
    let mut got = Vec::new();
    for (kind, r) in captured {
        match r {
            Ok(ctx) => {
                out.push(environment::context(&ctx, agent, inst));
                got.push(ctx);
            }
            Err(why) => out.push(Finding::fail(
                Area::Environment,
                kind.name(),
                why,
                format!(
                    "`su -l {} -c env` must work: check the agent's shell and start-up files",
                    agent.name
                ),
            )),
        }
    }
    if me.is_root() {
        match inst.pam_enabled {
            Some(enabled) => out.push(environment::pam(enabled, agent, &inst.env_file)),
            None => out.push(environment::launch_agent(agent, inst, access)),
        }
    }
    got
}

fn runtime_findings(
    contexts: &[Context],
    agent: &Agent,
    ca: &[u8],
    inst: &Installed,
    access: &Access,
) -> Vec<Finding> {
    let mut dirs: Vec<PathBuf> = Vec::new();
    let standard = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
    for path in contexts
        .iter()
        .filter_map(|c| c.get("PATH"))
        .chain([standard])
    {
        for d in path.split(':').filter(|d| d.starts_with('/')) {
            let d = PathBuf::from(d);
            if !dirs.contains(&d) {
                dirs.push(d);
            }
        }
    }
    let mut machine = sources::Machine::here();
    let (python, certifi) = match runtimes::which("python3", &dirs) {
        Some(py) => runtimes::probe_python(&py, access),
        None => Default::default(),
    };
    machine.certifi = certifi;
    if let Some(java) = runtimes::which("java", &dirs) {
        (machine.java_cacerts, machine.keytool) = runtimes::jdk(&java);
    }
    let found = runtimes::find(&dirs, &python);
    if found.is_empty() {
        return vec![Finding::skipped(
            Area::Runtime,
            "runtimes",
            "none of curl, wget, git, python3, pip, node, npm, java, go found",
        )];
    }
    found
        .iter()
        .map(|f| runtimes::check(f, contexts, agent, &machine, ca, inst, access))
        .collect()
}
