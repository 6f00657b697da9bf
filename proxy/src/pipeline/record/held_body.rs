//! The end of a request: its metrics and its audit record. The response body is wrapped so
//! its last frame (or its end) is released to the agent only once the record is in the audit
//! file; a response the agent saw complete is therefore always in the log.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Instant;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};

use crate::audit::{Entry, RequestEntry};
use crate::body::{BodyError, ProxyBody};
use crate::proxy::Proxy;

/// What is known of a request when its response starts; completed when it ends.
pub(crate) struct Finish {
    pub proxy: Arc<Proxy>,
    pub entry: RequestEntry,
    pub started: Instant,
    /// Request body bytes sent upstream.
    pub up: Arc<AtomicU64>,
    /// The host as a metric label (named in policy, or `other`).
    pub host_label: String,
}

impl Finish {
    /// Counts the request in the metrics and returns its audit record.
    fn account(mut self, down: u64, incomplete: bool) -> (Arc<Proxy>, RequestEntry) {
        let e = &mut self.entry;
        e.ms = self.started.elapsed().as_secs_f64() * 1000.0;
        e.bytes_up = self.up.load(Ordering::Relaxed);
        e.bytes_down = down;
        e.incomplete = incomplete;
        let m = &self.proxy.metrics;
        let decision = metric_decision(e.decision);
        let rule = e.rule.as_deref().unwrap_or("default");
        m.requests
            .with_label_values(&[decision, rule, &self.host_label])
            .inc();
        m.request_duration
            .with_label_values(&[decision])
            .observe(e.ms / 1000.0);
        m.bytes_up.inc_by(e.bytes_up);
        m.bytes_down.inc_by(down);
        if e.decision == "limited" {
            m.rate_limited.with_label_values(&[rule]).inc();
        }
        match e.error_code {
            Some("secret_leak") => m.secret_refusals.with_label_values(&["leak"]).inc(),
            Some("secret_scope") => m.secret_refusals.with_label_values(&["scope"]).inc(),
            Some("secret_unavailable") => {
                m.secret_refusals.with_label_values(&["unavailable"]).inc()
            }
            Some("upstream_dns" | "upstream_connect") => {
                m.upstream_errors.with_label_values(&["connect"]).inc()
            }
            Some("upstream_tls") => m.upstream_errors.with_label_values(&["tls"]).inc(),
            Some("upstream_timeout") => m.upstream_errors.with_label_values(&["timeout"]).inc(),
            Some("upstream_error") => m.upstream_errors.with_label_values(&["protocol"]).inc(),
            _ => {}
        }
        if e.error_code.is_none() {
            for s in &e.secrets {
                m.secret_injections.with_label_values(&[s]).inc();
            }
        }
        (self.proxy, self.entry)
    }

    /// Accounts for a request whose response body need not be held back (none: HEAD, 1xx,
    /// 204, 304, empty; or all `down` bytes of it already here): the record is written
    /// before the response is returned.
    /// `false`: the audit log could not record it; the response must not go out.
    pub(crate) async fn now(self, down: u64) -> bool {
        let (proxy, entry) = self.account(down, false);
        match &proxy.audit {
            Some(audit) => audit.write(Entry::Request(Box::new(entry))).await,
            None => true,
        }
    }

    /// Accounts without waiting (the client went away).
    fn detached(self, down: u64) {
        let (proxy, entry) = self.account(down, true);
        if let Some(audit) = &proxy.audit {
            audit.write_detached(Entry::Request(Box::new(entry)));
        }
    }
}

/// Decision names as metric label values (`ask-approved` → `ask_approved`).
pub(crate) fn metric_decision(d: &str) -> &'static str {
    match d {
        "allow" => "allow",
        "deny" => "deny",
        "limited" => "limited",
        "ask-approved" => "ask_approved",
        "ask-denied" => "ask_denied",
        "ask-timeout" => "ask_timeout",
        _ => "error",
    }
}

/// Resolves once the record is in the file; an error if the log could not take it.
type Writing = tokio::sync::oneshot::Receiver<()>;

/// Where a queued record stands.
enum Waiting {
    /// Queued: first once round the worker's other ready requests, so their records share
    /// this one's write (see `Audit::submit`).
    Queued(Arc<crate::audit::Audit>, Writing),
    /// Back from that round: drive the log, then wait.
    Yielded(Arc<crate::audit::Audit>, Writing),
    /// Waiting for the acknowledgement.
    Driven(Writing),
}

/// The response body, counted, with its last frame held until the record is written.
pub(crate) struct FinishedBody {
    inner: ProxyBody,
    finish: Option<Finish>,
    down: u64,
    held: Option<Frame<Bytes>>,
    waiting: Option<Waiting>,
    /// The response's Content-Length: a client that has that many bytes has the whole
    /// response, end of stream or not, so the frame that completes it is the one held.
    expected: Option<u64>,
    done: bool,
}

impl FinishedBody {
    pub(crate) fn new(inner: ProxyBody, finish: Finish, expected: Option<u64>) -> FinishedBody {
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
        let (proxy, entry) = f.account(self.down, false);
        let Some(audit) = &proxy.audit else {
            return false;
        };
        match audit.submit(Entry::Request(Box::new(entry))) {
            Some(w) => {
                self.waiting = Some(Waiting::Queued(audit.clone(), w));
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
                Some(Waiting::Queued(audit, w)) => {
                    this.waiting = Some(Waiting::Yielded(audit, w));
                    cx.waker().wake_by_ref();
                    return Poll::Pending;
                }
                Some(Waiting::Yielded(audit, w)) => {
                    audit.drive();
                    this.waiting = Some(Waiting::Driven(w));
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
                    if let Some(f) = this.finish.take() {
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
