//! A rule's LLM token budget: `budget = { tokens = 2_000_000, per = "1d", scope = "agent" }`.
//! The policy only validates and carries it; the proxy counts the tokens of each response
//! (`crate::budget`) and refuses the next request once the budget is spent.
//!
//! `per` is a fixed window aligned to the Unix epoch (`"1d"` resets at 00:00 UTC, `"1h"` on
//! the hour); `scope` says whose counter: each agent uid's (`"agent"`, the default), each
//! destination host's (`"host"`), or one shared by every daemon of the fleet (`"fleet"`,
//! kept in `[ratelimit] store`).

use std::fmt;
use std::ops::Range;
use std::time::Duration;

use serde::{Deserialize, Serialize, Serializer};
use toml::Spanned;

/// Bounds that catch typos without limiting real use.
pub(crate) const MAX_BUDGET_TOKENS: u64 = 1_000_000_000_000;
/// The shortest window: one second (tests use a few seconds).
pub(crate) const MIN_BUDGET_PER: Duration = Duration::from_secs(1);
/// The longest window: 31 days.
pub(crate) const MAX_BUDGET_PER: Duration = Duration::from_secs(31 * 86_400);

/// A rule's token budget (see the module docs). Invariants: `tokens` in
/// `1..=MAX_BUDGET_TOKENS`, `per` a whole number of seconds in `1s..=31d`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TokenBudget {
    pub tokens: u64,
    pub per: Duration,
    pub scope: BudgetScope,
}

/// Whose counter a request spends from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum BudgetScope {
    /// One counter per rule and agent uid, in this daemon.
    #[default]
    Agent,
    /// One counter per rule and destination host, in this daemon.
    Host,
    /// One counter per rule in the fleet's shared store.
    Fleet,
}

impl BudgetScope {
    pub fn as_str(self) -> &'static str {
        match self {
            BudgetScope::Agent => "agent",
            BudgetScope::Host => "host",
            BudgetScope::Fleet => "fleet",
        }
    }
}

/// `budget = { ... }` as written in TOML.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct BudgetFile {
    pub tokens: Spanned<i64>,
    pub per: Spanned<String>,
    pub scope: Option<Spanned<String>>,
}

/// Why a written `budget` is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum BudgetError {
    #[error("`budget.tokens` must be between 1 and {MAX_BUDGET_TOKENS}, not {0}")]
    Tokens(i64),
    #[error(
        "invalid `budget.per` {0:?}: use a whole number with a unit (\"30s\", \"15m\", \"1h\", \
         \"1d\") or \"minute\", \"hour\", \"day\""
    )]
    Per(String),
    #[error("`budget.per` {0:?} must be between 1s and 31d")]
    PerOutOfRange(String),
    #[error("unknown `budget.scope` {0:?}, expected \"agent\", \"host\" or \"fleet\"")]
    Scope(String),
}

/// Validates a written budget; the error carries the span of the offending value.
pub(crate) fn compile_budget(b: &BudgetFile) -> Result<TokenBudget, (Range<usize>, BudgetError)> {
    let tokens = u64::try_from(*b.tokens.get_ref())
        .ok()
        .filter(|n| (1..=MAX_BUDGET_TOKENS).contains(n))
        .ok_or_else(|| (b.tokens.span(), BudgetError::Tokens(*b.tokens.get_ref())))?;
    let per = parse_per(b.per.get_ref()).map_err(|e| (b.per.span(), e))?;
    let scope = match &b.scope {
        None => BudgetScope::Agent,
        Some(s) => match s.get_ref().as_str() {
            "agent" => BudgetScope::Agent,
            "host" => BudgetScope::Host,
            "fleet" => BudgetScope::Fleet,
            other => return Err((s.span(), BudgetError::Scope(other.to_owned()))),
        },
    };
    Ok(TokenBudget { tokens, per, scope })
}

/// The span of `scope = "fleet"` in a rule's budget (the rule compiled, so it is valid).
pub(crate) fn fleet_scope(def: &super::model::RuleDef) -> Option<Range<usize>> {
    let scope = def.budget.as_ref()?.get_ref().scope.as_ref()?;
    (scope.get_ref() == BudgetScope::Fleet.as_str()).then(|| scope.span())
}

/// `"2s"`, `"15m"`, `"1h"`, `"1d"` (whole numbers) or `"second"`, `"minute"`, `"hour"`,
/// `"day"`.
pub(crate) fn parse_per(s: &str) -> Result<Duration, BudgetError> {
    let secs = match s {
        "second" => Some(1),
        "minute" => Some(60),
        "hour" => Some(3600),
        "day" => Some(86_400),
        _ => {
            let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
            let (num, unit) = s.split_at(split);
            let scale = match unit {
                "s" => Some(1),
                "m" => Some(60),
                "h" => Some(3600),
                "d" => Some(86_400),
                _ => None,
            };
            // Digits only; bounded so the product cannot overflow.
            let n = (!num.is_empty() && num.len() <= 8)
                .then(|| num.parse::<u64>().ok())
                .flatten();
            n.zip(scale).map(|(n, scale)| n * scale)
        }
    };
    let Some(secs) = secs else {
        return Err(BudgetError::Per(s.to_owned()));
    };
    let per = Duration::from_secs(secs);
    if per < MIN_BUDGET_PER || per > MAX_BUDGET_PER {
        return Err(BudgetError::PerOutOfRange(s.to_owned()));
    }
    Ok(per)
}

/// The shortest exact spelling: `1d`, `1h`, `1m`, `90s`.
pub fn format_per(d: Duration) -> String {
    let s = d.as_secs();
    if s > 0 && s.is_multiple_of(86_400) {
        format!("{}d", s / 86_400)
    } else if s > 0 && s.is_multiple_of(3600) {
        format!("{}h", s / 3600)
    } else if s > 0 && s.is_multiple_of(60) {
        format!("{}m", s / 60)
    } else {
        format!("{s}s")
    }
}

impl fmt::Display for TokenBudget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} tokens per {} per {}",
            self.tokens,
            format_per(self.per),
            self.scope.as_str()
        )
    }
}

/// `{"tokens":2000000,"per":"1d","scope":"agent"}`.
impl Serialize for TokenBudget {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut st = s.serialize_struct("TokenBudget", 3)?;
        st.serialize_field("tokens", &self.tokens)?;
        st.serialize_field("per", &format_per(self.per))?;
        st.serialize_field("scope", self.scope.as_str())?;
        st.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn budget(text: &str) -> Result<TokenBudget, String> {
        let f: BudgetFile = toml::from_str(text).map_err(|e| e.to_string())?;
        compile_budget(&f).map_err(|(_, e)| e.to_string())
    }

    #[test]
    fn forms_and_defaults() {
        let b = budget("tokens = 2_000_000\nper = \"1d\"").expect("valid");
        assert_eq!(
            b,
            TokenBudget {
                tokens: 2_000_000,
                per: Duration::from_secs(86_400),
                scope: BudgetScope::Agent
            }
        );
        assert_eq!(b.to_string(), "2000000 tokens per 1d per agent");
        assert_eq!(
            serde_json::to_string(&b).expect("json"),
            r#"{"tokens":2000000,"per":"1d","scope":"agent"}"#
        );
        let h = budget("tokens = 5\nper = \"2s\"\nscope = \"host\"").expect("host");
        assert_eq!(
            (h.scope, h.per),
            (BudgetScope::Host, Duration::from_secs(2))
        );
        let f = budget("tokens = 5\nper = \"hour\"\nscope = \"fleet\"").expect("fleet");
        assert_eq!(f.scope, BudgetScope::Fleet);
    }

    #[test]
    fn bad_values_name_the_key() {
        for (text, needle) in [
            ("tokens = 0\nper = \"1d\"", "budget.tokens"),
            ("tokens = -5\nper = \"1d\"", "budget.tokens"),
            ("tokens = 5\nper = \"1y\"", "budget.per"),
            ("tokens = 5\nper = \"0s\"", "between 1s and 31d"),
            ("tokens = 5\nper = \"32d\"", "between 1s and 31d"),
            ("tokens = 5\nper = \"1.5h\"", "budget.per"),
            ("tokens = 5\nper = \"1d\"\nscope = \"global\"", "\"global\""),
        ] {
            let e = budget(text).expect_err(text);
            assert!(e.contains(needle), "{text}: {e}");
        }
        let unknown = budget("tokens = 5\nper = \"1d\"\nrequests = 3").expect_err("unknown key");
        assert!(unknown.contains("requests"), "{unknown}");
        assert!(budget("per = \"1d\"").is_err());
    }

    #[test]
    fn per_spellings() {
        for (s, secs) in [
            ("1s", 1),
            ("2s", 2),
            ("90m", 5400),
            ("1h", 3600),
            ("1d", 86_400),
            ("31d", 31 * 86_400),
            ("day", 86_400),
        ] {
            assert_eq!(parse_per(s), Ok(Duration::from_secs(secs)), "{s}");
        }
        assert_eq!(format_per(Duration::from_secs(86_400 * 7)), "7d");
        assert_eq!(format_per(Duration::from_secs(7200)), "2h");
        assert_eq!(format_per(Duration::from_secs(90)), "90s");
    }

    fn load(text: &str) -> Result<super::super::Policy, String> {
        let src = super::super::PolicySource {
            name: "llm.toml".into(),
            text: text.into(),
        };
        super::super::Policy::from_sources(&[src]).map_err(|e| e.to_string())
    }

    #[test]
    fn rules_carry_budgets_and_fleet_ones_need_a_store() {
        let text = "version = 1\n[[rule]]\nid = \"llm\"\nhosts = [\"api.openai.test\"]\n\
                    action = \"allow\"\nbudget = { tokens = 1_000, per = \"1h\" }\n\n\
                    [[rule]]\nid = \"shared\"\nhosts = [\"api.anthropic.test\"]\n\
                    action = \"allow\"\nbudget = { tokens = 9, per = \"1d\", scope = \"fleet\" }\n";
        let p = load(text).expect("valid");
        assert!(p.has_fleet_rules());
        p.check_fleet(true).expect("with a store");
        let e = p.check_fleet(false).expect_err("no store").to_string();
        assert!(e.starts_with("llm.toml:12:"), "{e}");
        assert!(
            e.contains("shared")
                && e.contains("`budget.scope = \"fleet\"`")
                && e.contains("[ratelimit] store"),
            "{e}"
        );
        let facts = super::super::RequestFacts {
            host: "api.openai.test",
            port: 443,
            scheme: super::super::Scheme::Https,
            method: Some("POST"),
            path: Some("/v1/chat/completions"),
            agent: Some(1001),
        };
        let d = p.decide(&facts);
        assert_eq!(
            d.obligations.budget,
            Some(TokenBudget {
                tokens: 1000,
                per: Duration::from_secs(3600),
                scope: BudgetScope::Agent
            })
        );
        let deny = "version = 1\n[[rule]]\nid = \"no\"\nhosts = [\"x.test\"]\naction = \"deny\"\n\
                    budget = { tokens = 5, per = \"1d\" }\n";
        let e = load(deny).expect_err("deny with a budget");
        assert!(e.contains("`budget` applies only to"), "{e}");
        let bad = "version = 1\n[[rule]]\nid = \"b\"\nhosts = [\"x.test\"]\naction = \"allow\"\n\
                   budget = { tokens = 5, per = \"1d\", window = \"x\" }\n";
        let e = load(bad).expect_err("unknown key");
        assert!(e.contains("window"), "{e}");
    }
}
