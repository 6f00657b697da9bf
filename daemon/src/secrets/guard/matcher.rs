//! The secret matcher: every secret value (and the forms a value takes when it is URL-,
//! JSON- or base64-encoded) and every placeholder (as written, and percent-encoded), searched
//! by two automata so that neither can hide the other.
//!
//! * Values are searched with **overlapping** matches: every occurrence of every form is
//!   found, whatever text surrounds or overlaps it (a placeholder, another value, a second
//!   encoding of the same value). A leftmost-longest, non-overlapping search would let a
//!   match that starts earlier consume the first bytes of a value (with a secret `hf`,
//!   `agenshield%3Asecret%3Ahf_…` hid the `hf_…` token behind the encoded placeholder).
//! * Placeholders are searched on their own, leftmost-longest; they only ever name which
//!   secret the agent wants swapped in, so they never decide whether a value is seen.

use aho_corasick::{AhoCorasick, AhoCorasickBuilder, MatchKind};
use zeroize::Zeroizing;

use crate::secrets::placeholder::placeholder;
use crate::secrets::{SecretName, SecretValue};

pub(crate) struct Matcher {
    /// Every form of every value; searched overlapping.
    values: AhoCorasick,
    /// Value pattern id → secret index.
    value_secret: Vec<usize>,
    /// Every placeholder form; searched leftmost-longest.
    placeholders: AhoCorasick,
    /// Placeholder pattern id → secret index.
    placeholder_secret: Vec<usize>,
    /// Every form of every value, ignoring ASCII case: for header names, which HTTP
    /// lower-cases (a value folded to lower case is still most of the value).
    folded: AhoCorasick,
    /// The longest pattern of either kind.
    max_len: usize,
}

/// An automaton that cannot be built (too many or too long patterns); the guard is never
/// silently disabled instead. Says nothing of the values.
#[derive(Debug, thiserror::Error)]
pub(crate) enum MatcherError {
    #[error("cannot build the secret matcher: {0}")]
    Values(aho_corasick::BuildError),
    #[error("cannot build the placeholder matcher: {0}")]
    Placeholders(aho_corasick::BuildError),
}

impl Matcher {
    /// `secrets` in the order their indices refer to. `Ok(None)` when there is nothing to
    /// match; an error (never a silently disabled guard) if an automaton cannot be built.
    pub(crate) fn build(
        secrets: &[(SecretName, &SecretValue)],
    ) -> Result<Option<Matcher>, MatcherError> {
        let mut values: Vec<Zeroizing<Vec<u8>>> = Vec::new();
        let mut value_secret = Vec::new();
        let mut placeholders: Vec<Vec<u8>> = Vec::new();
        let mut placeholder_secret = Vec::new();
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
                values.push(f);
                value_secret.push(i);
            }
            // The placeholder as written, and with its colons percent-encoded (as a URL's
            // query or a form body carries it); a name is only unreserved bytes.
            let ph = placeholder(name);
            for form in [ph.clone(), ph.replace(':', "%3A"), ph.replace(':', "%3a")] {
                placeholders.push(form.into_bytes());
                placeholder_secret.push(i);
            }
        }
        if values.is_empty() {
            return Ok(None);
        }
        let values_ac = AhoCorasickBuilder::new()
            .match_kind(MatchKind::Standard)
            .build(values.iter().map(|p| p.as_slice()))
            .map_err(MatcherError::Values)?;
        let folded = AhoCorasickBuilder::new()
            .match_kind(MatchKind::Standard)
            .ascii_case_insensitive(true)
            .build(values.iter().map(|p| p.as_slice()))
            .map_err(MatcherError::Values)?;
        let placeholders_ac = AhoCorasickBuilder::new()
            .match_kind(MatchKind::LeftmostLongest)
            .build(&placeholders)
            .map_err(MatcherError::Placeholders)?;
        let max_len = values
            .iter()
            .map(|p| p.len())
            .chain(placeholders.iter().map(Vec::len))
            .max()
            .unwrap_or(1);
        Ok(Some(Matcher {
            values: values_ac,
            value_secret,
            placeholders: placeholders_ac,
            placeholder_secret,
            folded,
            max_len,
        }))
    }

    /// Every occurrence of every form of every value in `haystack`, overlapping ones
    /// included, ordered by where they end.
    pub(crate) fn values<'a>(
        &'a self,
        haystack: &'a [u8],
    ) -> impl Iterator<Item = (usize, std::ops::Range<usize>)> + 'a {
        self.values
            .find_overlapping_iter(haystack)
            .map(|m| (self.value_secret[m.pattern().as_usize()], m.range()))
    }

    /// As `values`, ignoring ASCII case (a header name).
    pub(crate) fn values_folded<'a>(
        &'a self,
        haystack: &'a [u8],
    ) -> impl Iterator<Item = (usize, std::ops::Range<usize>)> + 'a {
        self.folded
            .find_overlapping_iter(haystack)
            .map(|m| (self.value_secret[m.pattern().as_usize()], m.range()))
    }

    /// Placeholders in `haystack`, leftmost-longest and non-overlapping (a placeholder
    /// followed by a name byte is a longer name; the caller decides, as it may need the byte
    /// after the haystack).
    pub(crate) fn placeholders<'a>(
        &'a self,
        haystack: &'a [u8],
    ) -> impl Iterator<Item = (usize, std::ops::Range<usize>)> + 'a {
        self.placeholders
            .find_iter(haystack)
            .map(|m| (self.placeholder_secret[m.pattern().as_usize()], m.range()))
    }

    /// The longest pattern: a match that ends in bytes not seen yet starts within this many
    /// bytes of the end of those seen.
    pub(crate) fn max_len(&self) -> usize {
        self.max_len
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
        let values: Vec<usize> = m.values(hay).map(|(s, _)| s).collect();
        assert_eq!(values, [0, 0, 1, 0]);
        let placeholders: Vec<usize> = m.placeholders(hay).map(|(s, _)| s).collect();
        assert_eq!(placeholders, [1]);
    }

    /// A placeholder, another value or another form of the same value overlapping a value
    /// never hides it (the shipped Hugging Face example: secret `hf`, tokens `hf_…`).
    #[test]
    fn a_value_is_found_whatever_overlaps_it() {
        let m = build(&[("hf", "hf_TOKEN123456"), ("other", "xyz-hf_TOK")]);
        let hay = b"agenshield%3Asecret%3Ahf_TOKEN123456";
        let found: Vec<(usize, std::ops::Range<usize>)> = m.values(hay).collect();
        assert_eq!(
            found,
            [(0, 22..36)],
            "the value behind the encoded placeholder"
        );
        // The placeholder automaton still sees its own form (the caller decides that the
        // name runs on into `_TOKEN…`).
        assert_eq!(m.placeholders(hay).count(), 1);
        // Two values overlapping: both found.
        let hay = b"..xyz-hf_TOKEN123456..";
        let secrets: Vec<usize> = m.values(hay).map(|(s, _)| s).collect();
        assert_eq!(secrets, [1, 0]);
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
                let hits: Vec<_> = m.values(b64.as_bytes()).collect();
                assert_eq!(hits.len(), 1, "{prefix:?} {b64}");
            }
        }
        let other = base64::engine::general_purpose::STANDARD.encode("ghp_0123456788?>?>~~");
        assert_eq!(m.values(other.as_bytes()).count(), 0, "one bit off: no hit");
    }
}
