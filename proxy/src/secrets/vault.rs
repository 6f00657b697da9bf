//! The daemon's secrets at run time: a store, the set loaded from it (swapped atomically on
//! every change), and when each secret was last used. Changes go through here so the set
//! and the store never disagree for longer than one write.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;
use serde::Serialize;

use super::set::SecretSet;
use super::store::{SecretStore, StoreError};
use super::value::{SecretName, SecretValue};

/// One secret as `ctl secrets list` shows it. Never a value.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct SecretStatus {
    pub name: String,
    pub placeholder: String,
    pub updated: Option<String>,
    /// Since the daemon started.
    pub last_used: Option<String>,
    pub uses: u64,
}

#[derive(Default, Clone)]
struct Usage {
    last_used: Option<String>,
    uses: u64,
}

pub(crate) struct Vault {
    store: Arc<dyn SecretStore>,
    set: ArcSwap<SecretSet>,
    updated: Mutex<HashMap<String, Option<String>>>,
    usage: Mutex<HashMap<Arc<str>, Usage>>,
    /// One change at a time, so the set swapped in matches the store.
    writes: tokio::sync::Mutex<()>,
}

impl Vault {
    /// Loads every secret. A value the store holds but cannot vouch for (bad mode, invalid
    /// bytes) fails the whole load: better not to start than to run without a secret.
    pub(crate) async fn open(store: Arc<dyn SecretStore>) -> Result<Vault, StoreError> {
        let vault = Vault {
            store,
            set: ArcSwap::from_pointee(SecretSet::default()),
            updated: Mutex::new(HashMap::new()),
            usage: Mutex::new(HashMap::new()),
            writes: tokio::sync::Mutex::new(()),
        };
        vault.reload().await?;
        Ok(vault)
    }

    /// Re-reads the store and swaps the set in.
    pub(crate) async fn reload(&self) -> Result<usize, StoreError> {
        let listed = self.store.list().await?;
        let mut entries = Vec::with_capacity(listed.len());
        let mut updated = HashMap::new();
        for s in listed {
            if let Some(v) = self.store.get(&s.name).await? {
                entries.push((s.name.clone(), Arc::new(v)));
                updated.insert(s.name.to_string(), s.updated);
            }
        }
        let n = entries.len();
        let set = SecretSet::new(entries).map_err(StoreError::Backend)?;
        self.set.store(Arc::new(set));
        if let Ok(mut u) = self.updated.lock() {
            *u = updated;
        }
        Ok(n)
    }

    pub(crate) fn describe(&self) -> String {
        self.store.describe()
    }

    /// The secrets in force now; a request keeps the set it started with.
    pub(crate) fn current(&self) -> Arc<SecretSet> {
        self.set.load_full()
    }

    pub(crate) fn contains(&self, name: &str) -> bool {
        self.set.load().get(name).is_some()
    }

    /// Creates or replaces a secret: durable in the store, then in force. Only this entry of
    /// the set in force changes (the others are not read again), so what was stored is what
    /// is used, even if another entry of the store has become unreadable.
    pub(crate) async fn put(
        &self,
        name: &SecretName,
        value: SecretValue,
    ) -> Result<(), StoreError> {
        let _one = self.writes.lock().await;
        // Built first: a set that cannot be built leaves store and memory as they were.
        let next = self
            .current()
            .with(name, Arc::new(value))
            .map_err(StoreError::Backend)?;
        let value = &next.get(name.as_str()).expect("just added").value;
        self.store.put(name, value).await?;
        self.set.store(Arc::new(next));
        if let Ok(mut u) = self.updated.lock() {
            u.insert(name.to_string(), Some(crate::clock::now_rfc3339()));
        }
        Ok(())
    }

    /// Removes a secret; `false` if there was none.
    pub(crate) async fn remove(&self, name: &SecretName) -> Result<bool, StoreError> {
        let _one = self.writes.lock().await;
        let next = self.current().without(name).map_err(StoreError::Backend)?;
        let removed = self.store.remove(name).await?;
        self.set.store(Arc::new(next));
        if let Ok(mut u) = self.updated.lock() {
            u.remove(name.as_str());
        }
        if let Ok(mut u) = self.usage.lock() {
            u.remove(name.as_str());
        }
        Ok(removed)
    }

    /// Notes that a request carried these secrets upstream.
    pub(crate) fn record_use(&self, names: &[Arc<str>]) {
        if names.is_empty() {
            return;
        }
        let now = crate::clock::now_rfc3339();
        if let Ok(mut u) = self.usage.lock() {
            for n in names {
                let e = u.entry(n.clone()).or_default();
                e.last_used = Some(now.clone());
                e.uses += 1;
            }
        }
    }

    pub(crate) fn list(&self) -> Vec<SecretStatus> {
        let set = self.current();
        let updated = self.updated.lock().map(|u| u.clone()).unwrap_or_default();
        let usage = self.usage.lock().map(|u| u.clone()).unwrap_or_default();
        set.iter()
            .map(|s| {
                let u = usage.get(s.name.as_str()).cloned().unwrap_or_default();
                SecretStatus {
                    name: s.name.to_string(),
                    placeholder: s.placeholder.clone(),
                    updated: updated.get(s.name.as_str()).cloned().flatten(),
                    last_used: u.last_used,
                    uses: u.uses,
                }
            })
            .collect()
    }
}
