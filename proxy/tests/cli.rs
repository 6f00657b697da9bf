//! The `agenshield` command line as an operator meets it: help, version, exit codes, and a
//! first run on built-in defaults.

use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn agenshield() -> Command {
    Command::new(env!("CARGO_BIN_EXE_agenshield"))
}

fn output(args: &[&str]) -> (Option<i32>, String, String) {
    let out = agenshield().args(args).output().expect("run agenshield");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn help_describes_the_commands() {
    let (code, out, _) = output(&["--help"]);
    assert_eq!(code, Some(0));
    assert!(out.contains("proxy"), "{out}");
    let (code, out, _) = output(&["proxy", "run", "--help"]);
    assert_eq!(code, Some(0));
    for needle in ["--config", "15001", "15080", "SIGHUP", "state"] {
        assert!(
            out.contains(needle),
            "run --help should mention {needle}:\n{out}"
        );
    }
}

#[test]
fn version_is_printed() {
    let (code, out, _) = output(&["--version"]);
    assert_eq!(code, Some(0));
    assert!(out.starts_with("agenshield "), "{out}");
}

#[test]
fn bad_usage_exits_2() {
    let (code, _, err) = output(&["proxy", "frobnicate"]);
    assert_eq!(code, Some(2), "{err}");
}

#[test]
fn unknown_config_key_exits_2_with_file_line_and_column() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = dir.path().join("proxy.toml");
    std::fs::write(
        &cfg,
        "[listen]\nexplicit = \"127.0.0.1:0\"\ntransparant = []\n",
    )
    .expect("write");
    let (code, _, err) = output(&["proxy", "run", "--config", cfg.to_str().expect("utf-8")]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("proxy.toml:3:1"), "{err}");
    assert!(err.contains("transparant"), "{err}");
}

#[test]
fn missing_config_file_exits_2() {
    let (code, _, err) = output(&["proxy", "run", "--config", "/nonexistent/proxy.toml"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("/nonexistent/proxy.toml"), "{err}");
}

/// `agenshield proxy run` with no config must work out of the box: it says where its state
/// is, creates the CA (key 0600) and seeds the default policy. It binds the default ports,
/// so it only runs when they are free (they are in CI).
#[test]
fn first_run_on_defaults_creates_state_and_serves() {
    // Every address the defaults bind (a missing IPv6 loopback is tolerated by the daemon).
    let busy: Vec<&str> = ["127.0.0.1:15001", "127.0.0.1:15080", "127.0.0.1:15090"]
        .into_iter()
        .chain(
            std::net::TcpListener::bind("[::1]:0")
                .is_ok()
                .then_some("[::1]:15001"),
        )
        .filter(|a| std::net::TcpListener::bind(a).is_err())
        // The DNS stub takes UDP and TCP.
        .chain(["127.0.0.1:15053"].into_iter().filter(|a| {
            std::net::TcpListener::bind(a).is_err() || std::net::UdpSocket::bind(a).is_err()
        }))
        .collect();
    if !busy.is_empty() {
        assert!(
            std::env::var("CI").is_err(),
            "default ports {busy:?} are taken on a CI machine"
        );
        eprintln!("SKIP first_run_on_defaults: default ports {busy:?} are in use here");
        return;
    }
    let state = tempfile::tempdir().expect("tempdir");
    let mut child = agenshield()
        .args(["proxy", "run"])
        .env("AGENSHIELD_STATE_DIR", state.path())
        .env("HOME", state.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::from(
            std::fs::File::create(state.path().join("stderr.log")).expect("stderr log"),
        ))
        .spawn()
        .expect("spawn");
    let stdout = child.stdout.take().expect("stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut seen = Vec::new();
    while !seen
        .iter()
        .any(|l: &String| l.starts_with("agenshield: ready "))
    {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) => seen.push(line),
            Err(_) => break,
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    let all = seen.join("\n");
    let log = std::fs::read_to_string(state.path().join("stderr.log")).unwrap_or_default();
    assert!(
        all.contains("agenshield: ready "),
        "never ready:\n{all}\nstderr:\n{log}"
    );
    assert!(
        all.contains(&state.path().display().to_string()),
        "state dir not printed:\n{all}"
    );
    assert!(all.contains("transparent=127.0.0.1:15001"), "{all}");
    assert!(all.contains("explicit=127.0.0.1:15080"), "{all}");
    assert!(all.contains("dns=127.0.0.1:15053"), "{all}");
    let key = state.path().join("certs/ca-key.pem");
    let mode = std::fs::metadata(&key)
        .expect("CA key created")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600, "CA key mode {mode:o}");
    assert!(state.path().join("certs/ca.pem").exists());
    assert!(state.path().join("policies/default.toml").exists());
}

/// `ctl secrets set` runs with `input` on stdin against a socket nobody serves.
fn secrets_set(name: &str, input: &[u8], socket: &std::path::Path) -> (Option<i32>, String) {
    use std::io::Write as _;
    let mut child = agenshield()
        .args(["proxy", "ctl", "secrets", "set", name, "--socket"])
        .arg(socket)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let mut stdin = child.stdin.take().expect("stdin");
    // The command may refuse (a bad name) before it reads stdin; a closed pipe is fine then.
    if let Err(e) = stdin.write_all(input) {
        assert_eq!(e.kind(), std::io::ErrorKind::BrokenPipe, "write: {e}");
    }
    drop(stdin);
    let out = child.wait_with_output().expect("wait");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn secrets_set_takes_the_value_from_stdin_only_and_checks_it_before_sending() {
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = dir.path().join("none.sock");
    // No value on the command line: an extra argument is bad usage.
    let (code, _, err) = output(&["proxy", "ctl", "secrets", "set", "k", "sk-value-on-argv"]);
    assert_eq!(code, Some(2), "{err}");
    // Bad names and bad values are bad input (2), said without echoing the value.
    let (code, err) = secrets_set("bad name", b"a-good-value-123", &socket);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("invalid secret name"), "{err}");
    let (code, err) = secrets_set("k", b"", &socket);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("no value on stdin"), "{err}");
    let (code, err) = secrets_set("k", b"tiny\n", &socket);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("at least 8") && !err.contains("tiny"), "{err}");
    // A good value with no daemon: the operation failed (1), one line.
    let (code, err) = secrets_set("k", b"a-good-value-123\n", &socket);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("the daemon is not running"), "{err}");
    assert!(!err.contains("a-good-value-123"), "{err}");
}

/// A daemon whose policy binds a secret the vault lacks does not start: exit 2, and the
/// message names the file, the rule, the secret and the command that fixes it.
#[test]
fn a_policy_binding_a_missing_secret_stops_the_start_with_the_fix() {
    let dir = tempfile::tempdir().expect("tempdir");
    let policies = dir.path().join("policies");
    std::fs::create_dir(&policies).expect("mkdir");
    std::fs::write(
        policies.join("api.toml"),
        "version = 1\n[[rule]]\nid = \"gh\"\nhosts = [\"api.github.com\"]\naction = \"allow\"\ninject = [{ header = \"Authorization\", value = \"token ${secret:github}\" }]\n",
    )
    .expect("policy");
    let cfg = dir.path().join("proxy.toml");
    std::fs::write(
        &cfg,
        "[listen]\ntransparent = [\"127.0.0.1:0\"]\nexplicit = \"127.0.0.1:0\"\ndns = \"127.0.0.1:0\"\nadmin = \"a.sock\"\nmetrics = \"off\"\n[paths]\npolicies = \"policies\"\ncerts = \"certs\"\nvault = \"vault\"\naudit = \"audit.jsonl\"\n",
    )
    .expect("config");
    let (code, _, err) = output(&["proxy", "run", "--config", cfg.to_str().expect("utf-8")]);
    assert_eq!(code, Some(2), "{err}");
    for needle in [
        "api.toml:6:",
        "rule `gh`",
        "\"github\"",
        "ctl secrets set github",
    ] {
        assert!(err.contains(needle), "{needle}: {err}");
    }
    // The vault it made on the way is private.
    let mode = std::fs::metadata(dir.path().join("vault"))
        .expect("vault made")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o700);
}
