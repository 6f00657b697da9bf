//! A lease taken before an outage is still spent during it (its tokens were taken from the
//! bucket), and only before its TTL; a check with no lease needs the store, so
//! `on_store_error` decides it.

use super::*;

fn limiter() -> FleetLimiter {
    // Port 9 (discard) on loopback: never started, so never connected (the store is down).
    let cfg: RateLimitConfig =
        toml::from_str("store = \"redis://127.0.0.1:9/0\"\non_store_error = \"deny\"")
            .expect("config");
    FleetLimiter::new(&cfg, None, &Registry::new(), "t")
        .expect("client")
        .expect("a store")
}

#[tokio::test(start_paused = true)]
async fn a_lease_is_spent_during_an_outage_only_before_its_ttl() {
    let fleet = limiter();
    let rate = RateLimit {
        requests: 10,
        per: Duration::from_secs(60),
        burst: 10,
    };
    let agent = AgentKey::Uid(1000);
    let key = bucket_script::key(&fleet.prefix, "r", fleet.by, agent, "h.test");
    let terms = Terms {
        requests: 10,
        unit_us: 60_000_000,
        burst: 10,
    };
    // What the store granted before it went away: two spare tokens.
    let now = Instant::now();
    let leases = fleet.store.leases();
    assert!(matches!(leases.take(&key, terms, now), Take::Ask { .. }));
    leases.granted(&key, terms, 3, 2, now);

    assert_eq!(
        fleet.check("r", agent, "h.test", rate).await,
        FleetVerdict::Allowed
    );
    // Past its TTL the other one is never spent: the check needs the store.
    tokio::time::advance(lease::LEASE_TTL).await;
    assert_eq!(
        fleet.check("r", agent, "h.test", rate).await,
        FleetVerdict::Refused(StoreErrorReason::Unreachable)
    );
    // Another key, no lease: the store decides, and it is down.
    assert_eq!(
        fleet.check("other", agent, "h.test", rate).await,
        FleetVerdict::Refused(StoreErrorReason::Unreachable)
    );
}
