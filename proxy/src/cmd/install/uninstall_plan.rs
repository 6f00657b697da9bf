//! The uninstall plan: stop the service, take the firewall down, then undo the manifest's
//! records in reverse, each by its step ([`Undo::undo`]). Files changed since install are
//! kept, directories that others put things in are kept, accounts that existed before
//! install are never in the manifest.
//!
//! Evidence is kept unless `--purge`: the log directories (the audit log) and the agent's
//! home stay, with their sizes in the plan. A config left at the installed path is renamed
//! `proxy.toml.uninstalled-STAMP`, so neither a later `proxy run` nor any tool that reads the
//! installed config by default takes it for an installation's (its users are gone). Last,
//! whatever is kept that the deleted accounts' ids own is made root's alone
//! ([`Action::CloseToRoot`]): ids are handed out again, and the next holder of the admin
//! group's gid must not read a kept config with `upstream.proxy` credentials in it.

use std::path::{Path, PathBuf};

use super::layout::{Layout, Platform, MANIFEST_PATH};
use super::linux;
use super::manifest::Created;
use super::observe::{FirewallSeen, Observed};
use super::plan::{command_line, Action, Plan, State};
use super::undo::{done, step, Undo};

/// The uninstall plan: the manifest's records undone in reverse, after the service is
/// stopped and the firewall taken down. Without a manifest only the firewall goes. `purge`:
/// the audit log's directory and the agent's home go too.
pub fn plan_uninstall(layout: &Layout, seen: &Observed, purge_evidence: bool) -> Plan {
    let l = layout;
    let manifest = seen.manifest.clone().unwrap_or_default();
    let u = Undo::new(l, seen, purge_evidence);
    let is_service = |c: &&Created| matches!(c, Created::Service { .. });
    let managed = manifest.created.iter().any(|c| is_service(&c));
    let mut steps = Vec::new();
    if seen.manifest.is_none() {
        steps.push(step(
            "nothing install created is known".into(),
            format!("no install manifest at {MANIFEST_PATH}: only the firewall rules are removed"),
            Action::Note,
            State::Note,
            None,
        ));
    }
    if seen.daemon_alive && !managed {
        steps.push(step(
            "stop the daemon first".into(),
            "a daemon not run by the service manager answers on the admin socket: stop it \
             (its reconcile loop would put the firewall back)"
                .into(),
            Action::Note,
            State::Note,
            None,
        ));
    }
    steps.extend(
        manifest
            .created
            .iter()
            .filter(is_service)
            .map(|c| u.undo(c)),
    );
    let fw = match l.platform {
        Platform::Linux => "the nftables table inet agenshield",
        Platform::MacOs => "the pf anchor com.apple/agenshield and its pfctl -E reference",
    };
    steps.push(step(
        format!("remove the firewall redirect: {fw}"),
        "agenshield proxy firewall down".into(),
        Action::FirewallDown,
        if seen.firewall == FirewallSeen::Absent {
            done()
        } else {
            State::Todo
        },
        None,
    ));
    let manifest_dir = Path::new(MANIFEST_PATH).parent().unwrap_or(Path::new("/"));
    let mut manifest_removed = false;
    let config_recorded = manifest
        .created
        .iter()
        .any(|c| matches!(c, Created::File { path, .. } if *path == l.config_file));
    let mut kept: Vec<PathBuf> = Vec::new();
    for c in manifest.created.iter().rev().filter(|c| !is_service(c)) {
        // What must go before a directory: the manifest out of its own, and a config install
        // did not write out of the config directory.
        if let Created::Dir { path, .. } = c {
            if path == manifest_dir && !manifest_removed {
                steps.push(u.remove_manifest());
                manifest_removed = true;
            }
            if *path == l.config_dir() && !config_recorded && seen.path(&l.config_file).is_some() {
                steps.push(u.retire(None, "not written by install"));
                kept.push(u.retired.clone());
            }
        }
        kept.extend(u.kept(c));
        steps.push(u.undo(c));
    }
    if !manifest_removed && seen.manifest.is_some() {
        steps.push(u.remove_manifest());
    }
    let (mut uids, mut gids) = (Vec::new(), Vec::new());
    for c in &manifest.created {
        match c {
            Created::User { name } => uids.extend(seen.users.get(name)),
            Created::Group { name } => gids.extend(seen.groups.get(name)),
            _ => {}
        }
    }
    if !uids.is_empty() || !gids.is_empty() {
        let paths = outermost(kept);
        let ids = |v: &[u32]| v.iter().map(u32::to_string).collect::<Vec<_>>().join(",");
        steps.push(step(
            "make what is kept root's alone (the deleted accounts' ids will be handed out \
             again)"
                .into(),
            format!(
                "under {}: what uid {} or gid {} owns becomes root:root, go-rwx",
                paths
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", "),
                ids(&uids),
                ids(&gids)
            ),
            Action::CloseToRoot { paths, uids, gids },
            State::Todo,
            None,
        ));
    }
    if managed && l.platform == Platform::Linux && seen.service.manager_running {
        let commands = linux::service_reload_units();
        steps.push(step(
            "make systemd forget the removed unit".into(),
            command_line(&commands),
            Action::Run {
                commands,
                fatal: false,
            },
            State::Todo,
            None,
        ));
    }
    Plan {
        title: format!("agenshield proxy uninstall ({})", l.platform.name()),
        steps,
    }
}

/// `paths` without those inside another of them, sorted.
fn outermost(mut paths: Vec<PathBuf>) -> Vec<PathBuf> {
    paths.sort();
    paths.dedup();
    let all = paths.clone();
    paths.retain(|p| !all.iter().any(|q| q != p && p.starts_with(q)));
    paths
}
