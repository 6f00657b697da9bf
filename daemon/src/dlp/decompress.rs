//! Compressed request bodies, decompressed within a cap so the detector can read them. The
//! detector never decompresses by itself: the caller knows the `Content-Encoding` and owns
//! the memory; it calls this first and refuses what does not fit or does not decode
//! (fail closed: a body the detector cannot read is not let through unread).

use std::io::Read;

use bytes::Bytes;

use super::DlpError;

/// A `Content-Encoding` the detector can look through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ContentEncoding {
    Identity,
    Gzip,
    /// zlib-wrapped, as HTTP says; a raw deflate stream is accepted too, as browsers do.
    Deflate,
    Brotli,
    Zstd,
}

impl ContentEncoding {
    /// One coding token of a `Content-Encoding` header.
    pub(crate) fn from_token(token: &str) -> Result<ContentEncoding, DlpError> {
        let t = token.trim();
        Ok(match t.to_ascii_lowercase().as_str() {
            "identity" | "" => ContentEncoding::Identity,
            // S3's streaming upload framing (`size;chunk-signature=…` lines around plain
            // chunks), not a compression: the bytes are scanned as they are. With another
            // coding beside it the framed bytes are not that coding's stream, and reading
            // them as one fails: refused, never sent unread.
            "aws-chunked" => ContentEncoding::Identity,
            "gzip" | "x-gzip" => ContentEncoding::Gzip,
            "deflate" => ContentEncoding::Deflate,
            "br" => ContentEncoding::Brotli,
            "zstd" => ContentEncoding::Zstd,
            _ => return Err(DlpError::UnknownEncoding(t.chars().take(32).collect())),
        })
    }

    fn as_str(self) -> &'static str {
        match self {
            ContentEncoding::Identity => "identity",
            ContentEncoding::Gzip => "gzip",
            ContentEncoding::Deflate => "deflate",
            ContentEncoding::Brotli => "br",
            ContentEncoding::Zstd => "zstd",
        }
    }
}

/// `bytes` decompressed, or an error when it is corrupt or would exceed `cap` bytes (the
/// decoder stops at `cap + 1`: a decompression bomb costs at most the cap).
pub(crate) fn decompress_capped(
    encoding: ContentEncoding,
    bytes: &[u8],
    cap: usize,
) -> Result<Bytes, DlpError> {
    let corrupt = |_| DlpError::Corrupt {
        encoding: encoding.as_str(),
    };
    let out = match encoding {
        ContentEncoding::Identity => {
            if bytes.len() > cap {
                return Err(DlpError::TooLarge { cap });
            }
            return Ok(Bytes::copy_from_slice(bytes));
        }
        ContentEncoding::Gzip => read_capped(flate2::read::MultiGzDecoder::new(bytes), cap),
        ContentEncoding::Deflate => match read_capped(flate2::read::ZlibDecoder::new(bytes), cap) {
            Err(ReadError::Io(_)) => read_capped(flate2::read::DeflateDecoder::new(bytes), cap),
            other => other,
        },
        ContentEncoding::Brotli => read_capped(brotli::Decompressor::new(bytes, 4096), cap),
        ContentEncoding::Zstd => {
            let decoder =
                ruzstd::decoding::StreamingDecoder::new(bytes).map_err(|_| DlpError::Corrupt {
                    encoding: encoding.as_str(),
                })?;
            read_capped(decoder, cap)
        }
    };
    match out {
        Ok(v) => Ok(Bytes::from(v)),
        Err(ReadError::TooLarge) => Err(DlpError::TooLarge { cap }),
        Err(ReadError::Io(e)) => Err(corrupt(e)),
    }
}

enum ReadError {
    TooLarge,
    Io(std::io::Error),
}

fn read_capped(reader: impl Read, cap: usize) -> Result<Vec<u8>, ReadError> {
    let mut out = Vec::new();
    let limit = u64::try_from(cap).unwrap_or(u64::MAX).saturating_add(1);
    reader
        .take(limit)
        .read_to_end(&mut out)
        .map_err(ReadError::Io)?;
    if out.len() > cap {
        return Err(ReadError::TooLarge);
    }
    Ok(out)
}
