//! The daemon's control plane: the admin API, policy reloads (`ctl reload`, SIGHUP, the
//! watcher) and the policy watcher, the redirect as `ctl status` shows it, the metrics
//! listener, and `policy check`. What the data path shares with it (the policy store, the
//! decision feed, approvals, live tunnels, metrics) sits below `proxy`, so nothing here is
//! imported by the data path.

pub mod admin;
pub(crate) mod firewall_view;
pub(crate) mod metrics_http;
pub mod policy_check;
pub mod policy_source;
pub(crate) mod policy_watch;
pub(crate) mod reload;
pub(crate) mod watch_health;
