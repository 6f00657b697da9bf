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

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Violation {
    /// A placeholder headed somewhere its secret is not bound.
    Scope,
    /// A real secret value headed somewhere it is not bound.
    Leak,
    /// The rule binds a secret the store no longer holds.
    Unavailable,
    /// The rule binds a fetched secret (a command's output, an OAuth2 token) whose fetch
    /// failed; `place` says which source failed.
    Unfetched,
    /// A bound secret would travel where it cannot be protected: over plain HTTP, or over a
    /// protocol upgrade whose frames the proxy does not inspect or redact.
    Transport,
    /// A placeholder of a secret the rule binds, in a place where the rule does not swap it
    /// (its `swap` leaves the place out, or the place cannot be rewritten: a compressed or
    /// binary body, the method, trailers). Sending the placeholder on would only fail
    /// upstream, less clearly.
    NotSwapped,
    /// A request signed with the placeholder of a rule's AWS key id (`sigv4`) that cannot
    /// be signed again; `place` says why.
    Unsignable,
    /// An AWS request outside what the rule's `sigv4` may sign; `place` says how.
    OutOfScope,
    /// A response under a rule that binds no secret carried a secret's value (its upstream
    /// was never given it: it got there as content); the response was cut short there.
    Echoed,
}

impl Violation {
    /// Its name in log lines.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Violation::Scope => "scope",
            Violation::Leak => "leak",
            Violation::Unavailable => "unavailable",
            Violation::Unfetched => "unfetched",
            Violation::Transport => "transport",
            Violation::NotSwapped => "not_swapped",
            Violation::Unsignable => "unsignable",
            Violation::OutOfScope => "out_of_scope",
            Violation::Echoed => "echoed",
        }
    }
}

/// Why a request was refused. Names the secret and the place, never the value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SecretRefusal {
    pub violation: Violation,
    pub secret: String,
    /// `header authorization`, `URL`, `host`, `body`.
    pub place: String,
}

impl SecretRefusal {
    pub(crate) fn message(&self, rule: Option<&str>) -> String {
        let rule = match rule {
            Some(id) if id != crate::policy::DEFAULT_RULE => format!("rule {id}"),
            _ => "the policy default".to_string(),
        };
        match self.violation {
            Violation::Scope => format!(
                "the placeholder for secret {:?} in the {} may only go where a rule binds it, and {rule} does not",
                self.secret, self.place
            ),
            Violation::Leak => format!(
                "the {} carries the value of secret {:?}, which {rule} does not bind; refused so it cannot leak",
                self.place, self.secret
            ),
            Violation::Unavailable => format!(
                "{rule} needs secret {:?}, which is not in the store",
                self.secret
            ),
            Violation::Unfetched => format!(
                "{rule} needs secret {:?}, which could not be fetched ({}); the operator sees why in `agenshield proxy ctl secrets list`",
                self.secret, self.place
            ),
            Violation::Transport => format!(
                "{rule} binds secret {:?}, which is never sent over {}; refused",
                self.secret, self.place
            ),
            Violation::Unsignable => format!(
                "{rule} signs AWS requests made with the placeholder for secret {:?}, and this one cannot be signed: {}",
                self.secret, self.place
            ),
            Violation::OutOfScope => format!(
                "{rule} signs AWS requests with secret {:?}, and this one {}; refused",
                self.secret, self.place
            ),
            Violation::Echoed => format!(
                "the response's {} carried the value of secret {:?}, which {rule} does not bind; it was cut short there, so the value never reached the agent",
                self.place, self.secret
            ),
            Violation::NotSwapped => format!(
                "the placeholder for secret {:?} is in the {}, where {rule} does not swap it for the value; refused rather than sent on as the placeholder (the rule's `swap` lists where it does)",
                self.secret, self.place
            ),
        }
    }
}

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
    check.text(method.as_bytes(), "method", false)?;
    check.text(host.as_bytes(), "host", false)?;
    check.headers(headers, swap)?;
    let (path, query) = match path_and_query.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (path_and_query, None),
    };
    check.url_part(path.as_bytes(), "path", swap.is_some_and(|s| s.path))?;
    if let Some(q) = query {
        // Parameter by parameter: a rule may swap in some only (`query:NAME`).
        for pair in q.split('&') {
            let key = pair.split_once('=').map_or(pair, |(k, _)| k);
            let key = form_urlencoded::parse(key.as_bytes())
                .next()
                .map(|(k, _)| k.into_owned())
                .unwrap_or_default();
            let swaps = swap.is_some_and(|s| s.swaps_query(&key));
            check.url_part(pair.as_bytes(), "query", swaps)?;
        }
    }
    if let Some(b) = bindings {
        for part in b.inject.iter().flat_map(|i| i.template.iter()) {
            if let TemplatePart::Secret(name) = part {
                if set.get(name).is_none() {
                    return Err(refusal(Violation::Unavailable, name, "policy"));
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

fn refusal(violation: Violation, secret: &str, place: &str) -> SecretRefusal {
    SecretRefusal {
        violation,
        secret: secret.to_string(),
        place: place.to_string(),
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
            self.text(name.as_str().as_bytes(), "header names", false)?;
            // HTTP folds names to lower case: a value folded so is still found.
            if let Some(m) = self.set.matcher() {
                for (index, _) in m.values_folded(name.as_str().as_bytes()) {
                    let secret = self.set.at(index).name.as_str();
                    if !self.bound(secret) {
                        return Err(refusal(Violation::Leak, secret, "header names"));
                    }
                }
            }
            let place = format!("header {name}");
            let swaps = swap.is_some_and(|s| s.swaps_header(name));
            self.text(value.as_bytes(), &place, swaps)?;
            if let Some(decoded) = basic_credentials(name, value.as_bytes()) {
                self.text(&decoded, &place, swaps)?;
            }
        }
        Ok(())
    }

    /// A part of the URL, as received and percent-decoded.
    fn url_part(&mut self, raw: &[u8], place: &str, swaps: bool) -> Result<(), SecretRefusal> {
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
    fn text(&mut self, bytes: &[u8], place: &str, swaps: bool) -> Result<(), SecretRefusal> {
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
