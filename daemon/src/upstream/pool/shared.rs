//! An HTTP/2 connection shared by concurrent requests, and the streams it lends them. A
//! connection that has received a `GOAWAY` (or failed) lends no further stream.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;

pub(super) struct Shared {
    pub(super) id: u64,
    send: h2::client::SendRequest<Bytes>,
    /// Its streams whose response bodies have not ended.
    pub(super) active: Arc<AtomicUsize>,
    addr: SocketAddr,
    last_used: Instant,
}

impl Shared {
    pub(super) fn new(id: u64, send: h2::client::SendRequest<Bytes>, addr: SocketAddr) -> Shared {
        Shared {
            id,
            send,
            active: Arc::new(AtomicUsize::new(0)),
            addr,
            last_used: Instant::now(),
        }
    }

    /// Whether it can open streams: not going away (no `GOAWAY` received), not closed. h2
    /// refuses new streams from the moment it reads the upstream's `GOAWAY`; a `GOAWAY` still
    /// on its way cannot be known, and the streams opened meanwhile are sent again
    /// (`h2_client::Unprocessed::AboveGoAway`).
    pub(super) fn usable(&mut self) -> bool {
        let mut cx = Context::from_waker(std::task::Waker::noop());
        // The pool's own handle never has a stream waiting to open, so this only asks whether
        // the connection has failed or been told to go away.
        !matches!(self.send.poll_ready(&mut cx), Poll::Ready(Err(_)))
    }

    pub(super) fn idle_for(&self, now: Instant) -> Option<Duration> {
        (self.active.load(Ordering::Relaxed) == 0).then(|| now.duration_since(self.last_used))
    }

    pub(super) fn stream(&mut self, now: Instant) -> Stream {
        self.active.fetch_add(1, Ordering::Relaxed);
        self.last_used = now;
        Stream {
            id: self.id,
            send: self.send.clone(),
            in_flight: InFlight(self.active.clone()),
            addr: self.addr,
        }
    }
}

/// A stream of a shared connection.
pub(super) struct Stream {
    /// Which connection: the one to forget if it fails.
    pub(super) id: u64,
    pub(super) send: h2::client::SendRequest<Bytes>,
    pub(super) in_flight: InFlight,
    pub(super) addr: SocketAddr,
}

/// One stream of a shared connection, counted until its response body ends.
pub(super) struct InFlight(Arc<AtomicUsize>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The upstream starts a graceful shutdown (`GOAWAY`) while a stream is under way: the
    /// connection stays open for that stream, but the pool no longer counts it usable, so no
    /// request is given a stream there.
    #[tokio::test]
    async fn a_connection_that_received_goaway_is_not_usable() {
        let (client_io, server_io) = tokio::io::duplex(64 * 1024);
        let (go_away, told) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(async move {
            let mut conn = h2::server::handshake(server_io)
                .await
                .expect("server handshake");
            // Hold the first stream unanswered, then go away.
            let held = conn.accept().await;
            let _ = told.await;
            conn.graceful_shutdown();
            while conn.accept().await.is_some() {}
            drop(held);
        });
        let (send, conn) = h2::client::handshake(client_io)
            .await
            .expect("client handshake");
        tokio::spawn(async move {
            let _ = conn.await;
        });
        let mut shared = Shared::new(0, send.clone(), "127.0.0.1:443".parse().expect("addr"));
        let mut ready = send.ready().await.expect("ready");
        let req = http::Request::get("https://api.test/")
            .body(())
            .expect("req");
        let (_response, _stream) = ready.send_request(req, true).expect("stream");
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(shared.usable(), "a working connection is usable");
        go_away.send(()).expect("server");
        let deadline = Instant::now() + Duration::from_secs(5);
        while shared.usable() {
            assert!(Instant::now() < deadline, "GOAWAY never noticed");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}
