//! Running a command secret's command: a shell as the daemon's own user (the worker's, under
//! the privilege split), in its own process group, killed whole when the timeout passes. Its
//! standard output, less one trailing newline, is the value; its standard error only ever
//! reaches the daemon's log (first line, bounded), never the agent; its output is never
//! logged.
//!
//! The command is not an argument: every local user (the agent too) can read any process's
//! arguments in `/proc/PID/cmdline` or `ps`, and a command often carries a credential
//! (`curl -H 'Authorization: …'`). The shell gets a fixed program as its argument, which
//! reads the command from its standard input (a pipe only it holds), points its standard
//! input at /dev/null (as the command always had it), and evaluates the command.

use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use zeroize::Zeroizing;

use crate::secrets::store::value::{SecretValue, MAX_VALUE_LEN};

/// How much of standard error is kept for the message.
const STDERR_KEPT: usize = 4096;

/// The shell's whole argument: the command comes on standard input. (`sh -s` would leave the
/// rest of the script on the command's standard input; this reads all of it first.)
const RUNNER: &str = "script=$(/bin/cat) && exec </dev/null && eval \"$script\"";

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
        .arg(RUNNER)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    let mut child = cmd
        .spawn()
        .map_err(|e| CommandFailure::Spawn(e.to_string()))?;
    let pid = child.id();
    let mut stdin = child.stdin.take().expect("piped");
    let stdout = child.stdout.take().expect("piped");
    let stderr = child.stderr.take().expect("piped");
    let script = async move {
        // A shell that exits early (a syntax error) closes the pipe: its status says why.
        let _ = stdin.write_all(command.as_bytes()).await;
        drop(stdin);
    };
    let work = async {
        let ((), out, err, status) = tokio::join!(
            script,
            read_capped(stdout, MAX_VALUE_LEN + 2),
            read_capped(stderr, STDERR_KEPT),
            child.wait()
        );
        (out, err.0, status)
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
    let (mut out, printed) = out;
    if printed > out.len() {
        return Err(CommandFailure::BadOutput(format!(
            "the command printed {printed} bytes; at most {MAX_VALUE_LEN} fit in a request header"
        )));
    }
    if out.last() == Some(&b'\n') {
        out.pop();
        if out.last() == Some(&b'\r') {
            out.pop();
        }
    }
    SecretValue::new(out.to_vec()).map_err(|e| CommandFailure::BadOutput(e.to_string()))
}

/// Up to `cap` bytes (the rest is read and dropped, so the writer never blocks), and how
/// many there were in all.
async fn read_capped<R: AsyncRead + Unpin>(mut r: R, cap: usize) -> (Zeroizing<Vec<u8>>, usize) {
    let mut kept = Zeroizing::new(Vec::new());
    let mut buf = Zeroizing::new([0u8; 4096]);
    let mut total = 0;
    loop {
        match r.read(&mut buf[..]).await {
            Ok(0) | Err(_) => return (kept, total),
            Ok(n) => {
                total += n;
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

    /// The command is never an argument of any process (where every local user could read
    /// it), and it runs with /dev/null, not the script, on its standard input.
    #[cfg(target_os = "linux")]
    #[tokio::test]
    async fn the_command_is_in_no_processs_arguments_and_reads_dev_null() {
        let marker = format!("argv_marker_{}", std::process::id());
        let command = format!(": {marker}; sleep 1; cat; printf 'tok_stdin_%s\\n' \"$(wc -c)\"");
        let running = tokio::spawn(async move { run(&command, T).await });
        let mut seen = Vec::new();
        for _ in 0..8 {
            tokio::time::sleep(Duration::from_millis(100)).await;
            for e in std::fs::read_dir("/proc").expect("/proc").flatten() {
                let cmdline = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
                if String::from_utf8_lossy(&cmdline).contains(&marker) {
                    seen.push(String::from_utf8_lossy(&cmdline).replace('\0', " "));
                }
            }
        }
        let v = running.await.expect("task").expect("runs");
        assert!(seen.is_empty(), "the command is visible: {seen:?}");
        assert_eq!(v.expose(), b"tok_stdin_0", "nothing on its stdin");
        // Several lines, quotes and a trailing comment run as `sh -c` would run them.
        let v = run("x='a b'\nprintf '%s-%s' \"$x\" \"$0\" # done", T)
            .await
            .expect("runs");
        assert_eq!(v.expose(), b"a b-/bin/sh");
        let e = run("if then fi", T).await.expect_err("a syntax error");
        assert!(matches!(e, CommandFailure::Exit { .. }), "{e}");
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
