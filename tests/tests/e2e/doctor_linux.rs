//! `sudo agenshield proxy doctor` against a real agent user who is hostile to it: the agent's
//! login PATH (set in its `~/.profile`, as a login shell reads it) holds a planted `python3` and
//! a `java` whose JDK has a planted `keytool`; its variables name a FIFO (`SSL_CERT_FILE`) and a
//! device (`CURL_CA_BUNDLE=/dev/null`). The real binary runs as root and must never run a plant
//! as root (each logs its euid to a world-writable file and tries to write into a directory
//! only root may write), never open the FIFO or the device, and finish within a bound,
//! reporting both.
#![cfg(target_os = "linux")]

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use agenshield_e2e::daemon::binary;
use agenshield_e2e::netlab::{root_or_skip, sh, AgentUser};
use agenshield_e2e::pki::TestCa;

/// Doctor's own bounds add up to far less; a hang is what this catches.
const DOCTOR_LIMIT: Duration = Duration::from_secs(120);

fn write_mode(path: &Path, text: &str, mode: u32) {
    std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
    std::fs::write(path, text).expect("write");
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).expect("chmod");
}

/// A program that records who ran it and tries to leave a mark only root could leave.
fn plant(path: &Path, name: &str, log: &Path, root_only: &Path) {
    write_mode(
        path,
        &format!(
            "#!/bin/sh\necho \"$(/usr/bin/id -u) {name}\" >> {}\n/usr/bin/touch {}/{name} 2>/dev/null\nexit 1\n",
            log.display(),
            root_only.display()
        ),
        0o755,
    );
}

#[test]
fn doctor_runs_nothing_of_the_agents_as_root_and_opens_no_fifo_or_device() {
    let Some(_guard) = root_or_skip("doctor_runs_nothing_of_the_agents_as_root") else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let agent = AgentUser::create_named("ashdoctor", 377);
    let home = d.join("home");
    std::fs::create_dir(&home).expect("home");
    sh(&[
        "usermod",
        "--shell",
        "/bin/sh",
        "--home",
        home.to_str().expect("utf-8"),
        &agent.name,
    ]);

    // Where only root may write, and where anyone may log.
    let root_only = d.join("root-only");
    std::fs::create_dir(&root_only).expect("mkdir");
    std::fs::set_permissions(&root_only, std::fs::Permissions::from_mode(0o700)).expect("chmod");
    let log = d.join("euid.log");
    write_mode(&log, "", 0o666);

    // The plants: python3 on the agent's PATH; java there too, resolving to a JDK in its home
    // whose keytool is planted beside it and whose cacerts only keytool could read.
    plant(&home.join("bin/python3"), "python3", &log, &root_only);
    plant(&home.join("jdk/bin/java"), "java", &log, &root_only);
    plant(&home.join("jdk/bin/keytool"), "keytool", &log, &root_only);
    write_mode(
        &home.join("jdk/lib/security/cacerts"),
        "not PKCS12: only keytool reads this\n",
        0o644,
    );
    std::os::unix::fs::symlink("../jdk/bin/java", home.join("bin/java")).expect("symlink");
    let fifo = home.join("trust.pem");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o644)).expect("mkfifo");
    write_mode(
        &home.join(".profile"),
        &format!(
            "export PATH=\"$HOME/bin:$PATH\"\nexport SSL_CERT_FILE={}\nexport CURL_CA_BUNDLE=/dev/null\n",
            fifo.display()
        ),
        0o644,
    );
    sh(&[
        "chown",
        "-R",
        &format!("{}:{}", agent.uid, agent.uid),
        home.to_str().expect("utf-8"),
    ]);

    // The daemon's side: a CA (so the runtimes are checked), the agent named, nothing running.
    let certs = d.join("certs");
    std::fs::create_dir(&certs).expect("mkdir");
    TestCa::new("doctor-test CA")
        .write_pem(&certs.join("ca.pem"))
        .expect("ca");
    let config = d.join("proxy.toml");
    std::fs::write(
        &config,
        format!(
            "[listen]\nadmin = {:?}\n\n[paths]\npolicies = {:?}\ncerts = {:?}\nvault = {:?}\naudit = {:?}\n\n\
             [redirect]\nenabled = false\nagent_users = [{:?}]\n",
            d.join("proxy.sock"),
            d.join("policies"),
            certs,
            d.join("vault"),
            d.join("audit.jsonl"),
            agent.name
        ),
    )
    .expect("config");

    // Anyone opening the FIFO for reading lets a non-blocking writer in: watched for the whole
    // run (and then closed at once, so a reader that opened it is not held up).
    let opened = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicBool::new(false));
    let watcher = {
        let (opened, done, fifo) = (Arc::clone(&opened), Arc::clone(&done), fifo.clone());
        std::thread::spawn(move || {
            use std::os::unix::fs::OpenOptionsExt;
            while !done.load(Ordering::Relaxed) {
                let w = std::fs::OpenOptions::new()
                    .write(true)
                    .custom_flags(libc_o_nonblock())
                    .open(&fifo);
                if w.is_ok() {
                    opened.store(true, Ordering::Relaxed);
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        })
    };

    let out_path = d.join("doctor.out");
    let started = Instant::now();
    let mut child = Command::new(binary())
        .args(["proxy", "doctor", "--config"])
        .arg(&config)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out_path).expect("out"))
        .stderr(Stdio::inherit())
        .spawn()
        .expect("doctor");
    let finished = loop {
        if child.try_wait().expect("wait").is_some() {
            break true;
        }
        if started.elapsed() > DOCTOR_LIMIT {
            let _ = child.kill();
            let _ = child.wait();
            break false;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let took = started.elapsed();
    done.store(true, Ordering::Relaxed);
    watcher.join().expect("watcher");
    let report = std::fs::read_to_string(&out_path).unwrap_or_default();
    let ran = std::fs::read_to_string(&log).unwrap_or_default();
    let marks: Vec<String> = std::fs::read_dir(&root_only)
        .expect("ls")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();

    assert!(
        marks.is_empty(),
        "a plant wrote where only root may: {marks:?}\nruns: {ran}\n{report}"
    );
    for line in ran.lines() {
        let uid = line.split_whitespace().next().unwrap_or("");
        assert_eq!(
            uid,
            agent.uid.to_string(),
            "a plant ran as someone other than the agent: {ran}"
        );
    }
    // Not vacuous: doctor did ask the agent's python3 and keytool (as the agent).
    for name in ["python3", "keytool"] {
        assert!(
            ran.lines().any(|l| l.ends_with(&format!(" {name}"))),
            "doctor never ran the agent's {name}: {ran:?}\n{report}"
        );
    }
    assert!(
        finished,
        "doctor did not finish within {DOCTOR_LIMIT:?}:\n{report}"
    );
    assert!(
        !opened.load(Ordering::Relaxed),
        "the FIFO the agent named was opened:\n{report}"
    );
    for want in [
        format!(
            "SSL_CERT_FILE → {}, which is a FIFO, not a file: not opened",
            fifo.display()
        ),
        "CURL_CA_BUNDLE → /dev/null, which is a character device, not a file: not opened"
            .to_string(),
        "fix: CURL_CA_BUNDLE = /dev/null in the agent's login is not a file: remove what sets it"
            .to_string(),
    ] {
        assert!(report.contains(&want), "wanted {want:?} in:\n{report}");
    }
    eprintln!("doctor took {took:?}:\n{report}");
}

fn libc_o_nonblock() -> i32 {
    nix::fcntl::OFlag::O_NONBLOCK.bits()
}

/// `sudo agenshield proxy exec` (macOS's sudo keeps the caller's HOME): the CA bundle is not
/// written through a cache directory another user controls, nor taken from one.
#[test]
fn exec_as_root_keeps_its_bundle_out_of_another_users_home() {
    let Some(_guard) = root_or_skip("exec_as_root_keeps_its_bundle_out_of_another_users_home")
    else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let agent = AgentUser::create_named("ashdoctorx", 378);
    // The agent's home, whose ~/.cache leads into a directory only root may write.
    let home = d.join("home");
    std::fs::create_dir(&home).expect("home");
    let root_only = d.join("root-only");
    std::fs::create_dir(&root_only).expect("mkdir");
    std::fs::set_permissions(&root_only, std::fs::Permissions::from_mode(0o700)).expect("chmod");
    std::os::unix::fs::symlink(&root_only, home.join(".cache")).expect("symlink");
    sh(&[
        "chown",
        "-h",
        "-R",
        &format!("{}:{}", agent.uid, agent.uid),
        home.to_str().expect("utf-8"),
    ]);
    let certs = d.join("certs");
    std::fs::create_dir(&certs).expect("mkdir");
    TestCa::new("exec-root-test CA")
        .write_pem(&certs.join("ca.pem"))
        .expect("ca");
    // exec runs nothing unless a proxy answers: something listening where it is told one is.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let config = d.join("proxy.toml");
    std::fs::write(
        &config,
        format!(
            "[listen]\nexplicit = \"{}\"\nadmin = {:?}\n\n[paths]\npolicies = {:?}\n\
             certs = {:?}\nvault = {:?}\naudit = {:?}\n",
            listener.local_addr().expect("addr"),
            d.join("proxy.sock"),
            d.join("policies"),
            certs,
            d.join("vault"),
            d.join("audit.jsonl"),
        ),
    )
    .expect("config");
    let out = Command::new(binary())
        .args(["proxy", "exec", "--config"])
        .arg(&config)
        .args(["--", "/bin/sh", "-c", "printf %s \"$CURL_CA_BUNDLE\""])
        .env("HOME", &home)
        .env_remove("XDG_CACHE_HOME")
        .stdin(Stdio::null())
        .output()
        .expect("exec");
    let bundle = String::from_utf8_lossy(&out.stdout).into_owned();
    let written: Vec<String> = std::fs::read_dir(&root_only)
        .expect("ls")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    // What this test made in root's cache goes again (named after this run's CA).
    if let Some(p) = Path::new(&bundle).parent() {
        if p == Path::new("/var/cache/agenshield") {
            let _ = std::fs::remove_file(&bundle);
            let _ = std::fs::remove_file(
                bundle
                    .replace("/ca-bundle-", "/truststore-")
                    .replace(".pem", ".p12"),
            );
        }
    }
    assert!(
        out.status.success(),
        "exec as root: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        written.is_empty(),
        "root wrote through the agent's ~/.cache: {written:?}"
    );
    assert!(
        bundle.starts_with("/var/cache/agenshield/ca-bundle-"),
        "the bundle is not in root's cache: {bundle}"
    );
}

/// `agenshield proxy firewall resolvers --socket PATH`: a resolver-style socket (mode 0666)
/// is closed to the agent user and to no one else, and `--open` takes that back. Tried with a
/// real connect (curl over the Unix socket): refused at once for a denied user (exit 7), let
/// in (then timing out on a server that never answers, exit 28) for another.
#[test]
fn a_resolver_socket_is_closed_to_the_agent_only() {
    let Some(_guard) = root_or_skip("a_resolver_socket_is_closed_to_the_agent_only") else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let agent = AgentUser::create_named("ashdoctorr", 379);
    let other = AgentUser::create_named("ashdoctoro", 380);
    let sock = d.join("io.systemd.Resolve");
    let _listener = std::os::unix::net::UnixListener::bind(&sock).expect("bind");
    std::fs::set_permissions(&sock, std::fs::Permissions::from_mode(0o666)).expect("chmod");
    let config = d.join("proxy.toml");
    std::fs::write(
        &config,
        format!("[redirect]\nagent_users = [{:?}]\n", agent.name),
    )
    .expect("config");
    let resolvers = |extra: &[&str]| {
        let out = Command::new(binary())
            .args(["proxy", "firewall", "resolvers", "--config"])
            .arg(&config)
            .arg("--socket")
            .arg(&sock)
            .args(extra)
            .output()
            .expect("run");
        assert!(
            out.status.success(),
            "firewall resolvers {extra:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let connect = |who: &AgentUser| {
        let mut argv = who.as_agent();
        argv.extend(
            [
                "curl",
                "-sS",
                "--max-time",
                "1",
                "--unix-socket",
                sock.to_str().expect("utf-8"),
                "http://resolver/",
            ]
            .map(String::from),
        );
        Command::new(&argv[0])
            .args(&argv[1..])
            .output()
            .expect("curl")
            .status
            .code()
    };
    assert_eq!(connect(&agent), Some(28), "open to start with");
    resolvers(&[]);
    assert_eq!(connect(&agent), Some(7), "the agent is refused");
    assert_eq!(connect(&other), Some(28), "another user is not");
    resolvers(&[]);
    assert_eq!(connect(&agent), Some(7), "idempotent");
    resolvers(&["--open"]);
    assert_eq!(connect(&agent), Some(28), "reopened");
}
