//! The install manifest: what install created, in creation order, so uninstall removes
//! exactly that (in reverse) and leaves everything else. Saved after every step, so an
//! install that fails half-way can still be undone.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    pub version: u32,
    pub platform: String,
    pub created: Vec<Created>,
}

/// One thing install created.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Created {
    Group {
        name: String,
    },
    User {
        name: String,
    },
    /// `purge`: the directory holds only what the product and its service write (logs, the
    /// socket, the agent's home), so uninstall removes it with its content. Otherwise it is
    /// removed only when empty.
    Dir {
        path: PathBuf,
        purge: bool,
    },
    /// `sha256` of what install wrote; a file changed since is kept. `None`: always ours.
    File {
        path: PathBuf,
        sha256: Option<String>,
    },
    /// Our marker block in a start-up file; `file_created`: the file did not exist before.
    EnvBlock {
        path: PathBuf,
        file_created: bool,
    },
    /// The service enabled and started (systemd unit name or launchd label).
    Service {
        name: String,
    },
    /// Mode and owner install changed on something that existed: what they were.
    Changed {
        path: PathBuf,
        mode: u32,
        owner: String,
        group: String,
    },
    /// Something registered with a tool of the system (PAM, the machine's trust store):
    /// `undo` runs at uninstall while `marker` exists.
    Registered {
        what: String,
        marker: PathBuf,
        undo: Vec<Vec<String>>,
    },
    /// A symbolic link install made at `path`, to `target`; uninstall removes it only while
    /// it still is that link.
    Link {
        path: PathBuf,
        target: PathBuf,
    },
    /// Our CA added to a user's keychain (macOS).
    Keychain {
        user: String,
        keychain: PathBuf,
        common_name: String,
    },
}

impl Manifest {
    pub fn new(platform: &str) -> Manifest {
        Manifest {
            version: 1,
            platform: platform.into(),
            created: Vec::new(),
        }
    }

    pub fn load(path: &Path) -> std::io::Result<Option<Manifest>> {
        match std::fs::read_to_string(path) {
            Ok(text) => serde_json::from_str(&text).map(Some).map_err(|e| {
                std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("{}: {e}", path.display()),
                )
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Writes the manifest atomically, mode 0600.
    pub fn save(&self, path: &Path) -> std::io::Result<()> {
        let tmp = path.with_extension("json.tmp");
        let _ = std::fs::remove_file(&tmp);
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)?;
        let text = serde_json::to_string_pretty(self).map_err(std::io::Error::other)?;
        f.write_all(text.as_bytes())?;
        f.write_all(b"\n")?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    }

    /// Whether install created `path` (a file or directory).
    pub fn owns_path(&self, path: &Path) -> bool {
        self.created.iter().any(|c| match c {
            Created::Dir { path: p, .. }
            | Created::File { path: p, .. }
            | Created::EnvBlock { path: p, .. }
            | Created::Link { path: p, .. } => p == path,
            _ => false,
        })
    }

    pub fn owns_user(&self, name: &str) -> bool {
        self.created
            .iter()
            .any(|c| matches!(c, Created::User { name: n } if n == name))
    }

    /// Adds `c`, replacing an older record of the same thing.
    pub fn record(&mut self, c: Created) {
        let same = |a: &Created| match (a, &c) {
            (Created::File { path: x, .. }, Created::File { path: y, .. }) => x == y,
            (Created::Dir { path: x, .. }, Created::Dir { path: y, .. }) => x == y,
            (Created::EnvBlock { path: x, .. }, Created::EnvBlock { path: y, .. }) => x == y,
            (Created::Changed { path: x, .. }, Created::Changed { path: y, .. }) => x == y,
            (Created::Registered { what: x, .. }, Created::Registered { what: y, .. }) => x == y,
            (a, c) => a == c,
        };
        if let Some(slot) = self.created.iter_mut().find(|a| same(a)) {
            // What a path was like before install is learned once: the first time.
            if matches!(c, Created::Changed { .. }) {
                return;
            }
            // An env block keeps whether install created its file the first time.
            if let (
                Created::EnvBlock { file_created, .. },
                Created::EnvBlock {
                    file_created: now, ..
                },
            ) = (&*slot, &c)
            {
                let first = *file_created || *now;
                if let Created::EnvBlock { path, .. } = c {
                    *slot = Created::EnvBlock {
                        path,
                        file_created: first,
                    };
                }
                return;
            }
            *slot = c;
        } else {
            self.created.push(c);
        }
    }

    pub fn forget(&mut self, c: &Created) {
        self.created.retain(|a| a != c);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_records_each_thing_once() {
        let mut m = Manifest::new("linux");
        m.record(Created::User { name: "a".into() });
        m.record(Created::File {
            path: "/x".into(),
            sha256: Some("1".into()),
        });
        m.record(Created::File {
            path: "/x".into(),
            sha256: Some("2".into()),
        });
        m.record(Created::EnvBlock {
            path: "/p".into(),
            file_created: true,
        });
        m.record(Created::EnvBlock {
            path: "/p".into(),
            file_created: false,
        });
        m.record(Created::User { name: "a".into() });
        assert_eq!(m.created.len(), 3);
        assert!(m.owns_user("a") && m.owns_path(Path::new("/x")));
        assert!(matches!(&m.created[1], Created::File { sha256: Some(s), .. } if s == "2"));
        assert!(matches!(
            &m.created[2],
            Created::EnvBlock {
                file_created: true,
                ..
            }
        ));
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("m.json");
        m.save(&p).expect("save");
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(
            std::fs::metadata(&p).expect("meta").permissions().mode() & 0o777,
            0o600
        );
        assert_eq!(Manifest::load(&p).expect("load"), Some(m));
        assert_eq!(
            Manifest::load(&dir.path().join("none")).expect("load"),
            None
        );
    }
}
