//! Placeholders: what the agent holds instead of a secret. `agenshield:secret:NAME` goes
//! where the key would (an environment variable, a config file); the proxy swaps it for the
//! real value in the headers of a request whose rule binds NAME, and refuses it anywhere else.

use crate::policy::{is_name_byte, SecretName};

pub(crate) const PREFIX: &str = "agenshield:secret:";

pub(crate) fn placeholder(name: &SecretName) -> String {
    format!("{PREFIX}{name}")
}

/// A placeholder found in a complete text: where, and the name it carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Found {
    pub range: std::ops::Range<usize>,
    /// As written; not necessarily a valid or known name.
    pub name: String,
}

/// Every placeholder in `text`, any name (a name runs while bytes are name bytes).
pub(crate) fn find_all(text: &[u8]) -> Vec<Found> {
    let finder = memchr::memmem::Finder::new(PREFIX);
    let mut out = Vec::new();
    let mut at = 0;
    while let Some(i) = finder.find(&text[at..]) {
        let start = at + i;
        let name_start = start + PREFIX.len();
        let len = text[name_start..]
            .iter()
            .take_while(|b| is_name_byte(**b))
            .count();
        let end = name_start + len;
        out.push(Found {
            range: start..end,
            name: String::from_utf8_lossy(&text[name_start..end]).into_owned(),
        });
        at = end.max(start + 1);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_names_to_their_end() {
        let f = find_all(b"Bearer agenshield:secret:openai, x agenshield:secret:gh-2.");
        assert_eq!(f.len(), 2);
        assert_eq!(f[0].name, "openai");
        assert_eq!(f[1].name, "gh-2");
        assert_eq!(
            &b"Bearer agenshield:secret:openai"[f[0].range.clone()],
            b"agenshield:secret:openai"
        );
        assert_eq!(find_all(b"agenshield:secret:")[0].name, "");
        assert!(find_all(b"nothing here").is_empty());
    }
}
