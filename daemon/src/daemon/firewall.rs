//! Redirecting the agent users into the proxy: the spec built from the config, its status
//! report, and the daemon's reconcile loop (`cmd/firewall.rs` drives the same by hand).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use agenshield_pf::{FirewallState, FirewallStatus, RedirectSpec, Redirector};
use serde::Serialize;

use anyhow::Context;

use super::BadInput;
use crate::config::{AgentUser, Config};
use crate::metrics::Metrics;

#[derive(Debug, thiserror::Error)]
pub enum FirewallError {
    #[error("agent user {0:?} does not exist")]
    NoSuchUser(String),
    #[error("looking up agent user {user:?}: {reason}")]
    Lookup { user: String, reason: String },
    #[error(
        "agent uid {0} is the proxy's own uid: its upstream connections would be redirected \
         into itself; run the proxy as another user"
    )]
    OwnUid(u32),
    #[error("{0}")]
    Listener(String),
    #[error(transparent)]
    Backend(#[from] agenshield_pf::RedirectError),
}

/// Agent users as uids.
pub fn resolve_uids(users: &[AgentUser]) -> Result<Vec<u32>, FirewallError> {
    users
        .iter()
        .map(|u| match u {
            AgentUser::Uid(uid) => Ok(*uid),
            AgentUser::Name(name) => match nix::unistd::User::from_name(name) {
                Ok(Some(user)) => Ok(user.uid.as_raw()),
                Ok(None) => Err(FirewallError::NoSuchUser(name.clone())),
                Err(e) => Err(FirewallError::Lookup {
                    user: name.clone(),
                    reason: e.to_string(),
                }),
            },
        })
        .collect()
}

/// The redirect spec for `cfg`, pointing at the transparent listeners `transparent` and the
/// DNS stub's `dns` addresses (actual addresses, so ephemeral ports work). The agent must
/// never be the proxy's own uid.
pub fn spec(
    cfg: &Config,
    transparent: &[SocketAddr],
    dns: &[SocketAddr],
) -> Result<RedirectSpec, FirewallError> {
    let uids = resolve_uids(&cfg.redirect.agent_users)?;
    let own = nix::unistd::geteuid().as_raw();
    if uids.contains(&own) {
        return Err(FirewallError::OwnUid(own));
    }
    let (redirect_v4, redirect_v6) = (
        loopback_port(transparent, true),
        loopback_port(transparent, false),
    );
    if redirect_v4.is_none() && redirect_v6.is_none() {
        return Err(FirewallError::Listener(
            "redirection needs a transparent listener on 127.0.0.1 or [::1] with a fixed port"
                .into(),
        ));
    }
    let exempt = cfg
        .redirect
        .exempt
        .iter()
        .map(|n| (n.network(), n.prefix_len()))
        .collect();
    Ok(RedirectSpec {
        agent_uids: uids,
        redirect_v4,
        redirect_v6,
        dns_v4: loopback_port(dns, true),
        dns_v6: loopback_port(dns, false),
        dns_passthrough: cfg.redirect.dns_passthrough.clone(),
        exempt,
    }
    .normalized()?)
}

/// The port of the first address in `bound` that a redirect of the family can reach:
/// `redirect` sends IPv4 to 127.0.0.1 and IPv6 to ::1, so only listeners there count.
fn loopback_port(bound: &[SocketAddr], v4: bool) -> Option<u16> {
    bound.iter().find_map(|a| {
        let reachable = match a.ip() {
            std::net::IpAddr::V4(ip) => v4 && (ip.is_loopback() || ip.is_unspecified()),
            std::net::IpAddr::V6(ip) => !v4 && (ip.is_loopback() || ip.is_unspecified()),
        };
        (reachable && a.port() != 0).then_some(a.port())
    })
}

/// A spec to ask the backend only whether any of our rules are in place: presence does not
/// depend on the spec, and this one needs no agent user to exist.
pub fn presence_probe() -> RedirectSpec {
    RedirectSpec {
        agent_uids: vec![u32::MAX],
        redirect_v4: Some(1),
        redirect_v6: None,
        dns_v4: None,
        dns_v6: None,
        dns_passthrough: Vec::new(),
        exempt: Vec::new(),
    }
}

/// `status --json`.
#[derive(Debug, Serialize)]
pub struct StatusReport {
    pub backend: String,
    pub state: &'static str,
    pub in_place: bool,
    pub matches_config: bool,
    pub agent_uids: Vec<u32>,
    pub configured_uids: Vec<u32>,
    pub redirect_v4: Option<u16>,
    pub redirect_v6: Option<u16>,
}

pub fn report(backend: &dyn Redirector, spec: &RedirectSpec, st: &FirewallStatus) -> StatusReport {
    StatusReport {
        backend: backend.describe(),
        state: match st.state {
            FirewallState::Absent => "absent",
            FirewallState::Matches => "in_place",
            FirewallState::Differs => "differs",
        },
        in_place: st.state != FirewallState::Absent,
        matches_config: st.state == FirewallState::Matches,
        agent_uids: st.installed_uids.clone(),
        configured_uids: spec.agent_uids.clone(),
        redirect_v4: spec.redirect_v4,
        redirect_v6: spec.redirect_v6,
    }
}

impl std::fmt::Display for StatusReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = match self.state {
            "absent" => "not in place: agent traffic is NOT redirected",
            "in_place" => "in place, matches the configuration",
            _ => "in place, but DIFFERS from the configuration (edited by hand?)",
        };
        let uids = |v: &[u32]| {
            if v.is_empty() {
                "-".to_string()
            } else {
                v.iter().map(u32::to_string).collect::<Vec<_>>().join(", ")
            }
        };
        let port = |p: Option<u16>, host: &str| match p {
            Some(p) => format!("{host}:{p}"),
            None => "refused".into(),
        };
        writeln!(f, "firewall:       {}", self.backend)?;
        writeln!(f, "state:          {state}")?;
        writeln!(f, "covers uids:    {}", uids(&self.agent_uids))?;
        writeln!(f, "configured:     {}", uids(&self.configured_uids))?;
        write!(
            f,
            "redirect to:    IPv4 {}, IPv6 {}",
            port(self.redirect_v4, "127.0.0.1"),
            port(self.redirect_v6, "[::1]")
        )
    }
}

/// Keeps the rules in place: every `every`, compares them with `spec` and restores them if
/// they vanished or changed. Each round's outcome goes to `report` ("matches", "restored",
/// "failed: …") and to the `firewall_redirect_active` gauge.
pub async fn reconcile(
    backend: Arc<dyn Redirector>,
    spec: RedirectSpec,
    every: Duration,
    metrics: Arc<crate::metrics::Metrics>,
    report: Option<tokio::sync::watch::Sender<String>>,
) {
    metrics.firewall.active.set(1);
    metrics.firewall.managed.set(1);
    let say = |s: String| {
        if let Some(r) = &report {
            r.send_if_modified(|old| {
                let changed = *old != s;
                *old = s;
                changed
            });
        }
    };
    say("matches".into());
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        tick.tick().await;
        let (b, s) = (backend.clone(), spec.clone());
        let checked = tokio::task::spawn_blocking(move || {
            let st = b.status(&s)?;
            if st.state != FirewallState::Matches {
                b.apply(&s)?;
            }
            Ok::<_, agenshield_pf::RedirectError>(st.state)
        })
        .await;
        // In place after this round: it matched, or it was restored without error.
        metrics
            .firewall
            .active
            .set(i64::from(matches!(checked, Ok(Ok(_)))));
        match checked {
            Ok(Ok(FirewallState::Matches)) => say("matches".into()),
            Ok(Ok(FirewallState::Absent)) => {
                tracing::warn!("firewall: {} had vanished; restored", backend.describe());
                say("restored".into());
            }
            Ok(Ok(FirewallState::Differs)) => {
                tracing::warn!(
                    "firewall: {} had been changed; restored",
                    backend.describe()
                );
                say("restored".into());
            }
            Ok(Err(e)) => {
                tracing::error!("firewall: reconcile failed: {e}");
                say(format!("failed: {e}"));
            }
            Err(e) => {
                tracing::error!("firewall: reconcile task failed: {e}");
                say(format!("failed: {e}"));
            }
        }
    }
}

/// Installs the redirect for the bound listeners and keeps it in place while we run
/// (reconcile outcomes go to `report` too, when given).
pub fn install_firewall(
    cfg: &Config,
    transparent: &[SocketAddr],
    dns: &[SocketAddr],
    metrics: Arc<Metrics>,
    report: Option<tokio::sync::watch::Sender<String>>,
) -> anyhow::Result<(Arc<dyn Redirector>, RedirectSpec)> {
    let spec = spec(cfg, transparent, dns).map_err(|e| BadInput(format!("firewall: {e}")))?;
    if !spec.dns_passthrough.is_empty() {
        tracing::warn!(
            resolvers = %list(&spec.dns_passthrough),
            "firewall: redirect.dns_passthrough is set: the agent's DNS to these resolvers \
             bypasses the DNS stub and policy; every name it asks for leaves the machine"
        );
    }
    if spec.dns_v4.is_none() && spec.dns_v6.is_none() {
        tracing::warn!(
            "firewall: no DNS stub on 127.0.0.1 or [::1] (listen.dns): the agent's UDP DNS is \
             refused and its TCP DNS is decided as raw TCP"
        );
    }
    let backend: Arc<dyn Redirector> = Arc::from(agenshield_pf::platform_redirector());
    backend
        .apply(&spec)
        .with_context(|| format!("installing {}", backend.describe()))?;
    tracing::info!(
        uids = %list(&spec.agent_uids),
        v4 = %port(spec.redirect_v4),
        v6 = %port(spec.redirect_v6),
        dns_v4 = %port(spec.dns_v4),
        dns_v6 = %port(spec.dns_v6),
        "firewall: {} in place",
        backend.describe()
    );
    tokio::spawn(reconcile(
        backend.clone(),
        spec.clone(),
        cfg.redirect.reconcile_interval,
        metrics,
        report,
    ));
    Ok((backend, spec))
}

/// `a,b,c` for a log field (`-` for none).
fn list<T: std::fmt::Display>(items: &[T]) -> String {
    if items.is_empty() {
        return "-".into();
    }
    items
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

/// A redirect's port for a log field: the port, or `refused` (that family is not redirected
/// to a listener, so it is refused).
fn port(p: Option<u16>) -> String {
    p.map_or_else(|| "refused".into(), |p| p.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_fields_are_display_forms() {
        assert_eq!(port(Some(15001)), "15001");
        assert_eq!(port(None), "refused");
        assert_eq!(list(&[5200u32, 5201]), "5200,5201");
        assert_eq!(list::<u32>(&[]), "-");
    }

    fn cfg(extra: &str) -> Config {
        let text = format!("[redirect]\nagent_users = [4242]\n{extra}");
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("proxy.toml");
        std::fs::write(&file, text).expect("write");
        Config::load(&file).expect("config")
    }

    fn dns() -> Vec<SocketAddr> {
        vec!["127.0.0.1:15053".parse().expect("a")]
    }

    #[test]
    fn spec_points_each_family_at_its_loopback_listener() {
        let bound: Vec<SocketAddr> = vec![
            "127.0.0.1:15001".parse().expect("a"),
            "[::1]:15002".parse().expect("a"),
        ];
        let s = spec(&cfg("exempt = [\"10.9.0.0/16\"]\n"), &bound, &dns()).expect("spec");
        assert_eq!(s.agent_uids, vec![4242]);
        assert_eq!((s.redirect_v4, s.redirect_v6), (Some(15001), Some(15002)));
        assert_eq!(s.exempt, vec![("10.9.0.0".parse().expect("ip"), 16)]);
        assert_eq!((s.dns_v4, s.dns_v6), (Some(15053), None));
        assert!(s.dns_passthrough.is_empty());
        let opted_out =
            spec(&cfg("dns_passthrough = [\"10.0.0.53\"]\n"), &bound, &dns()).expect("spec");
        assert_eq!(
            opted_out.dns_passthrough,
            vec!["10.0.0.53".parse::<std::net::IpAddr>().expect("ip")]
        );
        let no_stub = spec(&cfg(""), &bound, &[]).expect("spec");
        assert_eq!((no_stub.dns_v4, no_stub.dns_v6), (None, None));
    }

    #[test]
    fn spec_without_ipv6_listener_refuses_ipv6() {
        let bound: Vec<SocketAddr> = vec!["127.0.0.1:15001".parse().expect("a")];
        let s = spec(&cfg(""), &bound, &[]).expect("spec");
        assert_eq!(s.redirect_v6, None);
        let nowhere: Vec<SocketAddr> = vec!["10.0.0.1:15001".parse().expect("a")];
        assert!(spec(&cfg(""), &nowhere, &[]).is_err());
    }

    #[test]
    fn own_uid_as_agent_is_refused() {
        let own = nix::unistd::geteuid().as_raw();
        let mut c2 = cfg("");
        c2.redirect.agent_users = vec![AgentUser::Uid(own)];
        let bound: Vec<SocketAddr> = vec!["127.0.0.1:15001".parse().expect("a")];
        assert!(matches!(
            spec(&c2, &bound, &[]),
            Err(FirewallError::OwnUid(_))
        ));
    }

    #[test]
    fn unknown_user_is_named() {
        let mut c = cfg("");
        c.redirect.agent_users = vec![AgentUser::Name("no-such-user-agenshield".into())];
        let err = resolve_uids(&c.redirect.agent_users).expect_err("unknown");
        assert!(err.to_string().contains("no-such-user-agenshield"));
    }
}
