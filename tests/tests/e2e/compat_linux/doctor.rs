//! `agenshield proxy doctor` on the machine the compat suite installed, checked against the
//! tools themselves: sound, it passes every runtime; a client that refuses our CA is listed;
//! a runtime broken on purpose (a later line in the agent's `~/.wgetrc`, a variable gone from
//! PAM's environment file) is named with its fix, the tool really fails, and applying the
//! printed fix makes doctor and the tool both succeed.

use std::io::Write as _;
use std::path::Path;
use std::process::Output;
use std::time::{Duration, Instant};

use agenshield_e2e::installation::{as_agent, as_agent_plain, run, HOME};

const BUNDLE: &str = "/opt/agenshield/certs/agent-ca-bundle.pem";
const ENV_FILE: &str = "/opt/agenshield/certs/agent-env";
const RUNTIMES: [&str; 12] = [
    "curl",
    "wget",
    "git",
    "python (ssl, urllib)",
    "python requests",
    "python httpx",
    "pip",
    "node",
    "npm",
    "java",
    "go",
    "grpc (grpcio)",
];

fn doctor() -> (i32, String) {
    run(&["proxy", "doctor"])
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// The finding about `subject` in doctor's JSON.
fn finding(subject: &str) -> serde_json::Value {
    let (_, out) = run(&["proxy", "doctor", "--json"]);
    let v: serde_json::Value =
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("doctor --json: {e}:\n{out}"));
    v["findings"]
        .as_array()
        .and_then(|f| f.iter().find(|f| f["subject"] == subject).cloned())
        .unwrap_or_else(|| panic!("no finding about {subject}:\n{out}"))
}

fn append(path: &Path, line: &str) {
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(path)
        .expect("open");
    f.write_all(line.as_bytes()).expect("append");
}

const WGET: &str = "wget -q -O- https://api.compat.test/ok";
// It exits as soon as it has the status: node keeps a connection whose body it never read
// open until the server closes it.
const NODE: &str = "node -e \"require('https').get('https://api.compat.test/ok', r => { \
                    console.log('status', r.statusCode); process.exit(0) }).on('error', e => { \
                    console.log(e.code); process.exit(1) })\"";

pub fn finds_and_fixes(upstream_ca: &Path, config: &Path) {
    // Sound: every runtime trusts the CA, in and out of a login shell.
    let (code, out) = doctor();
    assert_eq!(code, 0, "doctor on a sound installation:\n{out}");
    for rt in RUNTIMES {
        let ok = format!("  ok    {rt}: reads ");
        assert!(
            out.lines()
                .any(|l| l.starts_with(&ok) && l.contains(" [login, non-login] ")),
            "{rt} is not ok in both contexts:\n{out}"
        );
    }
    // Every variable of the environment file install wrote, each naming our bundle.
    let vars = std::fs::read_to_string("/opt/agenshield/certs/agent-env")
        .expect("agent-env")
        .lines()
        .filter(|l| !l.starts_with('#') && l.contains('='))
        .count();
    assert!(vars >= 15, "{vars} variables in agent-env");
    assert!(
        out.contains(&format!(
            "  ok    login shell (su -l): all {vars} variables"
        )),
        "{out}"
    );

    // A client that refuses our leaf (it trusts only the upstream's CA) is listed by host,
    // one more refusal than before (the suite's pinned client already refused it, once per
    // context, where it was meant to be refused).
    let refusals = || {
        let (_, out) = run(&["proxy", "doctor", "--json"]);
        let v: serde_json::Value = serde_json::from_str(&out).expect("json");
        v["findings"]
            .as_array()
            .and_then(|f| {
                f.iter()
                    .find(|f| f["subject"] == "api.compat.test:443")
                    .cloned()
            })
            .and_then(|f| f["detail"].as_str()?.split(' ').next()?.parse::<u64>().ok())
            .unwrap_or(0)
    };
    let before = refusals();
    let o = as_agent(&format!(
        "curl -sS --max-time 5 --cacert {} https://api.compat.test/ok",
        upstream_ca.display()
    ));
    assert!(!o.status.success(), "curl trusted our leaf: {}", text(&o));
    // A second refusal within the audit's refusal window is counted in a `repeated` record,
    // written when the window (10 s) closes.
    let deadline = Instant::now() + Duration::from_secs(25);
    while refusals() != before + 1 {
        assert!(
            Instant::now() < deadline,
            "the rejection is not listed:\n{}",
            doctor().1
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let (code, out) = doctor();
    assert_eq!(code, 0, "a rejection is a warning:\n{out}");
    let listed = format!(
        "  WARN  api.compat.test:443: {} handshake(s) refused our leaf",
        before + 1
    );
    assert!(out.contains(&listed), "{out}");
    assert!(
        out.contains("allow the host with `tls = \"passthrough\"`"),
        "{out}"
    );

    // wget: a later line in ~/.wgetrc points it at the system bundle.
    let wgetrc = Path::new(HOME).join(".wgetrc");
    let original = std::fs::read_to_string(&wgetrc).expect("wgetrc");
    append(
        &wgetrc,
        "ca_certificate = /etc/ssl/certs/ca-certificates.crt\n",
    );
    let (code, out) = doctor();
    assert_eq!(code, 1, "doctor passed a broken wget:\n{out}");
    let line = format!(
        "  FAIL  wget: login, non-login: reads {} ca_certificate → \
         /etc/ssl/certs/ca-certificates.crt, which does not hold the AgenShield CA\n        \
         fix: in {}, set `ca_certificate = {BUNDLE}`",
        wgetrc.display(),
        wgetrc.display()
    );
    assert!(out.contains(&line), "wanted\n{line}\nin:\n{out}");
    assert!(out.contains("NOT OK: 1 failed"), "only wget fails:\n{out}");
    let f = finding("wget");
    assert_eq!(
        (f["area"].as_str(), f["status"].as_str()),
        (Some("runtime"), Some("fail"))
    );
    // doctor is right: wget refuses our leaf.
    let o = as_agent(WGET);
    assert!(!o.status.success(), "wget worked: {}", text(&o));
    // The fix, as printed, makes both right.
    append(&wgetrc, &format!("ca_certificate = {BUNDLE}\n"));
    assert_eq!(finding("wget")["status"], "ok");
    let o = as_agent(WGET);
    assert!(o.status.success(), "wget after the fix: {}", text(&o));
    std::fs::write(&wgetrc, original).expect("restore wgetrc");

    // node outside a login shell: a variable gone from PAM's environment file.
    let env = std::fs::read_to_string(ENV_FILE).expect("env file");
    let vars = env
        .lines()
        .filter(|l| !l.starts_with('#') && l.contains('='))
        .count();
    let without: String = env
        .lines()
        .filter(|l| !l.starts_with("NODE_EXTRA_CA_CERTS="))
        .map(|l| format!("{l}\n"))
        .collect();
    std::fs::write(ENV_FILE, without).expect("edit env file");
    let (code, out) = doctor();
    assert_eq!(code, 1, "{out}");
    for want in [
        format!("  FAIL  {ENV_FILE}: differs from what install writes"),
        format!(
            "  FAIL  outside a login shell (su, sudo -u, cron: PAM only): 1 of {vars} variables \
             are not set: NODE_EXTRA_CA_CERTS"
        ),
        "  FAIL  node: non-login: NODE_EXTRA_CA_CERTS is not set, so it reads node's bundled \
         Mozilla roots, which cannot hold the AgenShield CA"
            .to_string(),
        format!(
            "fix: `sudo agenshield proxy install` rewrites {ENV_FILE}, which PAM gives the \
             agent's sessions"
        ),
    ] {
        assert!(out.contains(&want), "wanted\n{want}\nin:\n{out}");
    }
    // In a login shell ~/.profile still sets it.
    assert!(out.contains("  FAIL  node: non-login:"), "{out}");
    let o = as_agent_plain(NODE);
    assert!(
        !o.status.success(),
        "node worked without the variable: {}",
        text(&o)
    );
    // The fix: install again.
    let (code, log) = run(&[
        "proxy",
        "install",
        "--config",
        &config.display().to_string(),
    ]);
    assert_eq!(code, 0, "install:\n{log}");
    let (code, out) = doctor();
    assert_eq!(code, 0, "doctor after install:\n{out}");
    let o = as_agent_plain(NODE);
    assert!(
        text(&o).contains("status 200"),
        "node after the fix: {}",
        text(&o)
    );
}
