//! The audit log: one JSON line per decision and per policy (re)load, hash-chained
//! (`chain.rs`), written by one task fed through a bounded queue (`writer.rs`), verified by
//! `ctl audit verify` (`verify.rs`).
//!
//! The guarantee: a request's record is written to the file (one `write(2)` per batch, no
//! user-space buffer) before the last byte of its response is released to the agent, so
//! every request the agent saw complete is in the log even if the daemon is then killed;
//! the file is fsynced within 100 ms of a write and on stop (the window for a power loss).
//! A full queue never drops a refusal (its request waits); an allowed request's record may
//! be dropped then, which is counted and written into the next record (`dropped_before`).

pub mod chain;
pub mod record;
pub mod verify;
mod writer;

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::{mpsc, oneshot};

pub use record::{Entry, LifecycleEntry, ReloadEntry, RequestEntry};
pub use writer::{rotated, Head};
use writer::{Msg, Writer};

use crate::config::AuditConfig;
use crate::metrics::Metrics;

/// Records queued at most; a request waits for its own record, so this bounds records in
/// flight, not requests.
const QUEUE: usize = 8192;

pub struct Audit {
    tx: mpsc::Sender<Msg>,
    dropped: Arc<AtomicU64>,
    metrics: Arc<Metrics>,
    head: Arc<Mutex<Head>>,
    path: std::path::PathBuf,
}

impl Audit {
    /// Opens (or creates) the log and starts its writer task (call within the runtime).
    pub fn open(path: &Path, cfg: &AuditConfig, metrics: Arc<Metrics>) -> std::io::Result<Audit> {
        let dropped = Arc::new(AtomicU64::new(0));
        let head = Arc::new(Mutex::new(Head {
            seq: 0,
            hash: chain::GENESIS.to_string(),
        }));
        let writer = Writer::open(
            path,
            cfg.max_bytes,
            cfg.keep,
            dropped.clone(),
            metrics.clone(),
            head.clone(),
        )?;
        let (tx, rx) = mpsc::channel(QUEUE);
        tokio::spawn(writer.run(rx));
        Ok(Audit {
            tx,
            dropped,
            metrics,
            head,
            path: path.to_path_buf(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The last record written: its sequence number and hash.
    pub fn head(&self) -> Head {
        self.head.lock().map(|h| h.clone()).unwrap_or(Head {
            seq: 0,
            hash: String::new(),
        })
    }

    /// Queues `entry` and waits until it is in the file. A refusal waits for room in the
    /// queue; an allowed request's record is dropped (and counted) if there is none.
    pub async fn write(self: &Arc<Self>, entry: Entry) {
        if let Some(written) = self.submit(entry) {
            // An error means the writer is gone (the daemon is stopping).
            let _ = written.await;
        }
    }

    /// Queues `entry`; the receiver resolves once it is in the file. `None`: dropped (an
    /// allowed request's record and a full queue, counted) or the writer is gone. A record
    /// that must be kept and finds the queue full is handed to a task that waits for room.
    pub fn submit(self: &Arc<Self>, entry: Entry) -> Option<oneshot::Receiver<()>> {
        let (ack, written) = oneshot::channel();
        let keep = entry.must_keep();
        let msg = Msg::Entry {
            time: crate::events::now_rfc3339(),
            entry,
            ack: Some(ack),
        };
        match self.tx.try_send(msg) {
            Ok(()) => Some(written),
            Err(mpsc::error::TrySendError::Full(msg)) if keep => {
                let tx = self.tx.clone();
                tokio::spawn(async move {
                    let _ = tx.send(msg).await;
                });
                Some(written)
            }
            Err(mpsc::error::TrySendError::Full(_)) => {
                self.count_drop();
                None
            }
            Err(mpsc::error::TrySendError::Closed(_)) => None,
        }
    }

    /// Queues `entry` without waiting for the write (a request whose client went away).
    pub fn write_detached(self: &Arc<Self>, entry: Entry) {
        drop(self.submit(entry));
    }

    fn count_drop(&self) {
        self.dropped.fetch_add(1, Ordering::Relaxed);
        self.metrics.audit_dropped.inc();
    }

    /// Everything queued before this call is written and fsynced when it returns.
    pub async fn sync(&self) {
        let (done, synced) = oneshot::channel();
        if self.tx.send(Msg::Sync(done)).await.is_ok() {
            let _ = synced.await;
        }
    }
}

/// `path?query` as the audit log records it: query parameter values replaced by
/// `[redacted]` (names kept) unless `keep_values`.
pub fn shown_path(path: &str, query: Option<&str>, keep_values: bool) -> String {
    let Some(q) = query.filter(|q| !q.is_empty()) else {
        return path.to_string();
    };
    if keep_values {
        return format!("{path}?{q}");
    }
    let params: Vec<String> = q
        .split('&')
        .map(|p| match p.split_once('=') {
            Some((k, _)) => format!("{k}=[redacted]"),
            None => p.to_string(),
        })
        .collect();
    format!("{path}?{}", params.join("&"))
}

#[cfg(test)]
mod tests;
