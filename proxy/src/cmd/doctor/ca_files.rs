//! The CA files install makes: the CA certificate (valid, a CA, not expiring), the agent's
//! bundle and trust store (holding the CA, readable by the agent), and the environment file
//! PAM reads (what install writes).

use super::agent::Agent;
use super::agent_access::Access;
use super::finding::{Area, Finding};
use super::holds::{holds, Format, Holds};
use super::installed::Installed;
use crate::cmd::trust::{bundle, files, truststore};

const REINSTALL: &str = "`sudo agenshield proxy install` writes it anew";

/// The CA certificate's DER when it is usable, and the findings about every file.
pub fn check(inst: &Installed, agent: &Agent) -> (Option<Vec<u8>>, Vec<Finding>) {
    let mut out = Vec::new();
    let ca = ca_cert(inst, &mut out);
    let Some(der) = ca.as_deref() else {
        out.push(Finding::skipped(
            Area::CaFiles,
            "bundle and trust store",
            "without the CA there is nothing to look for in them",
        ));
        return (None, out);
    };
    for (path, format, what) in [
        (&inst.bundle, Format::Pem, "the agent's bundle"),
        (
            &inst.truststore,
            Format::KeyStore {
                password: truststore::PASSWORD,
                keytool: None,
            },
            "the agent's JVM trust store",
        ),
    ] {
        let subject = path.display().to_string();
        // Root's own files (the config names them): read here, then judged for the agent.
        out.push(match holds(path, format, der, agent, &Access::ours()) {
            Holds::Yes => Finding::ok(
                Area::CaFiles,
                subject,
                format!("{what} holds the CA and {} can read it", agent.name),
            ),
            h => Finding::fail(
                Area::CaFiles,
                subject,
                format!("{what} {}", h.describe()),
                REINSTALL,
            ),
        });
    }
    let want = files::env_file(&inst.trust());
    let subject = inst.env_file.display().to_string();
    out.push(match std::fs::read_to_string(&inst.env_file) {
        Ok(text) if text == want => Finding::ok(
            Area::CaFiles,
            subject,
            "the variables PAM and systemd units give the agent",
        ),
        Ok(_) => Finding::fail(
            Area::CaFiles,
            subject,
            "differs from what install writes (edited, or an older install)",
            REINSTALL,
        ),
        Err(e) => Finding::fail(Area::CaFiles, subject, e.to_string(), REINSTALL),
    });
    (Some(der.to_vec()), out)
}

fn ca_cert(inst: &Installed, out: &mut Vec<Finding>) -> Option<Vec<u8>> {
    let subject = inst.ca.display().to_string();
    let text = match std::fs::read_to_string(&inst.ca) {
        Ok(t) => t,
        Err(e) => {
            out.push(Finding::fail(
                Area::CaFiles,
                subject,
                format!("the CA certificate: {e}"),
                "the daemon creates the CA when it first starts (`sudo agenshield proxy \
                 install` starts it); then re-run install so the agent trusts it",
            ));
            return None;
        }
    };
    let certs = bundle::certs_of(&text);
    let [der] = certs.as_slice() else {
        out.push(Finding::fail(
            Area::CaFiles,
            subject,
            format!("holds {} certificates, not one", certs.len()),
            "restore the CA the daemon created (ca.pem beside ca-key.pem)",
        ));
        return None;
    };
    let facts = match agenshield_certs::inspect(der.as_ref()) {
        Ok(f) => f,
        Err(e) => {
            out.push(Finding::fail(
                Area::CaFiles,
                subject,
                e,
                "restore the CA the daemon created",
            ));
            return None;
        }
    };
    let date = facts
        .not_after
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default();
    let summary = format!(
        "{}, valid until {date}, SHA-256 {}",
        facts.subject, facts.fingerprint_sha256
    );
    let renew = "move ca.pem and ca-key.pem aside and restart the daemon (it makes a new CA), \
                 then `sudo agenshield proxy install` so the agent trusts the new one";
    out.push(match facts.expiry(time::OffsetDateTime::now_utc()) {
        _ if !facts.is_ca => Finding::fail(
            Area::CaFiles,
            subject,
            format!("{summary}: not a CA certificate (basicConstraints)"),
            "restore the CA the daemon created",
        ),
        agenshield_certs::Expiry::Valid => Finding::ok(Area::CaFiles, subject, summary),
        agenshield_certs::Expiry::ExpiresSoon => Finding::warn(
            Area::CaFiles,
            subject,
            format!("{summary}: expires within 30 days"),
            Some(renew.into()),
        ),
        agenshield_certs::Expiry::Expired => Finding::fail(
            Area::CaFiles,
            subject,
            format!("{summary}: EXPIRED, every client refuses our leaves"),
            renew,
        ),
    });
    Some(der.as_ref().to_vec())
}
