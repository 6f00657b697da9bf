//! One client connection, from accept to the protocol that serves it:
//!
//! - `accept`: the listeners' accept loops, the original destination, the peer uid, one
//!   tracing span per connection, and admission: `identity` (who may use which listener),
//!   `budget` (connections per agent); `ctx` holds what is known of the connection.
//! - `dispatch`: `classify` reads the first bytes (ClientHello, HTTP, or other; `prefixed`
//!   replays them to whoever serves the connection), then hands it to `intercept` (TLS with a
//!   minted leaf: `server_tls`, resumption in `tls_sessions`), `passthrough` (TLS spliced
//!   untouched where a rule says so) or `opaque` (raw TCP).
//! - `http`: hyper's server into the request pipeline, with `watchdog` (idle and slow-head
//!   limits) and `h2_own_431` (the 431s h2 sends by itself, recorded).
//! - `explicit`: the CONNECT / absolute-URI listener.

pub(crate) mod accept;
mod budget;
mod classify;
mod ctx;
mod dispatch;
mod explicit;
pub(crate) mod h2_own_431;
mod http;
pub(crate) mod identity;
mod intercept;
mod opaque;
mod passthrough;
mod prefixed;
pub(crate) mod server_tls;
mod tls_sessions;
mod watchdog;

pub(crate) use budget::Budgets;
pub(crate) use ctx::{ConnCtx, Dest, DestHost, TlsSide};
