//! The agent's DNS stub. The firewall redirects all of the agent's DNS (UDP and TCP port 53,
//! to any address) here; a question is answered from our own resolver only if some rule
//! could allow a connection to the name (`Policy::decide_name`), with the private-address
//! guard applied to what it returns. A name no rule allows is answered here, without asking
//! anyone, so the lookup cannot carry data out of the machine: with a synthetic address that
//! stands for it (default), so the connection that follows comes back through the redirect
//! and the agent is told which rule refused it (a JSON 403 over HTTP), or with NXDOMAIN
//! (`dns.denied = "nxdomain"`). Every refusal carries an Extended DNS Error (RFC 8914) saying
//! why, for clients that speak EDNS.
//!
//! - `serve.rs`: the UDP and TCP loops (framing by hickory-net, messages by hickory-proto),
//!   with the agent's uid and original destination for each question;
//! - `message.rs`: one DNS message in, one out (opcode, question count, truncation);
//! - `answer.rs`: the decision and the answer for one question;
//! - `ede.rs`: the Extended DNS Error a refusal carries;
//! - `record.rs`: the decision's record (every refusal; an allowed name once per TTL);
//!
//! What the stub remembers (the names it gave each agent, the synthetic addresses, its
//! budgets) is `crate::dns_state`, beneath the raw TCP path that reads it too.

mod answer;
mod ede;
mod message;
mod record;
mod serve;

pub(crate) use serve::{serve_tcp, serve_udp};
