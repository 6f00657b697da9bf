//! The streaming scan: a credential split across chunks is found whole, nothing of it is
//! released before it is judged, and chunk edges make no findings of their own.

use base64::Engine as _;

use super::detector::Finding;
use super::format::Format;
use super::stream::{StreamScan, OVERLAP};
use super::testgen;
use super::Detector;

/// Streams `body` in `chunk`-byte pieces; returns the findings and the bytes released
/// before the first finding.
fn stream(body: &[u8], chunk: usize) -> (Vec<Finding>, usize) {
    let d = Detector::new();
    let mut s = StreamScan::default();
    let mut found = Vec::new();
    let mut released_before = 0usize;
    for piece in body.chunks(chunk) {
        let out = s.push(&d, piece, &mut found);
        if found.is_empty() {
            released_before += out.len();
        }
    }
    let out = s.finish(&d, &mut found);
    if found.is_empty() {
        released_before += out.len();
    }
    (found, released_before)
}

fn filler(n: usize) -> Vec<u8> {
    b"The quick brown fox jumps over the lazy dog; 0123456789. "
        .iter()
        .copied()
        .cycle()
        .take(n)
        .collect()
}

#[test]
fn a_credential_split_across_chunks_is_found_before_any_of_it_goes() {
    for format in Format::ALL {
        let value = testgen::value(format, 7);
        for chunk in [1usize, 7, 1000, 4096, 16 * 1024 + 3, 100_000] {
            let mut body = filler(50_000);
            body.push(b' ');
            let at = body.len();
            body.extend_from_slice(value.as_bytes());
            body.push(b' ');
            body.extend_from_slice(&filler(60_000));
            let (found, released) = stream(&body, chunk);
            assert!(
                found.iter().any(|f| f.format == format),
                "{format:?} not found in {chunk}-byte chunks"
            );
            assert!(
                released <= at,
                "{format:?}: {released} bytes released before the finding, credential at {at} ({chunk}-byte chunks)"
            );
        }
    }
}

#[test]
fn base64_runs_cut_anywhere_still_decode() {
    let value = testgen::value(Format::GitHubToken, 3);
    let mut text = filler(70_001).to_vec();
    text.extend_from_slice(format!("token={value}\n").as_bytes());
    text.extend_from_slice(&filler(20_000));
    let b64 = base64::engine::general_purpose::STANDARD.encode(&text);
    for chunk in [997usize, 4096, 16 * 1024 + 1, 65_537] {
        let (found, _) = stream(b64.as_bytes(), chunk);
        assert!(
            found.iter().any(|f| f.format == Format::GitHubToken),
            "not found in base64 streamed in {chunk}-byte chunks"
        );
    }
}

#[test]
fn chunk_edges_make_no_findings() {
    // Upper-case runs that start like an AWS key id but go on past 20 characters.
    let mut body = Vec::new();
    for i in 0..2000 {
        body.extend_from_slice(format!("AKIA{:0>30} ", i).as_bytes());
    }
    body.extend_from_slice(&filler(3 * OVERLAP));
    for chunk in [1usize, 13, 4096, 16 * 1024 + 5] {
        let (found, _) = stream(&body, chunk);
        assert!(found.is_empty(), "{found:?} in {chunk}-byte chunks");
    }
}

#[test]
fn held_back_is_bounded() {
    let d = Detector::new();
    let mut s = StreamScan::default();
    let mut found = Vec::new();
    let mut released = 0;
    let body = filler(1 << 20);
    for piece in body.chunks(5000) {
        released += s.push(&d, piece, &mut found).len();
        assert!(s.held() < OVERLAP + super::stream::STEP + 5000);
    }
    released += s.finish(&d, &mut found).len();
    assert_eq!(released, body.len());
    assert!(found.is_empty());
}
