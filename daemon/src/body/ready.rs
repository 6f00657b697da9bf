//! Taking a response body whole when all of it has already arrived.
//!
//! Most API responses are small and come in the same read as their head. Holding back the
//! last frame of such a body until its audit record is written (what `finish` does for
//! streamed bodies) makes hyper send the response head on its own and the body later: two
//! writes, two segments, two wake-ups of the client per request. When the whole body is
//! already here, the pipeline instead writes the record first and hands hyper a complete
//! body, which goes out with the head in one write. Nothing ever waits for this: frames
//! are taken only while the body yields them without blocking.

use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use bytes::{Bytes, BytesMut};
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;

use crate::body::{BodyError, ProxyBody};

/// What [`take_ready`] found.
pub(crate) enum Ready {
    /// The whole body, which had already arrived.
    Complete(Bytes),
    /// Not all there yet (or too large, or with trailers): the body as it was, frames
    /// already taken replayed first.
    Streaming(ProxyBody),
}

/// The body whole if every frame up to its end is available now and the data is at most
/// `limit` bytes.
pub(crate) fn take_ready(mut body: ProxyBody, limit: usize) -> Ready {
    if body.size_hint().lower() > limit as u64 {
        return Ready::Streaming(body);
    }
    let mut cx = Context::from_waker(Waker::noop());
    let mut taken: VecDeque<Frame<Bytes>> = VecDeque::new();
    let mut len = 0usize;
    loop {
        match Pin::new(&mut body).poll_frame(&mut cx) {
            Poll::Ready(None) => return Ready::Complete(concat(taken, len)),
            Poll::Ready(Some(Ok(frame))) => {
                let is_data = frame.is_data();
                if let Some(d) = frame.data_ref() {
                    len += d.len();
                }
                taken.push_back(frame);
                if !is_data || len > limit {
                    return Ready::Streaming(replay(taken, None, body));
                }
            }
            Poll::Ready(Some(Err(e))) => return Ready::Streaming(replay(taken, Some(e), body)),
            // The inner body registered our no-op waker; hyper's own poll replaces it.
            Poll::Pending => return Ready::Streaming(replay(taken, None, body)),
        }
    }
}

fn concat(frames: VecDeque<Frame<Bytes>>, len: usize) -> Bytes {
    if frames.len() == 1 {
        if let Some(Ok(d)) = frames.into_iter().next().map(Frame::into_data) {
            return d;
        }
        return Bytes::new();
    }
    let mut out = BytesMut::with_capacity(len);
    for f in frames {
        if let Ok(d) = f.into_data() {
            out.extend_from_slice(&d);
        }
    }
    out.freeze()
}

fn replay(frames: VecDeque<Frame<Bytes>>, err: Option<BodyError>, inner: ProxyBody) -> ProxyBody {
    if frames.is_empty() && err.is_none() {
        return inner;
    }
    Replay { frames, err, inner }.boxed()
}

/// Frames already taken, then an error taken with them, then the rest of the body.
struct Replay {
    frames: VecDeque<Frame<Bytes>>,
    err: Option<BodyError>,
    inner: ProxyBody,
}

impl Body for Replay {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        if let Some(f) = self.frames.pop_front() {
            return Poll::Ready(Some(Ok(f)));
        }
        if let Some(e) = self.err.take() {
            return Poll::Ready(Some(Err(e)));
        }
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.frames.is_empty() && self.err.is_none() && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        let queued: u64 = self
            .frames
            .iter()
            .filter_map(|f| f.data_ref().map(|d| d.len() as u64))
            .sum();
        crate::body::hint_plus(self.inner.size_hint(), queued)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::body::{full, stream};
    use http_body_util::StreamBody;

    #[tokio::test]
    async fn a_body_that_is_all_here_is_taken_whole() {
        match take_ready(full(Bytes::from_static(b"hello")), 1024) {
            Ready::Complete(b) => assert_eq!(&b[..], b"hello"),
            Ready::Streaming(_) => panic!("a full body is ready"),
        }
    }

    #[tokio::test]
    async fn a_body_still_arriving_is_left_streaming_and_loses_nothing() {
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, BodyError>>(4);
        tx.send(Ok(Frame::data(Bytes::from_static(b"first "))))
            .await
            .expect("send");
        let body = stream(StreamBody::new(tokio_stream_from(rx)));
        let Ready::Streaming(body) = take_ready(body, 1024) else {
            panic!("the end has not arrived");
        };
        tx.send(Ok(Frame::data(Bytes::from_static(b"second"))))
            .await
            .expect("send");
        drop(tx);
        let all = body.collect().await.expect("collect").to_bytes();
        assert_eq!(&all[..], b"first second");
    }

    #[tokio::test]
    async fn a_body_over_the_limit_is_left_streaming_whole() {
        let big = Bytes::from(vec![b'x'; 100]);
        let Ready::Streaming(body) = take_ready(full(big.clone()), 10) else {
            panic!("over the limit");
        };
        assert_eq!(body.collect().await.expect("collect").to_bytes(), big);
    }

    /// A receiver as a `Stream` without pulling in tokio-stream.
    fn tokio_stream_from<T: Send + 'static>(
        mut rx: tokio::sync::mpsc::Receiver<T>,
    ) -> impl futures_util::Stream<Item = T> + Send + Sync {
        futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx))
    }
}
