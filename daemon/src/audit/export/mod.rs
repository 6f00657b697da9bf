//! Shipping the audit log (`[[audit.export]]`): one task per sink reads the log *from the
//! file* after its persisted cursor (`cursor.rs`, `reader.rs`), and writes each record as an
//! RFC 5424 message to a syslog receiver over TCP or TLS (`syslog.rs`, `transport.rs`), as
//! the local line byte for byte or in its OCSF form (`ocsf.rs`). The local hash-chained file
//! stays the record of truth: nothing is queued in memory for a sink, so an outage or a
//! restart only makes a sink resume later, from its cursor; rotation waits for what a sink
//! has not shipped, up to its `max_hold` (`rotation::ExportHold`), and counts what it could
//! not keep.
//!
//! What is promised (docs/audit.md, *Shipping*): in order, none skipped; after a clean stop
//! or a restart, none twice; after a crash (SIGKILL, power loss), the records shipped since
//! the cursor was last written (≤ 200 ms of them; ≤ 1 s after a power loss) are sent again.

mod cursor;
mod metrics;
pub(crate) mod ocsf;
mod reader;
mod sink;
mod status;
mod syslog;
mod transport;

use std::path::Path;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;
use tokio::task::JoinHandle;

pub(crate) use metrics::ExportMetrics;
use reader::{LogReader, Resumed};
use sink::{HeadSeq, Sink};
pub(crate) use status::ExportStatus;
use status::SinkStatus;
use transport::{Connector, TlsSetupError};

use super::rotation::{ExportHold, HeldFor};
use crate::config::AuditExport;

/// The sinks' tasks.
pub(crate) struct Exports {
    stop: watch::Sender<Option<Instant>>,
    tasks: Vec<JoinHandle<()>>,
    statuses: Vec<Arc<SinkStatus>>,
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum ExportError {
    #[error(transparent)]
    Cursor(#[from] cursor::CursorError),
    #[error(transparent)]
    Tls(#[from] TlsSetupError),
    #[error("audit.export {sink}: reading the audit log {path}: {source}")]
    Log {
        sink: String,
        path: String,
        #[source]
        source: std::io::Error,
    },
}

/// Starts one task per sink of `exports`, each from its cursor. Returns the tasks and what
/// rotation must ask them.
pub(crate) fn start(
    exports: &[AuditExport],
    log: &Path,
    keep: u32,
    metrics: &ExportMetrics,
    head: HeadSeq,
) -> Result<(Exports, ExportHold), ExportError> {
    let (stop, stopped) = watch::channel(None);
    let mut sinks = Vec::new();
    let mut held = Vec::new();
    for (i, e) in exports.iter().enumerate() {
        let name = e.sink_name(i);
        metrics.touch(&name);
        let connector = Connector::new(e, &name)?;
        let cursor_path = e
            .cursor
            .clone()
            .unwrap_or_else(|| cursor::default_path(log, &name));
        let saved = cursor::load(&cursor_path)?;
        let (reader, resumed) =
            LogReader::open(log, keep, saved.as_ref()).map_err(|source| ExportError::Log {
                sink: name.clone(),
                path: log.display().to_string(),
                source,
            })?;
        match resumed {
            Resumed::Fresh => {
                tracing::info!(sink = %name, url = %e.url, "audit export: a new sink; shipping from the oldest record kept")
            }
            Resumed::AtCursor => {
                tracing::info!(sink = %name, url = %e.url, after_seq = reader.seq(), "audit export: resuming after its cursor")
            }
            Resumed::FromOldest { lost } => {
                metrics.dropped.with_label_values(&[&name]).inc_by(lost);
                tracing::warn!(sink = %name, url = %e.url, lost, "audit export: the cursor's record is no longer in the log; shipping from the oldest record kept")
            }
        }
        let shipped = Arc::new(AtomicU64::new(reader.seq()));
        held.push(HeldFor {
            name: name.clone(),
            shipped: shipped.clone(),
            max_hold: e.max_hold,
            dropped: metrics.dropped.with_label_values(&[&name]),
        });
        let status = Arc::new(SinkStatus::new(
            name.clone(),
            e.url.to_string(),
            e.format.as_str(),
            shipped.clone(),
            head.clone(),
        ));
        sinks.push(Sink {
            status,
            name,
            format: e.format,
            host_id: e.host_id.clone().unwrap_or_else(syslog::default_host_id),
            connector,
            reader,
            cursor_path,
            shipped,
            metrics: metrics.clone(),
            head: head.clone(),
        });
    }
    let statuses = sinks.iter().map(|s| s.status.clone()).collect();
    let tasks = sinks
        .into_iter()
        .map(|s| tokio::spawn(s.run(stopped.clone())))
        .collect();
    Ok((
        Exports {
            stop,
            tasks,
            statuses,
        },
        ExportHold::new(held),
    ))
}

impl Exports {
    /// Each sink's state, as `ctl status` shows it.
    pub(crate) fn status(&self) -> Vec<ExportStatus> {
        self.statuses.iter().map(|s| s.view()).collect()
    }

    /// Lets every sink ship what the log holds, for up to `within`, then stops them (their
    /// cursors saved and fsynced).
    pub(crate) async fn finish(self, within: Duration) {
        let _ = self.stop.send(Some(Instant::now() + within));
        let all = futures_util::future::join_all(self.tasks);
        if tokio::time::timeout(within + Duration::from_secs(2), all)
            .await
            .is_err()
        {
            tracing::warn!("audit export: a sink did not stop in time");
        }
    }
}
