//! AWS Signature Version 4, made again with keys the agent never holds. The agent's SDK is
//! configured with the access key id's placeholder (`agenshield:secret:NAME`) and any secret
//! key; a rule with `sigv4 = {...}` recognises that signature, and once the request has been
//! decided, swapped and injected, signs it again as it goes upstream: with the real keys, the
//! proxy's clock, and exactly the URL and headers sent (`aws-sigv4` computes the signature).
//! The agent's own signature is discarded, never checked: it was made with a key that is not
//! the real one. A body signed chunk by chunk (`STREAMING-AWS4-HMAC-SHA256-PAYLOAD`) has each
//! chunk signed again as it streams (`aws_chunked`).

use std::time::SystemTime;

use aws_credential_types::Credentials;
use aws_sigv4::http_request::{
    PayloadChecksumKind, PercentEncodingMode, SignableBody, SignableRequest, SigningSettings,
    UriPathNormalizationMode,
};
use aws_sigv4::sign::v4;
use aws_smithy_runtime_api::client::identity::Identity;
use http::{header, HeaderMap, HeaderName, HeaderValue, Request};
use http_body_util::BodyExt;

use crate::body::ProxyBody;
use crate::policy::{OutOfScope, Sigv4Keys};
use crate::secrets::placeholder::PREFIX;
use crate::secrets::rewrite::aws_chunked::ResignedChunks;
use crate::secrets::set::SecretSet;
use crate::secrets::{Place, SecretRefusal, Violation};

const ALGORITHM: &str = "AWS4-HMAC-SHA256";
const CONTENT_SHA256: &str = "x-amz-content-sha256";
const DATE: &str = "x-amz-date";
const SECURITY_TOKEN: &str = "x-amz-security-token";
const SIGNED_CHUNKS: &str = "STREAMING-AWS4-HMAC-SHA256-PAYLOAD";
const SIGNED_CHUNKS_TRAILER: &str = "STREAMING-AWS4-HMAC-SHA256-PAYLOAD-TRAILER";
/// Payload hashes passed on as stated: the body is not part of the signature (or its hash
/// is, and the upstream checks the body against it).
const STATED: [&str; 2] = ["UNSIGNED-PAYLOAD", "STREAMING-UNSIGNED-PAYLOAD-TRAILER"];

/// A body without `x-amz-content-sha256` is hashed into the signature, so it is read whole
/// first; these are API calls (JSON, query), never uploads, and larger ones are refused.
pub(crate) const MAX_HASHED_BODY: usize = 16 * 1024 * 1024;

/// How the request states its payload, which decides how it is signed.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Payload {
    /// `x-amz-content-sha256` as sent: the body's hash, `UNSIGNED-PAYLOAD`, or an unsigned
    /// aws-chunked body with trailers.
    Stated(String),
    /// Every chunk signed, chained from the request's signature (and the trailer, if any).
    SignedChunks { trailer: bool },
    /// No `x-amz-content-sha256`: the body's hash is in the signature.
    Hashed,
}

/// What the agent's signature said, enough to sign the request again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Resign {
    keys: Sigv4Keys,
    region: String,
    service: String,
    /// The headers the agent signed, but for those the signer sets itself.
    signed: Vec<HeaderName>,
    payload: Payload,
    /// The body is a form (a query API's `Action=` may be in it): checked when read whole.
    form: bool,
}

/// A refusal about the signature itself: names the key id's secret and what was wrong.
fn unsignable(keys: &Sigv4Keys, why: impl Into<String>) -> SecretRefusal {
    SecretRefusal {
        violation: Violation::Unsignable,
        secret: keys.access_key_id.to_string(),
        place: Place::Why(why.into()),
    }
}

/// Whether the request carries an AWS signature made with the placeholder of `keys`' access
/// key id; if so, what it takes to sign it again. A signature made with any other key id is
/// none of this rule's business (the leak guard sees it like any header).
pub(crate) fn plan(
    set: &SecretSet,
    keys: &Sigv4Keys,
    headers: &HeaderMap,
    path_and_query: &str,
) -> Result<Option<Resign>, SecretRefusal> {
    let mut auths = headers.get_all(header::AUTHORIZATION).iter();
    let (Some(auth), None) = (auths.next(), auths.next()) else {
        return Ok(None);
    };
    let Some(rest) = auth
        .to_str()
        .ok()
        .and_then(|a| a.strip_prefix(ALGORITHM))
        .and_then(|a| a.strip_prefix(' '))
    else {
        return Ok(None);
    };
    let mut credential = None;
    let mut signed_headers = None;
    for part in rest.split(',').map(str::trim) {
        if let Some(v) = part.strip_prefix("Credential=") {
            credential = Some(v);
        } else if let Some(v) = part.strip_prefix("SignedHeaders=") {
            signed_headers = Some(v);
        }
    }
    let Some(credential) = credential else {
        return Ok(None);
    };
    // key-id/date/region/service/aws4_request; the key id is our placeholder, whose
    // name cannot hold a '/'.
    let (key_id, scope) = credential.split_once('/').unwrap_or((credential, ""));
    let ours = key_id
        .strip_prefix(PREFIX)
        .is_some_and(|name| name == &*keys.access_key_id);
    if !ours {
        return Ok(None);
    }
    let parts: Vec<&str> = scope.split('/').collect();
    let [_date, region, service, "aws4_request"] = parts[..] else {
        return Err(unsignable(
            keys,
            "an AWS signature whose credential scope is not key/date/region/service/aws4_request",
        ));
    };
    let token =
        |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-');
    if !token(service) || !token(region) {
        return Err(unsignable(
            keys,
            "an AWS signature with an unreadable region or service",
        ));
    }
    // What the agent asks to have signed must be within what the rule may sign.
    let scope = &keys.scope;
    let out = |o: OutOfScope| out_of_scope(keys, &o);
    scope.check_scope(service, region).map_err(out)?;
    for target in headers.get_all(AMZ_TARGET) {
        // `DynamoDB_20120810.GetItem`: the operation is after the last dot.
        let t = String::from_utf8_lossy(target.as_bytes());
        let action = t.rsplit('.').next().unwrap_or(&t).trim();
        scope.check_action(action).map_err(out)?;
    }
    if let Some((_, query)) = path_and_query.split_once('?') {
        for action in actions_in(query.as_bytes()) {
            scope.check_action(&action).map_err(out)?;
        }
    }
    for source in headers.get_all(COPY_SOURCE) {
        scope
            .check_copy_source(&copy_source(source.as_bytes()))
            .map_err(out)?;
    }
    for name in keys.names() {
        if set.get(name).is_none() {
            return Err(SecretRefusal {
                violation: Violation::Unavailable,
                secret: name.to_string(),
                place: Place::Sigv4,
            });
        }
    }
    let signed = signed_headers
        .unwrap_or("")
        .split(';')
        .filter_map(|h| HeaderName::from_bytes(h.trim().as_bytes()).ok())
        .filter(|h| !signer_sets(h))
        .collect();
    let payload = match headers.get(CONTENT_SHA256).map(HeaderValue::to_str) {
        None => Payload::Hashed,
        Some(Ok(SIGNED_CHUNKS)) => Payload::SignedChunks { trailer: false },
        Some(Ok(SIGNED_CHUNKS_TRAILER)) => Payload::SignedChunks { trailer: true },
        Some(Ok(v)) if STATED.contains(&v) || is_sha256_hex(v) => Payload::Stated(v.to_string()),
        Some(_) => return Err(unsignable(
            keys,
            "an x-amz-content-sha256 that is neither a SHA-256 nor a payload mode this proxy signs",
        )),
    };
    // An `Action` in a form body is read when the body is read whole (its hash is signed);
    // one whose hash the agent states would go unread.
    let form = is_form(headers);
    if form && payload != Payload::Hashed {
        return Err(unsignable(
            keys,
            "a form body whose x-amz-content-sha256 is stated: its Action could not be checked",
        ));
    }
    Ok(Some(Resign {
        form,
        keys: keys.clone(),
        region: region.to_string(),
        service: service.to_string(),
        signed,
        payload,
    }))
}

const AMZ_TARGET: &str = "x-amz-target";
const COPY_SOURCE: &str = "x-amz-copy-source";

/// The refusal of a request outside what the rule may sign.
fn out_of_scope(keys: &Sigv4Keys, o: &OutOfScope) -> SecretRefusal {
    SecretRefusal {
        violation: Violation::OutOfScope,
        secret: keys.access_key_id.to_string(),
        place: Place::Why(o.describe(&keys.scope)),
    }
}

/// Every `Action` parameter of a query string or a form body, decoded.
fn actions_in(form: &[u8]) -> Vec<String> {
    form_urlencoded::parse(form)
        .filter(|(k, _)| k.eq_ignore_ascii_case("action"))
        .map(|(_, v)| v.into_owned())
        .collect()
}

/// `x-amz-copy-source` as `bucket/key`: percent-decoded, no leading `/`, no `?versionId=`.
fn copy_source(raw: &[u8]) -> String {
    let raw = raw.split(|b| *b == b'?').next().unwrap_or(raw);
    let decoded = percent_encoding::percent_decode(raw).decode_utf8_lossy();
    decoded.trim_start_matches('/').to_string()
}

fn is_form(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|v| {
            v.trim()
                .eq_ignore_ascii_case("application/x-www-form-urlencoded")
        })
}

/// Headers the signer writes itself (or hyper does, from the URL).
fn signer_sets(name: &HeaderName) -> bool {
    name == header::HOST
        || name == header::AUTHORIZATION
        || [CONTENT_SHA256, DATE, SECURITY_TOKEN].contains(&name.as_str())
}

fn is_sha256_hex(v: &str) -> bool {
    v.len() == 64 && v.bytes().all(|b| b.is_ascii_hexdigit())
}

/// Headers the check of the request head must not see: the agent's signature (its
/// placeholder is what this module answers) and its session token, which the proxy sets.
pub(crate) fn head_for_check(headers: &HeaderMap) -> HeaderMap {
    let mut h = headers.clone();
    h.remove(header::AUTHORIZATION);
    h.remove(SECURITY_TOKEN);
    h
}

impl Resign {
    /// The names of the secrets signing uses.
    pub(crate) fn keys(&self) -> &Sigv4Keys {
        &self.keys
    }

    pub(crate) fn secrets(&self) -> impl Iterator<Item = &std::sync::Arc<str>> {
        self.keys.names()
    }

    /// Whether the body is a form whose `Action` is checked when read whole.
    pub(crate) fn form(&self) -> bool {
        self.form
    }

    /// Whether the body must be read whole before signing (`read_whole`): its hash is in
    /// the signature.
    pub(crate) fn hashes_body(&self) -> bool {
        self.payload == Payload::Hashed
    }

    /// Signs `req` as it will be sent: `uri` is its full URL (scheme, authority, path and
    /// query as they go upstream), `now` the signing time. Hop-by-hop headers must be gone
    /// already. A refusal of a body (too large to hash, a chunk that does not parse) is
    /// returned, or, for chunks, set in `verdict` as they stream.
    pub(crate) fn sign(
        &self,
        set: &SecretSet,
        mut parts: http::request::Parts,
        body: Body,
        uri: &str,
        now: SystemTime,
        verdict: std::sync::Arc<std::sync::OnceLock<SecretRefusal>>,
    ) -> Result<Request<ProxyBody>, SecretRefusal> {
        for name in [DATE, SECURITY_TOKEN, CONTENT_SHA256] {
            parts.headers.remove(name);
        }
        parts.headers.remove(header::AUTHORIZATION);
        let hashed = match (&self.payload, &body) {
            (Payload::Hashed, Body::Whole(b)) => Some(b.clone()),
            (Payload::Hashed, Body::Streaming(_)) => {
                unreachable!("a body whose hash is signed is read whole first (`read_whole`)")
            }
            _ => None,
        };
        let body = body.into_body();
        let signable_body = match (&self.payload, &hashed) {
            (Payload::Stated(v), _) => SignableBody::Precomputed(v.clone()),
            (Payload::SignedChunks { trailer: false }, _) => {
                SignableBody::Precomputed(SIGNED_CHUNKS.into())
            }
            (Payload::SignedChunks { trailer: true }, _) => {
                SignableBody::Precomputed(SIGNED_CHUNKS_TRAILER.into())
            }
            (Payload::Hashed, Some(b)) => SignableBody::Bytes(b),
            (Payload::Hashed, None) => unreachable!("a hashed body was read above"),
        };
        let mut to_sign: Vec<(&str, &str)> = Vec::new();
        for name in &self.signed {
            for v in parts.headers.get_all(name) {
                let v = v.to_str().map_err(|_| {
                    unsignable(
                        &self.keys,
                        format!("header {name}, which is not text and so cannot be signed"),
                    )
                })?;
                to_sign.push((name.as_str(), v));
            }
        }
        let identity = self.identity(set)?;
        let params = self.params(&identity, now)?.into();
        let request = SignableRequest::new(
            parts.method.as_str(),
            uri,
            to_sign.into_iter(),
            signable_body,
        )
        .map_err(|e| unsignable(&self.keys, format!("a request that cannot be signed: {e}")))?;
        let (instructions, seed) = aws_sigv4::http_request::sign(request, &params)
            .map_err(|e| unsignable(&self.keys, format!("a request that cannot be signed: {e}")))?
            .into_parts();
        let (headers, _query) = instructions.into_parts();
        for h in headers {
            let mut value = HeaderValue::from_str(h.value()).map_err(|_| {
                unsignable(
                    &self.keys,
                    format!("a {} that is not a header value", h.name()),
                )
            })?;
            value.set_sensitive(true);
            parts.headers.insert(h.name(), value);
        }
        let body = match self.payload {
            Payload::SignedChunks { trailer } => BodyExt::boxed(ResignedChunks::new(
                body,
                ChunkSigner::new(identity, &self.region, &self.service, now),
                seed,
                trailer,
                unsignable(&self.keys, ""),
                verdict,
            )),
            _ => body,
        };
        Ok(Request::from_parts(parts, body))
    }

    fn identity(&self, set: &SecretSet) -> Result<Identity, SecretRefusal> {
        let text = |name: &std::sync::Arc<str>| -> Result<String, SecretRefusal> {
            let s = set.get(name).ok_or_else(|| SecretRefusal {
                violation: Violation::Unavailable,
                secret: name.to_string(),
                place: Place::Sigv4,
            })?;
            std::str::from_utf8(s.value.expose())
                .map(str::to_string)
                .map_err(|_| unsignable(&self.keys, format!("secret {name:?}, which is not text")))
        };
        let token = self.keys.session_token.as_ref().map(text).transpose()?;
        if token
            .as_deref()
            .is_some_and(|t| HeaderValue::from_str(t).is_err())
        {
            return Err(unsignable(
                &self.keys,
                "a session token that is not a header value",
            ));
        }
        let creds = Credentials::new(
            text(&self.keys.access_key_id)?,
            text(&self.keys.secret_access_key)?,
            token,
            None,
            "agenshield",
        );
        Ok(creds.into())
    }

    fn params<'a>(
        &'a self,
        identity: &'a Identity,
        now: SystemTime,
    ) -> Result<v4::SigningParams<'a, SigningSettings>, SecretRefusal> {
        let s3 = self.service == "s3";
        let mut settings = SigningSettings::default();
        // S3 signs the path as sent (each key byte-exact); the other services normalize it
        // and encode it twice.
        if s3 {
            settings.percent_encoding_mode = PercentEncodingMode::Single;
            settings.uri_path_normalization_mode = UriPathNormalizationMode::Disabled;
        }
        if self.payload != Payload::Hashed {
            settings.payload_checksum_kind = PayloadChecksumKind::XAmzSha256;
        }
        v4::SigningParams::builder()
            .identity(identity)
            .region(&self.region)
            .name(&self.service)
            .time(now)
            .settings(settings)
            .build()
            .map_err(|e| unsignable(&self.keys, format!("signing parameters: {e}")))
    }
}

/// A request body as the signer gets it: read whole (its hash is signed) or as it streams.
pub(crate) enum Body {
    Whole(bytes::Bytes),
    Streaming(ProxyBody),
}

impl Body {
    fn into_body(self) -> ProxyBody {
        match self {
            Body::Whole(b) => crate::body::full(b),
            Body::Streaming(b) => b,
        }
    }
}

/// Reads a body whose hash the signature holds, up to `MAX_HASHED_BODY`; a guard's refusal
/// met while reading (`verdict`) is the one given.
pub(crate) async fn read_whole(
    mut body: ProxyBody,
    keys: Sigv4Keys,
    form: bool,
    verdict: std::sync::Arc<std::sync::OnceLock<SecretRefusal>>,
) -> Result<bytes::Bytes, SecretRefusal> {
    let mut whole = bytes::BytesMut::new();
    while let Some(frame) = body.frame().await {
        let failed = |why: String| {
            verdict
                .get()
                .cloned()
                .unwrap_or_else(|| unsignable(&keys, why))
        };
        let frame = frame
            .map_err(|e| failed(format!("a body that could not be read to be signed: {e}")))?;
        // Trailers of a body whose hash is signed are not signed: dropped.
        let Ok(data) = frame.into_data() else {
            continue;
        };
        if whole.len() + data.len() > MAX_HASHED_BODY {
            return Err(failed(format!(
                "a body over {} MiB without x-amz-content-sha256 (its hash would be signed, so it would be read whole)",
                MAX_HASHED_BODY >> 20
            )));
        }
        whole.extend_from_slice(&data);
    }
    if form {
        for action in actions_in(&whole) {
            keys.scope
                .check_action(&action)
                .map_err(|o| out_of_scope(&keys, &o))?;
        }
    }
    Ok(whole.freeze())
}

/// What signing one more chunk (or the trailer) takes: the request's credentials, scope and
/// time.
pub(crate) struct ChunkSigner {
    identity: Identity,
    region: String,
    service: String,
    time: SystemTime,
}

impl ChunkSigner {
    pub(crate) fn new(identity: Identity, region: &str, service: &str, time: SystemTime) -> Self {
        ChunkSigner {
            identity,
            region: region.to_string(),
            service: service.to_string(),
            time,
        }
    }

    fn params(&self) -> v4::SigningParams<'_, ()> {
        v4::SigningParams::builder()
            .identity(&self.identity)
            .region(&self.region)
            .name(&self.service)
            .time(self.time)
            .settings(())
            .build()
            .expect("every parameter is set")
    }

    /// The signature of `chunk`, chained from `previous`.
    pub(crate) fn chunk(&self, chunk: &bytes::Bytes, previous: &str) -> String {
        let params = self.params();
        match v4::sign_chunk(chunk, previous, &params) {
            Ok(out) => out.into_parts().1,
            Err(e) => unreachable!("a chunk signature needs only credentials: {e}"),
        }
    }

    /// The signature of the trailing headers, chained from the last chunk's.
    pub(crate) fn trailer(
        &self,
        headers: &aws_smithy_runtime_api::http::Headers,
        previous: &str,
    ) -> String {
        let params = self.params();
        match v4::sign_trailer(headers, previous, &params) {
            Ok(out) => out.into_parts().1,
            Err(e) => unreachable!("a trailer signature needs only credentials: {e}"),
        }
    }
}

#[cfg(test)]
#[path = "sigv4_tests.rs"]
mod tests;
