//! The parts of a start the serving process does (a split daemon's worker, as the worker
//! user): open the audit log and the secret store, load the policy and the secrets it binds,
//! the CA, upstream trust and the resolver. Checked by reading what is there and saying what a
//! start would create.

use std::path::Path;
use std::sync::Arc;

use super::supervisor::BoundAddrs;
use super::{creatable, part, Part, Verdict};
use agenshield_proxy::config::Config;
use agenshield_proxy::daemon::build;
use agenshield_proxy::policy::Policy;

pub(super) fn audit(cfg: &Config) -> Part {
    let Some(path) = &cfg.audit_path else {
        return part(
            "audit",
            Verdict::Note,
            "off (audit.enabled = false): no decision is recorded",
        );
    };
    let failed = |e: &dyn std::fmt::Display| {
        part(
            "audit",
            Verdict::Failed,
            format!("opening the audit log {}: {e}", path.display()),
        )
    };
    let log = match agenshield_proxy::audit::preflight(path) {
        Ok(Some(bytes)) => format!("{} ({bytes} bytes)", path.display()),
        Ok(None) => match path.parent().map(creatable) {
            Some(Err(e)) => return failed(&e),
            _ => format!("{} (created at start)", path.display()),
        },
        Err(e) => return failed(&e),
    };
    match checkpoint_key(cfg) {
        Ok(key) => part("audit", Verdict::Ok, format!("{log}; {key}")),
        Err(e) => part("audit", Verdict::Failed, e),
    }
}

/// What a start does with the checkpoint key: load it (refused if others may read it) or
/// create it.
fn checkpoint_key(cfg: &Config) -> Result<String, String> {
    use agenshield_proxy::audit::checkpoint_key::KeyError;
    use agenshield_proxy::audit::CheckpointKey;
    if !agenshield_proxy::audit::checkpoints_enabled(&cfg.audit) {
        return Ok("no checkpoints (audit.checkpoint_every and checkpoint_interval are 0)".into());
    }
    let key = &cfg.audit_key;
    match CheckpointKey::load(key) {
        Ok(k) => Ok(format!(
            "checkpoints signed by {} (key id {})",
            key.display(),
            k.public().id()
        )),
        Err(KeyError::Read { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
            match key.parent().map(creatable) {
                Some(Err(e)) => Err(format!("the audit checkpoint key {}: {e}", key.display())),
                _ => Ok(format!(
                    "checkpoint key {} (created at start)",
                    key.display()
                )),
            }
        }
        Err(e) => Err(e.to_string()),
    }
}

/// The secrets the store holds: `Ok(None)` when a file vault does not exist yet (created,
/// empty, at start).
pub(super) type VaultState = Result<Option<Arc<agenshield_proxy::secrets::Vault>>, String>;

pub(super) async fn vault(cfg: &Config) -> VaultState {
    let store =
        agenshield_proxy::secrets::open_store(cfg, false).map_err(|e| format!("secrets: {e}"))?;
    let Some(store) = store else {
        return match creatable(&cfg.vault) {
            Ok(()) => Ok(None),
            Err(e) => Err(format!("secrets: {}: {e}", cfg.vault.display())),
        };
    };
    agenshield_proxy::secrets::Vault::open_with(store, build::reserved_values(cfg))
        .await
        .map(|v| Some(Arc::new(v)))
        .map_err(|e| format!("secrets: {e}"))
}

/// The policy `run` loads, whether it is the shipped one `run` would write first, and the
/// line that says so.
pub(super) type Loaded = ((Policy, bool), String);

pub(super) fn policy(cfg: &Config, seeds: bool) -> Result<Loaded, String> {
    if !seeds {
        let p = Policy::load_dir(&cfg.policies).map_err(|e| e.to_string())?;
        // A `scope = "fleet"` rate needs `[ratelimit] store`, as `run` checks at load.
        p.check_fleet(cfg.ratelimit.store.is_some())
            .map_err(|e| e.to_string())?;
        let line = format!(
            "{}: {} rules, {}",
            cfg.policies.display(),
            p.rule_count(),
            p.hash()
        );
        return Ok(((p, false), line));
    }
    // What `run` writes there first, loaded as `run` loads it.
    let scratch = tempfile::tempdir().map_err(|e| format!("a scratch directory: {e}"))?;
    let dir = scratch.path().join("policies");
    agenshield_proxy::daemon::seed_default_policy(&dir).map_err(|e| format!("{e:#}"))?;
    let p = Policy::load_dir(&dir).map_err(|e| e.to_string())?;
    creatable(&cfg.policies).map_err(|e| format!("{}: {e}", cfg.policies.display()))?;
    let line = format!(
        "{} does not exist yet: `run` writes the shipped default policy there ({} rules, {})",
        cfg.policies.display(),
        p.rule_count(),
        p.hash()
    );
    Ok(((p, true), line))
}

pub(super) fn secrets(cfg: &Config, vault: &VaultState, policy: Option<&Policy>) -> Part {
    let vault = match vault {
        Ok(v) => v,
        Err(e) => return part("secrets", Verdict::Failed, e.clone()),
    };
    let held = vault.as_ref().map_or(0, |v| v.current().len());
    let Some(p) = policy else {
        return part(
            "secrets",
            Verdict::Note,
            format!("{held} in the store; not matched (the policy did not load)"),
        );
    };
    match p.check_secrets(&|n| vault.as_ref().is_some_and(|v| v.contains(n))) {
        Ok(()) if vault.is_none() => part(
            "secrets",
            Verdict::Ok,
            format!(
                "the vault {} is created (empty) at start; the policy binds none",
                cfg.vault.display()
            ),
        ),
        Ok(()) => part(
            "secrets",
            Verdict::Ok,
            format!("{held} in the store, every secret the policy binds among them"),
        ),
        Err(e) => part("secrets", Verdict::Failed, format!("policy: {e}")),
    }
}

pub(super) fn ca(dir: &Path) -> Part {
    match agenshield_certs::Ca::load_existing(dir) {
        Ok(Some(ca)) => {
            let cert = dir.join("ca.pem");
            let until = crate::cmd::ca_file::read(&cert).ok().map(|(_, f)| {
                let expired =
                    f.expiry(time::OffsetDateTime::now_utc()) == agenshield_certs::Expiry::Expired;
                (f.not_after.date(), expired)
            });
            match until {
                Some((date, true)) => part(
                    "CA",
                    Verdict::Note,
                    format!(
                        "{} EXPIRED on {date}: clients refuse every certificate it signs",
                        cert.display()
                    ),
                ),
                Some((date, false)) => part(
                    "CA",
                    Verdict::Ok,
                    format!(
                        "{} (SHA-256 {}, valid until {date})",
                        cert.display(),
                        ca.fingerprint_sha256()
                    ),
                ),
                None => part(
                    "CA",
                    Verdict::Ok,
                    format!("{} (SHA-256 {})", cert.display(), ca.fingerprint_sha256()),
                ),
            }
        }
        Ok(None) => match creatable(dir) {
            Ok(()) => part(
                "CA",
                Verdict::Note,
                format!(
                    "none yet in {}; the daemon creates one when it first starts",
                    dir.display()
                ),
            ),
            Err(e) => part("CA", Verdict::Failed, format!("{}: {e}", dir.display())),
        },
        Err(e) => part(
            "CA",
            Verdict::Failed,
            format!("CA: {}", agenshield_proxy::error_chain::chain(&e)),
        ),
    }
}

pub(super) async fn upstream(cfg: &Config, bound: &BoundAddrs) -> Part {
    let trust = match agenshield_proxy::upstream::trust::UpstreamTrust::load(&cfg.upstream.extra_ca)
    {
        Ok(t) => t,
        Err(e) => return part("upstream", Verdict::Failed, e.to_string()),
    };
    if let Err(e) = trust.client_config() {
        return part("upstream", Verdict::Failed, format!("{e:#}"));
    }
    if let Err(e) = agenshield_proxy::upstream::resolve::Resolver::new(&cfg.resolver) {
        return part("upstream", Verdict::Failed, format!("resolver: {e:#}"));
    }
    if let Some(proxy) = &cfg.upstream.proxy {
        let own = bound.iter().map(|(_, a)| *a).collect();
        let guard = agenshield_proxy::upstream::guard::AddressGuard::new(
            cfg.upstream.allow_private.clone(),
            own,
        );
        if let Err(e) = build::check_proxy(proxy, &guard) {
            return part("upstream", Verdict::Failed, e.to_string());
        }
    }
    part(
        "upstream",
        Verdict::Ok,
        format!(
            "{} system and {} extra trust roots{}",
            trust.system_roots,
            trust.extra_roots,
            match &cfg.upstream.proxy {
                Some(p) => format!("; through the proxy {p}"),
                None => String::new(),
            }
        ),
    )
}

/// `[listen] admin_https` (its TLS files as the serving user reads them) and `[approvals]
/// webhook` (its key in the store): `None` when neither is set.
pub(super) fn approvals(cfg: &Config, vault: &VaultState) -> Option<Part> {
    let https = cfg.admin_https.as_ref();
    let webhook = cfg.approvals.webhook();
    if https.is_none() && webhook.is_none() {
        return None;
    }
    let mut said = Vec::new();
    if let Some(h) = https {
        if let Err(e) = agenshield_proxy::control::admin::check_https_tls(h) {
            return Some(part("approval", Verdict::Failed, e.to_string()));
        }
        said.push(format!(
            "admin HTTPS on {} for client certificates from {}",
            h.addr,
            h.client_ca.display()
        ));
    }
    if let Some(w) = webhook {
        let held = matches!(vault, Ok(Some(v)) if v.contains(&w.hmac_secret));
        if !held {
            return Some(part(
                "approval",
                Verdict::Failed,
                format!(
                    "approvals.hmac_secret: no secret {:?} in the store (agenshield proxy ctl \
                     secrets set {})",
                    w.hmac_secret, w.hmac_secret
                ),
            ));
        }
        said.push(format!(
            "webhook to {} signed with secret {:?}",
            w.url.host_str().unwrap_or(""),
            w.hmac_secret
        ));
    }
    Some(part("approval", Verdict::Ok, said.join("; ")))
}
