//! The secrets loaded now, with their automaton. Immutable: a change builds a new set and
//! swaps it in (`vault.rs`), so the data path reads it without locks.

use std::borrow::Cow;
use std::sync::Arc;

use crate::secrets::guard::matcher::{Matcher, MatcherError};
use crate::secrets::placeholder::placeholder;
use crate::secrets::{SecretName, SecretValue};

pub(crate) struct Secret {
    pub name: SecretName,
    pub value: Arc<SecretValue>,
    /// `agenshield:secret:NAME`.
    pub placeholder: String,
}

impl Secret {
    pub(crate) fn new(name: SecretName, value: Arc<SecretValue>) -> Secret {
        Secret {
            placeholder: placeholder(&name),
            name,
            value,
        }
    }
}

#[derive(Default)]
pub struct SecretSet {
    /// Sorted by name.
    secrets: Vec<Secret>,
    /// Values the daemon redacts that are no secret of the store (the upstream proxy's
    /// credentials): found and redacted like values, never bound, never swapped (their
    /// names hold a `.`, which no rule can name). Indexed after `secrets`.
    reserved: Arc<[Secret]>,
    matcher: Option<Matcher>,
}

impl SecretSet {
    /// Fails only if the automaton cannot be built; the caller keeps the set it had.
    #[cfg(test)]
    pub(crate) fn new(
        entries: Vec<(SecretName, Arc<SecretValue>)>,
    ) -> Result<SecretSet, MatcherError> {
        SecretSet::with_reserved(entries, Arc::from(Vec::new()))
    }

    /// `entries`, and the `reserved` values redacted with them.
    pub(crate) fn with_reserved(
        mut entries: Vec<(SecretName, Arc<SecretValue>)>,
        reserved: Arc<[Secret]>,
    ) -> Result<SecretSet, MatcherError> {
        entries.sort_by(|a, b| a.0.cmp(&b.0));
        entries.dedup_by(|a, b| a.0 == b.0);
        let refs: Vec<(SecretName, &SecretValue)> = entries
            .iter()
            .map(|(n, v)| (n.clone(), &**v))
            .chain(reserved.iter().map(|r| (r.name.clone(), &*r.value)))
            .collect();
        let matcher = Matcher::build(&refs)?;
        let secrets = entries
            .into_iter()
            .map(|(name, value)| Secret::new(name, value))
            .collect();
        Ok(SecretSet {
            secrets,
            reserved,
            matcher,
        })
    }

    /// This set with `name` set to `value` (added or replaced).
    pub(crate) fn with(
        &self,
        name: &SecretName,
        value: Arc<SecretValue>,
    ) -> Result<SecretSet, MatcherError> {
        let mut entries = self.entries_but(name);
        entries.push((name.clone(), value));
        SecretSet::with_reserved(entries, self.reserved.clone())
    }

    /// This set without `name`.
    pub(crate) fn without(&self, name: &SecretName) -> Result<SecretSet, MatcherError> {
        SecretSet::with_reserved(self.entries_but(name), self.reserved.clone())
    }

    fn entries_but(&self, name: &SecretName) -> Vec<(SecretName, Arc<SecretValue>)> {
        self.secrets
            .iter()
            .filter(|s| s.name != *name)
            .map(|s| (s.name.clone(), s.value.clone()))
            .collect()
    }

    /// Nothing to look for: no secret in the store, no reserved value.
    pub(crate) fn is_empty(&self) -> bool {
        self.secrets.is_empty() && self.reserved.is_empty()
    }

    /// The store's secrets (not the reserved values).
    pub fn len(&self) -> usize {
        self.secrets.len()
    }

    pub(crate) fn get(&self, name: &str) -> Option<&Secret> {
        self.secrets
            .binary_search_by(|s| s.name.as_str().cmp(name))
            .ok()
            .map(|i| &self.secrets[i])
    }

    /// The secret a matcher index refers to (a reserved value past the store's).
    pub(crate) fn at(&self, index: usize) -> &Secret {
        match self.secrets.get(index) {
            Some(s) => s,
            None => &self.reserved[index - self.secrets.len()],
        }
    }

    pub(crate) fn matcher(&self) -> Option<&Matcher> {
        self.matcher.as_ref()
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = &Secret> {
        self.secrets.iter()
    }

    /// `bytes` with every secret value replaced by its placeholder; `None` if it has none.
    /// Overlapping values are replaced as one run, by the placeholder of the first.
    pub(crate) fn redact_bytes(&self, bytes: &[u8]) -> Option<Vec<u8>> {
        let m = self.matcher.as_ref()?;
        let runs = value_runs(m, bytes);
        if runs.is_empty() {
            return None;
        }
        let mut out = Vec::with_capacity(bytes.len());
        let mut pos = 0;
        for (secret, r) in runs {
            out.extend_from_slice(&bytes[pos..r.start]);
            out.extend_from_slice(self.at(secret).placeholder.as_bytes());
            pos = r.end;
        }
        out.extend_from_slice(&bytes[pos..]);
        Some(out)
    }

    /// A header name with every value in it (matched ignoring case) replaced by
    /// `agenshield-secret-NAME` (a placeholder cannot be a name: `:` is no token character);
    /// `None` if it has none.
    pub(crate) fn redact_name(&self, name: &str) -> Option<String> {
        let m = self.matcher.as_ref()?;
        let mut found: Vec<(usize, std::ops::Range<usize>)> =
            m.values_folded(name.as_bytes()).collect();
        if found.is_empty() {
            return None;
        }
        found.sort_by_key(|(_, r)| r.start);
        let mut out = String::with_capacity(name.len() + 32);
        let mut pos = 0;
        for (secret, r) in found {
            if r.start < pos {
                // Overlapping: already covered as far as `pos`.
                pos = pos.max(r.end);
                continue;
            }
            out.push_str(&name[pos..r.start]);
            out.push_str("agenshield-secret-");
            out.push_str(
                &self
                    .at(secret)
                    .name
                    .as_str()
                    .replace('.', "-")
                    .to_ascii_lowercase(),
            );
            pos = r.end;
        }
        out.push_str(&name[pos..]);
        Some(out)
    }

    /// What a run of overlapping values is replaced by: the first one's placeholder.
    pub(crate) fn placeholder_of_run(&self, secrets: &[usize]) -> &str {
        secrets
            .first()
            .map_or("agenshield:secret:", |&i| self.at(i).placeholder.as_str())
    }

    /// `text` with every secret value replaced by its placeholder: for anything derived
    /// from a request that is about to be logged, recorded or shown.
    /// Text the agent percent-encoded in its own way (`%73k-…`, which no fixed encoded form
    /// matches) is shown decoded when its decoded form holds a value, so it can be redacted.
    pub(crate) fn redact<'a>(&self, text: &'a str) -> Cow<'a, str> {
        if text.contains('%') {
            let decoded = percent_encoding::percent_decode_str(text).collect::<Vec<u8>>();
            if let Some(b) = self.redact_bytes(&decoded) {
                return Cow::Owned(String::from_utf8_lossy(&b).into_owned());
            }
        }
        match self.redact_bytes(text.as_bytes()) {
            // Values and placeholders are ASCII, so replacing them keeps UTF-8 intact.
            Some(b) => Cow::Owned(String::from_utf8_lossy(&b).into_owned()),
            None => Cow::Borrowed(text),
        }
    }
}

/// The value matches in `bytes`, overlapping ones joined: (the first secret, the range).
pub(crate) fn value_runs(m: &Matcher, bytes: &[u8]) -> Vec<(usize, std::ops::Range<usize>)> {
    let mut found: Vec<(usize, std::ops::Range<usize>)> = m.values(bytes).collect();
    found.sort_by_key(|(_, r)| r.start);
    let mut runs: Vec<(usize, std::ops::Range<usize>)> = Vec::new();
    for (secret, r) in found {
        match runs.last_mut() {
            Some((_, last)) if r.start < last.end => last.end = last.end.max(r.end),
            _ => runs.push((secret, r)),
        }
    }
    runs
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn set(pairs: &[(&str, &str)]) -> SecretSet {
        SecretSet::new(
            pairs
                .iter()
                .map(|(n, v)| {
                    (
                        SecretName::new(n).expect("name"),
                        Arc::new(SecretValue::new(v.as_bytes().to_vec()).expect("value")),
                    )
                })
                .collect(),
        )
        .expect("set")
    }

    #[test]
    fn redact_replaces_every_form_and_keeps_the_rest() {
        let s = set(&[("openai", "sk-test-123456"), ("aws", "ab/cd+ef=gh")]);
        assert_eq!(
            s.redact("GET /v1?k=sk-test-123456&a=ab%2Fcd%2Bef%3Dgh"),
            "GET /v1?k=agenshield:secret:openai&a=agenshield:secret:aws"
        );
        assert!(matches!(s.redact("nothing"), Cow::Borrowed("nothing")));
        // An encoding of the agent's own making is shown decoded, and redacted.
        assert_eq!(
            s.redact("/a/%73k-test-12%334%356/%2e%2e"),
            "/a/agenshield:secret:openai/.."
        );
        assert!(matches!(s.redact("/a%20b"), Cow::Borrowed("/a%20b")));
        assert_eq!(
            s.get("aws").map(|x| x.placeholder.as_str()),
            Some("agenshield:secret:aws")
        );
        assert!(SecretSet::default().redact("sk-test-123456") == "sk-test-123456");
    }

    /// The Hugging Face example: the encoded placeholder of `hf` runs into the value, which
    /// is redacted all the same; overlapping values are redacted as one run.
    #[test]
    fn redaction_finds_a_value_whatever_overlaps_it() {
        let s = set(&[("hf", "hf_TOKEN123456"), ("x", "TOKEN123456-more")]);
        // (Text with a `%` is shown decoded, as `redact` always does.)
        assert_eq!(
            s.redact("agenshield%3Asecret%3Ahf_TOKEN123456"),
            "agenshield:secret:agenshield:secret:hf"
        );
        assert_eq!(
            String::from_utf8(
                s.redact_bytes(b"agenshield%3Asecret%3Ahf_TOKEN123456")
                    .expect("redacted")
            )
            .expect("utf-8"),
            "agenshield%3Asecret%3Aagenshield:secret:hf"
        );
        assert_eq!(
            s.redact("agenshield:secret:hf_TOKEN123456"),
            "agenshield:secret:agenshield:secret:hf"
        );
        assert_eq!(
            s.redact("a hf_TOKEN123456-more b"),
            "a agenshield:secret:hf b"
        );
    }

    /// Header names: HTTP folds them to lower case, so values are matched ignoring case.
    #[test]
    fn a_value_in_a_header_name_is_replaced_whatever_its_case() {
        let s = set(&[("openai", "sk-TEST-123456")]);
        assert_eq!(
            s.redact_name("x-sk-test-123456-echo").as_deref(),
            Some("x-agenshield-secret-openai-echo")
        );
        assert_eq!(s.redact_name("x-plain"), None);
        let mut h = http::HeaderMap::new();
        h.insert(
            http::HeaderName::from_static("x-sk-test-123456"),
            http::HeaderValue::from_static("v sk-TEST-123456"),
        );
        assert_eq!(crate::secrets::guard::redact::redact_headers(&s, &mut h), 2);
        assert_eq!(
            h.get("x-agenshield-secret-openai").map(|v| v.as_bytes()),
            Some(&b"v agenshield:secret:openai"[..])
        );
    }
}
