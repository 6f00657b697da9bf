//! The connections to the shared store: one multiplexed Redis connection per connection
//! thread ("shard", `runtime::shards`), made and driven on that thread, so a check's round
//! trip wakes no other thread (crossing to the main runtime cost about 50 µs of CPU per
//! request, `bench/fleet.sh`). Each is kept up by a task on its own thread, so no check ever
//! waits for a connect.
//!
//! A check takes its thread's connection; with none (the store is down, or the task is
//! reconnecting) it fails at once, and the caller falls back. A check that sees a connection
//! break drops every thread's connection (a store that went away broke them all; one left
//! in place would fail its next check) and wakes the tasks, which reconnect with a backoff
//! (100 ms doubling to 2 s), each attempt bounded by [`CONNECT_TIMEOUT`]. The store counts as
//! back once every thread has its connection again. Why not redis' `ConnectionManager`: its
//! first connect is on the caller's path, and a check that finds it reconnecting waits for
//! that instead of falling back at once.

use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwapOption;
use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Client};
use tokio::sync::Notify;

use super::batch::Queue;
use super::metrics::StoreErrorReason;
use super::outage::Outage;
use crate::runtime::shards;

/// The longest one connect attempt (TCP, TLS, AUTH, SELECT) may take, off the request path.
pub(super) const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
const BACKOFF_MIN: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(2);

/// One thread's connection, the signal that it broke, and its checks not yet sent.
#[derive(Default)]
struct Slot {
    conn: ArcSwapOption<MultiplexedConnection>,
    broken: Notify,
    queue: Queue,
}

pub(super) struct Store {
    client: Client,
    /// Indexed by `shards::current()`: 0 for the main runtime, then one per shard.
    slots: Box<[Slot]>,
    /// What connects and failures are told to.
    outage: Arc<Outage>,
}

impl Store {
    pub(super) fn new(client: Client, outage: Arc<Outage>) -> Store {
        Store {
            client,
            slots: (0..shards::slots()).map(|_| Slot::default()).collect(),
            outage,
        }
    }

    fn slot(&self) -> &Slot {
        let i = shards::current();
        &self.slots[i.min(self.slots.len() - 1)]
    }

    /// The calling thread's connection, if it has one now.
    pub(super) fn connection(&self) -> Option<MultiplexedConnection> {
        self.slot().conn.load().as_deref().cloned()
    }

    /// The calling thread's queue of checks (`batch.rs`).
    pub(super) fn queue(&self) -> &Queue {
        &self.slot().queue
    }

    /// How many threads have their connection now, of how many.
    pub(super) fn connected(&self) -> (usize, usize) {
        let n = self
            .slots
            .iter()
            .filter(|s| s.conn.load().is_some())
            .count();
        (n, self.slots.len())
    }

    /// Whether every thread has its connection.
    pub(super) fn all_connected(&self) -> bool {
        self.slots.iter().all(|s| s.conn.load().is_some())
    }

    /// A check saw a connection break: drop them all and let the tasks reconnect.
    pub(super) fn broke(&self) {
        self.outage.disconnected();
        for slot in self.slots.iter() {
            slot.conn.store(None);
            slot.broken.notify_one();
        }
    }

    /// Starts one task per thread, each keeping that thread's connection up.
    pub(super) fn start(self: &Arc<Self>) {
        let store = self.clone();
        shards::spawn_each(move |i| store.clone().maintain(i));
    }

    /// Keeps slot `i`'s connection in place for as long as the daemon runs (on slot `i`'s
    /// thread: a connection's driver runs where it was made).
    async fn maintain(self: Arc<Self>, i: usize) {
        let Some(slot) = self.slots.get(i) else {
            return;
        };
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(CONNECT_TIMEOUT))
            .set_response_timeout(None);
        let mut backoff = BACKOFF_MIN;
        loop {
            if slot.conn.load().is_some() {
                slot.broken.notified().await;
                continue;
            }
            let attempt = tokio::time::timeout(
                CONNECT_TIMEOUT,
                self.client
                    .get_multiplexed_async_connection_with_config(&config),
            )
            .await;
            let failed = match attempt {
                Ok(Ok(conn)) => {
                    slot.conn.store(Some(Arc::new(conn)));
                    backoff = BACKOFF_MIN;
                    if self.all_connected() {
                        self.outage.back();
                    }
                    continue;
                }
                Ok(Err(e)) => e.to_string(),
                Err(_) => StoreErrorReason::Timeout.as_str().to_string(),
            };
            self.outage.connect_failed(&failed);
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(BACKOFF_MAX);
        }
    }
}
