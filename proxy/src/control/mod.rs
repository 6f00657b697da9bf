//! The daemon's control plane: the admin API, the decision feed (`ctl tail`), approvals, the
//! policy store and its watcher, metrics and their listener, and `policy check`.

pub mod admin;
pub mod approvals;
pub mod events;
pub mod metrics;
pub mod metrics_http;
pub mod policy_check;
pub mod policy_store;
pub mod policy_watch;
