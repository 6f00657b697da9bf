//! The README's five-minute walkthrough, followed verbatim as root: every command between the
//! `walkthrough:start` and `walkthrough:end` markers runs as written, in order, and what its
//! comment promises (`# 200…`, `# 403 JSON…`, "the tail shows the deny") is checked. Edit the
//! walkthrough and this test follows it; break it and this test fails.
//!
//! What the test arranges around the commands, as a machine would have it:
//! - "the internet" is a network namespace whose HTTPS server answers for `pypi.org` and
//!   `example.com` with a test CA's certificate; an operator's config written before install
//!   (install keeps one already in place) points the daemon's resolver at it
//!   (`[resolver.hosts]`, a dead name server, so no query leaves the machine) and trusts that
//!   CA. Nothing else differs from the defaults.
//! - `cargo build --release` is not run again: `target/release/agenshield` stands for the
//!   binary under test.
//! - With no systemd (containers, CI), install says how to start the daemon and the test does
//!   so, as the service would, and stops it before uninstall, as systemd would.
//! - The interactive agent shell (`sudo -iu ash_default_agent` … `exit`) gets its lines on
//!   stdin; the second terminal's `tail -f` runs beside the rest.
//! - The request after the policy edit is repeated for up to 10 s: the edit is picked up by
//!   the watcher, not at once.
#![cfg(target_os = "linux")]

use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use agenshield_e2e::daemon::binary;
use agenshield_e2e::installation::*;
use agenshield_e2e::netlab::{root_or_skip, Internet};
use agenshield_e2e::pki::TestCa;
use agenshield_e2e::upstream::UpstreamOptions;

const README: &str = include_str!("../../../README.md");

/// One shell command of the walkthrough: its text (with a here-document's lines, if any) and
/// the comment after it.
#[derive(Debug, Clone)]
struct Step {
    command: String,
    comment: String,
}

/// The walkthrough's fenced `sh` blocks, each a list of steps.
fn walkthrough() -> Vec<Vec<Step>> {
    let start = README
        .find("<!-- walkthrough:start -->")
        .expect("README: walkthrough:start marker");
    let end = README
        .find("<!-- walkthrough:end -->")
        .expect("README: walkthrough:end marker");
    let mut blocks = Vec::new();
    let mut lines = README[start..end].lines();
    while let Some(line) = lines.next() {
        if line.trim() != "```sh" {
            continue;
        }
        let mut block = Vec::new();
        while let Some(line) = lines.next() {
            if line.trim() == "```" {
                break;
            }
            let (command, comment) = split_comment(line);
            if command.is_empty() {
                continue;
            }
            let mut command = command.to_string();
            // A here-document: its lines up to the terminator belong to the command.
            if let Some(tag) = heredoc_tag(&command) {
                for body in lines.by_ref() {
                    command.push('\n');
                    command.push_str(body);
                    if body.trim() == tag {
                        break;
                    }
                }
            }
            block.push(Step {
                command,
                comment: comment.to_string(),
            });
        }
        blocks.push(block);
    }
    blocks
}

/// `cmd   # comment` → (`cmd`, `comment`); a `#` inside quotes is not a comment.
fn split_comment(line: &str) -> (&str, &str) {
    let mut quote = None;
    for (i, c) in line.char_indices() {
        match (quote, c) {
            (None, '\'' | '"') => quote = Some(c),
            (Some(q), c) if c == q => quote = None,
            (None, '#') if i == 0 || line[..i].ends_with(char::is_whitespace) => {
                return (line[..i].trim(), line[i + 1..].trim());
            }
            _ => {}
        }
    }
    (line.trim(), "")
}

/// `… <<'TAG'` → `TAG`.
fn heredoc_tag(command: &str) -> Option<String> {
    let rest = command.split("<<").nth(1)?;
    Some(
        rest.trim()
            .trim_matches(|c| c == '\'' || c == '"')
            .to_string(),
    )
}

/// The HTTP status a comment promises (`# 200: …`, `# 403 JSON …`, `# 200 now`).
fn promised_status(comment: &str) -> Option<u16> {
    comment.get(..3)?.parse().ok()
}

fn bash(script: &str) -> Output {
    Command::new("bash")
        .args(["-c", script])
        .stdin(Stdio::null())
        .output()
        .expect("bash")
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// `ctl tail -f` in "a second terminal": its lines, collected as they come.
struct Tail {
    child: Child,
    lines: Arc<Mutex<Vec<String>>>,
}

impl Tail {
    fn start(command: &str) -> Tail {
        let mut child = Command::new("bash")
            .args(["-c", &format!("exec {command}")])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("tail -f");
        let lines = Arc::new(Mutex::new(Vec::new()));
        for pipe in [
            Box::new(child.stdout.take().expect("stdout")) as Box<dyn std::io::Read + Send>,
            Box::new(child.stderr.take().expect("stderr")),
        ] {
            let lines = lines.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                    lines.lock().unwrap_or_else(|p| p.into_inner()).push(line);
                }
            });
        }
        Tail { child, lines }
    }

    fn seen(&self) -> Vec<String> {
        self.lines.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Waits (10 s at most) for a line with every one of `needles`.
    fn wait_for(&self, needles: &[&str]) -> Option<String> {
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Some(l) = self
                .seen()
                .into_iter()
                .find(|l| needles.iter().all(|n| l.contains(n)))
            {
                return Some(l);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        None
    }
}

impl Drop for Tail {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readme_walkthrough_works_as_written() {
    let Some(_serial) = root_or_skip("walkthrough_linux") else {
        return;
    };
    let skip = |why: String| {
        if std::env::var("CI").is_ok_and(|v| v == "true") {
            panic!("walkthrough_linux: {why}");
        }
        let _ = writeln!(std::io::stderr(), "SKIP walkthrough_linux: {why}");
    };
    if let Some(why) = installed_already() {
        return skip(format!("{why}; refusing to touch an existing installation"));
    }
    if !bash("command -v sudo").status.success() {
        return skip("sudo is missing (the walkthrough's commands use it)".into());
    }
    let blocks = walkthrough();
    let steps: Vec<&Step> = blocks.iter().flatten().collect();
    assert!(
        steps.len() >= 8,
        "the walkthrough lost its steps: {blocks:#?}"
    );

    let mut cleanup = Cleanup {
        daemon: None,
        existed: candidates().into_iter().filter(|p| p.exists()).collect(),
        extra_files: Vec::new(),
    };

    // The internet, in a namespace: pypi.org and example.com, served with a test CA.
    let net = Internet::create();
    let ca = TestCa::new("walkthrough upstream CA");
    let leaf = ca.leaf(&["pypi.org", "example.com"]);
    let upstream = net.serve(
        SocketAddr::new(net.a4, 443),
        UpstreamOptions {
            tls: Some(leaf),
            name: "walkthrough".into(),
            ..Default::default()
        },
    );
    net.assert_route(net.a4);
    let share = tempfile::tempdir().expect("tempdir");
    std::fs::set_permissions(share.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let upstream_ca = share.path().join("upstream-ca.pem");
    ca.write_pem(&upstream_ca).expect("write CA");

    // The operator's config, in place before install (which keeps it): the defaults, but
    // for where "the internet" is.
    let config = format!(
        "[daemon]\nworker_user = \"{BROKER}\"\n\n\
         [listen]\nadmin = \"{RUN_DIR}/proxy.sock\"\n\n\
         [redirect]\nenabled = true\nagent_users = [\"{AGENT}\"]\n\n\
         [upstream]\nextra_ca = [\"{}\"]\nallow_private = [\"{}\"]\n\n\
         [resolver]\nnameservers = [\"127.0.0.1:9\"]\n\n\
         [resolver.hosts]\n\"pypi.org\" = [\"{a4}\"]\n\"example.com\" = [\"{a4}\"]\n",
        upstream_ca.display(),
        net.net4,
        a4 = net.a4,
    );
    std::fs::create_dir_all("/opt/agenshield/config").expect("config dir");
    std::fs::write("/opt/agenshield/config/proxy.toml", &config).expect("config");
    let retired_configs = || -> Vec<PathBuf> {
        std::fs::read_dir("/opt/agenshield/config")
            .map(|d| d.flatten().map(|e| e.path()).collect())
            .unwrap_or_default()
    };

    let daemon_log = share.path().join("daemon.log");
    let systemd = Path::new("/run/systemd/system").exists();
    let mut tail: Option<Tail> = None;
    let mut agent_said = String::new();
    let mut done = Vec::new();
    let mut i = 0;
    while i < steps.len() {
        let step = steps[i];
        let cmd = step.command.as_str();
        let at = i;
        let context = || format!("step {at}: `{cmd}`\ndaemon log:\n{}", read(&daemon_log));
        if cmd.starts_with("cargo build") {
            // Built already: the binary under test.
        } else if cmd.ends_with("tail -f") {
            tail = Some(Tail::start(cmd));
            // It is running when it prints its first line (the stream's start).
            std::thread::sleep(Duration::from_millis(500));
            assert!(
                tail.as_mut()
                    .is_some_and(|t| t.child.try_wait().ok().flatten().is_none()),
                "tail -f ended: {:?}\n{}",
                tail.as_ref().map(Tail::seen),
                context()
            );
        } else if let Some(user) = cmd.strip_prefix("sudo -iu ").filter(|u| !u.contains(' ')) {
            // The agent's interactive shell: the lines up to `exit`, on its stdin.
            let mut script = String::new();
            let mut promised = Vec::new();
            i += 1;
            while steps[i].command != "exit" {
                script.push_str(&steps[i].command);
                script.push('\n');
                promised.push(steps[i].comment.clone());
                i += 1;
            }
            script.push_str("exit\n");
            let mut child = Command::new("sudo")
                .args(["-iu", user])
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("sudo -iu");
            child
                .stdin
                .take()
                .expect("stdin")
                .write_all(script.as_bytes())
                .expect("the agent's shell");
            let out = child.wait_with_output().expect("the agent's shell");
            agent_said = String::from_utf8_lossy(&out.stdout).into_owned();
            check_agent_shell(&agent_said, &promised, &text(&out), &context());
        } else {
            let cmd = cmd.replace("target/release/agenshield", &binary().display().to_string());
            let promised = promised_status(&step.comment);
            let deadline = Instant::now() + Duration::from_secs(10);
            let out = loop {
                let out = bash(&cmd);
                let ok = out.status.success()
                    && promised.is_none_or(|code| {
                        String::from_utf8_lossy(&out.stdout).trim() == code.to_string()
                    });
                if ok || promised.is_none() || Instant::now() > deadline {
                    break out;
                }
                std::thread::sleep(Duration::from_millis(250));
            };
            assert!(out.status.success(), "{}\n{}", text(&out), context());
            if let Some(code) = promised {
                assert_eq!(
                    String::from_utf8_lossy(&out.stdout).trim(),
                    code.to_string(),
                    "{}",
                    context()
                );
            }
            if cmd.contains("proxy install") && !systemd {
                // What the service would do: start the installed daemon.
                assert!(
                    text(&out).contains("proxy run"),
                    "install says how to start the daemon without systemd:\n{}",
                    text(&out)
                );
                cleanup.daemon = Some(start_daemon(&daemon_log));
            }
            if cmd.contains("proxy doctor") {
                assert!(!text(&out).contains("FAIL"), "{}", text(&out));
            }
            if cmd.contains("proxy uninstall") {
                assert!(!user_exists(AGENT), "{}", text(&out));
            }
        }
        // Uninstall stops the service; with none, the test stops the daemon it started.
        if steps
            .get(i + 1)
            .is_some_and(|s| s.command.contains("proxy uninstall"))
        {
            cleanup.stop_daemon();
        }
        done.push(cmd.to_string());
        i += 1;
    }

    // The second terminal showed the denied request, and the allowed ones, as they came.
    let tail = tail.expect("the walkthrough runs `ctl tail -f`");
    assert!(
        tail.wait_for(&["example.com"]).is_some(),
        "the tail did not show the denied request: {:?}",
        tail.seen()
    );
    let deny = tail
        .seen()
        .into_iter()
        .find(|l| l.contains("example.com") && l.contains("deny"));
    assert!(deny.is_some(), "no deny in the tail: {:?}", tail.seen());
    assert!(
        tail.seen().iter().any(|l| l.contains("pypi.org")),
        "{:?}",
        tail.seen()
    );
    // The upstream saw the allowed requests, and example.com only after the edit.
    let seen: Vec<String> = upstream
        .requests()
        .iter()
        .map(|r| {
            let host = r.sni.clone().or(r.authority.clone()).unwrap_or_default();
            format!("{host} {}", r.path_and_query)
        })
        .collect();
    assert!(
        seen.iter()
            .any(|r| r.contains("pypi.org") && r.contains("/simple/")),
        "{seen:?}"
    );
    assert_eq!(
        seen.iter().filter(|r| r.contains("example.com")).count(),
        1,
        "example.com reached the upstream once, after the rule: {seen:?}\nagent: {agent_said}"
    );
    drop(tail);
    // Uninstall kept the config it did not write, renamed; the test's own leftovers go.
    for p in retired_configs() {
        let _ = std::fs::remove_file(p);
    }
    let _ = std::fs::remove_dir_all(HOME);
    if !cleanup.existed.contains(&PathBuf::from(LOG_DIR)) {
        let _ = std::fs::remove_dir_all(LOG_DIR);
    }
    let _ = std::fs::remove_dir_all("/opt/agenshield/policies");
    let _ = std::fs::remove_dir("/opt/agenshield/config");
    if !cleanup.existed.contains(&PathBuf::from(ROOT)) {
        let _ = std::fs::remove_dir(ROOT);
    }
    assert!(
        done.iter().any(|c| c.contains("proxy uninstall")),
        "{done:?}"
    );
}

/// The agent's shell printed, for each command, what its comment promised: `200` alone, or a
/// JSON 403 that says why.
fn check_agent_shell(stdout: &str, promised: &[String], all: &str, context: &str) {
    let mut rest = stdout;
    for comment in promised {
        match promised_status(comment) {
            Some(200) => {
                let (line, tail) = rest.split_once('\n').unwrap_or((rest, ""));
                assert_eq!(line.trim(), "200", "`{comment}`: {all}\n{context}");
                rest = tail;
            }
            Some(403) => {
                let mut de =
                    serde_json::Deserializer::from_str(rest).into_iter::<serde_json::Value>();
                let refusal = de
                    .next()
                    .and_then(Result::ok)
                    .unwrap_or_else(|| panic!("`{comment}`: no JSON 403 in {all}\n{context}"));
                // The deny response's contract (DESIGN.md): a code, a message, the rule.
                assert_eq!(
                    refusal["error_code"], "policy_denied",
                    "`{comment}`: {refusal}"
                );
                assert!(
                    refusal["message"].as_str().is_some_and(|m| !m.is_empty())
                        && refusal.get("rule_id").is_some(),
                    "`{comment}`: the 403 says why and names the rule: {refusal}"
                );
                rest = &rest[de.byte_offset()..];
                rest = rest.trim_start_matches('\n');
            }
            other => panic!("a comment promising {other:?}: `{comment}`"),
        }
    }
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_default()
}
