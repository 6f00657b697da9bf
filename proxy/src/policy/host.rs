//! Host normalization and host patterns. One canonical spelling per host, so `API.x.com.`,
//! `[::1]` or `::ffff:127.0.0.1` cannot slip past a rule written for `api.x.com` / `::1` / `127.0.0.1`.

use std::borrow::Cow;
use std::net::{Ipv4Addr, Ipv6Addr};

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
}

/// Canonical form of a host as received (port already stripped): ASCII-lowercased, one
/// trailing dot and IPv6 brackets removed, IPv6 compressed (IPv4-mapped IPv6 becomes the
/// IPv4 address). Numeric hosts other than strict dotted-quads are rejected because
/// resolvers read `127.1` or `0x7f.0.0.1` as IP addresses rules would not recognize.
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

/// Parses a `hosts` entry from a policy file; the error is a complete reason for the operator.
pub(crate) fn parse_host_pattern(raw: &str) -> Result<HostPattern, String> {
    if raw == "*" {
        return Ok(HostPattern::Any);
    }
    let wildcard_hint =
        "wildcards are only allowed as \"*\" or a leading \"*.\" (e.g. \"*.example.com\")";
    if let Some(suffix) = raw.strip_prefix("*.") {
        if suffix.contains('*') {
            return Err(format!("invalid host pattern {raw:?}: {wildcard_hint}"));
        }
        let canon =
            normalize_host(suffix).map_err(|e| format!("invalid host pattern {raw:?}: {e}"))?;
        if canon.contains(':') || canon.parse::<Ipv4Addr>().is_ok() {
            return Err(format!(
                "invalid host pattern {raw:?}: a wildcard cannot be applied to an IP address"
            ));
        }
        return Ok(HostPattern::Suffix(canon));
    }
    if raw.contains('*') {
        return Err(format!("invalid host pattern {raw:?}: {wildcard_hint}"));
    }
    normalize_host(raw)
        .map(HostPattern::Exact)
        .map_err(|e| format!("invalid host {raw:?}: {e}"))
}

/// The proper dot-suffixes of a canonical host, longest first: `a.b.c` → `b.c`, `c`.
pub(crate) fn parent_suffixes(host: &str) -> impl Iterator<Item = &str> {
    host.match_indices('.').map(move |(i, _)| &host[i + 1..])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalizes() {
        let cases = [
            ("API.GitHub.com", "api.github.com"),
            ("api.github.com.", "api.github.com"),
            ("[::1]", "::1"),
            ("::1", "::1"),
            ("[0:0:0:0:0:0:0:1]", "::1"),
            ("[::FFFF:127.0.0.1]", "127.0.0.1"),
            ("127.0.0.2", "127.0.0.2"),
            ("127.0.0.2.", "127.0.0.2"),
            ("my_host.internal", "my_host.internal"),
            ("123.example.com", "123.example.com"),
            ("x.0xfoo", "x.0xfoo"),
        ];
        for (raw, want) in cases {
            assert_eq!(normalize_host(raw).as_deref(), Ok(want), "{raw}");
        }
        assert!(matches!(
            normalize_host_cow("a.b"),
            Ok(Cow::Borrowed("a.b"))
        ));
    }

    #[test]
    fn rejects() {
        let cases = [
            ("", HostError::Empty),
            (".", HostError::Empty),
            ("a..b", HostError::EmptyLabel),
            (".a", HostError::EmptyLabel),
            ("a.b..", HostError::EmptyLabel),
            ("example.com:443", HostError::Colon),
            ("[::1]:443", HostError::BadIpv6),
            ("[::1", HostError::BadIpv6),
            ("[fe80::1%25eth0]", HostError::BadIpv6),
            ("a b", HostError::InvalidChar(' ')),
            ("a/b", HostError::InvalidChar('/')),
            ("caf\u{e9}.com", HostError::InvalidChar('\u{e9}')),
            ("127.1", HostError::AmbiguousNumeric),
            ("0x7f.0.0.1", HostError::AmbiguousNumeric),
            ("2130706433", HostError::AmbiguousNumeric),
            ("127.000.0.1", HostError::AmbiguousNumeric),
            ("1.2.3.4.5", HostError::AmbiguousNumeric),
        ];
        for (raw, want) in cases {
            assert_eq!(normalize_host(raw), Err(want), "{raw:?}");
        }
        assert_eq!(
            normalize_host(&"a".repeat(64)),
            Err(HostError::LabelTooLong)
        );
        let long = vec!["abc"; 70].join(".");
        assert_eq!(normalize_host(&long), Err(HostError::TooLong));
    }

    #[test]
    fn patterns() {
        assert_eq!(parse_host_pattern("*"), Ok(HostPattern::Any));
        assert_eq!(
            parse_host_pattern("*.GitHubUserContent.com."),
            Ok(HostPattern::Suffix("githubusercontent.com".into()))
        );
        assert_eq!(
            parse_host_pattern("[::1]"),
            Ok(HostPattern::Exact("::1".into()))
        );
        for bad in [
            "a*.b",
            "a.*.c",
            "*a.b",
            "*.*.b",
            "**",
            "*.",
            "*.127.0.0.1",
            "a.b*",
        ] {
            assert!(parse_host_pattern(bad).is_err(), "{bad}");
        }
        let e = parse_host_pattern("a.*.c").expect_err("bad");
        assert!(e.contains("leading \"*.\""), "{e}");
    }

    #[test]
    fn suffixes() {
        let got: Vec<_> = parent_suffixes("a.b.example.com").collect();
        assert_eq!(got, ["b.example.com", "example.com", "com"]);
        assert_eq!(parent_suffixes("localhost").count(), 0);
    }
}
