//! What goes upstream carries the values the agent never held.
//!
//! * `inject`: what a rule's `inject` entries set (headers, query parameters), and
//!   placeholders swapped in the head (credential headers, the path, the query);
//! * `swap`: placeholders swapped in content (a body as it streams, a WebSocket message),
//!   encoded for the content's type;
//! * `sigv4`: AWS Signature V4 made again with keys the agent never holds; `aws_chunked`: a
//!   body signed chunk by chunk, signed again as it streams;
//! * `websocket`: a WebSocket relayed message by message, swapped and guarded each way.

pub(crate) mod aws_chunked;
pub(crate) mod inject;
pub(crate) mod sigv4;
pub(crate) mod swap;
pub(crate) mod websocket;
