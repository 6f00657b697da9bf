//! The checkpoint signing key: an ed25519 key in a PKCS#8 PEM file (`paths.audit_key`) that
//! only the serving user may read (0600; refused if group or others have any access, as the
//! CA key is), made by `agenshield proxy install` or, when absent, at the daemon's first start.
//! Its public half is written beside it (`<name>.pub`, 0644), so an operator who may not
//! read the key can still export the public key (`ctl audit key`).

use std::fs::OpenOptions;
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use ring::rand::SystemRandom;
use ring::signature::{Ed25519KeyPair, KeyPair};

use super::checkpoint::{pem, pem_body, PublicKey, PublicKeyError};

const PRIVATE_LABEL: &str = "PRIVATE KEY";

#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("audit key {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("audit key {path}: mode {mode:04o} lets others read it; it must be 0600 (chmod 600)")]
    Exposed { path: PathBuf, mode: u32 },
    #[error("audit key {path}: not an ed25519 private key in PKCS#8 PEM")]
    Invalid { path: PathBuf },
    #[error("audit key {path}: creating it failed: {source}")]
    Create {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("audit public key {path}: {error}")]
    Public {
        path: PathBuf,
        error: PublicKeyError,
    },
    #[error(
        "no audit key at {path} (nor {public}): `agenshield proxy install` creates it, or the \
         daemon at its first start"
    )]
    Missing { path: PathBuf, public: PathBuf },
}

/// Whether the key was found or made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyOrigin {
    Created,
    Loaded,
}

/// The signing key. Never printed: its `Debug` shows the key id only.
pub struct CheckpointKey {
    pair: Ed25519KeyPair,
    public: PublicKey,
}

impl std::fmt::Debug for CheckpointKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CheckpointKey({})", self.public.id())
    }
}

/// `<path without extension>.pub`: where the public half is kept.
pub fn public_key_path(private: &Path) -> PathBuf {
    private.with_extension("pub")
}

impl CheckpointKey {
    /// Loads the key at `path`, or creates it (0600, never through a link) if there is none;
    /// (re)writes its public half beside it when that is missing or differs (a failure to is
    /// only warned about: the public key can be exported from the private one).
    pub fn load_or_create(path: &Path) -> Result<(CheckpointKey, KeyOrigin), KeyError> {
        let (key, origin) = match std::fs::symlink_metadata(path) {
            Ok(_) => (Self::load(path)?, KeyOrigin::Loaded),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                (Self::create(path)?, KeyOrigin::Created)
            }
            Err(source) => {
                return Err(KeyError::Read {
                    path: path.into(),
                    source,
                })
            }
        };
        let public = public_key_path(path);
        let want = key.public.to_pem();
        if std::fs::read_to_string(&public).ok().as_deref() != Some(want.as_str()) {
            if let Err(e) = write_public(&public, &want) {
                tracing::warn!(path = ?public, "could not write the audit public key: {e}");
            }
        }
        Ok((key, origin))
    }

    /// Loads the key at `path`, refusing one others may read.
    pub fn load(path: &Path) -> Result<CheckpointKey, KeyError> {
        let read = |source| KeyError::Read {
            path: path.into(),
            source,
        };
        let file = OpenOptions::new()
            .read(true)
            .custom_flags(nix::libc::O_NOFOLLOW)
            .open(path)
            .map_err(read)?;
        let meta = file.metadata().map_err(read)?;
        let mode = meta.permissions().mode() & 0o7777;
        if mode & 0o077 != 0 {
            return Err(KeyError::Exposed {
                path: path.into(),
                mode,
            });
        }
        let text = io::read_to_string(file).map_err(read)?;
        let der =
            pem_body(&text, PRIVATE_LABEL).map_err(|_| KeyError::Invalid { path: path.into() })?;
        // Also a version-1 PKCS#8 document (`openssl genpkey -algorithm ed25519`).
        let pair = Ed25519KeyPair::from_pkcs8_maybe_unchecked(&der)
            .map_err(|_| KeyError::Invalid { path: path.into() })?;
        Ok(Self::of(pair))
    }

    fn create(path: &Path) -> Result<CheckpointKey, KeyError> {
        let create = |source| KeyError::Create {
            path: path.into(),
            source,
        };
        let doc = Ed25519KeyPair::generate_pkcs8(&SystemRandom::new())
            .map_err(|_| create(io::Error::other("no randomness from the system")))?;
        let pair = Ed25519KeyPair::from_pkcs8(doc.as_ref())
            .map_err(|_| create(io::Error::other("the new key does not parse")))?;
        let text = zeroize::Zeroizing::new(pem(PRIVATE_LABEL, doc.as_ref()));
        // Its directory as the CA makes its own (the default place is the CA directory,
        // made after the log is opened): the public half beside the key is for everyone.
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o755)
                .create(dir)
                .map_err(create)?;
        }
        write_new(path, text.as_bytes(), 0o600).map_err(create)?;
        let key = Self::of(pair);
        tracing::info!(path = ?path, key_id = %key.public.id(), "audit checkpoint key created");
        Ok(key)
    }

    fn of(pair: Ed25519KeyPair) -> CheckpointKey {
        let mut raw = [0u8; 32];
        raw.copy_from_slice(pair.public_key().as_ref());
        CheckpointKey {
            pair,
            public: PublicKey::from_raw(raw),
        }
    }

    pub fn public(&self) -> &PublicKey {
        &self.public
    }

    /// The ed25519 signature of `message`, base64.
    pub(crate) fn sign(&self, message: &[u8]) -> String {
        use base64::Engine as _;
        base64::engine::general_purpose::STANDARD.encode(self.pair.sign(message).as_ref())
    }
}

/// The public key of the key at `path`: from the key itself when this user may read it,
/// else from its public half beside it (what an operator who is not root has).
pub fn read_public(path: &Path) -> Result<PublicKey, KeyError> {
    match CheckpointKey::load(path) {
        Ok(k) => return Ok(k.public),
        Err(KeyError::Read { source, .. })
            if matches!(
                source.kind(),
                io::ErrorKind::PermissionDenied | io::ErrorKind::NotFound
            ) => {}
        Err(e) => return Err(e),
    }
    let public = public_key_path(path);
    match std::fs::read_to_string(&public) {
        Ok(text) => PublicKey::from_pem(&text).map_err(|error| KeyError::Public {
            path: public,
            error,
        }),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Err(KeyError::Missing {
            path: path.into(),
            public,
        }),
        Err(source) => Err(KeyError::Read {
            path: public,
            source,
        }),
    }
}

/// A file that must not exist yet, with `mode`, never through a link.
fn write_new(path: &Path, bytes: &[u8], mode: u32) -> io::Result<()> {
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .open(path)?;
    // The umask may have taken bits off; never added any.
    f.set_permissions(std::fs::Permissions::from_mode(mode))?;
    f.write_all(bytes)?;
    f.sync_all()
}

/// The public half: replaced as a whole (a new file renamed over it), 0644.
fn write_public(path: &Path, text: &str) -> io::Result<()> {
    let tmp = path.with_extension("pub.tmp");
    let _ = std::fs::remove_file(&tmp);
    write_new(&tmp, text.as_bytes(), 0o644)?;
    std::fs::rename(&tmp, path)
}
