//! Load errors. Each renders as one line naming the file (and `line:column` when known), so an
//! operator can jump straight to the mistake from a log line or a CLI message.

use std::fmt;
use std::ops::Range;
use std::path::PathBuf;

/// Where in which policy source something is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Location {
    /// The source's name (its path for files on disk).
    pub file: String,
    /// 1-based line and column (column counted in bytes), when known.
    pub position: Option<(usize, usize)>,
}

impl Location {
    /// The whole file, no position.
    pub fn file(file: &str) -> Location {
        Location {
            file: file.to_owned(),
            position: None,
        }
    }

    /// The position of byte offset `span.start` in `text`.
    pub(crate) fn at(file: &str, text: &str, span: Range<usize>) -> Location {
        Location {
            file: file.to_owned(),
            position: Some(line_col(text, span.start)),
        }
    }
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.position {
            Some((line, column)) => write!(f, "{}:{line}:{column}", self.file),
            None => f.write_str(&self.file),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("no policy files in {dir}")]
    NoFiles { dir: String },
    /// TOML syntax or schema error (unknown key, wrong type, missing required key).
    #[error("{at}: {message}")]
    Parse { at: Location, message: String },
    /// A file-level semantic error (e.g. unsupported `version`).
    #[error("{at}: {message}")]
    Invalid { at: Location, message: String },
    /// A semantic error inside one rule.
    #[error("{at}: rule `{rule}`: {message}")]
    Rule {
        at: Location,
        rule: String,
        message: String,
    },
    #[error("{at}: duplicate rule id `{id}` (first defined at {first})")]
    DuplicateId {
        at: Location,
        first: Location,
        id: String,
    },
    /// A rule binds a secret the store does not hold.
    #[error("{at}: rule `{rule}` uses secret {secret:?}, which is not in the store (add it with `agenshield proxy ctl secrets set {secret}`)")]
    MissingSecret {
        at: Location,
        rule: String,
        secret: String,
    },
    /// Two files set a policy-wide key (`default`, `mode`) to different values.
    #[error("{0}")]
    Conflict(Box<Conflict>),
    /// Several rules are wrong: every one, one per line, in file order.
    #[error("{}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("\n"))]
    Several(Vec<PolicyError>),
}

/// Details of [`PolicyError::Conflict`] (boxed: keeps `Result<_, PolicyError>` small).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("conflicting `{key}`: {first} sets \"{first_value}\" but {second} sets \"{second_value}\"")]
pub struct Conflict {
    pub key: &'static str,
    pub first: Location,
    pub first_value: &'static str,
    pub second: Location,
    pub second_value: &'static str,
}

impl PolicyError {
    /// `None` for no errors, the error itself for one, `Several` for more.
    pub(crate) fn all(mut errors: Vec<PolicyError>) -> Option<PolicyError> {
        match errors.len() {
            0 => None,
            1 => errors.pop(),
            _ => Some(PolicyError::Several(errors)),
        }
    }

    /// The source the error is in, when it is about one.
    pub fn location(&self) -> Option<&Location> {
        match self {
            PolicyError::Parse { at, .. }
            | PolicyError::Invalid { at, .. }
            | PolicyError::Rule { at, .. }
            | PolicyError::DuplicateId { at, .. }
            | PolicyError::MissingSecret { at, .. } => Some(at),
            PolicyError::Conflict(c) => Some(&c.second),
            PolicyError::Several(all) => all.first().and_then(PolicyError::location),
            PolicyError::Read { .. } | PolicyError::NoFiles { .. } => None,
        }
    }
}

/// 1-based line and column (in bytes) of byte offset `at` in `text`.
pub(crate) fn line_col(text: &str, at: usize) -> (usize, usize) {
    let at = at.min(text.len());
    let before = &text.as_bytes()[..at];
    let line = before.iter().filter(|&&b| b == b'\n').count() + 1;
    let column = before
        .iter()
        .rposition(|&b| b == b'\n')
        .map_or(at, |nl| at - nl - 1)
        + 1;
    (line, column)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions() {
        let text = "a\nbc\n\nd";
        assert_eq!(line_col(text, 0), (1, 1));
        assert_eq!(line_col(text, 2), (2, 1));
        assert_eq!(line_col(text, 3), (2, 2));
        assert_eq!(line_col(text, 6), (4, 1));
        assert_eq!(line_col(text, 99), (4, 2));
        let at = Location::at("f.toml", text, 3..4);
        assert_eq!(at.to_string(), "f.toml:2:2");
        assert_eq!(Location::file("f.toml").to_string(), "f.toml");
    }
}
