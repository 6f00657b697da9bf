//! The daemon's control plane: the admin API, the decision feed (`ctl tail`), approvals, the
//! policy store and its watcher, live tunnels (re-decided on each policy change), metrics and
//! their listener, and `policy check`.

pub(crate) mod admin;
pub(crate) mod firewall_view;
pub(crate) mod metrics_http;
pub(crate) mod policy_check;
pub(crate) mod policy_watch;
pub(crate) mod reload;
pub(crate) mod watch_health;
