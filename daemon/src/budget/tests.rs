use std::time::Duration;

use super::*;

fn budget(tokens: u64, secs: u64, scope: BudgetScope) -> TokenBudget {
    TokenBudget {
        tokens,
        per: Duration::from_secs(secs),
        scope,
    }
}

#[test]
fn counters_are_per_subject_and_reset_with_the_window() {
    let b = TokenBudgets::new(&Registry::new(), "t");
    let rule: Arc<str> = "llm".into();
    let day = budget(100, 86_400, BudgetScope::Agent);
    let t = 1_796_622_000_000;
    let a = Subject::Agent(Some(1001));
    let other = Subject::Agent(Some(1002));
    assert_eq!(b.standing(&rule, day, &a, t).spent, 0);
    assert_eq!(b.charge(&rule, day, &a, 60, t).spent, 60);
    assert_eq!(b.charge(&rule, day, &a, 50, t + 1).spent, 110);
    assert_eq!(b.standing(&rule, day, &a, t + 2).spent, 110);
    assert_eq!(b.standing(&rule, day, &other, t).spent, 0);
    let next_day = Window::at(day.per, t).ends_ms;
    assert_eq!(b.standing(&rule, day, &a, next_day).spent, 0);
    assert_eq!(b.charge(&rule, day, &a, 5, next_day).spent, 5);
    // A changed `per` starts a fresh count.
    let hour = budget(100, 3600, BudgetScope::Agent);
    assert_eq!(b.standing(&rule, hour, &a, next_day).spent, 0);
}

#[test]
fn a_full_table_shares_one_overflow_counter_per_rule() {
    let b = TokenBudgets::new(&Registry::new(), "t");
    let rule: Arc<str> = "llm".into();
    let per_host = budget(10, 86_400, BudgetScope::Host);
    let t = 1_796_622_000_000;
    for i in 0..MAX_COUNTERS {
        b.charge(
            &rule,
            per_host,
            &Subject::Host(format!("h{i}").into()),
            1,
            t,
        );
    }
    let late: Subject = Subject::Host("late.test".into());
    b.charge(&rule, per_host, &late, 4, t);
    let again = Subject::Host("later.test".into());
    assert_eq!(b.charge(&rule, per_host, &again, 4, t).spent, 8);
    assert_eq!(b.standing(&rule, per_host, &again, t).spent, 8);
    assert!(b.lock().len() <= MAX_COUNTERS + 1);
    // Past windows make room.
    let tomorrow = Window::at(per_host.per, t).ends_ms;
    assert_eq!(b.charge(&rule, per_host, &late, 1, tomorrow).spent, 1);
}

#[test]
fn the_meter_counts_usage_or_estimates_and_settles_once() {
    let budgets = Arc::new(TokenBudgets::new(&Registry::new(), "t"));
    let rule: Arc<str> = "llm".into();
    let b = budget(1000, 86_400, BudgetScope::Agent);
    let who = Subject::Agent(Some(7));
    let before = budgets.standing(&rule, b, &who, window::now_ms());
    let m = Meter::new(
        budgets.clone(),
        rule.clone(),
        b,
        who.clone(),
        Some(7),
        before,
        None,
    );
    let mut h = http::HeaderMap::new();
    h.insert(
        http::header::CONTENT_TYPE,
        "application/json".parse().expect("value"),
    );
    m.respond(&h);
    drop(m);
    let m = Meter::new(
        budgets.clone(),
        rule.clone(),
        b,
        who.clone(),
        Some(7),
        before,
        None,
    );
    m.respond(&h);
    m.feed(br#"{"usage":{"input_tokens":20,"#);
    m.feed(br#""output_tokens":22}}"#);
    let facts = m.settle(100);
    assert_eq!(
        (facts.tokens, facts.estimated, facts.spent, facts.limit),
        (42, false, 42, 1000)
    );
    assert_eq!(m.settle(100), facts, "settled once");
    let opaque = Meter::new(budgets.clone(), rule.clone(), b, who, Some(7), before, None);
    let mut gz = http::HeaderMap::new();
    gz.insert(
        http::header::CONTENT_ENCODING,
        "gzip".parse().expect("value"),
    );
    opaque.respond(&gz);
    opaque.feed(&[0u8; 37]);
    let est = opaque.settle(100);
    assert_eq!((est.tokens, est.estimated, est.spent), (35, true, 77));
}

#[test]
fn a_request_that_sent_and_got_nothing_spends_nothing() {
    let budgets = Arc::new(TokenBudgets::new(&Registry::new(), "t"));
    let rule: Arc<str> = "llm".into();
    let b = budget(10, 86_400, BudgetScope::Host);
    let who = Subject::Host("api.test".into());
    let before = budgets.standing(&rule, b, &who, window::now_ms());
    let m = Meter::new(
        budgets.clone(),
        rule.clone(),
        b,
        who.clone(),
        None,
        before,
        None,
    );
    let facts = m.settle(0);
    assert_eq!((facts.tokens, facts.estimated, facts.spent), (0, false, 0));
    // Sent, but no response (an upstream failure): the request's bytes / 4, estimated.
    let m = Meter::new(budgets, rule, b, who, None, before, None);
    let facts = m.settle(9);
    assert_eq!((facts.tokens, facts.estimated, facts.spent), (3, true, 3));
}
