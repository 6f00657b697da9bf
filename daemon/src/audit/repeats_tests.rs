//! Repeated refusals: counted per agent and kind of refusal within the window, the first in
//! full at once, one `repeated` record per window, none lost at stop.

use std::path::Path;
use std::time::Duration;

use super::*;
use crate::audit::tests::{cfg, request, request_record};
use crate::audit::AuditMetrics;
use crate::audit::{Audit, Entry, LifecycleEntry};
use crate::config::AuditConfig;
use crate::record::{DnsFacts, End};

/// A DNS question for `host` that no rule allows, from `uid`.
fn dns_refusal(n: u64, uid: u32, host: &str) -> Record {
    Record {
        kind: RecordKind::Query,
        protocol: Protocol::Dns,
        listener: ListenerKind::Dns,
        agent_uid: Some(uid),
        host: host.into(),
        method: None,
        path: None,
        status: None,
        rule: Some("default".into()),
        secrets: Vec::new(),
        dns: Some(DnsFacts {
            qtype: Some(hickory_resolver::proto::rr::RecordType::A),
            rcode: hickory_resolver::proto::op::ResponseCode::NXDomain,
            answers: Vec::new(),
        }),
        ..request_record(n, Verdict::Deny)
    }
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

#[test]
fn the_same_refusal_from_one_agent_is_counted_within_its_window() {
    let r = Repeats::new(Duration::from_secs(10));
    let t0 = Instant::now();
    assert!(matches!(
        r.note(&dns_refusal(1, 7, "n0.flood.test"), t0),
        Noted::Write(None)
    ));
    for i in 1..1000 {
        let rec = dns_refusal(i + 1, 7, &format!("n{i}.flood.test"));
        assert!(matches!(r.note(&rec, t0 + ms(i)), Noted::Counted), "{i}");
    }
    // Another agent, another code, an allowed decision, an upstream failure, a close: each
    // in full.
    let other_agent = dns_refusal(2000, 8, "n1.flood.test");
    let other_code = Record {
        error_code: Some(ErrorCode::SecretLeak),
        ..dns_refusal(2001, 7, "x.test")
    };
    let allowed = request_record(2002, Verdict::Allow);
    let failed = Record {
        error_code: Some(ErrorCode::UpstreamError),
        decision: Verdict::Error,
        ..request_record(2003, Verdict::Error)
    };
    let close = request_record(2004, Verdict::Allow).closed(1, 2, 3.0, End::Closed);
    for rec in [
        &other_agent,
        &other_code,
        &allowed,
        &failed,
        &failed,
        &close,
    ] {
        assert!(
            matches!(r.note(rec, t0 + ms(1000)), Noted::Write(None)),
            "{rec:?}"
        );
    }
    assert!(r.due(t0 + ms(9_999)).is_empty(), "still open");
    let due = r.due(t0 + ms(10_000));
    assert_eq!(due.len(), 1, "only windows that counted something: {due:?}");
    let e = &due[0];
    assert_eq!(
        (e.count, e.of, e.agent_uid),
        (999, RequestId::fixed(1), Some(7))
    );
    assert_eq!(e.error_code, ErrorCode::PolicyDenied);
    assert_eq!(e.hosts.len(), MAX_HOSTS);
    assert_eq!(
        &*e.hosts[0], "n1.flood.test",
        "the first counted, not the one in full"
    );
    // After the window: in full again, and a new window.
    let t1 = t0 + ms(11_000);
    assert!(matches!(
        r.note(&dns_refusal(3000, 7, "late.test"), t1),
        Noted::Write(None)
    ));
    assert!(matches!(
        r.note(&dns_refusal(3001, 7, "late.test"), t1 + ms(1)),
        Noted::Counted
    ));
    // A window the ticker did not close yet is written before the refusal that follows it.
    match r.note(&dns_refusal(3002, 7, "later.test"), t1 + ms(20_000)) {
        Noted::Write(Some(closed)) => {
            assert_eq!((closed.count, closed.of), (1, RequestId::fixed(3000)));
        }
        _ => panic!("the closed window comes first"),
    }
    assert!(matches!(
        r.note(&dns_refusal(3003, 7, "later.test"), t1 + ms(20_001)),
        Noted::Counted
    ));
    let drained = r.drain();
    assert_eq!(drained.len(), 1);
    assert_eq!(drained[0].count, 1);
    assert!(r.drain().is_empty());
    // A zero window counts nothing.
    let off = Repeats::new(Duration::ZERO);
    for i in 0..3 {
        assert!(matches!(
            off.note(&dns_refusal(i, 7, "a.test"), t0),
            Noted::Write(None)
        ));
    }
}

fn read(path: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path)
        .expect("read")
        .lines()
        .map(|l| serde_json::from_str(l).expect("JSON"))
        .collect()
}

/// Through the log itself: a flood of 500 refusals is its first record and one count when
/// the window closes; an allowed record is written as ever; the chain holds; and at stop an
/// open window is written before the stop record.
#[tokio::test(start_paused = true)]
async fn a_flood_is_its_first_record_and_one_count_and_stop_loses_none() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("a.jsonl");
    let c = AuditConfig {
        refusal_window: Duration::from_secs(10),
        ..cfg(1 << 30, 1)
    };
    let audit = Audit::open(&path, &c, AuditMetrics::unregistered(), None).expect("open");
    for i in 0..500 {
        let r = dns_refusal(i, 7, &format!("n{i}.flood.test"));
        assert!(audit.write(Entry::Record(Box::new(r))).await);
    }
    assert!(audit.write(request(900, "allow")).await);
    audit.sync().await;
    assert_eq!(
        read(&path).len(),
        2,
        "the first refusal and the allowed request"
    );
    tokio::time::sleep(Duration::from_secs(11)).await;
    audit.sync().await;
    let lines = read(&path);
    assert_eq!(lines.len(), 3, "{lines:#?}");
    let rep = &lines[2];
    assert_eq!(rep["kind"], "repeated", "{rep}");
    assert_eq!(rep["count"], 499, "{rep}");
    assert_eq!(rep["of"], lines[0]["request_id"], "{rep}");
    assert_eq!(rep["of_kind"], "query", "{rep}");
    assert_eq!(rep["agent_uid"], 7, "{rep}");
    assert_eq!(rep["error_code"], "policy_denied", "{rep}");
    assert_eq!(rep["hosts"].as_array().map(Vec::len), Some(MAX_HOSTS));

    for i in 500..510 {
        let r = dns_refusal(i, 7, &format!("n{i}.flood.test"));
        assert!(audit.write(Entry::Record(Box::new(r))).await);
    }
    let stop = Entry::Stop(LifecycleEntry {
        version: "test",
        pid: 1,
        policy: "sha256:00".into(),
    });
    assert!(audit.write(stop).await);
    audit.sync().await;
    let lines = read(&path);
    let kinds: Vec<&str> = lines
        .iter()
        .map(|l| l["kind"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(
        kinds,
        ["query", "request", "repeated", "query", "repeated", "stop"]
    );
    assert_eq!(lines[4]["count"], 9);
    let r = crate::audit::verify::verify(&[path]).expect("verify");
    assert_eq!((r.records, r.broken), (6, None));
}

/// `docs/audit.schema.json` lists, for a `repeated` record, exactly the codes counted.
#[test]
fn the_schema_lists_exactly_the_codes_that_are_counted() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/audit.schema.json");
    let schema: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).expect("schema")).expect("JSON");
    let mut listed: Vec<&str> = schema["$defs"]["repeated"]["properties"]["error_code"]["enum"]
        .as_array()
        .expect("an enum")
        .iter()
        .filter_map(|v| v.as_str())
        .collect();
    listed.sort_unstable();
    let mut counted: Vec<&str> = ErrorCode::ALL
        .into_iter()
        .filter(|c| before_upstream(*c))
        .map(ErrorCode::as_str)
        .collect();
    counted.sort_unstable();
    assert_eq!(listed, counted);
}
