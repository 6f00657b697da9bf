//! A real rsyslogd (Debian's `rsyslog`, and `rsyslog-gnutls` for TLS) receiving a test
//! daemon's audit export: its own config, work directory and pid file in a temporary
//! directory, no system socket (`rsyslogd -n -f CONF -i PIDFILE`), one `imtcp` input per
//! port, each writing the messages' MSG (`%msg%`) one per line to a file of its own. Stopped
//! (SIGTERM) and started again on the same ports at will; killed on drop.

use std::fmt::Write as _;
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The TLS side of a receiver: its certificate and key, the CA its clients' certificates
/// must chain to (a client certificate is required).
pub struct RsyslogTls {
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

pub struct Rsyslog {
    child: Option<Child>,
    pub dir: tempfile::TempDir,
    /// One port per input, in the order asked.
    pub ports: Vec<u16>,
    conf: PathBuf,
}

/// Without Debian's `rsyslog` (and `rsyslog-gnutls` when `tls`): the reason to skip, or a
/// failure under CI (which installs them).
pub fn missing(tls: bool) -> Option<String> {
    let have = Path::new("/usr/sbin/rsyslogd").exists();
    let gtls = [
        "/usr/lib/x86_64-linux-gnu/rsyslog/lmnsd_gtls.so",
        "/usr/lib/aarch64-linux-gnu/rsyslog/lmnsd_gtls.so",
    ]
    .iter()
    .any(|p| Path::new(p).exists());
    if have && (!tls || gtls) {
        return None;
    }
    let why = "skipped: needs Debian's rsyslog and rsyslog-gnutls packages".to_string();
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "{why} (CI installs them)"
    );
    Some(why)
}

fn free_port() -> u16 {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

impl Rsyslog {
    /// `inputs` receivers (plain TCP, or all TLS with `tls`), each writing to `out(i)`.
    pub fn start(inputs: usize, tls: Option<&RsyslogTls>) -> Rsyslog {
        let dir = tempfile::tempdir().expect("tempdir");
        let ports: Vec<u16> = (0..inputs).map(|_| free_port()).collect();
        let d = dir.path();
        let mut c = String::new();
        let _ = write!(
            c,
            "global(workDirectory=\"{}\" maxMessageSize=\"64k\"",
            d.display()
        );
        match tls {
            Some(t) => {
                let _ = writeln!(
                    c,
                    " defaultNetstreamDriver=\"gtls\" defaultNetstreamDriverCAFile=\"{}\" \
                     defaultNetstreamDriverCertFile=\"{}\" defaultNetstreamDriverKeyFile=\"{}\")",
                    t.ca.display(),
                    t.cert.display(),
                    t.key.display()
                );
                let _ = writeln!(
                    c,
                    "module(load=\"imtcp\" streamDriver.name=\"gtls\" streamDriver.mode=\"1\" \
                     streamDriver.authMode=\"x509/certvalid\")"
                );
            }
            None => {
                let _ = writeln!(c, ")\nmodule(load=\"imtcp\")");
            }
        }
        let _ = writeln!(
            c,
            "template(name=\"msgonly\" type=\"string\" string=\"%msg%\\n\")\n\
             template(name=\"meta\" type=\"string\" string=\"%hostname% %msgid% %structured-data%\\n\")"
        );
        for (i, port) in ports.iter().enumerate() {
            let _ = writeln!(
                c,
                "input(type=\"imtcp\" port=\"{port}\" address=\"127.0.0.1\" ruleset=\"r{i}\")\n\
                 ruleset(name=\"r{i}\") {{\n  action(type=\"omfile\" file=\"{}\" template=\"msgonly\")\n  \
                 action(type=\"omfile\" file=\"{}\" template=\"meta\")\n}}",
                d.join(format!("out{i}.log")).display(),
                d.join(format!("meta{i}.log")).display()
            );
        }
        let conf = d.join("rsyslog.conf");
        std::fs::write(&conf, c).expect("write rsyslog.conf");
        let mut r = Rsyslog {
            child: None,
            dir,
            ports,
            conf,
        };
        r.resume();
        r
    }

    /// Starts rsyslogd (again) and waits until every input accepts connections.
    pub fn resume(&mut self) {
        let pid = self.dir.path().join("rsyslogd.pid");
        let _ = std::fs::remove_file(&pid);
        let log = std::fs::File::create(self.dir.path().join("rsyslogd.stderr")).expect("log");
        let child = Command::new("/usr/sbin/rsyslogd")
            .arg("-n")
            .arg("-f")
            .arg(&self.conf)
            .arg("-i")
            .arg(&pid)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn rsyslogd");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        for port in &self.ports {
            let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, *port));
            while TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err() {
                assert!(
                    Instant::now() < deadline,
                    "rsyslogd did not listen on {port}: {}",
                    std::fs::read_to_string(self.dir.path().join("rsyslogd.stderr"))
                        .unwrap_or_default()
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }

    /// SIGTERM, and waits for it to exit (it writes out what it received).
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let pid = nix::unistd::Pid::from_raw(child.id() as i32);
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
            let _ = child.wait();
        }
    }

    /// The messages input `i` received so far, one per line.
    pub fn received(&self, i: usize) -> Vec<String> {
        read_lines(&self.dir.path().join(format!("out{i}.log")))
    }

    /// `HOSTNAME MSGID STRUCTURED-DATA` of each message input `i` received.
    pub fn meta(&self, i: usize) -> Vec<String> {
        read_lines(&self.dir.path().join(format!("meta{i}.log")))
    }
}

fn read_lines(p: &Path) -> Vec<String> {
    std::fs::read_to_string(p)
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

impl Drop for Rsyslog {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
