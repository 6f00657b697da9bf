//! How to spell `agenshield` in a command printed for the operator to run (doctor's fixes,
//! "needs root" hints): `agenshield` where that name finds a program, else this binary's full
//! path, so the command works as written after `cargo run` or from a build directory. For a
//! command run with sudo, the name must be found where sudo looks (its `secure_path`, the
//! system directories), not on the caller's PATH.

use std::ffi::OsStr;
use std::path::PathBuf;

/// The directories of sudo's usual `secure_path` (Debian, Ubuntu, Fedora, macOS's defaults).
const ROOT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// `agenshield` as this user types it.
pub fn for_user() -> String {
    spelled(std::env::var_os("PATH").as_deref())
}

/// `agenshield` after `sudo`.
pub fn for_root() -> String {
    spelled(Some(OsStr::new(ROOT_PATH)))
}

fn spelled(path: Option<&OsStr>) -> String {
    if found_on(path).is_some() {
        return "agenshield".into();
    }
    match std::env::current_exe() {
        Ok(exe) => quoted(&exe.display().to_string()),
        Err(_) => "agenshield".into(),
    }
}

fn found_on(path: Option<&OsStr>) -> Option<PathBuf> {
    crate::cmd::exec::resolve_program(OsStr::new("agenshield"), Some(path?))
}

fn quoted(s: &str) -> String {
    if s.chars()
        .all(|c| c.is_ascii_alphanumeric() || "-_./:=,@+%".contains(c))
    {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

/// `text` with its `` `agenshield … `` and `` `sudo agenshield … `` commands spelled to work
/// here.
pub fn rewrite(text: &str) -> String {
    if !text.contains("agenshield ") {
        return text.to_string();
    }
    let (user, root) = (for_user(), for_root());
    text.replace("sudo agenshield ", &format!("sudo {root} "))
        .replace("`agenshield ", &format!("`{user} "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_on_the_path_is_kept_and_a_missing_one_becomes_this_binary() {
        let dir = tempfile::tempdir().expect("tempdir");
        let bin = dir.path().join("agenshield");
        std::fs::write(&bin, "#!/bin/sh\n").expect("write");
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        assert_eq!(spelled(Some(dir.path().as_os_str())), "agenshield");
        let empty = tempfile::tempdir().expect("tempdir");
        let exe = std::env::current_exe().expect("exe");
        assert_eq!(
            spelled(Some(empty.path().as_os_str())),
            quoted(&exe.display().to_string())
        );
        assert_eq!(quoted("/a b/x"), "'/a b/x'");
    }
}
