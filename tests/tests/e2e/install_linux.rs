//! Root end-to-end test of `agenshield proxy install` / `uninstall` on Linux: real users, real
//! files and modes, the real nftables redirect, the agent's login shell trusting our CA
//! through the environment install wrote, and an uninstall that leaves no trace.
//!
//! It refuses to touch a machine where AgenShield is installed (`installation`): a skip with
//! the reason, a failure under CI=true.
#![cfg(target_os = "linux")]

use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use agenshield_e2e::daemon::binary;
use agenshield_e2e::installation::*;
use agenshield_e2e::netlab::{root_or_skip, sh, Internet};
use agenshield_e2e::pki::TestCa;
use agenshield_e2e::upstream::UpstreamOptions;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn install_twice_then_agent_curl_works_with_no_flags_then_uninstall_leaves_no_trace() {
    let Some(_serial) = root_or_skip("install_linux") else {
        return;
    };
    if let Some(why) = installed_already() {
        if std::env::var("CI").is_ok_and(|v| v == "true") {
            panic!("install_linux: {why}: this test needs a machine without AgenShield");
        }
        use std::io::Write as _;
        let _ = writeln!(
            std::io::stderr(),
            "SKIP install_linux: {why}; refusing to touch an existing installation"
        );
        return;
    }
    let mut cleanup = Cleanup {
        daemon: None,
        existed: candidates().into_iter().filter(|p| p.exists()).collect(),
        extra_files: Vec::new(),
    };
    let before = snapshot();

    // "The internet": an HTTPS upstream in a namespace, with a certificate from a test CA
    // that only the daemon trusts (the agent must go through our interception to succeed).
    let net = Internet::create();
    let ca = TestCa::new("install e2e upstream CA");
    let a4 = net.a4;
    let leaf = ca.leaf(&[&a4.to_string()]);
    let upstream = net.serve(
        SocketAddr::new(a4, 443),
        UpstreamOptions {
            tls: Some(leaf),
            name: "install-e2e".into(),
            ..Default::default()
        },
    );
    let share = tempfile::tempdir().expect("tempdir");
    std::fs::set_permissions(share.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let upstream_ca = share.path().join("upstream-ca.pem");
    ca.write_pem(&upstream_ca).expect("write CA");

    // The values to install: the test's upstream CA, the namespace's range, a dead resolver
    // (nothing can leave the machine), ports and a socket of its own.
    let (transparent, explicit, dns) = (free_port(), free_port(), free_dns_port());
    let config_text = format!(
        "[listen]\ntransparent = [\"127.0.0.1:{transparent}\"]\nexplicit = \"127.0.0.1:{explicit}\"\n\
         dns = \"127.0.0.1:{dns}\"\n\
         metrics = \"off\"\nadmin = \"{RUN_DIR}/proxy.sock\"\n\n\
         [daemon]\nworker_user = \"{BROKER}\"\n\n\
         [redirect]\nenabled = true\nagent_users = [\"{AGENT}\"]\nreconcile_interval = \"1s\"\n\n\
         [upstream]\nextra_ca = [\"{}\"]\nallow_private = [\"{}\"]\n\n\
         [resolver]\nnameservers = [\"127.0.0.1:9\"]\n",
        upstream_ca.display(),
        net.net4
    );
    let config = share.path().join("proxy.toml");
    std::fs::write(&config, &config_text).expect("write config");
    let config_arg = config.to_str().expect("utf-8 path");

    // The dry run changes nothing and lists every step.
    let (code, plan) = run(&["proxy", "install", "--dry-run", "--config", config_arg]);
    assert_eq!(code, 0, "{plan}");
    assert!(
        plan.contains("[to do] create user ash_default_agent"),
        "{plan}"
    );
    assert_eq!(snapshot(), before, "--dry-run changed the machine:\n{plan}");

    let (code, first) = run(&["proxy", "install", "--config", config_arg]);
    assert_eq!(code, 0, "install failed:\n{first}");
    assert!(first.contains("steps carried out"), "{first}");
    // One line per step, nothing between them: the CA's creation is said in its own step.
    assert!(
        !first.contains(" INFO ") && !first.contains("created new CA"),
        "a log line in the plan:\n{first}"
    );
    assert!(
        first.contains("done (SHA-256 fingerprint "),
        "the CA step says what it made:\n{first}"
    );
    // `agenshield` is on PATH (sudo's too): a link to the installed binary.
    assert_eq!(
        std::fs::read_link(PATH_LINK).expect("the PATH link"),
        Path::new("/opt/agenshield/bin/agenshield")
    );

    // Accounts.
    let agent = nix::unistd::User::from_name(AGENT)
        .ok()
        .flatten()
        .expect("agent user");
    assert_eq!(agent.uid.as_raw(), 5200);
    assert_eq!(agent.dir, Path::new(HOME));
    let broker = nix::unistd::User::from_name(BROKER)
        .ok()
        .flatten()
        .expect("broker user");
    assert_eq!(broker.uid.as_raw(), 5201);
    let admin = nix::unistd::Group::from_name(ADMIN)
        .ok()
        .flatten()
        .expect("admin group");
    assert_eq!(admin.gid.as_raw(), 5202);
    assert!(admin.mem.iter().any(|m| m == BROKER), "{:?}", admin.mem);

    // Files, modes, owners.
    assert_meta("/opt/agenshield/bin/agenshield", 0o755, "root", "root");
    assert_eq!(
        std::fs::read("/opt/agenshield/bin/agenshield").expect("installed binary"),
        std::fs::read(binary()).expect("built binary"),
    );
    assert_meta("/opt/agenshield/config", 0o750, "root", ADMIN);
    assert_meta("/opt/agenshield/config/proxy.toml", 0o640, "root", ADMIN);
    assert_eq!(
        std::fs::read_to_string("/opt/agenshield/config/proxy.toml").expect("config"),
        config_text
    );
    assert_meta(
        "/opt/agenshield/policies/default.toml",
        0o640,
        "root",
        ADMIN,
    );
    assert_meta("/opt/agenshield/certs/ca.pem", 0o644, "root", "root");
    assert_meta("/opt/agenshield/certs/ca-key.pem", 0o600, BROKER, "root");
    // The audit log's checkpoint key: the worker's, its public half for everyone.
    assert_meta("/opt/agenshield/certs/audit-key.pem", 0o600, BROKER, "root");
    assert_meta("/opt/agenshield/certs/audit-key.pub", 0o644, "root", "root");
    assert_meta(
        "/opt/agenshield/certs/agent-ca-bundle.pem",
        0o644,
        "root",
        "root",
    );
    let our_ca = std::fs::read_to_string("/opt/agenshield/certs/ca.pem").expect("CA");
    let bundle =
        std::fs::read_to_string("/opt/agenshield/certs/agent-ca-bundle.pem").expect("bundle");
    assert!(
        bundle.trim_end().ends_with(our_ca.trim_end()),
        "bundle ends with our CA"
    );
    // The worker (the broker) serves: it owns the vault and writes the audit log.
    assert_meta("/opt/agenshield/vault", 0o700, BROKER, ADMIN);
    assert_meta("/var/log/agenshield", 0o750, BROKER, ADMIN);
    assert_meta(RUN_DIR, 0o750, "root", ADMIN);
    assert_meta(HOME, 0o750, AGENT, AGENT);
    assert_meta(MANIFEST, 0o600, "root", "root");
    let manifest = std::fs::read_to_string(MANIFEST).expect("manifest");
    for needle in [
        AGENT,
        BROKER,
        ADMIN,
        "/opt/agenshield/certs/ca-key.pem",
        "/opt/agenshield/certs/audit-key.pem",
        UNIT,
    ] {
        assert!(
            manifest.contains(needle),
            "manifest lacks {needle}:\n{manifest}"
        );
    }
    assert_eq!(
        std::fs::read_to_string(UNIT).expect("unit"),
        include_str!("../../../systemd/agenshield-proxy.service")
    );
    for f in [".profile", ".bashrc"] {
        let text = std::fs::read_to_string(Path::new(HOME).join(f)).expect("start-up file");
        assert!(
            text.contains("export CURL_CA_BUNDLE='/opt/agenshield/certs/agent-ca-bundle.pem'"),
            "{f}:\n{text}"
        );
    }
    let table =
        String::from_utf8_lossy(&sh(&["nft", "list", "table", "inet", "agenshield"]).stdout)
            .into_owned();
    assert!(
        table.contains("5200"),
        "the redirect covers the agent:\n{table}"
    );
    // The backstop of user isolation: the agent cannot read the CA key or the config.
    for secret in [
        "/opt/agenshield/certs/ca-key.pem",
        "/opt/agenshield/certs/audit-key.pem",
        "/opt/agenshield/config/proxy.toml",
    ] {
        let out = as_agent(&format!("cat {secret}"));
        assert!(!out.status.success(), "the agent could read {secret}");
    }

    // Install again: a no-op, said so, and nothing on disk or in the accounts moved.
    let installed = snapshot();
    let (code, second) = run(&["proxy", "install", "--config", config_arg]);
    assert_eq!(code, 0, "{second}");
    assert!(second.contains("nothing changed"), "{second}");
    for line in second
        .lines()
        .filter(|l| l.trim_start().starts_with(char::is_numeric))
    {
        let state = line.split_once(". ").map(|x| x.1).unwrap_or("");
        assert!(
            state.starts_with("already done") || state.starts_with("note"),
            "a second install did something: {line}\n{second}"
        );
    }
    assert_eq!(
        snapshot(),
        installed,
        "the second install changed the machine"
    );

    // The agent owns its home: a start-up file it turns into a link to the CA key must not
    // make root (re-)installing read, copy or chown the key. Install refuses that step.
    let key = "/opt/agenshield/certs/ca-key.pem";
    let key_before = (meta(key), std::fs::read(key).expect("key"));
    let planted = as_agent(&format!(
        "mv ~/.bashrc ~/.bashrc.saved && ln -s {key} ~/.bashrc && sed -i '/agenshield/d' ~/.profile"
    ));
    assert!(planted.status.success(), "{planted:?}");
    let (code, third) = run(&["proxy", "install", "--config", config_arg]);
    assert_ne!(code, 0, "install went through a planted symlink:\n{third}");
    assert!(third.contains("symbolic link"), "{third}");
    assert!(std::fs::symlink_metadata(format!("{HOME}/.bashrc"))
        .expect("link")
        .file_type()
        .is_symlink());
    assert_eq!((meta(key), std::fs::read(key).expect("key")), key_before);
    let restored = as_agent("rm ~/.bashrc && mv ~/.bashrc.saved ~/.bashrc");
    assert!(restored.status.success(), "{restored:?}");
    let (code, fixed) = run(&["proxy", "install", "--config", config_arg]);
    assert_eq!(code, 0, "{fixed}");

    // The agent's traffic fails closed until the daemon runs...
    net.assert_route(a4);
    let url = format!("https://{a4}/hello");
    let systemd = Path::new("/run/systemd/system").exists();
    if !systemd {
        let closed = as_agent(&format!("curl -sS --max-time 5 {url}"));
        assert!(
            !closed.status.success(),
            "agent reached the upstream with no proxy running"
        );
        assert!(upstream.requests().is_empty());
    }
    // ...whose policy must allow the upstream: an operator's file, which uninstall keeps.
    let policy = PathBuf::from("/opt/agenshield/policies/50-e2e.toml");
    std::fs::write(
        &policy,
        format!("version = 1\n[[rule]]\nid = \"e2e-upstream\"\nhosts = [\"{a4}\"]\naction = \"allow\"\n"),
    )
    .expect("policy");
    cleanup.extra_files.push(policy.clone());
    if !systemd {
        cleanup.daemon = Some(start_daemon(&share.path().join("daemon.log")));
    }

    // The agent's login shell, no flags: its tools trust our CA through the environment
    // install wrote, and the request is intercepted (the upstream's own CA is not in the
    // agent's bundle, so success means our leaf was presented).
    let mut last = None;
    for _ in 0..40 {
        let out = as_agent(&format!("curl -sS --max-time 10 {url}"));
        if out.status.success() {
            last = Some(Ok(out));
            break;
        }
        last = Some(Err(out));
        std::thread::sleep(Duration::from_millis(250));
    }
    let out = match last.expect("tried") {
        Ok(out) => out,
        Err(out) => panic!(
            "agent curl failed: {}{}\ndaemon log:\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            std::fs::read_to_string(share.path().join("daemon.log")).unwrap_or_default()
        ),
    };
    assert!(!out.stdout.is_empty(), "empty response");
    // The worker started with the checkpoint key install made; `ctl audit key` exports it.
    let (code, key) = run(&["proxy", "ctl", "audit", "key"]);
    assert_eq!(code, 0, "{key}");
    assert_eq!(
        key.trim_end(),
        std::fs::read_to_string("/opt/agenshield/certs/audit-key.pub")
            .expect("the public half")
            .trim_end()
    );
    let seen = upstream.requests();
    assert!(
        seen.iter().any(|r| r.path_and_query == "/hello"),
        "the upstream did not see the request: {seen:?}"
    );
    // Outside a login shell (su without -l, no start-up file read, nothing inherited): PAM
    // gives the agent's session the variables, and wget has its ~/.wgetrc.
    let plain = as_agent_plain(&format!(
        "curl -sS --max-time 10 {url} && wget -q -O /dev/null --timeout=10 {url} && echo ok"
    ));
    assert!(
        String::from_utf8_lossy(&plain.stdout).contains("ok"),
        "the agent outside a login shell: {}{}",
        String::from_utf8_lossy(&plain.stdout),
        String::from_utf8_lossy(&plain.stderr)
    );
    // Another user's session gets none of it.
    let other = Command::new("su")
        .args(["nobody", "-s", "/bin/sh", "-c", "echo \"[$SSL_CERT_FILE]\""])
        .env_clear()
        .output()
        .expect("su nobody");
    assert_eq!(String::from_utf8_lossy(&other.stdout).trim(), "[]");
    // Without the variables, curl's system roots do not know our CA: the file is what works.
    let bare = as_agent(&format!(
        "unset CURL_CA_BUNDLE SSL_CERT_FILE; curl -sS --max-time 10 {url}"
    ));
    assert!(
        !bare.status.success(),
        "curl trusted our CA without the environment install wrote"
    );

    // A daemon the service manager does not run would restore the firewall: uninstall
    // refuses to start while it answers, and changes nothing.
    if !systemd {
        let (code, refused) = run(&["proxy", "uninstall"]);
        assert_eq!(code, 1, "{refused}");
        assert!(refused.contains("stop it first"), "{refused}");
        assert!(
            user_exists(AGENT) && Path::new(MANIFEST).exists(),
            "{refused}"
        );
    }

    // The operator edits the installed config (say, adds upstream.proxy credentials): the
    // file uninstall keeps, which must neither stay readable by whoever later gets the admin
    // group's gid nor be taken for an installation's by a later start.
    let installed_config = "/opt/agenshield/config/proxy.toml";
    let edited = format!("{config_text}# the operator's own line\n");
    std::fs::write(installed_config, &edited).expect("edit the installed config");

    // Uninstall: the service (or our daemon) stops; the audit log and the agent's home are
    // kept (with their sizes), everything else of ours goes.
    let log_existed = cleanup.existed.contains(&PathBuf::from(LOG_DIR));
    // The agent's own work, in its home.
    let work = as_agent("echo the agent work > ~/notes.txt");
    assert!(work.status.success(), "{work:?}");
    cleanup.stop_daemon();
    let (code, undo) = run(&["proxy", "uninstall"]);
    assert_eq!(code, 0, "uninstall failed:\n{undo}");
    assert!(
        undo.contains(&format!("kept: keep the agent's home {HOME} (")),
        "{undo}"
    );
    assert!(undo.contains("kept (root's alone now):"), "{undo}");
    assert!(
        std::fs::symlink_metadata(PATH_LINK).is_err(),
        "the PATH link stayed:\n{undo}"
    );
    assert_meta(HOME, 0o700, "root", "root");
    assert_eq!(
        std::fs::read_to_string(Path::new(HOME).join("notes.txt")).expect("the agent's file"),
        "the agent work\n",
        "the home's content is kept"
    );
    if !log_existed {
        assert!(
            undo.contains("kept: keep the log directory (the audit log) /var/log/agenshield ("),
            "{undo}"
        );
        assert_meta(LOG_DIR, 0o700, "root", "root");
        let audit = std::fs::read_to_string("/var/log/agenshield/proxy-audit.jsonl")
            .expect("the audit log is kept");
        assert!(audit.contains("\"/hello\""), "the request's record is kept");
    }
    // The config: renamed, root's alone, its directory closed too.
    assert!(!Path::new(installed_config).exists(), "{undo}");
    let retired: Vec<PathBuf> = std::fs::read_dir("/opt/agenshield/config")
        .expect("config dir kept")
        .flatten()
        .map(|e| e.path())
        .collect();
    assert_eq!(retired.len(), 1, "{retired:?}");
    let retired = retired[0].display().to_string();
    assert!(
        retired.starts_with("/opt/agenshield/config/proxy.toml.uninstalled-"),
        "{retired}"
    );
    assert_eq!(std::fs::read_to_string(&retired).expect("kept"), edited);
    assert_meta(&retired, 0o600, "root", "root");
    assert_meta("/opt/agenshield/config", 0o700, "root", "root");
    assert_meta("/opt/agenshield/policies", 0o700, "root", "root");
    assert!(undo.contains(&retired), "the kept config is named:\n{undo}");

    // A later plain `proxy run` (no --config) starts on its built-in defaults: nothing left
    // behind is taken for an installation.
    let state = tempfile::tempdir().expect("tempdir");
    let mut plain = Command::new(binary())
        .args(["proxy", "run"])
        .env("AGENSHIELD_STATE_DIR", state.path())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("plain proxy run");
    let stdout = plain.stdout.take().expect("stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::BufRead as _;
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            if line.starts_with("agenshield: ready ") {
                let _ = tx.send(());
            }
        }
    });
    let ready = rx.recv_timeout(Duration::from_secs(30));
    let _ = plain.kill();
    let out = plain.wait_with_output().expect("plain run output");
    assert!(
        ready.is_ok(),
        "a plain `proxy run` after uninstall did not start:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for u in [AGENT, BROKER] {
        assert!(!user_exists(u), "user {u} left behind");
    }
    for g in [AGENT, BROKER, ADMIN] {
        assert!(!group_exists(g), "group {g} left behind");
    }
    let tables = String::from_utf8_lossy(&sh(&["nft", "list", "tables"]).stdout).into_owned();
    assert!(
        !tables.contains("agenshield"),
        "nft table left behind:\n{tables}"
    );
    // The operator's policy file stays, and with it its directory; nothing else of ours.
    assert!(
        policy.exists(),
        "uninstall removed a file it did not write:\n{undo}"
    );
    let left: Vec<String> = std::fs::read_dir("/opt/agenshield/policies")
        .expect("policy dir kept")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(left, vec!["50-e2e.toml".to_string()], "{undo}");
    std::fs::remove_file(&policy).expect("rm policy");
    std::fs::remove_dir("/opt/agenshield/policies").expect("rmdir policies");
    // What was kept, deleted by hand as the summary says.
    std::fs::remove_file(&retired).expect("rm the kept config");
    std::fs::remove_dir("/opt/agenshield/config").expect("rmdir config");
    std::fs::remove_dir_all(HOME).expect("rm the kept home");
    if !log_existed {
        std::fs::remove_dir_all(LOG_DIR).expect("rm the kept log");
    }
    if !cleanup.existed.contains(&PathBuf::from(ROOT)) {
        let left = sh(&["find", ROOT]);
        std::fs::remove_dir(ROOT).unwrap_or_else(|e| {
            panic!(
                "/opt/agenshield is not empty after uninstall ({e}):\n{}\n{undo}",
                String::from_utf8_lossy(&left.stdout)
            )
        });
    }

    // Install again, and uninstall with --purge: the audit log's directory and the agent's
    // home go too, counted.
    let (code, again) = run(&["proxy", "install", "--config", config_arg]);
    assert_eq!(code, 0, "install failed:\n{again}");
    let (code, purged) = run(&["proxy", "uninstall", "--purge"]);
    assert_eq!(code, 0, "uninstall --purge failed:\n{purged}");
    assert!(
        purged.contains(&format!("done: delete the agent's home {HOME} (")),
        "{purged}"
    );
    assert!(!Path::new(HOME).exists(), "{purged}");
    if !log_existed {
        assert!(
            purged.contains("done: delete the log directory (the audit log) /var/log/agenshield ("),
            "{purged}"
        );
        assert!(!Path::new(LOG_DIR).exists(), "{purged}");
    }
    assert!(!purged.contains("kept (root's alone now)"), "{purged}");
    assert!(std::fs::symlink_metadata(PATH_LINK).is_err(), "{purged}");
    // Nothing of the operator's was left this time: uninstall removed /opt/agenshield itself.
    if !cleanup.existed.contains(&PathBuf::from(ROOT)) {
        assert!(!Path::new(ROOT).exists(), "{purged}");
    }
    let mut after = snapshot();
    let mut was = before.clone();
    // The daemon appends to a log file that existed before (another test's leftover): that
    // file's size and time are not install's doing.
    // A directory that existed before gets a new time when entries come and go inside it.
    for snap in [&mut after, &mut was] {
        snap.retain(|k, _| !k.starts_with("/var/log/agenshield/"));
        for v in snap.values_mut() {
            if v.starts_with("40") {
                *v = v
                    .rsplit_once(' ')
                    .map(|x| x.0.to_string())
                    .unwrap_or_default();
            }
        }
    }
    assert_eq!(after, was, "uninstall left a trace:\n{undo}");
    let (code, again) = run(&["proxy", "uninstall"]);
    assert_eq!(code, 0, "{again}");
    assert!(again.contains("nothing changed"), "{again}");
}
