use super::*;
use crate::audit::tests::{cfg, request};
use crate::audit::{Audit, AuditMetrics};

/// Reads everything there is now, committing as it goes; returns the seqs read.
fn drain(r: &mut LogReader) -> Vec<u64> {
    let mut seqs = Vec::new();
    for _ in 0..10_000 {
        let lines = r.next_batch(4096).expect("read");
        if lines.is_empty() {
            return seqs;
        }
        seqs.extend(lines.iter().map(|l| l.seq.expect("a record")));
        r.commit(&lines);
    }
    panic!("never caught up");
}

#[tokio::test]
async fn a_reader_follows_appends_and_rotations_in_order_and_resumes_at_its_cursor() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("a.jsonl");
    let c = cfg(64 * 1024, 5);
    let audit = Audit::open(&path, &c, AuditMetrics::unregistered(), None).expect("open");
    let (mut r, resumed) = LogReader::open(&path, 5, None).expect("reader");
    assert_eq!(resumed, Resumed::Fresh);
    let mut seen = Vec::new();
    let mut n = 0;
    // Some 400 records of ~700 bytes: several rotations, read in between.
    for round in 0..8 {
        for _ in 0..50 {
            n += 1;
            assert!(audit.write(request(n, "allow")).await);
        }
        if round % 3 != 2 {
            seen.extend(drain(&mut r));
        }
    }
    audit.sync().await;
    seen.extend(drain(&mut r));
    assert!(
        std::fs::metadata(rotation_path(&path, 3)).is_ok(),
        "rotated a few times"
    );
    assert_eq!(
        seen,
        (1..=n).collect::<Vec<_>>(),
        "every record once, in order"
    );

    // A cursor taken now, then more records: a new reader resumes right after it.
    let saved = r.cursor();
    for _ in 0..120 {
        n += 1;
        assert!(audit.write(request(n, "allow")).await);
    }
    audit.sync().await;
    let (mut again, resumed) = LogReader::open(&path, 5, Some(&saved)).expect("reader");
    assert_eq!(resumed, Resumed::AtCursor);
    assert_eq!(drain(&mut again), (saved.seq + 1..=n).collect::<Vec<_>>());

    // A cursor whose inode is stale (the file was rotated since) is found by seq and hash.
    let stale = Cursor {
        inode: 1,
        ..saved.clone()
    };
    let (mut by_seq, resumed) = LogReader::open(&path, 5, Some(&stale)).expect("reader");
    assert_eq!(resumed, Resumed::AtCursor);
    assert_eq!(drain(&mut by_seq).first(), Some(&(saved.seq + 1)));

    // A cursor whose record is gone: from the oldest kept, the gap counted.
    let gone = Cursor {
        inode: 1,
        offset: 10,
        seq: 0,
        hash: "00".repeat(32),
    };
    let (_, resumed) = LogReader::open(&path, 5, Some(&gone)).expect("reader");
    assert!(matches!(resumed, Resumed::FromOldest { .. }), "{resumed:?}");
}

#[tokio::test]
async fn an_uncommitted_batch_comes_again() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("a.jsonl");
    let audit =
        Audit::open(&path, &cfg(1 << 30, 1), AuditMetrics::unregistered(), None).expect("open");
    for n in 1..=3 {
        assert!(audit.write(request(n, "allow")).await);
    }
    audit.sync().await;
    let (mut r, _) = LogReader::open(&path, 1, None).expect("reader");
    let first = r.next_batch(1 << 20).expect("read");
    assert_eq!(first.len(), 3);
    let again = r.next_batch(1 << 20).expect("read");
    assert_eq!(again.len(), 3, "not shipped: the same lines");
    r.commit(&again[..1]);
    let rest = r.next_batch(1 << 20).expect("read");
    assert_eq!(
        rest.iter().map(|l| l.seq).collect::<Vec<_>>(),
        [Some(2), Some(3)]
    );
    let text = std::fs::read(&path).expect("log");
    let joined: Vec<u8> = first
        .iter()
        .flat_map(|l| l.bytes.iter().copied().chain([b'\n']))
        .collect();
    assert_eq!(joined, text, "byte for byte");
}

#[tokio::test]
async fn rotation_waits_for_a_sink_up_to_its_max_hold_then_counts_what_it_lost() {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;

    use crate::audit::rotation::{ExportHold, HeldFor};

    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("a.jsonl");
    let audit = Audit::open(
        &path,
        &cfg(64 * 1024, 1),
        AuditMetrics::unregistered(),
        None,
    )
    .expect("open");
    let shipped = Arc::new(AtomicU64::new(0));
    let dropped = prometheus::IntCounter::new("d", "d").expect("counter");
    let hold = Arc::new(ExportHold::new(vec![HeldFor {
        name: "s".into(),
        shipped: shipped.clone(),
        max_hold: std::time::Duration::from_secs(2),
        dropped: dropped.clone(),
    }]));
    match audit.core.lock() {
        Ok(mut core) => core.writer.set_export_hold(hold),
        Err(_) => unreachable!("fresh"),
    }
    // Enough for three files' worth: with keep = 1, the second rotation would delete `.1`.
    let mut n = 0;
    while n < 300 {
        n += 1;
        assert!(audit.write(request(n, "allow")).await);
    }
    audit.sync().await;
    let first = std::fs::read_to_string(rotation_path(&path, 1)).expect(".1");
    assert!(
        first.contains("\"seq\":1,"),
        "the file holding unshipped records was kept"
    );
    assert_eq!(dropped.get(), 0);
    // Shipped now: the next rotation may go on.
    shipped.store(n, Ordering::Release);
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    for _ in 0..100 {
        n += 1;
        assert!(audit.write(request(n, "allow")).await);
    }
    audit.sync().await;
    let first = std::fs::read_to_string(rotation_path(&path, 1)).expect(".1");
    assert!(!first.contains("\"seq\":1,"), "rotated once shipped");
    assert_eq!(dropped.get(), 0, "nothing lost");
    // Unshipped past max_hold: deleted, and counted.
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    for _ in 0..400 {
        n += 1;
        assert!(audit.write(request(n, "allow")).await);
        if dropped.get() > 0 {
            break;
        }
        if n % 50 == 0 {
            tokio::time::sleep(std::time::Duration::from_millis(600)).await;
        }
    }
    assert!(
        dropped.get() > 0,
        "past max_hold the rotation went on and counted"
    );
}

fn rotation_path(path: &Path, n: u32) -> PathBuf {
    rotated(path, n)
}

/// What a whole-line parse says the envelope is (what `envelope` must agree with).
fn parsed_whole(line: &[u8]) -> (Option<u64>, Option<String>, Option<String>) {
    let v: serde_json::Value = match serde_json::from_slice(line) {
        Ok(v) => v,
        Err(_) => return (None, None, None),
    };
    let text = |k: &str| v.get(k).and_then(|x| x.as_str()).map(str::to_string);
    (
        v.get("seq").and_then(serde_json::Value::as_u64),
        text("time"),
        text("kind"),
    )
}

#[test]
fn the_envelope_read_from_the_front_is_the_envelope_of_the_whole_line() {
    for golden in ["audit-records.jsonl", "audit-records-v1.jsonl"] {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/golden")
            .join(golden);
        let text = std::fs::read(&path).expect("golden");
        for l in text.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
            assert_eq!(envelope(l), parsed_whole(l), "{golden}");
            // The writer's shape is read in front (a record after a drop names it between
            // `time` and `kind`: that one is parsed whole).
            let plain = !l.windows(16).any(|w| w == b"\"dropped_before\"");
            if golden == "audit-records.jsonl" && plain {
                assert!(envelope_in_front(l).is_some(), "read in front");
                assert!(
                    line(Bytes::copy_from_slice(l), 0).hash().is_some(),
                    "a sealed line states its hash"
                );
            }
        }
    }
}

#[test]
fn a_line_of_another_shape_is_parsed_whole_and_never_misread() {
    let odd: [&[u8]; 8] = [
        br#"{"seq":7,"v":2,"time":"t","kind":"request"}"#,
        br#"{"v":2,"seq":07,"time":"t","kind":"request"}"#,
        br#"{"v":2,"seq":7.5,"time":"t","kind":"request"}"#,
        br#"{"v":2,"seq":7,"time":"a\"b","kind":"request"}"#,
        br#"{"v":2,"seq":7,"time":"t","kind":"req\u0065st"}"#,
        br#"{"v":2,"seq":7,"time":"t","kind":"request""#,
        br#"{"v":2,"seq":99999999999999999999999,"time":"t","kind":"k"}"#,
        b"{\"v\":2,\"seq\":7,\"time\":\"t\xff\",\"kind\":\"k\"}",
    ];
    for l in odd {
        // Not read in front, so parsed whole, as it always was.
        assert_eq!(envelope_in_front(l), None, "{}", String::from_utf8_lossy(l));
    }
    assert_eq!(
        envelope(br#"{"v":2,"seq":7,"time":"t","kind":"request"}"#),
        (Some(7), Some("t".into()), Some("request".into()))
    );
    assert_eq!(line(Bytes::from_static(b"not json"), 0).hash(), None);
}
