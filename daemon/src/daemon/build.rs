//! Building the data path's shared state from the config: audit log, secrets, policy, CA and
//! leaf cache, upstream trust, resolver, guard, dialer and pooled clients.

use std::net::SocketAddr;
use std::sync::Arc;

use agenshield_certs::{Ca, CaOrigin, LeafCache, LeafConfig};
use anyhow::Context;

use super::BadInput;
use crate::admission::Identities;
use crate::approvals::Approvals;
use crate::audit::{Audit, CheckpointKey, KeyOrigin};
use crate::config::{Config, NameOrId};
use crate::control::admin::{self, AdminAuth};
use crate::control::policy_source::{PolicySource, SourceStart};
use crate::daemon::firewall;
use crate::metrics::Metrics;
use crate::policy::{Layering, PolicyStore};
use crate::proxy::{Proxy, ProxyParts};
use crate::ratelimit::FleetLimiter;
use crate::secrets::Vault;
use crate::upstream::client::Forwarder;
use crate::upstream::dial::Dialer;
use crate::upstream::guard::AddressGuard;
use crate::upstream::guard::Forbidden;
use crate::upstream::resolve::Resolver;
use crate::upstream::trust::UpstreamTrust;

/// The key that signs the audit log's checkpoints, created on the first start when absent;
/// `None` when `[audit]` asks for none. A key that cannot be read or made stops the start:
/// the operator asked for a signed log.
fn checkpoint_key(cfg: &Config) -> anyhow::Result<Option<CheckpointKey>> {
    if !crate::audit::checkpoints_enabled(&cfg.audit) {
        tracing::info!(
            "audit checkpoints are off (audit.checkpoint_every and checkpoint_interval are 0)"
        );
        return Ok(None);
    }
    let (key, origin) = CheckpointKey::load_or_create(&cfg.audit_key).map_err(|e| {
        BadInput(format!(
            "{e} (or set audit.checkpoint_every = 0 and audit.checkpoint_interval = \"0s\" for \
             no checkpoints)"
        ))
    })?;
    let verb = match origin {
        KeyOrigin::Created => "created",
        KeyOrigin::Loaded => "loaded",
    };
    println!(
        "agenshield: audit checkpoint key {verb}: {} (key id {})",
        cfg.audit_key.display(),
        key.public().id()
    );
    Ok(Some(key))
}

/// The data path's shared state: policy, CA and leaf cache, upstream trust, dialer, clients.
pub(super) async fn build_proxy(
    cfg: &Config,
    own: Vec<SocketAddr>,
    metrics: Arc<Metrics>,
) -> anyhow::Result<(Proxy, Option<SourceStart>)> {
    let audit = match &cfg.audit_path {
        Some(path) => {
            let audit = Audit::open(
                path,
                &cfg.audit,
                metrics.audit.clone(),
                checkpoint_key(cfg)?,
            )
            .with_context(|| format!("opening the audit log {}", path.display()))?;
            let export = crate::audit::export::ExportMetrics::register(
                metrics.registry(),
                crate::metrics::NS,
            );
            audit
                .start_exports(&cfg.audit, &export)
                .map_err(|e| BadInput(e.to_string()))?;
            Some(audit)
        }
        None => {
            tracing::warn!("audit log is off (audit.enabled = false)");
            None
        }
    };
    let store = crate::secrets::open_store(cfg, true)
        .map_err(|e| BadInput(format!("secrets: {e}")))?
        .context("the secret store was not created")?;
    let vault = Arc::new(
        Vault::open_with(store, reserved_values(cfg))
            .await
            .map_err(|e| BadInput(format!("secrets: {e}")))?,
    );
    tracing::info!(
        store = vault.describe().as_str(),
        secrets = vault.current().len(),
        "secrets loaded"
    );
    let known = vault.clone();
    let fleet_store = cfg.ratelimit.store.is_some();
    let secrets: crate::policy::SecretCheck = Arc::new(move |n: &str| known.contains(n));
    let (policies, source) = match &cfg.policy_source {
        None => (
            PolicyStore::load(&cfg.policies, secrets, fleet_store)
                .map_err(|e| BadInput(format!("policy: {e}")))?,
            None,
        ),
        Some(sc) => {
            let mut start = PolicySource::open(sc, &cfg.upstream.extra_ca)
                .and_then(PolicySource::start)
                .map_err(|e| BadInput(e.to_string()))?;
            let layering = Some(Layering {
                require_first_sync: sc.require_first_sync,
            });
            // A cached bundle that does not compose with the local directory leaves the
            // store refusing everything (not the local files alone) until it does.
            let (store, dropped) = PolicyStore::start_layered(
                &cfg.policies,
                secrets,
                fleet_store,
                layering,
                start.layer(),
            )
            .map_err(|e| BadInput(format!("policy: {e}")))?;
            if let Some(e) = dropped {
                start.drop_layer(format!(
                    "{e}; every agent request is refused (policy_unavailable) until the local \
                     policy directory composes with the bundle"
                ));
            }
            (store, Some(start))
        }
    };
    let fleet = fleet_limiter(cfg, &vault, &metrics)?;
    let policy = policies.current();
    tracing::info!(
        dir = ?cfg.policies,
        hash = policy.hash(),
        rules = policy.rule_count(),
        "policy loaded"
    );
    let (ca, origin) = Ca::load_or_create(&cfg.certs)
        .map_err(|e| BadInput(format!("CA: {}", crate::error_chain::chain(&e))))?;
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
    if let Some(proxy) = &cfg.upstream.proxy {
        check_proxy(proxy, &guard)?;
        tracing::info!(%proxy, "upstream connections go through the operator's proxy");
    }
    let dialer = Arc::new(Dialer::new(
        resolver,
        guard,
        cfg.limits.upstream_connect_timeout,
        metrics.upstream.connect.clone(),
        cfg.upstream.proxy.clone(),
    ));
    let forwarder = Forwarder::new(
        dialer.clone(),
        trust.client_config()?,
        &cfg.limits,
        metrics.upstream.retries.clone(),
    );
    vault.set_token_client(Arc::new(forwarder.clone()));
    let dns_metrics =
        crate::dns_state::DnsMetrics::register(metrics.registry(), crate::metrics::NS);
    let approvals = approvals(cfg, &vault, &metrics)?;
    let proxy = Proxy::new(ProxyParts {
        vault,
        dns_metrics,
        metrics,
        audit,
        audit_query_values: cfg.audit.query_values == crate::config::QueryValues::Keep,
        scan_body_bytes: cfg.secrets.scan_body_bytes,
        policies,
        leaves,
        dialer,
        forwarder,
        limits: cfg.limits.clone(),
        approvals,
        upgrades: cfg.upstream.upgrades.clone(),
        identities: identities(cfg)?,
        mcp: Arc::new(crate::mcp::McpState {
            pins: crate::mcp::pins::PinStore::open_or_earlier(
                cfg.mcp_pins.clone(),
                // The default was `mcp-pins.json` beside the vault, in a directory the serving
                // user may not write; pins kept there are read until saved at the new place.
                (cfg.mcp_pins == cfg.vault.with_file_name("mcp").join("mcp-pins.json"))
                    .then(|| cfg.vault.with_file_name("mcp-pins.json")),
            )
            .map_err(|e| BadInput(e.to_string()))?,
            sessions: Arc::default(),
        }),
        denied_names: cfg.dns_answers.denied,
        fleet,
    });
    Ok((proxy, source))
}

/// The `ask` queue, telling `[approvals] webhook` of each held request when one is set.
fn approvals(cfg: &Config, vault: &Arc<Vault>, metrics: &Metrics) -> anyhow::Result<Approvals> {
    let approvals = Approvals::new(cfg.approvals.timeout);
    let Some(webhook) = cfg.approvals.webhook() else {
        return Ok(approvals);
    };
    let notify = crate::approvals::webhook::start(
        &webhook,
        &cfg.upstream.extra_ca,
        vault.clone(),
        metrics.registry(),
        crate::metrics::NS,
    )
    .map_err(|e| BadInput(e.to_string()))?;
    Ok(approvals.notifying(Box::new(notify)))
}

/// `[ratelimit] store`'s limiter, connecting in the background from now on (a store that is
/// down at start is an outage like any other, not a failed start).
fn fleet_limiter(
    cfg: &Config,
    vault: &Vault,
    metrics: &Metrics,
) -> anyhow::Result<Option<FleetLimiter>> {
    let password = match &cfg.ratelimit.password_secret {
        None => None,
        Some(name) => {
            let secrets = vault.current();
            let secret = secrets.get(name).ok_or_else(|| {
                BadInput(format!(
                    "ratelimit.password_secret: no secret {name:?} in the store \
                     (agenshield proxy ctl secrets set {name})"
                ))
            })?;
            let text = std::str::from_utf8(secret.value.expose()).map_err(|_| {
                BadInput(format!(
                    "ratelimit.password_secret: secret {name:?} is not UTF-8"
                ))
            })?;
            Some(text.to_string())
        }
    };
    let fleet = FleetLimiter::new(
        &cfg.ratelimit,
        password,
        metrics.registry(),
        crate::metrics::NS,
    )
    .map_err(|e| BadInput(e.to_string()))?;
    if let (Some(f), Some(store)) = (&fleet, &cfg.ratelimit.store) {
        f.start();
        tracing::info!(
            %store,
            on_store_error = cfg.ratelimit.on_store_error.as_str(),
            timeout_ms = cfg.ratelimit.timeout.as_millis(),
            "fleet rate limits count in the shared store"
        );
    }
    Ok(fleet)
}

/// Who may use which listener (see `conn::identity`): agent users, the explicit listener's
/// extra users and groups, resolved now. An agent user that does not exist is no agent (said
/// at start); an extra user or group that does not exist stops the start, with its name.
pub fn identities(cfg: &Config) -> anyhow::Result<Identities> {
    let mut agents = Vec::new();
    for u in &cfg.redirect.agent_users {
        match firewall::resolve_uids(std::slice::from_ref(u)) {
            Ok(uids) => agents.extend(uids),
            Err(e) => tracing::warn!("redirect.agent_users: {u} is not admitted as an agent: {e}"),
        }
    }
    agents.sort_unstable();
    agents.dedup();
    if cfg.testing.every_uid_is_agent {
        tracing::warn!("TESTING: every local uid counts as an agent user's");
    }
    let user = |u: &NameOrId| match u {
        NameOrId::Id(uid) => Ok(*uid),
        NameOrId::Name(name) => match nix::unistd::User::from_name(name) {
            Ok(Some(user)) => Ok(user.uid.as_raw()),
            Ok(None) => Err(BadInput(format!("listen.explicit_users: no user {name:?}"))),
            Err(e) => Err(BadInput(format!(
                "listen.explicit_users: looking up {name:?}: {e}"
            ))),
        },
    };
    let group = |g: &NameOrId| match g {
        NameOrId::Id(gid) => Ok(*gid),
        NameOrId::Name(name) => match nix::unistd::Group::from_name(name) {
            Ok(Some(group)) => Ok(group.gid.as_raw()),
            Ok(None) => Err(BadInput(format!(
                "listen.explicit_groups: no group {name:?}"
            ))),
            Err(e) => Err(BadInput(format!(
                "listen.explicit_groups: looking up {name:?}: {e}"
            ))),
        },
    };
    Ok(Identities {
        agents,
        every_uid_is_agent: cfg.testing.every_uid_is_agent,
        own_uid: nix::unistd::geteuid().as_raw(),
        admin_gid: nix::unistd::Group::from_name(admin::ADMIN_GROUP)
            .ok()
            .flatten()
            .map(|g| g.gid.as_raw()),
        explicit_uids: cfg
            .explicit_users
            .iter()
            .map(user)
            .collect::<Result<_, _>>()?,
        explicit_gids: cfg
            .explicit_groups
            .iter()
            .map(group)
            .collect::<Result<_, _>>()?,
    })
}

/// Who may use the admin socket: root, our own uid, the admin group; never an agent.
pub(super) fn admin_auth(cfg: &Config) -> AdminAuth {
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

/// Text the daemon holds that must never reach the agent or a log, redacted like the
/// store's secrets: the upstream proxy's `user:password` and password (a corporate proxy
/// that reflects our `Proxy-Authorization`, in a TRACE or an error page, would otherwise hand
/// it to the agent). A part too short to be told from ordinary text (under 8 bytes) or not
/// printable ASCII is left out, with a warning.
pub fn reserved_values(
    cfg: &Config,
) -> Vec<(crate::secrets::SecretName, Arc<crate::secrets::SecretValue>)> {
    let Some(proxy) = &cfg.upstream.proxy else {
        return Vec::new();
    };
    let names = ["upstream.proxy", "upstream.proxy.password"];
    let mut out = Vec::new();
    for (name, text) in names.into_iter().zip(proxy.credential_texts()) {
        match crate::secrets::SecretValue::new(text.into_bytes()) {
            Ok(v) => out.push((crate::secrets::SecretName::reserved(name), Arc::new(v))),
            Err(_) => tracing::warn!(
                part = name,
                "the upstream proxy's credential is too short or not printable ASCII to be \
                 redacted on its own"
            ),
        }
    }
    out
}

/// An upstream proxy given as an address the guard forbids is refused at start, with the fix;
/// one given by name is guarded each time it is dialed.
pub fn check_proxy(
    proxy: &crate::config::UpstreamProxy,
    guard: &AddressGuard,
) -> anyhow::Result<()> {
    let Ok(ip) = proxy.host.parse::<std::net::IpAddr>() else {
        return Ok(());
    };
    let addr = std::net::SocketAddr::new(ip, proxy.port);
    match guard.check(addr) {
        Ok(()) => Ok(()),
        Err(reason @ Forbidden::OwnListener) => Err(BadInput(format!(
            "upstream.proxy: {addr} is {reason}: traffic would loop"
        ))
        .into()),
        Err(reason) => Err(BadInput(format!(
            "upstream.proxy: {addr} is a {reason}, which the private-address guard refuses; \
             allow it with upstream.allow_private = [\"{ip}/{}\"]",
            if ip.is_ipv4() { 32 } else { 128 }
        ))
        .into()),
    }
}
