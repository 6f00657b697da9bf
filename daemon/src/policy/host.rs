//! Host normalization and host patterns. One canonical spelling per host, so `API.x.com.`,
//! `[::1]`, `::ffff:127.0.0.1` or `bücher.example` cannot slip past a rule written for
//! `api.x.com` / `::1` / `127.0.0.1` / `xn--bcher-kva.example`.

use std::borrow::Cow;
use std::net::{Ipv4Addr, Ipv6Addr};

use idna::uts46::{AsciiDenyList, DnsLength, Hyphens, Uts46};

const MAX_HOST_LEN: usize = 253;
const MAX_LABEL_LEN: usize = 63;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HostError {
    #[error("empty host")]
    Empty,
    #[error("host longer than {MAX_HOST_LEN} bytes")]
    TooLong,
    #[error("invalid character {0:?} in host")]
    InvalidChar(char),
    #[error("empty label in host")]
    EmptyLabel,
    #[error("label longer than {MAX_LABEL_LEN} bytes in host")]
    LabelTooLong,
    #[error("invalid IPv6 literal")]
    BadIpv6,
    #[error("host contains \":\" (strip the port first; bare IPv6 must be a valid address)")]
    Colon,
    #[error("numeric host that is not a dotted-quad IPv4 address (e.g. \"127.1\", \"0x7f.1\")")]
    AmbiguousNumeric,
    #[error("invalid internationalized domain name (UTS 46 / IDNA): disallowed character or malformed \"xn--\" label")]
    InvalidIdn,
}

/// Canonical form of a host as received (port already stripped): ASCII-lowercased, one
/// trailing dot and IPv6 brackets removed, IPv6 compressed (IPv4-mapped IPv6 becomes the
/// IPv4 address), internationalized names as punycode (UTS 46 ToASCII, as browsers do).
/// Numeric hosts other than strict dotted-quads are rejected because resolvers read `127.1`
/// or `0x7f.0.0.1` as IP addresses rules would not recognize. Callers must dial the returned
/// name, not the raw one: the decision is only about the canonical form.
pub fn normalize_host(raw: &str) -> Result<String, HostError> {
    normalize_host_cow(raw).map(Cow::into_owned)
}

/// As [`normalize_host`], borrowing when the input is already canonical (the common case).
pub(crate) fn normalize_host_cow(raw: &str) -> Result<Cow<'_, str>, HostError> {
    if let Some(inner) = raw.strip_prefix('[') {
        let inner = inner.strip_suffix(']').ok_or(HostError::BadIpv6)?;
        let ip: Ipv6Addr = inner.parse().map_err(|_| HostError::BadIpv6)?;
        return Ok(Cow::Owned(canonical_v6(ip)));
    }
    if !raw.is_ascii() || has_punycode_label(raw) {
        // Unicode (or already-encoded) names: map and encode, then check the ASCII result
        // like any other host, so the mapping cannot produce something the rules never see.
        let ascii = Uts46::new()
            .to_ascii(
                raw.as_bytes(),
                AsciiDenyList::URL,
                Hyphens::Allow,
                DnsLength::Ignore,
            )
            .map_err(|_| HostError::InvalidIdn)?;
        return ascii_host(&ascii).map(|h| Cow::Owned(h.into_owned()));
    }
    ascii_host(raw)
}

/// The checks and canonical form for an ASCII host (no brackets).
fn ascii_host(raw: &str) -> Result<Cow<'_, str>, HostError> {
    let host = raw.strip_suffix('.').unwrap_or(raw);
    if host.is_empty() {
        return Err(HostError::Empty);
    }
    if host.contains(':') {
        let ip: Ipv6Addr = host.parse().map_err(|_| HostError::Colon)?;
        return Ok(Cow::Owned(canonical_v6(ip)));
    }
    if host.len() > MAX_HOST_LEN {
        return Err(HostError::TooLong);
    }
    let mut upper = false;
    for (i, b) in host.bytes().enumerate() {
        match b {
            b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' => {}
            b'A'..=b'Z' => upper = true,
            _ => {
                let c = host[i..]
                    .chars()
                    .next()
                    .unwrap_or(char::REPLACEMENT_CHARACTER);
                return Err(HostError::InvalidChar(c));
            }
        }
    }
    let mut last = "";
    for label in host.split('.') {
        if label.is_empty() {
            return Err(HostError::EmptyLabel);
        }
        if label.len() > MAX_LABEL_LEN {
            return Err(HostError::LabelTooLong);
        }
        last = label;
    }
    if is_numeric_label(last) && host.parse::<Ipv4Addr>().is_err() {
        return Err(HostError::AmbiguousNumeric);
    }
    Ok(if upper {
        Cow::Owned(host.to_ascii_lowercase())
    } else {
        Cow::Borrowed(host)
    })
}

/// True when some label starts with the ACE prefix `xn--` (any case): such labels must be
/// valid punycode, and are lower-cased by the IDNA mapping.
fn has_punycode_label(host: &str) -> bool {
    host.split('.')
        .any(|l| l.len() >= 4 && l.as_bytes()[..4].eq_ignore_ascii_case(b"xn--"))
}

fn canonical_v6(ip: Ipv6Addr) -> String {
    match ip.to_ipv4_mapped() {
        Some(v4) => v4.to_string(),
        None => ip.to_string(),
    }
}

/// A label that WHATWG URL parsing (and `inet_aton`) would read as a number: decimal or `0x` hex.
fn is_numeric_label(label: &str) -> bool {
    let hex = label
        .strip_prefix("0x")
        .or_else(|| label.strip_prefix("0X"));
    match hex {
        Some(h) => h.bytes().all(|b| b.is_ascii_hexdigit()),
        None => !label.is_empty() && label.bytes().all(|b| b.is_ascii_digit()),
    }
}

/// A compiled `hosts` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum HostPattern {
    /// `*`: every host, IP literals included.
    Any,
    /// One canonical host.
    Exact(String),
    /// `*.suffix`: any host strictly below `suffix` (any depth), not `suffix` itself.
    Suffix(String),
}

impl HostPattern {
    /// Whether canonical `host` matches (the index does this for rule hosts; this is for
    /// the few patterns checked per rule, e.g. AgenShield's `allowedHosts` exemptions).
    pub(crate) fn matches(&self, host: &str) -> bool {
        match self {
            HostPattern::Any => true,
            HostPattern::Exact(h) => h == host,
            HostPattern::Suffix(s) => host
                .strip_suffix(s.as_str())
                .is_some_and(|head| head.len() > 1 && head.ends_with('.')),
        }
    }
}

/// Why a `hosts` entry is refused; each is a complete reason for the operator (the entry is
/// policy text, never a secret).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum HostPatternError {
    #[error(
        "invalid host {0:?}: write the host name alone, e.g. \"api.github.com\" (a port \
         goes in `ports`, a path in `paths`, the scheme in `schemes`)"
    )]
    Url(String),
    #[error(
        "invalid host {raw:?}: write the port in `ports`, e.g. hosts = [\"{host}\"], \
         ports = [{port}]"
    )]
    WithPort {
        raw: String,
        host: String,
        port: String,
    },
    #[error("invalid host pattern {0:?}: wildcards are only allowed as \"*\" or a leading \"*.\" (e.g. \"*.example.com\")")]
    Wildcard(String),
    #[error("invalid host pattern {raw:?}: {why}")]
    Suffix { raw: String, why: HostError },
    #[error("invalid host pattern {0:?}: a wildcard cannot be applied to an IP address")]
    WildcardIp(String),
    #[error("invalid host {raw:?}: {why}")]
    Host { raw: String, why: HostError },
}

/// Parses a `hosts` entry from a policy file.
pub(crate) fn parse_host_pattern(raw: &str) -> Result<HostPattern, HostPatternError> {
    if raw == "*" {
        return Ok(HostPattern::Any);
    }
    // A URL or `host:port` where a host name goes: say where each part belongs.
    if raw.contains("://") || raw.contains('/') {
        return Err(HostPatternError::Url(raw.to_owned()));
    }
    if let Some((host, port)) = raw.rsplit_once(':') {
        if !host.contains(':') && port.parse::<u16>().is_ok() {
            return Err(HostPatternError::WithPort {
                raw: raw.to_owned(),
                host: host.to_owned(),
                port: port.to_owned(),
            });
        }
    }
    if let Some(suffix) = raw.strip_prefix("*.") {
        if suffix.contains('*') {
            return Err(HostPatternError::Wildcard(raw.to_owned()));
        }
        let canon = normalize_host(suffix).map_err(|why| HostPatternError::Suffix {
            raw: raw.to_owned(),
            why,
        })?;
        if canon.contains(':') || canon.parse::<Ipv4Addr>().is_ok() {
            return Err(HostPatternError::WildcardIp(raw.to_owned()));
        }
        return Ok(HostPattern::Suffix(canon));
    }
    if raw.contains('*') {
        return Err(HostPatternError::Wildcard(raw.to_owned()));
    }
    normalize_host(raw)
        .map(HostPattern::Exact)
        .map_err(|why| HostPatternError::Host {
            raw: raw.to_owned(),
            why,
        })
}

/// The proper dot-suffixes of a canonical host, longest first: `a.b.c` → `b.c`, `c`.
pub(crate) fn parent_suffixes(host: &str) -> impl Iterator<Item = &str> {
    host.match_indices('.').map(move |(i, _)| &host[i + 1..])
}

#[cfg(test)]
#[path = "host_tests.rs"]
mod tests;
