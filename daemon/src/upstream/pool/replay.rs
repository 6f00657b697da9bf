//! Keeping a small request whole so it can be sent again.

use bytes::Bytes;
use http::Request;
use http_body::{Body, Frame};
use http_body_util::BodyExt;

use crate::body::{BodyError, ProxyBody};

/// Request bodies up to this size (known in advance) are kept until the response head, so a
/// request the upstream refused unprocessed can be sent again.
pub(super) const REPLAY_LIMIT: u64 = 64 * 1024;

/// The parts of a request kept to send it again, with its whole (small) body.
pub(super) struct Replay {
    method: http::Method,
    uri: http::Uri,
    version: http::Version,
    headers: http::HeaderMap,
    body: Bytes,
}

impl Replay {
    /// The request again, as many times as it is sent (the body is shared, not copied).
    pub(super) fn request(&self) -> Request<ProxyBody> {
        let mut req = Request::new(crate::body::full(self.body.clone()));
        *req.method_mut() = self.method.clone();
        *req.uri_mut() = self.uri.clone();
        *req.version_mut() = self.version;
        *req.headers_mut() = self.headers.clone();
        req
    }
}

/// Reads a small body (its length known and at most [`REPLAY_LIMIT`]) whole, so the request
/// can be sent again; larger, unknown or upgrading requests stream as they are.
pub(super) async fn replayable(
    req: Request<ProxyBody>,
    upgrade: bool,
) -> (Request<ProxyBody>, Option<Replay>) {
    let hint = req.body().size_hint();
    let small = hint.upper() == Some(hint.lower()) && hint.lower() <= REPLAY_LIMIT;
    if upgrade || !small {
        return (req, None);
    }
    let (parts, body) = req.into_parts();
    let bytes = match body.collect().await {
        Ok(c) => c.to_bytes(),
        // The body failed (the leak guard refused it, say): let the send report it.
        Err(e) => {
            let failed = http_body_util::StreamBody::new(futures_util::stream::once(async move {
                Err::<Frame<Bytes>, BodyError>(e)
            }));
            return (Request::from_parts(parts, failed.boxed()), None);
        }
    };
    let replay = Replay {
        method: parts.method.clone(),
        uri: parts.uri.clone(),
        version: parts.version,
        headers: parts.headers.clone(),
        body: bytes.clone(),
    };
    (
        Request::from_parts(parts, crate::body::full(bytes)),
        Some(replay),
    )
}
