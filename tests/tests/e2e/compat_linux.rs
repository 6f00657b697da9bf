//! The compat suite: after a real `agenshield proxy install`, the agent's real tools, run as
//! the agent user through the real transparent path with no flags, against servers shaped
//! like the real thing in a namespace of the test's own (under the real names: the daemon's
//! resolver table points pypi.org, registry.npmjs.org, github.com… there, and the agent's DNS
//! goes to the stub). Each tool works in a login shell and outside one (`su` without `-l`
//! from an empty environment: PAM gives the session its variables), and each is refused a
//! URL the policy denies.
//!
//! Nothing leaves the machine: the daemon's nameserver is a dead loopback port, every name
//! the tools use is in its static table, and every address in it routes into the namespace
//! (checked). Prints the tools' versions (the matrix of the closing note).
#![cfg(target_os = "linux")]

use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use agenshield_e2e::installation::*;
use agenshield_e2e::netlab::{root_or_skip, sh, Internet};
use agenshield_e2e::pki::TestCa;
use agenshield_e2e::upstream::UpstreamOptions;

mod doctor;

/// Tools the suite runs, beyond the root lab's: (command, Debian package).
const TOOLS: [(&str, &str); 12] = [
    ("wget", "wget"),
    ("git", "git"),
    ("go", "golang-go"),
    ("java", "default-jre-headless"),
    ("javac", "default-jdk-headless"),
    ("node", "nodejs"),
    ("npm", "npm"),
    ("/usr/sbin/sshd", "openssh-server"),
    ("ssh-keygen", "openssh-client"),
    ("pam-auth-update", "libpam-runtime"),
    ("/usr/bin/python3", "python3"),
    ("su", "util-linux"),
];

/// Python modules the agent's Python needs: (module, Debian package).
const PY_MODULES: [(&str, &str); 5] = [
    ("venv", "python3-venv"),
    ("requests", "python3-requests"),
    ("httpx", "python3-httpx"),
    ("websockets", "python3-websockets"),
    ("grpc", "python3-grpcio"),
];

fn have(tool: &str) -> bool {
    if tool.starts_with('/') {
        return Path::new(tool).exists();
    }
    Command::new("sh")
        .args([
            "-c",
            &format!("command -v {tool} || test -x /usr/sbin/{tool}"),
        ])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Why the suite cannot run here, if it cannot (a skip, or a failure under CI=true).
fn missing() -> Option<String> {
    let mut gone: Vec<String> = TOOLS
        .iter()
        .filter(|(t, _)| !have(t))
        .map(|(t, p)| format!("{t} ({p})"))
        .collect();
    for (m, p) in PY_MODULES {
        let ok = Command::new("/usr/bin/python3")
            .args(["-c", &format!("import {m}")])
            .output()
            .is_ok_and(|o| o.status.success());
        if !ok {
            gone.push(format!("python3 module {m} ({p})"));
        }
    }
    (!gone.is_empty()).then(|| format!("missing: {}", gone.join(", ")))
}

fn skip(why: &str) {
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("compat_linux: {why}; under CI=true a skipped root test is a failure");
    }
    use std::io::Write as _;
    let _ = writeln!(std::io::stderr(), "SKIP compat_linux: {why}");
}

/// A process in the namespace, killed on drop.
struct Bg(Child);

impl Drop for Bg {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `args` inside `ns` and waits for "ready" on its stdout (or a file to appear).
fn start_in(ns: &str, args: &[&str], log: &Path) -> Bg {
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", ns]).args(args);
    let log_file = std::fs::File::create(log).expect("log");
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::from(log_file))
        .spawn()
        .unwrap_or_else(|e| panic!("{args:?}: {e}"));
    let out = child.stdout.take().expect("stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(out).lines().map_while(Result::ok) {
            if line.trim() == "ready" {
                let _ = tx.send(());
            }
        }
    });
    if rx.recv_timeout(Duration::from_secs(30)).is_err() {
        let _ = child.kill();
        panic!(
            "{args:?} did not start: {}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
    }
    Bg(child)
}

/// Waits until something accepts TCP on `addr` inside the namespace.
fn wait_listening(ns: &str, addr: SocketAddr) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        let probe = format!("exec 3<>/dev/tcp/{}/{}", addr.ip(), addr.port());
        let ok = Command::new("ip")
            .args(["netns", "exec", ns, "bash", "-c", &probe])
            .output()
            .is_ok_and(|o| o.status.success());
        if ok {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("nothing listens on {addr} in {ns}");
}

/// How the agent's command is started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Context {
    /// `su -l`: a login shell, its start-up files read.
    Login,
    /// `su` without `-l` from an empty environment, `sh -c`: no start-up file at all.
    Plain,
}

fn in_context(ctx: Context, script: &str) -> Output {
    match ctx {
        Context::Login => as_agent(script),
        Context::Plain => as_agent_plain(script),
    }
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// One tool's check: a command that must print `want`, and one a denied URL must make fail
/// with output containing `refused`.
struct Check {
    tool: &'static str,
    works: String,
    want: &'static str,
    denied: String,
    refused: &'static str,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_tool_works_as_the_agent_with_no_flags_in_and_out_of_a_login_shell() {
    let Some(_serial) = root_or_skip("compat_linux") else {
        return;
    };
    if let Some(why) = missing() {
        return skip(&why);
    }
    if let Some(why) = installed_already() {
        return skip(&format!(
            "{why}; refusing to touch an existing installation"
        ));
    }
    let mut cleanup = Cleanup {
        daemon: None,
        existed: candidates().into_iter().filter(|p| p.exists()).collect(),
        extra_files: Vec::new(),
    };

    // The world: registries on a4 (pypi.org, files.pythonhosted.org, registry.npmjs.org,
    // github.com over HTTPS and ssh), an API with WebSockets on b4 (api.compat.test, and
    // pinned.compat.test for the passthrough rule), gRPC on b4:8443.
    let net = Internet::create();
    let ca = TestCa::new("compat suite upstream CA");
    let share = tempfile::tempdir().expect("tempdir");
    std::fs::set_permissions(share.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let dir = share.path();
    let upstream_ca = dir.join("upstream-ca.pem");
    ca.write_pem(&upstream_ca).expect("CA");
    let (a4, b4) = (net.a4, net.b4);
    for addr in [a4, b4] {
        net.assert_route(addr);
    }
    let registry_names = [
        "pypi.org",
        "files.pythonhosted.org",
        "registry.npmjs.org",
        "github.com",
    ];
    ca.leaf(&registry_names)
        .write_pems(&dir.join("registry.pem"), &dir.join("registry.key"))
        .expect("leaf");
    ca.leaf(&["grpc.compat.test"])
        .write_pems(&dir.join("grpc.pem"), &dir.join("grpc.key"))
        .expect("leaf");
    let root = dir.join("www");
    let git_root = dir.join("git");
    std::fs::create_dir_all(&root).expect("mkdir");
    make_repo(&git_root.join("compat/repo.git"), None);
    let compat_src = Path::new(env!("CARGO_MANIFEST_DIR")).join("compat");
    let p = |p: &Path| p.to_str().expect("utf-8").to_string();
    let _registry = start_in(
        &net.ns,
        &[
            "/usr/bin/python3",
            &p(&compat_src.join("registry.py")),
            &a4.to_string(),
            "443",
            &p(&dir.join("registry.pem")),
            &p(&dir.join("registry.key")),
            &p(&root),
            &p(&git_root),
        ],
        &dir.join("registry.log"),
    );
    let _grpc = start_in(
        &net.ns,
        &[
            "/usr/bin/python3",
            &p(&compat_src.join("grpc_server.py")),
            &format!("{b4}:8443"),
            &p(&dir.join("grpc.pem")),
            &p(&dir.join("grpc.key")),
        ],
        &dir.join("grpc.log"),
    );
    let api = net.serve(
        SocketAddr::new(b4, 443),
        UpstreamOptions {
            tls: Some(ca.leaf(&["api.compat.test", "pinned.compat.test"])),
            name: "compat-api".into(),
            ..Default::default()
        },
    );
    let _plain_api = net.serve(
        SocketAddr::new(b4, 80),
        UpstreamOptions {
            name: "compat-api-plain".into(),
            ..Default::default()
        },
    );

    // Install, with the namespace's names in the daemon's resolver table.
    let (transparent, explicit, dns) = (free_port(), free_port(), free_dns_port());
    let mut hosts = String::new();
    for n in registry_names {
        hosts.push_str(&format!("{n:?} = [\"{a4}\"]\n"));
    }
    for n in ["api.compat.test", "pinned.compat.test", "grpc.compat.test"] {
        hosts.push_str(&format!("{n:?} = [\"{b4}\"]\n"));
    }
    let config_text = format!(
        "[listen]\ntransparent = [\"127.0.0.1:{transparent}\"]\nexplicit = \"127.0.0.1:{explicit}\"\n\
         dns = \"127.0.0.1:{dns}\"\nmetrics = \"off\"\nadmin = \"{RUN_DIR}/proxy.sock\"\n\n\
         [daemon]\nworker_user = \"{BROKER}\"\n\n\
         [redirect]\nenabled = true\nagent_users = [\"{AGENT}\"]\nreconcile_interval = \"1s\"\n\n\
         [upstream]\nextra_ca = [\"{}\"]\nallow_private = [\"{}\"]\n\n\
         [resolver]\nnameservers = [\"127.0.0.1:9\"]\n\n[resolver.hosts]\n{hosts}",
        upstream_ca.display(),
        net.net4
    );
    let config = dir.join("proxy.toml");
    std::fs::write(&config, &config_text).expect("config");
    let (code, out) = run(&["proxy", "install", "--config", &p(&config)]);
    assert_eq!(code, 0, "install failed:\n{out}");
    let policy = PathBuf::from("/opt/agenshield/policies/50-compat.toml");
    std::fs::write(&policy, POLICY).expect("policy");
    cleanup.extra_files.push(policy);
    if !Path::new("/run/systemd/system").exists() {
        cleanup.daemon = Some(start_daemon(&dir.join("daemon.log")));
    }

    // What the agent's tools need that a user would have: git's identity, an ssh key the
    // server knows and the server's host key, the compiled Go and Java clients.
    let agent_home = Path::new(HOME);
    let ssh_dir = dir.join("sshd");
    std::fs::create_dir_all(&ssh_dir).expect("mkdir");
    sh(&[
        "ssh-keygen",
        "-q",
        "-t",
        "ed25519",
        "-N",
        "",
        "-f",
        &p(&ssh_dir.join("host")),
    ]);
    let prep = as_agent(
        "mkdir -p ~/.ssh && chmod 700 ~/.ssh && ssh-keygen -q -t ed25519 -N '' -f ~/.ssh/id_ed25519 \
         && git config --global user.email agent@compat.test && git config --global user.name agent \
         && git config --global init.defaultBranch main",
    );
    assert!(prep.status.success(), "{}", text(&prep));
    let host_pub = std::fs::read_to_string(ssh_dir.join("host.pub")).expect("host key");
    let known = agent_home.join(".ssh/known_hosts");
    std::fs::write(&known, format!("github.com {host_pub}")).expect("known_hosts");
    sh(&["chown", &format!("{AGENT}:{AGENT}"), &p(&known)]);
    std::fs::copy(agent_home.join(".ssh/id_ed25519.pub"), ssh_dir.join(AGENT)).expect("key");
    let ssh_repo = dir.join("ssh-git/repo.git");
    make_repo(&ssh_repo, Some(AGENT));
    std::fs::write(
        ssh_dir.join("sshd_config"),
        format!(
            "ListenAddress {a4}:22\nHostKey {}\nAuthorizedKeysFile {}/%u\nStrictModes no\n\
             PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM yes\n\
             PidFile {}\nAllowUsers {AGENT}\n",
            p(&ssh_dir.join("host")),
            p(&ssh_dir),
            p(&ssh_dir.join("sshd.pid"))
        ),
    )
    .expect("sshd_config");
    std::fs::create_dir_all("/run/sshd").expect("privsep dir");
    let sshd_log = std::fs::File::create(dir.join("sshd.log")).expect("log");
    let _sshd = Bg(Command::new("ip")
        .args(["netns", "exec", &net.ns, "/usr/sbin/sshd", "-D", "-e", "-f"])
        .arg(ssh_dir.join("sshd_config"))
        .stderr(Stdio::from(sshd_log))
        .spawn()
        .expect("sshd"));
    wait_listening(&net.ns, SocketAddr::new(a4, 22));

    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).expect("mkdir");
    let go = Command::new("go")
        .args(["build", "-o"])
        .arg(bin.join("get-go"))
        .arg(compat_src.join("get.go"))
        .env("GOCACHE", dir.join("gocache"))
        .env("GOPATH", dir.join("gopath"))
        .env("GO111MODULE", "off")
        .output()
        .expect("go build");
    assert!(go.status.success(), "go build: {}", text(&go));
    let javac = Command::new("javac")
        .arg("-d")
        .arg(&bin)
        .arg(compat_src.join("Get.java"))
        .output()
        .expect("javac");
    assert!(javac.status.success(), "javac: {}", text(&javac));
    std::fs::copy(env!("CARGO_BIN_EXE_pinned-get"), bin.join("pinned-get")).expect("copy");
    for f in std::fs::read_dir(&bin).expect("ls").flatten() {
        let _ = std::fs::set_permissions(f.path(), std::fs::Permissions::from_mode(0o755));
    }

    let checks = checks(&bin, &upstream_ca, &ssh_repo);
    // The daemon comes up, and the agent reaches it.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let o = as_agent("curl -sS --max-time 5 https://api.compat.test/ok");
        if o.status.success() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the agent never got through: {}\ndaemon log:\n{}",
            text(&o),
            std::fs::read_to_string(dir.join("daemon.log")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(250));
    }

    let mut failures = Vec::new();
    for ctx in [Context::Login, Context::Plain] {
        let _ = as_agent("rm -rf ~/w && mkdir ~/w");
        for c in &checks {
            let started = Instant::now();
            let o = in_context(ctx, &format!("cd ~/w && {}", c.works));
            let out = text(&o);
            if !o.status.success() || !out.contains(c.want) {
                failures.push(format!("{} ({ctx:?}): `{}` gave:\n{out}", c.tool, c.works));
            }
            let o = in_context(ctx, &format!("cd ~/w && {}", c.denied));
            let out = text(&o);
            if !out.contains(c.refused) {
                failures.push(format!(
                    "{} ({ctx:?}) was not refused: `{}` gave:\n{out}",
                    c.tool, c.denied
                ));
            }
            eprintln!(
                "{:>10} {ctx:?}: {} ms",
                c.tool,
                started.elapsed().as_millis()
            );
        }
    }
    eprintln!("versions:\n{}", versions());
    assert!(
        failures.is_empty(),
        "{} failures:\n{}\ndaemon log (tail):\n{}\ndaemon log, raw TCP:\n{}\nsshd log (tail):\n{}",
        failures.len(),
        failures.join("\n---\n"),
        tail(&dir.join("daemon.log"), 40),
        matching(&dir.join("daemon.log"), ":22", 20),
        tail(&dir.join("sshd.log"), 30)
    );
    assert!(
        api.requests()
            .iter()
            .any(|r| r.path_and_query == "/ok/pinned"),
        "the passthrough client reached the API"
    );

    doctor::finds_and_fixes(&upstream_ca, &config);

    cleanup.stop_daemon();
    let (code, undo) = run(&["proxy", "uninstall"]);
    assert_eq!(code, 0, "uninstall failed:\n{undo}");
}

const POLICY: &str = r#"version = 1

# The shipped default policy allows these registries too; what the suite denies is denied
# here, ahead of it.
[[rule]]
id = "compat-denied"
hosts = ["pypi.org", "registry.npmjs.org", "github.com"]
paths = ["/denied/**", "/compat-denied", "/compat-denied/**", "/other/**"]
action = "deny"
priority = 10

[[rule]]
id = "compat-pypi"
hosts = ["pypi.org", "files.pythonhosted.org"]
paths = ["/simple/**", "/packages/**"]
action = "allow"

[[rule]]
id = "compat-npm"
hosts = ["registry.npmjs.org"]
paths = ["/compat-demo", "/compat-demo/**"]
action = "allow"

[[rule]]
id = "compat-github"
hosts = ["github.com"]
paths = ["/compat/**"]
action = "allow"

[[rule]]
id = "compat-github-ssh"
hosts = ["github.com"]
ports = [22]
schemes = ["tcp"]
action = "allow"

[[rule]]
id = "compat-api"
hosts = ["api.compat.test"]
paths = ["/ok/**", "/ok", "/ws"]
action = "allow"

[[rule]]
id = "compat-grpc"
hosts = ["grpc.compat.test"]
ports = [8443]
paths = ["/compat.Echo/Say"]
action = "allow"

[[rule]]
id = "compat-pinned"
hosts = ["pinned.compat.test"]
action = "allow"
tls = "passthrough"
"#;

/// The checks, in the order the closing note's matrix lists them.
fn checks(bin: &Path, upstream_ca: &Path, ssh_repo: &Path) -> Vec<Check> {
    let b = |name: &str| bin.join(name).display().to_string();
    let api = "https://api.compat.test";
    let py = "/usr/bin/python3";
    let c = |tool, works: String, want, denied: String, refused| Check {
        tool,
        works,
        want,
        denied,
        refused,
    };
    // python websockets: an echo on /ws, and a handshake to a denied path.
    let ws = |scheme: &'static str| {
        let script = |path: &str, body: &str| {
            format!(
                "{py} -c \"import asyncio, websockets\nasync def m():\n  async with \
                 websockets.connect('{scheme}://api.compat.test/{path}') as w:\n    {body}\n\
                 asyncio.run(m())\""
            )
        };
        c(
            scheme,
            script("ws", "await w.send('hi'); print('got', await w.recv())"),
            "got hi",
            script("denied", "pass"),
            "403",
        )
    };
    vec![
        c(
            "curl",
            format!("curl -sS {api}/ok"),
            "hello from compat-api",
            format!("curl -sS {api}/denied"),
            "policy_denied",
        ),
        c(
            "wget",
            format!("wget -O- {api}/ok"),
            "hello from compat-api",
            format!("wget -O- {api}/denied"),
            "403",
        ),
        c(
            "git-https",
            "rm -rf c && git clone https://github.com/compat/repo.git c && cd c && date > f \
             && git add f && git commit -qm push && git push -q origin HEAD && echo pushed"
                .into(),
            "pushed",
            "git clone https://github.com/other/repo.git o".into(),
            "403",
        ),
        c(
            "git-ssh",
            format!(
                "rm -rf s && git clone -q ssh://{AGENT}@github.com{} s && cd s && date > f \
                 && git add f && git commit -qm push && git push -q origin HEAD && echo pushed",
                ssh_repo.display()
            ),
            "pushed",
            "ssh -o BatchMode=yes -o ConnectTimeout=10 pypi.org true; echo \"exit=$?\"".into(),
            "exit=255",
        ),
        c(
            "pip",
            format!(
                "rm -rf v && {py} -m venv v && v/bin/pip install -q compat-demo \
                 && v/bin/python -c 'import compat_demo; print(compat_demo.VALUE)'"
            ),
            "compat-demo works",
            "v/bin/pip download -q -d d https://pypi.org/denied/x-1.0-py3-none-any.whl".into(),
            "403",
        ),
        c(
            "urllib",
            format!(
                "{py} -c \"import urllib.request as u; print(u.urlopen('{api}/ok').read().decode())\""
            ),
            "hello from compat-api",
            format!("{py} -c \"import urllib.request as u; u.urlopen('{api}/denied')\""),
            "HTTP Error 403",
        ),
        c(
            "requests",
            format!("{py} -c \"import requests; print(requests.get('{api}/ok').text)\""),
            "hello from compat-api",
            format!(
                "{py} -c \"import requests; print(requests.get('{api}/denied').status_code)\""
            ),
            "403",
        ),
        c(
            "httpx",
            format!("{py} -c \"import httpx; print(httpx.get('{api}/ok').text)\""),
            "hello from compat-api",
            format!("{py} -c \"import httpx; print(httpx.get('{api}/denied').status_code)\""),
            "403",
        ),
        c(
            "npm",
            "rm -rf n && mkdir n && cd n && npm install --silent compat-demo \
             && node -e \"console.log(require('compat-demo'))\""
                .into(),
            "compat-demo works",
            "npm view compat-denied".into(),
            "403",
        ),
        c(
            "node-fetch",
            format!("node -e \"fetch('{api}/ok').then(r => r.text()).then(console.log)\""),
            "hello from compat-api",
            format!("node -e \"fetch('{api}/denied').then(r => console.log(r.status))\""),
            "403",
        ),
        c(
            "node-https",
            format!(
                "node -e \"require('https').get('{api}/ok', r => r.on('data', d => process.stdout.write(d)))\""
            ),
            "hello from compat-api",
            format!(
                "node -e \"require('https').get('{api}/denied', r => {{ console.log(r.statusCode); r.resume(); }})\""
            ),
            "403",
        ),
        c(
            "go",
            format!("{} {api}/ok", b("get-go")),
            "200",
            format!("{} {api}/denied", b("get-go")),
            "403",
        ),
        c(
            "java",
            format!("java -cp {} Get {api}/ok", bin.display()),
            "200",
            format!("java -cp {} Get {api}/denied", bin.display()),
            "403",
        ),
        c(
            "grpc",
            format!(
                "{py} -c \"import grpc; ch = grpc.secure_channel('grpc.compat.test:8443', \
                 grpc.ssl_channel_credentials()); print(ch.unary_unary('/compat.Echo/Say')(b'hi', timeout=20))\""
            ),
            "echo: hi",
            format!(
                "{py} -c \"import grpc; ch = grpc.secure_channel('grpc.compat.test:8443', \
                 grpc.ssl_channel_credentials()); ch.unary_unary('/compat.Echo/Other')(b'hi', timeout=20)\""
            ),
            "PERMISSION_DENIED",
        ),
        ws("wss"),
        ws("ws"),
        c(
            "rustls-webpki",
            format!(
                "{} pinned.compat.test 443 {} /ok/pinned",
                b("pinned-get"),
                upstream_ca.display()
            ),
            "HTTP/1.1 200 OK",
            format!(
                "{} api.compat.test 443 {} /ok",
                b("pinned-get"),
                upstream_ca.display()
            ),
            "UnknownIssuer",
        ),
    ]
}

/// A bare repository with one commit, pushable (over HTTP as root's CGI; over ssh by `owner`).
fn make_repo(path: &Path, owner: Option<&str>) {
    let p = path.display().to_string();
    sh(&["git", "init", "-q", "--bare", "-b", "main", &p]);
    sh(&["git", "-C", &p, "config", "http.receivepack", "true"]);
    let work = tempfile::tempdir().expect("tempdir");
    let w = work.path().display().to_string();
    sh(&["git", "init", "-q", "-b", "main", &w]);
    std::fs::write(work.path().join("README"), "compat\n").expect("write");
    sh(&["git", "-C", &w, "add", "README"]);
    sh(&[
        "git",
        "-C",
        &w,
        "-c",
        "user.email=t@t",
        "-c",
        "user.name=t",
        "commit",
        "-qm",
        "first",
    ]);
    sh(&["git", "-C", &w, "push", "-q", &p, "main"]);
    if let Some(o) = owner {
        sh(&["chown", "-R", &format!("{o}:{o}"), &p]);
    }
}

/// The last `n` lines of a file.
fn tail(p: &Path, n: usize) -> String {
    matching(p, "", n)
}

/// The last `n` lines of a file that contain `needle`.
fn matching(p: &Path, needle: &str, n: usize) -> String {
    let t = std::fs::read_to_string(p).unwrap_or_default();
    let lines: Vec<&str> = t.lines().filter(|l| l.contains(needle)).collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// One line per tool: what it printed of its own version.
fn versions() -> String {
    let cmds = [
        "curl --version | head -1",
        "wget --version | head -1",
        "git --version",
        "ssh -V 2>&1",
        "/usr/bin/python3 --version",
        "/usr/bin/python3 -m pip --version | cut -d' ' -f1-2",
        "/usr/bin/python3 -c 'import requests, httpx, websockets, grpc; print(\"requests\", requests.__version__, \"httpx\", httpx.__version__, \"websockets\", websockets.__version__, \"grpcio\", grpc.__version__)'",
        "node --version",
        "npm --version",
        "go version",
        "java -version 2>&1 | head -1",
    ];
    cmds.iter()
        .map(|c| {
            let o = Command::new("sh").args(["-c", c]).output();
            o.map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
                .unwrap_or_default()
        })
        .collect::<Vec<_>>()
        .join("\n")
}
