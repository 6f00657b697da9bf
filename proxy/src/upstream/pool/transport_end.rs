//! Whether an upstream connection's transport has ended, as its HTTP/2 connection knows it.
//!
//! A stream failing with the peer's `GOAWAY(NO_ERROR)` is ambiguous in h2's errors: streams
//! above the GOAWAY's last-stream-id fail the moment the frame is read (the upstream did not
//! process them), but a stream at or below it that is still open when the transport then ends
//! fails with the same error, and that one the upstream may have processed. [`Watched`] marks
//! the end *before* h2 reads it, so a `GOAWAY` failure seen while the end is unmarked came from
//! the frame itself. Servers close right after their last response, so the end usually arrives
//! in the same read as the `GOAWAY`; it is held back from h2 for [`HOLD`] so that the streams
//! the frame failed are seen as such first. A stream seen late is not sent again: the error
//! only ever errs towards not retrying.
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use std::time::Duration;

use tokio::io::{AsyncRead, ReadBuf};

/// How long the end of a transport is held back from its connection.
const HOLD: Duration = Duration::from_millis(100);

/// Set once the transport under a connection has ended; shared with its streams.
#[derive(Clone, Default)]
pub(crate) struct TransportEnd(Arc<AtomicBool>);

impl TransportEnd {
    pub(crate) fn ended(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }

    fn mark(&self) {
        self.0.store(true, Ordering::Release);
    }
}

/// A transport that marks its [`TransportEnd`] as its reader is told of the end (held back
/// for [`HOLD`] first) or of a read error.
pub(crate) struct Watched<T> {
    inner: T,
    end: TransportEnd,
    /// Set when the end was read and is being held back.
    held: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl<T> Watched<T> {
    pub(crate) fn new(inner: T, end: TransportEnd) -> Watched<T> {
        Watched {
            inner,
            end,
            held: None,
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Watched<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if let Some(hold) = self.held.as_mut() {
            std::task::ready!(hold.as_mut().poll(cx));
            self.end.mark();
            return Poll::Ready(Ok(()));
        }
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        match &polled {
            Poll::Ready(Ok(())) if buf.filled().len() == before && buf.remaining() > 0 => {
                let mut hold = Box::pin(tokio::time::sleep(HOLD));
                let waiting = hold.as_mut().poll(cx).is_pending();
                self.held = Some(hold);
                if waiting {
                    return Poll::Pending;
                }
                self.end.mark();
            }
            Poll::Ready(Err(_)) => self.end.mark(),
            _ => {}
        }
        polled
    }
}

crate::write_through::write_through!(Watched, inner);

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn end_of_stream_is_marked_and_data_is_not() {
        let (a, mut b) = tokio::io::duplex(64);
        let end = TransportEnd::default();
        let mut watched = Watched::new(a, end.clone());
        b.write_all(b"frame").await.expect("write");
        let mut buf = [0u8; 5];
        watched.read_exact(&mut buf).await.expect("read");
        assert!(!end.ended(), "data is not an end");
        drop(b);
        let started = tokio::time::Instant::now();
        let mut reading = std::pin::pin!(watched.read(&mut buf));
        assert!(
            futures_util::poll!(reading.as_mut()).is_pending(),
            "the end is held back"
        );
        assert!(!end.ended(), "not marked before the reader is told");
        assert_eq!(reading.await.expect("eof"), 0);
        assert!(end.ended());
        assert!(started.elapsed() >= HOLD);
    }
}
