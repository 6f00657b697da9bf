//! The two streaming bodies: the request leak guard and the response redactor.

use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use http::HeaderMap;
use http_body::Frame;
use http_body_util::{BodyExt, StreamBody};

use crate::body::{BodyError, ProxyBody};
use crate::secrets::guard::redact::{Mode, RedactedBody};
use crate::secrets::guard::scan::tests::{binds, set};
use crate::secrets::guard::scan_body::ScannedBody;
use crate::secrets::rewrite::swap::BodySwap;
use crate::secrets::Violation;

fn body(frames: Vec<Frame<Bytes>>) -> ProxyBody {
    let stream = futures_util::stream::iter(frames.into_iter().map(Ok::<_, BodyError>));
    StreamBody::new(stream).boxed()
}

fn data(chunks: &[&str]) -> Vec<Frame<Bytes>> {
    chunks
        .iter()
        .map(|c| Frame::data(Bytes::copy_from_slice(c.as_bytes())))
        .collect()
}

async fn drain(
    b: impl http_body::Body<Data = Bytes, Error = BodyError> + Unpin,
) -> (Result<Vec<u8>, String>, Option<HeaderMap>) {
    let mut b = b;
    let mut out = Vec::new();
    let mut trailers = None;
    while let Some(f) = b.frame().await {
        match f {
            Ok(f) => match f.into_data() {
                Ok(d) => out.extend_from_slice(&d),
                Err(f) => trailers = f.into_trailers().ok(),
            },
            Err(e) => return (Err(e.to_string()), trailers),
        }
    }
    (Ok(out), trailers)
}

#[tokio::test]
async fn the_guard_refuses_a_value_split_across_chunks_and_names_it() {
    let verdict = Arc::new(OnceLock::new());
    let b = ScannedBody::new(
        body(data(&["{\"k\":\"ghp_GIT", "HUB_456789\"}"])),
        Arc::new(set()),
        None,
        1 << 20,
        verdict.clone(),
        BodySwap::Refused {
            place: crate::secrets::Place::Body,
        },
        Arc::default(),
    );
    let (out, _) = drain(b).await;
    assert!(out.is_err(), "refused");
    let r = verdict.get().expect("verdict left for the pipeline");
    assert_eq!(
        (r.violation, r.secret.as_str(), r.place.to_string().as_str()),
        (Violation::Leak, "github", "body")
    );
}

#[tokio::test]
async fn the_guard_passes_bound_secrets_trailers_and_bytes_past_its_window_unchanged() {
    let mut trailers = HeaderMap::new();
    trailers.insert("grpc-status", "0".parse().expect("v"));
    let mut frames = data(&["key=sk-test-OPENAI-123", "&rest"]);
    frames.push(Frame::trailers(trailers));
    let bound = Arc::new(binds(&["openai"], vec![]));
    let b = ScannedBody::new(
        body(frames),
        Arc::new(set()),
        Some(bound),
        1 << 20,
        Arc::default(),
        BodySwap::Refused {
            place: crate::secrets::Place::Body,
        },
        Arc::default(),
    );
    let (out, t) = drain(b).await;
    assert_eq!(out.expect("passes"), b"key=sk-test-OPENAI-123&rest");
    assert_eq!(t.expect("trailers")["grpc-status"], "0");

    // A window of 10 bytes: a value that starts after it is not looked at.
    let b = ScannedBody::new(
        body(data(&["0123456789abc ghp_GITHUB_456789"])),
        Arc::new(set()),
        None,
        10,
        Arc::default(),
        BodySwap::Refused {
            place: crate::secrets::Place::Body,
        },
        Arc::default(),
    );
    let (out, _) = drain(b).await;
    assert_eq!(
        out.expect("beyond the window"),
        b"0123456789abc ghp_GITHUB_456789"
    );
}

#[tokio::test]
async fn prefetch_refuses_a_small_body_before_anything_is_sent() {
    let mut b = ScannedBody::new(
        body(data(&["a=agenshield:sec", "ret:github&b=1"])),
        Arc::new(set()),
        Some(Arc::new(binds(&["openai"], vec![]))),
        1 << 20,
        Arc::default(),
        BodySwap::Refused {
            place: crate::secrets::Place::Body,
        },
        Arc::default(),
    );
    let e = b
        .prefetch(64 * 1024, std::time::Duration::from_secs(5))
        .await
        .expect_err("refused while prefetching");
    assert_eq!(
        (e.violation, e.secret.as_str()),
        (Violation::Scope, "github")
    );
}

#[tokio::test]
async fn redaction_replaces_values_split_anywhere_and_in_trailers() {
    let text = "echo: sk-test-OPENAI-123 and ghp_GITHUB_456789 end";
    for split in 0..=text.len() {
        let mut frames = data(&[&text[..split], &text[split..]]);
        let mut t = HeaderMap::new();
        t.insert("x-echo", "sk-test-OPENAI-123".parse().expect("v"));
        frames.push(Frame::trailers(t));
        let b = RedactedBody::new(body(frames), Arc::new(set()), Mode::Replace);
        let (out, trailers) = drain(b).await;
        assert_eq!(
            String::from_utf8(out.expect("body")).expect("utf8"),
            "echo: agenshield:secret:openai and agenshield:secret:github end",
            "split at {split}"
        );
        assert_eq!(
            trailers.expect("trailers")["x-echo"],
            "agenshield:secret:openai"
        );
    }
}

#[tokio::test]
async fn the_guard_checks_request_trailers_even_past_its_window() {
    for window in [1 << 20, 4] {
        let mut trailers = HeaderMap::new();
        trailers.insert("x-sig", "ghp_GITHUB_456789".parse().expect("v"));
        let mut frames = data(&["harmless body"]);
        frames.push(Frame::trailers(trailers));
        let verdict = Arc::new(OnceLock::new());
        let b = ScannedBody::new(
            body(frames),
            Arc::new(set()),
            Some(Arc::new(binds(&["openai"], vec![]))),
            window,
            verdict.clone(),
            BodySwap::Refused {
                place: crate::secrets::Place::Body,
            },
            Arc::default(),
        );
        let (out, trailers) = drain(b).await;
        assert!(out.is_err(), "window {window}: refused");
        assert!(
            trailers.is_none(),
            "window {window}: the trailers never went on"
        );
        let r = verdict.get().expect("verdict");
        assert_eq!(
            (r.violation, r.secret.as_str(), r.place.to_string().as_str()),
            (Violation::Leak, "github", "header x-sig")
        );
    }
}
