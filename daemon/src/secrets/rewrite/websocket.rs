//! A WebSocket under a rule that binds secrets, relayed message by message rather than byte
//! for byte (tungstenite parses the frames: masking, fragmentation, control frames, UTF-8).
//!
//! * Agent → upstream: a text message has the placeholders of the rule's secrets swapped for
//!   their values where the rule's `swap` lists `"websocket"`; a fragmented message is
//!   reassembled first, so a placeholder split across fragments is found whole. A binary
//!   message or a close reason that carries a placeholder is refused (it is not text), and
//!   any message carrying a secret the rule does not bind (value or placeholder) is refused.
//!   A refusal closes both sides (1008, policy violation) before any of that message goes on.
//! * Upstream → agent: every message and close reason has each secret value replaced by its
//!   placeholder; a real value never reaches the agent.
//! * Pings and pongs are hop by hop: each side's pings are answered by the relay, none is
//!   passed on (so no payload crosses, and a redacted ping never comes back as a pong
//!   carrying a placeholder).
//!
//! Compression (`permessage-deflate`) is not negotiated for such a connection: the request's
//! `Sec-WebSocket-Extensions` is removed, and an upstream that answers with an extension
//! anyway is refused (`offered_extensions_removed`, `check_accepted`). Messages are bounded
//! (`MAX_MESSAGE`); a longer one closes the connection (1009).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, Role, WebSocketConfig};
use tokio_tungstenite::tungstenite::{self, Message, Utf8Bytes};
use tokio_tungstenite::WebSocketStream;

use crate::policy::SecretBindings;
use crate::record::End;
use crate::secrets::rewrite::swap::{BodySwap, Swapper};
use crate::secrets::set::SecretSet;
use crate::secrets::{Place, SecretRefusal};
use crate::upstream::relay::{supervise, Activity, Relayed, Watched};

/// The longest message relayed (after reassembly); also the longest frame.
pub(crate) const MAX_MESSAGE: usize = 16 << 20;
/// How long the second direction may take to finish once the first has closed.
const CLOSE_GRACE: Duration = Duration::from_secs(5);
/// The longest reason a Close frame may carry (RFC 6455 §5.5: 125 bytes, less the code).
const MAX_CLOSE_REASON: usize = 123;

/// The credential check (`pipeline/dlp.rs`) on the agent's messages: each text or binary
/// message (reassembled, unmasked) and close reason is checked before any of it goes on.
pub(crate) trait FrameCheck: Send + Sync {
    /// `Err`: the message is refused (the text says why, never a value).
    fn check(&self, message: &[u8]) -> Result<(), String>;
    /// What the check found so far, for the close record.
    fn facts(&self) -> Option<crate::record::DlpFacts>;
}

/// The secrets a WebSocket is guarded against, and what it swapped.
pub(crate) struct FrameGuard {
    pub set: Arc<SecretSet>,
    /// `None`: the rule binds no secret (the guard is there for the credential check).
    pub bindings: Option<Arc<SecretBindings>>,
    /// The credential check, unless the rule says `dlp = "off"`.
    pub dlp: Option<Arc<dyn FrameCheck>>,
    /// Bound secrets swapped into messages, in the order first swapped.
    pub swapped: Arc<Mutex<Vec<Arc<str>>>>,
    /// The WebSocket runs over TLS: only then is a placeholder swapped for its value.
    pub tls: bool,
}

/// How a guarded WebSocket ended.
pub(crate) struct GuardedRelay {
    pub relayed: Relayed,
    /// The message the leak guard refused, when it closed the connection.
    pub refused: Option<SecretRefusal>,
    /// Why the credential check refused a message, when it closed the connection.
    pub dlp_refused: Option<String>,
}

/// Whether an upstream's 101 may be relayed message by message: it must not have agreed to
/// an extension (none was offered, so one would be a protocol error, and a compressed frame
/// could not be searched). `Err` names what it agreed to.
pub(crate) fn check_accepted(headers: &http::HeaderMap) -> Result<(), UnofferedExtension> {
    match headers.get(http::header::SEC_WEBSOCKET_EXTENSIONS) {
        None => Ok(()),
        Some(v) => Err(UnofferedExtension(
            String::from_utf8_lossy(v.as_bytes()).into_owned(),
        )),
    }
}

/// An upstream's 101 agreed to a WebSocket extension (named) that was not offered.
#[derive(Debug, thiserror::Error)]
#[error("the upstream agreed to the WebSocket extension {0:?}, which was not offered")]
pub(crate) struct UnofferedExtension(String);

/// Removes the extensions an agent offers (`permessage-deflate`): the relay must see every
/// message as text.
pub(crate) fn offered_extensions_removed(headers: &mut http::HeaderMap) {
    headers.remove(http::header::SEC_WEBSOCKET_EXTENSIONS);
}

impl FrameGuard {
    fn swapper(&self, swap: BodySwap, place: Place) -> Swapper {
        Swapper {
            set: self.set.clone(),
            bindings: self.bindings.clone(),
            swap,
            place,
            swapped: self.swapped.clone(),
        }
    }

    /// The bound secrets swapped into messages so far, sorted.
    pub(crate) fn swapped_names(&self) -> Vec<Arc<str>> {
        let mut names = self.swapped.lock().map(|s| s.clone()).unwrap_or_default();
        names.sort();
        names
    }

    /// Relays messages both ways until either side closes (and the other follows, or the
    /// grace ends), nothing moves for `idle`, `stop` resolves, or the guard refuses a
    /// message. `client` is the agent's side.
    pub(crate) async fn relay<A, B, S>(
        &self,
        client: A,
        upstream: B,
        idle: Duration,
        stop: S,
    ) -> GuardedRelay
    where
        A: AsyncRead + AsyncWrite + Unpin,
        B: AsyncRead + AsyncWrite + Unpin,
        S: std::future::Future,
    {
        let config = WebSocketConfig::default()
            .max_message_size(Some(MAX_MESSAGE))
            .max_frame_size(Some(MAX_MESSAGE));
        let activity = Activity::new();
        let agent = Watched::new(client, &activity);
        let far = Watched::new(upstream, &activity);
        let agent = WebSocketStream::from_raw_socket(agent, Role::Server, Some(config)).await;
        let far = WebSocketStream::from_raw_socket(far, Role::Client, Some(config)).await;
        let (mut to_agent, mut from_agent) = agent.split();
        let (mut to_far, mut from_far) = far.split();

        let swaps = self.bindings.as_ref().is_some_and(|b| b.swap.websocket);
        let text_swap = match (swaps, self.tls) {
            (true, true) => BodySwap::Text,
            (true, false) => BodySwap::Refused {
                place: Place::WebSocketMessageOverPlainHttp,
            },
            (false, _) => BodySwap::Refused {
                place: Place::WebSocketMessage,
            },
        };
        let text = self.swapper(text_swap, Place::WebSocketMessage);
        let binary = self.swapper(
            BodySwap::Refused {
                place: Place::WebSocketBinaryMessage,
            },
            Place::WebSocketMessage,
        );
        let reason = self.swapper(
            BodySwap::Refused {
                place: Place::WebSocketCloseReason,
            },
            Place::WebSocketCloseReason,
        );
        let outcome = {
            let up = async {
                loop {
                    let Some(msg) = from_agent.next().await else {
                        return Ok(());
                    };
                    let msg = msg.map_err(Flow::Broken)?;
                    if let Some(check) = &self.dlp {
                        let bytes: &[u8] = match &msg {
                            Message::Text(t) => t.as_bytes(),
                            Message::Binary(b) => b,
                            Message::Close(Some(f)) => f.reason.as_bytes(),
                            _ => &[],
                        };
                        if !bytes.is_empty() {
                            check.check(bytes).map_err(Flow::Credential)?;
                        }
                    }
                    let close = matches!(msg, Message::Close(_));
                    let out = outbound(msg, &text, &binary, &reason).map_err(Flow::Refused)?;
                    if close {
                        // The upstream may have closed first: this is then its answer.
                        let _ = to_far.send(out.unwrap_or(Message::Close(None))).await;
                        return Ok(());
                    }
                    if let Some(out) = out {
                        to_far.send(out).await.map_err(Flow::Broken)?;
                    }
                }
            };
            let down = async {
                loop {
                    let Some(msg) = from_far.next().await else {
                        return Ok(());
                    };
                    let msg = msg.map_err(Flow::Broken)?;
                    let close = matches!(msg, Message::Close(_));
                    let out = inbound(msg, &self.set);
                    if close {
                        // The agent may have closed first: this is then its answer.
                        let _ = to_agent.send(out.unwrap_or(Message::Close(None))).await;
                        return Ok(());
                    }
                    if let Some(out) = out {
                        to_agent.send(out).await.map_err(Flow::Broken)?;
                    }
                }
            };
            let both = async {
                tokio::pin!(up);
                tokio::pin!(down);
                let rest = tokio::select! {
                    r = &mut up => { r?; Rest::Down }
                    r = &mut down => { r?; Rest::Up }
                };
                // One side closed: the other gets a moment to answer the close.
                let second = match rest {
                    Rest::Down => tokio::time::timeout(CLOSE_GRACE, &mut down).await,
                    Rest::Up => tokio::time::timeout(CLOSE_GRACE, &mut up).await,
                };
                second.unwrap_or(Ok(()))
            };
            supervise(both, &activity, idle, stop).await
        };

        let mut dlp_refused = None;
        let (end, error, refused) = match outcome {
            Ok(Ok(())) => (End::Closed, None, None),
            Ok(Err(Flow::Broken(e))) => match e {
                tungstenite::Error::ConnectionClosed | tungstenite::Error::AlreadyClosed => {
                    (End::Closed, None, None)
                }
                tungstenite::Error::Capacity(_) => {
                    let _ = to_agent
                        .send(close(CloseCode::Size, "message too big"))
                        .await;
                    (End::Error, Some(std::io::Error::other(e)), None)
                }
                e => (End::Error, Some(std::io::Error::other(e)), None),
            },
            Ok(Err(Flow::Credential(why))) => {
                let reason = "agenshield: message refused: credential_exfiltration";
                let _ = to_agent.send(close(CloseCode::Policy, reason)).await;
                let _ = to_far.send(close(CloseCode::Away, "")).await;
                dlp_refused = Some(why);
                (End::Refused, None, None)
            }
            Ok(Err(Flow::Refused(r))) => {
                let why = "agenshield: message refused by the secret guard";
                let _ = to_agent.send(close(CloseCode::Policy, why)).await;
                let _ = to_far.send(close(CloseCode::Away, "")).await;
                (End::Refused, None, Some(r))
            }
            Err(end) => (end, None, None),
        };
        let up = from_agent.reunite(to_agent).map_or(0, |s| s.get_ref().read);
        let down = from_far.reunite(to_far).map_or(0, |s| s.get_ref().read);
        GuardedRelay {
            relayed: Relayed {
                up,
                down,
                end,
                error,
            },
            refused,
            dlp_refused,
        }
    }
}

/// Why a direction stopped before its side closed.
enum Flow {
    Broken(tungstenite::Error),
    Refused(SecretRefusal),
    /// The credential check refused a message (why).
    Credential(String),
}

enum Rest {
    Up,
    Down,
}

fn close(code: CloseCode, reason: &'static str) -> Message {
    Message::Close(Some(CloseFrame {
        code,
        reason: Utf8Bytes::from_static(reason),
    }))
}

/// An agent's message as it goes upstream: placeholders swapped or refused, secrets the rule
/// does not bind refused. `None`: nothing to send (a ping or pong, answered hop by hop; a raw
/// frame, which is never read).
fn outbound(
    msg: Message,
    text: &Swapper,
    binary: &Swapper,
    close_reason: &Swapper,
) -> Result<Option<Message>, SecretRefusal> {
    Ok(Some(match msg {
        Message::Text(t) => {
            let out = text.whole(Bytes::from(t))?;
            // Values are printable ASCII (`value.rs`), and placeholders are ASCII: replacing
            // one with the other keeps the text UTF-8.
            Message::Text(Utf8Bytes::try_from(out).unwrap_or_default())
        }
        Message::Binary(b) => Message::Binary(binary.whole(b)?),
        // Hop by hop: tungstenite has answered it already.
        Message::Ping(_) | Message::Pong(_) => return Ok(None),
        Message::Close(Some(f)) => {
            let reason = close_reason.whole(Bytes::from(f.reason.clone()))?;
            let reason = Utf8Bytes::try_from(reason).unwrap_or_default();
            Message::Close(Some(CloseFrame {
                code: f.code,
                reason,
            }))
        }
        Message::Close(None) => Message::Close(None),
        Message::Frame(_) => return Ok(None),
    }))
}

/// An upstream's message as it goes to the agent: every secret value replaced by its
/// placeholder. `None`: nothing to send (a ping or pong, answered hop by hop).
fn inbound(msg: Message, set: &SecretSet) -> Option<Message> {
    let redact = |b: Bytes| -> Bytes { set.redact_bytes(&b).map_or(b, Bytes::from) };
    // A close reason that would outgrow its frame once redacted is dropped.
    let reason = |b: Bytes| -> Bytes {
        match set.redact_bytes(&b) {
            None => b,
            Some(r) if r.len() <= MAX_CLOSE_REASON => Bytes::from(r),
            Some(_) => Bytes::new(),
        }
    };
    Some(match msg {
        Message::Text(t) => {
            let b = redact(Bytes::from(t));
            // Values are replaced whole, so the text stays UTF-8.
            Message::Text(Utf8Bytes::try_from(b).unwrap_or_default())
        }
        Message::Binary(b) => Message::Binary(redact(b)),
        Message::Ping(_) | Message::Pong(_) => return None,
        Message::Close(Some(f)) => {
            let reason = reason(Bytes::from(f.reason.clone()));
            let reason = Utf8Bytes::try_from(reason).unwrap_or_default();
            Message::Close(Some(CloseFrame {
                code: f.code,
                reason,
            }))
        }
        Message::Close(None) => Message::Close(None),
        Message::Frame(_) => return None,
    })
}

#[cfg(test)]
#[path = "websocket_tests.rs"]
mod tests;
