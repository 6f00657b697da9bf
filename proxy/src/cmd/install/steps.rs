//! The install plan's building blocks: one step per directory, file, group and user, each
//! compared with what exists (done, or to do, or a mode/owner fix).

use std::path::Path;

use super::layout::{Account, AgentBlock, BlockKind, Layout, Platform};
use super::manifest::{Created, Manifest};
use super::observe::{Observed, PathState};
use super::plan::{command_line, meta, meta_ok, Action, Content, Meta, PlanError, State, Step};
use super::{envblock, linux, macos};

pub(super) struct Builder<'a> {
    pub layout: &'a Layout,
    pub seen: &'a Observed,
    pub manifest: Manifest,
    pub steps: Vec<Step>,
}

impl Builder<'_> {
    pub(super) fn push(&mut self, summary: String, detail: String, action: Action, state: State) {
        self.steps.push(Step {
            summary,
            detail,
            action,
            state,
            record: None,
            unrecord: None,
        });
    }

    /// A step whose effect is in place already.
    pub(super) fn already(&mut self, summary: String, detail: String) {
        let done = State::Done("already done".into());
        self.push(summary, detail, Action::Note, done);
    }

    pub(super) fn push_recorded(
        &mut self,
        summary: String,
        detail: String,
        action: Action,
        state: State,
        c: Created,
    ) {
        self.push(summary, detail, action, state);
        if let Some(s) = self.steps.last_mut() {
            s.record = Some(c);
        }
    }

    /// Sets mode and owner of something that exists; uninstall restores the old ones unless
    /// install created the thing.
    pub(super) fn fix_meta(&mut self, what: &str, path: &Path, st: &PathState, m: Meta) {
        let summary = format!(
            "set mode and owner of {what} (now {:04o} {}:{})",
            st.mode, st.owner, st.group
        );
        let detail = format!(
            "chown {}:{} {p} && chmod {:04o} {p}",
            m.owner,
            m.group,
            m.mode,
            p = path.display()
        );
        let action = Action::SetMeta {
            path: path.into(),
            meta: m,
        };
        if self.manifest.owns_path(path) {
            self.push(summary, detail, action, State::Todo);
        } else {
            let before = Created::Changed {
                path: path.into(),
                mode: st.mode,
                owner: st.owner.clone(),
                group: st.group.clone(),
            };
            self.push_recorded(summary, detail, action, State::Todo, before);
        }
    }

    pub(super) fn dir(
        &mut self,
        what: &str,
        path: &Path,
        m: Meta,
        purge: bool,
    ) -> Result<(), PlanError> {
        let detail = format!("mkdir {} ({m})", path.display());
        match self.seen.path(path) {
            None => self.push_recorded(
                format!("create {what}"),
                detail,
                Action::MakeDir {
                    path: path.into(),
                    meta: m,
                },
                State::Todo,
                Created::Dir {
                    path: path.into(),
                    purge,
                },
            ),
            Some(st) if !st.dir => return Err(PlanError::NotADir(path.into())),
            Some(st) if meta_ok(st, &m) => self.already(format!("create {what}"), detail),
            Some(_) if !self.manifest.owns_path(path) && shared_system_dir(path) => {
                return Err(PlanError::Invalid(format!(
                    "{} is a shared system directory: install will not change its owner or \
                     mode for {what}; give it a directory of its own in the config",
                    path.display()
                )));
            }
            Some(st) => self.fix_meta(what, path, &st.clone(), m),
        }
        Ok(())
    }

    /// A file install writes. `replace`: rewrite it when its content differs; otherwise a
    /// differing file is the operator's and is kept.
    pub(super) fn file(
        &mut self,
        what: &str,
        path: &Path,
        m: Meta,
        content: Content,
        replace: bool,
    ) {
        let (detail, want_sha, current) = match &content {
            Content::Text(t) => (
                format!("write {} ({m})", path.display()),
                Some(super::observe::sha256_hex(t.as_bytes())),
                None,
            ),
            Content::CopyOf(src) => (
                format!("copy {} to {} ({m})", src.display(), path.display()),
                None,
                Some(self.seen.binary_current),
            ),
            Content::CaBundle { ca, keep } => (
                format!(
                    "write {} ({m}): the system roots{} plus {}",
                    path.display(),
                    kept(keep),
                    ca.display()
                ),
                None,
                None,
            ),
            Content::TrustStore { ca, keep } => (
                format!(
                    "write {} ({m}): PKCS12, the system roots{} plus {}",
                    path.display(),
                    kept(keep),
                    ca.display()
                ),
                None,
                None,
            ),
        };
        let st = self.seen.path(path).cloned();
        let same = match (&content, &st) {
            (_, None) => false,
            (Content::Text(_), Some(st)) => st.sha256 == want_sha,
            (Content::CopyOf(src), Some(st)) if *src != self.seen.exe => self
                .seen
                .path(src)
                .is_some_and(|from| from.sha256.is_some() && from.sha256 == st.sha256),
            (Content::CopyOf(_), Some(_)) => current == Some(true),
            (Content::CaBundle { .. }, Some(st)) => {
                st.sha256.is_some() && st.sha256 == self.seen.bundle_sha256
            }
            (Content::TrustStore { .. }, Some(_)) => self.seen.truststore_current,
        };
        let record = Created::File {
            path: path.into(),
            // Filled in with what was written when the step runs (None: always ours).
            sha256: match content {
                Content::CopyOf(_) => None,
                _ => Some(String::new()),
            },
        };
        let write = Action::Write {
            path: path.into(),
            meta: m.clone(),
            content,
        };
        match st {
            None => self.push_recorded(
                format!("install {what}"),
                detail,
                write,
                State::Todo,
                record,
            ),
            Some(st) if same && meta_ok(&st, &m) => self.already(format!("install {what}"), detail),
            Some(st) if same => self.fix_meta(what, path, &st, m),
            Some(_) if replace => self.push_recorded(
                format!("update {what} (it differs)"),
                detail,
                write,
                State::Todo,
                record,
            ),
            Some(_) => self.push(
                format!("install {what}"),
                detail,
                Action::Note,
                State::Done("kept: it exists with other content (the operator's)".into()),
            ),
        }
    }

    pub(super) fn group(&mut self, name: &str, gid: u32) -> Result<(), PlanError> {
        let summary = format!("create group {name} (gid {gid})");
        let commands = match self.layout.platform {
            Platform::Linux => linux::create_group(name, gid),
            Platform::MacOs => macos::create_group(name, gid),
        };
        let detail = command_line(&commands);
        if let Some(have) = self.seen.groups.get(name) {
            let why = if *have == gid {
                "already done".to_string()
            } else {
                format!("already exists (gid {have}); kept")
            };
            self.push(summary, detail, Action::Note, State::Done(why));
            return Ok(());
        }
        if let Some(holder) = self.seen.gid_names.get(&gid) {
            return Err(PlanError::IdTaken {
                what: "gid",
                id: gid,
                holder: holder.clone(),
                wanted: name.into(),
            });
        }
        self.push_recorded(
            summary,
            detail,
            Action::Run {
                commands,
                fatal: true,
            },
            State::Todo,
            Created::Group { name: name.into() },
        );
        Ok(())
    }

    pub(super) fn user(&mut self, a: &Account) -> Result<(), PlanError> {
        let summary = format!(
            "create user {} (uid {}, home {})",
            a.name,
            a.uid,
            a.home.display()
        );
        let commands = match self.layout.platform {
            Platform::Linux => linux::create_user(a),
            Platform::MacOs => macos::create_user(a, a.uid),
        };
        let detail = command_line(&commands);
        if let Some(have) = self.seen.users.get(&a.name) {
            let why = if *have == a.uid {
                "already done".to_string()
            } else {
                format!("already exists (uid {have}); kept")
            };
            self.push(summary, detail, Action::Note, State::Done(why));
            return Ok(());
        }
        if let Some(holder) = self.seen.uid_names.get(&a.uid) {
            return Err(PlanError::IdTaken {
                what: "uid",
                id: a.uid,
                holder: holder.clone(),
                wanted: a.name.clone(),
            });
        }
        self.push_recorded(
            summary,
            detail,
            Action::Run {
                commands,
                fatal: true,
            },
            State::Todo,
            Created::User {
                name: a.name.clone(),
            },
        );
        Ok(())
    }

    /// A directory in the agent's home, owned by the agent (made without following links).
    /// Not recorded: it goes with the home at uninstall, and is kept with a home install
    /// did not make.
    pub(super) fn agent_dir(&mut self, path: &Path) {
        let l = self.layout;
        let m = meta(0o755, &l.agent.name, &l.agent.name);
        let summary = format!("create the agent's {}", path.display());
        let detail = format!("mkdir {} ({m})", path.display());
        if self.seen.path(path).is_some_and(|st| st.dir) {
            self.already(summary, detail);
        } else {
            self.push(
                summary,
                detail,
                Action::MakeUserDir {
                    path: path.into(),
                    meta: m,
                },
                State::Todo,
            );
        }
    }

    /// A whole file of ours in the agent's home (written without following links).
    pub(super) fn agent_file(&mut self, what: &str, path: &Path, text: String) {
        let l = self.layout;
        let m = meta(0o644, &l.agent.name, &l.agent.name);
        let detail = format!("write {} ({m})", path.display());
        let want = Some(super::observe::sha256_hex(text.as_bytes()));
        if self.seen.path(path).is_some_and(|st| st.sha256 == want) {
            self.already(format!("install {what}"), detail);
            return;
        }
        self.push_recorded(
            format!("install {what}"),
            detail,
            Action::WriteUserFile {
                path: path.into(),
                meta: m,
                text,
            },
            State::Todo,
            Created::File {
                path: path.into(),
                sha256: Some(String::new()),
            },
        );
    }

    /// Our block of trust settings in one of the agent's files.
    pub(super) fn env_block(&mut self, b: &AgentBlock) {
        let l = self.layout;
        let path = b.path.as_path();
        let block = l.block(b.kind);
        let m = meta(0o644, &l.agent.name, &l.agent.name);
        let summary = match b.kind {
            BlockKind::Shell => format!(
                "point the agent's tools at the CA bundle in {} ({})",
                path.display(),
                l.trust().names().join(", ")
            ),
            BlockKind::EnvironmentD => format!(
                "the same variables for the agent's systemd user units: {}",
                path.display()
            ),
            BlockKind::Wgetrc => format!(
                "wget (GnuTLS reads no CA variable): ca_certificate in {}",
                path.display()
            ),
        };
        let detail = format!(
            "add the lines between '{}' and '{}' to {} (created {m} if missing)",
            super::layout::ENV_BEGIN
                .split(" (")
                .next()
                .unwrap_or_default(),
            super::layout::ENV_END,
            path.display()
        );
        let existing = self.seen.texts.get(path);
        if existing.is_some_and(|t| envblock::has_block(t, &block)) {
            self.already(summary, detail);
            return;
        }
        let record = Created::EnvBlock {
            path: path.into(),
            file_created: existing.is_none() && !self.manifest.owns_path(path),
        };
        self.push_recorded(
            summary,
            detail,
            Action::AddEnvBlock {
                path: path.into(),
                meta: m,
                block,
            },
            State::Todo,
            record,
        );
    }

    /// Commands that register something with the system, undone by `undo` at uninstall.
    pub(super) fn registered(
        &mut self,
        summary: String,
        commands: Vec<Vec<String>>,
        done: bool,
        fatal: bool,
        record: Created,
    ) {
        let detail = command_line(&commands);
        if done {
            self.already(summary, detail);
        } else {
            self.push_recorded(
                summary,
                detail,
                Action::Run { commands, fatal },
                State::Todo,
                record,
            );
        }
    }
}

/// ", the bundles kept from /etc/npmrc cafile, …" (or nothing).
fn kept(keep: &[crate::cmd::trust::bundle::Configured]) -> String {
    if keep.is_empty() {
        return String::new();
    }
    let list: Vec<String> = keep
        .iter()
        .map(|c| format!("{} ({})", c.path.display(), c.source))
        .collect();
    format!(", the bundles already configured ({})", list.join(", "))
}

/// Directories other software shares: install may create directories inside them, never take
/// one of them over (a config naming `/var/log/x.jsonl` as the audit log, say, would otherwise
/// hand `/var/log` to the worker user).
pub(super) fn shared_system_dir(path: &Path) -> bool {
    const SHARED: &[&str] = &[
        "/",
        "/Applications",
        "/Library",
        "/System",
        "/Users",
        "/bin",
        "/boot",
        "/dev",
        "/etc",
        "/home",
        "/lib",
        "/lib64",
        "/media",
        "/mnt",
        "/opt",
        "/private",
        "/private/etc",
        "/private/tmp",
        "/private/var",
        "/private/var/log",
        "/private/var/run",
        "/proc",
        "/root",
        "/run",
        "/sbin",
        "/srv",
        "/sys",
        "/tmp",
        "/usr",
        "/usr/local",
        "/usr/local/bin",
        "/var",
        "/var/lib",
        "/var/log",
        "/var/run",
        "/var/tmp",
    ];
    let p = path.to_string_lossy();
    let p = p.trim_end_matches('/');
    SHARED.contains(&if p.is_empty() { "/" } else { p })
}
