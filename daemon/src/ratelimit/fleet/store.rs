//! The connection to the shared store: one multiplexed Redis connection that every check
//! shares, kept up by a task of its own, so no check ever waits for a connect.
//!
//! A check takes the connection there is now; with none (the store is down, or the task is
//! reconnecting) it fails at once, and the caller falls back. A check that sees the
//! connection break drops it and wakes the task, which reconnects with a backoff (100 ms
//! doubling to 2 s), each attempt bounded by [`CONNECT_TIMEOUT`]. Why not redis'
//! `ConnectionManager`: its first connect is on the caller's path, and a check that finds it
//! reconnecting waits for that instead of falling back at once.

use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwapOption;
use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Client};
use tokio::sync::Notify;

use super::metrics::StoreErrorReason;
use super::outage::Outage;

/// The longest one connect attempt (TCP, TLS, AUTH, SELECT) may take, off the request path.
pub(super) const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
const BACKOFF_MIN: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(2);

pub(super) struct Store {
    client: Client,
    conn: ArcSwapOption<MultiplexedConnection>,
    broken: Notify,
    /// What a connect failure is told to.
    outage: Arc<Outage>,
}

impl Store {
    pub(super) fn new(client: Client, outage: Arc<Outage>) -> Store {
        Store {
            client,
            conn: ArcSwapOption::empty(),
            broken: Notify::new(),
            outage,
        }
    }

    /// The connection to use now, if there is one.
    pub(super) fn connection(&self) -> Option<MultiplexedConnection> {
        self.conn.load().as_deref().cloned()
    }

    /// A check saw the connection break: drop it (if it is still the one in place) and let
    /// the task reconnect.
    pub(super) fn broke(&self) {
        self.conn.store(None);
        self.broken.notify_one();
    }

    /// Keeps a connection in place for as long as the daemon runs (spawn it on the main
    /// runtime: the connection's driver task runs where it was made).
    pub(super) async fn maintain(self: Arc<Self>) {
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(CONNECT_TIMEOUT))
            .set_response_timeout(None);
        let mut backoff = BACKOFF_MIN;
        loop {
            if self.conn.load().is_some() {
                self.broken.notified().await;
                continue;
            }
            let attempt = tokio::time::timeout(
                CONNECT_TIMEOUT,
                self.client
                    .get_multiplexed_async_connection_with_config(&config),
            )
            .await;
            match attempt {
                Ok(Ok(conn)) => {
                    self.conn.store(Some(Arc::new(conn)));
                    self.outage.back();
                    backoff = BACKOFF_MIN;
                }
                Ok(Err(e)) => {
                    self.outage.connect_failed(&e.to_string());
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(BACKOFF_MAX);
                }
                Err(_) => {
                    self.outage
                        .connect_failed(StoreErrorReason::Timeout.as_str());
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(BACKOFF_MAX);
                }
            }
        }
    }
}
