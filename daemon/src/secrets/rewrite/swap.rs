//! The placeholder swap and the leak guard over content the agent sends (a request body, a
//! WebSocket message), applied to the pieces a `ChunkScanner` releases: a placeholder of a
//! secret the rule binds becomes its value, encoded for the content's type, where the rule
//! swaps there, and is refused elsewhere; a secret the rule does not bind (its value or its
//! placeholder) is refused.

use std::sync::{Arc, Mutex};

use bytes::{Bytes, BytesMut};
use http::{header, HeaderMap};

use crate::policy::SecretBindings;
use crate::secrets::guard::redact::content_coding;
use crate::secrets::guard::stream::{ChunkScanner, Piece};
use crate::secrets::set::SecretSet;
use crate::secrets::{Place, SecretRefusal, Violation};

/// What becomes of a placeholder of a bound secret in the content.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum BodySwap {
    /// Refused: the rule does not swap here, or this content cannot be rewritten (`place`
    /// says which: `body`, `gzip-encoded body`, `body of type application/grpc`, `WebSocket
    /// binary message`).
    Refused { place: Place },
    /// The value JSON-escaped (`"` and `\`), for a placeholder inside a JSON string.
    Json,
    /// The value percent-encoded, as a form field's value.
    Form,
    /// The value as it is.
    Text,
}

impl BodySwap {
    /// What a placeholder of a bound secret becomes in a request body with these headers:
    /// `swaps_body`: the rule swaps in bodies; `tls`: the request goes upstream over TLS.
    pub(crate) fn for_body(headers: &HeaderMap, swaps_body: bool, tls: bool) -> BodySwap {
        let refused = |place: Place| BodySwap::Refused { place };
        if !swaps_body {
            return refused(Place::Body);
        }
        if !tls {
            return refused(Place::BodyOverPlainHttp);
        }
        // A compressed body cannot be rewritten: a placeholder visible in its bytes is
        // refused, one the compression hides goes on as the text it is.
        if let Some(coding) = content_coding(headers) {
            return refused(Place::EncodedBody(coding));
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
            _ => refused(Place::BodyOfType(essence.escape_debug().to_string())),
        }
    }

    pub(crate) fn swaps(&self) -> bool {
        !matches!(self, BodySwap::Refused { .. })
    }

    fn encode(&self, value: &[u8]) -> Bytes {
        match self {
            BodySwap::Json => {
                Bytes::copy_from_slice(&crate::secrets::guard::matcher::json_escaped(value, false))
            }
            BodySwap::Form => Bytes::from(
                percent_encoding::percent_encode(
                    value,
                    crate::secrets::rewrite::inject::QUERY_VALUE,
                )
                .to_string(),
            ),
            BodySwap::Text | BodySwap::Refused { .. } => Bytes::copy_from_slice(value),
        }
    }
}

/// The swap and the guard for one stream of content.
pub(crate) struct Swapper {
    pub set: Arc<SecretSet>,
    pub bindings: Option<Arc<SecretBindings>>,
    pub swap: BodySwap,
    /// Where a secret the rule does not bind is reported found (`body`, `WebSocket message`).
    pub place: Place,
    /// Bound secrets whose placeholders were swapped, in the order first swapped.
    pub swapped: Arc<Mutex<Vec<Arc<str>>>>,
}

impl Swapper {
    /// Checks released pieces, swapping bound placeholders where the content may be
    /// rewritten; returns the bytes to send on.
    pub(crate) fn check(&self, pieces: Vec<Piece>) -> Result<Bytes, SecretRefusal> {
        let mut out = BytesMut::new();
        let mut single = None;
        let n = pieces.len();
        let binds = |name: &str| self.bindings.as_ref().is_some_and(|bd| bd.binds(name));
        let refusal = |violation, name: &str, place: &Place| SecretRefusal {
            violation,
            secret: name.to_string(),
            place: place.clone(),
        };
        for p in pieces {
            let bytes = match p {
                Piece::Plain(b) => b,
                Piece::Value(run) => {
                    // Every value in the run must be one the rule binds.
                    for &i in &run.secrets {
                        let name = self.set.at(i).name.as_str();
                        if !binds(name) {
                            return Err(refusal(Violation::Leak, name, &self.place));
                        }
                    }
                    run.bytes
                }
                Piece::Placeholder {
                    secret,
                    bytes,
                    split,
                } => {
                    let secret = self.set.at(secret);
                    let name = secret.name.as_str();
                    if !binds(name) {
                        return Err(refusal(Violation::Scope, name, &self.place));
                    }
                    match &self.swap {
                        BodySwap::Refused { place } => {
                            return Err(refusal(Violation::NotSwapped, name, place));
                        }
                        // Its start went on as text before a pause: it can no longer be
                        // swapped whole.
                        _ if split => {
                            return Err(refusal(
                                Violation::NotSwapped,
                                name,
                                &Place::SplitByPause(Box::new(self.place.clone())),
                            ));
                        }
                        swap => {
                            if let Ok(mut s) = self.swapped.lock() {
                                if !s.iter().any(|n| &**n == name) {
                                    s.push(secret.name.shared());
                                }
                            }
                            let _ = bytes;
                            swap.encode(secret.value.expose())
                        }
                    }
                }
            };
            if n == 1 {
                single = Some(bytes);
            } else {
                out.extend_from_slice(&bytes);
            }
        }
        Ok(single.unwrap_or_else(|| out.freeze()))
    }

    /// Checks and swaps a whole piece of content (a message); unchanged when no secret is
    /// held.
    pub(crate) fn whole(&self, content: Bytes) -> Result<Bytes, SecretRefusal> {
        let Some(m) = self.set.matcher() else {
            return Ok(content);
        };
        let mut scanner = ChunkScanner::default();
        let mut pieces = scanner.push(m, content);
        pieces.extend(scanner.finish(m));
        self.check(pieces)
    }
}

#[cfg(test)]
#[path = "swap_tests.rs"]
mod tests;
