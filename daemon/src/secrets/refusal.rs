//! Why the engine refused a request, or cut a response short: the violation, the secret it
//! names, and where (`Place`). It names the secret and the place, never the value; its
//! `message` is what the agent is told.

use crate::secrets::fetch::provider::SecretKind;
use crate::secrets::rewrite::aws_chunked::ChunkError;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Violation {
    /// A placeholder headed somewhere its secret is not bound.
    Scope,
    /// A real secret value headed somewhere it is not bound.
    Leak,
    /// The rule binds a secret the store no longer holds.
    Unavailable,
    /// The rule binds a fetched secret (a command's output, an OAuth2 token) whose fetch
    /// failed; `place` says which source failed.
    Unfetched,
    /// A bound secret would travel where it cannot be protected: over plain HTTP, or over a
    /// protocol upgrade whose frames the proxy does not inspect or redact.
    Transport,
    /// A placeholder of a secret the rule binds, in a place where the rule does not swap it
    /// (its `swap` leaves the place out, or the place cannot be rewritten: a compressed or
    /// binary body, the method, trailers). Sending the placeholder on would only fail
    /// upstream, less clearly.
    NotSwapped,
    /// A request signed with the placeholder of a rule's AWS key id (`sigv4`) that cannot
    /// be signed again; `place` says why.
    Unsignable,
    /// An AWS request outside what the rule's `sigv4` may sign; `place` says how.
    OutOfScope,
    /// A response under a rule that binds no secret carried a secret's value (its upstream
    /// was never given it: it got there as content); the response was cut short there.
    Echoed,
}

impl Violation {
    /// Its name in log lines.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Violation::Scope => "scope",
            Violation::Leak => "leak",
            Violation::Unavailable => "unavailable",
            Violation::Unfetched => "unfetched",
            Violation::Transport => "transport",
            Violation::NotSwapped => "not_swapped",
            Violation::Unsignable => "unsignable",
            Violation::OutOfScope => "out_of_scope",
            Violation::Echoed => "echoed",
        }
    }
}

/// Why a request was refused. Names the secret and the place, never the value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SecretRefusal {
    pub violation: Violation,
    pub secret: String,
    pub place: Place,
}

impl SecretRefusal {
    pub(crate) fn message(&self, rule: Option<&str>) -> String {
        let rule = match rule {
            Some(id) if id != crate::policy::DEFAULT_RULE => format!("rule {id}"),
            _ => "the policy default".to_string(),
        };
        match self.violation {
            Violation::Scope => format!(
                "the placeholder for secret {:?} in the {} may only go where a rule binds it, and {rule} does not",
                self.secret, self.place
            ),
            Violation::Leak => format!(
                "the {} carries the value of secret {:?}, which {rule} does not bind; refused so it cannot leak",
                self.place, self.secret
            ),
            Violation::Unavailable => format!(
                "{rule} needs secret {:?}, which is not in the store",
                self.secret
            ),
            Violation::Unfetched => format!(
                "{rule} needs secret {:?}, which could not be fetched ({}); the operator sees why in `agenshield proxy ctl secrets list`",
                self.secret, self.place
            ),
            Violation::Transport => format!(
                "{rule} binds secret {:?}, which is never sent over {}; refused",
                self.secret, self.place
            ),
            Violation::Unsignable => format!(
                "{rule} signs AWS requests made with the placeholder for secret {:?}, and this one cannot be signed: {}",
                self.secret, self.place
            ),
            Violation::OutOfScope => format!(
                "{rule} signs AWS requests with secret {:?}, and this one {}; refused",
                self.secret, self.place
            ),
            Violation::Echoed => format!(
                "the response's {} carried the value of secret {:?}, which {rule} does not bind; it was cut short there, so the value never reached the agent",
                self.place, self.secret
            ),
            Violation::NotSwapped => format!(
                "the placeholder for secret {:?} is in the {}, where {rule} does not swap it for the value; refused rather than sent on as the placeholder (the rule's `swap` lists where it does)",
                self.secret, self.place
            ),
        }
    }
}

/// Where a refused secret was; for a violation about where it may travel, how it is fetched
/// or signed, what stands in its way. Shown in the agent's answer and the daemon's log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Place {
    /// The request method.
    Method,
    Host,
    /// The names of the request's headers (or trailers).
    HeaderNames,
    /// One header's (or trailer's) value, Basic credentials decoded.
    Header(http::HeaderName),
    Path,
    Query,
    /// A rule's `inject` entries name a secret the store does not hold.
    Policy,
    /// The rule's `sigv4` keys name a secret the store does not hold.
    Sigv4,
    /// The request body (or, for `Echoed`, the response body).
    Body,
    /// The body of a request going upstream without TLS.
    BodyOverPlainHttp,
    /// A body in a content coding (escaped as received), which cannot be rewritten.
    EncodedBody(String),
    /// A body of a media type that cannot be rewritten (escaped as received).
    BodyOfType(String),
    WebSocketMessage,
    WebSocketMessageOverPlainHttp,
    WebSocketBinaryMessage,
    WebSocketCloseReason,
    /// Content whose placeholder a pause in the stream split: its start went on already.
    SplitByPause(Box<Place>),
    /// `Transport`: a request going upstream without TLS.
    PlainHttp,
    /// `Transport`: an upgrade to another protocol than WebSocket (escaped as asked).
    Upgrade(String),
    /// `Unfetched`: the source of a fetched secret that failed (what failed, not why).
    Fetch(SecretKind),
    /// `Unsignable`: a body signed chunk by chunk whose chunks are not as AWS frames them.
    AwsChunked(ChunkError),
    /// `Unsignable` and `OutOfScope`: why the request cannot be signed, or how it is outside
    /// what the rule may sign.
    Why(String),
}

impl std::fmt::Display for Place {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Place::Method => f.write_str("method"),
            Place::Host => f.write_str("host"),
            Place::HeaderNames => f.write_str("header names"),
            Place::Header(name) => write!(f, "header {name}"),
            Place::Path => f.write_str("path"),
            Place::Query => f.write_str("query"),
            Place::Policy => f.write_str("policy"),
            Place::Sigv4 => f.write_str("sigv4"),
            Place::Body => f.write_str("body"),
            Place::BodyOverPlainHttp => f.write_str("body sent over plain HTTP"),
            Place::EncodedBody(coding) => write!(f, "{coding}-encoded body"),
            Place::BodyOfType(essence) => write!(f, "body of type {essence}"),
            Place::WebSocketMessage => f.write_str("WebSocket message"),
            Place::WebSocketMessageOverPlainHttp => {
                f.write_str("WebSocket message over plain HTTP")
            }
            Place::WebSocketBinaryMessage => f.write_str("WebSocket binary message"),
            Place::WebSocketCloseReason => f.write_str("WebSocket close reason"),
            Place::SplitByPause(place) => {
                write!(f, "{place} (split by a pause in the stream)")
            }
            Place::PlainHttp => f.write_str("plain HTTP"),
            Place::Upgrade(proto) => write!(f, "an upgraded connection ({proto})"),
            Place::Fetch(kind) => f.write_str(match kind {
                SecretKind::Command => "its command failed",
                SecretKind::Oauth2 => "its token endpoint did not give a token",
                SecretKind::Static => "it could not be read",
            }),
            Place::AwsChunked(e) => write!(f, "an aws-chunked body with {e}"),
            Place::Why(why) => f.write_str(why),
        }
    }
}
