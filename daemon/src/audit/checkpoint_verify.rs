//! `ctl audit verify --checkpoints`: walks the chain through one or more files (oldest
//! first: the live log and its rotations, or a shipped copy exactly as the syslog receiver
//! wrote it) and checks every checkpoint's signature with the keys given. Offline: no daemon.
//!
//! Unlike the plain walk (`verify.rs`), which stops at the first broken line, this one goes
//! on, re-anchoring at each good checkpoint, and names each damaged range by the two good
//! checkpoints around it: a line edited, lines deleted, a file cut short before the next one
//! (a later record proves the cut), a chain recomputed after an edit (the next checkpoint's
//! signed head no longer matches), a checkpoint forged or signed by another key. A copy whose
//! beginning is missing (an export started later, a rotated file gone) is checked from its
//! first record, and said so. A tail after the last checkpoint is signed by nothing: cut
//! there, nothing in the copy can prove it, which the report says too.

use std::io::{self, BufRead, BufReader};
use std::path::{Path, PathBuf};

use serde::Serialize;

use super::chain::{unseal, GENESIS};
use super::checkpoint::{signed_message, CheckpointEntry, PublicKey};

/// What the walk found.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct CheckpointReport {
    pub files: Vec<PathBuf>,
    /// Key ids of the keys checked against.
    pub keys: Vec<String>,
    /// Lines read as records (checkpoints included).
    pub records: u64,
    pub first_seq: Option<u64>,
    pub last_seq: Option<u64>,
    /// The first record is the log's very first (its `prev` is the genesis value); when not,
    /// the copy's beginning is missing and the check starts at the copy's first record.
    pub starts_at_genesis: bool,
    /// A first line that was not a whole record (a copy that starts mid-line), skipped.
    pub skipped_first_line: bool,
    /// Checkpoints whose signature verified and whose head is the chain's.
    pub checkpoints: u64,
    pub first_checkpoint: Option<u64>,
    pub last_checkpoint: Option<u64>,
    /// Records after the last good checkpoint: signed by nothing yet, so a cut there cannot
    /// be seen in this copy (the next checkpoint, or the daemon's head, shows it).
    pub unsigned_tail: Option<SeqRange>,
    pub damage: Vec<Damage>,
}

impl CheckpointReport {
    /// No damage and at least one good checkpoint.
    pub fn ok(&self) -> bool {
        self.damage.is_empty() && self.checkpoints > 0
    }
}

/// Records `first..=last`.
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
pub struct SeqRange {
    pub first: u64,
    pub last: u64,
}

/// One damaged range: between two good checkpoints (or the copy's start or end).
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Damage {
    /// What the first problem in the range is.
    pub kind: DamageKind,
    /// Where it was seen first (1-based line).
    pub file: PathBuf,
    pub line: u64,
    /// The last good checkpoint before it (`None`: none in the copy before it).
    pub after_checkpoint: Option<u64>,
    /// The first good checkpoint after it (`None`: none in the copy after it).
    pub before_checkpoint: Option<u64>,
    /// The records that cannot be trusted: those between the two checkpoints.
    pub range: Option<SeqRange>,
    /// Further problems seen in the same range.
    pub more: u64,
    pub detail: String,
}

/// The kinds of damage, as `--json` spells them.
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum DamageKind {
    /// A line whose content does not match its own hash.
    Edited,
    /// Records missing: the sequence jumps (lines deleted).
    Removed,
    /// A file ends and the next continues later: the first was cut short.
    Truncated,
    /// A line that does not link to the one before it though no record is missing: lines
    /// replaced, inserted or reordered, or the chain recomputed.
    Relinked,
    /// A checkpoint whose signed head is not the chain's, or is not the line before it.
    HeadMismatch,
    /// A checkpoint whose signature does not verify with its key.
    BadSignature,
    /// A checkpoint signed by a key that is not one of those given.
    UnknownKey,
    /// A line that is not a sealed audit record.
    Malformed,
}

/// Verifies `files` as one chain, in the order given, against `keys`.
pub fn verify_checkpoints(files: &[PathBuf], keys: &[PublicKey]) -> io::Result<CheckpointReport> {
    let mut walk = Walk {
        keys,
        report: CheckpointReport {
            files: files.to_vec(),
            keys: keys.iter().map(PublicKey::id).collect(),
            records: 0,
            first_seq: None,
            last_seq: None,
            starts_at_genesis: false,
            skipped_first_line: false,
            checkpoints: 0,
            first_checkpoint: None,
            last_checkpoint: None,
            unsigned_tail: None,
            damage: Vec::new(),
        },
        prev: None,
        open: None,
        read_any: false,
    };
    for (index, file) in files.iter().enumerate() {
        let reader = BufReader::new(std::fs::File::open(file)?);
        for (i, line) in reader.split(b'\n').enumerate() {
            let at = Spot {
                file,
                line: i as u64 + 1,
                first_of_later_file: index > 0 && i == 0,
            };
            walk.line(&line?, &at);
        }
    }
    Ok(walk.finish())
}

/// Where a line is.
struct Spot<'a> {
    file: &'a Path,
    line: u64,
    /// The first line of a file after the first (a cut shows here).
    first_of_later_file: bool,
}

struct Walk<'k> {
    keys: &'k [PublicKey],
    report: CheckpointReport,
    /// The last record read: its seq and stated hash (whatever its state).
    prev: Option<(u64, String)>,
    /// A damaged range waiting for the next good checkpoint.
    open: Option<Damage>,
    /// A line was read (the first may be a fragment of a copy that starts mid-line).
    read_any: bool,
}

/// A line read as a record.
struct Read {
    seq: u64,
    prev: String,
    hash: String,
    intact: bool,
    value: serde_json::Value,
}

fn read(line: &[u8]) -> Option<Read> {
    let text = std::str::from_utf8(line).ok()?;
    // A receiver may put a space (or its own header: time, host, tag) before the message, or
    // end it with CR; the record itself starts at `{"v":` and ends at `}`, and only it is
    // hashed, so what comes before it changes nothing.
    let text = text.trim_end_matches('\r');
    let text = match text.find("{\"v\":") {
        Some(at) => &text[at..],
        None => text,
    };
    let value: serde_json::Value = serde_json::from_str(text).ok()?;
    let sealed = unseal(text)?;
    Some(Read {
        seq: value["seq"].as_u64()?,
        prev: value["prev"].as_str()?.to_string(),
        hash: sealed.hash.to_string(),
        intact: sealed.intact,
        value,
    })
}

impl Walk<'_> {
    fn line(&mut self, line: &[u8], at: &Spot) {
        let first = !self.read_any;
        self.read_any = true;
        if line.iter().all(u8::is_ascii_whitespace) {
            return;
        }
        let Some(r) = read(line) else {
            if first {
                self.report.skipped_first_line = true;
            } else {
                self.damage(
                    DamageKind::Malformed,
                    at,
                    "not a sealed audit record".into(),
                );
            }
            return;
        };
        let mut clean = true;
        if !r.intact {
            clean = false;
            self.damage(
                DamageKind::Edited,
                at,
                format!(
                    "seq {}: its content does not match its hash: the line was edited",
                    r.seq
                ),
            );
        }
        match self.prev.clone() {
            None => {
                self.report.first_seq = Some(r.seq);
                self.report.starts_at_genesis = r.prev == GENESIS;
            }
            Some((seq, hash)) => {
                if let Some((kind, why)) = link(seq, &hash, &r, at) {
                    clean = false;
                    self.damage(kind, at, why);
                }
            }
        }
        if r.value["kind"] == "checkpoint" {
            match self.checkpoint(&r) {
                Ok(()) if clean => self.anchor(r.seq),
                Ok(()) => {}
                Err((kind, why)) => self.damage(kind, at, why),
            }
        }
        self.report.records += 1;
        self.report.last_seq = Some(r.seq);
        self.prev = Some((r.seq, r.hash));
    }

    /// Whether the checkpoint `r` signs the line before it with one of the keys.
    fn checkpoint(&self, r: &Read) -> Result<(), (DamageKind, String)> {
        let cp: CheckpointEntry = serde_json::from_value(r.value.clone()).map_err(|e| {
            (
                DamageKind::Malformed,
                format!("checkpoint at seq {}: its fields do not read ({e})", r.seq),
            )
        })?;
        if cp.last_seq.checked_add(1) != Some(r.seq) || cp.head != r.prev {
            return Err((
                DamageKind::HeadMismatch,
                format!(
                    "checkpoint at seq {}: it signs seq {} with head {}, which is not the line \
                     before it",
                    r.seq, cp.last_seq, cp.head
                ),
            ));
        }
        let Some(key) = self.keys.iter().find(|k| k.id() == cp.key_id) else {
            return Err((
                DamageKind::UnknownKey,
                format!(
                    "checkpoint at seq {}: signed by key {}, not one given ({})",
                    r.seq,
                    cp.key_id,
                    self.report.keys.join(", ")
                ),
            ));
        };
        let time = r.value["time"].as_str().unwrap_or_default();
        let message = signed_message(r.seq, time, cp.first_seq, cp.last_seq, &cp.head, &cp.key_id);
        if !key.verifies(&message, &cp.signature) {
            return Err((
                DamageKind::BadSignature,
                format!(
                    "checkpoint at seq {}: its signature does not verify with key {}",
                    r.seq, cp.key_id
                ),
            ));
        }
        Ok(())
    }

    /// A good checkpoint at `seq`: closes the open damaged range, if any.
    fn anchor(&mut self, seq: u64) {
        if let Some(mut d) = self.open.take() {
            d.before_checkpoint = Some(seq);
            d.range = self.range(d.after_checkpoint, Some(seq));
            self.report.damage.push(d);
        }
        self.report.checkpoints += 1;
        self.report.first_checkpoint.get_or_insert(seq);
        self.report.last_checkpoint = Some(seq);
    }

    /// Opens a damaged range at `at`, or counts one more problem in the open one.
    fn damage(&mut self, kind: DamageKind, at: &Spot, detail: String) {
        match &mut self.open {
            Some(d) => d.more += 1,
            None => {
                self.open = Some(Damage {
                    kind,
                    file: at.file.to_path_buf(),
                    line: at.line,
                    after_checkpoint: self.report.last_checkpoint,
                    before_checkpoint: None,
                    range: None,
                    more: 0,
                    detail,
                })
            }
        }
    }

    /// The records strictly between two checkpoints (the copy's ends for `None`).
    fn range(&self, after: Option<u64>, before: Option<u64>) -> Option<SeqRange> {
        let first = match after {
            Some(cp) => cp.saturating_add(1),
            None => self.report.first_seq?,
        };
        let last = match before {
            Some(cp) => cp.checked_sub(1)?,
            None => self.report.last_seq?,
        };
        (first <= last).then_some(SeqRange { first, last })
    }

    fn finish(mut self) -> CheckpointReport {
        if let Some(mut d) = self.open.take() {
            d.range = self.range(d.after_checkpoint, None);
            self.report.damage.push(d);
        } else if self.report.last_seq != self.report.last_checkpoint {
            self.report.unsigned_tail = self.range(self.report.last_checkpoint, None);
        }
        self.report
    }
}

/// Why `r` does not follow the record `(seq, hash)` read before it, if it does not.
fn link(seq: u64, hash: &str, r: &Read, at: &Spot) -> Option<(DamageKind, String)> {
    let next = seq.checked_add(1);
    if r.prev == hash && next == Some(r.seq) {
        return None;
    }
    if r.prev != hash && next.is_some_and(|n| r.seq > n) {
        let missing = if seq + 1 == r.seq - 1 {
            format!("record seq {}", seq + 1)
        } else {
            format!("records seq {}..{}", seq + 1, r.seq - 1)
        };
        return Some(if at.first_of_later_file {
            (
                DamageKind::Truncated,
                format!(
                    "the file before ends at seq {seq} but this one goes on at seq {}: \
                     {missing} missing (the earlier file was cut short)",
                    r.seq
                ),
            )
        } else {
            (
                DamageKind::Removed,
                format!(
                    "the sequence jumps from {seq} to {}: {missing} deleted",
                    r.seq
                ),
            )
        });
    }
    Some((
        DamageKind::Relinked,
        format!(
            "seq {} does not follow seq {seq}: its prev hash is not the hash of the line \
             before (a line replaced, inserted or reordered, or the chain recomputed)",
            r.seq
        ),
    ))
}
