//! AWS SigV4 signed again: the real AWS CLI, configured with the access key id's placeholder
//! and a secret key that is not the real one, talks to a loopback upstream that checks every
//! signature with the real key (`agenshield_e2e::aws`, S3 and STS shaped) through the real
//! daemon. STS (a form body, hashed into the signature) and S3 PutObject / GetObject work;
//! a body signed chunk by chunk (`STREAMING-AWS4-HMAC-SHA256-PAYLOAD`, with and without
//! trailers), as the Java and Go SDKs send, is signed again chunk by chunk; the same CLI
//! pointed at a host the rule does not cover is refused before anything leaves; neither key
//! reaches the agent or anything the daemon wrote.

use std::path::{Path, PathBuf};
use std::process::Command;

use agenshield_e2e::audit;
use agenshield_e2e::aws::AwsAccount;
use agenshield_e2e::curl::curl;
use agenshield_e2e::upstream::UpstreamOptions;
use agenshield_e2e::world::{ApiUpstream, World};

const KEY_ID: &str = "AKIAAGENSHIELDE2E001";
const SECRET_KEY: &str = "aWsSeCrEt/e2e+Key0123456789abcdefGHIJklmn";
/// What the agent's SDK is given instead.
const PLACEHOLDER_ID: &str = "agenshield:secret:aws_key";
const AGENT_SECRET: &str = "not-the-real-secret-key";

const BASE: &str = r#"
version = 1
default = "deny"

[[rule]]
id = "other"
hosts = ["other.test"]
action = "allow"
"#;

/// Written once the secrets exist (a policy binding a missing secret does not load).
const BINDINGS: &str = r#"
version = 1

[[rule]]
id = "aws"
hosts = ["s3.test", "sts.test"]
action = "allow"
sigv4 = { access_key_id = "aws_key", secret_access_key = "aws_secret", services = ["s3", "sts"], regions = ["us-east-1"], actions = ["GetCallerIdentity"], copy_sources = ["agent-bucket/*"] }

[[rule]]
id = "mint"
hosts = ["mint.test"]
action = "allow"
sigv4 = { access_key_id = "aws_key", secret_access_key = "aws_secret", services = ["sts"], regions = ["us-east-1"], actions = ["GetSessionToken"] }
"#;

const HOSTS: [&str; 4] = ["s3.test", "sts.test", "other.test", "mint.test"];

/// The AWS CLI to run: `AGENSHIELD_AWS_CLI` (to try another version), else Debian's
/// (`.ci/run` installs it), else any on PATH.
fn aws_cli() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("AGENSHIELD_AWS_CLI") {
        return Some(PathBuf::from(p));
    }
    let debian = PathBuf::from("/usr/bin/aws");
    if debian.exists() {
        return Some(debian);
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join("aws"))
        .find(|p| p.exists())
}

/// The shared world with an AWS account behind the upstream (the test reads what it saw),
/// the keys stored, the bindings in force, and an AWS config for the CLI in its directory.
async fn world() -> (World, AwsAccount) {
    let account = AwsAccount {
        access_key_id: KEY_ID.into(),
        secret_access_key: SECRET_KEY.into(),
        ..Default::default()
    };
    let api = ApiUpstream::start(
        "aws upstream CA",
        &HOSTS,
        UpstreamOptions {
            name: "aws".into(),
            aws: Some(account.clone()),
            ..Default::default()
        },
    )
    .await;
    let opts = api.daemon_options(BASE);
    let w = api.world(opts);
    let daemon = &w.daemon;
    for (name, value) in [("aws_key", KEY_ID), ("aws_secret", SECRET_KEY)] {
        let (code, _, err) = daemon.ctl_stdin(&["secrets", "set", name], value.as_bytes());
        assert_eq!(code, 0, "secrets set {name}: {err}");
    }
    std::fs::write(daemon.dir.path().join("policies/aws.toml"), BINDINGS).expect("policy");
    daemon.wait_for_policy(&["s3.test"]);
    std::fs::write(
        w.scratch().join("config"),
        "[default]\nregion = us-east-1\ns3 =\n    addressing_style = path\n",
    )
    .expect("aws config");
    (w, account)
}

fn endpoint(w: &World, host: &str) -> String {
    format!("https://{host}:{}", w.up.addr.port())
}

/// The AWS CLI as an agent runs it: placeholder keys, the proxy from the environment,
/// the daemon's CA, nothing else (no instance metadata, no real config).
fn aws(w: &World, cli: &Path, host: &str, args: &[&str]) -> (i32, String, String) {
    let home = w.scratch();
    let out = Command::new(cli)
        .args(args)
        .args(["--endpoint-url", &endpoint(w, host)])
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("HOME", home)
        .env("AWS_CONFIG_FILE", home.join("config"))
        .env("AWS_SHARED_CREDENTIALS_FILE", home.join("no-credentials"))
        .env("AWS_ACCESS_KEY_ID", PLACEHOLDER_ID)
        .env("AWS_SECRET_ACCESS_KEY", AGENT_SECRET)
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .env("AWS_PAGER", "")
        .env("AWS_CA_BUNDLE", &w.daemon.ca_path)
        .env("HTTPS_PROXY", format!("http://{}", w.daemon.explicit))
        .output()
        .expect("run aws");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// PUTs `object` signed chunk by chunk with the placeholder key id (signatures that no
/// real key made), through the explicit proxy with curl; the status.
async fn put_signed_chunks(w: &World, key: &str, object: &[u8], trailer: bool) -> (u16, String) {
    let (mode, trailer_header) = if trailer {
        ("STREAMING-AWS4-HMAC-SHA256-PAYLOAD-TRAILER", true)
    } else {
        ("STREAMING-AWS4-HMAC-SHA256-PAYLOAD", false)
    };
    let bogus = "0".repeat(64);
    let mut body = Vec::new();
    for chunk in object.chunks(64 * 1024).chain([&[][..]]) {
        body.extend_from_slice(format!("{:x};chunk-signature={bogus}\r\n", chunk.len()).as_bytes());
        body.extend_from_slice(chunk);
        if !(chunk.is_empty() && trailer) {
            body.extend_from_slice(b"\r\n");
        }
    }
    if trailer {
        body.extend_from_slice(b"x-amz-checksum-crc32:AAAAAA==\r\n");
        body.extend_from_slice(format!("x-amz-trailer-signature:{bogus}\r\n\r\n").as_bytes());
    }
    let file = w.scratch().join(format!("{key}.chunked"));
    std::fs::write(&file, &body).expect("body");
    let now = time_now();
    let date = &now[..8];
    let mut signed =
        "content-encoding;host;x-amz-content-sha256;x-amz-date;x-amz-decoded-content-length"
            .to_string();
    if trailer_header {
        signed.push_str(";x-amz-trailer");
    }
    let auth = format!(
        "Authorization: AWS4-HMAC-SHA256 Credential={PLACEHOLDER_ID}/{date}/us-east-1/s3/aws4_request, SignedHeaders={signed}, Signature={bogus}"
    );
    let url = format!("{}/agent-bucket/{key}", endpoint(w, "s3.test"));
    let proxy = format!("http://{}", w.daemon.explicit);
    let ca = w.daemon.ca_path.display().to_string();
    let decoded = format!("x-amz-decoded-content-length: {}", object.len());
    let data = format!("@{}", file.display());
    let mode_h = format!("x-amz-content-sha256: {mode}");
    let date_h = format!("x-amz-date: {now}");
    let mut args = vec![
        "--cacert",
        &ca,
        "--proxy",
        &proxy,
        "-X",
        "PUT",
        "--data-binary",
        &data,
        "-H",
        &auth,
        "-H",
        &mode_h,
        "-H",
        &date_h,
        "-H",
        "Content-Encoding: aws-chunked",
        "-H",
        &decoded,
        "-H",
        "Content-Type: application/octet-stream",
    ];
    if trailer_header {
        args.extend(["-H", "x-amz-trailer: x-amz-checksum-crc32"]);
    }
    args.push(&url);
    let out = curl(&args, false).await;
    (out.status, out.text())
}

/// Now as `20261124T101500Z`.
fn time_now() -> String {
    let out = Command::new("date")
        .args(["-u", "+%Y%m%dT%H%M%SZ"])
        .output()
        .expect("date");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn assert_no_key(what: &str, text: &str) {
    use base64::Engine as _;
    let forms = [
        SECRET_KEY.to_string(),
        percent_encoding::utf8_percent_encode(SECRET_KEY, percent_encoding::NON_ALPHANUMERIC)
            .to_string(),
        base64::engine::general_purpose::STANDARD.encode(SECRET_KEY),
        KEY_ID.to_string(),
    ];
    for f in forms {
        assert!(
            !text.contains(&f),
            "{what} contains a real key (as {f:?}):\n{text}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_aws_cli_with_placeholder_keys_is_signed_again_with_the_real_ones() {
    let Some(cli) = aws_cli() else {
        let why = "the AWS CLI is not installed (.ci/run installs Debian's awscli)";
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "{why}; CI must run this test"
        );
        return eprintln!("skipped: {why}");
    };
    let (w, account) = world().await;
    let mut agent_saw = String::new();

    // 1. STS: a form body with no x-amz-content-sha256, so its hash is in the signature.
    let (code, out, err) = aws(
        &w,
        &cli,
        "sts.test",
        &["sts", "get-caller-identity", "--output", "json"],
    );
    assert_eq!(
        code,
        0,
        "sts get-caller-identity: {err}\nupstream refused: {:?}",
        account.refused.lock().expect("lock")
    );
    let id: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(id["Account"], "123456789012", "{out}");
    // The upstream echoed the real key id: the agent sees the placeholder in its place.
    assert_eq!(id["UserId"], PLACEHOLDER_ID, "{out}");
    agent_saw.push_str(&out);
    agent_saw.push_str(&err);

    // 2. S3 PutObject and GetObject, path-style, a 300 KiB object.
    let object: Vec<u8> = (0..300 * 1024u32).map(|i| (i % 251) as u8).collect();
    let src = w.scratch().join("object.bin");
    std::fs::write(&src, &object).expect("object");
    let (code, out, err) = aws(
        &w,
        &cli,
        "s3.test",
        &[
            "s3api",
            "put-object",
            "--bucket",
            "agent-bucket",
            "--key",
            "notes/object.bin",
            "--body",
            &src.display().to_string(),
        ],
    );
    assert_eq!(
        code,
        0,
        "put-object: {err}\nupstream refused: {:?}",
        account.refused.lock().expect("lock")
    );
    agent_saw.push_str(&out);
    agent_saw.push_str(&err);
    let dst = w.scratch().join("fetched.bin");
    let (code, out, err) = aws(
        &w,
        &cli,
        "s3.test",
        &[
            "s3api",
            "get-object",
            "--bucket",
            "agent-bucket",
            "--key",
            "notes/object.bin",
            &dst.display().to_string(),
        ],
    );
    assert_eq!(code, 0, "get-object: {err}");
    assert!(
        std::fs::read(&dst).expect("fetched") == object,
        "the object came back whole"
    );
    agent_saw.push_str(&out);
    agent_saw.push_str(&err);

    // 3. Signed chunks, with and without trailers: each chunk signed again.
    let big: Vec<u8> = (0..200 * 1024u32).map(|i| (i % 199) as u8).collect();
    for (key, trailer) in [("chunked.bin", false), ("trailer.bin", true)] {
        let (status, text) = put_signed_chunks(&w, key, &big, trailer).await;
        assert_eq!(
            status,
            200,
            "{key}: {text}\nupstream refused: {:?}",
            account.refused.lock().expect("lock")
        );
        let objects = account.objects.lock().expect("lock");
        assert!(
            objects.get(&format!("/agent-bucket/{key}")) == Some(&big),
            "{key} stored whole"
        );
    }
    let verified = account.verified.lock().expect("lock").clone();
    for want in [
        "POST / hashed",
        "GET /agent-bucket/notes/object.bin",
        "PUT /agent-bucket/chunked.bin STREAMING-AWS4-HMAC-SHA256-PAYLOAD",
        "PUT /agent-bucket/trailer.bin STREAMING-AWS4-HMAC-SHA256-PAYLOAD-TRAILER",
    ] {
        assert!(
            verified.iter().any(|v| v.starts_with(want)),
            "{want} not among {verified:?}"
        );
    }
    assert!(
        verified
            .iter()
            .any(|v| v.starts_with("PUT /agent-bucket/notes/object.bin")),
        "{verified:?}"
    );
    assert!(
        account.refused.lock().expect("lock").is_empty(),
        "every signature verified"
    );
    eprintln!("verified by the upstream: {verified:#?}");

    // 4. The same placeholder to a host the rule does not cover: refused, nothing sent.
    let before = w.up.requests().len();
    let (code, out, err) = aws(&w, &cli, "other.test", &["sts", "get-caller-identity"]);
    assert_ne!(code, 0, "refused: {out}");
    assert!(
        err.contains("403") || err.contains("Forbidden") || err.contains("secret"),
        "{err}"
    );
    assert_eq!(
        w.up.requests().len(),
        before,
        "nothing reached the upstream"
    );
    agent_saw.push_str(&out);
    agent_saw.push_str(&err);
    let recs = audit::lines(&w.daemon.audit_path());
    let refused = recs
        .iter()
        .find(|r| r["host"] == "other.test")
        .expect("the refusal is recorded");
    assert_eq!(refused["error_code"], "secret_scope", "{refused}");
    let signed = recs
        .iter()
        .find(|r| r["host"] == "sts.test")
        .expect("the signed request is recorded");
    assert_eq!(
        signed["secrets"],
        serde_json::json!(["aws_key", "aws_secret"]),
        "{signed}"
    );

    // 5. No real key in anything the agent saw or the daemon wrote.
    assert_no_key("the agent's view", &agent_saw);
    assert_no_key(
        "what the daemon wrote",
        &w.daemon.everything_written().await,
    );
}

/// The agent writes the credential scope and the action; the real keys sign only what the
/// rule's `sigv4` says: no other bucket through `copy-object`, no other service or region,
/// no fresh keys from STS unless the rule names the action, and then the fresh keys never
/// reach the agent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_real_keys_sign_only_what_the_rule_says() {
    let Some(cli) = aws_cli() else {
        let why = "the AWS CLI is not installed (.ci/run installs Debian's awscli)";
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "{why}; CI must run this test"
        );
        return eprintln!("skipped: {why}");
    };
    let (w, account) = world().await;
    {
        let mut objects = account.objects.lock().expect("lock");
        objects.insert("/agent-bucket/a.txt".into(), b"mine".to_vec());
        objects.insert("/other-bucket/secret.txt".into(), b"not yours".to_vec());
    }
    let copy = |source: &str, key: &str| {
        aws(
            &w,
            &cli,
            "s3.test",
            &[
                "s3api",
                "copy-object",
                "--bucket",
                "agent-bucket",
                "--key",
                key,
                "--copy-source",
                source,
            ],
        )
    };
    // Within the bucket the rule names: signed, and done.
    let (code, _, err) = copy("agent-bucket/a.txt", "b.txt");
    assert_eq!(code, 0, "{err}");
    // From another bucket the keys can read: refused before anything is sent.
    let before = w.up.requests().len();
    let (code, _, err) = copy("other-bucket/secret.txt", "stolen.txt");
    assert_ne!(code, 0, "refused");
    assert!(err.contains("403") || err.contains("Forbidden"), "{err}");
    assert_eq!(w.up.requests().len(), before, "nothing reached S3");
    assert!(!account
        .objects
        .lock()
        .expect("lock")
        .contains_key("/agent-bucket/stolen.txt"));

    // Another region than the rule's: refused.
    let (code, _, err) = aws(
        &w,
        &cli,
        "sts.test",
        &["sts", "get-caller-identity", "--region", "eu-west-1"],
    );
    assert_ne!(code, 0, "{err}");
    // STS handing out fresh keys, under the rule that does not name the action: refused.
    let (code, out, _) = aws(&w, &cli, "sts.test", &["sts", "get-session-token"]);
    assert_ne!(code, 0, "{out}");
    assert_eq!(w.up.requests().len(), before, "nothing reached STS");
    // Under the rule that names it exactly: signed, and the fresh keys are redacted.
    let (code, out, err) = aws(
        &w,
        &cli,
        "mint.test",
        &["sts", "get-session-token", "--output", "json"],
    );
    assert_eq!(
        code,
        0,
        "{err}\nupstream refused: {:?}",
        account.refused.lock().expect("lock")
    );
    let creds: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(
        creds["Credentials"]["SecretAccessKey"], "[redacted]",
        "{out}"
    );
    assert_eq!(creds["Credentials"]["SessionToken"], "[redacted]", "{out}");
    assert_eq!(
        creds["Credentials"]["AccessKeyId"], "ASIAFRESHKEY0000001",
        "{out}"
    );
    for fresh in [
        agenshield_e2e::aws::FRESH_SECRET,
        agenshield_e2e::aws::FRESH_TOKEN,
    ] {
        assert!(!out.contains(fresh) && !err.contains(fresh), "{out}{err}");
    }
    let recs = audit::lines(&w.daemon.audit_path());
    let scoped = recs
        .iter()
        .filter(|r| r["error_code"] == "secret_scope" && r["rule"] == "aws")
        .count();
    assert_eq!(
        scoped, 3,
        "the copy, the region and the STS call are recorded refused"
    );
}
