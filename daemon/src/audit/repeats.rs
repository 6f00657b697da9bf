//! Repeated refusals, counted instead of written one by one. An agent that asks for a
//! million names no rule allows (or sends a million requests the policy refuses) would
//! otherwise write a million records: the files that hold everyone's history rotate away and
//! every agent's records queue behind them. So the same refusal from the same agent within
//! `audit.refusal_window` becomes one record with a count:
//!
//! - the first is recorded in full, at once, like any refusal (a reviewer sees at once that
//!   something was refused, and what);
//! - those that follow within the window are counted, with the first and last time and a
//!   few of the hosts asked for;
//! - when the window closes (the audit ticker looks every 100 ms), and at stop, one
//!   `repeated` record says how many there were; the next refusal after that is recorded in
//!   full again and opens a new window.
//!
//! "The same refusal" is the agent's uid, the record's kind, protocol and listener, the
//! decision, the error code, the rule and the policy: not the host, port or path, which a
//! flood varies. Only refusals made before anything reached an upstream are counted (an
//! upstream failure, a client gone, an allowed decision is always written in full), so a
//! record is still written before any side effect.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Serialize;
use tokio::time::Instant;

use crate::record::{ErrorCode, ListenerKind, Protocol, Record, RecordKind, RequestId, Verdict};

/// Windows open at once at most; a refusal of yet another kind past it is written in full.
const MAX_OPEN: usize = 4096;
/// Distinct hosts a `repeated` record names at most (a sample, not a list).
pub(crate) const MAX_HOSTS: usize = 8;

/// The `repeated` record: how many refusals like the one recorded as `of` followed it
/// within its window.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct RepeatedEntry {
    /// The `request_id` of the refusal recorded in full that opened the window.
    pub of: RequestId,
    /// Its kind (`request`, `connection`, `query`).
    pub of_kind: RecordKind,
    pub protocol: Protocol,
    pub listener: ListenerKind,
    pub agent_uid: Option<u32>,
    pub decision: Verdict,
    pub rule: Option<Arc<str>>,
    pub policy: Arc<str>,
    pub error_code: ErrorCode,
    /// Refusals counted after `of` (at least 1).
    pub count: u64,
    /// When the first and the last of them started.
    pub first: Arc<str>,
    pub last: Arc<str>,
    /// Up to [`MAX_HOSTS`] distinct hosts among them, redacted as their records would be.
    pub hosts: Vec<Arc<str>>,
}

/// What [`Repeats::note`] made of a record.
pub(crate) enum Noted {
    /// Write it in full; if a window of its kind had closed unseen, write that first.
    Write(Option<RepeatedEntry>),
    /// Counted in its window: nothing to write now.
    Counted,
}

/// What makes two refusals the same.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Key {
    uid: Option<u32>,
    kind: &'static str,
    protocol: &'static str,
    listener: &'static str,
    decision: &'static str,
    code: &'static str,
    rule: Option<Arc<str>>,
    policy: Arc<str>,
}

struct Window {
    opened: Instant,
    entry: RepeatedEntry,
}

pub(crate) struct Repeats {
    window: Duration,
    open: Mutex<HashMap<Key, Window>>,
}

impl Repeats {
    /// `window` zero: nothing is counted, every refusal is written.
    pub(crate) fn new(window: Duration) -> Repeats {
        Repeats {
            window,
            open: Mutex::new(HashMap::new()),
        }
    }

    /// Counts `r` if it repeats a refusal recorded within the window; else it opens one.
    pub(crate) fn note(&self, r: &Record, now: Instant) -> Noted {
        if self.window.is_zero() {
            return Noted::Write(None);
        }
        let Some(key) = key(r) else {
            return Noted::Write(None);
        };
        let mut open = match self.open.lock() {
            Ok(o) => o,
            Err(p) => p.into_inner(),
        };
        let mut closed = None;
        if let Some(w) = open.get_mut(&key) {
            if now < w.opened + self.window {
                let e = &mut w.entry;
                if e.count == 0 {
                    e.first = r.started.clone();
                }
                e.count += 1;
                e.last = r.started.clone();
                if e.hosts.len() < MAX_HOSTS && !e.hosts.contains(&r.host) {
                    e.hosts.push(r.host.clone());
                }
                return Noted::Counted;
            }
            closed = open.remove(&key).and_then(|w| counted(w.entry));
        }
        if open.len() < MAX_OPEN {
            open.insert(
                key,
                Window {
                    opened: now,
                    entry: opening(r),
                },
            );
        }
        Noted::Write(closed)
    }

    /// Closes the windows that are over; the `repeated` records to write (those that
    /// counted anything).
    pub(crate) fn due(&self, now: Instant) -> Vec<RepeatedEntry> {
        let mut open = match self.open.lock() {
            Ok(o) => o,
            Err(p) => p.into_inner(),
        };
        if open.is_empty() {
            return Vec::new();
        }
        let window = self.window;
        let mut out = Vec::new();
        open.retain(|_, w| {
            if now < w.opened + window {
                return true;
            }
            out.extend(counted(w.entry.clone()));
            false
        });
        out
    }

    /// Closes every window (the daemon is stopping): nothing counted is lost.
    pub(crate) fn drain(&self) -> Vec<RepeatedEntry> {
        let mut open = match self.open.lock() {
            Ok(o) => o,
            Err(p) => p.into_inner(),
        };
        open.drain().filter_map(|(_, w)| counted(w.entry)).collect()
    }
}

fn counted(e: RepeatedEntry) -> Option<RepeatedEntry> {
    (e.count > 0).then_some(e)
}

/// The window a refusal recorded in full opens.
fn opening(r: &Record) -> RepeatedEntry {
    RepeatedEntry {
        of: r.request_id,
        of_kind: r.kind,
        protocol: r.protocol,
        listener: r.listener,
        agent_uid: r.agent_uid,
        decision: r.decision,
        rule: r.rule.clone(),
        policy: r.policy.clone(),
        error_code: r.error_code.unwrap_or(ErrorCode::PolicyDenied),
        count: 0,
        first: r.started.clone(),
        last: r.started.clone(),
        hosts: Vec::new(),
    }
}

/// `Some` for a refusal that may be counted: a decision that let nothing through and
/// reached no upstream.
fn key(r: &Record) -> Option<Key> {
    let code = r.error_code?;
    if r.decision.is_allowed() || r.incomplete || !before_upstream(code) {
        return None;
    }
    let kind = match r.kind {
        RecordKind::Request => "request",
        RecordKind::Connection => "connection",
        RecordKind::Query => "query",
        RecordKind::Close => return None,
    };
    let listener = match r.listener {
        ListenerKind::Transparent => "transparent",
        ListenerKind::Explicit => "explicit",
        ListenerKind::Dns => "dns",
    };
    Some(Key {
        uid: r.agent_uid,
        kind,
        protocol: r.protocol.as_str(),
        listener,
        decision: r.decision.as_str(),
        code: code.as_str(),
        rule: r.rule.clone(),
        policy: r.policy.clone(),
    })
}

/// Refusals the proxy makes before anything is sent upstream. An upstream failure (the
/// request, or the name to resolve, may have been sent) and a client that went away are
/// written in full, each time.
fn before_upstream(code: ErrorCode) -> bool {
    match code {
        ErrorCode::PolicyDenied
        | ErrorCode::RateLimited
        | ErrorCode::RateLimitStoreUnavailable
        | ErrorCode::Busy
        | ErrorCode::HostMismatch
        | ErrorCode::DestinationForbidden
        | ErrorCode::SecretScope
        | ErrorCode::SecretLeak
        | ErrorCode::SecretUnavailable
        | ErrorCode::BadRequest
        | ErrorCode::AuditUnavailable
        | ErrorCode::HeadTooLarge
        | ErrorCode::ClientRejectedCa
        | ErrorCode::TlsHandshakeFailed
        | ErrorCode::BadClientHello
        | ErrorCode::UpgradeRefused
        | ErrorCode::ConnectionBudget
        | ErrorCode::QueryTypeRefused
        | ErrorCode::UnknownUser
        | ErrorCode::UserNotAdmitted
        | ErrorCode::SecretNotForUser
        | ErrorCode::PolicyUnavailable
        | ErrorCode::CredentialExfiltration
        | ErrorCode::TokenBudgetExhausted => true,
        // Our resolver was asked: the name left the machine.
        ErrorCode::UpstreamDns
        | ErrorCode::UpstreamConnect
        | ErrorCode::UpstreamTls
        | ErrorCode::UpstreamError
        | ErrorCode::ClientGone => false,
        // Each names its own method and tool (`mcp`), which a repeat count would lose.
        ErrorCode::McpToolDenied | ErrorCode::McpToolChanged | ErrorCode::McpBodyInvalid => false,
    }
}

#[cfg(test)]
#[path = "repeats_tests.rs"]
mod tests;
