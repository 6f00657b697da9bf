//! Caps on requests in flight, per agent and host: one agent filling a rule's cap on a host
//! leaves every other agent's cap on it untouched.
//!
//! An atomic counter per host rather than a `Semaphore`: `max` comes from policy on every
//! call, and a counter honours a reloaded `max` at once (lowering it refuses new requests
//! until enough in-flight ones finish) where a semaphore's permit count is fixed.
//!
//! Memory: an (agent, host) entry is removed as soon as nobody references it (no permit, no
//! acquire in progress), so the map only holds pairs with requests in flight. The map is
//! keyed agent first, then host, so a lookup needs no allocation.

use std::collections::HashMap;
use std::fmt;
use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, PoisonError, RwLock, RwLockWriteGuard};

use super::{AgentKey, AtCapacity};

const SHARDS: usize = 32;

type Shard = RwLock<HashMap<AgentKey, HashMap<Box<str>, Arc<Slot>>>>;

/// Per-agent, per-host concurrency caps. Cloning is cheap and shares the state.
#[derive(Clone)]
pub(crate) struct ConcurrencyCaps {
    inner: Arc<Inner>,
}

struct Inner {
    shards: Box<[Shard]>,
    hasher: RandomState,
    refused: AtomicU64,
}

struct Slot {
    agent: AgentKey,
    host: Box<str>,
    shard: usize,
    in_flight: AtomicU32,
}

/// One request of one agent in flight to a host; dropping it (including by cancelling the future that
/// owns it) frees the slot.
#[must_use = "the slot is released as soon as the permit is dropped"]
pub(crate) struct ConcurrencyPermit {
    inner: Arc<Inner>,
    /// `Some` until `drop`, which must hand the `Arc` to `release` by value.
    slot: Option<Arc<Slot>>,
}

fn write<T>(l: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(PoisonError::into_inner)
}

impl Default for ConcurrencyCaps {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for ConcurrencyCaps {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConcurrencyCaps")
            .field("entries", &self.len())
            .field("refused", &self.refusals())
            .finish()
    }
}

impl ConcurrencyCaps {
    pub(crate) fn new() -> Self {
        ConcurrencyCaps {
            inner: Arc::new(Inner {
                shards: (0..SHARDS).map(|_| Shard::default()).collect(),
                hasher: RandomState::new(),
                refused: AtomicU64::new(0),
            }),
        }
    }

    /// Take a slot for `agent` on `host` without waiting; refuses if that agent already has
    /// `max` in flight there (`max == 0` refuses everything).
    pub(crate) fn acquire(
        &self,
        agent: AgentKey,
        host: &str,
        max: u32,
    ) -> Result<ConcurrencyPermit, AtCapacity> {
        let slot = self.inner.slot(agent, host);
        let admitted = slot
            .in_flight
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max).then_some(n + 1)
            })
            .is_ok();
        if admitted {
            return Ok(ConcurrencyPermit {
                inner: Arc::clone(&self.inner),
                slot: Some(slot),
            });
        }
        self.inner.refused.fetch_add(1, Ordering::Relaxed);
        self.inner.release(slot);
        Err(AtCapacity {
            agent,
            host: host.to_owned(),
            max,
        })
    }

    /// Requests `agent` has in flight to `host` now.
    #[cfg(test)]
    pub(crate) fn in_flight(&self, agent: AgentKey, host: &str) -> u32 {
        let shard = &self.inner.shards[self.inner.shard_of(agent, host)];
        let map = shard.read().unwrap_or_else(PoisonError::into_inner);
        map.get(&agent)
            .and_then(|hosts| hosts.get(host))
            .map_or(0, |s| s.in_flight.load(Ordering::Acquire))
    }

    /// (agent, host) pairs with an entry (requests in flight or an acquire in progress).
    pub(crate) fn len(&self) -> usize {
        let len = |s: &Shard| {
            let map = s.read().unwrap_or_else(PoisonError::into_inner);
            map.values().map(HashMap::len).sum::<usize>()
        };
        self.inner.shards.iter().map(len).sum()
    }

    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Acquires refused so far.
    pub(crate) fn refusals(&self) -> u64 {
        self.inner.refused.load(Ordering::Relaxed)
    }
}

impl Inner {
    fn shard_of(&self, agent: AgentKey, host: &str) -> usize {
        self.hasher.hash_one((agent, host)) as usize % SHARDS
    }

    fn slot(&self, agent: AgentKey, host: &str) -> Arc<Slot> {
        let shard = self.shard_of(agent, host);
        let lock = &self.shards[shard];
        if let Some(slot) = lock
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&agent)
            .and_then(|hosts| hosts.get(host))
        {
            return Arc::clone(slot);
        }
        let mut map = write(lock);
        let hosts = map.entry(agent).or_default();
        let slot = hosts.entry(host.into()).or_insert_with(|| {
            Arc::new(Slot {
                agent,
                host: host.into(),
                shard,
                in_flight: AtomicU32::new(0),
            })
        });
        Arc::clone(slot)
    }

    /// Drop one reference to `slot`, removing the host's entry if it was the last one.
    /// Clones are made under the shard lock and every reference is dropped here under the
    /// write lock, so the strong count is exact: 2 means just the map and us.
    fn release(&self, slot: Arc<Slot>) {
        let mut map = write(&self.shards[slot.shard]);
        let last = Arc::strong_count(&slot) == 2 && slot.in_flight.load(Ordering::Acquire) == 0;
        if let Some(hosts) = map.get_mut(&slot.agent).filter(|_| last) {
            if hosts
                .get(&*slot.host)
                .is_some_and(|s| Arc::ptr_eq(s, &slot))
            {
                hosts.remove(&*slot.host);
            }
            if hosts.is_empty() {
                map.remove(&slot.agent);
            }
        }
        drop(slot); // inside the lock, so the next releaser sees an exact count
    }
}

impl ConcurrencyPermit {
    pub(crate) fn host(&self) -> &str {
        self.slot.as_deref().map_or("", |s| &s.host)
    }

    pub(crate) fn agent(&self) -> Option<AgentKey> {
        self.slot.as_deref().map(|s| s.agent)
    }
}

impl fmt::Debug for ConcurrencyPermit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConcurrencyPermit")
            .field("agent", &self.agent())
            .field("host", &self.host())
            .finish()
    }
}

impl Drop for ConcurrencyPermit {
    fn drop(&mut self) {
        if let Some(slot) = self.slot.take() {
            slot.in_flight.fetch_sub(1, Ordering::AcqRel);
            self.inner.release(slot);
        }
    }
}

#[cfg(test)]
#[path = "concurrency_tests.rs"]
mod tests;
