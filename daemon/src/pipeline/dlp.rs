//! The credential check (`docs/dlp.md`), between the decision and the secrets phase: under
//! the deciding rule's `dlp` (default `"block"`), every credential the detector
//! (`crate::dlp`) finds in the URL, a header or the body is judged by `dlp::decide`: to its
//! home in a credential place it passes, else it is refused as `credential_exfiltration`
//! (`"block"`) or let through and recorded (`"report"`). The agent's own headers and body
//! are scanned before the secrets phase injects or swaps anything, so a credential the
//! proxy itself adds is never taken for the agent's.
//!
//! Bodies are scanned as they stream (`dlp_body.rs`); a compressed body is read whole
//! (within [`MAX_COMPRESSED`]) and decompressed within [`MAX_DECOMPRESSED`] first, or
//! refused. [`DlpPhase`] is what one request keeps: the rule's settings and what was found,
//! for the record.

use std::sync::{Arc, Mutex, OnceLock};

use bytes::Bytes;
use http::{header, Request};
use http_body_util::BodyExt;

use super::dlp_body::DlpBody;
use super::refusal::Refusal;
use super::RequestCtx;
use crate::body::ProxyBody;
use crate::dlp::{self, AllowList, ContentEncoding, Decision, Finding, Findings, Format, Place};
use crate::policy::DlpMode;
use crate::record::{DlpAction, DlpFacts, DlpFinding, DlpVerdict, ErrorCode};
use crate::secrets::rewrite::websocket::FrameCheck;

/// A compressed request body is read whole, up to this many bytes…
pub(crate) const MAX_COMPRESSED: usize = 16 << 20;
/// …and decompressed up to this many; larger is refused (the detector cannot read it).
pub(crate) const MAX_DECOMPRESSED: usize = 64 << 20;
/// Distinct (format, place, verdict) findings a record lists.
const MAX_RECORDED: usize = 32;

/// One request's credential check: the rule's settings, and what was found so far (the
/// body and a WebSocket add to it as they stream).
pub(crate) struct DlpPhase {
    mode: DlpMode,
    host: Arc<str>,
    allow_values: Arc<[Box<str>]>,
    /// `dlp_allow` as fingerprints, made on the first finding.
    allow: OnceLock<AllowList>,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    findings: Vec<DlpFinding>,
    reported: bool,
    blocked: Option<Blocked>,
}

/// Credentials refused: their formats (the first first) and where they were.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Blocked {
    pub formats: Vec<Format>,
    pub place: Place,
}

impl DlpPhase {
    /// The check under `rule` (`None`: the defaults) for requests to canonical `host`;
    /// `None` under `dlp = "off"`.
    pub(crate) fn new(rule: Option<&crate::policy::DlpRule>, host: &str) -> Option<DlpPhase> {
        let mode = rule.map_or(DlpMode::Block, |r| r.mode);
        if mode == DlpMode::Off {
            return None;
        }
        Some(DlpPhase {
            mode,
            host: host.into(),
            allow_values: rule.map_or_else(|| Arc::from(Vec::new()), |r| r.allow.clone()),
            allow: OnceLock::new(),
            state: Mutex::default(),
        })
    }

    /// Scans `bytes` (one whole value) found in `place` and judges what it holds.
    pub(crate) fn scan(
        &self,
        bytes: &[u8],
        place: Place,
        scratch: &mut Findings,
    ) -> Result<(), Blocked> {
        dlp::detector().scan(bytes, scratch);
        if scratch.is_empty() {
            return Ok(());
        }
        let found: Vec<Finding> = scratch.iter().cloned().collect();
        self.judge(&found, place)
    }

    /// Judges findings made in `place`: records each; `Err` for the first that may not go
    /// there under `dlp = "block"`.
    pub(crate) fn judge(&self, found: &[Finding], place: Place) -> Result<(), Blocked> {
        if found.is_empty() {
            return Ok(());
        }
        let allow = self.allow.get_or_init(|| {
            AllowList::new(
                dlp::detector(),
                self.allow_values.iter().map(|v| v.as_bytes()),
            )
        });
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let mut blocked: Option<Blocked> = None;
        for f in found {
            let decision = dlp::decide(f, &self.host, place, allow);
            let verdict = match decision {
                Decision::Home => DlpVerdict::Home,
                Decision::Bearer => DlpVerdict::Bearer,
                Decision::Allowed => DlpVerdict::Allowed,
                Decision::Exfiltration { format } => {
                    match self.mode {
                        DlpMode::Block => {
                            let b = blocked.get_or_insert(Blocked {
                                formats: Vec::new(),
                                place,
                            });
                            if !b.formats.contains(&format) {
                                b.formats.push(format);
                            }
                        }
                        _ => state.reported = true,
                    }
                    DlpVerdict::Exfiltration
                }
            };
            let entry = DlpFinding {
                format: f.format.as_str(),
                place: place.into(),
                verdict,
            };
            if state.findings.len() < MAX_RECORDED && !state.findings.contains(&entry) {
                state.findings.push(entry);
            }
        }
        match blocked {
            Some(b) => {
                state.blocked.get_or_insert_with(|| b.clone());
                Err(b)
            }
            None => Ok(()),
        }
    }

    /// The refusal of a credential this check blocked, if it blocked one.
    pub(crate) fn blocked(&self) -> Option<Blocked> {
        self.state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .blocked
            .clone()
    }

    /// What the record says: `None` when nothing was found.
    pub(crate) fn facts(&self) -> Option<DlpFacts> {
        let state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if state.findings.is_empty() {
            return None;
        }
        let action = if state.blocked.is_some() {
            DlpAction::Blocked
        } else if state.reported {
            DlpAction::Reported
        } else {
            DlpAction::Passed
        };
        Some(DlpFacts {
            action,
            findings: state.findings.clone(),
        })
    }

    /// Whether a finding not going home is refused (`block`) rather than let through.
    pub(crate) fn blocks(&self) -> bool {
        self.mode == DlpMode::Block
    }

    pub(crate) fn host(&self) -> &str {
        &self.host
    }
}

impl Blocked {
    /// The agent's view: the format and the place, never the value.
    pub(crate) fn refusal(&self, host: &str, rule: Option<&str>) -> Refusal {
        // A name can hold the credential (`<token>.example.com`): never shown.
        let host = &*dlp::shown(host);
        let names: Vec<&str> = self.formats.iter().map(|f| f.as_str()).collect();
        let names = names.join(", ");
        let homes = self.formats.first().map_or(&[][..], |f| f.home_patterns());
        let home = if homes.is_empty() {
            "a credential of this kind may go to no host".to_string()
        } else {
            format!(
                "a credential of this kind may go only to {} in a credential header",
                homes.join(", ")
            )
        };
        let message = format!(
            "credential ({names}) in the {} may not go to {host}: {home}",
            place_words(self.place)
        );
        let r = Refusal {
            rule_id: rule.map(str::to_string),
            explanation: format!(
                "credential_exfiltration: {names} in the {} (the rule's dlp = \"block\"; a known test value may be listed in dlp_allow)",
                place_words(self.place)
            ),
            ..Refusal::new(ErrorCode::CredentialExfiltration, message)
        };
        tracing::warn!(
            formats = names.as_str(),
            place = place_words(self.place),
            host,
            "refused: credential exfiltration"
        );
        r
    }
}

fn place_words(p: Place) -> &'static str {
    match p {
        Place::Path => "URL path",
        Place::Query => "URL query",
        Place::CredentialHeader => "credential header",
        Place::OtherHeader => "headers",
        Place::Body => "request body",
        Place::WebSocket => "WebSocket message",
        Place::DnsName => "DNS name",
    }
}

/// Scans the request head (URL and headers) under the deciding rule's `dlp`; keeps the
/// check in `ctx.dlp` for the body and the record.
pub(super) fn inspect<B>(ctx: &mut RequestCtx, req: &Request<B>) -> Result<(), Refusal> {
    let (Some(decision), Some(target)) = (&ctx.decision, &ctx.target) else {
        return Ok(());
    };
    let Some(phase) = DlpPhase::new(decision.dlp.as_deref(), &target.host) else {
        return Ok(());
    };
    let phase = Arc::new(phase);
    ctx.dlp = Some(phase.clone());
    scan_head(&phase, req).map_err(|b| b.refusal(&target.host, ctx.rule().map(|r| &**r)))
}

fn scan_head<B>(phase: &DlpPhase, req: &Request<B>) -> Result<(), Blocked> {
    let mut scratch = Findings::default();
    let uri = req.uri();
    // An absolute-form request line carries the host too (a Slack webhook's URL).
    match uri.authority() {
        Some(a) => {
            let mut p = Vec::with_capacity(a.as_str().len() + uri.path().len());
            p.extend_from_slice(a.as_str().as_bytes());
            p.extend_from_slice(uri.path().as_bytes());
            phase.scan(&p, Place::Path, &mut scratch)?;
        }
        None => phase.scan(uri.path().as_bytes(), Place::Path, &mut scratch)?,
    }
    if let Some(q) = uri.query() {
        phase.scan(q.as_bytes(), Place::Query, &mut scratch)?;
    }
    for (name, value) in req.headers() {
        phase.scan(value.as_bytes(), Place::header(name.as_str()), &mut scratch)?;
    }
    Ok(())
}

/// The check on the agent's WebSocket messages, when the request opens one under the check.
pub(super) fn frame_check(ctx: &RequestCtx) -> Option<Arc<dyn FrameCheck>> {
    let phase = ctx.dlp.clone()?;
    if !is_websocket(ctx.upgrade.as_deref()) {
        return None;
    }
    Some(Arc::new(WsCheck {
        phase,
        rule: ctx.rule().map(|r| r.to_string()),
    }))
}

fn is_websocket(upgrade: Option<&str>) -> bool {
    upgrade.is_some_and(|u| u.trim().eq_ignore_ascii_case("websocket"))
}

struct WsCheck {
    phase: Arc<DlpPhase>,
    rule: Option<String>,
}

impl FrameCheck for WsCheck {
    fn check(&self, message: &[u8]) -> Result<(), String> {
        let mut scratch = Findings::default();
        self.phase
            .scan(message, Place::WebSocket, &mut scratch)
            .map_err(|b| b.refusal(self.phase.host(), self.rule.as_deref()).message)
    }

    fn facts(&self) -> Option<DlpFacts> {
        self.phase.facts()
    }
}

/// Puts the request body under the check: scanned as it streams, or, compressed, read whole
/// and decompressed first (refused when it cannot be).
pub(super) async fn body(
    ctx: &mut RequestCtx,
    req: Request<ProxyBody>,
) -> Result<Request<ProxyBody>, Refusal> {
    let Some(phase) = ctx.dlp.clone() else {
        return Ok(req);
    };
    let mut req = req;
    if is_websocket(ctx.upgrade.as_deref()) {
        // Messages are checked one by one, as sent: no compression extension.
        crate::secrets::rewrite::websocket::offered_extensions_removed(req.headers_mut());
    }
    if http_body::Body::is_end_stream(req.body()) {
        return Ok(req);
    }
    let rule = ctx.rule().map(|r| r.to_string());
    // Boxed: the compressed path is a large future, and most requests take the other.
    let checked: std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<Request<ProxyBody>, Refusal>> + Send>,
    > = Box::pin(checked_body(phase, rule, req));
    checked.await
}

async fn checked_body(
    phase: Arc<DlpPhase>,
    rule: Option<String>,
    req: Request<ProxyBody>,
) -> Result<Request<ProxyBody>, Refusal> {
    let blocked = |b: Blocked| b.refusal(phase.host(), rule.as_deref());
    let codings = codings(req.headers()).map_err(|e| unreadable(&e, rule.as_deref()))?;
    let (parts, body) = req.into_parts();
    if codings.iter().all(|c| *c == ContentEncoding::Identity) {
        let mut body = DlpBody::new(body, phase.clone());
        body.prefetch().await.map_err(blocked)?;
        return Ok(Request::from_parts(parts, BodyExt::boxed(body)));
    }
    // Compressed: read whole within the cap, decompressed off the runtime's threads.
    let raw = read_capped(body, MAX_COMPRESSED)
        .await
        .map_err(|e| unreadable(&e, rule.as_deref()))?;
    let scanned = raw.clone();
    let check = phase.clone();
    let outcome = tokio::task::spawn_blocking(move || {
        let mut plain = scanned;
        for c in codings.iter().rev() {
            plain = dlp::decompress_capped(*c, &plain, MAX_DECOMPRESSED)?;
        }
        let mut scratch = Findings::default();
        Ok::<_, crate::dlp::DlpError>(check.scan(&plain, Place::Body, &mut scratch))
    })
    .await
    .map_err(|_| {
        unreadable(
            &crate::dlp::DlpError::Unreadable("could not be scanned".into()),
            rule.as_deref(),
        )
    })?;
    match outcome {
        Err(e) => Err(unreadable(&e, rule.as_deref())),
        Ok(Err(b)) => Err(blocked(b)),
        Ok(Ok(())) => Ok(Request::from_parts(parts, crate::body::full(raw))),
    }
}

/// The whole body, at most `cap` bytes (trailers are dropped: a compressed upload has none
/// in practice).
async fn read_capped(mut body: ProxyBody, cap: usize) -> Result<Bytes, crate::dlp::DlpError> {
    let mut out = bytes::BytesMut::new();
    while let Some(frame) = body.frame().await {
        let frame =
            frame.map_err(|_| crate::dlp::DlpError::Unreadable("could not be read".into()))?;
        if let Ok(data) = frame.into_data() {
            if out.len() + data.len() > cap {
                return Err(crate::dlp::DlpError::Unreadable(format!(
                    "is larger than {cap} bytes compressed"
                )));
            }
            out.extend_from_slice(&data);
        }
    }
    Ok(out.freeze())
}

/// The body's content codings, in the order applied; an unknown one is an error.
fn codings(headers: &http::HeaderMap) -> Result<Vec<ContentEncoding>, crate::dlp::DlpError> {
    let mut out = Vec::new();
    for v in headers.get_all(header::CONTENT_ENCODING) {
        let s = v
            .to_str()
            .map_err(|_| crate::dlp::DlpError::UnknownEncoding("(not text)".into()))?;
        for token in s.split(',') {
            out.push(ContentEncoding::from_token(token)?);
        }
    }
    Ok(out)
}

/// A body the check cannot read is refused, never sent on unread.
fn unreadable(e: &crate::dlp::DlpError, rule: Option<&str>) -> Refusal {
    Refusal {
        rule_id: rule.map(str::to_string),
        ..Refusal::new(
            ErrorCode::BadRequest,
            format!("{e}: the credential check cannot read it, so it is not sent"),
        )
    }
}
