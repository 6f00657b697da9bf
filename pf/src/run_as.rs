//! Running a program as another user from a root process that stays root: the child gives up
//! root for good between fork and exec, in a session of its own.
//!
//! What the child does, in order, before the program is executed: `setsid()` (a new session,
//! so it has no controlling terminal: nothing it runs can open our terminal or push keystrokes
//! into it with `TIOCSTI`), the user's supplementary groups, its group, its user (as root,
//! `setuid` sets the real, effective and saved uid alike), and on Linux
//! `PR_SET_NO_NEW_PRIVS` (a set-uid program it runs gains nothing). Then it checks that no way
//! back to root is left; if any step fails, the spawn fails and the program never runs.
//!
//! Everything the child needs (the group list) is computed in the parent: between fork and
//! exec a multithreaded parent's child may only make async-signal-safe calls, so the hook
//! makes system calls and allocates nothing. [`privsep::drop_to`](crate::privsep::drop_to) is
//! the same drop for the calling process itself (the daemon's worker).

use std::io;
use std::os::unix::process::CommandExt as _;
use std::process::Command;

/// A user a command runs as: its uid, primary gid and supplementary groups, never root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunAs {
    uid: libc::uid_t,
    gid: libc::gid_t,
    groups: Vec<libc::gid_t>,
}

impl RunAs {
    /// `uid` with primary group `gid` and supplementary `groups`; root is refused.
    pub fn new(uid: u32, gid: u32, groups: &[u32]) -> io::Result<RunAs> {
        if uid == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "running a command as another user means a user other than root",
            ));
        }
        let mut groups: Vec<libc::gid_t> = groups.iter().map(|g| *g as libc::gid_t).collect();
        if !groups.contains(&gid) {
            groups.insert(0, gid);
        }
        Ok(RunAs { uid, gid, groups })
    }

    /// The user `name` from the user and group databases.
    pub fn lookup(name: &str) -> io::Result<RunAs> {
        let user = nix::unistd::User::from_name(name)
            .map_err(io::Error::from)?
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, format!("no user {name:?}")))?;
        let groups = groups_of(name, user.gid.as_raw())?;
        RunAs::new(user.uid.as_raw(), user.gid.as_raw(), &groups)
    }

    pub fn uid(&self) -> u32 {
        self.uid
    }

    /// Makes `cmd` run as this user, in a new session, without new privileges. Only root
    /// can switch users: from any other process the spawn fails (EPERM).
    pub fn apply_to(&self, cmd: &mut Command) {
        let (uid, gid) = (self.uid, self.gid);
        let groups = self.groups.clone();
        let hook = move || -> io::Result<()> {
            // SAFETY (of what follows): only system calls on values computed before the fork;
            // nothing is allocated or locked on the success path.
            new_session()?;
            #[allow(unsafe_code)]
            // SAFETY: the pointer and length describe `groups`, a live Vec owned by this
            // closure; setgroups only reads it.
            if unsafe { libc::setgroups(groups.len() as _, groups.as_ptr()) } != 0 {
                return Err(io::Error::last_os_error());
            }
            #[allow(unsafe_code)]
            // SAFETY: setgid/setuid take plain integers; as root they set the real, effective
            // and saved ids alike.
            let (g, u) = unsafe { (libc::setgid(gid), libc::setuid(uid)) };
            if g != 0 || u != 0 {
                return Err(io::Error::last_os_error());
            }
            no_new_privs()?;
            #[allow(unsafe_code)]
            // SAFETY: plain id queries, and a setuid(0) that must fail now.
            let back_to_root = unsafe {
                libc::getuid() == 0
                    || libc::geteuid() == 0
                    || libc::getegid() != gid
                    || libc::setuid(0) == 0
            };
            if back_to_root {
                return Err(io::Error::from_raw_os_error(libc::EPERM));
            }
            Ok(())
        };
        #[allow(unsafe_code)]
        // SAFETY: the hook runs in the forked child before exec and makes only
        // async-signal-safe system calls (setsid, setgroups, setgid, setuid, prctl, getuid,
        // geteuid, getegid) on data prepared in the parent.
        unsafe {
            cmd.pre_exec(hook);
        }
    }

    /// Whether this user may connect to the Unix stream socket at `path`: `Ok` if it can,
    /// the error `connect(2)` gave it otherwise (`EACCES` when its permissions refuse it).
    /// The connect is made in a child that has become the user (and then runs `/bin/true`,
    /// as the user); needs root.
    pub fn can_connect(&self, path: &std::path::Path) -> io::Result<()> {
        use std::os::unix::ffi::OsStrExt;
        // The address is made before the fork: the child only copies nothing and calls.
        #[allow(unsafe_code)]
        // SAFETY: sockaddr_un is plain old data; all zeroes is a valid value.
        let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
        addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
        let bytes = path.as_os_str().as_bytes();
        if bytes.len() >= addr.sun_path.len() || bytes.contains(&0) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "not a Unix socket path",
            ));
        }
        for (d, s) in addr.sun_path.iter_mut().zip(bytes) {
            *d = *s as libc::c_char;
        }
        let len = (std::mem::size_of::<libc::sa_family_t>() + bytes.len() + 1) as libc::socklen_t;
        let program = ["/bin/true", "/usr/bin/true"]
            .into_iter()
            .find(|p| std::path::Path::new(p).exists())
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "no /bin/true"))?;
        let mut cmd = Command::new(program);
        cmd.env_clear()
            .current_dir("/")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null());
        self.apply_to(&mut cmd);
        let connect = move || -> io::Result<()> {
            #[allow(unsafe_code)]
            // SAFETY: socket, connect and close are async-signal-safe; `addr` is a valid
            // sockaddr_un of `len` bytes owned by this closure.
            unsafe {
                // Closed below, before the exec: no CLOEXEC needed (macOS has no SOCK_CLOEXEC).
                let fd = libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0);
                if fd < 0 {
                    return Err(io::Error::last_os_error());
                }
                let rc = libc::connect(fd, std::ptr::addr_of!(addr).cast(), len);
                let err = io::Error::last_os_error();
                libc::close(fd);
                if rc != 0 {
                    return Err(err);
                }
            }
            Ok(())
        };
        #[allow(unsafe_code)]
        // SAFETY: runs after the drop hook, in the child, making only the calls above.
        unsafe {
            cmd.pre_exec(connect);
        }
        // A refused connect fails the spawn with the child's error.
        let mut child = cmd.spawn()?;
        child.wait()?;
        Ok(())
    }
}

/// Makes `cmd` start in a session of its own (no controlling terminal), as whatever user it
/// runs as: for `su`, which must start as root, so that the shell it starts for another user
/// cannot reach our terminal.
pub fn detach(cmd: &mut Command) {
    #[allow(unsafe_code)]
    // SAFETY: setsid is async-signal-safe and the hook allocates nothing.
    unsafe {
        cmd.pre_exec(new_session);
    }
}

fn new_session() -> io::Result<()> {
    #[allow(unsafe_code)]
    // SAFETY: setsid takes no arguments; a freshly forked child is never a process-group
    // leader, so it succeeds.
    let rc = unsafe { libc::setsid() };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(target_os = "linux")]
fn no_new_privs() -> io::Result<()> {
    #[allow(unsafe_code)]
    // SAFETY: prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) takes integers only.
    let rc = unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(not(target_os = "linux"))]
fn no_new_privs() -> io::Result<()> {
    Ok(())
}

#[cfg(not(any(target_os = "macos", target_os = "ios")))]
fn groups_of(name: &str, primary: u32) -> io::Result<Vec<u32>> {
    let c = std::ffi::CString::new(name)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "user name has a NUL byte"))?;
    let list = nix::unistd::getgrouplist(&c, nix::unistd::Gid::from_raw(primary))
        .map_err(io::Error::from)?;
    Ok(list.into_iter().map(|g| g.as_raw()).collect())
}

/// macOS: nix has no getgrouplist there; the primary group only (a file readable through a
/// supplementary group is then not readable: the safe side).
#[cfg(any(target_os = "macos", target_os = "ios"))]
fn groups_of(_name: &str, primary: u32) -> io::Result<Vec<u32>> {
    Ok(vec![primary])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_is_refused() {
        assert!(RunAs::new(0, 0, &[]).is_err());
        assert!(RunAs::lookup("root").is_err());
    }

    /// As root: the child runs with the user's ids and groups, no way back, no terminal.
    #[test]
    fn the_child_is_the_user_in_a_session_of_its_own() {
        if !nix::unistd::geteuid().is_root() {
            return;
        }
        let who = RunAs::new(65_534, 65_534, &[65_533]).expect("nobody");
        let mut cmd = Command::new("/bin/sh");
        cmd.args([
            "-c",
            "id -u; id -g; id -G; grep NoNewPrivs /proc/self/status; \
             cut -d' ' -f6 /proc/$$/stat; echo $$; ( : < /dev/tty ) 2>/dev/null && echo tty || echo no-tty",
        ])
        .env_clear()
        .env("PATH", "/usr/bin:/bin");
        who.apply_to(&mut cmd);
        let out = cmd.output().expect("spawn");
        let text = String::from_utf8_lossy(&out.stdout);
        let lines: Vec<&str> = text.lines().map(str::trim).collect();
        assert_eq!(&lines[..3], ["65534", "65534", "65534 65533"], "{text}");
        assert!(lines[3].ends_with('1'), "no_new_privs: {text}");
        assert_eq!(lines[4], lines[5], "session leader: {text}");
        assert_eq!(lines[6], "no-tty", "{text}");
    }
}
