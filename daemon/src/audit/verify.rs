//! `ctl audit verify`: walks the chain through one or more files (oldest first) and names
//! the first line that breaks it.

use std::io::{self, BufRead, BufReader};
use std::path::{Path, PathBuf};

use serde::Serialize;

use super::chain::{unseal, GENESIS};
use super::rotation::rotated;

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Report {
    pub files: Vec<PathBuf>,
    pub records: u64,
    pub first_seq: Option<u64>,
    pub last_seq: Option<u64>,
    /// `prev` of the first record: the genesis value, or a hash from a file not checked.
    pub chain_start: Option<String>,
    /// The last record's hash: compare with `ctl status` to see that no tail was cut.
    pub head: Option<String>,
    /// Allowed-request records the daemon could not queue, as recorded in the log.
    pub dropped: u64,
    pub broken: Option<Broken>,
}

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Broken {
    pub file: PathBuf,
    /// 1-based.
    pub line: u64,
    pub reason: String,
}

impl Report {
    pub fn starts_at_genesis(&self) -> bool {
        self.chain_start.as_deref() == Some(GENESIS)
    }
}

/// The live log and its rotated files, oldest first (those that exist).
pub fn rotation_set(live: &Path, max_rotated: u32) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = (1..=max_rotated)
        .rev()
        .map(|n| rotated(live, n))
        .filter(|p| p.exists())
        .collect();
    files.push(live.to_path_buf());
    files
}

/// Verifies `files` as one chain, in the order given.
pub fn verify(files: &[PathBuf]) -> io::Result<Report> {
    let mut r = Report {
        files: files.to_vec(),
        records: 0,
        first_seq: None,
        last_seq: None,
        chain_start: None,
        head: None,
        dropped: 0,
        broken: None,
    };
    for file in files {
        let reader = BufReader::new(std::fs::File::open(file)?);
        for (i, line) in reader.split(b'\n').enumerate() {
            let line = line?;
            let n = i as u64 + 1;
            if let Err(why) = check_line(&mut r, &line) {
                r.broken = Some(Broken {
                    file: file.clone(),
                    line: n,
                    reason: why.to_string(),
                });
                return Ok(r);
            }
        }
    }
    Ok(r)
}

/// Why a line breaks the chain.
#[derive(Debug, thiserror::Error)]
enum BrokenLine {
    #[error("not UTF-8")]
    NotUtf8,
    #[error("not a JSON record ({0})")]
    NotJson(#[source] serde_json::Error),
    #[error("no hash: the line does not end in a seal")]
    NoSeal,
    #[error("its content does not match its hash: the line was edited")]
    Edited,
    #[error("no sequence number")]
    NoSeq,
    #[error("no prev hash")]
    NoPrev,
    #[error(
        "its prev hash is not the hash of the line before: a line was removed, \
         inserted or reordered here (sequence {last} → {seq})"
    )]
    NotLinked { last: u64, seq: u64 },
    #[error("the sequence jumps from {last} to {seq}")]
    SeqJump { last: u64, seq: u64 },
}

fn check_line(r: &mut Report, line: &[u8]) -> Result<(), BrokenLine> {
    let text = std::str::from_utf8(line).map_err(|_| BrokenLine::NotUtf8)?;
    let v: serde_json::Value = serde_json::from_str(text).map_err(BrokenLine::NotJson)?;
    let sealed = unseal(text).ok_or(BrokenLine::NoSeal)?;
    if !sealed.intact {
        return Err(BrokenLine::Edited);
    }
    let seq = v["seq"].as_u64().ok_or(BrokenLine::NoSeq)?;
    let prev = v["prev"].as_str().ok_or(BrokenLine::NoPrev)?;
    match (&r.head, r.last_seq) {
        (Some(head), Some(last)) => {
            if prev != head {
                return Err(BrokenLine::NotLinked { last, seq });
            }
            // A crafted u64::MAX must not wrap round to a "next" number.
            if last.checked_add(1) != Some(seq) {
                return Err(BrokenLine::SeqJump { last, seq });
            }
        }
        _ => {
            r.chain_start = Some(prev.to_string());
            r.first_seq = Some(seq);
        }
    }
    r.dropped += v["dropped_before"].as_u64().unwrap_or(0);
    r.records += 1;
    r.last_seq = Some(seq);
    r.head = Some(sealed.hash.to_string());
    Ok(())
}
