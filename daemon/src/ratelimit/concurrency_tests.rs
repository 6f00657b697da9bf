use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use super::*;

/// The agent most tests acquire as.
const A: AgentKey = AgentKey::Uid(5200);

#[test]
fn third_acquire_refused_and_drop_frees_a_slot() {
    let caps = ConcurrencyCaps::new();
    let a = caps.acquire(A, "h", 2).expect("first");
    let b = caps.acquire(A, "h", 2).expect("second");
    assert_eq!(b.host(), "h");
    let e = caps.acquire(A, "h", 2).expect_err("third must be refused");
    assert_eq!(
        e,
        AtCapacity {
            agent: A,
            host: "h".into(),
            max: 2
        }
    );
    assert!(caps.acquire(A, "other", 2).is_ok()); // caps are per host
    drop(a);
    assert_eq!(caps.in_flight(A, "h"), 1);
    let _c = caps.acquire(A, "h", 2).expect("slot freed by drop");
    assert!(caps.acquire(A, "h", 2).is_err());
    assert_eq!(caps.refusals(), 2);
}

#[test]
fn each_agent_has_its_own_cap_on_a_host() {
    // Agent A fills the cap on `h`; agent B (and an agent of unknown uid) still get slots.
    let caps = ConcurrencyCaps::new();
    let b = AgentKey::Uid(5201);
    let held: Vec<_> = (0..2)
        .map(|_| caps.acquire(A, "h", 2).expect("slot"))
        .collect();
    assert!(caps.acquire(A, "h", 2).is_err());
    let pb = caps.acquire(b, "h", 2).expect("B is not starved by A");
    assert_eq!((pb.agent(), pb.host()), (Some(b), "h"));
    let pu = caps
        .acquire(AgentKey::Unknown, "h", 2)
        .expect("unknown agent");
    assert_eq!((caps.in_flight(A, "h"), caps.in_flight(b, "h")), (2, 1));
    assert_eq!(caps.len(), 3);
    drop((held, pb, pu));
    assert!(caps.is_empty());
}

#[test]
fn zero_max_refuses_and_lowered_max_applies_to_new_requests() {
    let caps = ConcurrencyCaps::new();
    assert!(caps.acquire(A, "h", 0).is_err());
    let held: Vec<_> = (0..3)
        .map(|_| caps.acquire(A, "h", 3).expect("slot"))
        .collect();
    assert!(caps.acquire(A, "h", 2).is_err()); // policy lowered max to 2
    drop(held);
    assert!(caps.acquire(A, "h", 2).is_ok());
}

#[tokio::test(start_paused = true)]
async fn cancelled_future_releases_its_permit() {
    let caps = ConcurrencyCaps::new();
    // Cancelled by a timeout: the future, and the permit it owns, are dropped.
    let c = caps.clone();
    let timed = tokio::time::timeout(Duration::from_secs(1), async move {
        let _permit = c.acquire(A, "h", 1).expect("slot");
        std::future::pending::<()>().await;
    });
    assert!(timed.await.is_err());
    assert_eq!(caps.in_flight(A, "h"), 0);

    // Cancelled by aborting a spawned task that holds the permit.
    let (tx, rx) = tokio::sync::oneshot::channel();
    let c = caps.clone();
    let task = tokio::spawn(async move {
        let _permit = c.acquire(A, "h", 1).expect("slot");
        let _ = tx.send(());
        std::future::pending::<()>().await;
    });
    rx.await.expect("task acquired");
    assert!(caps.acquire(A, "h", 1).is_err());
    task.abort();
    assert!(task.await.expect_err("aborted").is_cancelled());
    assert!(caps.acquire(A, "h", 1).is_ok());
    assert!(caps.is_empty());
}

#[test]
fn idle_host_entries_are_removed() {
    let caps = ConcurrencyCaps::new();
    let held = caps.acquire(A, "keep", 1).expect("slot");
    for i in 0..10_000 {
        let host = format!("h{i}.example");
        let p = caps.acquire(A, &host, 1).expect("slot");
        assert!(caps.acquire(A, &host, 1).is_err()); // a refused attempt leaves no entry either
        drop(p);
    }
    assert_eq!(caps.len(), 1);
    drop(held);
    assert_eq!(caps.len(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_acquires_never_exceed_max() {
    let caps = ConcurrencyCaps::new();
    let hold = std::sync::Arc::new(tokio::sync::Barrier::new(200));
    let tasks: Vec<_> = (0..200)
        .map(|_| {
            let (caps, hold) = (caps.clone(), hold.clone());
            tokio::spawn(async move {
                let permit = caps.acquire(A, "h", 10);
                let ok = permit.is_ok();
                hold.wait().await; // every permit is still held while all tasks try
                ok
            })
        })
        .collect();
    let mut ok = 0;
    for t in tasks {
        ok += usize::from(t.await.expect("task panicked"));
    }
    assert_eq!(ok, 10);
    assert_eq!(caps.refusals(), 190);
    assert!(caps.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_churn_leaves_no_entries() {
    let caps = ConcurrencyCaps::new();
    let tasks: Vec<_> = (0..8)
        .map(|t| {
            let caps = caps.clone();
            tokio::spawn(async move {
                for i in 0..2000 {
                    // Few hosts, so acquires and releases of one entry race constantly.
                    let host = format!("h{}", (i + t) % 4);
                    let p = caps.acquire(A, &host, 3);
                    tokio::task::yield_now().await;
                    drop(p);
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.expect("task panicked");
    }
    assert!(caps.is_empty());
}

#[test]
fn simultaneous_releases_remove_the_entry() {
    // Rounds of threads releasing one host's permits at the same moment: whichever releaser
    // is last must see an exact reference count and remove the entry. Failures are counted,
    // not asserted, so a failing round cannot strand the other threads at the barrier.
    const THREADS: usize = 4;
    let caps = ConcurrencyCaps::new();
    let sync = std::sync::Barrier::new(THREADS);
    let (refused, leftovers) = (AtomicUsize::new(0), AtomicUsize::new(0));
    std::thread::scope(|s| {
        for _ in 0..THREADS {
            s.spawn(|| {
                for round in 0..5000 {
                    let permit = caps.acquire(A, &format!("h{round}"), THREADS as u32);
                    refused.fetch_add(usize::from(permit.is_err()), Ordering::Relaxed);
                    sync.wait();
                    drop(permit);
                    if sync.wait().is_leader() {
                        leftovers.fetch_add(caps.len(), Ordering::Relaxed);
                    }
                    sync.wait(); // nobody starts the next round before the leader looked
                }
            });
        }
    });
    assert_eq!(refused.into_inner(), 0);
    assert_eq!(leftovers.into_inner(), 0);
}
