//! One request through the proxy, as a list of phases over one [`RequestCtx`]:
//!
//! `record::ready` (the audit log can take the record) → `target` (which upstream,
//! SNI/Host/port agree, the path normalized, the head within
//! bounds) → `decide` (policy, and an operator for `ask`) → `dlp::inspect` (credentials in
//! the URL and headers go only home) → `mcp::request` (under a rule
//! with `mcp`: the JSON-RPC body read and decided) → `secrets::inspect` (where may
//! the secrets it carries go) → `budget` (a rule's LLM token budget) → `limit` (rates,
//! concurrency) → `dlp::body` (the body scanned as it streams) → `secrets::apply` (inject,
//! guard the body) → `forward` (upstream, redact
//! the response) → `mcp::response` (list results filtered) → `record` (the log line, the
//! `ctl tail` event, the audit entry and the metrics, from one [`crate::record::Record`]).
//!
//! Each phase is a function in a file named for it that goes on or returns a
//! [`refusal::Refusal`]; whatever happened, `record` runs once (if the client goes away
//! mid-pipeline, when its context is dropped). Raw TCP goes through the same `decide`,
//! `limit` and `record`; failed TLS handshakes and refusals by the HTTP server through
//! `record`.

mod budget;
pub(crate) mod decide;
pub(crate) mod dlp;
mod dlp_body;
mod forward;
pub(crate) mod limit;
mod mcp;
pub(crate) mod record;
pub(crate) mod refusal;
pub(crate) mod secrets;
pub(crate) mod target;
pub(crate) mod tunnel;

use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Instant;

use http::{Request, Response};
use hyper::body::Incoming;

use crate::body::ProxyBody;
use crate::policy::{Decision, Policy};
use crate::proxy::Proxy;
use crate::ratelimit::ConcurrencyPermit;
use crate::record::ConnCtx;
use crate::record::{Record, RequestId, Verdict};
use crate::upstream::target::Target;
use refusal::Refusal;
use secrets::SecretPhase;

/// What one request carries through the phases; `record` turns it into the record.
pub(crate) struct RequestCtx {
    pub proxy: Arc<Proxy>,
    pub conn: Arc<ConnCtx>,
    /// The policy in force when the request arrived; it keeps it to the end.
    pub policy: Arc<Policy>,
    pub id: RequestId,
    pub started: Instant,
    pub started_at: Arc<str>,
    pub method: http::Method,
    /// The path as shown: as received until `target` normalizes it, then the form sent
    /// upstream.
    pub path: String,
    /// The path as policy matches it (`NormalizedPath::matching`), once normalized.
    pub matching_path: String,
    /// The query sent upstream (injection may set parameters, a swap put values in).
    pub query: Option<String>,
    /// The path sent upstream when a swap put a value in it (`path` keeps the placeholder).
    pub upstream_path: Option<String>,
    /// The protocol the request asks to switch to (`Upgrade`), if any.
    pub upgrade: Option<Arc<str>>,
    pub target: Option<Target>,
    pub decision: Option<Decision>,
    /// Once decided and let through: `Allow`, or `AskApproved`.
    pub verdict: Option<Verdict>,
    pub secrets: Option<SecretPhase>,
    /// The credential check, unless the rule says `dlp = "off"` (`dlp.rs`).
    pub dlp: Option<Arc<dlp::DlpPhase>>,
    /// The rule's concurrency slot, held until the response body ends.
    pub permit: Option<ConcurrencyPermit>,
    /// Under a rule's token budget: what counts this request's tokens.
    pub budget: Option<Arc<crate::budget::Meter>>,
    /// Request body bytes sent upstream.
    pub bytes_up: Arc<AtomicU64>,
    /// Filled in by `forward` for an upgrade: the relay waits for the 101's record, then
    /// writes its close record.
    pub on_recorded: Option<tokio::sync::oneshot::Sender<Record>>,
    /// The record phase has taken the request; until then, dropping the context (the
    /// client went away mid-pipeline) records it as abandoned.
    pub recorded: bool,
    /// Under a rule with `mcp`: what the MCP phase read and decided.
    pub mcp: Option<mcp::McpExchange>,
}

/// Handles one HTTP request from the agent. Never fails: refusals become responses.
pub(crate) async fn handle(
    proxy: Arc<Proxy>,
    conn: Arc<ConnCtx>,
    req: Request<Incoming>,
) -> Response<ProxyBody> {
    let mut ctx = RequestCtx::new(proxy, conn, &req);
    let outcome = phases(&mut ctx, req).await.map_err(|mut r| {
        // A refusal after the decision (a limit, an upstream failure) names the rule that
        // matched, as a policy refusal does.
        if r.rule_id.is_none() {
            r.rule_id = ctx.rule().map(|id| id.to_string());
        }
        // An upstream failure's explanation says what the policy did (it allowed the
        // request) rather than repeating the message.
        let upstream = r.code.status() == http::StatusCode::BAD_GATEWAY;
        if let (true, Some(d)) = (upstream && r.explanation == r.message, &ctx.decision) {
            let decided = ctx
                .proxy
                .vault
                .current()
                .redact(&d.explanation)
                .into_owned();
            r.explanation = format!("{decided}: the request was allowed; the upstream failed it");
        }
        r
    });
    record::respond(ctx, outcome).await
}

type SendFuture<'a, T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send + 'a>>;

async fn phases(
    ctx: &mut RequestCtx,
    req: Request<Incoming>,
) -> Result<Response<ProxyBody>, Refusal> {
    record::ready(&ctx.proxy)?;
    target::find(ctx, &req)?;
    decide::request(ctx, &req).await?;
    dlp::inspect(ctx, &req)?;
    // Boxed as `dyn Send`: otherwise rustc cannot prove the whole request future `Send` for
    // every lifetime (the higher-ranked `Send` limitation, rust-lang/rust#64552).
    let read: SendFuture<'_, _> = Box::pin(mcp::request(ctx, req));
    let req = read.await?;
    secrets::inspect(ctx, &req).await?;
    budget::check(ctx).await?;
    limit::check(ctx).await?;
    let req = dlp::body(ctx, req).await?;
    let req = secrets::apply(ctx, req).await?;
    let forwarded = forward::forward(ctx, req).await?;
    let resp = forward::respond(ctx, forwarded)?;
    let filtered: SendFuture<'_, _> = Box::pin(mcp::response(ctx, resp));
    filtered.await
}

impl RequestCtx {
    fn new<B>(proxy: Arc<Proxy>, conn: Arc<ConnCtx>, req: &Request<B>) -> RequestCtx {
        RequestCtx {
            policy: proxy.policy(),
            proxy,
            conn,
            id: RequestId::random(),
            started: Instant::now(),
            started_at: crate::clock::now_rfc3339().into(),
            method: req.method().clone(),
            path: req.uri().path().to_string(),
            matching_path: String::new(),
            query: req.uri().query().map(str::to_string),
            upstream_path: None,
            upgrade: crate::upstream::client::upgrade_token(req).map(Arc::from),
            target: None,
            decision: None,
            verdict: None,
            secrets: None,
            dlp: None,
            permit: None,
            budget: None,
            bytes_up: Arc::new(AtomicU64::new(0)),
            on_recorded: None,
            recorded: false,
            mcp: None,
        }
    }

    /// The deciding rule's id, once decided.
    pub(crate) fn rule(&self) -> Option<&Arc<str>> {
        self.decision.as_ref().and_then(|d| d.rule_id.as_ref())
    }
}

impl Drop for RequestCtx {
    fn drop(&mut self) {
        if !self.recorded {
            record::abandoned(self);
        }
    }
}

#[cfg(test)]
#[path = "dlp_body_tests.rs"]
mod dlp_body_tests;
