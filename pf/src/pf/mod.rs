//! The macOS backend: pf.
//!
//! - [`anchor`]: the anchor `com.apple/agenshield` rendered by a pure function, and the
//!   comparison of what `pfctl` lists with it (both golden- and unit-tested on Linux).
//! - [`natlook`]: `DIOCNATLOOK` on `/dev/pf`, the original destination of a redirected
//!   connection: `#[repr(C)]` structures (layout-tested on Linux) and, on macOS, the ioctl.
//! - [`token`]: pf's enable reference (`pfctl -E` / `pfctl -X`) kept on disk.
//! - `backend` (macOS only): [`PfRedirector`], the [`crate::Redirector`] that loads the
//!   anchor with `pfctl -a com.apple/agenshield -f -` (the `pfctl` crate has no tables, no
//!   `self`, no `no rdr`), and uses the `pfctl` crate for what it covers: pf's status,
//!   the main ruleset's anchor hooks, flushing the anchor's rules.

pub mod anchor;
#[allow(unsafe_code)]
pub mod natlook;
pub mod token;

#[cfg(target_os = "macos")]
mod backend;

#[cfg(target_os = "macos")]
pub use backend::PfRedirector;
#[cfg(target_os = "macos")]
pub use natlook::PfNatlook;

pub use crate::command::{run, Output};
