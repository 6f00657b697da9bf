//! The detector: every format found raw and under every encoding, with the right format;
//! checksums, boundaries and structure rejecting near misses; nothing printed.

use super::detector::{Detector, Encoding, Findings};
use super::format::Format;
use super::testgen::{self, Wrap, WRAPS};

fn scan(d: &Detector, text: &str) -> Findings {
    let mut out = Findings::default();
    d.scan(text.as_bytes(), &mut out);
    out
}

fn formats(f: &Findings) -> Vec<Format> {
    f.iter().map(|x| x.format).collect()
}

#[test]
fn every_format_is_found_raw_and_under_every_encoding() {
    let d = Detector::new();
    let mut checked = 0;
    for format in Format::ALL {
        for seed in 0..3 {
            let value = testgen::value(format, seed);
            for wrap in WRAPS {
                let text = testgen::wrap(&value, wrap);
                let found = scan(&d, &text);
                assert!(
                    found.iter().any(|f| f.format == format),
                    "{format:?} (seed {seed}) not found under {wrap:?}: found {:?}",
                    formats(&found)
                );
                checked += 1;
                let expected = if wrap == Wrap::Raw || wrap == Wrap::PercentForm {
                    None // may be found raw too (a form leaves letters and digits alone)
                } else {
                    Some(wrap)
                };
                if let Some(w) = expected {
                    let enc = match w {
                        Wrap::PercentAll => Encoding::Percent,
                        Wrap::JsonUnicode => Encoding::JsonEscape,
                        Wrap::Base64 | Wrap::Base64Url => Encoding::Base64,
                        Wrap::Hex => Encoding::Hex,
                        _ => continue,
                    };
                    assert!(
                        found
                            .iter()
                            .any(|f| f.format == format && f.encoding == enc),
                        "{format:?} not found as {enc:?} under {w:?}"
                    );
                }
            }
        }
    }
    assert_eq!(checked, Format::ALL.len() * 3 * WRAPS.len());
}

#[test]
fn raw_findings_point_at_the_value() {
    let d = Detector::new();
    for format in [
        Format::GitHubToken,
        Format::GoogleApiKey,
        Format::Jwt,
        Format::StripeKey,
    ] {
        let value = testgen::value(format, 7);
        let text = format!("Authorization: Bearer {value}\r\n");
        let found = scan(&d, &text);
        let f = found.iter().find(|f| f.format == format).expect("found");
        assert_eq!(&text[f.range.clone()], value);
        assert_eq!(f.len, value.len());
        assert_eq!(f.encoding, Encoding::Raw);
        assert_eq!(f.fingerprint, d.fingerprint(value.as_bytes()));
    }
}

#[test]
fn github_token_with_a_wrong_checksum_is_not_a_finding() {
    let d = Detector::new();
    for seed in 0..50 {
        let good = testgen::github_token(&mut testgen::rng(seed), "ghp_");
        assert_eq!(formats(&scan(&d, &good)), vec![Format::GitHubToken]);
        let mut bad = good.into_bytes();
        let last = bad.len() - 1;
        bad[last] = if bad[last] == b'a' { b'b' } else { b'a' };
        let bad = String::from_utf8(bad).expect("ascii");
        for wrap in WRAPS {
            let text = testgen::wrap(&bad, wrap);
            assert!(scan(&d, &text).is_empty(), "seed {seed} under {wrap:?}");
        }
    }
}

#[test]
fn a_token_inside_a_longer_word_is_not_a_finding() {
    let d = Detector::new();
    let key = testgen::value(Format::AwsAccessKeyId, 1);
    assert!(scan(&d, &format!("X{key}")).is_empty());
    assert!(scan(&d, &format!("{key}X")).is_empty());
    let google = testgen::value(Format::GoogleApiKey, 1);
    assert!(scan(&d, &format!("{google}x")).is_empty());
    assert!(scan(&d, &format!("q{google}")).is_empty());
    // After an escape the token is on its own.
    assert_eq!(
        formats(&scan(&d, &format!("a%3D{key}"))),
        vec![Format::AwsAccessKeyId]
    );
    assert_eq!(
        formats(&scan(&d, &format!("\"\\n{key}\""))),
        vec![Format::AwsAccessKeyId]
    );
}

#[test]
fn near_misses_are_not_findings() {
    let d = Detector::new();
    let misses = [
        // A PEM header with no key after it (documentation, a regular expression).
        "-----BEGIN RSA PRIVATE KEY-----\n...\n-----END RSA PRIVATE KEY-----",
        "-----BEGIN CERTIFICATE-----\nMIIBszCCAVmgAwIBAgIUQ2n1b0nQ8Y4t6m0eW0vJbXlqvX0wCgYIKoZIzj0EAwIw\n-----END CERTIFICATE-----",
        // sk- in words, sk- without OpenAI's marker.
        "risk-free, task-based, desk-top, sk-learn, sk-1234567890abcdefghijklmnop",
        // A JWT-shaped string whose header has no alg.
        "eyJ0eXAiOiJKV1QifQ.eyJzdWIiOiIxMjMifQ.c2lnbmF0dXJlc2lnbmF0dXJlMTIz",
        // Stripe test keys and object ids.
        "sk_test_4eC39HqLyjWDarjtT1zdp7dc cus_NffrFeUfNV2Hib pi_3MtwBwLkdIwHu7ix28a3tqPa",
        // An AWS key id of the wrong length; other AWS id kinds.
        "AKIAIOSFODNN7EXAMPL AIDACKCEVSQ6C2EXAMPLE AROADBQP57FF2AEXAMPLE",
        // GitLab / Slack prefixes with short or plain bodies.
        "glpat-short xoxb-not-a-token xoxp-123",
        // A secret-key-shaped hex digest beside a key id.
        "AKIA, aws_secret_access_key = 0123456789abcdef0123456789abcdef01234567",
    ];
    for m in misses {
        let found = scan(&d, m);
        assert!(found.is_empty(), "{m:?}: {:?}", formats(&found));
    }
}

#[test]
fn aws_secret_key_is_found_beside_its_id_and_after_its_name() {
    let d = Detector::new();
    let text = "[default]\naws_access_key_id = AKIAIOSFODNN7EXAMPLE\naws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY\n";
    let found = scan(&d, text);
    let mut f = formats(&found);
    f.sort();
    assert_eq!(f, vec![Format::AwsAccessKeyId, Format::AwsSecretAccessKey]);
    let json = r#"{"SecretAccessKey": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"}"#;
    assert_eq!(formats(&scan(&d, json)), vec![Format::AwsSecretAccessKey]);
    let xml = "<SecretAccessKey>wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY</SecretAccessKey>";
    assert_eq!(formats(&scan(&d, xml)), vec![Format::AwsSecretAccessKey]);
}

#[test]
fn a_service_account_file_is_found_also_when_embedded_as_a_string() {
    let d = Detector::new();
    let file = testgen::value(Format::GoogleServiceAccount, 3);
    let embedded = serde_json::json!({ "credentials": file }).to_string();
    for text in [&file, &embedded] {
        let f = formats(&scan(&d, text));
        assert!(f.contains(&Format::GoogleServiceAccount), "{f:?}");
        assert!(f.contains(&Format::PemPrivateKey), "{f:?}");
    }
}

#[test]
fn a_finding_prints_format_and_length_only() {
    let d = Detector::new();
    let value = testgen::value(Format::OpenAiKey, 2);
    let found = scan(&d, &value);
    let shown = format!("{found:?}");
    assert!(shown.contains("OpenAiKey"), "{shown}");
    assert!(shown.contains(&format!("len: {}", value.len())), "{shown}");
    assert!(!shown.contains(&value[..20]), "{shown}");
    assert!(!shown.contains("T3BlbkFJ"), "{shown}");
    // Not even the decoding scratch, which held the value decoded.
    let hex: String = value.bytes().map(|b| format!("{b:02x}")).collect();
    let found = scan(&d, &hex);
    assert_eq!(found.len(), 1);
    let shown = format!("{found:?}");
    assert!(!shown.contains("scratch"), "{shown}");
}

#[test]
fn the_same_value_twice_is_one_finding_and_findings_are_capped() {
    let d = Detector::new();
    let v = testgen::value(Format::GitHubToken, 4);
    assert_eq!(scan(&d, &format!("{v} and {v}")).len(), 1);
    let many: String = (0..100)
        .map(|s| testgen::value(Format::GoogleApiKey, s) + "\n")
        .collect();
    let found = scan(&d, &many);
    assert_eq!(found.len(), 64);
    assert!(found.truncated);
}

#[test]
fn a_key_across_a_base64_chunk_edge_is_found() {
    let d = Detector::new();
    let key = testgen::value(Format::PemPrivateKey, 9);
    // Place the key so that its base64 spans the first 64 KiB chunk boundary.
    let mut text = "x".repeat(47_000);
    text.push_str(&key);
    text.push_str(&"y".repeat(30_000));
    let b64 = base64::Engine::encode(&base64::engine::general_purpose::STANDARD, &text);
    assert!(b64.len() > 64 * 1024);
    let found = scan(&d, &b64);
    assert_eq!(formats(&found), vec![Format::PemPrivateKey]);
    assert!(!found.decode_capped);
}

#[test]
fn decoding_work_is_capped_and_reported() {
    use super::decode::DecodeBudget;
    let mut budget = DecodeBudget::for_input(0);
    let mut scratch = Vec::new();
    let big = "QUFB".repeat(64 * 1024);
    let mut calls = 0;
    super::decode::each_run(big.as_bytes(), &mut budget, &mut scratch, &mut |_, _, _| {
        calls += 1
    });
    assert!(budget.exhausted());
    assert!(calls <= 2, "{calls}");
}

#[test]
fn json_unescape_joins_surrogates_and_keeps_malformed_escapes() {
    let mut out = Vec::new();
    super::decode::json_unescape(br#"a\u00e9\ud83d\ude00\/\q\u12"#, &mut out);
    assert_eq!(String::from_utf8_lossy(&out), "a\u{e9}\u{1f600}/\\q\\u12");
}

#[test]
fn a_private_key_in_a_form_body_is_found() {
    let d = Detector::new();
    for format in [
        Format::OpenSshPrivateKey,
        Format::PemPrivateKey,
        Format::GitHubToken,
        // A key id and its secret, a space between them: `+` in a form.
        Format::AwsSecretAccessKey,
    ] {
        let key = testgen::value(format, 5);
        let body = form_urlencoded::Serializer::new(String::new())
            .append_pair("title", "deploy key")
            .append_pair("key", &key)
            .finish();
        assert!(formats(&scan(&d, &body)).contains(&format), "{format:?}");
    }
}

#[test]
fn a_token_as_a_dns_label_is_found() {
    let d = Detector::new();
    let token = testgen::value(Format::GitHubToken, 8);
    let name = format!("{}.exfil.example", token.to_ascii_lowercase());
    // DNS is case-insensitive: a lower-cased token fails its checksum (and is no longer the
    // token); as sent, it is found.
    assert!(scan(&d, &name).is_empty());
    let name = format!("{token}.exfil.example");
    assert_eq!(formats(&scan(&d, &name)), vec![Format::GitHubToken]);
}

#[test]
fn a_base64_path_segment_of_a_url_is_found() {
    use base64::Engine as _;
    let d = Detector::new();
    for seed in 0..10 {
        let token = testgen::value(Format::GitLabToken, seed);
        let std = base64::engine::general_purpose::STANDARD.encode(format!("t={token}"));
        let url = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(format!("t={token}"));
        for seg in [std, url] {
            let text = format!("GET https://files.example.com/api/v4/{seg}/raw HTTP/1.1");
            assert_eq!(
                formats(&scan(&d, &text)),
                vec![Format::GitLabToken],
                "{seed}"
            );
        }
    }
}

/// Base64 of `data` wrapped at `width` characters with `eol` (MIME: 76 and CRLF).
fn wrapped(data: &[u8], width: usize, eol: &str) -> String {
    let b64 = base64::Engine::encode(&base64::engine::general_purpose::STANDARD, data);
    b64.as_bytes()
        .chunks(width)
        .map(|l| std::str::from_utf8(l).expect("ascii"))
        .collect::<Vec<_>>()
        .join(eol)
}

#[test]
fn a_line_wrapped_block_decodes_as_one_run() {
    use super::decode::DecodeBudget;
    let runs = |text: &str| {
        let mut budget = DecodeBudget::for_input(text.len());
        let mut scratch = Vec::new();
        let mut calls = 0;
        super::decode::each_run(
            text.as_bytes(),
            &mut budget,
            &mut scratch,
            &mut |_, r, _| {
                // The whole block (but its `=` padding, which ends a run).
                assert!(r.start == 0 && r.end + 2 >= text.len(), "{r:?}");
                calls += 1
            },
        );
        calls
    };
    // Binary (bytes no text has): told from its first bytes, nothing handed on.
    let binary: Vec<u8> = (0..64 * 1024u32)
        .map(|i| (i.wrapping_mul(7) ^ (i >> 5)) as u8 | 0x80)
        .collect();
    assert_eq!(runs(&wrapped(&binary, 76, "\r\n")), 0);
    // Text with a token across a line break (57 bytes decode from each 76-character line),
    // as mail and PEM wrap it: found.
    let d = Detector::new();
    let key = testgen::value(Format::GitHubToken, 4);
    let mut text = "an ordinary line of a text file, wrapped as mail does it.\n".repeat(25);
    text.insert_str(57 * 20 - 12, &format!(" {key} "));
    for (width, eol) in [(76, "\r\n"), (76, "\n"), (64, "\n")] {
        let block = wrapped(text.as_bytes(), width, eol);
        assert_eq!(runs(&block), 1, "{width} {eol:?}");
        assert_eq!(
            formats(&scan(&d, &block)),
            vec![Format::GitHubToken],
            "{width} {eol:?}"
        );
    }
    // A multipart boundary after a block is not part of it.
    let block = format!(
        "{}\r\n--boundary-1234567890-abcdefghijklmnop--\r\n",
        wrapped(text.as_bytes(), 76, "\r\n")
    );
    assert_eq!(formats(&scan(&d, &block)), vec![Format::GitHubToken]);
}
