//! One token bucket, in exact integer fixed point.
//!
//! Credit is counted in units where one token is `unit` = `per` in nanoseconds, so `e` ns
//! of refill adds exactly `e * requests` units: no float rounding, no drift between many
//! small refills and one large one, and `wait()` rounds up to the nanosecond so a caller
//! that waits exactly `retry_after` always finds its token.
//!
//! Bounds (no overflow anywhere): unit <= 2^64, credit <= burst * unit <= 2^96,
//! refill per call <= 2^64 ns * 2^32 requests = 2^96.

use std::ops::DerefMut;
use std::time::Duration;

use tokio::time::Instant;

use super::{LimitKey, RateLimit};

/// `retry_after` when no token will ever arrive.
pub(super) const NEVER: Duration = Duration::MAX;

#[derive(Debug)]
pub(super) struct Bucket {
    cfg: RateLimit,
    unit: u128,
    credit: u128,
    last_refill: Instant,
    /// Last time a `check` listed this bucket; only used to avoid evicting hot buckets.
    pub(super) last_used: Instant,
}

/// `per` in ns, clamped to [1, u64::MAX]: `per == 0` would make a token worth nothing.
fn unit_of(per: Duration) -> u128 {
    per.as_nanos().clamp(1, u128::from(u64::MAX))
}

impl Bucket {
    /// A new bucket starts full.
    pub(super) fn new(cfg: RateLimit, now: Instant) -> Self {
        let unit = unit_of(cfg.per);
        Bucket {
            cfg,
            unit,
            credit: u128::from(cfg.burst) * unit,
            last_refill: now,
            last_used: now,
        }
    }

    fn capacity(&self) -> u128 {
        u128::from(self.cfg.burst) * self.unit
    }

    /// Accrue tokens for the time since the last refill, at the current rate, up to `burst`.
    pub(super) fn refill(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.last_refill).as_nanos();
        let elapsed = elapsed.min(u128::from(u64::MAX));
        let added = elapsed * u128::from(self.cfg.requests);
        self.credit = self.credit.saturating_add(added).min(self.capacity());
        // `max` keeps the clock monotonic even if a caller passes a stale `now`.
        self.last_refill = self.last_refill.max(now);
    }

    /// Adopt `cfg` (call after `refill`, so time already elapsed accrued at the old rate).
    /// Credit is rescaled to the new unit rounding down and clamped to the new capacity,
    /// so a policy reload never grants tokens. Returns whether anything changed.
    pub(super) fn reconfigure(&mut self, cfg: RateLimit) -> bool {
        if cfg == self.cfg {
            return false;
        }
        let unit = unit_of(cfg.per);
        if unit != self.unit {
            // whole <= 2^32 and rem < 2^64, so neither product can overflow u128.
            let whole = self.credit / self.unit;
            let rem = self.credit % self.unit;
            self.credit = whole.saturating_mul(unit) + rem.saturating_mul(unit) / self.unit;
            self.unit = unit;
        }
        self.cfg = cfg;
        self.credit = self.credit.min(self.capacity());
        true
    }

    pub(super) fn has_token(&self) -> bool {
        self.credit >= self.unit
    }

    /// Debit one token; callers check `has_token` first (saturating as a backstop).
    pub(super) fn take(&mut self) {
        self.credit = self.credit.saturating_sub(self.unit);
    }

    /// Time from the last refill until one whole token is available, rounded up to 1 ns.
    pub(super) fn wait(&self) -> Duration {
        let deficit = self.unit.saturating_sub(self.credit);
        if deficit == 0 {
            return Duration::ZERO;
        }
        if self.cfg.requests == 0 || self.capacity() < self.unit {
            return NEVER;
        }
        let ns = deficit.div_ceil(u128::from(self.cfg.requests));
        Duration::from_nanos(u64::try_from(ns).unwrap_or(u64::MAX))
    }

    /// A full bucket is indistinguishable from a fresh one, so evicting it is lossless.
    pub(super) fn is_full(&self) -> bool {
        self.credit >= self.capacity()
    }

    #[cfg(test)]
    pub(super) fn tokens(&self) -> f64 {
        self.credit as f64 / self.unit as f64
    }
}

/// Refill and reconfigure every bucket, then debit one token from each or from none.
/// Callers hold all the locks. Returns the refusing index and its wait: the longest wait
/// among empty buckets, since the request can only pass once every one has a token.
pub(super) fn debit_all<B: DerefMut<Target = Bucket>>(
    buckets: &mut [B],
    wanted: &[&(LimitKey, RateLimit)],
    now: Instant,
) -> Option<(usize, Duration)> {
    let mut refusal: Option<(usize, Duration)> = None;
    for (i, (bucket, (key, cfg))) in buckets.iter_mut().zip(wanted).enumerate() {
        bucket.refill(now);
        if bucket.reconfigure(*cfg) {
            tracing::debug!(%key, ?cfg, "rate-limit bucket adopted new config");
        }
        bucket.last_used = now;
        if !bucket.has_token() {
            let wait = bucket.wait();
            if refusal.is_none_or(|(_, w)| wait > w) {
                refusal = Some((i, wait));
            }
        }
    }
    if refusal.is_none() {
        buckets.iter_mut().for_each(|b| b.take());
    }
    refusal
}
