//! An error with its causes, for the one line an operator reads: `cannot read /x/ca.pem:
//! Permission denied (os error 13)`. Our error types keep the cause as `source()` and leave it
//! out of `Display`; this puts it back.

/// `err` and each of its sources, joined by `: `. A source whose text its error already
/// showed (many put their cause in their own message as well as in `source()`) is not
/// repeated.
pub fn chain(err: &dyn std::error::Error) -> String {
    let mut s = err.to_string();
    let mut cur = err.source();
    while let Some(e) = cur {
        let text = e.to_string();
        if !s.contains(&text) {
            s.push_str(": ");
            s.push_str(&text);
        }
        cur = e.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("TLS with the upstream: {0}")]
    struct Shows(#[source] std::io::Error);

    #[derive(Debug, thiserror::Error)]
    #[error("cannot read /x/ca.pem")]
    struct Hides(#[source] std::io::Error);

    #[test]
    fn a_cause_is_shown_once() {
        let reset = || std::io::Error::from(std::io::ErrorKind::ConnectionReset);
        let shown = chain(&Shows(reset()));
        assert_eq!(shown.matches("reset").count(), 1, "{shown}");
        assert_eq!(
            chain(&Hides(reset())),
            format!("cannot read /x/ca.pem: {}", reset())
        );
    }
}
