//! Running a firewall tool (`nft`, `pfctl`): the one way the backends shell out.

use std::io::Write as _;
use std::process::{Command, Stdio};

use crate::redirect::RedirectError;

/// What a command printed, when it succeeded.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Output {
    pub stdout: String,
    pub stderr: String,
}

/// Runs `program args…` with `stdin`, the single way the firewall backends shell out: a failure to
/// start is `Spawn`, a non-zero exit is `Command` carrying what it wrote on stderr. On
/// success both streams are returned (`pfctl -E` prints its token on stderr).
pub fn run(program: &str, args: &[&str], stdin: Option<&str>) -> Result<Output, RedirectError> {
    let command = std::iter::once(program)
        .chain(args.iter().copied())
        .collect::<Vec<_>>()
        .join(" ");
    let spawn = |source| RedirectError::Spawn {
        command: command.clone(),
        source,
    };
    let mut child = Command::new(program)
        .args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(spawn)?;
    let pipe = child.stdin.take();
    // Feed stdin from another thread, so a child that answers before reading everything
    // cannot deadlock us on a full pipe.
    let out = std::thread::scope(|scope| {
        let writer = scope.spawn(move || match (stdin, pipe) {
            (Some(text), Some(mut pipe)) => pipe.write_all(text.as_bytes()),
            _ => Ok(()),
        });
        let out = child.wait_with_output();
        let written = writer
            .join()
            .unwrap_or_else(|_| Err(std::io::Error::other("stdin writer panicked")));
        out.map(|o| (o, written))
    })
    .map_err(spawn)?;
    let (out, written) = out;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).trim().to_string();
    if !out.status.success() {
        return Err(RedirectError::Command {
            command,
            stderr: if stderr.is_empty() {
                format!("exited with {}", out.status)
            } else {
                stderr
            },
        });
    }
    // Exited 0 without reading all its input: it did not see what we meant to give it.
    written.map_err(spawn)?;
    Ok(Output { stdout, stderr })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_returns_both_streams_on_success() {
        let out =
            run("sh", &["-c", "cat; echo 'Token : 42' >&2"], Some("rules\n")).expect("sh runs");
        assert_eq!(out.stdout, "rules\n");
        assert_eq!(crate::pf::token::parse_enable_output(&out.stderr), Some(42));
    }

    #[test]
    fn run_reports_stderr_of_a_failure() {
        let err = run(
            "sh",
            &[
                "-c",
                "echo 'pfctl: Syntax error in config file' >&2; exit 1",
            ],
            None,
        )
        .expect_err("exit 1");
        match err {
            RedirectError::Command { command, stderr } => {
                assert!(command.starts_with("sh -c"), "{command}");
                assert_eq!(stderr, "pfctl: Syntax error in config file");
            }
            other => panic!("expected Command, got {other:?}"),
        }
        let silent = run("sh", &["-c", "exit 3"], None).expect_err("exit 3");
        assert!(silent.to_string().contains("exit status: 3"), "{silent}");
    }

    #[test]
    fn run_reports_a_missing_program() {
        let err = run("/nonexistent/pfctl", &["-sr"], None).expect_err("missing");
        assert!(matches!(err, RedirectError::Spawn { .. }), "{err:?}");
    }

    #[test]
    fn run_feeds_large_input_without_deadlock() {
        let big = "pass out quick proto tcp user = 5200\n".repeat(20_000);
        let out = run("sh", &["-c", "cat"], Some(&big)).expect("cat");
        assert_eq!(out.stdout.len(), big.len());
    }
}
