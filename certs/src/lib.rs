//! AgenShield's local certificate authority.
//!
//! The proxy terminates TLS from agents with leaf certificates minted on the fly:
//! - [`Ca`] loads or creates the on-disk CA (`ca.pem` + `ca-key.pem`, key mode 0600).
//! - [`LeafName`] is a validated, normalized server name (DNS name or IP literal).
//! - [`LeafCache`] mints leaves signed by the CA, single-flight, and caches them
//!   as ready-to-use [`rustls::sign::CertifiedKey`]s.
//!
//! Everything uses ECDSA P-256 and the *ring* crypto provider.

mod ca;
mod cache;
mod error;
mod inspect;
mod leaf;

pub use ca::{Ca, CaOrigin};
pub use cache::{LeafCache, LeafConfig};
pub use error::CaError;
pub use inspect::{inspect, CertFacts, Expiry};
pub use leaf::LeafName;
