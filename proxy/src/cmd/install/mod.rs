//! `agenshield proxy install` / `uninstall`: the plan of steps for this platform, printed
//! with `--dry-run`, carried out otherwise.
//!
//! install: the accounts (agent `ash_default_agent` uid 5200 with a home, proxy worker
//! `ash_default_broker` uid 5201, group `agenshield-admin` gid 5202), `/opt/agenshield`
//! (binary, config, default policy, CA, agent CA bundle, vault), the log and socket
//! directories, the agent's CA variables in its shell start-up files (and on macOS its login
//! keychain), the firewall redirect, and the service (systemd unit / LaunchDaemon). Every step
//! already in place is skipped; what was created is recorded in a manifest, and uninstall
//! removes exactly that, in reverse, after stopping the service and taking the firewall down.

pub mod apply;
pub mod envblock;
mod install_plan;
pub mod layout;
pub mod linux;
pub mod macos;
pub mod manifest;
pub mod observe;
pub mod plan;
pub mod resolvers;
mod steps;
mod undo;
mod uninstall_plan;
pub mod userfile;

use std::path::Path;

use crate::cli::{InstallArgs, UninstallArgs};

impl From<UninstallArgs> for InstallArgs {
    fn from(u: UninstallArgs) -> InstallArgs {
        InstallArgs {
            dry_run: u.dry_run,
            config: u.config,
            trust_system_store: false,
            purge: u.purge,
        }
    }
}
use agenshield_proxy::config::{Config, DEFAULT_CONFIG_PATH};
use layout::{Layout, Platform, MANIFEST_PATH};
use manifest::Manifest;
use plan::InstallInput;

/// The example config the product ships, documenting every key.
const EXAMPLE_CONFIG: &str = include_str!("../../../../proxy.example.toml");
/// The policy installed as `default.toml`.
pub const DEFAULT_POLICY: &str = include_str!("../../../../policies/default.toml");

/// The config install writes when given none: the commented example with the redirect on.
pub fn default_config_text() -> String {
    let header = "# Written by `agenshield proxy install`: the example config, with the firewall\n\
                  # redirect enabled. Restart the service after editing it.\n\n";
    let text = EXAMPLE_CONFIG.replacen("\nenabled = false\n", "\nenabled = true\n", 1);
    // Serve as the broker; root only keeps the redirect (and, on macOS, answers the
    // worker's pf lookups): `privsep`.
    let text = text.replacen(
        "\n# worker_user = \"ash_default_broker\"\n",
        "\nworker_user = \"ash_default_broker\"\n",
        1,
    );
    format!("{header}{text}")
}

/// Parses config text that has no file of its own (through a private temporary file, since
/// `Config` loads from paths).
pub fn config_from_text(text: &str) -> Result<Config, String> {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    let path = std::env::temp_dir().join(format!(
        "agenshield-install-{}-{nanos}.toml",
        std::process::id()
    ));
    let write = || -> std::io::Result<()> {
        use std::io::Write as _;
        use std::os::unix::fs::OpenOptionsExt;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)?;
        f.write_all(text.as_bytes())
    };
    let result = write()
        .map_err(|e| e.to_string())
        .and_then(|()| Config::load(&path).map_err(|e| e.to_string()));
    let _ = std::fs::remove_file(&path);
    result
}

/// Keys holding paths, which must be absolute in an installed config: a relative path is
/// taken relative to the config's directory, which install changes.
fn relative_paths(text: &str) -> Vec<String> {
    let Ok(doc) = text.parse::<toml::Table>() else {
        return Vec::new();
    };
    let mut bad = Vec::new();
    let mut check = |key: String, v: &toml::Value| {
        if let Some(s) = v.as_str() {
            if !Path::new(s).is_absolute() {
                bad.push(format!("{key} = {s:?}"));
            }
        }
    };
    for (table, keys) in [
        ("paths", &["policies", "certs", "vault", "audit"][..]),
        ("listen", &["admin"][..]),
    ] {
        for k in keys {
            if let Some(v) = doc.get(table).and_then(|t| t.get(*k)) {
                check(format!("{table}.{k}"), v);
            }
        }
    }
    if let Some(list) = doc
        .get("upstream")
        .and_then(|t| t.get("extra_ca"))
        .and_then(|v| v.as_array())
    {
        for v in list {
            check("upstream.extra_ca".into(), v);
        }
    }
    bad
}

/// The config to install (or uninstall with) and its text.
fn install_config(given: Option<&Path>, uninstall: bool) -> Result<(Config, InstallInput), String> {
    let input = |text: String, given: bool| InstallInput {
        config_text: text,
        config_given: given,
        default_policy: DEFAULT_POLICY.to_string(),
        trust_system_store: false,
    };
    if let Some(file) = given {
        let text = std::fs::read_to_string(file)
            .map_err(|e| format!("cannot read config {}: {e}", file.display()))?;
        let cfg = Config::load(file).map_err(|e| e.to_string())?;
        let bad = relative_paths(&text);
        if !bad.is_empty() {
            return Err(format!(
                "{}: an installed config needs absolute paths: {}",
                file.display(),
                bad.join(", ")
            ));
        }
        if !cfg.redirect.enabled && !uninstall {
            eprintln!(
                "agenshield: warning: {} has redirect.enabled = false: the daemon will not keep \
                 the firewall redirect in place",
                file.display()
            );
        }
        return Ok((cfg, input(text, true)));
    }
    let installed = Path::new(DEFAULT_CONFIG_PATH);
    if let Ok(text) = std::fs::read_to_string(installed) {
        match Config::load(installed) {
            Ok(cfg) => return Ok((cfg, input(text, false))),
            Err(e) if uninstall => {
                eprintln!("agenshield: warning: {e}; uninstalling with the default layout")
            }
            Err(e) => return Err(e.to_string()),
        }
    }
    let text = default_config_text();
    let cfg = config_from_text(&text)?;
    Ok((cfg, input(text, false)))
}

/// Installs or uninstalls; the exit code to leave with.
pub fn command(args: &InstallArgs, uninstall: bool) -> u8 {
    let verb = if uninstall { "uninstall" } else { "install" };
    let (cfg, mut input) = match install_config(args.config.as_deref(), uninstall) {
        Ok(x) => x,
        Err(e) => {
            eprintln!("agenshield: {verb}: {e}");
            return 2;
        }
    };
    input.trust_system_store = args.trust_system_store;
    let platform = Platform::current();
    let layout = match Layout::new(platform, &cfg) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("agenshield: {verb}: {e}");
            return 2;
        }
    };
    let root = nix::unistd::geteuid().is_root();
    if !args.dry_run && !root {
        eprintln!(
            "agenshield: {verb} needs root (try: sudo {} proxy {verb}; --dry-run shows the plan)",
            crate::cmd::invocation::for_root()
        );
        return 1;
    }
    let seen = observe::observe(&layout, &cfg, Path::new(MANIFEST_PATH));
    let plan = if uninstall {
        plan::plan_uninstall(&layout, &seen, args.purge)
    } else {
        match plan::plan_install(&layout, &input, &seen) {
            Ok(p) => p,
            Err(e) => {
                eprintln!("agenshield: {verb}: {e}");
                return 1;
            }
        }
    };
    let managed = seen.manifest.as_ref().is_some_and(|m| {
        m.created
            .iter()
            .any(|c| matches!(c, manifest::Created::Service { .. }))
    });
    if uninstall && !args.dry_run && seen.daemon_alive && seen.manifest.is_some() && !managed {
        eprintln!(
            "agenshield: uninstall: a daemon answers on {}: stop it first (it was not started \
             by the service manager, and its reconcile loop would put the firewall back)",
            cfg.admin.display()
        );
        return 1;
    }
    if args.dry_run {
        print!("{}", plan.render());
        if !root {
            println!("(not root: some of what exists may not have been visible)");
        }
        return 0;
    }
    let mut manifest = match (&seen.manifest, uninstall) {
        (Some(m), _) => Some(m.clone()),
        (None, false) => Some(Manifest::new(platform.name())),
        (None, true) => None,
    };
    let out = apply::apply(&plan, &mut manifest, uninstall);
    for w in &out.warnings {
        eprintln!("agenshield: warning: {w}");
    }
    if let Some(f) = &out.failed {
        eprintln!("agenshield: {verb} failed at: {f}");
        let undo = if uninstall {
            "fix the cause and run uninstall again"
        } else {
            "fix the cause and run install again, or undo it with `agenshield proxy uninstall`"
        };
        eprintln!("agenshield: what was done so far is recorded in {MANIFEST_PATH}; {undo}");
        return 1;
    }
    if out.carried_out == 0 {
        println!(
            "{verb}: nothing changed: all {} steps were already done",
            out.already
        );
    } else {
        println!(
            "{verb}: {} steps carried out, {} already done",
            out.carried_out, out.already
        );
    }
    if uninstall {
        print!("{}", kept_summary(&plan));
    }
    0
}

/// What an uninstall kept, for the operator: the evidence with its size, a renamed config,
/// and how to delete them.
fn kept_summary(plan: &plan::Plan) -> String {
    use plan::{Action, State};
    let mut lines = Vec::new();
    let mut dirs = Vec::new();
    for s in &plan.steps {
        match (&s.action, &s.state) {
            (Action::Keep { path }, State::Done(why)) if why == "kept" => {
                lines.push(s.summary.trim_start_matches("keep ").to_string());
                dirs.push(path.display().to_string());
            }
            (Action::Retire { to, .. }, _) => {
                lines.push(format!("the config, as {}", to.display()));
                dirs.push(to.display().to_string());
            }
            _ => {}
        }
    }
    if lines.is_empty() {
        return String::new();
    }
    let mut out = String::from("kept (root's alone now):\n");
    for l in lines {
        out.push_str(&format!("  {l}\n"));
    }
    out.push_str(&format!(
        "delete them when you no longer need them: sudo rm -r {}\n",
        dirs.join(" ")
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_config_turns_the_redirect_on_and_keeps_the_installed_layout() {
        let text = default_config_text();
        let cfg = config_from_text(&text).expect("the default config parses");
        assert!(
            cfg.redirect.enabled,
            "the example's redirect switch was not found"
        );
        assert_eq!(
            cfg.worker_user,
            Some(agenshield_proxy::config::AgentUser::Name(
                "ash_default_broker".into()
            )),
            "the example's worker_user line was not found"
        );
        assert_eq!(cfg.policies, Path::new("/opt/agenshield/policies"));
        assert_eq!(cfg.certs, Path::new("/opt/agenshield/certs"));
        assert_eq!(
            cfg.admin,
            Path::new(agenshield_proxy::config::DEFAULT_ADMIN_SOCKET)
        );
    }

    #[test]
    fn relative_paths_in_a_given_config_are_named() {
        let bad = relative_paths(
            "[paths]\npolicies = \"pol\"\ncerts = \"/abs\"\n[upstream]\nextra_ca = [\"ca.pem\"]\n",
        );
        assert_eq!(
            bad,
            vec!["paths.policies = \"pol\"", "upstream.extra_ca = \"ca.pem\""]
        );
        assert!(relative_paths("[paths]\nvault = \"/v\"\n").is_empty());
    }
}
