//! The bundle format: a gzip tar of a policy directory (`*.toml`, `*.json`, `custom/*.json`)
//! and a `manifest.toml`. Read in memory, never unpacked to disk, and only after its
//! signature verified: what it unpacks to is capped, every entry must be a regular file (or
//! the `custom` directory) at a plain relative path, and a file that is not policy, a
//! duplicate or a missing manifest refuses the whole bundle.

use std::io::{Read, Write};
use std::path::{Component, Path};

use super::manifest::{Manifest, ManifestError, MANIFEST};
use crate::policy::PolicySource;

/// Entries one bundle may hold at most.
const MAX_ENTRIES: usize = 4096;

/// A bundle's content, checked.
#[derive(Debug, Clone)]
pub struct Bundle {
    pub manifest: Manifest,
    /// (name inside the bundle, text), in load order: `*.toml`, `*.json`, `custom/*.json`,
    /// each sorted by name.
    pub files: Vec<(String, String)>,
}

/// Why bytes are not a bundle.
#[derive(Debug, thiserror::Error)]
pub enum BundleError {
    #[error("unpacks to more than {0} bytes")]
    TooLarge(u64),
    #[error("not a gzip file: {0}")]
    Gzip(std::io::Error),
    #[error("not a tar archive: {0}")]
    Tar(std::io::Error),
    #[error("entry {0:?}: a path outside the bundle or not plain (absolute, `..`)")]
    Path(String),
    #[error("entry {name:?}: a {kind} (only regular files and the custom/ directory)")]
    NotAFile { name: String, kind: String },
    #[error("entry {0:?}: not a policy file (*.toml, *.json, custom/*.json) or manifest.toml")]
    NotPolicy(String),
    #[error("entry {0:?} appears twice")]
    Duplicate(String),
    #[error("entry {0:?} is not UTF-8 text")]
    NotText(String),
    #[error("more than {MAX_ENTRIES} entries")]
    TooManyEntries,
    #[error("no manifest.toml")]
    NoManifest,
    #[error(transparent)]
    Manifest(#[from] ManifestError),
    #[error("writing the bundle: {0}")]
    Write(std::io::Error),
}

impl Bundle {
    /// Parses `gz` (already verified), unpacking at most `max_unpacked` bytes.
    pub fn read(gz: &[u8], max_unpacked: u64) -> Result<Bundle, BundleError> {
        let mut tar = Vec::new();
        flate2::read::GzDecoder::new(gz)
            .take(max_unpacked.saturating_add(1))
            .read_to_end(&mut tar)
            .map_err(BundleError::Gzip)?;
        if tar.len() as u64 > max_unpacked {
            return Err(BundleError::TooLarge(max_unpacked));
        }
        let mut archive = tar::Archive::new(&tar[..]);
        let mut manifest = None;
        let mut files: Vec<(String, String)> = Vec::new();
        for (n, entry) in archive.entries().map_err(BundleError::Tar)?.enumerate() {
            if n >= MAX_ENTRIES {
                return Err(BundleError::TooManyEntries);
            }
            let mut entry = entry.map_err(BundleError::Tar)?;
            let raw = entry.path().map_err(BundleError::Tar)?.into_owned();
            let name = plain_name(&raw)?;
            let kind = entry.header().entry_type();
            if kind.is_dir() {
                if name.is_empty() || name == "custom" {
                    continue;
                }
                return Err(BundleError::NotPolicy(name));
            }
            if !(kind.is_file() || kind == tar::EntryType::Continuous) {
                return Err(BundleError::NotAFile {
                    name,
                    kind: format!("{kind:?}").to_lowercase(),
                });
            }
            let mut bytes = Vec::new();
            entry.read_to_end(&mut bytes).map_err(BundleError::Tar)?;
            let text = String::from_utf8(bytes).map_err(|_| BundleError::NotText(name.clone()))?;
            if name == MANIFEST {
                if manifest.is_some() {
                    return Err(BundleError::Duplicate(name));
                }
                manifest = Some(Manifest::parse(&text)?);
                continue;
            }
            if order(&name).is_none() {
                return Err(BundleError::NotPolicy(name));
            }
            if files.iter().any(|(f, _)| *f == name) {
                return Err(BundleError::Duplicate(name));
            }
            files.push((name, text));
        }
        let manifest = manifest.ok_or(BundleError::NoManifest)?;
        files.sort_by(|(a, _), (b, _)| order(a).cmp(&order(b)).then_with(|| a.cmp(b)));
        Ok(Bundle { manifest, files })
    }

    /// The files as policy sources, named `bundle:rREVISION/NAME` (errors then say where).
    pub fn sources(&self) -> Vec<PolicySource> {
        self.files
            .iter()
            .map(|(name, text)| PolicySource {
                name: format!("bundle:r{}/{name}", self.manifest.revision),
                text: text.clone(),
            })
            .collect()
    }

    /// Writes the bundle as a gzip tar: the manifest first, then the files, every entry a
    /// regular file owned by 0:0, mode 0644, dated `created_at` (so the same directory and
    /// manifest give the same bytes).
    pub fn write(&self, out: impl Write) -> Result<(), BundleError> {
        if i64::try_from(self.manifest.revision).is_err() {
            return Err(ManifestError::RevisionTooLarge(self.manifest.revision).into());
        }
        let mtime = time::OffsetDateTime::parse(
            &self.manifest.created_at,
            &time::format_description::well_known::Rfc3339,
        )
        .map(|t| t.unix_timestamp().max(0) as u64)
        .unwrap_or(0);
        let gz = flate2::write::GzEncoder::new(out, flate2::Compression::default());
        let mut tar = tar::Builder::new(gz);
        let manifest = self.manifest.render();
        let entries = std::iter::once((MANIFEST, manifest.as_str()))
            .chain(self.files.iter().map(|(n, t)| (n.as_str(), t.as_str())));
        for (name, text) in entries {
            let mut h = tar::Header::new_ustar();
            h.set_entry_type(tar::EntryType::Regular);
            h.set_size(text.len() as u64);
            h.set_mode(0o644);
            h.set_uid(0);
            h.set_gid(0);
            h.set_mtime(mtime);
            tar.append_data(&mut h, name, text.as_bytes())
                .map_err(BundleError::Write)?;
        }
        tar.into_inner()
            .and_then(|gz| gz.finish())
            .map_err(BundleError::Write)?
            .flush()
            .map_err(BundleError::Write)
    }
}

/// The entry's path as `a/b`, refusing anything but plain relative components (`./` is
/// dropped, as `tar -C dir .` writes it).
fn plain_name(path: &Path) -> Result<String, BundleError> {
    let mut parts = Vec::new();
    for c in path.components() {
        match c {
            Component::Normal(p) => match p.to_str() {
                Some(p) => parts.push(p),
                None => return Err(BundleError::Path(path.display().to_string())),
            },
            Component::CurDir => {}
            Component::ParentDir | Component::RootDir | Component::Prefix(_) => {
                return Err(BundleError::Path(path.display().to_string()))
            }
        }
    }
    Ok(parts.join("/"))
}

/// Where a policy file sorts (the load order of a directory), or `None` for a name that is
/// not a policy file.
fn order(name: &str) -> Option<u8> {
    let (dir, file) = match name.split_once('/') {
        Some((dir, file)) => (Some(dir), file),
        None => (None, name),
    };
    if file.is_empty() || file.starts_with('.') || file.contains('/') {
        return None;
    }
    match dir {
        None if file.len() > 5 && file.ends_with(".toml") => Some(0),
        None if file.len() > 5 && file.ends_with(".json") => Some(1),
        Some("custom") if file.len() > 5 && file.ends_with(".json") => Some(2),
        _ => None,
    }
}

#[cfg(test)]
#[path = "bundle_tests.rs"]
mod tests;
