//! `ctl` where an operator's scripts meet it: a reader that goes away (`| head -1`), `--json`
//! failures a script can parse, `--decision` checked before anything is asked, the CA shown
//! and exported, `policy check --exit-code` for CI, `policy check` deciding offline when the
//! daemon is down, `policy lint DIR`, and `default` refused as a rule id. The real binary
//! against a real daemon.

use agenshield_e2e::daemon::{Daemon, DaemonOptions};

const POLICY: &str = r#"version = 1
default = "deny"

[[rule]]
id = "x"
hosts = ["x.test"]
action = "deny"

[[rule]]
id = "y"
hosts = ["y.test"]
action = "allow"
"#;

fn json(out: &str) -> serde_json::Value {
    serde_json::from_str(out).unwrap_or_else(|e| panic!("not JSON ({e}): {out:?}"))
}

#[test]
fn ctl_serves_scripts_closed_pipes_json_errors_the_ca_and_ci_checks() {
    let mut daemon = Daemon::start(DaemonOptions {
        policies: vec![("main.toml".into(), POLICY.into())],
        hosts: vec![("y.test".into(), std::net::Ipv4Addr::LOCALHOST.into())],
        allow_private: vec!["127.0.0.0/8".into()],
        ..Default::default()
    });

    // 1. A reader that closes early: every command ends quietly with 0, never a panic.
    let pipe = |args: &[&str]| {
        let script = "\"$@\" | true; exit ${PIPESTATUS[0]}";
        let prefix: Vec<String> = ["bash", "-c", script, "ctl"].map(String::from).to_vec();
        daemon.ctl(&prefix, args)
    };
    for args in [
        &["status"][..],
        &["stats"],
        &["policy", "show"],
        &["status", "--json"],
        &["secrets", "list"],
    ] {
        let (code, _, err) = pipe(args);
        assert_eq!(code, 0, "{args:?} into a closed pipe: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }

    // 2. The CA: shown (same fingerprint as `status`), exported as the daemon wrote it.
    let (code, out, err) = daemon.ctl(&[], &["ca", "show", "--json"]);
    assert_eq!(code, 0, "{err}");
    let ca = json(&out);
    let (code, out, _) = daemon.ctl(&[], &["status", "--json"]);
    assert_eq!(code, 0);
    let status = json(&out);
    assert_eq!(ca["sha256"], status["ca"]["sha256"], "{ca} vs {status}");
    assert_eq!(ca["path"], daemon.ca_path.display().to_string());
    assert_eq!(ca["is_ca"], true);
    let (_, human, _) = daemon.ctl(&[], &["status"]);
    assert!(
        human.contains(ca["sha256"].as_str().expect("sha256")),
        "{human}"
    );
    let (code, pem, _) = daemon.ctl(&[], &["ca", "export"]);
    assert_eq!(code, 0);
    assert_eq!(pem.trim(), daemon.ca_pem.trim());

    // 3. --decision is checked before the daemon is asked; the valid values are listed.
    let (code, out, err) = daemon.ctl(&[], &["tail", "--decision", "nope"]);
    assert_eq!((code, out.as_str()), (2, ""), "{err}");
    assert!(err.contains("ask_approved"), "{err}");

    // 4. tail -n: the last N; -f starts from the last 10, not the whole backlog.
    for i in 0..12 {
        let url = format!("http://x.test/{i}");
        let proxy = format!("http://{}", daemon.explicit);
        let out = std::process::Command::new("curl")
            .args(["-s", "-o", "/dev/null", "--proxy", &proxy, &url])
            .output()
            .expect("curl");
        assert!(out.status.success());
    }
    let count = |out: &str| {
        out.lines()
            .filter(|l| l.contains("\"host\":\"x.test\""))
            .count()
    };
    let (code, out, _) = daemon.ctl(&[], &["tail", "--json"]);
    assert_eq!((code, count(&out)), (0, 12), "{out}");
    let (_, out, _) = daemon.ctl(&[], &["tail", "-n", "2", "--json"]);
    assert_eq!(out.lines().count(), 2, "{out}");
    assert!(
        out.lines()
            .last()
            .unwrap_or("")
            .contains("\"path\":\"/11\""),
        "the newest last: {out}"
    );
    let (_, out, _) = daemon.ctl(&[], &["tail", "-n", "0"]);
    assert_eq!(out, "");
    let timeout: Vec<String> = ["timeout", "2"].map(String::from).to_vec();
    let (code, out, _) = daemon.ctl(&timeout, &["tail", "-f", "--json"]);
    assert_eq!(code, 124, "still following when stopped");
    assert_eq!(count(&out), 10, "-f starts from the last 10: {out}");

    // A failure after the decision names the rule that matched (nothing listens on y.test:1).
    let proxy = format!("http://{}", daemon.explicit);
    let out = std::process::Command::new("curl")
        .args(["-s", "--proxy", &proxy, "http://y.test:1/"])
        .output()
        .expect("curl");
    let body = json(&String::from_utf8_lossy(&out.stdout));
    assert_eq!(body["error_code"], "upstream_connect", "{body}");
    assert_eq!(body["rule_id"], "y", "{body}");
    // 5. policy check --exit-code: 1 unless allowed outright.
    let check = |url: &str, extra: &[&str]| {
        let mut args = vec!["policy", "check", "GET", url, "--exit-code"];
        args.extend_from_slice(extra);
        daemon.ctl(&[], &args)
    };
    assert_eq!(check("https://y.test/", &[]).0, 0);
    let (code, out, _) = check("https://x.test/", &[]);
    assert_eq!(code, 1, "denied: {out}");
    assert!(out.contains("DENY"), "{out}");
    assert_eq!(
        daemon
            .ctl(&[], &["policy", "check", "GET", "https://x.test/"])
            .0,
        0,
        "without --exit-code"
    );

    // 6. lint: a directory, one file; a file naming a rule `default` is refused where it is,
    //    and under --json the error is an object on stdout with file, line and column.
    let dir = daemon.dir.path().join("policies");
    let (code, out, err) = daemon.ctl(&[], &["policy", "lint", &dir.display().to_string()]);
    assert_eq!(code, 0, "{out}{err}");
    let bad = daemon.dir.path().join("bad.toml");
    std::fs::write(
        &bad,
        "version = 1\n[[rule]]\nid = \"default\"\nhosts = [\"a.test\"]\naction = \"allow\"\n",
    )
    .expect("write");
    let bad_arg = bad.display().to_string();
    let (code, out, err) = daemon.ctl(&[], &["policy", "lint", &bad_arg, "--json"]);
    assert_eq!(code, 2, "{err}");
    let e = json(&out);
    assert_eq!(e["ok"], false);
    assert_eq!(e["error"]["code"], "bad_input");
    assert_eq!(e["error"]["file"], bad_arg);
    assert_eq!(
        (e["error"]["line"].as_u64(), e["error"]["column"].as_u64()),
        (Some(3), Some(6)),
        "{e}"
    );
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap_or("")
            .contains("names the policy's `default`"),
        "{e}"
    );
    // An AgenShield file: its command rules are skipped, and lint says so.
    let agen = daemon.dir.path().join("agenshield.json");
    std::fs::write(&agen, r#"{"defaultAction": "deny", "rules": [
        {"id": "web", "action": "allow", "target": "url", "patterns": ["y.test"], "enabled": true},
        {"id": "no-rm", "action": "deny", "target": "command", "patterns": ["rm -rf /"], "enabled": true}]}"#).expect("write");
    let (code, out, err) = daemon.ctl(&[], &["policy", "lint", &agen.display().to_string()]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("1 AgenShield rule(s) skipped"), "{out}");
    // check --policy FILE decides against that one file.
    let (code, out, err) = daemon.ctl(
        &[],
        &[
            "policy",
            "check",
            "GET",
            "https://y.test/",
            "--policy",
            &dir.join("main.toml").display().to_string(),
            "--json",
        ],
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(json(&out)["rule_id"], "y");

    // 7. run --check: the daemon's own configuration passes (while it runs: nothing is
    //    bound); a policy binding a missing secret, or one that does not parse, fails with
    //    the part named.
    let run_check = || {
        let out = std::process::Command::new(agenshield_e2e::daemon::binary())
            .args(["proxy", "run", "--check", "--config"])
            .arg(daemon.config_path())
            .output()
            .expect("run --check");
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    };
    let (code, out) = run_check();
    assert_eq!(code, 0, "{out}");
    for part in [
        "config   ok",
        "policy   ok",
        "secrets  ",
        "CA       ok",
        "worker   note",
        // The daemon running now holds the admin socket: `run` would start once it stops.
        "admin    note",
    ] {
        assert!(out.contains(part), "{part:?} in:\n{out}");
    }
    let extra = dir.join("zz-binds.toml");
    std::fs::write(&extra, "version = 1\n[[rule]]\nid = \"z\"\nhosts = [\"z.test\"]\naction = \"allow\"\nsecrets = [\"absent\"]\n").expect("write");
    let (code, out) = run_check();
    assert_eq!(code, 2, "{out}");
    assert!(
        out.contains("secrets  FAILED") && out.contains("\"absent\""),
        "{out}"
    );
    std::fs::write(&extra, "version = 1\n[[rule]]\nid = \"z\"\n").expect("write");
    let (code, out) = run_check();
    assert_eq!(code, 2, "{out}");
    assert!(
        out.contains("policy   FAILED") && out.contains("zz-binds.toml:"),
        "{out}"
    );
    std::fs::remove_file(&extra).expect("rm");

    // 8. The daemon down: --json failures are JSON on stdout; policy check decides offline
    //    against the configured directory, and says so.
    daemon.stop();
    let (code, out, err) = daemon.ctl(&[], &["status", "--json"]);
    assert_eq!(code, 1, "{err}");
    let e = json(&out);
    assert_eq!(e["error"]["code"], "not_running", "{e}");
    assert!(e["error"]["message"]
        .as_str()
        .unwrap_or("")
        .contains("not running"));
    let (code, out, err) = daemon.ctl(
        &[],
        &["policy", "check", "GET", "https://y.test/", "--json"],
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(json(&out)["decision"], "allow");
    assert!(err.contains("deciding offline against"), "{err}");
    let (code, _, _) = daemon.ctl(
        &[],
        &["policy", "check", "GET", "https://x.test/", "--exit-code"],
    );
    assert_eq!(code, 1);
}

/// A daemon that cannot read its CA says why, with the OS's reason, and so does `--check`.
#[test]
fn errors_keep_their_cause() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    std::fs::create_dir_all(d.join("pol")).expect("mkdir");
    std::fs::write(d.join("pol/a.toml"), "version = 1\ndefault = \"deny\"\n").expect("policy");
    // Both CA files "exist", as directories: unreadable as files.
    std::fs::create_dir_all(d.join("certs/ca.pem")).expect("mkdir");
    std::fs::create_dir_all(d.join("certs/ca-key.pem")).expect("mkdir");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(
        d.join("certs/ca-key.pem"),
        std::fs::Permissions::from_mode(0o700),
    )
    .expect("chmod");
    let config = d.join("c.toml");
    std::fs::write(
        &config,
        format!(
            "[listen]\ntransparent = []\nexplicit = \"127.0.0.1:0\"\nadmin = \"{d}/admin.sock\"\nmetrics = \"off\"\ndns = []\n\
             [paths]\npolicies = \"{d}/pol\"\ncerts = \"{d}/certs\"\nvault = \"{d}/vault\"\naudit = \"{d}/audit.jsonl\"\n",
            d = d.display()
        ),
    )
    .expect("config");
    let run = |check: bool| {
        let mut cmd = std::process::Command::new(agenshield_e2e::daemon::binary());
        cmd.args(["proxy", "run", "--config"]).arg(&config);
        if check {
            cmd.arg("--check");
        }
        let out = cmd.output().expect("run");
        (
            out.status.code().unwrap_or(-1),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        )
    };
    let (code, out) = run(false);
    assert_eq!(code, 2, "{out}");
    assert!(
        out.contains("CA: cannot read") && out.contains("(os error 21)"),
        "{out}"
    );
    let (code, out) = run(true);
    assert_eq!(code, 2, "{out}");
    assert!(
        out.contains("CA       FAILED") && out.contains("(os error 21)"),
        "{out}"
    );
}

/// An invalid AGENSHIELD_LOG is an error, not a silent fallback; `--log-format json` writes
/// one JSON object per log line.
#[test]
fn logging_is_checked_and_can_be_json() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pol = dir.path().join("a.toml");
    std::fs::write(&pol, "version = 1\ndefault = \"deny\"\n").expect("policy");
    let lint = |env: &str, json: bool| {
        let mut cmd = std::process::Command::new(agenshield_e2e::daemon::binary());
        if json {
            cmd.args(["--log-format", "json"]);
        }
        let out = cmd
            .args(["proxy", "ctl", "policy", "lint"])
            .arg(&pol)
            .env("AGENSHIELD_LOG", env)
            .output()
            .expect("run");
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, err) = lint("info,foo=bogus", false);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("AGENSHIELD_LOG=\"info,foo=bogus\" is not a log filter"),
        "{err}"
    );
    let (code, err) = lint("debug", true);
    assert_eq!(code, 0, "{err}");
    let lines: Vec<&str> = err.lines().collect();
    assert!(!lines.is_empty(), "debug logs something");
    for l in lines {
        let v: serde_json::Value = serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}"));
        assert!(
            v["level"].is_string() && v["fields"]["message"].is_string(),
            "{l}"
        );
    }
}

/// Issue 34: `AGENSHIELD_LOG=verbose` parsed as a module name and silenced every line, errors
/// included. A filter that enables not even our errors stops the daemon at once, with
/// examples of the right form; `debug` runs and logs.
#[test]
fn a_log_filter_that_enables_nothing_of_ours_is_refused() {
    let dir = agenshield_e2e::daemon::prepare(&DaemonOptions {
        policies: vec![("main.toml".into(), POLICY.into())],
        ..Default::default()
    });
    // Bounded: a daemon that starts despite the filter is stopped after 10 s (and fails).
    let run = |filter: &str| {
        let child = std::process::Command::new(agenshield_e2e::daemon::binary())
            .args(["proxy", "run", "--config"])
            .arg(dir.path().join("proxy.toml"))
            .env("AGENSHIELD_LOG", filter)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("run");
        let pid = nix::unistd::Pid::from_raw(child.id() as i32);
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            if rx.recv_timeout(std::time::Duration::from_secs(10)).is_err() {
                let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
            }
        });
        let out = child.wait_with_output().expect("run");
        let _ = tx.send(());
        out
    };
    for filter in ["verbose", "h2=debug"] {
        let out = run(filter);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{filter}: {err}");
        assert!(
            err.contains(&format!(
                "AGENSHIELD_LOG={filter:?} enables no log line of agenshield"
            )),
            "{err}"
        );
        assert!(
            err.contains("e.g. info, debug") && err.contains("agenshield_proxy=debug,h2=info"),
            "{err}"
        );
        assert!(
            String::from_utf8_lossy(&out.stdout).is_empty(),
            "nothing started"
        );
    }
    assert!(String::from_utf8_lossy(&run("verbose").stderr)
        .contains("\"verbose\" read as a module name"));
    // `debug` is a filter that works: the daemon starts and logs at debug.
    let daemon = Daemon::start(DaemonOptions {
        policies: vec![("main.toml".into(), POLICY.into())],
        ..Default::default()
    });
    let logs = daemon.logs();
    assert!(logs.contains("DEBUG") && logs.contains("INFO"), "{logs}");
}

/// `agenshield` with `args` and `envs`: (exit code, stdout, stderr).
fn agenshield(args: &[&str], envs: &[(&str, &std::path::Path)]) -> (i32, String, String) {
    let mut cmd = std::process::Command::new(agenshield_e2e::daemon::binary());
    cmd.args(args);
    for (k, v) in envs {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("agenshield");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The part named `name` of a `run --check --json` report.
fn check_part<'a>(report: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    report["parts"]
        .as_array()
        .and_then(|parts| parts.iter().find(|p| p["part"] == name))
        .unwrap_or_else(|| panic!("no part {name} in {report}"))
}

#[cfg(target_os = "linux")]
/// The `sha256:…` policy hash in `text`.
fn policy_hash(text: &str) -> String {
    let at = text
        .find("sha256:")
        .unwrap_or_else(|| panic!("no hash in {text}"));
    text[at..]
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == ':')
        .collect()
}

#[cfg(target_os = "linux")]
/// A daemon started by hand, stopped (SIGTERM) when dropped.
struct Started(std::process::Child);

#[cfg(target_os = "linux")]
impl Drop for Started {
    fn drop(&mut self) {
        let pid = nix::unistd::Pid::from_raw(self.0.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let _ = self.0.wait();
    }
}

/// Issue 34: on a fresh machine (no config file, no state yet) `--check` said FAILED for the
/// policy directory `run` itself seeds, and never said which config it read. Now it gives
/// `run`'s verdict part by part, creates nothing, and the policy it announces is the one
/// `run` then enforces. Root: `run` on built-in defaults binds the default ports.
#[cfg(target_os = "linux")] // root_or_skip: netlab is Linux-only
#[test]
fn run_check_gives_runs_verdict_on_a_fresh_machine() {
    let Some(_root) = agenshield_e2e::netlab::root_or_skip("run_check_fresh_machine") else {
        return;
    };
    assert!(
        !std::path::Path::new("/opt/agenshield/config/proxy.toml").exists(),
        "not a fresh machine: an installed config is in place"
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state");
    let env = [("AGENSHIELD_STATE_DIR", state.as_path())];
    let (code, out, err) = agenshield(&["proxy", "run", "--check", "--json"], &env);
    assert_eq!(code, 0, "{out}{err}");
    let report = json(&out);
    assert_eq!(report["ok"], true, "{report}");
    assert!(report["config"].is_null(), "{report}");
    let config = check_part(&report, "config");
    assert!(
        config["detail"].as_str().is_some_and(
            |d| d.contains("no config file") && d.contains(&state.display().to_string())
        ),
        "{report}"
    );
    let policy = check_part(&report, "policy");
    assert_eq!(policy["verdict"], "note", "{report}");
    let detail = policy["detail"].as_str().unwrap_or("");
    assert!(
        detail.contains("writes the shipped default policy"),
        "{report}"
    );
    let announced = policy_hash(detail);
    assert_eq!(check_part(&report, "CA")["verdict"], "note", "{report}");
    for p in report["parts"].as_array().expect("parts") {
        assert_ne!(p["verdict"], "failed", "{report}");
    }
    assert!(!state.exists(), "--check created {}", state.display());
    let (code, text, _) = agenshield(&["proxy", "run", "--check"], &env);
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("policy   note"), "{text}");

    // `run` agrees: it starts, seeds that policy and creates the CA.
    let mut child = std::process::Command::new(agenshield_e2e::daemon::binary())
        .args(["proxy", "run"])
        .env("AGENSHIELD_STATE_DIR", &state)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("run");
    let stdout = child.stdout.take().expect("stdout");
    let _daemon = Started(child);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            let _ = tx.send(line);
        }
    });
    let mut said = String::new();
    let ready = loop {
        let line = rx
            .recv_timeout(std::time::Duration::from_secs(30))
            .unwrap_or_else(|_| panic!("run did not become ready; it said:\n{said}"));
        said.push_str(&line);
        said.push('\n');
        if line.starts_with("agenshield: ready ") {
            break line;
        }
    };
    assert!(said.contains("wrote the default policy to"), "{said}");
    assert!(said.contains("CA created"), "{said}");
    assert_eq!(policy_hash(&ready), announced, "{said}");
    drop(_daemon);
    // And on the state it left, each part is plain `ok`.
    let (code, out, err) = agenshield(&["proxy", "run", "--check", "--json"], &env);
    assert_eq!(code, 0, "{out}{err}");
    let report = json(&out);
    assert_eq!(check_part(&report, "policy")["verdict"], "ok", "{report}");
    assert_eq!(check_part(&report, "CA")["verdict"], "ok", "{report}");
    assert_eq!(
        policy_hash(
            check_part(&report, "policy")["detail"]
                .as_str()
                .unwrap_or("")
        ),
        announced
    );
}

/// Issue 34: `--check` said "ready" for a redirect whose agent user does not exist, or is
/// root (the proxy's own uid), which `run` refuses. Now both refuse, with the same reason, and
/// `--check --json` names the config file it read. `run` stops before any rule is written.
#[cfg(target_os = "linux")] // root_or_skip: netlab is Linux-only
#[test]
fn run_check_gives_runs_verdict_on_a_missing_or_root_agent_user() {
    let Some(_root) = agenshield_e2e::netlab::root_or_skip("run_check_agent_users") else {
        return;
    };
    for (user, reason) in [
        (
            "ash_no_such_agent",
            "firewall: agent user \"ash_no_such_agent\" does not exist",
        ),
        ("root", "firewall: agent uid 0 is the proxy's own uid"),
    ] {
        let dir = tempfile::tempdir().expect("tempdir");
        let d = dir.path();
        std::fs::create_dir_all(d.join("pol")).expect("mkdir");
        std::fs::write(d.join("pol/a.toml"), POLICY).expect("policy");
        let config = d.join("proxy.toml");
        std::fs::write(
            &config,
            format!(
                "[listen]\ntransparent = [\"127.0.0.1:0\"]\nexplicit = \"127.0.0.1:0\"\ndns = [\"127.0.0.1:0\"]\nmetrics = \"off\"\nadmin = \"{d}/admin.sock\"\n\
                 [paths]\npolicies = \"{d}/pol\"\ncerts = \"{d}/certs\"\nvault = \"{d}/vault\"\naudit = \"{d}/audit.jsonl\"\n\
                 [redirect]\nenabled = true\nagent_users = [\"{user}\"]\n",
                d = d.display()
            ),
        )
        .expect("config");
        let config_arg = config.display().to_string();
        let (code, out, err) = agenshield(
            &["proxy", "run", "--check", "--json", "--config", &config_arg],
            &[],
        );
        assert_eq!(code, 2, "{user}: {out}{err}");
        let report = json(&out);
        assert_eq!(report["ok"], false, "{report}");
        assert_eq!(report["config"], config_arg.as_str(), "{report}");
        let redirect = check_part(&report, "redirect");
        assert_eq!(redirect["verdict"], "failed", "{report}");
        assert!(
            redirect["detail"]
                .as_str()
                .is_some_and(|d| d.starts_with(reason)),
            "{report}"
        );
        let failed: Vec<&serde_json::Value> = report["parts"]
            .as_array()
            .expect("parts")
            .iter()
            .filter(|p| p["verdict"] == "failed")
            .collect();
        assert_eq!(failed.len(), 1, "only the redirect fails: {report}");
        let (code, text, _) =
            agenshield(&["proxy", "run", "--check", "--config", &config_arg], &[]);
        assert_eq!(code, 2);
        assert!(
            text.contains(&format!("redirect FAILED {reason}")),
            "{text}"
        );
        // `run` refuses it for the same reason.
        let (code, out, err) = agenshield(&["proxy", "run", "--config", &config_arg], &[]);
        assert_eq!(code, 2, "{user}: {out}{err}");
        assert!(err.contains(reason), "{user}: {err}");
        assert!(!out.contains("agenshield: ready"), "{out}");
    }
}

/// Issue 34: `firewall … --json` printed its errors as text only; a script reading
/// stdout now gets one JSON object, as from every other `--json` command. (The redirect spec
/// fails before any firewall is asked: nothing here needs root.)
#[test]
fn firewall_errors_are_json_under_json() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("proxy.toml");
    std::fs::write(
        &config,
        "[redirect]\nagent_users = [\"ash_no_such_agent\"]\n",
    )
    .expect("config");
    let config_arg = config.display().to_string();
    // `up` resolves the agent users before it touches any firewall.
    let (code, out, err) = agenshield(
        &["proxy", "firewall", "up", "--json", "--config", &config_arg],
        &[],
    );
    assert_eq!(code, 2, "{out}{err}");
    let e = json(&out);
    assert_eq!(e["ok"], false, "{e}");
    assert_eq!(e["error"]["code"], "bad_input", "{e}");
    assert!(
        e["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("agent user \"ash_no_such_agent\" does not exist")),
        "{e}"
    );
    assert!(err.contains("does not exist"), "{err}");
    // A config that does not load: the same shape.
    let (code, out, _) = agenshield(
        &[
            "proxy",
            "firewall",
            "status",
            "--json",
            "--config",
            "/nonexistent/proxy.toml",
        ],
        &[],
    );
    assert_eq!(code, 2);
    assert_eq!(json(&out)["error"]["code"], "bad_input", "{out}");
}

/// Issue 34: "address in use" gave no hint of who holds it. `run` and `run --check` both say
/// which listener, which address, that another agenshield (or another program) holds it, and
/// how to see which.
#[test]
fn an_address_in_use_names_the_listener_and_how_to_find_its_holder() {
    let first = Daemon::start(DaemonOptions {
        policies: vec![("main.toml".into(), POLICY.into())],
        ..Default::default()
    });
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    std::fs::create_dir_all(d.join("pol")).expect("mkdir");
    std::fs::write(d.join("pol/a.toml"), POLICY).expect("policy");
    let config = d.join("proxy.toml");
    let taken = first.explicit;
    std::fs::write(
        &config,
        format!(
            "[listen]\ntransparent = [\"127.0.0.1:0\"]\nexplicit = \"{taken}\"\ndns = []\nmetrics = \"off\"\nadmin = \"{d}/admin.sock\"\n\
             [paths]\npolicies = \"{d}/pol\"\ncerts = \"{d}/certs\"\nvault = \"{d}/vault\"\naudit = \"{d}/audit.jsonl\"\n",
            d = d.display()
        ),
    )
    .expect("config");
    let config_arg = config.display().to_string();
    let said = format!(
        "binding the explicit listener on {taken}: Address already in use (os error 98): another \
         agenshield daemon, or another program, holds {taken}; see which with: ss -ltnp \
         'sport = :{}'",
        taken.port()
    );
    let (code, out, err) = agenshield(&["proxy", "run", "--config", &config_arg], &[]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(err.contains(&said), "{err}");
    assert_eq!(err.matches("os error 98").count(), 1, "said once: {err}");
    let (code, out, _) = agenshield(
        &["proxy", "run", "--check", "--json", "--config", &config_arg],
        &[],
    );
    assert_eq!(code, 2, "{out}");
    let report = json(&out);
    let listen = check_part(&report, "listen");
    assert_eq!(listen["verdict"], "failed", "{report}");
    assert!(
        listen["detail"].as_str().is_some_and(|d| d.contains(&said)),
        "{report}"
    );
}

/// A split daemon's worker reads the vault as the worker user, so `--check` does too: a vault
/// the worker may not use (left to root) fails both `run` and `--check`, for the same reason;
/// given to the worker, both pass.
#[cfg(target_os = "linux")] // root_or_skip: netlab is Linux-only
#[test]
fn run_check_reads_a_split_daemons_state_as_its_worker() {
    use agenshield_e2e::netlab::{root_or_skip, AgentUser};
    let Some(_root) = root_or_skip("run_check_split_worker") else {
        return;
    };
    let worker = AgentUser::create(387);
    let dir = agenshield_e2e::daemon::prepare(&DaemonOptions {
        policies: vec![("main.toml".into(), POLICY.into())],
        secrets: vec![("k".into(), "tok_split_check_value_1".into())],
        worker_user: Some((worker.name.clone(), worker.uid)),
        ..Default::default()
    });
    let chown = |path: &std::path::Path, uid: u32| {
        let out = std::process::Command::new("chown")
            .arg("-R")
            .arg(format!("{uid}:{uid}"))
            .arg(path)
            .output()
            .expect("chown");
        assert!(out.status.success(), "chown: {out:?}");
    };
    chown(dir.path(), worker.uid);
    chown(&dir.path().join("vault"), 0);
    let config = dir.path().join("proxy.toml").display().to_string();
    let (code, out, err) = agenshield(
        &["proxy", "run", "--check", "--json", "--config", &config],
        &[],
    );
    assert_eq!(code, 2, "{out}{err}");
    let report = json(&out);
    assert_eq!(check_part(&report, "worker")["verdict"], "ok", "{report}");
    let secrets = check_part(&report, "secrets");
    assert_eq!(secrets["verdict"], "failed", "{report}");
    let why = secrets["detail"].as_str().unwrap_or("").to_string();
    assert!(why.contains("vault"), "{report}");
    // `run` refuses it too, in its worker, for the same reason.
    let (code, out, err) = agenshield(&["proxy", "run", "--config", &config], &[]);
    assert_eq!(code, 2, "{out}{err}");
    assert!(!out.contains("agenshield: ready"), "{out}");
    let reason = why.trim_start_matches("secrets: ");
    assert!(err.contains(reason), "run said:\n{err}\ncheck said: {why}");
    // Given to the worker: both pass.
    chown(&dir.path().join("vault"), worker.uid);
    let (code, out, err) = agenshield(
        &["proxy", "run", "--check", "--json", "--config", &config],
        &[],
    );
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(check_part(&json(&out), "secrets")["verdict"], "ok", "{out}");
}
