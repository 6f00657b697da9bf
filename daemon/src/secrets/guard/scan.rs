//! The leak guard, for a request's head: where secrets may go. A placeholder or a real value
//! of a secret the deciding rule does not bind, anywhere in the host, a header (Basic
//! credentials decoded) or the URL (raw and percent-decoded), refuses the request.

use std::collections::BTreeSet;
use std::sync::Arc;

use base64::Engine as _;
use http::HeaderMap;

use crate::policy::{SecretBindings, SwapPlaces, TemplatePart};
use crate::secrets::placeholder;
use crate::secrets::set::SecretSet;
use crate::secrets::{Place, SecretRefusal, Violation};

/// What the head showed: the bound secrets this request uses (placeholders to swap in
/// headers, and every secret the rule injects), sorted.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct HeadScan {
    pub used: Vec<Arc<str>>,
}

/// Checks method, host, headers and URL (`path_and_query` as received).
pub(crate) fn inspect_head(
    set: &SecretSet,
    bindings: Option<&SecretBindings>,
    method: &str,
    host: &str,
    headers: &HeaderMap,
    path_and_query: &str,
) -> Result<HeadScan, SecretRefusal> {
    let mut used = BTreeSet::new();
    let swap = bindings.map(|b| &b.swap);
    let mut check = Checker {
        set,
        bindings,
        used: &mut used,
    };
    // A method is any token: a key made of token characters fits in it.
    check.text(method.as_bytes(), &Place::Method, false)?;
    check.text(host.as_bytes(), &Place::Host, false)?;
    check.headers(headers, swap)?;
    let (path, query) = match path_and_query.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (path_and_query, None),
    };
    check.url_part(path.as_bytes(), &Place::Path, swap.is_some_and(|s| s.path))?;
    if let Some(q) = query {
        // Parameter by parameter: a rule may swap in some only (`query:NAME`).
        for pair in q.split('&') {
            let key = pair.split_once('=').map_or(pair, |(k, _)| k);
            let key = form_urlencoded::parse(key.as_bytes())
                .next()
                .map(|(k, _)| k.into_owned())
                .unwrap_or_default();
            let swaps = swap.is_some_and(|s| s.swaps_query(&key));
            check.url_part(pair.as_bytes(), &Place::Query, swaps)?;
        }
    }
    if let Some(b) = bindings {
        for part in b.inject.iter().flat_map(|i| i.template.iter()) {
            if let TemplatePart::Secret(name) = part {
                if set.get(name).is_none() {
                    return Err(refusal(Violation::Unavailable, name, &Place::Policy));
                }
                used.insert(name.clone());
            }
        }
    }
    Ok(HeadScan {
        used: used.into_iter().collect(),
    })
}

/// The decoded `user:password` of `Authorization: Basic …`, if that is what `value` is.
pub(crate) fn basic_credentials(name: &http::HeaderName, value: &[u8]) -> Option<Vec<u8>> {
    if name != http::header::AUTHORIZATION {
        return None;
    }
    let (scheme, rest) = split_scheme(value)?;
    if !scheme.eq_ignore_ascii_case(b"basic") {
        return None;
    }
    base64::engine::general_purpose::STANDARD
        .decode(rest.trim_ascii())
        .ok()
}

pub(crate) fn split_scheme(value: &[u8]) -> Option<(&[u8], &[u8])> {
    let sp = value.iter().position(|b| *b == b' ')?;
    Some((&value[..sp], &value[sp + 1..]))
}

/// A name the agent wrote after the placeholder prefix, safe to show: anything can follow
/// the prefix (a real value, or the start of one), so only names the store holds are shown.
fn shown_name(set: &SecretSet, written: &str) -> String {
    if set.get(written).is_some() {
        written.to_string()
    } else {
        "(a name the store does not hold)".to_string()
    }
}

fn refusal(violation: Violation, secret: &str, place: &Place) -> SecretRefusal {
    SecretRefusal {
        violation,
        secret: secret.to_string(),
        place: place.clone(),
    }
}

struct Checker<'a> {
    set: &'a SecretSet,
    bindings: Option<&'a SecretBindings>,
    used: &'a mut BTreeSet<Arc<str>>,
}

/// Checks trailers (of a request body): like headers, but nothing is swapped there.
pub(crate) fn inspect_trailers(
    set: &SecretSet,
    bindings: Option<&SecretBindings>,
    trailers: &HeaderMap,
) -> Result<(), SecretRefusal> {
    let mut used = BTreeSet::new();
    Checker {
        set,
        bindings,
        used: &mut used,
    }
    .headers(trailers, None)
}

impl Checker<'_> {
    fn headers(
        &mut self,
        headers: &HeaderMap,
        swap: Option<&SwapPlaces>,
    ) -> Result<(), SecretRefusal> {
        for (name, value) in headers {
            self.text(name.as_str().as_bytes(), &Place::HeaderNames, false)?;
            // HTTP folds names to lower case: a value folded so is still found.
            if let Some(m) = self.set.matcher() {
                for (index, _) in m.values_folded(name.as_str().as_bytes()) {
                    let secret = self.set.at(index).name.as_str();
                    if !self.bound(secret) {
                        return Err(refusal(Violation::Leak, secret, &Place::HeaderNames));
                    }
                }
            }
            let place = Place::Header(name.clone());
            let swaps = swap.is_some_and(|s| s.swaps_header(name));
            self.text(value.as_bytes(), &place, swaps)?;
            if let Some(decoded) = basic_credentials(name, value.as_bytes()) {
                self.text(&decoded, &place, swaps)?;
            }
        }
        Ok(())
    }

    /// A part of the URL, as received and percent-decoded.
    fn url_part(&mut self, raw: &[u8], place: &Place, swaps: bool) -> Result<(), SecretRefusal> {
        self.text(raw, place, swaps)?;
        if raw.contains(&b'%') {
            let decoded: Vec<u8> = percent_encoding::percent_decode(raw).collect();
            self.text(&decoded, place, swaps)?;
        }
        Ok(())
    }

    fn bound(&self, name: &str) -> bool {
        self.bindings.is_some_and(|b| b.binds(name))
    }

    /// `swaps`: placeholders here are swapped for bound secrets, so they count as uses and
    /// must name a secret the store holds; where nothing is swapped a bound one is refused.
    fn text(&mut self, bytes: &[u8], place: &Place, swaps: bool) -> Result<(), SecretRefusal> {
        for found in placeholder::find_all(bytes) {
            if !self.bound(&found.name) {
                return Err(refusal(
                    Violation::Scope,
                    &shown_name(self.set, &found.name),
                    place,
                ));
            }
            if !swaps {
                return Err(refusal(Violation::NotSwapped, &found.name, place));
            }
            let Some(s) = self.set.get(&found.name) else {
                return Err(refusal(Violation::Unavailable, &found.name, place));
            };
            self.used.insert(s.name.shared());
        }
        if let Some(m) = self.set.matcher() {
            // Every occurrence, overlapping ones included: no surrounding text hides one.
            for (index, _) in m.values(bytes) {
                let name = self.set.at(index).name.as_str();
                if !self.bound(name) {
                    return Err(refusal(Violation::Leak, name, place));
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
#[path = "scan_tests.rs"]
pub(crate) mod tests;
