//! The install plan: accounts, directories and files, the CA and the agent's trust, the
//! firewall and the service, in the order they depend on each other.

use std::path::{Path, PathBuf};

use super::layout::{
    Layout, Platform, ADMIN_GID, ADMIN_GROUP, AGENT_PROFILE_PATH, BIN_DIR, BIN_PATH, INSTALL_ROOT,
    LOG_DIR, PATH_LINK,
};
use super::manifest::Created;
use super::observe::{FirewallSeen, Observed, PathLink};
use super::plan::{
    command_line, meta, meta_ok, Action, Content, InstallInput, Plan, PlanError, State,
};
use super::steps::Builder;
use super::{linux, macos};

/// The install plan.
pub fn plan_install(
    layout: &Layout,
    input: &InstallInput,
    seen: &Observed,
) -> Result<Plan, PlanError> {
    let l = layout;
    let root = "root";
    let rg = l.root_group;
    let mut b = Builder {
        layout,
        seen,
        manifest: seen.manifest.clone().unwrap_or_default(),
        steps: Vec::new(),
    };
    b.dir(
        "the install root",
        Path::new(INSTALL_ROOT),
        meta(0o755, root, rg),
        false,
    )?;
    b.group(ADMIN_GROUP, ADMIN_GID)?;
    b.group(&l.broker.name, l.broker.uid)?;
    b.user(&l.broker)?;
    b.group(&l.agent.name, l.agent.uid)?;
    b.user(&l.agent)?;
    let agent = l.agent.name.as_str();
    b.dir(
        "the agent's home",
        &l.agent.home,
        meta(0o750, agent, agent),
        true,
    )?;

    let first_daemon_input = b.steps.len();
    b.dir(
        "the binary directory",
        Path::new(BIN_DIR),
        meta(0o755, root, rg),
        false,
    )?;
    b.file(
        "the agenshield binary",
        Path::new(BIN_PATH),
        meta(0o755, root, rg),
        Content::CopyOf(seen.exe.clone()),
        true,
    );
    path_link_step(&mut b);
    let adm = ADMIN_GROUP;
    b.dir(
        "the config directory",
        &l.config_dir(),
        meta(0o750, root, adm),
        false,
    )?;
    let config_owned = b.manifest.owns_path(&l.config_file);
    b.file(
        "the daemon config",
        &l.config_file.clone(),
        meta(0o640, root, adm),
        Content::Text(input.config_text.clone()),
        input.config_given && config_owned,
    );
    b.dir(
        "the policy directory",
        &l.policies,
        meta(0o750, root, adm),
        false,
    )?;
    b.file(
        "the default policy",
        &l.policies.join("default.toml"),
        meta(0o640, root, adm),
        Content::Text(input.default_policy.clone()),
        false,
    );
    b.dir("the CA directory", &l.certs, meta(0o755, root, rg), false)?;
    ca_steps(&mut b);
    let keep = seen.configured_bundles.clone();
    b.file(
        "the agent's CA bundle",
        &l.bundle.clone(),
        meta(0o644, root, rg),
        Content::CaBundle {
            ca: l.certs.join("ca.pem"),
            keep: keep.clone(),
        },
        true,
    );
    b.file(
        "the agent's JVM trust store",
        &l.truststore.clone(),
        meta(0o644, root, rg),
        Content::TrustStore {
            ca: l.certs.join("ca.pem"),
            keep,
        },
        true,
    );
    b.file(
        "the agent's environment file",
        &l.env_file.clone(),
        meta(0o644, root, rg),
        Content::Text(crate::cmd::trust::files::env_file(&l.trust())),
        true,
    );
    // The file vault refuses a directory not owned by the uid that serves: the broker when
    // the daemon is split (`daemon.worker_user`, the default), root otherwise. The serving
    // uid writes (and rotates) the audit log too.
    let (serving, serving_group) = if l.worker {
        (l.broker.name.as_str(), adm)
    } else {
        (root, rg)
    };
    b.dir(
        "the secrets vault",
        &l.vault,
        meta(0o700, serving, serving_group),
        false,
    )?;
    // The pinned MCP tool definitions: rewritten by the serving uid whenever a pin changes.
    // A directory root keeps for something else would make every write fail (and the pins
    // be forgotten at the next start), so that is refused here, not found out later.
    let pins = &l.mcp_pins_dir;
    let roots = [
        PathBuf::from(INSTALL_ROOT),
        PathBuf::from(BIN_DIR),
        l.config_dir(),
        l.certs.clone(),
        l.policies.clone(),
        l.run_dir.clone(),
    ];
    if roots.contains(pins) {
        return Err(PlanError::Invalid(format!(
            "paths.mcp_pins is in {}, which root keeps: the daemon could not write its pins \
             there; give them a directory of their own (the default is `mcp/` beside the vault)",
            pins.display()
        )));
    }
    let served = [
        Some(&l.vault),
        l.audit_dir.as_ref(),
        l.policy_cache.as_ref(),
    ];
    if !served.contains(&Some(pins)) && pins != Path::new(LOG_DIR) {
        b.dir(
            "the MCP pins directory",
            pins,
            meta(0o700, serving, serving_group),
            false,
        )?;
    }
    // The policy source's cache: written by the process that fetches, the serving one.
    if let Some(cache) = &l.policy_cache {
        if let Some(parent) = cache.parent() {
            b.dir(
                "the policy cache's parent",
                parent,
                meta(0o755, root, rg),
                false,
            )?;
        }
        b.dir(
            "the policy bundle cache",
            cache,
            meta(0o700, serving, serving_group),
            false,
        )?;
    }
    audit_key_step(&mut b, serving);
    b.dir(
        "the log directory",
        Path::new(LOG_DIR),
        meta(0o750, serving, adm),
        true,
    )?;
    if let Some(audit) = l.audit_dir.as_deref().filter(|d| *d != Path::new(LOG_DIR)) {
        b.dir(
            "the audit log directory",
            audit,
            meta(0o750, serving, adm),
            true,
        )?;
    }
    b.dir(
        "the admin socket directory",
        &l.run_dir,
        meta(0o750, root, adm),
        true,
    )?;
    let daemon_inputs_changed = b.steps[first_daemon_input..]
        .iter()
        .any(|s| s.state == State::Todo);

    trust_steps(&mut b, input.trust_system_store);
    if l.platform == Platform::MacOs {
        agent_profile_steps(&mut b)?;
    }
    firewall_step(&mut b);
    if l.platform == Platform::Linux {
        resolver_steps(&mut b)?;
    }
    service_steps(&mut b, daemon_inputs_changed);
    let add_member = match l.platform {
        Platform::Linux => format!("usermod -aG {ADMIN_GROUP} NAME"),
        Platform::MacOs => format!("dseditgroup -o edit -a NAME -t user {ADMIN_GROUP}"),
    };
    b.push(
        "let operators use `agenshield proxy ctl` without root".into(),
        format!("add them to {ADMIN_GROUP}: {add_member}"),
        Action::Note,
        State::Note,
    );
    Ok(Plan {
        title: format!(
            "agenshield proxy install ({}): config {}",
            l.platform.name(),
            l.config_file.display()
        ),
        steps: b.steps,
    })
}

/// `agenshield` on PATH, sudo's included: a link in /usr/local/bin to the installed binary.
/// Whatever else is there already stays, and the operator is told.
fn path_link_step(b: &mut Builder) {
    let (path, target) = (Path::new(PATH_LINK), Path::new(BIN_PATH));
    let summary = format!("put agenshield on PATH: {PATH_LINK} -> {BIN_PATH}");
    let detail = format!("ln -s {BIN_PATH} {PATH_LINK}");
    match &b.seen.path_link {
        PathLink::Ours => b.already(summary, detail),
        PathLink::Missing => b.push_recorded(
            summary,
            detail,
            Action::Link {
                path: path.into(),
                target: target.into(),
            },
            State::Todo,
            Created::Link {
                path: path.into(),
                target: target.into(),
            },
        ),
        PathLink::NoDir => b.push(
            summary,
            format!(
                "there is no {}: run {BIN_PATH} by its full path",
                path.parent().unwrap_or(path).display()
            ),
            Action::Note,
            State::Note,
        ),
        PathLink::Foreign(what) => b.push(
            summary,
            format!(
                "{PATH_LINK} is {what}, not ours: it is left alone, so `agenshield` may be \
                 another program; run {BIN_PATH} by its full path (or remove {PATH_LINK} \
                 and install again)"
            ),
            Action::Note,
            State::Note,
        ),
    }
}

fn ca_steps(b: &mut Builder) {
    let l = b.layout;
    let (cert, key) = (l.certs.join("ca.pem"), l.certs.join("ca-key.pem"));
    let key_meta = meta(0o600, &l.broker.name, l.root_group);
    let detail = format!(
        "new ECDSA P-256 CA: {} ({}) and {} ({key_meta})",
        cert.display(),
        meta(0o644, "root", l.root_group),
        key.display()
    );
    match (b.seen.path(&cert), b.seen.path(&key)) {
        (Some(_), Some(k)) => {
            b.already("create the local CA".into(), detail);
            if !meta_ok(k, &key_meta) {
                b.fix_meta("the CA key", &key, &k.clone(), key_meta);
            }
        }
        _ => {
            b.push(
                "create the local CA".into(),
                detail,
                Action::CreateCa {
                    dir: l.certs.clone(),
                    key_owner: l.broker.name.clone(),
                },
                State::Todo,
            );
            // Recorded by apply: one File record per file written.
        }
    }
}

/// The key that signs the audit log's checkpoints, held by the user that serves (it writes
/// the log), never readable by the agent; its public half (`ctl audit key`) readable by all.
fn audit_key_step(b: &mut Builder, owner: &str) {
    use agenshield_proxy::audit::checkpoint_key::public_key_path;
    let l = b.layout;
    let Some(key) = l.audit_key.clone() else {
        return;
    };
    let key_meta = meta(0o600, owner, l.root_group);
    let detail = format!(
        "new ed25519 key: {} ({key_meta}) and its public half {} ({})",
        key.display(),
        public_key_path(&key).display(),
        meta(0o644, "root", l.root_group)
    );
    let summary = "create the audit log's checkpoint signing key".to_string();
    match b.seen.path(&key) {
        Some(k) => {
            b.already(summary, detail);
            if !meta_ok(k, &key_meta) {
                b.fix_meta("the audit checkpoint key", &key, &k.clone(), key_meta);
            }
        }
        None => b.push(
            summary,
            detail,
            Action::CreateAuditKey {
                path: key,
                owner: owner.to_string(),
            },
            State::Todo,
            // Recorded by apply: one File record per file written.
        ),
    }
}

/// The agent's trust in every way its processes start: shell start-up files, the systemd
/// user manager, wget, PAM sessions (Linux) or its launchd domain and login keychain
/// (macOS); and, if asked, the machine's own store.
fn trust_steps(b: &mut Builder, system_store: bool) {
    let l = b.layout;
    for d in l.agent_dirs.clone() {
        b.agent_dir(&d);
    }
    for block in l.blocks.clone() {
        b.env_block(&block);
    }
    match l.platform {
        Platform::Linux => pam_steps(b),
        Platform::MacOs => {
            let plist = crate::cmd::trust::files::launchd_env_plist(
                super::layout::LAUNCHD_ENV_LABEL,
                &l.trust(),
            );
            b.agent_file(
                "the LaunchAgent that sets the CA variables in the agent's launchd domain \
                 (loaded at its next login)",
                &l.launchd_env_plist(),
                plist,
            );
            keychain_steps(b);
        }
    }
    if system_store {
        system_store_steps(b);
    }
}

/// PAM: the environment file for the agent's sessions only, whatever starts them (su with or
/// without -l, sudo, cron, sshd, the systemd user manager; not runuser, whose stack has no
/// session include). Through Debian's `pam-auth-update`; elsewhere the two lines to add are
/// printed.
fn pam_steps(b: &mut Builder) {
    use super::layout::{PAM_PROFILE_NAME, PAM_PROFILE_PATH};
    use crate::cmd::trust::files;
    let l = b.layout;
    if !b.seen.pam_auth_update {
        b.push(
            "apply the CA variables to the agent's PAM sessions".into(),
            format!(
                "no pam-auth-update here: add these lines to your distribution's session \
                 stack (e.g. /etc/pam.d/system-login): {}",
                files::pam_lines(&l.agent.name, &l.env_file)
                    .trim_end()
                    .replace('\n', " | ")
            ),
            Action::Note,
            State::Note,
        );
        return;
    }
    b.file(
        "the PAM profile for the agent's sessions",
        Path::new(PAM_PROFILE_PATH),
        meta(0o644, "root", l.root_group),
        Content::Text(files::pam_profile(&l.agent.name, &l.env_file)),
        true,
    );
    let profile_changed = b.steps.last().is_some_and(|s| s.state == State::Todo);
    // `--enable`: install is the administrator's explicit choice, so a profile disabled
    // earlier is enabled again (`--package` alone keeps an administrator's "disabled").
    let enable = vec![vec![
        "pam-auth-update".to_string(),
        "--package".to_string(),
        "--enable".to_string(),
        PAM_PROFILE_NAME.to_string(),
    ]];
    let undo = vec![vec![
        "pam-auth-update".to_string(),
        "--package".to_string(),
        "--remove".to_string(),
        PAM_PROFILE_NAME.to_string(),
    ]];
    b.registered(
        format!(
            "apply the environment file to {}'s PAM sessions (su, sudo, cron, ssh)",
            l.agent.name
        ),
        enable,
        b.seen.pam_enabled && !profile_changed,
        true,
        Created::Registered {
            what: "pam".into(),
            marker: PAM_PROFILE_PATH.into(),
            undo,
        },
    );
}

/// `--trust-system-store`: our CA in the machine's store, for every user and process.
fn system_store_steps(b: &mut Builder) {
    use crate::cmd::trust::system_store::SystemStore;
    let l = b.layout;
    let ca = l.certs.join("ca.pem");
    b.push(
        "warning: --trust-system-store".into(),
        "every user and process of this machine will trust certificates the AgenShield CA \
         signs, not only the agent's"
            .into(),
        Action::Note,
        State::Note,
    );
    let Some(store) = b.seen.system_store else {
        b.push(
            "add the CA to the machine's trust store".into(),
            "no update-ca-certificates or /etc/pki/ca-trust here: add the CA by hand".into(),
            Action::Note,
            State::Note,
        );
        return;
    };
    // The keychain cannot be read without a prompt: on macOS the manifest tells.
    let mut done = true;
    if let Some(file) = store.file() {
        b.file(
            "the CA in the machine's trust store",
            &file,
            meta(0o644, "root", l.root_group),
            Content::CopyOf(ca.clone()),
            true,
        );
        done = b.steps.last().is_some_and(|s| s.state != State::Todo);
    }
    let marker = store.file().unwrap_or_else(|| ca.clone());
    b.registered(
        "rebuild the machine's trust store with the CA".into(),
        store.trust(&ca),
        done && b
            .manifest
            .created
            .iter()
            .any(|c| matches!(c, Created::Registered { what, .. } if what == "system-store")),
        store != SystemStore::MacOs,
        Created::Registered {
            what: "system-store".into(),
            marker,
            undo: store.remove(&ca),
        },
    );
}

fn keychain_steps(b: &mut Builder) {
    let l = b.layout;
    let kc = l.agent_keychain();
    let ca = l.certs.join("ca.pem");
    let mut commands = Vec::new();
    if b.seen.path(&kc).is_none() {
        commands.push(macos::keychain_create(&l.agent.name, &kc));
    }
    commands.push(macos::keychain_trust(&l.agent.name, &kc, &ca));
    let summary = format!(
        "trust the CA in {}'s login keychain (Go and Swift ignore the CA variables)",
        l.agent.name
    );
    let detail = command_line(&commands);
    let record = Created::Keychain {
        user: l.agent.name.clone(),
        keychain: kc,
        common_name: String::new(),
    };
    if b.seen.keychain_has_ca {
        b.already(summary, detail);
    } else {
        b.push_recorded(
            summary,
            detail,
            Action::Run {
                commands,
                fatal: false,
            },
            State::Todo,
            record,
        );
    }
}

fn firewall_step(b: &mut Builder) {
    let l = b.layout;
    let what = match l.platform {
        Platform::Linux => "nftables table inet agenshield",
        Platform::MacOs => {
            "pf anchor com.apple/agenshield (enabled with a pfctl -E reference token)"
        }
    };
    let summary = format!(
        "redirect {}'s TCP into the proxy and refuse its other traffic but DNS: {what}",
        l.agent.name
    );
    let detail = format!(
        "agenshield proxy firewall up --config {}",
        l.config_file.display()
    );
    let state = match b.seen.firewall {
        FirewallSeen::Matches => State::Done("already done".into()),
        _ => State::Todo,
    };
    b.push(
        summary,
        detail,
        Action::FirewallUp {
            config: l.config_file.clone(),
        },
        state,
    );
}

/// Linux: the local resolvers that answer around the DNS stub closed to the agent
/// ([`super::resolvers`]): the D-Bus policy, a drop-in per service that makes a resolver
/// socket (it applies the ACL again whenever the service starts), and the ACL now.
fn resolver_steps(b: &mut Builder) -> Result<(), PlanError> {
    use super::resolvers::{self, DBUS_POLICY_PATH, DROPIN_NAME, SOCKETS};
    let l = b.layout;
    let rg = l.root_group;
    let before = b.steps.len();
    if b.seen.dbus_policy_dir {
        b.file(
            "the D-Bus policy that keeps the agent from systemd-resolved",
            Path::new(DBUS_POLICY_PATH),
            meta(0o644, "root", rg),
            Content::Text(resolvers::dbus_policy(&[l.agent.name.as_str()])),
            true,
        );
    }
    let systemd = b.seen.service.manager_running;
    if systemd {
        for unit in SOCKETS.iter().map(|s| s.unit) {
            let dir = resolvers::dropin_dir(unit);
            b.dir(
                &format!("{unit}'s drop-in directory"),
                &dir,
                meta(0o755, "root", rg),
                false,
            )?;
            b.file(
                &format!("the drop-in that closes {unit}'s socket to the agent as it starts"),
                &dir.join(DROPIN_NAME),
                meta(0o644, "root", rg),
                Content::Text(resolvers::dropin(Path::new(BIN_PATH), &l.config_file)),
                true,
            );
        }
    }
    let changed = b.steps[before..].iter().any(|s| s.state == State::Todo);
    let resolvers_cmd = |open: bool| {
        let mut v: Vec<String> = [BIN_PATH, "proxy", "firewall", "resolvers"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        if open {
            v.push("--open".into());
        }
        v.extend(["--config".to_string(), l.config_file.display().to_string()]);
        v
    };
    let mut commands = Vec::new();
    if systemd && changed {
        commands.extend(linux::service_reload_units());
    }
    commands.push(resolvers_cmd(false));
    let done = !changed
        && b.manifest
            .created
            .iter()
            .any(|c| matches!(c, Created::Registered { what, .. } if what == "resolvers"));
    b.registered(
        format!(
            "close systemd-resolved's and nscd's sockets to {} (their lookups go around the DNS stub)",
            l.agent.name
        ),
        commands,
        done,
        false,
        Created::Registered {
            what: "resolvers".into(),
            marker: BIN_PATH.into(),
            undo: vec![resolvers_cmd(true)],
        },
    );
    Ok(())
}

fn service_steps(b: &mut Builder, daemon_inputs_changed: bool) {
    let l = b.layout;
    let (path, text) = l.service_file();
    let before = b.steps.len();
    let kind = match l.platform {
        Platform::Linux => "the systemd unit",
        Platform::MacOs => "the LaunchDaemon plist",
    };
    b.file(
        kind,
        Path::new(path),
        meta(0o644, "root", l.root_group),
        Content::Text(text.into()),
        true,
    );
    let changed = daemon_inputs_changed || b.steps[before..].iter().any(|s| s.state == State::Todo);
    let svc = b.seen.service;
    if !svc.manager_running {
        b.push(
            "start the service".into(),
            linux::no_service_manager_note(),
            Action::Note,
            State::Note,
        );
        return;
    }
    let (summary, commands, name) = match l.platform {
        Platform::Linux => (
            if svc.active && changed {
                "restart the service (what it runs changed)"
            } else {
                "enable and start the service"
            },
            linux::service_start(svc.active, changed),
            super::layout::SYSTEMD_UNIT_NAME,
        ),
        Platform::MacOs => (
            if svc.active && changed {
                "reload the LaunchDaemon (what it runs changed)"
            } else {
                "load the LaunchDaemon (RunAtLoad starts it)"
            },
            macos::service_start(svc.active, changed),
            super::layout::LAUNCHD_LABEL,
        ),
    };
    let detail = command_line(&commands);
    if svc.enabled && svc.active && !changed {
        b.already(summary.into(), detail);
    } else {
        b.push_recorded(
            summary.into(),
            detail,
            Action::Run {
                commands,
                fatal: true,
            },
            State::Todo,
            Created::Service { name: name.into() },
        );
    }
}

/// macOS: the Seatbelt backstop for the agent's sessions (the agent may not read the CA key,
/// the vault, the config or the policies, nor reach the admin socket; no UDP, no listeners).
/// Written where the agent can read it; whatever starts the agent's sessions runs them with
/// `sandbox-exec -f`. Linux has no equivalent to install: Unix permissions already keep
/// those files from the agent, and nftables refuses its UDP.
fn agent_profile_steps(b: &mut Builder) -> Result<(), PlanError> {
    let l = b.layout;
    let protected = agenshield_pf::sandbox::seatbelt::Protected {
        files: [l.certs.join("ca-key.pem"), l.config_file.clone()]
            .into_iter()
            .chain(l.audit_key.clone())
            .collect(),
        dirs: vec![l.vault.clone(), l.policies.clone()],
        sockets: vec![l.admin.clone()],
    };
    let profile = agenshield_pf::sandbox::seatbelt::agent_profile(&protected, &[])
        .map_err(|e| PlanError::Invalid(format!("the agent's sandbox profile: {e}")))?;
    b.file(
        "the agent's sandbox profile",
        Path::new(AGENT_PROFILE_PATH),
        meta(0o644, "root", l.root_group),
        Content::Text(profile),
        true,
    );
    b.push(
        "run the agent's sessions inside the sandbox profile".into(),
        format!(
            "start them with: sandbox-exec -f {AGENT_PROFILE_PATH} /bin/zsh -l (or the agent's command)"
        ),
        Action::Note,
        State::Note,
    );
    Ok(())
}
