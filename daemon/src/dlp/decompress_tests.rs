//! Bodies decompressed within a cap: each coding round-trips, a bomb is refused at the cap,
//! garbage is refused.

use std::io::Write;

use super::decompress::{decompress_capped, ContentEncoding};
use super::DlpError;

fn gzip(data: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    e.write_all(data).expect("gzip");
    e.finish().expect("gzip")
}

fn zlib(data: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
    e.write_all(data).expect("zlib");
    e.finish().expect("zlib")
}

fn raw_deflate(data: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::default());
    e.write_all(data).expect("deflate");
    e.finish().expect("deflate")
}

fn brotli(data: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    {
        let mut w = brotli::CompressorWriter::new(&mut out, 4096, 5, 22);
        w.write_all(data).expect("brotli");
    }
    out
}

fn zstd(data: &[u8]) -> Vec<u8> {
    ruzstd::encoding::compress_to_vec(data, ruzstd::encoding::CompressionLevel::Fastest)
}

#[test]
fn every_coding_round_trips() {
    let body = b"{\"prompt\": \"hello\"}".repeat(100);
    let cases = [
        (ContentEncoding::Identity, body.clone()),
        (ContentEncoding::Gzip, gzip(&body)),
        (ContentEncoding::Deflate, zlib(&body)),
        (ContentEncoding::Deflate, raw_deflate(&body)),
        (ContentEncoding::Brotli, brotli(&body)),
        (ContentEncoding::Zstd, zstd(&body)),
    ];
    for (enc, data) in cases {
        let out = decompress_capped(enc, &data, 1 << 20).unwrap_or_else(|e| panic!("{enc:?}: {e}"));
        assert_eq!(&out[..], &body[..], "{enc:?}");
    }
}

#[test]
fn a_body_over_the_cap_is_refused_without_inflating_it_all() {
    let bomb = vec![0u8; 8 << 20];
    for (enc, data) in [
        (ContentEncoding::Gzip, gzip(&bomb)),
        (ContentEncoding::Deflate, zlib(&bomb)),
        (ContentEncoding::Brotli, brotli(&bomb)),
        (ContentEncoding::Zstd, zstd(&bomb)),
        (ContentEncoding::Identity, bomb.clone()),
    ] {
        assert_eq!(
            decompress_capped(enc, &data, 1 << 20),
            Err(DlpError::TooLarge { cap: 1 << 20 }),
            "{enc:?}"
        );
    }
}

#[test]
fn garbage_and_unknown_codings_are_refused() {
    let junk = b"this is not compressed at all, not even a little".to_vec();
    for enc in [
        ContentEncoding::Gzip,
        ContentEncoding::Deflate,
        ContentEncoding::Brotli,
        ContentEncoding::Zstd,
    ] {
        assert!(
            matches!(
                decompress_capped(enc, &junk, 1 << 20),
                Err(DlpError::Corrupt { .. })
            ),
            "{enc:?}"
        );
    }
    assert_eq!(
        ContentEncoding::from_token(" GZIP "),
        Ok(ContentEncoding::Gzip)
    );
    assert_eq!(
        ContentEncoding::from_token("x-gzip"),
        Ok(ContentEncoding::Gzip)
    );
    assert_eq!(
        ContentEncoding::from_token("br"),
        Ok(ContentEncoding::Brotli)
    );
    assert!(matches!(
        ContentEncoding::from_token("compress"),
        Err(DlpError::UnknownEncoding(_))
    ));
    // The AWS CLI's streaming uploads: framing around plain bytes, scanned as they are.
    assert_eq!(
        ContentEncoding::from_token("aws-chunked"),
        Ok(ContentEncoding::Identity)
    );
}

#[test]
fn a_credential_in_a_gzip_body_is_found_once_decompressed() {
    use super::detector::{Detector, Findings};
    use super::format::Format;
    let d = Detector::new();
    let key = super::testgen::value(Format::AnthropicKey, 1);
    let body = gzip(format!("{{\"k\": \"{key}\"}}").as_bytes());
    let mut out = Findings::default();
    let plain = decompress_capped(ContentEncoding::Gzip, &body, 1 << 20).expect("gzip");
    d.scan(&plain, &mut out);
    assert_eq!(
        out.iter().map(|f| f.format).collect::<Vec<_>>(),
        vec![Format::AnthropicKey]
    );
}
