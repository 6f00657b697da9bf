//! The default secret store: one file per secret in the vault directory.
//!
//! The directory is 0700 and the files 0600, both owned by the daemon's user; anything else
//! (a loosened mode, another owner, a symlink) is refused rather than used, the way the CA
//! key is. Writes go to a temporary file that is synced and renamed over the old one, then
//! the directory is synced: a crash leaves the old value or the new one, never half of one.
//! Each value is the file's exact bytes (one trailing newline, from an editor, is ignored).

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use zeroize::Zeroizing;

use crate::secrets::store::value::MAX_VALUE_LEN;
use crate::secrets::store::{SecretStore, StoreError, StoreLocation, StoreResult, StoredSecret};
use crate::secrets::{SecretName, SecretValue};

const SUFFIX: &str = ".secret";

pub struct FileStore {
    dir: PathBuf,
    uid: u32,
}

impl FileStore {
    /// Opens the vault at `dir`, creating it (0700) if missing.
    pub(crate) fn open(dir: &Path) -> Result<FileStore, StoreError> {
        if let Some(store) = Self::open_existing(dir)? {
            return Ok(store);
        }
        if let Some(parent) = dir.parent() {
            fs::create_dir_all(parent).map_err(StoreError::io(parent))?;
        }
        fs::DirBuilder::new()
            .mode(0o700)
            .create(dir)
            .map_err(StoreError::io(dir))?;
        Self::open_existing(dir)?
            .ok_or_else(|| StoreError::io(dir)(std::io::Error::from(std::io::ErrorKind::NotFound)))
    }

    /// As [`FileStore::open`], without creating anything: `None` if `dir` does not exist
    /// (`open` would create it, empty).
    pub(crate) fn open_existing(dir: &Path) -> Result<Option<FileStore>, StoreError> {
        let uid = nix::unistd::geteuid().as_raw();
        match fs::symlink_metadata(dir) {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(StoreError::io(dir)(e)),
        }
        let meta = fs::symlink_metadata(dir).map_err(StoreError::io(dir))?;
        let insecure = |why: String| StoreError::Insecure {
            path: dir.to_path_buf(),
            why,
        };
        if !meta.file_type().is_dir() {
            return Err(insecure(
                "is not a directory (a symlink is not accepted)".into(),
            ));
        }
        check_owner_and_mode(&meta, uid, "directory", "chmod 700")
            .map_err(|e| insecure(e.to_string()))?;
        Ok(Some(FileStore {
            dir: dir.to_path_buf(),
            uid,
        }))
    }

    /// The names in a vault directory, read-only and without checks (for `policy lint`,
    /// which may run as a user who cannot open the vault at all).
    pub fn names_in(dir: &Path) -> std::io::Result<Vec<String>> {
        let mut names = Vec::new();
        for entry in fs::read_dir(dir)? {
            let file = entry?.file_name();
            if let Some(name) = file.to_str().and_then(|f| f.strip_suffix(SUFFIX)) {
                if SecretName::new(name).is_ok() {
                    names.push(name.to_string());
                }
            }
        }
        names.sort();
        Ok(names)
    }

    fn path_of(&self, name: &SecretName) -> PathBuf {
        self.dir.join(format!("{name}{SUFFIX}"))
    }

    fn list_now(&self) -> Result<Vec<StoredSecret>, StoreError> {
        let mut out = Vec::new();
        for entry in fs::read_dir(&self.dir).map_err(StoreError::io(&self.dir))? {
            let entry = entry.map_err(StoreError::io(&self.dir))?;
            let file = entry.file_name();
            let Some(name) = file.to_str().and_then(|f| f.strip_suffix(SUFFIX)) else {
                continue; // temporary files and anything else that is not ours
            };
            let Ok(name) = SecretName::new(name) else {
                tracing::warn!(file = ?entry.path(), "vault: ignoring a file whose name is not a valid secret name");
                continue;
            };
            let meta = entry.metadata().map_err(StoreError::io(entry.path()))?;
            let updated = meta.modified().ok().map(rfc3339);
            out.push(StoredSecret { name, updated });
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    fn get_now(&self, name: &SecretName) -> Result<Option<SecretValue>, StoreError> {
        let path = self.path_of(name);
        let mut file = match OpenOptions::new()
            .read(true)
            .custom_flags(nix::libc::O_NOFOLLOW)
            .open(&path)
        {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(StoreError::io(&path)(e)),
        };
        let meta = file.metadata().map_err(StoreError::io(&path))?;
        let insecure = |why: String| StoreError::Insecure {
            path: path.clone(),
            why,
        };
        if !meta.file_type().is_file() {
            return Err(insecure("is not a regular file".into()));
        }
        check_owner_and_mode(&meta, self.uid, "file", "chmod 600")
            .map_err(|e| insecure(e.to_string()))?;
        // Room for the largest value plus a newline; sized up front so no reallocation
        // leaves an unzeroized copy behind.
        let limit = MAX_VALUE_LEN as u64 + 2;
        let mut bytes = Zeroizing::new(Vec::with_capacity(meta.len().min(limit) as usize + 1));
        (&mut file)
            .take(limit)
            .read_to_end(&mut bytes)
            .map_err(StoreError::io(&path))?;
        if bytes.len() as u64 == limit {
            return Err(StoreError::BadValue {
                name: name.to_string(),
                why: crate::secrets::store::value::too_long(
                    crate::secrets::store::value::full_len(&bytes, &mut file),
                ),
            });
        }
        if bytes.last() == Some(&b'\n') {
            bytes.pop();
            if bytes.last() == Some(&b'\r') {
                bytes.pop();
            }
        }
        SecretValue::new(std::mem::take(&mut *bytes))
            .map(Some)
            .map_err(|why| StoreError::BadValue {
                name: name.to_string(),
                why: why.to_string(),
            })
    }

    fn put_now(&self, name: &SecretName, value: &SecretValue) -> Result<(), StoreError> {
        let path = self.path_of(name);
        let tmp = self
            .dir
            .join(format!(".{name}.tmp-{:016x}", rand::random::<u64>()));
        let written = (|| {
            let mut f = OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .custom_flags(nix::libc::O_NOFOLLOW)
                .open(&tmp)?;
            // The umask cannot widen 0600, but make the mode exact regardless.
            f.set_permissions(fs::Permissions::from_mode(0o600))?;
            f.write_all(value.expose())?;
            f.sync_all()?;
            fs::rename(&tmp, &path)
        })();
        if let Err(e) = written {
            let _ = fs::remove_file(&tmp);
            return Err(StoreError::io(&path)(e));
        }
        sync_dir(&self.dir)
    }

    fn remove_now(&self, name: &SecretName) -> Result<bool, StoreError> {
        let path = self.path_of(name);
        match fs::remove_file(&path) {
            Ok(()) => sync_dir(&self.dir).map(|()| true),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(StoreError::io(&path)(e)),
        }
    }
}

impl SecretStore for FileStore {
    fn location(&self) -> StoreLocation {
        StoreLocation::File {
            path: self.dir.clone(),
        }
    }

    fn list(&self) -> StoreResult<'_, Vec<StoredSecret>> {
        Box::pin(async move { self.list_now() })
    }

    fn get<'a>(&'a self, name: &'a SecretName) -> StoreResult<'a, Option<SecretValue>> {
        Box::pin(async move { self.get_now(name) })
    }

    fn put<'a>(&'a self, name: &'a SecretName, value: &'a SecretValue) -> StoreResult<'a, ()> {
        Box::pin(async move { self.put_now(name, value) })
    }

    fn remove<'a>(&'a self, name: &'a SecretName) -> StoreResult<'a, bool> {
        Box::pin(async move { self.remove_now(name) })
    }
}

fn check_owner_and_mode(
    meta: &fs::Metadata,
    uid: u32,
    what: &'static str,
    fix: &'static str,
) -> Result<(), Exposed> {
    if meta.uid() != uid {
        return Err(Exposed::Owner {
            what,
            owner: meta.uid(),
            uid,
        });
    }
    let mode = meta.mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(Exposed::Mode { what, mode, fix });
    }
    Ok(())
}

/// Why a vault file or directory would expose secrets: its owner or its mode.
#[derive(Debug, thiserror::Error)]
enum Exposed {
    #[error("{what} is owned by uid {owner}, not by the daemon's uid {uid}")]
    Owner {
        what: &'static str,
        owner: u32,
        uid: u32,
    },
    #[error("{what} mode is {mode:03o}: group or others could read secrets ({fix} it)")]
    Mode {
        what: &'static str,
        mode: u32,
        fix: &'static str,
    },
}

fn sync_dir(dir: &Path) -> Result<(), StoreError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(StoreError::io(dir))
}

fn rfc3339(t: std::time::SystemTime) -> String {
    let t = time::OffsetDateTime::from(t);
    t.format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_else(|_| t.unix_timestamp().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(n: &str) -> SecretName {
        SecretName::new(n).expect("valid name")
    }

    fn value(v: &str) -> SecretValue {
        SecretValue::new(v.as_bytes().to_vec()).expect("valid value")
    }

    #[tokio::test]
    async fn put_get_list_remove_round_trip_with_private_modes() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().join("vault");
        let store = FileStore::open(&dir).expect("open");
        assert_eq!(
            fs::metadata(&dir).expect("dir").permissions().mode() & 0o777,
            0o700
        );
        store
            .put(&name("openai"), &value("sk-test-0123456789"))
            .await
            .expect("put");
        store
            .put(&name("github"), &value("ghp_abcdefghijkl"))
            .await
            .expect("put");
        let file = dir.join("openai.secret");
        assert_eq!(
            fs::metadata(&file).expect("file").permissions().mode() & 0o777,
            0o600
        );
        let got = store.get(&name("openai")).await.expect("get");
        assert_eq!(got.expect("present").expose(), b"sk-test-0123456789");
        let names: Vec<String> = store
            .list()
            .await
            .expect("list")
            .into_iter()
            .map(|s| s.name.to_string())
            .collect();
        assert_eq!(names, ["github", "openai"]);
        // Replacing is atomic and leaves no temporary file behind.
        store
            .put(&name("openai"), &value("sk-test-replaced"))
            .await
            .expect("replace");
        let leftovers = fs::read_dir(&dir).expect("read_dir").count();
        assert_eq!(leftovers, 2);
        assert!(store.remove(&name("openai")).await.expect("rm"));
        assert!(!store.remove(&name("openai")).await.expect("rm again"));
        assert!(store.get(&name("openai")).await.expect("get").is_none());
    }

    #[tokio::test]
    async fn loosened_modes_and_symlinks_are_refused() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().join("vault");
        let store = FileStore::open(&dir).expect("open");
        store
            .put(&name("k"), &value("value-12345"))
            .await
            .expect("put");
        fs::set_permissions(dir.join("k.secret"), fs::Permissions::from_mode(0o644))
            .expect("chmod");
        let err = store.get(&name("k")).await.expect_err("0644 refused");
        assert!(err.to_string().contains("mode is 644"), "{err}");

        std::os::unix::fs::symlink(dir.join("k.secret"), dir.join("l.secret")).expect("link");
        assert!(store.get(&name("l")).await.is_err(), "symlink followed");

        fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).expect("chmod");
        let err = FileStore::open(&dir).err().expect("0755 dir refused");
        assert!(err.to_string().contains("chmod 700"), "{err}");
    }

    #[tokio::test]
    async fn a_hand_written_trailing_newline_is_ignored_and_bad_values_are_named() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().join("vault");
        let store = FileStore::open(&dir).expect("open");
        let write = |file: &str, text: &[u8]| {
            let p = dir.join(file);
            fs::write(&p, text).expect("write");
            fs::set_permissions(&p, fs::Permissions::from_mode(0o600)).expect("chmod");
        };
        write("nl.secret", b"value-with-newline\n");
        let v = store.get(&name("nl")).await.expect("get").expect("present");
        assert_eq!(v.expose(), b"value-with-newline");
        write("bad.secret", b"two\nlines-here");
        let err = store.get(&name("bad")).await.expect_err("refused");
        assert!(err.to_string().starts_with("secret bad:"), "{err}");
        assert!(!err.to_string().contains("lines-here"), "{err}");
    }
}
