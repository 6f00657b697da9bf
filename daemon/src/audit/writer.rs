//! The one writer. Records go through a bounded queue; whoever holds the writer role (a
//! lock, taken without waiting) drains it, seals the records in queue order and appends each
//! batch with a single `write(2)` before acknowledging it. The role is taken by the request
//! that just queued a record, so in the common case a request writes its own record (and
//! any queued beside it) with no hand-off to another task or thread: no wake-ups, no context
//! switches, which were most of what the log cost per request when a dedicated writer did
//! this. A request that finds the role taken leaves its record to the holder, which looks
//! at the queue again after letting go; a ticker drains it too, as a backstop.
//!
//! A record is in the file (and survives the daemon being killed) by the time its request
//! is told it was written. The write goes to the page cache and is short; the fsync runs on
//! the blocking pool within `SYNC_EVERY` of a write, and inline on request (`Msg::Sync`, at
//! stop).

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use super::chain::{seal_from, unseal, GENESIS};
use super::checkpoint_key::CheckpointKey;
use super::checkpoint_schedule::{Cadence, Checkpoints};
use super::health::{Health, NotReady};
use super::record::Fields;
use super::retention;
use super::rotation::{self, rotated, ExportHold, Leftover, Running};
use super::AuditMetrics;

/// The record format's version, the envelope's `v`. 1: HTTP requests only (`kind:
/// request` with a `scheme`). 2: every decision of every protocol, one shape
/// (`docs/audit.md`). `ctl audit verify` checks the chain of either.
pub(crate) const FORMAT_VERSION: u32 = 2;

/// A write is fsynced at most this long after it was made.
pub(crate) const SYNC_EVERY: Duration = Duration::from_millis(100);

pub(crate) enum Msg {
    Entry {
        time: String,
        /// The entry already encoded, by whoever submitted it (outside the writer role).
        fields: Fields,
        ack: Option<oneshot::Sender<()>>,
    },
    /// Write everything before this, fsync, then answer.
    Sync(oneshot::Sender<()>),
    /// Sign the chain head now if a record came since the last checkpoint (`checkpoint.rs`),
    /// then answer.
    Checkpoint(Option<oneshot::Sender<()>>),
}

/// When the live file is rotated, and what may be deleted then.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Rotation {
    /// The live file is rotated once it would grow past this.
    pub max_bytes: u64,
    /// Rotated files kept.
    pub keep: u32,
    /// No file holding a record younger than this is deleted (`retention.rs`).
    pub retention: Duration,
}

/// How often a rotation held back by the retention looks again.
const RETENTION_RECHECK: Duration = Duration::from_secs(1);

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
    rotation: Rotation,
    /// A rotation held back by the retention: when to look again.
    held: Option<Instant>,
    head: Head,
    /// Written since the last fsync started.
    dirty: bool,
    /// When the oldest unsynced write was made.
    dirty_since: Instant,
    dropped: Arc<AtomicU64>,
    metrics: AuditMetrics,
    health: Arc<Health>,
    /// What the last rotation left to do, on its own thread.
    leftover: Option<Running>,
    /// The export sinks, which may hold a rotation back (`rotation::ExportHold`).
    export_hold: Option<Arc<ExportHold>>,
    /// Signing the chain head from time to time; `None`: checkpoints are off.
    checkpoints: Option<Checkpoints>,
}

impl Writer {
    pub(crate) fn open(
        path: &Path,
        rotation: Rotation,
        dropped: Arc<AtomicU64>,
        metrics: AuditMetrics,
        health: Arc<Health>,
        checkpoints: Option<(CheckpointKey, Cadence)>,
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
        let (head, last_checkpoint) = match last_head(&mut file)? {
            Some(h) => h,
            None => match File::open(rotated(path, 1)) {
                Ok(mut f) => last_head(&mut f)?,
                Err(e) if e.kind() == io::ErrorKind::NotFound => None,
                Err(e) => return Err(e),
            }
            .unwrap_or((
                Head {
                    seq: 0,
                    hash: GENESIS.to_string(),
                },
                None,
            )),
        };
        // Records after the last checkpoint (a crash before it) are signed by the next one.
        let checkpoints = checkpoints.map(|(key, cadence)| match last_checkpoint {
            Some(at) if at <= head.seq => Checkpoints::new(key, cadence, at + 1, head.seq - at),
            _ => Checkpoints::new(key, cadence, head.seq + 1, 0),
        });
        if size > 0 && !ends_with_newline(&mut file)? {
            // A line cut short (power loss mid-write): end it, so the next record starts on
            // a line of its own; `verify` reports the cut line.
            file.write_all(b"\n")?;
        }
        Ok(Writer {
            path: path.to_path_buf(),
            size: file.metadata()?.len(),
            file,
            rotation,
            held: None,
            head,
            dirty: false,
            dirty_since: Instant::now(),
            dropped,
            metrics,
            health,
            leftover: None,
            export_hold: None,
            checkpoints,
        })
    }

    pub(crate) fn set_export_hold(&mut self, hold: Arc<ExportHold>) {
        self.export_hold = Some(hold);
    }

    /// The last record written.
    pub(crate) fn head(&self) -> &Head {
        &self.head
    }

    /// Writes `batch` (emptied) and acknowledges it.
    pub(crate) fn write_batch(&mut self, batch: &mut Vec<Msg>, buf: &mut Vec<u8>) {
        buf.clear();
        let mut acks = Vec::with_capacity(batch.len());
        let mut syncs = Vec::new();
        let mut head = self.head.clone();
        let mut records = 0;
        let mut tally = self.checkpoints.as_ref().map(Checkpoints::tally);
        let mut signed = 0;
        for msg in batch.drain(..) {
            match msg {
                Msg::Entry { time, fields, ack } => {
                    head.seq += 1;
                    head.hash = self.encode(buf, head.seq, &time, &fields, &head.hash);
                    records += 1;
                    acks.extend(ack);
                    if let (Some(c), Some(t)) = (&self.checkpoints, &mut tally) {
                        t.note();
                        if c.due_by_count(t) {
                            signed += self.checkpoint(buf, &mut head, c, t);
                        }
                    }
                }
                Msg::Sync(done) => syncs.push(done),
                Msg::Checkpoint(done) => {
                    if let (Some(c), Some(t)) = (&self.checkpoints, &mut tally) {
                        if t.since > 0 {
                            signed += self.checkpoint(buf, &mut head, c, t);
                        }
                    }
                    acks.extend(done);
                }
            }
        }
        records += signed;
        if !buf.is_empty() {
            if self.size > 0 && self.size + buf.len() as u64 > self.rotation.max_bytes {
                self.rotate_if_allowed();
            }
            let written = self.file.write_all(buf);
            self.health.wrote(written.as_ref().map(|_| ()));
            match written {
                Ok(()) => {
                    self.size += buf.len() as u64;
                    self.head = head;
                    if !self.dirty {
                        self.dirty = true;
                        self.dirty_since = Instant::now();
                    }
                    self.metrics.records.inc_by(records);
                    self.metrics.checkpoints.inc_by(signed);
                    if let (Some(c), Some(t)) = (&mut self.checkpoints, tally) {
                        c.commit(t, signed > 0);
                    }
                }
                Err(e) => {
                    // Nothing of this batch counts: a part written is cut off again so the
                    // chain stays whole at the last record written, and the batch's requests
                    // are not told "written" (their responses fail: fail closed).
                    self.metrics.write_errors.inc();
                    tracing::error!(path = ?self.path, records, "audit log write failed; those requests' responses are refused: {e}");
                    if let Err(t) = self.file.set_len(self.size) {
                        tracing::error!(path = ?self.path, "audit log: cutting off a partly written batch failed: {t}");
                        self.size = self.file.metadata().map_or(self.size, |m| m.len());
                    }
                    acks.clear();
                }
            }
        }
        for a in acks {
            let _ = a.send(());
        }
        if !syncs.is_empty() {
            self.sync_now();
            for s in syncs {
                let _ = s.send(());
            }
        }
    }

    /// Appends the checkpoint signing `head` and makes it the head; returns 1 (one line).
    fn checkpoint(
        &self,
        buf: &mut Vec<u8>,
        head: &mut Head,
        c: &Checkpoints,
        t: &mut super::checkpoint_schedule::Tally,
    ) -> u64 {
        let seq = head.seq + 1;
        let time = crate::clock::now_rfc3339();
        let fields = c.sign(t, seq, &time, head.seq, &head.hash);
        // `dropped_before` stays for the next record of a request: a checkpoint loses none.
        head.hash = encode(buf, seq, &time, 0, &fields, &head.hash);
        head.seq = seq;
        1
    }

    /// A record has waited `audit.checkpoint_interval` for a checkpoint.
    pub(crate) fn checkpoint_due(&self) -> bool {
        self.checkpoints
            .as_ref()
            .is_some_and(|c| c.due_by_time(Instant::now()))
    }

    fn encode(
        &self,
        buf: &mut Vec<u8>,
        seq: u64,
        time: &str,
        fields: &Fields,
        prev: &str,
    ) -> String {
        let dropped = self.dropped.swap(0, Ordering::Relaxed);
        encode(buf, seq, time, dropped, fields, prev)
    }

    /// What the periodic fsync needs: a handle on the file if a write made since the last
    /// fsync is `SYNC_EVERY` old (the caller fsyncs it outside the writer role).
    pub(crate) fn due_sync(&mut self) -> Option<(File, PathBuf)> {
        if !self.dirty || self.dirty_since.elapsed() < SYNC_EVERY {
            return None;
        }
        // The file before a rotation reaches the disk first (the next tick looks again).
        if self.leftover.as_ref().is_some_and(|l| !l.synced()) {
            return None;
        }
        if self.leftover.as_ref().is_some_and(Running::is_finished) {
            self.finish_leftover();
        }
        match self.file.try_clone() {
            Ok(file) => {
                self.dirty = false;
                Some((file, self.path.clone()))
            }
            Err(e) => {
                self.metrics.write_errors.inc();
                tracing::error!(path = ?self.path, "audit log fsync failed: {e}");
                None
            }
        }
    }

    /// Everything written so far is on disk when this returns (a rotated file's too).
    pub(crate) fn sync_now(&mut self) {
        self.finish_leftover();
        if self.dirty {
            fsync(&self.file, &self.path, &self.metrics);
            self.dirty = false;
        }
    }

    /// Rotates unless that would delete a file younger than the retention; then the live
    /// file grows on and the daemon refuses new requests until it may (looked at again at
    /// most once a second, here and from the ticker).
    fn rotate_if_allowed(&mut self) {
        let now = Instant::now();
        if self.held.is_some_and(|next| now < next) {
            return;
        }
        let r = self.rotation;
        if let Some(until) = retention::held_until(
            &self.path,
            r.keep,
            r.retention,
            std::time::SystemTime::now(),
        ) {
            if !self.health.retention_blocked() {
                let file = retention::next_deleted(&self.path, r.keep);
                self.health.retention(Some(NotReady::RetentionHeld {
                    size: self.size,
                    file,
                    retention: r.retention,
                    until,
                }));
            }
            self.held = Some(now + RETENTION_RECHECK);
            return;
        }
        let deleted = retention::next_deleted(&self.path, r.keep);
        let exporting = self.export_hold.as_ref();
        if exporting.is_some_and(|h| h.must_wait(&deleted, now)) {
            self.held = Some(now + RETENTION_RECHECK);
            return;
        }
        if self.held.take().is_some() {
            self.health.retention(None);
        }
        if let Err(e) = self.rotate() {
            self.metrics.write_errors.inc();
            tracing::error!(path = ?self.path, "audit log rotation failed, writing on: {e}");
        }
    }

    /// While a rotation is held back by the retention: looks again whether it may go on.
    pub(crate) fn recheck_retention(&mut self) {
        if self.held.is_some() {
            self.rotate_if_allowed();
        }
    }

    /// `log` → `log.1` → … → `log.keep`; the oldest beyond `keep` is deleted. The chain
    /// goes on in the new file. The renames and the new file happen here; the old file's
    /// fsync, the directory's and freeing the deleted file's blocks (23 ms for 100 MiB on
    /// ext4, measured) run on a thread of their own, not in the request holding the writer
    /// role (`rotation::Leftover`).
    fn rotate(&mut self) -> io::Result<()> {
        // The last rotation's is almost always long done (rotations are `max_bytes` apart).
        self.finish_leftover();
        let rotated = rotation::rotate_files(&self.path, self.rotation.keep)?;
        let old = std::mem::replace(&mut self.file, rotated.file);
        // The leftover thread fsyncs the old file; nothing is written to the new one yet.
        self.dirty = false;
        let leftover = Leftover {
            old,
            expired: rotated.expired,
            path: self.path.clone(),
            metrics: self.metrics.clone(),
        };
        self.size = 0;
        self.leftover = Some(leftover.start());
        Ok(())
    }

    /// Waits for the last rotation's leftover work.
    fn finish_leftover(&mut self) {
        if let Some(running) = self.leftover.take() {
            running.finish();
        }
    }
}

pub(crate) fn fsync(file: &File, path: &Path, metrics: &AuditMetrics) {
    if let Err(e) = file.sync_data() {
        metrics.write_errors.inc();
        tracing::error!(path = ?path, "audit log fsync failed: {e}");
    }
}

/// What [`Writer::open`] would find at `path`, without creating or writing anything: the
/// live file's size, opened as the writer opens it (append, no symlink); `None` if it does not
/// exist yet and the nearest existing directory above it lets this user create it.
pub fn preflight(path: &Path) -> io::Result<Option<u64>> {
    match OpenOptions::new()
        .append(true)
        .read(true)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .open(path)
    {
        Ok(f) => Ok(Some(f.metadata()?.len())),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            let mut dir = path.parent();
            while let Some(d) = dir.filter(|d| !d.exists()) {
                dir = d.parent();
            }
            let dir = dir.unwrap_or(Path::new("/"));
            nix::unistd::access(
                dir,
                nix::unistd::AccessFlags::W_OK | nix::unistd::AccessFlags::X_OK,
            )
            .map_err(|e| io::Error::other(format!("cannot create it in {}: {e}", dir.display())))?;
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

pub(super) fn open_log(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .create(true)
        .append(true)
        .read(true)
        .mode(0o640)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .open(path)
}

/// The seq and hash of the file's last sealed line, if it has one, and the seq of the last
/// checkpoint in the file's last 256 KiB.
fn last_head(file: &mut File) -> io::Result<Option<(Head, Option<u64>)>> {
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
    let mut head = None;
    for line in tail.lines().rev() {
        let Some(sealed) = unseal(line) else { continue };
        let v = serde_json::from_str::<serde_json::Value>(line).ok();
        let Some(seq) = v.as_ref().and_then(|v| v["seq"].as_u64()) else {
            continue;
        };
        let head = head.get_or_insert_with(|| Head {
            seq,
            hash: sealed.hash.to_string(),
        });
        if v.is_some_and(|v| v["kind"] == "checkpoint") {
            return Ok(Some((head.clone(), Some(seq))));
        }
    }
    Ok(head.map(|h| (h, None)))
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
/// this one (written as `dropped_before` when not 0). Only the envelope is made here: the
/// entry's own fields were encoded by its submitter.
pub(crate) fn encode(
    buf: &mut Vec<u8>,
    seq: u64,
    time: &str,
    dropped: u64,
    fields: &Fields,
    prev: &str,
) -> String {
    let start = buf.len();
    // Numbers and the time through serde_json's own formatting (no allocation); writing to
    // a Vec cannot fail.
    buf.extend_from_slice(b"{\"v\":");
    let _ = serde_json::to_writer(&mut *buf, &FORMAT_VERSION);
    buf.extend_from_slice(b",\"seq\":");
    let _ = serde_json::to_writer(&mut *buf, &seq);
    buf.extend_from_slice(b",\"time\":");
    let _ = serde_json::to_writer(&mut *buf, time);
    if dropped > 0 {
        buf.extend_from_slice(b",\"dropped_before\":");
        let _ = serde_json::to_writer(&mut *buf, &dropped);
    }
    buf.extend_from_slice(fields.as_bytes());
    seal_from(buf, start, prev)
}
