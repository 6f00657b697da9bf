//! The bucket table: a sharded map of `Arc<Mutex<Bucket>>`, one per (agent, key), plus
//! lossless eviction.
//!
//! Locking: shard locks are held only to look up, insert or sweep (never while taking a
//! bucket lock, except `try_lock` in the sweep, which cannot block). Bucket locks are taken
//! in ascending `LimitKey` order, so concurrent multi-key checks cannot deadlock.

use std::collections::HashMap;
use std::fmt;
use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock};
use std::time::Duration;

use tokio::time::Instant;

use super::bucket::{debit_all, Bucket};
use super::{AgentKey, KeyKind, LimitKey, Limited, RateLimit};

/// Hard cap on live buckets (each is ~200 bytes plus its key, so ~25 MB at most).
pub(crate) const DEFAULT_MAX_BUCKETS: usize = 100_000;
/// A full bucket untouched this long is evicted by the idle sweep.
pub(crate) const DEFAULT_IDLE_TTL: Duration = Duration::from_secs(10 * 60);
/// `check` runs the idle sweep inline at most this often.
pub(crate) const SWEEP_INTERVAL: Duration = Duration::from_secs(60);
/// At `max_buckets`, an O(n) pressure sweep runs at most this often (anti CPU-DoS).
const PRESSURE_SWEEP_INTERVAL: Duration = Duration::from_secs(1);
/// `retry_after` when a new bucket cannot be created because the table is full.
const TABLE_FULL_RETRY: Duration = Duration::from_secs(1);
const SHARDS: usize = 32;
const NEVER_SWEPT: u64 = u64::MAX;

type Slot = Arc<Mutex<Bucket>>;
/// A bucket belongs to one agent: every agent has its own bucket for each key.
type BucketKey = (AgentKey, LimitKey);
type Shard = RwLock<HashMap<BucketKey, Slot>>;

/// Token-bucket rate limiter. Share it behind an `Arc`; all methods are synchronous.
pub(crate) struct Limiter {
    shards: Box<[Shard]>,
    /// Keyed SipHash, so shard choice is not steerable.
    hasher: RandomState,
    max_buckets: usize,
    idle_ttl: Duration,
    live: AtomicUsize,
    epoch: Instant,
    /// Nanoseconds since `epoch` of the last idle / pressure sweep.
    last_sweep: AtomicU64,
    last_pressure_sweep: AtomicU64,
    refused: [AtomicU64; 2],
    refused_table_full: AtomicU64,
}

/// Counters for metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct LimiterStats {
    pub buckets: usize,
    pub refused_rule: u64,
    pub refused_secret: u64,
    /// Refusals because the table was at `max_buckets` (also counted under the key's kind).
    pub refused_table_full: u64,
}

fn read<T>(l: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(PoisonError::into_inner)
}

fn write<T>(l: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(PoisonError::into_inner)
}

// Nothing panics while a bucket is locked (all arithmetic saturates); recover regardless.
fn lock(m: &Mutex<Bucket>) -> MutexGuard<'_, Bucket> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn kind_index(kind: KeyKind) -> usize {
    match kind {
        KeyKind::Rule => 0,
        KeyKind::Secret => 1,
    }
}

impl Default for Limiter {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for Limiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Limiter")
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

impl Limiter {
    pub(crate) fn new() -> Self {
        Self::with_limits(DEFAULT_MAX_BUCKETS, DEFAULT_IDLE_TTL)
    }

    pub(crate) fn with_limits(max_buckets: usize, idle_ttl: Duration) -> Self {
        Limiter {
            shards: (0..SHARDS).map(|_| Shard::default()).collect(),
            hasher: RandomState::new(),
            max_buckets,
            idle_ttl,
            live: AtomicUsize::new(0),
            epoch: Instant::now(),
            last_sweep: AtomicU64::new(0),
            last_pressure_sweep: AtomicU64::new(NEVER_SWEPT),
            refused: Default::default(),
            refused_table_full: AtomicU64::new(0),
        }
    }

    /// Take one token from every listed bucket of `agent`, or from none. Buckets are created
    /// full on first use; a changed config is adopted (clamped, no free refill). A key listed
    /// twice is debited once, with its first listed config. Other agents' buckets are never
    /// touched.
    pub(crate) fn check(
        &self,
        agent: AgentKey,
        keys: &[(LimitKey, RateLimit)],
    ) -> Result<(), Limited> {
        // Sorting fixes the global lock order; dedup avoids locking one mutex twice.
        let mut wanted: Vec<&(LimitKey, RateLimit)> = keys.iter().collect();
        wanted.sort_by(|a, b| a.0.cmp(&b.0));
        wanted.dedup_by(|later, first| later.0 == first.0);

        let mut slots = Vec::with_capacity(wanted.len());
        for (key, cfg) in wanted.iter().copied() {
            match self.slot(&(agent, key.clone()), *cfg) {
                Some(slot) => slots.push(slot),
                None => return Err(self.refuse(key, TABLE_FULL_RETRY, true)),
            }
        }
        let refusal = {
            let mut guards: Vec<MutexGuard<'_, Bucket>> = slots.iter().map(|s| lock(s)).collect();
            // Read the clock after locking, so it is not earlier than any refill applied.
            debit_all(&mut guards, &wanted, Instant::now())
        };
        drop(slots); // release our references so the sweep below may evict them
        self.maybe_sweep();
        match refusal {
            None => Ok(()),
            Some((i, wait)) => Err(self.refuse(&wanted[i].0, wait, false)),
        }
    }

    /// Live buckets.
    pub(crate) fn len(&self) -> usize {
        self.live.load(Ordering::Acquire)
    }

    pub(crate) fn stats(&self) -> LimiterStats {
        let r = |k: KeyKind| self.refused[kind_index(k)].load(Ordering::Relaxed);
        LimiterStats {
            buckets: self.len(),
            refused_rule: r(KeyKind::Rule),
            refused_secret: r(KeyKind::Secret),
            refused_table_full: self.refused_table_full.load(Ordering::Relaxed),
        }
    }

    /// Evict buckets that are full and idle for `idle_ttl`; returns how many. `check` does
    /// this by itself every `SWEEP_INTERVAL`.
    #[cfg(test)]
    pub(crate) fn sweep(&self) -> usize {
        let now = Instant::now();
        self.last_sweep
            .store(self.since_epoch(now), Ordering::Release);
        self.evict(now, self.idle_ttl)
    }

    fn refuse(&self, key: &LimitKey, retry_after: Duration, table_full: bool) -> Limited {
        self.refused[kind_index(key.kind())].fetch_add(1, Ordering::Relaxed);
        if table_full {
            self.refused_table_full.fetch_add(1, Ordering::Relaxed);
        }
        Limited {
            key: key.clone(),
            retry_after,
        }
    }

    fn shard(&self, key: &BucketKey) -> &Shard {
        let i = self.hasher.hash_one(key) as usize % SHARDS;
        &self.shards[i]
    }

    /// The bucket for `key`, created full if missing; `None` if the table is full.
    fn slot(&self, key: &BucketKey, cfg: RateLimit) -> Option<Slot> {
        let shard = self.shard(key);
        if let Some(slot) = read(shard).get(key) {
            return Some(Arc::clone(slot));
        }
        for attempt in 0..2 {
            {
                let mut map = write(shard);
                if let Some(slot) = map.get(key) {
                    return Some(Arc::clone(slot));
                }
                if self.reserve() {
                    let slot = Arc::new(Mutex::new(Bucket::new(cfg, Instant::now())));
                    map.insert(key.clone(), Arc::clone(&slot));
                    return Some(slot);
                }
            } // the shard lock must be released before sweeping all shards
            if attempt == 0 {
                self.pressure_sweep();
            }
        }
        None
    }

    fn reserve(&self) -> bool {
        let max = self.max_buckets;
        self.live
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max).then_some(n + 1)
            })
            .is_ok()
    }

    fn since_epoch(&self, now: Instant) -> u64 {
        let ns = now.saturating_duration_since(self.epoch).as_nanos();
        u64::try_from(ns).unwrap_or(NEVER_SWEPT - 1)
    }

    /// Claim the right to sweep if `every` has passed since `last`; one caller wins.
    fn claim(&self, last: &AtomicU64, now: Instant, every: Duration) -> bool {
        let t = self.since_epoch(now);
        let prev = last.load(Ordering::Acquire);
        let due = prev == NEVER_SWEPT || u128::from(t.saturating_sub(prev)) >= every.as_nanos();
        due && last
            .compare_exchange(prev, t, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    fn maybe_sweep(&self) {
        let now = Instant::now();
        if self.claim(&self.last_sweep, now, SWEEP_INTERVAL) {
            let n = self.evict(now, self.idle_ttl);
            tracing::debug!(evicted = n, live = self.len(), "rate-limit idle sweep");
        }
    }

    /// At capacity, any unreferenced full bucket may go (lossless), however recently used.
    fn pressure_sweep(&self) {
        let now = Instant::now();
        if self.claim(&self.last_pressure_sweep, now, PRESSURE_SWEEP_INTERVAL) {
            let n = self.evict(now, Duration::ZERO);
            if self.len() >= self.max_buckets {
                tracing::warn!(
                    evicted = n,
                    max = self.max_buckets,
                    "rate-limit table full; refusing requests that need a new bucket"
                );
            }
        }
    }

    fn evict(&self, now: Instant, min_idle: Duration) -> usize {
        let mut evicted = 0;
        for shard in self.shards.iter() {
            let mut map = write(shard);
            let before = map.len();
            map.retain(|_, slot| !evictable(slot, now, min_idle));
            let n = before - map.len();
            self.live.fetch_sub(n, Ordering::AcqRel);
            evicted += n;
        }
        evicted
    }

    #[cfg(test)]
    pub(super) fn tokens(&self, agent: AgentKey, key: &LimitKey) -> Option<f64> {
        let key = (agent, key.clone());
        let slot = read(self.shard(&key)).get(&key).map(Arc::clone)?;
        let mut b = lock(&slot);
        b.refill(Instant::now());
        Some(b.tokens())
    }
}

/// Clones of a slot are only made under its shard lock, which the caller holds for writing:
/// a strong count of 1 means no `check` holds it now, nor can start to.
fn evictable(slot: &Slot, now: Instant, min_idle: Duration) -> bool {
    if Arc::strong_count(slot) != 1 {
        return false;
    }
    let Ok(mut bucket) = slot.try_lock() else {
        return false;
    };
    bucket.refill(now);
    bucket.is_full() && now.saturating_duration_since(bucket.last_used) >= min_idle
}

#[cfg(test)]
#[path = "limiter_tests.rs"]
mod tests;
