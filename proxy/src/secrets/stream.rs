//! Matching across chunk boundaries. A body arrives in chunks, and a secret may be split
//! between two of them; `ChunkScanner` holds back only the bytes that could still become a
//! match (the chunk's tail when it is the start of some pattern) and releases everything
//! else at once, so a stream that carries no secret is neither delayed nor copied.
//!
//! Why a match is final: with `L` the longest pattern, every pattern starting at or before
//! `len - L` lies wholly inside the buffer, so leftmost-longest decisions there cannot change
//! with more data. Later positions are held while they are a complete match or a proper
//! prefix of a pattern, and decided when the next chunk (or the end) comes.

use bytes::{Bytes, BytesMut};

use super::matcher::{HitKind, Matcher, Tag};
use super::value::is_name_byte;

/// A piece of the stream, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Piece {
    /// Bytes that are no part of any match.
    Plain(Bytes),
    /// A match and the bytes it covers.
    Hit(Tag, Bytes),
}

#[derive(Default)]
pub(crate) struct ChunkScanner {
    carry: BytesMut,
}

impl ChunkScanner {
    /// Scans `chunk` after whatever was held back; returns what can be released.
    pub(crate) fn push(&mut self, m: &Matcher, chunk: Bytes) -> Vec<Piece> {
        let buf = if self.carry.is_empty() {
            chunk
        } else {
            self.carry.extend_from_slice(&chunk);
            self.carry.split().freeze()
        };
        let mut out = Vec::new();
        let hold = scan(m, &buf, false, &mut out);
        if hold < buf.len() {
            self.carry.extend_from_slice(&buf[hold..]);
        }
        out
    }

    /// The end of the stream: everything held back is decided and released.
    pub(crate) fn finish(&mut self, m: &Matcher) -> Vec<Piece> {
        let buf = self.carry.split().freeze();
        let mut out = Vec::new();
        scan(m, &buf, true, &mut out);
        out
    }

    /// Bytes held back, waiting for the next chunk.
    #[cfg(test)]
    pub(crate) fn held(&self) -> usize {
        self.carry.len()
    }
}

/// Appends the released pieces of `buf` to `out`; returns where the held-back tail starts.
fn scan(m: &Matcher, buf: &Bytes, at_end: bool, out: &mut Vec<Piece>) -> usize {
    let len = buf.len();
    // One byte more than the longest pattern: a match decided here has the byte after it in
    // the buffer too (a placeholder must not run on into a longer name).
    let safe = if at_end {
        len
    } else {
        len.saturating_sub(m.max_len())
    };
    let mut pos = 0;
    let mut hold = len;
    for (tag, r) in m.find_iter(buf) {
        if r.start >= safe {
            hold = r.start;
            break;
        }
        if tag.kind == HitKind::Placeholder && buf.get(r.end).is_some_and(|b| is_name_byte(*b)) {
            // `agenshield:secret:gh-2` is not the placeholder of `gh`: a name the store does
            // not hold, so no secret; it goes on as text.
            continue;
        }
        if r.start > pos {
            out.push(Piece::Plain(buf.slice(pos..r.start)));
        }
        out.push(Piece::Hit(tag, buf.slice(r.clone())));
        pos = r.end;
    }
    if !at_end {
        if let Some(s) = (pos.max(safe)..hold).find(|&s| m.is_proper_prefix(&buf[s..])) {
            hold = s;
        }
    }
    let hold = hold.max(pos);
    if hold > pos {
        out.push(Piece::Plain(buf.slice(pos..hold)));
    }
    hold
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::secrets::value::{SecretName, SecretValue};

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

    /// Replaces value hits with `<sN>`, as redaction does.
    fn render(pieces: &[Piece]) -> String {
        pieces
            .iter()
            .map(|p| match p {
                Piece::Plain(b) => String::from_utf8_lossy(b).into_owned(),
                Piece::Hit(t, b) if t.kind == HitKind::Value => format!("<s{}>", t.secret),
                Piece::Hit(_, b) => String::from_utf8_lossy(b).into_owned(),
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
        let show = |pieces: Vec<Piece>| -> String {
            pieces
                .iter()
                .map(|p| match p {
                    Piece::Hit(t, _) if t.kind == HitKind::Placeholder => {
                        format!("[s{}]", t.secret)
                    }
                    Piece::Hit(_, b) | Piece::Plain(b) => String::from_utf8_lossy(b).into_owned(),
                })
                .collect()
        };
        for i in 0..=text.len() {
            let mut s = ChunkScanner::default();
            let mut out = s.push(&m, Bytes::copy_from_slice(&text.as_bytes()[..i]));
            out.extend(s.push(&m, Bytes::copy_from_slice(&text.as_bytes()[i..])));
            out.extend(s.finish(&m));
            assert_eq!(show(out), want, "split at {i}");
        }
    }

    #[test]
    fn a_shorter_secret_inside_a_longer_one_waits_for_the_longest() {
        let m = matcher(&["abcdefgh", "abcdefgh-and-more"]);
        assert_eq!(run(&m, &["x abcdefgh", "-and-more y"]), "x <s1> y");
        assert_eq!(run(&m, &["x abcdefgh", "-and y"]), "x <s0>-and y");
        assert_eq!(run(&m, &["x abcdefgh"]), "x <s0>");
    }

    #[test]
    fn clean_chunks_pass_whole_and_unheld() {
        let m = matcher(&["sk-live-ABCDEFGH"]);
        let mut s = ChunkScanner::default();
        let chunk = Bytes::from_static(b"{\"data\": [1, 2, 3]}\n");
        let out = s.push(&m, chunk.clone());
        assert_eq!(out, vec![Piece::Plain(chunk)]);
        assert_eq!(s.held(), 0);
        // A tail that could start a secret is held, and released when it turns out not to.
        let out = s.push(&m, Bytes::from_static(b"text sk-li"));
        assert_eq!(render(&out), "text ");
        assert_eq!(s.held(), 5);
        let out = s.push(&m, Bytes::from_static(b"ke this."));
        assert_eq!(render(&out), "sk-like this.");
        assert_eq!(s.held(), 0);
    }
}
