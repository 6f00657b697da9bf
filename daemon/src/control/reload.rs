//! A policy reload, as the operator's actions and the watcher ask for it (`ctl reload`,
//! SIGHUP, an edit the watcher saw, a secret stored that a refused policy wanted): the store
//! reads the directory again, and the outcome is logged, counted (metrics and `ctl stats`),
//! written to the audit log, and applied to the tunnels already open.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::audit::{Entry, ReloadEntry, ReloadResult, ReloadTrigger};
use crate::policy::{BundleLayer, Policy, PolicyError};
use crate::proxy::Proxy;

/// Reloads the policy directory. On failure the policy in force stays.
pub(crate) fn reload(proxy: &Proxy, why: ReloadTrigger) -> Result<Arc<Policy>, PolicyError> {
    apply(proxy, why, None)
}

/// A reload with `bundle` as the new bundle layer (`None`: the one in force), the one path a
/// policy bundle takes into force: recorded, counted and applied to open tunnels like any.
pub(crate) fn apply(
    proxy: &Proxy,
    why: ReloadTrigger,
    bundle: Option<Arc<BundleLayer>>,
) -> Result<Arc<Policy>, PolicyError> {
    let counters = &proxy.events.counters;
    let result = proxy.policies.reload_with(bundle);
    let (outcome, error) = match &result {
        Ok(_) => (ReloadResult::Ok, None),
        Err(e) => (ReloadResult::Error, Some(e.to_string())),
    };
    proxy.metrics.policy.reloaded(outcome);
    let now = proxy.policy();
    if result.is_ok() {
        proxy.metrics.policy.set_policy(now.hash());
    }
    if let Some(audit) = &proxy.audit {
        audit.write_detached(Entry::Reload(ReloadEntry {
            result: outcome,
            trigger: why.clone(),
            policy: now.hash().to_string(),
            rules: result.as_ref().ok().map(|p| p.rule_count()),
            error,
        }));
    }
    match result {
        Ok(p) => {
            counters.reloads_ok.fetch_add(1, Ordering::Relaxed);
            let closed = proxy.tunnels.revise(&p);
            if closed > 0 {
                tracing::info!(
                    closed,
                    "the new policy no longer allows {closed} open tunnel(s): closing them"
                );
            }
            tracing::info!(
                hash = p.hash(),
                rules = p.rule_count(),
                "policy reloaded ({why})"
            );
            Ok(p)
        }
        Err(e) => {
            counters.reloads_failed.fetch_add(1, Ordering::Relaxed);
            tracing::error!(
                "policy reload ({why}) failed, keeping {}: {e}",
                proxy.policy().hash()
            );
            Err(e)
        }
    }
}
