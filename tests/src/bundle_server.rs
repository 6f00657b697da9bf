//! The centre of a fleet, for the policy bundle tests: a real nginx on a loopback port
//! serving a directory over TLS (a leaf from a test CA made here), and the real `minisign`
//! CLI making keys (`-G -W`: no password) and signatures (`-S`). Both are Debian packages
//! (`nginx-light`, `minisign`); without them a test fails under CI and skips otherwise.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::pki::TestCa;

/// Without nginx or minisign: the reason to skip, or a failure under CI (which installs them).
pub fn missing() -> Option<&'static str> {
    if crate::prometheus::have("nginx") && crate::prometheus::have("minisign") {
        return None;
    }
    let why = "skipped: needs Debian's nginx-light and minisign packages";
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "{why} (CI installs them)"
    );
    Some(why)
}

/// A minisign key pair in a directory of its own.
pub struct SigningKey {
    pub public: PathBuf,
    secret: PathBuf,
    _dir: tempfile::TempDir,
}

impl SigningKey {
    /// `minisign -G -W`: a new key pair, the secret one unencrypted.
    pub fn generate() -> SigningKey {
        let dir = tempfile::tempdir().expect("tempdir");
        let public = dir.path().join("policy.pub");
        let secret = dir.path().join("policy.key");
        run(Command::new("minisign")
            .args(["-G", "-W", "-p"])
            .arg(&public)
            .arg("-s")
            .arg(&secret));
        SigningKey {
            public,
            secret,
            _dir: dir,
        }
    }

    /// `minisign -S`: writes `file.minisig`.
    pub fn sign(&self, file: &Path) {
        let sig = PathBuf::from(format!("{}.minisig", file.display()));
        let _ = std::fs::remove_file(&sig);
        run(Command::new("minisign")
            .arg("-S")
            .arg("-s")
            .arg(&self.secret)
            .arg("-m")
            .arg(file)
            .arg("-x")
            .arg(&sig));
    }
}

fn run(cmd: &mut Command) {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("running {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// nginx serving `root` over TLS on 127.0.0.1, stopped on drop.
pub struct Nginx {
    child: Option<Child>,
    pub port: u16,
    /// The files it serves.
    pub root: PathBuf,
    /// The CA of its certificate, as PEM on disk (for the daemon's `policy.source.ca`).
    pub ca_file: PathBuf,
    dir: tempfile::TempDir,
}

impl Nginx {
    pub fn start() -> Nginx {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().join("www");
        std::fs::create_dir_all(&root).expect("www");
        std::fs::create_dir_all(dir.path().join("tmp")).expect("tmp");
        let ca = TestCa::new("bundle server CA");
        let leaf = ca.leaf(&["127.0.0.1"]);
        let (chain, key) = (dir.path().join("chain.pem"), dir.path().join("key.pem"));
        leaf.write_pems(&chain, &key).expect("leaf PEMs");
        let ca_file = dir.path().join("ca.pem");
        ca.write_pem(&ca_file).expect("CA PEM");
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("free port")
            .port();
        let mut n = Nginx {
            child: None,
            port,
            root,
            ca_file,
            dir,
        };
        n.up();
        n
    }

    /// `https://127.0.0.1:PORT/NAME`.
    pub fn url(&self, name: &str) -> String {
        format!("https://127.0.0.1:{}/{name}", self.port)
    }

    /// Starts nginx (again) on the same port, root and certificate.
    pub fn up(&mut self) {
        let d = self.dir.path().display().to_string();
        let conf = self.dir.path().join("nginx.conf");
        std::fs::write(
            &conf,
            format!(
                "daemon off;\nmaster_process off;\nworker_processes 1;\npid {d}/nginx.pid;\n\
                 error_log {d}/error.log;\nevents {{ worker_connections 64; }}\nhttp {{\n\
                 access_log {d}/access.log;\nclient_body_temp_path {d}/tmp;\nproxy_temp_path {d}/tmp;\n\
                 fastcgi_temp_path {d}/tmp;\nuwsgi_temp_path {d}/tmp;\nscgi_temp_path {d}/tmp;\n\
                 server {{\nlisten 127.0.0.1:{port} ssl;\nssl_certificate {d}/chain.pem;\n\
                 ssl_certificate_key {d}/key.pem;\nroot {root};\n}}\n}}\n",
                port = self.port,
                root = self.root.display()
            ),
        )
        .expect("nginx.conf");
        let child = Command::new("nginx")
            .arg("-c")
            .arg(&conf)
            .arg("-p")
            .arg(self.dir.path())
            .arg("-e")
            .arg(self.dir.path().join("error.log"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn nginx");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "nginx did not listen within 10 s: {}",
                std::fs::read_to_string(self.dir.path().join("error.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Stops nginx (the port then refuses connections).
    pub fn down(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// The GET requests nginx served for `name`, with their status: `(status, bytes)`.
    pub fn served(&self, name: &str) -> Vec<u16> {
        let log = std::fs::read_to_string(self.dir.path().join("access.log")).unwrap_or_default();
        let needle = format!("\"GET /{name} ");
        log.lines()
            .filter(|l| l.contains(&needle))
            .filter_map(|l| {
                let after = l.split('"').nth(2)?;
                after.split_whitespace().next()?.parse().ok()
            })
            .collect()
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        self.down();
    }
}
