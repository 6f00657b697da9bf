//! Connection budgets: how many connections one agent may hold at once, so that no agent
//! (a hostile one, or a broken one in a reconnect loop) can take every slot and lock the
//! others out. An agent is the local uid that opened the connection; where the OS cannot
//! tell (another host's client, or no socket-owner lookup on this OS), its address.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

/// Who a connection counts against.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Agent {
    Uid(u32),
    Addr(IpAddr),
}

impl std::fmt::Display for Agent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Agent::Uid(uid) => write!(f, "uid {uid}"),
            Agent::Addr(ip) => write!(f, "client {ip}"),
        }
    }
}

/// Connections held now, per agent, each at most `per_agent`.
#[derive(Debug)]
pub(crate) struct Budgets {
    per_agent: usize,
    held: Mutex<HashMap<Agent, usize>>,
}

/// One connection's place in its agent's budget, given back when dropped.
#[derive(Debug)]
pub(crate) struct Seat {
    budgets: Arc<Budgets>,
    agent: Agent,
}

impl Drop for Seat {
    fn drop(&mut self) {
        if let Ok(mut held) = self.budgets.held.lock() {
            if let Some(n) = held.get_mut(&self.agent) {
                *n -= 1;
                if *n == 0 {
                    held.remove(&self.agent);
                }
            }
        }
    }
}

impl Budgets {
    pub(crate) fn new(per_agent: usize) -> Arc<Budgets> {
        Arc::new(Budgets {
            per_agent,
            held: Mutex::new(HashMap::new()),
        })
    }

    /// A seat for one more connection of `agent`, or `None` if it holds its budget already.
    pub(crate) fn take(self: &Arc<Self>, agent: Agent) -> Option<Seat> {
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        let n = held.entry(agent).or_insert(0);
        if *n >= self.per_agent {
            return None;
        }
        *n += 1;
        Some(Seat {
            budgets: self.clone(),
            agent,
        })
    }

    pub(crate) fn per_agent(&self) -> usize {
        self.per_agent
    }

    /// Connections `agent` holds now.
    #[cfg(test)]
    fn held(&self, agent: Agent) -> usize {
        self.held
            .lock()
            .map_or(0, |h| h.get(&agent).copied().unwrap_or(0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_agent_over_its_budget_is_refused_and_the_others_are_not() {
        let b = Budgets::new(2);
        let a = Agent::Uid(5200);
        let one = b.take(a).expect("first");
        let _two = b.take(a).expect("second");
        assert!(b.take(a).is_none(), "third refused");
        assert!(
            b.take(Agent::Uid(5201)).is_some(),
            "another agent is served"
        );
        drop(one);
        assert!(b.take(a).is_some(), "a seat given back is taken again");
        assert_eq!(b.held(Agent::Addr("127.0.0.1".parse().expect("ip"))), 0);
    }
}
