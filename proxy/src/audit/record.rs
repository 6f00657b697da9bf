//! What an audit record says. The writer adds the envelope (`v`, `seq`, `time`, `prev`,
//! `hash`, and `dropped_before` after a gap) around one of these entries.

use serde::Serialize;

/// One line of the audit log, before the writer seals it.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub(crate) enum Entry {
    Request(Box<RequestEntry>),
    Reload(ReloadEntry),
    Start(LifecycleEntry),
    Stop(LifecycleEntry),
}

impl Entry {
    /// Denials (and every other refusal) must never be dropped; allowed requests may be, if
    /// the queue is full (counted, and the gap is recorded in the next line).
    pub(crate) fn must_keep(&self) -> bool {
        match self {
            Entry::Request(r) => r.decision != "allow",
            _ => true,
        }
    }
}

/// One HTTP request (or refused connection): what was asked, what was decided, what happened.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct RequestEntry {
    /// When the request's head arrived (RFC 3339, UTC, milliseconds).
    pub started: String,
    pub request_id: String,
    pub conn_id: u64,
    /// The local user that opened the connection, when the OS told us.
    pub agent_uid: Option<u32>,
    /// The original destination (`ip:port`, or `name:port` on the explicit listener).
    pub dst: String,
    pub sni: Option<String>,
    pub host: String,
    pub port: u16,
    pub scheme: &'static str,
    pub method: String,
    /// The normalized path; query parameter values redacted unless configured otherwise.
    pub path: String,
    /// `allow`, `deny`, `limited`, `ask-approved`, `ask-denied`, `ask-timeout`, `error`.
    pub decision: &'static str,
    pub rule: Option<String>,
    pub policy: String,
    pub status: u16,
    pub bytes_up: u64,
    pub bytes_down: u64,
    /// From the request's head to the end of its response (or its abandonment).
    pub ms: f64,
    pub upstream: Option<String>,
    /// Names (never values) of the secrets injected into the request.
    pub secrets: Vec<String>,
    pub error_code: Option<&'static str>,
    /// The response did not complete: the client went away, or the upstream failed mid-body.
    pub incomplete: bool,
}

/// A policy load or reload.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct ReloadEntry {
    /// `ok` or `error`.
    pub result: &'static str,
    /// What triggered it (`start`, `file change`, `ctl reload`, `SIGHUP`…).
    pub trigger: String,
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
