//! What the daemon tells its operators about each decision: a live feed (`ctl tail -f`), the
//! last few (`ctl tail`), and counters (`ctl stats`). The events are the decisions' records,
//! as the audit log has them (without the chain's envelope).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use serde::Serialize;
use tokio::sync::broadcast;

use crate::record::{ErrorCode, Record, RecordKind, Verdict};

/// Counters for `ctl stats` and `ctl status`.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub connections: AtomicU64,
    pub allowed: AtomicU64,
    pub denied: AtomicU64,
    pub limited: AtomicU64,
    pub asked: AtomicU64,
    pub errors: AtomicU64,
    pub reloads_ok: AtomicU64,
    pub reloads_failed: AtomicU64,
    /// Requests refused because they carried a secret's value where it is not bound.
    pub secret_leaks: AtomicU64,
    /// Requests refused because they carried a placeholder where it is not bound.
    pub secret_scope: AtomicU64,
    /// Requests that had secrets injected.
    pub secret_injections: AtomicU64,
}

#[derive(Debug, Clone, Serialize)]
pub(crate) struct CountersSnapshot {
    pub connections: u64,
    pub allowed: u64,
    pub denied: u64,
    pub limited: u64,
    pub asked: u64,
    pub errors: u64,
    pub reloads_ok: u64,
    pub reloads_failed: u64,
    pub secret_leaks: u64,
    pub secret_scope: u64,
    pub secret_injections: u64,
}

impl Counters {
    pub(crate) fn snapshot(&self) -> CountersSnapshot {
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        CountersSnapshot {
            connections: g(&self.connections),
            allowed: g(&self.allowed),
            denied: g(&self.denied),
            limited: g(&self.limited),
            asked: g(&self.asked),
            errors: g(&self.errors),
            reloads_ok: g(&self.reloads_ok),
            reloads_failed: g(&self.reloads_failed),
            secret_leaks: g(&self.secret_leaks),
            secret_scope: g(&self.secret_scope),
            secret_injections: g(&self.secret_injections),
        }
    }
}

const RECENT: usize = 200;

/// Events are shared, not copied, between the feed and the ring of recent ones.
pub(crate) type SharedEvent = Arc<Record>;

pub(crate) struct Events {
    live: broadcast::Sender<SharedEvent>,
    recent: Mutex<VecDeque<SharedEvent>>,
    pub counters: Counters,
}

impl Default for Events {
    fn default() -> Self {
        Events {
            live: broadcast::channel(1024).0,
            recent: Mutex::new(VecDeque::with_capacity(RECENT)),
            counters: Counters::default(),
        }
    }
}

impl Events {
    pub(crate) fn publish(&self, ev: SharedEvent) {
        let c = &self.counters;
        // A close record ends a tunnel already counted at its decision.
        if ev.kind != RecordKind::Close {
            match ev.decision {
                Verdict::Allow | Verdict::AskApproved => &c.allowed,
                Verdict::Deny | Verdict::AskDenied | Verdict::AskTimeout => &c.denied,
                Verdict::Limited => &c.limited,
                Verdict::Error => &c.errors,
            }
            .fetch_add(1, Ordering::Relaxed);
            match ev.error_code {
                Some(ErrorCode::SecretLeak) => c.secret_leaks.fetch_add(1, Ordering::Relaxed),
                Some(ErrorCode::SecretScope) => c.secret_scope.fetch_add(1, Ordering::Relaxed),
                _ if !ev.secrets.is_empty() => c.secret_injections.fetch_add(1, Ordering::Relaxed),
                _ => 0,
            };
        }
        if let Ok(mut recent) = self.recent.lock() {
            if recent.len() == RECENT {
                recent.pop_front();
            }
            recent.push_back(ev.clone());
        }
        // Nobody listening is fine; a slow listener loses events and is told so.
        let _ = self.live.send(ev);
    }

    pub(crate) fn subscribe(&self) -> broadcast::Receiver<SharedEvent> {
        self.live.subscribe()
    }

    pub(crate) fn recent(&self) -> Vec<SharedEvent> {
        self.recent
            .lock()
            .map(|r| r.iter().cloned().collect())
            .unwrap_or_default()
    }
}
