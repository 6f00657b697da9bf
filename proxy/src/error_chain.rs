//! An error with its causes, for the one line an operator reads: `cannot read /x/ca.pem:
//! Permission denied (os error 13)`. Our error types keep the cause as `source()` and leave it
//! out of `Display`; this puts it back.

/// `err` and each of its sources, joined by `: `.
pub(crate) fn chain(err: &dyn std::error::Error) -> String {
    let mut s = err.to_string();
    let mut cur = err.source();
    while let Some(e) = cur {
        s.push_str(": ");
        s.push_str(&e.to_string());
        cur = e.source();
    }
    s
}
