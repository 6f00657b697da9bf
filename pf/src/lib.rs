//! Redirect backends and original-destination lookup for AgenShield.
//!
//! This is the only crate that talks to the operating system's packet filter. The proxy sees
//! it through [`OrigDst`]: given an accepted socket, where was the client really going?
//! Tests swap in [`FixedOrigDst`] so the whole proxy runs on loopback without a firewall.

mod origdst;

pub use origdst::{platform_orig_dst, FixedOrigDst, OrigDst, OrigDstError};
