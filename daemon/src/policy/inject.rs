//! Secret bindings: which secrets a rule's requests may carry, and the headers or query
//! parameters it sets from them. A rule binds a secret by naming it in `secrets = [...]` or
//! in an `inject` template (`value = "Bearer ${secret:NAME}"`); only requests that rule
//! allows get the value, and only rules that bind a secret may see it at all.
//!
//! `swap = [...]` says where the agent's placeholders of those secrets become values besides
//! the credential positions (`Authorization`, `Proxy-Authorization`, what `inject` sets),
//! which always swap: other headers, the path, query parameters, bodies, WebSocket messages
//! only where the rule names them, because for a content API those are content (a
//! placeholder in a file path or an issue comment would publish the value).
//!
//! `[secrets.NAME] rate = {...}` (policy-wide) limits how often NAME is used, over every
//! rule that binds it.

use std::collections::BTreeSet;
use std::ops::Range;
use std::sync::Arc;

use http::HeaderName;
use serde::Deserialize;
use toml::Spanned;

use super::error::PolicyError;
use super::rate::RateFile;

/// One `inject = [{ header = "…", value = "…" }]` entry as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct InjectFile {
    pub header: Option<Spanned<String>>,
    pub query: Option<Spanned<String>>,
    pub value: Spanned<String>,
}

/// `sigv4 = { access_key_id = "…", secret_access_key = "…", session_token = "…",
/// services = [...], regions = [...], actions = [...], copy_sources = [...] }` as written:
/// the secrets a rule re-signs AWS requests with, and what it may sign.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Sigv4File {
    pub access_key_id: Spanned<String>,
    pub secret_access_key: Spanned<String>,
    pub session_token: Option<Spanned<String>>,
    pub services: Option<Spanned<Vec<Spanned<String>>>>,
    pub regions: Option<Spanned<Vec<Spanned<String>>>>,
    pub actions: Option<Spanned<Vec<Spanned<String>>>>,
    pub copy_sources: Option<Spanned<Vec<Spanned<String>>>>,
}

/// `[secrets.NAME]` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct SecretSettingsFile {
    pub rate: Spanned<RateFile>,
}

/// What a rule's allowed requests may carry and get.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecretBindings {
    /// Every secret the rule binds, sorted and unique.
    pub names: Box<[Arc<str>]>,
    /// Set on each request the rule allows, in the order written.
    pub inject: Box<[Injection]>,
    /// Where placeholders of these secrets are swapped for their values.
    pub swap: SwapPlaces,
    /// AWS credentials the rule signs requests with. They are not in `names`: they are used
    /// only to sign, so their placeholders are swapped nowhere and their values go nowhere.
    pub sigv4: Option<Sigv4Keys>,
    /// `names` and the `sigv4` secrets: every secret the rule's requests may need a value of.
    pub needs: Box<[Arc<str>]>,
}

/// The secrets holding the AWS credentials a rule signs with (SigV4): the agent's SDK is
/// given the access key id's placeholder, and the proxy signs again with the real keys.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sigv4Keys {
    pub access_key_id: Arc<str>,
    pub secret_access_key: Arc<str>,
    pub session_token: Option<Arc<str>>,
    /// What the rule may sign with them.
    pub scope: Arc<super::Sigv4Scope>,
}

impl Sigv4Keys {
    pub fn names(&self) -> impl Iterator<Item = &Arc<str>> {
        [&self.access_key_id, &self.secret_access_key]
            .into_iter()
            .chain(self.session_token.as_ref())
    }
}

/// Where a rule swaps placeholders (`swap = [...]`). Elsewhere a placeholder of a secret it
/// binds is refused, never sent on as the placeholder.
///
/// Always: the credential positions, `Authorization` and `Proxy-Authorization` (with the
/// credentials inside `Basic`, where a URL's userinfo ends up) and the headers and query
/// parameters the rule's `inject` sets. Only where the rule names them: other headers
/// (`"header:NAME"`, or every header: `"headers"`), the path (`"path"`), query parameters
/// (`"query:NAME"`; the path and the whole query: `"url"`), bodies and WebSocket messages.
/// For a content API the path or a body *is* content: a placeholder swapped there would be
/// published (a file named after the token).
/// The default (no `swap`): the credential positions only.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SwapPlaces {
    /// Every header value (`"headers"`).
    pub all_headers: bool,
    /// Header names (lower case, sorted) swapped besides the credential headers.
    pub headers: Box<[HeaderName]>,
    /// The request target's path.
    pub path: bool,
    /// Every query parameter.
    pub all_query: bool,
    /// Query parameter names (as decoded, sorted) swapped.
    pub query: Box<[String]>,
    /// JSON, form-urlencoded and text request bodies.
    pub body: bool,
    /// Text messages the agent sends over a WebSocket.
    pub websocket: bool,
}

impl SwapPlaces {
    /// What `swap` may list.
    pub const NAMES: [&'static str; 7] = [
        "headers",
        "header:NAME",
        "path",
        "query:NAME",
        "url",
        "body",
        "websocket",
    ];

    /// Whether a placeholder in header `name` is swapped.
    pub fn swaps_header(&self, name: &HeaderName) -> bool {
        self.all_headers
            || *name == http::header::AUTHORIZATION
            || *name == http::header::PROXY_AUTHORIZATION
            || self
                .headers
                .binary_search_by(|h| h.as_str().cmp(name.as_str()))
                .is_ok()
    }

    /// Whether a placeholder in the value of query parameter `name` (decoded) is swapped.
    pub fn swaps_query(&self, name: &str) -> bool {
        self.all_query
            || self
                .query
                .binary_search_by(|q| q.as_str().cmp(name))
                .is_ok()
    }

    /// As written in a policy (the credential headers are implied).
    #[cfg(test)]
    pub fn names(&self) -> Vec<String> {
        let mut out = Vec::new();
        if self.all_headers {
            out.push("headers".to_string());
        }
        out.extend(self.headers.iter().map(|h| format!("header:{h}")));
        match (self.path, self.all_query) {
            (true, true) => out.push("url".into()),
            (true, false) => out.push("path".into()),
            (false, true) => out.push("query".into()),
            (false, false) => {}
        }
        out.extend(self.query.iter().map(|q| format!("query:{q}")));
        if self.body {
            out.push("body".into());
        }
        if self.websocket {
            out.push("websocket".into());
        }
        out
    }
}

impl SecretBindings {
    pub fn binds(&self, name: &str) -> bool {
        self.names.binary_search_by(|n| (**n).cmp(name)).is_ok()
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Injection {
    pub target: InjectTarget,
    pub template: Box<[TemplatePart]>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InjectTarget {
    /// Set, replacing every value the agent sent.
    Header(HeaderName),
    /// Set (replacing every occurrence) or appended.
    Query(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TemplatePart {
    Literal(String),
    Secret(Arc<str>),
}

/// A secret named by a rule: checked against the store when the policy is loaded.
#[derive(Debug, Clone)]
pub(crate) struct SecretUse {
    pub secret: Arc<str>,
    pub span: Range<usize>,
}

/// Headers an injection may not set: they frame the message, route it, or belong to a hop.
const FORBIDDEN_HEADERS: &[&str] = &[
    "host",
    "content-length",
    "transfer-encoding",
    "connection",
    "upgrade",
    "te",
    "trailer",
    "keep-alive",
    "proxy-connection",
    "proxy-authorization",
    "proxy-authenticate",
    "expect",
];

type ErrFn<'a> = dyn Fn(Range<usize>, String) -> PolicyError + 'a;

/// Validates a rule's `secrets` and `inject`; `None` when it binds nothing.
pub(crate) fn compile_bindings(
    secrets: Option<&Spanned<Vec<Spanned<String>>>>,
    inject: Option<&Spanned<Vec<InjectFile>>>,
    swap: Option<&Spanned<Vec<Spanned<String>>>>,
    sigv4: Option<&Spanned<Sigv4File>>,
    err: &ErrFn<'_>,
    uses: &mut Vec<SecretUse>,
) -> Result<Option<Arc<SecretBindings>>, PolicyError> {
    let mut names = BTreeSet::new();
    if let Some(list) = secrets {
        if list.get_ref().is_empty() {
            return Err(err(list.span(), "`secrets` must not be empty".into()));
        }
        for s in list.get_ref() {
            check_name(s.get_ref(), s.span(), err)?;
            names.insert(s.get_ref().clone());
            uses.push(SecretUse {
                secret: Arc::from(s.get_ref().as_str()),
                span: s.span(),
            });
        }
    }
    let mut injections = Vec::new();
    if let Some(list) = inject {
        let mut targets = BTreeSet::new();
        for entry in list.get_ref() {
            let target = match (&entry.header, &entry.query) {
                (Some(h), None) => {
                    let name = HeaderName::from_bytes(h.get_ref().as_bytes()).map_err(|_| {
                        err(h.span(), format!("invalid header name {:?}", h.get_ref()))
                    })?;
                    if FORBIDDEN_HEADERS.contains(&name.as_str()) {
                        return Err(err(
                            h.span(),
                            format!(
                                "`inject` may not set {:?}: it frames or routes the request",
                                name.as_str()
                            ),
                        ));
                    }
                    if !targets.insert(format!("header:{name}")) {
                        return Err(err(
                            h.span(),
                            format!("header {:?} is injected twice", name.as_str()),
                        ));
                    }
                    InjectTarget::Header(name)
                }
                (None, Some(q)) => {
                    let p = q.get_ref();
                    if p.is_empty()
                        || p.bytes()
                            .any(|b| !(0x21..=0x7e).contains(&b) || b"&=#".contains(&b))
                    {
                        return Err(err(q.span(), format!("invalid query parameter name {p:?}")));
                    }
                    if !targets.insert(format!("query:{p}")) {
                        return Err(err(
                            q.span(),
                            format!("query parameter {p:?} is injected twice"),
                        ));
                    }
                    InjectTarget::Query(p.clone())
                }
                _ => {
                    return Err(err(
                        entry.value.span(),
                        "each `inject` entry needs exactly one of `header` or `query`".into(),
                    ))
                }
            };
            let header = matches!(target, InjectTarget::Header(_));
            let template = parse_template(&entry.value, header, err)?;
            for part in template.iter() {
                if let TemplatePart::Secret(s) = part {
                    names.insert(s.to_string());
                    uses.push(SecretUse {
                        secret: s.clone(),
                        span: entry.value.span(),
                    });
                }
            }
            injections.push(Injection {
                target,
                template: template.into_boxed_slice(),
            });
        }
    }
    let sigv4 = match sigv4 {
        Some(s) => Some(compile_sigv4(s, &names, err, uses)?),
        None => None,
    };
    if names.is_empty() && injections.is_empty() && sigv4.is_none() {
        if let Some(list) = swap {
            return Err(err(
                list.span(),
                "`swap` says where placeholders of the rule's secrets are swapped, and it binds none (add `secrets = [...]`)".into(),
            ));
        }
        return Ok(None);
    }
    let mut swap = match swap {
        None => SwapPlaces::default(),
        Some(list) => compile_swap(list, err)?,
    };
    // What `inject` sets is a credential position: a placeholder the agent sent there is
    // swapped (and then replaced by the injection anyway).
    let mut headers = swap.headers.to_vec();
    let mut query = swap.query.to_vec();
    for inj in &injections {
        match &inj.target {
            InjectTarget::Header(h) => headers.push(h.clone()),
            InjectTarget::Query(q) => query.push(q.clone()),
        }
    }
    headers.sort_by(|a, b| a.as_str().cmp(b.as_str()));
    headers.dedup();
    query.sort();
    query.dedup();
    swap.headers = headers.into_boxed_slice();
    swap.query = query.into_boxed_slice();
    let names: Box<[Arc<str>]> = names.into_iter().map(|n| Arc::from(n.as_str())).collect();
    let mut needs: Vec<Arc<str>> = names.to_vec();
    needs.extend(sigv4.iter().flat_map(|k| k.names()).cloned());
    needs.sort();
    needs.dedup();
    Ok(Some(Arc::new(SecretBindings {
        names,
        inject: injections.into_boxed_slice(),
        swap,
        sigv4,
        needs: needs.into_boxed_slice(),
    })))
}

/// Checks `sigv4`: three distinct secret names, none also bound by `secrets` or `inject`
/// (a signing key swapped into a header would send it upstream).
fn compile_sigv4(
    spanned: &Spanned<Sigv4File>,
    bound: &BTreeSet<String>,
    err: &ErrFn<'_>,
    uses: &mut Vec<SecretUse>,
) -> Result<Sigv4Keys, PolicyError> {
    let file = spanned.get_ref();
    let scope = super::Sigv4Scope::compile(
        file.services.as_ref(),
        file.regions.as_ref(),
        file.actions.as_ref(),
        file.copy_sources.as_ref(),
        spanned.span(),
    )
    .map_err(|(span, e)| err(span, e.to_string()))?;
    let mut seen = BTreeSet::new();
    let fields = [
        Some(&file.access_key_id),
        Some(&file.secret_access_key),
        file.session_token.as_ref(),
    ];
    for s in fields.into_iter().flatten() {
        let name = s.get_ref();
        check_name(name, s.span(), err)?;
        if !seen.insert(name.as_str()) {
            return Err(err(
                s.span(),
                format!("`sigv4` names secret {name:?} twice: each key is its own secret"),
            ));
        }
        if bound.contains(name) {
            return Err(err(
                s.span(),
                format!(
                    "secret {name:?} signs requests (`sigv4`), so it may not also be swapped or injected (`secrets`, `inject`)"
                ),
            ));
        }
        uses.push(SecretUse {
            secret: Arc::from(name.as_str()),
            span: s.span(),
        });
    }
    Ok(Sigv4Keys {
        access_key_id: Arc::from(file.access_key_id.get_ref().as_str()),
        secret_access_key: Arc::from(file.secret_access_key.get_ref().as_str()),
        session_token: file
            .session_token
            .as_ref()
            .map(|t| Arc::from(t.get_ref().as_str())),
        scope: Arc::new(scope),
    })
}

fn compile_swap(
    list: &Spanned<Vec<Spanned<String>>>,
    err: &ErrFn<'_>,
) -> Result<SwapPlaces, PolicyError> {
    let mut places = SwapPlaces::default();
    let mut headers: Vec<HeaderName> = Vec::new();
    let mut query: Vec<String> = Vec::new();
    let mut seen = BTreeSet::new();
    for p in list.get_ref() {
        let written = p.get_ref().as_str();
        if !seen.insert(written.to_ascii_lowercase()) {
            return Err(err(
                p.span(),
                format!("{written:?} is listed twice in `swap`"),
            ));
        }
        match written {
            "headers" => places.all_headers = true,
            "path" => places.path = true,
            "url" => {
                places.path = true;
                places.all_query = true;
            }
            "body" => places.body = true,
            "websocket" => places.websocket = true,
            _ => {
                if let Some(name) = written.strip_prefix("header:") {
                    let h = HeaderName::from_bytes(name.as_bytes()).map_err(|_| {
                        err(p.span(), format!("invalid header name {name:?} in `swap`"))
                    })?;
                    if FORBIDDEN_HEADERS.contains(&h.as_str())
                        && h != http::header::PROXY_AUTHORIZATION
                    {
                        return Err(err(
                            p.span(),
                            format!(
                                "`swap` may not name {:?}: it frames or routes the request",
                                h.as_str()
                            ),
                        ));
                    }
                    headers.push(h);
                } else if let Some(name) = written.strip_prefix("query:") {
                    if name.is_empty()
                        || name
                            .bytes()
                            .any(|b| !(0x21..=0x7e).contains(&b) || b"&=#".contains(&b))
                    {
                        return Err(err(
                            p.span(),
                            format!("invalid query parameter name {name:?} in `swap`"),
                        ));
                    }
                    query.push(name.to_string());
                } else {
                    let known = SwapPlaces::NAMES.map(|n| format!("{n:?}")).join(", ");
                    return Err(err(
                        p.span(),
                        format!("unknown place {written:?} in `swap`; expected any of {known}"),
                    ));
                }
            }
        }
    }
    headers.sort_by(|a, b| a.as_str().cmp(b.as_str()));
    query.sort();
    places.headers = headers.into_boxed_slice();
    places.query = query.into_boxed_slice();
    Ok(places)
}

/// `Bearer ${secret:NAME}`: literal text and `${secret:NAME}` references; `$$` is a `$`.
fn parse_template(
    value: &Spanned<String>,
    header: bool,
    err: &ErrFn<'_>,
) -> Result<Vec<TemplatePart>, PolicyError> {
    let text = value.get_ref();
    let bad = |msg: String| err(value.span(), msg);
    let mut parts = Vec::new();
    let mut literal = String::new();
    let mut rest = text.as_str();
    while let Some(i) = rest.find('$') {
        literal.push_str(&rest[..i]);
        rest = &rest[i..];
        if let Some(after) = rest.strip_prefix("$$") {
            literal.push('$');
            rest = after;
        } else if let Some(after) = rest.strip_prefix("${secret:") {
            let Some(end) = after.find('}') else {
                return Err(bad(format!("unterminated `${{secret:` in {text:?}")));
            };
            let name = &after[..end];
            check_name(name, value.span(), err)?;
            if !literal.is_empty() {
                parts.push(TemplatePart::Literal(std::mem::take(&mut literal)));
            }
            parts.push(TemplatePart::Secret(Arc::from(name)));
            rest = &after[end + 1..];
        } else {
            return Err(bad(format!(
                "unexpected `$` in {text:?}: write `${{secret:NAME}}` for a secret or `$$` for a dollar sign"
            )));
        }
    }
    literal.push_str(rest);
    if !literal.is_empty() {
        parts.push(TemplatePart::Literal(literal));
    }
    let literal_ok = |s: &str| {
        s.bytes()
            .all(|b| (0x20..=0x7e).contains(&b) || (header && b == b'\t'))
    };
    for p in &parts {
        if let TemplatePart::Literal(s) = p {
            if !literal_ok(s) {
                return Err(bad(format!(
                    "{text:?} has characters a header or URL cannot carry"
                )));
            }
        }
    }
    if parts.is_empty() {
        return Err(bad("`value` must not be empty".into()));
    }
    Ok(parts)
}

fn check_name(name: &str, span: Range<usize>, err: &ErrFn<'_>) -> Result<(), PolicyError> {
    super::SecretName::new(name)
        .map(|_| ())
        .map_err(|e| err(span, e.to_string()))
}

/// Where a rule names a secret.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecretRef {
    pub secret: Arc<str>,
    pub rule: Arc<str>,
    pub at: super::Location,
}

/// A `[secrets.NAME] rate`, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecretRate {
    pub secret: Arc<str>,
    pub rate: super::RateLimit,
    pub at: super::Location,
}

#[cfg(test)]
#[path = "inject_tests.rs"]
pub(super) mod tests;
