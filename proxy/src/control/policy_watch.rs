//! Hot reload: watch the policy directory and reload shortly after it stops changing.
//! Watching the directory (not the files) catches every way editors save: write in place,
//! truncate-then-write, and write-temp-then-rename.

use std::sync::Arc;
use std::time::Duration;

use notify::{RecursiveMode, Watcher};
use tokio::sync::mpsc;

use crate::proxy::Proxy;

/// Quiet period before a reload: one save is often several file events.
const SETTLE: Duration = Duration::from_millis(50);

/// Starts watching; the returned watcher must be kept alive for as long as reloads should
/// happen.
pub(crate) fn watch_policies(proxy: Arc<Proxy>) -> notify::Result<notify::RecommendedWatcher> {
    let (tx, mut rx) = mpsc::unbounded_channel::<()>();
    let mut watcher =
        notify::recommended_watcher(move |ev: notify::Result<notify::Event>| match ev {
            Ok(ev) if ev.kind.is_access() => {}
            Ok(_) => {
                let _ = tx.send(());
            }
            Err(e) => tracing::warn!("policy watcher: {e}"),
        })?;
    // Recursive so `custom/` is covered too.
    watcher.watch(proxy.policies.dir(), RecursiveMode::Recursive)?;
    tokio::spawn(async move {
        while rx.recv().await.is_some() {
            // Coalesce the burst of events one save produces.
            loop {
                match tokio::time::timeout(SETTLE, rx.recv()).await {
                    Ok(Some(())) => continue,
                    Ok(None) => return,
                    Err(_) => break,
                }
            }
            // Outcome already logged and counted by `reload`.
            let _ = proxy.reload("file change");
        }
    });
    Ok(watcher)
}
