//! Hot reload: watch the policy directory and reload shortly after it stops changing.
//! Watching the directory (not the files) catches every way editors save: write in place,
//! truncate-then-write, and write-temp-then-rename.
//!
//! The directory itself may go too: deleted and recreated, rename-swapped (`mv new
//! policies`), replaced by a checkout. A watch stays on the inode it was set on, so it would
//! then miss every later edit. The parent directory is therefore watched as well, and whenever
//! the policy directory's identity (device and inode) changes, or it comes back, the watch is
//! moved to it and the policy reloaded; a check every [`RECHECK`] catches what events miss
//! (a parent replaced too). The watcher's health is in `ctl status` and the metrics.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use notify::{RecursiveMode, Watcher};
use serde::Serialize;
use tokio::sync::mpsc;

use crate::proxy::Proxy;

/// Quiet period before a reload: one save is often several file events.
const SETTLE: Duration = Duration::from_millis(50);

/// How often the directory's identity is checked without an event.
const RECHECK: Duration = Duration::from_secs(2);

/// What `ctl status` shows of the watcher.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct WatchStatus {
    /// Edits to the policy directory are being seen.
    pub active: bool,
    /// Times the watch was moved to a new directory at the same path.
    pub rearmed: u64,
    /// Why it is not active, or the last error it reported.
    pub error: Option<String>,
}

/// The watcher's health, shared with the admin API.
#[derive(Debug, Default)]
pub(crate) struct WatchHealth {
    state: Mutex<Option<String>>,
    active: std::sync::atomic::AtomicBool,
    rearmed: AtomicU64,
}

impl WatchHealth {
    pub(crate) fn status(&self) -> WatchStatus {
        WatchStatus {
            active: self.active.load(Ordering::Relaxed),
            rearmed: self.rearmed.load(Ordering::Relaxed),
            error: self.state.lock().ok().and_then(|e| e.clone()),
        }
    }

    fn set(&self, proxy: &Proxy, active: bool, error: Option<String>) {
        self.active.store(active, Ordering::Relaxed);
        if let Ok(mut e) = self.state.lock() {
            *e = error;
        }
        proxy.metrics.policy_watch_active.set(i64::from(active));
    }
}

/// Which directory a path names now (device, inode); `None` if it names none.
type Identity = Option<(u64, u64)>;

/// What is being watched: the policy directory and its parent.
type Armed = (Identity, Identity);

fn identity(path: &Path) -> Identity {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path)
        .ok()
        .filter(|m| m.is_dir())
        .map(|m| (m.dev(), m.ino()))
}

/// Starts watching in a task of its own, which owns the watcher for the daemon's life.
/// `Err`: no watcher could be made at all (then SIGHUP and `ctl reload` still work).
pub(crate) fn watch_policies(proxy: Arc<Proxy>) -> notify::Result<()> {
    let dir = proxy.policies.dir().to_path_buf();
    let parent = dir
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .map_or_else(|| PathBuf::from("."), Path::to_path_buf);
    let (tx, mut rx) = mpsc::unbounded_channel::<Result<bool, String>>();
    let inside = dir.clone();
    let mut watcher =
        notify::recommended_watcher(move |ev: notify::Result<notify::Event>| match ev {
            Ok(ev) if ev.kind.is_access() => {}
            // Only what happens in (or to) the policy directory: the parent holds other
            // files, which may change all the time (an audit log beside it, say), and must
            // not keep a reload waiting for quiet.
            Ok(ev) if ev.paths.iter().any(|p| p.starts_with(&inside)) => {
                let _ = tx.send(Ok(true));
            }
            Ok(_) => {}
            Err(e) => {
                let _ = tx.send(Err(e.to_string()));
            }
        })?;
    let health = proxy.policies.watch.clone();
    let mut armed = arm(&mut watcher, &dir, &parent, &health, &proxy);
    tokio::spawn(async move {
        loop {
            let mut changed = false;
            match tokio::time::timeout(RECHECK, rx.recv()).await {
                Ok(None) => return,
                Ok(Some(first)) => {
                    let mut note = |ev: Result<bool, String>| match ev {
                        Ok(ours) => changed |= ours,
                        // An overflowed queue, say: events were lost, so look again.
                        Err(e) => {
                            tracing::warn!("policy watcher: {e}; looking again");
                            changed = true;
                        }
                    };
                    note(first);
                    // Coalesce the burst of events one save (or one `mv`) produces.
                    loop {
                        match tokio::time::timeout(SETTLE, rx.recv()).await {
                            Ok(Some(ev)) => note(ev),
                            Ok(None) => return,
                            Err(_) => break,
                        }
                    }
                }
                Err(_) => {} // RECHECK elapsed
            }
            let now = (identity(&dir), identity(&parent));
            if now != armed {
                // The directory (or its parent) is another one now, or gone, or back.
                let _ = watcher.unwatch(&dir);
                let _ = watcher.unwatch(&parent);
                armed = arm(&mut watcher, &dir, &parent, &health, &proxy);
                health.rearmed.fetch_add(1, Ordering::Relaxed);
                proxy.metrics.policy_watch_rearms.inc();
                tracing::info!(dir = %dir.display(), "policy directory replaced: watching the new one");
                let _ = proxy.reload("policy directory replaced");
            } else if changed {
                // Outcome already logged and counted by `reload`.
                let _ = proxy.reload("file change");
            }
        }
    });
    Ok(())
}

/// Watches the policy directory (recursively, for `custom/`) and its parent; records how
/// that went. Returns what was watched.
fn arm(
    watcher: &mut notify::RecommendedWatcher,
    dir: &Path,
    parent: &Path,
    health: &WatchHealth,
    proxy: &Proxy,
) -> Armed {
    let parent_watch = watcher.watch(parent, RecursiveMode::NonRecursive);
    let dir_watch = watcher.watch(dir, RecursiveMode::Recursive);
    match (dir_watch, parent_watch) {
        (Ok(()), Ok(())) => health.set(proxy, true, None),
        (Err(e), _) => {
            let why = format!("cannot watch {}: {e}", dir.display());
            tracing::warn!("{why}; looking again every {RECHECK:?}");
            health.set(proxy, false, Some(why));
        }
        (Ok(()), Err(e)) => {
            // Edits are seen; a replaced directory is found by the periodic check.
            let why = format!("cannot watch {}: {e}", parent.display());
            tracing::warn!("{why}; a replaced policy directory is found within {RECHECK:?}");
            health.set(proxy, true, Some(why));
        }
    }
    (identity(dir), identity(parent))
}
