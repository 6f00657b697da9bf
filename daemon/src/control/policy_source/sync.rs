//! The policy source at work: the cached bundle at start, then a sync every interval (with
//! jitter, so a fleet does not knock at once): fetch, verify, parse, refuse a rollback,
//! apply through the reload path, cache, record. See the module's text for the guarantees.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sha2::{Digest, Sha256};

use super::bundle::{Bundle, BundleError};
use super::cache::{Cache, CacheError, Cached};
use super::fetch::{FetchError, Fetched, Fetcher};
use super::metrics::{SourceMetrics, SyncFailureReason};
use super::signature::{BundleKey, SignatureError};
use crate::audit::{BundleOrigin, BundleOutcome, BundleRefusal, Entry, PolicyEntry, ReloadTrigger};
use crate::clock::now_rfc3339;
use crate::config::PolicySourceConfig;
use crate::control::reload;
use crate::policy::{BundleLayer, SyncFailure};
use crate::proxy::Proxy;
use crate::upstream::trust::UpstreamTrust;

/// Why the source cannot be set up at start (a bad key, an exposed cache directory).
#[derive(Debug, thiserror::Error)]
pub(crate) enum SourceError {
    #[error(transparent)]
    Key(#[from] SignatureError),
    #[error(transparent)]
    Cache(#[from] CacheError),
    #[error("policy.source: trust roots: {0}")]
    Trust(String),
}

/// A bundle refused: why, and what could be read of it.
#[derive(Debug)]
struct Refused {
    reason: BundleRefusal,
    message: String,
    revision: Option<u64>,
    hash: Option<String>,
}

/// A verified, parsed bundle and its bytes.
struct Checked {
    layer: Arc<BundleLayer>,
    bundle: Vec<u8>,
    signature: Vec<u8>,
}

#[derive(Default)]
struct SyncState {
    /// The ETag to ask with: the bundle in force's (or an oversized one's, so it is not
    /// fetched again until it changes).
    etag: Option<String>,
    /// SHA-256 of the last refused bundle and of its signature: served again unchanged, it
    /// is not refused (and recorded) again.
    last_refused: Option<(String, String)>,
}

pub(crate) struct PolicySource {
    cfg: PolicySourceConfig,
    key: BundleKey,
    fetcher: Fetcher,
    cache: Cache,
    state: Mutex<SyncState>,
}

/// What start-up hands from building the state to serving: the source, and the outcome of
/// its cache (recorded once the audit log has its start line).
pub(crate) struct SourceStart {
    pub(crate) source: PolicySource,
    cache_outcome: Option<(BundleOutcome, Option<Refused>, Option<Arc<BundleLayer>>)>,
}

impl PolicySource {
    /// Reads the key and sets up the fetcher. `extra_ca`: `upstream.extra_ca`, trusted when
    /// `policy.source.ca` is not set.
    pub(crate) fn open(
        cfg: &PolicySourceConfig,
        extra_ca: &[PathBuf],
    ) -> Result<PolicySource, SourceError> {
        let key = BundleKey::load(&cfg.public_key)?;
        let roots = match &cfg.ca {
            Some(ca) => UpstreamTrust::load(std::slice::from_ref(ca)),
            None => UpstreamTrust::load(extra_ca),
        }
        .map_err(|e| SourceError::Trust(e.to_string()))?;
        let tls = roots
            .client_config()
            .map_err(|e| SourceError::Trust(e.to_string()))?;
        Ok(PolicySource {
            fetcher: Fetcher::new(cfg.url.clone(), tls, cfg.max_size, cfg.timeout),
            cache: Cache::new(&cfg.cache),
            key,
            cfg: cfg.clone(),
            state: Mutex::new(SyncState::default()),
        })
    }

    /// The cached bundle, verified again, as the first bundle layer (`None`: no cache, or
    /// one that does not verify, which is then recorded as refused).
    pub(crate) fn start(self) -> Result<SourceStart, SourceError> {
        let cached = self.cache.load()?;
        let Some(Cached {
            bundle,
            signature,
            etag,
        }) = cached
        else {
            return Ok(SourceStart {
                source: self,
                cache_outcome: None,
            });
        };
        let outcome = match self.check(bundle, signature, None) {
            Ok(c) => {
                self.lock().etag = etag;
                (BundleOutcome::Applied, None, Some(c.layer))
            }
            Err(r) => {
                tracing::error!(
                    cache = %self.cache.dir().display(),
                    "the cached policy bundle is refused ({}): {}",
                    r.reason.as_str(),
                    r.message
                );
                (BundleOutcome::Refused, Some(r), None)
            }
        };
        Ok(SourceStart {
            source: self,
            cache_outcome: Some(outcome),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, SyncState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Signature, then content, then (against `current`) the revision.
    fn check(
        &self,
        bundle: Vec<u8>,
        signature: Vec<u8>,
        current: Option<&BundleLayer>,
    ) -> Result<Checked, Refused> {
        let hash = hex(&Sha256::digest(&bundle));
        let refused = |reason, message: String, revision| Refused {
            reason,
            message,
            revision,
            hash: Some(hash.clone()),
        };
        self.key
            .verify(&bundle, &signature)
            .map_err(|e| refused(BundleRefusal::Signature, e.to_string(), None))?;
        let parsed = Bundle::read(&bundle, self.cfg.max_size.saturating_mul(4)).map_err(|e| {
            let reason = match e {
                BundleError::TooLarge(_) => BundleRefusal::TooLarge,
                _ => BundleRefusal::Malformed,
            };
            refused(reason, e.to_string(), None)
        })?;
        let revision = parsed.manifest.revision;
        if let Some(cur) = current {
            if revision < cur.revision || (revision == cur.revision && hash != cur.sha256) {
                return Err(refused(
                    BundleRefusal::Rollback,
                    format!(
                        "revision {revision} does not follow revision {} in force",
                        cur.revision
                    ),
                    Some(revision),
                ));
            }
        }
        let layer = BundleLayer {
            sources: parsed.sources(),
            local: parsed.manifest.local,
            revision,
            sha256: hash,
            created_at: parsed.manifest.created_at.clone(),
        };
        Ok(Checked {
            layer: Arc::new(layer),
            bundle,
            signature,
        })
    }

    /// One sync with the source.
    async fn sync(&self, proxy: &Proxy, m: &SourceMetrics) {
        let etag = self.lock().etag.clone();
        let (bundle, signature, etag) = match self.fetcher.fetch(etag.as_deref()).await {
            Ok(Fetched::NotModified) => return self.synced(proxy, m),
            Ok(Fetched::New {
                bundle,
                signature,
                etag,
            }) => (bundle, signature, etag),
            Err(FetchError::Unreachable(why)) => {
                tracing::warn!(url = %self.cfg.url, "policy source: {why}; the policy in force stays");
                return self.failed(proxy, m, SyncFailureReason::Fetch, why);
            }
            Err(e @ FetchError::TooLarge { .. }) => {
                let message = e.to_string();
                if let FetchError::TooLarge { etag, .. } = e {
                    self.lock().etag = etag;
                }
                let r = Refused {
                    reason: BundleRefusal::TooLarge,
                    message,
                    revision: None,
                    hash: None,
                };
                return self.refuse(proxy, m, r, BundleOrigin::Source);
            }
        };
        let current = proxy.policies.bundle();
        let hash = hex(&Sha256::digest(&bundle));
        if current.as_ref().is_some_and(|c| c.sha256 == hash) {
            // The bundle in force, under another ETag (a file touched, a server moved).
            if let Err(e) = self.cache.store_etag(etag.as_deref()) {
                tracing::warn!("policy source: {e}");
            }
            self.lock().etag = etag;
            return self.synced(proxy, m);
        }
        let seen = (hash, hex(&Sha256::digest(&signature)));
        if self.lock().last_refused.as_ref() == Some(&seen) {
            return;
        }
        let checked = match self.check(bundle, signature, current.as_deref()) {
            Ok(c) => c,
            Err(r) => {
                self.lock().last_refused = Some(seen);
                return self.refuse(proxy, m, r, BundleOrigin::Source);
            }
        };
        let layer = checked.layer.clone();
        let trigger = ReloadTrigger::PolicyBundle(layer.revision);
        if let Err(e) = reload::apply(proxy, trigger, Some(layer.clone())) {
            self.lock().last_refused = Some(seen);
            let r = Refused {
                reason: BundleRefusal::InvalidPolicy,
                message: e.to_string(),
                revision: Some(layer.revision),
                hash: Some(layer.sha256.clone()),
            };
            return self.refuse(proxy, m, r, BundleOrigin::Source);
        }
        if let Err(e) = self
            .cache
            .store(&checked.bundle, &checked.signature, etag.as_deref())
        {
            tracing::error!("policy source: the bundle is in force but not cached: {e}");
        }
        {
            let mut st = self.lock();
            st.etag = etag;
            st.last_refused = None;
        }
        tracing::info!(
            revision = layer.revision,
            sha256 = %layer.sha256,
            local = %layer.local,
            "policy bundle applied"
        );
        self.applied(proxy, m, &layer, BundleOrigin::Source);
        self.synced(proxy, m);
    }

    fn synced(&self, proxy: &Proxy, m: &SourceMetrics) {
        m.synced();
        proxy
            .policies
            .update_source(|s| s.last_sync = Some(now_rfc3339()));
    }

    fn failed(&self, proxy: &Proxy, m: &SourceMetrics, reason: SyncFailureReason, why: String) {
        m.failed(reason);
        proxy.policies.update_source(|s| {
            s.last_error = Some(SyncFailure {
                at: now_rfc3339(),
                reason: reason.as_str(),
                message: why,
            })
        });
    }

    fn refuse(&self, proxy: &Proxy, m: &SourceMetrics, r: Refused, origin: BundleOrigin) {
        tracing::error!(
            url = %self.cfg.url,
            reason = r.reason.as_str(),
            revision = r.revision,
            "policy bundle refused, the policy in force stays: {}",
            r.message
        );
        let message = r.message.clone();
        self.failed(proxy, m, SyncFailureReason::Refused(r.reason), message);
        self.record(
            proxy,
            PolicyEntry {
                outcome: BundleOutcome::Refused,
                reason: Some(r.reason),
                revision: r.revision,
                sha256: r.hash,
                origin,
                url: self.cfg.url.to_string(),
                policy: proxy.policy().hash().to_string(),
                error: Some(r.message),
            },
        );
    }

    fn applied(&self, proxy: &Proxy, m: &SourceMetrics, layer: &BundleLayer, origin: BundleOrigin) {
        m.in_force(layer.revision, &layer.sha256);
        proxy.policies.update_source(|s| {
            s.revision = Some(layer.revision);
            s.sha256 = Some(layer.sha256.clone());
            s.local = Some(layer.local);
            s.created_at = Some(layer.created_at.clone());
            s.from = Some(match origin {
                BundleOrigin::Source => "source",
                BundleOrigin::Cache => "cache",
            });
            s.last_error = None;
        });
        self.record(
            proxy,
            PolicyEntry {
                outcome: BundleOutcome::Applied,
                reason: None,
                revision: Some(layer.revision),
                sha256: Some(layer.sha256.clone()),
                origin,
                url: self.cfg.url.to_string(),
                policy: proxy.policy().hash().to_string(),
                error: None,
            },
        );
    }

    fn record(&self, proxy: &Proxy, e: PolicyEntry) {
        if let Some(audit) = &proxy.audit {
            audit.write_detached(Entry::Policy(Box::new(e)));
        }
    }

    /// The next wait: the interval, plus or minus up to a tenth.
    fn next_wait(&self) -> Duration {
        self.cfg.interval.mul_f64(0.9 + 0.2 * rand::random::<f64>())
    }
}

impl SourceStart {
    /// The bundle layer the store should start with.
    pub(crate) fn layer(&self) -> Option<Arc<BundleLayer>> {
        self.cache_outcome.as_ref().and_then(|(_, _, l)| l.clone())
    }

    /// The cached bundle did not compose with the local directory: recorded as refused (the
    /// store keeps its layer and refuses every request until the directory composes).
    pub(crate) fn drop_layer(&mut self, why: String) {
        if let Some((outcome, refused, layer)) = &mut self.cache_outcome {
            *refused = Some(Refused {
                reason: BundleRefusal::InvalidPolicy,
                message: why,
                revision: layer.as_ref().map(|l| l.revision),
                hash: layer.as_ref().map(|l| l.sha256.clone()),
            });
            *outcome = BundleOutcome::Refused;
            *layer = None;
        }
    }
}

/// Records the cache's outcome and runs the sync loop for the daemon's life (first sync at
/// once).
pub(crate) fn spawn(proxy: Arc<Proxy>, start: SourceStart) {
    let SourceStart {
        source,
        cache_outcome,
    } = start;
    let m = SourceMetrics::register(proxy.metrics.registry(), crate::metrics::NS);
    proxy
        .policies
        .update_source(|s| s.url = source.cfg.url.to_string());
    match cache_outcome {
        Some((BundleOutcome::Applied, _, Some(layer))) => {
            tracing::info!(
                revision = layer.revision,
                sha256 = %layer.sha256,
                "policy bundle from the cache in force"
            );
            source.applied(&proxy, &m, &layer, BundleOrigin::Cache);
        }
        Some((_, Some(r), _)) => source.refuse(&proxy, &m, r, BundleOrigin::Cache),
        _ => {}
    }
    if proxy.policy().is_unavailable() {
        tracing::warn!(
            url = %source.cfg.url,
            "no policy bundle yet (policy.source.require_first_sync): every agent request is \
             refused (policy_unavailable) until the first verified bundle arrives"
        );
    }
    tokio::spawn(async move {
        loop {
            source.sync(&proxy, &m).await;
            tokio::time::sleep(source.next_wait()).await;
        }
    });
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    bytes.iter().fold(String::with_capacity(64), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}
