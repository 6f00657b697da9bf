//! `[policy.source]`: the policy pulled as a signed bundle from an HTTPS server or a mounted
//! volume, so a fleet shares one central policy while every decision stays local.
//!
//! The path of a bundle, every step refusing what it cannot vouch for (and the policy in
//! force staying): `fetch.rs` (conditional GET, capped, with a deadline) →
//! `signature.rs` (minisign, before any byte is parsed) → `bundle.rs` (gzip tar in memory:
//! plain paths, regular files, policy files and `manifest.toml` only) → the rollback check
//! (`sync.rs`: never an older revision, nor the same revision with other bytes) →
//! `control::reload::apply` (the one reload path: recorded, counted, open tunnels decided
//! again) → `cache.rs` (the verified bytes kept for the next start, verified again then).
//! Every bundle applied or refused is one `policy` audit record; the sync runs in its own
//! task on its own clock, so no request ever waits for the source.
//!
//! Why pull and sign rather than push: the daemon opens no port for the centre, a stolen
//! server can serve only what the offline key signed, and a mounted volume works the same.

pub mod bundle;
mod cache;
mod fetch;
pub mod manifest;
mod metrics;
mod signature;
mod sync;

pub use bundle::{Bundle, BundleError};
pub use manifest::{Manifest, ManifestError, MANIFEST};
pub use signature::{BundleKey, SignatureError};
pub(crate) use sync::{spawn, PolicySource, SourceStart};
