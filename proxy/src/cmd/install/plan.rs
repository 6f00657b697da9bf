//! The plan: platform + layout + what already exists → the ordered steps, each with a human
//! summary and the exact command it runs or the file it writes (mode, owner). Pure, so both
//! platforms' plans render and are golden-tested anywhere. Steps whose effect is already in
//! place are marked done and skipped, which makes install idempotent.

use std::fmt::Write as _;
use std::path::PathBuf;

use super::manifest::Created;
use super::observe::PathState;
use crate::cmd::trust::bundle::Configured;

pub use super::install_plan::plan_install;
pub use super::uninstall_plan::plan_uninstall;

/// What a file step writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Content {
    Text(String),
    /// A copy of this file (the binary).
    CopyOf(PathBuf),
    /// The system roots, the bundles the machine already configures, and the CA at `ca`.
    CaBundle {
        ca: PathBuf,
        keep: Vec<Configured>,
    },
    /// The same certificates as a PKCS12 trust store for the JVM.
    TrustStore {
        ca: PathBuf,
        keep: Vec<Configured>,
    },
}

/// Who owns a path, by name (resolved when the step runs: the user may not exist yet).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Meta {
    pub mode: u32,
    pub owner: String,
    pub group: String,
}

impl std::fmt::Display for Meta {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:04o} {}:{}", self.mode, self.owner, self.group)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Commands run in order; the step fails at the first that fails. A step that is not
    /// `fatal` only warns (with the commands to run by hand).
    Run {
        commands: Vec<Vec<String>>,
        fatal: bool,
    },
    MakeDir {
        path: PathBuf,
        meta: Meta,
    },
    SetMeta {
        path: PathBuf,
        meta: Meta,
    },
    Write {
        path: PathBuf,
        meta: Meta,
        content: Content,
    },
    /// `Ca::load_or_create(dir)`, then the key handed to `key_owner` (0600).
    CreateCa {
        dir: PathBuf,
        key_owner: String,
    },
    /// `CheckpointKey::load_or_create(path)` (the audit log's signing key and its public half
    /// beside it), then the key handed to `owner` (0600).
    CreateAuditKey {
        path: PathBuf,
        owner: String,
    },
    /// A directory in the agent's home, made without following links (`userfile::mkdir`).
    MakeUserDir {
        path: PathBuf,
        meta: Meta,
    },
    /// A whole file in the agent's home, written without following links.
    WriteUserFile {
        path: PathBuf,
        meta: Meta,
        text: String,
    },
    AddEnvBlock {
        path: PathBuf,
        meta: Meta,
        block: String,
    },
    RemoveEnvBlock {
        path: PathBuf,
        delete_if_empty: bool,
    },
    /// `agenshield proxy firewall up --config CONFIG`, in process.
    FirewallUp {
        config: PathBuf,
    },
    /// `agenshield proxy firewall down`, in process.
    FirewallDown,
    RemoveFile {
        path: PathBuf,
    },
    /// `purge`: with everything in it; otherwise only when empty by then.
    RemoveDir {
        path: PathBuf,
        purge: bool,
    },
    /// Deletes a user or group unless it is already gone when the step runs (userdel may
    /// take the user's group with it).
    DeleteAccount {
        group: bool,
        name: String,
        command: Vec<String>,
    },
    RemoveManifest,
    /// `ln -s target path`.
    Link {
        path: PathBuf,
        target: PathBuf,
    },
    /// Removes `path` if it still is a link to `target`.
    RemoveLink {
        path: PathBuf,
        target: PathBuf,
    },
    /// A config uninstall leaves: renamed to `to` (so no later start takes it for the
    /// installed one) and made root's alone.
    Retire {
        path: PathBuf,
        to: PathBuf,
    },
    /// What uninstall keeps, made unreachable for whoever later gets the ids of the accounts
    /// it deleted: under each of `paths` (not following links), a directory or file owned by
    /// one of `uids` or `gids` becomes root's with no access for group and others (a
    /// directory's content is then out of reach, and keeps its ids for a reinstall);
    /// directories root owns alone are looked into.
    CloseToRoot {
        paths: Vec<PathBuf>,
        uids: Vec<u32>,
        gids: Vec<u32>,
    },
    /// Evidence uninstall keeps (without `--purge`): nothing to run here; the final
    /// [`Action::CloseToRoot`] closes it.
    Keep {
        path: PathBuf,
    },
    /// Nothing to run: something the operator must know.
    Note,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum State {
    Todo,
    /// Already in place (or deliberately left): the reason.
    Done(String),
    Note,
}

#[derive(Debug, Clone)]
pub struct Step {
    pub summary: String,
    /// The exact command(s) or the file with mode and owner.
    pub detail: String,
    pub action: Action,
    pub state: State,
    /// What install records in the manifest once the step ran.
    pub record: Option<Created>,
    /// What uninstall drops from the manifest once the step ran (or found it done).
    pub unrecord: Option<Created>,
}

#[derive(Debug, Clone)]
pub struct Plan {
    pub title: String,
    pub steps: Vec<Step>,
}

#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error("{what} {id} is taken by {holder:?}; install needs it for {wanted:?}")]
    IdTaken {
        what: &'static str,
        id: u32,
        holder: String,
        wanted: String,
    },
    #[error("{0} exists and is not a directory")]
    NotADir(PathBuf),
    #[error("{0}")]
    Invalid(String),
}

/// Inputs besides the machine: the config text to install and whether the operator passed it.
#[derive(Debug, Clone)]
pub struct InstallInput {
    pub config_text: String,
    /// `--config FILE` given: its text replaces a config install wrote earlier.
    pub config_given: bool,
    pub default_policy: String,
    /// `--trust-system-store`: add the CA to the machine's own store as well.
    pub trust_system_store: bool,
}

fn quote(arg: &str) -> String {
    let plain = !arg.is_empty()
        && arg
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./:=,@+%".contains(c));
    if plain {
        arg.to_string()
    } else {
        format!("'{}'", arg.replace('\'', r"'\''"))
    }
}

pub fn command_line(commands: &[Vec<String>]) -> String {
    commands
        .iter()
        .map(|c| c.iter().map(|a| quote(a)).collect::<Vec<_>>().join(" "))
        .collect::<Vec<_>>()
        .join(" && ")
}

pub fn meta(mode: u32, owner: &str, group: &str) -> Meta {
    Meta {
        mode,
        owner: owner.into(),
        group: group.into(),
    }
}

pub fn meta_ok(st: &PathState, m: &Meta) -> bool {
    st.mode == m.mode && st.owner == m.owner && st.group == m.group
}

impl Plan {
    pub fn todo(&self) -> usize {
        self.steps.iter().filter(|s| s.state == State::Todo).count()
    }

    /// One line per step: number, state, what, and the command or file.
    pub fn render(&self) -> String {
        let mut out = format!("{}\n", self.title);
        for (i, s) in self.steps.iter().enumerate() {
            let tag = match &s.state {
                State::Todo => "to do".to_string(),
                State::Done(why) => why.clone(),
                State::Note => "note".to_string(),
            };
            let _ = writeln!(out, "{:>2}. [{tag}] {}: {}", i + 1, s.summary, s.detail);
        }
        let _ = writeln!(
            out,
            "{} of {} steps to do",
            self.todo(),
            self.steps.iter().filter(|s| s.state != State::Note).count()
        );
        out
    }

    /// The records the plan's steps would add: what a manifest looks like after it ran.
    pub fn records(&self) -> Vec<Created> {
        self.steps
            .iter()
            .filter(|s| s.state == State::Todo)
            .filter_map(|s| s.record.clone())
            .collect()
    }
}
