//! Reading the audit log for a sink: from its cursor, line by line, following appends and
//! rotations. The log is the record of truth; a sink never gets a record any other way, so
//! what it ships is what the file holds, byte for byte.
//!
//! Only whole lines are handed out (the writer appends a batch with one `write(2)`, which a
//! reader may see half done: the rest comes on the next read). The position moves only when
//! the sink says a batch was shipped ([`LogReader::commit`]); until then the same lines come
//! again. A file is left for the next one only when it is no longer the live file and every
//! line of it was shipped: the reader holds it open, so even a file rotation deleted is read
//! to its end.

use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::ops::Range;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use bytes::Bytes;

use super::cursor::Cursor;
use crate::audit::chain::stated_hash;
use crate::audit::rotation::rotated;

/// How many bytes at a line's end hold its seal (`,"hash":"` + 64 hex + `"}`).
const SEAL_TAIL: usize = 9 + 64 + 2;

/// The longest line read (a record is under 100 KiB; this only bounds memory).
const MAX_LINE: usize = 8 << 20;

/// One line of the log, without its newline: a slice of the batch it was read in (one
/// buffer per batch, never a copy per line).
#[derive(Debug, Clone)]
pub(crate) struct Line {
    pub bytes: Bytes,
    /// Its envelope, when it is a record (`None` for a line cut short, say).
    pub seq: Option<u64>,
    time: Option<Bytes>,
    kind: Option<Bytes>,
    /// The offset just after its newline.
    end: u64,
}

impl Line {
    /// The record's `time`, as written.
    pub(crate) fn time(&self) -> Option<&str> {
        self.time
            .as_deref()
            .and_then(|t| std::str::from_utf8(t).ok())
    }

    /// The record's `kind`.
    pub(crate) fn kind(&self) -> Option<&str> {
        self.kind
            .as_deref()
            .and_then(|k| std::str::from_utf8(k).ok())
    }

    /// The hash the line's seal states.
    pub(crate) fn hash(&self) -> Option<&str> {
        hash_of(&self.bytes)
    }
}

/// How the reader found its place.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Resumed {
    /// A new sink: from the oldest record kept.
    Fresh,
    /// Just after the cursor's record.
    AtCursor,
    /// The cursor's record is no longer kept (rotated away, or the log replaced): from the
    /// oldest record kept; `lost` records between them were never shipped.
    FromOldest { lost: u64 },
}

pub(crate) struct LogReader {
    path: PathBuf,
    keep: u32,
    file: Option<File>,
    inode: u64,
    /// Everything before this was shipped.
    offset: u64,
    seq: u64,
    hash: String,
}

impl LogReader {
    /// A reader of the log at `path` (rotated files `.1`…`.keep`) positioned after `cursor`.
    pub(crate) fn open(
        path: &Path,
        keep: u32,
        cursor: Option<&Cursor>,
    ) -> io::Result<(LogReader, Resumed)> {
        let mut r = LogReader {
            path: path.to_path_buf(),
            keep,
            file: None,
            inode: 0,
            offset: 0,
            seq: 0,
            hash: String::new(),
        };
        let Some(c) = cursor else {
            r.start_at_oldest()?;
            return Ok((r, Resumed::Fresh));
        };
        r.seq = c.seq;
        r.hash = c.hash.clone();
        // The inode and offset, if the line before the offset is the cursor's record.
        for p in r.files() {
            let Some((f, ino)) = open_plain(&p)? else {
                continue;
            };
            if ino == c.inode && ends_with_record(&f, c.offset, &c.hash)? {
                r.place(f, ino, c.offset);
                return Ok((r, Resumed::AtCursor));
            }
        }
        // Else the record by its seq and hash, in the file that holds that seq.
        let mut holder = None;
        for p in r.files() {
            if let Some((f, ino)) = open_plain(&p)? {
                match first_seq(&f)? {
                    Some(first) if first <= c.seq => holder = Some((f, ino)),
                    _ => {}
                }
            }
        }
        if let Some((f, ino)) = holder {
            if let Some(end) = find_record(&f, c.seq, &c.hash)? {
                r.place(f, ino, end);
                return Ok((r, Resumed::AtCursor));
            }
        }
        let oldest = r.start_at_oldest()?;
        let lost = oldest.map_or(0, |first| first.saturating_sub(c.seq + 1));
        Ok((r, Resumed::FromOldest { lost }))
    }

    /// A reader of nothing, standing in while the real one is on the blocking pool.
    pub(crate) fn detached() -> LogReader {
        LogReader {
            path: PathBuf::new(),
            keep: 0,
            file: None,
            inode: 0,
            offset: 0,
            seq: 0,
            hash: String::new(),
        }
    }

    /// Where the reader stands (what a cursor saves).
    pub(crate) fn cursor(&self) -> Cursor {
        Cursor {
            inode: self.inode,
            offset: self.offset,
            seq: self.seq,
            hash: self.hash.clone(),
        }
    }

    /// The seq of the last line shipped.
    pub(crate) fn seq(&self) -> u64 {
        self.seq
    }

    /// The whole lines after the position, at most about `max_bytes` of them (at least one
    /// line, however long); empty when there is nothing new. Moves to the next file when the
    /// current one was rotated and is done.
    pub(crate) fn next_batch(&mut self, max_bytes: usize) -> io::Result<Vec<Line>> {
        if self.file.is_none() {
            match open_plain(&self.path)? {
                Some((f, ino)) => self.place(f, ino, 0),
                None => return Ok(Vec::new()),
            }
        }
        let lines = self.read_lines(max_bytes)?;
        if !lines.is_empty() {
            return Ok(lines);
        }
        // Nothing new here. Still the live file? Then wait for the writer.
        let live = std::fs::symlink_metadata(&self.path).ok().map(|m| m.ino());
        if live == Some(self.inode) {
            return Ok(Vec::new());
        }
        // Rotated: what the writer wrote before the rotation is there now.
        let lines = self.read_lines(max_bytes)?;
        if !lines.is_empty() {
            return Ok(lines);
        }
        if self.next_file()? {
            return self.read_lines(max_bytes);
        }
        Ok(Vec::new())
    }

    /// `lines` (the start of the last batch) were shipped: the position moves past them.
    pub(crate) fn commit(&mut self, lines: &[Line]) {
        let Some(last) = lines.last() else { return };
        self.offset = last.end;
        if let Some((seq, hash)) = lines.iter().rev().find_map(|l| Some((l.seq?, l.hash()?))) {
            self.seq = seq;
            self.hash = hash.to_string();
        }
    }

    fn read_lines(&mut self, max_bytes: usize) -> io::Result<Vec<Line>> {
        let Some(f) = &self.file else {
            return Ok(Vec::new());
        };
        // Only what the file holds past the position is read (and allocated): a sink that
        // looks often at a log that grew a little pays for that little.
        let size = f.metadata()?.len();
        let avail = usize::try_from(size.saturating_sub(self.offset)).unwrap_or(MAX_LINE);
        if avail == 0 {
            return Ok(Vec::new());
        }
        let mut want = max_bytes.max(4096).min(avail);
        loop {
            let buf = read_from(f, self.offset, want)?;
            let n = buf.len();
            let Some(last_nl) = memchr::memrchr(b'\n', &buf) else {
                if n == want && want < MAX_LINE && want < avail {
                    want = (want * 2).min(MAX_LINE).min(avail);
                    continue;
                }
                return Ok(Vec::new());
            };
            let buf = Bytes::from(buf);
            let mut out = Vec::new();
            let mut start = 0usize;
            for nl in memchr::memchr_iter(b'\n', &buf[..=last_nl]) {
                out.push(line(buf.slice(start..nl), self.offset + nl as u64 + 1));
                start = nl + 1;
            }
            return Ok(out);
        }
    }

    /// Moves to the file after the current one: the one whose first record follows the
    /// last one shipped (or, after a gap, the next one there is; or the new live file).
    fn next_file(&mut self) -> io::Result<bool> {
        let mut best: Option<(u64, File, u64)> = None;
        let mut live = None;
        for p in self.files() {
            let Some((f, ino)) = open_plain(&p)? else {
                continue;
            };
            if ino == self.inode {
                continue;
            }
            match first_seq(&f)? {
                Some(first)
                    if first > self.seq && best.as_ref().is_none_or(|(b, _, _)| first < *b) =>
                {
                    best = Some((first, f, ino));
                }
                None if p == self.path => live = Some((f, ino)),
                _ => {}
            }
        }
        if let Some((first, f, ino)) = best {
            if first > self.seq + 1 && self.seq > 0 {
                tracing::warn!(
                    path = ?self.path,
                    "audit export: records {}..{} were rotated away before they were shipped",
                    self.seq + 1,
                    first - 1
                );
            }
            self.place(f, ino, 0);
            return Ok(true);
        }
        if let Some((f, ino)) = live {
            self.place(f, ino, 0);
            return Ok(true);
        }
        Ok(false)
    }

    /// The kept files, oldest first, the live file last.
    fn files(&self) -> Vec<PathBuf> {
        let mut v: Vec<PathBuf> = (1..=self.keep)
            .rev()
            .map(|n| rotated(&self.path, n))
            .collect();
        v.push(self.path.clone());
        v
    }

    /// At the start of the oldest kept file; returns its first seq.
    fn start_at_oldest(&mut self) -> io::Result<Option<u64>> {
        for p in self.files() {
            if let Some((f, ino)) = open_plain(&p)? {
                let first = first_seq(&f)?;
                self.place(f, ino, 0);
                return Ok(first);
            }
        }
        Ok(None)
    }

    fn place(&mut self, f: File, ino: u64, offset: u64) {
        self.file = Some(f);
        self.inode = ino;
        self.offset = offset;
    }
}

/// Opens a regular file for reading, never through a link and never blocking (a FIFO
/// planted where a rotated file goes must not hang the sink); `None` if there is none.
fn open_plain(path: &Path) -> io::Result<Option<(File, u64)>> {
    let opened = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_NONBLOCK)
        .open(path);
    let f = match opened {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) if e.raw_os_error() == Some(nix::libc::ELOOP) => return Ok(None),
        Err(e) => return Err(e),
    };
    let meta = f.metadata()?;
    Ok(meta.is_file().then(|| (f, meta.ino())))
}

fn read_full_at(f: &File, buf: &mut [u8], at: u64) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match f.read_at(&mut buf[n..], at + n as u64) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// Up to `len` bytes of `f` from `at`, into a buffer that is not zeroed first (the file
/// fills it).
fn read_from(f: &File, at: u64, len: usize) -> io::Result<Vec<u8>> {
    let mut buf = Vec::with_capacity(len);
    let mut r = f;
    r.seek(SeekFrom::Start(at))?;
    r.take(len as u64).read_to_end(&mut buf)?;
    Ok(buf)
}

fn line(bytes: Bytes, end: u64) -> Line {
    let (seq, time, kind) = match front_spans(&bytes) {
        Some(sp) => (
            Some(sp.seq),
            Some(bytes.slice(sp.time)),
            Some(bytes.slice(sp.kind)),
        ),
        None => {
            let (seq, time, kind) = envelope(&bytes);
            (seq, time.map(Bytes::from), kind.map(Bytes::from))
        }
    };
    Line {
        bytes,
        seq,
        time,
        kind,
        end,
    }
}

/// The hash a line's seal states. The seal is ASCII at the end: only that much needs to be
/// text.
fn hash_of(bytes: &[u8]) -> Option<&str> {
    let tail = &bytes[bytes.len().saturating_sub(SEAL_TAIL)..];
    std::str::from_utf8(tail).ok().and_then(stated_hash)
}

/// The line's `seq`, `time` and `kind`. The writer puts them first, in that order, after
/// `v` (`{"v":2,"seq":7,"time":"…","kind":"request",…`), so they are read from the front
/// of the line without parsing the rest; a line shaped otherwise (a foreign or older
/// writer, a line cut short) is parsed whole.
fn envelope(bytes: &[u8]) -> (Option<u64>, Option<String>, Option<String>) {
    if let Some(found) = envelope_in_front(bytes) {
        return found;
    }
    #[derive(serde::Deserialize)]
    struct Envelope {
        seq: Option<u64>,
        time: Option<String>,
        kind: Option<String>,
    }
    let env: Option<Envelope> = serde_json::from_slice(bytes).ok();
    env.map_or((None, None, None), |e| (e.seq, e.time, e.kind))
}

type Front = (Option<u64>, Option<String>, Option<String>);

fn envelope_in_front(bytes: &[u8]) -> Option<Front> {
    let sp = front_spans(bytes)?;
    let text = |r: Range<usize>| String::from_utf8_lossy(&bytes[r]).into_owned();
    Some((Some(sp.seq), Some(text(sp.time)), Some(text(sp.kind))))
}

/// Where the envelope read in front sits in the line.
struct Spans {
    seq: u64,
    time: Range<usize>,
    kind: Range<usize>,
}

fn front_spans(bytes: &[u8]) -> Option<Spans> {
    let at = |rest: &[u8]| bytes.len() - rest.len();
    let rest = bytes.strip_prefix(b"{\"v\":")?;
    let (_, rest) = digits(rest)?;
    let rest = rest.strip_prefix(b",\"seq\":")?;
    let (seq, rest) = digits(rest)?;
    let rest = rest.strip_prefix(b",\"time\":\"")?;
    let time_at = at(rest);
    let (time_len, rest) = plain_string(rest)?;
    let rest = rest.strip_prefix(b",\"kind\":\"")?;
    let kind_at = at(rest);
    let (kind_len, rest) = plain_string(rest)?;
    // The envelope ends there: another member follows, or the object (then the seal) ends.
    if !matches!(rest.first(), Some(b',' | b'}')) {
        return None;
    }
    Some(Spans {
        seq,
        time: time_at..time_at + time_len,
        kind: kind_at..kind_at + kind_len,
    })
}

/// A JSON unsigned integer at the front of `b` (no sign, no leading zero unless it is 0,
/// no fraction) and what follows it.
fn digits(b: &[u8]) -> Option<(u64, &[u8])> {
    let n = b.iter().take_while(|c| c.is_ascii_digit()).count();
    let text = std::str::from_utf8(&b[..n]).ok()?;
    if n == 0 || (n > 1 && text.starts_with('0')) {
        return None;
    }
    if matches!(b.get(n), Some(b'.' | b'e' | b'E')) {
        return None;
    }
    Some((text.parse().ok()?, &b[n..]))
}

/// The length of a JSON string's content up to its closing quote, when it has no escapes
/// and no control characters and is UTF-8 (what the writer's time and kind always are),
/// and what follows the quote.
fn plain_string(b: &[u8]) -> Option<(usize, &[u8])> {
    let n = memchr::memchr2(b'"', b'\\', b)?;
    if b[n] != b'"' || b[..n].iter().any(|c| *c < 0x20) {
        return None;
    }
    std::str::from_utf8(&b[..n]).ok()?;
    Some((n, &b[n + 1..]))
}

/// The seq of the file's first line, if it is a record.
fn first_seq(f: &File) -> io::Result<Option<u64>> {
    let mut buf = vec![0u8; 64 * 1024];
    let n = read_full_at(f, &mut buf, 0)?;
    let Some(nl) = memchr::memchr(b'\n', &buf[..n]) else {
        return Ok(None);
    };
    Ok(envelope(&buf[..nl]).0)
}

/// Whether the line that ends at `offset` (its newline the byte before) carries `hash`;
/// offset 0 with no hash: the start of the log.
fn ends_with_record(f: &File, offset: u64, hash: &str) -> io::Result<bool> {
    if offset == 0 {
        return Ok(hash.is_empty());
    }
    let from = offset.saturating_sub(1 << 20);
    let mut buf = vec![0u8; usize::try_from(offset - from).unwrap_or(1 << 20)];
    let n = read_full_at(f, &mut buf, from)?;
    if n != buf.len() || buf.last() != Some(&b'\n') {
        return Ok(false);
    }
    let body = &buf[..n - 1];
    let start = memchr::memrchr(b'\n', body).map_or(0, |i| i + 1);
    Ok(hash_of(&body[start..]) == Some(hash))
}

/// The offset after the line with `seq` and `hash`, if the file holds it.
fn find_record(f: &File, seq: u64, hash: &str) -> io::Result<Option<u64>> {
    let mut offset = 0u64;
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = read_full_at(f, &mut buf, offset)?;
        let Some(last_nl) = memchr::memrchr(b'\n', &buf[..n]) else {
            return Ok(None);
        };
        let mut start = 0usize;
        for nl in memchr::memchr_iter(b'\n', &buf[..=last_nl]) {
            let piece = &buf[start..nl];
            if envelope(piece).0 == Some(seq) {
                return Ok((hash_of(piece) == Some(hash)).then_some(offset + nl as u64 + 1));
            }
            start = nl + 1;
        }
        offset += (last_nl + 1) as u64;
    }
}

#[cfg(test)]
#[path = "reader_tests.rs"]
mod tests;
