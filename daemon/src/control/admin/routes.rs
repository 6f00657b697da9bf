//! Admin endpoints. Every response is JSON; `GET /v1/tail?follow=1` streams one JSON event
//! per line.

use std::collections::HashMap;

use bytes::Bytes;
use futures_util::StreamExt;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::{Frame, Incoming};
use serde::Serialize;

use super::caller::Caller;
use super::Admin;
use crate::audit::ReloadTrigger;
use crate::body::{full, ProxyBody};
use crate::control::policy_check::check;
use crate::control::reload::reload;
use crate::events::SharedEvent;
use crate::record::{Record, Verdict};

pub(super) fn json<T: Serialize>(status: StatusCode, value: &T) -> Response<ProxyBody> {
    let mut body = serde_json::to_vec(value).unwrap_or_else(|_| b"{}".to_vec());
    body.push(b'\n');
    let mut r = Response::new(full(Bytes::from(body)));
    *r.status_mut() = status;
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    r
}

pub(super) fn error(status: StatusCode, message: impl Into<String>) -> Response<ProxyBody> {
    json(status, &serde_json::json!({ "error": message.into() }))
}

pub(super) fn forbidden(why: &str) -> Response<ProxyBody> {
    error(StatusCode::FORBIDDEN, format!("permission denied: {why}"))
}

pub(super) async fn route(
    admin: &Admin,
    caller: &Caller,
    req: Request<Incoming>,
) -> Response<ProxyBody> {
    let path = req.uri().path().to_string();
    let query = parse_query(req.uri().query());
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    match (req.method().clone(), segments.as_slice()) {
        (Method::GET, ["v1", "status"]) => status(admin).await,
        (Method::POST, ["v1", "reload"]) => {
            tracing::info!(caller = %caller, "reload requested over the admin API");
            match reload(&admin.proxy, ReloadTrigger::CtlReload) {
                Ok(p) => json(
                    StatusCode::OK,
                    &serde_json::json!({"ok": true, "hash": p.hash(), "rules": p.rule_count()}),
                ),
                Err(e) => error(StatusCode::UNPROCESSABLE_ENTITY, e.to_string()),
            }
        }
        (Method::GET, ["v1", "stats"]) => json(StatusCode::OK, &stats(admin)),
        (Method::GET, ["v1", "policy"]) => {
            let mut v = serde_json::to_value(admin.proxy.policies.info()).unwrap_or_default();
            v["rule_list"] = serde_json::to_value(admin.proxy.policy().rules()).unwrap_or_default();
            json(StatusCode::OK, &v)
        }
        (Method::POST, ["v1", "policy", "check"]) => policy_check(admin, req).await,
        (Method::GET, ["v1", "tail"]) => tail(admin, &query),
        (Method::GET, ["v1", "secrets"]) => super::secrets::list(admin),
        (Method::PUT, ["v1", "secrets", name]) => {
            let name = name.to_string();
            super::secrets::set(admin, caller, &name, req).await
        }
        (Method::DELETE, ["v1", "secrets", name]) => {
            super::secrets::remove(admin, caller, name).await
        }
        (Method::GET, ["v1", "mcp", "pins"]) => super::mcp::list(admin),
        (Method::POST, ["v1", "mcp", "accept"]) => super::mcp::accept(admin, caller, req).await,
        (Method::GET, ["v1", "pending"]) => json(StatusCode::OK, &admin.proxy.approvals.list()),
        (Method::POST, ["v1", "pending", id, verb @ ("approve" | "deny")]) => {
            let approve = *verb == "approve";
            let remember = query
                .get("remember")
                .is_some_and(|v| v == "1" || v == "true");
            match admin.proxy.approvals.decide(id, approve, remember) {
                Ok(p) => {
                    tracing::info!(caller = %caller, pending = %id, approve, remember, agent = %p.asked.agent_uid.map_or_else(|| "-".to_string(), |u| u.to_string()), method = %p.asked.method, host = %p.asked.host, path = p.asked.path.as_str(), "approval answered");
                    json(StatusCode::OK, &p)
                }
                Err(e) => error(StatusCode::NOT_FOUND, e.to_string()),
            }
        }
        _ => error(StatusCode::NOT_FOUND, format!("no such endpoint: {path}")),
    }
}

#[derive(Serialize)]
struct Status {
    version: &'static str,
    pid: u32,
    uptime_secs: u64,
    listeners: Listeners,
    firewall: Firewall,
    /// The CA whose leaves the agent sees.
    ca: CaInfo,
    audit: Option<AuditHead>,
    policy: crate::policy::PolicyInfo,
    counts: crate::events::CountersSnapshot,
    pending: usize,
    /// Raw TCP relays and upgraded connections open now.
    tunnels: usize,
    /// `[ratelimit] store`, when set: whether it answers.
    ratelimit_store: Option<crate::ratelimit::StoreStatus>,
    /// Token budgets' counters in windows not yet over (`budget/`).
    budgets: Vec<crate::budget::Spend>,
}

#[derive(Serialize)]
struct CaInfo {
    path: String,
    sha256: String,
}

#[derive(Serialize)]
struct Listeners {
    transparent: Vec<String>,
    explicit: String,
    /// The DNS stub's addresses (UDP and TCP on each); empty: no stub.
    dns: Vec<String>,
    /// `None`: no metrics listener.
    metrics: Option<String>,
    admin: String,
    /// The HTTPS admin listener (`listen.admin_https`); `None`: off.
    admin_https: Option<String>,
}

/// Where the audit chain stands: a reviewer who keeps this elsewhere can later show that
/// nothing up to it was rewritten (`ctl audit verify` ends at the same hash).
#[derive(Serialize)]
struct AuditHead {
    path: String,
    seq: u64,
    hash: String,
    /// Whether it can take records now; while not, requests are refused.
    ready: bool,
    /// Why not.
    problem: Option<String>,
    /// `[[audit.export]]` sinks: what each shipped and whether it can.
    export: Vec<crate::audit::export::ExportStatus>,
}

#[derive(Serialize)]
struct Firewall {
    enabled: bool,
    state: String,
    agent_uids: Vec<u32>,
}

async fn status(admin: &Admin) -> Response<ProxyBody> {
    let info = &admin.info;
    let firewall = match &info.firewall {
        None => Firewall {
            enabled: false,
            state: "disabled".into(),
            agent_uids: Vec::new(),
        },
        Some(view) => Firewall {
            enabled: true,
            state: view.state().await,
            agent_uids: view.agent_uids().to_vec(),
        },
    };
    json(
        StatusCode::OK,
        &Status {
            version: env!("CARGO_PKG_VERSION"),
            pid: std::process::id(),
            uptime_secs: info.started.elapsed().as_secs(),
            listeners: Listeners {
                transparent: info.transparent.iter().map(ToString::to_string).collect(),
                explicit: info.explicit.to_string(),
                dns: info.dns.iter().map(ToString::to_string).collect(),
                metrics: info.metrics.map(|m| m.to_string()),
                admin: info.socket.display().to_string(),
                admin_https: info.admin_https.map(|a| a.to_string()),
            },
            firewall,
            ca: CaInfo {
                path: info.ca_path.display().to_string(),
                sha256: admin.proxy.leaves.ca().fingerprint_sha256(),
            },
            audit: admin.proxy.audit.as_ref().map(|a| {
                let head = a.head();
                let ready = a.ready();
                AuditHead {
                    path: a.path().display().to_string(),
                    seq: head.seq,
                    hash: head.hash,
                    ready: ready.is_ok(),
                    problem: ready.err().map(|e| e.to_string()),
                    export: a.export_status(),
                }
            }),
            policy: admin.proxy.policies.info(),
            counts: admin.proxy.events.counters.snapshot(),
            pending: admin.proxy.approvals.len(),
            tunnels: admin.proxy.tunnels.len(),
            ratelimit_store: admin.proxy.fleet.as_ref().map(|f| f.status()),
            budgets: admin.proxy.tokens.snapshot(),
        },
    )
}

fn stats(admin: &Admin) -> serde_json::Value {
    let leaves = &admin.proxy.leaves;
    serde_json::json!({
        "counts": admin.proxy.events.counters.snapshot(),
        "uptime_secs": admin.info.started.elapsed().as_secs(),
        "leaf_certificates": { "minted": leaves.minted(), "cache_hits": leaves.hits(), "cache_misses": leaves.misses() },
        "pending": admin.proxy.approvals.len(),
    })
}

async fn policy_check(admin: &Admin, req: Request<Incoming>) -> Response<ProxyBody> {
    #[derive(serde::Deserialize)]
    struct Ask {
        method: String,
        url: String,
        #[serde(default)]
        agent: Option<u32>,
        /// An MCP call to check too (`ctl policy check --mcp-tool`).
        #[serde(default)]
        mcp: Option<crate::control::policy_check::McpCall>,
    }
    let body = match req.into_body().collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => return error(StatusCode::BAD_REQUEST, e.to_string()),
    };
    let ask: Ask = match serde_json::from_slice(&body) {
        Ok(a) => a,
        Err(e) => {
            return error(
                StatusCode::BAD_REQUEST,
                format!("expected {{method, url}}: {e}"),
            )
        }
    };
    let denied = admin.proxy.dns.denied;
    let policy = admin.proxy.policy();
    let checked = match &ask.mcp {
        Some(call) => crate::control::policy_check::check_mcp(
            &policy,
            &ask.method,
            &ask.url,
            ask.agent,
            denied,
            call,
        ),
        None => check(&policy, &ask.method, &ask.url, ask.agent, denied),
    };
    match checked {
        Ok(r) => json(StatusCode::OK, &r),
        Err(e) => error(StatusCode::BAD_REQUEST, e.to_string()),
    }
}

fn tail(admin: &Admin, query: &HashMap<String, String>) -> Response<ProxyBody> {
    let decision = match query.get("decision").map(|d| Verdict::parse(d).ok_or(d)) {
        None => None,
        Some(Ok(v)) => Some(v),
        Some(Err(d)) => {
            let valid: Vec<&str> = Verdict::ALL.iter().map(|v| v.as_str()).collect();
            return error(
                StatusCode::BAD_REQUEST,
                format!("no decision {d:?}; one of: {}", valid.join(", ")),
            );
        }
    };
    let host = query.get("host").cloned();
    let keep = move |e: &Record| {
        decision.is_none_or(|d| e.decision == d) && host.as_deref().is_none_or(|h| &*e.host == h)
    };
    let line = |e: &SharedEvent| {
        let mut v = serde_json::to_vec(e).unwrap_or_default();
        v.push(b'\n');
        Bytes::from(v)
    };
    let lines = match query.get("n").map(|n| n.parse::<usize>()) {
        None => usize::MAX,
        Some(Ok(n)) => n,
        Some(Err(_)) => {
            return error(StatusCode::BAD_REQUEST, "n must be a whole number of lines");
        }
    };
    let mut recent: Vec<Bytes> = admin
        .proxy
        .events
        .recent()
        .iter()
        .filter(|e| keep(e))
        .map(&line)
        .collect();
    // The last `n` of the backlog.
    recent.drain(..recent.len().saturating_sub(lines));
    if !query.get("follow").is_some_and(|v| v == "1" || v == "true") {
        let body: Vec<u8> = recent.concat();
        let mut r = Response::new(full(Bytes::from(body)));
        r.headers_mut().insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("application/x-ndjson"),
        );
        return r;
    }
    let rx = admin.proxy.events.subscribe();
    let live = futures_util::stream::unfold(rx, |mut rx| async move {
        loop {
            match rx.recv().await {
                Ok(ev) => return Some((ev, rx)),
                // A slow reader skips what it missed rather than stalling the daemon.
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => continue,
                Err(tokio::sync::broadcast::error::RecvError::Closed) => return None,
            }
        }
    })
    .filter(move |e| std::future::ready(keep(e)))
    .map(move |e| Ok::<_, crate::body::BodyError>(Frame::data(line(&e))));
    let stream =
        futures_util::stream::iter(recent.into_iter().map(|b| Ok(Frame::data(b)))).chain(live);
    let mut r = Response::new(BodyExt::boxed(StreamBody::new(stream)));
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/x-ndjson"),
    );
    r
}

fn parse_query(q: Option<&str>) -> HashMap<String, String> {
    q.unwrap_or("")
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            let dec = |s: &str| {
                percent_encoding::percent_decode_str(s)
                    .decode_utf8_lossy()
                    .into_owned()
            };
            (dec(k), dec(v))
        })
        .collect()
}
