//! The leak guard and the placeholder swap, for a request body: the first `window` bytes
//! (all of it where the rule swaps in bodies) are checked as they stream upstream. Of each
//! chunk, all but a tail as long as the longest pattern goes on once checked; the tail waits
//! for the next chunk (or a pause of `FLUSH_AFTER`), whatever its bytes are, so a secret or
//! placeholder split across chunks (or HTTP/2 DATA frames) is found whole and what the
//! upstream sees never depends on a stored value (`stream.rs`). On a hit the body fails, so the upstream
//! request is aborted before any byte of the secret is sent. A placeholder of a bound secret
//! becomes its value, encoded for the body's type, where the rule swaps in bodies; elsewhere
//! it is refused.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};

use crate::body::{BodyError, ProxyBody};
use crate::policy::SecretBindings;
use crate::secrets::guard::stream::{ChunkScanner, Pause};
use crate::secrets::rewrite::swap::{BodySwap, Swapper};
use crate::secrets::set::SecretSet;
use crate::secrets::SecretRefusal;

/// The body error; the refusal itself is also left in the shared slot, because an HTTP/2
/// upstream connection reports only that the stream was reset.
#[derive(Debug, thiserror::Error)]
#[error("request body refused by the leak guard (secret {})", .0.secret)]
pub(crate) struct BodyRefused(pub SecretRefusal);

pub(crate) struct ScannedBody {
    inner: ProxyBody,
    swapper: Swapper,
    scanner: ChunkScanner,
    pause: Pause,
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
            swapper: Swapper {
                set,
                bindings,
                swap,
                place: crate::secrets::Place::Body,
                swapped,
            },
            verdict,
            pending_error: None,
            inner,
            scanner: ChunkScanner::default(),
            pause: Pause::default(),
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

    fn refuse(&mut self, r: SecretRefusal) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        tracing::warn!(
            secret = %r.secret,
            kind = r.violation.as_str(),
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
                Poll::Pending => {
                    // A pause with bytes held: released after a fixed time, whatever they are.
                    let m = this.swapper.set.matcher();
                    let (Some(m), true) = (m, this.scanner.held() > 0) else {
                        return Poll::Pending;
                    };
                    if !this.pause.due(cx) {
                        return Poll::Pending;
                    }
                    let pieces = this.scanner.flush(m);
                    match this.swapper.check(pieces) {
                        Ok(out) if !out.is_empty() => this.queued.push_back(Frame::data(out)),
                        Ok(_) => {}
                        Err(r) => return this.refuse(r),
                    }
                    continue;
                }
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Some(Err(e))),
                Poll::Ready(Some(Ok(f))) => Some(f),
                Poll::Ready(None) => {
                    this.finished = true;
                    None
                }
            };
            this.pause.reset();
            let Some(m) = this.swapper.set.matcher() else {
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
                    match this.swapper.check(pieces) {
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
                    match this.swapper.check(pieces) {
                        Ok(out) if !out.is_empty() => this.queued.push_back(Frame::data(out)),
                        Ok(_) => {}
                        Err(r) => return this.refuse(r),
                    }
                    if let Some(f) = other {
                        // Trailers, whatever the window: checked as headers are.
                        if let Some(t) = f.trailers_ref() {
                            let (set, b) = (&this.swapper.set, this.swapper.bindings.as_deref());
                            if let Err(r) = crate::secrets::guard::scan::inspect_trailers(set, b, t)
                            {
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
        if !self.swapper.swap.swaps() {
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
