//! The one body type every response the proxy produces is converted into.

use bytes::Bytes;
use http_body_util::{combinators::BoxBody, BodyExt, Full};

pub type BodyError = Box<dyn std::error::Error + Send + Sync>;
pub type ProxyBody = BoxBody<Bytes, BodyError>;

pub fn full(bytes: Bytes) -> ProxyBody {
    Full::new(bytes).map_err(|never| match never {}).boxed()
}

pub fn empty() -> ProxyBody {
    full(Bytes::new())
}

/// Wraps any streaming body (an upstream response, a client request) without buffering it.
pub fn stream<B>(body: B) -> ProxyBody
where
    B: http_body::Body<Data = Bytes> + Send + Sync + 'static,
    B::Error: Into<BodyError>,
{
    body.map_err(Into::into).boxed()
}
