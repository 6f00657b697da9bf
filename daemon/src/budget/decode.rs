//! Compressed responses (`Content-Encoding: gzip`, `deflate`, `br`), decoded as they stream
//! by into the usage reader, never stored: each decoder writes into a sink that is the
//! reader, with its own bounded window (32 KiB for gzip and deflate, at most 16 MiB for br),
//! and at most [`MAX_DECODED_BYTES`] are decoded per response (past that, or on a decoding
//! error, the response is estimated). Other codings (`zstd`, chains of several) are not
//! read: estimated.

use std::io::Write;

use super::json_scan::JsonScan;
use super::sse::SseScan;
use super::usage::Usage;

/// The most bytes decoded from one response (smaller under test, so the bomb test is quick).
#[cfg(not(test))]
pub(crate) const MAX_DECODED_BYTES: u64 = 64 * 1024 * 1024;
#[cfg(test)]
pub(crate) const MAX_DECODED_BYTES: u64 = 2 * 1024 * 1024;

/// The reader of the decoded bytes.
#[derive(Debug)]
pub(crate) enum Plain {
    Json(JsonScan),
    Sse(SseScan),
}

impl Plain {
    pub(crate) fn feed(&mut self, data: &[u8]) {
        match self {
            Plain::Json(s) => s.feed(data),
            Plain::Sse(s) => s.feed(data),
        }
    }

    pub(crate) fn finish(&mut self) -> Option<Usage> {
        match self {
            Plain::Json(s) => s.finish(),
            Plain::Sse(s) => s.finish(),
        }
    }
}

/// Where a decoder writes: the reader, within the cap.
pub(crate) struct Sink {
    plain: Plain,
    written: u64,
}

impl Write for Sink {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.written = self.written.saturating_add(buf.len() as u64);
        if self.written > MAX_DECODED_BYTES {
            return Err(std::io::Error::other("decoded size cap"));
        }
        self.plain.feed(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A response coding the meter can read through.
pub(crate) enum Decoder {
    Gzip(Box<flate2::write::GzDecoder<Sink>>),
    Deflate(Box<flate2::write::ZlibDecoder<Sink>>),
    Brotli(Box<brotli::DecompressorWriter<Sink>>),
    /// A decoding error or the cap: nothing more is read.
    Failed,
}

impl Decoder {
    /// The decoder for `coding` (one token, lower case), or `None` for one it cannot read.
    pub(crate) fn new(coding: &str, plain: Plain) -> Option<Decoder> {
        let sink = Sink { plain, written: 0 };
        Some(match coding {
            "gzip" | "x-gzip" => Decoder::Gzip(Box::new(flate2::write::GzDecoder::new(sink))),
            "deflate" => Decoder::Deflate(Box::new(flate2::write::ZlibDecoder::new(sink))),
            "br" => Decoder::Brotli(Box::new(brotli::DecompressorWriter::new(sink, 4096))),
            _ => return None,
        })
    }

    pub(crate) fn feed(&mut self, data: &[u8]) {
        let ok = match self {
            Decoder::Gzip(d) => d.write_all(data).is_ok(),
            Decoder::Deflate(d) => d.write_all(data).is_ok(),
            Decoder::Brotli(d) => d.write_all(data).is_ok(),
            Decoder::Failed => true,
        };
        if !ok {
            *self = Decoder::Failed;
        }
    }

    /// What the decoded body said (`None` after a failure).
    pub(crate) fn finish(&mut self) -> Option<Usage> {
        let done = match self {
            Decoder::Gzip(d) => d.try_finish().ok().map(|()| d.get_mut()),
            Decoder::Deflate(d) => d.try_finish().ok().map(|()| d.get_mut()),
            Decoder::Brotli(d) => d.flush().ok().map(|()| d.get_mut()),
            Decoder::Failed => None,
        };
        let usage = done.and_then(|sink| sink.plain.finish());
        *self = Decoder::Failed;
        usage
    }
}

impl std::fmt::Debug for Decoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Decoder::Gzip(_) => "Decoder::Gzip",
            Decoder::Deflate(_) => "Decoder::Deflate",
            Decoder::Brotli(_) => "Decoder::Brotli",
            Decoder::Failed => "Decoder::Failed",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BODY: &[u8] = br#"{"choices":[{"message":{"content":"hi"}}],"usage":{"prompt_tokens":9,"completion_tokens":12,"total_tokens":21}}"#;

    fn read(coding: &str, encoded: &[u8]) -> Option<u64> {
        let mut d = Decoder::new(coding, Plain::Json(JsonScan::default())).expect("coding");
        for chunk in encoded.chunks(7) {
            d.feed(chunk);
        }
        d.finish().and_then(|u| u.tokens())
    }

    #[test]
    fn gzip_deflate_and_br_bodies_are_read() {
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        gz.write_all(BODY).expect("gzip");
        assert_eq!(read("gzip", &gz.finish().expect("gzip")), Some(21));
        let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
        z.write_all(BODY).expect("zlib");
        assert_eq!(read("deflate", &z.finish().expect("zlib")), Some(21));
        let mut br = Vec::new();
        {
            let mut w = brotli::CompressorWriter::new(&mut br, 4096, 5, 22);
            w.write_all(BODY).expect("br");
        }
        assert_eq!(read("br", &br), Some(21));
        assert!(Decoder::new("zstd", Plain::Json(JsonScan::default())).is_none());
    }

    #[test]
    fn garbage_and_bombs_are_not_read() {
        assert_eq!(read("gzip", b"not gzip at all"), None);
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        let zeros = vec![b' '; 1024 * 1024];
        for _ in 0..(MAX_DECODED_BYTES / zeros.len() as u64 + 1) {
            gz.write_all(&zeros).expect("gzip");
        }
        gz.write_all(BODY).expect("gzip");
        let bomb = gz.finish().expect("gzip");
        assert!(bomb.len() < 1024 * 1024);
        assert_eq!(read("gzip", &bomb), None);
    }
}
