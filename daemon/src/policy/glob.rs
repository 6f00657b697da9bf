//! Path globs: validation against the normalized path form, and compilation with a cache
//! (identical `paths` lists share one `GlobSet`; compiling globs dominates load time).

use std::collections::HashMap;

use globset::{GlobBuilder, GlobSet, GlobSetBuilder};
use toml::Spanned;

/// Compiled glob sets by (case-insensitive, patterns).
#[derive(Default)]
pub(crate) struct GlobCache(HashMap<(bool, String), GlobSet>);

impl GlobCache {
    /// One rule's `paths` as a glob set: `*` within a segment, `**` across segments. The
    /// error is the span of the offending pattern (or list) and a complete reason.
    pub(crate) fn get(
        &mut self,
        list: &Spanned<Vec<Spanned<String>>>,
        case_insensitive: bool,
    ) -> Result<GlobSet, (std::ops::Range<usize>, PathPatternError)> {
        // Unambiguous key: patterns cannot contain control characters (checked below).
        let key = list
            .get_ref()
            .iter()
            .map(|p| p.get_ref().as_str())
            .collect::<Vec<_>>()
            .join("\n");
        let key = (case_insensitive, key);
        if let Some(set) = self.0.get(&key) {
            return Ok(set.clone());
        }
        let mut set = GlobSetBuilder::new();
        for p in list.get_ref() {
            let pattern = p.get_ref();
            check_path_pattern(pattern).map_err(|e| (p.span(), e))?;
            let glob = GlobBuilder::new(pattern)
                .literal_separator(true)
                .backslash_escape(true)
                .case_insensitive(case_insensitive)
                .build()
                .map_err(|e| {
                    let e = PathPatternError::Glob {
                        pattern: pattern.clone(),
                        kind: e.kind().clone(),
                    };
                    (p.span(), e)
                })?;
            set.add(glob);
        }
        let set = set
            .build()
            .map_err(|e| (list.span(), PathPatternError::Set(e)))?;
        self.0.insert(key, set.clone());
        Ok(set)
    }
}

/// Why a `paths` entry is refused (the pattern is policy text, never a secret).
#[derive(Debug, thiserror::Error)]
pub(crate) enum PathPatternError {
    #[error("path pattern {0:?} must start with \"/\"")]
    NoLeadingSlash(String),
    #[error("path pattern {0:?} contains a control character")]
    ControlCharacter(String),
    #[error("path pattern {0:?} contains \"//\"; request paths have runs of \"/\" collapsed")]
    DoubleSlash(String),
    #[error(
        "path pattern {0:?} contains a \".\" or \"..\" segment; request paths have them resolved"
    )]
    DotSegment(String),
    #[error("path pattern {pattern:?} contains %{hex}; request paths are matched decoded, write {decoded:?} instead")]
    NeedlessEscape {
        pattern: String,
        hex: String,
        decoded: char,
    },
    #[error("path pattern {0:?}: write percent-escapes with uppercase hex")]
    LowercaseEscape(String),
    #[error("path pattern {0:?} has an invalid percent-escape")]
    InvalidEscape(String),
    #[error("invalid path glob {pattern:?}: {kind}")]
    Glob {
        pattern: String,
        kind: globset::ErrorKind,
    },
    #[error("invalid path globs: {0}")]
    Set(globset::Error),
}

/// Rejects path patterns that could never match a normalized (`matching`) path, which would
/// silently make a deny rule useless.
pub(crate) fn check_path_pattern(p: &str) -> Result<(), PathPatternError> {
    let owned = || p.to_owned();
    if !p.starts_with('/') {
        return Err(PathPatternError::NoLeadingSlash(owned()));
    }
    if p.bytes().any(|b| b.is_ascii_control()) {
        return Err(PathPatternError::ControlCharacter(owned()));
    }
    if p.contains("//") {
        return Err(PathPatternError::DoubleSlash(owned()));
    }
    if p.split('/').any(|seg| seg == "." || seg == "..") {
        return Err(PathPatternError::DotSegment(owned()));
    }
    let b = p.as_bytes();
    for (i, _) in p.match_indices('%') {
        let hex = b
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .filter(|h| h.bytes().all(|c| c.is_ascii_hexdigit()));
        let octet = hex.and_then(|h| u8::from_str_radix(h, 16).ok());
        match octet {
            Some(o) if o.is_ascii_graphic() && o != b'%' => {
                return Err(PathPatternError::NeedlessEscape {
                    pattern: owned(),
                    hex: hex.unwrap_or_default().to_owned(),
                    decoded: char::from(o),
                })
            }
            Some(_) if hex.is_some_and(|h| h.bytes().any(|c| c.is_ascii_lowercase())) => {
                return Err(PathPatternError::LowercaseEscape(owned()))
            }
            Some(_) => {}
            None => return Err(PathPatternError::InvalidEscape(owned())),
        }
    }
    Ok(())
}
