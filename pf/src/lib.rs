//! Redirect backends and original-destination lookup for AgenShield.
//!
//! This is the only crate that talks to the operating system's packet filter and socket
//! tables. The proxy sees it through a few seams: [`OrigDst`] (given an accepted socket, where
//! was the client really going?), [`Redirector`] (put the agent users' traffic into the proxy,
//! or take it out), [`peer_uid::socket_uid`] (which local user opened a connection), the
//! sandboxes, the privilege split, [`run_as`] (a command run as another user) and
//! [`allocator`] (free memory back to the OS).
//! Tests swap in [`FixedOrigDst`] so the whole proxy runs on loopback without a firewall.

pub mod allocator;
mod command;
pub mod conntrack;
pub mod nft;
mod origdst;
pub mod peer_uid;
pub mod pf;
pub mod privsep;
mod redirect;
pub mod run_as;
pub mod sandbox;
#[cfg(target_os = "linux")]
pub mod socket_acl;

pub use conntrack::OrigTuple;
pub use origdst::{platform_orig_dst, FixedOrigDst, OrigDst, OrigDstError};
#[cfg(target_os = "macos")]
pub use pf::{PfNatlook, PfRedirector};
pub use redirect::{
    platform_redirector, FirewallState, FirewallStatus, RedirectError, RedirectSpec, Redirector,
};
