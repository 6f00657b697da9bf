//! `ask` rules: the request waits (bounded) until an operator approves or denies it with
//! `ctl pending approve|deny ID`; no answer in time is a denial.
//!
//! The queue is shared per agent: each agent (uid; connections of unknown owner count as one)
//! may have [`MAX_PENDING_PER_AGENT`] requests waiting, so one agent that parks requests
//! cannot lock the others out of asking. [`MAX_PENDING`] bounds every agent together (what
//! the daemon holds in memory); reaching it takes 16 agents each at its quota.
//!
//! `approve --remember` lets later requests through, for the daemon's lifetime, only when
//! they are the approved one again: the same agent, rule, method, host, port and path
//! (the query may differ).
//!
//! A [`Notify`] (the webhook, `webhook.rs`) hears of each request as it starts to wait; what
//! it does with it runs off the request's path and cannot lose the request.

mod notice;
pub(crate) mod webhook;

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use serde::{Serialize, Serializer};
use time::OffsetDateTime;
use tokio::sync::oneshot;

use crate::clock::rfc3339;
use crate::ratelimit::AgentKey;

/// A request an `ask` rule holds, as the data path describes it. Method, host and path are
/// as shown to the operator: redacted (a secret's value never reaches `ctl pending`), so text.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Asked {
    /// The local user whose request waits, when the OS could tell.
    pub agent_uid: Option<u32>,
    pub client: SocketAddr,
    pub method: String,
    pub host: String,
    pub port: u16,
    pub path: String,
    /// `scheme://authority/path?query`, secrets redacted and query values `[redacted]`
    /// (names kept): what a person outside this machine (the webhook) may be shown.
    pub url: String,
    pub rule_id: String,
}

/// A request waiting for an operator's answer, as `ctl pending` lists it.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct PendingRequest {
    pub id: PendingId,
    #[serde(serialize_with = "timestamp")]
    pub since: OffsetDateTime,
    /// When it is refused unanswered (`approvals.timeout` after `since`).
    #[serde(serialize_with = "timestamp")]
    pub expires: OffsetDateTime,
    #[serde(flatten)]
    pub asked: Asked,
}

/// A pending request's id, `p1`, `p2`, …: given in the order requests were held.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct PendingId(u64);

impl PendingId {
    /// The id `ctl pending approve|deny` names, exactly as it was shown.
    pub(crate) fn parse(s: &str) -> Option<PendingId> {
        let id = PendingId(s.strip_prefix('p')?.parse().ok()?);
        (id.to_string() == s).then_some(id)
    }
}

impl fmt::Display for PendingId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "p{}", self.0)
    }
}

impl Serialize for PendingId {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

fn timestamp<S: Serializer>(t: &OffsetDateTime, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&rfc3339(*t))
}

/// Requests one agent may have waiting at once; more are refused at once (an agent must not
/// be able to park unbounded work in the daemon, nor take the others' places).
pub(crate) const MAX_PENDING_PER_AGENT: usize = 256;
/// Requests all agents together may have waiting.
pub(crate) const MAX_PENDING: usize = 16 * MAX_PENDING_PER_AGENT;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AskOutcome {
    /// This agent already has its quota of requests waiting.
    AgentFull,
    /// All agents together have [`MAX_PENDING`] requests waiting.
    Full,
    Approved,
    /// Approved earlier with `--remember`.
    Remembered,
    Denied,
    TimedOut,
}

#[derive(Debug, Clone, Copy)]
struct Verdict {
    approve: bool,
    remember: bool,
}

/// What `--remember` covers: this agent's request, exactly as approved (query aside).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct RememberKey {
    agent: AgentKey,
    rule_id: String,
    method: String,
    host: String,
    port: u16,
    path: String,
}

impl RememberKey {
    fn of(req: &Asked) -> RememberKey {
        RememberKey {
            agent: AgentKey::of(req.agent_uid),
            rule_id: req.rule_id.clone(),
            method: req.method.clone(),
            host: req.host.clone(),
            port: req.port,
            path: req.path.clone(),
        }
    }
}

/// The requests waiting now, and how many each agent has among them.
#[derive(Default)]
struct Waiting {
    by_id: HashMap<PendingId, (PendingRequest, oneshot::Sender<Verdict>)>,
    per_agent: HashMap<AgentKey, usize>,
}

impl Waiting {
    fn remove(&mut self, id: PendingId) -> Option<(PendingRequest, oneshot::Sender<Verdict>)> {
        let entry = self.by_id.remove(&id)?;
        let agent = AgentKey::of(entry.0.asked.agent_uid);
        if let Some(n) = self.per_agent.get_mut(&agent) {
            *n -= 1;
            if *n == 0 {
                self.per_agent.remove(&agent);
            }
        }
        Some(entry)
    }
}

/// Told of each request that starts to wait (after it is listed, before the wait).
pub(crate) trait Notify: Send + Sync {
    /// Must not block: the request's own task calls it.
    fn held(&self, req: &PendingRequest);
}

pub(crate) struct Approvals {
    timeout: Duration,
    notify: Option<Box<dyn Notify>>,
    per_agent: usize,
    total: usize,
    next: AtomicU64,
    waiting: Mutex<Waiting>,
    remembered: Mutex<HashSet<RememberKey>>,
}

#[derive(Debug, thiserror::Error)]
#[error("no pending request with id {0}")]
pub(crate) struct NotPending(pub String);

impl Approvals {
    pub(crate) fn new(timeout: Duration) -> Approvals {
        Approvals::with_limits(timeout, MAX_PENDING_PER_AGENT, MAX_PENDING)
    }

    fn with_limits(timeout: Duration, per_agent: usize, total: usize) -> Approvals {
        Approvals {
            timeout,
            notify: None,
            per_agent,
            total,
            next: AtomicU64::new(1),
            waiting: Mutex::new(Waiting::default()),
            remembered: Mutex::new(HashSet::new()),
        }
    }

    /// Tells `notify` of every request that starts to wait.
    pub(crate) fn notifying(self, notify: Box<dyn Notify>) -> Approvals {
        Approvals {
            notify: Some(notify),
            ..self
        }
    }

    /// Holds the caller until a verdict or the timeout.
    pub(crate) async fn ask(&self, asked: Asked) -> AskOutcome {
        let key = RememberKey::of(&asked);
        if self.remembered.lock().is_ok_and(|r| r.contains(&key)) {
            return AskOutcome::Remembered;
        }
        let since = OffsetDateTime::now_utc();
        let req = PendingRequest {
            id: PendingId(self.next.fetch_add(1, Ordering::Relaxed)),
            since,
            expires: since + self.timeout,
            asked,
        };
        let id = req.id;
        let shown = self.notify.as_ref().map(|_| req.clone());
        let (tx, rx) = oneshot::channel();
        {
            let Ok(mut w) = self.waiting.lock() else {
                return AskOutcome::Full;
            };
            let mine = w.per_agent.get(&key.agent).copied().unwrap_or(0);
            if mine >= self.per_agent {
                return AskOutcome::AgentFull;
            }
            if w.by_id.len() >= self.total {
                return AskOutcome::Full;
            }
            w.by_id.insert(id, (req, tx));
            *w.per_agent.entry(key.agent).or_default() += 1;
        }
        // Removed however this ends, including when the agent gives up and the future drops.
        let _entry = Entry {
            approvals: self,
            id,
        };
        tracing::warn!(pending = %id, agent = %key.agent, "request held for approval: agenshield proxy ctl pending approve {id}");
        if let (Some(notify), Some(req)) = (&self.notify, shown) {
            notify.held(&req);
        }
        match tokio::time::timeout(self.timeout, rx).await {
            Ok(Ok(v)) if v.approve => {
                if v.remember {
                    if let Ok(mut r) = self.remembered.lock() {
                        r.insert(key);
                    }
                }
                AskOutcome::Approved
            }
            Ok(_) => AskOutcome::Denied,
            Err(_) => AskOutcome::TimedOut,
        }
    }

    /// How many requests wait now.
    pub(crate) fn len(&self) -> usize {
        self.waiting.lock().map(|w| w.by_id.len()).unwrap_or(0)
    }

    pub(crate) fn list(&self) -> Vec<PendingRequest> {
        let mut v: Vec<PendingRequest> = self
            .waiting
            .lock()
            .map(|w| w.by_id.values().map(|(r, _)| r.clone()).collect())
            .unwrap_or_default();
        v.sort_by(|a, b| a.since.cmp(&b.since).then(a.id.cmp(&b.id)));
        v
    }

    /// Answers a pending request.
    pub(crate) fn decide(
        &self,
        id: &str,
        approve: bool,
        remember: bool,
    ) -> Result<PendingRequest, NotPending> {
        let entry = PendingId::parse(id)
            .and_then(|id| self.waiting.lock().ok().and_then(|mut w| w.remove(id)));
        let Some((req, tx)) = entry else {
            return Err(NotPending(id.to_string()));
        };
        // The waiter may have just timed out; the operator is still told what they answered.
        let _ = tx.send(Verdict { approve, remember });
        Ok(req)
    }

    pub(crate) fn timeout(&self) -> Duration {
        self.timeout
    }

    /// What one agent may have waiting at once.
    pub(crate) fn per_agent(&self) -> usize {
        self.per_agent
    }

    /// What all agents together may have waiting at once.
    pub(crate) fn total(&self) -> usize {
        self.total
    }
}

struct Entry<'a> {
    approvals: &'a Approvals,
    id: PendingId,
}

impl Drop for Entry<'_> {
    fn drop(&mut self) {
        if let Ok(mut w) = self.approvals.waiting.lock() {
            w.remove(self.id);
        }
    }
}

#[cfg(test)]
#[path = "approvals_tests.rs"]
mod tests;
