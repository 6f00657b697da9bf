//! A request body that counts what it yields: the bytes that went upstream, for the record.

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};

use crate::body::{BodyError, ProxyBody};

/// A request body that counts the bytes it yields (what went upstream).
pub(crate) struct CountedBody {
    inner: ProxyBody,
    count: Arc<AtomicU64>,
}

impl CountedBody {
    pub(crate) fn new(inner: ProxyBody, count: Arc<AtomicU64>) -> CountedBody {
        CountedBody { inner, count }
    }
}

impl Body for CountedBody {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let polled = ready!(Pin::new(&mut self.inner).poll_frame(cx));
        if let Some(Ok(f)) = &polled {
            if let Some(d) = f.data_ref() {
                self.count.fetch_add(d.len() as u64, Ordering::Relaxed);
            }
        }
        Poll::Ready(polled)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
