//! One client connection, from accept to the protocol that serves it:
//!
//! - `accept`: the listeners' accept loops, the original destination, the peer uid
//!   (`redirected_uid` for redirected connections, also when NAT moved the source port), one
//!   tracing span per connection, and admission (`crate::admission`: who may use which
//!   listener, connections per agent); what is known of the connection is a
//!   `record::ConnCtx`.
//! - `dispatch`: `classify` reads the first bytes (ClientHello, HTTP, or other;
//!   `crate::read_side` replays them to whoever serves the connection), then hands it to `intercept` (TLS with a
//!   minted leaf: `crate::server_tls`), `passthrough` (TLS spliced
//!   untouched where a rule says so) or `opaque` (raw TCP).
//! - `http`: hyper's server into the request pipeline, with `watchdog` (idle and slow-head
//!   limits) and `h2_own_431` (the 431s h2 sends by itself, recorded).
//! - `explicit`: the CONNECT / absolute-URI listener, on `http`'s server set-up.
//!
//! Every tunnel a decision here allows (raw TCP, passthrough) runs on `pipeline::tunnel`, as
//! an upgraded request's does; every record is built from the connection's
//! `record::RecordBase`.

pub(crate) mod accept;
mod classify;
mod dispatch;
mod explicit;
pub(crate) mod h2_own_431;
mod http;
mod intercept;
mod opaque;
mod passthrough;
pub(crate) mod redirected_uid;
mod watchdog;

pub(crate) use crate::record::{ConnCtx, Dest, DestHost, TlsSide};
