//! Closing a Unix socket to some users, and only to them: a POSIX ACL entry `user:UID:---` on
//! the socket's inode (Linux). `connect(2)` to a pathname socket needs write permission on
//! it, and a named-user entry decides for that uid before the group and other bits are looked
//! at, so the socket stays as open as it was for everyone else.
//!
//! What it is for: local resolvers that answer over a socket (systemd-resolved's varlink
//! socket, nscd's) resolve names for whoever connects, around the agent's DNS stub. The ACL
//! lives on the inode: a service that makes its socket anew gets none, so it is applied again
//! each time the service starts (install's systemd drop-ins).
//!
//! The ACL is read and written as the kernel's `system.posix_acl_access` attribute
//! (`include/uapi/linux/posix_acl_xattr.h`: a version, then `{tag, perm, id}` entries sorted by
//! tag and id); no libacl. A named entry needs a mask, which is kept as wide as the group
//! class already was, so nobody else loses access.

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

const XATTR: &[u8] = b"system.posix_acl_access\0";
const VERSION: u32 = 2;
const USER_OBJ: u16 = 0x01;
const USER: u16 = 0x02;
const GROUP_OBJ: u16 = 0x04;
const GROUP: u16 = 0x08;
const MASK: u16 = 0x10;
const OTHER: u16 = 0x20;
/// The id of entries that name nobody (`ACL_UNDEFINED_ID`).
const NO_ID: u32 = u32::MAX;

/// One ACL entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Entry {
    pub tag: u16,
    pub id: u32,
    pub perm: u16,
}

/// An access ACL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Acl(pub Vec<Entry>);

impl Acl {
    /// The ACL that mode bits alone amount to.
    pub fn from_mode(mode: u32) -> Acl {
        let e = |tag, shift: u32| Entry {
            tag,
            id: NO_ID,
            perm: ((mode >> shift) & 7) as u16,
        };
        Acl(vec![e(USER_OBJ, 6), e(GROUP_OBJ, 3), e(OTHER, 0)])
    }

    /// The kernel's attribute bytes.
    pub fn parse(bytes: &[u8]) -> io::Result<Acl> {
        let bad = || io::Error::new(io::ErrorKind::InvalidData, "malformed POSIX ACL attribute");
        let (head, rest) = bytes.split_at_checked(4).ok_or_else(bad)?;
        if u32::from_le_bytes(head.try_into().map_err(|_| bad())?) != VERSION || rest.len() % 8 != 0
        {
            return Err(bad());
        }
        Ok(Acl(rest
            .chunks_exact(8)
            .map(|c| Entry {
                tag: u16::from_le_bytes([c[0], c[1]]),
                perm: u16::from_le_bytes([c[2], c[3]]),
                id: u32::from_le_bytes([c[4], c[5], c[6], c[7]]),
            })
            .collect()))
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        let mut v = VERSION.to_le_bytes().to_vec();
        for e in &self.0 {
            v.extend_from_slice(&e.tag.to_le_bytes());
            v.extend_from_slice(&e.perm.to_le_bytes());
            v.extend_from_slice(&e.id.to_le_bytes());
        }
        v
    }

    /// Whether `uid` has a named entry with no permission.
    pub fn denies(&self, uid: u32) -> bool {
        self.0
            .iter()
            .any(|e| e.tag == USER && e.id == uid && e.perm == 0)
    }

    /// With `user:UID:---` for each of `uids` (replacing their entries), the mask widened to
    /// what the group class needs.
    pub fn with_denied(&self, uids: &[u32]) -> Acl {
        let mut v: Vec<Entry> = self
            .0
            .iter()
            .filter(|e| !(e.tag == USER && uids.contains(&e.id)))
            .copied()
            .collect();
        v.extend(uids.iter().map(|&id| Entry {
            tag: USER,
            id,
            perm: 0,
        }));
        Acl(v).normalized()
    }

    /// Without the `user:UID:---` entries of `uids`; a mask no named entry needs goes too.
    pub fn without_denied(&self, uids: &[u32]) -> Acl {
        Acl(self
            .0
            .iter()
            .filter(|e| !(e.tag == USER && e.perm == 0 && uids.contains(&e.id)))
            .copied()
            .collect())
        .normalized()
    }

    /// Sorted as the kernel wants, with a mask exactly when there are named entries. A mask
    /// already there stays as it was (our entries need nothing, and widening it would give
    /// the group class more); a new one is the group class's union, so it takes nothing from
    /// anyone.
    fn normalized(mut self) -> Acl {
        let named = self.0.iter().any(|e| e.tag == USER || e.tag == GROUP);
        let old_mask = self.0.iter().find(|e| e.tag == MASK).map(|e| e.perm);
        self.0.retain(|e| e.tag != MASK);
        if named {
            let group_class = self
                .0
                .iter()
                .filter(|e| matches!(e.tag, USER | GROUP | GROUP_OBJ))
                .fold(0, |m, e| m | e.perm);
            self.0.push(Entry {
                tag: MASK,
                id: NO_ID,
                perm: old_mask.unwrap_or(group_class),
            });
        } else if let (Some(m), Some(g)) =
            (old_mask, self.0.iter_mut().find(|e| e.tag == GROUP_OBJ))
        {
            // Without named entries the mask goes; the group owner keeps no more than it had
            // through it.
            g.perm &= m;
        }
        self.0.sort_by_key(|e| (e.tag, e.id));
        self
    }
}

/// The access ACL of `path` (its mode bits when it has none). Does not follow a final link.
pub fn read(path: &Path) -> io::Result<Acl> {
    let c = cpath(path)?;
    let mut buf = vec![0u8; 4096];
    #[allow(unsafe_code)]
    // SAFETY: `c` and the attribute name are NUL-terminated; `buf` is writable for its length.
    let n = unsafe {
        libc::lgetxattr(
            c.as_ptr(),
            XATTR.as_ptr().cast(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    if n >= 0 {
        buf.truncate(n as usize);
        return Acl::parse(&buf);
    }
    let e = io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::ENODATA) {
        use std::os::unix::fs::MetadataExt;
        return Ok(Acl::from_mode(std::fs::symlink_metadata(path)?.mode()));
    }
    Err(e)
}

/// Sets the access ACL of `path` (the kernel updates the mode bits to match). Does not follow
/// a final link.
pub fn write(path: &Path, acl: &Acl) -> io::Result<()> {
    let c = cpath(path)?;
    let bytes = acl.to_bytes();
    #[allow(unsafe_code)]
    // SAFETY: `c` and the attribute name are NUL-terminated; `bytes` is readable for its length.
    let rc = unsafe {
        libc::lsetxattr(
            c.as_ptr(),
            XATTR.as_ptr().cast(),
            bytes.as_ptr().cast(),
            bytes.len(),
            0,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Closes the socket at `path` to `uids`; whether anything changed.
pub fn deny(path: &Path, uids: &[u32]) -> io::Result<bool> {
    let acl = read(path)?;
    let want = acl.with_denied(uids);
    if want == acl {
        return Ok(false);
    }
    write(path, &want).map(|()| true)
}

/// Takes back what [`deny`] added for `uids`; whether anything changed.
pub fn undeny(path: &Path, uids: &[u32]) -> io::Result<bool> {
    let acl = read(path)?;
    let want = acl.without_denied(uids);
    if want == acl {
        return Ok(false);
    }
    write(path, &want).map(|()| true)
}

fn cpath(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path has a NUL byte"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_round_trip_and_deny_keeps_everyone_else() {
        let base = Acl::from_mode(0o666);
        let closed = base.with_denied(&[5200, 5201]);
        assert_eq!(
            closed.0,
            vec![
                Entry {
                    tag: USER_OBJ,
                    id: NO_ID,
                    perm: 6
                },
                Entry {
                    tag: USER,
                    id: 5200,
                    perm: 0
                },
                Entry {
                    tag: USER,
                    id: 5201,
                    perm: 0
                },
                Entry {
                    tag: GROUP_OBJ,
                    id: NO_ID,
                    perm: 6
                },
                Entry {
                    tag: MASK,
                    id: NO_ID,
                    perm: 6
                },
                Entry {
                    tag: OTHER,
                    id: NO_ID,
                    perm: 6
                },
            ]
        );
        assert!(closed.denies(5200) && !closed.denies(5202));
        assert_eq!(Acl::parse(&closed.to_bytes()).expect("parse"), closed);
        assert_eq!(closed.with_denied(&[5200]), closed, "idempotent");
        assert_eq!(closed.without_denied(&[5200, 5201]), base);
        // Someone else's named entry stays, and keeps its mask.
        let other = Acl(vec![
            Entry {
                tag: USER_OBJ,
                id: NO_ID,
                perm: 6,
            },
            Entry {
                tag: USER,
                id: 7,
                perm: 7,
            },
            Entry {
                tag: GROUP_OBJ,
                id: NO_ID,
                perm: 4,
            },
            Entry {
                tag: MASK,
                id: NO_ID,
                perm: 7,
            },
            Entry {
                tag: OTHER,
                id: NO_ID,
                perm: 0,
            },
        ]);
        let both = other.with_denied(&[5200]);
        assert!(both.0.contains(&Entry {
            tag: USER,
            id: 7,
            perm: 7
        }));
        assert!(both.0.contains(&Entry {
            tag: MASK,
            id: NO_ID,
            perm: 7
        }));
        assert_eq!(both.without_denied(&[5200]), other);
        assert!(Acl::parse(b"\x01\0\0\0").is_err());
    }

    /// On a real socket: the denied uid is refused, another is let in, and undoing it
    /// restores the mode.
    #[test]
    fn a_denied_uid_cannot_connect_and_others_still_can() {
        use crate::run_as::RunAs;
        use std::os::unix::fs::PermissionsExt;
        if !nix::unistd::geteuid().is_root() {
            return;
        }
        let dir = tempfile_dir();
        let sock = dir.join("s");
        let _l = std::os::unix::net::UnixListener::bind(&sock).expect("bind");
        std::fs::set_permissions(&sock, std::fs::Permissions::from_mode(0o666)).expect("chmod");
        let nobody = RunAs::new(65_534, 65_534, &[]).expect("nobody");
        let other = RunAs::new(65_533, 65_533, &[]).expect("other");
        assert!(nobody.can_connect(&sock).is_ok());
        match deny(&sock, &[65_534]) {
            Ok(true) => {}
            Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) => return,
            r => panic!("deny: {r:?}"),
        }
        assert_eq!(
            nobody
                .can_connect(&sock)
                .expect_err("refused")
                .raw_os_error(),
            Some(libc::EACCES)
        );
        assert!(other.can_connect(&sock).is_ok());
        assert!(read(&sock).expect("read").denies(65_534));
        assert!(undeny(&sock, &[65_534]).expect("undeny"));
        assert!(nobody.can_connect(&sock).is_ok());
        assert_eq!(read(&sock).expect("read"), Acl::from_mode(0o666));
        let _ = std::fs::remove_dir_all(&dir);
    }

    fn tempfile_dir() -> std::path::PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let d = std::env::temp_dir().join(format!("agenshield-acl-{}", std::process::id()));
        std::fs::create_dir_all(&d).expect("mkdir");
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        d
    }
}
