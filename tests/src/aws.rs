//! An AWS-shaped upstream that checks Signature Version 4 with the real key, as S3 and STS
//! do: the request's own SignedHeaders, its x-amz-date (within 15 minutes), its payload hash
//! (the body's SHA-256 where one is stated, every chunk's signature where the body is signed
//! chunk by chunk), its session token. A request that passes is served (S3 PutObject and
//! GetObject on an in-memory store, STS GetCallerIdentity); one that fails gets S3's 403
//! `SignatureDoesNotMatch` and the reason is kept for the test to show.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use aws_credential_types::Credentials;
use aws_sigv4::http_request::{
    PayloadChecksumKind, PercentEncodingMode, SignableBody, SignableRequest, SigningSettings,
    UriPathNormalizationMode,
};
use aws_sigv4::sign::v4;
use bytes::Bytes;
use http::{header, HeaderMap, Method, StatusCode};
use sha2::{Digest, Sha256};

/// The one account the server knows.
#[derive(Clone, Debug, Default)]
pub struct AwsAccount {
    pub access_key_id: String,
    pub secret_access_key: String,
    pub session_token: Option<String>,
    /// Objects by `/bucket/key`.
    pub objects: Arc<Mutex<BTreeMap<String, Vec<u8>>>>,
    /// Requests whose signature verified, as `METHOD path payload-mode`.
    pub verified: Arc<Mutex<Vec<String>>>,
    /// Why each refused request was refused.
    pub refused: Arc<Mutex<Vec<String>>>,
}

/// What the server answers: status, content type, body.
pub struct Answer {
    pub status: StatusCode,
    pub content_type: &'static str,
    /// S3's `ETag` for a stored object.
    pub etag: Option<String>,
    pub body: Vec<u8>,
}

/// The secret key and session token STS hands out for `GetSessionToken`.
pub const FRESH_SECRET: &str = "FRESHsecretKEY0123456789abcdefghijklmnop";
pub const FRESH_TOKEN: &str = "FRESHsessionTOKEN0123456789abcdefghijklmnopqrstuvwxyz==";

impl AwsAccount {
    /// Serves a request that carries an AWS signature; `host` as received (Host or
    /// :authority).
    pub fn serve(
        &self,
        method: &Method,
        host: &str,
        path_and_query: &str,
        headers: &HeaderMap,
        body: &[u8],
    ) -> Answer {
        match self.verify(method, host, path_and_query, headers, body) {
            Ok((object, mode)) => {
                self.verified.lock().expect("lock").push(format!(
                    "{method} {} {mode}",
                    path_and_query.split('?').next().unwrap_or("")
                ));
                self.act(method, path_and_query, headers, object)
            }
            Err(why) => {
                self.refused.lock().expect("lock").push(why.clone());
                let xml = format!(
                    "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>SignatureDoesNotMatch</Code><Message>{why}</Message></Error>"
                );
                Answer {
                    status: StatusCode::FORBIDDEN,
                    content_type: "application/xml",
                    etag: None,
                    body: xml.into_bytes(),
                }
            }
        }
    }

    /// Checks the signature; returns the payload as the object it carries (aws-chunked
    /// decoded) and the payload mode.
    fn verify(
        &self,
        method: &Method,
        host: &str,
        path_and_query: &str,
        headers: &HeaderMap,
        body: &[u8],
    ) -> Result<(Vec<u8>, String), String> {
        let get = |n: &str| headers.get(n).and_then(|v| v.to_str().ok());
        let auth = get("authorization").ok_or("no Authorization")?;
        let rest = auth
            .strip_prefix("AWS4-HMAC-SHA256 ")
            .ok_or("not AWS4-HMAC-SHA256")?;
        let field = |name: &str| {
            rest.split(',')
                .map(str::trim)
                .find_map(|p| p.strip_prefix(name))
                .ok_or(format!("no {name}"))
        };
        let credential = field("Credential=")?;
        let signed_headers = field("SignedHeaders=")?;
        let signature = field("Signature=")?;
        let scope: Vec<&str> = credential.split('/').collect();
        let [key_id, date, region, service, "aws4_request"] = scope[..] else {
            return Err(format!("bad credential scope {credential}"));
        };
        if key_id != self.access_key_id {
            return Err(format!("InvalidAccessKeyId: {key_id}"));
        }
        let amz_date = get("x-amz-date").ok_or("no x-amz-date")?;
        let time = parse_amz_date(amz_date).ok_or("bad x-amz-date")?;
        if !amz_date.starts_with(date) {
            return Err("x-amz-date and the credential scope disagree".into());
        }
        let skew = SystemTime::now()
            .duration_since(time)
            .unwrap_or_else(|e| e.duration());
        if skew > Duration::from_secs(15 * 60) {
            return Err(format!("RequestTimeTooSkewed: {amz_date}"));
        }
        if get("x-amz-security-token") != self.session_token.as_deref() {
            return Err("InvalidToken: the session token does not match".into());
        }
        let payload = get("x-amz-content-sha256");
        let mut pairs: Vec<(&str, &str)> = Vec::new();
        for name in signed_headers.split(';') {
            if ["x-amz-date", "x-amz-content-sha256", "x-amz-security-token"].contains(&name) {
                continue; // the signer adds these itself
            }
            if name == "host" {
                pairs.push(("host", host));
                continue;
            }
            let mut any = false;
            for v in headers.get_all(name) {
                pairs.push((name, v.to_str().map_err(|_| "a non-text signed header")?));
                any = true;
            }
            if !any {
                return Err(format!("signed header {name} is missing"));
            }
        }
        let signable = match payload {
            Some(p) => SignableBody::Precomputed(p.to_string()),
            None => SignableBody::Bytes(body),
        };
        let mut settings = SigningSettings::default();
        if service == "s3" {
            settings.percent_encoding_mode = PercentEncodingMode::Single;
            settings.uri_path_normalization_mode = UriPathNormalizationMode::Disabled;
        }
        if payload.is_some() {
            settings.payload_checksum_kind = PayloadChecksumKind::XAmzSha256;
        }
        let identity = Credentials::new(
            &self.access_key_id,
            &self.secret_access_key,
            self.session_token.clone(),
            None,
            "verifier",
        )
        .into();
        let params = v4::SigningParams::builder()
            .identity(&identity)
            .region(region)
            .name(service)
            .time(time)
            .settings(settings)
            .build()
            .map_err(|e| e.to_string())?
            .into();
        let uri = format!("https://{host}{path_and_query}");
        let req = SignableRequest::new(method.as_str(), uri, pairs.into_iter(), signable)
            .map_err(|e| e.to_string())?;
        let (instructions, expected) = aws_sigv4::http_request::sign(req, &params)
            .map_err(|e| e.to_string())?
            .into_parts();
        let computed_auth = instructions
            .headers()
            .find(|(n, _)| *n == "authorization")
            .map(|(_, v)| v.to_string())
            .unwrap_or_default();
        if !computed_auth.contains(&format!("SignedHeaders={signed_headers},")) {
            return Err(format!(
                "signed headers {signed_headers} are not what was sent ({computed_auth})"
            ));
        }
        if expected != signature {
            return Err("the signature does not match the real key".into());
        }
        let mode = payload.unwrap_or("hashed").to_string();
        let object = match payload {
            None | Some("UNSIGNED-PAYLOAD") => body.to_vec(),
            Some("STREAMING-UNSIGNED-PAYLOAD-TRAILER") => dechunk(body, None)?,
            Some("STREAMING-AWS4-HMAC-SHA256-PAYLOAD")
            | Some("STREAMING-AWS4-HMAC-SHA256-PAYLOAD-TRAILER") => {
                let chunk_params = v4::SigningParams::builder()
                    .identity(&identity)
                    .region(region)
                    .name(service)
                    .time(time)
                    .settings(())
                    .build()
                    .map_err(|e| e.to_string())?;
                dechunk(body, Some((&chunk_params, signature.to_string())))?
            }
            Some(hash) => {
                if hex(&Sha256::digest(body)) != hash {
                    return Err("XAmzContentSHA256Mismatch".into());
                }
                body.to_vec()
            }
        };
        Ok((object, mode))
    }

    fn act(
        &self,
        method: &Method,
        path_and_query: &str,
        headers: &HeaderMap,
        object: Vec<u8>,
    ) -> Answer {
        let path = path_and_query.split('?').next().unwrap_or("/");
        let xml = |status, body: String| Answer {
            status,
            content_type: "text/xml",
            etag: None,
            body: body.into_bytes(),
        };
        let form: BTreeMap<String, String> = form_urlencoded::parse(&object).into_owned().collect();
        if *method == Method::POST
            && form.get("Action").map(String::as_str) == Some("GetCallerIdentity")
        {
            return xml(StatusCode::OK, format!(
                "<GetCallerIdentityResponse xmlns=\"https://sts.amazonaws.com/doc/2011-06-15/\"><GetCallerIdentityResult><Arn>arn:aws:iam::123456789012:user/agent</Arn><UserId>{}</UserId><Account>123456789012</Account></GetCallerIdentityResult><ResponseMetadata><RequestId>r-1</RequestId></ResponseMetadata></GetCallerIdentityResponse>",
                self.access_key_id
            ));
        }
        if *method == Method::POST
            && form.get("Action").map(String::as_str) == Some("GetSessionToken")
        {
            // Fresh credentials, as STS hands them out.
            return xml(StatusCode::OK, format!(
                "<GetSessionTokenResponse xmlns=\"https://sts.amazonaws.com/doc/2011-06-15/\"><GetSessionTokenResult><Credentials><AccessKeyId>ASIAFRESHKEY0000001</AccessKeyId><SecretAccessKey>{FRESH_SECRET}</SecretAccessKey><SessionToken>{FRESH_TOKEN}</SessionToken><Expiration>2026-11-28T00:00:00Z</Expiration></Credentials></GetSessionTokenResult><ResponseMetadata><RequestId>r-2</RequestId></ResponseMetadata></GetSessionTokenResponse>"
            ));
        }
        let mut objects = self.objects.lock().expect("lock");
        if let (&Method::PUT, Some(source)) = (method, headers.get("x-amz-copy-source")) {
            // CopyObject: `/bucket/key` or `bucket/key`, percent-encoded.
            let source = percent_encoding::percent_decode(source.as_bytes()).decode_utf8_lossy();
            let source = format!("/{}", source.trim_start_matches('/'));
            return match objects.get(&source).cloned() {
                Some(o) => {
                    objects.insert(path.to_string(), o);
                    xml(
                        StatusCode::OK,
                        "<CopyObjectResult><ETag>\"x\"</ETag></CopyObjectResult>".into(),
                    )
                }
                None => xml(
                    StatusCode::NOT_FOUND,
                    "<Error><Code>NoSuchKey</Code></Error>".into(),
                ),
            };
        }
        match *method {
            Method::PUT => {
                                let etag = format!("\"{}\"", &hex(&Sha256::digest(&object))[..32]);
                objects.insert(path.to_string(), object);
                Answer {
                    status: StatusCode::OK,
                    content_type: "text/plain",
                    etag: Some(etag),
                    body: Vec::new(),
                }
            }
            Method::GET | Method::HEAD => match objects.get(path) {
                Some(o) => Answer {
                    status: StatusCode::OK,
                    content_type: "application/octet-stream",
                    etag: Some(format!("\"{}\"", &hex(&Sha256::digest(o))[..32])),
                    body: o.clone(),
                },
                None => xml(
                    StatusCode::NOT_FOUND,
                    "<Error><Code>NoSuchKey</Code><Message>The specified key does not exist.</Message></Error>".into(),
                ),
            },
            _ => xml(
                StatusCode::METHOD_NOT_ALLOWED,
                "<Error><Code>MethodNotAllowed</Code></Error>".into(),
            ),
        }
    }
}

/// The object in an aws-chunked body; with `signed`, each chunk's signature is checked,
/// chained from the seed, and the trailer's if there is one.
fn dechunk(
    body: &[u8],
    signed: Option<(&v4::SigningParams<'_, ()>, String)>,
) -> Result<Vec<u8>, String> {
    let mut previous = signed.as_ref().map(|(_, seed)| seed.clone());
    let mut out = Vec::new();
    let mut at = 0;
    let line = |at: &mut usize| -> Result<String, String> {
        let rest = &body[*at..];
        let n = rest
            .windows(2)
            .position(|w| w == b"\r\n")
            .ok_or("an unterminated line")?;
        *at += n + 2;
        String::from_utf8(rest[..n].to_vec()).map_err(|_| "a non-text line".into())
    };
    loop {
        let header = line(&mut at)?;
        let (size, ext) = header.split_once(';').unwrap_or((&header, ""));
        let size = usize::from_str_radix(size, 16).map_err(|_| format!("bad chunk size {size}"))?;
        let data = body.get(at..at + size).ok_or("a short chunk")?;
        if let (Some((params, _)), Some(prev)) = (&signed, &previous) {
            let sig = ext
                .strip_prefix("chunk-signature=")
                .ok_or("a chunk without its signature")?;
            let want = v4::sign_chunk(&Bytes::copy_from_slice(data), prev, params)
                .map_err(|e| e.to_string())?
                .into_parts()
                .1;
            if sig != want {
                return Err(format!(
                    "the signature of a {size}-byte chunk does not match"
                ));
            }
            previous = Some(want);
        }
        out.extend_from_slice(data);
        at += size;
        if size == 0 {
            break;
        }
        if body.get(at..at + 2) != Some(b"\r\n") {
            return Err("a chunk not followed by CRLF".into());
        }
        at += 2;
    }
    // The end: CRLF, or trailers up to an empty line.
    let mut trailers = aws_smithy_runtime_api::http::Headers::new();
    let mut trailer_sig = None;
    loop {
        let l = line(&mut at)?;
        if l.is_empty() {
            break;
        }
        let (name, value) = l.split_once(':').ok_or("a trailer without a colon")?;
        if name == "x-amz-trailer-signature" {
            trailer_sig = Some(value.to_string());
        } else {
            trailers.insert(name.to_ascii_lowercase(), value.trim().to_string());
        }
    }
    if at != body.len() {
        return Err("bytes after the body".into());
    }
    if let (Some((params, _)), Some(prev), false) = (&signed, &previous, trailers.is_empty()) {
        let want = v4::sign_trailer(&trailers, prev, params)
            .map_err(|e| e.to_string())?
            .into_parts()
            .1;
        if trailer_sig.as_deref() != Some(want.as_str()) {
            return Err("the trailer signature does not match".into());
        }
    }
    Ok(out)
}

/// `20261124T101500Z`.
fn parse_amz_date(s: &str) -> Option<SystemTime> {
    let format =
        time::format_description::parse_borrowed::<2>("[year][month][day]T[hour][minute][second]Z")
            .ok()?;
    let t = time::PrimitiveDateTime::parse(s, &format).ok()?;
    Some(t.assume_utc().into())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The header that names the request's signature, for a test to find its requests.
pub fn is_signed(headers: &HeaderMap) -> bool {
    headers
        .get(header::AUTHORIZATION)
        .is_some_and(|v| v.as_bytes().starts_with(b"AWS4-HMAC-SHA256 "))
}
