//! What `ctl status` shows of each sink: where it ships, the last record shipped and how many
//! wait, whether its receiver is reachable, since when not, and the last failure. The sink's
//! task writes it as things change (a connect, a failure); the admin API reads it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::sink::HeadSeq;

/// One sink's state, shared by its task and the admin API.
pub(crate) struct SinkStatus {
    name: String,
    url: String,
    format: &'static str,
    /// The seq of the last record shipped (the sink's task keeps it).
    shipped: Arc<AtomicU64>,
    head: HeadSeq,
    shown: Mutex<Shown>,
}

#[derive(Default)]
struct Shown {
    connected: bool,
    down_since: Option<String>,
    last_error: Option<LastFailure>,
}

/// A failure as `ctl status` shows it (kept after the receiver is back).
#[derive(Debug, Clone, serde::Serialize)]
pub(crate) struct LastFailure {
    pub reason: &'static str,
    pub at: String,
}

/// `/v1/status` `audit.export[]`.
#[derive(Debug, Clone, serde::Serialize)]
pub(crate) struct ExportStatus {
    pub name: String,
    pub url: String,
    pub format: &'static str,
    pub shipped_seq: u64,
    pub pending: u64,
    pub connected: bool,
    pub down_since: Option<String>,
    pub last_error: Option<LastFailure>,
}

impl SinkStatus {
    pub(crate) fn new(
        name: String,
        url: String,
        format: &'static str,
        shipped: Arc<AtomicU64>,
        head: HeadSeq,
    ) -> SinkStatus {
        SinkStatus {
            name,
            url,
            format,
            shipped,
            head,
            shown: Mutex::new(Shown::default()),
        }
    }

    /// A connection to the receiver is up.
    pub(crate) fn connected(&self) {
        let mut s = self.shown.lock().unwrap_or_else(|p| p.into_inner());
        s.connected = true;
        s.down_since = None;
    }

    /// Shipping failed for `reason` (the connection, if any, is gone).
    pub(crate) fn failed(&self, reason: &'static str) {
        let now = crate::clock::now_rfc3339();
        let mut s = self.shown.lock().unwrap_or_else(|p| p.into_inner());
        if s.connected || s.down_since.is_none() {
            s.down_since = Some(now.clone());
        }
        s.connected = false;
        s.last_error = Some(LastFailure { reason, at: now });
    }

    pub(crate) fn view(&self) -> ExportStatus {
        let shipped = self.shipped.load(Ordering::Acquire);
        let s = self.shown.lock().unwrap_or_else(|p| p.into_inner());
        ExportStatus {
            name: self.name.clone(),
            url: self.url.clone(),
            format: self.format,
            shipped_seq: shipped,
            pending: (self.head)().map_or(0, |h| h.saturating_sub(shipped)),
            connected: s.connected,
            down_since: s.down_since.clone(),
            last_error: s.last_error.clone(),
        }
    }
}
