//! The agent account as doctor sees it: its name, uid, groups and home, and whether it can
//! read a file (every directory above it searchable, the file readable, by mode bits).

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Agent {
    pub name: String,
    pub uid: u32,
    /// Primary and supplementary groups.
    pub gids: Vec<u32>,
    pub home: PathBuf,
}

impl Agent {
    /// The account `name` from the user database (`None` if there is none).
    pub fn lookup(name: &str) -> Option<Agent> {
        let user = nix::unistd::User::from_name(name).ok().flatten()?;
        let gids = groups(name, user.gid).unwrap_or_else(|| vec![user.gid.as_raw()]);
        Some(Agent {
            name: user.name,
            uid: user.uid.as_raw(),
            gids,
            home: user.dir,
        })
    }

    /// Why the agent cannot read `path`, or `None` if it can. Judged by owner, group and
    /// mode bits (ACLs are not consulted); root reads everything.
    pub fn cannot_read(&self, path: &Path) -> Option<String> {
        if self.uid == 0 {
            return None;
        }
        let mut dirs: Vec<&Path> = path.ancestors().skip(1).collect();
        dirs.reverse();
        for dir in dirs {
            if dir.as_os_str().is_empty() {
                continue;
            }
            match std::fs::metadata(dir) {
                Ok(m) if self.allowed(&m, 0o1) => {}
                Ok(m) => {
                    return Some(format!(
                        "{} (mode {:o}, uid {}) is not searchable by {}",
                        dir.display(),
                        m.mode() & 0o7777,
                        m.uid(),
                        self.name
                    ))
                }
                Err(e) => return Some(format!("{}: {e}", dir.display())),
            }
        }
        match std::fs::metadata(path) {
            Ok(m) if self.allowed(&m, 0o4) => None,
            Ok(m) => Some(format!(
                "mode {:o}, owner uid {} gid {}",
                m.mode() & 0o7777,
                m.uid(),
                m.gid()
            )),
            Err(e) => Some(e.to_string()),
        }
    }

    /// Whether the class of `m` the agent falls in has `bit` (1 = x, 4 = r).
    fn allowed(&self, m: &std::fs::Metadata, bit: u32) -> bool {
        let mode = m.mode();
        let shift = if m.uid() == self.uid {
            6
        } else if self.gids.contains(&m.gid()) {
            3
        } else {
            0
        };
        (mode >> shift) & bit != 0
    }
}

/// The user's groups (primary and supplementary) from the group database.
#[cfg(not(target_os = "macos"))]
fn groups(name: &str, primary: nix::unistd::Gid) -> Option<Vec<u32>> {
    let c = std::ffi::CString::new(name).ok()?;
    let list = nix::unistd::getgrouplist(&c, primary).ok()?;
    Some(list.into_iter().map(|g| g.as_raw()).collect())
}

/// macOS has no getgrouplist in nix; the agent's supplementary groups are not consulted
/// there (a file readable through one of them is judged unreadable: the safe side).
#[cfg(target_os = "macos")]
fn groups(_name: &str, _primary: nix::unistd::Gid) -> Option<Vec<u32>> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn nobody() -> Agent {
        Agent {
            name: "nobody-test".into(),
            uid: 65_000,
            gids: vec![65_000],
            home: PathBuf::from("/nonexistent"),
        }
    }

    #[test]
    fn mode_bits_decide_what_the_agent_reads() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))
            .expect("chmod");
        let f = dir.path().join("bundle.pem");
        std::fs::write(&f, "x").expect("write");
        let chmod = |p: &Path, m| {
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).expect("chmod")
        };
        chmod(&f, 0o644);
        // The temp dir's ancestors (/tmp is 1777) are searchable by everyone.
        assert_eq!(nobody().cannot_read(&f), None);
        chmod(&f, 0o600);
        let why = nobody().cannot_read(&f).expect("unreadable");
        assert!(why.contains("mode 600"), "{why}");
        chmod(&f, 0o644);
        chmod(dir.path(), 0o700);
        let why = nobody().cannot_read(&f).expect("unsearchable");
        assert!(why.contains("is not searchable by nobody-test"), "{why}");
        chmod(dir.path(), 0o755);
        let gone = dir.path().join("missing.pem");
        assert!(nobody().cannot_read(&gone).is_some());
        let root = Agent { uid: 0, ..nobody() };
        assert_eq!(root.cannot_read(&gone), None);
    }
}
