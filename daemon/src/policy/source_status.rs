//! What the policy in force came from when `[policy.source]` is set: the bundle layer the
//! store composes with the local directory, and the source's sync state as `ctl status`,
//! `ctl policy show` and the metrics show it. The sync loop (`control::policy_source`)
//! writes it; the store only keeps it.

use serde::Serialize;

use super::{LocalMode, PolicySource};

/// A verified bundle's files, ready to compose with the local directory.
#[derive(Debug, Clone)]
pub(crate) struct BundleLayer {
    /// In load order, named `bundle:rREVISION/FILE`.
    pub sources: Vec<PolicySource>,
    pub local: LocalMode,
    pub revision: u64,
    /// SHA-256 of the bundle file (hex).
    pub sha256: String,
    pub created_at: String,
}

/// A failed sync: when and why (for `ctl status`).
#[derive(Debug, Clone, Serialize)]
pub(crate) struct SyncFailure {
    pub at: String,
    /// The reason as a label (`fetch`, `signature`, `rollback`, …).
    pub reason: &'static str,
    pub message: String,
}

/// The policy source as `ctl` shows it.
#[derive(Debug, Clone, Default, Serialize)]
pub(crate) struct SourceStatus {
    pub url: String,
    /// The revision in force (`None`: no bundle applied yet).
    pub revision: Option<u64>,
    /// SHA-256 of the bundle in force.
    pub sha256: Option<String>,
    pub local: Option<LocalMode>,
    pub created_at: Option<String>,
    /// Where the bundle in force came from at start (`cache`), or `server`.
    pub from: Option<&'static str>,
    /// The last sync that reached the source (a new bundle, or the same one again).
    pub last_sync: Option<String>,
    /// The last failed sync, if no successful one came after it.
    pub last_error: Option<SyncFailure>,
    /// Every agent request is refused until the first bundle (`require_first_sync`).
    pub waiting_for_first_sync: bool,
}
