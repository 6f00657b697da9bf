//! The agent's environment as its processes get it, captured by starting a shell as the
//! agent: a login shell (`su -l`, which reads `~/.profile`), and, on Linux, a shell outside
//! any login (`su -s /bin/sh` from an empty environment: only PAM's session environment
//! reaches it, as with `sudo -u`, cron and systemd units that use PAM). When doctor runs as
//! the agent itself, its own environment is the context.
//!
//! `su` is root's own (a fixed, root-owned path, [`system_tool`]), started in a session of its
//! own with stdin closed: the agent's start-up files run without a controlling terminal, so
//! they cannot reach the terminal doctor was started from (no `TIOCSTI` into root's shell),
//! and what they print is bounded in time and size.

use std::collections::BTreeMap;
use std::process::Command;
use std::time::Duration;

use super::bounded::{self, RunError};
use super::system_tool;

/// The line the capturing shell prints before `env`, so that whatever a start-up file
/// prints is not taken for variables.
const MARKER: &str = "@@agenshield-doctor-env@@";
/// A start-up file that waits for input or loops must not hang doctor.
const TIMEOUT: Duration = Duration::from_secs(15);

/// How the agent's process was started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContextKind {
    Login,
    NonLogin,
    ThisProcess,
}

impl ContextKind {
    pub fn name(self) -> &'static str {
        match self {
            ContextKind::Login => "login shell (su -l)",
            ContextKind::NonLogin => "outside a login shell (su, sudo -u, cron: PAM only)",
            ContextKind::ThisProcess => "this process",
        }
    }

    /// A short name for lists.
    pub fn short(self) -> &'static str {
        match self {
            ContextKind::Login => "login",
            ContextKind::NonLogin => "non-login",
            ContextKind::ThisProcess => "this process",
        }
    }
}

/// One environment the agent's tools may run in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Context {
    pub kind: ContextKind,
    pub env: BTreeMap<String, String>,
}

impl Context {
    pub fn get(&self, var: &str) -> Option<&str> {
        self.env
            .get(var)
            .map(String::as_str)
            .filter(|v| !v.is_empty())
    }

    /// A variable whose name is matched without regard to case (npm's `npm_config_*`).
    pub fn get_any_case(&self, var: &str) -> Option<&str> {
        self.env
            .iter()
            .rev()
            .find(|(k, v)| k.eq_ignore_ascii_case(var) && !v.is_empty())
            .map(|(_, v)| v.as_str())
    }

    pub fn this_process() -> Context {
        Context {
            kind: ContextKind::ThisProcess,
            env: std::env::vars().collect(),
        }
    }
}

/// The agent's login-shell environment.
pub fn login(agent: &str) -> Result<Context, String> {
    let mut cmd = su()?;
    cmd.args(["-l", agent, "-c", &script()]);
    capture(ContextKind::Login, cmd)
}

/// Root's `su`, detached from any terminal.
fn su() -> Result<Command, String> {
    let path = system_tool::find(system_tool::SU).map_err(|e| format!("no root-owned su: {e}"))?;
    let mut cmd = Command::new(path);
    agenshield_pf::run_as::detach(&mut cmd);
    Ok(cmd)
}

/// The agent's environment outside a login shell (Linux; PAM's session environment only).
pub fn non_login(agent: &str) -> Result<Context, String> {
    let mut cmd = su()?;
    cmd.args([agent, "-s", "/bin/sh", "-c", &script()])
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .current_dir("/");
    capture(ContextKind::NonLogin, cmd)
}

fn script() -> String {
    format!("printf '\\n%s\\n' '{MARKER}'; env")
}

fn capture(kind: ContextKind, cmd: Command) -> Result<Context, String> {
    let ran = bounded::output(cmd, TIMEOUT).map_err(|e| match e {
        RunError::Start(e) => format!("cannot start su: {e}"),
        RunError::TimedOut(t) => format!(
            "the agent's {} did not finish within {}s (a start-up file waits or loops?)",
            kind.name(),
            t.as_secs()
        ),
        RunError::TooLarge => format!(
            "the agent's {} printed more than {} MiB",
            kind.name(),
            bounded::MAX_OUTPUT >> 20
        ),
    })?;
    let out = String::from_utf8_lossy(&ran.stdout);
    let Some((_, env_text)) = out.split_once(&format!("\n{MARKER}\n")) else {
        return Err(format!(
            "su as the agent failed ({}): {}",
            ran.status,
            String::from_utf8_lossy(&ran.stderr)
                .trim()
                .lines()
                .last()
                .unwrap_or("no output")
        ));
    };
    Ok(Context {
        kind,
        env: parse_env(env_text),
    })
}

/// `env`'s output: `NAME=value` lines; a line that does not start with a name continues the
/// value before it (a value holding a newline).
fn parse_env(text: &str) -> BTreeMap<String, String> {
    let mut env = BTreeMap::new();
    let mut last: Option<String> = None;
    for line in text.lines() {
        match line.split_once('=') {
            Some((k, v))
                if !k.is_empty()
                    && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                    && !k.starts_with(|c: char| c.is_ascii_digit()) =>
            {
                env.insert(k.to_string(), v.to_string());
                last = Some(k.to_string());
            }
            _ => {
                if let Some(v) = last.as_ref().and_then(|k| env.get_mut(k)) {
                    v.push('\n');
                    v.push_str(line);
                }
            }
        }
    }
    env
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_output_is_parsed_with_multiline_values() {
        let env = parse_env("A=1\nnpm_config_cafile=/x\nB=two\nlines\n=junk\n");
        assert_eq!(env["A"], "1");
        assert_eq!(env["B"], "two\nlines\n=junk");
        let ctx = Context {
            kind: ContextKind::Login,
            env,
        };
        assert_eq!(ctx.get_any_case("NPM_CONFIG_CAFILE"), Some("/x"));
        assert_eq!(ctx.get("MISSING"), None);
    }

    #[test]
    fn what_a_start_up_file_prints_is_not_taken_for_variables() {
        let mut cmd = Command::new("/bin/sh");
        cmd.args(["-c", &format!("echo NOISE=1; {}", script())])
            .env_clear()
            .env("ONLY", "this");
        let ctx = capture(ContextKind::Login, cmd).expect("capture");
        assert_eq!(ctx.get("ONLY"), Some("this"));
        assert_eq!(ctx.get("NOISE"), None);
        let mut fails = Command::new("/bin/sh");
        fails.args(["-c", "echo 'su: user x does not exist' >&2; exit 1"]);
        let err = capture(ContextKind::Login, fails).expect_err("no marker");
        assert!(err.contains("user x does not exist"), "{err}");
    }
}
