//! The audit log: one JSON line per decision and per policy (re)load, hash-chained
//! (`chain.rs`), written by one writer at a time from a bounded queue (`writer.rs`), verified by
//! `ctl audit verify` (`verify.rs`).
//!
//! The guarantee: a request's record is written to the file (one `write(2)` per batch, no
//! user-space buffer) before the last byte of its response is released to the agent, so
//! every request the agent saw complete is in the log even if the daemon is then killed;
//! the file is fsynced within 100 ms of a write and on stop (the window for a power loss).
//! A full queue never drops a refusal (its request waits); an allowed request's record may
//! be dropped then, which is counted and written into the next record (`dropped_before`).
//! One agent's repeated refusals are counted over a window and written as one record
//! (`repeats.rs`); rotation never deletes a file younger than `audit.retention`: requests are
//! refused instead (`retention.rs`). Every `audit.checkpoint_every` records or
//! `audit.checkpoint_interval` the writer signs the chain head into the log (`checkpoint.rs`).

pub(crate) mod chain;
pub mod checkpoint;
pub mod checkpoint_key;
mod checkpoint_schedule;
pub mod checkpoint_verify;
pub(crate) mod export;
mod health;
mod metrics;
mod policy_entry;
pub(crate) mod record;
mod repeats;
mod retention;
mod rotation;
pub mod verify;
mod writer;

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::{mpsc, oneshot};

pub use checkpoint_key::{CheckpointKey, KeyOrigin};
use health::Health;
pub(crate) use health::NotReady;
pub(crate) use metrics::AuditMetrics;
pub(crate) use policy_entry::{BundleOrigin, BundleOutcome, BundleRefusal, PolicyEntry};
pub(crate) use record::{Entry, Fields, LifecycleEntry, ReloadEntry, ReloadResult, ReloadTrigger};
use repeats::{Noted, Repeats};
pub use writer::{preflight, Head};
use writer::{Msg, Writer};

use crate::config::AuditConfig;

/// Records queued at most; a request waits for its own record, so this bounds records in
/// flight, not requests.
const QUEUE: usize = 8192;

/// Records sealed and written in one `write(2)` at most.
const BATCH: usize = 1024;
/// Times one `drive` goes back to the queue at most.
const DRIVE_ROUNDS: usize = 4;

pub(crate) struct Audit {
    tx: mpsc::Sender<Msg>,
    /// The writer role: whoever holds it drains the queue into the file.
    core: Mutex<Core>,
    dropped: Arc<AtomicU64>,
    metrics: AuditMetrics,
    path: std::path::PathBuf,
    health: Arc<Health>,
    /// Refusals counted over their window instead of written one by one.
    repeats: Repeats,
    /// The export sinks' tasks (`export/`), once started.
    exports: Mutex<Option<export::Exports>>,
}

impl Audit {
    /// Opens (or creates) the log and starts its ticker (periodic fsync, and a backstop
    /// drain of the queue); call within the runtime.
    /// `key`: the checkpoint key (`None`: no checkpoints, whatever `cfg` says).
    pub(crate) fn open(
        path: &Path,
        cfg: &AuditConfig,
        metrics: AuditMetrics,
        key: Option<CheckpointKey>,
    ) -> std::io::Result<Arc<Audit>> {
        let dropped = Arc::new(AtomicU64::new(0));
        let health = Arc::new(Health::new(
            path,
            metrics.ready.clone(),
            metrics.retention_blocked.clone(),
        ));
        health.check_space();
        let writer = Writer::open(
            path,
            writer::Rotation {
                max_bytes: cfg.max_bytes,
                keep: cfg.keep,
                retention: cfg.retention,
            },
            dropped.clone(),
            metrics.clone(),
            health.clone(),
            key.map(|k| (k, checkpoint_cadence(cfg))),
        )?;
        let (tx, rx) = mpsc::channel(QUEUE);
        let audit = Arc::new(Audit {
            tx,
            core: Mutex::new(Core {
                rx,
                writer,
                batch: Vec::with_capacity(BATCH),
                buf: Vec::with_capacity(64 * 1024),
            }),
            dropped,
            metrics,
            path: path.to_path_buf(),
            health,
            repeats: Repeats::new(cfg.refusal_window),
            exports: Mutex::new(None),
        });
        let weak = Arc::downgrade(&audit);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(writer::SYNC_EVERY);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let Some(audit) = weak.upgrade() else { return };
                for e in audit.repeats.due(tokio::time::Instant::now()) {
                    drop(audit.enqueue(Entry::Repeated(Box::new(e))));
                }
                audit.drive();
                audit.checkpoint_if_due();
                audit.sync_if_due();
                audit.recheck_retention();
                audit.health.check_space();
            }
        });
        Ok(audit)
    }

    /// Takes the writer role if it is free and drains the queue into the file; gives the
    /// role up and looks again, so a record queued while it was held is not left behind.
    /// (Waiting for the role instead measured no better: bench/observability.sh.)
    pub(crate) fn drive(&self) {
        // Bounded: under steady load one request must not write everyone's records for ever
        // while its own response waits; what is left goes to the next submitter (or the
        // ticker).
        for _ in 0..DRIVE_ROUNDS {
            let mut core = match self.core.try_lock() {
                Ok(core) => core,
                Err(std::sync::TryLockError::WouldBlock) => return,
                Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
            };
            let Core {
                rx,
                writer,
                batch,
                buf,
            } = &mut *core;
            while let Ok(m) = rx.try_recv() {
                batch.push(m);
                if batch.len() == BATCH {
                    writer.write_batch(batch, buf);
                }
            }
            if !batch.is_empty() {
                writer.write_batch(batch, buf);
            }
            drop(core);
            if self.tx.capacity() == self.tx.max_capacity() {
                return;
            }
        }
    }

    /// Writes a checkpoint if a record has waited `audit.checkpoint_interval` for one.
    fn checkpoint_if_due(&self) {
        let mut core = match self.core.try_lock() {
            Ok(core) => core,
            Err(std::sync::TryLockError::WouldBlock) => return,
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
        };
        let Core {
            writer, batch, buf, ..
        } = &mut *core;
        if writer.checkpoint_due() {
            batch.push(Msg::Checkpoint(None));
            writer.write_batch(batch, buf);
        }
    }

    /// Signs the chain head now (if a record came since the last checkpoint) and waits until
    /// that is in the file: at a clean stop, so the log ends signed.
    pub(crate) async fn checkpoint(&self) {
        let (done, written) = oneshot::channel();
        if self.tx.send(Msg::Checkpoint(Some(done))).await.is_ok() {
            self.drive();
            let _ = written.await;
        }
    }

    /// Starts an fsync on the blocking pool if a write has waited `SYNC_EVERY` for one.
    fn sync_if_due(&self) {
        // Never wait for the role here: a holder is writing, and the next tick comes.
        let due = match self.core.try_lock() {
            Ok(mut core) => core.writer.due_sync(),
            Err(std::sync::TryLockError::WouldBlock) => return,
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner().writer.due_sync(),
        };
        if let Some((file, path)) = due {
            let metrics = self.metrics.clone();
            tokio::task::spawn_blocking(move || writer::fsync(&file, &path, &metrics));
        }
    }

    /// While rotation is held back by the retention, looks again whether it may go on (the
    /// oldest file aged, or was archived away), at most once a second.
    fn recheck_retention(&self) {
        if !self.health.retention_blocked() {
            return;
        }
        let mut core = match self.core.try_lock() {
            Ok(core) => core,
            Err(std::sync::TryLockError::WouldBlock) => return,
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
        };
        core.writer.recheck_retention();
    }

    /// Starts shipping the log to `cfg.export`'s sinks (none: nothing to do), and lets
    /// rotation wait for them.
    pub(crate) fn start_exports(
        self: &Arc<Self>,
        cfg: &AuditConfig,
        metrics: &export::ExportMetrics,
    ) -> Result<(), export::ExportError> {
        if cfg.export.is_empty() {
            return Ok(());
        }
        let weak = Arc::downgrade(self);
        let head: Arc<dyn Fn() -> Option<u64> + Send + Sync> =
            Arc::new(move || weak.upgrade().map(|a| a.head().seq));
        let (exports, hold) = export::start(&cfg.export, &self.path, cfg.keep, metrics, head)?;
        let hold = Arc::new(hold);
        match self.core.lock() {
            Ok(mut core) => core.writer.set_export_hold(hold),
            Err(p) => p.into_inner().writer.set_export_hold(hold),
        }
        match self.exports.lock() {
            Ok(mut e) => *e = Some(exports),
            Err(p) => *p.into_inner() = Some(exports),
        }
        Ok(())
    }

    /// Each export sink's state (empty without `[[audit.export]]`).
    pub(crate) fn export_status(&self) -> Vec<export::ExportStatus> {
        match self.exports.lock() {
            Ok(e) => e.as_ref().map(|e| e.status()).unwrap_or_default(),
            Err(p) => p
                .into_inner()
                .as_ref()
                .map(|e| e.status())
                .unwrap_or_default(),
        }
    }

    /// Lets the sinks ship what is in the log (up to `within`) and stops them: at stop,
    /// after the stop record.
    pub(crate) async fn finish_exports(&self, within: std::time::Duration) {
        let exports = match self.exports.lock() {
            Ok(mut e) => e.take(),
            Err(p) => p.into_inner().take(),
        };
        if let Some(e) = exports {
            e.finish(within).await;
        }
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// `Err(why)` while the log cannot take records (its last write failed, or its file
    /// system is nearly full): nothing new may happen until it can.
    pub(crate) fn ready(&self) -> Result<(), NotReady> {
        self.health.ready()
    }

    /// The last record written: its sequence number and hash.
    pub(crate) fn head(&self) -> Head {
        match self.core.lock() {
            Ok(core) => core.writer.head().clone(),
            Err(p) => p.into_inner().writer.head().clone(),
        }
    }

    /// Queues `entry` and waits until it is in the file. A refusal waits for room in the
    /// queue; an allowed request's record is dropped (and counted) if there is none. `false`:
    /// the log could not take it (a write error): the caller must not let the response out.
    pub(crate) async fn write(self: &Arc<Self>, entry: Entry) -> bool {
        if let Some(written) = self.submit(entry) {
            // Let the worker's other ready requests queue their records first: one write
            // for the lot.
            tokio::task::yield_now().await;
            self.drive();
            // No acknowledgement: the write failed (or the daemon is stopping).
            return written.await.is_ok();
        }
        // Dropped by design (an allowed request's record, the queue full: counted).
        true
    }

    /// Queues `entry`; the receiver resolves once it is in the file, which happens when
    /// someone drives the queue ([`Audit::drive`]): the submitter, after letting the other
    /// ready requests of its worker queue theirs (one `write(2)` for all of them), or the
    /// ticker. `None`: dropped (an
    /// allowed request's record and a full queue, counted) or the writer is gone. A record
    /// that must be kept and finds the queue full is handed to a task that waits for room.
    ///
    /// A refusal that repeats one recorded within `audit.refusal_window` is counted instead
    /// (`repeats.rs`): it resolves at once, and its count is written when the window closes.
    pub(crate) fn submit(self: &Arc<Self>, entry: Entry) -> Option<oneshot::Receiver<()>> {
        match &entry {
            Entry::Record(r) => match self.repeats.note(r, tokio::time::Instant::now()) {
                Noted::Counted => {
                    let (ack, counted) = oneshot::channel();
                    let _ = ack.send(());
                    return Some(counted);
                }
                Noted::Write(Some(closed)) => {
                    drop(self.enqueue(Entry::Repeated(Box::new(closed))));
                }
                Noted::Write(None) => {}
            },
            // Nothing counted is lost: every open window is written before the stop record.
            Entry::Stop(_) => {
                for e in self.repeats.drain() {
                    drop(self.enqueue(Entry::Repeated(Box::new(e))));
                }
            }
            _ => {}
        }
        self.enqueue(entry)
    }

    /// Queues `entry` (see [`Audit::submit`]).
    fn enqueue(self: &Arc<Self>, entry: Entry) -> Option<oneshot::Receiver<()>> {
        let (ack, written) = oneshot::channel();
        let keep = entry.must_keep();
        let msg = Msg::Entry {
            time: crate::clock::now_rfc3339(),
            fields: Fields::of(&entry),
            ack: Some(ack),
        };
        match self.tx.try_send(msg) {
            Ok(()) => Some(written),
            Err(mpsc::error::TrySendError::Full(msg)) if keep => {
                let me = self.clone();
                tokio::spawn(async move {
                    if me.tx.send(msg).await.is_ok() {
                        me.drive();
                    }
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
    pub(crate) fn write_detached(self: &Arc<Self>, entry: Entry) {
        drop(self.submit(entry));
        self.drive();
    }

    fn count_drop(&self) {
        self.dropped.fetch_add(1, Ordering::Relaxed);
        self.metrics.dropped.inc();
    }

    /// Everything queued before this call is written and fsynced when it returns.
    pub(crate) async fn sync(&self) {
        let (done, synced) = oneshot::channel();
        if self.tx.send(Msg::Sync(done)).await.is_ok() {
            self.drive();
            let _ = synced.await;
        }
    }
}

/// `[audit] checkpoint_every` and `checkpoint_interval`.
fn checkpoint_cadence(cfg: &AuditConfig) -> checkpoint_schedule::Cadence {
    checkpoint_schedule::Cadence {
        every: cfg.checkpoint_every,
        interval: cfg.checkpoint_interval,
    }
}

/// `[audit]` asks for checkpoints (by count or by time): the daemon then needs the key.
pub fn checkpoints_enabled(cfg: &AuditConfig) -> bool {
    cfg.checkpoint_every > 0 || !cfg.checkpoint_interval.is_zero()
}

/// `path?query` as the audit log records it: query parameter values replaced by
/// `[redacted]` (names kept) unless `keep_values`.
pub(crate) fn shown_path(path: &str, query: Option<&str>, keep_values: bool) -> String {
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

/// What the writer role guards.
struct Core {
    rx: mpsc::Receiver<Msg>,
    writer: Writer,
    batch: Vec<Msg>,
    buf: Vec<u8>,
}

#[cfg(test)]
#[path = "audit_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "checkpoint_tests.rs"]
mod checkpoint_tests;
