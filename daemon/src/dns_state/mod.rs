//! The DNS stub's state, shared by its loops (`crate::dns`) and by the raw TCP path
//! (`crate::conn`), which decides a connection to an address the stub handed out by its name:
//!
//! - `names.rs`: which names each agent was given which addresses for;
//! - `metrics.rs`: the stub's own series (queries by decision and code, queries dropped);
//! - `synthetic.rs`: the addresses answered for names only an `ask` rule covers, and for
//!   names no rule allows, which no resolver is asked about;
//! - here: the stub's bounds (questions in hand per agent and in all) and its memory of the
//!   answers it recorded lately.

mod metrics;
pub(crate) mod names;
pub(crate) mod synthetic;

use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::config::DeniedAnswer;
use crate::ratelimit::{AgentKey, ConcurrencyCaps, ConcurrencyPermit};
pub(crate) use metrics::DnsMetrics;
pub(crate) use names::NameMemory;

/// Questions one agent (uid; askers of unknown owner count as one) may have in hand at once
/// (deciding, resolving, recording); past it, its questions are dropped unanswered and
/// counted (`agenshield_proxy_dns_dropped_total`): the client retries. So an agent that
/// floods the stub with slow questions leaves every other agent served.
pub(crate) const MAX_IN_FLIGHT_PER_AGENT: u32 = 256;
/// Questions all agents together may have in hand (the daemon's memory); reaching it takes
/// 16 agents at their quota.
pub(crate) const MAX_IN_FLIGHT: usize = 16 * MAX_IN_FLIGHT_PER_AGENT as usize;
/// Datagrams read but not yet attributed to an agent (finding a datagram's owner takes
/// microseconds); a datagram past it is dropped unread and counted.
pub(crate) const MAX_UNATTRIBUTED: usize = 1024;

/// The stub's state, shared by its loops and by the raw TCP path.
pub(crate) struct DnsState {
    pub names: NameMemory,
    /// The addresses standing for names only an `ask` rule covers, and (unless
    /// `dns.denied = "nxdomain"`) for names no rule allows.
    pub synthetic: synthetic::Synthetic,
    /// `dns.denied`: what a name no rule allows is answered with.
    pub denied: DeniedAnswer,
    /// Allowed answers recorded lately: (uid, name, type, rcode) → until when.
    pub recorded: moka::sync::Cache<(Option<u32>, Arc<str>, u16, u16), std::time::Instant>,
    pub unattributed: Arc<Semaphore>,
    in_flight: Arc<Semaphore>,
    per_agent: ConcurrencyCaps,
    /// The stub's series.
    pub metrics: DnsMetrics,
}

/// One question in hand, counted against its agent's budget and the stub's until dropped.
pub(crate) struct InHand {
    _agent: ConcurrencyPermit,
    _all: OwnedSemaphorePermit,
}

/// Why a question was not taken in hand.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Crowded {
    /// The asking agent has [`MAX_IN_FLIGHT_PER_AGENT`] questions in hand.
    Agent(AgentKey),
    /// All agents together have [`MAX_IN_FLIGHT`].
    All,
}

impl DnsState {
    /// Takes a question of the agent `uid` in hand, if its budget and the stub's allow.
    pub(crate) fn take(&self, uid: Option<u32>) -> Result<InHand, Crowded> {
        let agent = AgentKey::of(uid);
        let mine = self
            .per_agent
            .acquire(agent, "dns", MAX_IN_FLIGHT_PER_AGENT)
            .map_err(|_| Crowded::Agent(agent))?;
        let all = self
            .in_flight
            .clone()
            .try_acquire_owned()
            .map_err(|_| Crowded::All)?;
        Ok(InHand {
            _agent: mine,
            _all: all,
        })
    }
}

impl Default for DnsState {
    fn default() -> Self {
        DnsState::new(DeniedAnswer::default(), DnsMetrics::unregistered())
    }
}

impl DnsState {
    pub(crate) fn new(denied: DeniedAnswer, metrics: DnsMetrics) -> Self {
        DnsState {
            names: NameMemory::default(),
            synthetic: synthetic::Synthetic::default(),
            denied,
            recorded: moka::sync::Cache::builder()
                .max_capacity(65_536)
                .time_to_live(names::MAX_TTL)
                .build(),
            unattributed: Arc::new(Semaphore::new(MAX_UNATTRIBUTED)),
            in_flight: Arc::new(Semaphore::new(MAX_IN_FLIGHT)),
            per_agent: ConcurrencyCaps::new(),
            metrics,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_agent_at_its_budget_leaves_the_others_served() {
        let dns = DnsState::default();
        let (a, b) = (Some(5200), Some(5201));
        let held: Vec<InHand> = (0..MAX_IN_FLIGHT_PER_AGENT)
            .map(|_| dns.take(a).expect("in budget"))
            .collect();
        assert_eq!(dns.take(a).err(), Some(Crowded::Agent(AgentKey::Uid(5200))));
        let other = dns.take(b).expect("B is served while A is at its budget");
        let unknown = dns.take(None).expect("an asker of unknown owner too");
        drop(held);
        let _again = dns
            .take(a)
            .expect("A's budget is back once its questions end");
        drop((other, unknown));
    }

    #[test]
    fn all_agents_together_are_bounded() {
        let dns = DnsState::default();
        let held: Vec<InHand> = (0..MAX_IN_FLIGHT as u32)
            .map(|i| {
                dns.take(Some(i / MAX_IN_FLIGHT_PER_AGENT))
                    .expect("in budget")
            })
            .collect();
        assert_eq!(dns.take(Some(99_999)).err(), Some(Crowded::All));
        drop(held);
        assert!(dns.take(Some(99_999)).is_ok());
    }
}
