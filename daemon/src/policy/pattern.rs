//! AgenShield URL patterns (`https://api.github.com/**`, `*.example.com`,
//! `http://localhost:*`) as matchers: `[scheme://]host[:port][/path-glob]`.
//!
//! - scheme `http`/`https` (or `*`): only that scheme; absent: any scheme, TCP included.
//! - port: as written; `*` = any; absent = the scheme's default port, or any port when the
//!   scheme is absent too.
//! - path: a glob on the normalized path, case-insensitive like AgenShield's matcher; `*`
//!   stays within a segment, `**` crosses segments; `[ ] { }` are literal as in AgenShield.
//!   Absent: any path.

use std::ops::Range;

use toml::Spanned;

use super::model::MatchDef;

/// Why a pattern is not one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum PatternError {
    #[error("unsupported scheme {0:?} (use http or https)")]
    UnsupportedScheme(String),
    #[error("query strings and fragments cannot be matched (rules see the path only)")]
    QueryOrFragment,
    #[error("userinfo (\"user@\") is not allowed")]
    Userinfo,
    #[error("no host")]
    NoHost,
    #[error("unclosed \"[\" in host")]
    UnclosedBracket,
    #[error("unexpected {0:?} after the IPv6 address")]
    AfterIpv6(String),
    #[error("invalid port {0:?} (1..=65535 or \"*\")")]
    InvalidPort(String),
}

/// A pattern that is not one, with the pattern as written (policy text, never a secret).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid pattern {pattern:?}: {why}")]
pub(crate) struct InvalidPattern {
    pub pattern: String,
    pub why: PatternError,
}

/// The matcher for one pattern; every value points at the pattern's span for errors.
pub(crate) fn matcher(pattern: &str, span: &Range<usize>) -> Result<MatchDef, InvalidPattern> {
    let p = parse(pattern).map_err(|why| InvalidPattern {
        pattern: pattern.to_owned(),
        why,
    })?;
    let one = |v: String| Spanned::new(span.clone(), vec![Spanned::new(span.clone(), v)]);
    let port = p
        .port
        .map(|n| Spanned::new(span.clone(), vec![Spanned::new(span.clone(), i64::from(n))]));
    Ok(MatchDef {
        schemes: p.scheme.map(|s| one(s.to_owned())),
        ports: port,
        paths: p.path.map(one),
        paths_case_insensitive: true,
        ..MatchDef::hosts(one(p.host))
    })
}

struct Parsed {
    scheme: Option<&'static str>,
    host: String,
    port: Option<u16>,
    path: Option<String>,
}

fn parse(pattern: &str) -> Result<Parsed, PatternError> {
    let (scheme, rest) = match pattern.split_once("://") {
        None => (None, pattern),
        Some((s, rest)) => match s.to_ascii_lowercase().as_str() {
            "http" => (Some("http"), rest),
            "https" => (Some("https"), rest),
            "*" => (None, rest),
            other => return Err(PatternError::UnsupportedScheme(other.to_owned())),
        },
    };
    if rest.contains(['?', '#']) {
        return Err(PatternError::QueryOrFragment);
    }
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], Some(&rest[i..])),
        None => (rest, None),
    };
    if authority.contains('@') {
        return Err(PatternError::Userinfo);
    }
    let (host, port) = split_port(authority)?;
    if host.is_empty() {
        return Err(PatternError::NoHost);
    }
    // AgenShield's `**` matches anything, so as a host it can only mean "any host".
    let host = if host == "**" { "*" } else { host };
    let port = match (port, scheme) {
        (Some("*"), _) => None,
        (Some(p), _) => Some(parse_port(p)?),
        (None, Some("https")) => Some(443),
        (None, Some(_)) => Some(80),
        (None, None) => None,
    };
    Ok(Parsed {
        scheme,
        host: host.to_owned(),
        port,
        path: path.map(escape_literals),
    })
}

/// Splits `host[:port]`; `[v6]:port` is bracketed, a bare IPv6 literal has no port.
fn split_port(authority: &str) -> Result<(&str, Option<&str>), PatternError> {
    if authority.starts_with('[') {
        let end = authority.find(']').ok_or(PatternError::UnclosedBracket)?;
        let (host, rest) = authority.split_at(end + 1);
        return match rest.strip_prefix(':') {
            Some(port) => Ok((host, Some(port))),
            None if rest.is_empty() => Ok((host, None)),
            None => Err(PatternError::AfterIpv6(rest.to_owned())),
        };
    }
    match authority.matches(':').count() {
        0 => Ok((authority, None)),
        1 => Ok(authority
            .split_once(':')
            .map_or((authority, None), |(h, p)| (h, Some(p)))),
        _ => Ok((authority, None)),
    }
}

fn parse_port(p: &str) -> Result<u16, PatternError> {
    p.parse::<u16>()
        .ok()
        .filter(|&n| n != 0 && p.bytes().all(|b| b.is_ascii_digit()))
        .ok_or_else(|| PatternError::InvalidPort(p.to_owned()))
}

/// AgenShield treats `[ ] { }` literally; in a glob they are classes and alternations.
fn escape_literals(path: &str) -> String {
    let mut out = String::with_capacity(path.len());
    for c in path.chars() {
        if matches!(c, '[' | ']' | '{' | '}' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn show(p: &str) -> Result<String, PatternError> {
        parse(p).map(|x| format!("{:?} {} {:?} {:?}", x.scheme, x.host, x.port, x.path))
    }

    #[test]
    fn parses() {
        let ok = [
            (
                "https://api.github.com/**",
                "Some(\"https\") api.github.com Some(443) Some(\"/**\")",
            ),
            (
                "*.githubusercontent.com",
                "None *.githubusercontent.com None None",
            ),
            (
                "http://localhost:3000/*",
                "Some(\"http\") localhost Some(3000) Some(\"/*\")",
            ),
            ("http://localhost:*", "Some(\"http\") localhost None None"),
            (
                "HTTPS://X.example:8443",
                "Some(\"https\") X.example Some(8443) None",
            ),
            (
                "https://[::1]:8080/a",
                "Some(\"https\") [::1] Some(8080) Some(\"/a\")",
            ),
            ("::1", "None ::1 None None"),
            ("example.com:22", "None example.com Some(22) None"),
            ("*://x.example/", "None x.example None Some(\"/\")"),
            ("**", "None * None None"),
            (
                "https://x/a[1]{b}",
                "Some(\"https\") x Some(443) Some(\"/a\\\\[1\\\\]\\\\{b\\\\}\")",
            ),
        ];
        for (p, want) in ok {
            assert_eq!(show(p).as_deref(), Ok(want), "{p}");
        }
        let bad = [
            ("ftp://x.example/", "unsupported scheme \"ftp\""),
            ("https://x.example/a?b=1", "query strings"),
            ("https://x.example/#top", "query strings"),
            ("https://user@x.example/", "userinfo"),
            ("https:///a", "no host"),
            ("", "no host"),
            ("https://x.example:0/", "invalid port \"0\""),
            ("https://x.example:70000/", "invalid port"),
            ("https://x.example:+1/", "invalid port"),
            ("https://x.example:/", "invalid port \"\""),
            ("https://[::1/", "unclosed"),
            ("https://[::1]x/", "unexpected \"x\""),
        ];
        for (p, want) in bad {
            let e = parse(p).err().map(|e| e.to_string()).unwrap_or_default();
            assert!(e.contains(want), "{p}: {e}");
        }
    }
}
