//! When the writer signs: after `checkpoint_every` records, or `checkpoint_interval` after the
//! last checkpoint if a record came since (whichever first), and when asked (a clean stop).
//! The counts advance only with a write that succeeded, so a failed batch (cut off again)
//! leaves no checkpoint counted for records that are not in the file.

use std::time::{Duration, Instant};

use super::checkpoint::{signed_message, CheckpointEntry};
use super::checkpoint_key::CheckpointKey;
use super::record::{Entry, Fields};

/// What `[audit]` asks for. Both 0: no checkpoints (and no key).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Cadence {
    /// Records between checkpoints; 0: not by count.
    pub every: u64,
    /// Longest time a record waits for a checkpoint; zero: not by time.
    pub interval: Duration,
}

/// Records since the last checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Tally {
    /// Records written since the last checkpoint.
    pub since: u64,
    /// The first of them (the next record's seq when `since` is 0).
    pub first: u64,
}

impl Tally {
    pub(crate) fn note(&mut self) {
        self.since += 1;
    }

    fn restart(&mut self, next_seq: u64) {
        self.since = 0;
        self.first = next_seq;
    }
}

pub(crate) struct Checkpoints {
    key: CheckpointKey,
    cadence: Cadence,
    tally: Tally,
    last: Instant,
}

impl Checkpoints {
    /// `first`: the first record not signed yet (after the last checkpoint found in the log,
    /// or the next one to be written).
    pub(crate) fn new(key: CheckpointKey, cadence: Cadence, first: u64, pending: u64) -> Self {
        Checkpoints {
            key,
            cadence,
            tally: Tally {
                since: pending,
                first,
            },
            last: Instant::now(),
        }
    }

    pub(crate) fn tally(&self) -> Tally {
        self.tally
    }

    /// A checkpoint is due by count after the records in `t`.
    pub(crate) fn due_by_count(&self, t: &Tally) -> bool {
        self.cadence.every > 0 && t.since >= self.cadence.every
    }

    /// A checkpoint is due by time (a record has waited `interval` for one).
    pub(crate) fn due_by_time(&self, now: Instant) -> bool {
        !self.cadence.interval.is_zero()
            && self.tally.since > 0
            && now.duration_since(self.last) >= self.cadence.interval
    }

    /// The fields of the checkpoint at `seq`, written at `time`, signing the chain head
    /// (`last_seq`, `head`); `t` restarts after it.
    pub(crate) fn sign(
        &self,
        t: &mut Tally,
        seq: u64,
        time: &str,
        last_seq: u64,
        head: &str,
    ) -> Fields {
        let key_id = self.key.public().id();
        let message = signed_message(seq, time, t.first, last_seq, head, &key_id);
        let entry = CheckpointEntry {
            first_seq: t.first,
            last_seq,
            head: head.to_string(),
            signature: self.key.sign(&message),
            key_id,
        };
        t.restart(seq + 1);
        Fields::of(&Entry::Checkpoint(entry))
    }

    /// The batch in which `t` was counted is in the file; `signed`: it held a checkpoint.
    pub(crate) fn commit(&mut self, t: Tally, signed: bool) {
        self.tally = t;
        if signed {
            self.last = Instant::now();
        }
    }
}
