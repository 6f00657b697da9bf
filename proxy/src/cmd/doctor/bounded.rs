//! Running a helper (su, python3, keytool) with a time limit: whatever a start-up file or a
//! broken runtime does, doctor finishes.

use std::io::Read as _;
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// What a command printed, and how it ended.
#[derive(Debug)]
pub struct Ran {
    pub status: ExitStatus,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
}

/// Why a command gave no result.
#[derive(Debug, PartialEq, Eq)]
pub enum RunError {
    Start(String),
    /// Killed at the limit.
    TimedOut(Duration),
}

/// Runs `cmd` (stdin closed) and waits at most `limit` for it; at the limit it is killed.
pub fn output(mut cmd: Command, limit: Duration) -> Result<Ran, RunError> {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| RunError::Start(e.to_string()))?;
    // Readers of their own, so a full pipe never stalls the child.
    let drain = |pipe: Option<Box<dyn std::io::Read + Send>>| {
        std::thread::spawn(move || {
            let mut b = Vec::new();
            if let Some(mut p) = pipe {
                let _ = p.read_to_end(&mut b);
            }
            b
        })
    };
    let out = drain(child.stdout.take().map(|p| Box::new(p) as _));
    let err = drain(child.stderr.take().map(|p| Box::new(p) as _));
    let deadline = Instant::now() + limit;
    let status = loop {
        match child.try_wait() {
            Ok(Some(st)) => break st,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            Ok(None) | Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                // The readers are left to finish when the pipes close.
                return Err(RunError::TimedOut(limit));
            }
        }
    };
    Ok(Ran {
        status,
        stdout: out.join().unwrap_or_default(),
        stderr: err.join().unwrap_or_default(),
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
    }
}
