//! One client connection, from accept to the protocol that serves it:
//! `accept` (original destination, peer uid, one tracing span; `identity`: who may use
//! which listener) → `dispatch` (classify the
//! first bytes) → `intercept` (TLS with a minted leaf, `server_tls`) → `http` (hyper) into the
//! request pipeline; or `opaque` (raw TCP); `explicit` is the CONNECT / absolute-URI listener.

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
