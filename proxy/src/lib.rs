//! AgenShield's egress proxy: the daemon library behind the `agenshield` binary.
//!
//! A connection's path: `listen` (accept, original destination) → `connection` (classify the
//! first bytes) → `intercept` (TLS with a minted leaf) or plain HTTP → `serve` (hyper) →
//! `pipeline` (target → policy → forward) → `forward` (pooled, verified upstream client).
//! Non-HTTP streams go to `tunnel`, decided on their destination alone.

pub mod admin;
pub mod approvals;
pub mod audit;
pub mod body;
pub mod check;
pub mod classify;
pub mod cli;
pub mod config;
pub mod conn;
pub mod connection;
pub mod ctl;
pub mod daemon;
pub mod deny;
pub mod dial;
pub mod events;
pub mod exec;
pub mod explicit;
pub mod finish;
pub mod firewall;
pub mod forward;
pub mod guard;
pub mod install;
pub mod intercept;
pub mod listen;
pub mod metrics;
pub mod metrics_http;
pub mod orig_broker;
pub mod peer_uid;
pub mod pipeline;
pub mod policy;
pub mod policy_store;
pub mod prefixed;
pub mod privsep;
pub mod ratelimit;
pub mod ready_body;
pub mod resolve;
pub mod secrets;
pub mod serve;
pub mod state;
pub mod target;
pub mod tls;
pub mod trust_env;
pub mod tunnel;
pub mod watch;
