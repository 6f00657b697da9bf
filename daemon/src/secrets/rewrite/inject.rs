//! Injection: the deciding rule's `inject` entries set headers and query parameters from
//! secret values, and placeholders of bound secrets become the values where the rule swaps
//! them: the credential headers (Basic credentials included) and what the rule names (other
//! headers, the path, query parameters: a placeholder as written or with its colons
//! percent-encoded; the value as it is where a URL may carry it so, else percent-encoded). Bodies are swapped as they stream (`scan_body`). Runs after
//! the leak guard and the rate limits passed.

use base64::Engine as _;
use bytes::{BufMut, Bytes, BytesMut};
use http::{HeaderMap, HeaderName, HeaderValue};

use crate::policy::{InjectTarget, SecretBindings, TemplatePart};
use crate::secrets::guard::scan::{basic_credentials, split_scheme};
use crate::secrets::placeholder;
use crate::secrets::set::SecretSet;

/// The request target as it goes upstream, where injection or a swap changed it.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Url {
    /// `None`: unchanged.
    pub path: Option<String>,
    /// `None`: unchanged.
    pub query: Option<String>,
}

/// Sets `headers` and returns the URL's changes. The scan checked that every secret named
/// here exists in `set`; one missing now is skipped rather than half-injected.
pub(crate) fn apply(
    set: &SecretSet,
    bindings: &SecretBindings,
    headers: &mut HeaderMap,
    path: &str,
    query: Option<&str>,
) -> Url {
    swap_placeholders(set, bindings, headers);
    let swap = &bindings.swap;
    let path = if swap.path {
        swap_in_url(set, bindings, path)
    } else {
        None
    };
    let swapped = match query {
        Some(q) if swap.all_query => swap_in_url(set, bindings, q),
        Some(q) if !swap.query.is_empty() => swap_in_params(set, bindings, q),
        _ => None,
    };
    let injected = inject(set, bindings, headers, swapped.as_deref().or(query));
    Url {
        path,
        query: injected.or(swapped),
    }
}

/// `query` with placeholders swapped in the values of the parameters the rule names;
/// `None` if none was.
fn swap_in_params(set: &SecretSet, bindings: &SecretBindings, query: &str) -> Option<String> {
    let mut changed = false;
    let pairs: Vec<String> = query
        .split('&')
        .map(|pair| {
            let Some((k, v)) = pair.split_once('=') else {
                return pair.to_string();
            };
            let key = form_urlencoded::parse(k.as_bytes())
                .next()
                .map(|(k, _)| k.into_owned())
                .unwrap_or_default();
            if !bindings.swap.swaps_query(&key) {
                return pair.to_string();
            }
            match swap_in_url(set, bindings, v) {
                Some(v) => {
                    changed = true;
                    format!("{k}={v}")
                }
                None => pair.to_string(),
            }
        })
        .collect();
    changed.then(|| pairs.join("&"))
}

/// Sets the rule's `inject` headers; returns the query with its parameters set (`None`: no
/// parameter injected).
fn inject(
    set: &SecretSet,
    bindings: &SecretBindings,
    headers: &mut HeaderMap,
    query: Option<&str>,
) -> Option<String> {
    let mut query = query.map(str::to_string);
    let mut changed = false;
    for inj in bindings.inject.iter() {
        let Some(value) = render(set, &inj.template) else {
            continue;
        };
        match &inj.target {
            InjectTarget::Header(name) => {
                if let Some(v) = sensitive(value) {
                    headers.insert(name.clone(), v);
                }
            }
            InjectTarget::Query(param) => {
                let encoded = percent_encoding::percent_encode(&value, QUERY_VALUE).to_string();
                query = Some(set_param(query.as_deref(), param, &encoded));
                changed = true;
            }
        }
    }
    if changed {
        query
    } else {
        None
    }
}

/// `text` (a path or a query) with each bound placeholder, as written or with `%3A` for its
/// colons, replaced by the value percent-encoded; `None` if none was.
fn swap_in_url(set: &SecretSet, bindings: &SecretBindings, text: &str) -> Option<String> {
    let m = set.matcher()?;
    let bytes = text.as_bytes();
    let mut out: Option<String> = None;
    let mut pos = 0;
    for (index, r) in m.placeholders(bytes) {
        let secret = set.at(index);
        let longer_name = bytes
            .get(r.end)
            .is_some_and(|b| crate::policy::is_name_byte(*b));
        if longer_name || !bindings.binds(secret.name.as_str()) {
            continue;
        }
        let o = out.get_or_insert_with(|| String::with_capacity(text.len() + 64));
        o.push_str(&text[pos..r.start]);
        let value = secret.value.expose();
        // As it is when a path or query may carry it so (`123456:ABC-def`, a bot token);
        // else every byte but unreserved ones encoded. Either is a form the redactor knows,
        // so an upstream echoing the URL back is redacted.
        if value
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || b"-._~:@".contains(b))
        {
            o.push_str(&String::from_utf8_lossy(value));
        } else {
            o.extend(percent_encoding::percent_encode(value, QUERY_VALUE));
        }
        pos = r.end;
    }
    let mut o = out?;
    o.push_str(&text[pos..]);
    Some(o)
}

/// Characters left as they are in a query parameter value: unreserved ones.
pub(crate) const QUERY_VALUE: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

fn render(set: &SecretSet, template: &[TemplatePart]) -> Option<Bytes> {
    let mut out = BytesMut::new();
    for part in template {
        match part {
            TemplatePart::Literal(s) => out.put_slice(s.as_bytes()),
            TemplatePart::Secret(name) => out.put_slice(set.get(name)?.value.expose()),
        }
    }
    Some(out.freeze())
}

/// A header value that HPACK never indexes and `Debug` never prints.
fn sensitive(bytes: Bytes) -> Option<HeaderValue> {
    let mut v = HeaderValue::from_maybe_shared(bytes).ok()?;
    v.set_sensitive(true);
    Some(v)
}

/// Swaps placeholders in the headers the rule swaps in (the credential headers, what it
/// injects, what its `swap` names).
fn swap_placeholders(set: &SecretSet, bindings: &SecretBindings, headers: &mut HeaderMap) {
    let mut replaced: Vec<(HeaderName, Vec<HeaderValue>)> = Vec::new();
    for name in headers.keys().filter(|n| bindings.swap.swaps_header(n)) {
        let values = headers.get_all(name);
        let needs = values.iter().any(|v| {
            !placeholder::find_all(v.as_bytes()).is_empty()
                || basic_credentials(name, v.as_bytes())
                    .is_some_and(|d| !placeholder::find_all(&d).is_empty())
        });
        if needs {
            let swapped = values
                .iter()
                .map(|v| swap_value(set, bindings, name, v))
                .collect();
            replaced.push((name.clone(), swapped));
        }
    }
    for (name, values) in replaced {
        headers.remove(&name);
        for v in values {
            headers.append(name.clone(), v);
        }
    }
}

fn swap_value(
    set: &SecretSet,
    bindings: &SecretBindings,
    name: &HeaderName,
    v: &HeaderValue,
) -> HeaderValue {
    if let Some(decoded) = basic_credentials(name, v.as_bytes()) {
        if let Some(swapped) = swap_bytes(set, bindings, &decoded) {
            let scheme = split_scheme(v.as_bytes()).map_or(&b"Basic"[..], |(s, _)| s);
            let mut out = BytesMut::from(scheme);
            out.put_u8(b' ');
            out.put_slice(
                base64::engine::general_purpose::STANDARD
                    .encode(&swapped)
                    .as_bytes(),
            );
            return sensitive(out.freeze()).unwrap_or_else(|| v.clone());
        }
    }
    match swap_bytes(set, bindings, v.as_bytes()) {
        Some(swapped) => sensitive(Bytes::from(swapped)).unwrap_or_else(|| v.clone()),
        None => v.clone(),
    }
}

/// `bytes` with each bound placeholder replaced by its value; `None` if none was.
fn swap_bytes(set: &SecretSet, bindings: &SecretBindings, bytes: &[u8]) -> Option<Vec<u8>> {
    let found = placeholder::find_all(bytes);
    let mut out: Option<Vec<u8>> = None;
    let mut pos = 0;
    for f in found {
        let Some(s) = set.get(&f.name).filter(|_| bindings.binds(&f.name)) else {
            continue;
        };
        let o = out.get_or_insert_with(|| Vec::with_capacity(bytes.len() + 64));
        o.extend_from_slice(&bytes[pos..f.range.start]);
        o.extend_from_slice(s.value.expose());
        pos = f.range.end;
    }
    let mut o = out?;
    o.extend_from_slice(&bytes[pos..]);
    Some(o)
}

/// `query` with every `param=…` replaced by `param=value`, or `param=value` appended.
fn set_param(query: Option<&str>, param: &str, value: &str) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut set = false;
    for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let key = pair.split_once('=').map_or(pair, |(k, _)| k);
        let key_decoded = percent_encoding::percent_decode_str(key).decode_utf8_lossy();
        if key_decoded == param {
            if !set {
                parts.push(format!("{param}={value}"));
                set = true;
            }
        } else {
            parts.push(pair.to_string());
        }
    }
    if !set {
        parts.push(format!("{param}={value}"));
    }
    parts.join("&")
}

#[cfg(test)]
#[path = "inject_tests.rs"]
mod tests;
