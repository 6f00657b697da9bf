//! Joining an upstream body's small data chunks that have already arrived.
//!
//! An upstream chooses its own DATA frame size (nginx sends 8 KiB by default), and each chunk
//! the agent's side is handed becomes a frame, a TLS record and a write of its own: HTTP/2
//! writes every large DATA frame on its own. Chunks that are already here are joined, up to
//! [`TARGET`] bytes, before they go on. Nothing ever waits: a chunk goes on as soon as the
//! next one is not ready, so a stream that trickles (server-sent events, a slow download)
//! is passed on exactly as fast as it comes.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use http_body::{Body, Frame, SizeHint};

/// The largest joined chunk: a TLS record's largest plaintext, and HTTP/2's default largest
/// frame. Larger chunks would be split into frames and records of this size again.
pub(crate) const TARGET: usize = 16 * 1024;

/// `inner` with its ready data chunks joined, up to [`TARGET`] bytes each.
pub(crate) struct Joined<B: Body> {
    inner: B,
    /// A frame (or error) read while joining that did not fit or was not data: next out.
    held: Option<Result<Frame<Bytes>, B::Error>>,
    /// `inner` has ended: it is not polled again.
    ended: bool,
}

impl<B: Body> Joined<B> {
    pub(crate) fn new(inner: B) -> Self {
        Joined {
            inner,
            held: None,
            ended: false,
        }
    }
}

impl<B> Body for Joined<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Unpin,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = self.get_mut();
        let first = match this.held.take() {
            Some(held) => held,
            None if this.ended => return Poll::Ready(None),
            None => match Pin::new(&mut this.inner).poll_frame(cx) {
                Poll::Ready(Some(f)) => f,
                Poll::Ready(None) => {
                    this.ended = true;
                    return Poll::Ready(None);
                }
                Poll::Pending => return Poll::Pending,
            },
        };
        let first = match first.map(Frame::into_data) {
            Ok(Ok(data)) => data,
            Ok(Err(frame)) => return Poll::Ready(Some(Ok(frame))),
            Err(e) => return Poll::Ready(Some(Err(e))),
        };
        if first.len() >= TARGET || this.ended || this.inner.is_end_stream() {
            return Poll::Ready(Some(Ok(Frame::data(first))));
        }
        let mut joined: Option<BytesMut> = None;
        let mut len = first.len();
        while len < TARGET && !this.inner.is_end_stream() {
            // Pending registers this task's waker with `inner`: harmless, since what was
            // joined goes out now and the caller polls again for more.
            let Poll::Ready(next) = Pin::new(&mut this.inner).poll_frame(cx) else {
                break;
            };
            let more = match next.map(|f| f.map(Frame::into_data)) {
                Some(Ok(Ok(more))) => more,
                Some(Ok(Err(frame))) => {
                    this.held = Some(Ok(frame));
                    break;
                }
                Some(Err(e)) => {
                    this.held = Some(Err(e));
                    break;
                }
                None => {
                    this.ended = true;
                    break;
                }
            };
            if len + more.len() > TARGET {
                this.held = Some(Ok(Frame::data(more)));
                break;
            }
            let buf = joined.get_or_insert_with(|| {
                let mut b = BytesMut::with_capacity(TARGET);
                b.extend_from_slice(&first);
                b
            });
            buf.extend_from_slice(&more);
            len += more.len();
        }
        let data = joined.map_or(first, BytesMut::freeze);
        Poll::Ready(Some(Ok(Frame::data(data))))
    }

    fn is_end_stream(&self) -> bool {
        self.held.is_none() && (self.ended || self.inner.is_end_stream())
    }

    fn size_hint(&self) -> SizeHint {
        let held = match &self.held {
            Some(Ok(f)) => f.data_ref().map_or(0, |d| d.len() as u64),
            _ => 0,
        };
        if self.ended {
            return SizeHint::with_exact(held);
        }
        crate::body::hint_plus(self.inner.size_hint(), held)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::body::BodyError;
    use http::HeaderMap;
    use http_body_util::{BodyExt, StreamBody};
    use std::task::Waker;
    use tokio::sync::mpsc;

    type Item = Result<Frame<Bytes>, BodyError>;

    /// A body fed by hand: what was sent is ready, the rest is not.
    fn channel() -> (
        mpsc::UnboundedSender<Item>,
        Joined<impl Body<Data = Bytes, Error = BodyError> + Unpin>,
    ) {
        let (tx, mut rx) = mpsc::unbounded_channel::<Item>();
        let body = StreamBody::new(futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx)));
        (tx, Joined::new(body))
    }

    fn data(n: usize, byte: u8) -> Item {
        Ok(Frame::data(Bytes::from(vec![byte; n])))
    }

    fn poll<B: Body<Data = Bytes> + Unpin>(
        b: &mut B,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        Pin::new(b).poll_frame(&mut Context::from_waker(Waker::noop()))
    }

    fn data_len<E: std::fmt::Debug>(p: Poll<Option<Result<Frame<Bytes>, E>>>) -> usize {
        match p {
            Poll::Ready(Some(Ok(f))) => f.into_data().expect("a data frame").len(),
            other => panic!(
                "expected data, got {:?}",
                other.map(|o| o.map(|r| r.is_ok()))
            ),
        }
    }

    #[test]
    fn ready_chunks_are_joined_up_to_the_target_and_the_rest_waits_its_turn() {
        let (tx, mut body) = channel();
        for i in 0..5u8 {
            tx.send(data(8 * 1024, i)).expect("send");
        }
        // 8 + 8 KiB fit; the third is held for the next frame.
        assert_eq!(data_len(poll(&mut body)), TARGET);
        assert_eq!(data_len(poll(&mut body)), TARGET);
        assert_eq!(data_len(poll(&mut body)), 8 * 1024);
        assert!(poll(&mut body).is_pending(), "nothing more has arrived");
    }

    #[test]
    fn a_chunk_goes_on_at_once_when_the_next_has_not_arrived() {
        let (tx, mut body) = channel();
        tx.send(data(100, b'a')).expect("send");
        assert_eq!(data_len(poll(&mut body)), 100);
        assert!(poll(&mut body).is_pending());
        tx.send(data(200, b'b')).expect("send");
        assert_eq!(data_len(poll(&mut body)), 200);
    }

    #[test]
    fn a_large_chunk_is_passed_as_it_is() {
        let (tx, mut body) = channel();
        tx.send(data(TARGET + 1, b'a')).expect("send");
        tx.send(data(10, b'b')).expect("send");
        assert_eq!(data_len(poll(&mut body)), TARGET + 1);
        assert_eq!(data_len(poll(&mut body)), 10);
    }

    #[tokio::test]
    async fn bytes_order_trailers_and_errors_are_kept() {
        let (tx, body) = channel();
        tx.send(data(3, b'a')).expect("send");
        tx.send(data(3, b'b')).expect("send");
        let mut trailers = HeaderMap::new();
        trailers.insert("grpc-status", "0".parse().expect("value"));
        tx.send(Ok(Frame::trailers(trailers.clone())))
            .expect("send");
        drop(tx);
        let collected = body.collect().await.expect("collect");
        assert_eq!(collected.trailers(), Some(&trailers));
        assert_eq!(&collected.to_bytes()[..], b"aaabbb");

        let (tx, mut body) = channel();
        tx.send(data(3, b'a')).expect("send");
        tx.send(Err("upstream reset".into())).expect("send");
        assert_eq!(
            data_len(poll(&mut body)),
            3,
            "data before the error goes out"
        );
        match poll(&mut body) {
            Poll::Ready(Some(Err(e))) => assert_eq!(e.to_string(), "upstream reset"),
            _ => panic!("the error follows"),
        }
    }

    #[test]
    fn the_end_is_reported_once_and_not_polled_past() {
        let (tx, mut body) = channel();
        tx.send(data(5, b'a')).expect("send");
        drop(tx);
        assert_eq!(data_len(poll(&mut body)), 5);
        assert!(body.is_end_stream());
        assert!(matches!(poll(&mut body), Poll::Ready(None)));
        assert!(matches!(poll(&mut body), Poll::Ready(None)));
    }
}
