//! The agent's DNS stub. The firewall redirects all of the agent's DNS (UDP and TCP port 53,
//! to any address) here; a question is answered only if some rule could allow a connection
//! to the name (`Policy::decide_name`), from our own resolver, with the private-address
//! guard applied to what it returns. A name no rule allows gets NXDOMAIN, answered here:
//! it never reaches a resolver, so the lookup cannot carry data out of the machine.
//!
//! - `serve.rs`: the UDP and TCP loops (framing by hickory-net, messages by hickory-proto),
//!   with the agent's uid and original destination for each question;
//! - `message.rs`: one DNS message in, one out (opcode, question count, truncation);
//! - `answer.rs`: the decision and the answer for one question;
//! - `record.rs`: the decision's record (every refusal; an allowed name once per TTL);
//! - `names.rs`: which names each agent was given which addresses for, so that a raw TCP
//!   connection to one is decided by name;
//! - `synthetic.rs`: the addresses answered for names only an `ask` rule covers, which no
//!   resolver is asked about.

mod answer;
mod message;
mod names;
mod record;
mod serve;
pub(crate) mod synthetic;

use std::sync::Arc;

pub(crate) use names::NameMemory;
pub(crate) use serve::{serve_tcp, serve_udp};

/// Questions in hand at once (reading, deciding, resolving, recording); a datagram past it
/// is dropped unread and counted (`agenshield_proxy_dns_dropped_total`): the client retries.
pub(crate) const MAX_IN_FLIGHT: usize = 1024;

/// The stub's state, shared by its loops and by the raw TCP path.
pub(crate) struct DnsState {
    pub names: NameMemory,
    /// The addresses standing for names only an `ask` rule covers.
    pub synthetic: synthetic::Synthetic,
    /// Allowed answers recorded lately: (uid, name, type, rcode) → until when.
    recorded: moka::sync::Cache<(Option<u32>, Arc<str>, u16, u16), std::time::Instant>,
    in_flight: Arc<tokio::sync::Semaphore>,
}

impl Default for DnsState {
    fn default() -> Self {
        DnsState {
            names: NameMemory::default(),
            synthetic: synthetic::Synthetic::default(),
            recorded: moka::sync::Cache::builder()
                .max_capacity(65_536)
                .time_to_live(names::MAX_TTL)
                .build(),
            in_flight: Arc::new(tokio::sync::Semaphore::new(MAX_IN_FLIGHT)),
        }
    }
}
