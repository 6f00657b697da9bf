//! Classifying a new connection by its first bytes: a TLS ClientHello, plain HTTP/1.x (or
//! HTTP/2 prior knowledge), or something else. Decided by real parsers, never by guessing:
//! TLS by its record type, HTTP by httparse accepting a complete request line.

use std::time::Duration;

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncReadExt};

/// What a connection turned out to speak, by its first bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    Tls,
    Http,
    Other,
}

#[derive(Debug, thiserror::Error)]
pub(super) enum ClassifyError {
    #[error("client sent {} bytes and then nothing for {after:?}", got.len())]
    Timeout { got: BytesMut, after: Duration },
    #[error("client closed after {got} bytes, before it could be classified")]
    Closed { got: usize },
    #[error("reading the first bytes: {0}")]
    Io(#[from] std::io::Error),
}

const TLS_HANDSHAKE_RECORD: u8 = 0x16;
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Reads until the protocol is known; returns it with every byte read so far.
pub(super) async fn classify<S: AsyncRead + Unpin>(
    stream: &mut S,
    timeout: Duration,
    max_bytes: usize,
) -> Result<(Kind, BytesMut), ClassifyError> {
    let mut buf = BytesMut::with_capacity(1024);
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(p) = judge(&buf, max_bytes) {
            return Ok((p, buf));
        }
        let read = tokio::time::timeout_at(deadline, stream.read_buf(&mut buf)).await;
        match read {
            Err(_) => {
                return Err(ClassifyError::Timeout {
                    got: buf,
                    after: timeout,
                })
            }
            Ok(Ok(0)) => return Err(ClassifyError::Closed { got: buf.len() }),
            Ok(Ok(_)) => {}
            Ok(Err(e)) => return Err(e.into()),
        }
    }
}

/// `None` while more bytes are needed to decide.
pub(super) fn judge(buf: &[u8], max_bytes: usize) -> Option<Kind> {
    let first = *buf.first()?;
    if first == TLS_HANDSHAKE_RECORD {
        return Some(Kind::Tls);
    }
    if buf.len() < H2_PREFACE.len() && H2_PREFACE.starts_with(buf) {
        return None;
    }
    if buf.starts_with(H2_PREFACE) {
        return Some(Kind::Http);
    }
    // No room for headers: a complete request line is HTTP, whatever follows it. A bad
    // header must get hyper's 400, not turn the connection into an opaque tunnel.
    let mut headers = [httparse::EMPTY_HEADER; 0];
    let mut req = httparse::Request::new(&mut headers);
    match req.parse(buf) {
        Ok(httparse::Status::Complete(_)) => Some(Kind::Http),
        Ok(httparse::Status::Partial) if req.version.is_some() => Some(Kind::Http),
        Ok(httparse::Status::Partial) if buf.len() >= max_bytes => Some(Kind::Other),
        Ok(httparse::Status::Partial) => None,
        Err(httparse::Error::TooManyHeaders) => Some(Kind::Http),
        Err(_) => Some(Kind::Other),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAX: usize = 8192;

    #[test]
    fn tls_record_is_tls() {
        assert_eq!(judge(&[0x16], MAX), Some(Kind::Tls));
        assert_eq!(judge(&[0x16, 0x03, 0x01, 0x02, 0x00], MAX), Some(Kind::Tls));
    }

    #[test]
    fn http_needs_a_whole_request_line() {
        assert_eq!(judge(b"GE", MAX), None);
        assert_eq!(judge(b"GET /x HTT", MAX), None);
        assert_eq!(judge(b"GET /x HTTP/1.1\r\n", MAX), Some(Kind::Http));
        assert_eq!(
            judge(b"POST /x HTTP/1.0\r\nHost: a\r\n\r\n", MAX),
            Some(Kind::Http)
        );
    }

    #[test]
    fn a_bad_header_after_a_good_request_line_is_still_http() {
        assert_eq!(
            judge(
                b"GET /admin HTTP/1.1\r\nHost: x\r\nBad Name: 1\r\n\r\n",
                MAX
            ),
            Some(Kind::Http)
        );
    }

    #[test]
    fn h2_prior_knowledge_is_http() {
        assert_eq!(judge(&H2_PREFACE[..10], MAX), None);
        assert_eq!(judge(H2_PREFACE, MAX), Some(Kind::Http));
    }

    #[test]
    fn other_protocols_are_other() {
        assert_eq!(judge(b"SSH-2.0-OpenSSH_9.6\r\n", MAX), Some(Kind::Other));
        assert_eq!(judge(&[0, 1, 2, 3], MAX), Some(Kind::Other));
        assert_eq!(judge(b"\x05\x01\x00", MAX), Some(Kind::Other));
        let endless_token = vec![b'A'; MAX];
        assert_eq!(judge(&endless_token, MAX), Some(Kind::Other));
    }

    #[tokio::test]
    async fn silent_client_times_out() {
        let (mut a, _b) = tokio::io::duplex(64);
        let err = classify(&mut a, Duration::from_millis(30), MAX)
            .await
            .expect_err("must time out");
        assert!(matches!(err, ClassifyError::Timeout { ref got, .. } if got.is_empty()));
    }

    #[tokio::test]
    async fn bytes_read_are_returned() {
        use tokio::io::AsyncWriteExt;
        let (mut a, mut b) = tokio::io::duplex(64);
        b.write_all(b"GET / HTTP/1.1\r\nHo").await.expect("write");
        let (p, buf) = classify(&mut a, Duration::from_secs(1), MAX)
            .await
            .expect("classified");
        assert_eq!(p, Kind::Http);
        assert_eq!(&buf[..], b"GET / HTTP/1.1\r\nHo");
    }
}
