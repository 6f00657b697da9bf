//! `ctl audit key` and `ctl audit verify --checkpoints`: the public key that verifies the
//! audit log's signed checkpoints, and the offline check of a log (or a shipped copy of it)
//! against it. Neither needs the daemon.

use std::path::{Path, PathBuf};

use agenshield_proxy::audit::checkpoint::PublicKey;
use agenshield_proxy::audit::checkpoint_key::read_public;
use agenshield_proxy::audit::checkpoint_verify::{
    verify_checkpoints as walk, CheckpointReport, Damage, SeqRange,
};
use agenshield_proxy::config::Config;

use super::{output, print, FAILED, OK};

/// Prints the public key (PEM), or writes it to `out`.
pub(super) fn key(cfg: &Config, out: Option<&Path>, json: bool) -> u8 {
    let key = match read_public(&cfg.audit_key) {
        Ok(k) => k,
        Err(e) => return output::failed(e),
    };
    let pem = key.to_pem();
    if let Some(out) = out {
        if let Err(e) = std::fs::write(out, &pem) {
            return output::failed(format!("writing {}: {e}", out.display()));
        }
    }
    let v = serde_json::json!({
        "key_id": key.id(),
        "public_key": pem,
        "source": cfg.audit_key.display().to_string(),
        "written_to": out.map(|o| o.display().to_string()),
    });
    if json {
        return print(&v, true, |_| String::new());
    }
    match out {
        Some(o) => output::line(&format!(
            "wrote the audit public key (key id {}) to {}",
            key.id(),
            o.display()
        )),
        // PEM alone on stdout, so `ctl audit key > file` is the key file.
        None => output::line(pem.trim_end()),
    }
    OK
}

/// `ctl audit verify --checkpoints [--key FILE…] [FILE…]`.
pub(super) fn verify_checkpoints(
    cfg: &Config,
    files: Result<Vec<PathBuf>, &'static str>,
    key_files: &[PathBuf],
    json: bool,
) -> u8 {
    let files = match files {
        Ok(f) => f,
        Err(why) => return output::bad_input(why),
    };
    let mut keys = Vec::new();
    if key_files.is_empty() {
        match read_public(&cfg.audit_key) {
            Ok(k) => keys.push(k),
            Err(e) => return output::bad_input(format!("{e}; or name the key with --key FILE")),
        }
    }
    for f in key_files {
        let text = match std::fs::read_to_string(f) {
            Ok(t) => t,
            Err(e) => return output::bad_input(format!("{}: {e}", f.display())),
        };
        match PublicKey::from_pem(&text) {
            Ok(k) => keys.push(k),
            Err(e) => return output::bad_input(format!("{}: {e}", f.display())),
        }
    }
    let report = match walk(&files, &keys) {
        Ok(r) => r,
        Err(e) => {
            let shown: Vec<String> = files.iter().map(|f| f.display().to_string()).collect();
            return output::failed(format!("reading the audit log ({}): {e}", shown.join(", ")));
        }
    };
    let v = serde_json::to_value(&report).unwrap_or_default();
    let status = print(&v, json, |_| human(&report, key_files.is_empty()));
    if report.ok() {
        status
    } else {
        FAILED
    }
}

fn human(r: &CheckpointReport, local_key: bool) -> String {
    let mut out = Vec::new();
    if !r.damage.is_empty() {
        out.push(format!(
            "DAMAGED: {} range(s) of the audit log do not verify",
            r.damage.len()
        ));
        for d in &r.damage {
            out.push(format!("  {}", damage_line(d)));
        }
    } else if r.checkpoints == 0 {
        out.push(
            "NOT VERIFIED: no checkpoint signed with the given key(s) in the log: nothing in \
             it is signed"
                .to_string(),
        );
    } else {
        out.push(format!(
            "ok: {} records in {} file(s), seq {}..{}; {} checkpoint(s) verify, the last at seq {}",
            r.records,
            r.files.len(),
            r.first_seq.unwrap_or(0),
            r.last_seq.unwrap_or(0),
            r.checkpoints,
            r.last_checkpoint.unwrap_or(0)
        ));
    }
    if !r.starts_at_genesis && r.first_seq.is_some() {
        let first = r
            .first_checkpoint
            .map_or("none".to_string(), |s| format!("seq {s}"));
        out.push(format!(
            "note: this copy begins at seq {} (the log's beginning is not in it): what came \
             before cannot be checked; checked from its first record, signed from its first \
             checkpoint ({first})",
            r.first_seq.unwrap_or(0)
        ));
    }
    if r.skipped_first_line {
        out.push(
            "note: the first line is not a whole record (a copy cut mid-line): skipped".into(),
        );
    }
    if let Some(t) = r.unsigned_tail {
        out.push(format!(
            "note: {} signed by no checkpoint yet (the daemon is running, or stopped \
             uncleanly): a cut there cannot be seen in this copy",
            range_text(t)
        ));
    }
    out.push(format!("keys: {}", r.keys.join(", ")));
    if local_key {
        out.push(
            "note: checked with this host's own key; for evidence, verify with a key exported \
             earlier (`ctl audit key --out`) and kept elsewhere"
                .into(),
        );
    }
    out.join("\n")
}

fn range_text(t: SeqRange) -> String {
    if t.first == t.last {
        format!("record seq {}", t.first)
    } else {
        format!("records seq {}..{}", t.first, t.last)
    }
}

/// `seq A..B (between the checkpoints at seq X and Y): FILE line N: what`.
fn damage_line(d: &Damage) -> String {
    let range = d.range.map_or("no records".to_string(), range_text);
    let around = match (d.after_checkpoint, d.before_checkpoint) {
        (Some(a), Some(b)) => format!("between the checkpoints at seq {a} and seq {b}"),
        (Some(a), None) => format!("after the checkpoint at seq {a}, none good after it"),
        (None, Some(b)) => format!("before the first good checkpoint, at seq {b}"),
        (None, None) => "no good checkpoint around it".to_string(),
    };
    let more = if d.more > 0 {
        format!(" (and {} more problem(s) in the range)", d.more)
    } else {
        String::new()
    };
    format!(
        "{range} ({around}) cannot be trusted: {}:{}: {}{more}",
        d.file.display(),
        d.line,
        d.detail
    )
}
