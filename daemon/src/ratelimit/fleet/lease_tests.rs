use super::*;

const T: Terms = Terms {
    requests: 200,
    unit_us: 3_600_000_000,
    burst: 200,
};

fn want(take: Take) -> u32 {
    match take {
        Take::Ask { want, .. } => want,
        Take::Leased => panic!("expected a store call, got a leased token"),
    }
}

#[tokio::test(start_paused = true)]
async fn a_rarely_checked_key_asks_for_its_own_token_only() {
    let l = Leases::default();
    for _ in 0..5 {
        let now = Instant::now();
        assert_eq!(
            l.take("k", T, now),
            Take::Ask {
                want: 1,
                returning: None
            }
        );
        assert_eq!(l.granted("k", T, 1, 0, now), Kept::default());
        tokio::time::advance(Duration::from_millis(250)).await;
    }
}

#[tokio::test(start_paused = true)]
async fn want_follows_the_checks_of_the_last_ttl_bounded() {
    let l = Leases::default();
    let now = Instant::now();
    // 10 checks in the first window, each answered with its own token only.
    for i in 1..=10u32 {
        let w = want(l.take("k", T, now));
        assert_eq!(w, i, "demand so far in this window");
        l.granted("k", T, w, 0, now);
    }
    tokio::time::advance(LEASE_TTL).await;
    // Next window: the last one's 10 checks.
    let now = Instant::now();
    let w = want(l.take("k", T, now));
    assert_eq!(w, 10);
    // A second check while the first call is in flight asks for its own token only.
    assert_eq!(want(l.take("k", T, now)), 1);
    l.granted("k", T, 1, 0, now);
    l.failed("k", w);
    // Bounded.
    for _ in 0..(MAX_WANT + 200) {
        let w = want(l.take("k", T, now));
        l.granted("k", T, w, 0, now);
    }
    tokio::time::advance(LEASE_TTL).await;
    assert_eq!(want(l.take("k", T, Instant::now())), MAX_WANT);
    // Quiet for two windows: back to one.
    l.failed("k", MAX_WANT);
    tokio::time::advance(3 * LEASE_TTL).await;
    assert_eq!(want(l.take("k", T, Instant::now())), 1);
}

#[tokio::test(start_paused = true)]
async fn a_lease_is_spent_only_before_its_ttl_then_returned() {
    let l = Leases::default();
    let now = Instant::now();
    assert_eq!(want(l.take("k", T, now)), 1);
    let kept = l.granted("k", T, 1, 3, now);
    assert!(kept.start_sweep && kept.returning.is_empty());
    assert_eq!(l.take("k", T, now), Take::Leased);
    tokio::time::advance(LEASE_TTL - Duration::from_millis(1)).await;
    assert_eq!(l.take("k", T, Instant::now()), Take::Leased);
    tokio::time::advance(Duration::from_millis(1)).await;
    // Expired with one token left: the check goes to the store and sends it back.
    match l.take("k", T, Instant::now()) {
        Take::Ask {
            returning: Some(r), ..
        } => assert_eq!(
            r,
            Return {
                key: "k".into(),
                terms: T,
                tokens: 1
            }
        ),
        other => panic!("{other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn the_sweep_returns_expired_leases_and_stops_when_none_is_left() {
    let l = Leases::default();
    let start = Instant::now();
    for key in ["a", "b"] {
        l.take(key, T, start);
    }
    assert!(l.granted("a", T, 1, 4, start).start_sweep);
    tokio::time::advance(Duration::from_millis(30)).await;
    let later = Instant::now();
    // One sweep per thread at a time.
    assert!(!l.granted("b", T, 1, 2, later).start_sweep);
    let (back, next) = l.sweep(later);
    assert!(back.is_empty());
    assert_eq!(next, Some(start + LEASE_TTL));
    tokio::time::advance(LEASE_TTL - Duration::from_millis(30)).await;
    let (back, next) = l.sweep(Instant::now());
    assert_eq!(back.len(), 1);
    assert_eq!((back[0].key.as_str(), back[0].tokens), ("a", 4));
    assert_eq!(next, Some(later + LEASE_TTL));
    tokio::time::advance(Duration::from_millis(30)).await;
    let (back, next) = l.sweep(Instant::now());
    assert_eq!((back[0].key.as_str(), back[0].tokens), ("b", 2));
    assert_eq!(next, None);
    // Never spent after it went back; the next grant starts a sweep again.
    assert!(matches!(l.take("a", T, Instant::now()), Take::Ask { .. }));
    assert!(l.granted("a", T, 1, 1, Instant::now()).start_sweep);
}

#[tokio::test(start_paused = true)]
async fn a_grant_joining_a_running_lease_expires_with_it() {
    let l = Leases::default();
    let start = Instant::now();
    l.take("k", T, start);
    l.granted("k", T, 1, 1, start);
    tokio::time::advance(Duration::from_millis(60)).await;
    l.granted("k", T, 1, 5, Instant::now());
    let (_, next) = l.sweep(Instant::now());
    assert_eq!(next, Some(start + LEASE_TTL));
    tokio::time::advance(Duration::from_millis(40)).await;
    let (back, _) = l.sweep(Instant::now());
    assert_eq!(back[0].tokens, 6);
}

#[tokio::test(start_paused = true)]
async fn a_changed_rate_drops_the_lease_under_its_old_terms() {
    let l = Leases::default();
    let now = Instant::now();
    l.take("k", T, now);
    l.granted("k", T, 1, 3, now);
    let new = Terms { requests: 10, ..T };
    match l.take("k", new, now) {
        Take::Ask {
            returning: Some(r), ..
        } => assert_eq!((r.terms, r.tokens), (T, 3)),
        other => panic!("{other:?}"),
    }
    // A grant made under the old terms after the reload goes straight back.
    let kept = l.granted("k", T, 1, 2, now);
    assert_eq!(kept.returning.len(), 1);
    assert_eq!(kept.returning[0].terms, T);
}

#[tokio::test(start_paused = true)]
async fn a_full_table_asks_for_one_token_and_forgets_quiet_keys() {
    let l = Leases::default();
    let now = Instant::now();
    for i in 0..MAX_KEYS {
        let key = format!("k{i}");
        l.take(&key, T, now);
        l.granted(&key, T, 1, 0, now);
    }
    assert_eq!(want(l.take("new", T, now)), 1);
    // Still counted: a granted lease for an untracked key goes straight back.
    let kept = l.granted("new", T, 1, 2, now);
    assert_eq!(kept.returning.len(), 1);
    tokio::time::advance(2 * LEASE_TTL).await;
    l.take("new", T, Instant::now());
    assert_eq!(l.lock().entries.len(), 1, "quiet keys forgotten");
}

#[tokio::test(start_paused = true)]
async fn a_burst_in_one_batch_asks_for_no_lease_and_the_next_check_for_the_burst() {
    let l = Leases::default();
    let now = Instant::now();
    // 20 checks before any answer (one runtime turn): each asks for its own token only.
    for _ in 0..20 {
        assert_eq!(want(l.take("k", T, now)), 1);
    }
    for _ in 0..20 {
        l.granted("k", T, 1, 0, now);
    }
    // The next one, with nothing in flight, asks for what the burst suggests.
    assert_eq!(want(l.take("k", T, now)), 21);
}
