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
    ) -> Result<GlobSet, (std::ops::Range<usize>, String)> {
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
            check_path_pattern(pattern).map_err(|m| (p.span(), m))?;
            let glob = GlobBuilder::new(pattern)
                .literal_separator(true)
                .backslash_escape(true)
                .case_insensitive(case_insensitive)
                .build()
                .map_err(|e| {
                    let msg = format!("invalid path glob {pattern:?}: {}", e.kind());
                    (p.span(), msg)
                })?;
            set.add(glob);
        }
        let set = set
            .build()
            .map_err(|e| (list.span(), format!("invalid path globs: {e}")))?;
        self.0.insert(key, set.clone());
        Ok(set)
    }
}

/// Rejects path patterns that could never match a normalized (`matching`) path, which would
/// silently make a deny rule useless.
pub(crate) fn check_path_pattern(p: &str) -> Result<(), String> {
    if !p.starts_with('/') {
        return Err(format!("path pattern {p:?} must start with \"/\""));
    }
    if p.bytes().any(|b| b.is_ascii_control()) {
        return Err(format!("path pattern {p:?} contains a control character"));
    }
    if p.contains("//") {
        return Err(format!(
            "path pattern {p:?} contains \"//\"; request paths have runs of \"/\" collapsed"
        ));
    }
    if p.split('/').any(|seg| seg == "." || seg == "..") {
        return Err(format!("path pattern {p:?} contains a \".\" or \"..\" segment; request paths have them resolved"));
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
                return Err(format!(
                    "path pattern {p:?} contains %{}; request paths are matched decoded, write {:?} instead",
                    hex.unwrap_or_default(),
                    char::from(o)
                ))
            }
            Some(_) if hex.is_some_and(|h| h.bytes().any(|c| c.is_ascii_lowercase())) => {
                return Err(format!("path pattern {p:?}: write percent-escapes with uppercase hex"))
            }
            Some(_) => {}
            None => return Err(format!("path pattern {p:?} has an invalid percent-escape")),
        }
    }
    Ok(())
}
