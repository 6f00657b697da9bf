//! Synthetic addresses: what the stub answers for a name only an `ask` rule covers. Such a
//! name is never sent to a resolver (the lookup itself would carry data out before anyone
//! approved anything); the agent gets an address from 198.18.0.0/15 (RFC 2544's
//! benchmarking range, never routed on the Internet) that stands for the name. The redirect
//! brings every connection the agent opens back to the proxy, which sees the name (the SNI,
//! the Host, or for raw TCP this memory through `NameMemory`), decides it (the operator is
//! asked then) and dials the name with its own resolver; a synthetic address is never
//! dialed.
//!
//! Per agent uid: one agent's synthetic address names nothing for another. Bounded: at most
//! [`CAPACITY`] (agent, name) pairs, each kept while used and for [`IDLE`] after.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// 198.18.0.0/15.
const BASE: u32 = u32::from_be_bytes([198, 18, 0, 0]);
const SIZE: u32 = 1 << 17;
const CAPACITY: u64 = 65_536;
const IDLE: Duration = Duration::from_secs(3600);
/// The TTL of a synthetic answer.
pub(crate) const TTL: u32 = 300;

/// Whether `ip` is in the synthetic range (IPv4, or IPv4-mapped IPv6).
pub(crate) fn is_synthetic(ip: IpAddr) -> bool {
    match ip.to_canonical() {
        IpAddr::V4(v4) => u32::from(v4) & !(SIZE - 1) == BASE,
        IpAddr::V6(_) => false,
    }
}

type Uid = Option<u32>;

pub(crate) struct Synthetic {
    by_name: moka::sync::Cache<(Uid, Arc<str>), Ipv4Addr>,
    taken: moka::sync::Cache<(Uid, Ipv4Addr), Arc<str>>,
    next: AtomicU32,
}

impl Default for Synthetic {
    fn default() -> Self {
        Synthetic {
            by_name: moka::sync::Cache::builder()
                .max_capacity(CAPACITY)
                .time_to_idle(IDLE)
                .build(),
            taken: moka::sync::Cache::builder()
                .max_capacity(CAPACITY)
                .time_to_idle(IDLE)
                .build(),
            next: AtomicU32::new(1),
        }
    }
}

impl Synthetic {
    /// The address standing for `name` (normalized) for `uid`: the same while it is in use,
    /// a free one otherwise. `None` when no free address was found (the range is full of
    /// this agent's live names).
    pub(crate) fn address(&self, uid: Uid, name: &str) -> Option<Ipv4Addr> {
        let key = (uid, Arc::<str>::from(name));
        if let Some(ip) = self.by_name.get(&key) {
            // Keep the reverse entry alive as long as the forward one.
            if self.taken.get(&(uid, ip)).as_deref() == Some(name) {
                return Some(ip);
            }
        }
        for _ in 0..64 {
            // Never .0 or .255 of a /24: some clients refuse them.
            let n = self.next.fetch_add(1, Ordering::Relaxed) % SIZE;
            if n & 0xff == 0 || n & 0xff == 0xff {
                continue;
            }
            let ip = Ipv4Addr::from(BASE + n);
            let entry = self.taken.entry((uid, ip)).or_insert_with(|| key.1.clone());
            if entry.is_fresh() {
                self.by_name.insert(key, ip);
                return Some(ip);
            }
        }
        None
    }

    /// The name `ip` stands for, for `uid`.
    pub(crate) fn name(&self, uid: Uid, ip: IpAddr) -> Option<Arc<str>> {
        let IpAddr::V4(v4) = ip.to_canonical() else {
            return None;
        };
        self.taken.get(&(uid, v4))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_keeps_its_address_per_agent_and_addresses_name_nothing_elsewhere() {
        let s = Synthetic::default();
        let a = s.address(Some(1), "ask.test").expect("address");
        assert!(is_synthetic(IpAddr::V4(a)));
        assert_eq!(s.address(Some(1), "ask.test"), Some(a), "stable");
        let b = s.address(Some(1), "other.test").expect("address");
        assert_ne!(a, b);
        assert_eq!(s.name(Some(1), IpAddr::V4(a)).as_deref(), Some("ask.test"));
        assert_eq!(s.name(Some(2), IpAddr::V4(a)), None, "another agent");
        assert_eq!(s.name(None, IpAddr::V4(a)), None);
        let mapped: IpAddr = format!("::ffff:{a}").parse().expect("ip");
        assert_eq!(s.name(Some(1), mapped).as_deref(), Some("ask.test"));
        assert!(!is_synthetic("198.20.0.1".parse().expect("ip")));
        assert!(!is_synthetic("93.184.216.34".parse().expect("ip")));
        assert!(is_synthetic("198.19.255.254".parse().expect("ip")));
    }
}
