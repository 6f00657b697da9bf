//! The leak guard and the placeholder swap, for a request body: the first `window` bytes
//! (all of it where the rule swaps in bodies) are checked as they stream upstream. A chunk is
//! released only once it is known to carry no secret the rule does not bind; the bytes that
//! could start one are held until the next chunk decides, so a placeholder split across
//! chunks (or HTTP/2 DATA frames) is found whole. On a hit the body fails, so the upstream
//! request is aborted before any byte of the secret is sent. A placeholder of a bound secret
//! becomes its value, encoded for the body's type, where the rule swaps in bodies; elsewhere
//! it is refused.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use http_body::{Body, Frame, SizeHint};

use super::matcher::HitKind;
use super::scan::{SecretRefusal, Violation};
use super::set::SecretSet;
use super::stream::{ChunkScanner, Piece};
use crate::body::{BodyError, ProxyBody};
use crate::policy::SecretBindings;

/// The body error; the refusal itself is also left in the shared slot, because an HTTP/2
/// upstream connection reports only that the stream was reset.
#[derive(Debug, thiserror::Error)]
#[error("request body refused by the leak guard (secret {})", .0.secret)]
pub(crate) struct BodyRefused(pub SecretRefusal);

/// What becomes of a placeholder of a bound secret in the body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum BodySwap {
    /// Refused: the rule does not swap in bodies, or this body cannot be rewritten (`place`
    /// says which: `body`, `gzip-encoded body`, `body of type application/grpc`).
    Refused { place: String },
    /// The value JSON-escaped (`"` and `\`), for a placeholder inside a JSON string.
    Json,
    /// The value percent-encoded, as a form field's value.
    Form,
    /// The value as it is.
    Text,
}

impl BodySwap {
    pub(crate) fn swaps(&self) -> bool {
        !matches!(self, BodySwap::Refused { .. })
    }

    fn encode(&self, value: &[u8]) -> Bytes {
        match self {
            BodySwap::Json => Bytes::copy_from_slice(&super::matcher::json_escaped(value, false)),
            BodySwap::Form => Bytes::from(
                percent_encoding::percent_encode(value, super::inject::QUERY_VALUE).to_string(),
            ),
            BodySwap::Text | BodySwap::Refused { .. } => Bytes::copy_from_slice(value),
        }
    }
}

pub(crate) struct ScannedBody {
    inner: ProxyBody,
    swap: BodySwap,
    /// Bound secrets whose placeholders were swapped in the body.
    swapped: Arc<Mutex<Vec<Arc<str>>>>,
    set: Arc<SecretSet>,
    bindings: Option<Arc<SecretBindings>>,
    scanner: ChunkScanner,
    /// Bytes still to scan; 0 = done scanning, pass the rest through.
    remaining: usize,
    queued: VecDeque<Frame<Bytes>>,
    finished: bool,
    verdict: Arc<OnceLock<SecretRefusal>>,
    /// An error met while prefetching, handed on at the next poll.
    pending_error: Option<BodyError>,
}

impl ScannedBody {
    /// A refusal is also written to `verdict`, for whoever sees the request fail.
    /// `swapped` collects the secrets whose placeholders were swapped.
    pub(crate) fn new(
        inner: ProxyBody,
        set: Arc<SecretSet>,
        bindings: Option<Arc<SecretBindings>>,
        window: usize,
        verdict: Arc<OnceLock<SecretRefusal>>,
        swap: BodySwap,
        swapped: Arc<Mutex<Vec<Arc<str>>>>,
    ) -> ScannedBody {
        // A swap must see the whole body, not only the guard's window.
        let window = if swap.swaps() { usize::MAX } else { window };
        ScannedBody {
            swap,
            swapped,
            verdict,
            pending_error: None,
            inner,
            set,
            bindings,
            scanner: ChunkScanner::default(),
            remaining: window,
            queued: VecDeque::new(),
            finished: false,
        }
    }

    /// Reads and checks the start of the body (up to `max` bytes, or all of it if shorter)
    /// before anything is sent, waiting at most `wait`: a typical API body that carries a
    /// secret is refused before the upstream sees even the request head. Bounded, so a
    /// client that waits for the response before sending its body still goes on.
    /// `Ok(Some(n))`: the whole body was read, and `n` bytes go upstream.
    pub(crate) async fn prefetch(
        &mut self,
        max: usize,
        wait: std::time::Duration,
    ) -> Result<Option<u64>, SecretRefusal> {
        let deadline = tokio::time::Instant::now() + wait;
        let mut read = Vec::new();
        let mut bytes = 0;
        while bytes < max {
            let next = std::future::poll_fn(|cx| Pin::new(&mut *self).poll_frame(cx));
            match tokio::time::timeout_at(deadline, next).await {
                Err(_) | Ok(None) => break,
                Ok(Some(Ok(frame))) => {
                    bytes += frame.data_ref().map_or(0, Bytes::len);
                    read.push(frame);
                }
                Ok(Some(Err(e))) => {
                    if let Some(r) = self.verdict.get() {
                        return Err(r.clone());
                    }
                    // The client's own body error: handed on when the body is next read.
                    self.pending_error = Some(e);
                    break;
                }
            }
        }
        for frame in read.into_iter().rev() {
            self.queued.push_front(frame);
        }
        // Nothing has gone on yet: once the body ended, all of it is queued.
        let whole = self.finished && self.pending_error.is_none();
        Ok(whole.then(|| self.queued_len()))
    }

    /// Data bytes queued to go on.
    fn queued_len(&self) -> u64 {
        let lens = self
            .queued
            .iter()
            .filter_map(Frame::data_ref)
            .map(Bytes::len);
        lens.sum::<usize>() as u64
    }

    /// Where a refusal is left.
    #[cfg(test)]
    pub(crate) fn verdict_slot(&self) -> Arc<OnceLock<SecretRefusal>> {
        self.verdict.clone()
    }

    /// Checks released pieces, swapping bound placeholders where the body may be rewritten;
    /// returns the bytes to send on.
    fn check(&self, pieces: Vec<Piece>) -> Result<Bytes, SecretRefusal> {
        let mut out = BytesMut::new();
        let mut single = None;
        let n = pieces.len();
        for p in pieces {
            let bytes = match p {
                Piece::Plain(b) => b,
                Piece::Hit(tag, b) => {
                    let secret = self.set.at(tag.secret);
                    let name = secret.name.as_str();
                    let refusal = |violation, place: &str| SecretRefusal {
                        violation,
                        secret: name.to_string(),
                        place: place.to_string(),
                    };
                    if !self.bindings.as_ref().is_some_and(|bd| bd.binds(name)) {
                        let violation = match tag.kind {
                            HitKind::Value => Violation::Leak,
                            HitKind::Placeholder => Violation::Scope,
                        };
                        return Err(refusal(violation, "body"));
                    }
                    match (tag.kind, &self.swap) {
                        (HitKind::Value, _) => b,
                        (HitKind::Placeholder, BodySwap::Refused { place }) => {
                            return Err(refusal(Violation::NotSwapped, place));
                        }
                        (HitKind::Placeholder, swap) => {
                            if let Ok(mut s) = self.swapped.lock() {
                                if !s.iter().any(|n| &**n == name) {
                                    s.push(secret.name.shared());
                                }
                            }
                            swap.encode(secret.value.expose())
                        }
                    }
                }
            };
            if n == 1 {
                single = Some(bytes);
            } else {
                out.extend_from_slice(&bytes);
            }
        }
        Ok(single.unwrap_or_else(|| out.freeze()))
    }

    fn refuse(&mut self, r: SecretRefusal) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        tracing::warn!(
            secret = %r.secret,
            kind = ?r.violation,
            "request body refused by the leak guard"
        );
        self.finished = true;
        self.queued.clear();
        let _ = self.verdict.set(r.clone());
        Poll::Ready(Some(Err(Box::new(BodyRefused(r)))))
    }
}

impl Body for ScannedBody {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let this = &mut *self;
        if let Some(e) = this.pending_error.take() {
            return Poll::Ready(Some(Err(e)));
        }
        loop {
            if let Some(f) = this.queued.pop_front() {
                return Poll::Ready(Some(Ok(f)));
            }
            if this.finished {
                return Poll::Ready(None);
            }
            let frame = match Pin::new(&mut this.inner).poll_frame(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Some(Err(e))),
                Poll::Ready(Some(Ok(f))) => Some(f),
                Poll::Ready(None) => {
                    this.finished = true;
                    None
                }
            };
            let Some(m) = this.set.matcher() else {
                // Nothing to look for: pass through.
                match frame {
                    Some(f) => {
                        return Poll::Ready(Some(Ok(f)));
                    }
                    None => return Poll::Ready(None),
                }
            };
            match frame {
                Some(f) if f.is_data() && this.remaining > 0 => {
                    let Ok(data) = f.into_data() else { continue };
                    let take = data.len().min(this.remaining);
                    this.remaining -= take;
                    let (head, tail) = (data.slice(..take), data.slice(take..));
                    let mut pieces = this.scanner.push(m, head);
                    if this.remaining == 0 {
                        pieces.extend(this.scanner.finish(m));
                    }
                    match this.check(pieces) {
                        Ok(out) => {
                            if !out.is_empty() {
                                this.queued.push_back(Frame::data(out));
                            }
                            if !tail.is_empty() {
                                this.queued.push_back(Frame::data(tail));
                            }
                        }
                        Err(r) => return this.refuse(r),
                    }
                }
                other => {
                    // Trailers or the end: whatever was held back is decided first.
                    let pieces = this.scanner.finish(m);
                    match this.check(pieces) {
                        Ok(out) if !out.is_empty() => this.queued.push_back(Frame::data(out)),
                        Ok(_) => {}
                        Err(r) => return this.refuse(r),
                    }
                    if let Some(f) = other {
                        // Trailers, whatever the window: checked as headers are.
                        if let Some(t) = f.trailers_ref() {
                            let b = this.bindings.as_deref();
                            if let Err(r) = super::scan::inspect_trailers(&this.set, b, t) {
                                return this.refuse(r);
                            }
                        }
                        this.queued.push_back(f);
                    }
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.finished && self.queued.is_empty()
    }

    fn size_hint(&self) -> SizeHint {
        if !self.swap.swaps() {
            // The length is unchanged: the guard refuses, it never rewrites.
            return self.inner.size_hint();
        }
        // A swap changes the length: known only once the whole body has been read.
        if self.finished {
            return SizeHint::with_exact(self.queued_len());
        }
        SizeHint::default()
    }
}

#[cfg(test)]
#[path = "swap_tests.rs"]
mod swap_tests;
