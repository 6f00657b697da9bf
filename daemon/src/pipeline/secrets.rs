//! The secrets phase, in two steps around the limits: `inspect` checks where the secrets a
//! request carries may go (before limits, which count per secret); `apply` injects what the
//! rule binds and puts the leak guard on the body (after limits, so a refused request costs
//! no injection). After forwarding, `sign` signs the request again where the rule has AWS
//! keys, and `response` redacts what comes back. [`SecretPhase`] is what the phase keeps of
//! one request between those steps; the work is the engine's (`crate::secrets`: `guard`,
//! `rewrite`, `vault`).

use std::sync::{Arc, Mutex, OnceLock};

use http::{header, HeaderValue, Request, Response};
use http_body_util::BodyExt;

use super::refusal::Refusal;
use super::RequestCtx;
use crate::body::counted::CountedBody;
use crate::body::ProxyBody;
use crate::policy::{Scheme, SecretBindings};
use crate::record::ErrorCode;
use crate::secrets::guard::redact::{self, EncodedResponse, Mode};
use crate::secrets::guard::scan::inspect_head;
use crate::secrets::guard::scan_body::ScannedBody;
use crate::secrets::rewrite::inject::{self, Url};
use crate::secrets::rewrite::sigv4::{self, Resign};
use crate::secrets::rewrite::swap::BodySwap;
use crate::secrets::rewrite::websocket::{offered_extensions_removed, FrameGuard};
use crate::secrets::set::SecretSet;
use crate::secrets::vault::Vault;
use crate::secrets::{Place, SecretRefusal, Violation};

pub(super) async fn inspect<B>(ctx: &mut RequestCtx, req: &Request<B>) -> Result<(), Refusal> {
    let bindings = ctx.decision.as_ref().and_then(|d| d.secrets.clone());
    if let (Some(_), Some(d)) = (&bindings, &ctx.decision) {
        // Whose requests the rule's secrets serve (`conn::identity`): refused, never sent on
        // without them.
        ctx.proxy
            .identities
            .secrets(ctx.conn.agent_uid, d.names_agents, d.rule_id.as_deref())?;
    }
    if let Some(b) = &bindings {
        // A fetched secret the rule binds (a command's output, an OAuth2 token) must have a
        // value in force before anything is checked or swapped.
        // Boxed: fetching is a large future, and most requests bind no secret; unboxed it
        // made every request's future several KiB larger (copied on each start).
        let fresh = Box::pin(ctx.proxy.vault.fresh(&b.needs)).await;
        fresh.map_err(|e| refused(ctx, &e))?;
    }
    let target = ctx.target.as_ref().expect("the target phase ran");
    let raw_pq = req.uri().path_and_query().map_or("/", |p| p.as_str());
    let head = Head {
        method: req.method().as_str(),
        host: &target.host,
        headers: req.headers(),
        path_and_query: raw_pq,
        tls: target.scheme == Scheme::Https,
        upgrade: ctx.upgrade.as_deref(),
    };
    ctx.secrets =
        SecretPhase::inspect(&ctx.proxy.vault, bindings, &head).map_err(|e| refused(ctx, &e))?;
    Ok(())
}

/// Counts the body going up, injects, swaps, and guards the body; the path and query sent
/// upstream may change (`ctx.upstream_path`, `ctx.query`).
pub(super) async fn apply(
    ctx: &mut RequestCtx,
    req: Request<ProxyBody>,
) -> Result<Request<ProxyBody>, Refusal> {
    let up = ctx.bytes_up.clone();
    let req = req.map(|b| BodyExt::boxed(CountedBody::new(b, up)));
    let Some(phase) = &ctx.secrets else {
        return Ok(req);
    };
    let (req, url) = phase
        .apply(
            req,
            &ctx.path,
            ctx.query.as_deref(),
            ctx.proxy.scan_body_bytes,
        )
        .await
        .map_err(|e| refused(ctx, &e))?;
    if url.query.is_some() {
        ctx.query = url.query;
    }
    ctx.upstream_path = url.path;
    ctx.proxy.vault.record_use(&phase.used);
    Ok(req)
}

/// The body guard reads up to this much of a body before the request head goes upstream…
const PREFETCH_BYTES: usize = 64 * 1024;
/// …waiting at most this long for it; the rest is checked as it streams.
const PREFETCH_WAIT: std::time::Duration = std::time::Duration::from_millis(100);

/// What the head check looks at.
pub(crate) struct Head<'a> {
    pub method: &'a str,
    pub host: &'a str,
    pub headers: &'a http::HeaderMap,
    /// As received.
    pub path_and_query: &'a str,
    /// The request goes upstream over TLS.
    pub tls: bool,
    /// The protocol the request asks to switch to, if any.
    pub upgrade: Option<&'a str>,
}

pub(crate) struct SecretPhase {
    set: Arc<SecretSet>,
    bindings: Option<Arc<SecretBindings>>,
    /// Bound secrets the request carries upstream (injected or swapped), sorted.
    pub used: Vec<Arc<str>>,
    /// Set when the body guard refused the request body.
    body_verdict: Arc<OnceLock<SecretRefusal>>,
    /// Bound secrets whose placeholders were swapped in the body (known as it streams).
    body_used: Arc<Mutex<Vec<Arc<str>>>>,
    /// The request goes upstream over TLS: only then is a placeholder swapped in content.
    tls: bool,
    /// The request asks to switch to a WebSocket.
    websocket: bool,
    /// The request is signed with the placeholder of the rule's AWS key id: it is signed
    /// again as it goes upstream.
    resign: Option<Resign>,
}

impl SecretPhase {
    /// Checks the request head; `Ok(None)` when there is nothing to guard (no secrets held,
    /// none bound), which keeps the data path free of any secret work.
    pub(crate) fn inspect(
        vault: &Vault,
        bindings: Option<Arc<SecretBindings>>,
        head: &Head<'_>,
    ) -> Result<Option<SecretPhase>, SecretRefusal> {
        let set = vault.current();
        if set.is_empty() && bindings.is_none() {
            return Ok(None);
        }
        let keys = bindings.as_ref().and_then(|b| b.sigv4.as_ref());
        let resign = match keys {
            Some(k) => sigv4::plan(&set, k, head.headers, head.path_and_query)?,
            None => None,
        };
        // The signature the proxy replaces is not checked as a header: its placeholder is
        // what the rule's `sigv4` answers.
        let checked;
        let headers = match &resign {
            Some(_) => {
                checked = sigv4::head_for_check(head.headers);
                &checked
            }
            None => head.headers,
        };
        let mut scan = inspect_head(
            &set,
            bindings.as_deref(),
            head.method,
            head.host,
            headers,
            head.path_and_query,
        )?;
        if let Some(r) = &resign {
            scan.used.extend(r.secrets().cloned());
            scan.used.sort();
            scan.used.dedup();
        }
        let phase = SecretPhase {
            set,
            bindings,
            resign,
            used: scan.used,
            body_verdict: Arc::default(),
            body_used: Arc::default(),
            tls: head.tls,
            websocket: head
                .upgrade
                .is_some_and(|u| u.trim().eq_ignore_ascii_case("websocket")),
        };
        // Where a bound secret goes, the channel must protect it: injected or swapped values
        // only over TLS, and no upgrade but a WebSocket (whose messages are guarded and
        // redacted one by one; other protocols' bytes are not understood).
        let transport = |place: Place| {
            let secret = phase.used.first().map(|s| s.to_string()).or_else(|| {
                let b = phase.bindings.as_ref()?;
                b.names.first().map(|s| s.to_string())
            });
            SecretRefusal {
                violation: Violation::Transport,
                secret: secret.unwrap_or_default(),
                place,
            }
        };
        if !phase.used.is_empty() && !head.tls {
            return Err(transport(Place::PlainHttp));
        }
        if let Some(proto) = head.upgrade.filter(|_| !phase.websocket && phase.binds()) {
            return Err(transport(Place::Upgrade(proto.escape_debug().to_string())));
        }
        Ok(Some(phase))
    }

    /// Whether the rule binds secrets (its upstream has them and could echo them): its
    /// responses are asked for unencoded and have values replaced; and WebSockets are relayed
    /// message by message.
    fn binds(&self) -> bool {
        self.bindings.is_some() && !self.set.is_empty()
    }

    /// Injects and swaps (headers, path, query) and puts the leak guard, and the swap where
    /// the rule has one, on the body. `path` and `query` are what would go upstream; returns
    /// the request and the URL's changes.
    pub(crate) async fn apply(
        &self,
        req: Request<ProxyBody>,
        path: &str,
        query: Option<&str>,
        scan_body_bytes: usize,
    ) -> Result<(Request<ProxyBody>, Url), SecretRefusal> {
        let (mut parts, body) = req.into_parts();
        let mut url = Url::default();
        if let Some(b) = &self.bindings {
            url = inject::apply(&self.set, b, &mut parts.headers, path, query);
        }
        if self.binds() {
            // A compressed response could not be searched for echoed secrets, nor a
            // compressed WebSocket message.
            parts.headers.insert(
                header::ACCEPT_ENCODING,
                HeaderValue::from_static("identity"),
            );
            if self.websocket {
                offered_extensions_removed(&mut parts.headers);
            }
        }
        let has_body = !http_body::Body::is_end_stream(&body);
        let swaps_body = self.bindings.as_ref().is_some_and(|b| b.swap.body);
        let swap = BodySwap::for_body(&parts.headers, swaps_body, self.tls);
        let body = if has_body && (scan_body_bytes > 0 || swap.swaps()) {
            let mut scanned = ScannedBody::new(
                body,
                self.set.clone(),
                self.bindings.clone(),
                scan_body_bytes,
                self.body_verdict.clone(),
                swap.clone(),
                self.body_used.clone(),
            );
            let first = if swap.swaps() {
                PREFETCH_BYTES
            } else {
                PREFETCH_BYTES.min(scan_body_bytes)
            };
            let whole = scanned.prefetch(first, PREFETCH_WAIT).await?;
            if swap.swaps() {
                // The swap may change the length: stated when the whole body was read
                // already, else the body is re-framed (chunked, or HTTP/2 DATA to its end).
                parts.headers.remove(header::CONTENT_LENGTH);
                if let Some(n) = whole {
                    parts
                        .headers
                        .insert(header::CONTENT_LENGTH, HeaderValue::from(n));
                }
            }
            BodyExt::boxed(scanned)
        } else {
            body
        };
        Ok((Request::from_parts(parts, body), url))
    }

    /// Whether the request is signed again (`sign`) before it goes upstream.
    pub(crate) fn signs(&self) -> bool {
        self.resign.is_some()
    }

    /// Signs the request again with the rule's AWS keys, as it will be sent: `uri` is the
    /// full URL upstream; hop-by-hop headers must be gone already.
    pub(crate) async fn sign(
        &self,
        req: Request<ProxyBody>,
        uri: &str,
    ) -> Result<Request<ProxyBody>, SecretRefusal> {
        let Some(r) = &self.resign else {
            return Ok(req);
        };
        let (parts, body) = req.into_parts();
        let body = if r.hashes_body() {
            let verdict = self.body_verdict.clone();
            sigv4::Body::Whole(sigv4::read_whole(body, r.keys().clone(), r.form(), verdict).await?)
        } else {
            sigv4::Body::Streaming(body)
        };
        let now = std::time::SystemTime::now();
        r.sign(&self.set, parts, body, uri, now, self.body_verdict.clone())
    }

    /// The guard for the WebSocket this request opens, where its messages must be guarded
    /// and redacted (the rule binds secrets).
    pub(crate) fn frame_guard(&self) -> Option<FrameGuard> {
        let bindings = self
            .bindings
            .clone()
            .filter(|_| self.websocket && self.binds())?;
        Some(FrameGuard {
            set: self.set.clone(),
            bindings: Some(bindings),
            dlp: None,
            swapped: self.body_used.clone(),
            tls: self.tls,
        })
    }

    /// Every bound secret this request carried upstream: in its head, and those swapped in
    /// its body so far. Sorted.
    pub(crate) fn all_used(&self) -> Vec<Arc<str>> {
        let mut all = self.used.clone();
        if let Ok(body) = self.body_used.lock() {
            for n in body.iter() {
                if !all.contains(n) {
                    all.push(n.clone());
                }
            }
        }
        all.sort();
        all
    }

    /// Redacts what the upstream sent back, under every rule while the store holds a secret
    /// (a value can reach content some other way than this rule: it must never reach the
    /// agent). Under a rule that binds secrets a value becomes its placeholder, and a
    /// compressed body (which cannot be searched) is refused with the reason; under any
    /// other rule the body goes on byte for byte, as sent, and is cut short before a value.
    pub(crate) fn response(
        &self,
        resp: Response<ProxyBody>,
        head_only: bool,
    ) -> Result<Response<ProxyBody>, EncodedResponse> {
        let mode = if self.binds() {
            Mode::Replace
        } else {
            Mode::Cut
        };
        // Under a `sigv4` rule, credentials an AWS API hands out never reach the agent.
        let aws_fields = self.bindings.as_ref().is_some_and(|b| b.sigv4.is_some());
        redact::response(&self.set, mode, aws_fields, resp, head_only)
    }

    /// Why the body guard refused the request body, if it did.
    pub(crate) fn body_refusal(&self) -> Option<&SecretRefusal> {
        self.body_verdict.get()
    }
}

/// The agent's view of a leak-guard refusal, and a warning for the operator.
pub(super) fn refused(ctx: &RequestCtx, e: &SecretRefusal) -> Refusal {
    let r = refusal(e, ctx.rule().map(|r| &**r));
    tracing::warn!(secret = %e.secret, place = e.place.to_string().as_str(), code = r.code.as_str(), "refused: {}", r.message);
    r
}

pub(crate) fn refusal(e: &SecretRefusal, rule: Option<&str>) -> Refusal {
    let code = match e.violation {
        Violation::Scope | Violation::Transport | Violation::NotSwapped | Violation::OutOfScope => {
            ErrorCode::SecretScope
        }
        Violation::Leak | Violation::Echoed => ErrorCode::SecretLeak,
        Violation::Unsignable => ErrorCode::BadRequest,
        Violation::Unavailable | Violation::Unfetched => ErrorCode::SecretUnavailable,
    };
    Refusal {
        rule_id: rule.map(str::to_string),
        ..Refusal::new(code, e.message(rule))
    }
}
