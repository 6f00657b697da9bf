//! The fleet token bucket: one Lua script that Redis runs atomically per batch of checks
//! (`batch.rs`) and of leased tokens coming back (`lease.rs`), and the keys it runs on.
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

/// KEYS: first `ARGV[1]` buckets getting leased tokens back (`lease.rs`), then the buckets
/// of one batch of checks (`batch.rs`), in order, a key possibly more than once. ARGV[1]:
/// how many returns; then for the i-th key `requests`, `unit` (one token, µs), `burst`, `n`
/// at 4i-2..4i+1, `n` being the tokens returned, or for a check the tokens it wants (its own
/// and a lease). A return adds `n` tokens, capped at the capacity, to a bucket that is there
/// with the same token size (else it is dropped: an absent key is a full bucket, and a
/// changed size means a changed rule); it refills nothing (the next check does).
/// Returns {granted, wait} for each check in order, flat: granted is 0, and wait the µs
/// until a token is there, or 1 plus the extra tokens leased: at most `n - 1` and at most an
/// eighth of what is left after the check's own, so a bucket near empty grants one token a
/// call. Each check sees the ones before it in the batch, so a batch takes exactly the
/// tokens the same checks would take one call at a time; a key is read once and written
/// once per call however many checks name it (its state kept in the script between them;
/// the expiry is the last check's, as if each had set its own).
pub(super) const TOKEN_BUCKET: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local returns = tonumber(ARGV[1])
local out = {}
-- Each key is read once and written once per call: `state` mirrors what the hash would
-- hold after each step, `order` is the keys in first-seen order, for the writes at the end.
local state = {}
local order = {}
for i = 1, #KEYS do
  local key = KEYS[i]
  local requests = tonumber(ARGV[4 * i - 2])
  local unit = tonumber(ARGV[4 * i - 1])
  local burst = tonumber(ARGV[4 * i])
  local n = tonumber(ARGV[4 * i + 1])
  local cap = burst * unit
  local s = state[key]
  if s == nil then
    local h = redis.call('HMGET', key, 'c', 't', 'u')
    s = { c = tonumber(h[1]), t = tonumber(h[2]), u = tonumber(h[3]) }
    state[key] = s
    order[#order + 1] = key
  end
  if i <= returns then
    if s.c ~= nil and s.t ~= nil and s.u == unit and n > 0 then
      s.c = math.min(s.c + n * unit, cap)
      s.write_c = true
    end
  else
    local credit, last, old_unit = s.c, s.t, s.u
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
    local granted = 0
    local wait = 0
    if credit >= unit then
      local spare = math.floor((credit - unit) / unit / 8)
      granted = 1 + math.max(0, math.min(n - 1, spare))
      credit = credit - granted * unit
    else
      wait = math.ceil((unit - credit) / requests)
    end
    s.c, s.t, s.u = credit, last, unit
    s.write_all = true
    s.expire_ms = math.ceil((cap - credit) / requests / 1000) + 1000
    out[#out + 1] = granted
    out[#out + 1] = wait
  end
end
for _, key in ipairs(order) do
  local s = state[key]
  if s.write_all then
    redis.call('HSET', key, 'c', string.format('%.17g', s.c), 't',
      string.format('%.17g', s.t), 'u', string.format('%.17g', s.u))
    redis.call('PEXPIRE', key, s.expire_ms)
  elseif s.write_c then
    redis.call('HSET', key, 'c', string.format('%.17g', s.c))
  end
end
return out
"#;

/// One token, in µs: `per` (at least 1 s by the policy's bounds).
pub(super) fn unit_us(rate: &RateLimit) -> u64 {
    u64::try_from(rate.per.as_micros())
        .unwrap_or(u64::MAX)
        .max(1)
}

/// The script's answer for one check: granted (one token or more), or the wait until a
/// token is there.
pub(super) fn parse_reply((granted, wait_us): (i64, i64)) -> Option<Duration> {
    (granted < 1).then(|| Duration::from_micros(u64::try_from(wait_us).unwrap_or(0).max(1)))
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
        assert_eq!(parse_reply((5, 0)), None);
        assert_eq!(
            parse_reply((0, 2_500_000)),
            Some(Duration::from_micros(2_500_000))
        );
        assert_eq!(parse_reply((0, 0)), Some(Duration::from_micros(1)));
        assert_eq!(parse_reply((0, -5)), Some(Duration::from_micros(1)));
    }
}
