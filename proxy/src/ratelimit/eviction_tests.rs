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
    vec![(LimitKey::Host(format!("h{i}.example")), cfg)]
}

#[tokio::test(start_paused = true)]
async fn idle_full_buckets_are_evicted_by_sweep() {
    let l = Limiter::new();
    for i in 0..5000 {
        assert_eq!(l.check(&host(i)), Ok(()));
    }
    assert_eq!(l.len(), 5000);
    advance(Duration::from_secs(9 * 60)).await; // refilled, but not idle for long enough
    assert_eq!(l.sweep(), 0);
    advance(Duration::from_secs(60 + 1)).await;
    assert_eq!(l.sweep(), 5000);
    assert_eq!(l.len(), 0);
    assert!(l.is_empty());
}

#[tokio::test(start_paused = true)]
async fn check_runs_the_idle_sweep_by_itself() {
    let l = Limiter::new();
    for i in 0..1000 {
        assert_eq!(l.check(&host(i)), Ok(()));
    }
    advance(DEFAULT_IDLE_TTL + Duration::from_secs(1)).await;
    assert_eq!(l.check(&host(1_000_000)), Ok(()));
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
    assert_eq!(l.check(&k), Ok(()));
    advance(Duration::from_secs(11 * 60)).await;
    assert_eq!(l.sweep(), 0);
    let e = l.check(&k).expect_err("still empty");
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
        assert_eq!(l.check(&host_with(i, slow)), Ok(()));
    }
    // Table full of non-full buckets: a new key is refused; nothing is evicted.
    let e = l.check(&host_with(3, slow)).expect_err("table full");
    assert_eq!(e.key, LimitKey::Host("h3.example".into()));
    assert_eq!(e.retry_after_secs(), 1);
    assert!(l.check(&host_with(4, slow)).is_err()); // no second sweep in the same second
    let s = l.stats();
    assert_eq!((s.buckets, s.refused_table_full, s.refused_host), (3, 2, 2));
    // Existing keys are unaffected by the cap.
    assert_eq!(
        l.check(&host_with(0, slow)).err().map(|e| e.retry_after),
        Some(HOUR)
    );

    // Once buckets are full again, the pressure sweep frees room regardless of idle time.
    advance(HOUR).await;
    assert_eq!(l.check(&host_with(3, slow)), Ok(()));
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
    assert_eq!(l.check(&host_with(7, cfg)), Ok(()));
    advance(Duration::from_secs(11 * 60)).await;
    assert_eq!(l.sweep(), 1);
    // The recreated bucket is exactly what the evicted one had become: full at 2.
    assert_eq!(l.check(&host_with(7, cfg)), Ok(()));
    assert_eq!(l.check(&host_with(7, cfg)), Ok(()));
    assert!(l.check(&host_with(7, cfg)).is_err());
}
