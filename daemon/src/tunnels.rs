//! Live tunnels (raw TCP relays, upgraded connections) and what allowed them. A request on a
//! keep-alive connection is decided anew under the policy in force; a tunnel was decided once,
//! when it opened. So on every policy change each live tunnel is decided again, and one the
//! new policy no longer allows is closed (its close record says `revoked`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;

use crate::policy::{Action, Policy, RequestFacts, Scheme};

/// What a tunnel was allowed as, to decide it again.
#[derive(Debug, Clone)]
pub(crate) enum TunnelFacts {
    /// Raw TCP to `host:port`.
    Tcp {
        host: String,
        port: u16,
        agent: Option<u32>,
    },
    /// TLS to `host:port` passed through unopened (`tls = "passthrough"`).
    Passthrough {
        host: String,
        port: u16,
        agent: Option<u32>,
    },
    /// A request that switched protocols (a WebSocket): its host, port, scheme and path (the
    /// matching form), and the agent's uid where known.
    Upgrade {
        host: String,
        port: u16,
        scheme: Scheme,
        path: String,
        agent: Option<u32>,
    },
}

impl TunnelFacts {
    /// Whether `policy` would let it open now. `ask` would not: nobody can be asked for a
    /// tunnel already open.
    fn allowed(&self, policy: &Policy) -> bool {
        let d = match self {
            TunnelFacts::Tcp { host, port, agent } => policy.decide_tcp(host, *port, *agent),
            TunnelFacts::Passthrough { host, port, agent } => {
                return policy
                    .decide_passthrough(host, *port, *agent)
                    .is_some_and(|d| d.action == Action::Allow)
            }
            TunnelFacts::Upgrade {
                host,
                port,
                scheme,
                path,
                agent,
            } => policy.decide(&RequestFacts {
                host,
                port: *port,
                scheme: *scheme,
                method: Some("GET"),
                path: Some(path),
                agent: *agent,
            }),
        };
        d.action == Action::Allow
    }
}

/// The registry of live tunnels.
#[derive(Debug, Default)]
pub(crate) struct Tunnels {
    next: AtomicU64,
    live: Mutex<HashMap<u64, (TunnelFacts, oneshot::Sender<()>)>>,
}

/// A live tunnel's place in the registry: `revoked` resolves when a policy change closes it;
/// dropping it (the tunnel ended) removes it.
pub(crate) struct Live {
    tunnels: Arc<Tunnels>,
    id: u64,
    pub revoked: oneshot::Receiver<()>,
}

impl Drop for Live {
    fn drop(&mut self) {
        if let Ok(mut live) = self.tunnels.live.lock() {
            live.remove(&self.id);
        }
    }
}

impl Tunnels {
    /// Registers a tunnel that has just opened.
    pub(crate) fn open(self: &Arc<Self>, facts: TunnelFacts) -> Live {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let (tx, revoked) = oneshot::channel();
        if let Ok(mut live) = self.live.lock() {
            live.insert(id, (facts, tx));
        }
        Live {
            tunnels: self.clone(),
            id,
            revoked,
        }
    }

    /// Decides every live tunnel again under `policy` and closes those it does not allow.
    /// Returns how many were closed.
    pub(crate) fn revise(&self, policy: &Policy) -> usize {
        let Ok(mut live) = self.live.lock() else {
            return 0;
        };
        let refused: Vec<u64> = live
            .iter()
            .filter(|(_, (facts, _))| !facts.allowed(policy))
            .map(|(id, _)| *id)
            .collect();
        for id in &refused {
            if let Some((_, tx)) = live.remove(id) {
                let _ = tx.send(());
            }
        }
        refused.len()
    }

    /// Tunnels open now.
    pub(crate) fn len(&self) -> usize {
        self.live.lock().map_or(0, |l| l.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::PolicySource;

    fn policy(text: &str) -> Policy {
        Policy::from_sources(&[PolicySource {
            name: "p.toml".into(),
            text: text.into(),
        }])
        .expect("policy")
    }

    #[tokio::test]
    async fn a_tunnel_the_new_policy_refuses_is_revoked_and_the_others_stay() {
        let tunnels = Arc::new(Tunnels::default());
        let ssh = tunnels.open(TunnelFacts::Tcp {
            host: "git.example".into(),
            port: 22,
            agent: Some(1001),
        });
        let mut ws = tunnels.open(TunnelFacts::Upgrade {
            host: "ws.example".into(),
            port: 443,
            scheme: Scheme::Https,
            path: "/socket".into(),
            agent: Some(1001),
        });
        assert_eq!(tunnels.len(), 2);
        let keeps_ssh = policy(
            "version = 1\n[[rule]]\nid = \"ssh\"\nhosts = [\"git.example\"]\nports = [22]\nschemes = [\"tcp\"]\naction = \"allow\"\n",
        );
        assert_eq!(tunnels.revise(&keeps_ssh), 1);
        assert!((&mut ws.revoked).await.is_ok(), "the WebSocket is revoked");
        assert_eq!(tunnels.len(), 1);
        // A rule for another agent does not keep it.
        let for_another = policy(
            "version = 1\n[[rule]]\nid = \"ssh\"\nhosts = [\"git.example\"]\nports = [22]\nschemes = [\"tcp\"]\nagents = [1002]\naction = \"allow\"\n",
        );
        assert_eq!(
            tunnels.revise(&for_another),
            1,
            "the other agent's rule revokes it"
        );
        drop(ssh);
        assert_eq!(tunnels.len(), 0, "an ended tunnel leaves the registry");
    }
}
