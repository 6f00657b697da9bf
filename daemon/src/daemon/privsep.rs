//! Privilege separation: a small root supervisor and an unprivileged worker.
//!
//! With `daemon.worker_user` set and started as root, `agenshield proxy run` splits in two:
//!
//! - the **supervisor** (root) binds every listener and the admin socket, installs the
//!   firewall redirect and keeps it in place (reconcile), starts the worker, hands it the
//!   bound sockets over a Unix socket pair (`SCM_RIGHTS`), forwards SIGHUP/SIGTERM to it,
//!   reports each reconcile outcome to it, and exits with its exit code. It parses nothing
//!   that comes from the network.
//! - the **worker** (`proxy run --worker`) receives the sockets, drops to the worker user
//!   for good (groups, gid, uid; no new privileges) before its runtime starts, then does
//!   everything else: TLS, HTTP, policy, secrets, audit, metrics, the admin API. On Linux it
//!   needs nothing from root after that: `SO_ORIGINAL_DST` and the socket-owner lookup
//!   (`sock_diag`) work unprivileged.
//!
//! macOS: `DIOCNATLOOK` needs euid 0 on every call, so the worker sends each accepted socket
//! to the supervisor over a datagram pair (`orig_broker`); the supervisor reads the addresses
//! from the socket itself (`getsockname`/`getpeername`, so a compromised worker cannot choose
//! what is looked up), asks pf, and answers with the original destination.
//! `testing.broker_orig_dst` takes the same path on Linux. On Linux the same channel carries
//! the one other question: conntrack's original tuple of a connection whose client socket
//! `sock_diag` did not find where the proxy saw it (nf_nat moved its source port; ctnetlink
//! needs `CAP_NET_ADMIN`).
//!
//! If the worker dies the supervisor exits with its code (the rules stay: the agent fails
//! closed) and the service manager restarts both; if the supervisor dies the worker sees its
//! control socket close and stops.

use std::ffi::OsString;
use std::net::SocketAddr;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream as StdUnixStream;
use std::process::Stdio;
use std::sync::Arc;

use agenshield_pf::privsep::{self as os, Identity};
use anyhow::Context;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::signal::unix::{signal, SignalKind};

use crate::config::Config;
use crate::control::firewall_view::FirewallView;
use crate::daemon::{self, Bound, Listeners};
use crate::metrics::Metrics;

/// What the supervisor tells the worker along with the sockets.
#[derive(Debug, Serialize, Deserialize, PartialEq)]
pub struct Header {
    /// Protocol version.
    pub v: u32,
    pub transparent: Vec<SocketAddr>,
    pub explicit: SocketAddr,
    pub metrics: Option<SocketAddr>,
    /// The DNS stub's addresses: a UDP socket, then a TCP listener, for each.
    #[serde(default)]
    pub dns: Vec<SocketAddr>,
    /// The agent uids whose redirect the supervisor keeps; `None`: redirect off.
    pub firewall: Option<Vec<u32>>,
    /// The worker asks the supervisor for original destinations (`orig_broker`); the last
    /// socket handed over is its end of that channel.
    #[serde(default)]
    pub natlook: bool,
    /// The worker asks the supervisor for conntrack's original tuples (`orig_broker`, the
    /// same channel).
    #[serde(default)]
    pub conntrack: bool,
}

impl Header {
    /// Whether the hand-off carries a lookup channel (its last socket).
    fn lookup_channel(&self) -> bool {
        self.natlook || self.conntrack
    }
}

const VERSION: u32 = 1;

/// The worker user of a split start, if this start splits: `daemon.worker_user` is set and
/// we are root. Set but not root is an error (it could not be honoured).
pub fn worker_user(cfg: &Config) -> anyhow::Result<Option<Identity>> {
    let Some(user) = &cfg.worker_user else {
        return Ok(None);
    };
    if !nix::unistd::geteuid().is_root() {
        anyhow::bail!(
            "daemon.worker_user = {user} needs the daemon started as root (it drops to that \
             user after binding and installing the redirect)"
        );
    }
    let who = Identity::lookup(&user.to_string())
        .map_err(|e| daemon::BadInput(format!("daemon.worker_user: {e}")))?;
    Ok(Some(who))
}

/// The supervisor: binds, redirects, starts the worker as `who`, and waits for it. Returns
/// the exit code to leave with.
pub async fn supervise(cfg: Config, who: Identity) -> anyhow::Result<u8> {
    let Some(config_path) = cfg.source.clone() else {
        anyhow::bail!("a split daemon needs a config file (daemon.worker_user is set in one)");
    };
    daemon::prepare(&cfg)?;
    let bound = Bound::bind(&cfg).await?;
    let metrics = Arc::new(Metrics::new());
    let (report_tx, mut report_rx) = tokio::sync::watch::channel(String::from("matches"));
    let firewall = if cfg.redirect.enabled {
        let (_, spec) = daemon::install_firewall(
            &cfg,
            &bound.listeners.transparent_addrs,
            &bound.listeners.dns_addrs(),
            metrics,
            Some(report_tx),
        )?;
        Some(spec.agent_uids)
    } else {
        None
    };
    let header = Header {
        v: VERSION,
        transparent: bound.listeners.transparent_addrs.clone(),
        explicit: bound.listeners.explicit_addr,
        metrics: match &bound.listeners.metrics {
            Some(l) => Some(l.local_addr()?),
            None => None,
        },
        dns: bound.listeners.dns_addrs(),
        firewall,
        natlook: cfg!(target_os = "macos") || cfg.testing.broker_orig_dst,
        conntrack: cfg!(target_os = "linux"),
    };
    // Where a lookup needs root (pf, ctnetlink), the worker asks us: a channel and a thread
    // answering.
    let natlook = if header.lookup_channel() {
        let (mine, worker_end) = os::datagram_pair().context("creating the lookup channel")?;
        let lookup: Box<dyn agenshield_pf::OrigDst> = match cfg.testing.orig_dst_override {
            Some(addr) => Box::new(agenshield_pf::FixedOrigDst(addr)),
            None => agenshield_pf::platform_orig_dst(),
        };
        let listeners = crate::daemon::orig_broker::Listening {
            transparent: header.transparent.clone(),
            dns: header.dns.clone(),
        };
        let mine = std::os::unix::net::UnixDatagram::from(mine);
        std::thread::Builder::new()
            .name("orig-dst".into())
            .spawn(move || crate::daemon::orig_broker::serve(mine, listeners, lookup))
            .context("starting the lookup thread")?;
        Some(worker_end)
    } else {
        None
    };

    let (ours, theirs) = StdUnixStream::pair().context("creating the worker's socket pair")?;
    let mut args: Vec<OsString> = vec!["proxy".into(), "run".into(), "--worker".into()];
    args.push("--config".into());
    args.push(config_path.into_os_string());
    if let Some(addr) = cfg.testing.orig_dst_override {
        args.push("--orig-dst-override".into());
        args.push(addr.to_string().into());
    }
    let exe = std::env::current_exe().context("finding our own executable")?;
    let mut child = tokio::process::Command::new(&exe)
        .args(&args)
        // The worker tells us when it serves; only we talk to the service manager.
        .env_remove("NOTIFY_SOCKET")
        .stdin(Stdio::from(OwnedFd::from(theirs)))
        .spawn()
        .with_context(|| format!("starting the worker {}", exe.display()))?;
    let pid = child.id().map(|p| nix::unistd::Pid::from_raw(p as i32));
    let mut fds = Vec::new();
    for l in &bound.listeners.transparent {
        fds.push(l.as_fd());
    }
    fds.push(bound.listeners.explicit.as_fd());
    if let Some(m) = &bound.listeners.metrics {
        fds.push(m.as_fd());
    }
    for d in &bound.listeners.dns {
        fds.push(d.udp.as_fd());
        fds.push(d.tcp.as_fd());
    }
    fds.push(bound.admin.as_fd());
    if let Some(n) = &natlook {
        fds.push(n.as_fd());
    }
    os::send_fds(&ours, &serde_json::to_vec(&header)?, &fds)
        .context("handing the sockets to the worker")?;
    drop(fds);
    // The worker has its own copies; ours would only keep the ports open if it died.
    drop(bound);
    drop(natlook);
    tracing::info!(
        worker_pid = pid.map_or(0, |p| p.as_raw()),
        user = %who.name,
        uid = who.uid,
        "supervisor: worker started; serving is the worker's from here"
    );

    ours.set_nonblocking(true)?;
    let (from_worker, control) = tokio::net::UnixStream::from_std(ours)?.into_split();
    let mut from_worker = BufReader::new(from_worker).lines();
    let mut worker_talks = true;
    let mut hup = signal(SignalKind::hangup())?;
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let forward = |sig: nix::sys::signal::Signal| {
        if let Some(pid) = pid {
            let _ = nix::sys::signal::kill(pid, sig);
        }
    };
    let status = loop {
        tokio::select! {
            st = child.wait() => break st?,
            line = from_worker.next_line(), if worker_talks => match line {
                Ok(Some(l)) if format!("{l}\n") == super::readiness::READY_LINE => {
                    super::readiness::notify_service_manager();
                }
                Ok(Some(_)) => {}
                // Gone quiet: its exit is seen by `wait`.
                _ => worker_talks = false,
            },
            _ = hup.recv() => forward(nix::sys::signal::Signal::SIGHUP),
            _ = term.recv() => forward(nix::sys::signal::Signal::SIGTERM),
            _ = int.recv() => forward(nix::sys::signal::Signal::SIGTERM),
            changed = report_rx.changed() => {
                if changed.is_err() {
                    continue;
                }
                let line = serde_json::json!({ "firewall": *report_rx.borrow_and_update() });
                let mut text = line.to_string();
                text.push('\n');
                // Never wait on the worker: a worker that stopped reading must not stop us
                // forwarding signals or seeing it exit. A report that does not fit is dropped
                // (the next one says the same or newer).
                if control.try_write(text.as_bytes()).map_or(true, |n| n < text.len()) {
                    tracing::warn!("supervisor: the worker is not reading its reports");
                }
            }
        }
    };
    let _ = std::fs::remove_file(&cfg.admin);
    // `exit=0` or `exit=SIGKILL`: one word, not `exit status: 0`.
    let exit = match (
        status.code(),
        std::os::unix::process::ExitStatusExt::signal(&status),
    ) {
        (Some(code), _) => code.to_string(),
        (None, Some(sig)) => nix::sys::signal::Signal::try_from(sig)
            .map_or_else(|_| format!("signal{sig}"), |s| s.as_str().to_string()),
        (None, None) => "unknown".to_string(),
    };
    tracing::info!(
        exit = exit.as_str(),
        "supervisor: worker exited; the redirect stays in place"
    );
    Ok(match status.code() {
        Some(c) => u8::try_from(c).unwrap_or(1),
        None => 1,
    })
}

/// The worker's first step, before any runtime exists: take the sockets from the
/// supervisor (our stdin) and drop to `who` for good.
pub fn worker_handoff(who: &Identity) -> anyhow::Result<(Header, Vec<OwnedFd>, StdUnixStream)> {
    let stdin = std::io::stdin()
        .as_fd()
        .try_clone_to_owned()
        .context("taking the supervisor's socket")?;
    let control = StdUnixStream::from(stdin);
    let (raw, fds) = os::recv_fds(&control).context("receiving the sockets")?;
    let header: Header = serde_json::from_slice(&raw).context("reading the hand-off header")?;
    if header.v != VERSION {
        anyhow::bail!(
            "the supervisor speaks hand-off version {}, this worker {VERSION}",
            header.v
        );
    }
    let want = header.transparent.len()
        + 2
        + usize::from(header.metrics.is_some())
        + 2 * header.dns.len()
        + usize::from(header.lookup_channel());
    if fds.len() != want {
        anyhow::bail!(
            "the hand-off carried {} sockets, {want} expected",
            fds.len()
        );
    }
    os::drop_to(who).with_context(|| format!("dropping to user {}", who.name))?;
    Ok((header, fds, control))
}

/// The worker: serves on the handed-over sockets until told to stop.
pub async fn worker(
    cfg: Config,
    header: Header,
    fds: Vec<OwnedFd>,
    control: StdUnixStream,
) -> anyhow::Result<()> {
    let mut fds = fds.into_iter();
    let mut next = |what: &str| fds.next().with_context(|| format!("no socket for {what}"));
    let tcp = |fd: OwnedFd| -> anyhow::Result<tokio::net::TcpListener> {
        let l = std::net::TcpListener::from(fd);
        l.set_nonblocking(true)?;
        Ok(tokio::net::TcpListener::from_std(l)?)
    };
    let mut transparent = Vec::new();
    for _ in &header.transparent {
        transparent.push(tcp(next("a transparent listener")?)?);
    }
    let explicit = tcp(next("the explicit listener")?)?;
    let metrics_listener = match header.metrics {
        Some(_) => Some(tcp(next("the metrics listener")?)?),
        None => None,
    };
    let mut dns = Vec::new();
    for addr in &header.dns {
        let udp = {
            let s = std::net::UdpSocket::from(next("a DNS stub UDP socket")?);
            s.set_nonblocking(true)?;
            tokio::net::UdpSocket::from_std(s)?
        };
        let tcp = tcp(next("a DNS stub TCP listener")?)?;
        dns.push(crate::daemon::listeners::DnsSockets {
            udp,
            tcp,
            addr: *addr,
        });
    }
    let admin = {
        let fd = next("the admin socket")?;
        let l = std::os::unix::net::UnixListener::from(fd);
        l.set_nonblocking(true)?;
        tokio::net::UnixListener::from_std(l)?
    };
    let orig: Option<Arc<dyn agenshield_pf::OrigDst>> = if header.lookup_channel() {
        use crate::daemon::orig_broker::BrokeredOrigDst;
        let channel = std::os::unix::net::UnixDatagram::from(next("the lookup channel")?);
        let broker = if header.natlook {
            BrokeredOrigDst::new(channel)?
        } else {
            // Destinations are ours to read (`SO_ORIGINAL_DST`); only tuples are asked.
            let own: Box<dyn agenshield_pf::OrigDst> = match cfg.testing.orig_dst_override {
                Some(addr) => Box::new(agenshield_pf::FixedOrigDst(addr)),
                None => agenshield_pf::platform_orig_dst(),
            };
            BrokeredOrigDst::tuples_only(channel, own)?
        };
        Some(Arc::new(broker))
    } else {
        None
    };
    let bound = Bound {
        listeners: Listeners {
            transparent_addrs: transparent
                .iter()
                .map(tokio::net::TcpListener::local_addr)
                .collect::<Result<_, _>>()?,
            transparent,
            explicit_addr: explicit.local_addr()?,
            explicit,
            metrics: metrics_listener,
            dns,
        },
        admin,
    };
    let metrics = Arc::new(Metrics::new());
    let (state_tx, state_rx) = tokio::sync::watch::channel(String::from("matches"));
    let firewall = header.firewall.map(|agent_uids| {
        metrics.firewall.active.set(1);
        metrics.firewall.managed.set(1);
        FirewallView::Reported {
            agent_uids,
            state: state_rx,
        }
    });
    let (gone_tx, gone_rx) = tokio::sync::oneshot::channel();
    control.set_nonblocking(true)?;
    let (control, to_supervisor) = tokio::net::UnixStream::from_std(control)?.into_split();
    let gauge = metrics.clone();
    tokio::spawn(async move {
        let mut lines = BufReader::new(control).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            let Ok(v) = serde_json::from_str::<serde_json::Value>(&line) else {
                continue;
            };
            if let Some(state) = v["firewall"].as_str() {
                gauge
                    .firewall
                    .active
                    .set(i64::from(!state.starts_with("failed")));
                let _ = state_tx.send(state.to_string());
            }
        }
        let _ = gone_tx.send(());
    });
    let ready = super::readiness::Readiness::Supervisor(to_supervisor);
    daemon::serve(cfg, bound, metrics, firewall, Some(gone_rx), orig, ready).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_header_round_trips() {
        let h = Header {
            v: VERSION,
            transparent: vec!["127.0.0.1:15001".parse().expect("addr")],
            explicit: "127.0.0.1:15080".parse().expect("addr"),
            metrics: None,
            dns: vec!["127.0.0.1:15053".parse().expect("addr")],
            firewall: Some(vec![5200]),
            natlook: true,
            conntrack: true,
        };
        let text = serde_json::to_vec(&h).expect("json");
        assert_eq!(serde_json::from_slice::<Header>(&text).expect("back"), h);
    }
}
