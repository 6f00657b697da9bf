//! A request body under the credential check, scanned as it streams (`dlp::StreamScan`):
//! bytes go on only once scanned with what follows them (at most the scanner's overlap and
//! one step are held back), so the upstream never receives the bytes of a chunk that holds
//! a refused credential: the body fails instead, which aborts the upstream request, and the
//! check's state says why (`DlpPhase::blocked`). A pause releases what is held (a stream
//! the client feeds interactively is never stalled), as the leak guard does.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};

use super::dlp::{Blocked, DlpPhase};
use crate::body::{BodyError, ProxyBody};
use crate::dlp::{self, Finding, Place, StreamScan};
use crate::secrets::guard::stream::Pause;

/// The body is read up to this much before the request head goes upstream…
const PREFETCH_BYTES: usize = 64 * 1024;
/// …waiting at most this long: a typical API body with a credential is refused with a 403
/// before the upstream sees anything.
const PREFETCH_WAIT: Duration = Duration::from_millis(100);

/// The body error when a credential was refused mid-stream.
#[derive(Debug, thiserror::Error)]
#[error("request body refused: a credential ({})", .0.formats.first().map_or("", |f| f.as_str()))]
pub(crate) struct BodyBlocked(pub Blocked);

pub(crate) struct DlpBody {
    inner: ProxyBody,
    phase: Arc<DlpPhase>,
    scan: StreamScan,
    pause: Pause,
    queued: VecDeque<Frame<Bytes>>,
    finished: bool,
    found: Vec<Finding>,
    pending_error: Option<BodyError>,
}

impl DlpBody {
    pub(crate) fn new(inner: ProxyBody, phase: Arc<DlpPhase>) -> DlpBody {
        DlpBody {
            inner,
            phase,
            scan: StreamScan::default(),
            pause: Pause::default(),
            queued: VecDeque::new(),
            finished: false,
            found: Vec::new(),
            pending_error: None,
        }
    }

    /// Reads and checks the start of the body before anything is sent (bounded in bytes
    /// and time, so a client that waits for the response before its body still goes on).
    pub(crate) async fn prefetch(&mut self) -> Result<(), Blocked> {
        let deadline = tokio::time::Instant::now() + PREFETCH_WAIT;
        let mut read = Vec::new();
        let mut bytes = 0;
        while bytes < PREFETCH_BYTES {
            let next = std::future::poll_fn(|cx| Pin::new(&mut *self).poll_frame(cx));
            match tokio::time::timeout_at(deadline, next).await {
                Err(_) | Ok(None) => break,
                Ok(Some(Ok(frame))) => {
                    bytes += frame.data_ref().map_or(0, Bytes::len);
                    read.push(frame);
                }
                Ok(Some(Err(e))) => {
                    if let Some(b) = self.phase.blocked() {
                        return Err(b);
                    }
                    self.pending_error = Some(e);
                    break;
                }
            }
        }
        for frame in read.into_iter().rev() {
            self.queued.push_front(frame);
        }
        Ok(())
    }

    /// Judges what the scanner found; queues `out` when it may go on.
    fn judged(&mut self, out: Bytes) -> Result<(), BodyError> {
        let found = std::mem::take(&mut self.found);
        let verdict = self.phase.judge(&found, Place::Body);
        self.found = found;
        self.found.clear();
        if let Err(b) = verdict {
            self.finished = true;
            self.queued.clear();
            return Err(Box::new(BodyBlocked(b)));
        }
        if self.scan.capped && self.phase.blocks() {
            // Part of the body was read raw only: not sure, so not sent.
            self.finished = true;
            self.queued.clear();
            return Err(Box::new(std::io::Error::other(
                "request body refused: too much encoded text to scan for credentials",
            )));
        }
        if !out.is_empty() {
            self.queued.push_back(Frame::data(out));
        }
        Ok(())
    }
}

impl Body for DlpBody {
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
        let d = dlp::detector();
        loop {
            if let Some(f) = this.queued.pop_front() {
                return Poll::Ready(Some(Ok(f)));
            }
            if this.finished {
                return Poll::Ready(None);
            }
            match Pin::new(&mut this.inner).poll_frame(cx) {
                Poll::Pending => {
                    if this.scan.held() == 0 || !this.pause.due(cx) {
                        return Poll::Pending;
                    }
                    let out = this.scan.flush(d, &mut this.found);
                    if let Err(e) = this.judged(out) {
                        return Poll::Ready(Some(Err(e)));
                    }
                }
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Some(Err(e))),
                Poll::Ready(Some(Ok(frame))) => {
                    this.pause.reset();
                    match frame.into_data() {
                        Ok(data) => {
                            let out = this.scan.push(d, &data, &mut this.found);
                            if let Err(e) = this.judged(out) {
                                return Poll::Ready(Some(Err(e)));
                            }
                        }
                        Err(other) => {
                            // Trailers: what is held is decided first; their values are
                            // headers.
                            let out = this.scan.finish(d, &mut this.found);
                            if let Err(e) = this.judged(out) {
                                return Poll::Ready(Some(Err(e)));
                            }
                            if let Some(t) = other.trailers_ref() {
                                let mut scratch = dlp::Findings::default();
                                for (name, value) in t {
                                    let place = Place::header(name.as_str());
                                    if let Err(b) =
                                        this.phase.scan(value.as_bytes(), place, &mut scratch)
                                    {
                                        this.finished = true;
                                        this.queued.clear();
                                        return Poll::Ready(Some(Err(Box::new(BodyBlocked(b)))));
                                    }
                                }
                            }
                            this.queued.push_back(other);
                        }
                    }
                }
                Poll::Ready(None) => {
                    this.pause.reset();
                    let out = this.scan.finish(d, &mut this.found);
                    if let Err(e) = this.judged(out) {
                        return Poll::Ready(Some(Err(e)));
                    }
                    this.finished = true;
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.finished && self.queued.is_empty()
    }

    fn size_hint(&self) -> SizeHint {
        let held = self.scan.held() as u64
            + self
                .queued
                .iter()
                .filter_map(Frame::data_ref)
                .map(|b| b.len() as u64)
                .sum::<u64>();
        crate::body::hint_plus(self.inner.size_hint(), held)
    }
}
