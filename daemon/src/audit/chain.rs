//! The hash chain. Every line ends `,"prev":"P","hash":"H"}` where `H` is the SHA-256 (hex)
//! of the line's bytes up to, not including, `,"hash":` and `P` is the previous line's `H`.
//! Editing a line breaks its own hash; deleting or reordering lines breaks the next line's
//! `prev`; rewriting the whole tail is detectable against a head hash kept elsewhere (`ctl
//! audit verify` prints it; the daemon logs it when it stops).

use sha2::{Digest, Sha256};

/// `prev` of the first record ever written (no earlier line).
pub(crate) const GENESIS: &str = "0000000000000000000000000000000000000000000000000000000000000000";

const HASH_KEY: &str = ",\"hash\":\"";
const HEX_LEN: usize = 64;

pub(crate) fn hex_sha256(bytes: &[u8]) -> String {
    let digest = Sha256::digest(bytes);
    let mut out = String::with_capacity(HEX_LEN);
    for b in digest {
        out.push(char::from(b"0123456789abcdef"[usize::from(b >> 4)]));
        out.push(char::from(b"0123456789abcdef"[usize::from(b & 15)]));
    }
    out
}

/// Appends `,"prev":"P","hash":"H"}` and a newline to `buf`, sealing the line that starts at
/// `start`: a JSON object without its closing brace (the lines before it are untouched, so a
/// batch is sealed where it is built). Returns `H`.
pub(crate) fn seal_from(buf: &mut Vec<u8>, start: usize, prev: &str) -> String {
    buf.extend_from_slice(b",\"prev\":\"");
    buf.extend_from_slice(prev.as_bytes());
    buf.push(b'"');
    let hash = hex_sha256(&buf[start..]);
    buf.extend_from_slice(HASH_KEY.as_bytes());
    buf.extend_from_slice(hash.as_bytes());
    buf.extend_from_slice(b"\"}\n");
    hash
}

/// A line's stated hash and whether its content matches it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Sealed<'a> {
    pub hash: &'a str,
    pub intact: bool,
}

/// Reads the seal of `line` (without its newline); `None` if it has none.
pub(crate) fn unseal(line: &str) -> Option<Sealed<'_>> {
    let hash = stated_hash(line)?;
    let body = &line[..line.len() - (HASH_KEY.len() + HEX_LEN + 2)];
    Some(Sealed {
        hash,
        intact: hex_sha256(body.as_bytes()) == hash,
    })
}

/// The hash `line` (without its newline) states in its seal, not checked against its
/// content (for a reader that only needs to know which record it stands after; `ctl audit
/// verify` and the writer's resume use [`unseal`]).
pub(crate) fn stated_hash(line: &str) -> Option<&str> {
    let body_end = line.len().checked_sub(HASH_KEY.len() + HEX_LEN + 2)?;
    let tail = line.get(body_end..)?;
    let hash = tail.strip_prefix(HASH_KEY)?.strip_suffix("\"}")?;
    (hash.len() == HEX_LEN && hash.bytes().all(|b| b.is_ascii_hexdigit())).then_some(hash)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sealed_line_verifies_and_any_edit_breaks_it() {
        let mut line = b"{\"v\":1,\"seq\":1".to_vec();
        let h = seal_from(&mut line, 0, GENESIS);
        let text = std::str::from_utf8(&line).expect("utf8").trim_end();
        let s = unseal(text).expect("sealed");
        assert_eq!((s.hash, s.intact), (h.as_str(), true));
        let edited = text.replace("\"seq\":1", "\"seq\":2");
        assert!(!unseal(&edited).expect("still shaped").intact);
        assert_eq!(unseal("{\"v\":1}"), None);
        assert_eq!(unseal(""), None);
        assert_eq!(unseal(&text[..text.len() - 1]), None, "truncated");
    }

    #[test]
    fn sealing_a_line_inside_a_batch_seals_only_that_line() {
        let mut alone = b"{\"v\":1,\"seq\":2".to_vec();
        let h_alone = seal_from(&mut alone, 0, GENESIS);
        let mut batch = b"{\"earlier\":true}\n".to_vec();
        let start = batch.len();
        batch.extend_from_slice(b"{\"v\":1,\"seq\":2");
        let h = seal_from(&mut batch, start, GENESIS);
        assert_eq!(h, h_alone);
        assert_eq!(&batch[start..], &alone[..]);
    }
}
