//! The one writer: a task on the daemon's runtime that seals records in arrival order and
//! appends each batch with a single `write(2)` before acknowledging it, so a record is in the
//! file (and survives the daemon being killed) by the time its request is told it was
//! written. A task rather than a thread: handing it a record and being told it is written
//! are then wake-ups inside the runtime, not futex round trips to another thread, which is
//! most of what the log costs per request. The write itself is to the page cache and short;
//! what can take long (fsync, rotation's renames) runs on the blocking pool. The file is
//! fsynced within `SYNC_EVERY` of a write, and on request (`Msg::Sync`, used at stop).

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, oneshot};

use super::chain::{seal, unseal, GENESIS};
use super::record::Entry;
use crate::metrics::Metrics;

/// Records taken in one batch at most.
const BATCH: usize = 1024;
/// A write is fsynced at most this long after it was made.
pub(crate) const SYNC_EVERY: Duration = Duration::from_millis(100);

pub(crate) enum Msg {
    Entry {
        time: String,
        entry: Entry,
        ack: Option<oneshot::Sender<()>>,
    },
    /// Write everything before this, fsync, then answer.
    Sync(oneshot::Sender<()>),
}

/// Where the chain stands: the last record's sequence number and hash.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Head {
    pub seq: u64,
    pub hash: String,
}

pub(crate) struct Writer {
    path: PathBuf,
    file: File,
    size: u64,
    max_bytes: u64,
    keep: u32,
    head: Head,
    /// Written since the last fsync started.
    dirty: bool,
    /// When the oldest unsynced write was made.
    dirty_since: Instant,
    /// The fsync running on the blocking pool, if any.
    syncing: Option<tokio::task::JoinHandle<()>>,
    dropped: Arc<AtomicU64>,
    metrics: Arc<Metrics>,
    /// Shared with the daemon (`ctl status`).
    shown_head: Arc<std::sync::Mutex<Head>>,
}

impl Writer {
    pub(crate) fn open(
        path: &Path,
        max_bytes: u64,
        keep: u32,
        dropped: Arc<AtomicU64>,
        metrics: Arc<Metrics>,
        shown_head: Arc<std::sync::Mutex<Head>>,
    ) -> io::Result<Writer> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o750)
                .create(dir)?;
        }
        let mut file = open_log(path)?;
        let size = file.metadata()?.len();
        // The chain goes on from the last line of the live file, or of the newest rotated
        // one if the live file is empty.
        let head = match last_head(&mut file)? {
            Some(h) => h,
            None => match File::open(rotated(path, 1)) {
                Ok(mut f) => last_head(&mut f)?,
                Err(e) if e.kind() == io::ErrorKind::NotFound => None,
                Err(e) => return Err(e),
            }
            .unwrap_or(Head {
                seq: 0,
                hash: GENESIS.to_string(),
            }),
        };
        if size > 0 && !ends_with_newline(&mut file)? {
            // A line cut short (power loss mid-write): end it, so the next record starts on
            // a line of its own; `verify` reports the cut line.
            file.write_all(b"\n")?;
        }
        if let Ok(mut h) = shown_head.lock() {
            *h = head.clone();
        }
        Ok(Writer {
            path: path.to_path_buf(),
            size: file.metadata()?.len(),
            file,
            max_bytes,
            keep,
            head,
            dirty: false,
            dirty_since: Instant::now(),
            syncing: None,
            dropped,
            metrics,
            shown_head,
        })
    }

    /// Runs until every sender is gone, then syncs.
    pub(crate) async fn run(mut self, mut rx: mpsc::Receiver<Msg>) {
        let mut batch = Vec::with_capacity(BATCH);
        let mut buf = Vec::with_capacity(64 * 1024);
        loop {
            let first = if self.dirty {
                let due = tokio::time::Instant::from_std(self.dirty_since + SYNC_EVERY);
                tokio::select! {
                    m = rx.recv() => m,
                    () = tokio::time::sleep_until(due) => {
                        self.start_sync();
                        continue;
                    }
                }
            } else {
                rx.recv().await
            };
            let Some(first) = first else { break };
            batch.push(first);
            while batch.len() < BATCH {
                match rx.try_recv() {
                    Ok(m) => batch.push(m),
                    Err(_) => break,
                }
            }
            self.write_batch(&mut batch, &mut buf).await;
        }
        self.sync_now().await;
    }

    async fn write_batch(&mut self, batch: &mut Vec<Msg>, buf: &mut Vec<u8>) {
        buf.clear();
        let mut acks = Vec::with_capacity(batch.len());
        let mut syncs = Vec::new();
        let mut head = self.head.clone();
        let mut records = 0;
        for msg in batch.drain(..) {
            match msg {
                Msg::Entry { time, entry, ack } => {
                    head.seq += 1;
                    head.hash = self.encode(buf, head.seq, &time, &entry, &head.hash);
                    records += 1;
                    acks.extend(ack);
                }
                Msg::Sync(done) => syncs.push(done),
            }
        }
        if !buf.is_empty() {
            if self.size > 0 && self.size + buf.len() as u64 > self.max_bytes {
                if let Err(e) = self.rotate().await {
                    self.metrics.audit_write_errors.inc();
                    tracing::error!(path = %self.path.display(), "audit log rotation failed, writing on: {e}");
                }
            }
            match self.file.write_all(buf) {
                Ok(()) => {
                    self.size += buf.len() as u64;
                    self.head = head;
                    if !self.dirty {
                        self.dirty = true;
                        self.dirty_since = Instant::now();
                    }
                    self.metrics.audit_records.inc_by(records);
                    if let Ok(mut h) = self.shown_head.lock() {
                        *h = self.head.clone();
                    }
                }
                Err(e) => {
                    // The chain stays at the last record written: the lost ones are simply
                    // absent, which `verify` cannot see, so it is loud here and counted.
                    self.metrics.audit_write_errors.inc();
                    tracing::error!(path = %self.path.display(), records, "audit log write failed: {e}");
                    self.size = self.file.metadata().map_or(self.size, |m| m.len());
                }
            }
        }
        for a in acks {
            let _ = a.send(());
        }
        if !syncs.is_empty() {
            self.sync_now().await;
            for s in syncs {
                let _ = s.send(());
            }
        }
    }

    fn encode(&self, buf: &mut Vec<u8>, seq: u64, time: &str, entry: &Entry, prev: &str) -> String {
        let dropped = self.dropped.swap(0, Ordering::Relaxed);
        encode(buf, seq, time, dropped, entry, prev)
    }

    /// Starts an fsync of everything written so far on the blocking pool, unless one is
    /// still running (then the next deadline tries again).
    fn start_sync(&mut self) {
        if self.syncing.as_ref().is_some_and(|h| !h.is_finished()) {
            self.dirty_since = Instant::now();
            return;
        }
        if !self.dirty {
            return;
        }
        self.dirty = false;
        match self.file.try_clone() {
            Ok(file) => {
                let metrics = self.metrics.clone();
                let path = self.path.clone();
                self.syncing = Some(tokio::task::spawn_blocking(move || {
                    fsync(&file, &path, &metrics)
                }));
            }
            Err(e) => {
                self.metrics.audit_write_errors.inc();
                tracing::error!(path = %self.path.display(), "audit log fsync failed: {e}");
            }
        }
    }

    /// Everything written so far is on disk when this returns.
    async fn sync_now(&mut self) {
        if let Some(running) = self.syncing.take() {
            let _ = running.await;
        }
        self.start_sync();
        if let Some(running) = self.syncing.take() {
            let _ = running.await;
        }
    }

    /// `log` → `log.1` → … → `log.keep`; the oldest beyond `keep` is deleted. The chain
    /// goes on in the new file. The file system work runs on the blocking pool.
    async fn rotate(&mut self) -> io::Result<()> {
        self.sync_now().await;
        let (path, keep) = (self.path.clone(), self.keep);
        let file = tokio::task::spawn_blocking(move || rotate_files(&path, keep))
            .await
            .map_err(io::Error::other)??;
        self.file = file;
        self.size = 0;
        Ok(())
    }
}

fn fsync(file: &File, path: &Path, metrics: &Metrics) {
    if let Err(e) = file.sync_data() {
        metrics.audit_write_errors.inc();
        tracing::error!(path = %path.display(), "audit log fsync failed: {e}");
    }
}

/// Shifts the rotated files up by one, moves the live file to `.1` and opens a new one.
fn rotate_files(path: &Path, keep: u32) -> io::Result<File> {
    if keep == 0 {
        std::fs::remove_file(path)?;
    } else {
        let _ = std::fs::remove_file(rotated(path, keep));
        for n in (1..keep).rev() {
            match std::fs::rename(rotated(path, n), rotated(path, n + 1)) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
                _ => {}
            }
        }
        std::fs::rename(path, rotated(path, 1))?;
    }
    let file = open_log(path)?;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        File::open(dir)?.sync_all()?;
    }
    Ok(file)
}

/// `path.N`.
pub fn rotated(path: &Path, n: u32) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(format!(".{n}"));
    PathBuf::from(name)
}

fn open_log(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .create(true)
        .append(true)
        .read(true)
        .mode(0o640)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .open(path)
}

/// The seq and hash of the file's last sealed line, if it has one.
fn last_head(file: &mut File) -> io::Result<Option<Head>> {
    let len = file.metadata()?.len();
    let from = len.saturating_sub(256 * 1024);
    file.seek(SeekFrom::Start(from))?;
    let mut tail = String::new();
    file.take(len - from)
        .read_to_string(&mut tail)
        .or_else(|_| {
            // Not UTF-8 (a damaged tail): no usable head.
            tail.clear();
            Ok::<_, io::Error>(0)
        })?;
    for line in tail.lines().rev() {
        let Some(sealed) = unseal(line) else { continue };
        let seq = serde_json::from_str::<serde_json::Value>(line)
            .ok()
            .and_then(|v| v["seq"].as_u64());
        if let Some(seq) = seq {
            return Ok(Some(Head {
                seq,
                hash: sealed.hash.to_string(),
            }));
        }
    }
    Ok(None)
}

fn ends_with_newline(file: &mut File) -> io::Result<bool> {
    let len = file.metadata()?.len();
    if len == 0 {
        return Ok(true);
    }
    file.seek(SeekFrom::Start(len - 1))?;
    let mut last = [0u8; 1];
    file.read_exact(&mut last)?;
    Ok(last[0] == b'\n')
}

/// Appends one sealed line to `buf`; returns its hash. `dropped`: records lost just before
/// this one (written as `dropped_before` when not 0).
pub(crate) fn encode(
    buf: &mut Vec<u8>,
    seq: u64,
    time: &str,
    dropped: u64,
    entry: &Entry,
    prev: &str,
) -> String {
    let start = buf.len();
    buf.extend_from_slice(b"{\"v\":1,\"seq\":");
    buf.extend_from_slice(seq.to_string().as_bytes());
    buf.extend_from_slice(b",\"time\":");
    let _ = serde_json::to_writer(&mut *buf, time);
    if dropped > 0 {
        buf.extend_from_slice(b",\"dropped_before\":");
        buf.extend_from_slice(dropped.to_string().as_bytes());
    }
    let body_at = buf.len();
    if serde_json::to_writer(&mut *buf, entry).is_err() || buf.len() < body_at + 2 {
        // Cannot happen for these types; never write half a record.
        buf.truncate(body_at);
        buf.extend_from_slice(b"{\"kind\":\"unencodable\"}");
    }
    // `{"kind":…}` becomes `,"kind":…` inside the envelope, its `}` dropped for the seal.
    buf[body_at] = b',';
    buf.pop();
    let mut line = buf.split_off(start);
    let hash = seal(&mut line, prev);
    buf.extend_from_slice(&line);
    hash
}
