//! Where the agent-facing TLS server keeps resumable sessions: one cache shared by every
//! shard, bounded, each session usable once.
//!
//! rustls's own `ServerSessionMemoryCache` finds a session in a hash map but then removes its
//! key from an eviction queue by a linear search, under one lock: with the 16 Ki sessions
//! kept here then, every resumed handshake compared thousands of keys (5.5 % of the daemon's CPU
//! under a connection-per-request load, `bench/profiles/why.md`). moka removes in constant
//! time. It must evict the *oldest* session (LRU, as rustls's did): under moka's default
//! admission policy (TinyLFU) a full cache turns away every new session, since a session is
//! never read before it is taken, and once the unused second tickets had filled it no new
//! ticket would have been kept at all. Sessions also expire when their tickets do.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use rustls::server::StoresServerSessions;

/// Sessions kept for resumption: the tickets of the last 2 Ki connections (two each, the
/// rustls default), far more than a client offers back (its newest). A session costs ~470
/// bytes here with moka's bookkeeping, and the store stays full after a burst: at 16 Ki it
/// was 7.5 MB of a 50 MB daemon once 10,000 sessions had closed (issue 33), at 4 Ki 1.9 MB.
pub(crate) const CAPACITY: u64 = 4 * 1024;

/// The lifetime rustls gives a TLS 1.3 ticket for a stateful session: a client does not offer
/// one older than this.
const TICKET_LIFETIME: Duration = Duration::from_secs(24 * 60 * 60);

/// The session store handed to every server config.
pub(crate) struct TlsSessions {
    cache: moka::sync::Cache<Vec<u8>, Arc<[u8]>>,
}

impl TlsSessions {
    pub(crate) fn new(capacity: u64) -> Arc<TlsSessions> {
        Arc::new(TlsSessions {
            cache: moka::sync::Cache::builder()
                .max_capacity(capacity)
                .eviction_policy(moka::policy::EvictionPolicy::lru())
                .time_to_live(TICKET_LIFETIME)
                .build(),
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

    /// Every connection leaves a second ticket nobody uses; a full cache must still keep
    /// the newest sessions (the ones clients offer), pushing out the oldest.
    #[test]
    fn a_cache_full_of_unused_tickets_still_keeps_new_sessions() {
        let s = TlsSessions::new(64);
        for i in 0..1_000u32 {
            s.put(i.to_be_bytes().to_vec(), vec![0; 16]);
            s.cache.run_pending_tasks();
        }
        s.put(b"newest".to_vec(), b"session".to_vec());
        s.cache.run_pending_tasks();
        assert_eq!(s.take(b"newest").as_deref(), Some(&b"session"[..]));
        assert_eq!(s.get(&0u32.to_be_bytes()), None, "the oldest went");
    }

    #[test]
    fn debug_shows_no_secret() {
        let s = TlsSessions::new(8);
        s.put(b"id".to_vec(), b"hunter2".to_vec());
        assert!(!format!("{s:?}").contains("hunter2"));
    }
}
