//! Rule positions by host pattern, so a decision costs O(labels in host), not O(rules): an
//! exact-host map, a `*.suffix` map probed once per parent suffix, and the `*` rules.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use super::host::{parent_suffixes, HostPattern};

/// Rule positions (in evaluation order, ascending) by host pattern.
#[derive(Debug, Default)]
pub(crate) struct HostIndex {
    exact: HashMap<Box<str>, Vec<usize>, FastHash>,
    /// Keyed by the suffix after `*.`.
    suffix: HashMap<Box<str>, Vec<usize>, FastHash>,
    any: Vec<usize>,
}

/// FxHash-style hasher: several times faster than SipHash on short host names. Flooding is
/// not a concern: the keys come from the policy; requests only look up.
type FastHash = BuildHasherDefault<FxHasher>;

#[derive(Default)]
struct FxHasher(u64);

impl Hasher for FxHasher {
    fn write(&mut self, bytes: &[u8]) {
        const K: u64 = 0x51_7c_c1_b7_27_22_0a_95;
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            let mut w = [0u8; 8];
            w.copy_from_slice(c);
            self.0 = (self.0.rotate_left(5) ^ u64::from_le_bytes(w)).wrapping_mul(K);
        }
        for &b in chunks.remainder() {
            self.0 = (self.0.rotate_left(5) ^ u64::from(b)).wrapping_mul(K);
        }
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

impl HostIndex {
    /// Positions must be inserted in ascending order.
    pub(crate) fn insert(&mut self, pattern: HostPattern, pos: usize) {
        let list = match pattern {
            HostPattern::Any => &mut self.any,
            HostPattern::Exact(h) => self.exact.entry(h.into()).or_default(),
            HostPattern::Suffix(s) => self.suffix.entry(s.into()).or_default(),
        };
        if list.last() != Some(&pos) {
            list.push(pos);
        }
    }

    /// Whether the policy names `host` exactly (canonical form): such hosts get their own
    /// metric label, every other host is `other`.
    pub(crate) fn names(&self, host: &str) -> bool {
        self.exact.contains_key(host)
    }

    /// Calls `f` with each candidate list for a canonical host (each sorted ascending).
    pub(crate) fn candidates<'a>(&'a self, host: &str, mut f: impl FnMut(&'a [usize])) {
        if let Some(v) = self.exact.get(host) {
            f(v);
        }
        if !self.suffix.is_empty() {
            for s in parent_suffixes(host) {
                if let Some(v) = self.suffix.get(s) {
                    f(v);
                }
            }
        }
        if !self.any.is_empty() {
            f(&self.any);
        }
    }
}
