//! Swapping placeholders for values outside headers: the URL, and request bodies as they
//! stream (split anywhere across chunks), encoded for where they land.

use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use http_body::{Body as _, Frame};
use http_body_util::{BodyExt, StreamBody};

use crate::body::{BodyError, ProxyBody};
use crate::secrets::guard::scan::tests::binds;
use crate::secrets::guard::scan_body::ScannedBody;
use crate::secrets::rewrite::inject::{apply, Url};
use crate::secrets::rewrite::swap::BodySwap;
use crate::secrets::set::SecretSet;
use crate::secrets::{Place, Violation};

/// A value with every byte JSON or a form must escape.
const ODD: &str = "a\"b\\c/d e&f=g+h-123";

fn odd_set() -> SecretSet {
    crate::secrets::set::tests::set(&[("odd", ODD), ("gh", "ghp_GITHUB_456789")])
}

fn chunks(parts: &[&[u8]]) -> ProxyBody {
    let frames: Vec<Result<Frame<Bytes>, BodyError>> = parts
        .iter()
        .map(|p| Ok(Frame::data(Bytes::copy_from_slice(p))))
        .collect();
    StreamBody::new(futures_util::stream::iter(frames)).boxed()
}

fn scanned(parts: &[&[u8]], swap: BodySwap, bound: &[&str]) -> ScannedBody {
    ScannedBody::new(
        chunks(parts),
        Arc::new(odd_set()),
        Some(Arc::new(binds(bound, vec![]))),
        1 << 20,
        Arc::new(OnceLock::new()),
        swap,
        Arc::default(),
    )
}

async fn collect(b: ScannedBody) -> Result<Vec<u8>, String> {
    b.collect()
        .await
        .map(|c| c.to_bytes().to_vec())
        .map_err(|e| e.to_string())
}

#[tokio::test]
async fn a_json_body_gets_the_value_escaped_wherever_the_chunks_split_it() {
    let text = br#"{"client_secret":"agenshield:secret:odd","n":1}"#;
    let want = r#"{"client_secret":"a\"b\\c/d e&f=g+h-123","n":1}"#;
    assert!(serde_json::from_str::<serde_json::Value>(want).is_ok());
    for i in 0..=text.len() {
        for j in i..=text.len() {
            let b = scanned(
                &[&text[..i], &text[i..j], &text[j..]],
                BodySwap::Json,
                &["odd"],
            );
            let got = collect(b).await.expect("swapped");
            assert_eq!(String::from_utf8_lossy(&got), want, "split at {i},{j}");
        }
    }
    let v: serde_json::Value = serde_json::from_str(want).expect("json");
    assert_eq!(v["client_secret"], ODD);
}

#[tokio::test]
async fn a_form_body_takes_the_placeholder_encoded_and_gets_the_value_encoded() {
    let text = b"grant_type=client_credentials&client_secret=agenshield%3Asecret%3Aodd&x=agenshield:secret:odd";
    let got = collect(scanned(&[text], BodySwap::Form, &["odd"]))
        .await
        .expect("swapped");
    let got = String::from_utf8(got).expect("utf8");
    let fields: Vec<(String, String)> = form_urlencoded::parse(got.as_bytes())
        .into_owned()
        .collect();
    assert_eq!(fields[1], ("client_secret".into(), ODD.into()), "{got}");
    assert_eq!(fields[2], ("x".into(), ODD.into()), "{got}");
    assert!(!got.contains("agenshield"), "{got}");
}

#[tokio::test]
async fn the_whole_length_is_known_when_the_body_came_at_once_and_only_then() {
    let text: &[u8] = b"say agenshield:secret:gh please";
    let want = b"say ghp_GITHUB_456789 please".len() as u64;
    let mut b = scanned(&[text], BodySwap::Text, &["gh"]);
    let whole = b
        .prefetch(64 * 1024, std::time::Duration::from_secs(5))
        .await
        .expect("passes");
    assert_eq!(whole, Some(want));
    assert_eq!(b.size_hint().exact(), Some(want));
    assert_eq!(collect(b).await.expect("swapped").len() as u64, want);
    // Read only in part: unknown, so the body is re-framed rather than mis-stated. (The
    // first chunk is longer than the tail the scanner holds, so part of it is released.)
    let long = [text, &[b'x'; 200][..]].concat();
    let mut b = scanned(&[&long, b" more"], BodySwap::Text, &["gh"]);
    let whole = b
        .prefetch(4, std::time::Duration::from_secs(5))
        .await
        .expect("passes");
    assert_eq!(whole, None);
    assert_eq!(b.size_hint().exact(), None);
}

#[tokio::test]
async fn where_the_body_may_not_be_rewritten_a_bound_placeholder_is_refused_by_name() {
    for (refused, place) in [
        (Place::Body, "body"),
        (Place::EncodedBody("gzip".into()), "gzip-encoded body"),
        (
            Place::BodyOfType("application/grpc".into()),
            "body of type application/grpc",
        ),
    ] {
        let swap = BodySwap::Refused { place: refused };
        let b = scanned(&[b"x agenshield:secret:g", b"h y"], swap, &["gh"]);
        let verdict = b.verdict_slot();
        assert!(collect(b).await.is_err(), "{place}: refused");
        let r = verdict.get().expect("a verdict").clone();
        assert_eq!(
            (r.violation, r.secret.as_str(), r.place.to_string().as_str()),
            (Violation::NotSwapped, "gh", place)
        );
    }
    // An unbound one is out of scope, as ever; a longer name is no placeholder of `gh`.
    let b = scanned(&[b"agenshield:secret:odd"], BodySwap::Text, &["gh"]);
    assert!(collect(b).await.is_err());
    let b = scanned(
        &[b"agenshield:secret:gh-2 and agenshield:secret:ghx"],
        BodySwap::Text,
        &["gh"],
    );
    assert_eq!(
        collect(b).await.expect("no placeholder of a held name"),
        b"agenshield:secret:gh-2 and agenshield:secret:ghx"
    );
}

#[test]
fn the_url_gets_values_as_they_are_or_percent_encoded_in_path_and_query() {
    let s = odd_set();
    let b = binds(&["odd", "gh"], vec![]);
    let mut h = http::HeaderMap::new();
    let url = apply(
        &s,
        &b,
        &mut h,
        "/botagenshield:secret:gh/sendMessage",
        Some("key=agenshield%3asecret%3aodd&other=agenshield:secret:gh-2"),
    );
    assert_eq!(
        url,
        Url {
            path: Some("/botghp_GITHUB_456789/sendMessage".into()),
            query: Some(
                "key=a%22b%5Cc%2Fd%20e%26f%3Dg%2Bh-123&other=agenshield:secret:gh-2".into()
            ),
        }
    );
    // Unbound: left for the guard (which refuses it); not swapped.
    let only_gh = binds(&["gh"], vec![]);
    let url = apply(&s, &only_gh, &mut h, "/agenshield:secret:odd", None);
    assert_eq!(url, Url::default());
}
