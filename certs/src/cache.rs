//! Single-flight cache of minted leaves, keyed by [`LeafName`].

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rustls::sign::CertifiedKey;

use crate::ca::Ca;
use crate::error::CaError;
use crate::leaf::{mint, LeafName};

/// How leaves are minted and cached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeafConfig {
    /// Lifetime of each leaf (after a 5-minute backdate). Default 24h.
    pub validity: Duration,
    /// Maximum number of cached leaves. Default 10 000.
    pub cache_capacity: u64,
    /// How long a leaf is served from cache; must be < `validity`. Default 12h.
    pub cache_ttl: Duration,
}

impl Default for LeafConfig {
    fn default() -> Self {
        LeafConfig {
            validity: Duration::from_secs(24 * 3600),
            cache_capacity: 10_000,
            cache_ttl: Duration::from_secs(12 * 3600),
        }
    }
}

/// Mints leaf certificates signed by the CA and caches them. Cheap to clone (shared state).
#[derive(Clone)]
pub struct LeafCache {
    cache: moka::future::Cache<LeafName, Arc<CertifiedKey>>,
    inner: Arc<Inner>,
}

struct Inner {
    ca: Arc<Ca>,
    validity: Duration,
    minted: AtomicU64,
    hits: AtomicU64,
    misses: AtomicU64,
}

impl std::fmt::Debug for LeafCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeafCache")
            .field("ca", &self.inner.ca)
            .field("validity", &self.inner.validity)
            .field("entries", &self.cache.entry_count())
            .field("minted", &self.minted())
            .finish_non_exhaustive()
    }
}

impl LeafCache {
    /// Creates an empty cache minting with `ca`.
    ///
    /// A `cache_ttl` that is not below `validity` would serve expired leaves, so it is
    /// replaced by `validity / 2` (with a warning).
    pub fn new(ca: Arc<Ca>, cfg: LeafConfig) -> LeafCache {
        let mut ttl = cfg.cache_ttl;
        if ttl >= cfg.validity {
            ttl = cfg.validity / 2;
            tracing::warn!(
                configured = ?cfg.cache_ttl,
                validity = ?cfg.validity,
                using = ?ttl,
                "leaf cache TTL must be shorter than leaf validity"
            );
        }
        let cache = moka::future::Cache::builder()
            .max_capacity(cfg.cache_capacity)
            .time_to_live(ttl)
            .build();
        LeafCache {
            cache,
            inner: Arc::new(Inner {
                ca,
                validity: cfg.validity,
                minted: AtomicU64::new(0),
                hits: AtomicU64::new(0),
                misses: AtomicU64::new(0),
            }),
        }
    }

    /// Returns the certified key (chain `[leaf, CA]`, P-256 signer) for `name`.
    ///
    /// Concurrent first calls for one name mint exactly once and share the result.
    /// Minting (~100 µs of ECDSA) runs inline on the calling task.
    pub async fn get(&self, name: &LeafName) -> Result<Arc<CertifiedKey>, CaError> {
        // Re-normalize: the enum is public, so a caller may have built an unparsed name.
        let owned;
        let name = match name {
            LeafName::Dns(dns) => {
                owned = LeafName::parse(dns)?;
                &owned
            }
            LeafName::Ip(_) => name,
        };
        let ran_init = AtomicBool::new(false);
        let init = async {
            ran_init.store(true, Ordering::Relaxed);
            let key = mint(&self.inner.ca, name, self.inner.validity)?;
            self.inner.minted.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(%name, "minted leaf certificate");
            Ok::<_, CaError>(Arc::new(key))
        };
        let result = self.cache.try_get_with_by_ref(name, init).await;
        // A miss is a call whose own init ran; callers coalesced onto it count as hits.
        let counter = if ran_init.load(Ordering::Relaxed) {
            &self.inner.misses
        } else {
            &self.inner.hits
        };
        counter.fetch_add(1, Ordering::Relaxed);
        result.map_err(|shared| Arc::try_unwrap(shared).unwrap_or_else(CaError::Shared))
    }

    /// How many leaves have been minted since creation.
    /// The CA the leaves are signed by.
    pub fn ca(&self) -> &Ca {
        &self.inner.ca
    }

    pub fn minted(&self) -> u64 {
        self.inner.minted.load(Ordering::Relaxed)
    }

    /// Calls to [`get`](Self::get) answered without minting (cached or coalesced).
    pub fn hits(&self) -> u64 {
        self.inner.hits.load(Ordering::Relaxed)
    }

    /// Calls to [`get`](Self::get) that ran a mint (successful or not).
    pub fn misses(&self) -> u64 {
        self.inner.misses.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use rustls::pki_types::ServerName;
    use rustls::server::{ClientHello, ResolvesServerCert};
    use rustls::{ClientConfig, ClientConnection, RootCertStore, ServerConfig, ServerConnection};
    use std::io::{Read, Write};

    fn new_cache(cfg: LeafConfig) -> (tempfile::TempDir, Arc<Ca>, LeafCache) {
        let dir = tempfile::tempdir().unwrap();
        let (ca, _) = Ca::load_or_create(dir.path()).unwrap();
        let ca = Arc::new(ca);
        let cache = LeafCache::new(ca.clone(), cfg);
        (dir, ca, cache)
    }

    #[derive(Debug)]
    struct FixedCert(Arc<CertifiedKey>);

    impl ResolvesServerCert for FixedCert {
        fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
            Some(self.0.clone())
        }
    }

    /// Shuttles TLS records between the two in-memory connections until both finish.
    fn handshake(
        client: &mut ClientConnection,
        server: &mut ServerConnection,
    ) -> Result<(), rustls::Error> {
        for _ in 0..20 {
            while client.wants_write() {
                let mut buf = Vec::new();
                client.write_tls(&mut buf).unwrap();
                server.read_tls(&mut buf.as_slice()).unwrap();
                server.process_new_packets()?;
            }
            while server.wants_write() {
                let mut buf = Vec::new();
                server.write_tls(&mut buf).unwrap();
                client.read_tls(&mut buf.as_slice()).unwrap();
                client.process_new_packets()?;
            }
            if !client.is_handshaking() && !server.is_handshaking() {
                return Ok(());
            }
        }
        panic!("handshake did not complete");
    }

    fn tls_pair(
        ca: &Ca,
        key: Arc<CertifiedKey>,
        name: &str,
    ) -> (ClientConnection, ServerConnection) {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let server_cfg = ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_cert_resolver(Arc::new(FixedCert(key)));
        let mut roots = RootCertStore::empty();
        roots.add(ca.cert_der().clone()).unwrap();
        let client_cfg = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        let server_name = ServerName::try_from(name.to_string()).unwrap();
        let client = ClientConnection::new(Arc::new(client_cfg), server_name).unwrap();
        let server = ServerConnection::new(Arc::new(server_cfg)).unwrap();
        (client, server)
    }

    #[tokio::test]
    async fn rustls_handshake_succeeds_with_cached_leaf() {
        let (_dir, ca, cache) = new_cache(LeafConfig::default());
        for name in ["api.example.test", "127.0.0.1", "::1"] {
            let key = cache.get(&LeafName::parse(name).unwrap()).await.unwrap();
            let (mut client, mut server) = tls_pair(&ca, key.clone(), name);
            handshake(&mut client, &mut server).unwrap();
            assert_eq!(client.peer_certificates().unwrap()[0], key.cert[0]);

            client.writer().write_all(b"ping").unwrap();
            let mut buf = Vec::new();
            client.write_tls(&mut buf).unwrap();
            server.read_tls(&mut buf.as_slice()).unwrap();
            server.process_new_packets().unwrap();
            let mut got = [0u8; 4];
            server.reader().read_exact(&mut got).unwrap();
            assert_eq!(&got, b"ping");
        }
    }

    #[tokio::test]
    async fn rustls_handshake_fails_for_wrong_name() {
        let (_dir, ca, cache) = new_cache(LeafConfig::default());
        let key = cache
            .get(&LeafName::parse("a.test").unwrap())
            .await
            .unwrap();
        let (mut client, mut server) = tls_pair(&ca, key, "b.test");
        let err = handshake(&mut client, &mut server).unwrap_err();
        assert!(
            matches!(
                err,
                rustls::Error::InvalidCertificate(_) | rustls::Error::AlertReceived(_)
            ),
            "{err:?}"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn concurrent_gets_mint_once() {
        let (_dir, _ca, cache) = new_cache(LeafConfig::default());
        let barrier = Arc::new(tokio::sync::Barrier::new(100));
        let tasks: Vec<_> = (0..100)
            .map(|_| {
                let (cache, barrier) = (cache.clone(), barrier.clone());
                tokio::spawn(async move {
                    barrier.wait().await;
                    cache
                        .get(&LeafName::parse("one.test").unwrap())
                        .await
                        .unwrap()
                })
            })
            .collect();
        let mut keys = Vec::new();
        for t in tasks {
            keys.push(t.await.unwrap());
        }
        assert_eq!(cache.minted(), 1);
        assert!(keys.iter().all(|k| Arc::ptr_eq(k, &keys[0])));
        assert_eq!(cache.misses(), 1);
        assert_eq!(cache.hits(), 99);

        let other = cache
            .get(&LeafName::parse("two.test").unwrap())
            .await
            .unwrap();
        assert_eq!(cache.minted(), 2);
        assert!(!Arc::ptr_eq(&other, &keys[0]));
        assert_ne!(other.cert[0], keys[0].cert[0]);
    }

    #[tokio::test]
    async fn names_are_normalized_before_lookup() {
        let (_dir, _ca, cache) = new_cache(LeafConfig::default());
        let a = cache
            .get(&LeafName::parse("A.Test.").unwrap())
            .await
            .unwrap();
        let b = cache.get(&LeafName::Dns("a.TEST".into())).await.unwrap();
        assert!(Arc::ptr_eq(&a, &b));
        assert_eq!(cache.minted(), 1);
        let err = cache
            .get(&LeafName::Dns("bad name".into()))
            .await
            .unwrap_err();
        assert!(matches!(err, CaError::InvalidName { .. }));
    }

    #[tokio::test]
    async fn leaf_validity_follows_config() {
        let validity = Duration::from_secs(2 * 3600);
        let cfg = LeafConfig {
            validity,
            cache_ttl: Duration::from_secs(3600),
            ..LeafConfig::default()
        };
        let (_dir, _ca, cache) = new_cache(cfg);
        let key = cache
            .get(&LeafName::parse("a.test").unwrap())
            .await
            .unwrap();
        let (_, x) = x509_parser::parse_x509_certificate(&key.cert[0]).unwrap();
        let v = x.validity();
        let remaining = v.not_after.to_datetime() - time::OffsetDateTime::now_utc();
        let expected = time::Duration::try_from(validity).unwrap();
        assert!(
            (remaining - expected).abs() <= time::Duration::seconds(5),
            "{remaining}"
        );
    }

    #[tokio::test]
    async fn expired_entries_are_reminted() {
        let cfg = LeafConfig {
            validity: Duration::from_secs(3600),
            cache_ttl: Duration::from_millis(50),
            ..LeafConfig::default()
        };
        let (_dir, _ca, cache) = new_cache(cfg);
        let name = LeafName::parse("a.test").unwrap();
        let first = cache.get(&name).await.unwrap();
        let again = cache.get(&name).await.unwrap();
        assert!(Arc::ptr_eq(&first, &again));
        tokio::time::sleep(Duration::from_millis(120)).await;
        let later = cache.get(&name).await.unwrap();
        assert!(!Arc::ptr_eq(&first, &later));
        assert_eq!(cache.minted(), 2);
        assert_eq!((cache.hits(), cache.misses()), (1, 2));
    }

    #[test]
    fn default_config_matches_spec() {
        let cfg = LeafConfig::default();
        assert_eq!(cfg.validity, Duration::from_secs(86_400));
        assert_eq!(cfg.cache_capacity, 10_000);
        assert_eq!(cfg.cache_ttl, Duration::from_secs(43_200));
        assert!(cfg.cache_ttl < cfg.validity);
    }
}
