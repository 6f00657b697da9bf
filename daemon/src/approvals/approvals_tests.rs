use std::sync::Arc;

use super::*;

const A: u32 = 5200;
const B: u32 = 5201;

fn req() -> Asked {
    ask_as(Some(A), "POST", "/x")
}

fn ask_as(uid: Option<u32>, method: &str, path: &str) -> Asked {
    Asked {
        agent_uid: uid,
        client: ([127, 0, 0, 1], 1).into(),
        method: method.into(),
        host: "api.test".into(),
        port: 443,
        path: path.into(),
        url: format!("https://api.test{path}"),
        rule_id: "ask-api".into(),
    }
}

/// Starts a request that asks, and waits until it is listed as pending.
async fn held(a: &Arc<Approvals>, r: Asked) -> (tokio::task::JoinHandle<AskOutcome>, String) {
    let before: HashSet<String> = a.list().into_iter().map(|p| p.id.to_string()).collect();
    let waiter = tokio::spawn({
        let a = a.clone();
        async move { a.ask(r).await }
    });
    loop {
        if let Some(p) = a
            .list()
            .into_iter()
            .find(|p| !before.contains(&p.id.to_string()))
        {
            return (waiter, p.id.to_string());
        }
        tokio::task::yield_now().await;
    }
}

#[tokio::test(start_paused = true)]
async fn unanswered_request_times_out_and_is_forgotten() {
    let a = Approvals::new(Duration::from_secs(30));
    let out = a.ask(req()).await;
    assert_eq!(out, AskOutcome::TimedOut);
    assert!(a.list().is_empty());
    assert!(a.waiting.lock().expect("lock").per_agent.is_empty());
}

#[tokio::test]
async fn approval_releases_and_remember_covers_the_next_one() {
    let a = Arc::new(Approvals::new(Duration::from_secs(30)));
    let (waiter, id) = held(&a, req()).await;
    a.decide(&id, true, true).expect("pending");
    assert_eq!(waiter.await.expect("join"), AskOutcome::Approved);
    assert_eq!(a.ask(req()).await, AskOutcome::Remembered);
    assert!(a.decide("p999", true, false).is_err());
}

#[tokio::test]
async fn remember_covers_the_approving_agent_method_and_path_only() {
    let a = Arc::new(Approvals::new(Duration::from_secs(30)));
    let (waiter, id) = held(&a, ask_as(Some(A), "GET", "/repos/x")).await;
    let shown = a.decide(&id, true, true).expect("pending");
    assert_eq!(
        (
            shown.asked.agent_uid,
            shown.asked.method.as_str(),
            shown.asked.path.as_str()
        ),
        (Some(A), "GET", "/repos/x")
    );
    assert_eq!(waiter.await.expect("join"), AskOutcome::Approved);
    assert_eq!(
        a.ask(ask_as(Some(A), "GET", "/repos/x")).await,
        AskOutcome::Remembered
    );
    // Another agent, another method, another path, or an owner-less connection: asked again.
    for other in [
        ask_as(Some(B), "GET", "/repos/x"),
        ask_as(None, "GET", "/repos/x"),
        ask_as(Some(A), "DELETE", "/repos/x"),
        ask_as(Some(A), "GET", "/repos/y"),
    ] {
        let what = format!("{:?} {} {}", other.agent_uid, other.method, other.path);
        let (waiter, id) = held(&a, other).await;
        a.decide(&id, false, false).expect("pending");
        assert_eq!(waiter.await.expect("join"), AskOutcome::Denied, "{what}");
    }
}

#[tokio::test]
async fn denial_is_a_denial() {
    let a = Arc::new(Approvals::new(Duration::from_secs(30)));
    let (waiter, id) = held(&a, req()).await;
    a.decide(&id, false, false).expect("pending");
    assert_eq!(waiter.await.expect("join"), AskOutcome::Denied);
}

#[tokio::test(start_paused = true)]
async fn one_agent_at_its_quota_leaves_the_others_room() {
    let a = Arc::new(Approvals::new(Duration::from_secs(30)));
    let mut held_a = Vec::new();
    for i in 0..MAX_PENDING_PER_AGENT {
        held_a.push(held(&a, ask_as(Some(A), "GET", &format!("/{i}"))).await);
    }
    assert_eq!(
        a.ask(ask_as(Some(A), "GET", "/more")).await,
        AskOutcome::AgentFull
    );
    // B, and connections of unknown owner, still get to ask.
    let (waiter_b, id_b) = held(&a, ask_as(Some(B), "GET", "/b")).await;
    let (waiter_u, id_u) = held(&a, ask_as(None, "GET", "/u")).await;
    assert_eq!(a.len(), MAX_PENDING_PER_AGENT + 2);
    let listed = a.list();
    let b = listed
        .iter()
        .find(|p| p.id.to_string() == id_b)
        .expect("B is listed");
    assert_eq!(
        (
            b.asked.agent_uid,
            b.asked.method.as_str(),
            b.asked.path.as_str()
        ),
        (Some(B), "GET", "/b")
    );
    a.decide(&id_b, true, false).expect("pending");
    a.decide(&id_u, true, false).expect("pending");
    assert_eq!(waiter_b.await.expect("join"), AskOutcome::Approved);
    assert_eq!(waiter_u.await.expect("join"), AskOutcome::Approved);
    // An answered request gives its agent's place back.
    let (waiter, id) = held_a.pop().expect("one of A's");
    a.decide(&id, false, false).expect("pending");
    assert_eq!(waiter.await.expect("join"), AskOutcome::Denied);
    let (_waiter, _id) = held(&a, ask_as(Some(A), "GET", "/again")).await;
}

#[tokio::test(start_paused = true)]
async fn all_agents_together_are_bounded() {
    let a = Arc::new(Approvals::with_limits(Duration::from_secs(30), 2, 3));
    let mut held_all = Vec::new();
    for uid in [A, A, B] {
        held_all.push(held(&a, ask_as(Some(uid), "GET", "/")).await);
    }
    assert_eq!(
        a.ask(ask_as(Some(A), "GET", "/")).await,
        AskOutcome::AgentFull
    );
    assert_eq!(a.ask(ask_as(Some(B), "GET", "/")).await, AskOutcome::Full);
    assert_eq!(a.ask(ask_as(None, "GET", "/")).await, AskOutcome::Full);
    assert_eq!((a.per_agent(), a.total()), (2, 3));
}
