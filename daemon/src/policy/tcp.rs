//! `decide_tcp`: the decision for a raw TCP connection to `host:port` (scheme `tcp`, no
//! method or path, so rules constrained by method or path never match it). The data path
//! calls it when a connection is taken as raw TCP, and the tunnel registry again on every
//! policy change for each live raw TCP tunnel.

use super::{Decision, Policy, RequestFacts, Scheme};

impl Policy {
    /// The decision for a raw TCP connection from `agent` (its uid; `None` when it cannot be
    /// told) to `host` (a name or an address, as the connection is decided) and `port`.
    pub fn decide_tcp(&self, host: &str, port: u16, agent: Option<u32>) -> Decision {
        self.decide(&RequestFacts {
            host,
            port,
            scheme: Scheme::Tcp,
            method: None,
            path: None,
            agent,
        })
    }
}
