//! The decide phase: what the policy says about a request or a raw connection, and for an
//! `ask` rule, what an operator says (a request waits for the answer; a raw connection
//! cannot wait, so `ask` refuses it like `deny`). Report mode lets would-be refusals through
//! with a warning.

use http::Request;

use super::refusal::Refusal;
use super::RequestCtx;
use crate::approvals::{AskOutcome, Asked};
use crate::policy::{Action, Decision, RequestFacts};
use crate::proxy::Proxy;
use crate::record::{ErrorCode, Verdict};

/// Decides an HTTP request; on `Ok`, `ctx.verdict` says whether it was allowed outright or
/// approved by an operator.
pub(super) async fn request<B>(ctx: &mut RequestCtx, req: &Request<B>) -> Result<(), Refusal> {
    let target = ctx.target.as_ref().expect("the target phase ran");
    let decision = ctx.policy.decide(&RequestFacts {
        host: &target.host,
        port: target.port,
        scheme: target.scheme,
        method: Some(req.method().as_str()),
        path: Some(&ctx.matching_path),
        agent: ctx.conn.agent_uid,
    });
    let what = || {
        format!(
            "{} {}://{}{}",
            req.method(),
            target.scheme_str(),
            target.authority(),
            ctx.path
        )
    };
    if decision.reported_deny {
        let why = ctx
            .proxy
            .vault
            .current()
            .redact(&decision.explanation)
            .into_owned();
        tracing::warn!(host = %target.host, rule = decision.rule_id.as_deref().unwrap_or(crate::record::NO_RULE), "report mode: would deny: {why}");
    }
    let action = decision.action;
    ctx.decision = Some(decision);
    let decision = ctx.decision.as_ref().expect("just set");
    let refused = |why: Option<&str>, verdict: Verdict| Refusal {
        verdict,
        ..policy_refusal(&what(), decision, why)
    };
    let outcome = match action {
        Action::Allow => Ok(Verdict::Allow),
        Action::Deny => Err(refused(None, Verdict::Deny)),
        Action::Ask => match ask(ctx, req).await {
            AskOutcome::Approved | AskOutcome::Remembered => Ok(Verdict::AskApproved),
            AskOutcome::AgentFull => {
                let why = format!(
                    "{} requests of this agent already wait for an operator",
                    ctx.proxy.approvals.per_agent()
                );
                Err(refused(Some(&why), Verdict::AskDenied))
            }
            AskOutcome::Full => {
                let why = format!(
                    "{} requests already wait for an operator",
                    ctx.proxy.approvals.total()
                );
                Err(refused(Some(&why), Verdict::AskDenied))
            }
            AskOutcome::Denied => Err(refused(Some("an operator denied it"), Verdict::AskDenied)),
            AskOutcome::TimedOut => {
                let why = format!(
                    "no operator approved it within {:?}",
                    ctx.proxy.approvals.timeout()
                );
                Err(refused(Some(&why), Verdict::AskTimeout))
            }
        },
    };
    ctx.verdict = Some(outcome?);
    Ok(())
}

/// What a raw TCP decision (`Policy::decide_tcp`) means once the connection is taken as raw TCP: go on, or the
/// refusal (`ask` refuses: a byte stream cannot be held for an operator). `shown`: the host
/// as logs may show it (redacted).
pub(crate) fn connection_outcome(d: &Decision, shown: &str, port: u16) -> Result<(), Refusal> {
    if d.reported_deny {
        tracing::warn!(
            host = shown,
            port,
            rule = d.rule_id.as_deref().unwrap_or(crate::record::NO_RULE),
            "report mode: would deny raw TCP: {}",
            d.explanation
        );
    }
    match d.action {
        Action::Allow => Ok(()),
        Action::Deny | Action::Ask => {
            let what = if shown.contains(':') {
                format!("TCP to [{shown}]:{port}")
            } else {
                format!("TCP to {shown}:{port}")
            };
            Err(policy_refusal(&what, d, None))
        }
    }
}

fn policy_refusal(what: &str, d: &Decision, why: Option<&str>) -> Refusal {
    Refusal {
        message: match why {
            _ if d.unavailable => format!("{what} is refused: {}", d.explanation),
            Some(why) => format!("{what} needs approval and {why}"),
            None => format!("{what} is not allowed by policy"),
        },
        rule_id: d.rule_id.as_deref().map(str::to_string),
        explanation: d.explanation.clone(),
        ..Refusal::new(
            if d.unavailable {
                ErrorCode::PolicyUnavailable
            } else {
                ErrorCode::PolicyDenied
            },
            "",
        )
    }
}

/// Parks the request until an operator answers (or the wait times out).
async fn ask<B>(ctx: &RequestCtx, req: &Request<B>) -> AskOutcome {
    let proxy: &Proxy = &ctx.proxy;
    let target = ctx.target.as_ref().expect("the target phase ran");
    proxy
        .events
        .counters
        .asked
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    // The operator sees what the agent sent, with any secret value in it redacted.
    let shown = proxy.vault.current();
    let path = shown.redact(&ctx.path);
    let query = ctx.query.as_deref().map(|q| shown.redact(q));
    // Query values never leave the machine in a notice, whatever the audit log keeps.
    let url = format!(
        "{}://{}{}",
        target.scheme_str(),
        shown.redact(&target.authority()),
        crate::audit::shown_path(&path, query.as_deref(), false)
    );
    proxy
        .approvals
        .ask(Asked {
            agent_uid: ctx.conn.agent_uid,
            client: ctx.conn.client,
            method: shown.redact(req.method().as_str()).into_owned(),
            host: shown.redact(&target.host).into_owned(),
            port: target.port,
            path: path.into_owned(),
            url,
            rule_id: ctx.rule().map(|r| r.to_string()).unwrap_or_default(),
        })
        .await
}
