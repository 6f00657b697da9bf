//! Reading policy files from disk: which files, in which order, and the policy hash.
//!
//! A policy directory holds `*.toml` (sorted), then AgenShield `*.json` (sorted), then
//! `custom/*.json` (sorted, as AgenShield lays them out). Dotfiles and editor backups are
//! skipped; the order breaks priority ties.

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use super::{Policy, PolicyError, PolicySource};

impl Policy {
    /// Loads `dir/*.toml`, `dir/*.json` and `dir/custom/*.json` (not recursing further).
    pub fn load_dir(dir: &Path) -> Result<Policy, PolicyError> {
        let files = list_dir(dir)?;
        if files.is_empty() {
            return Err(PolicyError::NoFiles {
                dir: dir.display().to_string(),
            });
        }
        load_files(&files)
    }
}

/// The policy files of `dir` in load order: `*.toml`, `*.json`, then `custom/*.json`.
pub fn list_dir(dir: &Path) -> Result<Vec<PathBuf>, PolicyError> {
    let mut files = list(dir, ".toml")?;
    files.extend(list(dir, ".json")?);
    let custom = dir.join("custom");
    if custom.is_dir() {
        files.extend(list(&custom, ".json")?);
    }
    Ok(files)
}

/// Loads the given files in the given order: `*.json` as AgenShield JSON, others as TOML.
pub fn load_files<P: AsRef<Path>>(files: &[P]) -> Result<Policy, PolicyError> {
    Policy::from_sources(&read_sources(files)?)
}

/// The text of each file, named by its path.
pub(crate) fn read_sources<P: AsRef<Path>>(files: &[P]) -> Result<Vec<PolicySource>, PolicyError> {
    files
        .iter()
        .map(|path| {
            let path = path.as_ref();
            let text = std::fs::read_to_string(path).map_err(read_err(path))?;
            Ok(PolicySource {
                name: path.display().to_string(),
                text,
            })
        })
        .collect::<Result<Vec<_>, PolicyError>>()
}

fn read_err(path: &Path) -> impl FnOnce(std::io::Error) -> PolicyError {
    let path = path.to_path_buf();
    move |source| PolicyError::Read { path, source }
}

/// The files in `dir` named `*{ext}`, sorted by name.
fn list(dir: &Path, ext: &str) -> Result<Vec<PathBuf>, PolicyError> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(read_err(dir))? {
        let entry = entry.map_err(read_err(dir))?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else {
            tracing::warn!(file = ?entry.path(), "skipping policy file with a non-UTF-8 name");
            continue;
        };
        if name.len() <= ext.len() || !name.ends_with(ext) || name.starts_with('.') {
            continue;
        }
        let path = entry.path();
        // Follows symlinks: a dangling `x.toml` link is an error, a directory is skipped.
        if std::fs::metadata(&path).map_err(read_err(&path))?.is_file() {
            files.push((name.to_owned(), path));
        }
    }
    files.sort();
    Ok(files.into_iter().map(|(_, p)| p).collect())
}

/// A source's name without its directory, except that files in a `custom` directory keep
/// `custom/`: the policy hash and AgenShield rule ids depend on it.
pub(crate) fn short_name(name: &str) -> String {
    let path = Path::new(name);
    let file = path.file_name().and_then(|n| n.to_str()).unwrap_or(name);
    let in_custom = path
        .parent()
        .and_then(Path::file_name)
        .is_some_and(|d| d == "custom");
    if in_custom {
        format!("custom/{file}")
    } else {
        file.to_owned()
    }
}

/// `sha256:` + 16 hex digits over every source's short name and text.
pub(crate) fn hash_sources(sources: &[PolicySource]) -> String {
    let mut h = Sha256::new();
    for s in sources {
        // Not the directory: the same policy hashes alike wherever it lives.
        h.update(short_name(&s.name).as_bytes());
        h.update([0]);
        h.update(s.text.as_bytes());
        h.update([0]);
    }
    let digest = h.finalize();
    let mut out = String::from("sha256:");
    for b in &digest[..8] {
        out.push_str(&format!("{b:02x}"));
    }
    out
}

#[cfg(test)]
#[path = "load_tests.rs"]
mod tests;
