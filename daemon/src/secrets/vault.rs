//! The daemon's secrets at run time: a store, the set loaded from it (swapped atomically on
//! every change), when each secret was last used, and for fetched secrets (a command's
//! output, an OAuth2 token: `provider.rs`) the value in force and until when. Changes go
//! through here so the set and the store never disagree for longer than one write.
//!
//! A fetch that fails is not run again on every request that needs the secret: it backs off
//! (1 s, doubled after each failure in a row, at most 5 min), and meanwhile the requests
//! bound to that secret are refused at once (`secret_unavailable`), as are those arriving
//! while a retry is under way. Each secret has its own fetch and backoff, so one whose
//! source hangs holds up no request for another.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use serde::Serialize;

use crate::secrets::fetch::oauth::TokenClient;
use crate::secrets::fetch::provider::{ProviderSpec, SecretKind, SpecError};
use crate::secrets::fetch::FetchError;
use crate::secrets::set::{Secret, SecretSet};
use crate::secrets::store::{SecretStore, StoreError};
use crate::secrets::{Place, SecretRefusal, Violation};
use crate::secrets::{SecretName, SecretValue};

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
    /// Fetched secrets whose last fetch failed: not fetched again before then.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retry_at: Option<String>,
}

/// The wait after the first failed fetch, doubled after each failure in a row…
const BACKOFF_FIRST: Duration = Duration::from_secs(1);
/// …up to this.
const BACKOFF_MAX: Duration = Duration::from_secs(5 * 60);

/// A fetched secret: how, and the state of the value in force.
struct Provider {
    name: SecretName,
    spec: ProviderSpec,
    /// One fetch at a time; requests that need the value meanwhile wait for it (unless it is
    /// a retry after a failure: they are refused at once).
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
    /// Failures in a row since the last good fetch.
    failures: u32,
    /// After a failure: no fetch before then.
    retry_at: Option<tokio::time::Instant>,
    retry_text: Option<String>,
}

#[derive(Default, Clone)]
struct Usage {
    last_used: Option<String>,
    uses: u64,
}

pub struct Vault {
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
    /// Values redacted beside the store's (the upstream proxy's credentials).
    reserved: Arc<[Secret]>,
}

impl Vault {
    /// Loads every secret. A value the store holds but cannot vouch for (bad mode, invalid
    /// bytes) fails the whole load: better not to start than to run without a secret.
    #[cfg(test)]
    pub(crate) async fn open(store: Arc<dyn SecretStore>) -> Result<Vault, StoreError> {
        Vault::open_with(store, Vec::new()).await
    }

    /// As `open`, with `reserved` values redacted beside the store's: text the daemon holds
    /// that must never reach the agent or a log (the upstream proxy's credentials). They are
    /// no secret of the store: no rule binds them and no placeholder of theirs is swapped.
    pub async fn open_with(
        store: Arc<dyn SecretStore>,
        reserved: Vec<(SecretName, Arc<SecretValue>)>,
    ) -> Result<Vault, StoreError> {
        let reserved: Arc<[Secret]> = reserved
            .into_iter()
            .map(|(n, v)| Secret::new(n, v))
            .collect();
        let vault = Vault {
            reserved,
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
                            why: why.to_string(),
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
        let set = SecretSet::with_reserved(entries, self.reserved.clone())
            .map_err(|e| StoreError::Backend(e.to_string()))?;
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

    pub(crate) fn location(&self) -> crate::secrets::store::StoreLocation {
        self.store.location()
    }

    /// The secrets in force now; a request keeps the set it started with.
    pub fn current(&self) -> Arc<SecretSet> {
        self.set.load_full()
    }

    pub fn contains(&self, name: &str) -> bool {
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
            .map_err(|e| StoreError::Backend(e.to_string()))?;
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
        let next = self
            .current()
            .without(name)
            .map_err(|e| StoreError::Backend(e.to_string()))?;
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
                    error: f.error.map(|e| match &f.retry_text {
                        Some(at) => format!(
                            "{e} ({} failure(s) in a row; not fetched again before {at})",
                            f.failures
                        ),
                        None => e,
                    }),
                    retry_at: f.retry_text,
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
            .map_err(|e| ProviderError::Store(StoreError::Backend(e.to_string())))?;
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
    /// others needing it wait). `Err`: one could not be fetched; the request is refused: at
    /// once while its fetch backs off after a failure, or while a retry is under way.
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
            if p.backing_off() {
                return Err(unavailable(name, p));
            }
            let _one = match p.fetching.try_lock() {
                Ok(one) => one,
                // A retry after a failure is under way: its answer is the backoff's.
                Err(_) if p.failing() => return Err(unavailable(name, p)),
                Err(_) => p.fetching.lock().await,
            };
            if p.valid_now() {
                continue; // fetched while we waited
            }
            if p.backing_off() {
                return Err(unavailable(name, p)); // failed while we waited
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
                    tracing::info!(secret = %name, kind = p.spec.kind().as_str(), "secret fetched");
                }
                Err(e) => {
                    let e = self.current().redact(&e.to_string()).into_owned();
                    let wait = p.failed();
                    tracing::error!(secret = %name, kind = p.spec.kind().as_str(), "fetching the secret failed (not tried again for {}): {e}", humantime::format_duration(wait));
                    return Err(unavailable(name, p));
                }
            }
        }
        Ok(())
    }

    /// Fetches a value and how long it is good for; the failure is noted on the provider.
    async fn fetch(&self, p: &Provider) -> Result<(SecretValue, std::time::Duration), FetchError> {
        let got = match &p.spec {
            ProviderSpec::Command { command, .. } => {
                crate::secrets::fetch::command::run(command, p.spec.timeout())
                    .await
                    .map(|v| (v, p.spec.ttl()))
                    .map_err(FetchError::Command)
            }
            ProviderSpec::Oauth2 { .. } => match self.token_client.get() {
                Some(client) => crate::secrets::fetch::oauth::fetch(&p.spec, client.as_ref())
                    .await
                    .map_err(FetchError::Token),
                None => Err(FetchError::NoTokenClient),
            },
        };
        if let Ok(mut st) = p.state.lock() {
            st.fetches += 1;
            st.error = got.as_ref().err().map(ToString::to_string);
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
    Invalid(SpecError),
    #[error("fetching it failed: {0}")]
    Fetch(FetchError),
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
            s.failures = 0;
            s.retry_at = None;
            s.retry_text = None;
        }
    }

    /// A fetch failed: no other before the backoff has passed (returned).
    fn failed(&self) -> Duration {
        let Ok(mut s) = self.state.lock() else {
            return BACKOFF_FIRST;
        };
        s.failures = s.failures.saturating_add(1);
        let wait = backoff(s.failures);
        s.retry_at = Some(tokio::time::Instant::now() + wait);
        s.retry_text = Some(crate::clock::rfc3339_after(wait));
        wait
    }

    /// The last fetch failed and its backoff has not passed.
    fn backing_off(&self) -> bool {
        self.state
            .lock()
            .ok()
            .and_then(|s| s.retry_at)
            .is_some_and(|t| tokio::time::Instant::now() < t)
    }

    /// The last fetch failed (backing off or not).
    fn failing(&self) -> bool {
        self.state.lock().is_ok_and(|s| s.failures > 0)
    }

    fn snapshot(&self) -> FetchState {
        self.state.lock().map(|s| s.clone()).unwrap_or_default()
    }
}

/// The wait after `failures` failed fetches in a row: 1 s, 2 s, 4 s, … at most 5 min.
fn backoff(failures: u32) -> Duration {
    let doublings = failures.saturating_sub(1).min(16);
    BACKOFF_FIRST
        .saturating_mul(1 << doublings)
        .min(BACKOFF_MAX)
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
    SecretRefusal {
        violation: Violation::Unfetched,
        secret: name.to_string(),
        place: Place::Fetch(p.spec.kind()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::secrets::store::file::FileStore;

    #[test]
    fn the_backoff_doubles_from_a_second_to_five_minutes() {
        let secs: Vec<u64> = [1, 2, 3, 4, 9, 10, 40, u32::MAX]
            .iter()
            .map(|f| backoff(*f).as_secs())
            .collect();
        assert_eq!(secs, [1, 2, 4, 8, 256, 300, 300, 300]);
    }

    /// A vault with command secrets `s` (its script: `scratch/s.sh`) and `t`, each fetched
    /// once already; the scripts count their runs in `scratch/NAME.runs`.
    async fn vault(scratch: &std::path::Path) -> Vault {
        let store = FileStore::open(&scratch.join("vault")).expect("store");
        let vault = Vault::open(Arc::new(store)).await.expect("vault");
        for name in ["s", "t"] {
            let d = scratch.display();
            let script = format!(
                "echo run >> {d}/{name}.runs\n\
                 if [ -e {d}/{name}.hang ]; then sleep 30; fi\n\
                 if [ -e {d}/{name}.fail ]; then echo broken >&2; exit 1; fi\n\
                 printf 'tok_{name}_value_0001'"
            );
            let spec = ProviderSpec::Command {
                command: script,
                ttl_secs: 1,
                timeout_secs: 1,
            };
            let name = SecretName::new(name).expect("name");
            vault.put_provider(&name, spec).await.expect("first fetch");
        }
        vault
    }

    fn runs(scratch: &std::path::Path, name: &str) -> usize {
        std::fs::read_to_string(scratch.join(format!("{name}.runs")))
            .unwrap_or_default()
            .lines()
            .count()
    }

    fn names(n: &[&str]) -> Vec<Arc<str>> {
        n.iter().map(|s| Arc::from(*s)).collect()
    }

    /// A failing source is run again only when its backoff has passed, however many requests
    /// need it meanwhile; they are refused at once, and `secrets list` says when it is
    /// tried again. A good fetch ends the backoff.
    #[tokio::test]
    async fn a_failing_fetch_backs_off_and_the_requests_meanwhile_are_refused_at_once() {
        let dir = tempfile::tempdir().expect("tempdir");
        let scratch = dir.path();
        let v = vault(scratch).await;
        std::fs::write(scratch.join("s.fail"), "").expect("switch");
        tokio::time::sleep(Duration::from_millis(1100)).await; // the TTL passes
        let started = Instant::now();
        let mut refused = 0;
        // 2.5 s of requests every 10 ms: runs at 0 s, 1 s and 3 s would be due; two fit.
        while started.elapsed() < Duration::from_millis(2500) {
            let t = Instant::now();
            if v.fresh(&names(&["s"])).await.is_err() {
                refused += 1;
            }
            assert!(t.elapsed() < Duration::from_millis(500), "answered at once");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(refused > 100, "{refused}");
        assert_eq!(
            runs(scratch, "s"),
            1 + 2,
            "the first fetch, then one per backoff"
        );
        let listed = v.list().into_iter().find(|s| s.name == "s").expect("s");
        assert!(listed.retry_at.is_some(), "{listed:?}");
        let error = listed.error.expect("an error");
        assert!(
            error.contains("broken") && error.contains("2 failure(s) in a row"),
            "{error}"
        );
        // The source works again: the next fetch after the backoff succeeds and ends it.
        std::fs::remove_file(scratch.join("s.fail")).expect("switch");
        tokio::time::sleep(Duration::from_millis(2100)).await;
        v.fresh(&names(&["s"])).await.expect("fetched");
        let listed = v.list().into_iter().find(|s| s.name == "s").expect("s");
        assert_eq!((listed.retry_at, listed.error), (None, None));
    }

    /// A source that hangs holds up the requests that need it for one timeout at most (then
    /// its backoff answers), and never a request for another secret; a request arriving
    /// while a retry hangs is refused at once.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_hanging_fetch_holds_up_no_other_secret_and_no_request_past_one_timeout() {
        let dir = tempfile::tempdir().expect("tempdir");
        let scratch = dir.path();
        let v = Arc::new(vault(scratch).await);
        std::fs::write(scratch.join("s.hang"), "").expect("switch");
        tokio::time::sleep(Duration::from_millis(1100)).await;
        let t0 = Instant::now();
        let waiting: Vec<_> = (0..10)
            .map(|_| {
                let v = v.clone();
                tokio::spawn(async move {
                    let r = v.fresh(&names(&["s"])).await;
                    (r.is_ok(), Instant::now())
                })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(200)).await;
        let t = Instant::now();
        v.fresh(&names(&["t"]))
            .await
            .expect("t is fetched meanwhile");
        assert!(
            t.elapsed() < Duration::from_millis(900),
            "{:?}",
            t.elapsed()
        );
        for w in waiting {
            let (ok, at) = w.await.expect("task");
            assert!(!ok);
            assert!(at - t0 < Duration::from_millis(2500), "{:?}", at - t0);
        }
        assert_eq!(runs(scratch, "s"), 2, "one run for all ten");
        // After the backoff a retry starts and hangs; meanwhile others are refused at once.
        tokio::time::sleep(Duration::from_millis(1000)).await;
        let retry = {
            let v = v.clone();
            tokio::spawn(async move { v.fresh(&names(&["s"])).await.is_err() })
        };
        tokio::time::sleep(Duration::from_millis(200)).await;
        let t = Instant::now();
        assert!(v.fresh(&names(&["s"])).await.is_err());
        assert!(
            t.elapsed() < Duration::from_millis(300),
            "{:?}",
            t.elapsed()
        );
        assert!(retry.await.expect("task"));
        assert_eq!(runs(scratch, "s"), 3);
    }
}
