//! The one-shot commands of the `agenshield` binary beside `proxy run`: `ctl`, `install` /
//! `uninstall`, `firewall`, `exec`, `doctor`, and the CA trust variables they share.

mod ca_file;
pub mod check;
pub mod ctl;
pub mod docs;
pub mod doctor;
pub mod exec;
pub mod firewall;
pub mod install;
pub mod invocation;
pub mod policy_bundle;
pub mod trust;
