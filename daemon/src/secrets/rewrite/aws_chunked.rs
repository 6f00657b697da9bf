//! A body signed chunk by chunk (`x-amz-content-sha256: STREAMING-AWS4-HMAC-SHA256-PAYLOAD`,
//! `Content-Encoding: aws-chunked`), signed again as it streams: each chunk's signature is
//! chained from the one before, starting at the request's, so every chunk the agent signed
//! with its placeholder key gets the signature the real key makes. A chunk is held whole
//! until its signature is known (its header goes first); its length, and so the body's, is
//! unchanged. With trailers (`…-PAYLOAD-TRAILER`) the trailing headers are signed too.
//!
//! Format: `hex-size;chunk-signature=SIG\r\n DATA \r\n` …, then `0;chunk-signature=SIG\r\n`
//! and either `\r\n`, or trailer lines `name:value\r\n`, `x-amz-trailer-signature:SIG\r\n`,
//! `\r\n` (<https://docs.aws.amazon.com/AmazonS3/latest/API/sigv4-streaming.html>).

use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};

use bytes::{BufMut, Bytes, BytesMut};
use http_body::{Body, Frame};

use crate::body::{BodyError, ProxyBody};
use crate::secrets::rewrite::sigv4::ChunkSigner;
use crate::secrets::{Place, SecretRefusal};

/// The longest chunk held to be signed; SDKs send 64 KiB to 8 MiB.
pub(crate) const MAX_CHUNK: usize = 16 * 1024 * 1024;
/// The longest chunk header or trailer line.
const MAX_LINE: usize = 4096;
const SIGNATURE_EXT: &str = "chunk-signature=";
const TRAILER_SIGNATURE: &str = "x-amz-trailer-signature";

#[derive(Debug)]
enum State {
    /// Expecting `hex-size;chunk-signature=SIG\r\n`.
    Header,
    /// Expecting `size` bytes and `\r\n`.
    Data(usize),
    /// After the last chunk, with trailers: lines up to an empty one.
    Trailer {
        lines: Vec<Bytes>,
        signed: bool,
    },
    Done,
}

/// The sans-I/O part: bytes in, re-signed bytes out.
pub(crate) struct Rechunker {
    signer: ChunkSigner,
    previous: String,
    trailer: bool,
    state: State,
    buf: BytesMut,
}

impl Rechunker {
    /// `seed` is the request's signature.
    pub(crate) fn new(signer: ChunkSigner, seed: String, trailer: bool) -> Rechunker {
        Rechunker {
            signer,
            previous: seed,
            trailer,
            state: State::Header,
            buf: BytesMut::new(),
        }
    }

    /// Takes `input`; returns what can go on now (possibly nothing).
    pub(crate) fn push(&mut self, input: &[u8]) -> Result<Bytes, ChunkError> {
        self.buf.extend_from_slice(input);
        let mut out = BytesMut::new();
        loop {
            match &mut self.state {
                State::Header => {
                    let Some(line) = take_line(&mut self.buf, Line::ChunkHeader)? else {
                        break;
                    };
                    let size = parse_header(&line)?;
                    self.state = State::Data(size);
                }
                State::Data(0) => {
                    let sig = self.signer.chunk(&Bytes::new(), &self.previous);
                    if self.trailer {
                        put_header(&mut out, 0, &sig);
                        self.previous = sig;
                        self.state = State::Trailer {
                            lines: Vec::new(),
                            signed: false,
                        };
                        continue;
                    }
                    if self.buf.len() < 2 {
                        break;
                    }
                    expect_crlf(&self.buf[..2])?;
                    let _ = self.buf.split_to(2);
                    put_header(&mut out, 0, &sig);
                    out.put_slice(b"\r\n");
                    self.state = State::Done;
                }
                State::Data(size) => {
                    let size = *size;
                    if self.buf.len() < size + 2 {
                        break;
                    }
                    let data = self.buf.split_to(size).freeze();
                    expect_crlf(&self.buf[..2])?;
                    let _ = self.buf.split_to(2);
                    let sig = self.signer.chunk(&data, &self.previous);
                    put_header(&mut out, size, &sig);
                    out.put_slice(&data);
                    out.put_slice(b"\r\n");
                    self.previous = sig;
                    self.state = State::Header;
                }
                State::Trailer { lines, signed } => {
                    let Some(line) = take_line(&mut self.buf, Line::Trailer)? else {
                        break;
                    };
                    if !line.is_empty() {
                        let (name, _) = split_trailer(&line)?;
                        if name.eq_ignore_ascii_case(TRAILER_SIGNATURE) {
                            *signed = true;
                        } else if *signed {
                            return Err(ChunkError::TrailerAfterSignature);
                        } else {
                            lines.push(line);
                        }
                        continue;
                    }
                    if !*signed {
                        return Err(ChunkError::UnsignedTrailers);
                    }
                    let mut headers = aws_smithy_runtime_api::http::Headers::new();
                    for l in lines.iter() {
                        let (name, value) = split_trailer(l)?;
                        headers
                            .try_append(name.to_ascii_lowercase(), value.trim().to_string())
                            .map_err(|_| ChunkError::TrailerNotAHeader(name.to_string()))?;
                        out.put_slice(l);
                        out.put_slice(b"\r\n");
                    }
                    let sig = self.signer.trailer(&headers, &self.previous);
                    out.put_slice(format!("{TRAILER_SIGNATURE}:{sig}\r\n\r\n").as_bytes());
                    self.state = State::Done;
                }
                State::Done => {
                    if !self.buf.is_empty() {
                        return Err(ChunkError::AfterLastChunk);
                    }
                    break;
                }
            }
        }
        Ok(out.freeze())
    }

    /// At the body's end: every chunk arrived.
    pub(crate) fn finish(&self) -> Result<(), ChunkError> {
        match self.state {
            State::Done => Ok(()),
            _ => Err(ChunkError::EndedEarly),
        }
    }
}

/// What is wrong with an aws-chunked body (said after "an aws-chunked body with").
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum ChunkError {
    #[error("a {0} line over {MAX_LINE} bytes")]
    LongLine(Line),
    #[error("a chunk header that is not text")]
    HeaderNotText,
    #[error("a chunk header without its chunk-signature")]
    NoSignature,
    #[error("a chunk header with an extension other than chunk-signature")]
    OtherExtension,
    #[error("a chunk signature that is not 64 hex digits")]
    BadSignature,
    #[error("a chunk size that is not hex")]
    BadSize,
    #[error("a chunk over {} MiB", MAX_CHUNK >> 20)]
    TooLong,
    #[error("a chunk whose data is not followed by CRLF (its size is wrong)")]
    NoCrlf,
    #[error("a trailer that is not text")]
    TrailerNotText,
    #[error("a trailer line without a colon")]
    TrailerNoColon,
    #[error("a trailer with an invalid name")]
    TrailerBadName,
    #[error("a trailer after the trailer signature")]
    TrailerAfterSignature,
    #[error("trailers without x-amz-trailer-signature")]
    UnsignedTrailers,
    /// The trailer's name (not secret: a header name).
    #[error("trailer {0:?} is not a header")]
    TrailerNotAHeader(String),
    #[error("bytes after the last chunk")]
    AfterLastChunk,
    #[error("the body ended before its last chunk")]
    EndedEarly,
}

/// Which kind of line was too long.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Line {
    ChunkHeader,
    Trailer,
}

impl std::fmt::Display for Line {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Line::ChunkHeader => "chunk header",
            Line::Trailer => "trailer",
        })
    }
}

/// A line ending in CRLF, taken off `buf` without it; `None` until it is complete.
fn take_line(buf: &mut BytesMut, what: Line) -> Result<Option<Bytes>, ChunkError> {
    match memchr::memmem::find(buf, b"\r\n") {
        Some(n) if n <= MAX_LINE => {
            let line = buf.split_to(n).freeze();
            let _ = buf.split_to(2);
            Ok(Some(line))
        }
        Some(_) => Err(ChunkError::LongLine(what)),
        None if buf.len() > MAX_LINE => Err(ChunkError::LongLine(what)),
        None => Ok(None),
    }
}

/// `hex-size;chunk-signature=SIG`: the size.
fn parse_header(line: &[u8]) -> Result<usize, ChunkError> {
    let text = std::str::from_utf8(line).map_err(|_| ChunkError::HeaderNotText)?;
    let (size, ext) = text.split_once(';').ok_or(ChunkError::NoSignature)?;
    let sig = ext
        .strip_prefix(SIGNATURE_EXT)
        .ok_or(ChunkError::OtherExtension)?;
    if sig.len() != 64 || !sig.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(ChunkError::BadSignature);
    }
    if size.is_empty() || size.len() > 8 || !size.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(ChunkError::BadSize);
    }
    let n = usize::from_str_radix(size, 16).map_err(|_| ChunkError::BadSize)?;
    if n > MAX_CHUNK {
        return Err(ChunkError::TooLong);
    }
    Ok(n)
}

fn put_header(out: &mut BytesMut, size: usize, sig: &str) {
    out.put_slice(format!("{size:x};{SIGNATURE_EXT}{sig}\r\n").as_bytes());
}

fn expect_crlf(b: &[u8]) -> Result<(), ChunkError> {
    if b == b"\r\n" {
        Ok(())
    } else {
        Err(ChunkError::NoCrlf)
    }
}

fn split_trailer(line: &[u8]) -> Result<(&str, &str), ChunkError> {
    let text = std::str::from_utf8(line).map_err(|_| ChunkError::TrailerNotText)?;
    let (name, value) = text.split_once(':').ok_or(ChunkError::TrailerNoColon)?;
    if name.is_empty() || !name.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(ChunkError::TrailerBadName);
    }
    Ok((name, value))
}

/// The body wrapper: a refusal fails the body, and is left in `verdict` for the agent's
/// answer (the upstream request is aborted, so it never completes unsigned).
pub(crate) struct ResignedChunks {
    inner: ProxyBody,
    chunks: Rechunker,
    refusal: SecretRefusal,
    verdict: Arc<OnceLock<SecretRefusal>>,
    ended: bool,
}

impl ResignedChunks {
    /// `refusal` is the refusal to give, its `place` filled in with what was wrong.
    pub(crate) fn new(
        inner: ProxyBody,
        signer: ChunkSigner,
        seed: String,
        trailer: bool,
        refusal: SecretRefusal,
        verdict: Arc<OnceLock<SecretRefusal>>,
    ) -> ResignedChunks {
        ResignedChunks {
            inner,
            chunks: Rechunker::new(signer, seed, trailer),
            refusal,
            verdict,
            ended: false,
        }
    }

    fn refuse(&mut self, why: ChunkError) -> BodyError {
        let mut r = self.refusal.clone();
        r.place = Place::AwsChunked(why);
        let _ = self.verdict.set(r.clone());
        self.ended = true;
        Box::new(crate::secrets::guard::scan_body::BodyRefused(r))
    }
}

impl Body for ResignedChunks {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let this = &mut *self;
        loop {
            if this.ended {
                return Poll::Ready(None);
            }
            match Pin::new(&mut this.inner).poll_frame(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Some(Err(e))),
                Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                    Ok(data) => match this.chunks.push(&data) {
                        Ok(out) if out.is_empty() => continue,
                        Ok(out) => return Poll::Ready(Some(Ok(Frame::data(out)))),
                        Err(why) => return Poll::Ready(Some(Err(this.refuse(why)))),
                    },
                    // HTTP trailers are not part of the signed body: on as they came.
                    Err(frame) => return Poll::Ready(Some(Ok(frame))),
                },
                Poll::Ready(None) => {
                    if let Err(why) = this.chunks.finish() {
                        return Poll::Ready(Some(Err(this.refuse(why))));
                    }
                    this.ended = true;
                    return Poll::Ready(None);
                }
            }
        }
    }

    fn size_hint(&self) -> http_body::SizeHint {
        // Same length: only signatures change, and they are all 64 hex digits.
        self.inner.size_hint()
    }
}
