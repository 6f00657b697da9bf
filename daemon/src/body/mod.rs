//! The one body type every response and request the proxy handles is converted into, and the
//! wrappers around it: `counted` (bytes up), `ready` (a response body already all here),
//! `joined` (an upstream body's small chunks that are already here, joined).

pub(crate) mod counted;
pub(crate) mod joined;
pub(crate) mod ready;

use bytes::Bytes;
use http_body_util::{combinators::BoxBody, BodyExt, Full};

pub(crate) type BodyError = Box<dyn std::error::Error + Send + Sync>;
pub(crate) type ProxyBody = BoxBody<Bytes, BodyError>;

pub(crate) fn full(bytes: Bytes) -> ProxyBody {
    Full::new(bytes).map_err(|never| match never {}).boxed()
}

/// `inner`'s size hint with `more` bytes in front of it (frames a wrapper already holds).
pub(crate) fn hint_plus(inner: http_body::SizeHint, more: u64) -> http_body::SizeHint {
    let mut hint = http_body::SizeHint::new();
    hint.set_lower(inner.lower() + more);
    if let Some(upper) = inner.upper() {
        hint.set_upper(upper + more);
    }
    hint
}

pub(crate) fn empty() -> ProxyBody {
    full(Bytes::new())
}

/// Wraps any streaming body (an upstream response, a client request) without buffering it.
pub(crate) fn stream<B>(body: B) -> ProxyBody
where
    B: http_body::Body<Data = Bytes> + Send + Sync + 'static,
    B::Error: Into<BodyError>,
{
    body.map_err(Into::into).boxed()
}

/// `body`, keeping `guard` alive until the body is finished or dropped (an in-flight slot,
/// say, that must cover the whole response, not just its headers).
pub(crate) fn guarded<G: Send + Sync + Unpin + 'static>(body: ProxyBody, guard: G) -> ProxyBody {
    Guarded {
        body,
        _guard: guard,
    }
    .boxed()
}

struct Guarded<G> {
    body: ProxyBody,
    _guard: G,
}

impl<G: Unpin> http_body::Body for Guarded<G> {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, BodyError>>> {
        std::pin::Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}
