//! Credentials that may only go home (issue 37 item 2, `docs/dlp.md`), through the real
//! daemon on loopback: for each credential format, a generated value in each position of a
//! request to a host that is not its home is refused (`credential_exfiltration`, naming the
//! format, never the value, and the upstream never sees it); the same value to its home (the
//! real home name mapped to the loopback upstream) in a credential header passes; a corpus
//! of ordinary requests is never refused; `dlp = "report"` lets through and records,
//! `dlp = "off"` does not look. The table is printed and written to
//! `bench/results-dlp-table.md`.

use std::io::Write as _;

use agenshield_e2e::audit;
use agenshield_e2e::dlp::{self, RawRequest, RawResponse, FORMATS};
use agenshield_e2e::upstream::UpstreamOptions;
use agenshield_e2e::world::World;
use base64::Engine as _;

const AWAY: &str = "paste.test";

fn policy() -> String {
    let homes: Vec<String> = dlp::home_hosts().iter().map(|h| format!("{h:?}")).collect();
    format!(
        r#"
version = 1
default = "deny"

[[rule]]
id = "paste"
hosts = ["paste.test", "*.paste.test", "registry.test", "api.test", "cdn.test"]
action = "allow"

[[rule]]
id = "homes"
hosts = [{}]
action = "allow"

[[rule]]
id = "reported"
hosts = ["report.test"]
action = "allow"
dlp = "report"

[[rule]]
id = "unscanned"
hosts = ["off.test"]
action = "allow"
dlp = "off"

[[rule]]
id = "allowlisted"
hosts = ["fixtures.test"]
action = "allow"
dlp_allow = ["ALLOWED_VALUE"]
"#,
        homes.join(", ")
    )
}

async fn world() -> World {
    let mut sans = vec![AWAY, "registry.test", "api.test", "cdn.test"];
    sans.extend(["report.test", "off.test", "fixtures.test"]);
    sans.extend(dlp::home_hosts());
    let policy = policy();
    World::start("dlp-upstream", &sans, UpstreamOptions::default(), &policy).await
}

async fn send(w: &World, host: &str, req: &RawRequest) -> RawResponse {
    let tls = w.tls(host, &[b"http/1.1"]).await;
    dlp::send(tls, host, req).await
}

const POSITIONS: [&str; 10] = [
    "path",
    "query",
    "header",
    "json",
    "form",
    "multipart",
    "base64",
    "gzip",
    "websocket",
    "dns",
];

fn enc(v: &str) -> String {
    percent_encoding::utf8_percent_encode(v, percent_encoding::NON_ALPHANUMERIC).to_string()
}

/// `value` in `position` of a request; `None` for the positions this build does not scan.
fn request(position: &str, value: &str) -> Option<RawRequest> {
    Some(match position {
        "path" => RawRequest::get(format!("/echo/notes/{}", enc(value))),
        "query" => RawRequest::get(format!("/echo/search?q={}&page=2", enc(value))),
        "header" => RawRequest::get("/echo/me").header(
            "Authorization",
            format!("Bearer {}", dlp::header_safe(value)),
        ),
        "json" => {
            let body = serde_json::json!({"model": "m", "messages": [{"role": "user", "content": format!("use this: {value}")}]});
            RawRequest::post(
                "/echo/v1/chat",
                "application/json",
                body.to_string().into_bytes(),
            )
        }
        "form" => {
            let body: String = form_urlencoded::Serializer::new(String::new())
                .append_pair("title", "build notes")
                .append_pair("note", value)
                .finish();
            RawRequest::post(
                "/echo/paste",
                "application/x-www-form-urlencoded",
                body.into_bytes(),
            )
        }
        "multipart" => {
            let b = "----agenshield-dlp-7MA4YWxkTrZu0gW";
            let body = format!(
                "--{b}\r\nContent-Disposition: form-data; name=\"title\"\r\n\r\nnotes\r\n--{b}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"env.txt\"\r\nContent-Type: text/plain\r\n\r\nKEY={value}\r\n--{b}--\r\n"
            );
            RawRequest::post(
                "/echo/upload",
                &format!("multipart/form-data; boundary={b}"),
                body.into_bytes(),
            )
        }
        "base64" => {
            let text = format!("config:\n  key: {value}\n");
            let body = base64::engine::general_purpose::STANDARD.encode(text);
            RawRequest::post("/echo/blob", "text/plain", body.into_bytes())
        }
        "gzip" => {
            let json = serde_json::json!({"file": ".env", "content": format!("TOKEN={value}\n")});
            let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
            gz.write_all(json.to_string().as_bytes()).expect("gzip");
            let body = gz.finish().expect("gzip");
            RawRequest::post("/echo/sync", "application/json", body)
                .header("Content-Encoding", "gzip")
        }
        _ => return None,
    })
}

/// `value` in a WebSocket text message and, separately, a binary one, to the upstream's
/// echo: refused when the proxy closes with 1008 before anything is echoed.
async fn websocket(w: &World, value: &str) -> &'static str {
    use futures_util::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
    use tokio_tungstenite::tungstenite::Message;
    let mut outcomes = Vec::new();
    for binary in [false, true] {
        let tls = w.tls(AWAY, &[b"http/1.1"]).await;
        let url = w.url("wss", AWAY, "/ws");
        let Ok((mut ws, _)) = tokio_tungstenite::client_async(url, tls).await else {
            return "HANDSHAKE FAILED";
        };
        // An ordinary message goes through first: the relay works.
        ws.send(Message::text("hello")).await.expect("send");
        let echoed = tokio::time::timeout(std::time::Duration::from_secs(10), ws.next()).await;
        if !matches!(echoed, Ok(Some(Ok(Message::Text(_))))) {
            return "NO ECHO";
        }
        let msg = format!(
            "{{\"op\": \"note\", \"text\": {}}}",
            serde_json::json!(value)
        );
        let msg = if binary {
            Message::binary(msg.into_bytes())
        } else {
            Message::text(msg)
        };
        ws.send(msg).await.expect("send");
        let next = tokio::time::timeout(std::time::Duration::from_secs(10), ws.next()).await;
        let refused = match next {
            Ok(Some(Ok(Message::Close(Some(f))))) => {
                f.code == CloseCode::Policy && f.reason.contains("credential_exfiltration")
            }
            _ => false,
        };
        outcomes.push(refused);
    }
    if outcomes.iter().all(|r| *r) {
        "refused"
    } else {
        "PASSED"
    }
}

/// `value` as the first labels of a name under an allowed domain, asked of the daemon's
/// DNS stub: REFUSED (rcode 5) when the check stops it. Values that cannot be a DNS name
/// (too long a label, characters names do not carry) are not asked.
async fn dns(w: &World, value: &str) -> &'static str {
    let fits = value.split('.').all(|l| {
        !l.is_empty()
            && l.len() <= 63
            && l.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    });
    let name = format!("{value}.{AWAY}");
    if !fits || name.len() > 253 {
        return "n/a (no DNS name)";
    }
    let mut q = vec![0x12, 0x34, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0];
    for label in name.split('.') {
        q.push(label.len() as u8);
        q.extend_from_slice(label.as_bytes());
    }
    q.extend_from_slice(&[0, 0, 1, 0, 1]);
    let sock = tokio::net::UdpSocket::bind("127.0.0.1:0")
        .await
        .expect("udp");
    sock.send_to(&q, w.daemon.dns[0]).await.expect("send");
    let mut buf = [0u8; 1500];
    match tokio::time::timeout(std::time::Duration::from_secs(10), sock.recv(&mut buf)).await {
        Ok(Ok(n)) if n >= 4 && buf[3] & 0x0f == 5 => "refused",
        Ok(Ok(n)) if n >= 4 => "PASSED",
        _ => "NO ANSWER",
    }
}

/// A distinctive piece of the value (what must not appear in a refusal or the audit log).
fn piece(value: &str) -> String {
    let line = value
        .lines()
        .max_by_key(|l| l.len())
        .unwrap_or(value)
        .trim();
    line.chars().skip(4).take(28).collect()
}

#[tokio::test]
async fn credentials_go_only_home_in_every_position() {
    let w = world().await;
    let mut table = String::from("| format | ");
    table.push_str(&POSITIONS.join(" | "));
    table.push_str(" | home, credential header |\n|---|");
    table.push_str(&"---|".repeat(POSITIONS.len() + 1));
    table.push('\n');
    let mut failures = Vec::new();
    for (i, f) in FORMATS.iter().enumerate() {
        let value = dlp::value(f.name, 1000 + i as u64);
        let secret = piece(&value);
        table.push_str(&format!("| `{}` |", f.name));
        for position in POSITIONS {
            if position == "websocket" || position == "dns" {
                let cell = match position {
                    "websocket" => websocket(&w, &value).await,
                    _ => dns(&w, &value).await,
                };
                if !cell.starts_with("refused") && !cell.starts_with("n/a") {
                    failures.push(format!("{} in {position}: {cell}", f.name));
                }
                table.push_str(&format!(" {cell} |"));
                continue;
            }
            let Some(req) = request(position, &value) else {
                table.push_str(" not scanned |");
                continue;
            };
            let before = w.requests().len();
            let r = send(&w, AWAY, &req).await;
            if position == "header" && f.name == "jwt" {
                // A JWT is a bearer token: in `Authorization` it goes to whatever host the
                // rule allows, recorded with the verdict `bearer` (docs/dlp.md).
                let passed = r.status == 200 && w.requests().len() == before + 1;
                if !passed {
                    failures.push(format!(
                        "jwt as a bearer token: status {} {}",
                        r.status, r.body
                    ));
                }
                table.push_str(if passed {
                    " passes (bearer) |"
                } else {
                    " REFUSED |"
                });
                continue;
            }
            let json: serde_json::Value = serde_json::from_str(&r.body).unwrap_or_default();
            let refused = r.status == 403
                && json["error_code"] == "credential_exfiltration"
                && json["message"].as_str().is_some_and(|m| m.contains(f.name));
            let leaked = r.body.contains(&secret);
            let reached = w.requests().len() > before;
            let cell = match (refused, leaked, reached) {
                (true, false, false) => "refused",
                (true, false, true) => "refused (upstream saw the head)",
                (true, true, _) => "refused, VALUE SHOWN",
                (false, ..) => "PASSED",
            };
            if cell != "refused" {
                failures.push(format!(
                    "{} in {position}: {cell} (status {}, {})",
                    f.name, r.status, r.body
                ));
            }
            table.push_str(&format!(" {cell} |"));
        }
        match f.home {
            Some(home) => {
                let req = request("header", &value).expect("header");
                let r = send(&w, home, &req).await;
                let ok = r.status == 200;
                table.push_str(if ok { " passes |\n" } else { " REFUSED |\n" });
                if !ok {
                    failures.push(format!(
                        "{} to its home {home}: status {} {}",
                        f.name, r.status, r.body
                    ));
                }
            }
            None if f.name == "jwt" => {
                table.push_str(" no home: a bearer token, passes only in a credential header |\n")
            }
            None => table.push_str(" no home (refused everywhere) |\n"),
        }
    }
    println!("\n{table}");
    let bench = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../bench");
    let _ = std::fs::write(
        bench.join("results-dlp-table.md"),
        format!("# Credentials that may only go home: every format in every position

Written by `cargo test -p agenshield-e2e --test e2e dlp::` (the real daemon on loopback). Each cell: the value to a host that is not its home (`paste.test`); the last column: the same value to its home (the real name mapped to the loopback upstream) in `Authorization`.

{table}"),
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));

    // The audit log names formats and places, never a value.
    let written = w.daemon.everything_written().await;
    for (i, f) in FORMATS.iter().enumerate() {
        let secret = piece(&dlp::value(f.name, 1000 + i as u64));
        assert!(!written.contains(&secret), "a {} value was written", f.name);
    }
    let lines = audit::lines(&w.daemon.audit_path());
    audit::assert_matches_schema(&lines);
    let blocked = lines
        .iter()
        .filter(|l| l["dlp"]["action"] == "blocked")
        .count();
    assert!(blocked >= FORMATS.len() * 8, "{blocked} blocked records");
    let gh = lines
        .iter()
        .find(|l| {
            l["error_code"] == "credential_exfiltration"
                && l["dlp"]["findings"].as_array().is_some_and(|a| {
                    a.iter()
                        .any(|x| x["format"] == "github_token" && x["place"] == "body")
                })
        })
        .expect("a record of a github_token refused in a body");
    assert_eq!(gh["status"], 403);
    assert_eq!(gh["rule"], "paste");
    let home = lines
        .iter()
        .find(|l| l["host"] == "api.github.com" && l["status"] == 200)
        .expect("the home request's record");
    assert_eq!(home["dlp"]["action"], "passed");
    assert_eq!(home["dlp"]["findings"][0]["place"], "credential_header");
    assert_eq!(home["dlp"]["findings"][0]["verdict"], "home");
}

#[tokio::test]
async fn report_lets_through_and_records_off_does_not_look() {
    let w = world().await;
    let value = dlp::value("github_token", 77);
    let body = serde_json::json!({"token": value}).to_string().into_bytes();
    let r = send(
        &w,
        "report.test",
        &RawRequest::post("/echo/a", "application/json", body.clone()),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    let r = send(
        &w,
        "off.test",
        &RawRequest::post("/echo/b", "application/json", body.clone()),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    let r = send(
        &w,
        AWAY,
        &RawRequest::post("/echo/c", "application/json", body),
    )
    .await;
    assert_eq!(r.status, 403, "{}", r.body);
    // An unknown content coding is not sent on unread.
    let r = send(
        &w,
        AWAY,
        &RawRequest::post("/echo/d", "application/json", b"xyz".to_vec())
            .header("Content-Encoding", "compress"),
    )
    .await;
    assert_eq!(r.status, 400, "{}", r.body);
    let written = w.daemon.everything_written().await;
    assert!(!written.contains(&value[4..30]), "the value was written");
    let lines = audit::lines(&w.daemon.audit_path());
    audit::assert_matches_schema(&lines);
    let by_host = |h: &str| {
        lines
            .iter()
            .find(|l| l["host"] == h && l["kind"] == "request")
            .cloned()
            .unwrap_or_default()
    };
    let reported = by_host("report.test");
    assert_eq!(reported["dlp"]["action"], "reported");
    assert_eq!(reported["dlp"]["findings"][0]["format"], "github_token");
    assert_eq!(reported["dlp"]["findings"][0]["verdict"], "exfiltration");
    assert!(by_host("off.test").get("dlp").is_none());
    // The upstream got the reported body; never the blocked one.
    let seen: Vec<_> = w
        .requests()
        .iter()
        .map(|r| r.path_and_query.clone())
        .collect();
    assert!(seen.contains(&"/echo/a".to_string()));
    assert!(!seen.contains(&"/echo/c".to_string()), "{seen:?}");
}

#[tokio::test]
async fn a_credential_late_in_a_large_streamed_body_stops_the_upload() {
    let w = world().await;
    let value = dlp::value("anthropic_key", 5);
    let mut body = Vec::new();
    while body.len() < 3 << 20 {
        body.extend_from_slice(
            b"{\"line\": \"ordinary log text, nothing to see here 0123456789\"}\n",
        );
    }
    body.extend_from_slice(format!("{{\"key\": \"{value}\"}}\n").as_bytes());
    body.extend_from_slice(&vec![b'x'; 100_000]);
    let r = send(
        &w,
        AWAY,
        &RawRequest::post("/echo/logs", "application/x-ndjson", body.clone()),
    )
    .await;
    assert_eq!(r.status, 403, "{}", r.body);
    assert!(r.body.contains("anthropic_key"), "{}", r.body);
    // Whatever reached the upstream stops before the credential.
    for seen in w.requests() {
        let got = seen.body.lock().expect("body").clone();
        assert!(
            !String::from_utf8_lossy(&got).contains("sk-ant-"),
            "the upstream received the credential"
        );
    }
    let lines = audit::lines(&w.daemon.audit_path());
    let rec = lines
        .iter()
        .find(|l| l["path"] == "/echo/logs")
        .expect("record");
    assert_eq!(rec["error_code"], "credential_exfiltration");
    assert_eq!(rec["dlp"]["action"], "blocked");
}

/// Ordinary traffic an agent sends: package managers, JSON APIs, images, ids and hashes.
fn corpus() -> Vec<(&'static str, RawRequest)> {
    let mut g = dlp::Gen::new(42);
    let mut out = Vec::new();
    let hex = |g: &mut dlp::Gen, n| g.pick(b"0123456789abcdef", n);
    let uuid = |g: &mut dlp::Gen| {
        let h = g.pick(b"0123456789abcdef", 32);
        format!(
            "{}-{}-4{}-a{}-{}",
            &h[..8],
            &h[8..12],
            &h[13..16],
            &h[17..20],
            &h[20..]
        )
    };
    let pkgs = [
        "requests",
        "numpy",
        "serde",
        "tokio",
        "left-pad",
        "react",
        "lodash",
        "express",
        "typescript",
        "pytest",
    ];
    for (i, p) in pkgs.iter().enumerate() {
        out.push((
            "registry.test",
            RawRequest::get(format!("/echo/simple/{p}/"))
                .header("User-Agent", "pip/24.0 {\"python\":\"3.12.1\"}")
                .header("Accept", "application/vnd.pypi.simple.v1+json"),
        ));
        out.push((
            "registry.test",
            RawRequest::get(format!("/echo/{p}/-/{p}-1.{i}.3.tgz"))
                .header("User-Agent", "npm/10.2.4 node/v20.11.0 linux x64")
                .header("npm-session", hex(&mut g, 16)),
        ));
        out.push((
            "registry.test",
            RawRequest::get(format!("/echo/api/v1/crates/{p}/0.{i}.1/download"))
                .header("User-Agent", "cargo 1.79.0 (ffa9cf99a 2024-06-03)"),
        ));
        out.push((
            "registry.test",
            RawRequest::get(format!(
                "/echo/v2/library/{p}/manifests/sha256:{}",
                hex(&mut g, 64)
            ))
            .header("Accept", "application/vnd.oci.image.manifest.v1+json"),
        ));
        out.push((
            "registry.test",
            RawRequest::get(format!("/echo/{p}/info/refs?service=git-upload-pack"))
                .header("Git-Protocol", "version=2"),
        ));
        let want: String = (0..5)
            .map(|_| format!("0032want {}\n", hex(&mut g, 40)))
            .collect();
        out.push((
            "registry.test",
            RawRequest::post(
                format!("/echo/{p}.git/git-upload-pack"),
                "application/x-git-upload-pack-request",
                format!("{want}00000009done\n").into_bytes(),
            ),
        ));
    }
    for i in 0..40 {
        let id = uuid(&mut g);
        let body = serde_json::json!({
            "id": id, "request_id": uuid(&mut g), "commit": hex(&mut g, 40),
            "sha256": hex(&mut g, 64), "name": format!("item-{i}"), "count": i,
            "tags": ["alpha", "beta"], "created_at": "2026-12-07T05:00:00Z",
            "text": "The quick brown fox jumps over the lazy dog. sk-learn and ghp are words too.",
        });
        out.push((
            "api.test",
            RawRequest::post(
                format!("/echo/v1/items/{id}"),
                "application/json",
                body.to_string().into_bytes(),
            )
            .header("Authorization", format!("Bearer {}", uuid(&mut g))),
        ));
        out.push((
            "api.test",
            RawRequest::get(format!(
                "/echo/v1/items?cursor={}&limit=50&sort=-created_at",
                hex(&mut g, 24)
            ))
            .header("If-None-Match", format!("\"{}\"", hex(&mut g, 32))),
        ));
    }
    for i in 0..30 {
        // A small PNG-like binary image, base64 in JSON and as a data URL.
        let mut img = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR".to_vec();
        img.extend(g.bytes(600 + i * 37));
        let b64 = base64::engine::general_purpose::STANDARD.encode(&img);
        let body =
            serde_json::json!({"image": format!("data:image/png;base64,{b64}"), "alt": "chart"});
        out.push((
            "cdn.test",
            RawRequest::post(
                "/echo/upload/image",
                "application/json",
                body.to_string().into_bytes(),
            ),
        ));
        out.push((
            "cdn.test",
            RawRequest::post("/echo/upload/raw", "image/png", img),
        ));
    }
    for i in 0..20 {
        let text = format!("commit {}\nAuthor: Dev <dev@example.com>\n\n    fix: handle {} (closes #{})\n\ndiff --git a/src/lib.rs b/src/lib.rs\nindex {}..{} 100644\n", hex(&mut g, 40), uuid(&mut g), 100 + i, hex(&mut g, 7), hex(&mut g, 7));
        let form: String = form_urlencoded::Serializer::new(String::new())
            .append_pair("patch", &text)
            .append_pair("token_type", "bearer")
            .append_pair("state", &hex(&mut g, 32))
            .finish();
        out.push((
            "api.test",
            RawRequest::post(
                "/echo/review",
                "application/x-www-form-urlencoded",
                form.into_bytes(),
            ),
        ));
        let jwt_like = format!(
            "{}.{}",
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b"{\"not\":\"a token\"}"),
            hex(&mut g, 10)
        );
        out.push((
            "api.test",
            RawRequest::get(format!(
                "/echo/search?q=AKIA+is+a+prefix&ref={jwt_like}&sha={}",
                hex(&mut g, 40)
            ))
            .header("Cookie", format!("session={}; theme=dark", uuid(&mut g))),
        ));
    }
    out
}

#[tokio::test]
async fn ordinary_traffic_is_never_refused() {
    let w = world().await;
    let corpus = corpus();
    assert!(corpus.len() >= 200, "{} requests", corpus.len());
    let mut refused = Vec::new();
    for (host, req) in &corpus {
        let r = send(&w, host, req).await;
        if r.status != 200 {
            refused.push(format!(
                "{host} {} {}: {} {}",
                req.method, req.path, r.status, r.body
            ));
        }
    }
    println!(
        "false-positive corpus: {} ordinary requests, {} refused",
        corpus.len(),
        refused.len()
    );
    assert!(refused.is_empty(), "{}", refused.join("\n"));
    let lines = audit::lines(&w.daemon.audit_path());
    assert!(
        lines.iter().all(|l| l.get("dlp").is_none()),
        "a finding in the corpus"
    );
}
