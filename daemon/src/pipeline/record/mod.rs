//! The record phase: every decision becomes one [`Record`], and everything an operator or a
//! reviewer sees of it is derived from that record:
//!
//! - at the decision: the log line (`record::log`) and the `ctl tail` event;
//! - once the outcome is known: the metrics and the audit entry. A request's record is in the
//!   audit file before the last byte of its response reaches the agent (`held_body.rs`); a
//!   tunnel's decision is in it before the first byte is relayed; its close record follows
//!   when the relay ends.

mod held_body;

use std::borrow::Cow;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use http::Response;
use http_body_util::BodyExt;

use held_body::FinishedBody;

use super::refusal::{self, Refusal};
use super::RequestCtx;
use crate::audit::Entry;
use crate::body::ready::{take_ready, Ready};
use crate::body::ProxyBody;
use crate::policy::Policy;
use crate::proxy::Proxy;
use crate::record::{
    log, ErrorCode, McpFacts, McpRefusedMessage, Protocol, Record, Redact, RequestId, Stamp,
    Verdict,
};
use crate::secrets::rewrite::websocket::GuardedRelay;
use crate::secrets::set::SecretSet;
use crate::upstream::pool::UpstreamAddr;
use crate::upstream::relay::Relayed;

/// A response body up to this size that has fully arrived with its head is recorded and
/// sent whole (see `body::ready`); larger or still-arriving bodies stream.
const READY_BODY_LIMIT: usize = 64 * 1024;

/// Whether the audit log can take this request's record. While it cannot (a write failed,
/// or its file system is nearly full) nothing is forwarded: `503 audit_unavailable`.
pub(crate) fn ready(proxy: &Proxy) -> Result<(), Refusal> {
    match proxy.audit.as_ref().map(|a| a.ready()) {
        Some(Err(why)) => Err(Refusal::new(
            ErrorCode::AuditUnavailable,
            format!("{why}; nothing is forwarded until the audit log can record it"),
        )),
        _ => Ok(()),
    }
}

/// How a request ended, for its record.
pub(super) enum Ending<'a> {
    Responded(&'a Response<ProxyBody>),
    Refused(&'a Refusal),
    /// The client went away (a reset stream, a closed connection) before the pipeline
    /// finished; the request may have been forwarded already.
    Abandoned,
}

/// Ends an HTTP request: builds its record from what the phases learned and the outcome,
/// logs and publishes it, and returns the response with its audit write attached.
pub(super) async fn respond(
    mut ctx: RequestCtx,
    outcome: Result<Response<ProxyBody>, Refusal>,
) -> Response<ProxyBody> {
    ctx.recorded = true;
    let secrets = ctx.proxy.vault.current();
    // The agent may have put a secret value anywhere it wrote: nothing shown or logged
    // carries it.
    let outcome = outcome.map_err(|r| shown(&secrets, r));
    let record = match &outcome {
        Ok(resp) => request_record(&ctx, Ending::Responded(resp)),
        Err(r) => request_record(&ctx, Ending::Refused(r)),
    };
    let pending = PendingRecord::request(&mut ctx, record);
    pending.decided();
    let resp = match outcome {
        Ok(resp) => resp,
        Err(r) => {
            let id = ctx.id.to_string();
            super::mcp::answer(&ctx, &r, &id, ctx.policy.hash())
                .unwrap_or_else(|| refusal::render(&r, &id, ctx.policy.hash()))
        }
    };
    attach(pending, resp, ctx.method == http::Method::HEAD).await
}

/// Records a request the client abandoned before the pipeline finished (called when its
/// `RequestCtx` is dropped unrecorded): marked incomplete, written without waiting.
pub(super) fn abandoned(ctx: &mut RequestCtx) {
    // At runtime shutdown there is nowhere left to write it.
    if tokio::runtime::Handle::try_current().is_err() {
        return;
    }
    let record = request_record(ctx, Ending::Abandoned);
    let pending = PendingRecord::request(ctx, record);
    pending.decided();
    pending.detached(0);
}

/// The record of a request, from its context and how it ended (redacted: nothing the agent
/// wrote reaches it unfiltered).
fn request_record(ctx: &RequestCtx, ending: Ending<'_>) -> Record {
    let secrets = ctx.proxy.vault.current();
    let (verdict, status, error_code, upstream, reason) = match ending {
        Ending::Responded(resp) => (
            ctx.verdict.unwrap_or(Verdict::Allow),
            Some(resp.status().as_u16()),
            None,
            // The address actually dialed, which the agent never chose.
            resp.extensions().get::<UpstreamAddr>().map(|a| a.0),
            None,
        ),
        Ending::Refused(r) => (
            r.verdict,
            Some(super::mcp::answered_status(ctx, r)),
            Some(r.code),
            None,
            Some(r.message.clone()),
        ),
        Ending::Abandoned => match ctx.verdict {
            Some(v) => (
                v,
                None,
                None,
                None,
                Some("the client went away before the response".to_string()),
            ),
            None => (
                Verdict::Error,
                None,
                Some(ErrorCode::ClientGone),
                None,
                Some("the client went away before the request was decided".to_string()),
            ),
        },
    };
    let (host, port, protocol) = match &ctx.target {
        Some(t) => (
            Some(secrets.redact(&t.host).into()),
            t.port,
            protocol_of(t.scheme),
        ),
        None => (
            None,
            ctx.conn.dest.port,
            if ctx.conn.tls.is_some() {
                Protocol::Https
            } else {
                Protocol::Http
            },
        ),
    };
    let path = crate::audit::shown_path(
        &secrets.redact(&ctx.path),
        ctx.query.as_deref().map(|q| secrets.redact(q)).as_deref(),
        ctx.proxy.audit_query_values,
    );
    let at = Stamp {
        id: ctx.id,
        started: ctx.started_at.clone(),
        policy: ctx.policy.hash_shared(),
    };
    // A credential the check found in the URL or the name is not written either.
    let dlp = ctx.dlp.as_ref().and_then(|p| p.facts());
    let (host, path) = match &dlp {
        Some(_) => (
            host.map(|h: Arc<str>| crate::dlp::shown(&h).into()),
            crate::dlp::shown(&path).into_owned(),
        ),
        None => (host, path),
    };
    Record {
        port,
        method: Some(secrets.redact(ctx.method.as_str()).into_owned()),
        path: Some(path),
        upgrade: ctx.upgrade.as_deref().map(|u| secrets.redact(u).into()),
        decision: verdict,
        rule: ctx.rule().cloned(),
        status,
        error_code,
        upstream,
        secrets: ctx
            .secrets
            .as_ref()
            .map(|p| p.all_used())
            .unwrap_or_default(),
        reason,
        ms: ms_since(ctx.started),
        incomplete: matches!(ending, Ending::Abandoned),
        would_deny: ctx.decision.as_ref().is_some_and(|d| d.reported_deny),
        mcp: ctx
            .mcp
            .as_ref()
            .and_then(|m| m.facts.as_ref())
            .map(|f| McpFacts {
                method: f.method.as_deref().map(|m| secrets.redact(m).into_owned()),
                tool: f.tool.as_deref().map(|t| secrets.redact(t).into_owned()),
                batch: f.batch,
                refused: f
                    .refused
                    .iter()
                    .map(|m| McpRefusedMessage {
                        method: m.method.as_deref().map(|x| secrets.redact(x).into_owned()),
                        tool: m.tool.as_deref().map(|x| secrets.redact(x).into_owned()),
                        error_code: m.error_code,
                    })
                    .collect(),
            }),
        limit_scope: match ending {
            Ending::Refused(r) => r.limit_scope,
            _ => None,
        },
        dlp,
        budget: match ending {
            Ending::Refused(Refusal {
                budget: Some(b), ..
            }) => Some(b.as_ref().clone()),
            _ => ctx.budget.as_ref().map(|m| m.at_decision()),
        },
        ..ctx.conn.base(&secrets).request(protocol, host, at)
    }
}

/// Writes the record before a bodiless or already-complete response goes out, or holds the
/// last frame of a streaming one until it is written.
async fn attach(
    pending: PendingRecord,
    resp: Response<ProxyBody>,
    head_only: bool,
) -> Response<ProxyBody> {
    let status = resp.status();
    let bodiless = head_only
        || status.is_informational()
        || status == http::StatusCode::NO_CONTENT
        || status == http::StatusCode::NOT_MODIFIED
        || http_body::Body::is_end_stream(resp.body());
    let (id, policy) = (pending.record.request_id, pending.record.policy.clone());
    let withheld = || {
        refusal::render(
            &Refusal::new(
                ErrorCode::AuditUnavailable,
                "the audit log could not record this request, so its response is withheld",
            ),
            &id.to_string(),
            &policy,
        )
    };
    if bodiless {
        if !pending.now(0).await {
            return withheld();
        }
        return resp;
    }
    let (parts, body) = resp.into_parts();
    match take_ready(body, READY_BODY_LIMIT) {
        // All here: record it, then hand hyper the whole response for one write.
        Ready::Complete(bytes) => {
            if !pending.now(bytes.len() as u64).await {
                return withheld();
            }
            Response::from_parts(parts, crate::body::full(bytes))
        }
        Ready::Streaming(body) => {
            let expected = parts
                .headers
                .get(http::header::CONTENT_LENGTH)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse::<u64>().ok());
            Response::from_parts(
                parts,
                BodyExt::boxed(FinishedBody::new(body, pending, expected)),
            )
        }
    }
}

/// A connection decided as a whole (raw TCP, a failed TLS handshake, a request the HTTP
/// server refused): logged, published, counted and written. `false`: the audit log could
/// not take it; nothing may be relayed.
pub(crate) async fn connection(proxy: &Arc<Proxy>, record: Record) -> bool {
    let pending = PendingRecord {
        proxy: proxy.clone(),
        policy: proxy.policy(),
        record,
        open: None,
        on_recorded: None,
    };
    pending.decided();
    pending.now(0).await
}

/// Records the end of a tunnel `decided` allowed.
pub(crate) async fn tunnel_closed(
    proxy: &Arc<Proxy>,
    decided: &Record,
    relayed: &Relayed,
    started: Instant,
) {
    connection(proxy, closed(decided, relayed, started)).await;
}

/// The close record of a tunnel that `decided` opened.
fn closed(decided: &Record, relayed: &Relayed, started: Instant) -> Record {
    if let Some(e) = &relayed.error {
        tracing::debug!("tunnel ended: {e}");
    }
    decided.ended(relayed, ms_since(started))
}

/// Records the end of a WebSocket relayed through the secret guard: the secrets swapped
/// into its messages join the decision's, and a refusal gives the close its code and reason.
pub(crate) async fn guarded_tunnel_closed(
    proxy: &Arc<Proxy>,
    decided: &Record,
    guarded: &GuardedRelay,
    swapped: &[Arc<str>],
    dlp: Option<crate::record::DlpFacts>,
    started: Instant,
) {
    let mut record = closed(decided, &guarded.relayed, started);
    if dlp.is_some() {
        record.dlp = dlp;
    }
    if let Some(why) = &guarded.dlp_refused {
        tracing::warn!("WebSocket closed: {why}");
        record.error_code = Some(ErrorCode::CredentialExfiltration);
        record.reason = Some(why.clone());
    }
    for name in swapped {
        if !record.secrets.contains(name) {
            record.secrets.push(name.clone());
        }
    }
    record.secrets.sort();
    if let Some(r) = &guarded.refused {
        let refusal = crate::pipeline::secrets::refusal(r, decided.rule.as_deref());
        tracing::warn!(secret = %r.secret, place = r.place.to_string().as_str(), code = refusal.code.as_str(), "WebSocket closed: {}", refusal.message);
        record.error_code = Some(refusal.code);
        record.reason = Some(refusal.message);
    }
    connection(proxy, record).await;
}

/// The secret set in force redacts what records show (`record::RecordBase`).
impl Redact for SecretSet {
    fn redact<'a>(&self, text: &'a str) -> Cow<'a, str> {
        SecretSet::redact(self, text)
    }
}

/// A record's id and when its decision started (`at`, else now), under `policy`: the one
/// place a record's time is formatted.
pub(crate) fn stamp(policy: &Policy, at: Option<time::OffsetDateTime>) -> Stamp {
    let started = match at {
        Some(t) => crate::clock::rfc3339(t),
        None => crate::clock::now_rfc3339(),
    };
    Stamp {
        id: RequestId::random(),
        started: started.into(),
        policy: policy.hash_shared(),
    }
}

/// `r` as the agent and the record may see it: its message and explanation redacted with
/// `set` (the agent may have put a secret value anywhere it wrote).
pub(crate) fn shown(set: &SecretSet, r: Refusal) -> Refusal {
    if set.is_empty() {
        return r;
    }
    Refusal {
        message: set.redact(&r.message).into_owned(),
        explanation: set.redact(&r.explanation).into_owned(),
        ..r
    }
}

fn protocol_of(scheme: crate::policy::Scheme) -> Protocol {
    match scheme {
        crate::policy::Scheme::Https => Protocol::Https,
        crate::policy::Scheme::Http => Protocol::Http,
        crate::policy::Scheme::Tcp => Protocol::Tcp,
    }
}

pub(crate) fn ms_since(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1000.0
}

/// A record on its way out: decided, logged and published, then completed (a request's
/// duration and bytes, once its response ends), counted and written.
pub(crate) struct PendingRecord {
    proxy: Arc<Proxy>,
    /// The policy it was decided under (names the hosts that are metric labels).
    policy: Arc<Policy>,
    record: Record,
    /// A request whose outcome is still coming; `None`: the record is final as built.
    open: Option<Open>,
    /// Who waits for the record to be written (an upgrade's relay).
    on_recorded: Option<tokio::sync::oneshot::Sender<Record>>,
}

/// What completes a request's record.
struct Open {
    started: Instant,
    /// Request body bytes sent upstream so far.
    up: Arc<AtomicU64>,
    /// Under a token budget: settled when the record is completed.
    budget: Option<Arc<crate::budget::Meter>>,
}

impl PendingRecord {
    fn request(ctx: &mut RequestCtx, record: Record) -> PendingRecord {
        PendingRecord {
            proxy: ctx.proxy.clone(),
            policy: ctx.policy.clone(),
            record,
            open: Some(Open {
                started: ctx.started,
                up: ctx.bytes_up.clone(),
                budget: ctx.budget.clone(),
            }),
            on_recorded: ctx.on_recorded.take(),
        }
    }

    /// The response was cut short by the secret guard (`e`): the record names why.
    fn cut(&mut self, e: &crate::secrets::SecretRefusal) {
        let r = crate::pipeline::secrets::refusal(e, self.record.rule.as_deref());
        self.record.error_code = Some(r.code);
        self.record.reason = Some(r.message);
    }

    /// The decision is made: the log line and the `ctl tail` event.
    fn decided(&self) {
        log::line(&self.record);
        self.proxy.events.publish(Arc::new(self.record.clone()));
    }

    /// Completes the record (`down` bytes sent to the agent) and counts it in the metrics.
    fn complete(mut self, down: u64, incomplete: bool) -> Completed {
        let r = &mut self.record;
        if let Some(open) = &self.open {
            r.ms = ms_since(open.started);
            r.bytes_up = open.up.load(Ordering::Relaxed);
            r.bytes_down = down;
            r.incomplete |= incomplete;
            if let Some(meter) = &open.budget {
                r.budget = Some(meter.settle(r.bytes_up));
            }
        }
        self.proxy
            .metrics
            .observe(r, self.policy.host_label(&r.host));
        Completed {
            proxy: self.proxy,
            record: self.record,
            on_recorded: self.on_recorded,
        }
    }

    /// Completes and writes the record, waiting until it is in the file. `false`: the
    /// audit log could not record it; the response must not go out.
    async fn now(self, down: u64) -> bool {
        let Completed {
            proxy,
            record,
            on_recorded,
        } = self.complete(down, false);
        // Only a record that is in the file lets the relay that waits for it start.
        let copy = on_recorded.as_ref().map(|_| record.clone());
        let written = match &proxy.audit {
            Some(audit) => audit.write(Entry::Record(Box::new(record))).await,
            None => true,
        };
        if let (true, Some(tx), Some(copy)) = (written, on_recorded, copy) {
            let _ = tx.send(copy);
        }
        written
    }

    /// Completes and queues the record without waiting (the client went away).
    fn detached(self, down: u64) {
        let c = self.complete(down, true);
        if let Some(audit) = &c.proxy.audit {
            audit.write_detached(Entry::Record(Box::new(c.record)));
        }
    }

    /// Completes and queues the record; the receiver resolves once it is in the file.
    /// `None`: nothing to wait for (no audit log, or dropped by design).
    fn submit(self, down: u64) -> Option<Submitted> {
        let c = self.complete(down, false);
        let audit = c.proxy.audit.clone()?;
        let written = audit.submit(Entry::Record(Box::new(c.record)))?;
        Some(Submitted { audit, written })
    }
}

/// A completed record, about to be written.
struct Completed {
    proxy: Arc<Proxy>,
    record: Record,
    on_recorded: Option<tokio::sync::oneshot::Sender<Record>>,
}

/// A record queued for the audit log and the acknowledgement that it was written.
pub(crate) struct Submitted {
    audit: Arc<crate::audit::Audit>,
    written: tokio::sync::oneshot::Receiver<()>,
}
