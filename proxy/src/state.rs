//! Everything the data path shares, built once at start-up.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use agenshield_certs::LeafCache;
use arc_swap::ArcSwap;

use crate::config::Limits;
use crate::dial::Dialer;
use crate::forward::Forwarder;
use crate::policy::Policy;
use crate::tls::InterceptTls;

pub struct Proxy {
    policy: ArcSwap<Policy>,
    pub leaves: LeafCache,
    pub tls: InterceptTls,
    pub dialer: Arc<Dialer>,
    pub forwarder: Forwarder,
    pub limits: Limits,
    next_conn: AtomicU64,
}

impl Proxy {
    pub fn new(
        policy: Policy,
        leaves: LeafCache,
        dialer: Arc<Dialer>,
        forwarder: Forwarder,
        limits: Limits,
    ) -> Proxy {
        Proxy {
            policy: ArcSwap::from_pointee(policy),
            leaves,
            tls: InterceptTls::new(),
            dialer,
            forwarder,
            limits,
            next_conn: AtomicU64::new(1),
        }
    }

    /// The policy in force now. A request keeps the one it started with.
    pub fn policy(&self) -> Arc<Policy> {
        self.policy.load_full()
    }

    pub fn replace_policy(&self, policy: Policy) {
        self.policy.store(Arc::new(policy));
    }

    pub fn next_conn_id(&self) -> u64 {
        self.next_conn.fetch_add(1, Ordering::Relaxed)
    }
}
