//! `agenshield proxy run`: bind, build the data path from the config, serve until signalled.
//! The parts: `listeners` (what is bound), `build` (the shared state), `firewall` (the
//! redirect and its reconcile loop), `privsep` + `orig_broker` (the root supervisor and its
//! unprivileged worker).

pub mod build;
pub mod firewall;
pub mod listeners;
pub mod orig_broker;
pub mod privsep;
pub mod readiness;

use std::io::Write;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use agenshield_pf::{platform_orig_dst, FixedOrigDst, OrigDst};
use anyhow::Context;
use tokio::signal::unix::{signal, SignalKind};

pub use firewall::install_firewall;
pub use listeners::{Bound, Listeners};

use crate::audit::{Entry, LifecycleEntry, ReloadEntry, ReloadResult, ReloadTrigger};
use crate::config::Config;
use crate::conn::accept;
use crate::control::admin::{self, Admin, DaemonInfo};
use crate::control::firewall_view::FirewallView;
use crate::control::policy_watch::watch_policies;
use crate::control::reload::reload;
use crate::metrics::Metrics;
use build::{admin_auth, build_proxy};

/// The policy shipped with the product, seeded into a fresh state directory.
const DEFAULT_POLICY: &str = include_str!("../../../policies/default.toml");

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
            &bound.listeners.dns_addrs(),
            metrics.clone(),
            None,
        )?;
        Some(FirewallView::Owned(backend, spec))
    } else {
        None
    };
    let ready = readiness::Readiness::ServiceManager;
    serve(cfg, bound, metrics, firewall, None, None, ready).await
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
    }
    if seeds_default_policy(cfg) {
        if let Some(file) = seed_default_policy(&cfg.policies)? {
            println!("agenshield: wrote the default policy to {}", file.display());
        }
    }
    for key in &cfg.not_yet_effective {
        tracing::warn!("config key {key} is set but has no effect in this build");
    }
    raise_open_files(&cfg.limits);
    Ok(())
}

/// Serves on `bound` until signalled. `supervisor_gone`: when this is the worker of a split
/// daemon, resolves if the privileged supervisor goes away, which stops the worker. `orig`:
/// how original destinations are found, when not by this process itself. `ready`: who is told
/// once every listener serves.
pub async fn serve(
    cfg: Config,
    bound: Bound,
    metrics: Arc<Metrics>,
    firewall: Option<FirewallView>,
    supervisor_gone: Option<tokio::sync::oneshot::Receiver<()>>,
    orig: Option<Arc<dyn OrigDst>>,
    ready: readiness::Readiness,
) -> anyhow::Result<()> {
    let Bound {
        listeners,
        admin: admin_listener,
    } = bound;
    let (proxy, policy_source) = build_proxy(&cfg, listeners.own_addrs(), metrics).await?;
    let proxy = Arc::new(proxy);
    proxy.metrics.policy.set_policy(proxy.policy().hash());
    proxy.metrics.policy.reloaded(ReloadResult::Ok);
    if let Some(audit) = &proxy.audit {
        let policy = proxy.policy();
        audit.write(Entry::Start(lifecycle(policy.hash()))).await;
        audit
            .write(Entry::Reload(ReloadEntry {
                result: ReloadResult::Ok,
                trigger: ReloadTrigger::Start,
                policy: policy.hash().to_string(),
                rules: Some(policy.rule_count()),
                error: None,
            }))
            .await;
    }
    if let Some(start) = policy_source {
        crate::control::policy_source::spawn(proxy.clone(), start);
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
    crate::runtime::shards::start();
    let mut tasks = tokio::task::JoinSet::new();
    for l in transparent {
        tasks.spawn(accept::transparent(
            proxy.clone(),
            l,
            orig.clone(),
            explicit_addr,
        ));
    }
    tasks.spawn(accept::explicit(proxy.clone(), explicit));
    let dns_addrs: Vec<SocketAddr> = listeners.dns.iter().map(|d| d.addr).collect();
    for d in listeners.dns {
        tasks.spawn(crate::dns::serve_udp(proxy.clone(), d.udp));
        tasks.spawn(crate::dns::serve_tcp(proxy.clone(), d.tcp, orig.clone()));
    }
    let metrics_bound = match listeners.metrics {
        Some(l) => {
            let addr = l.local_addr()?;
            tasks.spawn(crate::control::metrics_http::serve(l, proxy.clone()));
            Some(addr)
        }
        None => None,
    };
    let metrics_addr = metrics_bound.map_or_else(|| "off".to_string(), |a| a.to_string());

    let admin_https = match &cfg.admin_https {
        Some(https) => Some(
            admin::AdminHttps::bind(https)
                .await
                .map_err(|e| BadInput(e.to_string()))?,
        ),
        None => None,
    };
    let admin_https_addr = admin_https.as_ref().map(|h| h.addr);
    let admin = Arc::new(Admin::new(
        proxy.clone(),
        DaemonInfo {
            started: std::time::Instant::now(),
            transparent: transparent_addrs.clone(),
            explicit: explicit_addr,
            dns: dns_addrs.clone(),
            metrics: metrics_bound,
            socket: cfg.admin.clone(),
            admin_https: admin_https_addr,
            firewall,
            ca_path: cfg.certs.join("ca.pem"),
        },
        admin_auth(&cfg),
    ));
    if let Some(https) = admin_https {
        tracing::info!(
            "admin API over HTTPS on {}: client certificates from {} only, never an agent uid",
            https.addr,
            cfg.admin_https
                .as_ref()
                .map_or_else(String::new, |h| h.client_ca.display().to_string())
        );
        tasks.spawn(admin::serve_https(https, admin.clone()));
    }
    tasks.spawn(admin::serve(admin_listener, admin));
    tokio::spawn(crate::runtime::memory_release::watch());
    // Kept alive for the daemon's lifetime; dropping it stops hot reload.
    if let Err(e) = watch_policies(proxy.clone()).await {
        tracing::warn!(
            "policy hot reload has no watcher ({}: {e}); the directory is compared every few \
             seconds, and SIGHUP and ctl reload apply at once",
            cfg.policies.display()
        );
    }

    // One stable line on stdout that scripts and tests wait for.
    println!(
        "agenshield: ready transparent={} explicit={explicit_addr} dns={} admin={} policy={} metrics={metrics_addr} audit={}",
        transparent_addrs
            .iter()
            .map(SocketAddr::to_string)
            .collect::<Vec<_>>()
            .join(","),
        if dns_addrs.is_empty() {
            "off".to_string()
        } else {
            dns_addrs
                .iter()
                .map(SocketAddr::to_string)
                .collect::<Vec<_>>()
                .join(",")
        },
        cfg.admin.display(),
        proxy.policy().hash(),
        cfg.audit_path
            .as_deref()
            .map_or("off".to_string(), |p| p.display().to_string()),
    );
    // The try-it commands with this daemon's own CA and listener, to copy as they are.
    let ca = cfg.certs.join("ca.pem");
    println!(
        "agenshield: try it: curl --cacert {ca} -x http://{explicit_addr} https://example.com/   # a 403 JSON refusal: the policy denies it, nothing leaves",
        ca = ca.display()
    );
    let _ = std::io::stdout().flush();
    ready.ready().await;

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
            _ = hup.recv() => { let _ = reload(&proxy, ReloadTrigger::Sighup); }
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
        // The log ends signed: nothing after the last checkpoint to cut unseen.
        audit.checkpoint().await;
        audit.sync().await;
        let head = audit.head();
        tracing::info!(seq = head.seq, hash = %head.hash, "audit log closed");
        audit
            .finish_exports(std::time::Duration::from_secs(3))
            .await;
    }
    Ok(())
}

fn lifecycle(policy: &str) -> LifecycleEntry {
    LifecycleEntry {
        version: env!("CARGO_PKG_VERSION"),
        pid: std::process::id(),
        policy: policy.to_string(),
    }
}

/// Raises the soft limit on open files to the hard one: each connection may hold two (the
/// agent's and the upstream's), and a soft limit of 1024 (a common default) would have
/// `accept` fail long before `limits.max_connections`. Says so when even the hard limit is
/// too low.
fn raise_open_files(limits: &crate::config::Limits) {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) else {
        return;
    };
    if soft < hard {
        // macOS refuses an unlimited soft limit (above OPEN_MAX): settle for a finite one.
        let raised = setrlimit(Resource::RLIMIT_NOFILE, hard, hard)
            .or_else(|_| setrlimit(Resource::RLIMIT_NOFILE, hard.min(10_240), hard));
        if let Err(e) = raised {
            tracing::warn!("raising the open-file limit from {soft} to {hard}: {e}");
        }
    }
    let want = u64::try_from(limits.max_connections)
        .unwrap_or(u64::MAX)
        .saturating_mul(2)
        .saturating_add(256);
    if hard < want {
        tracing::warn!(
            "the open-file limit is {hard}, under the {want} that limits.max_connections = {} \
             may need; raise it (systemd: LimitNOFILE) or lower max_connections",
            limits.max_connections
        );
    }
}

/// Whether this start writes the shipped policy: a first run on built-in defaults, whose
/// policy directory does not exist yet (a config file's directory must exist).
pub fn seeds_default_policy(cfg: &Config) -> bool {
    cfg.state_dir.is_some() && !cfg.policies.exists()
}

/// On a first run with built-in defaults, give the operator the shipped policy to edit.
/// Returns the file written (`None`: the directory was there already).
pub fn seed_default_policy(dir: &Path) -> anyhow::Result<Option<std::path::PathBuf>> {
    if dir.exists() {
        return Ok(None);
    }
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let file = dir.join("default.toml");
    std::fs::write(&file, DEFAULT_POLICY).with_context(|| format!("writing {}", file.display()))?;
    Ok(Some(file))
}
