//! pf's enable reference, kept on disk.
//!
//! On macOS several programs share pf: each enables it with `pfctl -E` (`DIOCSTARTREF`),
//! which returns a token and counts a reference, and releases it with `pfctl -X TOKEN`
//! (`DIOCSTOPREF`); pf stops only when the last reference goes. A plain `pfctl -d`
//! (`DIOCSTOP`) stops pf whatever the count and invalidates every token. [xnu
//! `bsd/net/pf_ioctl.c`: `generate_token`, `remove_token` (ESRCH → EINVAL for an unknown
//! token), `DIOCSTARTREF`/`DIOCSTOPREF`/`DIOCSTOP`; pfctl prints `Token : N` on stderr, as
//! sshuttle's pf method reads it.]
//!
//! The token lives in a file so `firewall down`, run by another process than `firewall up`,
//! can release it. A token found on disk that this process did not take is stale (the
//! daemon restarted or crashed): a new reference is taken *first* and only then the old
//! one released, so the count never drops to zero in between and pf never stops under the
//! agent (which would let its traffic out unredirected).

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::redirect::RedirectError;

/// Where the daemon keeps its reference token (`/var/run` is emptied at boot, as are pf's
/// tokens).
pub const DEFAULT_TOKEN_PATH: &str = "/var/run/agenshield/pf.token";

/// The token in `pfctl -E`'s output (`Token : 123…`, on stderr).
pub fn parse_enable_output(output: &str) -> Option<u64> {
    output.lines().find_map(|line| {
        let (key, value) = line.split_once(':')?;
        (key.trim() == "Token")
            .then(|| value.trim().parse().ok())
            .flatten()
    })
}

/// The on-disk token: one decimal number and a newline, mode 0600.
#[derive(Debug, Clone)]
pub struct TokenFile {
    path: PathBuf,
}

impl TokenFile {
    pub fn new(path: impl Into<PathBuf>) -> TokenFile {
        TokenFile { path: path.into() }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The stored token; `None` when there is no file. A file that does not hold a token is
    /// reported (`Invalid`) rather than guessed at.
    pub fn read(&self) -> Result<Option<u64>, RedirectError> {
        match std::fs::read_to_string(&self.path) {
            Ok(text) => text.trim().parse().map(Some).map_err(|_| {
                RedirectError::Invalid(format!(
                    "{} does not hold a pf token: {:?}",
                    self.path.display(),
                    text.trim()
                ))
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(self.io("reading", e)),
        }
    }

    /// Stores `token`, replacing the file atomically (write beside it, then rename).
    pub fn write(&self, token: u64) -> Result<(), RedirectError> {
        if let Some(dir) = self.path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| self.io("creating the directory of", e))?;
        }
        let tmp = self.path.with_extension("token.tmp");
        let mut opts = std::fs::OpenOptions::new();
        opts.write(true).create(true).truncate(true);
        #[cfg(unix)]
        {
            use std::os::unix::fs::OpenOptionsExt as _;
            opts.mode(0o600);
        }
        let mut f = opts.open(&tmp).map_err(|e| self.io("writing", e))?;
        writeln!(f, "{token}")
            .and_then(|()| f.sync_all())
            .map_err(|e| self.io("writing", e))?;
        std::fs::rename(&tmp, &self.path).map_err(|e| self.io("replacing", e))
    }

    /// Removes the file; `Ok(false)` when there was none.
    pub fn clear(&self) -> Result<bool, RedirectError> {
        match std::fs::remove_file(&self.path) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(self.io("removing", e)),
        }
    }

    fn io(&self, what: &str, source: std::io::Error) -> RedirectError {
        RedirectError::Spawn {
            command: format!("{what} {}", self.path.display()),
            source,
        }
    }
}

/// Taking and dropping one pf enable reference (`pfctl -E` / `pfctl -X`).
pub trait EnableRef {
    fn acquire(&self) -> Result<u64, RedirectError>;
    fn release(&self, token: u64) -> Result<(), RedirectError>;
}

/// The reference this process holds, and the file that outlives it.
#[derive(Debug)]
pub struct TokenKeeper {
    file: TokenFile,
    held: Mutex<Option<u64>>,
}

impl TokenKeeper {
    pub fn new(file: TokenFile) -> TokenKeeper {
        TokenKeeper {
            file,
            held: Mutex::new(None),
        }
    }

    pub fn file(&self) -> &TokenFile {
        &self.file
    }

    /// Makes sure this process holds a live reference and the file names it. `pf_running`
    /// is pf's status now: a reference taken earlier is dead once pf was stopped by hand.
    pub fn ensure(&self, pf: &dyn EnableRef, pf_running: bool) -> Result<u64, RedirectError> {
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(token) = *held {
            if pf_running {
                if self.file.read().ok().flatten() != Some(token) {
                    self.file.write(token)?;
                }
                return Ok(token);
            }
        }
        // Stale: ours from before pf was stopped, or a previous process's on disk.
        let stale = match held.take() {
            Some(t) => Some(t),
            None => self.file.read().unwrap_or_else(|e| {
                tracing::warn!("pf token: {e}; taking a new reference");
                None
            }),
        };
        let token = pf.acquire()?;
        *held = Some(token);
        let written = self.file.write(token);
        if let Some(old) = stale.filter(|old| *old != token) {
            if let Err(e) = pf.release(old) {
                // pf was stopped (all tokens void) or it was already released: nothing held.
                tracing::debug!("pf token {old} was not live: {e}");
            }
        }
        written.map(|()| token)
    }

    /// Releases the reference this process or an earlier one took, and removes the file.
    /// `Ok(false)` when there was none. A token pf no longer knows (pf was stopped by hand,
    /// or the host rebooted) is dropped with a warning: there is nothing left to release.
    pub fn release(&self, pf: &dyn EnableRef) -> Result<bool, RedirectError> {
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        let on_disk = self.file.read().unwrap_or_else(|e| {
            tracing::warn!("pf token: {e}; removing the file");
            None
        });
        let tokens: Vec<u64> = held.take().into_iter().chain(on_disk).collect();
        let mut released = false;
        for (i, token) in tokens.iter().enumerate() {
            if tokens[..i].contains(token) {
                continue;
            }
            match pf.release(*token) {
                Ok(()) => released = true,
                Err(e) => tracing::warn!("pf token {token} could not be released: {e}"),
            }
        }
        let had_file = self.file.clear()?;
        Ok(released || had_file)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;

    /// A private temporary directory, removed on drop (also when a test fails).
    struct TempDir(PathBuf);
    impl TempDir {
        fn new(name: &str) -> TempDir {
            let p = std::env::temp_dir()
                .join(format!("agenshield-pf-token-{name}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&p);
            std::fs::create_dir_all(&p).expect("temp dir");
            TempDir(p)
        }
    }
    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// Test double for pf's reference count, used only to check OUR sequence (acquire
    /// before release, stale tokens released, the count never hitting zero). pf itself
    /// cannot run on Linux; the counting rules are xnu's DIOCSTARTREF/DIOCSTOPREF.
    #[derive(Default)]
    struct RefCount {
        live: RefCell<Vec<u64>>,
        next: RefCell<u64>,
        log: RefCell<Vec<String>>,
        min_refs_after_start: RefCell<Option<usize>>,
    }
    impl RefCount {
        fn with_live(tokens: &[u64]) -> RefCount {
            let r = RefCount::default();
            r.live.borrow_mut().extend_from_slice(tokens);
            *r.next.borrow_mut() = 100;
            r
        }
    }
    impl EnableRef for RefCount {
        fn acquire(&self) -> Result<u64, RedirectError> {
            *self.next.borrow_mut() += 1;
            let t = *self.next.borrow();
            self.live.borrow_mut().push(t);
            self.log.borrow_mut().push(format!("E {t}"));
            Ok(t)
        }
        fn release(&self, token: u64) -> Result<(), RedirectError> {
            self.log.borrow_mut().push(format!("X {token}"));
            let mut live = self.live.borrow_mut();
            let Some(i) = live.iter().position(|t| *t == token) else {
                return Err(RedirectError::Command {
                    command: format!("pfctl -X {token}"),
                    stderr: "pfctl: DIOCSTOPREF: Invalid argument".into(),
                });
            };
            live.remove(i);
            let mut min = self.min_refs_after_start.borrow_mut();
            *min = Some(min.map_or(live.len(), |m| m.min(live.len())));
            Ok(())
        }
    }

    #[test]
    fn parses_the_token_pfctl_prints() {
        let out = "No ALTQ support in kernel\nALTQ related functions disabled\npf enabled\nToken : 18446744073709551615\n";
        assert_eq!(parse_enable_output(out), Some(u64::MAX));
        assert_eq!(parse_enable_output("pf enabled\n"), None);
        assert_eq!(parse_enable_output("Token : nope\n"), None);
    }

    #[test]
    fn file_round_trip_mode_and_garbage() {
        let dir = TempDir::new("file");
        let f = TokenFile::new(dir.0.join("run/pf.token"));
        assert_eq!(f.read().expect("read"), None);
        f.write(42).expect("write");
        assert_eq!(f.read().expect("read"), Some(42));
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt as _;
            let mode = std::fs::metadata(f.path())
                .expect("stat")
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        std::fs::write(f.path(), "not a token\n").expect("garbage");
        assert!(matches!(f.read(), Err(RedirectError::Invalid(_))));
        assert!(f.clear().expect("clear"));
        assert!(!f.clear().expect("clear again"));
    }

    #[test]
    fn first_apply_replaces_a_stale_token_without_dropping_to_zero() {
        let dir = TempDir::new("stale");
        let file = TokenFile::new(dir.0.join("pf.token"));
        file.write(7).expect("seed");
        // A previous daemon's reference 7 is the only one pf counts.
        let pf = RefCount::with_live(&[7]);
        let keeper = TokenKeeper::new(file.clone());
        let t = keeper.ensure(&pf, true).expect("ensure");
        assert_eq!(*pf.log.borrow(), vec![format!("E {t}"), "X 7".to_string()]);
        assert_eq!(file.read().expect("read"), Some(t));
        assert_eq!(*pf.live.borrow(), vec![t]);
        // Released after the new reference was taken: pf never stopped in between.
        assert_eq!(*pf.min_refs_after_start.borrow(), Some(1));

        // Later applies keep the reference while pf runs.
        assert_eq!(keeper.ensure(&pf, true).expect("again"), t);
        assert_eq!(pf.log.borrow().len(), 2);
    }

    #[test]
    fn pf_stopped_by_hand_takes_a_new_reference() {
        let dir = TempDir::new("stopped");
        let keeper = TokenKeeper::new(TokenFile::new(dir.0.join("pf.token")));
        let pf = RefCount::with_live(&[]);
        let first = keeper.ensure(&pf, true).expect("ensure");
        // `pfctl -d`: pf stopped, every token void.
        pf.live.borrow_mut().clear();
        let second = keeper.ensure(&pf, false).expect("re-enable");
        assert_ne!(first, second);
        assert_eq!(keeper.file().read().expect("read"), Some(second));
        assert_eq!(
            pf.log.borrow().last().map(String::as_str),
            Some(&*format!("X {first}"))
        );
    }

    #[test]
    fn a_lost_file_is_rewritten() {
        let dir = TempDir::new("lost");
        let keeper = TokenKeeper::new(TokenFile::new(dir.0.join("pf.token")));
        let pf = RefCount::with_live(&[]);
        let t = keeper.ensure(&pf, true).expect("ensure");
        keeper.file().clear().expect("someone removed it");
        assert_eq!(keeper.ensure(&pf, true).expect("ensure"), t);
        assert_eq!(keeper.file().read().expect("read"), Some(t));
    }

    #[test]
    fn release_from_another_process_uses_the_file() {
        let dir = TempDir::new("release");
        let path = dir.0.join("pf.token");
        let pf = RefCount::with_live(&[]);
        let up = TokenKeeper::new(TokenFile::new(&path));
        let t = up.ensure(&pf, true).expect("up");
        // `firewall down` is a new process: nothing held in memory, the file names it.
        let down = TokenKeeper::new(TokenFile::new(&path));
        assert!(down.release(&pf).expect("down"));
        assert!(pf.live.borrow().is_empty());
        assert_eq!(
            pf.log.borrow().last().map(String::as_str),
            Some(&*format!("X {t}"))
        );
        assert!(!path.exists());
        // Nothing left: a second down reports so.
        assert!(!down.release(&pf).expect("down again"));
    }

    #[test]
    fn release_of_a_void_token_still_clears_the_file() {
        let dir = TempDir::new("void");
        let file = TokenFile::new(dir.0.join("pf.token"));
        file.write(5).expect("seed");
        let pf = RefCount::with_live(&[]);
        let keeper = TokenKeeper::new(file.clone());
        assert!(keeper.release(&pf).expect("release"));
        assert_eq!(file.read().expect("read"), None);
    }
}
