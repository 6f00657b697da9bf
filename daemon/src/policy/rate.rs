//! Rule obligations: the rate limit and concurrency cap a rule attaches to what it allows.
//! The policy only validates and carries them; the proxy keeps the buckets and counters.
//!
//! `rate = { requests = R, per = P, burst = B }` is a token bucket: it holds at most `B`
//! tokens (default `R`) and starts full; one token is added every `P / R`; each request
//! takes one, and a request finding the bucket empty is refused (429 + Retry-After).
//!
//! `scope = "local"` (the default) keeps the bucket in this daemon; `scope = "fleet"` keeps it
//! in the shared store (`[ratelimit] store`), so every daemon under the same policy spends
//! from one bucket per rule (and agent or host, as `[ratelimit] fleet_key` says).

use std::fmt;
use std::ops::Range;
use std::time::Duration;

use serde::{Deserialize, Serialize, Serializer};
use toml::Spanned;

/// Bounds that catch typos (`requests = 6000000`) without limiting real use.
pub const MAX_RATE_REQUESTS: u32 = 1_000_000;
pub const MAX_RATE_PER: Duration = Duration::from_secs(24 * 3600);
pub const MAX_CONCURRENT: u32 = 100_000;

/// A rule's token bucket (see the module docs). Invariants: `requests`, `burst` in
/// `1..=MAX_RATE_REQUESTS`, `per` a whole number of seconds in `1s..=24h`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RateLimit {
    /// Tokens added per `per`.
    pub requests: u32,
    pub per: Duration,
    /// Bucket capacity: the most requests allowed back to back. `burst` if given, else `requests`.
    pub burst: u32,
    /// Where the bucket lives: this daemon, or the fleet's shared store.
    pub scope: RateScope,
}

/// Where a rule's bucket is kept.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum RateScope {
    /// In this daemon (one bucket per agent uid).
    #[default]
    Local,
    /// In the shared store (`[ratelimit] store`): one bucket for the whole fleet.
    Fleet,
}

impl RateScope {
    pub fn as_str(self) -> &'static str {
        match self {
            RateScope::Local => "local",
            RateScope::Fleet => "fleet",
        }
    }
}

impl RateLimit {
    /// Time to earn one token: `per / requests` (at least 1 µs given the bounds).
    pub fn token_interval(&self) -> Duration {
        self.per / self.requests.max(1)
    }
}

/// What the proxy must enforce for a request the rule allows (or after an `ask` is approved).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize)]
pub struct Obligations {
    pub rate: Option<RateLimit>,
    /// Requests in flight at once, per host, under this rule.
    pub max_concurrent: Option<u32>,
    /// LLM tokens the rule's responses may spend per window (`policy/budget.rs`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub budget: Option<super::budget::TokenBudget>,
}

impl Obligations {
    pub fn is_empty(&self) -> bool {
        self.rate.is_none() && self.max_concurrent.is_none() && self.budget.is_none()
    }
}

/// `rate = { ... }` as written in TOML.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RateFile {
    pub requests: Spanned<i64>,
    pub per: Spanned<String>,
    pub burst: Option<Spanned<i64>>,
    pub scope: Option<Spanned<String>>,
}

/// Why a written `rate` is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum RateError {
    #[error("`{key}` must be between 1 and {MAX_RATE_REQUESTS}, not {value}")]
    Count { key: &'static str, value: i64 },
    #[error(
        "`rate.burst` = 0 would refuse every request (burst is the bucket size; \
         use action = \"deny\" to block)"
    )]
    ZeroBurst,
    #[error(
        "invalid `rate.per` {0:?}: use a whole number with a unit (\"30s\", \"1m\", \"1h\") \
         or \"second\", \"minute\", \"hour\""
    )]
    Per(String),
    #[error("`rate.per` {0:?} must be between 1s and 24h")]
    PerOutOfRange(String),
    #[error("unknown `rate.scope` {0:?}, expected \"local\" or \"fleet\"")]
    Scope(String),
}

/// Validates a written rate; the error carries the span of the offending value.
pub(crate) fn compile_rate(r: &RateFile) -> Result<RateLimit, (Range<usize>, RateError)> {
    let count = |v: &Spanned<i64>, key: &'static str| {
        u32::try_from(*v.get_ref())
            .ok()
            .filter(|n| (1..=MAX_RATE_REQUESTS).contains(n))
            .ok_or_else(|| {
                let value = *v.get_ref();
                (v.span(), RateError::Count { key, value })
            })
    };
    let requests = count(&r.requests, "rate.requests")?;
    let per = parse_per(r.per.get_ref()).map_err(|e| (r.per.span(), e))?;
    let burst = match &r.burst {
        Some(b) if *b.get_ref() == 0 => return Err((b.span(), RateError::ZeroBurst)),
        Some(b) => count(b, "rate.burst")?,
        None => requests,
    };
    let scope = match &r.scope {
        None => RateScope::Local,
        Some(s) => parse_scope(s.get_ref()).map_err(|e| (s.span(), e))?,
    };
    Ok(RateLimit {
        requests,
        per,
        burst,
        scope,
    })
}

/// `"local"` or `"fleet"`.
pub(crate) fn parse_scope(s: &str) -> Result<RateScope, RateError> {
    match s {
        "local" => Ok(RateScope::Local),
        "fleet" => Ok(RateScope::Fleet),
        other => Err(RateError::Scope(other.to_owned())),
    }
}

/// `"30s"`, `"1m"`, `"2h"` (whole numbers) or `"second"`, `"minute"`, `"hour"`.
pub(crate) fn parse_per(s: &str) -> Result<Duration, RateError> {
    let secs = match s {
        "second" => Some(1),
        "minute" => Some(60),
        "hour" => Some(3600),
        _ => {
            let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
            let (num, unit) = s.split_at(split);
            let scale = match unit {
                "s" => Some(1),
                "m" => Some(60),
                "h" => Some(3600),
                _ => None,
            };
            // Digits only (no sign, no fraction); bounded so the product cannot overflow.
            let n = (!num.is_empty() && num.len() <= 6)
                .then(|| num.parse::<u64>().ok())
                .flatten();
            n.zip(scale).map(|(n, scale)| n * scale)
        }
    };
    let Some(secs) = secs else {
        return Err(RateError::Per(s.to_owned()));
    };
    let per = Duration::from_secs(secs);
    if per.is_zero() || per > MAX_RATE_PER {
        return Err(RateError::PerOutOfRange(s.to_owned()));
    }
    Ok(per)
}

/// The shortest exact spelling: `1h`, `1m`, `90s`.
fn format_per(d: Duration) -> String {
    let s = d.as_secs();
    if s > 0 && s.is_multiple_of(3600) {
        format!("{}h", s / 3600)
    } else if s > 0 && s.is_multiple_of(60) {
        format!("{}m", s / 60)
    } else {
        format!("{s}s")
    }
}

impl fmt::Display for RateLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} per {}, burst {}",
            self.requests,
            format_per(self.per),
            self.burst
        )?;
        match self.scope {
            RateScope::Local => Ok(()),
            RateScope::Fleet => f.write_str(", fleet-wide"),
        }
    }
}

/// `{"requests":60,"per":"1m","burst":10}`: `per` as written, not serde's `{secs,nanos}`;
/// `"scope":"fleet"` only for a fleet rate (a local one reads as it always did).
impl Serialize for RateLimit {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let fleet = self.scope == RateScope::Fleet;
        let mut st = s.serialize_struct("RateLimit", 3 + usize::from(fleet))?;
        st.serialize_field("requests", &self.requests)?;
        st.serialize_field("per", &format_per(self.per))?;
        st.serialize_field("burst", &self.burst)?;
        if fleet {
            st.serialize_field("scope", self.scope.as_str())?;
        }
        st.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scope_is_local_unless_fleet_is_written() {
        let rate = |text: &str| -> Result<RateLimit, String> {
            let f: RateFile = toml::from_str(text).map_err(|e| e.to_string())?;
            compile_rate(&f).map_err(|(_, e)| e.to_string())
        };
        let local = rate("requests = 5\nper = \"1m\"").expect("local");
        assert_eq!(local.scope, RateScope::Local);
        let explicit = rate("requests = 5\nper = \"1m\"\nscope = \"local\"").expect("local");
        assert_eq!(explicit, local);
        let fleet = rate("requests = 5\nper = \"1m\"\nscope = \"fleet\"").expect("fleet");
        assert_eq!(fleet.scope, RateScope::Fleet);
        assert_eq!((fleet.requests, fleet.burst), (5, 5));
        let bad = rate("requests = 5\nper = \"1m\"\nscope = \"global\"").expect_err("bad");
        assert!(
            bad.contains("\"global\"") && bad.contains("\"fleet\""),
            "{bad}"
        );
        let typed = rate("requests = 5\nper = \"1m\"\nscope = 1").expect_err("not a string");
        assert!(
            typed.contains("scope") || typed.contains("string"),
            "{typed}"
        );
    }

    #[test]
    fn per_forms() {
        let ok = [
            ("1s", 1),
            ("30s", 30),
            ("1m", 60),
            ("90m", 5400),
            ("1h", 3600),
            ("24h", 86400),
            ("second", 1),
            ("minute", 60),
            ("hour", 3600),
        ];
        for (s, secs) in ok {
            assert_eq!(parse_per(s), Ok(Duration::from_secs(secs)), "{s}");
        }
        for bad in [
            "", "0s", "1", "m", "1.5m", "-1s", "1 m", "1d", "25h", "1M", "+1s", "9999999h",
        ] {
            assert!(parse_per(bad).is_err(), "{bad:?}");
        }
        assert!(parse_per("0s")
            .expect_err("zero")
            .to_string()
            .contains("between 1s and 24h"));
    }

    #[test]
    fn formats_and_serializes() {
        let r = RateLimit {
            requests: 60,
            per: Duration::from_secs(60),
            burst: 10,
            scope: RateScope::Local,
        };
        assert_eq!(r.to_string(), "60 per 1m, burst 10");
        assert_eq!(r.token_interval(), Duration::from_secs(1));
        let o = Obligations {
            rate: Some(r),
            max_concurrent: Some(4),
            budget: None,
        };
        let json = serde_json::to_string(&o).expect("serializes");
        assert_eq!(
            json,
            r#"{"rate":{"requests":60,"per":"1m","burst":10},"max_concurrent":4}"#
        );
        assert_eq!(
            serde_json::to_string(&Obligations::default()).expect("serializes"),
            r#"{"rate":null,"max_concurrent":null}"#
        );
        assert_eq!(format_per(Duration::from_secs(90)), "90s");
        let fleet = RateLimit {
            scope: RateScope::Fleet,
            ..r
        };
        assert_eq!(fleet.to_string(), "60 per 1m, burst 10, fleet-wide");
        assert_eq!(
            serde_json::to_string(&fleet).expect("serializes"),
            r#"{"requests":60,"per":"1m","burst":10,"scope":"fleet"}"#
        );
        assert_eq!(format_per(Duration::from_secs(7200)), "2h");
    }
}
