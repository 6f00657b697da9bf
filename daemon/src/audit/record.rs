//! What an audit line holds. The writer adds the envelope (`v`, `seq`, `time`, `prev`,
//! `hash`, and `dropped_before` after a gap) around one of these entries. Decisions are the
//! pipeline's [`Record`], the one shape every output derives from (`docs/audit.md`).

use std::fmt;

use serde::{Serialize, Serializer};

use super::checkpoint::CheckpointEntry;
use super::repeats::RepeatedEntry;
use crate::record::{Record, RecordKind};

/// One line of the audit log, before the writer seals it: a decision's [`Record`] (which
/// carries its own `kind`), or an event of the daemon's own.
#[derive(Debug, Clone)]
pub(crate) enum Entry {
    Record(Box<Record>),
    /// Refusals like one recorded in full, counted over a window (`repeats.rs`).
    Repeated(Box<RepeatedEntry>),
    Reload(ReloadEntry),
    Start(LifecycleEntry),
    Stop(LifecycleEntry),
    /// A policy bundle applied or refused (`policy_entry.rs`).
    Policy(Box<super::PolicyEntry>),
    /// The chain head signed (`checkpoint.rs`); made by the writer only.
    Checkpoint(CheckpointEntry),
}

impl Entry {
    /// Only the record of an allowed plain HTTP request may be dropped, if the queue is full
    /// (counted, and the gap is recorded in the next line): its request then goes on. All
    /// else waits for room: refusals and errors, and the decisions of tunnels (raw TCP, an
    /// upgrade), whose bytes flow only once their record is written, and their closes.
    pub(crate) fn must_keep(&self) -> bool {
        match self {
            Entry::Record(r) => {
                !r.decision.is_allowed()
                    || r.error_code.is_some()
                    || r.kind != RecordKind::Request
                    || r.upgrade.is_some()
            }
            _ => true,
        }
    }
}

impl Serialize for Entry {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        /// `{"kind": …, fields of the entry…}`.
        #[derive(Serialize)]
        struct Tagged<'a, T: Serialize> {
            kind: &'static str,
            #[serde(flatten)]
            entry: &'a T,
        }
        match self {
            Entry::Record(r) => r.serialize(s),
            Entry::Repeated(e) => Tagged {
                kind: "repeated",
                entry: e.as_ref(),
            }
            .serialize(s),
            Entry::Reload(e) => Tagged {
                kind: "reload",
                entry: e,
            }
            .serialize(s),
            Entry::Start(e) => Tagged {
                kind: "start",
                entry: e,
            }
            .serialize(s),
            Entry::Stop(e) => Tagged {
                kind: "stop",
                entry: e,
            }
            .serialize(s),
            Entry::Policy(e) => Tagged {
                kind: "policy",
                entry: e.as_ref(),
            }
            .serialize(s),
            Entry::Checkpoint(e) => Tagged {
                kind: "checkpoint",
                entry: e,
            }
            .serialize(s),
        }
    }
}

/// An entry's fields as they go into its line: `,"kind":…,…` — the entry's JSON object
/// without its braces, so the writer only has to put the envelope around it. Made by the
/// submitter, on its own thread, so the writer role (which every shard's records wait for)
/// holds only the envelope, the hash and the write.
#[derive(Debug, Clone)]
pub(crate) struct Fields(Vec<u8>);

impl Fields {
    pub(crate) fn of(entry: &Entry) -> Fields {
        let mut out = Vec::with_capacity(768);
        if serde_json::to_writer(&mut out, entry).is_err() || out.len() < 2 {
            // Cannot happen for these types; never write half a record.
            out.clear();
            out.extend_from_slice(b"{\"kind\":\"unencodable\"}");
        }
        // `{"kind":…}` becomes `,"kind":…`.
        out[0] = b',';
        out.pop();
        Fields(out)
    }

    pub(crate) fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

/// How a policy load or reload went.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum ReloadResult {
    Ok,
    /// The new files were refused; the last good policy stays in force.
    Error,
}

impl ReloadResult {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            ReloadResult::Ok => "ok",
            ReloadResult::Error => "error",
        }
    }
}

/// What a policy load or reload was asked by: written (and logged) as a short phrase.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ReloadTrigger {
    /// The daemon starting: the first load.
    Start,
    /// An edit the watcher reported.
    FileChange,
    /// An edit found by comparing the directory (no event reported it).
    FileChangePolled,
    /// The policy directory was replaced (moved, recreated) and the watch moved to it.
    DirectoryReplaced,
    /// `ctl reload`.
    CtlReload,
    /// SIGHUP.
    Sighup,
    /// A secret was stored (by its name) while the policy in force was a refused one's
    /// predecessor: the refused one may load now.
    SecretStored(String),
    /// A policy bundle (this revision) from `[policy.source]`.
    PolicyBundle(u64),
}

impl fmt::Display for ReloadTrigger {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReloadTrigger::Start => f.write_str("start"),
            ReloadTrigger::FileChange => f.write_str("file change"),
            ReloadTrigger::FileChangePolled => f.write_str("file change (found by polling)"),
            ReloadTrigger::DirectoryReplaced => f.write_str("policy directory replaced"),
            ReloadTrigger::CtlReload => f.write_str("ctl reload"),
            ReloadTrigger::Sighup => f.write_str("SIGHUP"),
            ReloadTrigger::SecretStored(name) => write!(f, "secret {name} stored"),
            ReloadTrigger::PolicyBundle(revision) => write!(f, "policy bundle revision {revision}"),
        }
    }
}

impl Serialize for ReloadTrigger {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// A policy load or reload.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct ReloadEntry {
    pub result: ReloadResult,
    /// What triggered it (`start`, `file change`, `ctl reload`, `SIGHUP`…).
    pub trigger: ReloadTrigger,
    /// The policy in force after it.
    pub policy: String,
    pub rules: Option<usize>,
    pub error: Option<String>,
}

/// The daemon starting or stopping.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct LifecycleEntry {
    pub version: &'static str,
    pub pid: u32,
    pub policy: String,
}
