//! The policy in force, and how it changes: parsed and validated completely, then swapped
//! atomically. A request keeps the policy it started with; a bad file keeps the last good
//! policy in force and is remembered for `ctl status`.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;
use serde::Serialize;

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
}

impl PolicyStore {
    pub(crate) fn load(
        dir: &Path,
        secrets: SecretCheck,
        fleet_store: bool,
    ) -> Result<PolicyStore, PolicyError> {
        let policy = Policy::load_dir(dir)?;
        policy.check_secrets(&*secrets)?;
        policy.check_fleet(fleet_store)?;
        Ok(PolicyStore {
            watch: Arc::default(),
            dir: dir.to_path_buf(),
            secrets,
            fleet_store,
            current: ArcSwap::from_pointee(policy),
            state: Mutex::new((now_rfc3339(), None)),
        })
    }

    /// The policy in force now.
    pub(crate) fn current(&self) -> Arc<Policy> {
        self.current.load_full()
    }

    /// Re-reads the directory. On success the new policy is in force for every request that
    /// starts after this returns; on failure nothing changes but the recorded error.
    pub(crate) fn reload(&self) -> Result<Arc<Policy>, PolicyError> {
        let loaded = Policy::load_dir(&self.dir).and_then(|p| {
            p.check_secrets(&*self.secrets)?;
            p.check_fleet(self.fleet_store)?;
            Ok(p)
        });
        match loaded {
            Ok(p) => {
                let p = Arc::new(p);
                self.current.store(p.clone());
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
        }
    }
}
