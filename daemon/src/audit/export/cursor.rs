//! A sink's persisted position: the last record it shipped (its `seq` and `hash`) and where
//! that record ends (the file's inode and the byte offset after its line). Written whole to
//! a temporary file and renamed over the old one, so a crash leaves the old cursor or the
//! new one, never half of either; fsynced at most once a second (`sink.rs`).
//!
//! The inode and offset find the place fast; the `seq` and `hash` are the truth: a cursor
//! whose offset does not end at a line with that hash (the file was replaced, cut, or the
//! inode reused) is looked up by `seq` and `hash` over the kept files instead (`reader.rs`).

use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// Where a sink stands. `seq` 0 with an empty hash: nothing shipped yet.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(crate) struct Cursor {
    pub inode: u64,
    pub offset: u64,
    pub seq: u64,
    pub hash: String,
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum CursorError {
    #[error("cursor {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cursor {path} is not a cursor: {source}")]
    Malformed {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
}

/// The cursor file at `path`; `None` if there is none (a new sink).
pub(crate) fn load(path: &Path) -> Result<Option<Cursor>, CursorError> {
    match std::fs::read(path) {
        Ok(bytes) => {
            serde_json::from_slice(&bytes)
                .map(Some)
                .map_err(|source| CursorError::Malformed {
                    path: path.to_path_buf(),
                    source,
                })
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(CursorError::Io {
            path: path.to_path_buf(),
            source,
        }),
    }
}

/// Replaces the cursor at `path` with `c` (temporary file, then rename); `fsync`: the file
/// and its directory reach the disk before this returns.
pub(crate) fn save(path: &Path, c: &Cursor, fsync: bool) -> Result<(), CursorError> {
    let io_err = |source| CursorError::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o640)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .open(&tmp)
        .map_err(io_err)?;
    let bytes = serde_json::to_vec(c).unwrap_or_default();
    f.write_all(&bytes).map_err(io_err)?;
    if fsync {
        f.sync_data().map_err(io_err)?;
    }
    std::fs::rename(&tmp, path).map_err(io_err)?;
    if fsync {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::File::open(dir)
                .and_then(|d| d.sync_all())
                .map_err(io_err)?;
        }
    }
    Ok(())
}

/// The default cursor of sink `name` for the log at `log`: `<log>.export-<name>.cursor`.
pub(crate) fn default_path(log: &Path, name: &str) -> PathBuf {
    let mut p = log.as_os_str().to_owned();
    p.push(format!(".export-{name}.cursor"));
    PathBuf::from(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cursor_survives_a_save_and_a_load_and_replaces_the_old_one() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = default_path(&dir.path().join("a.jsonl"), "siem");
        assert!(path.ends_with("a.jsonl.export-siem.cursor"));
        assert_eq!(load(&path).expect("none"), None);
        let c = Cursor {
            inode: 7,
            offset: 1234,
            seq: 9,
            hash: "ab".repeat(32),
        };
        save(&path, &c, true).expect("save");
        save(
            &path,
            &Cursor {
                seq: 10,
                ..c.clone()
            },
            false,
        )
        .expect("save");
        assert_eq!(load(&path).expect("load").expect("some").seq, 10);
        std::fs::write(&path, "{").expect("cut");
        assert!(load(&path).is_err());
    }
}
