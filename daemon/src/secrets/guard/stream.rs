//! Matching across chunk boundaries. A body arrives in chunks, and a secret may be split
//! between two of them. `ChunkScanner` releases what it has scanned, holding back a tail
//! whose length never depends on what the bytes are:
//!
//! * Of every chunk it releases all but the last `max_len` bytes (`max_len`: the longest
//!   pattern), so a match that ends in a later chunk still starts in bytes it holds, and the
//!   whole match is seen before any byte of it is released. What is held is the same for
//!   `xxxxsk-te` and `xxxxzz-zz`, whatever the stored values are: an agent watching what an
//!   upstream receives (or a response it reads) learns nothing about a stored value from
//!   where the stream pauses. (The scanner it replaces held a tail only while it was the
//!   start of a stored value: a prefix oracle, one guess per byte.)
//! * Only a complete match moves the line: a run of values is released (replaced, or
//!   refused, by the caller) whole, and a placeholder is decided once the byte after it is
//!   known (a longer name runs on).
//! * `flush` releases everything held, on a timer the caller keeps (a stream that pauses is
//!   not stalled). The last `max_len` bytes released are kept, so a value that began before
//!   the pause is still found when the rest of it comes: its remaining bytes are handed over
//!   as a `split` piece (refused by the leak guard, replaced by the redactor).
//!
//! Values are matched overlapping (the matcher's doc says why), and a run of overlapping
//! value matches is one piece naming each secret in it.

use std::future::Future as _;
use std::pin::Pin;
use std::task::Context;
use std::time::Duration;

use bytes::{Bytes, BytesMut};

use crate::policy::is_name_byte;
use crate::secrets::guard::matcher::Matcher;

/// A piece of the stream, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Piece {
    /// Bytes that are no part of any match.
    Plain(Bytes),
    /// One or more (overlapping) occurrences of secret values, and the bytes they cover.
    Value(Run),
    /// A placeholder of `secret`.
    Placeholder {
        secret: usize,
        bytes: Bytes,
        /// It began in bytes already released (by `flush`): `bytes` is only its rest.
        split: bool,
    },
}

/// Overlapping value matches, joined.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Run {
    /// Every secret with a value in the run, in the order their matches start.
    pub secrets: Vec<usize>,
    pub bytes: Bytes,
    /// The run began in bytes already released (by `flush`): `bytes` is only its rest.
    pub split: bool,
}

#[derive(Default)]
pub(crate) struct ChunkScanner {
    /// The last bytes released (at most `max_len`), where a match not complete yet may
    /// have begun.
    released: Bytes,
    /// Bytes not released yet.
    held: BytesMut,
}

impl ChunkScanner {
    /// Scans `chunk` after whatever was held back; returns what can be released.
    pub(crate) fn push(&mut self, m: &Matcher, chunk: Bytes) -> Vec<Piece> {
        self.scan(m, Some(chunk), false)
    }

    /// Releases everything held, deciding it as if the stream ended here (a timed release
    /// while the stream pauses). What follows is still matched against the bytes just
    /// released.
    pub(crate) fn flush(&mut self, m: &Matcher) -> Vec<Piece> {
        self.scan(m, None, true)
    }

    /// The end of the stream: everything held back is decided and released.
    pub(crate) fn finish(&mut self, m: &Matcher) -> Vec<Piece> {
        self.scan(m, None, true)
    }

    /// Bytes held back, waiting for the next chunk (or a `flush`).
    pub(crate) fn held(&self) -> usize {
        self.held.len()
    }

    fn scan(&mut self, m: &Matcher, chunk: Option<Bytes>, to_end: bool) -> Vec<Piece> {
        let r = self.released.len();
        let extra = chunk.as_ref().map_or(0, Bytes::len);
        let mut w = BytesMut::with_capacity(r + self.held.len() + extra);
        w.extend_from_slice(&self.released);
        w.extend_from_slice(&self.held);
        if let Some(c) = &chunk {
            w.extend_from_slice(c);
        }
        let w = w.freeze();
        let len = w.len();
        let hold = m.max_len();
        let mut out = Vec::new();

        // Value matches not wholly in what was released before, joined where they overlap.
        let mut found: Vec<(usize, std::ops::Range<usize>)> =
            m.values(&w).filter(|(_, rg)| rg.end > r).collect();
        found.sort_by_key(|(_, rg)| rg.start);
        let mut events: Vec<Event> = Vec::new();
        for (secret, rg) in found {
            match events.last_mut() {
                Some(Event {
                    kind: EventKind::Value(secrets),
                    end,
                    ..
                }) if rg.start < *end => {
                    *end = (*end).max(rg.end);
                    if !secrets.contains(&secret) {
                        secrets.push(secret);
                    }
                }
                _ => events.push(Event {
                    start: rg.start,
                    end: rg.end,
                    kind: EventKind::Value(vec![secret]),
                }),
            }
        }
        let runs = events.len();
        for (secret, rg) in m.placeholders(&w) {
            if rg.end <= r {
                continue;
            }
            let undecided = match w.get(rg.end) {
                // `agenshield:secret:gh-2` is not the placeholder of `gh`: a name the store
                // does not hold, so no secret; it goes on as text.
                Some(b) if is_name_byte(*b) => continue,
                Some(_) => false,
                None => !to_end,
            };
            // Where a value is, the value decides.
            if events[..runs]
                .iter()
                .any(|v| rg.start < v.end && v.start < rg.end)
            {
                continue;
            }
            events.push(Event {
                start: rg.start,
                end: rg.end,
                kind: EventKind::Placeholder { secret, undecided },
            });
        }
        events.sort_by_key(|e| e.start);

        // The line: all but the last `hold` bytes, moved only by a complete match.
        let mut line = if to_end {
            len
        } else {
            len.saturating_sub(hold).max(r)
        };
        let mut pos = r;
        for e in events {
            if e.start >= line {
                break;
            }
            if matches!(
                e.kind,
                EventKind::Placeholder {
                    undecided: true,
                    ..
                }
            ) {
                // Its name may run on: decided with the next chunk.
                line = e.start.max(pos);
                break;
            }
            let from = e.start.max(r);
            if from > pos {
                out.push(Piece::Plain(w.slice(pos..from)));
            }
            let split = e.start < r;
            let bytes = w.slice(from..e.end);
            out.push(match e.kind {
                EventKind::Value(secrets) => Piece::Value(Run {
                    secrets,
                    bytes,
                    split,
                }),
                EventKind::Placeholder { secret, .. } => Piece::Placeholder {
                    secret,
                    bytes,
                    split,
                },
            });
            pos = e.end;
            line = line.max(pos);
        }
        let line = line.max(pos);
        if line > pos {
            out.push(Piece::Plain(w.slice(pos..line)));
        }
        self.released = w.slice(line.saturating_sub(hold)..line);
        self.held = BytesMut::from(&w[line..]);
        out
    }
}

/// How long a stream may pause with bytes held before they are released anyway.
pub(crate) const FLUSH_AFTER: Duration = Duration::from_millis(50);

/// The timed release of a body: armed while the stream pauses with bytes held, so an
/// interactive stream (an SSE event, a gRPC message, a chunk the other side waits on) is
/// never stalled by the tail the scanner keeps. It depends only on time, never on content.
#[derive(Default)]
pub(crate) struct Pause(Option<Pin<Box<tokio::time::Sleep>>>);

impl Pause {
    /// Whether the stream has paused for `FLUSH_AFTER` (arming the timer, and registering
    /// the wake-up, on the first call of a pause).
    pub(crate) fn due(&mut self, cx: &mut Context<'_>) -> bool {
        let sleep = self
            .0
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(FLUSH_AFTER)));
        if sleep.as_mut().poll(cx).is_ready() {
            self.0 = None;
            true
        } else {
            false
        }
    }

    /// Data came: the next pause starts its own timer.
    pub(crate) fn reset(&mut self) {
        self.0 = None;
    }
}

struct Event {
    start: usize,
    end: usize,
    kind: EventKind,
}

enum EventKind {
    Value(Vec<usize>),
    Placeholder { secret: usize, undecided: bool },
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::secrets::{SecretName, SecretValue};

    fn matcher(values: &[&str]) -> Matcher {
        let owned: Vec<(SecretName, SecretValue)> = values
            .iter()
            .enumerate()
            .map(|(i, v)| {
                (
                    SecretName::new(&format!("s{i}")).expect("name"),
                    SecretValue::new(v.as_bytes().to_vec()).expect("value"),
                )
            })
            .collect();
        let refs: Vec<_> = owned.iter().map(|(n, v)| (n.clone(), v)).collect();
        Matcher::build(&refs).expect("builds").expect("matcher")
    }

    /// Replaces value runs with `<sN>` (each secret in the run), placeholders with `[sN]`,
    /// as redaction and the swap do; a split piece is marked `~`.
    fn render(pieces: &[Piece]) -> String {
        pieces
            .iter()
            .map(|p| match p {
                Piece::Plain(b) => String::from_utf8_lossy(b).into_owned(),
                Piece::Value(run) => {
                    let names: Vec<String> = run.secrets.iter().map(|s| format!("s{s}")).collect();
                    let split = if run.split { "~" } else { "" };
                    format!("<{split}{}>", names.join("+"))
                }
                Piece::Placeholder { secret, split, .. } => {
                    format!("[{}s{secret}]", if *split { "~" } else { "" })
                }
            })
            .collect()
    }

    fn run(m: &Matcher, chunks: &[&str]) -> String {
        let mut s = ChunkScanner::default();
        let mut out = Vec::new();
        for c in chunks {
            out.extend(s.push(m, Bytes::copy_from_slice(c.as_bytes())));
        }
        out.extend(s.finish(m));
        render(&out)
    }

    #[test]
    fn a_secret_split_anywhere_is_found_once() {
        let m = matcher(&["sk-live-ABCDEFGH", "short-secret"]);
        let text = "pre sk-live-ABCDEFGH mid short-secret end sk-live-ABCDEFGH";
        let want = "pre <s0> mid <s1> end <s0>";
        // Every split into two chunks and into three chunks.
        for i in 0..=text.len() {
            assert_eq!(run(&m, &[&text[..i], &text[i..]]), want, "split at {i}");
            for j in i..=text.len() {
                let got = run(&m, &[&text[..i], &text[i..j], &text[j..]]);
                assert_eq!(got, want, "split at {i},{j}");
            }
        }
        // One byte at a time.
        let bytes: Vec<String> = text.chars().map(String::from).collect();
        let refs: Vec<&str> = bytes.iter().map(String::as_str).collect();
        assert_eq!(run(&m, &refs), want);
    }

    #[test]
    fn a_placeholder_is_found_whole_and_encoded_and_never_inside_a_longer_name() {
        let m = matcher(&["sk-live-ABCDEFGH"]);
        let text = "a agenshield:secret:s0 b agenshield%3Asecret%3As0& c agenshield:secret:s0x d agenshield:secret:s0";
        let want = "a [s0] b [s0]& c agenshield:secret:s0x d [s0]";
        for i in 0..=text.len() {
            assert_eq!(run(&m, &[&text[..i], &text[i..]]), want, "split at {i}");
        }
    }

    #[test]
    fn overlapping_values_are_one_run_naming_each() {
        let m = matcher(&["abcdefgh", "abcdefgh-and-more", "efgh-and-more-still"]);
        assert_eq!(run(&m, &["x abcdefgh", "-and-more y"]), "x <s0+s1> y");
        assert_eq!(run(&m, &["x abcdefgh", "-and y"]), "x <s0>-and y");
        assert_eq!(run(&m, &["x abcdefgh"]), "x <s0>");
        assert_eq!(run(&m, &["x abcdefgh-and-more-still y"]), "x <s0+s1+s2> y");
    }

    /// The Hugging Face example: the encoded placeholder of `s0` runs into a value of `s0`
    /// (`agenshield%3Asecret%3As0` + `_…` is a longer name, and the value is found).
    #[test]
    fn a_placeholder_never_hides_a_value() {
        let m = matcher(&["s0_TOKEN123456"]);
        let text = "agenshield%3Asecret%3As0_TOKEN123456";
        for i in 0..=text.len() {
            assert_eq!(
                run(&m, &[&text[..i], &text[i..]]),
                "agenshield%3Asecret%3A<s0>",
                "split at {i}"
            );
        }
    }

    /// What is released, and when, never depends on the stored values: a chunk ending in the
    /// start of a value is held exactly as long as one that does not.
    #[test]
    fn what_is_held_does_not_depend_on_the_secret() {
        let m = matcher(&["sk-test-123456"]);
        let released = |chunk: &str| {
            let mut s = ChunkScanner::default();
            let out = s.push(&m, Bytes::copy_from_slice(chunk.as_bytes()));
            (render(&out).len(), s.held())
        };
        let pad = "x".repeat(200);
        for (a, b) in [
            (format!("{pad}sk-te"), format!("{pad}zz-zz")),
            (format!("{pad}s"), format!("{pad}z")),
            (
                format!("{pad}agenshield:secret:s"),
                format!("{pad}agenshield:secret:x"),
            ),
            ("xxxxsk-te".to_string(), "xxxxzz-zz".to_string()),
        ] {
            assert_eq!(released(&a), released(&b), "{a:?} vs {b:?}");
        }
        let (out, held) = released(&format!("{pad}sk-te"));
        assert_eq!(held, m.max_len());
        assert_eq!(out, 205 - m.max_len());
    }

    #[test]
    fn a_flush_releases_everything_and_still_finds_a_value_begun_before_it() {
        let m = matcher(&["sk-live-ABCDEFGH"]);
        let mut s = ChunkScanner::default();
        let mut out = s.push(&m, Bytes::from_static(b"text sk-li"));
        assert_eq!(render(&out), "");
        assert_eq!(s.held(), 10);
        out.extend(s.flush(&m));
        assert_eq!(render(&out), "text sk-li");
        assert_eq!(s.held(), 0);
        // The rest of the value: its unreleased part is handed over as split.
        let rest = s.push(&m, Bytes::from_static(b"ve-ABCDEFGH and on"));
        let rest_end = s.finish(&m);
        assert_eq!(render(&rest) + &render(&rest_end), "<~s0> and on");
        match &rest[0] {
            Piece::Value(run) => assert_eq!(&run.bytes[..], b"ve-ABCDEFGH"),
            other => panic!("{other:?}"),
        }
        // A placeholder split by a flush is marked too.
        let mut s = ChunkScanner::default();
        let mut out = s.push(&m, Bytes::from_static(b"a agenshield:sec"));
        out.extend(s.flush(&m));
        out.extend(s.push(&m, Bytes::from_static(b"ret:s0 b")));
        out.extend(s.finish(&m));
        assert_eq!(render(&out), "a agenshield:sec[~s0] b");
    }

    #[test]
    fn clean_chunks_go_on_but_for_the_held_tail() {
        let m = matcher(&["sk-live-ABCDEFGH"]);
        let hold = m.max_len();
        let mut s = ChunkScanner::default();
        let chunk = "{\"data\": [1, 2, 3]} and some more text to make it long enough\n";
        let out = s.push(&m, Bytes::copy_from_slice(chunk.as_bytes()));
        assert_eq!(render(&out), chunk[..chunk.len() - hold]);
        assert_eq!(s.held(), hold);
        let out = s.finish(&m);
        assert_eq!(render(&out), chunk[chunk.len() - hold..]);
    }
}
