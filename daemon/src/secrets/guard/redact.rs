//! Response redaction: a secret value in a response never reaches the agent. Headers (names
//! and values) and trailers have every value replaced by its placeholder. The body is
//! scanned as it streams (across chunk boundaries, holding a tail whose length never
//! depends on the bytes, `stream.rs`):
//!
//! * under a rule that binds secrets (its upstream has them and may echo one), a value
//!   becomes its placeholder (`Mode::Replace`; the length changes);
//! * under any other rule, a value means it got into content somewhere: the body is cut
//!   short before it (`Mode::Cut`), so clean responses go on byte for byte, lengths kept.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use http::{header, HeaderMap, HeaderName, HeaderValue, Response};
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;

use crate::body::{BodyError, ProxyBody};
use crate::secrets::guard::stream::{ChunkScanner, Pause, Piece};
use crate::secrets::set::SecretSet;

/// Replaces secret values in every header value, and in header names (where HTTP has folded
/// them to lower case: matched ignoring case); returns how many headers changed.
pub(crate) fn redact_headers(set: &SecretSet, headers: &mut HeaderMap) -> usize {
    let mut changed = 0;
    for value in headers.values_mut() {
        if let Some(r) = set.redact_bytes(value.as_bytes()) {
            // A value that is no valid header value once redacted is dropped, never kept.
            *value = HeaderValue::from_bytes(&r)
                .unwrap_or_else(|_| HeaderValue::from_static("agenshield:secret:[redacted]"));
            changed += 1;
        }
    }
    let renamed: Vec<HeaderName> = headers
        .keys()
        .filter(|n| set.redact_name(n.as_str()).is_some())
        .cloned()
        .collect();
    for name in renamed {
        let values: Vec<HeaderValue> = headers.get_all(&name).iter().cloned().collect();
        headers.remove(&name);
        let new = set
            .redact_name(name.as_str())
            .and_then(|n| HeaderName::from_bytes(n.as_bytes()).ok())
            .unwrap_or_else(|| HeaderName::from_static("x-agenshield-redacted"));
        for v in values {
            headers.append(new.clone(), v);
        }
        changed += 1;
    }
    changed
}

/// Redacts what the upstream sent back, while the set holds a secret: its headers always;
/// its body (unless `head_only` or empty) in `mode`: `Cut` goes on byte for byte, as sent,
/// and is cut short before a value; `Replace` has values become placeholders (and, with
/// `aws_fields`, credentials an AWS API hands out redacted), and refuses a body in any
/// coding but identity, which could not be searched for echoed secrets.
pub(crate) fn response(
    set: &Arc<SecretSet>,
    mode: Mode,
    aws_fields: bool,
    resp: Response<ProxyBody>,
    head_only: bool,
) -> Result<Response<ProxyBody>, EncodedResponse> {
    if set.is_empty() {
        return Ok(resp);
    }
    let (mut parts, body) = resp.into_parts();
    redact_headers(set, &mut parts.headers);
    if head_only || http_body::Body::is_end_stream(&body) {
        return Ok(Response::from_parts(parts, body));
    }
    if mode == Mode::Cut {
        let cut = RedactedBody::new(body, set.clone(), Mode::Cut);
        return Ok(Response::from_parts(parts, BodyExt::boxed(cut)));
    }
    if let Some(coding) = content_coding(&parts.headers) {
        return Err(EncodedResponse { coding });
    }
    // A placeholder is not as long as its value: the length is no longer known.
    parts.headers.remove(header::CONTENT_LENGTH);
    let redacted = BodyExt::boxed(RedactedBody::new(body, set.clone(), Mode::Replace));
    if aws_fields {
        let fields = crate::secrets::guard::aws_fields::FieldsRedacted::new(redacted);
        return Ok(Response::from_parts(parts, BodyExt::boxed(fields)));
    }
    Ok(Response::from_parts(parts, redacted))
}

/// A response body that must have values replaced came in a coding that hides them.
#[derive(Debug, thiserror::Error)]
#[error(
    "the upstream sent a {coding}-encoded body although asked for identity; it cannot be \
     checked for secret values, so it is not passed on"
)]
pub(crate) struct EncodedResponse {
    /// As `content_coding` gives it: escaped.
    coding: String,
}

/// The first coding but identity in any `Content-Encoding` header (every header, every
/// coding in it), escaped for a message.
pub(crate) fn content_coding(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(header::CONTENT_ENCODING)
        .iter()
        .flat_map(|v| v.as_bytes().split(|b| *b == b','))
        .map(<[u8]>::trim_ascii)
        .find(|c| !c.is_empty() && !c.eq_ignore_ascii_case(b"identity"))
        .map(|c| String::from_utf8_lossy(c).escape_debug().to_string())
}

/// What a value in the body gets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Replaced by its placeholder.
    Replace,
    /// The body ends in an error before it (the record says why).
    Cut,
}

/// The body error of a cut response; the pipeline's record reads the refusal from it.
#[derive(Debug, thiserror::Error)]
#[error("response cut short: it carried the value of secret {}", .0.secret)]
pub(crate) struct ResponseCut(pub crate::secrets::SecretRefusal);

pub(crate) struct RedactedBody {
    inner: ProxyBody,
    mode: Mode,
    set: Arc<SecretSet>,
    scanner: ChunkScanner,
    pause: Pause,
    queued: VecDeque<Frame<Bytes>>,
    finished: bool,
    /// Values replaced so far (for the log line at the end).
    replaced: usize,
}

impl RedactedBody {
    pub(crate) fn new(inner: ProxyBody, set: Arc<SecretSet>, mode: Mode) -> RedactedBody {
        RedactedBody {
            inner,
            mode,
            set,
            scanner: ChunkScanner::default(),
            pause: Pause::default(),
            queued: VecDeque::new(),
            finished: false,
            replaced: 0,
        }
    }

    fn render(&mut self, pieces: Vec<Piece>) -> Result<Bytes, BodyError> {
        if let [Piece::Plain(b)] = pieces.as_slice() {
            return Ok(b.clone());
        }
        let mut out = BytesMut::new();
        for p in pieces {
            match p {
                Piece::Plain(b) | Piece::Placeholder { bytes: b, .. } => out.extend_from_slice(&b),
                Piece::Value(run) if self.mode == Mode::Cut => {
                    let secret = self.set.placeholder_of_run(&run.secrets);
                    let name = secret
                        .strip_prefix(crate::secrets::placeholder::PREFIX)
                        .unwrap_or("");
                    tracing::warn!(
                        secret = name,
                        "response cut short: it carried a secret value"
                    );
                    self.finished = true;
                    self.queued.clear();
                    return Err(Box::new(ResponseCut(crate::secrets::SecretRefusal {
                        violation: crate::secrets::Violation::Echoed,
                        secret: name.to_string(),
                        place: crate::secrets::Place::Body,
                    })));
                }
                Piece::Value(run) => {
                    self.replaced += 1;
                    out.extend_from_slice(self.set.placeholder_of_run(&run.secrets).as_bytes());
                }
            }
        }
        Ok(out.freeze())
    }
}

impl Body for RedactedBody {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let this = &mut *self;
        loop {
            if let Some(f) = this.queued.pop_front() {
                return Poll::Ready(Some(Ok(f)));
            }
            if this.finished {
                return Poll::Ready(None);
            }
            let set = this.set.clone();
            let Some(m) = set.matcher() else {
                return Pin::new(&mut this.inner).poll_frame(cx);
            };
            match Pin::new(&mut this.inner).poll_frame(cx) {
                Poll::Pending => {
                    // A pause with bytes held: released after a fixed time, whatever they
                    // are (a value begun in them is still replaced when its rest comes).
                    if this.scanner.held() == 0 || !this.pause.due(cx) {
                        return Poll::Pending;
                    }
                    let pieces = this.scanner.flush(m);
                    let out = match this.render(pieces) {
                        Ok(out) => out,
                        Err(e) => return Poll::Ready(Some(Err(e))),
                    };
                    if !out.is_empty() {
                        return Poll::Ready(Some(Ok(Frame::data(out))));
                    }
                }
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Some(Err(e))),
                Poll::Ready(Some(Ok(f))) if f.is_data() => {
                    this.pause.reset();
                    let Ok(data) = f.into_data() else { continue };
                    let pieces = this.scanner.push(m, data);
                    let out = match this.render(pieces) {
                        Ok(out) => out,
                        Err(e) => return Poll::Ready(Some(Err(e))),
                    };
                    if !out.is_empty() {
                        return Poll::Ready(Some(Ok(Frame::data(out))));
                    }
                }
                Poll::Ready(other) => {
                    let pieces = this.scanner.finish(m);
                    let out = match this.render(pieces) {
                        Ok(out) => out,
                        Err(e) => return Poll::Ready(Some(Err(e))),
                    };
                    if !out.is_empty() {
                        this.queued.push_back(Frame::data(out));
                    }
                    match other {
                        Some(Ok(f)) => {
                            let f = match f.into_trailers() {
                                Ok(mut t) => {
                                    redact_headers(&set, &mut t);
                                    Frame::trailers(t)
                                }
                                Err(f) => f,
                            };
                            this.queued.push_back(f);
                        }
                        _ => this.finished = true,
                    }
                    if this.replaced > 0 && this.finished {
                        tracing::info!(
                            values = this.replaced,
                            "response redacted: secret values replaced by placeholders"
                        );
                    }
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.finished && self.queued.is_empty()
    }

    fn size_hint(&self) -> SizeHint {
        match self.mode {
            // A placeholder is not as long as its value: the length is unknown.
            Mode::Replace => SizeHint::default(),
            // Cut short: an error is still to come, never an empty body.
            Mode::Cut if self.finished => SizeHint::default(),
            // Byte for byte: what the inner body has left, and what is held.
            Mode::Cut => {
                let queued: usize = self
                    .queued
                    .iter()
                    .filter_map(Frame::data_ref)
                    .map(Bytes::len)
                    .sum();
                crate::body::hint_plus(
                    self.inner.size_hint(),
                    (self.scanner.held() + queued) as u64,
                )
            }
        }
    }
}

#[cfg(test)]
#[path = "redact_tests.rs"]
mod tests;
