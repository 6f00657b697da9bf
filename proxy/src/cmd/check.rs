//! `agenshield proxy run --check`: everything `run` would read, checked without binding a
//! port, touching the firewall or creating anything: the configuration (already loaded), the
//! policy, the secrets it binds, the CA and the worker user. One line per part; exit 0 when
//! all pass, 2 when any fails.

use std::path::Path;

use crate::config::Config;
use crate::policy::Policy;

/// One part's verdict.
enum Part {
    Ok(String),
    Note(String),
    Failed(String),
}

pub fn command(cfg: &Config, config_path: &str) -> u8 {
    let mut parts = vec![("config", Part::Ok(config_path.to_string()))];
    let policy = Policy::load_dir(&cfg.policies);
    parts.push((
        "policy",
        match &policy {
            Ok(p) => Part::Ok(format!(
                "{}: {} rules, {}",
                cfg.policies.display(),
                p.rule_count(),
                p.hash()
            )),
            Err(e) => Part::Failed(e.to_string()),
        },
    ));
    parts.push(("secrets", secrets(cfg, policy.as_ref().ok())));
    parts.push(("CA", ca(&cfg.certs)));
    parts.push((
        "worker",
        match crate::daemon::privsep::worker_user(cfg) {
            Ok(Some(who)) => Part::Ok(format!("serves as {} (uid {})", who.name, who.uid)),
            Ok(None) => Part::Note("no privilege split (daemon.worker_user unset)".into()),
            Err(e) => Part::Failed(e.to_string()),
        },
    ));
    let mut failed = false;
    for (name, part) in &parts {
        let (tag, text) = match part {
            Part::Ok(t) => ("ok", t),
            Part::Note(t) => ("note", t),
            Part::Failed(t) => {
                failed = true;
                ("FAILED", t)
            }
        };
        println!("{name:<8} {tag:<6} {text}");
    }
    if failed {
        eprintln!("agenshield: the configuration would not start; fix the FAILED parts");
        2
    } else {
        println!("agenshield: the configuration is ready to run (nothing was bound or changed)");
        0
    }
}

fn secrets(cfg: &Config, policy: Option<&Policy>) -> Part {
    let Some(p) = policy else {
        return Part::Note("not checked (the policy did not load)".into());
    };
    match crate::cmd::ctl::secret_names(cfg) {
        Ok(names) => match p.check_secrets(&|n| names.iter().any(|x| x == n)) {
            Ok(()) => Part::Ok(format!(
                "{} in the store, every secret the policy binds among them",
                names.len()
            )),
            Err(e) => Part::Failed(e.to_string()),
        },
        Err(why) if p.secret_refs().is_empty() => {
            Part::Note(format!("the policy binds none ({why})"))
        }
        Err(why) => Part::Failed(format!("the policy binds secrets, and {why}")),
    }
}

fn ca(dir: &Path) -> Part {
    let cert = dir.join("ca.pem");
    let key = dir.join("ca-key.pem");
    match (cert.exists(), key.exists()) {
        (false, false) => {
            return Part::Note(format!(
                "none yet in {}; the daemon creates one when it first starts",
                dir.display()
            ))
        }
        (true, false) | (false, true) => {
            return Part::Failed(format!(
                "{} and {} must both exist (or neither, for a new CA)",
                cert.display(),
                key.display()
            ))
        }
        (true, true) => {}
    }
    if let Err(e) = std::fs::File::open(&key) {
        return Part::Failed(format!("CA: cannot read {}: {e}", key.display()));
    }
    match super::ca_file::read(&cert) {
        Ok((_, f))
            if f.expiry(time::OffsetDateTime::now_utc()) == agenshield_certs::Expiry::Expired =>
        {
            Part::Failed(format!("{} expired", cert.display()))
        }
        Ok((_, f)) => Part::Ok(format!(
            "{} (SHA-256 {}, valid until {})",
            cert.display(),
            f.fingerprint_sha256,
            f.not_after.date()
        )),
        Err(why) => Part::Failed(why),
    }
}
