//! Running a command secret's command: `/bin/sh -c COMMAND` as the daemon's own user (the
//! worker's, under the privilege split), no stdin, in its own process group, killed whole
//! when the timeout passes. Its standard output, less one trailing newline, is the value;
//! its standard error only ever reaches the daemon's log (first line, bounded), never the
//! agent; its output is never logged.

use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt};
use zeroize::Zeroizing;

use super::value::{SecretValue, MAX_VALUE_LEN};

/// How much of standard error is kept for the message.
const STDERR_KEPT: usize = 4096;

/// Why a command gave no value. The text never holds its output.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum CommandFailure {
    #[error("the command could not be started: {0}")]
    Spawn(String),
    #[error("the command did not finish within {0:?} and was killed")]
    Timeout(Duration),
    #[error("the command exited with {status}{}", stderr_suffix(.stderr))]
    Exit { status: String, stderr: String },
    #[error("the command's output is not a usable value: {0}")]
    BadOutput(String),
}

fn stderr_suffix(stderr: &str) -> String {
    if stderr.is_empty() {
        String::new()
    } else {
        format!(": {stderr}")
    }
}

/// Runs `command` and returns its output as a value.
pub(crate) async fn run(command: &str, timeout: Duration) -> Result<SecretValue, CommandFailure> {
    let mut cmd = tokio::process::Command::new("/bin/sh");
    cmd.arg("-c")
        .arg(command)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    let mut child = cmd
        .spawn()
        .map_err(|e| CommandFailure::Spawn(e.to_string()))?;
    let pid = child.id();
    let stdout = child.stdout.take().expect("piped");
    let stderr = child.stderr.take().expect("piped");
    let work = async {
        let (out, err, status) = tokio::join!(
            read_capped(stdout, MAX_VALUE_LEN + 2),
            read_capped(stderr, STDERR_KEPT),
            child.wait()
        );
        (out, err, status)
    };
    let (out, err, status) = match tokio::time::timeout(timeout, work).await {
        Ok(done) => done,
        Err(_) => {
            // The whole group: a shell's children would otherwise hold the pipe open.
            if let Some(pid) = pid.and_then(|p| i32::try_from(p).ok()) {
                let _ = nix::sys::signal::killpg(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
            return Err(CommandFailure::Timeout(timeout));
        }
    };
    let status = status.map_err(|e| CommandFailure::Spawn(e.to_string()))?;
    if !status.success() {
        let first = String::from_utf8_lossy(&err);
        let line = first.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
        let line: String = line.chars().take(200).collect();
        return Err(CommandFailure::Exit {
            status: status.to_string(),
            stderr: line.trim().to_string(),
        });
    }
    let mut out = out;
    if out.last() == Some(&b'\n') {
        out.pop();
        if out.last() == Some(&b'\r') {
            out.pop();
        }
    }
    SecretValue::new(out.to_vec()).map_err(CommandFailure::BadOutput)
}

/// Up to `cap` bytes (the rest is read and dropped, so the writer never blocks).
async fn read_capped<R: AsyncRead + Unpin>(mut r: R, cap: usize) -> Zeroizing<Vec<u8>> {
    let mut kept = Zeroizing::new(Vec::new());
    let mut buf = Zeroizing::new([0u8; 4096]);
    loop {
        match r.read(&mut buf[..]).await {
            Ok(0) | Err(_) => return kept,
            Ok(n) => {
                let room = cap.saturating_sub(kept.len());
                kept.extend_from_slice(&buf[..n.min(room)]);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Duration = Duration::from_secs(5);

    #[tokio::test]
    async fn the_output_less_its_newline_is_the_value() {
        let v = run("printf 'tok_from_command_1\\n'", T)
            .await
            .expect("runs");
        assert_eq!(v.expose(), b"tok_from_command_1");
    }

    #[tokio::test]
    async fn failures_say_why_without_the_output() {
        let e = run(
            "echo partial_output_xyz; echo 'not logged in' >&2; exit 3",
            T,
        )
        .await
        .expect_err("refused");
        let text = e.to_string();
        assert!(
            text.contains("exit status: 3") && text.contains("not logged in"),
            "{text}"
        );
        assert!(!text.contains("partial_output_xyz"), "{text}");
        let e = run("printf short", T).await.expect_err("refused");
        assert!(matches!(e, CommandFailure::BadOutput(_)), "{e}");
        assert!(!e.to_string().contains("short"), "{e}");
        let e = run("printf ''", T).await.expect_err("refused");
        assert!(matches!(e, CommandFailure::BadOutput(_)), "{e}");
    }

    #[tokio::test]
    async fn a_command_past_its_timeout_is_killed_with_its_children() {
        let started = std::time::Instant::now();
        // The background child holds stdout open; only killing the group ends the read.
        let e = run(
            "sleep 30 & sleep 30; echo never_printed_1",
            Duration::from_millis(300),
        )
        .await
        .expect_err("refused");
        assert_eq!(e, CommandFailure::Timeout(Duration::from_millis(300)));
        assert!(started.elapsed() < Duration::from_secs(5));
    }
}
