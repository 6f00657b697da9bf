//! Rate limits (token buckets) and per-host concurrency caps, each kept per agent.
//!
//! # Per agent
//! Every bucket and every cap belongs to one [`AgentKey`] (the local uid that opened the
//! connection), so an agent that drains a rule's bucket or fills its concurrency cap leaves
//! every other agent's untouched (DESIGN.md: one agent cannot starve another). A rule's
//! `rate` and `max_concurrent`, and a secret's `rate`, are therefore budgets *per agent*:
//! with N agents an upstream may see up to N times the rate. There is deliberately no
//! machine-wide ceiling on top: a shared ceiling is exactly the budget one agent could drain
//! for all (a fleet-wide count is a job for a shared counter, see DESIGN.md "Beyond one
//! machine"). Connections whose owner the OS cannot tell all share the one
//! [`AgentKey::Unknown`] budget, so nobody can mint fresh budgets per address or connection.
//! Memory stays bounded without it: keys are (agent, rule or secret name from the policy),
//! agents are local uids, and the table cap below still holds.
//!
//! # Token buckets
//! A bucket holds at most `burst` tokens, starts full, and refills continuously at
//! `requests / per`. Arithmetic is exact integer fixed point (see `bucket.rs`), so refill
//! never drifts and a `retry_after` is never a nanosecond too early.
//!
//! [`Limiter::check`] debits one token from every listed bucket of one agent or from none:
//! the buckets are locked in ascending [`LimitKey`] order (a total order, so no deadlock), decided on,
//! and released. No lock is held across an `.await` (everything here is synchronous).
//!
//! # Memory bound (why not moka)
//! Evicting a bucket that is *not* full would hand the agent a fresh full bucket, i.e. free
//! tokens: with `1 request / hour`, a TTI cache of 10 min would allow 6 requests an hour.
//! moka's TTI cannot see bucket state and runs on its own clock (not `tokio::time`), so the
//! limiter uses a sharded map and evicts only buckets that are **full** (indistinguishable
//! from a fresh one, so eviction is lossless) and unreferenced:
//! * idle sweep: full and untouched for `idle_ttl` (10 min); runs inline from `check` at most
//!   once per [`SWEEP_INTERVAL`], or explicitly via [`Limiter::sweep`];
//! * hard cap `max_buckets` (100 000): when full, a pressure sweep evicts every full bucket
//!   (at most once a second, so a flood of new hosts cannot make each call O(n)); if the
//!   table is still full, requests needing a *new* bucket are refused (fail closed).
//!
//! # Fleet scope
//! A rule whose rate says `scope = "fleet"` counts in the shared store instead (`fleet/`),
//! and falls back to its bucket here only when the store does not answer in time and
//! `ratelimit.on_store_error = "local"`.
//!
//! Concurrency caps need no sweep: an (agent, host) entry is removed as soon as its last
//! in-flight permit (or failed attempt) goes away, so memory is O(requests in flight).

mod bucket;
mod concurrency;
pub(crate) mod fleet;
mod limiter;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

pub(crate) use concurrency::{ConcurrencyCaps, ConcurrencyPermit};
pub(crate) use fleet::{FleetLimiter, FleetVerdict, StoreStatus};
pub(crate) use limiter::Limiter;

/// `requests` tokens per `per`, holding at most `burst`. Identical to the policy's struct.
///
/// Degenerate values are safe: `burst == 0` refuses everything, `requests == 0` is a
/// one-off quota of `burst` that never refills, and `per` is clamped to
/// `[1 ns, u64::MAX ns]` (so `per == 0` means "refill instantly").
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct RateLimit {
    pub requests: u32,
    pub per: Duration,
    pub burst: u32,
}

/// Whose budget a request spends: the local uid that opened its connection, or, when the OS
/// could not tell, the one budget every such connection shares (keying those by address or
/// by connection would let whoever controls them mint fresh budgets).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum AgentKey {
    Uid(u32),
    Unknown,
}

impl AgentKey {
    pub(crate) fn of(uid: Option<u32>) -> AgentKey {
        uid.map_or(AgentKey::Unknown, AgentKey::Uid)
    }
}

impl fmt::Display for AgentKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AgentKey::Uid(uid) => write!(f, "uid {uid}"),
            AgentKey::Unknown => f.write_str("an agent of unknown uid"),
        }
    }
}

/// Scope of a bucket within one agent's budgets. Keys compare byte-exact.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum LimitKey {
    Rule(Arc<str>),
    Secret(String),
}

/// Which [`LimitKey`] variant, for per-kind counters.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum KeyKind {
    Rule,
    Secret,
}

impl LimitKey {
    pub(crate) fn kind(&self) -> KeyKind {
        match self {
            LimitKey::Rule(_) => KeyKind::Rule,
            LimitKey::Secret(_) => KeyKind::Secret,
        }
    }
}

impl fmt::Display for LimitKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LimitKey::Rule(id) => write!(f, "rule:{id}"),
            LimitKey::Secret(s) => write!(f, "secret:{s}"),
        }
    }
}

/// A request was refused by the bucket `key`; a token will be there after `retry_after`.
///
/// When several buckets are empty, `key` is the one with the longest wait (the request can
/// only pass once all of them have a token). `retry_after == Duration::MAX` means "never"
/// (`burst == 0`, or an exhausted `requests == 0` quota).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("rate limit exceeded for {key}; retry after {retry_after:?}")]
pub(crate) struct Limited {
    pub key: LimitKey,
    pub retry_after: Duration,
}

impl Limited {
    /// Whole seconds for a `Retry-After` header: rounded up, at least 1, saturating.
    pub(crate) fn retry_after_secs(&self) -> u64 {
        let d = self.retry_after;
        let up = u64::from(d.subsec_nanos() > 0);
        d.as_secs().saturating_add(up).max(1)
    }
}

/// The agent already has `max` requests in flight to the host.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{agent} already has {max} requests in flight to {host}")]
pub(crate) struct AtCapacity {
    pub agent: AgentKey,
    pub host: String,
    pub max: u32,
}

impl From<crate::policy::RateLimit> for RateLimit {
    fn from(r: crate::policy::RateLimit) -> Self {
        RateLimit {
            requests: r.requests,
            per: r.per,
            burst: r.burst,
        }
    }
}
