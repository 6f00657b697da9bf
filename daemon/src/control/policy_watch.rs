//! Hot reload: watch the policy directory and reload shortly after it stops changing.
//! Watching the directory (not the files) catches every way editors save: write in place,
//! truncate-then-write, and write-temp-then-rename.
//!
//! The directory itself may go too: deleted and recreated, rename-swapped (`mv new
//! policies`), replaced by a checkout. A watch stays on the inode it was set on, so it would
//! then miss every later edit. The parent directory is therefore watched as well, and whenever
//! the policy directory's identity (device and inode) changes, or it comes back, the watch is
//! moved to it and the policy reloaded.
//!
//! Events are not trusted blindly: the watcher proves they arrive with a probe
//! (`watch_health.rs`), and every [`RECHECK`] it also compares the directory's listing (names,
//! sizes, times) with the last one it reloaded, so an edit no event reported (a deaf watch, a
//! network filesystem changed from elsewhere) is applied all the same.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use notify::{RecursiveMode, Watcher, WatcherKind};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use super::reload::reload;
use super::watch_health::{Liveness, Probe, PROBE_WAIT};
use crate::audit::ReloadTrigger;
use crate::policy::WatchHealth;
use crate::proxy::Proxy;

/// Quiet period before a reload: one save is often several file events.
const SETTLE: Duration = Duration::from_millis(50);

/// How often the directory's identity and listing are compared without an event.
const RECHECK: Duration = Duration::from_secs(2);

/// Entries the listing comparison reads at most (a policy directory holds a few files).
const MAX_LISTED: usize = 4096;

/// What the watcher's callback saw.
enum Seen {
    /// Something inside the directory was opened (our own probe, or a reload reading it).
    Read,
    /// Something inside the directory changed, or events were lost and it must be re-read.
    Changed,
    Error(String),
}

/// Starts watching in a task of its own, which owns the watcher for the daemon's life, and
/// returns once the first probe was heard or went unheard (at most [`PROBE_WAIT`] and a
/// little), so `ctl status` is true from the first moment. `Err`: no watcher could be made at
/// all; the directory is still compared every [`RECHECK`], and SIGHUP and `ctl reload` work.
pub(crate) async fn watch_policies(proxy: Arc<Proxy>) -> notify::Result<()> {
    let dir = proxy.policies.dir().to_path_buf();
    let parent = dir
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .map_or_else(|| PathBuf::from("/"), Path::to_path_buf);
    let health = proxy.policies.watch.clone();
    health.set_poll(RECHECK);
    let (tx, rx) = mpsc::unbounded_channel::<Seen>();
    // The path as configured (absolute) and as the OS may report it (symlinks resolved).
    let inside = [
        dir.clone(),
        std::fs::canonicalize(&dir).unwrap_or(dir.clone()),
    ];
    let watcher = notify::recommended_watcher(move |ev: notify::Result<notify::Event>| {
        let seen = match ev {
            // A queue overflow: events were lost, so look again.
            Ok(ev) if ev.need_rescan() => Seen::Changed,
            // Only what happens in (or to) the policy directory: the parent holds other
            // files, which may change all the time (an audit log beside it, say), and must
            // not keep a reload waiting for quiet.
            Ok(ev)
                if !ev
                    .paths
                    .iter()
                    .any(|p| inside.iter().any(|d| p.starts_with(d))) =>
            {
                return
            }
            Ok(ev) if ev.kind.is_access() => Seen::Read,
            Ok(_) => Seen::Changed,
            Err(e) => Seen::Error(e.to_string()),
        };
        let _ = tx.send(seen);
    });
    let watcher = match watcher {
        Ok(w) => Some(w),
        Err(e) => {
            let why = format!("no watcher: {e}");
            tracing::error!(
                "policy hot reload: {why}; comparing {} every {RECHECK:?} instead",
                dir.display()
            );
            health.set(&proxy.metrics.policy.watch_active, false, false, Some(why));
            None
        }
    };
    let (first_tx, first_rx) = oneshot::channel();
    let made = watcher.is_some();
    tokio::spawn(watch(proxy, watcher, dir, parent, rx, first_tx));
    if made {
        let _ = tokio::time::timeout(PROBE_WAIT + RECHECK, first_rx).await;
        Ok(())
    } else {
        Err(notify::Error::generic("no watcher"))
    }
}

/// The watch loop: events, probes, the periodic comparison, and re-arming.
async fn watch(
    proxy: Arc<Proxy>,
    mut watcher: Option<notify::RecommendedWatcher>,
    dir: PathBuf,
    parent: PathBuf,
    mut rx: mpsc::UnboundedReceiver<Seen>,
    first: oneshot::Sender<()>,
) {
    let health = proxy.policies.watch.clone();
    // Only inotify reports reads; elsewhere (FSEvents) a set watch is all that is known.
    let probes = notify::RecommendedWatcher::kind() == WatcherKind::Inotify;
    let mut first = Some(first);
    let mut listing = listing(&dir);
    let mut probe = Probe::new(Instant::now());
    let mut armed = match watcher.as_mut() {
        Some(w) => arm(w, &dir, &parent, &health, &proxy, probes, &mut probe),
        None => (identity(&dir), identity(&parent)),
    };
    // Nothing to wait for: no probes here, or no watch could be set.
    if !probes || !probe.due(Instant::now()) {
        if let Some(f) = first.take() {
            let _ = f.send(());
        }
    }
    loop {
        let now = Instant::now();
        if probes && watcher.is_some() && probe.due(now) {
            // Opening the directory is an event for its watch, like any edit.
            let _ = std::fs::read_dir(&dir);
            probe.sent(now);
        }
        let wait = probe.wait_left(now).map_or(RECHECK, |w| w.min(RECHECK));
        let mut seen = Burst::default();
        match tokio::time::timeout(wait, rx.recv()).await {
            Ok(None) => {
                // No watcher (it could not be made): compare on a timer alone.
                tokio::time::sleep(wait).await;
            }
            Ok(Some(event)) => {
                seen.note(event);
                while let Ok(more) = rx.try_recv() {
                    seen.note(more);
                }
                // Coalesce the burst of events one save (or one `mv`) produces. A read (our
                // probe, our own reload) changes nothing: no reason to wait for quiet.
                if seen.changed {
                    while let Ok(Some(more)) = tokio::time::timeout(SETTLE, rx.recv()).await {
                        seen.note(more);
                    }
                }
            }
            Err(_) => {} // RECHECK elapsed, or the probe's time is up
        }
        let Burst { changed, heard } = seen;
        if probes && watcher.is_some() {
            let now = Instant::now();
            let verdict = if heard {
                probe.heard()
            } else {
                probe.expire(now)
            };
            if let Some(state) = verdict {
                report(&proxy, &health, &dir, state);
            }
            if probe.state() != Liveness::Unknown {
                if let Some(f) = first.take() {
                    let _ = f.send(());
                }
            }
        }
        let now_id = (identity(&dir), identity(&parent));
        if now_id != armed {
            // The directory (or its parent) is another one now, or gone, or back.
            if let Some(w) = watcher.as_mut() {
                let _ = w.unwatch(&dir);
                let _ = w.unwatch(&parent);
                probe.rearmed(Instant::now());
                armed = arm(w, &dir, &parent, &health, &proxy, probes, &mut probe);
            } else {
                armed = now_id;
            }
            health.rearmed.fetch_add(1, Ordering::Relaxed);
            proxy.metrics.policy.watch_rearms.inc();
            tracing::info!(dir = ?dir, "policy directory replaced: watching the new one");
            listing = self::listing(&dir);
            let _ = reload(&proxy, ReloadTrigger::DirectoryReplaced);
            continue;
        }
        if changed {
            // Taken before the reload reads the files: an edit after it is seen next time.
            listing = self::listing(&dir);
            // Outcome already logged and counted by `reload`.
            let _ = reload(&proxy, ReloadTrigger::FileChange);
        } else if !heard {
            // A quiet spell: compare, for what no event reported. (Not while events arrive:
            // a writer's open comes before its write, and the file is half written then.)
            let now_listing = self::listing(&dir);
            if now_listing != listing {
                listing = now_listing;
                tracing::info!(
                    dir = ?dir,
                    "policy change found by comparing the directory (no event reported it)"
                );
                let _ = reload(&proxy, ReloadTrigger::FileChangePolled);
            }
        }
    }
}

/// What a burst of events amounted to.
#[derive(Default)]
struct Burst {
    /// Something inside the directory changed (or events were lost): reload.
    changed: bool,
    /// An event from inside the directory arrived: the watch is heard.
    heard: bool,
}

impl Burst {
    fn note(&mut self, seen: Seen) {
        match seen {
            Seen::Read => self.heard = true,
            Seen::Changed => (self.heard, self.changed) = (true, true),
            Seen::Error(e) => {
                tracing::warn!("policy watcher: {e}; looking again");
                self.changed = true;
            }
        }
    }
}

/// Says what a probe verdict means, in the log and in the health.
fn report(proxy: &Proxy, health: &WatchHealth, dir: &Path, state: Liveness) {
    match state {
        Liveness::Heard => {
            if health.status().error.is_some() {
                tracing::info!(dir = ?dir, "policy watcher: events arrive again");
            }
            health.set(&proxy.metrics.policy.watch_active, true, true, None);
        }
        Liveness::Deaf => {
            let why = format!(
                "no event arrived within {}s of a probe (opening {}): edits are not seen as \
                 they happen; the directory is compared every {}s instead",
                PROBE_WAIT.as_secs(),
                dir.display(),
                RECHECK.as_secs()
            );
            tracing::error!("policy watcher: {why}");
            health.set(&proxy.metrics.policy.watch_active, false, false, Some(why));
        }
        Liveness::Unknown => {}
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

/// A digest of the directory's tree (names, kinds, sizes, inodes, modification and change
/// times): equal digests mean nothing a reload would read has changed.
fn listing(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let mut h = DefaultHasher::new();
    let mut todo = vec![dir.to_path_buf()];
    let mut seen = 0;
    while let Some(d) = todo.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            d.hash(&mut h);
            continue;
        };
        let mut entries: Vec<_> = entries.filter_map(Result::ok).collect();
        entries.sort_by_key(std::fs::DirEntry::file_name);
        for e in entries {
            seen += 1;
            if seen > MAX_LISTED {
                return h.finish();
            }
            let path = e.path();
            path.hash(&mut h);
            // Followed, as the loader follows links.
            if let Ok(m) = std::fs::metadata(&path) {
                (m.is_dir(), m.len(), m.ino(), m.mtime(), m.mtime_nsec()).hash(&mut h);
                (m.ctime(), m.ctime_nsec()).hash(&mut h);
                if m.is_dir() {
                    todo.push(path);
                }
            }
        }
    }
    h.finish()
}

/// Watches the policy directory (recursively, for `custom/`) and its parent; records how
/// that went. Returns what was watched. Where probes prove the watch, it is reported active
/// only once one is heard.
fn arm(
    watcher: &mut notify::RecommendedWatcher,
    dir: &Path,
    parent: &Path,
    health: &WatchHealth,
    proxy: &Proxy,
    probes: bool,
    probe: &mut Probe,
) -> Armed {
    let parent_watch = watcher.watch(parent, RecursiveMode::NonRecursive);
    let dir_watch = watcher.watch(dir, RecursiveMode::Recursive);
    let gauge = &proxy.metrics.policy.watch_active;
    match (dir_watch, parent_watch) {
        (Ok(()), Ok(())) if probes => {
            // Keeps the last verdict's until the probe answers: the status and the metric
            // say "active" only for a watch that was heard.
        }
        (Ok(()), Ok(())) => health.set(gauge, true, false, None),
        (Err(e), _) => {
            let why = format!(
                "cannot watch {}: {e}; the directory is compared every {}s instead",
                dir.display(),
                RECHECK.as_secs()
            );
            tracing::warn!("{why}");
            health.set(gauge, false, false, Some(why));
            probe.lost(Instant::now());
        }
        (Ok(()), Err(e)) => {
            // Edits are seen; a replaced directory is found by the periodic check.
            let why = format!("cannot watch {}: {e}", parent.display());
            tracing::warn!("{why}; a replaced policy directory is found within {RECHECK:?}");
            if !probes {
                health.set(gauge, true, false, Some(why));
            }
        }
    }
    (identity(dir), identity(parent))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_listing_changes_with_any_edit_and_only_then() {
        let d = tempfile::tempdir().expect("tempdir");
        let a = d.path().join("a.toml");
        std::fs::write(&a, "version = 1\n").expect("write");
        let before = listing(d.path());
        assert_eq!(before, listing(d.path()), "stable");
        std::fs::write(&a, "version = 2\n").expect("same size, new content");
        let after = listing(d.path());
        assert_ne!(before, after, "an edit in place changes the times");
        std::fs::create_dir(d.path().join("custom")).expect("mkdir");
        let with_custom = listing(d.path());
        assert_ne!(after, with_custom);
        std::fs::write(d.path().join("custom/b.json"), "{}").expect("write");
        assert_ne!(with_custom, listing(d.path()), "nested files count");
        assert_ne!(listing(&d.path().join("gone")), listing(d.path()));
    }
}
