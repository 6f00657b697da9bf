//! A real `redis-server` (Debian's `redis-server`) on a free loopback port, for the fleet
//! rate-limit tests: no persistence, killed on drop, and able to be killed, stopped and
//! started again on the same port mid-test (an outage the daemon must ride out).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::pki::TestLeaf;

/// Whether `tool` is on PATH.
fn have(tool: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Without Debian's `redis-server` package: the reason to skip, or a failure under CI (which
/// installs it).
pub fn missing() -> Option<&'static str> {
    if have("redis-server") {
        return None;
    }
    let why = "skipped: needs Debian's redis-server package";
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "{why} (CI installs it)"
    );
    Some(why)
}

/// A running `redis-server`, killed on drop.
pub struct RedisServer {
    child: Option<Child>,
    pub addr: SocketAddr,
    /// `Some`: TLS on `addr` (and no plain port), with this leaf's files.
    tls: Option<(PathBuf, PathBuf)>,
    /// `requirepass`, if any.
    password: Option<String>,
    dir: tempfile::TempDir,
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port()
}

impl RedisServer {
    /// Plain TCP on a free loopback port.
    pub fn start() -> RedisServer {
        Self::start_with(None, None)
    }

    /// TLS only (`rediss://`), with `leaf` as the server's certificate (clients are not
    /// asked for one), and `password` required of clients if given.
    pub fn start_tls(leaf: &TestLeaf, password: Option<&str>) -> RedisServer {
        Self::start_with(Some(leaf), password)
    }

    fn start_with(leaf: Option<&TestLeaf>, password: Option<&str>) -> RedisServer {
        let dir = tempfile::tempdir().expect("tempdir");
        let tls = leaf.map(|leaf| {
            let (chain, key) = (dir.path().join("redis.pem"), dir.path().join("redis.key"));
            leaf.write_pems(&chain, &key).expect("write leaf");
            (chain, key)
        });
        let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().expect("addr");
        let mut server = RedisServer {
            child: None,
            addr,
            tls,
            password: password.map(str::to_string),
            dir,
        };
        server.spawn();
        server
    }

    fn spawn(&mut self) {
        let port = self.addr.port().to_string();
        let mut cmd = Command::new("redis-server");
        match &self.tls {
            None => {
                cmd.args(["--port", &port]);
            }
            Some((chain, key)) => {
                cmd.args(["--port", "0", "--tls-port", &port])
                    .arg("--tls-cert-file")
                    .arg(chain)
                    .arg("--tls-key-file")
                    .arg(key)
                    .args(["--tls-auth-clients", "no"]);
            }
        }
        if let Some(pw) = &self.password {
            cmd.args(["--requirepass", pw]);
        }
        let log = std::fs::File::create(self.dir.path().join("redis.log")).expect("log");
        let child = cmd
            .args(["--save", "", "--appendonly", "no", "--bind", "127.0.0.1"])
            .arg("--dir")
            .arg(self.dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::from(log.try_clone().expect("log")))
            .stderr(Stdio::from(log))
            .spawn()
            .expect("spawn redis-server");
        self.child = Some(child);
        self.wait_listening();
    }

    fn wait_listening(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if std::net::TcpStream::connect_timeout(&self.addr, Duration::from_millis(200)).is_ok()
            {
                return;
            }
            if let Some(Ok(Some(status))) = self.child.as_mut().map(Child::try_wait) {
                panic!("redis-server exited ({status}); its log:\n{}", self.log());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!(
            "redis-server did not listen within 10 s; its log:\n{}",
            self.log()
        );
    }

    /// `redis://127.0.0.1:PORT/0` (or `rediss://`).
    pub fn url(&self) -> String {
        let scheme = if self.tls.is_some() {
            "rediss"
        } else {
            "redis"
        };
        format!("{scheme}://{}/0", self.addr)
    }

    /// SIGKILL, as a crash: nothing is said to the clients.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts it again on the same port, empty (no persistence).
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    /// SIGSTOP (`true`) or SIGCONT (`false`): a server that hangs, its connections open.
    pub fn pause(&self, stop: bool) {
        let pid = self.child.as_ref().expect("running").id();
        let signal = if stop { "-STOP" } else { "-CONT" };
        let ok = Command::new("kill")
            .args([signal, &pid.to_string()])
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "kill {signal} {pid}");
    }

    /// How many script calls (EVALSHA and EVAL) the server has run (`INFO commandstats`;
    /// plain TCP only).
    pub fn script_calls(&self) -> u64 {
        assert!(self.tls.is_none(), "script_calls: plain TCP servers only");
        let out = Command::new("redis-cli")
            .args(["-h", "127.0.0.1", "-p", &self.addr.port().to_string()])
            .args(["INFO", "commandstats"])
            .output()
            .expect("redis-cli runs (Debian's redis-tools, with redis-server)");
        let text = String::from_utf8_lossy(&out.stdout);
        text.lines()
            .filter(|l| l.starts_with("cmdstat_evalsha:") || l.starts_with("cmdstat_eval:"))
            .filter_map(|l| {
                let calls = l.split_once("calls=")?.1;
                calls.split(',').next()?.trim().parse::<u64>().ok()
            })
            .sum()
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("redis.log")).unwrap_or_default()
    }
}
