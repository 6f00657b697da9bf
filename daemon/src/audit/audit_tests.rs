//! Audit log: the record format (golden), the chain across restarts and rotation, and the
//! verifier naming the first broken line.

use std::path::{Path, PathBuf};

use super::chain::GENESIS;
use super::verify::{rotation_set, verify};
use super::writer::encode;
use super::*;
use crate::config::AuditConfig;
use crate::record::{
    End, ErrorCode, ListenerKind, Protocol, Record, RecordKind, RequestId, Verdict,
};

/// An intercepted HTTPS request, as the pipeline records it.
pub(super) fn request_record(n: u64, decision: Verdict) -> Record {
    let allowed = decision.is_allowed();
    Record {
        kind: RecordKind::Request,
        protocol: Protocol::Https,
        started: "2026-11-23T10:00:00.000Z".into(),
        request_id: RequestId::fixed(n),
        conn_id: n,
        listener: ListenerKind::Transparent,
        client: "127.0.0.1:50000".parse().expect("addr"),
        agent_uid: Some(1001),
        dst: "203.0.113.7:443".into(),
        sni: Some("api.example.com".into()),
        host: "api.example.com".into(),
        port: 443,
        method: Some("POST".into()),
        path: Some(shown_path("/v1/chat", Some("model=x&stream"), false)),
        upgrade: None,
        decision,
        rule: Some("openai".into()),
        policy: "sha256:3f2a9c1d0b7e4a51".into(),
        status: Some(if allowed { 200 } else { 403 }),
        error_code: (!allowed).then_some(ErrorCode::PolicyDenied),
        upstream: allowed.then(|| "203.0.113.7:443".parse().expect("addr")),
        secrets: vec!["openai".into()],
        bytes_up: 512,
        bytes_down: 2048,
        ms: 12.5,
        incomplete: false,
        would_deny: false,
        limit_scope: None,
        dlp: None,
        budget: None,
        end: None,
        dns: None,
        mcp: None,
        reason: None,
    }
}

pub(super) fn request(n: u64, decision: &'static str) -> Entry {
    let v = Verdict::parse(decision).expect("a verdict");
    Entry::Record(Box::new(request_record(n, v)))
}

#[test]
fn the_record_format_matches_the_golden_file() {
    let mut buf = Vec::new();
    let h1 = encode(
        &mut buf,
        1,
        "2026-11-23T10:00:00.012Z",
        0,
        &Fields::of(&request(1, "allow")),
        GENESIS,
    );
    // A raw TCP connection refused, one allowed and its close, a client that rejected our
    // CA, an upgrade, a reload after three dropped records, and the refusal repeated.
    let tcp = Record {
        kind: RecordKind::Connection,
        protocol: Protocol::Tcp,
        sni: None,
        host: "198.51.100.9".into(),
        dst: "198.51.100.9:25".into(),
        port: 25,
        method: None,
        path: None,
        status: None,
        secrets: Vec::new(),
        bytes_up: 0,
        bytes_down: 0,
        ms: 0.25,
        rule: Some("no-smtp".into()),
        ..request_record(2, Verdict::Deny)
    };
    let ssh = Record {
        request_id: RequestId::fixed(3),
        conn_id: 3,
        decision: Verdict::Allow,
        error_code: None,
        rule: Some("git-ssh".into()),
        host: "github.com".into(),
        dst: "140.82.112.3:22".into(),
        port: 22,
        upstream: Some("140.82.112.3:22".parse().expect("addr")),
        ms: 3.125,
        ..tcp.clone()
    };
    // Milliseconds are kept to the microsecond: 1500.0004 is written 1500.0.
    let closed = ssh.closed(4096, 65536, 1500.0004, End::Closed);
    let tls = Record {
        kind: RecordKind::Connection,
        protocol: Protocol::Tls,
        decision: Verdict::Error,
        error_code: Some(ErrorCode::ClientRejectedCa),
        rule: None,
        method: None,
        path: None,
        status: None,
        upstream: None,
        secrets: Vec::new(),
        bytes_up: 0,
        bytes_down: 0,
        ms: 1.5,
        ..request_record(5, Verdict::Error)
    };
    let ws = Record {
        method: Some("GET".into()),
        path: Some("/socket".into()),
        upgrade: Some("websocket".into()),
        status: Some(101),
        secrets: Vec::new(),
        bytes_up: 0,
        bytes_down: 0,
        ..request_record(6, Verdict::Allow)
    };
    let ws_closed = ws.closed(12, 34, 250.0, End::IdleTimeout);
    let mut prev = h1;
    for (n, r) in [tcp, ssh, closed, tls, ws, ws_closed]
        .into_iter()
        .enumerate()
    {
        let seq = n as u64 + 2;
        prev = encode(
            &mut buf,
            seq,
            "2026-11-23T10:00:01.000Z",
            0,
            &Fields::of(&Entry::Record(Box::new(r))),
            &prev,
        );
    }
    let reload = Entry::Reload(ReloadEntry {
        result: ReloadResult::Error,
        trigger: ReloadTrigger::FileChange,
        policy: "sha256:3f2a9c1d0b7e4a51".into(),
        rules: None,
        error: Some("policies/main.toml:3: unknown key \"hots\"".into()),
    });
    let prev = encode(
        &mut buf,
        8,
        "2026-11-23T10:00:02.000Z",
        3,
        &Fields::of(&reload),
        &prev,
    );
    // 41 more refusals like the raw TCP one (seq 2) from its agent, within its window.
    let repeated = Entry::Repeated(Box::new(super::repeats::RepeatedEntry {
        of: RequestId::fixed(2),
        of_kind: RecordKind::Connection,
        protocol: Protocol::Tcp,
        listener: ListenerKind::Transparent,
        agent_uid: Some(1001),
        decision: Verdict::Deny,
        rule: Some("no-smtp".into()),
        policy: "sha256:3f2a9c1d0b7e4a51".into(),
        error_code: ErrorCode::PolicyDenied,
        count: 41,
        first: "2026-11-23T10:00:00.100Z".into(),
        last: "2026-11-23T10:00:09.900Z".into(),
        hosts: vec!["198.51.100.9".into(), "198.51.100.10".into()],
    }));
    encode(
        &mut buf,
        9,
        "2026-11-23T10:00:10.000Z",
        0,
        &Fields::of(&repeated),
        &prev,
    );
    let golden = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/audit-records.jsonl");
    let got = String::from_utf8(buf).expect("utf8");
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::write(&golden, &got).expect("write golden");
    }
    let want = std::fs::read_to_string(&golden).expect("golden file (UPDATE_GOLDEN=1 writes it)");
    assert_eq!(
        got, want,
        "the audit record format changed: update the golden file on purpose"
    );
    for line in got.lines() {
        let v: serde_json::Value = serde_json::from_str(line).expect("each line is JSON");
        assert_eq!(v["v"], 2);
    }
}

#[test]
fn files_written_in_the_first_format_still_verify() {
    // Format 1 (HTTP requests only, `kind: request` with a `scheme`), as written before the
    // record became one shape for every protocol.
    let v1 = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/audit-records-v1.jsonl");
    let report = verify(std::slice::from_ref(&v1)).expect("read");
    assert_eq!(report.broken, None);
    assert_eq!((report.records, report.dropped), (2, 3));
    assert!(report.starts_at_genesis());
}

#[test]
fn query_values_are_redacted_names_kept() {
    assert_eq!(
        shown_path("/a", Some("k=1&flag&x="), false),
        "/a?k=[redacted]&flag&x=[redacted]"
    );
    assert_eq!(shown_path("/a", Some("k=1"), true), "/a?k=1");
    assert_eq!(shown_path("/a", Some(""), false), "/a");
    assert_eq!(shown_path("/a", None, false), "/a");
}

/// Rotation with no retention guard and every refusal written in full (the tests of those
/// set them).
pub(super) fn cfg(max_bytes: u64, keep: u32) -> AuditConfig {
    AuditConfig {
        max_bytes,
        keep,
        retention: std::time::Duration::ZERO,
        refusal_window: std::time::Duration::ZERO,
        ..AuditConfig::default()
    }
}

async fn write_n(path: &Path, c: &AuditConfig, from: u64, n: u64) -> Head {
    let audit = Audit::open(path, c, AuditMetrics::unregistered(), None).expect("open");
    for i in from..from + n {
        audit
            .write(request(i, if i % 3 == 0 { "deny" } else { "allow" }))
            .await;
    }
    audit.sync().await;
    audit.head()
}

#[tokio::test]
async fn the_chain_goes_on_across_restarts_and_rotations() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("logs/proxy-audit.jsonl");
    let c = cfg(64 * 1024, 3);
    let head = write_n(&path, &c, 1, 10).await;
    assert_eq!(head.seq, 10);
    // A restart continues the same chain.
    let head = write_n(&path, &c, 11, 500).await;
    assert_eq!(head.seq, 510);
    let files = rotation_set(&path, c.keep);
    assert!(files.len() > 1, "rotated at 64 KiB: {files:?}");
    assert!(files.len() <= 4, "keeps 3 rotated files: {files:?}");
    for f in &files {
        let len = std::fs::metadata(f).expect("meta").len();
        assert!(len <= 64 * 1024 + 4096, "{} is {len} bytes", f.display());
    }
    let r = verify(&files).expect("verify");
    assert_eq!(r.broken, None);
    assert_eq!(r.last_seq, Some(510));
    assert_eq!(r.head.as_deref(), Some(head.hash.as_str()));
    // The oldest file was deleted, so the chain starts at a hash from it, not at genesis.
    assert!(!r.starts_at_genesis());
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(&path).expect("m").permissions(),
    );
    assert_eq!(mode & 0o777, 0o640);
}

fn lines(p: &PathBuf) -> Vec<String> {
    std::fs::read_to_string(p)
        .expect("read")
        .lines()
        .map(str::to_string)
        .collect()
}

#[tokio::test]
async fn verify_names_the_first_broken_line() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("a.jsonl");
    write_n(&path, &cfg(1 << 30, 1), 1, 8).await;
    let files = vec![path.clone()];
    let r = verify(&files).expect("verify");
    assert_eq!((r.records, r.broken.clone()), (8, None));
    assert!(r.starts_at_genesis());
    let original = lines(&path);
    let put = |l: &[String]| std::fs::write(&path, l.join("\n") + "\n").expect("write");

    // An edited field on line 5.
    let mut edited = original.clone();
    edited[4] = edited[4].replace("\"status\":200", "\"status\":201");
    assert_ne!(edited[4], original[4]);
    put(&edited);
    let b = verify(&files).expect("verify").broken.expect("broken");
    assert_eq!(b.line, 5, "{b:?}");
    assert!(b.reason.contains("edited"), "{b:?}");

    // A removed line 3: line 3 (formerly 4) no longer follows line 2.
    let mut removed = original.clone();
    removed.remove(2);
    put(&removed);
    let b = verify(&files).expect("verify").broken.expect("broken");
    assert_eq!(b.line, 3, "{b:?}");
    assert!(b.reason.contains("removed"), "{b:?}");

    // Garbage on line 7.
    let mut junk = original.clone();
    junk[6] = "not json".into();
    put(&junk);
    let b = verify(&files).expect("verify").broken.expect("broken");
    assert_eq!(b.line, 7);

    // A line cut short by a crash: the next start ends it and goes on; verify names it.
    let mut cut = original.join("\n");
    cut.truncate(cut.len() - 10);
    std::fs::write(&path, cut).expect("write");
    write_n(&path, &cfg(1 << 30, 1), 100, 1).await;
    let b = verify(&files).expect("verify").broken.expect("broken");
    assert_eq!(b.line, 8);
}

#[tokio::test]
async fn a_full_queue_drops_only_allowed_records_and_says_so() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("a.jsonl");
    let audit =
        Audit::open(&path, &cfg(1 << 30, 1), AuditMetrics::unregistered(), None).expect("open");
    // Bypass the queue's capacity by counting a drop the way a full queue does.
    audit.count_drop();
    audit.count_drop();
    audit.write(request(1, "deny")).await;
    audit.sync().await;
    let text = std::fs::read_to_string(&path).expect("read");
    assert!(text.contains("\"dropped_before\":2"), "{text}");
    let r = verify(&[path]).expect("verify");
    assert_eq!((r.dropped, r.broken), (2, None));
}

/// Many requests on two workers, each waiting for its own record: every record is written
/// exactly once, in one unbroken chain, whoever held the writer role.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_writers_lose_nothing_and_keep_one_chain() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("c.jsonl");
    let audit =
        Audit::open(&path, &cfg(1 << 30, 1), AuditMetrics::unregistered(), None).expect("open");
    let mut tasks = Vec::new();
    for t in 0..8u64 {
        let audit = audit.clone();
        tasks.push(tokio::spawn(async move {
            for i in 0..200u64 {
                let n = t * 1000 + i;
                audit
                    .write(request(n, if n % 2 == 0 { "deny" } else { "allow" }))
                    .await;
            }
        }));
    }
    for t in tasks {
        t.await.expect("task");
    }
    let text = std::fs::read_to_string(&path).expect("read");
    assert_eq!(text.lines().count(), 1600);
    let r = verify(&[path]).expect("verify");
    assert_eq!((r.records, r.broken, r.last_seq), (1600, None, Some(1600)));
    assert_eq!(audit.head().seq, 1600);
}

/// A write that fails (a full disk: /dev/full answers ENOSPC) is not acknowledged, so the
/// request's response is withheld, and it is counted.
#[tokio::test]
async fn a_failed_write_is_not_acknowledged() {
    let full = Path::new("/dev/full");
    if !full.exists() {
        assert!(
            std::env::var("CI").is_err(),
            "/dev/full is missing on a CI machine"
        );
        eprintln!("SKIP a_failed_write_is_not_acknowledged: no /dev/full here");
        return;
    }
    let metrics = AuditMetrics::unregistered();
    let audit = Audit::open(full, &cfg(1 << 30, 1), metrics.clone(), None).expect("open");
    assert!(
        !audit.write(request(1, "deny")).await,
        "a failed write was acknowledged"
    );
    assert!(!audit.write(request(2, "allow")).await);
    assert_eq!(metrics.write_errors.get(), 2);
    assert_eq!(audit.head().seq, 0, "the chain did not move");
    // A working log acknowledges.
    let dir = tempfile::tempdir().expect("tempdir");
    let ok =
        Audit::open(&dir.path().join("a.jsonl"), &cfg(1 << 30, 1), metrics, None).expect("open");
    assert!(ok.write(request(3, "allow")).await);
}

/// `keep = 0`: a rotation deletes the old file once the new one is open; nothing is left
/// aside and the live file's chain goes on from the deleted one.
#[tokio::test]
async fn keeping_no_rotated_files_leaves_only_the_live_one() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("k0.jsonl");
    let head = write_n(&path, &cfg(64 * 1024, 0), 1, 400).await;
    assert_eq!(head.seq, 400);
    let names: Vec<String> = std::fs::read_dir(dir.path())
        .expect("dir")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, vec!["k0.jsonl".to_string()], "{names:?}");
    let r = verify(std::slice::from_ref(&path)).expect("verify");
    assert_eq!((&r.broken, r.last_seq), (&None, Some(400)));
    assert!(
        !r.starts_at_genesis(),
        "it rotated: the chain starts mid-way"
    );
}

#[test]
fn a_sequence_at_u64_max_followed_by_another_record_is_a_break() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("crafted.jsonl");
    let mut buf = Vec::new();
    let h1 = encode(
        &mut buf,
        u64::MAX,
        "2026-11-23T10:00:00.000Z",
        0,
        &Fields::of(&request(1, "allow")),
        GENESIS,
    );
    // Sealed correctly, chained correctly: only the sequence number is impossible.
    encode(
        &mut buf,
        0,
        "2026-11-23T10:00:00.001Z",
        0,
        &Fields::of(&request(2, "allow")),
        &h1,
    );
    std::fs::write(&path, &buf).expect("write");
    let report = verify(std::slice::from_ref(&path)).expect("read");
    let broken = report.broken.expect("the chain is broken");
    assert_eq!(broken.line, 2);
    assert!(broken.reason.contains("jumps"), "{}", broken.reason);
}
