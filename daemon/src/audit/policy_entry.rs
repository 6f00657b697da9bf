//! The `policy` record: one per outcome of the policy source, a bundle applied or a bundle
//! refused (with why). A sync that finds nothing new (`304 Not Modified`, the same bundle)
//! writes nothing; one that cannot reach the source is counted, not recorded.

use serde::Serialize;

/// What became of a bundle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum BundleOutcome {
    /// Verified, parsed and in force (a reload was made of it).
    Applied,
    /// Not taken; the policy in force stays.
    Refused,
}

/// Why a bundle was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum BundleRefusal {
    /// The signature does not verify with the configured key (a tampered bundle, another
    /// key, a missing or malformed signature).
    Signature,
    /// Larger than `policy.source.max_size` (bundle or signature; unpacked, four times it).
    TooLarge,
    /// Not a bundle: not gzip, not tar, a path that leaves the bundle, a link or other
    /// non-file entry, a file that is not policy, no or a bad `manifest.toml`.
    Malformed,
    /// A revision older than the one in force, or the same revision with other content.
    Rollback,
    /// The policy files (with the local layer) do not load.
    InvalidPolicy,
}

impl BundleRefusal {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            BundleRefusal::Signature => "signature",
            BundleRefusal::TooLarge => "too_large",
            BundleRefusal::Malformed => "malformed",
            BundleRefusal::Rollback => "rollback",
            BundleRefusal::InvalidPolicy => "invalid_policy",
        }
    }
}

/// Where the bundle came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum BundleOrigin {
    /// Fetched from `policy.source.url` now.
    Source,
    /// The daemon's own cache, read at start.
    Cache,
}

/// A `policy` line.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct PolicyEntry {
    pub outcome: BundleOutcome,
    /// `null` when applied.
    pub reason: Option<BundleRefusal>,
    /// The bundle's revision, when its manifest could be read.
    pub revision: Option<u64>,
    /// SHA-256 of the bundle file (hex), when it was read whole. (Not `hash`: the line's
    /// envelope has that name.)
    pub sha256: Option<String>,
    pub origin: BundleOrigin,
    /// The policy source, as configured.
    pub url: String,
    /// The policy in force after it (`Policy::hash`).
    pub policy: String,
    /// What was wrong, in words (`null` when applied).
    pub error: Option<String>,
}
