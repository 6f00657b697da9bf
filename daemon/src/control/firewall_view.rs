//! The agents' redirect as `ctl status` shows it: the daemon (or its privileged supervisor)
//! keeps the rules in place and hands the admin API this view of them, so the admin API
//! reads the firewall's state without knowing how the daemon keeps it.

use std::sync::Arc;

use agenshield_pf::{RedirectSpec, Redirector};

/// The redirect as the daemon's status shows it.
pub enum FirewallView {
    /// This process installed the rules and can ask the firewall itself.
    Owned(Arc<dyn Redirector>, RedirectSpec),
    /// The privileged supervisor owns them; this is its latest reconcile report
    /// ("matches", "restored", "failed: …").
    Reported {
        agent_uids: Vec<u32>,
        state: tokio::sync::watch::Receiver<String>,
    },
}

impl FirewallView {
    pub fn agent_uids(&self) -> &[u32] {
        match self {
            FirewallView::Owned(_, spec) => &spec.agent_uids,
            FirewallView::Reported { agent_uids, .. } => agent_uids,
        }
    }

    /// The state now: asked of the firewall, or the supervisor's last report.
    pub async fn state(&self) -> String {
        match self {
            FirewallView::Owned(backend, spec) => {
                let (b, s) = (backend.clone(), spec.clone());
                match tokio::task::spawn_blocking(move || b.status(&s)).await {
                    Ok(Ok(st)) => format!("{:?}", st.state).to_lowercase(),
                    Ok(Err(e)) => format!("unknown: {e}"),
                    Err(e) => format!("unknown: {e}"),
                }
            }
            FirewallView::Reported { state, .. } => state.borrow().clone(),
        }
    }
}
