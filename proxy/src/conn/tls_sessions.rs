//! Where the agent-facing TLS server keeps resumable sessions: one cache shared by every
//! shard, bounded, each session usable once.
//!
//! rustls's own `ServerSessionMemoryCache` finds a session in a hash map but then removes its
//! key from an eviction queue by a linear search, under one lock: with the 16 Ki sessions
//! kept here every resumed handshake compared thousands of keys (5.5 % of the daemon's CPU
//! under a connection-per-request load, `bench/profiles/why.md`). moka removes in constant
//! time and evicts by its own bounded policy.

use std::fmt;
use std::sync::Arc;

use rustls::server::StoresServerSessions;

/// Sessions kept for resumption (two tickets per connection, the rustls default).
pub(crate) const CAPACITY: u64 = 16 * 1024;

/// The session store handed to every server config.
pub(crate) struct TlsSessions {
    cache: moka::sync::Cache<Vec<u8>, Arc<[u8]>>,
}

impl TlsSessions {
    pub(crate) fn new(capacity: u64) -> Arc<TlsSessions> {
        Arc::new(TlsSessions {
            cache: moka::sync::Cache::new(capacity),
        })
    }
}

impl StoresServerSessions for TlsSessions {
    fn put(&self, key: Vec<u8>, value: Vec<u8>) -> bool {
        self.cache.insert(key, value.into());
        true
    }

    fn get(&self, key: &[u8]) -> Option<Vec<u8>> {
        self.cache.get(key).map(|v| v.to_vec())
    }

    /// A session resumes once: TLS 1.3 resumption takes it out.
    fn take(&self, key: &[u8]) -> Option<Vec<u8>> {
        self.cache.remove(key).map(|v| v.to_vec())
    }

    fn can_cache(&self) -> bool {
        true
    }
}

impl fmt::Debug for TlsSessions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never the sessions themselves: they hold resumption secrets.
        f.debug_struct("TlsSessions")
            .field("entries", &self.cache.entry_count())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_is_taken_once() {
        let s = TlsSessions::new(8);
        assert!(s.put(b"id".to_vec(), b"secret".to_vec()));
        assert_eq!(s.get(b"id").as_deref(), Some(&b"secret"[..]));
        assert_eq!(s.take(b"id").as_deref(), Some(&b"secret"[..]));
        assert_eq!(s.take(b"id"), None);
        assert_eq!(s.get(b"id"), None);
    }

    #[test]
    fn the_cache_stays_bounded() {
        let s = TlsSessions::new(64);
        for i in 0..10_000u32 {
            s.put(i.to_be_bytes().to_vec(), vec![0; 16]);
        }
        s.cache.run_pending_tasks();
        assert!(s.cache.entry_count() <= 64, "{}", s.cache.entry_count());
    }

    #[test]
    fn debug_shows_no_secret() {
        let s = TlsSessions::new(8);
        s.put(b"id".to_vec(), b"hunter2".to_vec());
        assert!(!format!("{s:?}").contains("hunter2"));
    }
}
