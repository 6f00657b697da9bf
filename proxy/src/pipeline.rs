//! The request pipeline: classify (done by the connection) → policy → limit → inject →
//! forward → audit. Plain async functions, one per phase, over a per-request context.

use std::sync::Arc;
use std::time::Instant;

use http::{Request, Response};
use hyper::body::Incoming;
use hyper_util::client::legacy::connect::HttpInfo;

use crate::body::ProxyBody;
use crate::conn::ConnCtx;
use crate::deny::{self, ErrorCode, Refusal};
use crate::policy::{normalize_path, Action, Policy, RequestFacts};
use crate::state::Proxy;
use crate::target::{self, Target};

/// Handles one HTTP request from the agent. Never fails: refusals become responses.
pub async fn handle(
    proxy: Arc<Proxy>,
    ctx: Arc<ConnCtx>,
    req: Request<Incoming>,
) -> Response<ProxyBody> {
    let started = Instant::now();
    let request_id = new_request_id();
    let policy = proxy.policy();
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let outcome = run(&proxy, &ctx, &policy, req).await;
    let ms = started.elapsed().as_secs_f64() * 1000.0;
    match outcome {
        Ok((resp, target, rule)) => {
            // The address actually dialed, which the agent never chose.
            let upstream = resp
                .extensions()
                .get::<HttpInfo>()
                .map(|i| i.remote_addr().to_string());
            tracing::info!(
                request_id,
                %method,
                host = %target.host,
                port = target.port,
                path,
                decision = "allow",
                rule = rule.as_deref().unwrap_or("(default)"),
                status = resp.status().as_u16(),
                upstream = %upstream.as_deref().unwrap_or("-"),
                ms,
                "request"
            );
            resp
        }
        Err(refusal) => {
            tracing::info!(
                request_id,
                %method,
                path,
                decision = "refuse",
                error_code = refusal.code.as_str(),
                rule = refusal.rule_id.as_deref().unwrap_or(""),
                status = refusal.code.status().as_u16(),
                reason = %refusal.message,
                ms,
                "request"
            );
            deny::render(&refusal, &request_id, policy.hash())
        }
    }
}

type Allowed = (Response<ProxyBody>, Target, Option<String>);

async fn run(
    proxy: &Proxy,
    ctx: &ConnCtx,
    policy: &Policy,
    req: Request<Incoming>,
) -> Result<Allowed, Refusal> {
    let target = target::for_request(ctx, &req)?;
    let path = normalize_path(req.uri().path())
        .map_err(|e| Refusal::new(ErrorCode::BadRequest, format!("invalid request path: {e}")))?;

    let decision = policy.decide(&RequestFacts {
        host: &target.host,
        port: target.port,
        scheme: target.scheme,
        method: Some(req.method().as_str()),
        path: Some(&path.matching),
    });
    let rule = decision.rule_id.as_deref().map(str::to_string);
    if decision.action == Action::Deny {
        return Err(Refusal {
            code: ErrorCode::PolicyDenied,
            message: format!(
                "{} {}://{}{} is not allowed by policy",
                req.method(),
                target.scheme_str(),
                target.authority(),
                path.forward
            ),
            rule_id: rule,
            explanation: decision.explanation,
        });
    }
    if decision.reported_deny {
        tracing::warn!(
            host = %target.host,
            rule = rule.as_deref().unwrap_or("(default)"),
            "report mode: would deny: {}",
            decision.explanation
        );
    }

    let path_and_query = match req.uri().query() {
        Some(q) => format!("{}?{q}", path.forward),
        None => path.forward,
    };
    let resp = proxy
        .forwarder
        .forward(&target, &path_and_query, req)
        .await?;
    Ok((resp, target, rule))
}

fn new_request_id() -> String {
    format!("{:016x}", rand::random::<u64>())
}
