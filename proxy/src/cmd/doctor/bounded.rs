//! Running a helper (su, python3, keytool, cat) with a time limit and a size limit on what it
//! prints: whatever a start-up file or a broken runtime does, doctor finishes.

use std::io::Read as _;
use std::process::{Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What a command printed, and how it ended.
#[derive(Debug)]
pub struct Ran {
    pub status: ExitStatus,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
}

/// More than a helper may print on either stream (a trust store, a bundle, an environment
/// are all far smaller).
pub const MAX_OUTPUT: u64 = 8 << 20;

/// Why a command gave no result.
#[derive(Debug, PartialEq, Eq)]
pub enum RunError {
    Start(String),
    /// Killed at the limit.
    TimedOut(Duration),
    /// It printed more than [`MAX_OUTPUT`] bytes: killed.
    TooLarge,
}

/// Runs `cmd` (stdin closed) and waits at most `limit` for it; at the limit, or once it has
/// printed more than [`MAX_OUTPUT`], it is killed (with its process group, when it leads
/// one: helpers run as the agent start in a session of their own).
pub fn output(mut cmd: Command, limit: Duration) -> Result<Ran, RunError> {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| RunError::Start(e.to_string()))?;
    let over = Arc::new(AtomicBool::new(false));
    // Readers of their own, so a full pipe never stalls the child.
    let drain = |pipe: Option<Box<dyn std::io::Read + Send>>| {
        let over = Arc::clone(&over);
        std::thread::spawn(move || {
            let mut b = Vec::new();
            if let Some(p) = pipe {
                // Past the cap the pipe is closed: a writer that goes on gets EPIPE.
                let _ = p.take(MAX_OUTPUT + 1).read_to_end(&mut b);
            }
            if b.len() as u64 > MAX_OUTPUT {
                over.store(true, Ordering::Relaxed);
            }
            b
        })
    };
    let out = drain(child.stdout.take().map(|p| Box::new(p) as _));
    let err = drain(child.stderr.take().map(|p| Box::new(p) as _));
    let deadline = Instant::now() + limit;
    let pgid = i32::try_from(child.id())
        .ok()
        .map(nix::unistd::Pid::from_raw);
    let kill_group = || {
        if let Some(pgid) = pgid {
            let _ = nix::sys::signal::killpg(pgid, nix::sys::signal::Signal::SIGKILL);
        }
    };
    let status = loop {
        let failed = match child.try_wait() {
            Ok(Some(st)) => break st,
            _ if over.load(Ordering::Relaxed) => RunError::TooLarge,
            Ok(None) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
            Ok(None) | Err(_) => RunError::TimedOut(limit),
        };
        // Before the child is reaped its pid (and group id) cannot be reused.
        kill_group();
        let _ = child.kill();
        let _ = child.wait();
        // The readers are left to finish when the pipes close.
        return Err(failed);
    };
    // Something it left behind (`sleep 999 &` in a start-up file) may hold the pipes open:
    // it gets until the deadline, then its process group is killed.
    let done = || out.is_finished() && err.is_finished();
    while !done() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    if !done() {
        kill_group();
        let grace = Instant::now() + Duration::from_secs(1);
        while !done() && Instant::now() < grace {
            std::thread::sleep(Duration::from_millis(10));
        }
        if !done() {
            return Err(RunError::TimedOut(limit));
        }
    }
    let (stdout, stderr) = (
        out.join().unwrap_or_default(),
        err.join().unwrap_or_default(),
    );
    if over.load(Ordering::Relaxed) {
        return Err(RunError::TooLarge);
    }
    Ok(Ran {
        status,
        stdout,
        stderr,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_is_collected_and_a_hang_is_cut_short() {
        let mut cmd = Command::new("/bin/sh");
        cmd.args(["-c", "echo out; echo err >&2; exit 3"]);
        let r = output(cmd, Duration::from_secs(10)).expect("ran");
        assert_eq!(r.status.code(), Some(3));
        assert_eq!(
            (r.stdout.as_slice(), r.stderr.as_slice()),
            (&b"out\n"[..], &b"err\n"[..])
        );
        let mut hang = Command::new("/bin/sleep");
        hang.arg("30");
        let started = Instant::now();
        assert_eq!(
            output(hang, Duration::from_millis(200)).expect_err("cut"),
            RunError::TimedOut(Duration::from_millis(200))
        );
        assert!(started.elapsed() < Duration::from_secs(5));
        assert!(matches!(
            output(Command::new("/nonexistent/tool"), Duration::from_secs(1)),
            Err(RunError::Start(_))
        ));
        // Endless output is cut at the cap, not read until the time limit.
        let mut flood = Command::new("/bin/sh");
        flood.args(["-c", "exec cat /dev/zero"]);
        let started = Instant::now();
        assert_eq!(
            output(flood, Duration::from_secs(60)).expect_err("cut"),
            RunError::TooLarge
        );
        assert!(started.elapsed() < Duration::from_secs(30));
        // A process left behind holding the pipes does not hold doctor past the limit.
        let mut left = Command::new("/bin/sh");
        left.args(["-c", "sleep 30 & echo started"]);
        let started = Instant::now();
        let _ = output(left, Duration::from_millis(500));
        assert!(started.elapsed() < Duration::from_secs(5));
    }
}
