//! The fleet token bucket: one Lua script that Redis runs atomically per batch of checks
//! (`batch.rs`), and the keys it runs on.
//!
//! It is the local bucket (`bucket.rs`) in Redis: capacity `burst` tokens, starting full,
//! refilled continuously at `requests / per`, one token per request, all in integer
//! microseconds of credit (one token = `per` in µs, so `e` µs of refill add `e * requests`).
//! Time is Redis's own `TIME`, read inside the script, so the hosts' clocks never matter. A
//! bucket whose `per` changed is rescaled (rounding down) and clamped to its new capacity, so
//! a policy change never grants tokens. Every key carries a TTL of the time it takes to fill
//! up again (plus a second): an expired key reads as a full bucket, which it would be.
//!
//! Lua numbers are doubles: credit is exact up to 2^53 µs·requests (a day's `per` with a
//! burst up to 100 000); beyond, it is rounded to within a few µs of a token.

use std::time::Duration;

use super::super::{AgentKey, RateLimit};
use crate::config::FleetKey;

/// KEYS: the buckets of one batch of checks (`batch.rs`), in order, a key possibly more than
/// once. ARGV: for the i-th key, `requests`, `unit` (one token, µs), `burst` at 3i-2..3i.
/// Returns {taken, wait} for each key in order, flat: taken 1 when a token was taken, else 0
/// and the µs until one is there. Each check sees the ones before it in the batch (a key
/// read after it was written in the same call), so a batch takes exactly the tokens the same
/// checks would take one call at a time.
pub(super) const TOKEN_BUCKET: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local out = {}
for i = 1, #KEYS do
  local key = KEYS[i]
  local requests = tonumber(ARGV[3 * i - 2])
  local unit = tonumber(ARGV[3 * i - 1])
  local burst = tonumber(ARGV[3 * i])
  local cap = burst * unit
  local s = redis.call('HMGET', key, 'c', 't', 'u')
  local credit = tonumber(s[1])
  local last = tonumber(s[2])
  local old_unit = tonumber(s[3])
  if credit == nil or last == nil or old_unit == nil then
    credit = cap
    last = now
    old_unit = unit
  end
  if old_unit ~= unit then
    credit = math.floor(credit * unit / old_unit)
  end
  if now > last then
    credit = credit + (now - last) * requests
    last = now
  end
  if credit > cap then
    credit = cap
  end
  local taken = 0
  local wait = 0
  if credit >= unit then
    credit = credit - unit
    taken = 1
  else
    wait = math.ceil((unit - credit) / requests)
  end
  redis.call('HSET', key, 'c', string.format('%.17g', credit), 't',
    string.format('%.17g', last), 'u', string.format('%.17g', unit))
  local full_ms = math.ceil((cap - credit) / requests / 1000)
  redis.call('PEXPIRE', key, full_ms + 1000)
  out[2 * i - 1] = taken
  out[2 * i] = wait
end
return out
"#;

/// One token, in µs: `per` (at least 1 s by the policy's bounds).
pub(super) fn unit_us(rate: &RateLimit) -> u64 {
    u64::try_from(rate.per.as_micros())
        .unwrap_or(u64::MAX)
        .max(1)
}

/// The script's answer for one check: taken, or the wait until a token is there.
pub(super) fn parse_reply((taken, wait_us): (i64, i64)) -> Option<Duration> {
    (taken != 1).then(|| Duration::from_micros(u64::try_from(wait_us).unwrap_or(0).max(1)))
}

/// The bucket's key: the same on every host for the same policy, since it is made of the
/// rule's id as written (never a pointer or a load order) and the agent uid or destination
/// host. The rule id is length-prefixed, so no id can spell another's key.
pub(super) fn key(prefix: &str, rule: &str, by: FleetKey, agent: AgentKey, host: &str) -> String {
    let whose = match (by, agent) {
        (FleetKey::Agent, AgentKey::Uid(uid)) => format!("agent:{uid}"),
        (FleetKey::Agent, AgentKey::Unknown) => "agent:unknown".to_string(),
        (FleetKey::Host, _) => format!("host:{}", host.to_ascii_lowercase()),
    };
    format!("{prefix}{}:{rule}:{whose}", rule.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_name_the_rule_and_whose_bucket_unambiguously() {
        let p = "agenshield:rl:";
        assert_eq!(
            key(p, "api", FleetKey::Agent, AgentKey::Uid(1000), "x.test"),
            "agenshield:rl:3:api:agent:1000"
        );
        assert_eq!(
            key(p, "api", FleetKey::Agent, AgentKey::Unknown, "x.test"),
            "agenshield:rl:3:api:agent:unknown"
        );
        assert_eq!(
            key(
                p,
                "api",
                FleetKey::Host,
                AgentKey::Uid(1000),
                "API.Example.com"
            ),
            "agenshield:rl:3:api:host:api.example.com"
        );
        // A rule id that contains another key's tail cannot collide with it.
        assert_ne!(
            key(p, "a:agent:1", FleetKey::Agent, AgentKey::Uid(2), ""),
            key(p, "a", FleetKey::Agent, AgentKey::Uid(1), "")
        );
    }

    #[test]
    fn replies_are_taken_or_a_wait_of_at_least_a_microsecond() {
        assert_eq!(parse_reply((1, 0)), None);
        assert_eq!(
            parse_reply((0, 2_500_000)),
            Some(Duration::from_micros(2_500_000))
        );
        assert_eq!(parse_reply((0, 0)), Some(Duration::from_micros(1)));
        assert_eq!(parse_reply((0, -5)), Some(Duration::from_micros(1)));
    }
}
