//! The uninstall plan: stop the service, take the firewall down, then undo the manifest's
//! records in reverse. Files changed since install are kept, directories that others put
//! things in are kept, accounts that existed before install are never in the manifest.
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
use super::manifest::Created;
use super::observe::{FirewallSeen, Observed, PathLink};
use super::plan::{command_line, meta_ok, Action, Meta, Plan, State, Step};
use super::{linux, macos};

/// The uninstall plan: the manifest's records undone in reverse, after the service is
/// stopped and the firewall taken down. Without a manifest only the firewall goes. `purge`:
/// the audit log's directory and the agent's home go too.
pub fn plan_uninstall(layout: &Layout, seen: &Observed, purge_evidence: bool) -> Plan {
    let l = layout;
    let manifest = seen.manifest.clone().unwrap_or_default();
    let mut steps: Vec<Step> = Vec::new();
    let mut push = |summary: String,
                    detail: String,
                    action: Action,
                    state: State,
                    unrecord: Option<Created>| {
        steps.push(Step {
            summary,
            detail,
            action,
            state,
            record: None,
            unrecord,
        })
    };
    let done = || State::Done("already done".into());
    if seen.manifest.is_none() {
        push(
            "nothing install created is known".into(),
            format!("no install manifest at {MANIFEST_PATH}: only the firewall rules are removed"),
            Action::Note,
            State::Note,
            None,
        );
    }
    let managed = manifest
        .created
        .iter()
        .any(|c| matches!(c, Created::Service { .. }));
    if seen.daemon_alive && !managed {
        push(
            "stop the daemon first".into(),
            "a daemon not run by the service manager answers on the admin socket: stop it \
             (its reconcile loop would put the firewall back)"
                .into(),
            Action::Note,
            State::Note,
            None,
        );
    }
    for c in manifest
        .created
        .iter()
        .filter(|c| matches!(c, Created::Service { .. }))
    {
        let svc = seen.service;
        match l.platform {
            Platform::Linux if !svc.manager_running => push(
                "stop and disable the service".into(),
                "systemd is not running: nothing to stop".into(),
                Action::Note,
                done(),
                Some(c.clone()),
            ),
            _ => {
                let commands = match l.platform {
                    Platform::Linux => linux::service_stop(),
                    Platform::MacOs => macos::service_stop(),
                };
                let state = if svc.enabled || svc.active {
                    State::Todo
                } else {
                    done()
                };
                push(
                    "stop and disable the service".into(),
                    command_line(&commands),
                    Action::Run {
                        commands,
                        fatal: true,
                    },
                    state,
                    Some(c.clone()),
                )
            }
        }
    }
    let fw = match l.platform {
        Platform::Linux => "the nftables table inet agenshield",
        Platform::MacOs => "the pf anchor com.apple/agenshield and its pfctl -E reference",
    };
    push(
        format!("remove the firewall redirect: {fw}"),
        "agenshield proxy firewall down".into(),
        Action::FirewallDown,
        if seen.firewall == FirewallSeen::Absent {
            done()
        } else {
            State::Todo
        },
        None,
    );
    let manifest_dir = Path::new(MANIFEST_PATH).parent().unwrap_or(Path::new("/"));
    let mut manifest_step_done = false;
    let manifest_step = |push: &mut dyn FnMut(String, String, Action, State, Option<Created>)| {
        push(
            "remove the install manifest".into(),
            format!("rm {MANIFEST_PATH}"),
            Action::RemoveManifest,
            if seen.path(Path::new(MANIFEST_PATH)).is_some() {
                State::Todo
            } else {
                done()
            },
            None,
        );
    };
    let retired = retired_name(&l.config_file, &seen.stamp);
    let retire_step = |push: &mut dyn FnMut(String, String, Action, State, Option<Created>),
                       un: Option<Created>,
                       why: &str| {
        push(
            format!(
                "keep the config ({why}) under another name, root's alone, so no later start \
                 takes it for an installation's"
            ),
            format!(
                "mv {} {} && chown root:root and chmod go-rwx it",
                l.config_file.display(),
                retired.display()
            ),
            Action::Retire {
                path: l.config_file.clone(),
                to: retired.clone(),
            },
            State::Todo,
            un,
        );
    };
    let config_recorded = manifest
        .created
        .iter()
        .any(|c| matches!(c, Created::File { path, .. } if *path == l.config_file));
    let evidence = l.evidence_dirs();
    let mut kept_paths: Vec<PathBuf> = Vec::new();
    for c in manifest.created.iter().rev() {
        let un = Some(c.clone());
        match c {
            Created::Service { .. } => {}
            Created::Changed {
                path,
                mode,
                owner,
                group,
            } => {
                let meta = Meta {
                    mode: *mode,
                    owner: owner.clone(),
                    group: group.clone(),
                };
                let state = match seen.path(path) {
                    Some(st) if !meta_ok(st, &meta) => State::Todo,
                    _ => done(),
                };
                push(
                    format!("restore mode and owner of {} ({meta})", path.display()),
                    format!(
                        "chown {owner}:{group} {p} && chmod {mode:04o} {p}",
                        p = path.display()
                    ),
                    Action::SetMeta {
                        path: path.clone(),
                        meta,
                    },
                    state,
                    un,
                );
            }
            Created::Keychain { user, keychain, .. } => {
                let ca = l.certs.join("ca.pem");
                let mut commands = vec![macos::keychain_untrust(user, &ca)];
                if let Some(cn) = &seen.ca_common_name {
                    commands.push(macos::keychain_delete(user, keychain, cn));
                }
                let state = if seen.keychain_has_ca && seen.users.contains_key(user) {
                    State::Todo
                } else {
                    done()
                };
                push(
                    format!("remove the CA from {user}'s keychain"),
                    command_line(&commands),
                    Action::Run {
                        commands,
                        fatal: false,
                    },
                    state,
                    un,
                );
            }
            Created::Registered { what, marker, undo } => {
                let state = if seen.path(marker).is_some() {
                    State::Todo
                } else {
                    done()
                };
                push(
                    format!("undo the {what} registration"),
                    command_line(undo),
                    Action::Run {
                        commands: undo.clone(),
                        fatal: false,
                    },
                    state,
                    un,
                );
            }
            Created::EnvBlock { path, file_created } => {
                let has = seen
                    .texts
                    .get(path)
                    .is_some_and(|t| t.contains(super::layout::ENV_BEGIN));
                let tail = if *file_created {
                    " (and the file, if nothing else is left in it)"
                } else {
                    ""
                };
                push(
                    format!("remove our block from {}", path.display()),
                    format!(
                        "delete the lines between the agenshield markers in {}{tail}",
                        path.display()
                    ),
                    Action::RemoveEnvBlock {
                        path: path.clone(),
                        delete_if_empty: *file_created,
                    },
                    if has { State::Todo } else { done() },
                    un,
                );
            }
            Created::File { path, sha256 } => {
                let st = seen.path(path);
                let changed = match (st.and_then(|s| s.sha256.as_ref()), sha256) {
                    (Some(now), Some(then)) => !then.is_empty() && now != then,
                    _ => false,
                };
                if changed && *path == l.config_file {
                    retire_step(&mut push, un, "changed since install");
                    kept_paths.push(retired.clone());
                    continue;
                }
                let (state, action) = match st {
                    None => (done(), Action::Note),
                    Some(_) if changed => {
                        kept_paths.push(path.clone());
                        (
                            State::Done("kept: changed since install".into()),
                            Action::Note,
                        )
                    }
                    Some(_) => (State::Todo, Action::RemoveFile { path: path.clone() }),
                };
                push(
                    format!("remove {}", path.display()),
                    format!("rm {}", path.display()),
                    action,
                    state,
                    un,
                );
            }
            Created::Link { path, target } => {
                let state = match &seen.path_link {
                    PathLink::Ours => State::Todo,
                    PathLink::Foreign(what) => {
                        State::Done(format!("kept: it is {what} now, not our link"))
                    }
                    PathLink::Missing | PathLink::NoDir => done(),
                };
                push(
                    format!("remove the link {}", path.display()),
                    format!(
                        "rm {} (only while it is our link to {})",
                        path.display(),
                        target.display()
                    ),
                    Action::RemoveLink {
                        path: path.clone(),
                        target: target.clone(),
                    },
                    state,
                    un,
                );
            }
            Created::Dir { path, purge } => {
                if path == manifest_dir && !manifest_step_done {
                    manifest_step(&mut push);
                    manifest_step_done = true;
                }
                if *path == l.config_dir()
                    && !config_recorded
                    && seen.path(&l.config_file).is_some()
                {
                    retire_step(&mut push, None, "not written by install");
                    kept_paths.push(retired.clone());
                }
                kept_paths.push(path.clone());
                if *purge && evidence.contains(path) {
                    let what = if *path == l.agent.home {
                        "the agent's home"
                    } else {
                        "the log directory (the audit log)"
                    };
                    let size = seen
                        .sizes
                        .get(path)
                        .map_or_else(String::new, |s| format!(" ({s})"));
                    let there = seen.path(path).is_some();
                    if purge_evidence {
                        push(
                            format!("delete {what} {}{size}", path.display()),
                            format!("rm -r {} (--purge)", path.display()),
                            Action::RemoveDir {
                                path: path.clone(),
                                purge: true,
                            },
                            if there { State::Todo } else { done() },
                            un,
                        );
                    } else {
                        push(
                            format!("keep {what} {}{size}", path.display()),
                            "kept, root's alone (--purge deletes it)".into(),
                            Action::Keep { path: path.clone() },
                            if there {
                                State::Done("kept".into())
                            } else {
                                done()
                            },
                            un,
                        );
                    }
                    continue;
                }
                let detail = if *purge {
                    format!("rm -r {}", path.display())
                } else {
                    format!(
                        "rmdir {} (only if empty: what others put there stays)",
                        path.display()
                    )
                };
                push(
                    format!("remove directory {}", path.display()),
                    detail,
                    Action::RemoveDir {
                        path: path.clone(),
                        purge: *purge,
                    },
                    if seen.path(path).is_some() {
                        State::Todo
                    } else {
                        done()
                    },
                    un,
                );
            }
            Created::User { name } | Created::Group { name } => {
                let group = matches!(c, Created::Group { .. });
                let command = match (l.platform, group) {
                    (Platform::Linux, false) => linux::delete_user(name),
                    (Platform::Linux, true) => linux::delete_group(name),
                    (Platform::MacOs, false) => macos::delete_user(name),
                    (Platform::MacOs, true) => macos::delete_group(name),
                };
                let exists = if group {
                    seen.groups.contains_key(name)
                } else {
                    seen.users.contains_key(name)
                };
                push(
                    format!("delete {} {name}", if group { "group" } else { "user" }),
                    command_line(std::slice::from_ref(&command)),
                    Action::DeleteAccount {
                        group,
                        name: name.clone(),
                        command,
                    },
                    if exists { State::Todo } else { done() },
                    un,
                );
            }
        }
    }
    if !manifest_step_done && seen.manifest.is_some() {
        manifest_step(&mut push);
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
        let paths = outermost(kept_paths);
        let ids = |v: &[u32]| v.iter().map(u32::to_string).collect::<Vec<_>>().join(",");
        push(
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
        );
    }
    let had_unit = manifest
        .created
        .iter()
        .any(|c| matches!(c, Created::Service { .. }));
    if had_unit && l.platform == Platform::Linux && seen.service.manager_running {
        let commands = linux::service_reload_units();
        push(
            "make systemd forget the removed unit".into(),
            command_line(&commands),
            Action::Run {
                commands,
                fatal: false,
            },
            State::Todo,
            None,
        );
    }
    Plan {
        title: format!("agenshield proxy uninstall ({})", l.platform.name()),
        steps,
    }
}

/// Where uninstall moves a config it keeps: `proxy.toml.uninstalled-STAMP`.
fn retired_name(config: &Path, stamp: &str) -> PathBuf {
    let mut name = config.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".uninstalled-{stamp}"));
    config.with_file_name(name)
}

/// `paths` without those inside another of them, sorted.
fn outermost(mut paths: Vec<PathBuf>) -> Vec<PathBuf> {
    paths.sort();
    paths.dedup();
    let all = paths.clone();
    paths.retain(|p| !all.iter().any(|q| q != p && p.starts_with(q)));
    paths
}
