//! Flush consolidation for multiplexed (HTTP/2) upstream connections, the technique Netty
//! ships as `FlushConsolidationHandler`. The h2 codec flushes after every turn of its
//! connection task, and a connection task is woken once per stream that has something to
//! send, so under load every request became its own TLS record and its own `writev(2)`. Not
//! used on the agent's side: there a refused upload's response and stream reset would share
//! one read, which curl 7.88 reports as a framing error (`bench/profiles/why.md`).
//!
//! [`Coalesced`] buffers writes and answers the first flush with `Pending` after waking its
//! own task: the task goes to the back of its shard's run queue, every stream task already
//! ready runs and queues its frames, and the next poll flushes them all in one TLS write.
//! The delay is one turn of the scheduler, never a timer; shutdown is not deferred.

use std::io::{self, IoSlice};
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, BufWriter, ReadBuf};

/// Frames gathered before a write at most; a write this large or larger (a full 16 KiB
/// DATA frame) goes through without being copied.
pub(crate) const CAPACITY: usize = 16 * 1024;

/// `inner` with writes gathered and the first flush of a turn deferred to the next.
pub(crate) struct Coalesced<S> {
    inner: BufWriter<S>,
    /// The flush was deferred once (the task woke itself); the next one writes.
    deferred: bool,
}

impl<S: AsyncWrite> Coalesced<S> {
    pub(crate) fn new(inner: S) -> Coalesced<S> {
        Coalesced {
            inner: BufWriter::with_capacity(CAPACITY, inner),
            deferred: false,
        }
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for Coalesced<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Coalesced<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if !this.inner.buffer().is_empty() && !this.deferred {
            this.deferred = true;
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        let flushed = Pin::new(&mut this.inner).poll_flush(cx);
        if flushed.is_ready() {
            this.deferred = false;
        }
        flushed
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};
    use tokio::io::AsyncWriteExt;

    /// Records every write the wrapped stream is asked for.
    #[derive(Clone, Default)]
    struct Writes(Arc<Mutex<Vec<Vec<u8>>>>);

    impl AsyncWrite for Writes {
        fn poll_write(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<io::Result<usize>> {
            self.0.lock().expect("lock").push(buf.to_vec());
            Poll::Ready(Ok(buf.len()))
        }
        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    impl AsyncRead for Writes {
        fn poll_read(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
            _: &mut ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    /// The h2 connection task as the codec drives it: each poll moves every frame the
    /// streams queued into the writer, then flushes. Stream `i` queues its frame after `i`
    /// turns of the scheduler. Returns the writes the socket saw.
    async fn connection_task<W>(wrap: impl FnOnce(Writes) -> W, streams: u8) -> Vec<Vec<u8>>
    where
        W: AsyncWrite + Unpin + Send + 'static,
    {
        let writes = Writes::default();
        let mut out = wrap(writes.clone());
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Vec<u8>>();
        let conn = tokio::spawn(std::future::poll_fn(move |cx| {
            let mut open = true;
            loop {
                match rx.poll_recv(cx) {
                    Poll::Ready(Some(frame)) => {
                        let n = std::task::ready!(Pin::new(&mut out).poll_write(cx, &frame));
                        assert_eq!(n.expect("write"), frame.len());
                    }
                    Poll::Ready(None) => {
                        open = false;
                        break;
                    }
                    Poll::Pending => break,
                }
            }
            std::task::ready!(Pin::new(&mut out).poll_flush(cx)).expect("flush");
            if open {
                Poll::Pending
            } else {
                Poll::Ready(())
            }
        }));
        let senders: Vec<_> = (0..streams)
            .map(|i| {
                let tx = tx.clone();
                tokio::spawn(async move {
                    for _ in 0..i {
                        // One turn: back of the run queue, not after the I/O driver.
                        let mut yielded = false;
                        std::future::poll_fn(|cx| {
                            if yielded {
                                return Poll::Ready(());
                            }
                            yielded = true;
                            cx.waker().wake_by_ref();
                            Poll::Pending
                        })
                        .await;
                    }
                    tx.send(vec![i; 10]).expect("send");
                })
            })
            .collect();
        drop(tx);
        for s in senders {
            s.await.expect("stream");
        }
        conn.await.expect("connection");
        let got = writes.0.lock().expect("lock").clone();
        got
    }

    #[tokio::test(flavor = "current_thread")]
    async fn frames_of_streams_ready_a_turn_apart_go_out_in_one_write() {
        let got = connection_task(Coalesced::new, 2).await;
        assert_eq!(got, [[[0u8; 10], [1u8; 10]].concat()], "one write for both");
        // The same with a plain buffered writer: a write per flush, a flush per frame.
        let plain = connection_task(|w| BufWriter::with_capacity(CAPACITY, w), 2).await;
        assert_eq!(plain.len(), 2, "{plain:?}");
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_lone_flush_waits_one_turn_and_then_writes() {
        let writes = Writes::default();
        let mut out = Coalesced::new(writes.clone());
        out.write_all(b"frame").await.expect("write");
        let mut polls = 0;
        std::future::poll_fn(|cx| {
            polls += 1;
            Pin::new(&mut out).poll_flush(cx)
        })
        .await
        .expect("flush");
        assert_eq!(polls, 2, "deferred once, then written");
        assert_eq!(
            writes.0.lock().expect("lock").as_slice(),
            [b"frame".to_vec()]
        );
        // Nothing buffered: a flush is immediate.
        std::future::poll_fn(|cx| {
            polls += 1;
            Pin::new(&mut out).poll_flush(cx)
        })
        .await
        .expect("flush");
        assert_eq!(polls, 3);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn shutdown_writes_what_is_buffered_at_once() {
        let writes = Writes::default();
        let mut out = Coalesced::new(writes.clone());
        out.write_all(b"last").await.expect("write");
        out.shutdown().await.expect("shutdown");
        assert_eq!(
            writes.0.lock().expect("lock").as_slice(),
            [b"last".to_vec()]
        );
    }
}
