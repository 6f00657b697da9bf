//! One request on a shared HTTP/2 connection, on the `h2` crate directly (as pingora does).
//!
//! hyper's HTTP/2 client hides what a retry must know: when a `GOAWAY` arrives it can fail a
//! request whose stream it had already handed to h2 (whose HEADERS still go out, so the
//! upstream may process it) with the same error as a stream the upstream never saw. Here
//! every step is ours: a stream h2 would not open comes back whole, and a stream's failure is
//! classified by h2's own error, which carries the protocol's facts (RFC 9113 §8.7): the
//! peer's `REFUSED_STREAM`, or the peer's `GOAWAY` whose last stream id is below the stream's.
//! h2 gives a stream the peer's `GOAWAY` error only then (`Streams::recv_go_away`); a stream at
//! or below that id, which the upstream may have processed, fails with an I/O error when the
//! connection then ends, however soon after the `GOAWAY` that is (pinned by the tests below).

use std::future::poll_fn;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{header, HeaderValue, Method, Request, Response};
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;

use crate::body::{BodyError, ProxyBody};

/// How a request on a shared connection failed.
pub(super) enum StreamFailure {
    /// The connection would not open a stream (it is going away or gone): nothing was sent and
    /// the request comes back whole.
    NotOpened(Box<Request<ProxyBody>>, h2::Error),
    /// The upstream provably did not process the stream, for this reason.
    Unprocessed(Unprocessed, h2::StreamId, h2::Error),
    /// Anything else: the upstream may have processed it.
    Failed(h2::StreamId, h2::Error),
}

/// Why the upstream provably did not process a stream it was sent: what the protocol says
/// makes a request safe to send again (RFC 9113 §8.7), whatever its method.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Unprocessed {
    /// The upstream reset it with `REFUSED_STREAM`.
    RefusedStream,
    /// The upstream's `GOAWAY` named a last stream id below it.
    AboveGoAway,
}

/// Sends `req` on `send`; the response body streams from the upstream, giving flow-control
/// credit back as the agent reads it.
pub(super) async fn send(
    send: &h2::client::SendRequest<Bytes>,
    req: Request<ProxyBody>,
) -> Result<Response<RecvBody>, StreamFailure> {
    let mut send = match send.clone().ready().await {
        Ok(ready) => ready,
        Err(e) => return Err(StreamFailure::NotOpened(Box::new(req), e)),
    };
    let head = head_of(&req);
    let eos = req.body().is_end_stream();
    let (response, out) = match send.send_request(head, eos) {
        Ok(opened) => opened,
        Err(e) => return Err(StreamFailure::NotOpened(Box::new(req), e)),
    };
    let id = response.stream_id();
    if !eos {
        tokio::spawn(pump(req.into_body(), out));
    }
    match response.await {
        Ok(resp) => {
            let length = resp
                .headers()
                .get(header::CONTENT_LENGTH)
                .and_then(|v| v.to_str().ok()?.parse().ok());
            Ok(resp.map(|recv| RecvBody::new(recv, length)))
        }
        Err(e) => Err(match unprocessed(&e) {
            Some(why) => StreamFailure::Unprocessed(why, id, e),
            None => StreamFailure::Failed(id, e),
        }),
    }
}

/// The request's head as h2 sends it: method, absolute URI (`:scheme`, `:authority`,
/// `:path`) and headers (hop-by-hop ones were removed before), with `content-length` when
/// the body's size is known.
fn head_of(req: &Request<ProxyBody>) -> Request<()> {
    let mut head = Request::new(());
    *head.method_mut() = req.method().clone();
    *head.uri_mut() = req.uri().clone();
    *head.headers_mut() = req.headers().clone();
    if let Some(len) = req.body().size_hint().exact() {
        let has_payload = !matches!(
            *req.method(),
            Method::GET | Method::HEAD | Method::DELETE | Method::OPTIONS | Method::CONNECT
        );
        if len != 0 || has_payload {
            head.headers_mut()
                .entry(header::CONTENT_LENGTH)
                .or_insert_with(|| HeaderValue::from(len));
        }
    }
    head
}

/// Whether a stream's failure proves the upstream did not process it: the upstream refused it
/// (`REFUSED_STREAM`), or failed it with its `GOAWAY`, which h2 does only to the streams above
/// the frame's last stream id. Anything else (a reset with another code, our own `GOAWAY`, the
/// connection's end or an I/O error) may follow processing.
fn unprocessed(e: &h2::Error) -> Option<Unprocessed> {
    if !e.is_remote() {
        return None;
    }
    if e.is_reset() && e.reason() == Some(h2::Reason::REFUSED_STREAM) {
        Some(Unprocessed::RefusedStream)
    } else if e.is_go_away() {
        Some(Unprocessed::AboveGoAway)
    } else {
        None
    }
}

/// Streams the request body into the stream as the upstream grants window, then ends it (or
/// sends the trailers). A failing body resets the stream; a stream the upstream reset stops
/// the pump.
async fn pump(mut body: ProxyBody, mut out: h2::SendStream<Bytes>) {
    loop {
        let frame = tokio::select! {
            biased;
            _ = poll_fn(|cx| out.poll_reset(cx)) => return,
            frame = body.frame() => frame,
        };
        let frame = match frame {
            None => {
                let _ = out.send_data(Bytes::new(), true);
                return;
            }
            Some(Err(e)) => {
                tracing::debug!("request body failed; resetting the upstream stream: {e}");
                out.send_reset(h2::Reason::CANCEL);
                return;
            }
            Some(Ok(frame)) => frame,
        };
        match frame.into_data() {
            Ok(mut data) => {
                while !data.is_empty() {
                    out.reserve_capacity(data.len());
                    let granted = match poll_fn(|cx| out.poll_capacity(cx)).await {
                        Some(Ok(granted)) => granted,
                        // The stream was reset or the connection failed: the response says so.
                        _ => return,
                    };
                    if granted == 0 {
                        continue;
                    }
                    let chunk = data.split_to(granted.min(data.len()));
                    if out.send_data(chunk, false).is_err() {
                        return;
                    }
                }
            }
            Err(frame) => {
                if let Ok(trailers) = frame.into_trailers() {
                    let _ = out.send_trailers(trailers);
                    return;
                }
            }
        }
    }
}

/// A response body read from its stream; every chunk read gives its window back, so an agent
/// that stops reading holds this one stream's window and nothing more.
pub(super) struct RecvBody {
    recv: h2::RecvStream,
    data_done: bool,
    /// What `content-length` says is still to come (h2 holds the stream to it).
    remaining: Option<u64>,
}

impl RecvBody {
    fn new(recv: h2::RecvStream, length: Option<u64>) -> RecvBody {
        RecvBody {
            recv,
            data_done: false,
            remaining: length,
        }
    }
}

impl Body for RecvBody {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        if !self.data_done {
            match std::task::ready!(self.recv.poll_data(cx)) {
                Some(Ok(data)) => {
                    let _ = self.recv.flow_control().release_capacity(data.len());
                    if let Some(left) = self.remaining.as_mut() {
                        *left = left.saturating_sub(data.len() as u64);
                    }
                    return Poll::Ready(Some(Ok(Frame::data(data))));
                }
                Some(Err(e)) => return Poll::Ready(Some(Err(e.into()))),
                None => self.data_done = true,
            }
        }
        match std::task::ready!(self.recv.poll_trailers(cx)) {
            Ok(Some(trailers)) => Poll::Ready(Some(Ok(Frame::trailers(trailers)))),
            Ok(None) => Poll::Ready(None),
            Err(e) => Poll::Ready(Some(Err(e.into()))),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.recv.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        match (self.remaining, self.data_done) {
            (_, true) => SizeHint::with_exact(0),
            (Some(left), false) => SizeHint::with_exact(left),
            (None, false) => SizeHint::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An HTTP/2 upstream over an in-memory pipe that refuses the first stream
    /// (`REFUSED_STREAM`), fails the second (`INTERNAL_ERROR`) and answers the rest.
    async fn upstream() -> h2::client::SendRequest<Bytes> {
        let (client_io, server_io) = tokio::io::duplex(64 * 1024);
        tokio::spawn(async move {
            let mut conn = h2::server::handshake(server_io)
                .await
                .expect("server handshake");
            let mut n = 0;
            while let Some(Ok((_req, mut respond))) = conn.accept().await {
                n += 1;
                match n {
                    1 => respond.send_reset(h2::Reason::REFUSED_STREAM),
                    2 => respond.send_reset(h2::Reason::INTERNAL_ERROR),
                    _ => {
                        let resp = Response::builder().status(200).body(()).expect("resp");
                        let _ = respond.send_response(resp, true);
                    }
                }
            }
        });
        let (send, conn) = h2::client::handshake(client_io)
            .await
            .expect("client handshake");
        tokio::spawn(async move {
            let _ = conn.await;
        });
        send
    }

    fn get() -> Request<ProxyBody> {
        Request::get("https://api.test/x")
            .body(crate::body::empty())
            .expect("request")
    }

    /// What a retry rests on: only a stream the upstream provably did not process is
    /// `Unprocessed` (sent again by the pool); any other reset may have been processed.
    #[tokio::test]
    async fn a_refused_stream_is_told_apart_from_a_failed_one() {
        let send = upstream().await;
        assert!(matches!(
            super::send(&send, get()).await,
            Err(StreamFailure::Unprocessed(Unprocessed::RefusedStream, _, _))
        ));
        assert!(matches!(
            super::send(&send, get()).await,
            Err(StreamFailure::Failed(..))
        ));
        match super::send(&send, get()).await {
            Ok(resp) => assert_eq!(resp.status(), 200),
            Err(_) => panic!("the third stream is answered"),
        }
    }

    /// An upstream that reads the HEADERS of streams 1 and 3, then writes
    /// `GOAWAY(NO_ERROR, last_stream_id = 1)` and closes, in one write: what nginx does when
    /// its `keepalive_requests` ends a connection that had one stream under way and one it
    /// will not process. (Raw frames: no server library closes at exactly that point.)
    async fn going_away_after_stream_1(server: tokio::io::DuplexStream) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut server = server;
        // Our SETTINGS (empty), as the server's connection preface.
        server
            .write_all(&[0, 0, 0, 4, 0, 0, 0, 0, 0])
            .await
            .expect("settings");
        let mut preface = [0u8; 24];
        server.read_exact(&mut preface).await.expect("preface");
        let mut headers = 0;
        while headers < 2 {
            let mut head = [0u8; 9];
            server.read_exact(&mut head).await.expect("frame head");
            let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
            let mut payload = vec![0u8; len];
            server
                .read_exact(&mut payload)
                .await
                .expect("frame payload");
            if head[3] == 0x1 {
                headers += 1;
            }
        }
        let mut bye = vec![0, 0, 0, 4, 1, 0, 0, 0, 0]; // SETTINGS ACK
        bye.extend_from_slice(&[0, 0, 8, 7, 0, 0, 0, 0, 0]); // GOAWAY on stream 0
        bye.extend_from_slice(&1u32.to_be_bytes()); // last stream id
        bye.extend_from_slice(&0u32.to_be_bytes()); // NO_ERROR
        server.write_all(&bye).await.expect("goaway");
        server.shutdown().await.expect("close");
    }

    /// The protocol fact the classification rests on, as h2 reports it: a stream above the
    /// `GOAWAY`'s last stream id fails with the upstream's `GOAWAY` (not processed, sent again);
    /// one at or below it, cut by the connection's end that came in the same read, fails with
    /// an I/O error (may have been processed, never sent again).
    #[tokio::test]
    async fn only_the_stream_above_the_goaway_is_unprocessed() {
        let (client_io, server_io) = tokio::io::duplex(64 * 1024);
        tokio::spawn(going_away_after_stream_1(server_io));
        let (send, conn) = h2::client::handshake(client_io)
            .await
            .expect("client handshake");
        tokio::spawn(async move {
            let _ = conn.await;
        });
        let (first, second) = tokio::join!(super::send(&send, get()), super::send(&send, get()));
        match first {
            Err(StreamFailure::Failed(id, e)) => {
                assert_eq!(u32::from(id), 1);
                assert!(e.is_io(), "{e:?}");
            }
            _ => panic!("stream 1 (at the last stream id) is not sent again"),
        }
        match second {
            Err(StreamFailure::Unprocessed(Unprocessed::AboveGoAway, id, e)) => {
                assert_eq!(u32::from(id), 3);
                assert_eq!(e.reason(), Some(h2::Reason::NO_ERROR));
            }
            _ => panic!("stream 3 (above the last stream id) is unprocessed"),
        }
        // The connection takes no further stream, and says so before sending anything.
        assert!(matches!(
            super::send(&send, get()).await,
            Err(StreamFailure::NotOpened(..))
        ));
    }
}
