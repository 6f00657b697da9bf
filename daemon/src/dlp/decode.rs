//! One level of decoding for the detector: the runs of an input that may hide a credential
//! under percent-encoding, JSON string escapes, base64/base64url or hex, decoded one by one
//! into a scratch buffer the detector scans.
//!
//! Cost stays linear: only runs of plausible length are decoded (a run shorter than the
//! shortest credential encoded cannot hold one), long base64/hex runs are decoded in
//! overlapping chunks (so a credential across a chunk edge is still seen whole, and scratch
//! stays small), and every call has a work cap ([`DecodeBudget`]) proportional to its input.
//! Form and multipart bodies need no decoder of their own: their fields are text, and their
//! `%XX` escapes are the percent runs. Line-wrapped base64 (MIME, 76 characters a line; PEM,
//! 64) is joined and decoded as one run: a credential across a line break is seen whole.

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
/// The longest run whose `/`-separated segments are decoded one by one (a URL path).
const MAX_PATH_RUN: usize = 4096;
/// The shortest line of a line-wrapped block (but its last): base64 and hex are wrapped at
/// 60 characters or more (MIME 76, PEM 64).
const MIN_WRAPPED_LINE: usize = 60;
/// Encoded bytes decoded first to tell text from binary (a multiple of 4).
const PROBE: usize = 256;
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
    percent_runs(bytes, budget, scratch, f);
    json_runs(bytes, budget, scratch, f);
    base64_hex_runs(bytes, budget, scratch, f);
}

/// Byte classes, one table lookup per byte in the hot loops.
const B64: u8 = 1;
const HEX: u8 = 2;
/// `-` and `_`: base64url only.
const URL_ONLY: u8 = 4;
/// `+` and `/`: standard base64 only.
const STD_ONLY: u8 = 8;
/// Ends a URL-ish run: whitespace, quotes, brackets, the separators of forms, headers and
/// markup.
const DELIM: u8 = 16;

static CLASS: [u8; 256] = classes();

const fn classes() -> [u8; 256] {
    let mut t = [0u8; 256];
    let mut i = 0;
    while i < 256 {
        let b = i as u8;
        let mut c = 0;
        if b.is_ascii_alphanumeric() {
            c |= B64;
        }
        if b.is_ascii_hexdigit() {
            c |= HEX;
        }
        if b == b'-' || b == b'_' {
            c |= B64 | URL_ONLY;
        }
        if b == b'+' || b == b'/' {
            c |= B64 | STD_ONLY;
        }
        if b.is_ascii_whitespace()
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
        {
            c |= DELIM;
        }
        t[i] = c;
        i += 1;
    }
    t
}

fn class(b: u8) -> u8 {
    CLASS[usize::from(b)]
}

/// The runs around `%XX` escapes: found from the escapes (`memchr`), each run (between
/// delimiters) visited once, so text without escapes costs one `memchr`.
fn percent_runs(bytes: &[u8], budget: &mut DecodeBudget, scratch: &mut Vec<u8>, f: OnRun<'_>) {
    let mut done = 0;
    for p in memchr::memchr_iter(b'%', bytes) {
        let escape = p >= done
            && bytes.get(p + 1).is_some_and(u8::is_ascii_hexdigit)
            && bytes.get(p + 2).is_some_and(u8::is_ascii_hexdigit);
        if !escape {
            continue;
        }
        let start = bytes[done..p]
            .iter()
            .rposition(|b| class(*b) & DELIM != 0)
            .map_or(done, |i| done + i + 1);
        let end = bytes[p..]
            .iter()
            .position(|b| class(*b) & DELIM != 0)
            .map_or(bytes.len(), |i| p + i);
        done = end;
        let s = &bytes[start..end];
        if s.len() < MIN_TEXT_RUN {
            continue;
        }
        if !budget.take(s.len()) {
            return;
        }
        scratch.clear();
        scratch.extend(percent_encoding::percent_decode(s));
        f(Encoding::Percent, start..end, scratch);
        // A form (`application/x-www-form-urlencoded`, a query) writes a space as `+` and a
        // `+` as `%2B`: a run with both is read the form's way too.
        if s.contains(&b'+') && budget.take(s.len()) {
            let spaced: Vec<u8> = s
                .iter()
                .map(|&b| if b == b'+' { b' ' } else { b })
                .collect();
            scratch.clear();
            scratch.extend(percent_encoding::percent_decode(&spaced));
            f(Encoding::Percent, start..end, scratch);
        }
    }
}

/// The JSON strings (between unescaped quotes) around `\uXXXX` and `\/` escapes, found
/// from the backslashes.
fn json_runs(bytes: &[u8], budget: &mut DecodeBudget, scratch: &mut Vec<u8>, f: OnRun<'_>) {
    let mut done = 0;
    for p in memchr::memchr_iter(b'\\', bytes) {
        if p < done || !matches!(bytes.get(p + 1), Some(b'u' | b'/')) {
            continue;
        }
        // A JSON string ends at an unescaped quote; a raw control byte cannot be in one (so
        // binary data around a stray `\u` ends the run at once).
        let edge = |i: usize| {
            let b = bytes[i];
            b < 0x20 || (b == b'"' && (i == 0 || bytes[i - 1] != b'\\'))
        };
        let start = (done..p).rev().find(|i| edge(*i)).map_or(done, |i| i + 1);
        let end = (p..bytes.len()).find(|i| edge(*i)).unwrap_or(bytes.len());
        done = end;
        let s = &bytes[start..end];
        if s.len() < MIN_TEXT_RUN {
            continue;
        }
        if !budget.take(s.len()) {
            return;
        }
        json_unescape(s, scratch);
        f(Encoding::JsonEscape, start..end, scratch);
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

fn base64_hex_runs(bytes: &[u8], budget: &mut DecodeBudget, scratch: &mut Vec<u8>, f: OnRun<'_>) {
    let n = bytes.len();
    let mut i = 0;
    // A line-wrapped block's lines, joined.
    let mut joined = Vec::new();
    while i < n {
        while i < n && class(bytes[i]) & B64 == 0 {
            i += 1;
        }
        let start = i;
        let (all, any, end) = run_at(bytes, start);
        i = end;
        if i - start < MIN_BASE64_RUN {
            continue;
        }
        let run = start..i;
        // A line-wrapped block (MIME's 76 characters a line, PEM's 64): its lines decode as
        // one run, so a credential across a line break is seen whole, and a binary block is
        // told by its first bytes and not decoded line by line.
        let block = wrapped_block(bytes, start, end, all, any);
        if let Some((block_end, all, any)) = block {
            let lines = &bytes[start..block_end];
            let whole = start..block_end;
            // Its first bytes tell a binary block (an attachment) before the rest is copied.
            join_lines(lines, &mut joined, PROBE);
            let probed = decode_run(
                &joined,
                0..joined.len(),
                all,
                any,
                budget,
                scratch,
                &mut |_, _, _| {},
            );
            let decoded = match probed {
                Decoded::Text => {
                    join_lines(lines, &mut joined, usize::MAX);
                    let on_block =
                        &mut |enc: Encoding, _: Range<usize>, d: &[u8]| f(enc, whole.clone(), d);
                    decode_run(
                        &joined,
                        0..joined.len(),
                        all,
                        any,
                        budget,
                        scratch,
                        on_block,
                    )
                }
                other => other,
            };
            if decoded == Decoded::BudgetSpent {
                return;
            }
            i = block_end;
            continue;
        }
        if decode_run(bytes, run.clone(), all, any, budget, scratch, f) == Decoded::BudgetSpent {
            return;
        }
        // A URL path (`/v1/<base64>/x`): its segments are decoded one by one too. Only in
        // runs as short as URLs are: a long run with `/` is base64 itself (an image).
        if any & STD_ONLY != 0
            && i - start <= MAX_PATH_RUN
            && memchr::memchr(b'/', &bytes[start..i]).is_some()
        {
            let mut seg_start = start;
            for j in start..=i {
                if j < i && bytes[j] != b'/' {
                    continue;
                }
                let seg = seg_start..j;
                seg_start = j + 1;
                if seg.len() < MIN_BASE64_RUN || seg.len() == run.len() {
                    continue;
                }
                let (all, any) = bytes[seg.clone()]
                    .iter()
                    .fold((u8::MAX, 0u8), |(a, o), b| (a & class(*b), o | class(*b)));
                if decode_run(bytes, seg, all, any, budget, scratch, f) == Decoded::BudgetSpent {
                    return;
                }
            }
        }
    }
}

/// The lines of a wrapped block without their `\n`/`\r\n`, into `out` (cleared), line by
/// line until it holds at least `limit` bytes.
fn join_lines(lines: &[u8], out: &mut Vec<u8>, limit: usize) {
    out.clear();
    for line in lines.split(|b| *b == b'\n') {
        out.extend_from_slice(line.strip_suffix(b"\r").unwrap_or(line));
        if out.len() >= limit {
            return;
        }
    }
}

/// The run of base64/hex bytes at `start`: the AND and OR of their classes, and its end.
fn run_at(bytes: &[u8], start: usize) -> (u8, u8, usize) {
    let (mut all, mut any) = (u8::MAX, 0u8);
    let mut i = start;
    // Whole chunks of run bytes first, each classified without a branch per byte.
    while let Some(chunk) = bytes.get(i..i + LANES) {
        let Some((a, o)) = chunk_classes(chunk) else {
            break;
        };
        all &= a;
        any |= o;
        i += LANES;
    }
    while i < bytes.len() {
        let c = class(bytes[i]);
        if c & B64 == 0 {
            break;
        }
        all &= c;
        any |= c;
        i += 1;
    }
    (all, any, i)
}

/// Bytes [`chunk_classes`] classifies at once.
const LANES: usize = 32;

/// The AND and OR of the classes of a chunk whose bytes are all base64/hex run bytes, as
/// [`class`] would fold them one by one; `None` if one is not. Folds of comparisons without
/// early exit, which the compiler turns into vector instructions (a base64 upload is
/// megabytes of run bytes: the byte-by-byte table walk was most of the scan's time).
fn chunk_classes(chunk: &[u8]) -> Option<(u8, u8)> {
    let (mut run, mut hex_all, mut hex_any) = (1u8, 1u8, 0u8);
    let (mut url_all, mut url_any, mut std_all, mut std_any) = (1u8, 0u8, 1u8, 0u8);
    for &b in chunk {
        let alnum = u8::from(b.is_ascii_alphanumeric());
        let url = u8::from(b == b'-') | u8::from(b == b'_');
        let std = u8::from(b == b'+') | u8::from(b == b'/');
        let hex = u8::from(b.is_ascii_hexdigit());
        run &= alnum | url | std;
        hex_all &= hex;
        hex_any |= hex;
        url_all &= url;
        url_any |= url;
        std_all &= std;
        std_any |= std;
    }
    if run == 0 {
        return None;
    }
    let bits = |hex: u8, url: u8, std: u8| {
        B64 | if hex == 1 { HEX } else { 0 }
            | if url == 1 { URL_ONLY } else { 0 }
            | if std == 1 { STD_ONLY } else { 0 }
    };
    Some((
        bits(hex_all, url_all, std_all),
        bits(hex_any, url_any, std_any),
    ))
}

/// When the run `start..end` is the first line of a line-wrapped block: the block's end
/// and the AND/OR of its classes. Each line but the last is at least `MIN_WRAPPED_LINE`
/// long and ends with `\n` or `\r\n`, and every line is of one base64 alphabet.
fn wrapped_block(
    bytes: &[u8],
    start: usize,
    end: usize,
    all: u8,
    any: u8,
) -> Option<(usize, u8, u8)> {
    const BOTH: u8 = URL_ONLY | STD_ONLY;
    if end - start < MIN_WRAPPED_LINE {
        return None;
    }
    let (mut all, mut any, mut block_end, mut lines) = (all, any, end, 1);
    loop {
        let rest = &bytes[block_end..];
        let nl = if rest.starts_with(b"\r\n") {
            2
        } else if rest.starts_with(b"\n") {
            1
        } else {
            break;
        };
        let (a, o, e) = run_at(bytes, block_end + nl);
        let len = e - (block_end + nl);
        if len == 0 || (any | o) & BOTH == BOTH {
            break;
        }
        all &= a;
        any |= o;
        block_end = e;
        lines += 1;
        if len < MIN_WRAPPED_LINE {
            break; // a block's last line is its shortest
        }
    }
    (lines > 1).then_some((block_end, all, any))
}

/// What [`decode_run`] made of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Decoded {
    /// Decoded (or not decodable: not one alphabet, too short), and handed on.
    Text,
    /// Binary underneath: not decoded past the probe.
    Binary,
    /// The work cap was reached: the scan stops decoding.
    BudgetSpent,
}

/// Decodes one run as hex (all hex digits, 40 or more) or base64 (one alphabet), in chunks;
/// `all`/`any` are the AND/OR of its byte classes.
fn decode_run(
    bytes: &[u8],
    run: Range<usize>,
    all: u8,
    any: u8,
    budget: &mut DecodeBudget,
    scratch: &mut Vec<u8>,
    f: OnRun<'_>,
) -> Decoded {
    let s = &bytes[run.clone()];
    let hex = all & HEX != 0;
    if hex && s.len() < MIN_HEX_RUN {
        return Decoded::Text;
    }
    let url = any & URL_ONLY != 0;
    if !hex && url && any & STD_ONLY != 0 {
        return Decoded::Text; // not one base64 alphabet
    }
    // Binary underneath (an image, a digest, compressed data): a credential is text, and one
    // level of encoding of text is what this looks through; the rest is not decoded.
    let probe = &s[..s.len().min(PROBE)];
    if !budget.take(probe.len()) {
        return Decoded::BudgetSpent;
    }
    scratch.clear();
    let decoded = if hex {
        hex_decode(probe, scratch)
    } else {
        base64_decode(probe, url, scratch)
    };
    if !decoded {
        return Decoded::Text;
    }
    if looks_binary(scratch) {
        return Decoded::Binary;
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
            return Decoded::BudgetSpent;
        }
        scratch.clear();
        let ok = if hex {
            hex_decode(chunk, scratch)
        } else {
            base64_decode(chunk, url, scratch)
        };
        if ok && !scratch.is_empty() {
            let encoding = if hex { Encoding::Hex } else { Encoding::Base64 };
            f(encoding, run.clone(), scratch);
        }
        if end == s.len() {
            return Decoded::Text;
        }
        at = end - OVERLAP;
    }
}

/// Not UTF-8 (an invalid sequence, not just one cut at the end), or more than 1 in 16 bytes
/// a control byte other than whitespace: not text.
fn looks_binary(decoded: &[u8]) -> bool {
    if let Err(e) = std::str::from_utf8(decoded) {
        if e.error_len().is_some() {
            return true;
        }
    }
    let control = decoded
        .iter()
        .filter(|b| (**b < 0x20 && !matches!(**b, b'\n' | b'\r' | b'\t')) || **b == 0x7f)
        .count();
    control * 16 > decoded.len()
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

#[cfg(test)]
mod tests {
    use super::{class, run_at, B64};

    /// The run at `start` as the byte-by-byte table walk finds it.
    fn walked(bytes: &[u8], start: usize) -> (u8, u8, usize) {
        let (mut all, mut any, mut i) = (u8::MAX, 0u8, start);
        while i < bytes.len() && class(bytes[i]) & B64 != 0 {
            all &= class(bytes[i]);
            any |= class(bytes[i]);
            i += 1;
        }
        (all, any, i)
    }

    #[test]
    fn runs_found_a_chunk_at_a_time_are_those_found_byte_by_byte() {
        // Alphabets that make every class mix likely: hex only, base64, base64url, both,
        // and delimiters now and then.
        let alphabets: [&[u8]; 5] = [
            b"0123456789abcdefABCDEF",
            b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/",
            b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_",
            b"abc+/-_019",
            b"abcdef0123 \n\"=%.",
        ];
        for round in 0..4000u32 {
            let alphabet = alphabets[(round % 5) as usize];
            let len = (rand::random::<u32>() % 200) as usize;
            let mut bytes: Vec<u8> = (0..len)
                .map(|_| alphabet[rand::random::<u32>() as usize % alphabet.len()])
                .collect();
            if round % 3 == 0 && len > 0 {
                let at = rand::random::<u32>() as usize % len;
                bytes[at] = b'\n';
            }
            let start = if len > 0 {
                rand::random::<u32>() as usize % len
            } else {
                0
            };
            assert_eq!(
                run_at(&bytes, start),
                walked(&bytes, start),
                "{:?} from {start}",
                String::from_utf8_lossy(&bytes)
            );
        }
    }
}
