//! The false-positive corpus: ordinary traffic an agent sends (package-manager URLs and
//! metadata, JSON API bodies, base64 images, UUIDs, digests, git objects and packs, random
//! ids, minified JavaScript, certificates and public keys), generated here. Not one finding.

use std::io::Write;

use base64::Engine as _;
use rand::rngs::StdRng;
use rand::Rng;

use super::detector::{Detector, Findings};
use super::testgen::{pick, rng, BASE62, URL64};

const HEX: &[u8] = b"0123456789abcdef";
const WORDS: &[&str] = &[
    "the",
    "risk-free",
    "task-runner",
    "desk-lamp",
    "mask-image",
    "skip",
    "token",
    "secret",
    "key",
    "private",
    "public",
    "BEGIN",
    "ask-user",
    "disk-usage",
    "kiosk-mode",
    "AKIAK",
    "eyes",
    "service",
    "account",
    "private_key_id",
    "bearer",
    "slack",
    "hooks",
    "github",
    "gitlab",
    "stripe",
    "live",
    "sk",
    "glpat",
    "xoxb",
    "AIza",
    "openai",
    "anthropic",
];
const PACKAGES: &[&str] = &[
    "lodash",
    "react",
    "@types/node",
    "express",
    "typescript",
    "left-pad",
    "chalk",
    "zod",
    "requests",
    "numpy",
    "django",
    "flask",
    "serde",
    "tokio",
    "rand",
    "clap",
    "hyper",
    "sk-learn-utils",
    "eyJ-parser",
    "aws-sdk",
    "@aws-sdk/client-s3",
    "ghp-tools",
];

fn hex(rng: &mut StdRng, n: usize) -> String {
    pick(rng, HEX, n)
}

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

fn random_bytes(rng: &mut StdRng, n: usize) -> Vec<u8> {
    (0..n).map(|_| rng.random()).collect()
}

fn uuid(rng: &mut StdRng) -> String {
    format!(
        "{}-{}-4{}-a{}-{}",
        hex(rng, 8),
        hex(rng, 4),
        hex(rng, 3),
        hex(rng, 3),
        hex(rng, 12)
    )
}

fn sentence(rng: &mut StdRng, n: usize) -> String {
    (0..n)
        .map(|_| WORDS[rng.random_range(0..WORDS.len())])
        .collect::<Vec<_>>()
        .join(" ")
}

fn npm(rng: &mut StdRng, i: usize) -> Vec<String> {
    let name = PACKAGES[i % PACKAGES.len()];
    let v = format!(
        "{}.{}.{}",
        rng.random_range(0..20),
        rng.random_range(0..50),
        rng.random_range(0..99)
    );
    let integrity = format!("sha512-{}", b64(&random_bytes(rng, 64)));
    let tarball = format!(
        "https://registry.npmjs.org/{name}/-/{}-{v}.tgz",
        name.rsplit('/').next().unwrap_or(name)
    );
    let packument = serde_json::json!({
        "name": name,
        "dist-tags": { "latest": v },
        "versions": { v.clone(): {
            "name": name, "version": v,
            "dist": { "integrity": integrity, "shasum": hex(rng, 40), "tarball": tarball.clone(),
                      "signatures": [{ "keyid": format!("SHA256:{}", b64(&random_bytes(rng, 32))),
                                       "sig": b64(&random_bytes(rng, 71)) }] },
            "_npmUser": { "name": "maintainer", "email": "m@example.org" }
        }}
    });
    vec![
        tarball,
        packument.to_string(),
        format!("GET /{} HTTP/1.1", name.replace('/', "%2F")),
    ]
}

fn pypi(rng: &mut StdRng, i: usize) -> Vec<String> {
    let name = PACKAGES[(i + 7) % PACKAGES.len()];
    let digest = hex(rng, 64);
    let url = format!(
        "https://files.pythonhosted.org/packages/{}/{}/{}/{name}-1.{i}.0-py3-none-any.whl#sha256={digest}",
        hex(rng, 2),
        hex(rng, 2),
        hex(rng, 60)
    );
    let simple = serde_json::json!({
        "meta": { "api-version": "1.1" },
        "name": name,
        "files": [{ "filename": format!("{name}-1.{i}.0.tar.gz"), "url": url.clone(),
                    "hashes": { "sha256": digest }, "requires-python": ">=3.8",
                    "upload-time": "2024-05-01T12:00:00.000000Z", "yanked": false }]
    });
    vec![url, simple.to_string()]
}

fn crates_index(rng: &mut StdRng, i: usize) -> String {
    serde_json::json!({
        "name": PACKAGES[(i + 3) % PACKAGES.len()], "vers": format!("0.{i}.1"),
        "deps": [{ "name": "serde", "req": "^1", "features": ["derive"], "optional": false,
                   "default_features": true, "target": null, "kind": "normal" }],
        "cksum": hex(rng, 64), "features": { "std": [] }, "yanked": false, "rust_version": "1.70"
    })
    .to_string()
}

fn json_api(rng: &mut StdRng, i: usize) -> String {
    match i % 4 {
        0 => serde_json::json!({
            "model": "gpt-4o-mini",
            "messages": [{ "role": "user", "content": sentence(rng, 40) }],
            "temperature": 0.2, "user": uuid(rng)
        })
        .to_string(),
        1 => serde_json::json!({
            "id": rng.random_range(1..10_000_000u64), "login": "octocat",
            "node_id": b64(format!("04:User{}", rng.random_range(1..1_000_000u32)).as_bytes()),
            "avatar_url": format!("https://avatars.githubusercontent.com/u/{}?v=4", rng.random_range(1..1_000_000u32)),
            "sha": hex(rng, 40), "etag": format!("W/\"{}\"", hex(rng, 32)),
        })
        .to_string(),
        2 => serde_json::json!({
            "object": "customer", "id": format!("cus_{}", pick(rng, BASE62, 14)),
            "invoice_prefix": pick(rng, b"ABCDEF0123456789", 8),
            "payment_intent": format!("pi_{}", pick(rng, BASE62, 24)),
            "request_id": format!("req_{}", pick(rng, BASE62, 14)),
            "aws_request_id": uuid(rng), "arn": "arn:aws:iam::123456789012:role/deploy"
        })
        .to_string(),
        _ => serde_json::json!({
            "query": "query { viewer { login } }",
            "variables": { "cursor": b64(format!("cursor:v2:{}", hex(rng, 16)).as_bytes()) },
            "trace": pick(rng, URL64, 32), "text": sentence(rng, 20)
        })
        .to_string(),
    }
}

fn image(rng: &mut StdRng, i: usize) -> String {
    let (magic, mime): (&[u8], &str) = if i.is_multiple_of(2) {
        (b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR", "image/png")
    } else {
        (b"\xff\xd8\xff\xe0\0\x10JFIF\0", "image/jpeg")
    };
    let mut data = magic.to_vec();
    data.extend(random_bytes(rng, 512 << (i % 6)));
    let uri = format!("data:{mime};base64,{}", b64(&data));
    if i.is_multiple_of(3) {
        serde_json::json!({ "type": "image_url", "image_url": { "url": uri } }).to_string()
    } else {
        uri
    }
}

fn git_objects(rng: &mut StdRng, i: usize) -> Vec<u8> {
    if i.is_multiple_of(2) {
        format!(
            "tree {}\nparent {}\nauthor A U Thor <a@example.org> 1700000000 +0000\ncommitter A U Thor <a@example.org> 1700000000 +0000\n\n{}\n",
            hex(rng, 40), hex(rng, 40), sentence(rng, 12)
        )
        .into_bytes()
    } else {
        // A pack: header, then zlib-compressed blobs and raw binary deltas.
        let mut pack = b"PACK\0\0\0\x02\0\0\0\x08".to_vec();
        for _ in 0..8 {
            let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::fast());
            let _ = z.write_all(sentence(rng, 30).as_bytes());
            pack.extend(z.finish().unwrap_or_default());
            pack.extend(random_bytes(rng, 200));
        }
        pack.extend(random_bytes(rng, 20));
        pack
    }
}

fn ids(rng: &mut StdRng, i: usize) -> String {
    match i % 5 {
        0 => uuid(rng),
        1 => format!("{} {}", hex(rng, 40), hex(rng, 64)),
        2 => pick(rng, BASE62, 32),
        3 => format!("01{}", pick(rng, b"0123456789ABCDEFGHJKMNPQRSTVWXYZ", 24)),
        _ => format!(
            "https://cdn.example.com/assets/{}/{}.js?v={}",
            pick(rng, URL64, 22),
            hex(rng, 20),
            pick(rng, BASE62, 10)
        ),
    }
}

const MINIFIED_JS: &[&str] = &[
    r#"!function(e,t){"object"==typeof exports?module.exports=t():e.lib=t()}(this,function(){var e={};return e.mask="mask-image",e.sk=function(t){return t.sk-1},e})"#,
    r#"const a=(e,t)=>e.task-t.task;export default{name:"desk-top",data(){return{risk:"risk-free",eyJ:0}}};//# sourceMappingURL=data:application/json;base64,eyJ2ZXJzaW9uIjozLCJzb3VyY2VzIjpbImEuanMiXSwibWFwcGluZ3MiOiJBQUFBIn0="#,
    r#"var r=/^-----BEGIN [A-Z ]+-----$/,s=/sk-[a-zA-Z0-9]{48}/,g=/ghp_[A-Za-z0-9]{36}/;function v(k){return r.test(k)||s.test(k)}"#,
    r#"window.__CONFIG__={"apiBase":"https://api.example.com/v2","release":"2024.05.1","sentry":"https://0123456789abcdef@o1.ingest.sentry.io/1"};"#,
    r#"n.exports={AKIA:"AKIA",prefix:"xoxb-",doc:"set OPENAI_API_KEY=sk-... and GITHUB_TOKEN=ghp_..."}"#,
];

const CERTS: &[&str] = &[
    "-----BEGIN CERTIFICATE-----\nMIIBszCCAVmgAwIBAgIUQ2n1b0nQ8Y4t6m0eW0vJbXlqvX0wCgYIKoZIzj0EAwIw\nDzENMAsGA1UEAwwEdGVzdDAeFw0yNDAxMDEwMDAwMDBaFw0yNTAxMDEwMDAwMDBa\n-----END CERTIFICATE-----\n",
    "-----BEGIN PUBLIC KEY-----\nMFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEq1bM3w0b3Xh0nQ8Y4t6m0eW0vJbX\nlqvX0wCgYIKoZIzj0EAwIwDzENMAsGA1UEAwwEdGVzdDAeFw0yNDAxMDEwMDAw==\n-----END PUBLIC KEY-----\n",
    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl agent@host",
    "-----BEGIN PGP PUBLIC KEY BLOCK-----\n\nmQINBGTest0BEAC7Q2n1b0nQ8Y4t6m0eW0vJbXlqvX0wCgYIKoZIzj0EAwIwDzENMAsG\n=AbCd\n-----END PGP PUBLIC KEY BLOCK-----\n",
];

/// At least 200 ordinary inputs.
fn corpus() -> Vec<(String, Vec<u8>)> {
    let r = &mut rng(2026);
    let mut out: Vec<(String, Vec<u8>)> = Vec::new();
    let mut add = |kind: &str, bytes: Vec<u8>| out.push((kind.to_owned(), bytes));
    for i in 0..30 {
        for s in npm(r, i) {
            add("npm", s.into_bytes());
        }
        for s in pypi(r, i) {
            add("pypi", s.into_bytes());
        }
        add("crates.io index", crates_index(r, i).into_bytes());
        add("json api", json_api(r, i).into_bytes());
        add("image", image(r, i).into_bytes());
        add("git", git_objects(r, i));
        add("ids", ids(r, i).into_bytes());
        let form = format!(
            "user={}&q={}&tags=a%2Cb%2Cc&redirect=https%3A%2F%2Fexample.com%2Fcb%3Fstate%3D{}",
            pick(r, BASE62, 8),
            sentence(r, 6).replace(' ', "+"),
            hex(r, 32)
        );
        add("form", form.into_bytes());
    }
    for (i, js) in MINIFIED_JS.iter().enumerate() {
        add("minified js", js.repeat(1 + i % 3).into_bytes());
    }
    for c in CERTS {
        add("certificate", c.as_bytes().to_vec());
    }
    let multipart = format!(
        "--XyZ\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.png\"\r\nContent-Type: image/png\r\n\r\n{}\r\n--XyZ\r\nContent-Disposition: form-data; name=\"note\"\r\n\r\n{}\r\n--XyZ--\r\n",
        String::from_utf8_lossy(&random_bytes(r, 2048)),
        sentence(r, 10)
    );
    add("multipart", multipart.into_bytes());
    out
}

#[test]
fn ordinary_traffic_has_no_findings() {
    let d = Detector::new();
    let corpus = corpus();
    assert!(corpus.len() >= 200, "{} inputs", corpus.len());
    let mut out = Findings::default();
    let mut bad = Vec::new();
    for (i, (kind, bytes)) in corpus.iter().enumerate() {
        d.scan(bytes, &mut out);
        if !out.is_empty() || out.decode_capped {
            bad.push(format!(
                "#{i} {kind}: {:?} capped={}",
                out, out.decode_capped
            ));
        }
    }
    assert!(
        bad.is_empty(),
        "{} of {} inputs had findings:\n{}",
        bad.len(),
        corpus.len(),
        bad.join("\n")
    );
}

/// For the throughput test: the corpus, concatenated.
pub(super) fn mixed_text() -> Vec<u8> {
    let mut all = Vec::new();
    for (_, bytes) in corpus() {
        all.extend_from_slice(&bytes);
        all.push(b'\n');
    }
    all
}
