//! Which names the stub answered with which addresses, per agent: a raw TCP connection to one
//! of those addresses is then decided by name (`ssh git@github.com` against a `tcp` rule for
//! `github.com`), and its record names the host.
//!
//! Bounded twice: each name is remembered for its answer's TTL (at least [`MIN_TTL`], at most
//! [`MAX_TTL`]), and the memory holds at most [`CAPACITY`] (agent, address) pairs, each with
//! at most [`NAMES_PER_ADDR`] names (a CDN address serves many), the least recent evicted
//! first. An agent cannot make another agent's connections be decided by a name it looked up:
//! the key includes the uid.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Clients reuse an answer a little past its TTL (Java caches 30 s, retries reconnect):
/// shorter TTLs are stretched to this.
pub(crate) const MIN_TTL: Duration = Duration::from_secs(60);
/// No name is remembered longer, whatever its TTL.
pub(crate) const MAX_TTL: Duration = Duration::from_secs(3600);
const CAPACITY: u64 = 65_536;
const NAMES_PER_ADDR: usize = 8;

/// (agent uid, address): `None` where the OS could not tell the uid (macOS).
type Key = (Option<u32>, IpAddr);

#[derive(Debug, Clone, PartialEq, Eq)]
struct Seen {
    name: Arc<str>,
    until: Instant,
}

pub(crate) struct NameMemory {
    cache: moka::sync::Cache<Key, Arc<Vec<Seen>>>,
}

impl Default for NameMemory {
    fn default() -> Self {
        NameMemory {
            cache: moka::sync::Cache::builder()
                .max_capacity(CAPACITY)
                .time_to_live(MAX_TTL)
                .build(),
        }
    }
}

impl NameMemory {
    /// The stub answered `name` (normalized) with `addr`, valid for `ttl` seconds.
    pub(crate) fn remember(&self, uid: Option<u32>, addr: IpAddr, name: &str, ttl: u32) {
        let until = Instant::now() + Duration::from_secs(u64::from(ttl)).clamp(MIN_TTL, MAX_TTL);
        let name: Arc<str> = name.into();
        self.cache
            .entry((uid, addr.to_canonical()))
            .and_upsert_with(|old| {
                let now = Instant::now();
                let mut seen: Vec<Seen> = old
                    .map(|e| e.into_value().as_ref().clone())
                    .unwrap_or_default()
                    .into_iter()
                    .filter(|s| s.until > now && s.name != name)
                    .collect();
                seen.insert(0, Seen { name, until });
                seen.truncate(NAMES_PER_ADDR);
                Arc::new(seen)
            });
    }

    /// The names `uid` was given `addr` for and may still use, most recent first.
    pub(crate) fn names(&self, uid: Option<u32>, addr: IpAddr) -> Vec<Arc<str>> {
        let Some(seen) = self.cache.get(&(uid, addr.to_canonical())) else {
            return Vec::new();
        };
        let now = Instant::now();
        seen.iter()
            .filter(|s| s.until > now)
            .map(|s| s.name.clone())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("ip")
    }

    #[test]
    fn names_are_per_agent_most_recent_first_and_bounded() {
        let m = NameMemory::default();
        let a = ip("192.0.2.7");
        m.remember(Some(1), a, "one.test", 300);
        m.remember(Some(1), a, "two.test", 300);
        m.remember(Some(1), a, "one.test", 300);
        let got: Vec<String> = m.names(Some(1), a).iter().map(|n| n.to_string()).collect();
        assert_eq!(got, ["one.test", "two.test"]);
        // Another agent, or the same agent at another address, learned nothing.
        assert!(m.names(Some(2), a).is_empty());
        assert!(m.names(None, a).is_empty());
        assert!(m.names(Some(1), ip("192.0.2.8")).is_empty());
        // IPv4-mapped IPv6 is the same address.
        assert_eq!(m.names(Some(1), ip("::ffff:192.0.2.7")).len(), 2);
        for i in 0..20 {
            m.remember(Some(1), a, &format!("n{i}.test"), 300);
        }
        let got = m.names(Some(1), a);
        assert_eq!(got.len(), NAMES_PER_ADDR);
        assert_eq!(&*got[0], "n19.test");
    }

    #[test]
    fn a_name_is_forgotten_after_its_ttl() {
        let m = NameMemory::default();
        let a = ip("192.0.2.9");
        m.remember(Some(1), a, "short.test", 0);
        assert_eq!(m.names(Some(1), a).len(), 1, "stretched to MIN_TTL");
        // Forged expiry in the past: gone.
        m.cache.insert(
            (Some(1), a),
            Arc::new(vec![Seen {
                name: "old.test".into(),
                until: Instant::now() - Duration::from_secs(1),
            }]),
        );
        assert!(m.names(Some(1), a).is_empty());
    }
}
