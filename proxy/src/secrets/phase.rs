//! The pipeline's secret phases for one request: inspect the head (before rate limits),
//! inject and guard the body (before forwarding), redact the response (after it).

use std::sync::{Arc, Mutex, OnceLock};

use http::{header, HeaderValue, Request, Response};
use http_body_util::BodyExt;

use crate::body::ProxyBody;
use crate::policy::SecretBindings;
use crate::secrets::guard::redact::{redact_headers, Mode, RedactedBody};
use crate::secrets::guard::scan::{inspect_head, SecretRefusal, Violation};
use crate::secrets::guard::scan_body::ScannedBody;
use crate::secrets::rewrite::inject::Url;
use crate::secrets::rewrite::sigv4::{self, Resign};
use crate::secrets::rewrite::swap::BodySwap;
use crate::secrets::rewrite::websocket::{offered_extensions_removed, FrameGuard};
use crate::secrets::set::SecretSet;
use crate::secrets::vault::Vault;

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
        let transport = |place: &str| {
            let secret = phase.used.first().map(|s| s.to_string()).or_else(|| {
                let b = phase.bindings.as_ref()?;
                b.names.first().map(|s| s.to_string())
            });
            SecretRefusal {
                violation: Violation::Transport,
                secret: secret.unwrap_or_default(),
                place: place.to_string(),
            }
        };
        if !phase.used.is_empty() && !head.tls {
            return Err(transport("plain HTTP"));
        }
        if let Some(proto) = head.upgrade.filter(|_| !phase.websocket && phase.binds()) {
            return Err(transport(&format!(
                "an upgraded connection ({})",
                proto.escape_debug()
            )));
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
            url = crate::secrets::rewrite::inject::apply(
                &self.set,
                b,
                &mut parts.headers,
                path,
                query,
            );
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
        let swap = self.body_swap(&parts.headers);
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

    /// What a placeholder of a bound secret becomes in this request's body.
    fn body_swap(&self, headers: &http::HeaderMap) -> BodySwap {
        let refused = |place: String| BodySwap::Refused { place };
        if !self.bindings.as_ref().is_some_and(|b| b.swap.body) {
            return refused("body".into());
        }
        if !self.tls {
            return refused("body sent over plain HTTP".into());
        }
        // A compressed body cannot be rewritten: a placeholder visible in its bytes is
        // refused, one the compression hides goes on as the text it is.
        if let Some(coding) = content_coding(headers) {
            return refused(format!("{coding}-encoded body"));
        }
        let Some(ct) = headers.get(header::CONTENT_TYPE) else {
            return BodySwap::Text;
        };
        let essence = ct
            .to_str()
            .unwrap_or("")
            .split(';')
            .next()
            .unwrap_or("")
            .trim()
            .to_ascii_lowercase();
        match essence.as_str() {
            "application/json" => BodySwap::Json,
            e if e.starts_with("application/") && e.ends_with("+json") => BodySwap::Json,
            "application/x-www-form-urlencoded" => BodySwap::Form,
            e if e.starts_with("text/") => BodySwap::Text,
            _ => refused(format!("body of type {}", essence.escape_debug())),
        }
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
            bindings,
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
    ) -> Result<Response<ProxyBody>, String> {
        if self.set.is_empty() {
            return Ok(resp);
        }
        let (mut parts, body) = resp.into_parts();
        redact_headers(&self.set, &mut parts.headers);
        let empty = head_only || http_body::Body::is_end_stream(&body);
        if empty {
            return Ok(Response::from_parts(parts, body));
        }
        if !self.binds() {
            let cut = RedactedBody::new(body, self.set.clone(), Mode::Cut);
            return Ok(Response::from_parts(parts, BodyExt::boxed(cut)));
        }
        // A body in any coding but identity could not be searched for echoed secrets.
        if let Some(coding) = content_coding(&parts.headers) {
            return Err(format!(
                "the upstream sent a {coding}-encoded body although asked for identity; \
                 it cannot be checked for secret values, so it is not passed on"
            ));
        }
        // A placeholder is not as long as its value: the length is no longer known.
        parts.headers.remove(header::CONTENT_LENGTH);
        let redacted = BodyExt::boxed(RedactedBody::new(body, self.set.clone(), Mode::Replace));
        // Under a `sigv4` rule, credentials an AWS API hands out never reach the agent.
        if self.bindings.as_ref().is_some_and(|b| b.sigv4.is_some()) {
            let fields = crate::secrets::guard::aws_fields::FieldsRedacted::new(redacted);
            return Ok(Response::from_parts(parts, BodyExt::boxed(fields)));
        }
        Ok(Response::from_parts(parts, redacted))
    }

    /// Why the body guard refused the request body, if it did.
    pub(crate) fn body_refusal(&self) -> Option<&SecretRefusal> {
        self.body_verdict.get()
    }
}

/// The first coding but identity in any `Content-Encoding` header (every header, every
/// coding in it), escaped for a message.
fn content_coding(headers: &http::HeaderMap) -> Option<String> {
    headers
        .get_all(header::CONTENT_ENCODING)
        .iter()
        .flat_map(|v| v.as_bytes().split(|b| *b == b','))
        .map(<[u8]>::trim_ascii)
        .find(|c| !c.is_empty() && !c.eq_ignore_ascii_case(b"identity"))
        .map(|c| String::from_utf8_lossy(c).escape_debug().to_string())
}
