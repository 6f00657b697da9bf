//! The request pipeline: classify (done by the connection) → policy → limit → inject →
//! forward → audit. Plain async functions, one per phase, over a per-request context.

use std::sync::Arc;
use std::time::Instant;

use http::{Request, Response};
use hyper::body::Incoming;
use hyper_util::client::legacy::connect::HttpInfo;

use crate::approvals::{AskOutcome, PendingRequest};
use crate::body::ProxyBody;
use crate::conn::ConnCtx;
use crate::deny::{self, ErrorCode, Refusal};
use crate::events::{now_rfc3339, DecisionEvent};
use crate::policy::{normalize_path, Action, Decision, Policy, RequestFacts};
use crate::ratelimit::{LimitKey, Limited};
use crate::state::Proxy;
use crate::target::{self, Target};

/// What one request came to, for the response, the log and the event feed.
struct Outcome {
    target: Option<Target>,
    path: String,
    rule: Option<String>,
    /// `allow`, `deny`, `limited`, `ask-approved`, `ask-denied`, `ask-timeout`, `error`.
    label: &'static str,
    result: Result<Response<ProxyBody>, Refusal>,
}

impl Outcome {
    fn refused(
        target: Option<Target>,
        path: String,
        rule: Option<String>,
        label: &'static str,
        r: Refusal,
    ) -> Outcome {
        Outcome {
            target,
            path,
            rule,
            label,
            result: Err(r),
        }
    }
}

/// Handles one HTTP request from the agent. Never fails: refusals become responses.
pub async fn handle(
    proxy: Arc<Proxy>,
    ctx: Arc<ConnCtx>,
    req: Request<Incoming>,
) -> Response<ProxyBody> {
    let started = Instant::now();
    let request_id = format!("{:016x}", rand::random::<u64>());
    let policy = proxy.policy();
    let method = req.method().to_string();
    let out = run(&proxy, &ctx, &policy, req).await;
    let ms = started.elapsed().as_secs_f64() * 1000.0;
    let reason = out
        .result
        .as_ref()
        .err()
        .map(|r| r.message.clone())
        .unwrap_or_default();
    let (status, error_code, upstream, resp) = match out.result {
        Ok(resp) => {
            // The address actually dialed, which the agent never chose.
            let upstream = resp
                .extensions()
                .get::<HttpInfo>()
                .map(|i| i.remote_addr().to_string());
            (resp.status().as_u16(), None, upstream, resp)
        }
        Err(r) => {
            let resp = deny::render(&r, &request_id, policy.hash());
            (resp.status().as_u16(), Some(r.code.as_str()), None, resp)
        }
    };
    let (host, port, scheme) = match &out.target {
        Some(t) => (t.host.clone(), t.port, t.scheme_str()),
        None => (
            ctx.dest.host.to_string(),
            ctx.dest.port,
            if ctx.tls.is_some() { "https" } else { "http" },
        ),
    };
    tracing::info!(
        request_id,
        %method,
        host,
        port,
        path = out.path,
        decision = out.label,
        rule = out.rule.as_deref().unwrap_or("(default)"),
        status,
        upstream = %upstream.as_deref().unwrap_or("-"),
        error_code = error_code.unwrap_or("-"),
        ms,
        "request {reason}"
    );
    proxy.events.publish(DecisionEvent {
        time: now_rfc3339(),
        request_id,
        conn_id: ctx.id,
        client: ctx.client.to_string(),
        decision: out.label,
        method,
        scheme,
        host,
        port,
        path: out.path,
        rule_id: out.rule,
        status,
        error_code,
        upstream,
        ms,
    });
    resp
}

async fn run(proxy: &Proxy, ctx: &ConnCtx, policy: &Policy, req: Request<Incoming>) -> Outcome {
    let raw_path = req.uri().path().to_string();
    let target = match target::for_request(ctx, &req) {
        Ok(t) => t,
        Err(r) => return Outcome::refused(None, raw_path, None, "deny", r),
    };
    let path = match normalize_path(req.uri().path()) {
        Ok(p) => p,
        Err(e) => {
            let r = Refusal::new(ErrorCode::BadRequest, format!("invalid request path: {e}"));
            return Outcome::refused(Some(target), raw_path, None, "deny", r);
        }
    };
    let decision = policy.decide(&RequestFacts {
        host: &target.host,
        port: target.port,
        scheme: target.scheme,
        method: Some(req.method().as_str()),
        path: Some(&path.matching),
    });
    let rule = decision.rule_id.as_deref().map(str::to_string);
    let shown = path.forward.clone();
    let refuse =
        |label, r| Outcome::refused(Some(target.clone()), shown.clone(), rule.clone(), label, r);

    // policy
    let label = match decision.action {
        Action::Allow => "allow",
        Action::Deny => {
            return refuse(
                "deny",
                policy_refusal(&req, &target, &shown, &decision, None),
            )
        }
        Action::Ask => match ask(proxy, ctx, &req, &target, &shown, &decision).await {
            AskOutcome::Approved | AskOutcome::Remembered => "ask-approved",
            AskOutcome::Full => {
                let why = format!(
                    "{} requests already wait for an operator",
                    crate::approvals::MAX_PENDING
                );
                let r = policy_refusal(&req, &target, &shown, &decision, Some(&why));
                return refuse("ask-denied", r);
            }
            AskOutcome::Denied => {
                let r = policy_refusal(
                    &req,
                    &target,
                    &shown,
                    &decision,
                    Some("an operator denied it"),
                );
                return refuse("ask-denied", r);
            }
            AskOutcome::TimedOut => {
                let why = format!(
                    "no operator approved it within {:?}",
                    proxy.approvals.timeout()
                );
                let r = policy_refusal(&req, &target, &shown, &decision, Some(&why));
                return refuse("ask-timeout", r);
            }
        },
    };
    if decision.reported_deny {
        tracing::warn!(host = %target.host, rule = rule.as_deref().unwrap_or("(default)"), "report mode: would deny: {}", decision.explanation);
    }

    // limit
    let mut keys = Vec::new();
    if let (Some(rate), Some(id)) = (decision.obligations.rate, decision.rule_id.as_ref()) {
        keys.push((LimitKey::Rule(id.clone()), rate.into()));
    }
    if let Err(l) = proxy.limiter.check(&keys) {
        return refuse("limited", limited_refusal(&l, &target));
    }
    let permit = match decision.obligations.max_concurrent {
        Some(max) => match proxy.caps.acquire(&target.host, max) {
            Ok(p) => Some(p),
            Err(_) => {
                let r = Refusal {
                    retry_after: Some(1),
                    ..Refusal::new(
                        ErrorCode::RateLimited,
                        format!(
                            "{} already has {max} requests in flight (rule limit)",
                            target.host
                        ),
                    )
                };
                return refuse("limited", r);
            }
        },
        None => None,
    };

    // forward (inject arrives with the secrets issue)
    let path_and_query = match req.uri().query() {
        Some(q) => format!("{}?{q}", path.forward),
        None => path.forward,
    };
    let result = proxy
        .forwarder
        .forward(&target, &path_and_query, req)
        .await
        .map(|resp| match permit {
            // The in-flight slot is held until the response body is done.
            Some(p) => resp.map(|b| crate::body::guarded(b, p)),
            None => resp,
        });
    let label = if result.is_err() { "error" } else { label };
    Outcome {
        target: Some(target),
        path: shown,
        rule,
        label,
        result,
    }
}

fn policy_refusal<B>(
    req: &Request<B>,
    t: &Target,
    path: &str,
    d: &Decision,
    why: Option<&str>,
) -> Refusal {
    let what = format!(
        "{} {}://{}{}",
        req.method(),
        t.scheme_str(),
        t.authority(),
        path
    );
    Refusal {
        code: ErrorCode::PolicyDenied,
        message: match why {
            Some(why) => format!("{what} needs approval and {why}"),
            None => format!("{what} is not allowed by policy"),
        },
        rule_id: d.rule_id.as_deref().map(str::to_string),
        explanation: d.explanation.clone(),
        retry_after: None,
    }
}

fn limited_refusal(l: &Limited, t: &Target) -> Refusal {
    Refusal {
        retry_after: Some(l.retry_after_secs()),
        ..Refusal::new(
            ErrorCode::RateLimited,
            format!(
                "rate limit of {} reached for {}; retry in {} s",
                l.key,
                t.host,
                l.retry_after_secs()
            ),
        )
    }
}

async fn ask<B>(
    proxy: &Proxy,
    ctx: &ConnCtx,
    req: &Request<B>,
    t: &Target,
    path: &str,
    d: &Decision,
) -> AskOutcome {
    proxy
        .events
        .counters
        .asked
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    proxy
        .approvals
        .ask(PendingRequest {
            id: String::new(),
            since: String::new(),
            client: ctx.client.to_string(),
            method: req.method().to_string(),
            host: t.host.clone(),
            port: t.port,
            path: path.to_string(),
            rule_id: d.rule_id.as_deref().unwrap_or("").to_string(),
        })
        .await
}
