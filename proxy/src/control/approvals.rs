//! `ask` rules: the request waits (bounded) until an operator approves or denies it with
//! `ctl pending approve|deny ID`; no answer in time is a denial. `approve --remember` lets
//! later requests the same rule asks about, to the same host and port, through for the
//! daemon's lifetime.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use serde::Serialize;
use tokio::sync::oneshot;

use crate::clock::now_rfc3339;

#[derive(Debug, Clone, Serialize)]
pub(crate) struct PendingRequest {
    pub id: String,
    pub since: String,
    pub client: String,
    pub method: String,
    pub host: String,
    pub port: u16,
    pub path: String,
    pub rule_id: String,
}

/// Requests that may wait at once; more are refused at once (an agent must not be able to
/// park unbounded work in the daemon).
pub(crate) const MAX_PENDING: usize = 256;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AskOutcome {
    /// Too many requests already wait for an answer.
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

type SessionKey = (String, String, u16);

pub(crate) struct Approvals {
    timeout: Duration,
    next: AtomicU64,
    waiting: Mutex<HashMap<String, (PendingRequest, oneshot::Sender<Verdict>)>>,
    remembered: Mutex<HashSet<SessionKey>>,
}

#[derive(Debug, thiserror::Error)]
#[error("no pending request with id {0}")]
pub(crate) struct NotPending(pub String);

impl Approvals {
    pub(crate) fn new(timeout: Duration) -> Approvals {
        Approvals {
            timeout,
            next: AtomicU64::new(1),
            waiting: Mutex::new(HashMap::new()),
            remembered: Mutex::new(HashSet::new()),
        }
    }

    /// Holds the caller until a verdict or the timeout. `req.id` is assigned here.
    pub(crate) async fn ask(&self, mut req: PendingRequest) -> AskOutcome {
        let key = (req.rule_id.clone(), req.host.clone(), req.port);
        if self.remembered.lock().is_ok_and(|r| r.contains(&key)) {
            return AskOutcome::Remembered;
        }
        req.id = format!("p{}", self.next.fetch_add(1, Ordering::Relaxed));
        req.since = now_rfc3339();
        let id = req.id.clone();
        let (tx, rx) = oneshot::channel();
        match self.waiting.lock() {
            Ok(mut w) if w.len() < MAX_PENDING => {
                w.insert(id.clone(), (req, tx));
            }
            _ => return AskOutcome::Full,
        }
        // Removed however this ends, including when the agent gives up and the future drops.
        let _entry = Entry {
            approvals: self,
            id: &id,
        };
        tracing::warn!(pending = %id, "request held for approval: agenshield proxy ctl pending approve {id}");
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
        self.waiting.lock().map(|w| w.len()).unwrap_or(0)
    }

    pub(crate) fn list(&self) -> Vec<PendingRequest> {
        let mut v: Vec<PendingRequest> = self
            .waiting
            .lock()
            .map(|w| w.values().map(|(r, _)| r.clone()).collect())
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
        let entry = self.waiting.lock().ok().and_then(|mut w| w.remove(id));
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
}

struct Entry<'a> {
    approvals: &'a Approvals,
    id: &'a str,
}

impl Drop for Entry<'_> {
    fn drop(&mut self) {
        if let Ok(mut w) = self.approvals.waiting.lock() {
            w.remove(self.id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn req() -> PendingRequest {
        PendingRequest {
            id: String::new(),
            since: String::new(),
            client: "127.0.0.1:1".into(),
            method: "POST".into(),
            host: "api.test".into(),
            port: 443,
            path: "/x".into(),
            rule_id: "ask-api".into(),
        }
    }

    /// Starts a request that asks, and waits until it is listed as pending.
    async fn held(a: &Arc<Approvals>) -> (tokio::task::JoinHandle<AskOutcome>, String) {
        let waiter = tokio::spawn({
            let a = a.clone();
            async move { a.ask(req()).await }
        });
        loop {
            if let Some(p) = a.list().first() {
                return (waiter, p.id.clone());
            }
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test(start_paused = true)]
    async fn unanswered_request_times_out_and_is_forgotten() {
        let a = Approvals::new(Duration::from_secs(30));
        let out = a.ask(req()).await;
        assert_eq!(out, AskOutcome::TimedOut);
        assert!(a.list().is_empty());
    }

    #[tokio::test]
    async fn approval_releases_and_remember_covers_the_next_one() {
        let a = Arc::new(Approvals::new(Duration::from_secs(30)));
        let (waiter, id) = held(&a).await;
        a.decide(&id, true, true).expect("pending");
        assert_eq!(waiter.await.expect("join"), AskOutcome::Approved);
        assert_eq!(a.ask(req()).await, AskOutcome::Remembered);
        assert!(a.decide("p999", true, false).is_err());
    }

    #[tokio::test]
    async fn denial_is_a_denial() {
        let a = Arc::new(Approvals::new(Duration::from_secs(30)));
        let (waiter, id) = held(&a).await;
        a.decide(&id, false, false).expect("pending");
        assert_eq!(waiter.await.expect("join"), AskOutcome::Denied);
    }
}
