use std::sync::Arc;
use std::time::Duration;

use tokio::time::advance;

use super::*;

const NS: Duration = Duration::from_nanos(1);
/// The agent most tests spend as.
const A: AgentKey = AgentKey::Uid(5200);

fn rl(requests: u32, per: Duration, burst: u32) -> RateLimit {
    RateLimit {
        requests,
        per,
        burst,
    }
}

fn rule(id: &str) -> LimitKey {
    LimitKey::Rule(Arc::from(id))
}

fn host(h: &str) -> LimitKey {
    LimitKey::Secret(h.to_owned())
}

fn one(key: &LimitKey, cfg: RateLimit) -> Vec<(LimitKey, RateLimit)> {
    vec![(key.clone(), cfg)]
}

fn refused(l: &Limiter, keys: &[(LimitKey, RateLimit)]) -> Limited {
    match l.check(A, keys) {
        Err(e) => e,
        Ok(()) => panic!("expected a refusal for {keys:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn burst_then_refuse_then_one_per_interval() {
    let l = Limiter::new();
    let k = one(&rule("r"), rl(4, Duration::from_secs(1), 3));
    for _ in 0..3 {
        assert_eq!(l.check(A, &k), Ok(()));
    }
    let e = refused(&l, &k);
    assert_eq!(e.key, rule("r"));
    assert_eq!(e.retry_after, Duration::from_millis(250));
    assert_eq!(e.retry_after_secs(), 1);

    advance(Duration::from_millis(250)).await; // per / requests
    assert_eq!(l.check(A, &k), Ok(()));
    assert!(l.check(A, &k).is_err());

    // A long idle period refills to `burst` and no further.
    advance(Duration::from_secs(3600)).await;
    assert_eq!(l.tokens(A, &rule("r")), Some(3.0));
    for _ in 0..3 {
        assert_eq!(l.check(A, &k), Ok(()));
    }
    assert!(l.check(A, &k).is_err());
    assert_eq!(l.stats().refused_rule, 3);
}

#[tokio::test(start_paused = true)]
async fn each_agent_has_its_own_bucket() {
    // Agent A drains the rule's and the secret's buckets; agent B still has full ones.
    let l = Limiter::new();
    let b = AgentKey::Uid(5201);
    let keys = [
        (rule("r"), rl(1, Duration::from_secs(3600), 2)),
        (host("tok"), rl(1, Duration::from_secs(3600), 5)),
    ];
    for _ in 0..2 {
        assert_eq!(l.check(A, &keys), Ok(()));
    }
    assert_eq!(refused(&l, &keys).key, rule("r"));
    for _ in 0..2 {
        assert_eq!(l.check(b, &keys), Ok(()), "agent B is not starved by A");
    }
    assert!(l.check(b, &keys).is_err());
    assert_eq!(l.tokens(A, &host("tok")), Some(3.0));
    assert_eq!(l.tokens(b, &host("tok")), Some(3.0));
    assert_eq!(l.len(), 4);
}

#[tokio::test(start_paused = true)]
async fn agents_of_unknown_uid_share_one_bucket() {
    // Not a fresh budget per connection: every owner-less connection spends the same one.
    let l = Limiter::new();
    let k = one(&rule("r"), rl(1, Duration::from_secs(3600), 1));
    assert_eq!(l.check(AgentKey::of(None), &k), Ok(()));
    assert!(l.check(AgentKey::Unknown, &k).is_err());
    assert_eq!(l.check(AgentKey::of(Some(7)), &k), Ok(()));
    assert_eq!(l.len(), 2);
}

#[tokio::test(start_paused = true)]
async fn sixty_per_minute_burst_ten() {
    let l = Limiter::new();
    let k = one(
        &host("api.example.com"),
        rl(60, Duration::from_secs(60), 10),
    );
    for _ in 0..10 {
        assert_eq!(l.check(A, &k), Ok(()));
    }
    let e = refused(&l, &k);
    assert_eq!(e.retry_after, Duration::from_secs(1));
    assert_eq!(e.retry_after_secs(), 1);
    advance(Duration::from_secs(1)).await;
    assert_eq!(l.check(A, &k), Ok(()));
    assert!(l.check(A, &k).is_err());
}

#[tokio::test(start_paused = true)]
async fn retry_after_is_exact_and_never_early() {
    // 3 per second: a token takes 333_333_333.3 ns, so the wait must round up.
    let l = Limiter::new();
    let k = one(&rule("r"), rl(3, Duration::from_secs(1), 1));
    assert_eq!(l.check(A, &k), Ok(()));
    let e = refused(&l, &k);
    assert_eq!(e.retry_after, Duration::from_nanos(333_333_334));
    advance(e.retry_after - NS).await;
    assert_eq!(refused(&l, &k).retry_after, NS);
    advance(NS).await;
    assert_eq!(l.check(A, &k), Ok(()));
}

#[test]
fn retry_after_secs_rounds_up_with_floor_of_one() {
    let secs = |d| {
        Limited {
            key: rule("r"),
            retry_after: d,
        }
        .retry_after_secs()
    };
    assert_eq!(secs(Duration::ZERO), 1);
    assert_eq!(secs(NS), 1);
    assert_eq!(secs(Duration::from_secs(1)), 1);
    assert_eq!(secs(Duration::from_secs(1) + NS), 2);
    assert_eq!(secs(Duration::MAX), u64::MAX);
}

#[tokio::test(start_paused = true)]
async fn multi_key_check_is_all_or_nothing() {
    let l = Limiter::new();
    let r = (rule("r"), rl(1, Duration::from_secs(3600), 1));
    let h = (host("h.example"), rl(1, Duration::from_secs(3600), 5));
    assert_eq!(l.check(A, std::slice::from_ref(&r)), Ok(()));
    // Rule bucket empty, host bucket full: refused, and the host bucket is not debited.
    let e = refused(&l, &[h.clone(), r.clone()]);
    assert_eq!(e.key, rule("r"));
    assert_eq!(e.retry_after, Duration::from_secs(3600));
    assert_eq!(l.tokens(A, &host("h.example")), Some(5.0));
    for _ in 0..5 {
        assert_eq!(l.check(A, std::slice::from_ref(&h)), Ok(()));
    }
    assert!(l.check(A, &[h]).is_err());
    let s = l.stats();
    assert_eq!((s.refused_rule, s.refused_secret, s.buckets), (1, 1, 2));
}

#[tokio::test(start_paused = true)]
async fn refusal_names_the_longest_wait() {
    let l = Limiter::new();
    let fast = (rule("fast"), rl(1, Duration::from_secs(1), 1));
    let slow = (
        LimitKey::Secret("tok".into()),
        rl(1, Duration::from_secs(60), 1),
    );
    assert_eq!(l.check(A, &[fast.clone(), slow.clone()]), Ok(()));
    let e = refused(&l, &[fast, slow]);
    assert_eq!(e.key, LimitKey::Secret("tok".into()));
    assert_eq!(e.retry_after, Duration::from_secs(60));
    assert_eq!(l.stats().refused_secret, 1);
}

#[tokio::test(start_paused = true)]
async fn duplicate_keys_are_debited_once() {
    let l = Limiter::new();
    let k = (rule("r"), rl(1, Duration::from_secs(3600), 2));
    assert_eq!(l.check(A, &[k.clone(), k.clone()]), Ok(()));
    assert_eq!(l.tokens(A, &rule("r")), Some(1.0));
}

#[tokio::test(start_paused = true)]
async fn config_change_clamps_without_free_refill() {
    let l = Limiter::new();
    let slow = |burst| one(&rule("r"), rl(1, Duration::from_secs(3600), burst));
    for _ in 0..2 {
        assert_eq!(l.check(A, &slow(10)), Ok(()));
    }
    // 8 tokens left; shrinking to 5 clamps to 5 (5 allowed, then refused).
    for _ in 0..5 {
        assert_eq!(l.check(A, &slow(5)), Ok(()));
    }
    assert!(l.check(A, &slow(5)).is_err());
    // Growing capacity does not fill the bucket either.
    assert!(l.check(A, &slow(100)).is_err());
    assert_eq!(l.tokens(A, &rule("r")), Some(0.0));
}

#[tokio::test(start_paused = true)]
async fn rate_change_keeps_partial_credit_exactly() {
    let l = Limiter::new();
    assert_eq!(
        l.check(A, &one(&rule("r"), rl(1, Duration::from_secs(1), 1))),
        Ok(())
    );
    advance(Duration::from_millis(500)).await; // half a token accrued at the old rate
                                               // Halving the rate: the half token is kept, the other half now takes 1 s.
    let e = refused(&l, &one(&rule("r"), rl(1, Duration::from_secs(2), 1)));
    assert_eq!(e.retry_after, Duration::from_secs(1));
    assert_eq!(l.tokens(A, &rule("r")), Some(0.5));
}

#[tokio::test(start_paused = true)]
async fn degenerate_configs_are_safe() {
    let l = Limiter::new();
    let zero_burst = one(&rule("a"), rl(10, Duration::from_secs(1), 0));
    assert_eq!(refused(&l, &zero_burst).retry_after, Duration::MAX);

    let quota = one(&rule("b"), rl(0, Duration::from_secs(1), 2));
    assert_eq!(l.check(A, &quota), Ok(()));
    assert_eq!(l.check(A, &quota), Ok(()));
    assert_eq!(refused(&l, &quota).retry_after, Duration::MAX);

    // per == 0 is treated as 1 ns.
    let instant = one(&rule("c"), rl(1, Duration::ZERO, 1));
    assert_eq!(l.check(A, &instant), Ok(()));
    assert_eq!(refused(&l, &instant).retry_after, NS);
    advance(NS).await;
    assert_eq!(l.check(A, &instant), Ok(()));

    let huge = one(&rule("d"), rl(u32::MAX, Duration::MAX, u32::MAX));
    assert_eq!(l.check(A, &huge), Ok(()));
    assert_eq!(l.check(A, &[]), Ok(()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_checks_grant_exactly_burst() {
    let l = Arc::new(Limiter::new());
    let start = Arc::new(tokio::sync::Barrier::new(1000));
    let tasks: Vec<_> = (0..1000)
        .map(|_| {
            let (l, start) = (Arc::clone(&l), Arc::clone(&start));
            tokio::spawn(async move {
                start.wait().await;
                l.check(A, &one(&rule("r"), rl(1, Duration::from_secs(3600), 100)))
                    .is_ok()
            })
        })
        .collect();
    let mut ok = 0;
    for t in tasks {
        ok += usize::from(t.await.expect("task panicked"));
    }
    assert_eq!(ok, 100);
    assert_eq!(l.stats().refused_rule, 900);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_multi_key_checks_in_both_orders_stay_atomic() {
    let l = Arc::new(Limiter::new());
    let r = (rule("r"), rl(1, Duration::from_secs(3600), 100));
    let h = (host("h"), rl(1, Duration::from_secs(3600), 60));
    let tasks: Vec<_> = (0..400)
        .map(|i| {
            let l = Arc::clone(&l);
            let keys = if i % 2 == 0 {
                [r.clone(), h.clone()]
            } else {
                [h.clone(), r.clone()]
            };
            tokio::spawn(async move { l.check(A, &keys).is_ok() })
        })
        .collect();
    let mut ok = 0;
    for t in tasks {
        ok += usize::from(t.await.expect("task panicked"));
    }
    assert_eq!(ok, 60);
    // The rule bucket lost exactly the 60 tokens of the successful checks.
    let left = l.tokens(A, &rule("r")).expect("bucket exists");
    assert!((40.0..40.01).contains(&left), "rule bucket has {left}");
}

/// Eviction: only full, idle buckets go, so a returning key never gains a refill.
mod eviction {
    use std::time::Duration;

    use tokio::time::advance;

    use super::*;

    const HOUR: Duration = Duration::from_secs(3600);

    fn host(i: usize) -> Vec<(LimitKey, RateLimit)> {
        host_with(
            i,
            RateLimit {
                requests: 10,
                per: Duration::from_secs(1),
                burst: 5,
            },
        )
    }

    fn host_with(i: usize, cfg: RateLimit) -> Vec<(LimitKey, RateLimit)> {
        vec![(LimitKey::Secret(format!("h{i}.example")), cfg)]
    }

    #[tokio::test(start_paused = true)]
    async fn idle_full_buckets_are_evicted_by_sweep() {
        let l = Limiter::new();
        for i in 0..5000 {
            assert_eq!(l.check(A, &host(i)), Ok(()));
        }
        assert_eq!(l.len(), 5000);
        advance(Duration::from_secs(9 * 60)).await; // refilled, but not idle for long enough
        assert_eq!(l.sweep(), 0);
        advance(Duration::from_secs(60 + 1)).await;
        assert_eq!(l.sweep(), 5000);
        assert_eq!(l.len(), 0);
        assert_eq!(l.len(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn check_runs_the_idle_sweep_by_itself() {
        let l = Limiter::new();
        for i in 0..1000 {
            assert_eq!(l.check(A, &host(i)), Ok(()));
        }
        advance(DEFAULT_IDLE_TTL + Duration::from_secs(1)).await;
        assert_eq!(l.check(A, &host(1_000_000)), Ok(()));
        assert_eq!(l.len(), 1); // only the bucket just used
    }

    #[tokio::test(start_paused = true)]
    async fn buckets_that_are_not_full_are_never_evicted() {
        // Evicting this bucket would hand out a free token long before the hour is up.
        let l = Limiter::new();
        let k = host_with(
            0,
            RateLimit {
                requests: 1,
                per: HOUR,
                burst: 1,
            },
        );
        assert_eq!(l.check(A, &k), Ok(()));
        advance(Duration::from_secs(11 * 60)).await;
        assert_eq!(l.sweep(), 0);
        let e = l.check(A, &k).expect_err("still empty");
        assert_eq!(e.retry_after, Duration::from_secs(49 * 60));
        advance(Duration::from_secs(59 * 60)).await; // full at 60 min, idle since 11 min
        assert_eq!(l.sweep(), 1);
        assert_eq!(l.len(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn table_cap_evicts_full_buckets_then_fails_closed() {
        let l = Limiter::with_limits(3, DEFAULT_IDLE_TTL);
        let slow = RateLimit {
            requests: 1,
            per: HOUR,
            burst: 1,
        };
        for i in 0..3 {
            assert_eq!(l.check(A, &host_with(i, slow)), Ok(()));
        }
        // Table full of non-full buckets: a new key is refused; nothing is evicted.
        let e = l.check(A, &host_with(3, slow)).expect_err("table full");
        assert_eq!(e.key, LimitKey::Secret("h3.example".into()));
        assert_eq!(e.retry_after_secs(), 1);
        assert!(l.check(A, &host_with(4, slow)).is_err()); // no second sweep in the same second
        let s = l.stats();
        assert_eq!(
            (s.buckets, s.refused_table_full, s.refused_secret),
            (3, 2, 2)
        );
        // Existing keys are unaffected by the cap.
        assert_eq!(
            l.check(A, &host_with(0, slow)).err().map(|e| e.retry_after),
            Some(HOUR)
        );

        // Once buckets are full again, the pressure sweep frees room regardless of idle time.
        advance(HOUR).await;
        assert_eq!(l.check(A, &host_with(3, slow)), Ok(()));
        assert_eq!(l.len(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn eviction_is_lossless_for_a_returning_key() {
        let l = Limiter::new();
        let cfg = RateLimit {
            requests: 1,
            per: Duration::from_secs(1),
            burst: 2,
        };
        assert_eq!(l.check(A, &host_with(7, cfg)), Ok(()));
        advance(Duration::from_secs(11 * 60)).await;
        assert_eq!(l.sweep(), 1);
        // The recreated bucket is exactly what the evicted one had become: full at 2.
        assert_eq!(l.check(A, &host_with(7, cfg)), Ok(()));
        assert_eq!(l.check(A, &host_with(7, cfg)), Ok(()));
        assert!(l.check(A, &host_with(7, cfg)).is_err());
    }
}
