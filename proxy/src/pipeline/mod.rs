//! The request pipeline: classify (done by the connection) → policy → limit → inject →
//! forward → audit. Plain async functions, one per phase, over a per-request context.

pub(crate) mod record;
pub(crate) mod refusal;
pub(crate) mod target;

use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Instant;

use http_body_util::BodyExt;

use http::{Request, Response};
use hyper::body::Incoming;
use hyper_util::client::legacy::connect::HttpInfo;

use crate::audit::RequestEntry;
use crate::body::counted::CountedBody;
use crate::body::ready::{take_ready, Ready};
use crate::body::ProxyBody;
use crate::conn::ConnCtx;
use crate::control::approvals::{AskOutcome, PendingRequest};
use crate::control::events::{now_rfc3339, DecisionEvent};
use crate::policy::{normalize_path, Action, Decision, Policy, RequestFacts, Scheme};
use crate::proxy::Proxy;
use crate::ratelimit::{LimitKey, Limited};
use crate::secrets::phase::{Head, SecretPhase};
use crate::secrets::{SecretRefusal, Violation};
use record::{Finish, FinishedBody};
use refusal::{ErrorCode, Refusal};
use target::Target;

/// A response body up to this size that has fully arrived with its head is recorded and
/// sent whole (see `ready_body`); larger or still-arriving bodies stream.
const READY_BODY_LIMIT: usize = 64 * 1024;

/// What one request came to, for the response, the log and the event feed.
struct Outcome {
    target: Option<Target>,
    path: String,
    rule: Option<String>,
    /// `allow`, `deny`, `limited`, `ask-approved`, `ask-denied`, `ask-timeout`, `error`.
    label: &'static str,
    result: Result<Response<ProxyBody>, Refusal>,
    /// Secrets injected (names).
    secrets: Vec<Arc<str>>,
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
            secrets: Vec::new(),
        }
    }
}

/// Handles one HTTP request from the agent. Never fails: refusals become responses.
pub(crate) async fn handle(
    proxy: Arc<Proxy>,
    ctx: Arc<ConnCtx>,
    req: Request<Incoming>,
) -> Response<ProxyBody> {
    let started = Instant::now();
    let started_at = now_rfc3339();
    let request_id = format!("{:016x}", rand::random::<u64>());
    let policy = proxy.policy();
    let method = req.method().to_string();
    let head_only = req.method() == http::Method::HEAD;
    let query = req.uri().query().map(str::to_string);
    let up = Arc::new(AtomicU64::new(0));
    let mut out = run(&proxy, &ctx, &policy, req, &up).await;
    let ms = started.elapsed().as_secs_f64() * 1000.0;
    // The agent may have put a secret value in the method or the path; nothing shown or
    // logged carries it.
    let secrets = proxy.vault.current();
    let method = secrets.redact(&method).into_owned();
    if !secrets.is_empty() {
        out.path = secrets.redact(&out.path).into_owned();
        if let Err(r) = &mut out.result {
            r.message = secrets.redact(&r.message).into_owned();
            r.explanation = secrets.redact(&r.explanation).into_owned();
        }
    }
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
            let resp = refusal::render(&r, &request_id, policy.hash());
            (resp.status().as_u16(), Some(r.code.as_str()), None, resp)
        }
    };
    let (host, port, scheme) = match &out.target {
        Some(t) => (secrets.redact(&t.host).into_owned(), t.port, t.scheme_str()),
        None => (
            secrets.redact(&ctx.dest.host.to_string()).into_owned(),
            ctx.dest.port,
            if ctx.tls.is_some() { "https" } else { "http" },
        ),
    };
    // The audit log is the record of every request; this line is for the operator's eyes:
    // refusals and errors at info, allowed requests at debug.
    macro_rules! request_line {
        ($level:expr) => {
            tracing::event!(
                $level,
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
                secrets = %out.secrets.join(","),
                ms,
                "request {reason}"
            )
        };
    }
    if out.label == "allow" && error_code.is_none() {
        request_line!(tracing::Level::DEBUG);
    } else {
        request_line!(tracing::Level::INFO);
    }
    let secret_names: Vec<String> = out.secrets.iter().map(|s| s.to_string()).collect();
    let audited_path = crate::audit::shown_path(
        &out.path,
        query.as_deref().map(|q| secrets.redact(q)).as_deref(),
        proxy.audit_query_values,
    );
    let finish = Finish {
        proxy: proxy.clone(),
        host_label: policy.host_label(&host).to_string(),
        entry: RequestEntry {
            started: started_at,
            request_id: request_id.clone(),
            conn_id: ctx.id,
            agent_uid: ctx.agent_uid,
            dst: secrets.redact(&ctx.dest.to_string()).into_owned(),
            sni: ctx
                .tls
                .as_ref()
                .and_then(|t| t.sni.as_deref())
                .map(|s| secrets.redact(s).into_owned()),
            host: host.clone(),
            port,
            scheme,
            method: method.clone(),
            path: audited_path,
            decision: out.label,
            rule: out.rule.clone(),
            policy: policy.hash().to_string(),
            status,
            bytes_up: 0,
            bytes_down: 0,
            ms: 0.0,
            upstream: upstream.clone(),
            secrets: secret_names.clone(),
            error_code,
            incomplete: false,
        },
        started,
        up,
    };
    let audit_refusal = |request_id: &str| {
        refusal::render(
            &Refusal::new(
                ErrorCode::AuditUnavailable,
                "the audit log could not record this request, so its response is withheld",
            ),
            request_id,
            policy.hash(),
        )
    };
    let rid = request_id.clone();
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
        secrets: secret_names,
        ms,
    });
    // A response with no body to hold back is recorded before it is returned.
    let bodiless = head_only
        || resp.status().is_informational()
        || resp.status() == http::StatusCode::NO_CONTENT
        || resp.status() == http::StatusCode::NOT_MODIFIED
        || http_body::Body::is_end_stream(resp.body());
    if bodiless {
        if !finish.now(0).await {
            return audit_refusal(&rid);
        }
        return resp;
    }
    let (parts, body) = resp.into_parts();
    match take_ready(body, READY_BODY_LIMIT) {
        // All here: record it, then hand hyper the whole response for one write.
        Ready::Complete(bytes) => {
            if !finish.now(bytes.len() as u64).await {
                return audit_refusal(&rid);
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
                BodyExt::boxed(FinishedBody::new(body, finish, expected)),
            )
        }
    }
}

async fn run(
    proxy: &Proxy,
    ctx: &ConnCtx,
    policy: &Policy,
    req: Request<Incoming>,
    up: &Arc<AtomicU64>,
) -> Outcome {
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
                    crate::control::approvals::MAX_PENDING
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
        let why = proxy
            .vault
            .current()
            .redact(&decision.explanation)
            .into_owned();
        tracing::warn!(host = %target.host, rule = rule.as_deref().unwrap_or("(default)"), "report mode: would deny: {why}");
    }

    // secrets: where may the secrets this request carries go?
    let raw_pq = req
        .uri()
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_string();
    let head = Head {
        method: req.method().as_str(),
        host: &target.host,
        headers: req.headers(),
        path_and_query: &raw_pq,
        tls: target.scheme == Scheme::Https,
        upgrade: crate::upstream::client::wants_upgrade(&req),
    };
    let phase = match SecretPhase::inspect(&proxy.vault, decision.secrets.clone(), &head) {
        Ok(p) => p,
        Err(e) => {
            let r = secret_refusal(&e, rule.as_deref());
            tracing::warn!(secret = %e.secret, place = %e.place, code = r.code.as_str(), "refused: {}", r.message);
            let label = if r.code.is_secret_guard() {
                "deny"
            } else {
                "error"
            };
            return refuse(label, r);
        }
    };
    let used = phase.as_ref().map(|p| p.used.clone()).unwrap_or_default();

    // limit
    let mut keys = Vec::new();
    if let (Some(rate), Some(id)) = (decision.obligations.rate, decision.rule_id.as_ref()) {
        keys.push((LimitKey::Rule(id.clone()), rate.into()));
    }
    for name in &used {
        if let Some(rate) = policy.secret_rate(name) {
            keys.push((LimitKey::Secret(name.to_string()), rate.into()));
        }
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

    // inject
    let head_only = req.method() == http::Method::HEAD;
    let up = up.clone();
    let mut req = req.map(|b| BodyExt::boxed(CountedBody::new(crate::body::stream(b), up)));
    let mut query = req.uri().query().map(str::to_string);
    if let Some(phase) = &phase {
        let (r, q) = match phase.apply(req, proxy.scan_body_bytes).await {
            Ok(applied) => applied,
            Err(e) => {
                let r = secret_refusal(&e, rule.as_deref());
                tracing::warn!(secret = %e.secret, place = %e.place, code = r.code.as_str(), "refused: {}", r.message);
                return refuse("deny", r);
            }
        };
        req = r;
        if q.is_some() {
            query = q;
        }
        proxy.vault.record_use(&used);
    }

    // forward
    let path_and_query = match query {
        Some(q) => format!("{}?{q}", path.forward),
        None => path.forward,
    };
    let result = proxy
        .forwarder
        .forward(&target, &path_and_query, req)
        .await
        .map_err(|r| match phase.as_ref().and_then(|p| p.body_refusal()) {
            // The body guard stopped the upload: that, not the aborted stream, is the reason.
            Some(e) => secret_refusal(e, rule.as_deref()),
            None => r,
        })
        .and_then(|resp| match &phase {
            Some(phase) => phase
                .response(resp, head_only)
                .map_err(|why| Refusal::new(ErrorCode::UpstreamError, why)),
            None => Ok(resp),
        })
        .map(|resp| match permit {
            // The in-flight slot is held until the response body is done.
            Some(p) => resp.map(|b| crate::body::guarded(b, p)),
            None => resp,
        });
    let label = match &result {
        Ok(_) => label,
        Err(r) if r.code.is_secret_guard() => "deny",
        Err(_) => "error",
    };
    let result = result.map_err(|mut r| {
        if r.code.is_secret_guard() {
            r.rule_id = rule.clone();
        }
        r
    });
    Outcome {
        target: Some(target),
        path: shown,
        rule,
        label,
        result,
        secrets: used,
    }
}

/// The agent's view of a leak-guard refusal.
pub(crate) fn secret_refusal(e: &SecretRefusal, rule: Option<&str>) -> Refusal {
    let code = match e.violation {
        Violation::Scope => ErrorCode::SecretScope,
        Violation::Leak => ErrorCode::SecretLeak,
        Violation::Unavailable => ErrorCode::SecretUnavailable,
        Violation::Transport => ErrorCode::SecretScope,
    };
    Refusal {
        rule_id: rule.map(str::to_string),
        ..Refusal::new(code, e.message(rule))
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
    // The operator sees what the agent sent, with any secret value in it redacted.
    let shown = proxy.vault.current();
    proxy
        .approvals
        .ask(PendingRequest {
            id: String::new(),
            since: String::new(),
            client: ctx.client.to_string(),
            method: shown.redact(req.method().as_str()).into_owned(),
            host: shown.redact(&t.host).into_owned(),
            port: t.port,
            path: shown.redact(path).into_owned(),
            rule_id: d.rule_id.as_deref().unwrap_or("").to_string(),
        })
        .await
}
