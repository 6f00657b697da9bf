//! Signed policy bundles, pulled (issue 36 item 1): a real nginx on loopback serves bundles
//! made by `agenshield proxy policy bundle` and signed with the real `minisign` CLI; the
//! daemon applies them, keeps the running policy when one is tampered with, signed by
//! another key, older or oversized (one `policy` record each), starts from its cache with
//! the server down, refuses everything before its first bundle when told to, and composes a
//! `deny-only` bundle with the local directory (also over `file://`).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use agenshield_e2e::audit::{assert_matches_schema, lines};
use agenshield_e2e::bundle_server::{self, Nginx, SigningKey};
use agenshield_e2e::daemon::{binary, Daemon};
use agenshield_e2e::upstream::UpstreamOptions;
use agenshield_e2e::world::{ApiUpstream, World};
use serde_json::Value;

const HOSTS: [&str; 3] = ["a.test", "b.test", "c.test"];

/// A policy allowing exactly `hosts` (any path), default deny.
fn allowing(hosts: &[&str]) -> String {
    let mut p = String::from("version = 1\ndefault = \"deny\"\n");
    for h in hosts {
        let id = h.replace('.', "-");
        p.push_str(&format!(
            "\n[[rule]]\nid = \"central-{id}\"\naction = \"allow\"\nhosts = [\"{h}\"]\n"
        ));
    }
    p
}

/// `agenshield proxy policy bundle` of a directory holding `main.toml` (and `extra`), into
/// `out`: the CLI's stdout.
fn make_bundle(
    scratch: &Path,
    main: &str,
    extra: &[(&str, &str)],
    revision: u64,
    local: &str,
    out: &Path,
) -> String {
    let dir = tempfile::tempdir_in(scratch).expect("tempdir");
    std::fs::write(dir.path().join("main.toml"), main).expect("main.toml");
    for (name, text) in extra {
        std::fs::write(dir.path().join(name), text).expect("extra file");
    }
    let run = std::process::Command::new(binary())
        .args(["proxy", "policy", "bundle"])
        .arg(dir.path())
        .arg("--out")
        .arg(out)
        .args(["--revision", &revision.to_string(), "--local", local])
        .output()
        .expect("run policy bundle");
    assert!(
        run.status.success(),
        "policy bundle failed: {}",
        String::from_utf8_lossy(&run.stderr)
    );
    String::from_utf8_lossy(&run.stdout).into_owned()
}

/// Puts `bundle` and its signature `sig` at `dest` and `dest.minisig`: both copied beside
/// them first, then renamed back to back, the signature first (a conditional GET between the
/// two renames still finds the old bundle unchanged and asks for no signature).
fn publish(bundle: &Path, sig: &Path, dest: &Path) {
    let dest_sig = PathBuf::from(format!("{}.minisig", dest.display()));
    let staged = |from: &Path, to: &Path| {
        let tmp = PathBuf::from(format!("{}.stage", to.display()));
        std::fs::copy(from, &tmp).expect("stage");
        tmp
    };
    let (tmp_sig, tmp_bundle) = (staged(sig, &dest_sig), staged(bundle, dest));
    std::fs::rename(tmp_sig, &dest_sig).expect("publish signature");
    std::fs::rename(tmp_bundle, dest).expect("publish bundle");
}

/// A bundle built and signed in `work`, named `name`: (bundle, signature).
struct Made {
    bundle: PathBuf,
    sig: PathBuf,
}

#[allow(clippy::too_many_arguments)]
fn made(
    work: &Path,
    name: &str,
    main: &str,
    extra: &[(&str, &str)],
    revision: u64,
    local: &str,
    key: &SigningKey,
) -> Made {
    let bundle = work.join(name);
    make_bundle(work, main, extra, revision, local, &bundle);
    key.sign(&bundle);
    Made {
        sig: PathBuf::from(format!("{}.minisig", bundle.display())),
        bundle,
    }
}

fn status(d: &Daemon) -> Value {
    let (code, out, err) = d.ctl(&[], &["status", "--json"]);
    assert_eq!(code, 0, "ctl status: {err}");
    serde_json::from_str(&out).expect("status JSON")
}

/// Waits (10 s at most) until `ok` holds of `ctl status --json`'s policy source.
fn wait_source(d: &Daemon, what: &str, ok: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let s = status(d);
        if ok(&s["policy"]["source"]) {
            return s;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: not within 10 s; source: {}\nlog:\n{}",
            s["policy"]["source"],
            d.logs()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn revision(s: &Value) -> Option<u64> {
    s["revision"].as_u64()
}

/// The audit log's `policy` records.
fn policy_records(d: &Daemon) -> Vec<Value> {
    lines(&d.audit_path())
        .into_iter()
        .filter(|l| l["kind"] == "policy")
        .collect()
}

/// Waits for a `policy` record refusing with `reason` (after the first `skip` of them).
fn wait_refusal(d: &Daemon, reason: &str, skip: usize) -> Value {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let found: Vec<Value> = policy_records(d)
            .into_iter()
            .filter(|r| r["outcome"] == "refused" && r["reason"] == reason)
            .collect();
        if found.len() > skip {
            return found[skip].clone();
        }
        assert!(
            Instant::now() < deadline,
            "no {reason} refusal recorded within 10 s; records: {:?}\nlog:\n{}",
            policy_records(d),
            d.logs()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn reloads(d: &Daemon) -> usize {
    lines(&d.audit_path())
        .iter()
        .filter(|l| l["kind"] == "reload")
        .count()
}

async fn code_of(w: &World, host: &str, path: &str) -> (u16, Value) {
    let out = w.transparent("https", host, path, &[]).await;
    let body = serde_json::from_slice(&out.body).unwrap_or(Value::Null);
    (out.status, body)
}

fn source_config(url: &str, key: &Path, ca: Option<&Path>, more: &[&str]) -> Vec<String> {
    let mut lines = vec![
        "[policy.source]".to_string(),
        format!("url = {url:?}"),
        format!("public_key = {:?}", key.display().to_string()),
        "interval = \"1s\"".to_string(),
        "cache = \"policy-cache\"".to_string(),
        "max_size = 65536".to_string(),
    ];
    if let Some(ca) = ca {
        lines.push(format!("ca = {:?}", ca.display().to_string()));
    }
    lines.extend(more.iter().map(|l| l.to_string()));
    lines
}

fn scrape(d: &Daemon) -> String {
    let out = std::process::Command::new("curl")
        .args(["-sS", &format!("http://{}/metrics", d.metrics)])
        .output()
        .expect("curl metrics");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread")]
async fn bundles_from_nginx_apply_update_and_refuse_tampered_foreign_old_and_oversized() {
    if let Some(why) = bundle_server::missing() {
        eprintln!("{why}");
        return;
    }
    let key = SigningKey::generate();
    let other_key = SigningKey::generate();
    let mut nginx = Nginx::start();
    let work = tempfile::tempdir().expect("work dir");
    let w = work.path();
    let dest = nginx.root.join("bundle.tar.gz");

    let r1 = made(
        w,
        "r1.tar.gz",
        &allowing(&["a.test"]),
        &[],
        1,
        "merge",
        &key,
    );
    publish(&r1.bundle, &r1.sig, &dest);

    let api = ApiUpstream::start("bundles CA", &HOSTS, UpstreamOptions::default()).await;
    let mut opts = api.daemon_options("");
    // No local policy: the bundle alone decides.
    opts.policies.clear();
    opts.extra_config = source_config(
        &nginx.url("bundle.tar.gz"),
        &key.public,
        Some(&nginx.ca_file),
        &[],
    );
    let started = Instant::now();
    let mut w_ = api.world(opts);
    let s = wait_source(&w_.daemon, "revision 1 applied", |s| revision(s) == Some(1));
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "applied within one interval of the start (took {:?})",
        started.elapsed()
    );
    let sha1 = s["policy"]["source"]["sha256"]
        .as_str()
        .expect("sha256")
        .to_string();
    assert_eq!(sha1.len(), 64);
    assert_eq!(code_of(&w_, "a.test", "/").await.0, 200);
    let (code, body) = code_of(&w_, "b.test", "/").await;
    assert_eq!(
        (code, &body["error_code"]),
        (403, &Value::from("policy_denied"))
    );

    // Nothing new: conditional GETs answered 304, no reload, no record.
    let before = (reloads(&w_.daemon), policy_records(&w_.daemon).len());
    std::thread::sleep(Duration::from_millis(3500));
    let served = nginx.served("bundle.tar.gz");
    assert!(
        served.iter().filter(|s| **s == 304).count() >= 2,
        "conditional GETs answered 304: {served:?}"
    );
    assert_eq!(
        (reloads(&w_.daemon), policy_records(&w_.daemon).len()),
        before,
        "a 304 costs no reload and no record"
    );

    // A new revision: a new ETag, applied through the reload path.
    let etag = |n: &Nginx| {
        let out = std::process::Command::new("curl")
            .args(["-sSI", "--cacert"])
            .arg(&n.ca_file)
            .arg(n.url("bundle.tar.gz"))
            .output()
            .expect("curl -I");
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .find(|l| l.to_ascii_lowercase().starts_with("etag:"))
            .map(str::to_string)
            .unwrap_or_default()
    };
    let etag1 = etag(&nginx);
    let r2 = made(
        w,
        "r2.tar.gz",
        &allowing(&["a.test", "b.test"]),
        &[(
            "more.toml",
            "version = 1\n# revision 2 brings a second file\n",
        )],
        2,
        "merge",
        &key,
    );
    publish(&r2.bundle, &r2.sig, &dest);
    assert_ne!(
        etag(&nginx),
        etag1,
        "nginx serves the new revision under a new ETag"
    );
    let s = wait_source(&w_.daemon, "revision 2 applied", |s| revision(s) == Some(2));
    let sha2 = s["policy"]["source"]["sha256"]
        .as_str()
        .expect("sha")
        .to_string();
    assert_ne!(sha1, sha2);
    assert_eq!(code_of(&w_, "b.test", "/").await.0, 200);
    let reload = lines(&w_.daemon.audit_path())
        .into_iter()
        .rev()
        .find(|l| l["kind"] == "reload")
        .expect("a reload record");
    assert_eq!(reload["trigger"], "policy bundle revision 2");
    assert_eq!(reload["result"], "ok");

    // Tampered: a byte of the signed bundle changed.
    let r3 = made(
        w,
        "r3.tar.gz",
        &allowing(&["c.test"]),
        &[],
        3,
        "merge",
        &key,
    );
    let mut bytes = std::fs::read(&r3.bundle).expect("r3");
    let at = bytes.len() / 2;
    bytes[at] ^= 0x55;
    let tampered = w.join("tampered.tar.gz");
    std::fs::write(&tampered, &bytes).expect("tampered");
    publish(&tampered, &r3.sig, &dest);
    let rec = wait_refusal(&w_.daemon, "signature", 0);
    assert_eq!(rec["revision"], Value::Null, "nothing of it was parsed");

    // Signed by another key.
    let foreign = made(
        w,
        "foreign.tar.gz",
        &allowing(&["c.test"]),
        &[],
        3,
        "merge",
        &other_key,
    );
    publish(&foreign.bundle, &foreign.sig, &dest);
    let rec = wait_refusal(&w_.daemon, "signature", 1);
    assert!(
        rec["error"].as_str().unwrap_or("").contains("another key"),
        "{rec}"
    );

    // A rollback to revision 1 (validly signed).
    publish(&r1.bundle, &r1.sig, &dest);
    let rec = wait_refusal(&w_.daemon, "rollback", 0);
    assert_eq!(rec["revision"], 1);

    // Over max_size (64 KiB): random hex does not compress below it.
    let mut noise = String::from("version = 1\n# ");
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    while noise.len() < 300_000 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        noise.push_str(&format!("{x:016x}"));
    }
    noise.push('\n');
    let big = made(
        w,
        "big.tar.gz",
        &allowing(&["c.test"]),
        &[("noise.toml", &noise)],
        4,
        "merge",
        &key,
    );
    assert!(std::fs::metadata(&big.bundle).expect("big").len() > 65536);
    publish(&big.bundle, &big.sig, &dest);
    wait_refusal(&w_.daemon, "too_large", 0);

    // Through all of it, revision 2 stayed in force.
    let s = status(&w_.daemon);
    assert_eq!(revision(&s["policy"]["source"]), Some(2));
    assert_eq!(s["policy"]["source"]["sha256"], Value::from(sha2.clone()));
    assert_eq!(code_of(&w_, "a.test", "/").await.0, 200);
    assert_eq!(code_of(&w_, "b.test", "/").await.0, 200);
    assert_eq!(code_of(&w_, "c.test", "/").await.0, 403);
    let applied: Vec<Value> = policy_records(&w_.daemon)
        .into_iter()
        .filter(|r| r["outcome"] == "applied")
        .collect();
    assert_eq!(
        applied.len(),
        2,
        "revisions 1 and 2, once each: {applied:?}"
    );
    assert_eq!(applied[1]["sha256"], Value::from(sha2.clone()));
    assert_eq!(applied[1]["origin"], "source");

    // ctl and metrics show the revision, its hash, the last sync and the last error.
    let (code, text, _) = w_.daemon.ctl(&[], &["status"]);
    assert_eq!(code, 0);
    assert!(
        text.contains("revision 2") && text.contains(&sha2),
        "{text}"
    );
    assert!(text.contains("sync error    too_large"), "{text}");
    let (_, show, _) = w_.daemon.ctl(&[], &["policy", "show", "--json"]);
    let show: Value = serde_json::from_str(&show).expect("policy show JSON");
    assert_eq!(show["source"]["revision"], 2);
    assert!(show["source"]["last_sync"].is_string());
    let metrics = scrape(&w_.daemon);
    let info = format!("agenshield_proxy_policy_source_info{{hash=\"{sha2}\",revision=\"2\"}} 1");
    assert!(metrics.contains(&info), "{info} in:\n{metrics}");
    for reason in ["signature", "rollback", "too_large"] {
        assert!(
            metrics.contains(&format!(
                "agenshield_proxy_policy_source_sync_failures_total{{reason=\"{reason}\"}}"
            )),
            "{reason} counted"
        );
    }
    assert!(metrics.contains("agenshield_proxy_policy_source_last_sync_timestamp_seconds "));

    // The server down: a restart starts from the cache (verified again), revision 2.
    nginx.down();
    w_.daemon.restart();
    let s = status(&w_.daemon);
    assert_eq!(revision(&s["policy"]["source"]), Some(2), "{s}");
    assert_eq!(s["policy"]["source"]["from"], "cache");
    assert_eq!(code_of(&w_, "b.test", "/").await.0, 200);
    assert_eq!(code_of(&w_, "c.test", "/").await.0, 403);
    wait_source(&w_.daemon, "the outage is shown", |s| {
        s["last_error"]["reason"] == "fetch"
    });
    let last = policy_records(&w_.daemon).pop().expect("a record");
    assert_eq!(
        (&last["outcome"], &last["origin"], &last["revision"]),
        (
            &Value::from("applied"),
            &Value::from("cache"),
            &Value::from(2)
        )
    );
    assert_matches_schema(&lines(&w_.daemon.audit_path()));
}

#[tokio::test(flavor = "multi_thread")]
async fn require_first_sync_refuses_every_request_until_the_first_bundle() {
    if let Some(why) = bundle_server::missing() {
        eprintln!("{why}");
        return;
    }
    let key = SigningKey::generate();
    let nginx = Nginx::start();
    let work = tempfile::tempdir().expect("work dir");
    let api = ApiUpstream::start("first sync CA", &HOSTS, UpstreamOptions::default()).await;
    // A local policy that would allow a.test: not used before the first bundle.
    let mut opts = api.daemon_options(&allowing(&["a.test"]));
    opts.extra_config = source_config(
        &nginx.url("bundle.tar.gz"),
        &key.public,
        Some(&nginx.ca_file),
        &["require_first_sync = true"],
    );
    let w_ = api.world(opts);
    let (code, body) = code_of(&w_, "a.test", "/").await;
    assert_eq!(code, 403, "{body}");
    assert_eq!(body["error_code"], "policy_unavailable", "{body}");
    let (_, text, _) = w_.daemon.ctl(&[], &["status"]);
    assert!(text.contains("REFUSING ALL"), "{text}");
    let refused = lines(&w_.daemon.audit_path())
        .into_iter()
        .find(|l| l["error_code"] == "policy_unavailable")
        .expect("the refusal is recorded");
    assert_eq!(refused["decision"], "deny");

    let r1 = made(
        work.path(),
        "r1.tar.gz",
        &allowing(&["b.test"]),
        &[],
        1,
        "ignore",
        &key,
    );
    publish(&r1.bundle, &r1.sig, &nginx.root.join("bundle.tar.gz"));
    wait_source(&w_.daemon, "the first bundle", |s| revision(s) == Some(1));
    assert_eq!(code_of(&w_, "b.test", "/").await.0, 200);
    let (code, body) = code_of(&w_, "a.test", "/").await;
    assert_eq!(
        (code, &body["error_code"]),
        (403, &Value::from("policy_denied")),
        "local = \"ignore\": the local allow does not apply"
    );
    assert_matches_schema(&lines(&w_.daemon.audit_path()));
}

#[tokio::test(flavor = "multi_thread")]
async fn deny_only_bundle_over_file_url_drops_local_allows_and_keeps_local_denies() {
    if let Some(why) = bundle_server::missing() {
        eprintln!("{why}");
        return;
    }
    let key = SigningKey::generate();
    let volume = tempfile::tempdir().expect("mounted volume");
    let r1 = made(
        volume.path(),
        "bundle.tar.gz",
        &allowing(&["a.test", "b.test"]),
        &[],
        7,
        "deny-only",
        &key,
    );
    let local =
        "version = 1\n[[rule]]\nid = \"local-allow\"\naction = \"allow\"\nhosts = [\"c.test\"]\n\n\
                 [[rule]]\nid = \"local-deny\"\naction = \"deny\"\nhosts = [\"b.test\"]\n";
    let api = ApiUpstream::start("deny-only CA", &HOSTS, UpstreamOptions::default()).await;
    let mut opts = api.daemon_options(local);
    opts.extra_config = source_config(
        &format!("file://{}", r1.bundle.display()),
        &key.public,
        None,
        &[],
    );
    let w_ = api.world(opts);
    wait_source(&w_.daemon, "revision 7 from file://", |s| {
        revision(s) == Some(7)
    });
    assert_eq!(
        code_of(&w_, "a.test", "/").await.0,
        200,
        "the bundle allows a.test"
    );
    let (code, body) = code_of(&w_, "b.test", "/").await;
    assert_eq!(
        (code, &body["rule_id"]),
        (403, &Value::from("local-deny")),
        "a local deny applies"
    );
    let (code, body) = code_of(&w_, "c.test", "/").await;
    assert_eq!(
        (code, &body["rule_id"]),
        (403, &Value::from("default")),
        "a local allow is left out"
    );
    let (_, show, _) = w_.daemon.ctl(&[], &["policy", "show"]);
    assert!(
        show.contains("local ignored") && show.contains("local-allow"),
        "ctl policy show reports it: {show}"
    );
    let (_, json, _) = w_.daemon.ctl(&[], &["policy", "show", "--json"]);
    let json: Value = serde_json::from_str(&json).expect("JSON");
    assert_eq!(json["source"]["local"], "deny-only");
    assert!(json["local_dropped"][0]
        .as_str()
        .is_some_and(|l| l.contains("local-allow")));
    assert!(
        w_.daemon.logs().contains("left out"),
        "reported at load in the log"
    );
    assert_matches_schema(&lines(&w_.daemon.audit_path()));
}

#[tokio::test(flavor = "multi_thread")]
async fn policy_bundle_refuses_an_invalid_directory() {
    let dir = tempfile::tempdir().expect("dir");
    std::fs::write(
        dir.path().join("main.toml"),
        "version = 1\n[[rule]]\nid = \"x\"\naction = \"maybe\"\nhosts = [\"a.test\"]\n",
    )
    .expect("write");
    let out = dir.path().join("b.tar.gz");
    let run = std::process::Command::new(binary())
        .args(["proxy", "policy", "bundle"])
        .arg(dir.path())
        .arg("--out")
        .arg(&out)
        .output()
        .expect("run");
    assert_eq!(run.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&run.stderr).contains("maybe"));
    assert!(!out.exists(), "no bundle is written");
}

/// A split daemon (root supervisor, unprivileged worker): the worker fetches (the supervisor
/// reads nothing from the network) and writes the cache as itself, 0700.
// The root guard serialises root tests across the whole test process, awaits included.
#[allow(clippy::await_holding_lock)]
#[cfg(target_os = "linux")]
#[tokio::test(flavor = "multi_thread")]
async fn a_split_daemons_worker_fetches_and_owns_the_cache() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    use agenshield_e2e::netlab::{root_or_skip, AgentUser};
    let Some(_serial) = root_or_skip("a_split_daemons_worker_fetches_and_owns_the_cache") else {
        return;
    };
    if let Some(why) = bundle_server::missing() {
        eprintln!("{why}");
        return;
    }
    let key = SigningKey::generate();
    let nginx = Nginx::start();
    // What the worker reads must be readable by it: the key and the server's CA, in the open.
    let shared = tempfile::tempdir().expect("shared");
    std::fs::set_permissions(shared.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let (pub_key, ca) = (
        shared.path().join("policy.pub"),
        shared.path().join("ca.pem"),
    );
    std::fs::copy(&key.public, &pub_key).expect("copy key");
    std::fs::copy(&nginx.ca_file, &ca).expect("copy CA");
    for f in [&pub_key, &ca] {
        std::fs::set_permissions(f, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    }
    let work = tempfile::tempdir().expect("work");
    let r1 = made(
        work.path(),
        "r1.tar.gz",
        &allowing(&["a.test"]),
        &[],
        1,
        "merge",
        &key,
    );
    publish(&r1.bundle, &r1.sig, &nginx.root.join("bundle.tar.gz"));

    let worker = AgentUser::create(std::process::id() % 97 + 300);
    let api = ApiUpstream::start("split CA", &HOSTS, UpstreamOptions::default()).await;
    let mut opts = api.daemon_options("version = 1\n");
    opts.worker_user = Some((worker.name.clone(), worker.uid));
    opts.extra_config = source_config(&nginx.url("bundle.tar.gz"), &pub_key, Some(&ca), &[]);
    let w_ = api.world(opts);
    wait_source(&w_.daemon, "revision 1 in the worker", |s| {
        revision(s) == Some(1)
    });
    assert_eq!(code_of(&w_, "a.test", "/").await.0, 200);
    let cache = w_.daemon.dir.path().join("policy-cache");
    let meta = std::fs::metadata(&cache).expect("the cache directory");
    assert_eq!(meta.uid(), worker.uid, "written by the worker, not root");
    assert_eq!(meta.mode() & 0o777, 0o700);
    let bundle = std::fs::metadata(cache.join("bundle.tar.gz")).expect("cached bundle");
    assert_eq!(bundle.uid(), worker.uid);
    assert_eq!(bundle.mode() & 0o777, 0o600);
    assert!(w_.daemon.logs().contains("worker started"), "a split start");
}
