//! Raw TCP: a connection that is neither TLS nor HTTP (or that is decided before it speaks)
//! is decided on its destination alone (scheme `tcp`), through the pipeline's decide and
//! limit steps. Its record is written before the first byte is relayed; a second record
//! gives the bytes and duration when the relay ends.

use std::sync::Arc;
use std::time::Instant;

use tokio::io::{AsyncRead, AsyncWrite};

use crate::conn::ConnCtx;
use crate::control::metrics::ConnProtocol;
use crate::pipeline::record::{self, Protocol, Record, RecordKind, RequestId, Verdict};
use crate::pipeline::refusal::Refusal;
use crate::pipeline::{decide, limit, secrets};
use crate::policy::{Decision, Policy};
use crate::proxy::Proxy;
use crate::ratelimit::ConcurrencyPermit;
use crate::secrets::phase::{Head, SecretPhase};
use crate::upstream::relay::relay;

/// What the policy says about a connection as raw TCP, decided when it was accepted.
pub(super) struct TcpDecision {
    policy: Arc<Policy>,
    decision: Option<Decision>,
    outcome: Result<(), Refusal>,
    started: Instant,
    at: time::OffsetDateTime,
}

impl TcpDecision {
    pub(super) fn allowed(&self) -> bool {
        self.outcome.is_ok()
    }

    /// The policy it was decided under; the connection keeps it.
    pub(super) fn policy(&self) -> &Policy {
        &self.policy
    }
}

/// Decides `ctx`'s destination as raw TCP under the policy in force.
pub(super) fn decide(proxy: &Proxy, ctx: &ConnCtx) -> TcpDecision {
    let policy = proxy.policy();
    let host = ctx.dest.host.to_string();
    // A name can carry a secret too (to whoever answers the DNS query for it); a raw stream
    // binds no secret, so a value or placeholder in the name is refused.
    let head = Head {
        method: "",
        host: &host,
        headers: &http::HeaderMap::new(),
        path_and_query: "",
        tls: false,
        upgrade: false,
    };
    let (decision, outcome) = match SecretPhase::inspect(&proxy.vault, None, &head) {
        Err(e) => (None, Err(secrets::refusal(&e, None))),
        Ok(_) => {
            let (d, outcome) = decide::connection(&policy, &host, ctx.dest.port);
            (Some(d), outcome)
        }
    };
    TcpDecision {
        policy,
        decision,
        outcome,
        started: Instant::now(),
        at: time::OffsetDateTime::now_utc(),
    }
}

/// Records the decision, and for an allowed one dials, relays and records the close.
pub(super) async fn relay_opaque<S>(proxy: Arc<Proxy>, ctx: ConnCtx, tcp: TcpDecision, client: S)
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let mut rec = Record {
        kind: RecordKind::Connection,
        protocol: Protocol::Tcp,
        rule: tcp.decision.as_ref().and_then(|d| d.rule_id.clone()),
        ..record::base(
            &proxy,
            &ctx,
            &tcp.policy,
            RequestId::random(),
            crate::control::events::rfc3339(tcp.at).into(),
            record::dest_host(&proxy, &ctx),
        )
    };
    let permit = match admit(&proxy, &ctx, &tcp) {
        Ok(permit) => permit,
        Err(r) => {
            refuse(&proxy, rec, &r, tcp.started).await;
            return;
        }
    };
    let host = ctx.dest.host.to_string();
    let (upstream, addr) = match proxy.dialer.dial(&host, ctx.dest.port).await {
        Ok(dialed) => dialed,
        Err(e) => {
            let r = crate::upstream::client::dial_refusal(&e);
            refuse(&proxy, rec, &r, tcp.started).await;
            return;
        }
    };
    rec.decision = Verdict::Allow;
    rec.upstream = Some(addr);
    rec.ms = record::ms_since(tcp.started);
    // Nothing is relayed unless the decision is in the audit log.
    if !record::connection(&proxy, rec.clone()).await {
        return;
    }
    let _open = proxy.metrics.connection(ConnProtocol::Tcp);
    let _permit: Option<ConcurrencyPermit> = permit;
    let started = Instant::now();
    let relayed = relay(client, upstream, proxy.limits.tunnel_idle_timeout).await;
    record::tunnel_closed(&proxy, &rec, &relayed, started).await;
}

/// The policy's outcome, then the rule's limits.
fn admit(
    proxy: &Proxy,
    ctx: &ConnCtx,
    tcp: &TcpDecision,
) -> Result<Option<ConcurrencyPermit>, Refusal> {
    tcp.outcome.clone()?;
    match &tcp.decision {
        Some(d) => limit::connection(proxy, d, &ctx.dest.host.to_string()),
        None => Ok(None),
    }
}

async fn refuse(proxy: &Arc<Proxy>, mut rec: Record, r: &Refusal, started: Instant) {
    let secrets = proxy.vault.current();
    rec.decision = r.verdict;
    rec.error_code = Some(r.code);
    rec.reason = Some(secrets.redact(&r.message).into_owned());
    rec.ms = record::ms_since(started);
    record::connection(proxy, rec).await;
}
