//! Everything that faces upstreams: `resolve` (our resolver), `guard` (the private-address
//! guard), `dial` (connect to exactly an address that passed), `trust` (verified rustls),
//! `client` (the pooled hyper clients that forward requests) and `relay` (tunnels).

pub(crate) mod client;
pub(crate) mod dial;
pub(crate) mod guard;
pub(crate) mod relay;
pub(crate) mod resolve;
pub(crate) mod trust;
