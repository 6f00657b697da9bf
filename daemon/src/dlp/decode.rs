//! One level of decoding for the detector: the runs of an input that may hide a credential
//! under percent-encoding, JSON string escapes, base64/base64url or hex, decoded one by one
//! into a scratch buffer the detector scans.
//!
//! Cost stays linear: only runs of plausible length are decoded (a run shorter than the
//! shortest credential encoded cannot hold one), long base64/hex runs are decoded in
//! overlapping chunks (so a credential across a chunk edge is still seen whole, and scratch
//! stays small), and every call has a work cap ([`DecodeBudget`]) proportional to its input.
//! Form and multipart bodies need no decoder of their own: their fields are text, and their
//! `%XX` escapes are the percent runs. Line-wrapped base64 (MIME, 76 characters a line) is
//! decoded line by line.

use std::ops::Range;

use base64::alphabet;
use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
use base64::Engine as _;

use super::detector::Encoding;

/// The shortest credential (an AWS key id) is 20 bytes.
const MIN_TEXT_RUN: usize = 20;
/// 20 bytes in base64.
const MIN_BASE64_RUN: usize = 27;
/// 20 bytes in hex.
const MIN_HEX_RUN: usize = 40;
/// Encoded bytes decoded per step of a long base64/hex run (a multiple of 4).
const CHUNK: usize = 64 * 1024;
/// Encoded bytes each step shares with the previous one (a multiple of 4): the longest
/// credential followed (a 16 KiB private-key block) fits in it encoded.
const OVERLAP: usize = 24 * 1024;
/// Decoded bytes allowed per input byte, and per call.
const WORK_FACTOR: usize = 6;
const WORK_SLACK: usize = 64 * 1024;

/// Called with each decoded run: its encoding, its range in the input, the decoded bytes.
pub(super) type OnRun<'a> = &'a mut dyn FnMut(Encoding, Range<usize>, &[u8]);

/// The decoding work one scan may do.
#[derive(Debug)]
pub(super) struct DecodeBudget {
    left: usize,
    exhausted: bool,
}

impl DecodeBudget {
    pub(super) fn for_input(len: usize) -> DecodeBudget {
        DecodeBudget {
            left: len.saturating_mul(WORK_FACTOR).saturating_add(WORK_SLACK),
            exhausted: false,
        }
    }

    /// Spends `n` decoded bytes, or reports the cap reached.
    fn take(&mut self, n: usize) -> bool {
        if self.exhausted || n > self.left {
            self.exhausted = true;
            return false;
        }
        self.left -= n;
        true
    }

    pub(super) fn exhausted(&self) -> bool {
        self.exhausted
    }
}

/// Calls `f(encoding, run, decoded)` for each decodable run of `bytes` (its range in
/// `bytes`), until the budget runs out.
pub(super) fn each_run(
    bytes: &[u8],
    budget: &mut DecodeBudget,
    scratch: &mut Vec<u8>,
    f: OnRun<'_>,
) {
    if memchr::memchr(b'%', bytes).is_some() {
        percent_runs(bytes, budget, scratch, f);
    }
    if memchr::memchr(b'\\', bytes).is_some() {
        json_runs(bytes, budget, scratch, f);
    }
    base64_hex_runs(bytes, budget, scratch, f);
}

/// Bytes that end a URL-ish run: whitespace, quotes, brackets, and the separators of forms,
/// headers and markup.
fn is_text_delimiter(b: u8) -> bool {
    b.is_ascii_whitespace()
        || matches!(
            b,
            b'"' | b'\''
                | b'&'
                | b'<'
                | b'>'
                | b'('
                | b')'
                | b','
                | b';'
                | b'{'
                | b'}'
                | b'['
                | b']'
                | b'|'
                | b'`'
                | b'\\'
        )
}

fn split_runs(bytes: &[u8], delimiter: fn(u8) -> bool) -> impl Iterator<Item = Range<usize>> + '_ {
    let mut i = 0;
    std::iter::from_fn(move || {
        while i < bytes.len() && delimiter(bytes[i]) {
            i += 1;
        }
        if i >= bytes.len() {
            return None;
        }
        let start = i;
        while i < bytes.len() && !delimiter(bytes[i]) {
            i += 1;
        }
        Some(start..i)
    })
}

fn percent_runs(bytes: &[u8], budget: &mut DecodeBudget, scratch: &mut Vec<u8>, f: OnRun<'_>) {
    for run in split_runs(bytes, is_text_delimiter) {
        let s = &bytes[run.clone()];
        let escaped = s
            .windows(3)
            .any(|w| w[0] == b'%' && w[1].is_ascii_hexdigit() && w[2].is_ascii_hexdigit());
        if s.len() < MIN_TEXT_RUN || !escaped {
            continue;
        }
        if !budget.take(s.len()) {
            return;
        }
        scratch.clear();
        scratch.extend(percent_encoding::percent_decode(s));
        f(Encoding::Percent, run, scratch);
    }
}

/// JSON strings (between unescaped quotes) that hold `\uXXXX` or `\/` escapes.
fn json_runs(bytes: &[u8], budget: &mut DecodeBudget, scratch: &mut Vec<u8>, f: OnRun<'_>) {
    let mut start = 0;
    let mut i = 0;
    while i <= bytes.len() {
        let end_here = i == bytes.len() || bytes[i] == b'"';
        if !end_here {
            i = (i + if bytes[i] == b'\\' { 2 } else { 1 }).min(bytes.len());
            continue;
        }
        let run = start..i.min(bytes.len());
        let s = &bytes[run.clone()];
        let escaped = s.windows(2).any(|w| w == b"\\u" || w == b"\\/");
        if s.len() >= MIN_TEXT_RUN && escaped {
            if !budget.take(s.len()) {
                return;
            }
            json_unescape(s, scratch);
            f(Encoding::JsonEscape, run, scratch);
        }
        i += 1;
        start = i;
    }
}

/// JSON string escapes decoded (surrogate pairs joined); anything malformed is kept as is.
pub(super) fn json_unescape(s: &[u8], out: &mut Vec<u8>) {
    out.clear();
    let mut i = 0;
    while i < s.len() {
        if s[i] != b'\\' || i + 1 >= s.len() {
            out.push(s[i]);
            i += 1;
            continue;
        }
        let simple = match s[i + 1] {
            b'/' => Some(b'/'),
            b'\\' => Some(b'\\'),
            b'"' => Some(b'"'),
            b'n' => Some(b'\n'),
            b'r' => Some(b'\r'),
            b't' => Some(b'\t'),
            b'b' => Some(0x08),
            b'f' => Some(0x0c),
            _ => None,
        };
        if let Some(b) = simple {
            out.push(b);
            i += 2;
            continue;
        }
        let Some(unit) = hex4(s, i) else {
            out.push(s[i]);
            i += 1;
            continue;
        };
        let mut consumed = 6;
        let mut code = u32::from(unit);
        if (0xD800..0xDC00).contains(&unit) {
            if let Some(low) = hex4(s, i + 6).filter(|l| (0xDC00..0xE000).contains(l)) {
                code = 0x10000 + ((code - 0xD800) << 10) + (u32::from(low) - 0xDC00);
                consumed = 12;
            }
        }
        let c = char::from_u32(code).unwrap_or(char::REPLACEMENT_CHARACTER);
        let mut buf = [0u8; 4];
        out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
        i += consumed;
    }
}

/// The code unit of `\uXXXX` at `i`.
fn hex4(s: &[u8], i: usize) -> Option<u16> {
    let h = s.get(i..i + 6)?;
    if h[0] != b'\\' || h[1] != b'u' {
        return None;
    }
    let text = std::str::from_utf8(&h[2..]).ok()?;
    u16::from_str_radix(text, 16).ok()
}

fn is_base64_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'+' | b'/' | b'-' | b'_')
}

fn base64_hex_runs(bytes: &[u8], budget: &mut DecodeBudget, scratch: &mut Vec<u8>, f: OnRun<'_>) {
    for run in split_runs(bytes, |b| !is_base64_byte(b)) {
        if run.len() < MIN_BASE64_RUN {
            continue;
        }
        if !decode_run(bytes, run.clone(), budget, scratch, f) {
            return;
        }
        // A base64 segment of a URL path (`/v1/<base64>/x`): decode each segment too.
        let s = &bytes[run.clone()];
        if memchr::memchr(b'/', s).is_some() {
            for seg in split_runs(s, |b| b == b'/') {
                let seg = run.start + seg.start..run.start + seg.end;
                if seg.len() >= MIN_BASE64_RUN && !decode_run(bytes, seg, budget, scratch, f) {
                    return;
                }
            }
        }
    }
}

/// Decodes one run as hex (all hex digits, 40 or more) or base64 (one alphabet), in chunks.
/// False when the budget ran out.
fn decode_run(
    bytes: &[u8],
    run: Range<usize>,
    budget: &mut DecodeBudget,
    scratch: &mut Vec<u8>,
    f: OnRun<'_>,
) -> bool {
    let s = &bytes[run.clone()];
    let hex = s.iter().all(u8::is_ascii_hexdigit);
    if hex && s.len() < MIN_HEX_RUN {
        return true;
    }
    let url = s.iter().any(|b| matches!(b, b'-' | b'_'));
    let std = s.iter().any(|b| matches!(b, b'+' | b'/'));
    if !hex && url && std {
        return true; // not one base64 alphabet
    }
    let mut at = 0;
    loop {
        let end = (at + CHUNK).min(s.len());
        let chunk = &s[at..end];
        let cost = if hex {
            chunk.len() / 2
        } else {
            chunk.len() / 4 * 3 + 2
        };
        if !budget.take(cost) {
            return false;
        }
        scratch.clear();
        let ok = if hex {
            hex_decode(chunk, scratch)
        } else {
            base64_decode(chunk, url, scratch)
        };
        if ok && !scratch.is_empty() {
            f(
                if hex { Encoding::Hex } else { Encoding::Base64 },
                run.clone(),
                scratch,
            );
        }
        if end == s.len() {
            return true;
        }
        at = end - OVERLAP;
    }
}

fn hex_decode(s: &[u8], out: &mut Vec<u8>) -> bool {
    let digit = |b: u8| match b {
        b'0'..=b'9' => b - b'0',
        b'a'..=b'f' => b - b'a' + 10,
        _ => b.to_ascii_lowercase().wrapping_sub(b'a').wrapping_add(10),
    };
    out.extend(s.chunks_exact(2).map(|p| digit(p[0]) << 4 | digit(p[1])));
    true
}

/// Lenient base64: padding optional, trailing bits allowed, a dangling last character
/// dropped.
fn base64_decode(s: &[u8], url: bool, out: &mut Vec<u8>) -> bool {
    const CONFIG: GeneralPurposeConfig = GeneralPurposeConfig::new()
        .with_decode_padding_mode(DecodePaddingMode::Indifferent)
        .with_decode_allow_trailing_bits(true);
    const STD: GeneralPurpose = GeneralPurpose::new(&alphabet::STANDARD, CONFIG);
    const URL: GeneralPurpose = GeneralPurpose::new(&alphabet::URL_SAFE, CONFIG);
    let s = if s.len() % 4 == 1 {
        &s[..s.len() - 1]
    } else {
        s
    };
    let engine = if url { &URL } else { &STD };
    engine.decode_vec(s, out).is_ok()
}
