//! The agents' redirect: whether this daemon keeps it, and whether it is in place now. The
//! alert rules read both: only where the daemon keeps the redirect does a 0 in `active` mean
//! the agents' redirect is gone.

use prometheus::{IntGauge, Registry};

use super::{opts, register};

pub(crate) struct FirewallMetrics {
    /// 1 while the redirect rules are verified in place.
    pub active: IntGauge,
    /// 1 where this daemon keeps the redirect (`redirect.enabled`).
    pub managed: IntGauge,
}

impl FirewallMetrics {
    pub(super) fn register(r: &Registry) -> FirewallMetrics {
        FirewallMetrics {
            active: register(
                r,
                IntGauge::with_opts(opts(
                    "firewall_redirect_active",
                    "1 while the redirect rules are verified in place, else 0.",
                )),
            ),
            managed: register(
                r,
                IntGauge::with_opts(opts(
                    "firewall_redirect_managed",
                    "1 where this daemon installs and keeps the agents' redirect rules \
                     (redirect.enabled), else 0 (the redirect, if any, is kept elsewhere).",
                )),
            ),
        }
    }
}
