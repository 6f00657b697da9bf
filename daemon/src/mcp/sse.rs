//! An MCP answer as a `text/event-stream` body, filtered event by event: each event whose
//! data is a JSON-RPC message carrying a list result is rewritten (`filter.rs`); other events
//! pass as they were (re-encoded). Events are parsed and encoded by `sse-stream` (the SSE
//! codec the Rust MCP SDK uses), never by hand.
//!
//! Under the older HTTP+SSE transport the stream's `endpoint` event registers it
//! (`sessions.rs`), and the proxy's answers to refused POSTs are merged into it as `message`
//! events.
//!
//! Cost is bounded: the parser holds at most the event being read, and an event longer than
//! the cap ends the stream with an error (the client sees the stream break, nothing
//! unfiltered). Comment lines (`: keep-alive`) are not forwarded.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use futures_util::StreamExt;
use http_body_util::{BodyDataStream, BodyExt};
use sse_stream::{SseBody, SseByteStream};

use super::filter::Filter;
use super::sessions::SseSessions;
use super::McpState;
use crate::body::{BodyError, ProxyBody};
use crate::policy::McpRule;

/// Why the stream read from the server ends early.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ReadError {
    #[error("{0}")]
    Body(BodyError),
    #[error("an SSE event of the MCP server is longer than {0} bytes; the stream is cut")]
    EventTooLarge(usize),
}

/// `body` (a `text/event-stream`) with every list result in it filtered by the rule, after
/// `first`: the proxy's own messages sent before the server's (its errors for the refused
/// messages of a batch forwarded in part).
pub(crate) fn filtered(
    body: ProxyBody,
    rule: Arc<McpRule>,
    state: Arc<McpState>,
    server: Arc<str>,
    cap: usize,
    first: Vec<String>,
) -> ProxyBody {
    let (tx, rx) = SseSessions::channel();
    let mut tx = Some(tx);
    let mut registered = None;
    // Bytes read since the last event came out: what the parser may be holding.
    let pending = Arc::new(AtomicUsize::new(0));
    let counted = {
        let pending = pending.clone();
        BodyDataStream::new(body).map(move |chunk| {
            let chunk: Bytes = chunk.map_err(ReadError::Body)?;
            if pending.fetch_add(chunk.len(), Ordering::Relaxed) + chunk.len() > cap {
                return Err(ReadError::EventTooLarge(cap));
            }
            Ok(chunk)
        })
    };
    let events = SseByteStream::new(counted).map(move |event| {
        let mut event = event?;
        pending.store(0, Ordering::Relaxed);
        if event.event.as_deref() == Some("endpoint") && registered.is_none() {
            if let (Some(tx), Some(endpoint)) = (tx.take(), &event.data) {
                registered = state.sessions.register(server.clone(), endpoint, tx);
            }
        }
        if let Some(data) = &event.data {
            let filter = Filter {
                rule: &rule,
                pins: &state.pins,
                server: &server,
            };
            if let (Some(json), _) = filter.bytes(data.as_bytes()) {
                // serde_json writes UTF-8.
                event.data = Some(String::from_utf8_lossy(&json).into_owned());
            }
        }
        Ok::<_, sse_stream::Error>(event)
    });
    // The proxy's own answers, merged in; the stream ends when the server's does.
    let injected = tokio_stream_from(rx).map(|json| {
        Some(Ok::<_, sse_stream::Error>(
            sse_stream::Sse::default().event("message").data(json),
        ))
    });
    let ours = futures_util::stream::iter(first).map(|json| {
        Ok::<_, sse_stream::Error>(sse_stream::Sse::default().event("message").data(json))
    });
    let upstream = ours
        .chain(events)
        .map(Some)
        .chain(futures_util::stream::once(async { None }));
    let merged = futures_util::stream::select(upstream, injected)
        .take_while(|e| std::future::ready(e.is_some()))
        .filter_map(std::future::ready);
    SseBody::new(merged).map_err(BodyError::from).boxed()
}

/// A receiver as a stream (without tokio-stream).
fn tokio_stream_from(
    rx: tokio::sync::mpsc::Receiver<String>,
) -> impl futures_util::Stream<Item = String> {
    futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|m| (m, rx)) })
}
