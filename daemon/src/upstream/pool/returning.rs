//! An HTTP/1.1 connection on loan to one request: back to the pool once its response has been
//! read to the end, closed if the response is dropped before.

use std::pin::Pin;
use std::sync::Weak;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use hyper::body::Incoming;

use super::{Key, Own, Pool};
use crate::body::joined::Joined;
use crate::body::{BodyError, ProxyBody};

pub(super) struct Returning {
    pub(super) pool: Weak<Pool>,
    pub(super) key: Key,
    pub(super) own: Own,
}

impl Returning {
    /// The response body, giving the connection back when it ends.
    pub(super) fn wrap(self, body: Joined<Incoming>) -> ProxyBody {
        ReturningBody {
            inner: crate::body::stream(body),
            back: Some(self),
        }
        .boxed()
    }

    fn give_back(self) {
        if let Some(pool) = self.pool.upgrade() {
            pool.give_back(&self.key, self.own);
        }
    }
}

struct ReturningBody {
    inner: ProxyBody,
    back: Option<Returning>,
}

impl Drop for ReturningBody {
    fn drop(&mut self) {
        // The server side may stop once the body says it is done, without polling its end.
        if self.inner.is_end_stream() {
            if let Some(back) = self.back.take() {
                back.give_back();
            }
        }
    }
}

impl Body for ReturningBody {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(None) => {
                if let Some(back) = self.back.take() {
                    back.give_back();
                }
            }
            Poll::Ready(Some(Err(_))) => self.back = None,
            _ => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
