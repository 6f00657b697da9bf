//! The root test lab: a throwaway agent user and a network namespace acting as "the
//! internet" (a veth pair with addresses of its own, IPv4 and IPv6). Everything it creates is
//! removed on drop, also when a test fails. Traffic only ever goes to the namespace, and only
//! after `assert_route` confirmed the kernel routes it there.

use std::net::{IpAddr, SocketAddr};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, MutexGuard};

/// Root tests share one firewall table name, so they run one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

/// Tools a root test needs besides the proxy.
const TOOLS: [&str; 9] = [
    "nft", "ip", "setpriv", "unshare", "useradd", "curl", "dig", "dnsmasq", "ssh",
];

/// `Some(guard)` when this test can run as root; otherwise prints why it skips, and fails
/// under `CI=true` (CI must run every root test).
pub fn root_or_skip(test: &str) -> Option<MutexGuard<'static, ()>> {
    let missing: Vec<&str> = TOOLS
        .iter()
        .copied()
        .filter(|t| which(t).is_none())
        .collect();
    let reason = if !nix::unistd::geteuid().is_root() {
        Some("needs root (nftables, network namespaces, a throwaway user)".to_string())
    } else if !missing.is_empty() {
        Some(format!("missing tools: {}", missing.join(", ")))
    } else {
        None
    };
    if let Some(reason) = reason {
        if std::env::var("CI").is_ok_and(|v| v == "true") {
            panic!("{test}: {reason}; under CI=true a skipped root test is a failure");
        }
        // Straight to the stderr fd: libtest captures eprintln!, and a skip must be seen.
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), "SKIP {test}: {reason}");
        return None;
    }
    Some(SERIAL.lock().unwrap_or_else(|p| p.into_inner()))
}

fn which(tool: &str) -> Option<std::path::PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .chain(["/usr/sbin".into(), "/sbin".into()])
        .map(|d| d.join(tool))
        .find(|p| p.exists())
}

/// Runs a command; panics with its output when it fails.
pub fn sh(args: &[&str]) -> Output {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .unwrap_or_else(|e| panic!("{args:?}: {e}"));
    assert!(
        out.status.success(),
        "{args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// A system user that exists for one test.
pub struct AgentUser {
    pub name: String,
    pub uid: u32,
}

impl AgentUser {
    pub fn create(tag: u32) -> AgentUser {
        Self::create_named(&format!("ashtest{tag}"), tag)
    }

    /// A user named `name` (e.g. `ash_<agent>_agent`, as AgenShield names an agent's user).
    pub fn create_named(name: &str, tag: u32) -> AgentUser {
        let name = name.to_string();
        let _ = Command::new("userdel").arg(&name).output();
        // A uid range of our own, away from real users and the product's 5200.
        let uid = 52_500 + tag % 400;
        sh(&[
            "useradd",
            "--system",
            "--no-create-home",
            "--shell",
            "/usr/sbin/nologin",
            "--uid",
            &uid.to_string(),
            "--user-group",
            &name,
        ]);
        AgentUser { name, uid }
    }

    /// `setpriv` prefix that runs a command as this user, with no supplementary groups.
    pub fn as_agent(&self) -> Vec<String> {
        vec![
            "setpriv".into(),
            format!("--reuid={}", self.uid),
            format!("--regid={}", self.uid),
            "--clear-groups".into(),
            "--".into(),
        ]
    }
}

impl Drop for AgentUser {
    fn drop(&mut self) {
        let _ = Command::new("userdel").arg(&self.name).output();
    }
}

/// "The internet": a namespace behind a veth pair, with two IPv4 and two IPv6 host addresses.
pub struct Internet {
    pub ns: String,
    host_if: String,
    /// `allowed.test` lives here…
    pub a4: IpAddr,
    pub a6: IpAddr,
    /// …and `other.test` here.
    pub b4: IpAddr,
    pub b6: IpAddr,
    pub net4: String,
    pub net6: String,
}

static NEXT: AtomicU32 = AtomicU32::new(0);

impl Internet {
    pub fn create() -> Internet {
        let n = (std::process::id() % 200 + NEXT.fetch_add(1, Ordering::Relaxed)) % 250 + 1;
        let ns = format!("ashinet{n}");
        let host_if = format!("ashh{n}");
        let ns_if = format!("ashn{n}");
        let _ = Command::new("ip").args(["netns", "del", &ns]).output();
        let _ = Command::new("ip").args(["link", "del", &host_if]).output();
        let net = Internet {
            ns: ns.clone(),
            host_if: host_if.clone(),
            a4: format!("10.213.{n}.2").parse().expect("ip"),
            b4: format!("10.213.{n}.3").parse().expect("ip"),
            a6: format!("fd00:213:{n}::2").parse().expect("ip"),
            b6: format!("fd00:213:{n}::3").parse().expect("ip"),
            net4: format!("10.213.{n}.0/24"),
            net6: format!("fd00:213:{n}::/64"),
        };
        sh(&["ip", "netns", "add", &ns]);
        sh(&[
            "ip", "link", "add", &host_if, "type", "veth", "peer", "name", &ns_if,
        ]);
        sh(&["ip", "link", "set", &ns_if, "netns", &ns]);
        sh(&[
            "ip",
            "addr",
            "add",
            &format!("10.213.{n}.1/24"),
            "dev",
            &host_if,
        ]);
        sh(&[
            "ip",
            "-6",
            "addr",
            "add",
            &format!("fd00:213:{n}::1/64"),
            "dev",
            &host_if,
            "nodad",
        ]);
        sh(&["ip", "link", "set", &host_if, "up"]);
        let ns_ip = |args: &[&str]| {
            let mut all = vec!["ip", "-n", ns.as_str()];
            all.extend_from_slice(args);
            sh(&all);
        };
        for a in [net.a4, net.b4] {
            ns_ip(&["addr", "add", &format!("{a}/24"), "dev", &ns_if]);
        }
        for a in [net.a6, net.b6] {
            ns_ip(&[
                "-6",
                "addr",
                "add",
                &format!("{a}/64"),
                "dev",
                &ns_if,
                "nodad",
            ]);
        }
        ns_ip(&["link", "set", &ns_if, "up"]);
        ns_ip(&["link", "set", "lo", "up"]);
        for a in [net.a4, net.b4, net.a6, net.b6] {
            net.assert_route(a);
        }
        net
    }

    /// Network safety: the kernel must route `addr` into our veth, nowhere else.
    pub fn assert_route(&self, addr: IpAddr) {
        let out = sh(&["ip", "route", "get", &addr.to_string()]);
        let route = String::from_utf8_lossy(&out.stdout);
        assert!(
            route.contains(&format!("dev {} ", self.host_if)),
            "refusing to send to {addr}: route is `{}`",
            route.trim()
        );
    }

    /// Binds TCP listeners inside the namespace (sockets keep their namespace for life).
    pub fn bind_tcp(&self, addrs: &[SocketAddr]) -> Vec<std::net::TcpListener> {
        let addrs = addrs.to_vec();
        self.inside(move || {
            addrs
                .iter()
                .map(|a| std::net::TcpListener::bind(a).unwrap_or_else(|e| panic!("bind {a}: {e}")))
                .collect()
        })
    }

    /// An upstream server listening at `addr` inside the namespace.
    pub fn serve(
        &self,
        addr: SocketAddr,
        opts: crate::upstream::UpstreamOptions,
    ) -> crate::upstream::Upstream {
        let listener = self.bind_tcp(&[addr]).pop().expect("listener");
        crate::upstream::Upstream::serve_std(listener, opts)
    }

    /// Binds a UDP socket inside the namespace.
    pub fn bind_udp(&self, addr: SocketAddr) -> std::net::UdpSocket {
        self.inside(move || std::net::UdpSocket::bind(addr).expect("bind udp"))
    }

    fn inside<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> T {
        let path = format!("/run/netns/{}", self.ns);
        std::thread::spawn(move || {
            let fd = std::fs::File::open(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
            nix::sched::setns(&fd, nix::sched::CloneFlags::CLONE_NEWNET).expect("setns");
            f()
        })
        .join()
        .expect("namespace thread")
    }
}

impl Drop for Internet {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.ns]).output();
        let _ = Command::new("ip")
            .args(["link", "del", &self.host_if])
            .output();
    }
}

/// Removes the daemon's nftables table when dropped (the daemon leaves it in place on exit,
/// by design, so agent traffic fails closed): declare it before the daemon in a test.
pub struct FirewallCleanup;

impl Drop for FirewallCleanup {
    fn drop(&mut self) {
        let _ = Command::new("nft")
            .args(["delete", "table", "inet", "agenshield"])
            .output();
    }
}
