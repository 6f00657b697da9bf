//! A secret's value: zeroized when dropped and printed as `[redacted]`, so neither a log
//! line, a `{:?}` nor a panic message can carry one. (Its name is `policy::SecretName`.)

use std::fmt;

use zeroize::Zeroizing;

/// Shortest value accepted: shorter ones would make the leak guard match ordinary text.
pub(crate) const MIN_VALUE_LEN: usize = 8;
/// Longest value accepted (it must fit in a request header).
pub const MAX_VALUE_LEN: usize = 8 * 1024;
/// A secret value. Not `Clone`: share it behind an `Arc`, so there is one copy to zeroize.
pub struct SecretValue(Zeroizing<Vec<u8>>);

/// Why a value of `len` bytes is refused: its real size, and the limit.
pub fn too_long(len: usize) -> String {
    format!("the value is {len} bytes; at most {MAX_VALUE_LEN} fit in a request header")
}

/// Why bytes cannot be a secret value. Carries sizes and positions, never the bytes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidSecretValue {
    #[error(
        "the value is {len} bytes; at least {MIN_VALUE_LEN} are needed so the leak \
         guard can tell it from ordinary text"
    )]
    TooShort { len: usize },
    #[error("{}", too_long(*len))]
    TooLong { len: usize },
    /// `byte` counts from 1.
    #[error(
        "byte {byte} of the value is not printable ASCII (control characters, newlines \
         and non-ASCII cannot be sent in a header)"
    )]
    NotPrintable { byte: usize },
    #[error("the value starts or ends with a space (HTTP would trim it)")]
    EdgeSpace,
}

/// Bytes read past a value that did not fit, only counted (at most this many).
const MAX_COUNTED: usize = 64 * 1024 * 1024;

/// The size of a value of which `kept` was read and `rest` is what is left, its final
/// newline (or CRLF) left out as the readers leave it out; the rest is read and dropped.
/// For the error that says how long a refused value really is, not how much was read.
pub fn full_len(kept: &[u8], rest: &mut impl std::io::Read) -> usize {
    let mut buf = Zeroizing::new([0u8; 8192]);
    let (mut total, mut tail) = (kept.len(), [0u8; 2]);
    let keep_tail = |tail: &mut [u8; 2], bytes: &[u8]| match bytes {
        [.., a, b] => *tail = [*a, *b],
        [b] => *tail = [tail[1], *b],
        [] => {}
    };
    keep_tail(&mut tail, kept);
    while total < MAX_COUNTED {
        match rest.read(&mut buf[..]) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                total += n;
                keep_tail(&mut tail, &buf[..n]);
            }
        }
    }
    match tail {
        [b'\r', b'\n'] => total - 2,
        [_, b'\n'] => total - 1,
        _ => total,
    }
}

impl SecretValue {
    /// Checks that `bytes` can be injected into a header and is long enough to be recognised
    /// reliably: printable ASCII (space allowed inside), no leading or trailing space,
    /// `MIN_VALUE_LEN..=MAX_VALUE_LEN` bytes. The error never quotes the value.
    pub fn new(bytes: Vec<u8>) -> Result<SecretValue, InvalidSecretValue> {
        let bytes = Zeroizing::new(bytes);
        let len = bytes.len();
        if len < MIN_VALUE_LEN {
            return Err(InvalidSecretValue::TooShort { len });
        }
        if len > MAX_VALUE_LEN {
            return Err(InvalidSecretValue::TooLong { len });
        }
        if let Some(pos) = bytes.iter().position(|b| !(0x20..=0x7e).contains(b)) {
            return Err(InvalidSecretValue::NotPrintable { byte: pos + 1 });
        }
        if bytes.first() == Some(&b' ') || bytes.last() == Some(&b' ') {
            return Err(InvalidSecretValue::EdgeSpace);
        }
        Ok(SecretValue(bytes))
    }

    /// The bytes, for injection and matching only. Never format or log them.
    pub(crate) fn expose(&self) -> &[u8] {
        &self.0
    }
}

impl fmt::Debug for SecretValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[redacted]")
    }
}

impl fmt::Display for SecretValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[redacted]")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn value_never_formats_its_bytes() {
        let v = SecretValue::new(b"sk-live-0123456789".to_vec()).expect("valid");
        assert_eq!(format!("{v:?}"), "[redacted]");
        assert_eq!(format!("{v}"), "[redacted]");
        assert_eq!(format!("{:?}", Some(&v)), "Some([redacted])");
        assert_eq!(v.expose(), b"sk-live-0123456789");
    }

    #[test]
    fn value_rules_are_explained_without_quoting_the_value() {
        for (bad, why) in [
            (&b"short"[..], "at least 8"),
            (b"has\nnewline-in-it", "not printable"),
            (b" leading-space", "space"),
            (b"non-ascii-\xc3\xa9-value", "not printable"),
        ] {
            let err = SecretValue::new(bad.to_vec())
                .expect_err("must be refused")
                .to_string();
            assert!(err.contains(why), "{err}");
            let text = String::from_utf8_lossy(bad);
            assert!(!err.contains(text.trim()), "error quotes the value: {err}");
        }
        assert!(SecretValue::new(vec![b'x'; MAX_VALUE_LEN + 1]).is_err());
    }

    #[test]
    fn value_errors_read_as_before() {
        let text = |b: &[u8]| {
            SecretValue::new(b.to_vec())
                .expect_err("refused")
                .to_string()
        };
        assert_eq!(
            text(b"short"),
            "the value is 5 bytes; at least 8 are needed so the leak guard can tell it from \
             ordinary text"
        );
        assert_eq!(
            text(b"abc\ndefgh"),
            "byte 4 of the value is not printable ASCII (control characters, newlines and \
             non-ASCII cannot be sent in a header)"
        );
        assert_eq!(
            text(b"abcdefgh "),
            "the value starts or ends with a space (HTTP would trim it)"
        );
        assert_eq!(text(&[b'x'; 9000]), too_long(9000));
    }

    /// Issue 34: a 9000-byte secret was reported as "8195 bytes" (what had been read).
    #[test]
    fn a_value_too_long_is_reported_at_its_full_size() {
        let mut input: &[u8] = &[b'x'; 9000 - 100];
        assert_eq!(full_len(&[b'x'; 100], &mut input), 9000);
        let mut nl: &[u8] = b"xxxx\n";
        assert_eq!(full_len(b"ab", &mut nl), 6);
        let mut crlf: &[u8] = b"\r\n";
        assert_eq!(full_len(b"abc", &mut crlf), 3);
        let mut none: &[u8] = b"";
        assert_eq!(full_len(b"abc\n", &mut none), 3);
        assert!(too_long(9000).starts_with("the value is 9000 bytes; at most 8192"));
        assert!(SecretValue::new(b"with inner space".to_vec()).is_ok());
    }
}
