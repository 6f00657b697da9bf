//! Signed checkpoints against the real daemon: traffic through it, checkpoints landing in
//! the log every N records and at the stop, `ctl audit key` exporting the public key (which
//! the real `openssl` verifies a checkpoint with, from the encoding docs/audit.md gives), then
//! copies of the log with a line deleted, a file cut short before the next, a line edited and
//! the chain re-signed with another key (made by `openssl`): `ctl audit verify --checkpoints`
//! names each damaged range by the checkpoints around it and exits 1; the untouched log, the
//! same log as two rotated files and a shipped copy without its beginning verify.

use std::path::{Path, PathBuf};
use std::process::Command;

use agenshield_e2e::audit;
use agenshield_e2e::curl::curl;
use agenshield_e2e::upstream::UpstreamOptions;
use agenshield_e2e::world::{ApiUpstream, World};
use base64::Engine as _;
use serde_json::Value;
use sha2::{Digest, Sha256};

const POLICY: &str = r#"
version = 1
default = "deny"

[[rule]]
id = "api"
hosts = ["api.cp.test"]
action = "allow"
"#;

const EVERY: u64 = 10;

#[tokio::test]
async fn checkpoints_sign_the_log_and_verify_names_each_damaged_range() {
    let api = ApiUpstream::start(
        "checkpoints upstream CA",
        &["api.cp.test", "denied.cp.test"],
        UpstreamOptions::default(),
    )
    .await;
    let mut opts = api.daemon_options(POLICY);
    opts.audit = vec![
        format!("checkpoint_every = {EVERY}"),
        "checkpoint_interval = \"1h\"".into(),
    ];
    let mut w = api.world(opts);
    for i in 0..45 {
        let host = if i % 4 == 3 {
            "denied.cp.test"
        } else {
            "api.cp.test"
        };
        let out = w.explicit("https", host, &format!("/r{i}"), &[]).await;
        if host == "api.cp.test" {
            assert_eq!(out.status, 200, "{out:?}");
        }
    }
    let scrape = curl(&[&format!("http://{}/metrics", w.daemon.metrics)], false).await;
    let signed = metric(&scrape.text(), "agenshield_proxy_audit_checkpoints_total");
    assert!(
        signed >= 4,
        "45 requests, a checkpoint every {EVERY}: {signed}"
    );

    // The key: private to the daemon's user, its public half beside it.
    let key_file = w.daemon.dir.path().join("certs/audit-key.pem");
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(&key_file).expect("the key").permissions(),
    );
    assert_eq!(mode & 0o777, 0o600);
    w.daemon.stop();

    let log = w.daemon.audit_path();
    let lines = read_lines(&log);
    let cps = checkpoints(&lines);
    assert!(cps.len() >= 5, "{cps:?}");
    assert_eq!(
        cps.last().copied(),
        Some(lines.len() as u64),
        "the stop signs the log's end"
    );
    for pair in cps.windows(2) {
        assert!(pair[1] - pair[0] <= EVERY + 1, "{cps:?}");
    }
    audit::assert_matches_schema(&audit::lines(&log));

    // `ctl audit key`: PEM on stdout, the same in --out's file.
    let public = w.scratch().join("host-audit.pub");
    let (code, pem, err) = w.daemon.ctl(&[], &["audit", "key"]);
    assert_eq!(code, 0, "{err}");
    assert!(pem.starts_with("-----BEGIN PUBLIC KEY-----\n"), "{pem}");
    let (code, out, err) = w.daemon.ctl(
        &[],
        &["audit", "key", "--out", &public.display().to_string()],
    );
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(std::fs::read_to_string(&public).expect("written"), pem);
    let key_id = key_id_of(&public);
    assert!(out.contains(&key_id), "{out}");

    // openssl verifies a checkpoint from the documented encoding, not from our code.
    let cp: Value = serde_json::from_str(&lines[cps[1] as usize - 1]).expect("json");
    assert_eq!(cp["key_id"], key_id.as_str());
    let msg = w.scratch().join("msg.bin");
    let sig = w.scratch().join("sig.bin");
    std::fs::write(&msg, message(&cp)).expect("msg");
    let raw = base64::engine::general_purpose::STANDARD
        .decode(cp["signature"].as_str().expect("signature"))
        .expect("base64");
    std::fs::write(&sig, raw).expect("sig");
    let verified = openssl(&[
        "pkeyutl",
        "-verify",
        "-pubin",
        "-inkey",
        &s(&public),
        "-rawin",
        "-in",
        &s(&msg),
        "-sigfile",
        &s(&sig),
    ]);
    assert!(
        verified.contains("Signature Verified Successfully"),
        "{verified}"
    );

    let check = |files: &[&Path]| -> (i32, String) {
        let mut args = vec!["audit", "verify", "--checkpoints", "--key"];
        let key = s(&public);
        args.push(&key);
        let names: Vec<String> = files.iter().map(|f| s(f)).collect();
        args.extend(names.iter().map(String::as_str));
        let (code, out, err) = w.daemon.ctl(&[], &args);
        eprintln!("$ ctl {}\n{out}{err}", args.join(" "));
        (code, format!("{out}{err}"))
    };
    let between = |a: u64, b: u64| {
        format!(
            "records seq {}..{} (between the checkpoints at seq {a} and seq {b})",
            a + 1,
            b - 1
        )
    };

    // The untouched log verifies; so does it as rotated files, given in order.
    let (code, out) = check(&[&log]);
    assert_eq!(code, 0, "{out}");
    assert!(out.starts_with("ok:"), "{out}");
    let cut = cps[2] as usize + 3;
    let older = write_copy(&w, "log.1", &lines[..cut]);
    let live = write_copy(&w, "log", &lines[cut..]);
    let (code, out) = check(&[&older, &live]);
    assert_eq!(code, 0, "{out}");

    // (a) A line deleted between two checkpoints.
    let gone = cps[1] as usize + 3;
    let mut a = lines.clone();
    a.remove(gone - 1);
    let (code, out) = check(&[&write_copy(&w, "deleted.jsonl", &a)]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains(&between(cps[1], cps[2])), "{out}");
    assert!(out.contains(&format!("record seq {gone} deleted")), "{out}");

    // (b) A rotated file cut short between two checkpoints, the next file going on.
    let older = write_copy(&w, "cut.1", &lines[..cps[1] as usize + 2]);
    let live = write_copy(&w, "cut", &lines[cps[1] as usize + 6..]);
    let (code, out) = check(&[&older, &live]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains(&between(cps[1], cps[2])), "{out}");
    assert!(out.contains("the earlier file was cut short"), "{out}");

    // (c) A line edited between two checkpoints.
    let edited = cps[2] as usize + 2;
    let mut c = lines.clone();
    c[edited - 1] = c[edited - 1].replacen("\"time\":\"2", "\"time\":\"1", 1);
    assert_ne!(c, lines);
    let (code, out) = check(&[&write_copy(&w, "edited.jsonl", &c)]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains(&between(cps[2], cps[3])), "{out}");
    assert!(out.contains("the line was edited"), "{out}");

    // (d) The edit hidden: the chain recomputed and re-signed with another key.
    let other = w.scratch().join("other.pem");
    openssl(&["genpkey", "-algorithm", "ed25519", "-out", &s(&other)]);
    let other_pub = w.scratch().join("other.pub");
    openssl(&["pkey", "-in", &s(&other), "-pubout", "-out", &s(&other_pub)]);
    let other_id = key_id_of(&other_pub);
    let forged = forge(&w, &c, edited, &other, &other_id);
    let forged_file = write_copy(&w, "forged.jsonl", &forged);
    let (code, out) = check(&[&forged_file]);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains(&format!("after the checkpoint at seq {}", cps[2])),
        "{out}"
    );
    assert!(out.contains(&format!("signed by key {other_id}")), "{out}");
    // The plain chain check cannot see it: only the signatures do.
    let (code, out, err) = w.daemon.ctl(&[], &["audit", "verify", &s(&forged_file)]);
    assert_eq!(code, 0, "{out}{err}");

    // A shipped copy whose beginning is missing (the receiver's, a space before each line).
    let shipped: Vec<String> = lines[cps[0] as usize + 2..]
        .iter()
        .map(|l| format!(" {l}"))
        .collect();
    let (code, out) = check(&[&write_copy(&w, "shipped.jsonl", &shipped)]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains(&format!("this copy begins at seq {}", cps[0] + 3)),
        "{out}"
    );
}

fn s(p: &Path) -> String {
    p.display().to_string()
}

fn metric(text: &str, name: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.trim().parse::<f64>().ok())
        .unwrap_or_else(|| panic!("no {name} in:\n{text}")) as u64
}

fn read_lines(p: &Path) -> Vec<String> {
    std::fs::read_to_string(p)
        .expect("audit log")
        .lines()
        .map(str::to_string)
        .collect()
}

/// Seqs of the checkpoint lines (the log starts at seq 1: line n is seq n).
fn checkpoints(lines: &[String]) -> Vec<u64> {
    lines
        .iter()
        .enumerate()
        .map(|(i, l)| {
            let v: Value = serde_json::from_str(l).expect("json");
            assert_eq!(v["seq"], i as u64 + 1);
            v
        })
        .filter(|v| v["kind"] == "checkpoint")
        .map(|v| v["seq"].as_u64().expect("seq"))
        .collect()
}

fn write_copy(w: &World, name: &str, lines: &[String]) -> PathBuf {
    let p = w.scratch().join(name);
    let text: String = lines.iter().map(|l| format!("{l}\n")).collect();
    std::fs::write(&p, text).expect("copy");
    p
}

fn openssl(args: &[&str]) -> String {
    let out = Command::new("openssl")
        .args(args)
        .output()
        .expect("openssl (Debian package openssl)");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "openssl {args:?}: {text}");
    text
}

/// docs/audit.md: the first 8 bytes of the SHA-256 of the 32 key bytes, hex. The key bytes
/// are the last 32 of the SubjectPublicKeyInfo DER.
fn key_id_of(public_pem: &Path) -> String {
    let text = std::fs::read_to_string(public_pem).expect("pem");
    let b64: String = text.lines().filter(|l| !l.starts_with("-----")).collect();
    let der = base64::engine::general_purpose::STANDARD
        .decode(b64)
        .expect("base64");
    let raw = &der[der.len() - 32..];
    Sha256::digest(raw)[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// docs/audit.md: each item as a 4-byte big-endian length and its bytes: the domain, seq,
/// time, first_seq, last_seq (8-byte big-endian), head, key_id.
fn message(cp: &Value) -> Vec<u8> {
    let n = |k: &str| cp[k].as_u64().expect(k).to_be_bytes().to_vec();
    let t = |k: &str| cp[k].as_str().expect(k).as_bytes().to_vec();
    let items = [
        b"agenshield audit checkpoint v1".to_vec(),
        n("seq"),
        t("time"),
        n("first_seq"),
        n("last_seq"),
        t("head"),
        t("key_id"),
    ];
    let mut m = Vec::new();
    for item in items {
        m.extend_from_slice(&(item.len() as u32).to_be_bytes());
        m.extend_from_slice(&item);
    }
    m
}

/// docs/audit.md's seal: SHA-256 of the line up to `,"hash":`, `prev` replaced.
fn reseal(line: &str, prev: &str) -> String {
    let v: Value = serde_json::from_str(line).expect("json");
    let old = v["prev"].as_str().expect("prev");
    let end = line.find(",\"hash\":\"").expect("sealed");
    let body = line[..end].replace(
        &format!("\"prev\":\"{old}\""),
        &format!("\"prev\":\"{prev}\""),
    );
    let hash: String = Sha256::digest(body.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("{body},\"hash\":\"{hash}\"}}")
}

/// What a forger with write access to the log but not the key does: recompute the chain
/// from the edited line (1-based `from`) to the end, signing each checkpoint with `key`.
fn forge(w: &World, lines: &[String], from: usize, key: &Path, key_id: &str) -> Vec<String> {
    let mut l = lines.to_vec();
    for i in from - 1..l.len() {
        let prev: Value = serde_json::from_str(&l[i - 1]).expect("json");
        let prev = prev["hash"].as_str().expect("hash").to_string();
        let mut v: Value = serde_json::from_str(&l[i]).expect("json");
        if v["kind"] == "checkpoint" {
            let mut line = l[i].clone();
            v["head"] = prev.clone().into();
            v["key_id"] = key_id.into();
            let msg = w.scratch().join("forged-msg.bin");
            let sig = w.scratch().join("forged-sig.bin");
            std::fs::write(&msg, message(&v)).expect("msg");
            openssl(&[
                "pkeyutl",
                "-sign",
                "-inkey",
                &s(key),
                "-rawin",
                "-in",
                &s(&msg),
                "-out",
                &s(&sig),
            ]);
            let signature =
                base64::engine::general_purpose::STANDARD.encode(std::fs::read(&sig).expect("sig"));
            let old: Value = serde_json::from_str(&l[i]).expect("json");
            for (k, new) in [
                ("head", prev.as_str()),
                ("key_id", key_id),
                ("signature", &signature),
            ] {
                line = line.replace(
                    &format!("\"{k}\":{}", old[k]),
                    &format!("\"{k}\":\"{new}\""),
                );
            }
            l[i] = line;
        }
        l[i] = reseal(&l[i], &prev);
    }
    l
}
