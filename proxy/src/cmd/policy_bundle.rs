//! `agenshield proxy policy bundle DIR --out FILE`: a policy directory packed for
//! `[policy.source]`, after the daemon's own loader accepted it (a bundle every daemon would
//! refuse is never made). The operator signs the file with `minisign -S`.

use std::path::Path;

use agenshield_proxy::control::policy_source::{Bundle, Manifest};
use agenshield_proxy::policy::{list_dir, LocalMode, Policy};

use crate::cli::PolicyTool;

pub fn command(tool: PolicyTool) -> u8 {
    match tool {
        PolicyTool::Bundle {
            dir,
            out,
            revision,
            local,
        } => match bundle(&dir, &out, revision, &local) {
            Ok(line) => {
                println!("{line}");
                0
            }
            Err(e) => {
                eprintln!("agenshield: {e}");
                2
            }
        },
    }
}

fn bundle(dir: &Path, out: &Path, revision: Option<u64>, local: &str) -> anyhow::Result<String> {
    let local = LocalMode::parse(local)
        .ok_or_else(|| anyhow::anyhow!("--local {local:?}: merge, deny-only or ignore"))?;
    let policy = Policy::load_dir(dir).map_err(|e| anyhow::anyhow!("{}: {e}", dir.display()))?;
    let now = time::OffsetDateTime::now_utc();
    let revision = revision.unwrap_or(now.unix_timestamp().max(1) as u64);
    anyhow::ensure!(revision > 0, "--revision must be at least 1");
    let created_at = now
        .replace_nanosecond(0)
        .unwrap_or(now)
        .format(&time::format_description::well_known::Rfc3339)?;
    let mut files = Vec::new();
    for path in list_dir(dir)? {
        let name = path
            .strip_prefix(dir)
            .map_err(|_| anyhow::anyhow!("{} is outside {}", path.display(), dir.display()))?
            .to_str()
            .ok_or_else(|| anyhow::anyhow!("{}: not a UTF-8 name", path.display()))?
            .to_string();
        let text = std::fs::read_to_string(&path)
            .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
        files.push((name, text));
    }
    let bundle = Bundle {
        manifest: Manifest {
            revision,
            created_at,
            local,
        },
        files,
    };
    let mut bytes = Vec::new();
    bundle.write(&mut bytes)?;
    let tmp = out.with_extension("tmp");
    std::fs::write(&tmp, &bytes)
        .and_then(|()| std::fs::rename(&tmp, out))
        .map_err(|e| anyhow::anyhow!("{}: {e}", out.display()))?;
    Ok(format!(
        "agenshield: wrote {} (revision {revision}, local = {local}, {} files, policy {}, {} rules); sign it: minisign -S -m {}",
        out.display(),
        bundle.files.len(),
        policy.hash(),
        policy.rule_count(),
        out.display()
    ))
}
