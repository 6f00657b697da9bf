//! OS sandboxes for agent processes: Landlock on Linux, Seatbelt profiles on macOS.
//!
//! The Seatbelt renderers are pure functions, compiled everywhere so their golden files are
//! checked on Linux too; the Landlock code exists on Linux only.

#[cfg(target_os = "linux")]
pub mod landlock;
pub mod seatbelt;
#[cfg(all(
    target_os = "linux",
    any(target_arch = "x86_64", target_arch = "aarch64")
))]
pub mod seccomp;

/// Marks every open descriptor above stderr close-on-exec, so a command about to be exec'd
/// inside a sandbox gets none of what this process inherited (a socket connected somewhere
/// before the sandbox existed, say). Call it from the one thread that is about to exec.
pub fn close_inherited_on_exec() {
    use nix::fcntl::{fcntl, FcntlArg, FdFlag};
    use std::os::fd::BorrowedFd;
    let dir = if cfg!(target_os = "linux") {
        "/proc/self/fd"
    } else {
        "/dev/fd"
    };
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let fds: Vec<i32> = entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .filter(|fd| *fd > 2)
        .collect();
    for fd in fds {
        // SAFETY: `fd` was open when the directory was listed (the listing's own descriptor
        // may be closed since: then fcntl fails with EBADF and nothing happens); the borrow
        // lives only for this one fcntl call and never closes anything.
        #[allow(unsafe_code)]
        let borrowed = unsafe { BorrowedFd::borrow_raw(fd) };
        let _ = fcntl(borrowed, FcntlArg::F_SETFD(FdFlag::FD_CLOEXEC));
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn inherited_descriptors_are_marked_close_on_exec() {
        use nix::fcntl::{fcntl, FcntlArg, FdFlag};
        let f = std::fs::File::open("/dev/null").expect("open");
        // dup(2) gives a descriptor without close-on-exec, as an inherited one would be.
        let plain = nix::unistd::dup(&f).expect("dup");
        let flags = |fd| FdFlag::from_bits_truncate(fcntl(fd, FcntlArg::F_GETFD).expect("getfd"));
        assert!(!flags(&plain).contains(FdFlag::FD_CLOEXEC));
        super::close_inherited_on_exec();
        assert!(flags(&plain).contains(FdFlag::FD_CLOEXEC));
    }
}
