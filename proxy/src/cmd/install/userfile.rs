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

/// Opens `dir` one component at a time, never following a symbolic link that another user
/// could have made: a link is followed only if root owns it and the directory it is in (the
/// system's own, such as macOS's `/var`); below the first directory root does not own,
/// nothing is followed at all.
fn open_dir(dir: &Path) -> io::Result<OwnedFd> {
    use std::path::Component;
    let err =
        |e: Errno| io::Error::new(io::Error::from(e).kind(), format!("{}: {e}", dir.display()));
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
    if !dir.is_absolute() {
        return Err(refused(dir, "is not an absolute path"));
    }
    let mut fd = nix::fcntl::open("/", flags, Mode::empty()).map_err(err)?;
    for c in dir.components() {
        let name = match c {
            Component::RootDir => continue,
            Component::Normal(n) => n,
            _ => return Err(refused(dir, "has a `.` or `..` component")),
        };
        fd = match openat(&fd, name, flags | OFlag::O_NOFOLLOW, Mode::empty()) {
            Ok(next) => next,
            Err(Errno::ELOOP) | Err(Errno::ENOTDIR) => {
                let link =
                    nix::sys::stat::fstatat(&fd, name, nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW)
                        .map_err(err)?;
                let parent = fstat(&fd).map_err(io::Error::from)?;
                if link.st_uid != 0 || parent.st_uid != 0 {
                    return Err(refused(
                        dir,
                        "goes through a symbolic link root does not own; not followed",
                    ));
                }
                openat(&fd, name, flags, Mode::empty()).map_err(err)?
            }
            Err(e) => return Err(err(e)),
        };
    }
    Ok(fd)
}

/// Makes the directory `path` (its parent must exist) owned `uid:gid` with `mode`, or checks
/// that it exists as a directory, without following links (as [`write`]).
pub fn mkdir(path: &Path, mode: u32, uid: u32, gid: u32) -> io::Result<()> {
    let (dir, name) = split(path)?;
    let dirfd = open_dir(dir)?;
    match nix::sys::stat::mkdirat(&dirfd, name, Mode::from_bits_truncate(0o700)) {
        Ok(()) | Err(Errno::EEXIST) => {}
        Err(e) => return Err(io::Error::from(e)),
    }
    let fd = openat(
        &dirfd,
        name,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| match e {
        Errno::ELOOP | Errno::ENOTDIR => refused(path, "is not a directory; not followed"),
        e => io::Error::from(e),
    })?;
    fchown(&fd, Some(Uid::from_raw(uid)), Some(Gid::from_raw(gid))).map_err(io::Error::from)?;
    nix::sys::stat::fchmod(&fd, Mode::from_bits_truncate(mode as _)).map_err(io::Error::from)
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

/// Removes the file `path` (gone already is fine), reaching its directory without following
/// links another user made: a link swapped in for `~/.config` cannot make root delete a
/// file of that name elsewhere.
pub fn remove(path: &Path) -> io::Result<()> {
    let (dir, name) = split(path)?;
    let dirfd = match open_dir(dir) {
        Ok(fd) => fd,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    match unlinkat(&dirfd, name, UnlinkatFlags::NoRemoveDir) {
        Ok(()) | Err(Errno::ENOENT) => Ok(()),
        Err(e) => Err(io::Error::new(
            io::Error::from(e).kind(),
            format!("{}: {e}", path.display()),
        )),
    }
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
    fn a_link_in_the_middle_of_the_path_is_not_followed_and_dirs_are_made_in_place() {
        let d = tempfile::tempdir().expect("tempdir");
        let elsewhere = d.path().join("elsewhere");
        std::fs::create_dir(&elsewhere).expect("mkdir");
        let home = d.path().join("home");
        std::fs::create_dir(&home).expect("mkdir");
        let (uid, gid) = (
            nix::unistd::getuid().as_raw(),
            nix::unistd::getgid().as_raw(),
        );
        if uid != 0 {
            // Only root's links are followed: as a user, the tempdir itself is "another user's".
            return;
        }
        std::os::unix::fs::symlink(&elsewhere, home.join(".config")).expect("symlink");
        let deep = home.join(".config/environment.d");
        assert!(
            mkdir(&deep, 0o755, uid, gid).is_ok(),
            "root's own link is followed"
        );
        std::fs::remove_dir(elsewhere.join("environment.d")).expect("rmdir");
        std::os::unix::fs::lchown(home.join(".config"), Some(65534), None).expect("chown link");
        let err = mkdir(&deep, 0o755, uid, gid).expect_err("another user's link");
        assert!(err.to_string().contains("symbolic link"), "{err}");
        assert!(write(&deep.join("x.conf"), b"x", 0o644, uid, gid).is_err());
        assert!(!elsewhere.join("environment.d").exists());
        std::fs::remove_file(home.join(".config")).expect("rm link");
        mkdir(&home.join(".config"), 0o755, uid, gid).expect("mkdir");
        mkdir(&deep, 0o755, uid, gid).expect("mkdir");
        mkdir(&deep, 0o755, uid, gid).expect("again: exists");
        write(&deep.join("60.conf"), b"A=1\n", 0o644, uid, gid).expect("write");
        assert_eq!(
            std::fs::read_to_string(deep.join("60.conf")).expect("read"),
            "A=1\n"
        );
    }

    #[test]
    fn a_symlinked_directory_is_not_entered() {
        let d = tempfile::tempdir().expect("tempdir");
        let real = d.path().join("real");
        std::fs::create_dir(&real).expect("mkdir");
        let home = d.path().join("home");
        std::os::unix::fs::symlink(&real, &home).expect("symlink");
        // Root follows only root's own links: this one is another user's.
        std::os::unix::fs::lchown(&home, Some(65534), None).ok();
        assert!(read(&home.join(".profile")).is_err());
        assert!(write(&home.join(".profile"), b"x", 0o644, 0, 0).is_err());
        assert!(!real.join(".profile").exists());
        std::fs::write(real.join(".profile"), "x").expect("write");
        assert!(remove(&home.join(".profile")).is_err());
        assert!(real.join(".profile").exists(), "removed through the link");
        remove(&real.join(".profile")).expect("remove");
        assert!(!real.join(".profile").exists());
        remove(&real.join(".profile")).expect("gone already");
    }
}
