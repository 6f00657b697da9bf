//! AgenShield's egress proxy: the daemon library behind the `agenshield` binary (whose
//! commands, `ctl`, `install`, `firewall`, `exec`, `doctor` and `trust`, are the
//! `agenshield-proxy` package in `proxy/`, over this library's public surface).
//!
//! In the order a connection meets them:
//! - `conn`: accept a connection (original destination, peer uid), classify it, intercept
//!   TLS, serve HTTP, or relay raw TCP;
//! - `pipeline`: one request through its phases: target → decide → secrets → limit →
//!   forward → record (+ the refusal the agent sees);
//! - `dns`: the agent's DNS stub (names decided by policy, synthetic answers);
//! - `upstream`: resolve, guard, dial, verified TLS, pooled clients, relays;
//! - beneath the data path, the state it shares: `admission` (who may use which listener,
//!   connections per agent), `server_tls` (the intercepting side's rustls set-up) and
//!   `dns_state` (the names and synthetic addresses the DNS stub gave each agent);
//! - the engines, with no I/O of their own: `policy`, `secrets`, `ratelimit`, `audit`;
//! - `proxy`: the state the data path shares; beneath it `metrics` (each area's Prometheus
//!   families), `events` (the decision feed), `approvals`, `tunnels`;
//! - `control`: admin API, policy reload and watcher, the metrics listener;
//! - `daemon`: `proxy run`, the privilege split, the firewall glue;
//! - `logging`, `log_filter`: the process's log output;
//! - beneath them all, importing nothing else from the crate: `record` (the vocabulary every
//!   layer speaks: the record of a decision, its verdicts and error codes, the log line) and
//!   `runtime` (the shards connections are served on, memory back to the OS after a burst).

#![warn(unreachable_pub)]

// Public: what `main.rs`, the command-line crate (`proxy/`), the integration tests and the
// benches use.
pub mod audit;
pub mod config;
pub mod control;
pub mod daemon;
pub mod error_chain;
pub mod log_filter;
pub mod logging;
pub mod policy;
pub mod record;
pub mod runtime;
pub mod secrets;
pub mod upstream;

mod admission;
mod approvals;
mod body;
mod budget;
mod clock;
mod conn;
// The engine of issue 37 (credentials that may only go home); the pipeline does not call it yet.
#[allow(dead_code)]
mod dlp;
mod dns;
mod dns_state;
mod events;
mod flush_coalesce;
mod mcp;
mod metrics;
mod pipeline;
mod proxy;
mod ratelimit;
mod read_side;
mod server_tls;
mod toml_errors;
mod tunnels;
