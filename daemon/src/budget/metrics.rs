//! The token budgets' series: tokens counted and what is left, by rule and agent (the agent
//! is a local uid, so the labels stay as few as the policy's rules times the agent users).

use prometheus::{IntCounterVec, IntGaugeVec, Opts, Registry};

#[derive(Clone)]
pub(crate) struct BudgetMetrics {
    tokens: IntCounterVec,
    estimated: IntCounterVec,
    remaining: IntGaugeVec,
    exhausted: IntCounterVec,
}

impl BudgetMetrics {
    /// Registers the series in `r`, each name under `namespace`.
    pub(crate) fn register(r: &Registry, namespace: &str) -> BudgetMetrics {
        let opts = |name: &str, help: &str| Opts::new(name, help).namespace(namespace);
        let counter = |name, help, labels: &[&str]| {
            let c = IntCounterVec::new(opts(name, help), labels).expect("valid metric definition");
            r.register(Box::new(c.clone())).expect("unique metric name");
            c
        };
        let tokens = counter(
            "budget_tokens_total",
            "LLM tokens counted against rules' token budgets, by rule and agent uid.",
            &["rule", "agent"],
        );
        let estimated = counter(
            "budget_estimated_responses_total",
            "Responses under a token budget whose usage could not be read, counted as \
             (request + response body bytes) / 4, by rule.",
            &["rule"],
        );
        let exhausted = counter(
            "budget_exhausted_total",
            "Requests refused because their rule's token budget was spent, by rule and agent uid.",
            &["rule", "agent"],
        );
        let remaining = IntGaugeVec::new(
            opts(
                "budget_remaining_tokens",
                "Tokens left in the current window of a rule's budget, by rule and agent uid \
                 (scope = \"agent\"; `fleet` for a fleet-wide budget as this daemon last saw it).",
            ),
            &["rule", "agent"],
        )
        .expect("valid metric definition");
        r.register(Box::new(remaining.clone()))
            .expect("unique metric name");
        BudgetMetrics {
            tokens,
            estimated,
            remaining,
            exhausted,
        }
    }

    pub(crate) fn counted(&self, rule: &str, agent: &str, tokens: u64, estimated: bool) {
        self.tokens.with_label_values(&[rule, agent]).inc_by(tokens);
        if estimated {
            self.estimated.with_label_values(&[rule]).inc();
        }
    }

    pub(crate) fn remaining(&self, rule: &str, agent: &str, left: u64) {
        self.remaining
            .with_label_values(&[rule, agent])
            .set(i64::try_from(left).unwrap_or(i64::MAX));
    }

    pub(crate) fn exhausted(&self, rule: &str, agent: &str) {
        self.exhausted.with_label_values(&[rule, agent]).inc();
    }
}
