//! The local cache of the last verified bundle: `bundle.tar.gz`, `bundle.tar.gz.minisig` and
//! `etag`, in a directory only the daemon's user may write (created 0700; one that others
//! may write, or that another user owns, is not used). Each file is written to a temporary
//! name, synced and renamed into place, so a crash leaves the old file or the new one; a
//! bundle and signature that do not belong together (a crash between two renames) simply
//! fail verification at the next start, which then waits for the source. What is loaded
//! is verified again, exactly like a fetched bundle.

use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

const BUNDLE: &str = "bundle.tar.gz";
const SIGNATURE: &str = "bundle.tar.gz.minisig";
const ETAG: &str = "etag";

/// What the cache holds.
#[derive(Debug)]
pub(super) struct Cached {
    pub bundle: Vec<u8>,
    pub signature: Vec<u8>,
    pub etag: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum CacheError {
    #[error("policy cache {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "policy cache {path}: owned by uid {owner} with mode {mode:o}; it must belong to the \
         daemon's user ({uid}) and be writable by no one else"
    )]
    Exposed {
        path: PathBuf,
        owner: u32,
        mode: u32,
        uid: u32,
    },
}

pub(super) struct Cache {
    dir: PathBuf,
}

impl Cache {
    pub(super) fn new(dir: &Path) -> Cache {
        Cache {
            dir: dir.to_path_buf(),
        }
    }

    pub(super) fn dir(&self) -> &Path {
        &self.dir
    }

    /// Creates the directory (0700) if missing and checks who may write it.
    fn prepare(&self) -> Result<(), CacheError> {
        let io = |source| CacheError::Io {
            path: self.dir.clone(),
            source,
        };
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&self.dir)
            .map_err(io)?;
        let meta = std::fs::symlink_metadata(&self.dir).map_err(io)?;
        let uid = nix::unistd::geteuid().as_raw();
        if !meta.is_dir() || meta.uid() != uid || meta.mode() & 0o022 != 0 {
            return Err(CacheError::Exposed {
                path: self.dir.clone(),
                owner: meta.uid(),
                mode: meta.mode() & 0o7777,
                uid,
            });
        }
        Ok(())
    }

    /// The cached bundle, signature and ETag; `None` when there is no cached bundle.
    pub(super) fn load(&self) -> Result<Option<Cached>, CacheError> {
        if !self.dir.exists() {
            return Ok(None);
        }
        self.prepare()?;
        let read = |name: &str| {
            let path = self.dir.join(name);
            match std::fs::read(&path) {
                Ok(b) => Ok(Some(b)),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                Err(source) => Err(CacheError::Io { path, source }),
            }
        };
        let (Some(bundle), Some(signature)) = (read(BUNDLE)?, read(SIGNATURE)?) else {
            return Ok(None);
        };
        let etag = read(ETAG)?.and_then(|e| String::from_utf8(e).ok());
        Ok(Some(Cached {
            bundle,
            signature,
            etag,
        }))
    }

    /// Replaces the cached bundle (and signature, and ETag).
    pub(super) fn store(
        &self,
        bundle: &[u8],
        signature: &[u8],
        etag: Option<&str>,
    ) -> Result<(), CacheError> {
        self.prepare()?;
        self.write(BUNDLE, bundle)?;
        self.write(SIGNATURE, signature)?;
        self.write(ETAG, etag.unwrap_or("").as_bytes())?;
        std::fs::File::open(&self.dir)
            .and_then(|d| d.sync_all())
            .map_err(|source| CacheError::Io {
                path: self.dir.clone(),
                source,
            })
    }

    /// Only the ETag (the same bundle served under a new one).
    pub(super) fn store_etag(&self, etag: Option<&str>) -> Result<(), CacheError> {
        self.prepare()?;
        self.write(ETAG, etag.unwrap_or("").as_bytes())
    }

    fn write(&self, name: &str, bytes: &[u8]) -> Result<(), CacheError> {
        let path = self.dir.join(name);
        let tmp = self.dir.join(format!(".{name}.tmp"));
        let io = |source| CacheError::Io {
            path: path.clone(),
            source,
        };
        let _ = std::fs::remove_file(&tmp);
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(nix::libc::O_NOFOLLOW)
            .open(&tmp)
            .map_err(io)?;
        f.write_all(bytes).and_then(|()| f.sync_all()).map_err(io)?;
        std::fs::rename(&tmp, &path).map_err(io)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stores_and_loads_and_refuses_an_open_directory() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let cache = Cache::new(&tmp.path().join("c"));
        assert!(cache.load().expect("empty").is_none());
        cache.store(b"b", b"s", Some("\"e1\"")).expect("store");
        let got = cache.load().expect("load").expect("cached");
        assert_eq!((got.bundle, got.signature), (b"b".to_vec(), b"s".to_vec()));
        assert_eq!(got.etag.as_deref(), Some("\"e1\""));
        let mode = std::fs::metadata(cache.dir()).expect("dir").mode() & 0o777;
        assert_eq!(mode, 0o700);
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(cache.dir(), std::fs::Permissions::from_mode(0o777))
            .expect("chmod");
        assert!(matches!(cache.load(), Err(CacheError::Exposed { .. })));
    }
}
