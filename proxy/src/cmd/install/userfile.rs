//! Root editing a file in a directory another user controls (the agent's shell start-up
//! files in its home) without following anything that user planted there.
//!
//! Every step goes through a descriptor of the directory opened with `O_NOFOLLOW`: the file
//! is opened with `O_NOFOLLOW` and must be a regular file with one link, owned by the
//! directory's owner; the replacement is created with `O_EXCL|O_NOFOLLOW`, given its owner
//! and mode through its descriptor (`fchown`/`fchmod`), and renamed into place within the
//! same directory. A symlink to the CA key, a hard link to `/etc/shadow` or a temp file
//! swapped for a symlink mid-write can no longer make root read or chown what it should not.

use std::ffi::OsStr;
use std::io::{self, Read, Write};
use std::os::fd::OwnedFd;
use std::path::Path;

use nix::errno::Errno;
use nix::fcntl::{openat, renameat, OFlag};
use nix::sys::stat::{fstat, Mode, SFlag};
use nix::unistd::{fchown, unlinkat, Gid, Uid, UnlinkatFlags};

/// Start-up files are small; anything bigger is not one.
const MAX_BYTES: u64 = 1024 * 1024;

/// A file as found: its text, mode, owner and group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    pub text: String,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
}

fn split(path: &Path) -> io::Result<(&Path, &OsStr)> {
    match (path.parent(), path.file_name()) {
        (Some(dir), Some(name)) if !dir.as_os_str().is_empty() => Ok((dir, name)),
        _ => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{}: not a file in a directory", path.display()),
        )),
    }
}

fn open_dir(dir: &Path) -> io::Result<OwnedFd> {
    nix::fcntl::open(
        dir,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| io::Error::new(io::Error::from(e).kind(), format!("{}: {e}", dir.display())))
}

/// Reads `path`; `None` if it does not exist. Refuses a symlink, anything but a regular file,
/// a file with other hard links, and a file not owned by the directory's owner.
pub fn read(path: &Path) -> io::Result<Option<Found>> {
    let (dir, name) = split(path)?;
    let dirfd = open_dir(dir)?;
    let dir_uid = fstat(&dirfd).map_err(io::Error::from)?.st_uid;
    let fd = match openat(
        &dirfd,
        name,
        OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC,
        Mode::empty(),
    ) {
        Ok(fd) => fd,
        Err(Errno::ENOENT) => return Ok(None),
        Err(Errno::ELOOP) => {
            return Err(refused(path, "is a symbolic link; not followed"));
        }
        Err(e) => return Err(io::Error::from(e)),
    };
    let st = fstat(&fd).map_err(io::Error::from)?;
    if SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits()) != SFlag::S_IFREG {
        return Err(refused(path, "is not a regular file"));
    }
    if st.st_nlink != 1 {
        return Err(refused(path, "has other hard links"));
    }
    if st.st_uid != dir_uid {
        return Err(refused(
            path,
            &format!(
                "is owned by uid {}, not by its directory's owner",
                st.st_uid
            ),
        ));
    }
    let mut text = String::new();
    std::fs::File::from(fd)
        .take(MAX_BYTES + 1)
        .read_to_string(&mut text)?;
    if text.len() as u64 > MAX_BYTES {
        return Err(refused(path, "is larger than a start-up file can be"));
    }
    // `st_mode` is u32 on Linux, u16 on macOS.
    #[allow(clippy::useless_conversion)]
    let mode = u32::from(st.st_mode) & 0o7777;
    Ok(Some(Found {
        text,
        mode,
        uid: st.st_uid,
        gid: st.st_gid,
    }))
}

/// Replaces (or creates) `path` with `bytes`, owned `uid:gid`, mode `mode`.
pub fn write(path: &Path, bytes: &[u8], mode: u32, uid: u32, gid: u32) -> io::Result<()> {
    let (dir, name) = split(path)?;
    let dirfd = open_dir(dir)?;
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(name);
    tmp_name.push(".agenshield-tmp");
    let tmp = tmp_name.as_os_str();
    let _ = unlinkat(&dirfd, tmp, UnlinkatFlags::NoRemoveDir);
    let fd = openat(
        &dirfd,
        tmp,
        OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::from_bits_truncate(0o600),
    )
    .map_err(io::Error::from)?;
    let result = (|| {
        let mut f = std::fs::File::from(fd);
        fchown(&f, Some(Uid::from_raw(uid)), Some(Gid::from_raw(gid))).map_err(io::Error::from)?;
        nix::sys::stat::fchmod(&f, Mode::from_bits_truncate(mode as _)).map_err(io::Error::from)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        renameat(&dirfd, tmp, &dirfd, name).map_err(io::Error::from)
    })();
    if result.is_err() {
        let _ = unlinkat(&dirfd, tmp, UnlinkatFlags::NoRemoveDir);
    }
    result
}

fn refused(path: &Path, why: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::PermissionDenied,
        format!("{} {why}: not touched", path.display()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn a_regular_file_is_read_and_replaced_in_place() {
        let d = tempfile::tempdir().expect("tempdir");
        let p = d.path().join(".profile");
        std::fs::write(&p, "export A=1\n").expect("write");
        let found = read(&p).expect("read").expect("exists");
        assert_eq!(found.text, "export A=1\n");
        write(&p, b"export A=2\n", 0o640, found.uid, found.gid).expect("write");
        assert_eq!(std::fs::read_to_string(&p).expect("read"), "export A=2\n");
        assert_eq!(std::fs::metadata(&p).expect("meta").mode() & 0o7777, 0o640);
        assert!(read(&d.path().join(".bashrc")).expect("read").is_none());
    }

    #[test]
    fn a_planted_symlink_or_hard_link_is_refused_and_left_alone() {
        let d = tempfile::tempdir().expect("tempdir");
        let secret = d.path().join("secret");
        std::fs::write(&secret, "TOPSECRET\n").expect("write");
        let link = d.path().join(".profile");
        std::os::unix::fs::symlink(&secret, &link).expect("symlink");
        let err = read(&link).expect_err("a symlink is refused");
        assert!(err.to_string().contains("symbolic link"), "{err}");
        assert!(std::fs::symlink_metadata(&link)
            .expect("meta")
            .file_type()
            .is_symlink());
        let hard = d.path().join(".bashrc");
        std::fs::hard_link(&secret, &hard).expect("hard link");
        let err = read(&hard).expect_err("a hard link is refused");
        assert!(err.to_string().contains("hard links"), "{err}");
        assert_eq!(
            std::fs::read_to_string(&secret).expect("read"),
            "TOPSECRET\n"
        );
    }

    #[test]
    fn a_symlinked_directory_is_not_entered() {
        let d = tempfile::tempdir().expect("tempdir");
        let real = d.path().join("real");
        std::fs::create_dir(&real).expect("mkdir");
        let home = d.path().join("home");
        std::os::unix::fs::symlink(&real, &home).expect("symlink");
        assert!(read(&home.join(".profile")).is_err());
        assert!(write(&home.join(".profile"), b"x", 0o644, 0, 0).is_err());
        assert!(!real.join(".profile").exists());
    }
}
