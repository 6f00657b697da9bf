//! One Aho-Corasick automaton over every secret value (and the forms a value takes when it
//! is URL- or JSON-encoded) and every placeholder (as written, and percent-encoded), so a
//! header, a URL or a body chunk is searched for all of them in one pass.

use aho_corasick::{AhoCorasick, AhoCorasickBuilder, MatchKind};
use zeroize::Zeroizing;

use super::placeholder::placeholder;
use super::value::{SecretName, SecretValue};

/// What a match is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HitKind {
    /// The real value (or an encoding of it).
    Value,
    /// The secret's placeholder.
    Placeholder,
}

/// A match: which secret (an index into the set it was built from) and what form.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Tag {
    pub secret: usize,
    pub kind: HitKind,
}

pub(crate) struct Matcher {
    ac: AhoCorasick,
    /// Pattern id → tag.
    tags: Vec<Tag>,
    /// Every pattern, sorted, to tell whether a chunk ends in the start of one. Zeroized on
    /// drop (the automaton's own tables are not: `aho-corasick` offers no hook for it).
    sorted: Vec<Zeroizing<Vec<u8>>>,
    /// Bytes some pattern starts with.
    first: [bool; 256],
    max_len: usize,
}

impl Matcher {
    /// `secrets` in the order their indices refer to. `Ok(None)` when there is nothing to
    /// match; an error (never a silently disabled guard) if the automaton cannot be built.
    pub(crate) fn build(secrets: &[(SecretName, &SecretValue)]) -> Result<Option<Matcher>, String> {
        let mut patterns: Vec<Zeroizing<Vec<u8>>> = Vec::new();
        let mut tags = Vec::new();
        for (i, (name, value)) in secrets.iter().enumerate() {
            let raw = Zeroizing::new(value.expose().to_vec());
            let mut forms: Vec<Zeroizing<Vec<u8>>> = vec![
                percent_encoded(&raw, b"0123456789ABCDEF"),
                percent_encoded(&raw, b"0123456789abcdef"),
                json_escaped(&raw, true),
                json_escaped(&raw, false),
            ];
            forms.extend(base64_cores(&raw));
            forms.retain(|f| **f != *raw);
            forms.sort_by(|a, b| a.as_slice().cmp(b.as_slice()));
            forms.dedup();
            forms.insert(0, raw);
            for f in forms {
                patterns.push(f);
                tags.push(Tag {
                    secret: i,
                    kind: HitKind::Value,
                });
            }
            // The placeholder as written, and with its colons percent-encoded (as a URL's
            // query or a form body carries it); a name is only unreserved bytes.
            let ph = placeholder(name);
            for form in [ph.clone(), ph.replace(':', "%3A"), ph.replace(':', "%3a")] {
                patterns.push(Zeroizing::new(form.into_bytes()));
                tags.push(Tag {
                    secret: i,
                    kind: HitKind::Placeholder,
                });
            }
        }
        if patterns.is_empty() {
            return Ok(None);
        }
        let ac = AhoCorasickBuilder::new()
            .match_kind(MatchKind::LeftmostLongest)
            .build(patterns.iter().map(|p| p.as_slice()))
            .map_err(|e| format!("cannot build the secret matcher: {e}"))?;
        let mut first = [false; 256];
        for p in &patterns {
            first[usize::from(p[0])] = true;
        }
        let max_len = patterns.iter().map(|p| p.len()).max().unwrap_or(1);
        let mut sorted = patterns;
        sorted.sort_by(|a, b| a.as_slice().cmp(b.as_slice()));
        sorted.dedup();
        Ok(Some(Matcher {
            ac,
            tags,
            sorted,
            first,
            max_len,
        }))
    }

    /// Non-overlapping matches in a complete haystack, leftmost-longest.
    pub(crate) fn find_iter<'a>(
        &'a self,
        haystack: &'a [u8],
    ) -> impl Iterator<Item = (Tag, std::ops::Range<usize>)> + 'a {
        self.ac
            .find_iter(haystack)
            .map(|m| (self.tags[m.pattern().as_usize()], m.range()))
    }

    pub(crate) fn max_len(&self) -> usize {
        self.max_len
    }

    /// Whether `tail` is a proper prefix of some pattern (more bytes could complete a match).
    pub(crate) fn is_proper_prefix(&self, tail: &[u8]) -> bool {
        if tail.is_empty() || !self.first[usize::from(tail[0])] {
            return false;
        }
        let from = self.sorted.partition_point(|p| p.as_slice() < tail);
        self.sorted[from..]
            .iter()
            .take_while(|p| p.starts_with(tail))
            .any(|p| p.len() > tail.len())
    }
}

/// Every byte but RFC 3986 unreserved ones as `%XX`, in the given hex digits (upper case, as
/// most encoders write, or lower case).
fn percent_encoded(v: &[u8], hex: &[u8; 16]) -> Zeroizing<Vec<u8>> {
    let mut out = Zeroizing::new(Vec::with_capacity(v.len() * 3));
    for &b in v {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b);
        } else {
            out.extend_from_slice(&[b'%', hex[usize::from(b >> 4)], hex[usize::from(b & 15)]]);
        }
    }
    out
}

/// The value base64-encoded wherever it sits in the encoded data: for each of the three
/// alignments (0, 1 or 2 bytes before it in its 3-byte group), the run of base64 characters
/// made of the value's bits alone, in the standard and the URL-safe alphabet. Finds a value
/// inside `Authorization: Basic` credentials an upstream echoes (`user:VALUE`), in a JWT or
/// in any base64 blob; at least 9 characters for the shortest (8-byte) value.
fn base64_cores(v: &[u8]) -> Vec<Zeroizing<Vec<u8>>> {
    use base64::Engine as _;
    let mut out = Vec::new();
    for k in 0..3usize {
        let mut padded = Zeroizing::new(vec![0u8; k]);
        padded.extend_from_slice(v);
        let (first, last) = (8 * k, 8 * (k + v.len()));
        // A character holds bits [6i, 6i + 6): kept when they all are the value's.
        let stable: Vec<usize> = (0..(padded.len() * 8).div_ceil(6))
            .filter(|i| 6 * i >= first && 6 * i + 6 <= last)
            .collect();
        let (Some(&from), Some(&to)) = (stable.first(), stable.last()) else {
            continue;
        };
        for engine in [
            &base64::engine::general_purpose::STANDARD_NO_PAD,
            &base64::engine::general_purpose::URL_SAFE_NO_PAD,
        ] {
            let encoded = Zeroizing::new(engine.encode(&*padded).into_bytes());
            out.push(Zeroizing::new(encoded[from..=to].to_vec()));
        }
    }
    out
}

/// As a JSON string body: `"` and `\` escaped, and `/` as `\/` if `slash` (some encoders
/// write it, most do not).
pub(crate) fn json_escaped(v: &[u8], slash: bool) -> Zeroizing<Vec<u8>> {
    let mut out = Zeroizing::new(Vec::with_capacity(v.len() + 8));
    for &b in v {
        if matches!(b, b'"' | b'\\') || (slash && b == b'/') {
            out.push(b'\\');
        }
        out.push(b);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn build(values: &[(&str, &str)]) -> Matcher {
        let owned: Vec<(SecretName, SecretValue)> = values
            .iter()
            .map(|(n, v)| {
                (
                    SecretName::new(n).expect("name"),
                    SecretValue::new(v.as_bytes().to_vec()).expect("value"),
                )
            })
            .collect();
        let refs: Vec<(SecretName, &SecretValue)> =
            owned.iter().map(|(n, v)| (n.clone(), v)).collect();
        Matcher::build(&refs).expect("builds").expect("non-empty")
    }

    #[test]
    fn finds_raw_encoded_and_placeholder_forms() {
        let m = build(&[("aws", "abc/def+ghi=jk"), ("gh", "ghp_0123456789")]);
        let hay = b"x=abc%2Fdef%2Bghi%3Djk&y={\"k\":\"abc\\/def+ghi=jk\"} ghp_0123456789 agenshield:secret:gh abc/def+ghi=jk";
        let hits: Vec<(usize, HitKind)> =
            m.find_iter(hay).map(|(t, _)| (t.secret, t.kind)).collect();
        assert_eq!(
            hits,
            [
                (0, HitKind::Value),
                (0, HitKind::Value),
                (1, HitKind::Value),
                (1, HitKind::Placeholder),
                (0, HitKind::Value)
            ]
        );
    }

    #[test]
    fn a_value_is_found_base64_encoded_at_any_offset_in_either_alphabet() {
        use base64::Engine as _;
        let value = "ghp_0123456789?>?>~~";
        let m = build(&[("gh", value)]);
        for prefix in ["", "u", "me", "user:", "x-access-token:"] {
            for engine in [
                &base64::engine::general_purpose::STANDARD,
                &base64::engine::general_purpose::URL_SAFE,
            ] {
                let b64 = engine.encode(format!("{prefix}{value}:rest"));
                let hits: Vec<_> = m.find_iter(b64.as_bytes()).collect();
                assert_eq!(hits.len(), 1, "{prefix:?} {b64}");
            }
        }
        let other = base64::engine::general_purpose::STANDARD.encode("ghp_0123456788?>?>~~");
        assert_eq!(
            m.find_iter(other.as_bytes()).count(),
            0,
            "one bit off: no hit"
        );
    }

    #[test]
    fn proper_prefixes_are_recognised() {
        let m = build(&[("k", "secret-value-1")]);
        assert!(m.is_proper_prefix(b"secr"));
        assert!(m.is_proper_prefix(b"agenshield:sec"));
        assert!(
            !m.is_proper_prefix(b"secret-value-1"),
            "complete, not proper"
        );
        assert!(!m.is_proper_prefix(b"sex"));
        assert!(!m.is_proper_prefix(b""));
    }
}
