//! The minimum retention: rotation never deletes a file that holds a record younger than
//! `audit.retention` (default 24 h). When the file that would fall off the end is that young,
//! the live file grows on past `max_bytes` and the daemon refuses new requests
//! (`audit_unavailable`, `agenshield_proxy_audit_retention_blocked` 1) until that file is old
//! enough or an operator archives it away: a flood of records must not destroy the evidence
//! of what came just before it.
//!
//! A file's newest record is the later of its last line's `time` and the file's mtime (the
//! last write to it), so neither a line cut short nor a clock step makes it look older.

use std::io::{self, Read, Seek, SeekFrom};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use super::rotation::rotated;

/// How much of a file's end is read for its last record.
const TAIL: u64 = 64 * 1024;

/// The file the next rotation deletes: `log.keep`, or the live file itself when none are
/// kept.
pub(super) fn next_deleted(path: &Path, keep: u32) -> PathBuf {
    if keep == 0 {
        path.to_path_buf()
    } else {
        rotated(path, keep)
    }
}

/// `Some(until)`: the file the next rotation would delete holds a record younger than
/// `retention`, until then. `None`: there is no such file, or it is old enough.
pub(super) fn held_until(
    path: &Path,
    keep: u32,
    retention: Duration,
    now: SystemTime,
) -> Option<SystemTime> {
    if retention.is_zero() {
        return None;
    }
    let newest = match newest_record(&next_deleted(path, keep)) {
        Ok(n) => n?,
        // Unreadable: keep it (deleting what we cannot date would be a guess).
        Err(e) => {
            tracing::warn!(path = ?path, "audit log rotation: cannot date the oldest file, keeping it: {e}");
            now
        }
    };
    let until = newest + retention;
    (now < until).then_some(until)
}

/// When the newest record of the file at `path` was written; `None` if there is no file,
/// or something else than a regular file (which holds no record; the rotation unlinks it).
/// Opened as the rotation opens it: never through a link, never blocking (a FIFO planted
/// there must not hold the writer role).
pub(super) fn newest_record(path: &Path) -> io::Result<Option<SystemTime>> {
    let opened = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_NONBLOCK)
        .open(path);
    let mut file = match opened {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        // O_NOFOLLOW on a link.
        Err(e) if e.raw_os_error() == Some(nix::libc::ELOOP) => return Ok(None),
        Err(e) => return Err(e),
    };
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Ok(None);
    }
    let mtime = meta.modified()?;
    let len = meta.len();
    let from = len.saturating_sub(TAIL);
    file.seek(SeekFrom::Start(from))?;
    let mut tail = Vec::new();
    file.take(len - from).read_to_end(&mut tail)?;
    let last = tail.split(|b| *b == b'\n').rev().find_map(record_time);
    Ok(Some(last.map_or(mtime, |t| t.max(mtime))))
}

/// The envelope's `time` of one line, if it is a record.
fn record_time(line: &[u8]) -> Option<SystemTime> {
    #[derive(serde::Deserialize)]
    struct Envelope<'a> {
        #[serde(borrow)]
        time: &'a str,
    }
    let env: Envelope<'_> = serde_json::from_slice(line).ok()?;
    let t = time::OffsetDateTime::parse(env.time, &time::format_description::well_known::Rfc3339)
        .ok()?;
    Some(SystemTime::from(t))
}

#[cfg(test)]
mod tests {
    use std::fs::File;

    use super::*;

    const DAY: Duration = Duration::from_secs(24 * 3600);

    #[test]
    fn a_file_is_held_while_its_newest_record_is_younger_than_the_retention() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("a.jsonl");
        let now = SystemTime::now();
        assert_eq!(held_until(&path, 1, DAY, now), None, "no file to delete");
        // An old record, in a file last written now: the mtime says it is young.
        std::fs::write(
            rotated(&path, 1),
            "{\"v\":2,\"seq\":1,\"time\":\"2020-01-01T00:00:00.000Z\",\"kind\":\"start\"}\n",
        )
        .expect("write");
        let until = held_until(&path, 1, DAY, now).expect("held by its mtime");
        assert!(until > now + DAY - Duration::from_secs(60), "{until:?}");
        // Both old: deleted.
        let old = SystemTime::UNIX_EPOCH + Duration::from_secs(1_577_836_800);
        File::options()
            .write(true)
            .open(rotated(&path, 1))
            .and_then(|f| f.set_modified(old))
            .expect("mtime");
        assert_eq!(held_until(&path, 1, DAY, now), None);
        // A record written a minute ago, in a file whose mtime was set back: held by it.
        let recent =
            crate::clock::rfc3339(time::OffsetDateTime::now_utc() - Duration::from_secs(60));
        std::fs::write(
            rotated(&path, 1),
            format!("{{\"time\":\"{recent}\"}}\nnot json, cut sh"),
        )
        .expect("write");
        File::options()
            .write(true)
            .open(rotated(&path, 1))
            .and_then(|f| f.set_modified(old))
            .expect("mtime");
        assert!(held_until(&path, 1, DAY, now).is_some());
        assert_eq!(held_until(&path, 1, Duration::ZERO, now), None, "off");
        // A FIFO or a link where the oldest file goes holds nothing (and does not block).
        std::fs::remove_file(rotated(&path, 1)).expect("rm");
        nix::unistd::mkfifo(&rotated(&path, 1), nix::sys::stat::Mode::S_IRWXU).expect("mkfifo");
        assert_eq!(held_until(&path, 1, DAY, now), None);
        std::fs::remove_file(rotated(&path, 1)).expect("rm");
        std::os::unix::fs::symlink(dir.path(), rotated(&path, 1)).expect("symlink");
        assert_eq!(held_until(&path, 1, DAY, now), None);
        // Keeping none: the live file is the one deleted.
        std::fs::write(&path, "live\n").expect("live");
        assert!(held_until(&path, 0, DAY, now).is_some());
    }

    /// Through the log: once the oldest kept file is younger than the retention, rotation
    /// stops, nothing is deleted, the log says it cannot take requests (the alarm is up);
    /// archiving that file away lets it rotate again.
    #[tokio::test]
    async fn a_full_log_whose_oldest_file_is_young_refuses_instead_of_deleting_it() {
        use crate::audit::tests::{cfg, request};
        use crate::audit::Audit;
        use crate::audit::AuditMetrics;

        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("a.jsonl");
        let c = crate::config::AuditConfig {
            retention: DAY,
            ..cfg(64 * 1024, 1)
        };
        let metrics = AuditMetrics::unregistered();
        let audit = Audit::open(&path, &c, metrics.clone(), None).expect("open");
        let mut n = 0;
        while audit.ready().is_ok() {
            n += 1;
            assert!(n < 1000, "never held back");
            assert!(audit.write(request(n, "allow")).await);
        }
        let why = audit.ready().expect_err("held").to_string();
        assert!(why.contains("audit.retention"), "{why}");
        assert_eq!(metrics.retention_blocked.get(), 1);
        assert_eq!(metrics.ready.get(), 0);
        // The first record is still there, in the file that was not deleted; records in
        // flight still go to the live file, past its size.
        let first = std::fs::read_to_string(rotated(&path, 1)).expect(".1");
        assert!(first.contains("\"request_id\":\"0000000000000001\""));
        assert!(audit.write(request(n + 1, "allow")).await);
        audit.sync().await;
        assert!(std::fs::metadata(&path).expect("live").len() > 64 * 1024);
        assert!(!rotated(&path, 2).exists());

        // Archived away: the next look rotates, and requests may go again.
        let archive = dir.path().join("archived.jsonl");
        std::fs::rename(rotated(&path, 1), &archive).expect("archive");
        tokio::time::sleep(Duration::from_millis(1300)).await;
        assert_eq!(audit.ready().map_err(|e| e.to_string()), Ok(()));
        assert_eq!(metrics.retention_blocked.get(), 0);
        assert_eq!(metrics.ready.get(), 1);
        assert!(rotated(&path, 1).exists(), "rotated");
        assert!(std::fs::metadata(&path).expect("live").len() < 1024);
        let files = [archive, rotated(&path, 1), path.clone()];
        audit.sync().await;
        let r = crate::audit::verify::verify(&files).expect("verify");
        assert_eq!(r.broken, None);
        assert!(r.starts_at_genesis());
    }
}
