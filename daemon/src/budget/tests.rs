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
    assert_eq!(b.standing(&rule, day, &a, None, t).spent, 0);
    assert_eq!(b.charge(&rule, day, &a, None, 60, t).spent, 60);
    assert_eq!(b.charge(&rule, day, &a, None, 50, t + 1).spent, 110);
    assert_eq!(b.standing(&rule, day, &a, None, t + 2).spent, 110);
    assert_eq!(b.standing(&rule, day, &other, None, t).spent, 0);
    let next_day = Window::at(day.per, t).ends_ms;
    assert_eq!(b.standing(&rule, day, &a, None, next_day).spent, 0);
    assert_eq!(b.charge(&rule, day, &a, None, 5, next_day).spent, 5);
    // A changed `per` starts a fresh count.
    let hour = budget(100, 3600, BudgetScope::Agent);
    assert_eq!(b.standing(&rule, hour, &a, None, next_day).spent, 0);
}

#[test]
fn an_agent_that_fills_the_host_table_spends_only_its_own_overflow() {
    let b = TokenBudgets::new(&Registry::new(), "t");
    let rule: Arc<str> = "llm".into();
    let per_host = budget(10, 86_400, BudgetScope::Host);
    let per_agent = budget(10, 86_400, BudgetScope::Agent);
    let t = 1_796_622_000_000;
    let (attacker, other) = (Some(1001), Some(1002));
    // One agent names MAX_COUNTERS hosts the rule matches.
    for i in 0..MAX_COUNTERS {
        let host = Subject::Host(format!("h{i}.example").into());
        b.charge(&rule, per_host, &host, attacker, 1, t);
    }
    // Its next hosts go to its overflow counter, which every host it reaches answers to.
    let late = Subject::Host("late.example".into());
    assert_eq!(b.charge(&rule, per_host, &late, attacker, 4, t).spent, 4);
    let later = Subject::Host("later.example".into());
    assert_eq!(b.charge(&rule, per_host, &later, attacker, 4, t).spent, 8);
    assert_eq!(b.standing(&rule, per_host, &later, attacker, t).spent, 8);
    let h0 = Subject::Host("h0.example".into());
    assert_eq!(b.standing(&rule, per_host, &h0, attacker, t).spent, 9);
    // Another agent's new host is not charged to it: its own overflow, from 0.
    let theirs = Subject::Host("theirs.example".into());
    assert_eq!(b.standing(&rule, per_host, &theirs, other, t).spent, 0);
    assert_eq!(b.charge(&rule, per_host, &theirs, other, 3, t).spent, 3);
    assert_eq!(b.standing(&rule, per_host, &h0, other, t).spent, 4);
    // Agent counters are never crowded out by hosts.
    let me = Subject::Agent(other);
    assert_eq!(b.charge(&rule, per_agent, &me, other, 2, t).spent, 2);
    assert_eq!(b.lock().hosts, MAX_COUNTERS);
    assert!(b.lock().map.len() <= MAX_COUNTERS + 3);
    // Past windows make room (swept at most once a second).
    let tomorrow = Window::at(per_host.per, t).ends_ms + 1000;
    assert_eq!(
        b.charge(&rule, per_host, &late, attacker, 1, tomorrow)
            .spent,
        1
    );
    assert_eq!(b.lock().hosts, 1);
}

#[test]
fn the_meter_counts_usage_or_estimates_and_settles_once() {
    let budgets = Arc::new(TokenBudgets::new(&Registry::new(), "t"));
    let rule: Arc<str> = "llm".into();
    let b = budget(1000, 86_400, BudgetScope::Agent);
    let who = Subject::Agent(Some(7));
    let before = budgets.standing(&rule, b, &who, Some(7), window::now_ms());
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
    let before = budgets.standing(&rule, b, &who, Some(7), window::now_ms());
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
