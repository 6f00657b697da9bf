//! A body scanned as it streams, without buffering it whole: each scan covers the bytes not
//! yet scanned plus the last [`OVERLAP`] bytes before them, so a credential split across
//! chunks (or HTTP/2 DATA frames) is seen whole, and the last `OVERLAP` bytes are held back
//! until the next scan has seen what follows them: the caller releases only bytes no later
//! data can turn into part of a credential it has not judged yet. A scan runs once
//! [`STEP`] new bytes have come (so tiny chunks do not rescan the overlap each), at a pause
//! (`flush`) and at the end (`finish`).
//!
//! The window's start is aligned, inside a base64 or hex run, to a multiple of 4 bytes from
//! the run's start, so the run decodes as it would whole.

use std::collections::HashSet;

use bytes::{Bytes, BytesMut};

use super::detector::{Detector, Encoding, Finding, Findings, Fingerprint};
use super::format::Format;

/// Bytes before the unscanned ones that each scan covers again, and the most held back
/// after a scan: the longest credential the detector knows (a private-key block, percent-
/// encoded) fits in it.
pub(crate) const OVERLAP: usize = 32 * 1024;
/// New bytes that make a scan run. Each scan also covers the `OVERLAP` before them again,
/// so a bulk upload is scanned (STEP + OVERLAP) / STEP = 1.33 times; a stream holds at most
/// about STEP + OVERLAP bytes.
pub(crate) const STEP: usize = 96 * 1024;
/// Distinct findings remembered per stream (so one is reported once, not at every window
/// that sees it again).
const MAX_SEEN: usize = 256;

/// The streaming scan of one body.
pub(crate) struct StreamScan {
    /// `[released context][held back][not scanned yet]`.
    buf: BytesMut,
    /// `buf[..released]` went on already.
    released: usize,
    /// `buf[..scanned]` has been scanned.
    scanned: usize,
    /// The absolute offset of `buf[0]`, and of the start of the base64/hex run it is in
    /// (when it is in one).
    base: u64,
    run_start: Option<u64>,
    findings: Findings,
    seen: HashSet<(Format, Fingerprint)>,
    /// A scan hit the decoding work cap: part of the body was scanned raw only.
    pub capped: bool,
}

impl Default for StreamScan {
    fn default() -> Self {
        StreamScan {
            buf: BytesMut::new(),
            released: 0,
            scanned: 0,
            base: 0,
            run_start: None,
            findings: Findings::default(),
            seen: HashSet::new(),
            capped: false,
        }
    }
}

impl StreamScan {
    /// Bytes held back (scanned or not), not released yet.
    pub(crate) fn held(&self) -> usize {
        self.buf.len() - self.released
    }

    /// Takes a chunk; new findings go to `out`. Returns the bytes that may go on once the
    /// caller has judged `out` (empty while held back).
    pub(crate) fn push(&mut self, d: &Detector, chunk: &[u8], out: &mut Vec<Finding>) -> Bytes {
        self.buf.extend_from_slice(chunk);
        if self.buf.len() - self.scanned < STEP {
            return Bytes::new();
        }
        self.scan(d, out, false);
        let keep_from = self.buf.len().saturating_sub(OVERLAP).max(self.released);
        self.release(keep_from)
    }

    /// The stream paused: scans what is new and releases everything (what follows is still
    /// scanned with this as context, but these bytes are gone).
    pub(crate) fn flush(&mut self, d: &Detector, out: &mut Vec<Finding>) -> Bytes {
        if self.scanned < self.buf.len() {
            self.scan(d, out, true);
        }
        let end = self.buf.len();
        self.release(end)
    }

    /// The end of the body: scans what is left and releases it.
    pub(crate) fn finish(&mut self, d: &Detector, out: &mut Vec<Finding>) -> Bytes {
        self.flush(d, out)
    }

    /// Scans the window. Unless `last` (nothing follows yet), a raw finding that ends where
    /// the window ends is left for the next scan: the token may go on in the next chunk (a
    /// longer run of letters is no credential); it is held back, so nothing of it has gone.
    fn scan(&mut self, d: &Detector, out: &mut Vec<Finding>, last: bool) {
        d.scan(&self.buf, &mut self.findings);
        self.capped |= self.findings.decode_capped;
        let end = self.buf.len();
        for f in self.findings.iter() {
            if !last && f.encoding == Encoding::Raw && f.range.end == end {
                continue;
            }
            // Seen in an earlier window (the overlap is scanned again).
            let key = (f.format, f.fingerprint);
            if self.seen.contains(&key) {
                continue;
            }
            if self.seen.len() < MAX_SEEN {
                self.seen.insert(key);
            }
            out.push(f.clone());
        }
        self.scanned = end;
    }

    /// Releases `buf[released..upto]`, then drops what the next window no longer needs:
    /// everything before the last `OVERLAP` bytes, the cut aligned inside an encoded run.
    fn release(&mut self, upto: usize) -> Bytes {
        let out = Bytes::copy_from_slice(&self.buf[self.released..upto]);
        self.released = upto;
        let cut = self.buf.len().saturating_sub(OVERLAP).min(self.released);
        if cut > 0 {
            let cut = self.aligned(cut);
            let _ = self.buf.split_to(cut);
            self.base += cut as u64;
            self.released -= cut;
            self.scanned -= cut;
        }
        out
    }

    /// `cut`, moved back (by at most 3 bytes) to a multiple of 4 from the start of the
    /// base64/hex run it falls in; remembers that run's start for the next cut.
    fn aligned(&mut self, cut: usize) -> usize {
        if !is_run_byte(self.buf[cut]) {
            self.run_start = None;
            return cut;
        }
        let start = match self.buf[..cut].iter().rposition(|&b| !is_run_byte(b)) {
            Some(i) => self.base + i as u64 + 1,
            // The run began before this window: where it was found to begin.
            None => self.run_start.unwrap_or(self.base),
        };
        let abs = self.base + cut as u64;
        let aligned = start + (abs - start) / 4 * 4;
        let aligned = aligned.max(self.base);
        self.run_start = Some(start);
        (aligned - self.base) as usize
    }
}

/// A byte of a base64, base64url or hex run.
fn is_run_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'+' | b'/' | b'-' | b'_')
}
