//! Whether the audit log can take records now: its last write did not fail, its file
//! system has room for at least [`RESERVE`] bytes more (an eighth of a file system smaller
//! than 8 MiB, so a small one can be seen to have room again), and its rotation is not held
//! back by the minimum retention (`retention.rs`). While it cannot, the pipeline refuses
//! new requests and tunnels (`503 audit_unavailable`) before anything reaches an upstream, so
//! no side effect happens unrecorded; the refusals' own records are still attempted, and the
//! first that is written (or the room coming back) ends the refusals.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use prometheus::IntGauge;

/// Free space the log's file system must keep: a few thousand records, so that a write
/// about to fail is seen before it fails (the ticker looks every 100 ms).
pub(crate) const RESERVE: u64 = 1 << 20;

/// Why the audit log cannot take records now (for `ctl status` and the refusal's message).
#[derive(Debug, Clone, thiserror::Error)]
pub(crate) enum NotReady {
    #[error("the last write to the audit log failed: {0}")]
    WriteFailed(Arc<std::io::Error>),
    #[error(
        "the audit log's file system ({}) has {} KiB free, under the {} KiB it must keep",
        dir.display(),
        free / 1024,
        reserve / 1024
    )]
    LowSpace {
        dir: PathBuf,
        free: u64,
        reserve: u64,
    },
    #[error(
        "the audit log is full ({size} bytes) and rotating it would delete {}, which holds \
         records younger than audit.retention ({}); archive that file elsewhere, or wait until {}",
        file.display(),
        humantime::format_duration(*retention),
        humantime::format_rfc3339_seconds(*until)
    )]
    RetentionHeld {
        size: u64,
        file: PathBuf,
        retention: Duration,
        until: SystemTime,
    },
    /// Not ready, and the reason was lost (a poisoned lock).
    #[error("the audit log cannot be written")]
    Unknown,
}

pub(crate) struct Health {
    /// The directory the log lives in (where free space is measured).
    dir: PathBuf,
    write_failed: AtomicBool,
    low_space: AtomicBool,
    /// Rotating would delete records younger than `audit.retention`.
    retention_held: AtomicBool,
    /// Why, for `ctl status` and the refusal's message.
    why: Mutex<Option<NotReady>>,
    /// `agenshield_proxy_audit_ready`.
    gauge: IntGauge,
    /// `agenshield_proxy_audit_retention_blocked`: the alarm.
    retention_gauge: IntGauge,
}

impl Health {
    pub(crate) fn new(log: &Path, gauge: IntGauge, retention_gauge: IntGauge) -> Health {
        gauge.set(1);
        retention_gauge.set(0);
        Health {
            dir: log
                .parent()
                .filter(|d| !d.as_os_str().is_empty())
                .unwrap_or(Path::new("."))
                .to_path_buf(),
            write_failed: AtomicBool::new(false),
            low_space: AtomicBool::new(false),
            retention_held: AtomicBool::new(false),
            why: Mutex::new(None),
            gauge,
            retention_gauge,
        }
    }

    /// `Err(why)` while the log cannot take records.
    pub(crate) fn ready(&self) -> Result<(), NotReady> {
        if !self.write_failed.load(Ordering::Relaxed)
            && !self.low_space.load(Ordering::Relaxed)
            && !self.retention_held.load(Ordering::Relaxed)
        {
            return Ok(());
        }
        Err(self
            .why
            .lock()
            .map(|w| w.clone())
            .unwrap_or_default()
            .unwrap_or(NotReady::Unknown))
    }

    /// A batch was written (`Ok`) or failed.
    pub(crate) fn wrote(&self, outcome: Result<(), &std::io::Error>) {
        let failed = outcome.is_err();
        if self.write_failed.swap(failed, Ordering::Relaxed) != failed {
            match outcome {
                Err(e) => {
                    let e = std::io::Error::new(e.kind(), e.to_string());
                    self.turned_bad(NotReady::WriteFailed(Arc::new(e)));
                }
                Ok(()) => self.turned_good("the audit log is written again"),
            }
        }
    }

    /// Rotation is held back by the retention (`Some(why)`), or no longer (`None`).
    pub(crate) fn retention(&self, held: Option<NotReady>) {
        let now = held.is_some();
        if self.retention_held.swap(now, Ordering::Relaxed) != now {
            self.retention_gauge.set(i64::from(now));
            match held {
                Some(why) => self.turned_bad(why),
                None => self.turned_good("the audit log rotates again (its oldest file may go)"),
            }
        }
    }

    pub(crate) fn retention_blocked(&self) -> bool {
        self.retention_held.load(Ordering::Relaxed)
    }

    /// Measures the free space where the log lives (the ticker calls this).
    pub(crate) fn check_space(&self) {
        let (free, size) = match nix::sys::statvfs::statvfs(&self.dir) {
            Ok(st) => space(&st),
            // Not measurable: the writes themselves will tell.
            Err(_) => return,
        };
        let reserve = RESERVE.min(size / 8);
        let low = free < reserve;
        if self.low_space.swap(low, Ordering::Relaxed) != low {
            if low {
                self.turned_bad(NotReady::LowSpace {
                    dir: self.dir.clone(),
                    free,
                    reserve,
                });
            } else {
                self.turned_good("the audit log's file system has room again");
            }
        }
    }

    fn turned_good(&self, news: &str) {
        tracing::info!("{news}");
        self.gauge.set(i64::from(self.ready().is_ok()));
    }

    fn turned_bad(&self, why: NotReady) {
        tracing::error!("{why}: refusing requests until it can record them");
        if let Ok(mut w) = self.why.lock() {
            *w = Some(why);
        }
        self.gauge.set(i64::from(self.ready().is_ok()));
    }
}

/// Bytes an unprivileged writer may still use, and the file system's size.
// The field types are narrower on macOS.
#[allow(clippy::useless_conversion)]
fn space(st: &nix::sys::statvfs::Statvfs) -> (u64, u64) {
    let unit = u64::from(st.fragment_size());
    (
        u64::from(st.blocks_available()).saturating_mul(unit),
        u64::from(st.blocks()).saturating_mul(unit),
    )
}
