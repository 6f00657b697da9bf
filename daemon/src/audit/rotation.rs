//! Rotating the audit log: `log` → `log.1` → … → `log.keep`, the oldest beyond `keep`
//! deleted, and the slow part of it kept off the request path.
//!
//! A rotation happens inside a batch write, i.e. in the request that holds the writer role,
//! with every other request's record waiting on it. Renaming and opening are metadata
//! operations and quick; three things are not: the old file's fsync, the directory's, and
//! freeing a deleted file's blocks (23 ms for a 100 MiB file on ext4 here, during which
//! every request of the daemon waited for its record). So the deleted file is held open
//! across its unlink (the kernel frees it at the last close), and the fsyncs and that close
//! run on a thread of their own ([`Leftover`]). The new file is not fsynced before the old
//! one has been (the writer asks [`Running::synced`]); the kernel's own writeback could
//! still write some of the new file first, which a power loss in that moment would show as
//! a break that `ctl audit verify` reports, never as a silent gap.

use std::fs::File;
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::writer::{fsync, open_log};
use super::AuditMetrics;

/// `path.N`.
pub(crate) fn rotated(path: &Path, n: u32) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(format!(".{n}"));
    PathBuf::from(name)
}

pub(super) struct Rotated {
    /// The new live file.
    pub file: File,
    /// The file that fell off the end, unlinked but still open: its blocks are freed when
    /// this is dropped.
    pub expired: Option<File>,
}

/// Shifts the rotated files up by one, moves the live file to `.1` and opens a new one. If
/// the new file cannot be opened, the live file is moved back, so writing goes on in it
/// (never into a file no longer at `path`). `keep` 0: the old file is deleted once the new
/// one is open (the caller still holds it open, so that is quick too).
pub(super) fn rotate_files(path: &Path, keep: u32) -> io::Result<Rotated> {
    let mut expired = None;
    let aside = if keep == 0 {
        let mut name = path.as_os_str().to_owned();
        name.push(".rotating");
        PathBuf::from(name)
    } else {
        let oldest = rotated(path, keep);
        // Opened before it is unlinked, so the unlink does not free it here. (Should the
        // unlink fail, the rename below replaces it all the same.) Never through a link,
        // and never anything but a regular file: opening a FIFO would block the writer role.
        expired = open_expired(&oldest);
        let _ = std::fs::remove_file(&oldest);
        for n in (1..keep).rev() {
            match std::fs::rename(rotated(path, n), rotated(path, n + 1)) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
                _ => {}
            }
        }
        rotated(path, 1)
    };
    std::fs::rename(path, &aside)?;
    let file = match open_log(path) {
        Ok(f) => f,
        Err(e) => {
            let _ = std::fs::rename(&aside, path);
            return Err(e);
        }
    };
    if keep == 0 {
        let _ = std::fs::remove_file(&aside);
    }
    Ok(Rotated { file, expired })
}

/// The expired file, held open across its unlink: a regular file, opened without following
/// a link and without blocking; `None` if there is none (or it is anything else, which the
/// unlink then removes inline, as before).
fn open_expired(path: &Path) -> Option<File> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_NONBLOCK)
        .open(path)
        .ok()?;
    file.metadata().ok()?.is_file().then_some(file)
}

/// The export sinks' say in rotation (`audit.export`, `export/`): a file holding records a
/// sink has not shipped yet is not deleted while that sink's `max_hold` has not passed since
/// the rotation first had to wait (the live file grows on meanwhile). Past it the file goes,
/// and what each sink lost is counted (`…_audit_export_dropped_total`) and logged.
pub(crate) struct ExportHold {
    pub sinks: Vec<HeldFor>,
    /// When the rotation first had to wait; `None` while it does not.
    since: Mutex<Option<Instant>>,
}

/// One sink, as rotation sees it.
pub(crate) struct HeldFor {
    pub name: String,
    /// The seq of the last record the sink shipped.
    pub shipped: Arc<AtomicU64>,
    pub max_hold: Duration,
    pub dropped: prometheus::IntCounter,
}

impl ExportHold {
    pub(crate) fn new(sinks: Vec<HeldFor>) -> ExportHold {
        ExportHold {
            sinks,
            since: Mutex::new(None),
        }
    }

    /// Whether the rotation that would delete `file` must wait. When it may go on, counts
    /// the records of `file` each sink had not shipped.
    pub(crate) fn must_wait(&self, file: &Path, now: Instant) -> bool {
        let Some((first, last)) = seq_range(file) else {
            self.reset();
            return false;
        };
        let mut since = match self.since.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        let waited = now.duration_since(*since.get_or_insert(now));
        let behind = |s: &HeldFor| s.shipped.load(Ordering::Acquire) < last;
        if self.sinks.iter().any(|s| behind(s) && waited < s.max_hold) {
            if waited.is_zero() {
                tracing::info!(file = ?file, "audit log rotation waits for the export sinks to ship it");
            }
            return true;
        }
        *since = None;
        for s in self.sinks.iter().filter(|s| behind(s)) {
            let shipped = s.shipped.load(Ordering::Acquire);
            let lost = last - shipped.max(first.saturating_sub(1));
            s.dropped.inc_by(lost);
            tracing::warn!(sink = %s.name, file = ?file, lost, "audit log rotation deletes records the export sink has not shipped (max_hold passed)");
        }
        false
    }

    fn reset(&self) {
        match self.since.lock() {
            Ok(mut g) => *g = None,
            Err(p) => *p.into_inner() = None,
        }
    }
}

/// The first and last `seq` of the log file at `path`; `None` without a record in it.
fn seq_range(path: &Path) -> Option<(u64, u64)> {
    use std::io::{Read, Seek, SeekFrom};
    let mut f = open_expired(path)?;
    let seq_of = |line: &[u8]| {
        #[derive(serde::Deserialize)]
        struct Seq {
            seq: u64,
        }
        serde_json::from_slice::<Seq>(line).ok().map(|s| s.seq)
    };
    let mut head = vec![0u8; 64 * 1024];
    let n = f.read(&mut head).ok()?;
    let first = head[..n].split(|b| *b == b'\n').find_map(seq_of)?;
    let len = f.metadata().ok()?.len();
    let from = len.saturating_sub(64 * 1024);
    f.seek(SeekFrom::Start(from)).ok()?;
    let mut tail = Vec::new();
    f.take(len - from).read_to_end(&mut tail).ok()?;
    let last = tail.split(|b| *b == b'\n').rev().find_map(seq_of)?;
    Some((first, last))
}

/// What a rotation leaves to do: fsync the old file (its last records) and the directory (the
/// renames), then close the old file and the expired one (freeing the latter).
pub(super) struct Leftover {
    pub old: File,
    pub expired: Option<File>,
    pub path: PathBuf,
    pub metrics: AuditMetrics,
}

impl Leftover {
    fn run(self, synced: &AtomicBool) {
        // Always, even if no write was made since the last periodic fsync: that one may
        // still be running on the blocking pool, and this one waits for it.
        fsync(&self.old, &self.path, &self.metrics);
        if let Some(dir) = self.path.parent().filter(|d| !d.as_os_str().is_empty()) {
            if let Err(e) = File::open(dir).and_then(|d| d.sync_all()) {
                tracing::warn!(dir = ?dir, "audit log rotation: syncing the directory failed: {e}");
            }
        }
        // The new file may be fsynced from here on; freeing the expired file can take long.
        synced.store(true, Ordering::Release);
        drop(self.old);
        drop(self.expired);
    }

    /// Runs on a thread of its own; inline if no thread can be started.
    pub(super) fn start(self) -> Running {
        let synced = Arc::new(AtomicBool::new(false));
        let work = Arc::new(Mutex::new(Some(self)));
        let (theirs, flag) = (work.clone(), synced.clone());
        let spawned = std::thread::Builder::new()
            .name("audit-rotation".into())
            .spawn(move || {
                if let Some(left) = take(&theirs) {
                    left.run(&flag);
                }
            });
        match spawned {
            Ok(handle) => Running {
                handle: Some(handle),
                synced,
            },
            Err(e) => {
                tracing::warn!("audit log rotation: no thread for the fsync, doing it inline: {e}");
                if let Some(left) = take(&work) {
                    left.run(&synced);
                }
                Running {
                    handle: None,
                    synced,
                }
            }
        }
    }
}

fn take(work: &Mutex<Option<Leftover>>) -> Option<Leftover> {
    match work.lock() {
        Ok(mut w) => w.take(),
        Err(p) => p.into_inner().take(),
    }
}

/// A rotation's leftover work under way (or done inline).
pub(super) struct Running {
    handle: Option<JoinHandle<()>>,
    synced: Arc<AtomicBool>,
}

impl Running {
    /// The old file and the directory are on disk (what is left is closing files).
    pub(super) fn synced(&self) -> bool {
        self.synced.load(Ordering::Acquire)
    }

    pub(super) fn is_finished(&self) -> bool {
        self.handle.as_ref().is_none_or(JoinHandle::is_finished)
    }

    /// Waits for all of it.
    pub(super) fn finish(self) {
        if let Some(handle) = self.handle {
            if handle.join().is_err() {
                tracing::error!("audit log rotation: the fsync thread panicked");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::Read;
    use std::os::unix::fs::MetadataExt;

    use super::*;

    #[test]
    fn the_expired_file_is_unlinked_but_held_open_for_the_leftover_thread() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("a.jsonl");
        std::fs::write(&path, "live\n").expect("live");
        std::fs::write(rotated(&path, 1), "one\n").expect("1");
        std::fs::write(rotated(&path, 2), "two\n").expect("2");
        let Rotated { file, expired } = rotate_files(&path, 2).expect("rotate");
        assert_eq!(file.metadata().expect("meta").len(), 0, "a new live file");
        assert_eq!(
            std::fs::read_to_string(rotated(&path, 1)).expect("1"),
            "live\n"
        );
        assert_eq!(
            std::fs::read_to_string(rotated(&path, 2)).expect("2"),
            "one\n"
        );
        let mut expired = expired.expect("the oldest, still open");
        assert_eq!(expired.metadata().expect("meta").nlink(), 0, "unlinked");
        let mut held = String::new();
        expired.read_to_string(&mut held).expect("read");
        assert_eq!(
            held, "two\n",
            "its blocks are freed only when the thread drops it"
        );
        let mut names: Vec<_> = std::fs::read_dir(dir.path())
            .expect("dir")
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(names, ["a.jsonl", "a.jsonl.1", "a.jsonl.2"]);
    }

    /// Something else planted where the oldest file goes (a FIFO, a link) is not opened:
    /// opening a FIFO would block the writer role, following a link would reach elsewhere.
    #[test]
    fn a_fifo_or_a_link_in_the_oldest_place_is_unlinked_without_being_opened() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("a.jsonl");
        let outside = dir.path().join("elsewhere");
        std::fs::write(&outside, "not ours\n").expect("outside");
        for plant in ["fifo", "link"] {
            std::fs::write(&path, "live\n").expect("live");
            let oldest = rotated(&path, 1);
            let _ = std::fs::remove_file(&oldest);
            match plant {
                "fifo" => {
                    nix::unistd::mkfifo(&oldest, nix::sys::stat::Mode::S_IRWXU).expect("mkfifo")
                }
                _ => std::os::unix::fs::symlink(&outside, &oldest).expect("symlink"),
            }
            let (done, rx) = std::sync::mpsc::channel();
            let p = path.clone();
            std::thread::spawn(move || {
                let _ = done.send(rotate_files(&p, 1).map(|r| r.expired.is_none()));
            });
            let held_nothing = rx
                .recv_timeout(std::time::Duration::from_secs(10))
                .expect("the rotation blocked on it")
                .expect("rotated");
            assert!(held_nothing, "{plant}: not opened");
            assert_eq!(
                std::fs::read_to_string(&oldest).expect("1"),
                "live\n",
                "{plant}: replaced by the old live file"
            );
        }
        assert_eq!(std::fs::read_to_string(&outside).expect("o"), "not ours\n");
    }

    #[test]
    fn keeping_none_deletes_the_old_file_and_holds_nothing_else() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("a.jsonl");
        std::fs::write(&path, "live\n").expect("live");
        let old = File::open(&path).expect("the writer's handle");
        let Rotated { expired, .. } = rotate_files(&path, 0).expect("rotate");
        assert!(expired.is_none());
        assert_eq!(old.metadata().expect("meta").nlink(), 0);
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .expect("dir")
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["a.jsonl"]);
    }
}
