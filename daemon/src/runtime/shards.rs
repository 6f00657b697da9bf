//! Where connections are served: one single-threaded runtime per core ("shard"), each
//! connection wholly on one of them. A request's tasks (the client connection, its streams,
//! the upstream connection it uses, the relay) then wake each other on the same thread, with
//! no cross-thread wake-ups: on a multi-threaded runtime those (futex wakes, context switches,
//! work stealing) cost about a third of the daemon's CPU per request (bench/profiles).
//!
//! The accept loops stay on the main runtime and hand each accepted socket over; the shard
//! registers it with its own reactor. Everything shared (policy, pools, audit, metrics) is
//! as before; the upstream pool keeps connections per shard ([`current`]) so a request never
//! rides another thread's connection.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;

use tokio::runtime::Handle;

/// The shards, started on first use.
static SHARDS: OnceLock<Shards> = OnceLock::new();

thread_local! {
    /// The shard this thread runs, `None` off the shards (the main runtime).
    static SHARD: std::cell::Cell<Option<usize>> = const { std::cell::Cell::new(None) };
}

/// Why a shard did not start (the daemon then serves on its main runtime).
#[derive(Debug, thiserror::Error)]
enum ShardError {
    /// No thread for it.
    #[error(transparent)]
    Thread(std::io::Error),
    /// Its thread ended before saying whether its runtime started.
    #[error(transparent)]
    Gone(std::sync::mpsc::RecvError),
    /// No runtime on its thread.
    #[error(transparent)]
    Runtime(std::io::Error),
}

struct Shards {
    handles: Vec<Handle>,
    next: AtomicUsize,
}

/// The shard the caller runs on (0 off the shards): the pool keys connections by it.
pub(crate) fn current() -> usize {
    SHARD.with(|s| s.get()).map_or(0, |i| i + 1)
}

/// How many shards: one per CPU the process may use.
fn count() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

fn shards() -> &'static Shards {
    SHARDS.get_or_init(|| {
        let handles = (0..count())
            .map(|i| {
                let (tx, rx) = std::sync::mpsc::channel();
                std::thread::Builder::new()
                    .name(format!("agenshield-conn-{i}"))
                    .spawn(move || {
                        let rt = match tokio::runtime::Builder::new_current_thread()
                            .enable_all()
                            .on_thread_park(super::memory_release::on_park)
                            .build()
                        {
                            Ok(rt) => rt,
                            Err(e) => {
                                let _ = tx.send(Err(e));
                                return;
                            }
                        };
                        SHARD.with(|s| s.set(Some(i)));
                        let _ = tx.send(Ok(rt.handle().clone()));
                        // Serves whatever is spawned onto it, for the life of the process.
                        rt.block_on(std::future::pending::<()>());
                    })
                    .map_err(ShardError::Thread)
                    .and_then(|_| {
                        rx.recv()
                            .map_err(ShardError::Gone)
                            .and_then(|r| r.map_err(ShardError::Runtime))
                    })
            })
            .collect::<Result<Vec<Handle>, ShardError>>();
        match handles {
            Ok(handles) => Shards {
                handles,
                next: AtomicUsize::new(0),
            },
            // No thread or runtime for a shard: serve on the caller's runtime instead (the
            // daemon works as before, only without the per-core split).
            Err(e) => {
                tracing::error!(
                    "starting the connection threads failed ({e}); serving on the main runtime"
                );
                Shards {
                    handles: Vec::new(),
                    next: AtomicUsize::new(0),
                }
            }
        }
    })
}

/// Starts the shards now (else they start with the first connection).
pub(crate) fn start() {
    let n = shards().handles.len();
    tracing::debug!(shards = n, "connection threads");
}

/// Wakes every shard (to run its park hook: `memory_release`).
pub(crate) fn wake_all() {
    for h in &shards().handles {
        h.spawn(async {});
    }
}

/// Serves `make()`'s future on the next shard, round robin. `make` runs on the shard, so
/// sockets it registers (`TcpStream::from_std`) belong to that shard's reactor.
pub(crate) fn spawn<M, F>(make: M)
where
    M: FnOnce() -> F + Send + 'static,
    F: Future<Output = ()> + Send + 'static,
{
    let s = shards();
    if s.handles.is_empty() {
        tokio::spawn(async move { make().await });
        return;
    }
    let i = s.next.fetch_add(1, Ordering::Relaxed) % s.handles.len();
    s.handles[i].spawn(async move { make().await });
}

/// Runs `make(slot)`'s future on every shard (slot = that shard's [`current`]) and on the
/// caller's runtime (slot 0), for state kept per shard: one of each per thread that serves.
pub(crate) fn spawn_each<M, F>(make: M)
where
    M: Fn(usize) -> F + Send + Sync + 'static,
    F: Future<Output = ()> + Send + 'static,
{
    let make = std::sync::Arc::new(make);
    for (i, h) in shards().handles.iter().enumerate() {
        let make = make.clone();
        h.spawn(async move { make(i + 1).await });
    }
    tokio::spawn(make(0));
}

/// How many slots [`spawn_each`] fills: one per shard, and the caller's runtime.
pub(crate) fn slots() -> usize {
    shards().handles.len() + 1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_spawned_connection_runs_on_a_shard_thread() {
        let (tx, rx) = tokio::sync::oneshot::channel();
        spawn(move || async move {
            let name = std::thread::current().name().map(str::to_string);
            let _ = tx.send((name, current()));
        });
        let (name, shard) = rx.await.expect("ran");
        assert!(name.unwrap_or_default().starts_with("agenshield-conn-"));
        assert!(
            shard >= 1,
            "the pool tells shards apart from the main runtime"
        );
        assert_eq!(current(), 0);
    }
}
