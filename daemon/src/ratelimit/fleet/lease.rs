//! Token leases: a connection thread that checks a fleet key often keeps a few of its tokens
//! for a moment, so most of its checks take a token here instead of a script call.
//!
//! # Never more than the rate
//! A lease holds tokens the script already took out of the fleet's bucket (`bucket_script.rs`
//! grants `1 + extra`, the extra only while the bucket has plenty: at most an eighth of what
//! is left, so near exhaustion every check goes to the store and takes exactly its one
//! token). Spending one is spending a token the fleet already counted, so the fleet never
//! admits more than its rate. A lease is spent only before its [`LEASE_TTL`]; its unused
//! tokens then go back to the bucket ([`Return`], sent with the thread's next batch) and are
//! never spent here again. What leases can cost is the other way: tokens held by one thread
//! are not there for the others until they come back (at most [`LEASE_TTL`] later), and those
//! of a daemon that dies, or whose return fails, are lost (the bucket refills them at its
//! rate). A lease taken before a store outage is still spent during it (its tokens were taken
//! from the bucket); a reload that changes the rule's rate drops the lease (returned under
//! the old rate; the script ignores it if a token's size changed).
//!
//! # How much to ask for
//! `want` is about the checks this thread made for the key in the last [`LEASE_TTL`] (at
//! most [`MAX_WANT`]): a key checked once in a while asks for 1, exactly one call per check
//! as without leases, and a busy key asks for about what it will spend before the lease
//! expires, so leases do not sit idle. The checks still waiting for their calls, and the
//! extras they asked for, count against it: a burst of checks in one batch asks for no
//! lease at all, and the next check asks for what the burst suggests.
//!
//! Each thread has its own table (`store.rs` slot), locked only for a few map operations and
//! never across an await.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// How long a lease's tokens may be spent: short, since a lease's tokens are not there for
/// the fleet's other threads and daemons until they come back.
pub(super) const LEASE_TTL: Duration = Duration::from_millis(100);

/// The most tokens one check asks for (its own included).
pub(super) const MAX_WANT: u32 = 1024;

/// The most keys one thread tracks; past it a check asks for its own token only.
const MAX_KEYS: usize = 4096;

/// The rate a lease's tokens were taken under (the script's arguments).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Terms {
    pub requests: u64,
    pub unit_us: u64,
    pub burst: u64,
}

/// Unused leased tokens going back to their bucket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Return {
    pub key: String,
    pub terms: Terms,
    pub tokens: u32,
}

/// What a check does.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Take {
    /// Took a token from this thread's lease: no store call.
    Leased,
    /// Asks the store for `want` tokens (its own included); `returning`: the unused tokens
    /// of this key's expired lease, to send along.
    Ask {
        want: u32,
        returning: Option<Return>,
    },
}

/// What to do after a grant was recorded.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Kept {
    /// Tokens to give back now (a lease that expired meanwhile, or no room to keep them).
    pub returning: Vec<Return>,
    /// Start this thread's sweep (`Leases::sweep`): it has a lease and no sweep running.
    pub start_sweep: bool,
}

struct Entry {
    terms: Terms,
    tokens: u32,
    expires: Instant,
    /// Checks in the window that began at `window_start`, and in the one before.
    window_start: Instant,
    this_window: u32,
    last_window: u32,
    /// Checks whose call is not answered yet, and the extra tokens they asked for.
    in_flight: u32,
    asking: u32,
}

impl Entry {
    fn new(terms: Terms, now: Instant) -> Entry {
        Entry {
            terms,
            tokens: 0,
            expires: now,
            window_start: now,
            this_window: 0,
            last_window: 0,
            in_flight: 0,
            asking: 0,
        }
    }

    /// A call that asked for `want` tokens is over.
    fn answered(&mut self, want: u32) {
        self.in_flight = self.in_flight.saturating_sub(1);
        self.asking = self.asking.saturating_sub(want.saturating_sub(1));
    }

    fn take_expired(&mut self, key: &str, now: Instant) -> Option<Return> {
        if self.tokens == 0 || now < self.expires {
            return None;
        }
        Some(Return {
            key: key.to_string(),
            terms: self.terms,
            tokens: std::mem::take(&mut self.tokens),
        })
    }
}

#[derive(Default)]
struct Table {
    entries: HashMap<String, Entry>,
    sweeping: bool,
    /// When a full table was last pruned of quiet keys (at most once a [`LEASE_TTL`]).
    pruned: Option<Instant>,
}

/// Whether an entry still matters at `now`: a lease, a call in flight, or recent checks.
fn live(e: &Entry, now: Instant) -> bool {
    e.tokens > 0 || e.in_flight > 0 || now < e.window_start + 2 * LEASE_TTL
}

/// One thread's leases, by bucket key.
#[derive(Default)]
pub(super) struct Leases {
    table: Mutex<Table>,
}

impl Leases {
    fn lock(&self) -> std::sync::MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A check for `key` under `terms`: a token from the lease, or what to ask the store.
    pub(super) fn take(&self, key: &str, terms: Terms, now: Instant) -> Take {
        let mut t = self.lock();
        if !t.entries.contains_key(key)
            && t.entries.len() >= MAX_KEYS
            && t.pruned.is_none_or(|p| now >= p + LEASE_TTL)
        {
            t.pruned = Some(now);
            t.entries.retain(|_, e| live(e, now));
        }
        if !t.entries.contains_key(key) && t.entries.len() >= MAX_KEYS {
            return Take::Ask {
                want: 1,
                returning: None,
            };
        }
        let e = t
            .entries
            .entry(key.to_string())
            .or_insert_with(|| Entry::new(terms, now));
        let mut returning = None;
        if e.terms != terms {
            // The rule's rate changed (a reload): the old lease goes back, under its terms.
            if e.tokens > 0 {
                returning = Some(Return {
                    key: key.to_string(),
                    terms: e.terms,
                    tokens: std::mem::take(&mut e.tokens),
                });
            }
            e.terms = terms;
        }
        if now >= e.window_start + LEASE_TTL {
            e.last_window = if now < e.window_start + 2 * LEASE_TTL {
                e.this_window
            } else {
                0
            };
            e.this_window = 0;
            e.window_start = now;
        }
        e.this_window = e.this_window.saturating_add(1);
        if e.tokens > 0 && now < e.expires {
            e.tokens -= 1;
            return Take::Leased;
        }
        if returning.is_none() {
            returning = e.take_expired(key, now);
        }
        // The checks in flight (this one included) and the extras they asked for already
        // cover that much of the demand.
        let demand = e.last_window.max(e.this_window).min(MAX_WANT);
        e.in_flight = e.in_flight.saturating_add(1);
        let extra = demand.saturating_sub(e.in_flight.saturating_add(e.asking));
        e.asking += extra;
        Take::Ask {
            want: 1 + extra,
            returning,
        }
    }

    /// The store answered a check that asked for `want`: `leftover` tokens (granted, not
    /// spent by the check) become this thread's lease for `key`.
    pub(super) fn granted(
        &self,
        key: &str,
        terms: Terms,
        want: u32,
        leftover: u32,
        now: Instant,
    ) -> Kept {
        let mut kept = Kept::default();
        let mut t = self.lock();
        let Some(e) = t.entries.get_mut(key) else {
            if leftover > 0 {
                kept.returning.push(Return {
                    key: key.to_string(),
                    terms,
                    tokens: leftover,
                });
            }
            return kept;
        };
        e.answered(want);
        if leftover == 0 {
            return kept;
        }
        if e.terms != terms {
            kept.returning.push(Return {
                key: key.to_string(),
                terms,
                tokens: leftover,
            });
            return kept;
        }
        if e.tokens > 0 && now < e.expires {
            // Joins the lease still running, and expires with it (never later).
            e.tokens = e.tokens.saturating_add(leftover);
        } else {
            kept.returning.extend(e.take_expired(key, now));
            e.tokens = leftover;
            e.expires = now + LEASE_TTL;
        }
        if !t.sweeping {
            t.sweeping = true;
            kept.start_sweep = true;
        }
        kept
    }

    /// The call for a check that asked for `want` failed: its extras are no longer asked for.
    pub(super) fn failed(&self, key: &str, want: u32) {
        if let Some(e) = self.lock().entries.get_mut(key) {
            e.answered(want);
        }
    }

    /// Takes every expired lease's tokens (to return) and forgets keys gone quiet; also says
    /// when to look again: the first remaining lease's expiry, or `None` (no lease left: the
    /// sweep ends, and the next grant starts another).
    pub(super) fn sweep(&self, now: Instant) -> (Vec<Return>, Option<Instant>) {
        let mut t = self.lock();
        let mut returning = Vec::new();
        let mut next: Option<Instant> = None;
        t.entries.retain(|key, e| {
            returning.extend(e.take_expired(key, now));
            if e.tokens > 0 {
                next = Some(next.map_or(e.expires, |n| n.min(e.expires)));
            }
            live(e, now)
        });
        if next.is_none() {
            t.sweeping = false;
        }
        (returning, next)
    }
}

#[cfg(test)]
#[path = "lease_tests.rs"]
mod tests;
