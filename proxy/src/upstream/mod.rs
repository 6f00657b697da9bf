//! Everything that faces upstreams: `resolve` (our resolver), `guard` (the private-address
//! guard), `dial` (connect to exactly an address that passed), `trust` (verified rustls),
//! `client` (the pooled hyper clients that forward requests) and `relay` (tunnels).

pub mod client;
pub mod dial;
pub mod guard;
pub mod relay;
pub mod resolve;
pub mod trust;
