//! What doctor reads and runs on the agent's word, it reads and runs with the agent's rights.
//!
//! Run as root, doctor learns paths from the agent: its PATH (python3, java and the JDK's
//! keytool), its home (`~/.wgetrc`, `~/.curlrc`, …), its variables (`SSL_CERT_FILE`, …) and
//! what its programs print (certifi's path). The agent owns all of it, so root must neither
//! execute nor open any of it: a planted `python3` would run as root, a variable naming a FIFO
//! would hang doctor, one naming a device would have root open it. Here every such program
//! runs as the agent ([`agenshield_pf::run_as`]: its uid and groups, a session of its own, no
//! new privileges, an empty environment, `/` as working directory, bounded in time and
//! output), and every such file is read as the agent, by a root-owned `cat` (or `sh` for a
//! directory) run the same way. Before that, root only looks (`stat`): what is not a regular
//! file (a directory where one is expected) is refused unopened, and a file the agent's mode
//! bits keep it from is explained by [`Agent::cannot_read`] without being read.
//!
//! When doctor is the agent itself ([`Access::ours`]), it reads in-process: without
//! following into anything but a regular file (`O_NONBLOCK`, then `fstat`), bounded in size.
//! That is also how root reads its own installed files.
//!
//! Every read is remembered by path, and all reads as the agent share one time budget, so an
//! agent that swaps its files for FIFOs between the look and the read costs doctor seconds,
//! not hours.

use std::cell::RefCell;
use std::collections::HashMap;
use std::io::Read as _;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use agenshield_pf::run_as::RunAs;

use super::agent::Agent;
use super::bounded::{self, Ran, RunError, MAX_OUTPUT};
use super::system_tool;

/// One read as the agent.
const READ_LIMIT: Duration = Duration::from_secs(10);
/// Every read as the agent, together.
const READ_BUDGET: Duration = Duration::from_secs(60);

/// Why a file gave no bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReadError {
    Missing,
    /// Not a regular file (a directory where a file is wanted, or the reverse): not opened.
    NotAFile(&'static str),
    /// The agent may not read it, and why.
    Denied(String),
    TimedOut(Duration),
    TooLarge,
    Failed(String),
}

impl std::fmt::Display for ReadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReadError::Missing => write!(f, "does not exist"),
            ReadError::NotAFile(kind) => write!(f, "is {kind}, not read"),
            ReadError::Denied(why) => write!(f, "the agent cannot read it ({why})"),
            ReadError::TimedOut(t) => write!(f, "reading it took more than {}s", t.as_secs()),
            ReadError::TooLarge => write!(f, "is larger than {} MiB", MAX_OUTPUT >> 20),
            ReadError::Failed(e) => write!(f, "{e}"),
        }
    }
}

/// What one read gave.
type Read = Result<Vec<u8>, ReadError>;

/// A file, or a directory whose regular files are read one after the other.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Want {
    File,
    Dir,
}

enum Who {
    /// This process: doctor is the agent, or the files are root's own.
    Ours,
    /// The agent, from a root process.
    Agent {
        run_as: RunAs,
        agent: Agent,
        cat: Result<PathBuf, String>,
        sh: Result<PathBuf, String>,
    },
}

/// How doctor reaches what the agent names.
pub struct Access {
    who: Who,
    cache: RefCell<HashMap<(PathBuf, Want), Read>>,
    budget: Instant,
}

impl Access {
    /// Reads and runs in this process, with its own rights.
    pub fn ours() -> Access {
        Access::with(Who::Ours)
    }

    /// For `agent`: as the agent when this process is root; in-process when it is the agent;
    /// `Err` when neither (this user cannot act as the agent).
    pub fn for_agent(agent: &Agent) -> Result<Access, String> {
        let me = nix::unistd::geteuid();
        if me.as_raw() == agent.uid && !me.is_root() {
            return Ok(Access::ours());
        }
        if !me.is_root() {
            return Err("acting as the agent needs root".into());
        }
        let run_as =
            RunAs::lookup(&agent.name).map_err(|e| format!("cannot run as {}: {e}", agent.name))?;
        if run_as.uid() != agent.uid {
            return Err(format!("{} changed uid while doctor ran", agent.name));
        }
        Ok(Access::with(Who::Agent {
            run_as,
            agent: agent.clone(),
            cat: system_tool::find(system_tool::CAT),
            sh: system_tool::find(system_tool::SH),
        }))
    }

    fn with(who: Who) -> Access {
        Access {
            who,
            cache: RefCell::new(HashMap::new()),
            budget: Instant::now() + READ_BUDGET,
        }
    }

    /// Whether reads are made by the agent itself from a root process (what it read, the
    /// agent can read; otherwise that is judged from the mode bits).
    pub fn reads_as_agent(&self) -> bool {
        matches!(self.who, Who::Agent { .. })
    }

    /// A command for `program` (a path the agent may control) as the agent would run it:
    /// empty environment but a plain PATH, working directory `/`, and, from root, the agent's
    /// ids in a session of its own.
    pub fn command(&self, program: &Path) -> Command {
        let mut cmd = Command::new(program);
        cmd.env_clear()
            .env("PATH", "/usr/local/bin:/usr/bin:/bin")
            .current_dir("/");
        if let Who::Agent { run_as, .. } = &self.who {
            run_as.apply_to(&mut cmd);
        }
        cmd
    }

    /// Whether the agent can connect to the Unix stream socket at `path` (tried as the agent).
    pub fn can_connect(&self, path: &Path) -> std::io::Result<()> {
        match &self.who {
            Who::Agent { run_as, .. } => run_as.can_connect(path),
            Who::Ours => std::os::unix::net::UnixStream::connect(path).map(drop),
        }
    }

    /// Runs a command made by [`Access::command`], bounded.
    pub fn run(&self, cmd: Command, limit: Duration) -> Result<Ran, RunError> {
        bounded::output(cmd, limit)
    }

    /// The bytes of the file at `path` (for [`Want::Dir`], of every regular file in it,
    /// each followed by a newline), as the agent reads them.
    pub fn read(&self, path: &Path, want: Want) -> Result<Vec<u8>, ReadError> {
        let key = (path.to_path_buf(), want);
        if let Some(r) = self.cache.borrow().get(&key) {
            return r.clone();
        }
        let r = self.read_uncached(path, want);
        self.cache.borrow_mut().insert(key, r.clone());
        r
    }

    /// [`Access::read`] as text (not UTF-8 is replaced, as config files are read).
    pub fn read_text(&self, path: &Path) -> Result<String, ReadError> {
        self.read(path, Want::File)
            .map(|b| String::from_utf8_lossy(&b).into_owned())
    }

    fn read_uncached(&self, path: &Path, want: Want) -> Result<Vec<u8>, ReadError> {
        // Looking is not opening: a FIFO or a device is refused here, unopened.
        let meta = std::fs::metadata(path).map_err(io_error)?;
        check_kind(&meta.file_type(), want)?;
        match &self.who {
            Who::Ours => match want {
                Want::File => read_regular(path),
                Want::Dir => read_dir(path),
            },
            Who::Agent {
                run_as: _,
                agent,
                cat,
                sh,
            } => {
                if let Some(why) = agent.cannot_read(path) {
                    return Err(ReadError::Denied(why));
                }
                let left = self.budget.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(ReadError::TimedOut(READ_BUDGET));
                }
                let cmd = match want {
                    Want::File => {
                        let mut c = self.command(cat.as_ref().map_err(|e| tool_missing("cat", e))?);
                        c.arg("--").arg(path);
                        c
                    }
                    Want::Dir => {
                        let mut c = self.command(sh.as_ref().map_err(|e| tool_missing("sh", e))?);
                        c.args([
                            "-c",
                            "for f in \"$1\"/*; do [ -f \"$f\" ] && cat -- \"$f\" && echo; done \
                             2>/dev/null; exit 0",
                            "sh",
                        ])
                        .arg(path)
                        .env("PATH", "/usr/bin:/bin");
                        c
                    }
                };
                let ran = self.run(cmd, READ_LIMIT.min(left)).map_err(|e| match e {
                    RunError::Start(e) => ReadError::Failed(format!("cannot start cat: {e}")),
                    RunError::TimedOut(t) => ReadError::TimedOut(t),
                    RunError::TooLarge => ReadError::TooLarge,
                })?;
                if ran.status.success() {
                    return Ok(ran.stdout);
                }
                let said = String::from_utf8_lossy(&ran.stderr);
                let said = said
                    .trim()
                    .lines()
                    .last()
                    .unwrap_or("no message")
                    .to_string();
                Err(if said.contains("Permission denied") {
                    ReadError::Denied(said)
                } else if said.contains("No such file") {
                    ReadError::Missing
                } else {
                    ReadError::Failed(said)
                })
            }
        }
    }
}

fn tool_missing(name: &str, why: &str) -> ReadError {
    ReadError::Failed(format!(
        "no root-owned {name} to read it as the agent with ({why})"
    ))
}

fn io_error(e: std::io::Error) -> ReadError {
    match e.kind() {
        std::io::ErrorKind::NotFound => ReadError::Missing,
        std::io::ErrorKind::PermissionDenied => ReadError::Denied(e.to_string()),
        _ => ReadError::Failed(e.to_string()),
    }
}

fn check_kind(t: &std::fs::FileType, want: Want) -> Result<(), ReadError> {
    let kind = if t.is_file() {
        "a regular file"
    } else if t.is_dir() {
        "a directory"
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_block_device() {
        "a block device"
    } else if t.is_socket() {
        "a socket"
    } else {
        "not a file"
    };
    match (want, t.is_file(), t.is_dir()) {
        (Want::File, true, _) | (Want::Dir, _, true) => Ok(()),
        _ => Err(ReadError::NotAFile(kind)),
    }
}

/// Opens without waiting (a FIFO swapped in after the look does not block), then reads only
/// a regular file, and only so much.
fn read_regular(path: &Path) -> Result<Vec<u8>, ReadError> {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags((nix::fcntl::OFlag::O_NONBLOCK | nix::fcntl::OFlag::O_NOCTTY).bits())
        .open(path)
        .map_err(io_error)?;
    check_kind(&f.metadata().map_err(io_error)?.file_type(), Want::File)?;
    let mut b = Vec::new();
    f.take(MAX_OUTPUT + 1)
        .read_to_end(&mut b)
        .map_err(io_error)?;
    if b.len() as u64 > MAX_OUTPUT {
        return Err(ReadError::TooLarge);
    }
    Ok(b)
}

fn read_dir(dir: &Path) -> Result<Vec<u8>, ReadError> {
    let mut all = Vec::new();
    for e in std::fs::read_dir(dir).map_err(io_error)?.flatten() {
        let p = e.path();
        let regular = std::fs::metadata(&p).is_ok_and(|m| m.is_file());
        if let (true, Ok(b)) = (regular, read_regular(&p)) {
            all.extend_from_slice(&b);
            all.push(b'\n');
            if all.len() as u64 > MAX_OUTPUT {
                return Err(ReadError::TooLarge);
            }
        }
    }
    Ok(all)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fifo_or_a_device_is_refused_unopened_and_files_are_read() {
        let dir = tempfile::tempdir().expect("tempdir");
        let fifo = dir.path().join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o644))
            .expect("mkfifo");
        let a = Access::ours();
        let started = Instant::now();
        assert_eq!(
            a.read(&fifo, Want::File),
            Err(ReadError::NotAFile("a FIFO"))
        );
        assert_eq!(
            a.read(Path::new("/dev/zero"), Want::File),
            Err(ReadError::NotAFile("a character device"))
        );
        // Opened past the look (a swap after it): O_NONBLOCK, then refused by its type.
        assert_eq!(read_regular(&fifo), Err(ReadError::NotAFile("a FIFO")));
        assert!(started.elapsed() < Duration::from_secs(5));
        let f = dir.path().join("a.pem");
        std::fs::write(&f, "x").expect("write");
        assert_eq!(a.read(&f, Want::File), Ok(b"x".to_vec()));
        assert_eq!(a.read(dir.path(), Want::Dir), Ok(b"x\n".to_vec()));
        assert_eq!(
            a.read(&f, Want::Dir),
            Err(ReadError::NotAFile("a regular file"))
        );
        assert_eq!(
            a.read(&dir.path().join("gone"), Want::File),
            Err(ReadError::Missing)
        );
    }
}
