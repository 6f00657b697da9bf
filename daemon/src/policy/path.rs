//! Request-path normalization. Security-critical: rules are only as good as the path they
//! see, so every trick a server might undo (dot-segments, escapes, `//`, `%2F`) is undone here.

use std::fmt;

/// Longest request path accepted (bytes, before normalization).
pub const MAX_PATH_LEN: usize = 8 * 1024;

/// The two normalized forms of one request path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NormalizedPath {
    /// RFC 3986-equivalent form to send upstream: unreserved escapes decoded, remaining escapes
    /// upper-cased, dot-segments removed. Means exactly what the client's path meant.
    pub forward: String,
    /// What rules match against: `forward`, then every escape of a printable ASCII character
    /// decoded (so `%2F` is `/`) except `%25`, `%3F` and `%23` (a `%`, `?` or `#` that is
    /// data, not syntax), `\` taken as `/`, runs of `/` collapsed, and each segment's
    /// parameters (from a `;` or a `%3B` on) dropped, as Tomcat, Jetty and Spring drop them.
    /// Models the most lenient reading an upstream might apply.
    pub matching: String,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    #[error("path does not start with \"/\"")]
    NotAbsolute,
    #[error("path longer than {MAX_PATH_LEN} bytes")]
    TooLong,
    #[error("invalid percent-escape at byte {0}")]
    BadEscape(usize),
    #[error("control character in path at byte {0}")]
    Control(usize),
    #[error("percent-encoded NUL (%00) in path")]
    EncodedNul,
    #[error("\"?\" in path (split off the query first)")]
    Query,
    #[error(
        "an encoded separator (%2F, %5C or \\) or a segment parameter (\";\") forms a \".\" or \"..\" segment"
    )]
    EncodedDotSegment,
}

/// Normalizes a request-target path (without `?query`). `*` (for `OPTIONS *`) passes as is.
pub fn normalize_path(raw: &str) -> Result<NormalizedPath, PathError> {
    if raw == "*" {
        return Ok(NormalizedPath {
            forward: "*".into(),
            matching: "*".into(),
        });
    }
    if raw.len() > MAX_PATH_LEN {
        return Err(PathError::TooLong);
    }
    if !raw.starts_with('/') {
        return Err(PathError::NotAbsolute);
    }
    let forward = remove_dot_segments(&canonical_escapes(raw, is_unreserved)?);
    let matching = matching_form(&forward)?;
    Ok(NormalizedPath { forward, matching })
}

/// The `matching` form of an already-`forward` path.
fn matching_form(forward: &str) -> Result<String, PathError> {
    let decoded = canonical_escapes(forward, |b| {
        b.is_ascii_graphic() && !matches!(b, b'%' | b'?' | b'#')
    })?;
    // Runs of separators collapse; the trailing one is kept.
    let trailing = decoded.ends_with(['/', '\\']);
    let mut collapsed = String::with_capacity(decoded.len());
    for seg in decoded.split(['/', '\\']) {
        // `/a;jsessionid=1/b`, `/a;/b` and `/a%3Bx/b` all name `/a/b` to some servers.
        let seg = seg.split(';').next().unwrap_or("");
        if !seg.is_empty() {
            collapsed.push('/');
            collapsed.push_str(seg);
        }
    }
    if collapsed.is_empty() || trailing {
        collapsed.push('/');
    }
    // `forward` has no dot-segments left, so any here were made by decoding a separator or
    // dropping a parameter (`..;`). Upstreams differ on whether they do either; a path whose
    // meaning depends on that is refused, so an allow rule can never be matched on a form the
    // upstream does not see.
    if collapsed.split('/').any(|seg| seg == "." || seg == "..") {
        return Err(PathError::EncodedDotSegment);
    }
    Ok(collapsed)
}

/// True when `path` is already in `matching` form (normalizing it again would not change it).
/// Lets `decide` re-normalize a path a caller forgot to normalize, at no cost otherwise.
pub(crate) fn is_matching_form(path: &str) -> bool {
    if path == "*" {
        return true;
    }
    if !path.starts_with('/') || path.len() > MAX_PATH_LEN {
        return false;
    }
    let b = path.as_bytes();
    if b.iter()
        .any(|&c| matches!(c, b'%' | b'\\' | b'?' | b';') || c.is_ascii_control())
    {
        // Escapes are rare in matching paths; let the slow path decide.
        return false;
    }
    !(path.contains("//")
        || path.contains("/./")
        || path.contains("/../")
        || path.ends_with("/.")
        || path.ends_with("/.."))
}

fn is_unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')
}

fn hex_val(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// Decodes escapes whose octet satisfies `decode`, upper-cases the hex of the others, and
/// rejects malformed escapes, `%00`, raw control characters and `?`.
fn canonical_escapes(raw: &str, decode: impl Fn(u8) -> bool) -> Result<String, PathError> {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    let bytes = raw.as_bytes();
    let mut out = String::with_capacity(raw.len());
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        if b == b'%' {
            let (hi, lo) = match (bytes.get(i + 1), bytes.get(i + 2)) {
                (Some(&h), Some(&l)) => match (hex_val(h), hex_val(l)) {
                    (Some(h), Some(l)) => (h, l),
                    _ => return Err(PathError::BadEscape(i)),
                },
                _ => return Err(PathError::BadEscape(i)),
            };
            let octet = (hi << 4) | lo;
            if octet == 0 {
                return Err(PathError::EncodedNul);
            }
            if decode(octet) {
                out.push(char::from(octet));
            } else {
                out.push('%');
                out.push(char::from(HEX[usize::from(hi)]));
                out.push(char::from(HEX[usize::from(lo)]));
            }
            i += 3;
            continue;
        }
        if b.is_ascii_control() {
            return Err(PathError::Control(i));
        }
        if b == b'?' {
            return Err(PathError::Query);
        }
        // Copy the whole run up to the next special byte; non-ASCII bytes pass through
        // opaquely (a run never splits a UTF-8 sequence since all specials are ASCII).
        let end = bytes[i..]
            .iter()
            .position(|&c| c == b'%' || c == b'?' || c.is_ascii_control())
            .map_or(bytes.len(), |n| i + n);
        out.push_str(&raw[i..end]);
        i = end;
    }
    Ok(out)
}

/// RFC 3986 §5.2.4 for an absolute path: drops `.` segments, lets `..` pop one segment
/// (never above the root), and keeps the trailing slash a final `.`/`..` implies.
fn remove_dot_segments(path: &str) -> String {
    let rest = path.strip_prefix('/').unwrap_or(path);
    let mut stack: Vec<&str> = Vec::new();
    let mut segments = rest.split('/').peekable();
    while let Some(seg) = segments.next() {
        let last = segments.peek().is_none();
        match seg {
            "." => {}
            ".." => {
                stack.pop();
            }
            s => {
                stack.push(s);
                continue;
            }
        }
        if last {
            stack.push("");
        }
    }
    let mut out = String::with_capacity(path.len());
    for seg in &stack {
        out.push('/');
        out.push_str(seg);
    }
    if out.is_empty() {
        out.push('/');
    }
    out
}

impl fmt::Display for NormalizedPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.forward)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fwd(raw: &str) -> String {
        normalize_path(raw).expect(raw).forward
    }
    fn mat(raw: &str) -> String {
        normalize_path(raw).expect(raw).matching
    }

    #[test]
    fn decoded_separators_forming_dot_segments_are_refused() {
        for raw in [
            "/%2E%2e%2F..",
            "/x/..%2Fadmin",
            "/a%2F..%2F..%2Fb",
            "/a\\..\\b",
            "/a%5C.%5Cb",
        ] {
            assert!(
                matches!(normalize_path(raw), Err(PathError::EncodedDotSegment)),
                "{raw}"
            );
        }
        // Encoded separators alone are fine.
        assert_eq!(mat("/a%2Fb"), "/a/b");
    }

    #[test]
    fn forward_form() {
        let cases = [
            ("/", "/"),
            ("/a/../b", "/b"),
            ("/a/./b", "/a/b"),
            ("//a//b", "//a//b"),
            ("/%61", "/a"),
            ("/%41", "/A"),
            ("/%7e", "/~"),
            ("/%7Euser", "/~user"),
            ("/%2e%2e/secret", "/secret"),
            // `%2F` is reserved: it stays escaped, so `..%2F..` is one ordinary segment.
            ("/a/%2E/b", "/a/b"),
            ("/a%2fb", "/a%2Fb"),
            ("/a/b/..", "/a/"),
            ("/a/b/.", "/a/b/"),
            ("/..", "/"),
            ("/../../x", "/x"),
            ("/a/b/", "/a/b/"),
            ("/a//../b", "/a/b"),
            ("/caf\u{e9}/%c3%a9", "/caf\u{e9}/%C3%A9"),
            ("/a%20b", "/a%20b"),
        ];
        for (raw, want) in cases {
            assert_eq!(fwd(raw), want, "forward of {raw}");
        }
    }

    #[test]
    fn matching_form_cases() {
        let cases = [
            ("//a//b", "/a/b"),
            ("/a%2Fb", "/a/b"),
            ("/a%2fb", "/a/b"),
            ("/a%5Cb", "/a/b"),
            ("/a\\b", "/a/b"),
            ("/a%3Bb", "/a"),
            ("/a;b", "/a"),
            ("/private;jsessionid=1/x", "/private/x"),
            ("/private;/x", "/private/x"),
            ("/private%3Bx/y", "/private/y"),
            ("/a%3Fb", "/a%3Fb"),
            ("/a%23b", "/a%23b"),
            ("/100%25", "/100%25"),
            ("/a%20b", "/a%20b"),
            ("/a/b/", "/a/b/"),
            ("/a///", "/a/"),
            ("/a//../b", "/a/b"),
        ];
        for (raw, want) in cases {
            assert_eq!(mat(raw), want, "matching of {raw}");
        }
    }

    #[test]
    fn matching_is_idempotent_and_detected() {
        for raw in [
            "/a/b",
            "/a%2Fb/../c",
            "//x//y/",
            "/%25/%20",
            "/caf\u{e9}",
            "*",
        ] {
            let m = mat(raw);
            assert_eq!(mat(&m), m, "idempotent for {raw}");
        }
        assert!(is_matching_form("/repos/x/y"));
        assert!(!is_matching_form("/a//b"));
        assert!(!is_matching_form("/a/../b"));
        assert!(!is_matching_form("/a/.."));
        assert!(!is_matching_form("/a%2Fb"));
        assert!(!is_matching_form("a/b"));
        assert!(!is_matching_form("/a;b"));
    }

    #[test]
    fn a_parameter_that_hides_a_dot_segment_is_refused() {
        for raw in ["/public/..;/private/x", "/a/.;/b", "/a/..%3B/b", "/..;x/y"] {
            assert!(
                matches!(normalize_path(raw), Err(PathError::EncodedDotSegment)),
                "{raw}"
            );
        }
    }

    #[test]
    fn options_star() {
        assert_eq!(fwd("*"), "*");
        assert_eq!(normalize_path("**"), Err(PathError::NotAbsolute));
    }

    #[test]
    fn errors() {
        assert_eq!(normalize_path("/%zz"), Err(PathError::BadEscape(1)));
        assert_eq!(normalize_path("/a%2"), Err(PathError::BadEscape(2)));
        assert_eq!(normalize_path("/a%"), Err(PathError::BadEscape(2)));
        assert_eq!(normalize_path("/a%g1"), Err(PathError::BadEscape(2)));
        assert_eq!(normalize_path("/a\0b"), Err(PathError::Control(2)));
        assert_eq!(normalize_path("/a\nb"), Err(PathError::Control(2)));
        assert_eq!(normalize_path("/a\x7fb"), Err(PathError::Control(2)));
        assert_eq!(normalize_path("/a%00b"), Err(PathError::EncodedNul));
        assert_eq!(normalize_path("/a?b"), Err(PathError::Query));
        assert_eq!(normalize_path(""), Err(PathError::NotAbsolute));
        assert_eq!(normalize_path("a/b"), Err(PathError::NotAbsolute));
        assert_eq!(
            normalize_path("http://x/"),
            Err(PathError::NotAbsolute),
            "absolute-form is the caller's job"
        );
        let long = format!("/{}", "a".repeat(MAX_PATH_LEN));
        assert_eq!(normalize_path(&long), Err(PathError::TooLong));
        let ok = format!("/{}", "a".repeat(MAX_PATH_LEN - 1));
        assert!(normalize_path(&ok).is_ok());
    }
}
