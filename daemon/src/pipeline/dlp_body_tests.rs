//! The body under the credential check: clean bytes go on unchanged; a credential deep in a
//! body fails it before any byte of the chunk that holds it goes on; `report` lets it through
//! and records it.

use std::sync::Arc;

use bytes::Bytes;
use http_body::Frame;
use http_body_util::{BodyExt, StreamBody};

use super::dlp::DlpPhase;
use super::dlp_body::DlpBody;
use crate::body::ProxyBody;
use crate::policy::{DlpMode, DlpRule};
use crate::record::DlpAction;

/// Not a real key: an AWS key id's shape.
const KEY: &str = "AKIAZ7Q3LMN4PQR5STUV";

fn body_of(data: &[u8], chunk: usize) -> ProxyBody {
    let chunks: Vec<Result<Frame<Bytes>, std::io::Error>> = data
        .chunks(chunk)
        .map(|c| Ok(Frame::data(Bytes::copy_from_slice(c))))
        .collect();
    crate::body::stream(StreamBody::new(futures_util::stream::iter(chunks)))
}

fn text(n: usize) -> Vec<u8> {
    b"{\"line\": \"ordinary text 0123456789\"}\n"
        .iter()
        .copied()
        .cycle()
        .take(n)
        .collect()
}

/// Reads `body` to its end or first error: the bytes that went on, and whether it failed.
async fn drain(mut body: DlpBody) -> (Vec<u8>, bool) {
    let mut out = Vec::new();
    while let Some(frame) = body.frame().await {
        match frame {
            Ok(f) => out.extend_from_slice(f.data_ref().map_or(&[][..], |d| d)),
            Err(_) => return (out, true),
        }
    }
    (out, false)
}

fn phase(mode: DlpMode) -> Arc<DlpPhase> {
    let rule = DlpRule {
        mode,
        allow: Arc::from(Vec::new()),
    };
    Arc::new(DlpPhase::new(Some(&rule), "paste.test").expect("scanning"))
}

#[tokio::test]
async fn clean_bodies_go_on_byte_for_byte() {
    let data = text(1 << 20);
    for chunk in [1000, 7001, 65_536, 1 << 20] {
        let p = phase(DlpMode::Block);
        let (out, failed) = drain(DlpBody::new(body_of(&data, chunk), p.clone())).await;
        assert!(!failed);
        assert_eq!(out, data, "{chunk}-byte chunks");
        assert!(p.facts().is_none());
    }
}

#[tokio::test]
async fn a_credential_deep_in_a_body_fails_it_before_it_goes_on() {
    let mut data = text(700_000);
    let at = data.len();
    data.extend_from_slice(format!(" {KEY} ").as_bytes());
    data.extend_from_slice(&text(300_000));
    for chunk in [999, 16_384, 100_000] {
        let p = phase(DlpMode::Block);
        let (out, failed) = drain(DlpBody::new(body_of(&data, chunk), p.clone())).await;
        assert!(failed, "{chunk}-byte chunks");
        assert!(
            out.len() <= at,
            "{} bytes went on, the key at {at}",
            out.len()
        );
        assert!(!String::from_utf8_lossy(&out).contains("AKIA"));
        let blocked = p.blocked().expect("blocked");
        assert_eq!(blocked.formats[0].as_str(), "aws_access_key_id");
        assert_eq!(p.facts().expect("facts").action, DlpAction::Blocked);
    }
}

#[tokio::test]
async fn report_lets_it_through_and_records_it() {
    let mut data = text(50_000);
    data.extend_from_slice(format!(" {KEY} ").as_bytes());
    let p = phase(DlpMode::Report);
    let (out, failed) = drain(DlpBody::new(body_of(&data, 4096), p.clone())).await;
    assert!(!failed);
    assert_eq!(out, data);
    assert_eq!(p.facts().expect("facts").action, DlpAction::Reported);
}
