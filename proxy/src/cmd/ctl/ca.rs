//! `ctl ca show` and `ctl ca export`: the CA whose leaves the agent sees, read from the
//! configured certificate directory (its certificate only; the key is never opened), so they
//! work whether or not the daemon runs.

use super::{output, print, Config, OK};
use crate::cli::CaCommand;

pub(super) fn run(cfg: &Config, cmd: CaCommand, json: bool) -> u8 {
    let path = cfg.certs.join("ca.pem");
    let (text, facts) = match crate::cmd::ca_file::read(&path) {
        Ok(read) => read,
        Err(why) if !path.exists() => {
            return output::failed(format!(
                "{why} (the daemon creates it when it first starts)"
            ))
        }
        Err(why) => return output::failed(why),
    };
    match cmd {
        CaCommand::Export => {
            // The certificate as the daemon wrote it, for a trust store or another machine.
            output::line(text.trim_end());
            OK
        }
        CaCommand::Show => {
            let not_after = facts
                .not_after
                .format(&time::format_description::well_known::Rfc3339)
                .unwrap_or_default();
            let v = serde_json::json!({
                "path": path.display().to_string(),
                "subject": facts.subject,
                "sha256": facts.fingerprint_sha256,
                "not_after": not_after,
                "is_ca": facts.is_ca,
            });
            print(&v, json, |v| {
                format!(
                    "CA          {}\nsubject     {}\nSHA-256     {}\nvalid until {}",
                    v["path"].as_str().unwrap_or(""),
                    v["subject"].as_str().unwrap_or(""),
                    v["sha256"].as_str().unwrap_or(""),
                    v["not_after"].as_str().unwrap_or("")
                )
            })
        }
    }
}
