//! The operator's log line for a record. The audit log is the record of every decision;
//! this line is for eyes: refusals and errors at info, what was let through (and the ends of
//! tunnels) at debug.

use tracing::Level;

use super::{End, ErrorCode, Protocol, Record, RecordKind, NO_RULE};

pub(crate) fn line(r: &Record) {
    let quiet = r.decision.is_allowed() && r.error_code.is_none();
    if quiet {
        emit(Level::DEBUG, r);
    } else {
        emit(Level::INFO, r);
    }
}

fn emit(level: Level, r: &Record) {
    macro_rules! at {
        ($level:expr) => {
            tracing::event!(
                $level,
                request_id = %r.request_id,
                kind = r.kind.as_str(),
                protocol = r.protocol.as_str(),
                method = r.method.as_deref().unwrap_or("-"),
                host = &*r.host,
                port = r.port,
                path = r.path.as_deref().unwrap_or("-"),
                decision = r.decision.as_str(),
                rule = r.rule.as_deref().unwrap_or(NO_RULE),
                status = r.status.unwrap_or(0),
                upstream = %r.upstream.map_or_else(|| "-".to_string(), |a| a.to_string()),
                error_code = r.error_code.map_or("-", ErrorCode::as_str),
                secrets = %if r.secrets.is_empty() {
                    "-".to_string()
                } else {
                    r.secrets.join(",")
                },
                bytes_up = r.bytes_up,
                bytes_down = r.bytes_down,
                ms = super::rounded_ms(r.ms),
                "{}",
                summary(r)
            )
        };
    }
    match level {
        Level::DEBUG => at!(Level::DEBUG),
        _ => at!(Level::INFO),
    }
}

/// One phrase a person reads first.
fn summary(r: &Record) -> String {
    let reason = r.reason.as_deref().unwrap_or("");
    match (r.kind, r.protocol, r.error_code) {
        (RecordKind::Close, _, _) => format!(
            "tunnel closed ({})",
            r.end.map_or("-", End::as_str)
        ),
        (_, Protocol::Tls, Some(ErrorCode::ClientRejectedCa)) => format!(
            "the client rejected the AgenShield CA for {}: this tool does not trust the CA ({reason})",
            r.sni.as_deref().unwrap_or(&r.host)
        ),
        (RecordKind::Connection, _, _) => format!("connection {reason}"),
        (RecordKind::Request, _, _) => format!("request {reason}"),
        (RecordKind::Query, _, _) => format!(
            "dns {} {} {}: {reason}",
            r.dns.as_ref().map_or_else(|| "-".to_string(), |d| d.qtype_str()),
            r.host,
            r.dns.as_ref().map_or("-", |d| d.rcode_str())
        ),
    }
}
