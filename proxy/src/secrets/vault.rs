//! The daemon's secrets at run time: a store, the set loaded from it (swapped atomically on
//! every change), when each secret was last used, and for fetched secrets (a command's
//! output, an OAuth2 token: `provider.rs`) the value in force and until when. Changes go
//! through here so the set and the store never disagree for longer than one write.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use arc_swap::ArcSwap;
use serde::Serialize;

use super::oauth::TokenClient;
use super::provider::{ProviderSpec, SecretKind};
use super::scan::{SecretRefusal, Violation};
use super::set::SecretSet;
use super::store::{SecretStore, StoreError};
use super::value::{SecretName, SecretValue};

/// One secret as `ctl secrets list` shows it. Never a value.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct SecretStatus {
    pub name: String,
    pub kind: SecretKind,
    pub placeholder: String,
    pub updated: Option<String>,
    /// Since the daemon started.
    pub last_used: Option<String>,
    pub uses: u64,
    /// Fetched secrets: where the value comes from (the command, or the token URL and
    /// client id).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// Fetched secrets: when the value in force was fetched, and until when it is used.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fetched: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expires: Option<String>,
    /// Fetched secrets: times fetched since the daemon started, and the last failure.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fetches: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// A fetched secret: how, and the state of the value in force.
struct Provider {
    name: SecretName,
    spec: ProviderSpec,
    /// One fetch at a time; requests that need the value meanwhile wait for it.
    fetching: tokio::sync::Mutex<()>,
    state: Mutex<FetchState>,
}

#[derive(Default, Clone)]
struct FetchState {
    /// The value in the set is good until then; `None`: never fetched.
    valid_until: Option<Instant>,
    fetched: Option<String>,
    expires: Option<String>,
    fetches: u64,
    error: Option<String>,
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
    /// Fetched secrets, by name.
    providers: ArcSwap<HashMap<Arc<str>, Arc<Provider>>>,
    /// Fetches OAuth2 tokens (the daemon's own verified upstream client).
    token_client: OnceLock<Arc<dyn TokenClient>>,
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
            providers: ArcSwap::default(),
            token_client: OnceLock::new(),
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
        let mut providers = HashMap::new();
        for s in listed {
            if let Some(v) = self.store.get(&s.name).await? {
                let v = match ProviderSpec::from_stored(&v) {
                    Err(why) => {
                        return Err(StoreError::BadValue {
                            name: s.name.to_string(),
                            why,
                        })
                    }
                    Ok(None) => v,
                    Ok(Some(spec)) => {
                        providers.insert(
                            s.name.shared(),
                            Arc::new(Provider::new(s.name.clone(), spec)),
                        );
                        unfetched()
                    }
                };
                entries.push((s.name.clone(), Arc::new(v)));
                updated.insert(s.name.to_string(), s.updated);
            }
        }
        let n = entries.len();
        let set = SecretSet::new(entries).map_err(StoreError::Backend)?;
        self.set.store(Arc::new(set));
        self.providers.store(Arc::new(providers));
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
        self.set_provider(name, None);
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
        self.set_provider(name, None);
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
        let providers = self.providers.load();
        set.iter()
            .map(|s| {
                let u = usage.get(s.name.as_str()).cloned().unwrap_or_default();
                let p = providers.get(s.name.as_str());
                let f = p.map(|p| p.snapshot()).unwrap_or_default();
                SecretStatus {
                    name: s.name.to_string(),
                    kind: p.map_or(SecretKind::Static, |p| p.spec.kind()),
                    placeholder: s.placeholder.clone(),
                    updated: updated.get(s.name.as_str()).cloned().flatten(),
                    last_used: u.last_used,
                    uses: u.uses,
                    source: p.map(|p| set.redact(&p.spec.source()).into_owned()),
                    fetched: f.fetched,
                    expires: f.expires,
                    fetches: p.map(|_| f.fetches),
                    error: f.error,
                }
            })
            .collect()
    }

    /// Stores a fetched secret's definition, having fetched it once (so a definition that
    /// does not work is refused, with why, rather than stored); the value fetched is in
    /// force at once.
    pub(crate) async fn put_provider(
        &self,
        name: &SecretName,
        spec: ProviderSpec,
    ) -> Result<(), ProviderError> {
        spec.validate().map_err(ProviderError::Invalid)?;
        let stored = spec.to_stored().map_err(ProviderError::Invalid)?;
        let provider = Arc::new(Provider::new(name.clone(), spec));
        let (value, valid) = self.fetch(&provider).await.map_err(ProviderError::Fetch)?;
        let _one = self.writes.lock().await;
        let next = self
            .current()
            .with(name, Arc::new(value))
            .map_err(|e| ProviderError::Store(StoreError::Backend(e)))?;
        self.store
            .put(name, &stored)
            .await
            .map_err(ProviderError::Store)?;
        self.set.store(Arc::new(next));
        provider.fetched(valid);
        self.set_provider(name, Some(provider));
        if let Ok(mut u) = self.updated.lock() {
            u.insert(name.to_string(), Some(crate::clock::now_rfc3339()));
        }
        Ok(())
    }

    /// Where OAuth2 tokens are fetched from (set once, when the daemon's upstream client
    /// exists).
    pub(crate) fn set_token_client(&self, client: Arc<dyn TokenClient>) {
        let _ = self.token_client.set(client);
    }

    /// Makes sure every fetched secret among `names` has a value in force, fetching those
    /// that have none or whose time to live has passed (one fetch per secret at a time;
    /// others needing it wait). `Err`: one could not be fetched; the request is refused.
    pub(crate) async fn fresh(&self, names: &[Arc<str>]) -> Result<(), SecretRefusal> {
        let providers = self.providers.load();
        if providers.is_empty() {
            return Ok(());
        }
        for p in names.iter().filter_map(|n| providers.get(n)) {
            let name = p.name.as_str();
            if p.valid_now() {
                continue;
            }
            let _one = p.fetching.lock().await;
            if p.valid_now() {
                continue; // fetched while we waited
            }
            match self.fetch(p).await {
                Ok((value, valid)) => {
                    let _w = self.writes.lock().await;
                    match self.current().with(&p.name, Arc::new(value)) {
                        Ok(next) => self.set.store(Arc::new(next)),
                        Err(e) => {
                            tracing::error!(secret = %name, "the fetched value cannot be used: {e}");
                            return Err(unavailable(name, p));
                        }
                    }
                    p.fetched(valid);
                    tracing::info!(secret = %name, kind = ?p.spec.kind(), "secret fetched");
                }
                Err(e) => {
                    let e = self.current().redact(&e).into_owned();
                    tracing::error!(secret = %name, kind = ?p.spec.kind(), "fetching the secret failed: {e}");
                    return Err(unavailable(name, p));
                }
            }
        }
        Ok(())
    }

    /// Fetches a value and how long it is good for; the failure is noted on the provider.
    async fn fetch(&self, p: &Provider) -> Result<(SecretValue, std::time::Duration), String> {
        let got = match &p.spec {
            ProviderSpec::Command { command, .. } => super::command::run(command, p.spec.timeout())
                .await
                .map(|v| (v, p.spec.ttl()))
                .map_err(|e| e.to_string()),
            ProviderSpec::Oauth2 { .. } => match self.token_client.get() {
                Some(client) => super::oauth::fetch(&p.spec, client.as_ref()).await,
                None => Err("no upstream client to fetch the token with".into()),
            },
        };
        if let Ok(mut st) = p.state.lock() {
            st.fetches += 1;
            st.error = got.as_ref().err().cloned();
        }
        got
    }

    fn set_provider(&self, name: &SecretName, provider: Option<Arc<Provider>>) {
        let mut next = HashMap::clone(&self.providers.load());
        match provider {
            Some(p) => next.insert(name.shared(), p),
            None => next.remove(name.as_str()),
        };
        self.providers.store(Arc::new(next));
    }
}

/// Why a fetched secret could not be set.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ProviderError {
    #[error("{0}")]
    Invalid(String),
    #[error("fetching it failed: {0}")]
    Fetch(String),
    #[error("{0}")]
    Store(StoreError),
}

impl Provider {
    fn new(name: SecretName, spec: ProviderSpec) -> Provider {
        Provider {
            name,
            spec,
            fetching: tokio::sync::Mutex::new(()),
            state: Mutex::new(FetchState::default()),
        }
    }

    fn valid_now(&self) -> bool {
        self.state
            .lock()
            .ok()
            .and_then(|s| s.valid_until)
            .is_some_and(|t| Instant::now() < t)
    }

    fn fetched(&self, valid: std::time::Duration) {
        if let Ok(mut s) = self.state.lock() {
            s.valid_until = Some(Instant::now() + valid);
            s.fetched = Some(crate::clock::now_rfc3339());
            s.expires = Some(crate::clock::rfc3339_after(valid));
            s.error = None;
        }
    }

    fn snapshot(&self) -> FetchState {
        self.state.lock().map(|s| s.clone()).unwrap_or_default()
    }
}

/// A stand-in value for a fetched secret not fetched yet: its name is known (a rule may bind
/// it, its placeholder is recognised), and this is never sent anywhere (a request that needs
/// the secret fetches it first, or is refused).
fn unfetched() -> SecretValue {
    let nonce: u128 = rand::random();
    SecretValue::new(format!("agenshield-unfetched-{nonce:032x}").into_bytes())
        .expect("a valid stand-in")
}

/// The agent's refusal: which source failed, not why (that is in the daemon's log and `ctl
/// secrets list`, for the operator).
fn unavailable(name: &str, p: &Provider) -> SecretRefusal {
    let source = match p.spec.kind() {
        SecretKind::Command => "its command failed",
        SecretKind::Oauth2 => "its token endpoint did not give a token",
        SecretKind::Static => "it could not be read",
    };
    SecretRefusal {
        violation: Violation::Unfetched,
        secret: name.to_string(),
        place: source.to_string(),
    }
}
