//! The parts of a start the process that is started does (a split daemon's supervisor, as
//! root): bind every listener and the admin socket, and put the redirect in place. Checked
//! by binding each listener and releasing it, and by asking the firewall, not changing it.

use std::net::SocketAddr;
use std::path::Path;

use super::{creatable, part, Part, Verdict};
use agenshield_proxy::config::Config;
use agenshield_proxy::daemon::listeners::{self, Role};

/// The daemon serving the admin socket now, and the addresses it listens on.
pub(super) struct Running {
    pid: u64,
    addrs: Vec<SocketAddr>,
}

pub(super) async fn running_daemon(socket: &Path) -> Option<Running> {
    if !agenshield_proxy::control::admin::served(socket).await {
        return None;
    }
    let client = crate::cmd::ctl::client::Client::new(socket);
    let v = client
        .json(http::Method::GET, "/v1/status", None)
        .await
        .ok()?;
    let l = &v["listeners"];
    let mut addrs: Vec<SocketAddr> = Vec::new();
    for list in [&l["transparent"], &l["dns"]] {
        addrs.extend(
            list.as_array()
                .into_iter()
                .flatten()
                .filter_map(|a| a.as_str()?.parse::<SocketAddr>().ok()),
        );
    }
    for one in [&l["explicit"], &l["metrics"]] {
        addrs.extend(one.as_str().and_then(|a| a.parse::<SocketAddr>().ok()));
    }
    Some(Running {
        pid: v["pid"].as_u64().unwrap_or(0),
        addrs,
    })
}

/// The addresses `run` would get, by role (configured ones where they are held by the running
/// daemon, so the redirect can still be computed).
pub(super) type BoundAddrs = Vec<(Role, SocketAddr)>;

pub(super) async fn listen(cfg: &Config, running: Option<&Running>) -> (Part, BoundAddrs) {
    let mut bound = Vec::new();
    let (mut failed, mut held, mut shown) = (Vec::new(), Vec::new(), Vec::new());
    for (role, addr, got) in listeners::probe(cfg).await {
        match got {
            Ok(Some(a)) => {
                shown.push(format!("{role} {addr}"));
                bound.push((role, a));
            }
            Ok(None) => shown.push(format!("{role} {addr} (unavailable here; skipped)")),
            Err(e) if e.in_use() && running.is_some_and(|r| r.addrs.contains(&addr)) => {
                held.push(format!("{role} {addr}"));
                bound.push((role, addr));
            }
            Err(e) => failed.push(e.to_string()),
        }
    }
    let p = if !failed.is_empty() {
        part("listen", Verdict::Failed, failed.join("; "))
    } else if let (false, Some(r)) = (held.is_empty(), running) {
        part(
            "listen",
            Verdict::Note,
            format!(
                "{} held by the daemon running now (pid {}), which a restart frees; {}",
                held.join(", "),
                r.pid,
                if shown.is_empty() {
                    "nothing else".to_string()
                } else {
                    format!("free: {}", shown.join(", "))
                }
            ),
        )
    } else {
        part("listen", Verdict::Ok, shown.join(", "))
    };
    (p, bound)
}

pub(super) fn admin(cfg: &Config, running: Option<&Running>) -> Part {
    match running {
        Some(r) => part(
            "admin",
            Verdict::Note,
            format!(
                "{} is served by the daemon running now (pid {}): `run` starts once it stops",
                cfg.admin.display(),
                r.pid
            ),
        ),
        None => match cfg.admin.parent().map(creatable) {
            Some(Err(e)) => part(
                "admin",
                Verdict::Failed,
                format!("{}: {e}", cfg.admin.display()),
            ),
            _ => part(
                "admin",
                Verdict::Ok,
                format!("{} (bound at start)", cfg.admin.display()),
            ),
        },
    }
}

pub(super) fn redirect(cfg: &Config, bound: &BoundAddrs) -> Part {
    if !cfg.redirect.enabled {
        return part(
            "redirect",
            Verdict::Note,
            "off (redirect.enabled = false): agent users' traffic is not redirected",
        );
    }
    let of = |want: Role| -> Vec<SocketAddr> {
        bound
            .iter()
            .filter(|(r, _)| *r == want)
            .map(|(_, a)| *a)
            .collect()
    };
    let spec =
        match agenshield_proxy::daemon::firewall::spec(cfg, &of(Role::Transparent), &of(Role::Dns))
        {
            Ok(s) => s,
            Err(e) => return part("redirect", Verdict::Failed, format!("firewall: {e}")),
        };
    let backend = agenshield_pf::platform_redirector();
    match backend.status(&spec) {
        Ok(st) => part(
            "redirect",
            Verdict::Ok,
            format!(
                "{} for agent uids {:?} (in place now: {})",
                backend.describe(),
                spec.agent_uids,
                match st.state {
                    agenshield_pf::FirewallState::Absent => "no",
                    agenshield_pf::FirewallState::Matches => "yes, as configured",
                    agenshield_pf::FirewallState::Differs => "yes, but it differs",
                }
            ),
        ),
        Err(e) => part(
            "redirect",
            Verdict::Failed,
            format!("installing {}: {e}", backend.describe()),
        ),
    }
}
