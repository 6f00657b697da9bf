//! What ctl writes. Results go to stdout, and a reader that went away (`ctl status | head
//! -1`) ends the command quietly with 0 rather than a panic. Failures go to stderr as one
//! `agenshield: …` line and, under `--json`, also to stdout as one JSON object
//! (`{"ok": false, "error": {"code", "message", "file", "line", "column"}}`), so a script
//! reading stdout always gets JSON.

use std::io::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};

use super::{BAD_INPUT, FAILED};

/// `--json` for this run (one command per process).
static JSON: AtomicBool = AtomicBool::new(false);

pub(crate) fn set_json(json: bool) {
    JSON.store(json, Ordering::Relaxed);
}

/// Prints `text` and a newline on stdout; exits 0 if stdout is closed.
pub(crate) fn line(text: &str) {
    let mut out = std::io::stdout().lock();
    if writeln!(out, "{text}").and_then(|()| out.flush()).is_err() {
        std::process::exit(0);
    }
}

/// Why a command failed, in a form a script can branch on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ErrorCode {
    /// The command line or an input file is wrong (exit 2).
    BadInput,
    /// The operation failed (exit 1).
    Failed,
    /// The daemon is not running.
    NotRunning,
    /// The admin socket refused this user.
    NoAccess,
    /// The daemon answered with a refusal.
    Refused,
    /// The daemon's answer could not be understood.
    Protocol,
}

impl ErrorCode {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            ErrorCode::BadInput => "bad_input",
            ErrorCode::Failed => "failed",
            ErrorCode::NotRunning => "not_running",
            ErrorCode::NoAccess => "no_access",
            ErrorCode::Refused => "refused",
            ErrorCode::Protocol => "protocol",
        }
    }

    pub(crate) fn exit(self) -> u8 {
        match self {
            ErrorCode::BadInput => BAD_INPUT,
            _ => FAILED,
        }
    }
}

/// Where in a file an error is, when there is such a place.
#[derive(Debug, Clone, Default)]
pub(crate) struct Place {
    pub file: Option<String>,
    pub line: Option<usize>,
    pub column: Option<usize>,
}

/// Reports a failure; returns its exit code.
pub(crate) fn error(code: ErrorCode, message: &str) -> u8 {
    error_at(code, message, &Place::default())
}

/// `error` with the file, line and column it is about.
pub(crate) fn error_at(code: ErrorCode, message: &str, at: &Place) -> u8 {
    let mut err = std::io::stderr().lock();
    // What the daemon said may carry terminal controls; the JSON below stays exact.
    let shown = super::escape::escape_lines(message);
    if message.starts_with('/') || at.file.is_some() {
        let _ = writeln!(err, "{shown}");
    } else {
        let _ = writeln!(err, "agenshield: {shown}");
    }
    if JSON.load(Ordering::Relaxed) {
        let mut e = serde_json::json!({ "code": code.as_str(), "message": message });
        if let Some(f) = &at.file {
            e["file"] = f.as_str().into();
        }
        if let Some(l) = at.line {
            e["line"] = l.into();
        }
        if let Some(c) = at.column {
            e["column"] = c.into();
        }
        line(&serde_json::json!({ "ok": false, "error": e }).to_string());
    }
    code.exit()
}

/// A bad command line or input (exit 2).
pub(crate) fn bad_input(message: impl std::fmt::Display) -> u8 {
    error(ErrorCode::BadInput, &message.to_string())
}

/// A failed operation (exit 1).
pub(crate) fn failed(message: impl std::fmt::Display) -> u8 {
    error(ErrorCode::Failed, &message.to_string())
}
