//! SigV4 signed again, checked against AWS's own published examples (the S3 documentation's
//! "GET object" and "PUT object in chunks" signatures), which no code here produced: the
//! agent's request carries the placeholder key id and signatures made with a key that is not
//! the real one, and what goes upstream must carry exactly the signatures AWS computed.

use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::{HeaderValue, Request};
use http_body_util::BodyExt;

use crate::policy::Sigv4Keys;
use crate::secrets::guard::scan::tests::headers;
use crate::secrets::rewrite::aws_chunked::Rechunker;
use crate::secrets::rewrite::sigv4::{self, Body, ChunkSigner};
use crate::secrets::set::SecretSet;
use crate::secrets::Violation;
use crate::secrets::{SecretName, SecretValue};

const KEY_ID: &str = "AKIAIOSFODNN7EXAMPLE";
const SECRET: &str = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY";
/// 2013-05-24T00:00:00Z, the examples' time.
fn example_time() -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_369_353_600)
}
const SEED: &str = "4f232c4386841ef735655705268965c44a0e4690baa4adea153f7db9fa80a0a9";
const CHUNK_SIGS: [&str; 3] = [
    "ad80c730a21e5b8d04586a2213dd63b9a0e99e0e2307b0ade35a65485a288648",
    "0055627c9e194cb4542bae2aa5492e3c1575bbb81b612b7d234b86a503ef5497",
    "b6c6ea8a5354eaf15b3cb7646744f4275b71ea724fed81ceb9323e279d449df9",
];
const BOGUS: &str = "0000000000000000000000000000000000000000000000000000000000000000";

fn keys() -> Sigv4Keys {
    Sigv4Keys {
        access_key_id: Arc::from("aws_key"),
        secret_access_key: Arc::from("aws_secret"),
        session_token: None,
        scope: Arc::new(crate::policy::Sigv4Scope {
            services: vec!["*".to_string()].into_boxed_slice(),
            regions: vec!["*".to_string()].into_boxed_slice(),
            actions: Some(
                crate::policy::sigv4_scope_globs(&["GetCallerIdentity", "Get*"]).expect("globs"),
            ),
            copy_sources: None,
        }),
    }
}

/// Keys whose rule signs S3 in eu-west-1 only, copying from `my-bucket` only, with no actions.
fn s3_keys() -> Sigv4Keys {
    Sigv4Keys {
        scope: Arc::new(crate::policy::Sigv4Scope {
            services: vec!["s3".to_string()].into_boxed_slice(),
            regions: vec!["eu-west-1".to_string()].into_boxed_slice(),
            actions: None,
            copy_sources: Some(crate::policy::sigv4_scope_globs(&["my-bucket/*"]).expect("globs")),
        }),
        ..keys()
    }
}

fn set() -> SecretSet {
    let entry = |n: &str, v: &str| {
        (
            SecretName::new(n).expect("name"),
            Arc::new(SecretValue::new(v.as_bytes().to_vec()).expect("value")),
        )
    };
    SecretSet::new(vec![entry("aws_key", KEY_ID), entry("aws_secret", SECRET)]).expect("set")
}

/// The agent's Authorization: its SDK signed with the placeholder key id and some key.
fn agent_auth(scope: &str, signed: &str) -> String {
    format!(
        "AWS4-HMAC-SHA256 Credential=agenshield:secret:aws_key/{scope},SignedHeaders={signed},Signature={BOGUS}"
    )
}

fn signature(auth: &HeaderValue) -> String {
    let a = auth.to_str().expect("text");
    a.rsplit("Signature=")
        .next()
        .expect("signature")
        .to_string()
}

/// The chunked body of the PUT example (65 KiB of `a` in a 64 KiB and a 1 KiB chunk), with
/// `sigs` as its chunk signatures.
fn chunked_body(sigs: [&str; 3]) -> Vec<u8> {
    let mut b = Vec::new();
    for (size, sig) in [(65536, sigs[0]), (1024, sigs[1]), (0, sigs[2])] {
        b.extend_from_slice(format!("{size:x};chunk-signature={sig}\r\n").as_bytes());
        b.extend(std::iter::repeat_n(b'a', size));
        b.extend_from_slice(b"\r\n");
    }
    b
}

#[tokio::test]
async fn the_chunked_put_example_is_signed_as_aws_signs_it() {
    let signed = "content-encoding;content-length;host;x-amz-content-sha256;x-amz-date;x-amz-decoded-content-length;x-amz-storage-class";
    let h = headers(&[
        (
            "authorization",
            &agent_auth("20130524/us-east-1/s3/aws4_request", signed),
        ),
        ("x-amz-date", "20991231T000000Z"),
        ("x-amz-storage-class", "REDUCED_REDUNDANCY"),
        ("x-amz-content-sha256", "STREAMING-AWS4-HMAC-SHA256-PAYLOAD"),
        ("content-encoding", "aws-chunked"),
        ("x-amz-decoded-content-length", "66560"),
        ("content-length", "66824"),
        ("user-agent", "not signed"),
    ]);
    let set = set();
    let plan = sigv4::plan(&set, &keys(), &h, "/")
        .expect("ok")
        .expect("ours");
    assert!(!plan.hashes_body());
    let body = chunked_body([BOGUS; 3]);
    assert_eq!(body.len(), 66824);
    let mut req = Request::builder()
        .method("PUT")
        .uri("/examplebucket/chunkObject.txt")
        .body(crate::body::full(Bytes::from(body)))
        .expect("request");
    *req.headers_mut() = h;
    let (parts, body) = req.into_parts();
    let verdict = Arc::new(OnceLock::new());
    let out = plan
        .sign(
            &set,
            parts,
            Body::Streaming(body),
            "https://s3.amazonaws.com/examplebucket/chunkObject.txt",
            example_time(),
            verdict.clone(),
        )
        .expect("signed");
    let auth = out.headers().get("authorization").expect("signed");
    assert_eq!(signature(auth), SEED);
    let text = auth.to_str().expect("text");
    assert!(text.contains("Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request"));
    assert!(text.contains(&format!("SignedHeaders={signed},")), "{text}");
    assert_eq!(out.headers()["x-amz-date"], "20130524T000000Z");
    let sent = out.into_body().collect().await.expect("body").to_bytes();
    assert_eq!(&sent[..], &chunked_body(CHUNK_SIGS)[..]);
    assert!(verdict.get().is_none());
}

#[test]
fn the_get_example_is_signed_as_aws_signs_it() {
    let signed = "host;range;x-amz-content-sha256;x-amz-date";
    let empty = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
    let h = headers(&[
        (
            "authorization",
            &agent_auth("20130524/us-east-1/s3/aws4_request", signed),
        ),
        ("range", "bytes=0-9"),
        ("x-amz-content-sha256", empty),
        ("x-amz-date", "20130524T000000Z"),
    ]);
    let set = set();
    let plan = sigv4::plan(&set, &keys(), &h, "/")
        .expect("ok")
        .expect("ours");
    let mut req = Request::builder()
        .uri("/test.txt")
        .body(crate::body::empty())
        .expect("request");
    *req.headers_mut() = h;
    let (parts, body) = req.into_parts();
    let out = plan
        .sign(
            &set,
            parts,
            Body::Streaming(body),
            "https://examplebucket.s3.amazonaws.com/test.txt",
            example_time(),
            Arc::default(),
        )
        .expect("signed");
    assert_eq!(
        signature(&out.headers()["authorization"]),
        "f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41"
    );
}

fn signer() -> ChunkSigner {
    let creds = aws_credential_types::Credentials::new(KEY_ID, SECRET, None, None, "test");
    ChunkSigner::new(creds.into(), "us-east-1", "s3", example_time())
}

/// However the body arrives (a byte at a time, in odd pieces, whole), the same chunks and
/// signatures go on.
#[test]
fn chunks_are_signed_again_across_every_split() {
    let input = chunked_body([BOGUS; 3]);
    let want = chunked_body(CHUNK_SIGS);
    for piece in [1, 2, 7, 85, 86, 87, 4096, 65_536 + 86, input.len()] {
        let mut r = Rechunker::new(signer(), SEED.into(), false);
        let mut out = Vec::new();
        for part in input.chunks(piece) {
            out.extend_from_slice(&r.push(part).expect("parses"));
        }
        r.finish().expect("complete");
        assert_eq!(out.len(), want.len(), "piece {piece}");
        assert!(out == want, "piece {piece}");
    }
}

#[test]
fn trailers_are_kept_and_signed_after_the_last_chunk() {
    let mut input = b"3;chunk-signature=".to_vec();
    input.extend_from_slice(BOGUS.as_bytes());
    input.extend_from_slice(b"\r\nabc\r\n0;chunk-signature=");
    input.extend_from_slice(BOGUS.as_bytes());
    input.extend_from_slice(b"\r\nx-amz-checksum-crc32:NSRBwg==\r\nx-amz-trailer-signature:");
    input.extend_from_slice(BOGUS.as_bytes());
    input.extend_from_slice(b"\r\n\r\n");
    let mut r = Rechunker::new(signer(), SEED.into(), true);
    let out = r.push(&input).expect("parses");
    r.finish().expect("complete");
    let out = String::from_utf8(out.to_vec()).expect("text");
    assert_eq!(out.len(), input.len());
    assert!(!out.contains(BOGUS), "{out}");
    let lines: Vec<&str> = out.split("\r\n").collect();
    assert_eq!(lines[1], "abc");
    assert_eq!(lines[3], "x-amz-checksum-crc32:NSRBwg==");
    assert!(lines[4].starts_with("x-amz-trailer-signature:"));
    assert_eq!(&lines[5..], ["", ""]);
    // The trailer's signature chains from the last chunk's: a different seed, a different one.
    let mut other = Rechunker::new(signer(), CHUNK_SIGS[0].into(), true);
    let again = other.push(&input).expect("parses");
    assert_ne!(&again[..], out.as_bytes());
}

#[test]
fn a_body_that_is_not_aws_chunked_is_refused() {
    let sig = format!(";chunk-signature={BOGUS}\r\n");
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (b"3\r\nabc\r\n".to_vec(), "without its chunk-signature"),
        (format!("zz{sig}").into_bytes(), "not hex"),
        (b"3;chunk-signature=12\r\nabc\r\n".to_vec(), "64 hex"),
        (
            format!("3;x=1{sig}").into_bytes(),
            "other than chunk-signature",
        ),
        (
            format!("2{sig}abc\r\n").into_bytes(),
            "not followed by CRLF",
        ),
        (format!("2000000{sig}").into_bytes(), "over 16 MiB"),
        (
            format!("0{sig}\r\nmore").into_bytes(),
            "after the last chunk",
        ),
        (vec![b'1'; 5000], "over 4096 bytes"),
    ];
    for (input, why) in cases {
        let mut r = Rechunker::new(signer(), SEED.into(), false);
        let e = r.push(&input).expect_err(why).to_string();
        assert!(e.contains(why), "{e:?} should say {why:?}");
    }
    let mut r = Rechunker::new(signer(), SEED.into(), false);
    r.push(format!("3{sig}ab").as_bytes())
        .expect("so far so good");
    assert!(r
        .finish()
        .expect_err("cut short")
        .to_string()
        .contains("ended before"));
    let mut r = Rechunker::new(signer(), SEED.into(), true);
    let unsigned = format!("0{sig}x-amz-checksum-crc32:AAAA\r\n\r\n");
    let e = r
        .push(unsigned.as_bytes())
        .expect_err("no trailer signature")
        .to_string();
    assert!(e.contains("without x-amz-trailer-signature"), "{e}");
}

#[test]
fn only_a_signature_made_with_the_placeholder_is_taken() {
    let set = set();
    let signed = "host;x-amz-date";
    let scope = "20261124/eu-west-1/sts/aws4_request";
    // Another key id, or another scheme: none of this rule's business.
    let real = format!(
        "AWS4-HMAC-SHA256 Credential={KEY_ID}/{scope},SignedHeaders={signed},Signature={BOGUS}"
    );
    for auth in [
        real.as_str(),
        "Bearer agenshield:secret:aws_key",
        "AWS4-HMAC-SHA256",
    ] {
        let h = headers(&[("authorization", auth)]);
        assert_eq!(sigv4::plan(&set, &keys(), &h, "/"), Ok(None), "{auth}");
    }
    let other_name = agent_auth(scope, signed).replace("secret:aws_key/", "secret:aws_other/");
    let h = headers(&[("authorization", &other_name)]);
    assert_eq!(sigv4::plan(&set, &keys(), &h, "/"), Ok(None));
    // Ours: no payload header means the body's hash is signed.
    let h = headers(&[("authorization", &agent_auth(scope, signed))]);
    let plan = sigv4::plan(&set, &keys(), &h, "/")
        .expect("ok")
        .expect("ours");
    assert!(plan.hashes_body());
    // Ours but unusable: refused, saying why.
    let bad: [(&[(&str, &str)], &str); 3] = [
        (&[("authorization", "AWS4-HMAC-SHA256 Credential=agenshield:secret:aws_key/20261124/x/aws4_request, SignedHeaders=host, Signature=00")], "credential scope"),
        (&[("authorization", "AWS4-HMAC-SHA256 Credential=agenshield:secret:aws_key/20261124/eu west/s3/aws4_request, SignedHeaders=host, Signature=00")], "region or service"),
        (&[("authorization", &agent_auth(scope, signed)), ("x-amz-content-sha256", "STREAMING-AWS4-ECDSA-P256-SHA256-PAYLOAD")], "payload mode"),
    ];
    for (pairs, why) in bad {
        let e = sigv4::plan(&set, &keys(), &headers(pairs), "/").expect_err(why);
        assert_eq!(e.violation, Violation::Unsignable);
        assert!(
            e.place.to_string().contains(why),
            "{:?} should say {why}",
            e.place
        );
    }
    // A key the store lost: unavailable, by name.
    let lost = Sigv4Keys {
        session_token: Some(Arc::from("aws_token")),
        ..keys()
    };
    let e = sigv4::plan(&set, &lost, &h, "/").expect_err("no token in the store");
    assert_eq!(
        (e.violation, e.secret.as_str()),
        (Violation::Unavailable, "aws_token")
    );
}

#[tokio::test]
async fn a_hashed_body_is_signed_with_its_hash_and_a_large_one_is_refused() {
    let body = crate::body::full(Bytes::from_static(
        b"Action=GetCallerIdentity&Version=2011-06-15",
    ));
    let got = sigv4::read_whole(body, keys(), true, Arc::default())
        .await
        .expect("read");
    assert_eq!(&got[..], b"Action=GetCallerIdentity&Version=2011-06-15");
    let big = Bytes::from(vec![b'x'; sigv4::MAX_HASHED_BODY + 1]);
    let e = sigv4::read_whole(crate::body::full(big), keys(), false, Arc::default())
        .await
        .expect_err("too large");
    assert_eq!(e.violation, Violation::Unsignable);
    assert!(e.place.to_string().contains("over 16 MiB"), "{}", e.place);
}

/// The agent writes the credential scope and the action: only what the rule's `sigv4` says
/// it may sign is signed (no other bucket through `copy-object`, no fresh keys from STS).
#[tokio::test]
async fn only_what_the_rule_may_sign_is_signed() {
    let set = set();
    let auth = |scope: &str| agent_auth(scope, "host;x-amz-date");
    let plan = |keys: &Sigv4Keys, pairs: &[(&str, &str)], pq: &str| {
        sigv4::plan(&set, keys, &headers(pairs), pq)
    };
    let s3 = s3_keys();
    let ok = auth("20261124/eu-west-1/s3/aws4_request");
    assert!(plan(&s3, &[("authorization", &ok)], "/k")
        .expect("in scope")
        .is_some());
    /// Headers, the path and query, what the refusal says.
    type Case<'a> = (Vec<(&'a str, String)>, &'a str, &'a str);
    let cases: Vec<Case> = vec![
        (
            vec![("authorization", auth("20261124/eu-west-1/sts/aws4_request"))],
            "/",
            "service \"sts\"",
        ),
        (
            vec![("authorization", auth("20261124/us-east-1/s3/aws4_request"))],
            "/",
            "region \"us-east-1\"",
        ),
        (
            vec![
                ("authorization", ok.clone()),
                (
                    "x-amz-copy-source",
                    "/other-bucket/secret%2Etxt?versionId=1".into(),
                ),
            ],
            "/my-bucket/copy",
            "copies from \"other-bucket/secret.txt\"",
        ),
        (
            vec![("authorization", ok.clone())],
            "/?Action=ListBuckets",
            "calls action \"ListBuckets\"; the rule lists no `actions`",
        ),
        (
            vec![
                ("authorization", ok.clone()),
                ("x-amz-target", "DynamoDB_20120810.GetItem".into()),
            ],
            "/",
            "calls action \"GetItem\"",
        ),
    ];
    for (pairs, pq, says) in cases {
        let pairs: Vec<(&str, &str)> = pairs.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let e = plan(&s3, &pairs, pq).expect_err(says);
        assert_eq!(e.violation, Violation::OutOfScope, "{says}");
        assert!(
            e.place.to_string().contains(says),
            "{:?} should say {says}",
            e.place
        );
    }
    let copy = [
        ("authorization", ok.as_str()),
        ("x-amz-copy-source", "my-bucket/a/b.txt"),
    ];
    assert!(plan(&s3, &copy, "/my-bucket/c")
        .expect("own bucket")
        .is_some());
    // Credentials are issued only where the action is named exactly: `Get*` does not do.
    let any = keys();
    let sts = auth("20261124/us-east-1/sts/aws4_request");
    let e = plan(
        &any,
        &[("authorization", &sts)],
        "/?Action=GetSessionToken&Version=2011-06-15",
    )
    .expect_err("issues credentials");
    assert!(
        e.place.to_string().contains("issues credentials"),
        "{}",
        e.place
    );
    assert!(plan(
        &any,
        &[("authorization", &sts)],
        "/?Action=GetCallerIdentity"
    )
    .is_ok());
    // In a form body, read whole (its hash is signed), as the CLI sends STS calls.
    let form = [
        ("authorization", sts.as_str()),
        (
            "content-type",
            "application/x-www-form-urlencoded; charset=utf-8",
        ),
    ];
    let r = plan(&any, &form, "/").expect("head is fine").expect("ours");
    assert!(r.form() && r.hashes_body());
    let body = crate::body::full(Bytes::from_static(
        b"Action=AssumeRole&RoleArn=x&Version=2011-06-15",
    ));
    let e = sigv4::read_whole(body, any.clone(), true, Arc::default())
        .await
        .expect_err("AssumeRole is not named");
    assert_eq!(e.violation, Violation::OutOfScope);
    // A form body whose hash is stated could not be read: refused.
    let stated = [
        ("authorization", sts.as_str()),
        ("content-type", "application/x-www-form-urlencoded"),
        ("x-amz-content-sha256", "UNSIGNED-PAYLOAD"),
    ];
    let e = plan(&any, &stated, "/").expect_err("form with a stated hash");
    assert_eq!(e.violation, Violation::Unsignable);
}
