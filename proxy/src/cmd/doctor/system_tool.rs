//! The system programs doctor starts itself (`su`, and `cat` and `sh` to read the agent's
//! files as the agent): taken from fixed paths, never from a PATH, and only when root owns the
//! program and every directory above it and none of them is writable by group or others, so
//! no other user can have placed or replaced it.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// `su`, which starts the agent's shells.
pub const SU: &[&str] = &["/bin/su", "/usr/bin/su"];
/// `cat`, which reads a file as the agent.
pub const CAT: &[&str] = &["/bin/cat", "/usr/bin/cat"];
/// `sh`, which reads a directory of certificates as the agent.
pub const SH: &[&str] = &["/bin/sh", "/usr/bin/sh"];

/// The first of `candidates` that is a root-owned program, resolved (symlinks followed, so
/// the path run is the one checked), or why none is.
pub fn find(candidates: &[&str]) -> Result<PathBuf, String> {
    let mut why = Vec::new();
    for c in candidates {
        match root_owned_program(Path::new(c)) {
            Ok(p) => return Ok(p),
            Err(e) => why.push(e),
        }
    }
    Err(why.join("; "))
}

fn root_owned_program(path: &Path) -> Result<PathBuf, String> {
    let real = std::fs::canonicalize(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let m = std::fs::metadata(&real).map_err(|e| format!("{}: {e}", real.display()))?;
    if !m.is_file() || m.mode() & 0o111 == 0 {
        return Err(format!("{} is not an executable file", real.display()));
    }
    for p in real.ancestors() {
        let m = std::fs::metadata(p).map_err(|e| format!("{}: {e}", p.display()))?;
        if m.uid() != 0 || m.mode() & 0o022 != 0 {
            return Err(format!(
                "{} (owner uid {}, mode {:o}) could be changed by a user other than root",
                p.display(),
                m.uid(),
                m.mode() & 0o7777
            ));
        }
    }
    Ok(real)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn only_programs_no_other_user_can_replace_are_taken() {
        assert!(find(CAT).is_ok(), "{:?}", find(CAT));
        assert!(find(&["/nonexistent/cat"]).is_err());
        // A program in a temporary directory: under world-writable /tmp, or not root's.
        let dir = tempfile::tempdir().expect("tempdir");
        let tool = dir.path().join("tool");
        std::fs::write(&tool, "#!/bin/sh\n").expect("write");
        std::fs::set_permissions(&tool, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        let err = find(&[tool.to_str().expect("utf-8")]).expect_err("not trusted");
        assert!(err.contains("could be changed"), "{err}");
    }
}
