//! One sink's task: read the next lines of the log after its cursor, frame them, write them
//! to the receiver, move the cursor. A record counts as shipped once its bytes were written
//! and flushed to a connection that looked alive just before; then, and only then, the
//! cursor moves past it. A failed connect or write drops the connection, and the same lines
//! go again (from the file) on the next one, after a backoff.
//!
//! Memory is bounded by one batch (`BATCH_BYTES` of lines and their frames): records that
//! cannot be shipped wait in the log, not here.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use tokio::sync::watch;

use super::cursor::{self, Cursor};
use super::metrics::ExportMetrics;
use super::ocsf;
use super::reader::{Line, LogReader};
use super::status::SinkStatus;
use super::syslog::Framer;
use super::transport::{Conn, Connector, Failure};
use crate::config::ExportFormat;

/// Lines read and sent at once, at most (about).
const BATCH_BYTES: usize = 256 * 1024;
/// How often a sink with nothing to ship looks at the log again.
const POLL: Duration = Duration::from_millis(50);
/// After shipping a batch that was not full, how long the sink lets records gather before it
/// reads again. Under load this turns thousands of small rounds a second (each a read on the
/// blocking pool, a liveness look and a write) into a few dozen full ones; a record waits at
/// most this much longer to ship.
const LINGER: Duration = Duration::from_millis(20);
/// The cursor file is rewritten at most this often while records ship...
const SAVE_EVERY: Duration = Duration::from_millis(200);
/// ...and fsynced at most this often (and at stop).
const SYNC_EVERY: Duration = Duration::from_secs(1);
const BACKOFF_FIRST: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(30);

/// The seq of the newest record in the log (the writer's head), for the pending gauge.
pub(crate) type HeadSeq = Arc<dyn Fn() -> Option<u64> + Send + Sync>;

pub(crate) struct Sink {
    pub status: Arc<SinkStatus>,
    pub name: String,
    pub format: ExportFormat,
    pub host_id: String,
    pub connector: Connector,
    pub reader: LogReader,
    pub cursor_path: PathBuf,
    pub shipped: Arc<AtomicU64>,
    pub metrics: ExportMetrics,
    pub head: HeadSeq,
}

/// What the loop keeps between rounds.
struct State {
    conn: Option<Conn>,
    backoff: Duration,
    /// Since when the receiver could not be reached (logged once per outage).
    down_since: Option<Instant>,
    saved: Cursor,
    last_save: Instant,
    last_sync: Instant,
    /// When the oldest record waiting to be shipped was written.
    waiting_since: Option<SystemTime>,
    /// No connect before this (the backoff after a failure).
    retry_at: Instant,
}

impl State {
    /// No connect for a while after a failure: 0.1 s doubling to 30 s (reset by a shipped
    /// batch, so a receiver that accepts and then drops every connection is not hammered).
    fn back_off(&mut self) {
        self.retry_at = Instant::now() + jitter(self.backoff);
        self.backoff = (self.backoff * 2).min(BACKOFF_MAX);
    }
}

impl Sink {
    /// Ships until `stop` turns true and then until caught up or `deadline` (sent with it).
    pub(crate) async fn run(mut self, mut stop: watch::Receiver<Option<Instant>>) {
        let mut st = State {
            conn: None,
            backoff: BACKOFF_FIRST,
            down_since: None,
            saved: self.reader.cursor(),
            last_save: Instant::now(),
            last_sync: Instant::now(),
            waiting_since: None,
            retry_at: Instant::now(),
        };
        let mut gauges_at = Instant::now();
        let mut framer = Framer::new(&self.host_id, std::process::id());
        loop {
            let deadline = *stop.borrow();
            if deadline.is_some_and(|d| Instant::now() >= d) {
                break;
            }
            if gauges_at.elapsed() >= Duration::from_secs(1) {
                self.update_gauges(&st);
                gauges_at = Instant::now();
            }
            let lines = match self.read().await {
                Some(Ok(lines)) => lines,
                Some(Err(e)) => {
                    self.failed(Failure::Read, &mut st);
                    tracing::error!(sink = %self.name, "audit export: reading the log: {e}");
                    self.pause(&mut stop, Duration::from_secs(1)).await;
                    continue;
                }
                None => return,
            };
            if lines.is_empty() {
                st.waiting_since = None;
                self.save(&mut st, false).await;
                if deadline.is_some() {
                    break;
                }
                self.pause(&mut stop, POLL).await;
                continue;
            }
            st.waiting_since = st
                .waiting_since
                .or_else(|| lines[0].time().and_then(parse_time));
            if st.conn.is_none() && Instant::now() < st.retry_at {
                // Backing off; the gauges still move once a second meanwhile.
                let wait = st.retry_at.saturating_duration_since(Instant::now());
                self.pause(&mut stop, wait.min(Duration::from_secs(1)))
                    .await;
                continue;
            }
            if !self.connected(&mut st).await {
                st.back_off();
                continue;
            }
            let bytes = self.framed(&mut framer, &lines);
            let Some(conn) = st.conn.as_mut() else {
                continue;
            };
            let full = lines.iter().map(|l| l.bytes.len() + 1).sum::<usize>() >= BATCH_BYTES / 2;
            match conn.send(&bytes).await {
                Ok(()) => {
                    st.backoff = BACKOFF_FIRST;
                    self.reader.commit(&lines);
                    self.shipped.store(self.reader.seq(), Ordering::Release);
                    self.metrics
                        .shipped
                        .with_label_values(&[&self.name])
                        .inc_by(lines.len() as u64);
                    st.waiting_since = None;
                    if st.last_save.elapsed() >= SAVE_EVERY {
                        let sync = st.last_sync.elapsed() >= SYNC_EVERY;
                        self.save(&mut st, sync).await;
                    }
                    if !full && deadline.is_none() {
                        self.pause(&mut stop, LINGER).await;
                    }
                }
                Err(f) => {
                    st.conn = None;
                    self.failed(f, &mut st);
                    st.back_off();
                }
            }
        }
        self.save(&mut st, true).await;
        self.update_gauges(&st);
        if let Some(conn) = st.conn.take() {
            conn.close().await;
        }
        let left = (self.head)().map_or(0, |h| h.saturating_sub(self.reader.seq()));
        tracing::info!(sink = %self.name, seq = self.reader.seq(), left, "audit export stopped");
    }

    /// The next batch, read on the blocking pool; `None` if that pool is gone.
    async fn read(&mut self) -> Option<std::io::Result<Vec<Line>>> {
        let placeholder = LogReader::detached();
        let mut reader = std::mem::replace(&mut self.reader, placeholder);
        let (reader, lines) = tokio::task::spawn_blocking(move || {
            let lines = reader.next_batch(BATCH_BYTES);
            (reader, lines)
        })
        .await
        .ok()?;
        self.reader = reader;
        Some(lines)
    }

    /// A connection that looks alive, (re)connecting if need be.
    async fn connected(&mut self, st: &mut State) -> bool {
        if let Some(c) = st.conn.as_mut() {
            if c.looks_alive() {
                return true;
            }
            st.conn = None;
            self.failed(Failure::Closed, st);
        }
        match self.connector.connect().await {
            Ok(c) => {
                st.conn = Some(c);
                self.status.connected();
                if let Some(since) = st.down_since.take() {
                    tracing::info!(sink = %self.name, after = ?since.elapsed(), from_seq = self.reader.seq() + 1, "audit export: receiver back; shipping what waited");
                }
                true
            }
            Err(f) => {
                self.failed(f, st);
                false
            }
        }
    }

    fn failed(&self, f: Failure, st: &mut State) {
        self.status.failed(f.as_str());
        self.metrics
            .failures
            .with_label_values(&[&self.name, f.as_str()])
            .inc();
        if st.down_since.is_none() && f != Failure::Read {
            st.down_since = Some(Instant::now());
            tracing::warn!(sink = %self.name, reason = f.as_str(), "audit export: receiver unreachable; records wait in the log and ship when it is back");
        }
    }

    fn framed(&self, framer: &mut Framer, lines: &[Line]) -> Vec<u8> {
        let mut out = Vec::with_capacity(BATCH_BYTES + lines.len() * 128);
        for l in lines {
            match self.format {
                ExportFormat::Agenshield => {
                    framer.frame(&mut out, l.time(), l.kind(), l.seq, &l.bytes);
                }
                ExportFormat::Ocsf => {
                    let event = ocsf::event(&l.bytes, &self.host_id);
                    framer.frame(
                        &mut out,
                        l.time(),
                        l.kind(),
                        l.seq,
                        &serde_json::to_vec(&event).unwrap_or_default(),
                    );
                }
            }
        }
        out
    }

    /// Writes the cursor if it moved (`sync`: and fsyncs it).
    async fn save(&self, st: &mut State, sync: bool) {
        let c = self.reader.cursor();
        if c == st.saved && !sync {
            return;
        }
        let path = self.cursor_path.clone();
        let saving = c.clone();
        let saved = tokio::task::spawn_blocking(move || cursor::save(&path, &saving, sync)).await;
        match saved {
            Ok(Ok(())) => {
                st.saved = c;
                st.last_save = Instant::now();
                if sync {
                    st.last_sync = Instant::now();
                }
            }
            Ok(Err(e)) => tracing::error!(sink = %self.name, "audit export: {e}"),
            Err(e) => tracing::error!(sink = %self.name, "audit export: saving the cursor: {e}"),
        }
    }

    fn update_gauges(&self, st: &State) {
        let pending = (self.head)().map_or(0, |h| h.saturating_sub(self.reader.seq()));
        self.metrics
            .pending
            .with_label_values(&[&self.name])
            .set(i64::try_from(pending).unwrap_or(i64::MAX));
        let lag = st
            .waiting_since
            .and_then(|t| SystemTime::now().duration_since(t).ok())
            .map_or(0.0, |d| d.as_secs_f64());
        self.metrics.lag.with_label_values(&[&self.name]).set(lag);
    }

    /// Sleeps `d`, or less if a stop is asked for.
    async fn pause(&self, stop: &mut watch::Receiver<Option<Instant>>, d: Duration) {
        let deadline = *stop.borrow();
        let d = deadline.map_or(d, |end| {
            d.min(end.saturating_duration_since(Instant::now()))
        });
        tokio::select! {
            () = tokio::time::sleep(d) => {}
            changed = stop.changed() => {
                // The sender gone (no one will ask for a stop): sleep as asked, never spin.
                if changed.is_err() {
                    tokio::time::sleep(d).await;
                }
            }
        }
    }
}

fn parse_time(t: &str) -> Option<SystemTime> {
    time::OffsetDateTime::parse(t, &time::format_description::well_known::Rfc3339)
        .ok()
        .map(SystemTime::from)
}

/// `d` give or take a fifth, so sinks of many hosts do not reconnect in step.
fn jitter(d: Duration) -> Duration {
    let f: f64 = rand::random_range(0.8..1.2);
    d.mul_f64(f)
}
