//! The `agenshield` command line (crate `agenshield_cli`, package `agenshield-proxy`): its
//! arguments (`cli`) and the one-shot commands (`cmd`: `ctl`, `install`, `firewall`, `exec`,
//! `doctor`, `trust`, `check`), over the public surface of the daemon library (package
//! `agenshield-daemon`, crate `agenshield_proxy`). `main.rs` dispatches; `proxy run` is the
//! library's `daemon`.

#![warn(unreachable_pub)]

pub mod cli;
pub mod cmd;
