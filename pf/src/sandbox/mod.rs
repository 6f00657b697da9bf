//! OS sandboxes for agent processes: Landlock on Linux, Seatbelt profiles on macOS.
//!
//! The Seatbelt renderers are pure functions, compiled everywhere so their golden files are
//! checked on Linux too; the Landlock code exists on Linux only.

#[cfg(target_os = "linux")]
pub mod landlock;
pub mod seatbelt;
#[cfg(all(
    target_os = "linux",
    any(target_arch = "x86_64", target_arch = "aarch64")
))]
pub mod seccomp;
