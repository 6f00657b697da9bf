//! Synthetic addresses: what the stub answers for a name only an `ask` rule covers, and for a
//! name no rule allows (unless `dns.denied = "nxdomain"`). Such a name is never sent to a
//! resolver (the lookup itself would carry data out before anyone approved anything); the
//! agent gets an address from 198.18.0.0/15 (RFC 2544's benchmarking range, never routed on
//! the Internet) that stands for the name. The redirect brings every connection the agent
//! opens back to the proxy, which sees the name (the SNI, the Host, or for raw TCP this
//! memory through `NameMemory`) and decides it: the operator is asked then, or the agent is
//! told which rule refused it. Only an allowed connection is dialed, by the name, with the
//! proxy's own resolver; a synthetic address is never dialed.
//!
//! Per agent uid: one agent's synthetic address names nothing for another, and each agent
//! has a pool of its own, so an agent asking for a flood of names (every name no rule allows
//! now takes an address) evicts only its own. Bounded: at most [`PER_AGENT`] names per
//! agent, each kept while used and for [`IDLE`] after, and at most [`AGENTS`] agents' pools.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// 198.18.0.0/15.
const BASE: u32 = u32::from_be_bytes([198, 18, 0, 0]);
const SIZE: u32 = 1 << 17;
/// Names one agent holds addresses for (an eighth of the range: a free address is found at
/// once).
const PER_AGENT: u64 = 16_384;
/// Agents with a pool (uids seen by the stub; configured agents are few).
const AGENTS: u64 = 1024;
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

/// One agent's addresses.
struct Pool {
    by_name: moka::sync::Cache<Arc<str>, Ipv4Addr>,
    taken: moka::sync::Cache<Ipv4Addr, Arc<str>>,
    next: AtomicU32,
}

impl Pool {
    fn new() -> Pool {
        Pool {
            by_name: moka::sync::Cache::builder()
                .max_capacity(PER_AGENT)
                .time_to_idle(IDLE)
                .build(),
            taken: moka::sync::Cache::builder()
                .max_capacity(PER_AGENT)
                .time_to_idle(IDLE)
                .build(),
            next: AtomicU32::new(1),
        }
    }
}

pub(crate) struct Synthetic {
    pools: moka::sync::Cache<Uid, Arc<Pool>>,
}

impl Default for Synthetic {
    fn default() -> Self {
        Synthetic {
            pools: moka::sync::Cache::builder()
                .max_capacity(AGENTS)
                .time_to_idle(IDLE)
                .build(),
        }
    }
}

impl Synthetic {
    /// The address standing for `name` (normalized) for `uid`: the same while it is in use,
    /// a free one otherwise. `None` when no free address was found.
    pub(crate) fn address(&self, uid: Uid, name: &str) -> Option<Ipv4Addr> {
        let pool = self.pools.get_with(uid, || Arc::new(Pool::new()));
        let name = Arc::<str>::from(name);
        if let Some(ip) = pool.by_name.get(&name) {
            // Keep the reverse entry alive as long as the forward one.
            if pool.taken.get(&ip).as_deref() == Some(&*name) {
                return Some(ip);
            }
        }
        for _ in 0..64 {
            // Never .0 or .255 of a /24: some clients refuse them.
            let n = pool.next.fetch_add(1, Ordering::Relaxed) % SIZE;
            if n & 0xff == 0 || n & 0xff == 0xff {
                continue;
            }
            let ip = Ipv4Addr::from(BASE + n);
            let entry = pool.taken.entry(ip).or_insert_with(|| name.clone());
            if entry.is_fresh() {
                pool.by_name.insert(name, ip);
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
        self.pools.get(&uid)?.taken.get(&v4)
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

    #[test]
    fn one_agents_flood_of_names_leaves_another_agents_addresses() {
        let s = Synthetic::default();
        let kept = s.address(Some(2), "held.test").expect("address");
        for i in 0..PER_AGENT + 2_000 {
            let _ = s.address(Some(1), &format!("n{i}.flood.test"));
        }
        s.pools.run_pending_tasks();
        for pool in s.pools.iter() {
            pool.1.by_name.run_pending_tasks();
            pool.1.taken.run_pending_tasks();
            assert!(pool.1.taken.entry_count() <= PER_AGENT, "bounded per agent");
        }
        assert_eq!(
            s.name(Some(2), IpAddr::V4(kept)).as_deref(),
            Some("held.test"),
            "the other agent's address still stands for its name"
        );
    }
}
