//! Everything that faces upstreams: `target` (where a request goes), `resolve` (our resolver), `guard` (the private-address
//! guard, with `local_addrs`: this host's own), `dial` (connect to exactly an address that passed, or through the operator's proxy:
//! `proxy_connect`, giving a `connection`), `trust` (verified rustls), `pool` (upstream
//! connections kept and shared, HTTP/2 spread over several), `client` (forwarding a request
//! through the pool, its failures an `error::UpstreamError`) and `relay` (tunnels).

pub(crate) mod client;
pub(crate) mod connection;
pub(crate) mod dial;
pub(crate) mod error;
pub mod guard;
mod local_addrs;
pub(crate) mod pool;
pub(crate) mod proxy_connect;
pub(crate) mod relay;
pub mod resolve;
pub(crate) mod target;
pub mod trust;
