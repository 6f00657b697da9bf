//! The policy in force, and how it changes: parsed and validated completely, then swapped
//! atomically. A request keeps the policy it started with; a bad file keeps the last good
//! policy in force and is remembered for `ctl status`.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;
use serde::Serialize;

use super::source_status::{BundleLayer, SourceStatus};
use super::watch_status::{WatchHealth, WatchStatus};
use super::{Policy, PolicyError};
use crate::clock::now_rfc3339;

#[derive(Debug, Clone, Serialize)]
pub(crate) struct ReloadFailure {
    pub at: String,
    pub message: String,
}

#[derive(Debug, Clone, Serialize)]
pub(crate) struct PolicyInfo {
    pub dir: PathBuf,
    pub hash: String,
    pub rules: usize,
    pub mode: String,
    pub loaded_at: String,
    /// The last reload that failed, if no successful one came after it.
    pub last_error: Option<ReloadFailure>,
    /// Whether edits to the directory are seen (hot reload).
    pub watch: WatchStatus,
    /// `[policy.source]`, when set: the bundle in force and the last sync.
    pub source: Option<SourceStatus>,
    /// Local rules and settings a `deny-only` bundle left out, one line each.
    pub local_dropped: Vec<String>,
    /// No policy yet: every agent request is refused (`policy_unavailable`).
    pub unavailable: bool,
}

/// How the store builds a policy when `[policy.source]` is set.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Layering {
    /// Before the first bundle, refuse everything rather than use the local directory alone.
    pub require_first_sync: bool,
}

/// Whether the secret store holds a secret: a policy binding a missing one is refused.
pub(crate) type SecretCheck = Arc<dyn Fn(&str) -> bool + Send + Sync>;

pub(crate) struct PolicyStore {
    /// The hot-reload watcher's health (`policy_watch.rs` keeps it up to date).
    pub watch: Arc<WatchHealth>,
    dir: PathBuf,
    secrets: SecretCheck,
    /// `[ratelimit] store` is set: rules may say `rate.scope = "fleet"`.
    fleet_store: bool,
    current: ArcSwap<Policy>,
    state: Mutex<(String, Option<ReloadFailure>)>,
    /// `Some` when a policy source is configured.
    layering: Option<Layering>,
    /// The bundle layer in force, and what of the local layer it left out. Held while a
    /// policy is built and swapped, so two reloads never interleave.
    layers: Mutex<(Option<Arc<BundleLayer>>, Vec<String>)>,
    source: Mutex<Option<SourceStatus>>,
}

impl PolicyStore {
    pub(crate) fn load(
        dir: &Path,
        secrets: SecretCheck,
        fleet_store: bool,
    ) -> Result<PolicyStore, PolicyError> {
        Self::load_layered(dir, secrets, fleet_store, None, None)
    }

    /// With `layering` (a policy source is configured), the policy is `bundle` composed with
    /// the local directory; before any bundle, the directory alone or, with
    /// `require_first_sync`, [`Policy::unavailable`]. `fleet_store`: whether `[ratelimit]
    /// store` is configured (a `scope = "fleet"` rate without it is refused).
    pub(crate) fn load_layered(
        dir: &Path,
        secrets: SecretCheck,
        fleet_store: bool,
        layering: Option<Layering>,
        bundle: Option<Arc<BundleLayer>>,
    ) -> Result<PolicyStore, PolicyError> {
        let (policy, dropped) = build(dir, &*secrets, fleet_store, layering, bundle.as_deref())?;
        Ok(PolicyStore {
            watch: Arc::default(),
            dir: dir.to_path_buf(),
            secrets,
            fleet_store,
            current: ArcSwap::from_pointee(policy),
            state: Mutex::new((now_rfc3339(), None)),
            layering,
            layers: Mutex::new((bundle, dropped)),
            source: Mutex::new(None),
        })
    }

    /// [`Self::load_layered`] at start, with the cached (verified) `bundle`. When it does not
    /// compose with the local directory, the store keeps the bundle layer (the rollback
    /// floor; a fixed directory composes with it at the next reload) and refuses everything
    /// meanwhile ([`Policy::unavailable`]): the local directory alone would let through what
    /// the bundle's `local` mode leaves out. The composition error is returned beside it.
    pub(crate) fn start_layered(
        dir: &Path,
        secrets: SecretCheck,
        fleet_store: bool,
        layering: Option<Layering>,
        bundle: Option<Arc<BundleLayer>>,
    ) -> Result<(PolicyStore, Option<PolicyError>), PolicyError> {
        match Self::load_layered(dir, secrets.clone(), fleet_store, layering, bundle.clone()) {
            Err(e) if bundle.is_some() => {
                let store = PolicyStore {
                    watch: Arc::default(),
                    dir: dir.to_path_buf(),
                    secrets,
                    fleet_store,
                    current: ArcSwap::from_pointee(Policy::unavailable()),
                    state: Mutex::new((
                        now_rfc3339(),
                        Some(ReloadFailure {
                            at: now_rfc3339(),
                            message: e.to_string(),
                        }),
                    )),
                    layering,
                    layers: Mutex::new((bundle, Vec::new())),
                    source: Mutex::new(None),
                };
                Ok((store, Some(e)))
            }
            other => other.map(|s| (s, None)),
        }
    }

    /// The policy in force now.
    pub(crate) fn current(&self) -> Arc<Policy> {
        self.current.load_full()
    }

    /// Re-reads the directory (and composes it with `bundle`, the new bundle layer, or, for
    /// `None`, the one in force). On success the new policy is in force for every request
    /// that starts after this returns, and the layer is kept; on failure nothing changes but
    /// the recorded error.
    pub(crate) fn reload_with(
        &self,
        bundle: Option<Arc<BundleLayer>>,
    ) -> Result<Arc<Policy>, PolicyError> {
        let mut layers = self.layers.lock().unwrap_or_else(|e| e.into_inner());
        let layer = bundle.clone().or_else(|| layers.0.clone());
        let loaded = build(
            &self.dir,
            &*self.secrets,
            self.fleet_store,
            self.layering,
            layer.as_deref(),
        );
        match loaded {
            Ok((p, dropped)) => {
                let p = Arc::new(p);
                self.current.store(p.clone());
                if bundle.is_some() {
                    layers.0 = bundle;
                }
                layers.1 = dropped;
                if let Ok(mut st) = self.state.lock() {
                    *st = (now_rfc3339(), None);
                }
                Ok(p)
            }
            Err(e) => {
                if let Ok(mut st) = self.state.lock() {
                    st.1 = Some(ReloadFailure {
                        at: now_rfc3339(),
                        message: e.to_string(),
                    });
                }
                Err(e)
            }
        }
    }

    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }

    /// The bundle layer in force, if any.
    pub(crate) fn bundle(&self) -> Option<Arc<BundleLayer>> {
        self.layers.lock().ok().and_then(|l| l.0.clone())
    }

    /// Updates the policy source's status (the sync loop's).
    pub(crate) fn update_source(&self, f: impl FnOnce(&mut SourceStatus)) {
        if let Ok(mut s) = self.source.lock() {
            f(s.get_or_insert_with(SourceStatus::default));
        }
    }

    pub(crate) fn info(&self) -> PolicyInfo {
        let p = self.current();
        let (loaded_at, last_error) = self
            .state
            .lock()
            .map(|s| s.clone())
            .unwrap_or_else(|_| (String::new(), None));
        PolicyInfo {
            dir: self.dir.clone(),
            hash: p.hash().to_string(),
            rules: p.rule_count(),
            mode: format!("{:?}", p.mode()).to_lowercase(),
            loaded_at,
            last_error,
            watch: self.watch.status(),
            source: self
                .source
                .lock()
                .ok()
                .and_then(|s| s.clone())
                .map(|mut s| {
                    s.waiting_for_first_sync = p.is_unavailable();
                    s
                }),
            local_dropped: self.layers.lock().map(|l| l.1.clone()).unwrap_or_default(),
            unavailable: p.is_unavailable(),
        }
    }
}

/// The policy for the directory and, when a source is configured, the bundle layer; and
/// what of the local layer was left out.
fn build(
    dir: &Path,
    secrets: &(dyn Fn(&str) -> bool + Send + Sync),
    fleet_store: bool,
    layering: Option<Layering>,
    bundle: Option<&BundleLayer>,
) -> Result<(Policy, Vec<String>), PolicyError> {
    let (policy, dropped) = match (layering, bundle) {
        (None, _) => (Policy::load_dir(dir)?, Vec::new()),
        (Some(_), Some(b)) => {
            let c = Policy::compose(&b.sources, dir, b.local)?;
            (c.policy, c.dropped)
        }
        (Some(l), None) if l.require_first_sync => (Policy::unavailable(), Vec::new()),
        // No bundle yet: the local directory alone; none either, nothing is allowed.
        (Some(_), None) => match super::load::list_dir(dir) {
            Ok(files) if !files.is_empty() => (Policy::load_dir(dir)?, Vec::new()),
            _ => (Policy::unavailable(), Vec::new()),
        },
    };
    if !policy.is_unavailable() {
        policy.check_secrets(secrets)?;
        policy.check_fleet(fleet_store)?;
    }
    Ok((policy, dropped))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::{Action, LocalMode, PolicySource, RequestFacts, Scheme};

    fn get(p: &Policy, host: &str) -> Action {
        p.decide(&RequestFacts {
            host,
            port: 443,
            scheme: Scheme::Https,
            method: Some("GET"),
            path: Some("/"),
            agent: None,
        })
        .action
    }

    /// A cached deny-only bundle that does not compose with the local directory (here a
    /// local rule reusing a bundle rule's id) must not leave the local directory alone in
    /// force: its allow rules are exactly what the bundle said to leave out.
    #[test]
    fn a_start_bundle_that_does_not_compose_fails_closed_not_to_the_local_files() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let local = tmp.path().join("local.toml");
        std::fs::write(
            &local,
            "version = 1\n[[rule]]\nid = \"central\"\naction = \"deny\"\nhosts = [\"x.test\"]\n\
             [[rule]]\nid = \"evil\"\naction = \"allow\"\nhosts = [\"*\"]\n",
        )
        .expect("write");
        let bundle = Arc::new(BundleLayer {
            sources: vec![PolicySource {
                name: "bundle:r1/main.toml".into(),
                text: "version = 1\n[[rule]]\nid = \"central\"\naction = \"allow\"\nhosts = [\"a.test\"]\n".into(),
            }],
            local: LocalMode::DenyOnly,
            revision: 1,
            sha256: "00".into(),
            created_at: "2026-12-07T00:00:00Z".into(),
        });
        let layering = Some(Layering {
            require_first_sync: false,
        });
        let secrets: SecretCheck = Arc::new(|_: &str| true);
        let (store, err) =
            PolicyStore::start_layered(tmp.path(), secrets, false, layering, Some(bundle.clone()))
                .expect("a store");
        assert!(err.is_some(), "the composition error is reported");
        let p = store.current();
        assert!(p.is_unavailable(), "fail closed, not the local files alone");
        assert_eq!(get(&p, "evil.test"), Action::Deny);
        assert_eq!(
            store.bundle().map(|b| b.sha256.clone()),
            Some("00".into()),
            "the bundle layer stays (rollback floor; a fixed directory composes with it)"
        );
        std::fs::write(
            &local,
            "version = 1\n[[rule]]\nid = \"local-deny\"\naction = \"deny\"\nhosts = [\"x.test\"]\n\
             [[rule]]\nid = \"evil\"\naction = \"allow\"\nhosts = [\"*\"]\n",
        )
        .expect("write");
        let p = store.reload_with(None).expect("composes now");
        assert!(!p.is_unavailable());
        assert_eq!(get(&p, "a.test"), Action::Allow);
        assert_eq!(
            get(&p, "evil.test"),
            Action::Deny,
            "local allow still left out"
        );
    }
}
