//! The older HTTP+SSE transport's sessions: the client opens an SSE stream (GET), whose first
//! event (`endpoint`) names where to POST its messages; the server answers them on that
//! stream, not in the POSTs' responses. So that a refused message is answered where the
//! client reads, each stream under an `mcp` rule registers the endpoint it announced here,
//! and the proxy's JSON-RPC errors are sent as events into that stream.
//!
//! Bounded: at most `MAX_SESSIONS` streams are registered (past that, a refusal is the plain
//! 403), each with a queue of `QUEUE` events; a stream's entry goes when its body is dropped.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::mpsc;

const MAX_SESSIONS: usize = 4096;
const QUEUE: usize = 64;

/// (server `host:port`, endpoint path and query) → the stream's queue of injected events.
type Key = (Arc<str>, String);

#[derive(Debug, Default)]
pub(crate) struct SseSessions {
    open: Mutex<HashMap<Key, mpsc::Sender<String>>>,
}

/// A stream's registration; dropping it removes the entry.
pub(crate) struct Registered {
    sessions: Arc<SseSessions>,
    key: Key,
}

impl Drop for Registered {
    fn drop(&mut self) {
        if let Ok(mut open) = self.sessions.open.lock() {
            open.remove(&self.key);
        }
    }
}

impl SseSessions {
    /// Registers the stream that announced `endpoint` (a path, or an absolute URL) for
    /// `server`; `None` when full.
    pub(crate) fn register(
        self: &Arc<Self>,
        server: Arc<str>,
        endpoint: &str,
        tx: mpsc::Sender<String>,
    ) -> Option<Registered> {
        let key = (server, path_and_query(endpoint)?);
        let mut open = self.open.lock().ok()?;
        if open.len() >= MAX_SESSIONS && !open.contains_key(&key) {
            return None;
        }
        open.insert(key.clone(), tx);
        Some(Registered {
            sessions: self.clone(),
            key,
        })
    }

    /// Sends each JSON-RPC message (serialized) to the stream whose endpoint is
    /// `path_and_query` on `server`; false when there is none (or its queue is full).
    pub(crate) fn inject(&self, server: &str, path_and_query: &str, messages: &[String]) -> bool {
        let tx = match self.open.lock() {
            Ok(open) => open
                .get(&(Arc::from(server), path_and_query.to_string()))
                .cloned(),
            Err(_) => None,
        };
        let Some(tx) = tx else { return false };
        messages.iter().all(|m| tx.try_send(m.clone()).is_ok())
    }

    pub(crate) fn channel() -> (mpsc::Sender<String>, mpsc::Receiver<String>) {
        mpsc::channel(QUEUE)
    }
}

/// The path and query of an endpoint as announced (relative, or an absolute URL).
fn path_and_query(endpoint: &str) -> Option<String> {
    let uri: http::Uri = endpoint.trim().parse().ok()?;
    uri.path_and_query().map(|p| p.as_str().to_string())
}
