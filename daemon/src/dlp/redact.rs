//! What a record or a log line may show of text the agent wrote (a URL, a host, a DNS name)
//! once a credential was found in it: the text with each credential (or the encoded run it
//! was decoded from) replaced by `[credential]`.

use super::detector::{Detector, Findings};

/// `text` with every credential the detector finds in it replaced; `None` when it finds
/// none.
pub(crate) fn redacted(d: &Detector, text: &str) -> Option<String> {
    let mut found = Findings::default();
    d.scan(text.as_bytes(), &mut found);
    if found.is_empty() {
        return None;
    }
    let mut ranges: Vec<_> = found.iter().map(|f| f.range.clone()).collect();
    ranges.sort_by_key(|r| r.start);
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(text.len());
    let mut at = 0;
    for r in ranges {
        if r.end <= at {
            continue;
        }
        let start = r.start.max(at);
        out.extend_from_slice(&bytes[at..start]);
        out.extend_from_slice(b"[credential]");
        at = r.end.min(bytes.len());
    }
    out.extend_from_slice(&bytes[at..]);
    Some(String::from_utf8_lossy(&out).into_owned())
}

/// `text` as a record may show it: redacted when it holds a credential.
pub(crate) fn shown(text: &str) -> std::borrow::Cow<'_, str> {
    match redacted(super::detector(), text) {
        Some(r) => std::borrow::Cow::Owned(r),
        None => std::borrow::Cow::Borrowed(text),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_are_replaced_and_the_rest_kept() {
        let d = Detector::new();
        let token = crate::dlp::testgen::value(crate::dlp::Format::GitHubToken, 9);
        let text = format!("/echo/notes/{token}?page=2");
        let shown = redacted(&d, &text).expect("found");
        assert_eq!(shown, "/echo/notes/[credential]?page=2");
        assert!(redacted(&d, "/echo/plain?page=2").is_none());
        let enc: String = token.bytes().map(|b| format!("%{b:02X}")).collect();
        let shown = redacted(&d, &format!("/q?t={enc}&x=1")).expect("found");
        assert!(
            !shown.contains(&enc) && shown.contains("[credential]"),
            "{shown}"
        );
    }
}
