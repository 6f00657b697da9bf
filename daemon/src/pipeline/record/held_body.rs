//! A streaming response body whose last frame (or its end) is released to the agent only
//! once the request's record is in the audit file: a response the agent saw complete is
//! always in the log. Counts the bytes down on the way.

use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};

use super::{PendingRecord, Submitted};
use crate::body::{BodyError, ProxyBody};

/// Resolves once the record is in the file; an error if the log could not take it.
type Writing = tokio::sync::oneshot::Receiver<()>;

/// Where a queued record stands.
enum Waiting {
    /// Queued: first once round the worker's other ready requests, so their records share
    /// this one's write (see `Audit::submit`).
    Queued(Submitted),
    /// Back from that round: drive the log, then wait.
    Yielded(Submitted),
    /// Waiting for the acknowledgement.
    Driven(Writing),
}

/// The response body, counted, with its last frame held until the record is written.
pub(crate) struct FinishedBody {
    inner: ProxyBody,
    finish: Option<PendingRecord>,
    down: u64,
    held: Option<Frame<Bytes>>,
    waiting: Option<Waiting>,
    /// The response's Content-Length: a client that has that many bytes has the whole
    /// response, end of stream or not, so the frame that completes it is the one held.
    expected: Option<u64>,
    done: bool,
}

impl FinishedBody {
    pub(super) fn new(
        inner: ProxyBody,
        finish: PendingRecord,
        expected: Option<u64>,
    ) -> FinishedBody {
        FinishedBody {
            expected,
            inner,
            finish: Some(finish),
            down: 0,
            held: None,
            waiting: None,
            done: false,
        }
    }

    /// Accounts for the request and queues its record; `false` when there is nothing to
    /// wait for (no audit log, or the record dropped by design).
    fn start_writing(&mut self) -> bool {
        let Some(f) = self.finish.take() else {
            return false;
        };
        match f.submit(self.down) {
            Some(s) => {
                self.waiting = Some(Waiting::Queued(s));
                true
            }
            None => false,
        }
    }

    /// Lets the held last frame (or the end of the body) out.
    fn release(&mut self) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        match self.held.take() {
            Some(f) => Poll::Ready(Some(Ok(f))),
            None => {
                self.done = true;
                Poll::Ready(None)
            }
        }
    }
}

impl Body for FinishedBody {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let this = &mut *self;
        loop {
            match this.waiting.take() {
                Some(Waiting::Queued(s)) => {
                    this.waiting = Some(Waiting::Yielded(s));
                    cx.waker().wake_by_ref();
                    return Poll::Pending;
                }
                Some(Waiting::Yielded(s)) => {
                    s.audit.drive();
                    this.waiting = Some(Waiting::Driven(s.written));
                    continue;
                }
                Some(Waiting::Driven(mut w)) => match Pin::new(&mut w).poll(cx) {
                    Poll::Pending => {
                        this.waiting = Some(Waiting::Driven(w));
                        return Poll::Pending;
                    }
                    Poll::Ready(Ok(())) => return this.release(),
                    Poll::Ready(Err(_)) => {
                        // The log could not record it: the response ends short (fail closed).
                        this.held = None;
                        this.done = true;
                        return Poll::Ready(Some(Err(
                            "the audit log could not record this response".into(),
                        )));
                    }
                },
                None => {}
            }
            if this.done || this.finish.is_none() {
                this.done = true;
                return Poll::Ready(None);
            }
            match ready!(Pin::new(&mut this.inner).poll_frame(cx)) {
                Some(Ok(frame)) => {
                    if let Some(d) = frame.data_ref() {
                        this.down += d.len() as u64;
                    }
                    let complete = this.expected.is_some_and(|n| this.down >= n);
                    if !this.inner.is_end_stream() && !complete {
                        return Poll::Ready(Some(Ok(frame)));
                    }
                    // The last frame: out only once the record is written.
                    this.held = Some(frame);
                    if !this.start_writing() {
                        return this.release();
                    }
                }
                Some(Err(e)) => {
                    if let Some(mut f) = this.finish.take() {
                        // Cut short before a secret's value: the record says so.
                        if let Some(cut) =
                            e.downcast_ref::<crate::secrets::guard::redact::ResponseCut>()
                        {
                            f.cut(&cut.0);
                        }
                        f.detached(this.down);
                    }
                    this.done = true;
                    return Poll::Ready(Some(Err(e)));
                }
                None => {
                    if !this.start_writing() {
                        return this.release();
                    }
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for FinishedBody {
    fn drop(&mut self) {
        // Never finished: the client went away (or hyper dropped an unsent body).
        if let Some(f) = self.finish.take() {
            f.detached(self.down);
        }
    }
}
