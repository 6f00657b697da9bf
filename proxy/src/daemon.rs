//! `agenshield proxy run`: build the data path from the config, bind, serve until signalled.

use std::io::Write;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use agenshield_certs::{Ca, CaOrigin, LeafCache, LeafConfig};
use agenshield_pf::{
    platform_orig_dst, platform_redirector, FixedOrigDst, OrigDst, RedirectSpec, Redirector,
};
use anyhow::Context;
use tokio::net::TcpListener;
use tokio::signal::unix::{signal, SignalKind};

use crate::admin::{self, Admin, AdminAuth, DaemonInfo};
use crate::approvals::Approvals;
use crate::audit::{Audit, Entry, LifecycleEntry, ReloadEntry};
use crate::config::Config;
use crate::dial::Dialer;
use crate::firewall;
use crate::forward::Forwarder;
use crate::guard::AddressGuard;
use crate::listen;
use crate::metrics::Metrics;
use crate::policy_store::PolicyStore;
use crate::resolve::Resolver;
use crate::secrets::Vault;
use crate::state::{Proxy, ProxyParts};
use crate::tls::UpstreamTrust;
use crate::watch::watch_policies;

/// The policy shipped with the product, seeded into a fresh state directory.
const DEFAULT_POLICY: &str = include_str!("../../policies/default.toml");

/// A start-up failure caused by bad input (config or policy): exit code 2, not 1.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct BadInput(pub String);

pub async fn run(cfg: Config) -> anyhow::Result<()> {
    prepare(&cfg)?;
    let bound = Bound::bind(&cfg).await?;
    let metrics = Arc::new(Metrics::new());
    // Redirect first: from here on the agent fails closed even if the rest of start-up fails
    // (a bad policy, say), because the rules outlive this process.
    let firewall = if cfg.redirect.enabled {
        let (backend, spec) = install_firewall(
            &cfg,
            &bound.listeners.transparent_addrs,
            metrics.clone(),
            None,
        )?;
        Some(firewall::FirewallView::Owned(backend, spec))
    } else {
        None
    };
    serve(cfg, bound, metrics, firewall, None, None).await
}

/// Start-up work before anything is bound: the state directory on defaults, warnings.
pub fn prepare(cfg: &Config) -> anyhow::Result<()> {
    if let Some(dir) = &cfg.state_dir {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("creating state directory {}", dir.display()))?;
        println!(
            "agenshield: no config file; running on built-in defaults with state in {}",
            dir.display()
        );
        seed_default_policy(&cfg.policies)?;
    }
    for key in &cfg.not_yet_effective {
        tracing::warn!("config key {key} is set but has no effect in this build yet");
    }
    Ok(())
}

/// Everything the daemon listens on, bound before anything is served.
pub struct Bound {
    pub listeners: Listeners,
    pub admin: tokio::net::UnixListener,
}

impl Bound {
    pub async fn bind(cfg: &Config) -> anyhow::Result<Bound> {
        let listeners = Listeners::bind(cfg).await?;
        let admin = admin::bind(&cfg.admin).await?;
        Ok(Bound { listeners, admin })
    }
}

/// Serves on `bound` until signalled. `supervisor_gone`: when this is the worker of a split
/// daemon, resolves if the privileged supervisor goes away, which stops the worker. `orig`:
/// how original destinations are found, when not by this process itself.
pub async fn serve(
    cfg: Config,
    bound: Bound,
    metrics: Arc<Metrics>,
    firewall: Option<firewall::FirewallView>,
    supervisor_gone: Option<tokio::sync::oneshot::Receiver<()>>,
    orig: Option<Arc<dyn OrigDst>>,
) -> anyhow::Result<()> {
    let Bound {
        listeners,
        admin: admin_listener,
    } = bound;
    let proxy = Arc::new(build_proxy(&cfg, listeners.own_addrs(), metrics).await?);
    proxy.metrics.set_policy(proxy.policy().hash());
    proxy.metrics.reloads.with_label_values(&["ok"]).inc();
    if let Some(audit) = &proxy.audit {
        let policy = proxy.policy();
        audit.write(Entry::Start(lifecycle(policy.hash()))).await;
        audit
            .write(Entry::Reload(ReloadEntry {
                result: "ok",
                trigger: "start".into(),
                policy: policy.hash().to_string(),
                rules: Some(policy.rule_count()),
                error: None,
            }))
            .await;
    }
    let orig: Arc<dyn OrigDst> = match (orig, cfg.testing.orig_dst_override) {
        (Some(brokered), _) => brokered,
        (None, Some(addr)) => {
            tracing::warn!("TESTING: every transparent connection is treated as headed to {addr}");
            Arc::new(FixedOrigDst(addr))
        }
        (None, None) => Arc::from(platform_orig_dst()),
    };
    tracing::info!(
        lookup = orig.name(),
        "original destinations of redirected connections"
    );
    let (transparent, transparent_addrs) = (listeners.transparent, listeners.transparent_addrs);
    let (explicit, explicit_addr) = (listeners.explicit, listeners.explicit_addr);
    let slots = proxy.slots.clone();
    let mut tasks = tokio::task::JoinSet::new();
    for l in transparent {
        tasks.spawn(listen::transparent(
            proxy.clone(),
            l,
            orig.clone(),
            slots.clone(),
        ));
    }
    tasks.spawn(listen::explicit(proxy.clone(), explicit, slots.clone()));
    let metrics_addr = match listeners.metrics {
        Some(l) => {
            let addr = l.local_addr()?;
            tasks.spawn(crate::metrics_http::serve(l, proxy.clone()));
            addr.to_string()
        }
        None => "off".to_string(),
    };

    let admin = Arc::new(Admin::new(
        proxy.clone(),
        DaemonInfo {
            started: std::time::Instant::now(),
            transparent: transparent_addrs.clone(),
            explicit: explicit_addr,
            socket: cfg.admin.clone(),
            firewall,
        },
        admin_auth(&cfg),
    ));
    tasks.spawn(admin::serve(admin_listener, admin));
    // Kept alive for the daemon's lifetime; dropping it stops hot reload.
    let _watcher = match watch_policies(proxy.clone()) {
        Ok(w) => Some(w),
        Err(e) => {
            tracing::warn!("policy hot reload is off (watching {} failed: {e}); SIGHUP and ctl reload still work", cfg.policies.display());
            None
        }
    };

    // One stable line on stdout that scripts and tests wait for.
    println!(
        "agenshield: ready transparent={} explicit={explicit_addr} admin={} policy={} metrics={metrics_addr} audit={}",
        transparent_addrs
            .iter()
            .map(SocketAddr::to_string)
            .collect::<Vec<_>>()
            .join(","),
        cfg.admin.display(),
        proxy.policy().hash(),
        cfg.audit_path
            .as_deref()
            .map_or("off".to_string(), |p| p.display().to_string()),
    );
    let _ = std::io::stdout().flush();

    let mut hup = signal(SignalKind::hangup())?;
    let mut term = signal(SignalKind::terminate())?;
    let supervised = supervisor_gone.is_some();
    let mut supervisor_gone = std::pin::pin!(async move {
        match supervisor_gone {
            Some(gone) => {
                let _ = gone.await;
            }
            None => std::future::pending().await,
        }
    });
    loop {
        tokio::select! {
            _ = hup.recv() => { let _ = proxy.reload("SIGHUP"); }
            _ = term.recv() => break,
            _ = tokio::signal::ctrl_c() => break,
            () = &mut supervisor_gone => {
                tracing::error!("the privileged supervisor is gone; stopping");
                break;
            }
            done = tasks.join_next() => {
                if let Some(Err(e)) = done {
                    anyhow::bail!("a listener stopped: {e}");
                }
            }
        }
    }
    tracing::info!("shutting down");
    if !supervised {
        // A worker cannot remove it (the supervisor's directory); the supervisor does.
        let _ = std::fs::remove_file(&cfg.admin);
    }
    if let Some(audit) = &proxy.audit {
        audit
            .write(Entry::Stop(lifecycle(proxy.policy().hash())))
            .await;
        audit.sync().await;
        let head = audit.head();
        tracing::info!(seq = head.seq, hash = %head.hash, "audit log closed");
    }
    Ok(())
}

/// The bound listeners, before anything is served on them.
pub struct Listeners {
    pub transparent: Vec<TcpListener>,
    pub transparent_addrs: Vec<SocketAddr>,
    pub explicit: TcpListener,
    pub explicit_addr: SocketAddr,
    pub metrics: Option<TcpListener>,
}

impl Listeners {
    async fn bind(cfg: &Config) -> anyhow::Result<Listeners> {
        let mut transparent = Vec::new();
        for addr in &cfg.transparent {
            match TcpListener::bind(addr).await {
                Ok(l) => transparent.push(l),
                // The default [::1] listener is optional on hosts without IPv6 loopback.
                Err(e) if cfg.transparent_is_default && addr.is_ipv6() => {
                    tracing::warn!("not listening on {addr}: {e}");
                }
                Err(e) => {
                    return Err(e).with_context(|| format!("binding transparent listener {addr}"))
                }
            }
        }
        let explicit = TcpListener::bind(cfg.explicit)
            .await
            .with_context(|| format!("binding explicit listener {}", cfg.explicit))?;
        let metrics = match cfg.metrics {
            Some(addr) => Some(
                TcpListener::bind(addr)
                    .await
                    .with_context(|| format!("binding metrics listener {addr}"))?,
            ),
            None => None,
        };
        Ok(Listeners {
            metrics,
            transparent_addrs: transparent
                .iter()
                .map(TcpListener::local_addr)
                .collect::<Result<_, _>>()?,
            explicit_addr: explicit.local_addr()?,
            transparent,
            explicit,
        })
    }

    /// Every address we listen on: the proxy must never dial itself.
    fn own_addrs(&self) -> Vec<SocketAddr> {
        let mut own = self.transparent_addrs.clone();
        own.push(self.explicit_addr);
        own
    }
}

/// Installs the redirect for the bound listeners and keeps it in place while we run
/// (reconcile outcomes go to `report` too, when given).
pub fn install_firewall(
    cfg: &Config,
    transparent: &[SocketAddr],
    metrics: Arc<Metrics>,
    report: Option<tokio::sync::watch::Sender<String>>,
) -> anyhow::Result<(Arc<dyn Redirector>, RedirectSpec)> {
    let spec = firewall::spec(cfg, transparent).map_err(|e| BadInput(format!("firewall: {e}")))?;
    let backend: Arc<dyn Redirector> = Arc::from(platform_redirector());
    backend
        .apply(&spec)
        .with_context(|| format!("installing {}", backend.describe()))?;
    tracing::info!(
        uids = ?spec.agent_uids,
        v4 = ?spec.redirect_v4,
        v6 = ?spec.redirect_v6,
        "firewall: {} in place",
        backend.describe()
    );
    tokio::spawn(firewall::reconcile(
        backend.clone(),
        spec.clone(),
        cfg.redirect.reconcile_interval,
        metrics,
        report,
    ));
    Ok((backend, spec))
}

/// The data path's shared state: policy, CA and leaf cache, upstream trust, dialer, clients.
async fn build_proxy(
    cfg: &Config,
    own: Vec<SocketAddr>,
    metrics: Arc<Metrics>,
) -> anyhow::Result<Proxy> {
    let audit = match &cfg.audit_path {
        Some(path) => Some(
            Audit::open(path, &cfg.audit, metrics.clone())
                .with_context(|| format!("opening the audit log {}", path.display()))?,
        ),
        None => {
            tracing::warn!("audit log is off (audit.enabled = false)");
            None
        }
    };
    let store = crate::secrets::open_store(cfg).map_err(|e| BadInput(format!("secrets: {e}")))?;
    let vault = Arc::new(
        Vault::open(store)
            .await
            .map_err(|e| BadInput(format!("secrets: {e}")))?,
    );
    tracing::info!(
        store = %vault.describe(),
        secrets = vault.current().len(),
        "secrets loaded"
    );
    let known = vault.clone();
    let policies = PolicyStore::load(&cfg.policies, Arc::new(move |n: &str| known.contains(n)))
        .map_err(|e| BadInput(format!("policy: {e}")))?;
    let policy = policies.current();
    tracing::info!(
        dir = %cfg.policies.display(),
        hash = policy.hash(),
        rules = policy.rule_count(),
        "policy loaded"
    );
    let (ca, origin) = Ca::load_or_create(&cfg.certs).map_err(|e| BadInput(format!("CA: {e}")))?;
    let verb = match origin {
        CaOrigin::Created => "created",
        CaOrigin::Loaded => "loaded",
    };
    println!(
        "agenshield: CA {verb}: {} (SHA-256 {})",
        cfg.certs.join("ca.pem").display(),
        ca.fingerprint_sha256()
    );
    let leaves = LeafCache::new(
        Arc::new(ca),
        LeafConfig {
            validity: cfg.tls.leaf_validity,
            cache_capacity: cfg.tls.leaf_cache_capacity,
            cache_ttl: cfg.tls.leaf_cache_ttl,
        },
    );
    let trust = UpstreamTrust::load(&cfg.upstream.extra_ca).map_err(|e| BadInput(e.to_string()))?;
    tracing::info!(
        system = trust.system_roots,
        extra = trust.extra_roots,
        "upstream trust roots loaded"
    );
    let resolver = Resolver::new(&cfg.resolver)?;
    let guard = AddressGuard::new(cfg.upstream.allow_private.clone(), own);
    let dialer = Arc::new(Dialer::new(
        resolver,
        guard,
        cfg.limits.upstream_connect_timeout,
        metrics.upstream_connect.clone(),
    ));
    let forwarder = Forwarder::new(
        dialer.clone(),
        trust.client_config()?,
        &cfg.limits,
        metrics.clone(),
    );
    Ok(Proxy::new(ProxyParts {
        vault,
        metrics,
        audit,
        audit_query_values: cfg.audit.query_values == crate::config::QueryValues::Keep,
        scan_body_bytes: cfg.secrets.scan_body_bytes,
        policies,
        leaves,
        dialer,
        forwarder,
        limits: cfg.limits.clone(),
        approvals: Approvals::new(cfg.approvals.timeout),
    }))
}

fn lifecycle(policy: &str) -> LifecycleEntry {
    LifecycleEntry {
        version: env!("CARGO_PKG_VERSION"),
        pid: std::process::id(),
        policy: policy.to_string(),
    }
}

/// Who may use the admin socket: root, our own uid, the admin group; never an agent.
fn admin_auth(cfg: &Config) -> AdminAuth {
    let agent_uids = cfg
        .redirect
        .agent_users
        .iter()
        .filter_map(|u| match firewall::resolve_uids(std::slice::from_ref(u)) {
            Ok(uids) => uids.first().copied(),
            Err(e) => {
                tracing::debug!("admin socket: agent user {u} not refused by uid: {e}");
                None
            }
        })
        .collect();
    AdminAuth {
        own_uid: nix::unistd::geteuid().as_raw(),
        admin_gid: nix::unistd::Group::from_name(admin::ADMIN_GROUP)
            .ok()
            .flatten()
            .map(|g| g.gid.as_raw()),
        agent_uids,
    }
}

/// On a first run with built-in defaults, give the operator the shipped policy to edit.
fn seed_default_policy(dir: &Path) -> anyhow::Result<()> {
    if dir.exists() {
        return Ok(());
    }
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let file = dir.join("default.toml");
    std::fs::write(&file, DEFAULT_POLICY).with_context(|| format!("writing {}", file.display()))?;
    println!("agenshield: wrote the default policy to {}", file.display());
    Ok(())
}
