//! Raw TCP: a connection that is neither TLS nor HTTP (or that is decided before it speaks)
//! is decided on its destination alone (`Policy::decide_tcp`, scheme `tcp`), then goes
//! through the pipeline's decide outcome and limit steps. Its record is written before the
//! first byte is relayed; a second record gives the bytes and duration when the relay ends.
//!
//! A destination address the DNS stub gave this agent for a name (within that answer's TTL)
//! is decided by the name: `ssh git@github.com` against a `tcp` rule for `github.com`. The
//! names it was given are tried most recent first, then the address itself; the first that
//! allows decides, else the most recent name's refusal. Either way the address the agent
//! chose is dialed (the stub gave it), through the private-address guard.

use std::sync::Arc;
use std::time::Instant;

use tokio::io::{AsyncRead, AsyncWrite};

use crate::conn::{ConnCtx, DestHost};
use crate::pipeline::record;
use crate::pipeline::refusal::Refusal;
use crate::pipeline::secrets::{Head, SecretPhase};
use crate::pipeline::tunnel::Tunnel;
use crate::pipeline::{decide, limit, secrets};
use crate::policy::{Action, Decision, Policy};
use crate::proxy::Proxy;
use crate::ratelimit::ConcurrencyPermit;
use crate::read_side::ReadSide;
use crate::record::{Protocol, Record, Verdict};
use crate::tunnels::TunnelFacts;
use crate::upstream::error::UpstreamError;

/// What the policy says about a connection as raw TCP, decided when it was accepted (and
/// acted on only if it is taken as raw TCP).
pub(super) struct TcpDecision {
    policy: Arc<Policy>,
    /// The destination host, as the decision saw it: a name the DNS stub gave the agent for
    /// the address, or the address.
    host: String,
    /// What to dial: the destination as the agent gave it.
    dial: String,
    /// `host` is a name remembered from the DNS stub.
    by_name: bool,
    /// `Err`: the name carries a secret and no policy question was asked.
    decision: Result<Decision, Refusal>,
    started: Instant,
    at: time::OffsetDateTime,
}

impl TcpDecision {
    /// Raw TCP there is allowed by a rule (or the default), not merely let through by
    /// report mode.
    pub(super) fn allowed_by_policy(&self) -> bool {
        matches!(&self.decision, Ok(d) if d.action == Action::Allow && !d.reported_deny)
    }

    /// The policy it was decided under; the connection keeps it.
    pub(super) fn policy(&self) -> &Policy {
        &self.policy
    }

    /// The policy, for what the connection turns out to be.
    pub(super) fn into_policy(self) -> Arc<Policy> {
        self.policy
    }

    /// The name it was decided by, when the DNS stub gave the agent this address for one.
    pub(super) fn name(&self) -> Option<&str> {
        self.by_name.then_some(self.host.as_str())
    }
}

/// Decides `ctx`'s destination as raw TCP under the policy in force.
pub(super) fn decide(proxy: &Proxy, ctx: &ConnCtx) -> TcpDecision {
    let policy = proxy.policy();
    let dial = ctx.dest.host.to_string();
    let names = match ctx.dest.host {
        DestHost::Ip(ip) => {
            let mut names = proxy.dns.names.names(ctx.agent_uid, ip);
            // A synthetic address still in use past its answer's TTL.
            if names.is_empty() {
                names.extend(proxy.dns.synthetic.name(ctx.agent_uid, ip));
            }
            names
        }
        DestHost::Name(_) => Vec::new(),
    };
    let (host, by_name, decision) =
        choose(proxy, &policy, &names, &dial, ctx.dest.port, ctx.agent_uid);
    // A synthetic address (a name only an `ask` rule covers) stands for its name: the name
    // is dialed, resolved by our own resolver; the address never is.
    let dial = match ctx.dest.host {
        DestHost::Ip(ip) if by_name && crate::dns_state::synthetic::is_synthetic(ip) => {
            host.clone()
        }
        _ => dial,
    };
    TcpDecision {
        policy,
        host,
        dial,
        by_name,
        decision,
        started: Instant::now(),
        at: time::OffsetDateTime::now_utc(),
    }
}

/// The host a raw TCP connection is decided as, whether it is a name, and the decision: the
/// first of `names` (most recent first) that allows; else the address `dial`, if it allows
/// or no name was given; else the most recent name's refusal.
fn choose(
    proxy: &Proxy,
    policy: &Policy,
    names: &[Arc<str>],
    dial: &str,
    port: u16,
    agent: Option<u32>,
) -> (String, bool, Result<Decision, Refusal>) {
    let allows = |d: &Result<Decision, Refusal>| matches!(d, Ok(d) if d.action == Action::Allow && !d.reported_deny);
    let mut refused = None;
    for name in names {
        let d = decide_host(proxy, policy, name, port, agent);
        if allows(&d) {
            return (name.to_string(), true, d);
        }
        refused.get_or_insert((name, d));
    }
    let d = decide_host(proxy, policy, dial, port, agent);
    match refused {
        Some((name, by_name)) if !allows(&d) => (name.to_string(), true, by_name),
        _ => (dial.to_string(), false, d),
    }
}

/// `host:port` as raw TCP: the secret guard on the name, then the policy.
fn decide_host(
    proxy: &Proxy,
    policy: &Policy,
    host: &str,
    port: u16,
    agent: Option<u32>,
) -> Result<Decision, Refusal> {
    // A name can carry a secret too (to whoever answers the DNS query for it); a raw stream
    // binds no secret, so a value or placeholder in the name is refused.
    let head = Head {
        method: "",
        host,
        headers: &http::HeaderMap::new(),
        path_and_query: "",
        tls: false,
        upgrade: None,
    };
    match SecretPhase::inspect(&proxy.vault, None, &head) {
        Err(e) => Err(secrets::refusal(&e, None)),
        Ok(_) => Ok(policy.decide_tcp(host, port, agent)),
    }
}

/// Records the decision, and for an allowed one dials, relays and records the close.
pub(super) async fn relay_opaque<S>(proxy: Arc<Proxy>, ctx: ConnCtx, tcp: TcpDecision, client: S)
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let secrets = proxy.vault.current();
    let shown: Arc<str> = secrets.redact(&tcp.host).into();
    let rule = tcp.decision.as_ref().ok().and_then(|d| d.rule_id.clone());
    let at = record::stamp(&tcp.policy, Some(tcp.at));
    let rec = Record {
        would_deny: tcp.decision.as_ref().is_ok_and(|d| d.reported_deny),
        ..ctx
            .base(&secrets)
            .decided(Protocol::Tcp, shown.clone(), rule, at)
    };
    drop(secrets);
    let permit = match admit(&proxy, &ctx, &tcp, &shown).await {
        Ok(permit) => permit,
        Err(r) => {
            refuse(&proxy, rec, &r, tcp.started).await;
            return;
        }
    };
    let spliced = Splice {
        dial: &tcp.dial,
        first: None,
        facts: TunnelFacts::Tcp {
            host: tcp.host.clone(),
            port: ctx.dest.port,
            agent: ctx.agent_uid,
        },
        protocol: Protocol::Tcp,
        started: tcp.started,
    };
    spliced.run(&proxy, &ctx, rec, permit, client).await;
}

/// An allowed byte stream, from the dial on: what to dial, bytes already read from the client
/// (sent first), the tunnel it is registered as, its metric label.
pub(super) struct Splice<'a> {
    pub dial: &'a str,
    pub first: Option<bytes::Bytes>,
    pub facts: TunnelFacts,
    pub protocol: Protocol,
    pub started: Instant,
}

impl Splice<'_> {
    /// Dials (through the resolver and the guard), records the decision (nothing is relayed
    /// unless it is in the audit log), then runs the tunnel (`pipeline::tunnel`).
    pub(super) async fn run<S>(
        self,
        proxy: &Arc<Proxy>,
        ctx: &ConnCtx,
        mut rec: Record,
        permit: Option<ConcurrencyPermit>,
        client: S,
    ) where
        S: AsyncRead + AsyncWrite + Unpin,
    {
        let (upstream, addr) = match proxy.dialer.dial(self.dial, ctx.dest.port).await {
            Ok(dialed) => dialed,
            Err(e) => {
                let r = Refusal::from(UpstreamError::from(&e));
                refuse(proxy, rec, &r, self.started).await;
                return;
            }
        };
        rec.decision = Verdict::Allow;
        rec.upstream = Some(addr);
        rec.ms = record::ms_since(self.started);
        if !record::connection(proxy, rec.clone()).await {
            return;
        }
        let _permit: Option<ConcurrencyPermit> = permit;
        let tunnel = Tunnel {
            facts: self.facts,
            protocol: self.protocol,
            decided: rec,
        };
        // What was read already goes first, and counts as sent.
        let client = ReadSide::prefixed(self.first.unwrap_or_default(), client);
        tunnel.run(proxy, client, upstream, None).await;
    }
}

/// The audit log's readiness, the policy's outcome, then the rule's limits.
async fn admit(
    proxy: &Proxy,
    ctx: &ConnCtx,
    tcp: &TcpDecision,
    shown: &str,
) -> Result<Option<ConcurrencyPermit>, Refusal> {
    record::ready(proxy)?;
    let d = tcp.decision.as_ref().map_err(Clone::clone)?;
    decide::connection_outcome(d, shown, ctx.dest.port)?;
    limit::connection(proxy, d, &tcp.host, ctx.agent_uid).await
}

pub(super) async fn refuse(proxy: &Arc<Proxy>, rec: Record, r: &Refusal, started: Instant) {
    let shown = record::shown(&proxy.vault.current(), r.clone());
    let rec = Record {
        ms: record::ms_since(started),
        ..rec.refused(&shown)
    };
    record::connection(proxy, rec).await;
}
