//! The uninstall plan's building blocks, the mirror of `steps.rs`: for each thing install
//! created ([`Created`]), the one step that removes it (or restores it, or keeps it as
//! evidence), compared with what exists now. Files changed since install are kept,
//! directories are removed only when empty unless only the product writes there, accounts
//! are deleted only when install made them (the manifest names no other).

use std::path::{Path, PathBuf};

use super::layout::{Layout, Platform, ENV_BEGIN, MANIFEST_PATH};
use super::manifest::Created;
use super::observe::{Observed, PathLink};
use super::plan::{command_line, meta_ok, Action, Meta, State, Step};
use super::{linux, macos};

pub(super) struct Undo<'a> {
    layout: &'a Layout,
    seen: &'a Observed,
    /// `--purge`: the evidence directories (the audit log's, the agent's home) go too.
    purge_evidence: bool,
    evidence: Vec<PathBuf>,
    /// Where a kept config is moved: `proxy.toml.uninstalled-STAMP`.
    pub retired: PathBuf,
}

pub(super) fn step(
    summary: String,
    detail: String,
    action: Action,
    state: State,
    unrecord: Option<Created>,
) -> Step {
    Step {
        summary,
        detail,
        action,
        state,
        record: None,
        unrecord,
    }
}

pub(super) fn done() -> State {
    State::Done("already done".into())
}

/// `Todo` while `there`, else done.
fn todo_if(there: bool) -> State {
    if there {
        State::Todo
    } else {
        done()
    }
}

impl<'a> Undo<'a> {
    pub(super) fn new(layout: &'a Layout, seen: &'a Observed, purge_evidence: bool) -> Undo<'a> {
        Undo {
            layout,
            seen,
            purge_evidence,
            evidence: layout.evidence_dirs(),
            retired: retired_name(&layout.config_file, &seen.stamp),
        }
    }

    /// The step that undoes `c`.
    pub(super) fn undo(&self, c: &Created) -> Step {
        let (l, seen) = (self.layout, self.seen);
        let un = Some(c.clone());
        match c {
            Created::Service { .. } => {
                let svc = seen.service;
                let summary = "stop and disable the service".to_string();
                if l.platform == Platform::Linux && !svc.manager_running {
                    return step(
                        summary,
                        "systemd is not running: nothing to stop".into(),
                        Action::Note,
                        done(),
                        un,
                    );
                }
                let commands = match l.platform {
                    Platform::Linux => linux::service_stop(),
                    Platform::MacOs => macos::service_stop(),
                };
                step(
                    summary,
                    command_line(&commands),
                    Action::Run {
                        commands,
                        fatal: true,
                    },
                    todo_if(svc.enabled || svc.active),
                    un,
                )
            }
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
                let state = todo_if(seen.path(path).is_some_and(|st| !meta_ok(st, &meta)));
                step(
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
                )
            }
            Created::Keychain { user, keychain, .. } => {
                let ca = l.certs.join("ca.pem");
                let mut commands = vec![macos::keychain_untrust(user, &ca)];
                if let Some(cn) = &seen.ca_common_name {
                    commands.push(macos::keychain_delete(user, keychain, cn));
                }
                step(
                    format!("remove the CA from {user}'s keychain"),
                    command_line(&commands),
                    Action::Run {
                        commands,
                        fatal: false,
                    },
                    todo_if(seen.keychain_has_ca && seen.users.contains_key(user)),
                    un,
                )
            }
            Created::Registered { what, marker, undo } => step(
                format!("undo the {what} registration"),
                command_line(undo),
                Action::Run {
                    commands: undo.clone(),
                    fatal: false,
                },
                todo_if(seen.path(marker).is_some()),
                un,
            ),
            Created::EnvBlock { path, file_created } => {
                let has = seen.texts.get(path).is_some_and(|t| t.contains(ENV_BEGIN));
                let tail = if *file_created {
                    " (and the file, if nothing else is left in it)"
                } else {
                    ""
                };
                step(
                    format!("remove our block from {}", path.display()),
                    format!(
                        "delete the lines between the agenshield markers in {}{tail}",
                        path.display()
                    ),
                    Action::RemoveEnvBlock {
                        path: path.clone(),
                        delete_if_empty: *file_created,
                    },
                    todo_if(has),
                    un,
                )
            }
            Created::File { path, sha256 } => {
                let changed = self.changed(path, sha256);
                if changed && *path == l.config_file {
                    return self.retire(un, "changed since install");
                }
                let (state, action) = match seen.path(path) {
                    None => (done(), Action::Note),
                    Some(_) if changed => (
                        State::Done("kept: changed since install".into()),
                        Action::Note,
                    ),
                    Some(_) => (State::Todo, Action::RemoveFile { path: path.clone() }),
                };
                step(
                    format!("remove {}", path.display()),
                    format!("rm {}", path.display()),
                    action,
                    state,
                    un,
                )
            }
            Created::Link { path, target } => {
                let state = match &seen.path_link {
                    PathLink::Ours => State::Todo,
                    PathLink::Foreign(what) => {
                        State::Done(format!("kept: it is {what} now, not our link"))
                    }
                    PathLink::Missing | PathLink::NoDir => done(),
                };
                step(
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
                )
            }
            Created::Dir { path, purge } if *purge && self.evidence.contains(path) => {
                self.evidence_dir(path, un)
            }
            Created::Dir { path, purge } => {
                let detail = if *purge {
                    format!("rm -r {}", path.display())
                } else {
                    format!(
                        "rmdir {} (only if empty: what others put there stays)",
                        path.display()
                    )
                };
                step(
                    format!("remove directory {}", path.display()),
                    detail,
                    Action::RemoveDir {
                        path: path.clone(),
                        purge: *purge,
                    },
                    todo_if(seen.path(path).is_some()),
                    un,
                )
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
                step(
                    format!("delete {} {name}", if group { "group" } else { "user" }),
                    command_line(std::slice::from_ref(&command)),
                    Action::DeleteAccount {
                        group,
                        name: name.clone(),
                        command,
                    },
                    todo_if(exists),
                    un,
                )
            }
        }
    }

    /// What of `c` stays on the machine after its step (made root's alone at the end): a
    /// changed file (the config under its retired name), every directory (one that others
    /// put things in outlives its `rmdir`).
    pub(super) fn kept(&self, c: &Created) -> Option<PathBuf> {
        match c {
            Created::File { path, sha256 } if self.changed(path, sha256) => {
                Some(if *path == self.layout.config_file {
                    self.retired.clone()
                } else {
                    path.clone()
                })
            }
            Created::Dir { path, .. } => Some(path.clone()),
            _ => None,
        }
    }

    /// Whether the file install wrote with `sha256` holds something else now.
    fn changed(&self, path: &Path, sha256: &Option<String>) -> bool {
        let now = self.seen.path(path).and_then(|s| s.sha256.as_ref());
        match (now, sha256) {
            (Some(now), Some(then)) => !then.is_empty() && now != then,
            _ => false,
        }
    }

    /// The log directory or the agent's home: deleted with `--purge`, kept otherwise.
    fn evidence_dir(&self, path: &Path, un: Option<Created>) -> Step {
        let what = if *path == self.layout.agent.home {
            "the agent's home"
        } else {
            "the log directory (the audit log)"
        };
        let size = self
            .seen
            .sizes
            .get(path)
            .map_or_else(String::new, |s| format!(" ({s})"));
        let there = self.seen.path(path).is_some();
        if self.purge_evidence {
            return step(
                format!("delete {what} {}{size}", path.display()),
                format!("rm -r {} (--purge)", path.display()),
                Action::RemoveDir {
                    path: path.into(),
                    purge: true,
                },
                todo_if(there),
                un,
            );
        }
        step(
            format!("keep {what} {}{size}", path.display()),
            "kept, root's alone (--purge deletes it)".into(),
            Action::Keep { path: path.into() },
            if there {
                State::Done("kept".into())
            } else {
                done()
            },
            un,
        )
    }

    /// The config kept under [`Undo::retired`], root's alone.
    pub(super) fn retire(&self, un: Option<Created>, why: &str) -> Step {
        let l = self.layout;
        step(
            format!(
                "keep the config ({why}) under another name, root's alone, so no later start \
                 takes it for an installation's"
            ),
            format!(
                "mv {} {} && chown root:root and chmod go-rwx it",
                l.config_file.display(),
                self.retired.display()
            ),
            Action::Retire {
                path: l.config_file.clone(),
                to: self.retired.clone(),
            },
            State::Todo,
            un,
        )
    }

    pub(super) fn remove_manifest(&self) -> Step {
        step(
            "remove the install manifest".into(),
            format!("rm {MANIFEST_PATH}"),
            Action::RemoveManifest,
            todo_if(self.seen.path(Path::new(MANIFEST_PATH)).is_some()),
            None,
        )
    }
}

/// Where uninstall moves a config it keeps: `proxy.toml.uninstalled-STAMP`.
fn retired_name(config: &Path, stamp: &str) -> PathBuf {
    let mut name = config.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".uninstalled-{stamp}"));
    config.with_file_name(name)
}
