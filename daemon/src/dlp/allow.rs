//! `dlp_allow`: values known to be harmless (test keys, documentation examples) that may go
//! anywhere. Kept only as keyed fingerprints ([`Detector::fingerprint`]), never as text, so
//! neither a log line nor a memory dump of the list shows a value; a lookup compares
//! fingerprints under a key drawn per detector, so its timing says nothing about the values.

use std::collections::HashSet;

use super::detector::{Detector, Finding, Fingerprint};

/// The AWS documentation's example access key id and secret key: allowed out of the box.
pub(crate) const AWS_EXAMPLE_KEYS: [&str; 2] = [
    "AKIAIOSFODNN7EXAMPLE",
    "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
];

/// Allowed values, as fingerprints under one detector's key.
#[derive(Debug, Clone, Default)]
pub(crate) struct AllowList {
    set: HashSet<Fingerprint>,
}

impl AllowList {
    /// The defaults ([`AWS_EXAMPLE_KEYS`]) and `extra` (a rule's `dlp_allow`).
    pub(crate) fn new<I, V>(detector: &Detector, extra: I) -> AllowList
    where
        I: IntoIterator<Item = V>,
        V: AsRef<[u8]>,
    {
        let defaults = AWS_EXAMPLE_KEYS
            .iter()
            .map(|v| detector.fingerprint(v.as_bytes()));
        let extra = extra.into_iter().map(|v| detector.fingerprint(v.as_ref()));
        AllowList {
            set: defaults.chain(extra).collect(),
        }
    }

    /// Whether the finding's value is listed.
    pub(crate) fn allows(&self, finding: &Finding) -> bool {
        self.set.contains(&finding.fingerprint)
    }
}
