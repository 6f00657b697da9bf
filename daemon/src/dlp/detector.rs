//! The detector: one Aho-Corasick automaton over every literal prefix and marker, built once,
//! run once over the input and once over each decoded run; each match is verified where it
//! stands (`verify.rs`). Not a regular expression per format per byte: the automaton's
//! prefilter skips ordinary text at memory speed, and verification is bounded per match.
//!
//! What it reports is where and what, never the value: a [`Finding`] holds the format, the
//! range in the scanned input, the encoding it was found under, and a keyed fingerprint
//! (for `dlp_allow` and for telling repeats apart), and its `Debug` shows the format and the
//! length only.

use std::fmt;
use std::ops::Range;

use aho_corasick::{AhoCorasick, AhoCorasickBuilder, MatchKind};
use sha2::{Digest, Sha256};

use super::decode::{self, DecodeBudget};
use super::format::Format;
use super::marker::{Marker, LITERALS};
use super::verify::{verify, Hit};

/// Findings past this many in one input are not listed (`Findings::truncated` says so): one
/// is enough to refuse.
const MAX_FINDINGS: usize = 64;

/// Under which encoding a credential was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Encoding {
    Raw,
    /// `%XX` escapes decoded.
    Percent,
    /// JSON string escapes (`\uXXXX`, `\/`) decoded.
    JsonEscape,
    /// A base64 or base64url run decoded.
    Base64,
    /// A run of hex digits decoded.
    Hex,
}

/// A keyed hash of a credential's value (SHA-256 under the detector's random key): equal
/// values give equal fingerprints within one detector, and nothing outside it can tell what
/// value a fingerprint stands for.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Fingerprint([u8; 32]);

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Fingerprint([redacted])")
    }
}

/// One credential found. The value itself is not kept.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Finding {
    pub format: Format,
    /// Where in the scanned input: the credential, or the whole encoded run it was decoded
    /// from.
    pub range: Range<usize>,
    pub encoding: Encoding,
    /// The value's length in bytes (decoded).
    pub len: usize,
    pub fingerprint: Fingerprint,
}

impl fmt::Debug for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Finding")
            .field("format", &self.format)
            .field("len", &self.len)
            .finish_non_exhaustive()
    }
}

/// What one scan found (reused across scans: `scan` clears it).
#[derive(Default)]
pub(crate) struct Findings {
    list: Vec<Finding>,
    /// More than [`MAX_FINDINGS`]: the rest were not listed.
    pub truncated: bool,
    /// The decoding work cap stopped decoding before the end of the input: what was not
    /// decoded was scanned raw only. A caller that must be sure refuses.
    pub decode_capped: bool,
    scratch: Vec<u8>,
}

/// The findings only: the decoding scratch (which held decoded input) is never shown.
impl fmt::Debug for Findings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Findings")
            .field("list", &self.list)
            .field("truncated", &self.truncated)
            .field("decode_capped", &self.decode_capped)
            .finish()
    }
}

impl Findings {
    pub(crate) fn iter(&self) -> impl Iterator<Item = &Finding> {
        self.list.iter()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    pub(crate) fn len(&self) -> usize {
        self.list.len()
    }

    fn clear(&mut self) {
        self.list.clear();
        self.truncated = false;
        self.decode_capped = false;
    }

    fn push(&mut self, finding: Finding) {
        let seen = self
            .list
            .iter()
            .any(|f| f.format == finding.format && f.fingerprint == finding.fingerprint);
        if seen {
            return;
        }
        if self.list.len() >= MAX_FINDINGS {
            self.truncated = true;
            return;
        }
        self.list.push(finding);
    }
}

/// The credential detector, built once and shared.
pub(crate) struct Detector {
    automaton: AhoCorasick,
    key: [u8; 32],
}

impl fmt::Debug for Detector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Detector")
            .field("literals", &LITERALS.len())
            .finish_non_exhaustive()
    }
}

impl Detector {
    /// Builds the automaton and draws the fingerprint key.
    pub(crate) fn new() -> Detector {
        let automaton = AhoCorasickBuilder::new()
            .match_kind(MatchKind::LeftmostLongest)
            .build(LITERALS.iter().map(|(lit, _)| lit))
            // The literal table is static and valid: a failure here is a programming error
            // the first test shows.
            .expect("the credential literals build an automaton");
        Detector {
            automaton,
            key: rand::random(),
        }
    }

    /// Scans `bytes` (one whole value: a URL, a header, a body, a frame, a name) raw, then
    /// one level inside its percent-encoded, JSON-escaped, base64 and hex runs, within a
    /// work cap linear in its length. Compressed bodies must be decompressed first
    /// ([`super::decompress_capped`]). `out` is cleared first.
    pub(crate) fn scan(&self, bytes: &[u8], out: &mut Findings) {
        out.clear();
        self.scan_layer(bytes, Encoding::Raw, None, out);
        let mut budget = DecodeBudget::for_input(bytes.len());
        let mut scratch = std::mem::take(&mut out.scratch);
        decode::each_run(
            bytes,
            &mut budget,
            &mut scratch,
            &mut |encoding, run, decoded| {
                self.scan_layer(decoded, encoding, Some(run), out);
            },
        );
        out.decode_capped = budget.exhausted();
        // Decoded input stays no longer than the scan; the capacity is kept for the next.
        scratch.clear();
        out.scratch = scratch;
    }

    /// The fingerprint `value` would have in a finding.
    pub(crate) fn fingerprint(&self, value: &[u8]) -> Fingerprint {
        let mut h = Sha256::new();
        h.update(self.key);
        h.update(value);
        Fingerprint(h.finalize().into())
    }

    fn scan_layer(
        &self,
        hay: &[u8],
        encoding: Encoding,
        run: Option<Range<usize>>,
        out: &mut Findings,
    ) {
        let mut covered = 0usize;
        for m in self.automaton.find_iter(hay) {
            if m.start() < covered {
                continue;
            }
            let marker: Marker = LITERALS[m.pattern().as_usize()].1;
            verify(marker, hay, m.start(), m.len(), &mut |hit: Hit| {
                covered = covered.max(hit.range.end);
                out.push(Finding {
                    format: hit.format,
                    range: run.clone().unwrap_or_else(|| hit.range.clone()),
                    encoding,
                    len: hit.range.len(),
                    fingerprint: self.fingerprint(&hay[hit.range]),
                });
            });
        }
    }
}

impl Default for Detector {
    fn default() -> Self {
        Detector::new()
    }
}
