//! Signed checkpoints: the signed message byte for byte, the key file, checkpoints landing
//! in the chain (by count, by time, at a stop, across a restart), and the verifier naming
//! each kind of damage by the checkpoints around it.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::chain::{hex_sha256, GENESIS};
use super::checkpoint::{signed_message, PublicKey, DOMAIN};
use super::checkpoint_key::{public_key_path, read_public, CheckpointKey, KeyError, KeyOrigin};
use super::checkpoint_verify::{verify_checkpoints, CheckpointReport, DamageKind, SeqRange};
use super::tests::{cfg, request};
use super::*;

#[test]
fn the_signed_message_is_length_prefixed_items_in_the_documented_order() {
    let m = signed_message(
        7,
        "2026-12-07T03:00:00.000Z",
        1,
        6,
        &"ab".repeat(32),
        "0011223344556677",
    );
    let mut want = Vec::new();
    for item in [
        DOMAIN,
        &7u64.to_be_bytes()[..],
        b"2026-12-07T03:00:00.000Z",
        &1u64.to_be_bytes()[..],
        &6u64.to_be_bytes()[..],
        "ab".repeat(32).as_bytes(),
        b"0011223344556677",
    ] {
        want.extend_from_slice(&u32::try_from(item.len()).expect("small").to_be_bytes());
        want.extend_from_slice(item);
    }
    assert_eq!(m, want);
    assert_eq!(
        &m[..4],
        &[0, 0, 0, 30],
        "the domain first, its length before it"
    );
    assert_eq!(DOMAIN, b"agenshield audit checkpoint v1");
    // Fields cannot slide into each other: moving a byte between two items changes it.
    let shifted = signed_message(
        7,
        "2026-12-07T03:00:00.000Z0",
        1,
        6,
        &"ab".repeat(32),
        "011223344556677",
    );
    assert_ne!(m, shifted);
}

#[test]
fn a_created_key_is_private_has_its_public_half_beside_it_and_loads_again() {
    let dir = tempfile::tempdir().expect("tempdir");
    // Its directory is made too (by default the CA's, made later).
    let path = dir.path().join("certs/audit-key.pem");
    let (key, origin) = CheckpointKey::load_or_create(&path).expect("create");
    assert_eq!(origin, KeyOrigin::Created);
    let mode = std::fs::metadata(&path).expect("meta").permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    let text = std::fs::read_to_string(&path).expect("read");
    assert!(text.starts_with("-----BEGIN PRIVATE KEY-----\n"), "{text}");
    let public = std::fs::read_to_string(public_key_path(&path)).expect("pub");
    assert_eq!(PublicKey::from_pem(&public).expect("pem"), *key.public());
    assert_eq!(
        format!("{key:?}"),
        format!("CheckpointKey({})", key.public().id())
    );
    assert!(
        !format!("{key:?}").contains(&text[30..60]),
        "Debug never shows the key"
    );
    let (again, origin) = CheckpointKey::load_or_create(&path).expect("load");
    assert_eq!(origin, KeyOrigin::Loaded);
    assert_eq!(again.public(), key.public());
    assert_eq!(key.public().id().len(), 16);
    // Signatures verify with the public half, and only for what was signed.
    let sig = key.sign(b"message");
    assert!(key.public().verifies(b"message", &sig));
    assert!(!key.public().verifies(b"messagE", &sig));
    assert!(!key.public().verifies(b"message", "not base64!"));
    // The operator without access to the key reads the public half.
    std::fs::remove_file(&path).expect("rm");
    assert_eq!(read_public(&path).expect("from .pub"), *key.public());
}

#[test]
fn a_key_others_may_read_is_refused_and_a_public_key_must_be_ed25519() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("audit-key.pem");
    CheckpointKey::load_or_create(&path).expect("create");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).expect("chmod");
    match CheckpointKey::load_or_create(&path) {
        Err(KeyError::Exposed { mode, .. }) => assert_eq!(mode, 0o640),
        other => panic!("an exposed key was taken: {other:?}"),
    }
    assert!(PublicKey::from_pem("hello").is_err());
    // An EC P-256 public key (from the CA crate's kind) is not an ed25519 one.
    let ec = "-----BEGIN PUBLIC KEY-----\nMFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEYWJjZGVmZ2hpamtsbW5vcHFyc3R1\ndnd4eXphYmNkZWZnaGlqa2xtbm9wcXJzdHV2d3h5emFiY2RlZg==\n-----END PUBLIC KEY-----\n";
    assert_eq!(
        PublicKey::from_pem(ec),
        Err(super::checkpoint::PublicKeyError::NotEd25519)
    );
    match read_public(&dir.path().join("none.pem")) {
        Err(KeyError::Missing { .. }) => {}
        other => panic!("{other:?}"),
    }
}

/// Checkpoints every `every` records (and not by time).
fn every(n: u64) -> AuditConfig {
    AuditConfig {
        checkpoint_every: n,
        checkpoint_interval: Duration::ZERO,
        ..cfg(1 << 30, 1)
    }
}

/// `n` records through a real `Audit` signing with the key at `key`, then a clean stop's
/// checkpoint.
async fn write_signed(path: &Path, c: &AuditConfig, key: &Path, from: u64, n: u64) -> PublicKey {
    let (k, _) = CheckpointKey::load_or_create(key).expect("key");
    let public = k.public().clone();
    let metrics = AuditMetrics::unregistered();
    let audit = Audit::open(path, c, metrics.clone(), Some(k)).expect("open");
    for i in from..from + n {
        assert!(
            audit
                .write(request(i, if i % 3 == 0 { "deny" } else { "allow" }))
                .await
        );
    }
    audit.checkpoint().await;
    audit.sync().await;
    public
}

fn lines(p: &Path) -> Vec<String> {
    std::fs::read_to_string(p)
        .expect("read")
        .lines()
        .map(str::to_string)
        .collect()
}

fn kinds(p: &Path) -> Vec<(u64, String)> {
    lines(p)
        .iter()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).expect("json");
            (
                v["seq"].as_u64().expect("seq"),
                v["kind"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect()
}

fn checkpoint_seqs(p: &Path) -> Vec<u64> {
    kinds(p)
        .into_iter()
        .filter(|(_, k)| k == "checkpoint")
        .map(|(s, _)| s)
        .collect()
}

#[tokio::test]
async fn checkpoints_land_every_n_records_and_at_a_stop_and_the_log_verifies() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("a.jsonl");
    let key = dir.path().join("k.pem");
    let public = write_signed(&path, &every(10), &key, 1, 25).await;
    // 10 records, checkpoint 11; 10 more, checkpoint 22; 5 more and the stop's at 28.
    assert_eq!(checkpoint_seqs(&path), [11, 22, 28]);
    let cp: serde_json::Value =
        serde_json::from_str(&lines(&path)[21]).expect("the checkpoint at 22");
    assert_eq!(cp["first_seq"], 12);
    assert_eq!(cp["last_seq"], 21);
    assert_eq!(cp["head"], cp["prev"]);
    assert_eq!(cp["key_id"], public.id());
    let r = verify_checkpoints(std::slice::from_ref(&path), std::slice::from_ref(&public))
        .expect("verify");
    assert!(r.ok(), "{r:?}");
    assert_eq!(
        (r.records, r.checkpoints, r.last_checkpoint),
        (28, 3, Some(28))
    );
    assert!(r.starts_at_genesis);
    assert_eq!(r.unsigned_tail, None);
    // The plain chain check reads the checkpoint lines like any other.
    let plain = super::verify::verify(std::slice::from_ref(&path)).expect("verify");
    assert!(plain.broken.is_none(), "{plain:?}");
    // A second stop with nothing new writes no empty checkpoint; a restart goes on from the
    // last checkpoint.
    let again = write_signed(&path, &every(10), &key, 26, 3).await;
    assert_eq!(again, public);
    assert_eq!(checkpoint_seqs(&path), [11, 22, 28, 32]);
    let cp: serde_json::Value = serde_json::from_str(&lines(&path)[31]).expect("cp");
    assert_eq!(
        (cp["first_seq"].as_u64(), cp["last_seq"].as_u64()),
        (Some(29), Some(31))
    );
}

#[tokio::test]
async fn a_checkpoint_comes_after_the_interval_when_records_wait_for_one() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("a.jsonl");
    let (k, _) = CheckpointKey::load_or_create(&dir.path().join("k.pem")).expect("key");
    let c = AuditConfig {
        checkpoint_every: 1000,
        checkpoint_interval: Duration::from_millis(300),
        ..cfg(1 << 30, 1)
    };
    let metrics = AuditMetrics::unregistered();
    let audit = Audit::open(&path, &c, metrics.clone(), Some(k)).expect("open");
    for i in 1..=3 {
        assert!(audit.write(request(i, "allow")).await);
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while metrics.checkpoints.get() == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "no checkpoint by time"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    audit.sync().await;
    assert_eq!(checkpoint_seqs(&path), [4]);
    // Nothing new: no further checkpoint however long it waits.
    tokio::time::sleep(Duration::from_millis(700)).await;
    audit.sync().await;
    assert_eq!(checkpoint_seqs(&path), [4]);
    assert_eq!(metrics.checkpoints.get(), 1);
}

/// A log of 45 records with checkpoints at 11, 22, 33, 44 and 50 (the stop's), its key, and
/// a place for damaged copies.
struct Signed {
    dir: tempfile::TempDir,
    path: PathBuf,
    key: PublicKey,
    signer: CheckpointKey,
}

async fn signed_log() -> Signed {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("a.jsonl");
    let key_path = dir.path().join("k.pem");
    let key = write_signed(&path, &every(10), &key_path, 1, 45).await;
    assert_eq!(checkpoint_seqs(&path), [11, 22, 33, 44, 50]);
    let signer = CheckpointKey::load(&key_path).expect("key");
    Signed {
        dir,
        path,
        key,
        signer,
    }
}

impl Signed {
    /// A copy of the log's lines, changed by `f`, as files split at the given line counts.
    fn copy(&self, name: &str, f: impl FnOnce(&mut Vec<String>)) -> PathBuf {
        let mut l = lines(&self.path);
        f(&mut l);
        let p = self.dir.path().join(name);
        std::fs::write(&p, l.iter().map(|l| format!("{l}\n")).collect::<String>()).expect("w");
        p
    }

    fn check(&self, files: &[PathBuf]) -> CheckpointReport {
        verify_checkpoints(files, std::slice::from_ref(&self.key)).expect("verify")
    }
}

/// Re-seals `line` (its `prev` replaced by `prev`): what a forger recomputes.
fn reseal(line: &str, prev: &str) -> String {
    let v: serde_json::Value = serde_json::from_str(line).expect("json");
    let old_prev = v["prev"].as_str().expect("prev");
    let body_end = line.find(",\"hash\":\"").expect("seal");
    let body = line[..body_end].replace(
        &format!("\"prev\":\"{old_prev}\""),
        &format!("\"prev\":\"{prev}\""),
    );
    let hash = hex_sha256(body.as_bytes());
    format!("{body},\"hash\":\"{hash}\"}}")
}

fn hash_of(line: &str) -> String {
    let v: serde_json::Value = serde_json::from_str(line).expect("json");
    v["hash"].as_str().expect("hash").to_string()
}

/// Recomputes the chain from line index `from` to the end.
fn rechain(l: &mut [String], from: usize) {
    for i in from..l.len() {
        let prev = if i == 0 {
            GENESIS.to_string()
        } else {
            hash_of(&l[i - 1])
        };
        l[i] = reseal(&l[i], &prev);
    }
}

fn one(r: &CheckpointReport) -> &super::checkpoint_verify::Damage {
    assert_eq!(r.damage.len(), 1, "{r:#?}");
    assert!(!r.ok());
    &r.damage[0]
}

#[tokio::test]
async fn an_edited_line_is_named_with_the_checkpoints_around_it() {
    let s = signed_log().await;
    let p = s.copy("edited.jsonl", |l| l[14] = l[14].replace("POST", "GET!"));
    let r = s.check(&[p]);
    let d = one(&r);
    assert_eq!(d.kind, DamageKind::Edited);
    assert_eq!(d.line, 15);
    assert_eq!(
        (d.after_checkpoint, d.before_checkpoint),
        (Some(11), Some(22))
    );
    assert_eq!(
        d.range,
        Some(SeqRange {
            first: 12,
            last: 21
        })
    );
    // Its hash recomputed too: the next line no longer links.
    let p = s.copy("edited2.jsonl", |l| {
        l[14] = reseal(&l[14].replace("POST", "GET!"), &hash_of(&l[13]));
    });
    let d = one(&s.check(&[p])).clone();
    assert_eq!((d.kind, d.line), (DamageKind::Relinked, 16));
    assert_eq!(
        (d.after_checkpoint, d.before_checkpoint),
        (Some(11), Some(22))
    );
}

#[tokio::test]
async fn a_chain_recomputed_after_an_edit_fails_at_the_next_checkpoint() {
    let s = signed_log().await;
    let p = s.copy("rewritten.jsonl", |l| {
        l[14] = l[14].replace("POST", "GET!");
        rechain(l, 14);
    });
    let r = s.check(&[p]);
    let d = one(&r);
    // Every hash links again; only the signed head of the checkpoint at 22 tells.
    assert_eq!((d.kind, d.line), (DamageKind::HeadMismatch, 22));
    assert_eq!(d.after_checkpoint, Some(11));
    // The later checkpoints sign the old chain too: none is good after it.
    assert_eq!(d.before_checkpoint, None);
    assert_eq!(
        d.range,
        Some(SeqRange {
            first: 12,
            last: 50
        })
    );
}

#[tokio::test]
async fn deleted_lines_are_named_with_the_checkpoints_around_them() {
    let s = signed_log().await;
    let p = s.copy("deleted.jsonl", |l| {
        l.drain(25..28);
    });
    let d = one(&s.check(&[p])).clone();
    assert_eq!((d.kind, d.line), (DamageKind::Removed, 26));
    assert!(d.detail.contains("seq 26..28"), "{}", d.detail);
    assert_eq!(
        (d.after_checkpoint, d.before_checkpoint),
        (Some(22), Some(33))
    );
    assert_eq!(
        d.range,
        Some(SeqRange {
            first: 23,
            last: 32
        })
    );
}

#[tokio::test]
async fn a_file_cut_short_before_the_next_is_named_as_truncated() {
    let s = signed_log().await;
    // As rotated: lines 1..=30 in `.1`, the rest in the live file; `.1` then cut after 24.
    let all = lines(&s.path);
    let older = s.dir.path().join("log.1");
    let live = s.dir.path().join("log");
    let text = |l: &[String]| l.iter().map(|l| format!("{l}\n")).collect::<String>();
    std::fs::write(&older, text(&all[..24])).expect("w");
    std::fs::write(&live, text(&all[30..])).expect("w");
    let d = one(&s.check(&[older.clone(), live.clone()])).clone();
    assert_eq!((d.kind, d.line), (DamageKind::Truncated, 1));
    assert_eq!(d.file, live);
    assert!(d.detail.contains("seq 25..30"), "{}", d.detail);
    assert_eq!(
        (d.after_checkpoint, d.before_checkpoint),
        (Some(22), Some(33))
    );
    // Whole, the two files verify as one chain.
    std::fs::write(&older, text(&all[..30])).expect("w");
    assert!(s.check(&[older, live]).ok());
}

#[tokio::test]
async fn a_checkpoint_signed_with_another_key_or_forged_is_named() {
    let s = signed_log().await;
    let other_dir = tempfile::tempdir().expect("tempdir");
    let (other, _) = CheckpointKey::load_or_create(&other_dir.path().join("o.pem")).expect("key");
    // The forger edits seq 15, recomputes the chain and signs the checkpoints with its key.
    let resign = |l: &mut Vec<String>, key: &CheckpointKey, id: &str| {
        l[14] = l[14].replace("POST", "GET!");
        for i in 14..l.len() {
            let prev = hash_of(&l[i - 1]);
            let mut v: serde_json::Value = serde_json::from_str(&l[i]).expect("json");
            if v["kind"] == "checkpoint" {
                let seq = v["seq"].as_u64().expect("seq");
                let msg = signed_message(
                    seq,
                    v["time"].as_str().expect("time"),
                    v["first_seq"].as_u64().expect("first"),
                    seq - 1,
                    &prev,
                    id,
                );
                let mut line = l[i].clone();
                let signature = key.sign(&msg);
                for (k, new) in [
                    ("head", prev.as_str()),
                    ("key_id", id),
                    ("signature", &signature),
                ] {
                    // Replaced in place: the line keeps its key order.
                    line =
                        line.replace(&format!("\"{k}\":{}", v[k]), &format!("\"{k}\":\"{new}\""));
                }
                v["head"] = prev.clone().into();
                l[i] = line;
            }
            l[i] = reseal(&l[i], &prev);
        }
    };
    let other_id = other.public().id();
    let p = s.copy("other-key.jsonl", |l| resign(l, &other, &other_id));
    let d = one(&s.check(std::slice::from_ref(&p))).clone();
    assert_eq!((d.kind, d.line), (DamageKind::UnknownKey, 22));
    assert!(d.detail.contains(&other_id), "{}", d.detail);
    assert_eq!((d.after_checkpoint, d.before_checkpoint), (Some(11), None));
    // Given both keys, the forger's checkpoints verify: the key is what is trusted.
    let both = verify_checkpoints(&[p], &[s.key.clone(), other.public().clone()]).expect("v");
    assert!(both.ok(), "{both:?}");
    // Our key id on the forger's signature: the signature fails.
    let our_id = s.key.id();
    let p = s.copy("forged.jsonl", |l| resign(l, &other, &our_id));
    let d = one(&s.check(&[p])).clone();
    assert_eq!((d.kind, d.line), (DamageKind::BadSignature, 22));
    // The genuine signer's re-signing verifies: that is why the key stays with the worker.
    let p = s.copy("resigned.jsonl", |l| resign(l, &s.signer, &our_id));
    assert!(s.check(&[p]).ok());
}

#[tokio::test]
async fn a_shipped_copy_without_its_beginning_verifies_from_its_first_record() {
    let s = signed_log().await;
    // The receiver's copy starts mid-way, mid-line, with a space or a header of its own
    // before each message.
    let p = s.copy("shipped.jsonl", |l| {
        let tail: Vec<String> = l
            .drain(17..)
            .enumerate()
            .map(|(i, x)| match i % 2 {
                0 => format!(" {x}"),
                _ => format!("Dec  7 03:00:00 host1 agenshield[42]: {x}\r"),
            })
            .collect();
        *l = vec![tail[0][40..].to_string()];
        l.extend(tail[1..].iter().cloned());
    });
    let r = s.check(&[p]);
    assert!(r.ok(), "{r:#?}");
    assert!(!r.starts_at_genesis);
    assert!(r.skipped_first_line);
    assert_eq!((r.first_seq, r.first_checkpoint), (Some(19), Some(22)));
    // Cut after the checkpoint at 33 and ten records on: the unsigned tail is said.
    let p = s.copy("running.jsonl", |l| l.truncate(38));
    let r = s.check(&[p]);
    assert!(r.ok());
    assert_eq!(
        r.unsigned_tail,
        Some(SeqRange {
            first: 34,
            last: 38
        })
    );
    // No checkpoint at all: nothing is verified.
    let p = s.copy("unsigned.jsonl", |l| l.truncate(10));
    let r = s.check(&[p]);
    assert!(!r.ok() && r.damage.is_empty() && r.checkpoints == 0);
}

#[tokio::test]
async fn a_malformed_line_is_damage_not_a_crash() {
    let s = signed_log().await;
    let p = s.copy("junk.jsonl", |l| {
        l[30] = "\u{0}\u{1} not json {".into();
        l[31] = String::from_utf8_lossy(&[0xff, 0xfe]).into_owned();
    });
    let d = one(&s.check(&[p])).clone();
    assert_eq!((d.kind, d.line), (DamageKind::Malformed, 31));
    assert_eq!(
        (d.after_checkpoint, d.before_checkpoint),
        (Some(22), Some(44))
    );
}
